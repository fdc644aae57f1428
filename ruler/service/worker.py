"""The job worker: judges the groups of accepted jobs in the background, committing each result.

It reads unfinished groups from the database, so after a crash or restart it simply picks up where
the last process stopped (groups that were running are judged again; their first result was never
committed). On shutdown it stops taking work and waits up to `grace_s` for groups in flight; any still
running then stay unfinished in the database and are resumed by the next process.
"""

from __future__ import annotations

import asyncio
import json
import logging

from judges.errors import JudgeError
from ruler.trajectory import TrajectoryGroup

log = logging.getLogger("ruler.service")


class JobWorker:
    def __init__(self, store, cfg, metrics, grace_s: float = 30.0):
        self.store, self.cfg, self.metrics, self.grace_s = store, cfg, metrics, grace_s
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._inflight: dict[tuple[str, int], asyncio.Task] = {}

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task:
            await self._task
        if self._inflight:
            done, pending = await asyncio.wait(list(self._inflight.values()), timeout=self.grace_s)
            for t in pending:  # left 'running' in the database: the next process resumes them
                t.cancel()

    async def _loop(self) -> None:
        while not self._stopping:
            free = self.cfg.worker_concurrency - len(self._inflight)
            if free > 0:
                for row in await asyncio.to_thread(self.store.pending_groups, free + len(self._inflight)):
                    key = (row["job_id"], row["idx"])
                    if key in self._inflight or len(self._inflight) >= self.cfg.worker_concurrency:
                        continue
                    if not await asyncio.to_thread(self.store.mark_running, *key):
                        continue
                    task = asyncio.create_task(self._judge(row))
                    self._inflight[key] = task
                    task.add_done_callback(lambda _t, k=key: (self._inflight.pop(k, None), self._wake.set()))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    async def _judge(self, row: dict) -> None:
        from ruler.service.app import group_result, judge_with_config

        options = json.loads(row["options"])
        result, error = None, None
        try:
            group = TrajectoryGroup.model_validate(json.loads(row["request"]))
            scored = await judge_with_config(self.cfg, group, options)
            result = group_result(scored, self.metrics)
        except asyncio.TimeoutError:
            error = f"timeout: the judge did not answer within {self.cfg.judge_timeout_s:g} s"
            self.metrics.errors.labels("timeout").inc()
        except (JudgeError, ValueError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.metrics.errors.labels("judge").inc()
        except asyncio.CancelledError:
            raise  # shutting down: leave the group unfinished for the next process
        await asyncio.to_thread(self.store.finish_group, row["job_id"], row["idx"], result, error)
        log.info(json.dumps({"event": "group", "job": row["job_id"], "index": row["idx"],
                             "status": "done" if error is None else "error"}))
