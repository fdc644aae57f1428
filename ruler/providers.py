"""What RULER needs to know about a judge model: which litellm provider serves it, the answer format it
can be held to, its context size and how it counts prompt tokens."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import litellm

from ruler_rl.judges import EMBEDDED_JUDGE, JudgeConfigError
from ruler_rl.limits import UNKNOWN_CONTEXT_TOKENS  # noqa: F401  (importable here too)
from ruler_rl.prompt import response_schema

LOCAL_EXPLANATION_CHARS = 80  # the embedded judge decodes ~10 tokens/s on CPU: keep its explanations short
SERVED_EXPLANATION_CHARS = 400  # self-served models under constrained decoding: bound run-on explanations
ANSWER_ROOM_TOKENS = 256  # the embedded judge's context left for its answer

TokenCounter = Callable[[list[dict]], int]
"""Prompt tokens of a list of chat messages, as one judge counts them."""


def default_judge_model() -> str:
    """`$RULER_JUDGE_MODEL` when set, else the embedded offline judge."""
    return os.environ.get("RULER_JUDGE_MODEL") or EMBEDDED_JUDGE


@functools.lru_cache(maxsize=256)
def provider_of(model: str, api_base: str | None) -> str:
    """litellm's provider for `model` (a `JudgeConfigError` for a model no provider serves)."""
    from ruler_rl.judges.local_provider import check_local_model

    check_local_model(model)
    try:
        return litellm.get_llm_provider(model, api_base=api_base)[1]
    except Exception as exc:
        raise JudgeConfigError(f"unknown judge model {model!r}: {str(exc).splitlines()[0]}") from None


@functools.lru_cache(maxsize=256)
def _context_limit(model: str, provider: str) -> int | None:
    if provider == "local":
        from ruler_rl.judges.embedded import load_local_model

        return load_local_model(model.split("/", 1)[1]).max_context - ANSWER_ROOM_TOKENS
    try:
        info = litellm.get_model_info(model=model, custom_llm_provider=provider)
        return info.get("max_input_tokens") or info.get("max_tokens")
    except Exception:  # a model litellm does not know: the caller may pass max_prompt_tokens
        return None


@dataclass(frozen=True)
class Judge:
    """One judge model as RULER calls it: the litellm model string, its provider and the call's parameters."""

    model: str
    provider: str
    params: dict

    @classmethod
    def of(cls, model: str, params: dict) -> Judge:
        """The judge `model` called with `params`; raises `JudgeConfigError` if no provider serves it."""
        return cls(model, provider_of(model, params.get("api_base")), dict(params))

    def response_format(self, ids: list[str]) -> dict | None:
        """The answer's JSON schema where the provider can enforce it (exact, per id, for models we serve)."""
        if "response_format" in self.params:
            return self.params["response_format"]
        if self.provider == "local":
            schema = response_schema(ids, max_explanation_chars=LOCAL_EXPLANATION_CHARS)
        elif self.provider in ("hosted_vllm", "vllm-engine") or (self.provider == "openai"
                                                                 and self.params.get("api_base")):
            schema = response_schema(ids, max_explanation_chars=SERVED_EXPLANATION_CHARS)
        else:
            try:
                if not litellm.supports_response_schema(model=self.model, custom_llm_provider=self.provider):
                    return None
            except Exception:
                return None
            schema = response_schema(None)
        return {"type": "json_schema", "json_schema": {"name": "ruler_scores", "schema": schema, "strict": True}}

    def cache_model(self) -> str:
        """The model as the cache key names it: the model string, except for a `local/<folder>` judge, whose
        key names the folder's weights (`ruler_rl.judges.local_provider.model_identity`), so a retrained or replaced
        model never hits the answers of the one before."""
        if self.provider == "local":
            from ruler_rl.judges.local_provider import model_identity

            return model_identity(self.model)
        return self.model

    def context_limit(self) -> int | None:
        """The judge's input tokens (the embedded judge: its context less room for the answer); None: unknown."""
        return _context_limit(self.model, self.provider)

    def token_counter(self) -> TokenCounter:
        """Prompt tokens as this judge counts them: the embedded tokenizer, else litellm's counter for the model."""
        if self.provider == "local":
            from ruler_rl.judges.embedded import load_local_model

            tok = load_local_model(self.model.split("/", 1)[1]).tokenizer
            return lambda msgs: sum(len(tok(m["content"])["input_ids"]) + 4 for m in msgs) + 3
        return lambda msgs: litellm.token_counter(model=self.model, messages=msgs)
