"""One judge call through litellm, retried with tenacity on transient failures.

Transient: 429 (honouring `Retry-After`), 5xx, timeouts, connection errors. Those are retried with
exponential backoff and jitter; anything else (bad key, unknown model, bad request) fails at once with
a `JudgeConfigError`. litellm's and the OpenAI SDK's own retries are switched off so the attempt count
is ours alone.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass, field

import litellm
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay
from tenacity.wait import wait_exponential_jitter

from ruler_rl.judges.errors import JudgeConfigError, JudgeUnavailableError
from ruler_rl.judges.local_provider import check_local_model, register_local_provider
from ruler_rl.judges.retry import MAX_ATTEMPTS, RetryPolicy  # noqa: F401  (importable here too)
from ruler_rl.judges.vllm_engine import register_vllm_engine_provider

litellm.suppress_debug_info = True  # no provider-list banners on our errors
# importing this module (or `ruler_rl.judges.complete`, `ruler_rl.judges.EMBEDDED_JUDGE`, ...) registers local/ and
# vllm-engine/
register_local_provider()
register_vllm_engine_provider()

TRANSIENT = (
    litellm.RateLimitError,
    litellm.InternalServerError,
    litellm.ServiceUnavailableError,
    litellm.APIConnectionError,
    litellm.Timeout,
    litellm.BadGatewayError,
)
CONFIG = (litellm.AuthenticationError, litellm.NotFoundError, litellm.BadRequestError,
          litellm.PermissionDeniedError)


@dataclass
class JudgeReply:
    """What a judge said and what it cost."""

    content: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    response: object = field(default=None, repr=False)  # litellm's ModelResponse (choices, tool calls)


def json_list(text: str | None, key: str) -> list:
    """The list under `key` of an LLM's answer `text` that should be the JSON object `{key: [...], ...}`
    alone (as a `json_schema` response format asks for; surrounding whitespace is fine). A `ValueError`
    says what is wrong otherwise: not JSON, not an object, no `key`, or `key` not holding a list. The items
    are returned as they are, for the caller to check one by one."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty string, got {key!r}")
    if not isinstance(text, str):
        raise ValueError(f"the answer is not text (got {type(text).__name__})")  # noqa: TRY004 (a bad answer)
    try:
        obj = json.loads(text)
    except ValueError:
        raise ValueError(f"the answer is not JSON (it began: {text.strip()[:80]!r})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"the answer is JSON but not an object (a {type(obj).__name__})")  # noqa: TRY004
    if key not in obj:
        raise ValueError(f"the answer has no {key!r} field (fields: {sorted(obj)[:10]})")
    if not isinstance(obj[key], list):
        raise ValueError(f"the answer's {key!r} is not a list (a {type(obj[key]).__name__})")  # noqa: TRY004
    return obj[key]


def _retry_after_seconds(exc: BaseException) -> float | None:
    """The server's `Retry-After`, in seconds, from a litellm exception, if it sent one."""
    headers = {}
    for source in (getattr(exc, "litellm_response_headers", None), getattr(exc, "headers", None)):
        if source:
            headers.update({k.lower(): v for k, v in dict(source).items()})
    response = getattr(exc, "response", None)
    if response is not None and getattr(response, "headers", None):
        headers.update({k.lower(): v for k, v in response.headers.items()})
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(exc, litellm.APIError) and isinstance(status, int) and status >= 500


def _wait(policy: RetryPolicy, deadline: float):
    backoff = wait_exponential_jitter(initial=policy.initial_wait, max=policy.max_wait)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        after = _retry_after_seconds(exc) if exc is not None else None
        seconds = min(after, policy.max_retry_after) if after is not None else backoff(state)
        return max(0.0, min(seconds, deadline - time.monotonic()))  # never sleep past the deadline

    return wait


@functools.lru_cache(maxsize=512)
def has_price(model: str) -> bool:
    """Whether litellm's price table knows `model` (a local or self-hosted model costs 0)."""
    name = model.split("/", 1)[1] if "/" in model else model
    if model in litellm.model_cost or name in litellm.model_cost:
        return True
    try:  # aliases and provider-specific names (looked up once per model string)
        info = litellm.get_model_info(model=model)
        return bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))
    except Exception:
        return False


def _usage_and_cost(response, model: str) -> tuple[int, int, float]:
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    if not has_price(model):  # skips litellm's cost lookup, which costs milliseconds per call
        return prompt, completion, 0.0
    try:
        cost = float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # models without a price (local, self-hosted) cost 0
        cost = 0.0
    return prompt, completion, cost


async def complete(
    model: str,
    messages: list[dict],
    *,
    response_format: dict | None = None,
    params: dict | None = None,
    retry: RetryPolicy | None = None,
) -> JudgeReply:
    """Ask `model` (any litellm model string) to complete `messages`; return text, usage and cost.

    Raises JudgeConfigError for requests that can never succeed and JudgeUnavailableError when
    transient failures outlast the retry policy.
    """
    if not isinstance(model, str) or not model.strip():
        raise JudgeConfigError(f"judge model must be a non-empty litellm model string, got {model!r}")
    if not messages:
        raise JudgeConfigError("no messages to send to the judge")
    check_local_model(model)
    policy = retry or RetryPolicy()
    if params is not None and not isinstance(params, dict):
        raise JudgeConfigError(f"judge params must be a dict, got {type(params).__name__}")
    kwargs = {"timeout": policy.timeout, "num_retries": 0, "max_retries": 0, **(params or {})}
    if response_format is not None:
        kwargs["response_format"] = response_format
    deadline = time.monotonic() + policy.deadline
    attempts = 0
    try:
        async with asyncio.timeout(policy.deadline):  # the hard bound, whatever the transport does
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.deadline),
                wait=_wait(policy, deadline),
                retry=retry_if_exception(_is_transient),
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    per_call = kwargs["timeout"]
                    if isinstance(per_call, (int, float)):  # no attempt may outlive the deadline
                        per_call = max(0.01, min(per_call, deadline - time.monotonic()))
                    response = await litellm.acompletion(model=model, messages=messages,
                                                         **{**kwargs, "timeout": per_call})
    except TimeoutError as exc:  # asyncio.timeout: the deadline passed during an attempt or a wait
        raise JudgeUnavailableError(
            f"judge {model!r} gave no answer within the {policy.deadline:g} s deadline for one call "
            f"({attempts} attempt(s))") from exc
    except JudgeConfigError:
        raise
    except CONFIG as exc:
        raise JudgeConfigError(f"judge {model!r} refused the request: {exc}") from exc
    except Exception as exc:
        if _is_transient(exc):
            raise JudgeUnavailableError(
                f"judge {model!r} still failing after {attempts} attempt(s): {type(exc).__name__}: {exc}"
            ) from exc
        if "LLM Provider NOT provided" in str(exc) or isinstance(exc, ValueError):
            raise JudgeConfigError(f"unknown judge model {model!r}: {exc}") from exc
        raise JudgeUnavailableError(f"judge {model!r} failed: {type(exc).__name__}: {exc}") from exc
    choices = getattr(response, "choices", None) or []
    content = (choices[0].message.content or "") if choices else ""
    prompt, completion, cost = _usage_and_cost(response, model)
    return JudgeReply(
        content=content, model=model, prompt_tokens=prompt, completion_tokens=completion, cost=cost,
        response=response,
    )
