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
are matched by role, text, tool calls (id, name, arguments as JSON) and tool_call_id, so a framework that
resends an assistant turn in its own shape still extends it.

The recording HTTP client is an httpx transport wrapper: it reads the request JSON and the response JSON of
`POST …/chat/completions` and changes nothing. Outside a recording it only passes requests through. Which
recording a completion belongs to is a context variable, so concurrent agents (asyncio tasks, threads) each
record their own; tasks started inside a block (and `asyncio.to_thread`) inherit it, plain threads do not.
Streamed completions cannot be recorded (their token ids are not assembled here): a streamed request made
while recording gets an HTTP 400 saying to disable streaming.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import threading
from typing import Any

import httpx
from openai.types.chat.chat_completion import Choice

from ruler.trajectory import History, Trajectory, choice_to_message

_current: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar("ruler_record_trajectory", default=None)

STREAMING_REFUSED = ("record_trajectory cannot record a streamed chat completion (its served token ids are not "
                     "assembled): disable streaming — LangChain: ChatOpenAI(streaming=False), the default; Agents "
                     "SDK: Runner.run, not Runner.run_streamed; OpenAI client: stream=False")


class RecordingError(RuntimeError):
    """A recording was used wrongly (e.g. entered twice)."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _key(message: Any) -> tuple:
    """What identifies a message when matching a request to a recorded conversation: role, text, tool calls
    (id, name, parsed arguments), tool_call_id. Frameworks resend assistant turns in their own shape (None
    vs "" content, re-serialized arguments), which this ignores."""
    if isinstance(message, Choice):
        message = choice_to_message(message)
    if not isinstance(message, dict):
        return ("?", repr(message))
    calls = tuple((c.get("id"), (c.get("function") or {}).get("name"),
                   json.dumps(_arguments((c.get("function") or {}).get("arguments")), sort_keys=True))
                  for c in message.get("tool_calls") or [] if isinstance(c, dict))
    return (message.get("role"), _text(message.get("content")).strip(), calls, message.get("tool_call_id"))


class _Recorder:
    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory
        self.lock = threading.Lock()
        self.completions = 0

    def add(self, request: dict, response: dict) -> None:
        messages, choices = request.get("messages"), response.get("choices")
        if not isinstance(messages, list) or not isinstance(choices, list) or not choices:
            return
        choice = dict(choices[0])
        for key in ("prompt_token_ids",):  # some servers put the prompt's ids on the response only
            if choice.get(key) is None and response.get(key) is not None:
                choice[key] = response[key]
        parsed = Choice.model_validate(choice)
        tools = request.get("tools") or None
        keys = [_key(m) for m in messages]
        with self.lock:
            self.completions += 1
            t = self.trajectory
            histories: list[Any] = [t, *t.additional_histories]
            best, best_len = None, -1
            for h in histories:  # the longest recorded conversation this request extends (an empty main one: any)
                recorded = [_key(m) for m in h.messages_and_choices]
                if len(recorded) > best_len and recorded == keys[:len(recorded)] and (recorded or h is t):
                    best, best_len = h, len(recorded)
            if best is None:
                t.additional_histories.append(History(messages_and_choices=[*messages, parsed], tools=tools))
                return
            best.messages_and_choices.extend([*messages[best_len:], parsed])
            if tools and not best.tools:
                best.tools = tools


def _is_completion(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.rstrip("/").endswith("/chat/completions")


def _request_json(request: httpx.Request) -> dict | None:
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return None
    return body if isinstance(body, dict) else None


def _refuse_stream(request: httpx.Request) -> httpx.Response:
    return httpx.Response(400, json={"error": {"message": STREAMING_REFUSED, "type": "invalid_request_error",
                                               "code": 400}}, request=request)


def _record(recorder: _Recorder, body: dict, response: httpx.Response) -> None:
    if response.status_code != 200:
        return
    try:
        data = json.loads(response.content)
    except ValueError:
        return
    if isinstance(data, dict):
        recorder.add(body, data)


class RecordingTransport(httpx.BaseTransport):
    """A sync httpx transport that records chat completions into the current `record_trajectory`."""

    def __init__(self, inner: httpx.BaseTransport | None = None):
        if inner is not None and not isinstance(inner, httpx.BaseTransport):
            raise TypeError(f"inner must be an httpx.BaseTransport, got {type(inner).__name__}")
        self.inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        recorder = _current.get()
        if recorder is None or not _is_completion(request):
            return self.inner.handle_request(request)
        body = _request_json(request) or {}
        if body.get("stream"):
            return _refuse_stream(request)
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
        self.inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        recorder = _current.get()
        if recorder is None or not _is_completion(request):
            return await self.inner.handle_async_request(request)
        body = _request_json(request) or {}
        if body.get("stream"):
            return _refuse_stream(request)
        response = await self.inner.handle_async_request(request)
        await response.aread()
        _record(recorder, body, response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _client_settings(kwargs: dict) -> dict:
    # openai's own defaults: 10 min per request, 5 s to connect, redirects followed
    return {"timeout": httpx.Timeout(600.0, connect=5.0), "follow_redirects": True, **kwargs}


def recording_http_client(transport: httpx.BaseTransport | None = None, **kwargs) -> httpx.Client:
    """An `httpx.Client` (openai's default timeouts; `kwargs` go to httpx) that records inside
    `record_trajectory`; `transport` is the one it wraps (a plain HTTP transport by default). For
    `OpenAI(http_client=...)`, LangChain's `ChatOpenAI(http_client=...)`."""
    return httpx.Client(transport=RecordingTransport(transport), **_client_settings(kwargs))


def recording_async_http_client(transport: httpx.AsyncBaseTransport | None = None, **kwargs) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` (openai's default timeouts; `kwargs` go to httpx) that records inside
    `record_trajectory`; `transport` is the one it wraps. For `AsyncOpenAI(http_client=...)`,
    `ChatOpenAI(http_async_client=...)`."""
    return httpx.AsyncClient(transport=AsyncRecordingTransport(transport), **_client_settings(kwargs))


def litellm_client(transport: httpx.AsyncBaseTransport | None = None):
    """A litellm `AsyncHTTPHandler` that records inside `record_trajectory`: pass it as
    `litellm.acompletion(..., client=litellm_client(), **model.litellm_completion_params())` (the
    `hosted_vllm/` provider of `litellm_completion_params` sends its requests through it)."""
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    return AsyncHTTPHandler(timeout=httpx.Timeout(600.0, connect=5.0), transport=AsyncRecordingTransport(transport))


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
            raise TypeError(f"trajectory must be a ruler.Trajectory, got {type(trajectory).__name__}")
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
        self._token = _current.set(_Recorder(t))
        return t

    def _exit(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            _current.reset(token)

    def __enter__(self) -> Trajectory:
        return self._enter()

    def __exit__(self, *exc) -> None:
        self._exit()

    async def __aenter__(self) -> Trajectory:
        return self._enter()

    async def __aexit__(self, *exc) -> None:
        self._exit()

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
        raise TypeError(f"model must be a registered trainer.TrainableModel, got {type(model).__name__}")


def langchain_chat_model(model, *, step: int | None = None, transport: httpx.AsyncBaseTransport | None = None,
                         sync_transport: httpx.BaseTransport | None = None, **kwargs):
    """A langchain-openai `ChatOpenAI` for `model`'s server (temperature 1, no streaming) whose calls are
    recorded inside `record_trajectory`; `kwargs` go to `ChatOpenAI`. For LangGraph agents
    (`create_react_agent(langchain_chat_model(model), tools)`). Needs the `agents` extra."""
    from judges.extras import require

    require("agents", "trainer.record.langchain_chat_model (LangChain/LangGraph agents)")
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
    `run_streamed`). Needs the `agents` extra."""
    from judges.extras import require

    require("agents", "trainer.record.agents_sdk_model (OpenAI Agents SDK agents)")
    _check_model(model)
    from agents import OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key,
                         http_client=recording_async_http_client(transport))
    return OpenAIChatCompletionsModel(model=model.get_inference_name(step), openai_client=client)
