"""Client for the judging service: `RulerClient` and `AsyncRulerClient` (same names, sync and async).

    client = RulerClient("http://judge.internal:8700", api_key="rk_...")
    scored = client.score_group(group)          # the same result shape as ruler_score_group(group)

429 and 503 answers are retried (honouring Retry-After) with tenacity; every call has a timeout.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, AbstractContextManager

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception, stop_after_attempt

from ruler_rl.trajectory import TrajectoryGroup

RETRY_STATUS = {429, 502, 503, 504}


class RulerServiceError(Exception):
    """The service refused or failed a request; `status` and `detail` say how."""

    def __init__(self, status: int, detail):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


def _retryable(exc: BaseException) -> bool:
    return (isinstance(exc, RulerServiceError) and exc.status in RETRY_STATUS) or isinstance(exc, httpx.TransportError)


def _wait(state) -> float:
    exc = state.outcome.exception() if state.outcome else None
    after = getattr(exc, "retry_after", None)
    return min(float(after), 60.0) if after is not None else min(0.5 * 2 ** (state.attempt_number - 1), 10.0)


def _check(response: httpx.Response) -> dict:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        err = RulerServiceError(response.status_code, detail)
        err.retry_after = response.headers.get("retry-after")
        raise err
    return response.json()


def _body(group: TrajectoryGroup, options: dict) -> dict:
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"score_group takes a TrajectoryGroup, got {type(group).__name__}")
    return {"trajectories": [t.model_dump(mode="json") for t in group.trajectories],
            "metadata": group.metadata, **{k: v for k, v in options.items() if v is not None}}


class RulerClient(AbstractContextManager):
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 660.0, attempts: int = 5):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                  headers={"Authorization": f"Bearer {api_key}"})
        self.attempts = attempts

    def _post(self, path: str, body: dict, headers: dict | None = None) -> dict:
        for attempt in Retrying(stop=stop_after_attempt(self.attempts), wait=_wait,
                                retry=retry_if_exception(_retryable), reraise=True):
            with attempt:
                return _check(self._http.post(path, json=body, headers=headers))

    def score_group(self, group: TrajectoryGroup, *, idempotency_key: str | None = None, **options) -> TrajectoryGroup:
        """Judge one group through the service; returns the scored group (as `ruler_score_group` does)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return TrajectoryGroup.model_validate(self._post("/v1/score", _body(group, options), headers)["group"])

    def submit_job(self, groups: list[TrajectoryGroup], **options) -> str:
        body = {"groups": [{"trajectories": [t.model_dump(mode="json") for t in g.trajectories],
                            "metadata": g.metadata} for g in groups],
                **{k: v for k, v in options.items() if v is not None}}
        return self._post("/v1/jobs", body)["job_id"]

    def job(self, job_id: str) -> dict:
        return _check(self._http.get(f"/v1/jobs/{job_id}"))

    def wait_job(self, job_id: str, *, poll_s: float = 0.5, timeout_s: float = 3600) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.job(job_id)
            if state["status"] in ("done", "cancelled") or time.monotonic() > deadline:
                return state
            time.sleep(poll_s)

    def close(self) -> None:
        self._http.close()

    def __exit__(self, *exc):
        self.close()


class AsyncRulerClient(AbstractAsyncContextManager):
    def __init__(self, base_url: str, api_key: str, *, timeout: float = 660.0, attempts: int = 5):
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout,
                                       headers={"Authorization": f"Bearer {api_key}"})
        self.attempts = attempts

    async def score_group(self, group: TrajectoryGroup, *, idempotency_key: str | None = None,
                          **options) -> TrajectoryGroup:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts), wait=_wait,
                                           retry=retry_if_exception(_retryable), reraise=True):
            with attempt:
                data = _check(await self._http.post("/v1/score", json=_body(group, options), headers=headers))
        return TrajectoryGroup.model_validate(data["group"])

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aexit__(self, *exc):
        await self.aclose()
