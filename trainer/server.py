"""The OpenAI-compatible server in front of the engines: `/v1/chat/completions` (tools, `n`, logprobs) and
`/v1/models`. The served name `<model>` (or `<model>@<step>`) means the model's latest adapter.

Every choice carries its sampled tokens and their logprobs as two compact lists, `token_ids` and
`token_logprobs` (extra fields: the OpenAI client keeps them on the `Choice`), so the trainer trains on
exactly what was sampled. With `logprobs: true` they also come as standard logprobs entries
`token_id:<id>` (vLLM's `return_tokens_as_token_ids` convention).
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

from trainer.chat import parse_tool_calls, prompt_ids


@dataclass
class Served:
    """What the server needs of a registered model."""
    name: str
    engine: Any
    tokenizer: Any
    max_seq_length: int
    step: int = 0


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
    top_logprobs: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _json(body: dict) -> Response:
    """Serialize directly: FastAPI's generic encoder walks every token entry and is the bottleneck."""
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def create_server_app(models: dict[str, Served]) -> FastAPI:
    app = FastAPI(title="ruler-rl trainer server", docs_url="/docs")

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
        if served is None:
            raise APIError(404, f"model {name!r} is not served here; models: {sorted(models)}", "not_found_error")
        if step and step != str(served.step):
            raise APIError(404, f"{base} is at step {served.step}; only the latest adapter is served",
                           "not_found_error")
        return served

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [{"id": m.name, "object": "model", "owned_by": "ruler-rl",
                                            "step": m.step} for m in models.values()]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        served = resolve(req.model)
        if req.stream:
            raise APIError(400, "stream is not supported by this server")
        if req.stop:
            raise APIError(400, "stop sequences are not supported; use max_tokens")
        tools = req.tools if req.tool_choice != "none" else None
        try:
            ids = prompt_ids(served.tokenizer, req.messages, tools)
        except (ValueError, TypeError, KeyError) as exc:
            raise APIError(400, f"messages: {exc}") from None
        room = served.max_seq_length - len(ids)
        if room < 1:
            raise APIError(400, f"the prompt has {len(ids)} tokens; max_seq_length is {served.max_seq_length}")
        max_tokens = min(req.max_completion_tokens or req.max_tokens or room, room)
        started = time.perf_counter()
        samples = await served.engine.generate(ids, n=req.n, max_tokens=max_tokens, temperature=req.temperature,
                                               top_p=req.top_p, seed=req.seed)
        choices = []
        for i, s in enumerate(samples):
            text = served.tokenizer.decode(s.token_ids, skip_special_tokens=True)
            content, calls = parse_tool_calls(text) if tools else (text, [])
            choices.append({
                "index": i, "finish_reason": "tool_calls" if calls else s.finish_reason,
                "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
                # compact: what the trainer needs, parsed by clients as two plain lists
                "token_ids": s.token_ids, "token_logprobs": s.logprobs,
                "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None,
                                          "top_logprobs": []} for t, lp in zip(s.token_ids, s.logprobs)]}
                if req.logprobs else None})
        completion = sum(len(s.token_ids) for s in samples)
        return _json({"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": f"{served.name}@{served.step}", "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                          "total_tokens": len(ids) + completion},
                "system_fingerprint": f"{served.engine.name}-{time.perf_counter() - started:.3f}s"})

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
