"""What stands between a client and the routes: the request body's size and pace (`RequestGuard`), JSON
that nests too deeply (`JSONRoute`), and each key's request rate (`RateLimiter`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import contextmanager

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from ruler_rl.service.metrics import Metrics

log = logging.getLogger("ruler.service")


class RequestGuard:
    """ASGI middleware around every request: size and pace of the body, unhandled errors, metrics and logs.

    - the body may not exceed `max_bytes`: a larger `Content-Length` is refused before the app runs, and
      the bytes that arrive are counted too, so a chunked (or lying) body is cut off at the limit: 413;
    - the whole body must arrive within `body_timeout_s` of the request reaching the app, however it is
      paced (a body trickled a byte at a time is cut off at the deadline, not kept open piece by piece): 408;
    - an unhandled exception is a 500 "internal error" (logged), never a dropped connection.
    After a 413 or 408 the app below sees the client as gone and nothing else is sent.
    """

    DRAIN_BYTES = 64 * 1024 * 1024  # after a 413, read (and drop) at most this much so the client sees the answer

    def __init__(self, app, max_bytes: int, body_timeout_s: float, metrics: Metrics):
        self.app, self.max_bytes, self.body_timeout_s, self.metrics = app, max_bytes, body_timeout_s, metrics

    async def _reply(self, send, status: int, detail: str) -> None:
        payload = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        deadline = time.monotonic() + self.body_timeout_s
        state = {"status": None, "refused": False, "received": 0, "body_done": False}

        async def next_piece():
            return await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))

        async def guarded_receive():
            if state["refused"]:
                return {"type": "http.disconnect"}
            if state["body_done"]:
                return await receive()
            try:
                message = await next_piece()
            except TimeoutError:
                state["refused"] = True
                await self._reply(send, 408, f"request body too slow: not complete within {self.body_timeout_s:g} s")
                state["status"] = 408
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > self.max_bytes:
                    state["refused"] = True
                    await self._reply(send, 413, f"request body over {self.max_bytes} bytes")
                    state["status"] = 413
                    await self._drain(message.get("more_body", False), next_piece)
                    return {"type": "http.disconnect"}
                if not message.get("more_body"):
                    state["body_done"] = True
            else:
                state["body_done"] = True
            return message

        async def guarded_send(message):
            if state["refused"]:
                return  # after a 413/408 nothing else may be sent
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            await send(message)

        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            state["status"] = 413
            await self._reply(send, 413, f"request body over {self.max_bytes} bytes")
            await self._drain(True, next_piece)
        else:
            try:
                await self.app(scope, guarded_receive, guarded_send)
            except Exception:
                if not state["refused"]:
                    log.exception("unhandled error")
                    if state["status"] is None:  # nothing sent yet: answer, don't drop the connection
                        state["status"] = 500
                        await self._reply(send, 500, "internal error")
        route = scope.get("route")
        path = route.path if route is not None else "other"
        status = state["status"] or 500
        elapsed = time.perf_counter() - started
        self.metrics.requests.labels(path, str(status)).inc()
        self.metrics.latency.labels(path).observe(elapsed)
        log.info(json.dumps({"event": "request", "method": scope.get("method"), "path": scope.get("path"),
                             "status": status, "ms": round(elapsed * 1000, 2)}))

    async def _drain(self, more: bool, next_piece) -> None:
        """Read and drop the rest of a refused body (bounded), so the client gets to read the 413."""
        drained = 0
        try:
            while more and drained < self.DRAIN_BYTES:
                message = await next_piece()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                more = message.get("more_body", False)
        except TimeoutError:
            return


class JSONRequest(Request):
    """A request whose JSON body may not nest past what the parser can take: a clear 422, not a 400."""

    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body)
            except RecursionError:
                raise json.JSONDecodeError("JSON nested too deeply", "", 0) from None
            except json.JSONDecodeError:
                raise
            except ValueError as exc:  # e.g. an integer with more digits than Python converts
                raise json.JSONDecodeError(str(exc), "", 0) from None
        return self._json


def json_media_type(content_type: str | None) -> bool:
    """Whether a Content-Type header allows reading the body as JSON: `application/json`, a `+json` type, or
    none at all (the body is then read as JSON), parameters aside."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return not media or media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class JSONRoute(APIRoute):
    """A route that parses its request's body with `JSONRequest`; a body whose Content-Type says it is not JSON
    gets a 415 naming it (instead of a validation error about its shape)."""

    def get_route_handler(self):
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route_handler(request: Request):
            if takes_body and not json_media_type(request.headers.get("content-type")):
                given = request.headers.get("content-type")
                return JSONResponse({"detail": f"the body must be JSON: the request has Content-Type {given!r}; "
                                               "send it as application/json"}, status_code=415,
                                    headers={"connection": "close"})  # its unread body goes with the connection
            if takes_body and not request.headers.get("content-type"):  # none given: read as JSON all the same
                scope = {**request.scope, "headers": [*[(k, v) for k, v in request.scope["headers"]
                                                         if k != b"content-type"],
                                                       (b"content-type", b"application/json")]}
                return await handler(JSONRequest(scope, request.receive))
            return await handler(JSONRequest(request.scope, request.receive))

        return route_handler


class RateLimiter:
    """Per-key sliding one-minute window plus a cap on requests in flight."""

    def __init__(self, per_minute: int, inflight: int):
        for name, value in (("per_minute", per_minute), ("inflight", inflight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.per_minute, self.inflight_cap = per_minute, inflight
        self.hits: dict[str, list[float]] = {}
        self.inflight: dict[str, int] = {}

    def check(self, key_id: str) -> float | None:
        """Seconds to wait before retrying, or None when allowed (and counted)."""
        now = time.monotonic()
        window = [t for t in self.hits.get(key_id, []) if now - t < 60]
        self.hits[key_id] = window
        if len(window) >= self.per_minute:
            return max(1.0, 60 - (now - window[0]))
        if self.inflight.get(key_id, 0) >= self.inflight_cap:
            return 1.0
        window.append(now)
        return None

    @contextmanager
    def in_flight(self, key_id: str):
        """Count a request of `key_id` as in flight (against `inflight`) while the block runs."""
        self.inflight[key_id] = self.inflight.get(key_id, 0) + 1
        try:
            yield
        finally:
            self.inflight[key_id] -= 1
