"""The job worker: judges the groups of accepted jobs in the background, committing each result.

It reads unfinished groups from the database, so after a crash or restart it picks up where the last
process stopped (a group that was running is judged again; its first result was never committed).
Every group ends: whatever goes wrong while judging it makes it `error` with a message (the exception's
type and what a client may be told, classified as /v1/score classifies it: `ruler_rl.service.judging.failure`;
the detail is logged), except a judge that is slow or unavailable (the group's time limit, or 429/5xx after
the call's own retries), which puts the group back with a backoff (`group_retry_s`, doubling, at most
`MAX_BACKOFF_S`) until `max_group_attempts` attempts are spent. An attempt is counted when a group is taken
up, so a process that dies while judging it spends one too, and at start groups at their budget are given
up (`error`), never resumed. Cancelling a job stops its groups in flight. On shutdown the worker stops
taking work and waits up to `grace_s` for groups in flight; any still running then are left for the next
process.

The database may fail (locked, disk full, I/O errors): a pass of the loop that fails is logged and tried
again with a backoff (`health()` says `failing` meanwhile, and `/healthz` answers 503); a group whose
result cannot be saved is ended `error` with a second, smaller write, and if that fails too, the loop
gives it up (`error`) once the database answers again, instead of leaving it `running` until a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from ruler_rl.service.config import ServiceConfig
from ruler_rl.service.judging import group_result, judge_with_config, judging_failed
from ruler_rl.service.metrics import Metrics
from ruler_rl.service.store import Store
from ruler_rl.trajectory import TrajectoryGroup, validate_trajectories

log = logging.getLogger("ruler.service")
MAX_BACKOFF_S = 300.0
LOOP_RETRY_S = (0.5, 30.0)  # a failed pass of the loop waits from the first to at most the second, doubling


class JobWorker:
    """Judges job groups in the background, `cfg.worker_concurrency` at a time (see the module's docstring)."""

    def __init__(self, store: Store, cfg: ServiceConfig, metrics: Metrics, grace_s: float = 30.0):
        if not isinstance(cfg, ServiceConfig):
            raise TypeError(f"JobWorker takes a ServiceConfig, got {type(cfg).__name__}")
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or grace_s < 0:
            raise ValueError(f"grace_s must be a number >= 0, got {grace_s!r}")
        self.store, self.cfg, self.metrics, self.grace_s = store, cfg, metrics, grace_s
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._inflight: dict[tuple[str, int], asyncio.Task] = {}
        self._cancelled: set[str] = set()  # jobs cancelled while this process runs: nothing more starts for them
        self._unsaved = False  # a group's end could not be written: give up stranded groups when the database answers
        self.failing: str | None = None  # why the last pass of the loop failed (None: it did not)
        self.failing_since: float | None = None

    async def start(self) -> None:
        self._wake = asyncio.Event()
        for row in await asyncio.to_thread(self.store.give_up_exhausted, self.cfg.max_group_attempts):
            log.warning(json.dumps({"event": "group_given_up", "job": row["job_id"], "index": row["idx"],
                                    "attempts": row["attempts"]}))
        self._task = asyncio.create_task(self._loop())

    def wake(self) -> None:
        self._wake.set()

    def health(self) -> dict:
        """{"worker": "running"}, or "failing" (its passes raise: since when, the error's type) or "stopped"."""
        if self._task is None or (self._task.done() and not self._stopping):
            return {"worker": "stopped"}
        if self.failing is not None:
            return {"worker": "failing", "error": self.failing,
                    "failing_for_s": round(time.time() - (self.failing_since or time.time()), 1)}
        return {"worker": "running"}

    def backoff(self, attempts: int) -> float:
        """Seconds before a group's next attempt after `attempts` found its judge unavailable."""
        return min(MAX_BACKOFF_S, self.cfg.group_retry_s * 2 ** (attempts - 1))

    async def cancel_job(self, job_id: str) -> None:
        """Stop the groups of `job_id` being judged now (the job is already marked cancelled)."""
        self._cancelled.add(job_id)
        tasks = [t for (j, _), t in list(self._inflight.items()) if j == job_id]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task:
            await self._task
        if self._inflight:
            _, pending = await asyncio.wait(list(self._inflight.values()), timeout=self.grace_s)
            for t in pending:  # left 'running' in the database: the next process resumes them (within budget)
                t.cancel()

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                await self._take_up_work()
            except Exception as exc:  # the database failed: log, wait, try again; /healthz says so meanwhile
                failures += 1
                self.failing, self.failing_since = type(exc).__name__, self.failing_since or time.time()
                wait = min(LOOP_RETRY_S[1], LOOP_RETRY_S[0] * 2 ** (failures - 1))
                log.exception("job worker: a pass failed (%d in a row); trying again in %g s", failures, wait)
                await asyncio.sleep(wait)
                continue
            failures, self.failing, self.failing_since = 0, None, None
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            except TimeoutError:
                pass

    async def _take_up_work(self) -> None:
        """One pass: give up stranded groups (if a write failed), then start groups up to the concurrency."""
        budget = self.cfg.max_group_attempts
        if self._unsaved:
            for row in await asyncio.to_thread(self.store.give_up_exhausted, budget, set(self._inflight),
                                               "the result of the last attempt could not be saved"):
                log.warning(json.dumps({"event": "group_given_up", "job": row["job_id"], "index": row["idx"],
                                        "attempts": row["attempts"]}))
            self._unsaved = False
        free = self.cfg.worker_concurrency - len(self._inflight)
        if free <= 0:
            return
        for row in await asyncio.to_thread(self.store.pending_groups, free + len(self._inflight), budget):
            key = (row["job_id"], row["idx"])
            if key in self._inflight or len(self._inflight) >= self.cfg.worker_concurrency:
                continue
            if not await asyncio.to_thread(self.store.mark_running, *key, budget):
                continue
            if row["job_id"] in self._cancelled:  # cancelled while it was being taken up
                continue
            task = asyncio.create_task(self._judge(row, row["attempts"] + 1))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, k=key: (self._inflight.pop(k, None), self._wake.set()))

    async def _judge(self, row: dict, attempt: int) -> None:
        result, error, retry = None, None, False
        try:
            options = json.loads(row["options"])  # checked again against the configuration by judge_with_config
            group = TrajectoryGroup.model_validate(json.loads(row["request"]))
            validate_trajectories(group, limits=self.cfg.limits)  # the same check the endpoints ran
            scored = await judge_with_config(self.cfg, group, options)
            result = group_result(scored, self.metrics).model_dump(mode="json")
        except asyncio.CancelledError:
            raise  # a cancelled job, or shutting down: the database already says what happens next
        except Exception as exc:  # classified as /v1/score does; a bug ends the group instead of looping on it
            failed = judging_failed(exc, self.cfg, self.metrics, f"job {row['job_id']} group {row['idx']}")
            error, retry = failed.job_error, failed.retry
        key = (row["job_id"], row["idx"])
        if retry and attempt < self.cfg.max_group_attempts:
            wait = self.backoff(attempt)
            try:
                await asyncio.to_thread(self.store.retry_later, *key, error, time.time() + wait)
            except Exception:  # left 'running' within its budget: the loop takes it up again
                log.exception("job %s group %s: could not put the group back in the queue", *key)
                return
            log.info(json.dumps({"event": "group", "job": key[0], "index": key[1], "status": "retry",
                                 "attempt": attempt, "retry_in_s": round(wait, 3)}))
            return
        if retry:
            error = f"gave up after {attempt} attempt(s): {error}"
        try:
            await asyncio.to_thread(self.store.finish_group, *key, result, error)
        except Exception as exc:
            log.exception("job %s group %s: could not save the group's %s", *key, "result" if error is None else "error")
            self.metrics.failed("internal")
            error = f"internal error: the result could not be saved ({type(exc).__name__})"
            try:
                await asyncio.to_thread(self.store.finish_group, *key, None, error)
            except Exception:
                log.exception("job %s group %s: could not save the error either; given up when the database answers",
                              *key)
                self._unsaved = True
                return
        log.info(json.dumps({"event": "group", "job": key[0], "index": key[1], "attempt": attempt,
                             "status": "done" if error is None else "error"}))
