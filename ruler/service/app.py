"""The judging service: FastAPI app with API keys, limits, persistent jobs, idempotency and metrics.

    POST /v1/score        one group, judged now          GET /healthz   liveness, open
    POST /v1/jobs         many groups, 202 + job id      GET /metrics   Prometheus (key optional)
    GET  /v1/jobs/{id}    status and results so far      /docs          the OpenAPI contract
    DELETE /v1/jobs/{id}  cancel what has not started
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
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from judges.errors import JudgeConfigError, JudgeError
from ruler.advantages import group_advantages
from ruler.scoring import ruler_score_group
from ruler.service.store import Store
from ruler.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger("ruler.service")


@dataclass
class ServiceConfig:
    """Everything `ruler serve` can set. Limits answer 413/422/429 with the offending field named."""

    db_path: str = "ruler-service.db"
    judge_model: str | None = None            # default judge (None: $RULER_JUDGE_MODEL or the embedded one)
    judge_params: dict = field(default_factory=dict)  # api_base, api_key, ... for the judge (never from clients)
    allowed_judges: list[str] | None = None   # judge models clients may ask for; None: only the default
    max_body_bytes: int = 8 * 1024 * 1024
    max_trajectories: int = 256
    max_messages: int = 512
    max_message_chars: int = 200_000
    max_groups_per_job: int = 1000
    rate_per_minute: int = 600                # requests per key per minute
    max_inflight_per_key: int = 32            # concurrent /v1/score requests per key
    judge_timeout_s: float = 600.0            # one group's judging; past it the group is an error result
    body_timeout_s: float = 30.0              # longest wait for the next piece of a request body (slow-loris)
    worker_concurrency: int = 8
    metrics_require_key: bool = False
    cache: object = None                      # passed to ruler_score_group (None: default judge cache)


class BodyTimeout:
    """ASGI middleware against slow-loris bodies: each piece of a request body must arrive within
    `seconds` of the previous one, else the client gets 408 and the request is abandoned."""

    def __init__(self, app, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_done = False
        timed_out = False

        async def timed_receive():
            nonlocal body_done, timed_out
            if body_done or timed_out:
                return await receive() if not timed_out else {"type": "http.disconnect"}
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except asyncio.TimeoutError:
                timed_out = True
                payload = json.dumps({"detail": f"request body too slow: nothing for {self.seconds:g} s"}).encode()
                await send({"type": "http.response.start", "status": 408,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(payload)).encode())]})
                await send({"type": "http.response.body", "body": payload})
                return {"type": "http.disconnect"}  # the app below gives up on this request
            if message["type"] != "http.request" or not message.get("more_body"):
                body_done = True
            return message

        async def guarded_send(message):
            if not timed_out:  # after a 408 nothing else may be sent
                await send(message)

        await self.app(scope, timed_receive, guarded_send)


class GroupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    trajectories: list[Trajectory]
    metadata: dict = {}


class ScoreOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    judge_model: str | None = None
    rubric: str | None = None
    num_permutations: int = Field(1, ge=1, le=8)
    max_prompt_tokens: int | None = Field(None, ge=256)

    def judge_options(self, judge_model: str | None) -> dict:
        """What the judging needs, with the judge the service resolved (stored with jobs as JSON)."""
        return {"judge_model": judge_model, "rubric": self.rubric, "num_permutations": self.num_permutations,
                "max_prompt_tokens": self.max_prompt_tokens}


class ScoreRequest(ScoreOptions):
    trajectories: list[Trajectory]
    metadata: dict = {}


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


def _limits(cfg: ServiceConfig, groups: list[list[Trajectory]], where: str) -> None:
    for g, trajectories in enumerate(groups):
        base = f"{where}[{g}]" if where == "groups" else ""
        if not trajectories:
            raise HTTPException(422, [{"loc": ["body", *([where, g] if base else []), "trajectories"],
                                       "msg": "a group needs at least one trajectory"}])
        if len(trajectories) > cfg.max_trajectories:
            raise HTTPException(422, [{"loc": ["body", *([where, g] if base else []), "trajectories"],
                                       "msg": f"at most {cfg.max_trajectories} trajectories per group"}])
        for t, traj in enumerate(trajectories):
            msgs = traj.messages()
            loc = ["body", *([where, g] if base else []), "trajectories", t, "messages_and_choices"]
            if len(msgs) > cfg.max_messages:
                raise HTTPException(422, [{"loc": loc, "msg": f"at most {cfg.max_messages} messages per trajectory"}])
            for m, msg in enumerate(msgs):
                content = msg.get("content") if isinstance(msg, dict) else None
                if isinstance(content, str) and len(content) > cfg.max_message_chars:
                    raise HTTPException(422, [{"loc": [*loc, m, "content"],
                                               "msg": f"at most {cfg.max_message_chars} characters per message"}])


def create_app(cfg: ServiceConfig) -> FastAPI:
    store = Store(cfg.db_path)
    metrics = Metrics()
    limiter = RateLimiter(cfg.rate_per_minute, cfg.max_inflight_per_key)
    from ruler.service.worker import JobWorker

    worker = JobWorker(store, cfg, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await worker.stop()

    app = FastAPI(title="ruler-rl judging service", version="0.1.0", lifespan=lifespan)
    app.state.store, app.state.worker, app.state.config = store, worker, cfg

    @app.middleware("http")
    async def observe(request: Request, call_next):
        started = time.perf_counter()
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cfg.max_body_bytes):
            response = JSONResponse({"detail": f"request body over {cfg.max_body_bytes} bytes"}, status_code=413)
        else:
            try:
                response = await call_next(request)
            except Exception:  # never let one request take the service down
                log.exception("unhandled error")
                response = JSONResponse({"detail": "internal error"}, status_code=500)
        path = request.scope.get("route").path if request.scope.get("route") else "other"
        elapsed = time.perf_counter() - started
        metrics.requests.labels(path, str(response.status_code)).inc()
        metrics.latency.labels(path).observe(elapsed)
        log.info(json.dumps({"event": "request", "method": request.method, "path": request.url.path,
                             "status": response.status_code, "ms": round(elapsed * 1000, 2)}))
        return response

    app.add_middleware(BodyTimeout, seconds=cfg.body_timeout_s)  # outermost: wraps every body read

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
        raise HTTPException(422, [{"loc": ["body", "judge_model"], "msg": f"judge {requested!r} is not offered here"}])

    def idempotent(key_id: str, idem: str | None, body: BaseModel):
        if not idem:
            return None, None
        digest = hashlib.sha256(body.model_dump_json().encode()).hexdigest()
        found = store.idempotent_response(key_id, idem)
        if found is None:
            return None, digest
        if found["request_hash"] != digest:
            raise HTTPException(422, "Idempotency-Key was already used with a different request body")
        return JSONResponse(found["response"], status_code=found["status"]), digest

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "queue_depth": store.queue_depth()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics_endpoint(authorization: str | None = Header(None)):
        if cfg.metrics_require_key:
            require_key(authorization)
        metrics.queue.set(store.queue_depth())
        return PlainTextResponse(generate_latest(metrics.registry).decode())

    @app.post("/v1/score", response_model=ScoreResponse)
    async def score(body: ScoreRequest, key_id: str = Depends(rate_limited),
                    idempotency_key: str | None = Header(None)):
        replay, digest = idempotent(key_id, idempotency_key, body)
        if replay is not None:
            return replay
        _limits(cfg, [body.trajectories], "trajectories")
        limiter.inflight[key_id] = limiter.inflight.get(key_id, 0) + 1
        try:
            result = await score_group(TrajectoryGroup(body.trajectories, metadata=body.metadata), body, judge_for(body.judge_model))
        finally:
            limiter.inflight[key_id] -= 1
        if digest:
            store.save_idempotent_response(key_id, idempotency_key, digest, 200, result)
        return result

    async def score_group(group: TrajectoryGroup, opts: ScoreOptions, judge: str | None) -> dict:
        try:
            scored = await judge_with_config(cfg, group, opts.judge_options(judge))
        except asyncio.TimeoutError:
            metrics.errors.labels("timeout").inc()
            raise HTTPException(504, f"the judge did not answer within {cfg.judge_timeout_s:g} s")
        except (JudgeConfigError, ValueError, TypeError) as exc:
            metrics.errors.labels("bad_request").inc()
            raise HTTPException(422, str(exc))
        except JudgeError as exc:
            metrics.errors.labels("judge").inc()
            raise HTTPException(503, f"judge failed: {exc}", headers={"Retry-After": "5"})
        return group_result(scored, metrics)

    @app.post("/v1/jobs", status_code=202)
    async def create_job(body: JobRequest, key_id: str = Depends(rate_limited),
                         idempotency_key: str | None = Header(None)):
        replay, digest = idempotent(key_id, idempotency_key, body)
        if replay is not None:
            return replay
        if not body.groups:
            raise HTTPException(422, [{"loc": ["body", "groups"], "msg": "a job needs at least one group"}])
        if len(body.groups) > cfg.max_groups_per_job:
            raise HTTPException(422, [{"loc": ["body", "groups"], "msg": f"at most {cfg.max_groups_per_job} groups"}])
        _limits(cfg, [g.trajectories for g in body.groups], "groups")
        options = body.judge_options(judge_for(body.judge_model))
        job_id = store.create_job(key_id, [g.model_dump(mode="json") for g in body.groups], options)
        worker.wake()
        answer = {"job_id": job_id, "status": "pending", "groups": len(body.groups)}
        if digest:
            store.save_idempotent_response(key_id, idempotency_key, digest, 202, answer)
        return answer

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, key_id: str = Depends(require_key)):
        job = store.job(job_id, key_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id!r} for this key")
        return {"job_id": job["id"], "status": job["status"], "groups": len(job["groups"]),
                "done": sum(g["status"] in ("done", "error", "cancelled") for g in job["groups"]),
                "results": [{"index": g["idx"], "status": g["status"],
                             "result": json.loads(g["result"]) if g["result"] else None, "error": g["error"]}
                            for g in job["groups"]]}

    @app.delete("/v1/jobs/{job_id}")
    def cancel_job(job_id: str, key_id: str = Depends(require_key)):
        if store.job(job_id, key_id) is None:
            raise HTTPException(404, f"no job {job_id!r} for this key")
        return {"job_id": job_id, "cancelled": store.cancel_job(job_id, key_id)}

    return app


async def judge_with_config(cfg: ServiceConfig, group: TrajectoryGroup, options: dict) -> TrajectoryGroup:
    """`ruler_score_group` as the service runs it: its judge credentials, cache and time limit, and the
    client's options (judge_model, rubric, num_permutations, max_prompt_tokens). Raises asyncio.TimeoutError."""
    return await asyncio.wait_for(ruler_score_group(
        group, options.get("judge_model"), dict(cfg.judge_params) or None, options.get("rubric") or "default",
        cache=cfg.cache, num_permutations=options.get("num_permutations") or 1,
        max_prompt_tokens=options.get("max_prompt_tokens")), cfg.judge_timeout_s)


def group_result(scored: TrajectoryGroup, metrics: Metrics | None = None) -> dict:
    """The answer for one scored group: scores with advantages, the scored group itself, usage."""
    meta = scored.metadata
    if metrics is not None:
        metrics.judge_calls.inc(int(meta.get("judge_calls") or 0))
        if meta.get("judge_cached"):
            metrics.cache_hits.inc()
    rewards = [t.reward for t in scored.trajectories]
    adv = group_advantages(rewards) if rewards else []
    return {
        "scores": [{"trajectory_id": str(i), "score": t.reward, "advantage": a,
                    "explanation": next((x.removeprefix("RULER explanation: ") for x in t.logs
                                         if x.startswith("RULER explanation: ")), "")}
                   for i, (t, a) in enumerate(zip(scored.trajectories, adv), 1)],
        "group": scored.model_dump(mode="json"),
        "usage": {k: meta.get(k) for k in ("judge_calls", "judge_prompt_tokens", "judge_completion_tokens", "judge_cost")},
        "cached": bool(meta.get("judge_cached")),
        "judge_model": str(meta.get("judge_model", "")),
    }
