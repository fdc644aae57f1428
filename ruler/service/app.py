"""The judging service: FastAPI app with API keys, limits, persistent jobs, idempotency and metrics.

    POST /v1/score        one group, judged now          GET /healthz   open; 503 if the DB or worker fails
    POST /v1/jobs         many groups, 202 + job id      GET /metrics   Prometheus (key optional)
    GET  /v1/jobs/{id}    status and results so far      /docs          the OpenAPI contract
    DELETE /v1/jobs/{id}  cancel: waiting groups are dropped, groups being judged are stopped

What a client sends never reaches the filesystem, a URL or a subprocess of its choosing: a rubric is
a library name (or one from the operator's `rubric_dir`, read once at start) or the rubric text, never
a path; a judge is the default or one of `allowed_judges`; an `api_base` must be one of
`allowed_api_bases` (none by default). Every group passes `validate_trajectories` with the service's
`Limits` before it is judged or queued; the body limit counts the bytes that arrive (chunked or not).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from judges.completion import RetryPolicy
from judges.errors import JudgeConfigError, JudgeError, JudgeInputError, JudgeOutputError, JudgeUnavailableError
from judges.rubrics import MAX_RUBRIC_CHARS, RUBRICS, RubricText, get_rubric, load_rubric_folder
from ruler.results import score_rows
from ruler.scoring import MAX_PERMUTATIONS, MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS, ruler_score_group
from ruler.service.store import Store
from ruler.trajectory import (MAX_PROBLEMS, History, Limits, MetadataValue, Trajectory, TrajectoryError,
                              TrajectoryGroup, unknown_field, validate_trajectories)

log = logging.getLogger("ruler.service")


@dataclass
class ServiceConfig:
    """Everything `ruler serve` can set. Limits answer 413/422/429 with the offending field named."""

    db_path: str = "ruler-service.db"
    judge_model: str | None = None            # default judge (None: $RULER_JUDGE_MODEL or the embedded one)
    judge_params: dict = field(default_factory=dict)  # api_base, api_key, ... for the judge (never from clients)
    allowed_judges: list[str] | None = None   # judge models clients may ask for; None: only the default
    allowed_api_bases: list[str] = field(default_factory=list)  # api_base values clients may send; none by default
    rubric_dir: str | None = None             # the operator's named rubrics (<name>.txt|.md), read once at start
    max_body_bytes: int = 8 * 1024 * 1024     # counted as the bytes arrive, chunked bodies included
    max_trajectories: int = 256
    max_messages: int = 512                   # per conversation
    max_message_chars: int = 200_000          # per message (text, tool-call arguments, other fields)
    max_json_depth: int = 32                  # nesting inside a message or a tool schema
    max_groups_per_job: int = 1000
    max_permutations: int = 8                 # the most orderings (k) a request may ask for
    max_prompt_tokens: int | None = None      # ceiling on any judge prompt (None: the judge's context)
    rate_per_minute: int = 600                # requests per key per minute
    max_inflight_per_key: int = 32            # concurrent /v1/score requests per key
    judge_timeout_s: float = 600.0            # one group's judging; past it the group is an error result
    judge_retries: int = 4                    # retries of one judge call on 429/5xx/timeouts, within the above
    body_timeout_s: float = 60.0              # the whole request body must arrive within this of its headers: 408
    worker_concurrency: int = 8
    max_group_attempts: int = 3               # a job group whose judge stays unavailable is tried this often
    group_retry_s: float = 5.0                # wait before a group's 2nd attempt; doubles each time, <= 300 s
    metrics_require_key: bool = False
    cache: object = None                      # passed to ruler_score_group (None: default judge cache)

    def __post_init__(self):
        def check(name: str, low: float, high: float | None = None, integer: bool = True):
            value = getattr(self, name)
            ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
            if not ok or not (low <= value and (high is None or value <= high)):
                bound = f"from {low} to {high}" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} {bound}, got {value!r}")

        for name in ("max_body_bytes", "max_trajectories", "max_messages", "max_message_chars", "max_json_depth",
                     "max_groups_per_job", "rate_per_minute", "max_inflight_per_key", "worker_concurrency"):
            check(name, 1)
        check("max_permutations", 1, MAX_PERMUTATIONS)
        check("judge_retries", 0, 19)
        check("max_group_attempts", 1, 100)
        for name in ("judge_timeout_s", "body_timeout_s", "group_retry_s"):
            check(name, 0.001, integer=False)
        if self.max_prompt_tokens is not None:
            check("max_prompt_tokens", MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
        if not isinstance(self.judge_params, dict):
            raise TypeError("judge_params must be a dict")

    @property
    def limits(self) -> Limits:
        return Limits(max_trajectories=self.max_trajectories, max_messages=self.max_messages,
                      max_message_chars=self.max_message_chars, max_depth=self.max_json_depth)


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


class JSONRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route_handler(request: Request):
            return await handler(JSONRequest(request.scope, request.receive))

        return route_handler


class GroupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = {}


class ScoreOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    judge_model: str | None = Field(None, min_length=1, max_length=256,
                                    description="A judge the service offers; default: its own.")
    api_base: str | None = Field(None, min_length=1, max_length=2048,
                                 description="Only one of the addresses the operator allowed (--allow-api-base).")
    rubric: str | None = Field(None, min_length=1, max_length=MAX_RUBRIC_CHARS,
                               description="A rubric name or the rubric text; never a path.")
    num_permutations: int = Field(1, ge=1, le=MAX_PERMUTATIONS, strict=True)
    max_prompt_tokens: int | None = Field(None, ge=MIN_PROMPT_TOKENS, le=MAX_PROMPT_TOKENS, strict=True)


class ScoreRequest(ScoreOptions):
    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = {}


class JobRequest(ScoreOptions):
    groups: list[GroupIn]


class ScoreOut(BaseModel):
    trajectory_id: str
    score: float
    advantage: float
    explanation: str


class ScoreResponse(BaseModel):
    scores: list[ScoreOut]
    group: dict
    usage: dict
    cached: bool
    judge_model: str


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("ruler_requests_total", "HTTP requests", ["path", "status"], registry=self.registry)
        self.latency = Histogram("ruler_request_seconds", "HTTP request latency", ["path"], registry=self.registry)
        self.judge_calls = Counter("ruler_judge_calls_total", "Judge LLM calls made", registry=self.registry)
        self.cache_hits = Counter("ruler_cache_hits_total", "Groups answered from the judge cache", registry=self.registry)
        self.errors = Counter("ruler_errors_total", "Groups that failed", ["kind"], registry=self.registry)
        self.queue = Gauge("ruler_queue_depth", "Job groups waiting or running", registry=self.registry)


class RateLimiter:
    """Per-key sliding one-minute window plus a cap on requests in flight."""

    def __init__(self, per_minute: int, inflight: int):
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


REQUEST_FIELDS = {*ScoreRequest.model_fields, *JobRequest.model_fields, *GroupIn.model_fields,
                  *Trajectory.model_fields, *History.model_fields}
MAX_IDEMPOTENCY_KEY_CHARS = 200


def _check_group(cfg: ServiceConfig, trajectories: list[Trajectory], metadata: dict, where: list) -> None:
    """422 naming each problem (trajectory index and field) unless the group passes `validate_trajectories`."""
    if not trajectories:
        raise HTTPException(422, [{"loc": [*where, "trajectories"], "msg": "a group needs at least one trajectory",
                                   "type": "value_error"}])
    try:
        validate_trajectories(TrajectoryGroup(trajectories, metadata=metadata), limits=cfg.limits)
    except TrajectoryError as exc:
        raise HTTPException(422, [{"loc": [*where, *(("trajectories",) if not p.loc or isinstance(p.loc[0], int)
                                                     else ()), *p.loc],
                                   "msg": str(p), "type": "value_error"} for p in exc.problems]) from None


def _validation_detail(exc: RequestValidationError) -> list[dict]:
    """pydantic's errors without the echoed input; unknown fields and bad JSON said in words."""
    out = []
    for e in exc.errors()[:MAX_PROBLEMS]:
        loc = [p for p in e.get("loc", ()) if p not in ("Choice", "dict[str,any]")]
        if e.get("type") == "extra_forbidden":
            msg = unknown_field(str(loc[-1]), REQUEST_FIELDS)
        elif e.get("type") == "json_invalid":
            msg = f"invalid JSON: {(e.get('ctx') or {}).get('error', 'cannot be parsed')}"
        else:
            msg = e.get("msg", "invalid")
        out.append({"loc": loc, "msg": msg, "type": e.get("type", "value_error")})
    return out


def create_app(cfg: ServiceConfig) -> FastAPI:
    store = Store(cfg.db_path)
    metrics = Metrics()
    limiter = RateLimiter(cfg.rate_per_minute, cfg.max_inflight_per_key)
    rubrics = load_rubric_folder(cfg.rubric_dir) if cfg.rubric_dir else {}
    from ruler.service.worker import JobWorker

    worker = JobWorker(store, cfg, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await worker.start()
        yield
        await worker.stop()

    app = FastAPI(title="ruler-rl judging service", version="0.1.0", lifespan=lifespan)
    app.router.route_class = JSONRoute
    app.state.store, app.state.worker, app.state.config = store, worker, cfg
    app.add_middleware(RequestGuard, max_bytes=cfg.max_body_bytes, body_timeout_s=cfg.body_timeout_s, metrics=metrics)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _validation_detail(exc)}, status_code=422)

    def require_key(authorization: str | None = Header(None)) -> str:
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(401, "missing API key: send Authorization: Bearer <key>",
                                headers={"WWW-Authenticate": "Bearer"})
        key_id = store.key_id_for(authorization.removeprefix("Bearer ").strip())
        if key_id is None:
            raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
        return key_id

    def rate_limited(key_id: str = Depends(require_key)) -> str:
        wait = limiter.check(key_id)
        if wait is not None:
            raise HTTPException(429, "rate limit reached for this key", headers={"Retry-After": str(int(wait + 0.999))})
        return key_id

    def judge_for(requested: str | None) -> str | None:
        if requested is None or requested == cfg.judge_model:
            return cfg.judge_model
        if cfg.allowed_judges is not None and requested in cfg.allowed_judges:
            return requested
        raise HTTPException(422, [{"loc": ["body", "judge_model"], "msg": f"judge {requested!r} is not offered here",
                                   "type": "value_error"}])

    def options_for(body: ScoreOptions) -> dict:
        """The judging options as stored with a job: the judge and rubric resolved, every limit checked."""
        def refuse(name: str, msg: str):
            raise HTTPException(422, [{"loc": ["body", name], "msg": msg, "type": "value_error"}])

        if body.api_base is not None and not api_base_allowed(cfg, body.api_base):
            refuse("api_base", f"api_base {body.api_base!r} is not allowed here: the service only calls judge "
                               "addresses its operator allowed")
        if body.num_permutations > cfg.max_permutations:
            refuse("num_permutations", f"at most {cfg.max_permutations} orderings here")
        if cfg.max_prompt_tokens and body.max_prompt_tokens and body.max_prompt_tokens > cfg.max_prompt_tokens:
            refuse("max_prompt_tokens", f"at most {cfg.max_prompt_tokens} here")
        try:
            rubric = get_rubric(body.rubric or "default", library=rubrics)
        except JudgeConfigError as exc:
            refuse("rubric", str(exc))
        return {"judge_model": judge_for(body.judge_model), "api_base": body.api_base, "rubric": rubric,
                "rubric_resolved": True, "num_permutations": body.num_permutations,
                "max_prompt_tokens": body.max_prompt_tokens or cfg.max_prompt_tokens}

    async def idempotent(key_id: str, idem: str | None, request: Request):
        """(a stored answer to replay or None, the request's digest or None). Called once the request passed
        every check; the digest is of the bytes the client sent, so nothing is serialised again here."""
        if not idem:
            return None, None
        digest = hashlib.sha256(await request.body()).hexdigest()
        found = store.idempotent_response(key_id, idem)
        if found is None:
            return None, digest
        if found["request_hash"] != digest:
            raise HTTPException(422, "Idempotency-Key was already used with a different request body")
        return JSONResponse(found["response"], status_code=found["status"]), digest

    @app.get("/healthz")
    def healthz():
        """200 while the database answers and the job worker runs; 503 saying which is not."""
        state = worker.health()
        try:
            depth = store.queue_depth()
        except Exception as exc:
            log.warning("healthz: the database did not answer: %s: %s", type(exc).__name__, exc)
            return JSONResponse({"status": "error", "database": "unavailable", **state}, status_code=503)
        if state["worker"] != "running":
            return JSONResponse({"status": "error", "queue_depth": depth, **state}, status_code=503)
        return {"status": "ok", "queue_depth": depth, **state}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics_endpoint(authorization: str | None = Header(None)):
        if cfg.metrics_require_key:
            require_key(authorization)
        metrics.queue.set(store.queue_depth())
        return PlainTextResponse(generate_latest(metrics.registry).decode())

    def check_idempotency_key(idem: str | None) -> None:
        if idem and len(idem) > MAX_IDEMPOTENCY_KEY_CHARS:
            raise HTTPException(422, [{"loc": ["header", "idempotency-key"], "type": "value_error",
                                       "msg": f"at most {MAX_IDEMPOTENCY_KEY_CHARS} characters"}])

    @app.post("/v1/score", response_model=ScoreResponse)
    async def score(body: ScoreRequest, request: Request, key_id: str = Depends(rate_limited),
                    idempotency_key: str | None = Header(None)):
        check_idempotency_key(idempotency_key)
        _check_group(cfg, body.trajectories, body.metadata, ["body"])
        options = options_for(body)
        replay, digest = await idempotent(key_id, idempotency_key, request)
        if replay is not None:
            return replay
        limiter.inflight[key_id] = limiter.inflight.get(key_id, 0) + 1
        try:
            result = await score_group(TrajectoryGroup(body.trajectories, metadata=body.metadata), options)
        finally:
            limiter.inflight[key_id] -= 1
        if digest:
            store.save_idempotent_response(key_id, idempotency_key, digest, 200, result)
        return result

    async def score_group(group: TrajectoryGroup, options: dict) -> dict:
        try:
            scored = await judge_with_config(cfg, group, options)
        except TimeoutError:
            metrics.errors.labels("timeout").inc()
            raise HTTPException(504, f"the judge did not answer within {cfg.judge_timeout_s:g} s")
        except (JudgeConfigError, ValueError, TypeError) as exc:
            metrics.errors.labels("bad_request").inc()
            log.warning("group not judged: %s: %s", type(exc).__name__, exc)
            raise HTTPException(422, public_error(exc))
        except JudgeError as exc:
            metrics.errors.labels("judge").inc()
            log.warning("group not judged: %s: %s", type(exc).__name__, exc)
            raise HTTPException(503, f"judge failed: {public_error(exc)}", headers={"Retry-After": "5"})
        return group_result(scored, metrics)

    @app.post("/v1/jobs", status_code=202)
    async def create_job(body: JobRequest, request: Request, key_id: str = Depends(rate_limited),
                         idempotency_key: str | None = Header(None)):
        check_idempotency_key(idempotency_key)
        if not body.groups:
            raise HTTPException(422, [{"loc": ["body", "groups"], "msg": "a job needs at least one group",
                                       "type": "value_error"}])
        if len(body.groups) > cfg.max_groups_per_job:
            raise HTTPException(422, [{"loc": ["body", "groups"], "msg": f"at most {cfg.max_groups_per_job} groups",
                                       "type": "value_error"}])
        for g, group in enumerate(body.groups):
            _check_group(cfg, group.trajectories, group.metadata, ["body", "groups", g])
        options = options_for(body)
        replay, digest = await idempotent(key_id, idempotency_key, request)
        if replay is not None:
            return replay
        job_id = store.create_job(key_id, [g.model_dump(mode="json") for g in body.groups], options)
        worker.wake()
        answer = {"job_id": job_id, "status": "pending", "groups": len(body.groups)}
        if digest:
            store.save_idempotent_response(key_id, idempotency_key, digest, 202, answer)
        return answer

    @app.get("/v1/jobs/{job_id}")
    def job_status(job_id: str, key_id: str = Depends(require_key)):
        job = store.job(job_id, key_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} for this key")
        return {"job_id": job["id"], "status": job["status"], "groups": len(job["groups"]),
                "done": sum(g["status"] in ("done", "error", "cancelled") for g in job["groups"]),
                "results": [{"index": g["idx"], "status": g["status"], "attempts": g["attempts"],
                             "result": json.loads(g["result"]) if g["result"] else None, "error": g["error"]}
                            for g in job["groups"]]}

    @app.delete("/v1/jobs/{job_id}")
    async def cancel_job(job_id: str, key_id: str = Depends(require_key)):
        if store.job(job_id, key_id) is None:
            raise HTTPException(404, f"no job {job_id!r} for this key")
        cancelled = store.cancel_job(job_id, key_id)
        if cancelled:
            await worker.cancel_job(job_id)  # groups being judged stop now; their results are never written
        return {"job_id": job_id, "cancelled": cancelled}

    return app


def public_error(exc: BaseException) -> str:
    """What a client is told about a failure while its group was judged. A message about the client's own
    request (`TrajectoryError`, `JudgeInputError`) is passed on; any other says only what kind of failure it
    was: the judge's addresses, credentials and replies stay in the service's log."""
    if isinstance(exc, (TrajectoryError, JudgeInputError)):
        return str(exc)
    if isinstance(exc, JudgeUnavailableError):
        return "the judge is unavailable (details in the service's log)"
    if isinstance(exc, JudgeOutputError):
        return "the judge's answers held no valid scores (details in the service's log)"
    if isinstance(exc, JudgeConfigError):
        return "the judge refused the request or is misconfigured (details in the service's log)"
    return "the group could not be judged (details in the service's log)"


def api_base_allowed(cfg: ServiceConfig, api_base: str) -> bool:
    return api_base.rstrip("/") in {a.rstrip("/") for a in cfg.allowed_api_bases}


def checked_options(cfg: ServiceConfig, options: dict) -> dict:
    """A job's stored options checked again against the service as it is configured now (a job stored by an
    older process, or before the operator narrowed what clients may choose): the judge, api_base,
    num_permutations and max_prompt_tokens must still be allowed. JudgeInputError names the first that is not.
    The rubric is the text the endpoint resolved (`rubric_resolved`), never looked up again; a job stored
    before rubrics were resolved may hold a built-in name, which is looked up."""
    if not isinstance(options, dict):
        raise JudgeConfigError("the job's stored options are not an object")
    judge = options.get("judge_model")
    if judge is not None and judge != cfg.judge_model and judge not in (cfg.allowed_judges or ()):
        raise JudgeInputError(f"judge {judge!r} is not offered here")
    api_base = options.get("api_base")
    if api_base is not None and (not isinstance(api_base, str) or not api_base_allowed(cfg, api_base)):
        raise JudgeInputError(f"api_base {api_base!r} is not allowed here")
    k = options.get("num_permutations") or 1
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg.max_permutations:
        raise JudgeInputError(f"num_permutations {k!r}: at most {cfg.max_permutations} orderings here")
    tokens = options.get("max_prompt_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not MIN_PROMPT_TOKENS <= tokens <= (cfg.max_prompt_tokens or MAX_PROMPT_TOKENS)):
        raise JudgeInputError(f"max_prompt_tokens {tokens!r}: from {MIN_PROMPT_TOKENS} to "
                               f"{cfg.max_prompt_tokens or MAX_PROMPT_TOKENS} here")
    rubric = options.get("rubric") or "default"
    if not isinstance(rubric, str) or len(rubric) > MAX_RUBRIC_CHARS:
        raise JudgeConfigError("the job's stored rubric is not rubric text")
    text = rubric if options.get("rubric_resolved") else RUBRICS.get(rubric, rubric)
    return {"judge_model": judge, "api_base": api_base, "rubric": RubricText(text), "num_permutations": k,
            "max_prompt_tokens": tokens}


async def judge_with_config(cfg: ServiceConfig, group: TrajectoryGroup, options: dict) -> TrajectoryGroup:
    """`ruler_score_group` as the service runs it: its judge credentials, cache, limits, retries and time limit,
    and the client's options as resolved by the endpoint (judge_model, api_base, rubric text, num_permutations,
    max_prompt_tokens), checked again by `checked_options`. Raises asyncio.TimeoutError past `judge_timeout_s`."""
    options = checked_options(cfg, options)
    params = dict(cfg.judge_params)
    if options["api_base"] is not None:
        params["api_base"] = options["api_base"]
    retry = RetryPolicy(attempts=cfg.judge_retries + 1)  # the whole group is bounded by judge_timeout_s below
    return await asyncio.wait_for(ruler_score_group(
        group, options["judge_model"], params or None, options["rubric"], cache=cfg.cache,
        num_permutations=options["num_permutations"], retry=retry, max_prompt_tokens=options["max_prompt_tokens"],
        limits=cfg.limits), cfg.judge_timeout_s)


def group_result(scored: TrajectoryGroup, metrics: Metrics | None = None) -> dict:
    """The answer for one scored group: scores with advantages, the scored group itself, usage."""
    meta = scored.metadata
    if metrics is not None:
        metrics.judge_calls.inc(int(meta.get("judge_calls") or 0))
        if meta.get("judge_cached"):
            metrics.cache_hits.inc()
    return {
        "scores": [row.model_dump() for row in score_rows(scored)],
        "group": scored.model_dump(mode="json"),
        "usage": {k: meta.get(k) for k in ("judge_calls", "judge_prompt_tokens", "judge_completion_tokens", "judge_cost")},
        "cached": bool(meta.get("judge_cached")),
        "judge_model": str(meta.get("judge_model", "")),
    }
