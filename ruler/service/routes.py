"""The service's routes, one router per area (scoring, jobs, operations), and the dependencies they share:
the service's parts (`Service`, on `app.state.service`), the caller's API key, its rate limit, and
`Idempotency-Key` replays."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from ruler_rl.service.config import ServiceConfig
from ruler_rl.service.guard import JSONRoute, RateLimiter
from ruler_rl.service.judging import group_result, judge_with_config, judging_failed
from ruler_rl.service.metrics import Metrics
from ruler_rl.service.models import (
    Cancelled,
    GroupResult,
    Health,
    JobCreated,
    JobRequest,
    JobStatus,
    ScoreRequest,
    ScoreResponse,
)
from ruler_rl.service.store import Store
from ruler_rl.service.validation import check_group, check_idempotency_key, check_job_size, resolved_options
from ruler_rl.service.worker import JobWorker
from ruler_rl.trajectory import TrajectoryGroup

log = logging.getLogger("ruler.service")


@dataclass
class Service:
    """The parts of one running service that its routes use."""

    cfg: ServiceConfig
    store: Store
    metrics: Metrics
    limiter: RateLimiter
    rubrics: dict[str, str]  # the operator's named rubrics (`rubric_dir`), read once at start
    worker: JobWorker


def service(request: Request) -> Service:
    """The running service the request reached."""
    return request.app.state.service


def key_id_for(svc: Service, authorization: str | None) -> str:
    """The id of the API key in an `Authorization: Bearer <key>` header; 401 if it is missing, unknown or revoked."""
    if not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "missing API key: send Authorization: Bearer <key>",
                            headers={"WWW-Authenticate": "Bearer"})
    key_id = svc.store.key_id_for(authorization.removeprefix("Bearer ").strip())
    if key_id is None:
        raise HTTPException(401, "unknown or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return key_id


def api_key(authorization: str | None = Header(None), svc: Service = Depends(service)) -> str:
    """Dependency: the caller's API key id (401 without a valid key)."""
    return key_id_for(svc, authorization)


def rate_limited(key_id: str = Depends(api_key), svc: Service = Depends(service)) -> str:
    """Dependency: the caller's API key id, once its rate limit let the request through (429 otherwise)."""
    wait = svc.limiter.check(key_id)
    if wait is not None:
        raise HTTPException(429, "rate limit reached for this key", headers={"Retry-After": str(int(wait + 0.999))})
    return key_id


async def answered_once(svc: Service, request: Request, key_id: str, idempotency_key: str | None, status: int,
                        answer: Callable[[], Awaitable[BaseModel]]) -> BaseModel | JSONResponse:
    """`answer()`, or with an `Idempotency-Key` the first answer to the same key and body again (422 for the
    same key with another body). Called once the request passed every check; the body compared is the bytes
    the client sent, so nothing is serialised again here."""
    if not idempotency_key:
        return await answer()
    digest = hashlib.sha256(await request.body()).hexdigest()
    found = svc.store.idempotent_response(key_id, idempotency_key)
    if found is not None:
        if found["request_hash"] != digest:
            raise HTTPException(422, "Idempotency-Key was already used with a different request body")
        return JSONResponse(found["response"], status_code=found["status"])
    result = await answer()
    svc.store.save_idempotent_response(key_id, idempotency_key, digest, status, result.model_dump(mode="json"))
    return result


def not_found(job_id: str) -> HTTPException:
    return HTTPException(404, f"no job {job_id!r} for this key")


# --- scoring -------------------------------------------------------------------------------------

scoring = APIRouter(prefix="/v1", tags=["scoring"], route_class=JSONRoute)


@scoring.post("/score", response_model=ScoreResponse)
async def score(body: ScoreRequest, request: Request, key_id: str = Depends(rate_limited),
                idempotency_key: str | None = Header(None), svc: Service = Depends(service)):
    """Judge one group now. 422: the request cannot be judged as sent; 503: the judge failed; 504: it was slow."""
    check_idempotency_key(idempotency_key)
    check_group(svc.cfg, body.trajectories, body.metadata, ["body"])
    options = resolved_options(svc.cfg, svc.rubrics, body)

    async def judged() -> ScoreResponse:
        with svc.limiter.in_flight(key_id):
            try:
                scored = await judge_with_config(svc.cfg, TrajectoryGroup(body.trajectories, metadata=body.metadata),
                                                 options)
            except Exception as exc:
                failed = judging_failed(exc, svc.cfg, svc.metrics, "/v1/score")
                raise HTTPException(failed.status, failed.detail,
                                    headers={"Retry-After": "5"} if failed.status == 503 else None) from None
        return group_result(scored, svc.metrics)

    return await answered_once(svc, request, key_id, idempotency_key, 200, judged)


# --- jobs ----------------------------------------------------------------------------------------

jobs = APIRouter(prefix="/v1", tags=["jobs"], route_class=JSONRoute)


@jobs.post("/jobs", status_code=202, response_model=JobCreated)
async def create_job(body: JobRequest, request: Request, key_id: str = Depends(rate_limited),
                     idempotency_key: str | None = Header(None), svc: Service = Depends(service)):
    """Accept many groups for judging in the background: each is checked, then all are stored, then 202."""
    check_idempotency_key(idempotency_key)
    check_job_size(svc.cfg, len(body.groups))
    for g, group in enumerate(body.groups):
        check_group(svc.cfg, group.trajectories, group.metadata, ["body", "groups", g])
    options = resolved_options(svc.cfg, svc.rubrics, body)

    async def accepted() -> JobCreated:
        job_id = svc.store.create_job(key_id, [g.model_dump(mode="json") for g in body.groups], options)
        svc.worker.wake()
        return JobCreated(job_id=job_id, groups=len(body.groups))

    return await answered_once(svc, request, key_id, idempotency_key, 202, accepted)


@jobs.get("/jobs/{job_id}", response_model=JobStatus)
def job_status(job_id: str, key_id: str = Depends(api_key), svc: Service = Depends(service)):
    """A job's status and every group's result or error so far (404: no such job for this key)."""
    job = svc.store.job(job_id, key_id)
    if job is None:
        raise not_found(job_id)
    return JobStatus(job_id=job["id"], status=job["status"], groups=len(job["groups"]),
                     done=sum(g["status"] in ("done", "error", "cancelled") for g in job["groups"]),
                     results=[GroupResult(index=g["idx"], status=g["status"], attempts=g["attempts"],
                                          result=json.loads(g["result"]) if g["result"] else None, error=g["error"])
                              for g in job["groups"]])


@jobs.delete("/jobs/{job_id}", response_model=Cancelled)
async def cancel_job(job_id: str, key_id: str = Depends(api_key), svc: Service = Depends(service)):
    """Cancel a job: waiting groups are dropped, groups being judged are stopped (`cancelled`: false if the job
    had already ended)."""
    if svc.store.job(job_id, key_id) is None:
        raise not_found(job_id)
    cancelled = svc.store.cancel_job(job_id, key_id)
    if cancelled:
        await svc.worker.cancel_job(job_id)  # groups being judged stop now; their results are never written
    return Cancelled(job_id=job_id, cancelled=cancelled)


# --- operations ----------------------------------------------------------------------------------

operations = APIRouter(tags=["operations"], route_class=JSONRoute)


@operations.get("/healthz", response_model=Health, response_model_exclude_none=True,
                responses={503: {"model": Health, "description": "The database or the job worker fails"}})
def healthz(svc: Service = Depends(service)):
    """200 while the database answers and the job worker runs; 503 saying which is not. Needs no key."""
    state = svc.worker.health()
    try:
        depth = svc.store.queue_depth()
    except Exception as exc:
        log.warning("healthz: the database did not answer: %s: %s", type(exc).__name__, exc)
        return JSONResponse(Health(status="error", database="unavailable", **state).model_dump(exclude_none=True),
                            status_code=503)
    if state["worker"] != "running":
        return JSONResponse(Health(status="error", queue_depth=depth, **state).model_dump(exclude_none=True),
                            status_code=503)
    return Health(status="ok", queue_depth=depth, **state)


@operations.get("/metrics", response_class=PlainTextResponse)
def metrics(authorization: str | None = Header(None), svc: Service = Depends(service)):
    """Prometheus metrics as text (an API key needed only with `metrics_require_key`)."""
    if svc.cfg.metrics_require_key:
        key_id_for(svc, authorization)
    return PlainTextResponse(svc.metrics.render(svc.store.queue_depth()))


ROUTERS = (scoring, jobs, operations)
