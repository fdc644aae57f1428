"""Record trajectories from agent code you already have: plain OpenAI clients, LangGraph/LangChain, the OpenAI
Agents SDK.

    with record_trajectory() as traj:               # or `async with`, or @record_trajectory() on a function
        await my_agent(model.openai_client(), question)
    traj.reward = ...

Every chat completion made inside the block through a recording HTTP client (`model.openai_client()`,
`langchain_chat_model(model)`, `agents_sdk_model(model)`, litellm with `client=litellm_client()`, or any
client given `recording_http_client()` / `recording_async_http_client()`) is added to the trajectory: the request's messages (tool results included),
its tools, and the answer's choice kept whole as an OpenAI `Choice`, so the served token ids ride along and
`model.train` trains the turn token-exactly (a request with `n` > 1 records its first choice). A request whose
messages do not extend a conversation already recorded starts an entry of `additional_histories`; messages
are matched whole, normalised (role, content with every part — images too —, tool calls by id, name and
arguments as JSON, tool_call_id, other fields), so a framework that resends an assistant turn in its own
shape still extends it while a request differing only in an image does not.

The recording HTTP client is an httpx transport wrapper: it reads the request JSON and the response JSON of
`POST …/chat/completions` and changes nothing. Outside a recording it only passes requests through. Which
recording a completion belongs to is a context variable, so concurrent agents (asyncio tasks, threads) each
record their own; tasks started inside a block (and `asyncio.to_thread`) inherit it, plain threads do not.
Streamed completions cannot be recorded (their token ids are not assembled here): a streamed request made
while recording gets an HTTP 400 saying to disable streaming; so does a Responses API (`/responses`) or
legacy `/completions` request (it would not be recorded). Recording never fails the agent's call: a choice
outside OpenAI's values (vLLM's `finish_reason: "abort"`) is kept unvalidated, a 200 that is not a usable
chat completion is logged as a warning and skipped. A choice without served token ids (`prompt_token_ids`
and `token_ids`: an API model called through a recording client) is recorded as a plain assistant message
(context, never trained), with a `RecordingWarning` once per recording. When a block ends without an
exception, a block that recorded no completion gives a `RecordingWarning`, and the recorded trajectory is
checked by `ruler_rl.trajectory.validate_trajectories` (a `RecordingError` names what is wrong).

`langchain_chat_model`, `agents_sdk_model` and `litellm_client` each make HTTP clients: make them once per
run and close them with `aclose_recording` at the end.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import logging
import threading
import warnings
from typing import Any

import httpx
import pydantic
from openai.types.chat.chat_completion import ChatCompletionMessage, Choice

from ruler_rl.messages import TrajectoryError
from ruler_rl.trajectory import History, Trajectory, choice_to_message, validate_trajectories

log = logging.getLogger(__name__)

_current: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("ruler_record_trajectory", default=None)

STREAMING_REFUSED = ("record_trajectory cannot record a streamed chat completion (its served token ids are not "
                     "assembled): disable streaming — LangChain: ChatOpenAI(streaming=False), the default; Agents "
                     "SDK: Runner.run, not Runner.run_streamed; OpenAI client: stream=False")


NOT_CHAT_REFUSED = ("record_trajectory records chat completions only: a {what} request made inside a recording "
                    "would not be recorded; use the chat completions API (client.chat.completions.create; "
                    "Agents SDK: OpenAIChatCompletionsModel, which agents_sdk_model gives)")
# openai's own client defaults: 10 min per request, 5 s to connect, 1000 connections, 100 kept alive
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
TRANSPORT_OPTIONS = ("verify", "cert", "trust_env", "http1", "http2", "limits", "proxy", "mounts")


class RecordingError(RuntimeError):
    """A recording was used wrongly (e.g. entered twice), or what it recorded is not a valid trajectory."""


class RecordingWarning(UserWarning):
    """Something made inside a recording was not recorded (a reply without served token ids, an unusable
    answer, a block that recorded no completion)."""


def _content(content: Any) -> Any:
    """Content compared whole: None and "" alike, text alone as its stripped string (a list of text parts
    too), any other part (an image, audio) kept as canonical JSON, so requests differing only in it differ."""
    if content is None:
        return ""
    if isinstance(content, list):
        if all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            return "\n".join(str(p.get("text", "")) for p in content).strip()
        return tuple(json.dumps(p, sort_keys=True, default=repr) for p in content)
    return str(content).strip() if isinstance(content, str) else json.dumps(content, sort_keys=True, default=repr)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


_KEY_SKIP = {"role", "content", "tool_calls", "tool_call_id"}


def _key(message: Any) -> tuple:
    """What identifies a message when matching a request to a recorded conversation: the whole message,
    normalised — role, content (text and every other part), tool calls (id, name, parsed arguments),
    tool_call_id and any other field (name, ...; of an assistant turn only its name). Frameworks resend assistant turns in their own shape (None
    vs "" content, re-serialized arguments, empty fields), which this ignores."""
    if isinstance(message, Choice):
        message = choice_to_message(message)
    if not isinstance(message, dict):
        return ("?", repr(message))
    calls = tuple((c.get("id"), (c.get("function") or {}).get("name"),
                   json.dumps(_arguments((c.get("function") or {}).get("arguments")), sort_keys=True))
                  for c in message.get("tool_calls") or [] if isinstance(c, dict))
    # an assistant turn is compared by what it said, called and its name: frameworks resend it with fields of
    # their own (reasoning, refusal, annotations, audio) or without them
    other = {k: v for k, v in message.items() if k not in _KEY_SKIP and v not in (None, "", [], {})
             and (message.get("role") != "assistant" or k == "name")}
    rest = json.dumps(other, sort_keys=True, default=repr)
    return (message.get("role"), _content(message.get("content")), calls, message.get("tool_call_id"), rest)


def _parse_choice(choice: dict) -> Choice:
    """The served choice as a `Choice`, never raising: one outside OpenAI's values (vLLM's
    `finish_reason: "abort"`) is built without validation, keeping every served field."""
    try:
        return Choice.model_validate(choice)
    except pydantic.ValidationError:
        message = choice.get("message")
        try:
            message = ChatCompletionMessage.model_validate(message)
        except pydantic.ValidationError:
            message = ChatCompletionMessage.model_construct(**message) if isinstance(message, dict) else \
                ChatCompletionMessage.model_construct(role="assistant", content=None)
        return Choice.model_construct(**{**choice, "message": message})


def _has_token_ids(choice: dict) -> bool:
    return isinstance(choice.get("prompt_token_ids"), list) and isinstance(choice.get("token_ids"), list)


class _Recorder:
    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory
        self.lock = threading.Lock()
        self.completions = 0  # completions recorded (read at block exit: none recorded is warned about)
        self.warned_no_ids = False

    def add(self, request: dict, response: dict) -> None:
        messages, choices = request.get("messages"), response.get("choices")
        if not isinstance(messages, list) or not isinstance(choices, list) or not choices \
                or not isinstance(choices[0], dict):
            log.warning("record_trajectory: a chat completion answered 200 without a usable request/choices; it "
                        "is not recorded")
            return
        choice = dict(choices[0])
        for key in ("prompt_token_ids",):  # some servers put the prompt's ids on the response only
            if choice.get(key) is None and response.get(key) is not None:
                choice[key] = response[key]
        parsed = _parse_choice(choice)
        trainable = _has_token_ids(choice)
        # a choice without served token ids (an API model called through a recording client) cannot be
        # trained: it is kept as a plain assistant message, so the conversation it belongs to still matches
        item: Any = parsed if trainable else choice_to_message(parsed)
        tools = request.get("tools") or None
        keys = [_key(m) for m in messages]
        with self.lock:
            if not trainable and not self.warned_no_ids:
                self.warned_no_ids = True
                warnings.warn(f"record_trajectory: a completion from {response.get('model')!r} carries no served "
                              "token ids (prompt_token_ids/token_ids); it is recorded as a plain assistant "
                              "message, not trained (warned once per recording)", RecordingWarning, stacklevel=2)
            self.completions += 1
            t = self.trajectory
            histories: list[Any] = [t, *t.additional_histories]
            best, best_len = None, -1
            for h in histories:  # the longest recorded conversation this request extends (an empty main one: any)
                recorded = [_key(m) for m in h.messages_and_choices]
                if len(recorded) > best_len and recorded == keys[:len(recorded)] and (recorded or h is t):
                    best, best_len = h, len(recorded)
            if best is None:
                t.additional_histories.append(History.model_construct(
                    messages_and_choices=[*messages, item], tools=tools))
                return
            best.messages_and_choices.extend([*messages[best_len:], item])
            if tools and not best.tools:
                best.tools = tools


def _kind(request: httpx.Request) -> str | None:
    """ "chat" for a chat completion, the name of another generation API a recording cannot record, else None."""
    if request.method != "POST":
        return None
    path = request.url.path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "Responses API (/responses)"
    if path.endswith("/completions"):
        return "legacy completions (/completions)"
    return None


def _request_json(request: httpx.Request) -> dict | None:
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return None
    return body if isinstance(body, dict) else None


def _refuse(request: httpx.Request, message: str) -> httpx.Response:
    return httpx.Response(400, json={"error": {"message": message, "type": "invalid_request_error",
                                               "code": 400}}, request=request)


def _refusal(request: httpx.Request, kind: str, body: dict) -> httpx.Response | None:
    if kind != "chat":
        return _refuse(request, NOT_CHAT_REFUSED.format(what=kind))
    if body.get("stream"):
        return _refuse(request, STREAMING_REFUSED)
    return None


def _record(recorder: _Recorder, body: dict, response: httpx.Response) -> None:
    """Never raises: a failure to record is logged, the agent's own call goes on."""
    if response.status_code != 200:
        return
    try:
        data = json.loads(response.content)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.warning("record_trajectory: a chat completion answered 200 with a body that is not a JSON object "
                    "(%r...); it is not recorded", response.content[:80])
        return
    try:
        recorder.add(body, data)
    except Exception as exc:  # noqa: BLE001 -- the agent's call must not fail because recording did
        log.warning("record_trajectory: a chat completion could not be recorded (%s: %s)", type(exc).__name__, exc)


class RecordingTransport(httpx.BaseTransport):
    """A sync httpx transport that records chat completions into the current `record_trajectory`."""

    def __init__(self, inner: httpx.BaseTransport | None = None):
        if inner is not None and not isinstance(inner, httpx.BaseTransport):
            raise TypeError(f"inner must be an httpx.BaseTransport, got {type(inner).__name__}")
        self.inner = inner or httpx.HTTPTransport(limits=DEFAULT_LIMITS)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        recorder, kind = _current.get(), _kind(request)
        if recorder is None or kind is None:
            return self.inner.handle_request(request)
        body = _request_json(request) or {}
        refused = _refusal(request, kind, body)
        if refused is not None:
            return refused
        response = self.inner.handle_request(request)
        response.read()
        _record(recorder, body, response)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncRecordingTransport(httpx.AsyncBaseTransport):
    """An async httpx transport that records chat completions into the current `record_trajectory`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None):
        if inner is not None and not isinstance(inner, httpx.AsyncBaseTransport):
            raise TypeError(f"inner must be an httpx.AsyncBaseTransport, got {type(inner).__name__}")
        self.inner = inner or httpx.AsyncHTTPTransport(limits=DEFAULT_LIMITS)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        recorder, kind = _current.get(), _kind(request)
        if recorder is None or kind is None:
            return await self.inner.handle_async_request(request)
        body = _request_json(request) or {}
        refused = _refusal(request, kind, body)
        if refused is not None:
            return refused
        response = await self.inner.handle_async_request(request)
        await response.aread()
        _record(recorder, body, response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _wrap(client, wrapper):
    """Put `wrapper` around every transport httpx built for `client` (its default one and the proxy mounts
    from `proxy`/`mounts`/environment proxies), so the client's own `limits`, `verify`, `http2`, `proxy` and
    environment proxies all apply under the recording."""
    client._transport = wrapper(client._transport)
    client._mounts = {pattern: wrapper(t) if t is not None else None for pattern, t in client._mounts.items()}
    return client


def _client_args(transport, kwargs: dict) -> dict:
    if "transport" in kwargs:
        raise TypeError("pass the transport to wrap as `transport=`")
    if transport is not None:
        given = sorted(k for k in TRANSPORT_OPTIONS if k in kwargs)
        if given:
            raise ValueError(f"{', '.join(given)} would be ignored by httpx next to a transport: configure the "
                             "transport you pass instead")
    settings = {"timeout": DEFAULT_TIMEOUT, "follow_redirects": True, **kwargs}
    if transport is None:
        settings.setdefault("limits", DEFAULT_LIMITS)
    else:
        settings["transport"] = transport
    return settings


def recording_http_client(transport: httpx.BaseTransport | None = None, **kwargs) -> httpx.Client:
    """An `httpx.Client` that records inside `record_trajectory`; `kwargs` go to httpx (openai's defaults:
    10 min timeout, 5 s to connect, 1000 connections / 100 kept alive), transport options (`limits`, `verify`,
    `http2`, `proxy`, environment proxies...) included. `transport` is a transport to wrap instead (then
    configure it, not the client: httpx ignores transport options next to one). For
    `OpenAI(http_client=...)`, LangChain's `ChatOpenAI(http_client=...)`. Close it (`.close()`) when done."""
    if transport is not None and not isinstance(transport, httpx.BaseTransport):
        raise TypeError(f"transport must be an httpx.BaseTransport, got {type(transport).__name__}")
    client = httpx.Client(**_client_args(transport, kwargs))
    return _wrap(client, RecordingTransport)


def recording_async_http_client(transport: httpx.AsyncBaseTransport | None = None, **kwargs) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` that records inside `record_trajectory`; as `recording_http_client`. For
    `AsyncOpenAI(http_client=...)`, `ChatOpenAI(http_async_client=...)`. Close it (`await .aclose()`)."""
    if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
        raise TypeError(f"transport must be an httpx.AsyncBaseTransport, got {type(transport).__name__}")
    client = httpx.AsyncClient(**_client_args(transport, kwargs))
    return _wrap(client, AsyncRecordingTransport)


def litellm_client(transport: httpx.AsyncBaseTransport | None = None):
    """A litellm `AsyncHTTPHandler` that records inside `record_trajectory`: pass it as
    `litellm.acompletion(..., client=litellm_client(), **model.litellm_completion_params())` (the
    `hosted_vllm/` provider of `litellm_completion_params` sends its requests through it). Make one per run
    and close it when done (`await aclose_recording(handler)`)."""
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    handler = AsyncHTTPHandler(timeout=DEFAULT_TIMEOUT)
    handler.client = recording_async_http_client(transport)
    return handler


async def aclose_recording(obj) -> None:
    """Close the HTTP clients of what `langchain_chat_model`, `agents_sdk_model` or `litellm_client` returned
    (each makes its own clients: make one per run, not per rollout, and close it at the end)."""
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    if isinstance(obj, AsyncHTTPHandler):
        await obj.client.aclose()
        return
    clients = [getattr(obj, name, None) for name in ("http_async_client", "http_client")]  # LangChain ChatOpenAI
    openai_client = getattr(obj, "_client", None)  # Agents SDK OpenAIChatCompletionsModel
    if openai_client is not None and hasattr(openai_client, "close"):
        await openai_client.close()
    elif not any(isinstance(c, (httpx.Client, httpx.AsyncClient)) for c in clients):
        raise TypeError(f"aclose_recording closes what langchain_chat_model, agents_sdk_model or litellm_client "
                        f"returned, got {type(obj).__name__}")
    for c in clients:
        if isinstance(c, httpx.AsyncClient):
            await c.aclose()
        elif isinstance(c, httpx.Client):
            c.close()


class record_trajectory:  # named like a function: `with record_trajectory() as traj`
    """Record the chat completions made inside it into a `Trajectory`.

    `with` / `async with` give the trajectory (a new one, or `trajectory` when given, appended to).
    As a decorator (`@record_trajectory()`), the decorated function (sync or async) returns the recorded
    trajectory instead of its own result; a number it returns becomes the trajectory's `reward`, None leaves
    it, anything else is a TypeError. An exception inside propagates unchanged (so `gather_trajectory_groups`
    counts a rollout that raised); what was recorded until then stays in the trajectory. `metadata` is
    copied into the trajectory's. One instance records once at a time: entering it twice is a RecordingError.
    """

    def __init__(self, trajectory: Trajectory | None = None, *, metadata: dict | None = None):
        if trajectory is not None and not isinstance(trajectory, Trajectory):
            raise TypeError(f"trajectory must be a ruler_rl.Trajectory, got {type(trajectory).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        self._given = trajectory
        self._metadata = dict(metadata or {})
        self._token: contextvars.Token | None = None
        self.trajectory: Trajectory | None = None

    def _enter(self) -> Trajectory:
        if self._token is not None:
            raise RecordingError("this record_trajectory is already recording; make one per rollout")
        t = self._given if self._given is not None else Trajectory(messages_and_choices=[])
        if self._metadata:
            t.metadata.update(Trajectory(messages_and_choices=[], metadata=self._metadata).metadata)
        self.trajectory = t
        self._recorder = _Recorder(t)
        self._token = _current.set(self._recorder)
        return t

    def _exit(self, failed: bool) -> None:
        token, self._token = self._token, None
        if token is None:
            return
        _current.reset(token)
        if failed:  # the block's own exception propagates unchanged
            return
        if self._recorder.completions == 0:
            warnings.warn("record_trajectory recorded no chat completion: was the agent's client made with "
                          "model.openai_client(), langchain_chat_model, agents_sdk_model, litellm_client or a "
                          "recording_*http_client?", RecordingWarning, stacklevel=3)
            return
        try:
            validate_trajectories([self.trajectory])
        except TrajectoryError as exc:
            raise RecordingError(f"the recorded trajectory is not a valid trajectory: {exc}") from exc

    def __enter__(self) -> Trajectory:
        return self._enter()

    def __exit__(self, exc_type, *exc) -> None:
        self._exit(exc_type is not None)

    async def __aenter__(self) -> Trajectory:
        return self._enter()

    async def __aexit__(self, exc_type, *exc) -> None:
        self._exit(exc_type is not None)

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError("record_trajectory(...) decorates a function")
        given, metadata = self._given, self._metadata

        def finish(t: Trajectory, result: Any) -> Trajectory:
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                t.reward = float(result)
            elif result is not None:
                raise TypeError(f"{fn.__name__} returned a {type(result).__name__}: a function recorded with "
                                "@record_trajectory returns a reward (a number) or None")
            return t

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def arun(*args, **kwargs) -> Trajectory:
                rec = record_trajectory(given.model_copy(deep=True) if given else None, metadata=metadata)
                async with rec as t:
                    result = await fn(*args, **kwargs)
                return finish(t, result)
            return arun

        @functools.wraps(fn)
        def run(*args, **kwargs) -> Trajectory:
            rec = record_trajectory(given.model_copy(deep=True) if given else None, metadata=metadata)
            with rec as t:
                result = fn(*args, **kwargs)
            return finish(t, result)
        return run


def current_trajectory() -> Trajectory | None:
    """The trajectory being recorded in this context, or None."""
    recorder = _current.get()
    return recorder.trajectory if recorder is not None else None


def _check_model(model) -> None:
    if not all(hasattr(model, a) for a in ("inference_base_url", "inference_api_key", "get_inference_name")):
        raise TypeError(f"model must be a registered ruler_rl.trainer.TrainableModel, got {type(model).__name__}")


def langchain_chat_model(model, *, step: int | None = None, transport: httpx.AsyncBaseTransport | None = None,
                         sync_transport: httpx.BaseTransport | None = None, **kwargs):
    """A langchain-openai `ChatOpenAI` for `model`'s server (temperature 1, no streaming) whose calls are
    recorded inside `record_trajectory`; `kwargs` go to `ChatOpenAI`. For LangGraph agents
    (`create_react_agent(langchain_chat_model(model), tools)`). It makes its own HTTP clients: make one per
    run, not per rollout, and close it at the end (`await aclose_recording(chat_model)`). Needs langgraph and
    langchain-openai (the `agents` extra)."""
    from ruler_rl.judges.extras import require

    require("agents", "ruler_rl.trainer.record.langchain_chat_model (LangChain/LangGraph agents)",
            modules=["langgraph", "langchain_openai"])
    _check_model(model)
    if kwargs.get("streaming"):
        raise ValueError(STREAMING_REFUSED)
    from langchain_openai import ChatOpenAI

    settings = {"temperature": 1, **kwargs}
    return ChatOpenAI(model=model.get_inference_name(step), base_url=model.inference_base_url,
                      api_key=model.inference_api_key, http_async_client=recording_async_http_client(transport),
                      http_client=recording_http_client(sync_transport), **settings)


def agents_sdk_model(model, *, step: int | None = None, transport: httpx.AsyncBaseTransport | None = None):
    """An OpenAI Agents SDK `OpenAIChatCompletionsModel` for `model`'s server whose calls are recorded inside
    `record_trajectory` (`Agent(..., model=agents_sdk_model(model))`, then `Runner.run`, not
    `run_streamed`). It makes its own HTTP client: make one per run and close it at the end
    (`await aclose_recording(sdk_model)`). Needs openai-agents (the `agents` extra)."""
    from ruler_rl.judges.extras import require

    require("agents", "ruler_rl.trainer.record.agents_sdk_model (OpenAI Agents SDK agents)", modules=["agents"])
    _check_model(model)
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key,
                         http_client=recording_async_http_client(transport))
    return OpenAIChatCompletionsModel(model=model.get_inference_name(step), openai_client=client)
