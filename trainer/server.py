"""The CPU engine's small OpenAI-compatible server: `/v1/chat/completions` and `/v1/models`, speaking the
subset of vLLM's OpenAI server that rollouts use, in the same shapes, so one rollout function runs unchanged
on the CPU and on a GPU (where vLLM's own server answers; `trainer/vllm_server.py`).

The subset: tools (rendered by the chat template; calls parsed with a vLLM parser name, `hermes` or
`llama3_json`), `tool_choice` `auto`/`none`/`required`/a named function (the last two by constrained
decoding with xgrammar, Hermes format), `n`, `max_tokens`/`max_completion_tokens`, `temperature`,
`top_p`, `seed`, `response_format` `json_schema`/`json_object` (constrained decoding with xgrammar, the
logprobs still the unconstrained policy's, so unlike vLLM's, whose logprobs come after the grammar's mask and
which the trainer's middleware marks `constrained`, they are trained on as they are), `logprobs`/`top_logprobs` (0-20 alternatives per token; as vLLM, `top_logprobs` > 0 needs
`logprobs: true`), `return_tokens_as_token_ids`, `return_token_ids` and `chat_template_kwargs`. As on the GPU
path, every non-streamed completion carries what training needs whatever the request asked: the response's
and each choice's `prompt_token_ids`, each choice's `token_ids`, and the sampled tokens' logprobs (the
policy's own, at temperature 1): standard `logprobs` when asked for, else one compact `token_logprobs` list
per choice; and each choice's `policy_step`, the adapter step whose weights sampled it (as the middleware in
vLLM's server adds it), which training checks against `TrainConfig.max_off_policy_steps`.

`<model>` is the latest adapter; `<model>@<step>` names a step (only the latest is served here: the CPU
engine generates with the very weights being trained). Requests that arrive during a training step wait
for it (the engine's lock): none is cut short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from ruler_rl.judges.extras import pip_command
from ruler_rl.trainer.chat import parse_tool_calls, prompt_ids
from ruler_rl.trainer.engine import GeneratingEngine


@dataclass
class Served:
    """What the server needs of a registered model (the backend keeps one per model, served here or not)."""
    name: str
    engine: GeneratingEngine | None       # None: an engine with its own server answers for this model
    tokenizer: Any
    max_seq_length: int
    step: int = 0
    chat_template: str | None = None      # None: the tokenizer's own
    renders_tools: bool = True
    tool_parser: str = "hermes"
    reasoning_parser: str | None = None   # "qwen3": text before </think> becomes message.reasoning
    end_of_turn: list[int] | None = None  # the ids that end an assistant turn (generation config + tokenizer)


class ChatRequest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    model: str
    messages: list[dict] = pydantic.Field(min_length=1)
    tools: list[dict] | None = None
    tool_choice: Any = None
    n: int = pydantic.Field(1, ge=1, le=128)
    max_tokens: int | None = pydantic.Field(None, ge=1)
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0, le=5)
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    logprobs: bool | None = None
    top_logprobs: int | None = pydantic.Field(None, ge=0, le=20)
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    response_format: dict | None = None


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _json(body: dict) -> Response:
    """Serialize directly: FastAPI's generic encoder walks every token entry and is the bottleneck."""
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def _check_tools(tools: list) -> None:
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise APIError(400, f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': …}}}}")
        if tool.get("type", "function") != "function":
            raise APIError(400, f"tools[{i}].type must be 'function'")


def _forced_tools(tool_choice: Any, tools: list | None) -> list[dict]:
    """The tools one of which must be called: all of them for `required`, one for a named function; [] for
    `auto`/`none`. Anything else is refused."""
    if tool_choice in ("auto", "none"):
        return []
    if not tools:
        raise APIError(400, f"tool_choice {tool_choice!r} needs tools")
    if tool_choice == "required":
        return list(tools)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or tool_choice.get("type", "function") != "function":
        raise APIError(400, f"tool_choice must be 'auto', 'none', 'required' or "
                       f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")
    chosen = [t for t in tools if t["function"]["name"] == name]
    if not chosen:
        raise APIError(400, f"tool_choice names {name!r}, which is not among the tools")
    return chosen


def _tool_call_grammar(tools: list[dict]):
    """An xgrammar grammar for one Hermes tool call to one of `tools`, arguments matching its parameters:
    `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (constrained decoding, as vLLM does for
    `tool_choice` `required` or a named function)."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise APIError(400, "tool_choice 'required' or a named function needs xgrammar on the CPU server "
                       f"({pip_command('embedded')})") from None
    calls = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        schema = {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                  "required": ["name", "arguments"], "additionalProperties": False}
        try:
            calls.append(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                                      separators=(", ", ": ")))
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar refuses a schema with a RuntimeError
            raise APIError(400, f"tools: the parameters of {fn['name']!r} are not a usable JSON schema: {exc}") \
                from None
    body = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
    return xgr.Grammar.concat(xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), body,
                              xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"'))


def _response_format_grammar(fmt: dict):
    """An xgrammar grammar for `response_format` (constrained decoding, as vLLM's structured outputs):
    `{"type": "json_schema", "json_schema": {"schema": {...}}}` or `{"type": "json_object"}`; None for
    `text`. JSON is written without free whitespace, `, ` and `: ` between items (as the embedded judge)."""
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "response_format json_schema needs {'json_schema': {'schema': {...}}}")
    else:
        raise APIError(400, f"response_format type must be text, json_object or json_schema, got {kind!r}")
    try:
        import xgrammar as xgr
    except ImportError:
        raise APIError(400, f"response_format needs xgrammar on the CPU server ({pip_command('embedded')})") \
            from None
    try:
        return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar refuses a schema with a RuntimeError
        raise APIError(400, f"response_format: not a usable JSON schema: {exc}") from None


def _split_reasoning(text: str, parser: str | None) -> tuple[str | None, str]:
    if parser != "qwen3" or "</think>" not in text:
        return None, text
    reasoning, _, rest = text.partition("</think>")
    return reasoning.removeprefix("<think>").strip("\n") or None, rest.lstrip("\n")


def _logprob_entry(tokenizer, token: int, lp: float, top: list[tuple[int, float]], as_ids: bool) -> dict:
    def name(t: int) -> str:
        return f"token_id:{t}" if as_ids else tokenizer.decode([t])

    text = name(token)
    return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": name(t), "logprob": v, "bytes": list(name(t).encode("utf-8"))}
                             for t, v in top]}


def create_server_app(models: dict[str, Served]) -> FastAPI:
    app = FastAPI(title="ruler-rl CPU inference server", docs_url="/docs")

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError):
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(400, f"{where}: {first['msg']}", "invalid_request_error")

    def resolve(name: str) -> Served:
        base, _, step = name.partition("@")
        served = models.get(base)
        if served is None or served.engine is None:
            raise APIError(404, f"model {name!r} is not served here; models: {sorted(models)}", "not_found_error")
        if step and step != str(served.step):
            raise APIError(404, f"unknown adapter step {step!r} for {base}: it is at step {served.step}, and only "
                           "the latest adapter is served by the CPU engine", "not_found_error")
        return served

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "ruler-rl", "step": m.step}
            for m in models.values() for name in (m.name, f"{m.name}@{m.step}")]}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        served = resolve(req.model)
        if req.stream:
            raise APIError(400, "stream is not supported by the CPU server")
        if req.stop:
            raise APIError(400, "stop sequences are not supported by the CPU server; use max_tokens")
        if req.top_logprobs and not req.logprobs:  # vLLM refuses this too
            raise APIError(400, "top_logprobs needs logprobs: true (alternatives come inside standard logprobs)")
        shaped = _response_format_grammar(req.response_format) if req.response_format else None
        tool_choice = req.tool_choice if req.tool_choice is not None else "auto"
        tools = req.tools or None
        if tools:
            _check_tools(tools)
            if not served.renders_tools:
                raise APIError(400, f"the chat template of {served.name} cannot render tools; give one that can "
                               "(EngineConfig.chat_template)")
        forced = _forced_tools(tool_choice, tools)
        if forced and shaped is not None:
            raise APIError(400, "response_format and a forced tool call (tool_choice required or named) cannot "
                           "both constrain one answer")
        if forced and served.tool_parser != "hermes":
            raise APIError(400, f"tool_choice {tool_choice!r} needs the hermes tool parser on the CPU server")
        try:
            ids = prompt_ids(served.tokenizer, req.messages, tools, chat_template=served.chat_template,
                             **(req.chat_template_kwargs or {}))
        except (ValueError, TypeError, KeyError) as exc:
            raise APIError(400, f"messages: {exc}") from None
        except Exception as exc:  # jinja's TemplateError: the template refused these messages
            raise APIError(400, f"the chat template cannot render these messages: {exc}") from None
        room = served.max_seq_length - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt has {len(ids)} tokens; max_seq_length is {served.max_seq_length}")
        max_tokens = min(req.max_completion_tokens or req.max_tokens or room, room)
        samples = await served.engine.generate(ids, n=req.n, max_tokens=max_tokens, temperature=req.temperature,
                                               top_p=req.top_p, seed=req.seed, top_logprobs=req.top_logprobs or 0,
                                               **({"grammar": _tool_call_grammar(forced)} if forced else
                                                  {"grammar": shaped} if shaped is not None else {}))
        tok = served.tokenizer
        choices = []
        for i, s in enumerate(samples):
            text = tok.decode(s.token_ids, skip_special_tokens=True)
            reasoning, text = _split_reasoning(text, served.reasoning_parser)
            content, calls = (parse_tool_calls(text, served.tool_parser) if tools and tool_choice != "none"
                              else (text, []))
            top = s.top_logprobs or [[] for _ in s.token_ids]
            entries = zip(s.token_ids, s.logprobs, top, strict=True)
            standard = {"content": [_logprob_entry(tok, t, lp, tp, bool(req.return_tokens_as_token_ids))
                                    for t, lp, tp in entries]} if req.logprobs else None
            choices.append({
                "index": i, "finish_reason": "tool_calls" if calls else s.finish_reason, "stop_reason": None,
                "message": {"role": "assistant", "content": content, "tool_calls": calls, "reasoning": reasoning},
                "logprobs": standard, "token_ids": s.token_ids, "prompt_token_ids": ids,
                "policy_step": served.step if s.policy_step is None else s.policy_step,
                **({} if req.logprobs else {"token_logprobs": s.logprobs})})
        completion = sum(len(s.token_ids) for s in samples)
        return _json({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                      "created": int(time.time()), "model": req.model, "choices": choices,
                      "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                                "total_tokens": len(ids) + completion},
                      "prompt_token_ids": ids})

    return app


class BackgroundServer:
    """uvicorn serving `app` as a task on the caller's event loop (so the engines live on one loop)."""

    def __init__(self, app: FastAPI, host: str, port: int = 0):
        import uvicorn

        self.host = host
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off"))
        self.server.capture_signals = contextlib.nullcontext  # Ctrl-C stays with the training script
        self.task: asyncio.Task | None = None
        self.url = ""

    async def start(self) -> None:
        """Serve; port 0 binds a free port, read back from the socket."""
        self.task = asyncio.create_task(self.server.serve())
        for _ in range(500):
            if self.server.started:
                port = self.server.servers[0].sockets[0].getsockname()[1]
                self.url = f"http://{self.host}:{port}/v1"
                return
            if self.task.done():
                self.task.result()
                raise RuntimeError("the server stopped while starting")
            await asyncio.sleep(0.01)
        raise TimeoutError("the server did not start within 5 s")

    async def stop(self) -> None:
        if self.task is not None:
            self.server.should_exit = True
            await self.task
            self.task = None

