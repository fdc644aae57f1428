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

Modules: `config` (what the operator sets), `models` (request and response bodies), `validation` (checks
before judging), `judging` (one group judged, failures classified), `routes`, `guard` (body limits, rate
limits), `metrics`, `worker` (background jobs) and `store` (SQLite).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ruler_rl.judges.rubrics import load_rubric_folder
from ruler_rl.service.config import ServiceConfig
from ruler_rl.service.guard import RateLimiter, RequestGuard
from ruler_rl.service.metrics import Metrics
from ruler_rl.service.routes import ROUTERS, Service
from ruler_rl.service.store import Store
from ruler_rl.service.validation import validation_detail
from ruler_rl.service.worker import JobWorker

__all__ = ["ServiceConfig", "create_app"]


def create_app(cfg: ServiceConfig) -> FastAPI:
    """The service for `cfg`, its database and rubric folder opened now (their errors come before serving);
    the job worker starts and stops with the app (`lifespan`), resuming the jobs the database holds."""
    if not isinstance(cfg, ServiceConfig):
        raise TypeError(f"create_app takes a ServiceConfig, got {type(cfg).__name__}")
    store, metrics = Store(cfg.db_path), Metrics()
    worker = JobWorker(store, cfg, metrics)
    service = Service(cfg=cfg, store=store, metrics=metrics, worker=worker,
                      limiter=RateLimiter(cfg.rate_per_minute, cfg.max_inflight_per_key),
                      rubrics=load_rubric_folder(cfg.rubric_dir) if cfg.rubric_dir else {})

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await worker.start()
        yield
        await worker.stop()

    app = FastAPI(title="ruler-rl judging service", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(RequestGuard, max_bytes=cfg.max_body_bytes, body_timeout_s=cfg.body_timeout_s, metrics=metrics)
    app.add_exception_handler(RequestValidationError, invalid_request)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request FastAPI could not parse or validate: 422 listing the problems (`validation_detail`)."""
    return JSONResponse({"detail": validation_detail(exc)}, status_code=422)
