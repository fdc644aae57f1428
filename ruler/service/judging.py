"""Judging one group as the service does, for the score endpoint and the job worker alike: the service's
judge settings applied (`judge_with_config`), the answer built (`group_result`), and every failure classified
once (`failure`): its metrics kind, its HTTP status on /v1/score, what the client is told, and whether a job
group is tried again later.

A failure about the client's own request (`TrajectoryError`, `JudgeInputError`) is passed on in full; any
other says only what kind of failure it was: the judge's addresses, credentials and replies stay in the
service's log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ruler_rl.judges.completion import RetryPolicy
from ruler_rl.judges.errors import (
    JudgeConfigError,
    JudgeError,
    JudgeInputError,
    JudgeOutputError,
    JudgeUnavailableError,
)
from ruler_rl.messages import TrajectoryError
from ruler_rl.results import score_notes, score_rows
from ruler_rl.scoring import ruler_score_group
from ruler_rl.service.config import ServiceConfig, checked_options
from ruler_rl.service.metrics import Metrics
from ruler_rl.service.models import ScoreResponse, Usage
from ruler_rl.trajectory import TrajectoryGroup

log = logging.getLogger("ruler.service")


async def judge_with_config(cfg: ServiceConfig, group: TrajectoryGroup, options: dict) -> TrajectoryGroup:
    """`ruler_score_group` as the service runs it: its judge credentials, cache, limits, retries and time limit,
    and the client's options as resolved by the endpoint (judge_model, api_base, rubric text, num_permutations,
    max_prompt_tokens), checked again by `checked_options`. Raises TimeoutError past `judge_timeout_s`."""
    options = checked_options(cfg, options)
    params = dict(cfg.judge_params)
    if options["api_base"] is not None:
        params["api_base"] = options["api_base"]
    retry = RetryPolicy(attempts=cfg.judge_retries + 1)  # the whole group is bounded by judge_timeout_s below
    return await asyncio.wait_for(ruler_score_group(
        group, options["judge_model"], params or None, options["rubric"], cache=cfg.cache,
        num_permutations=options["num_permutations"], retry=retry, max_prompt_tokens=options["max_prompt_tokens"],
        limits=cfg.limits), cfg.judge_timeout_s)


def group_result(scored: TrajectoryGroup, metrics: Metrics) -> ScoreResponse:
    """The answer for one scored group (scores with advantages, the scored group itself, usage), counting its
    judge calls and cache hit in `metrics`."""
    if not isinstance(scored, TrajectoryGroup):
        raise TypeError(f"group_result takes a TrajectoryGroup, got {type(scored).__name__}")
    meta = scored.metadata
    metrics.judge_calls.inc(int(meta.get("judge_calls") or 0))
    if meta.get("judge_cached"):
        metrics.cache_hits.inc()
    return ScoreResponse(scores=score_rows(scored), group=scored.model_dump(mode="json"),
                         usage=Usage(**{k: meta.get(k) for k in Usage.model_fields}),
                         cached=bool(meta.get("judge_cached")), judge_model=str(meta.get("judge_model", "")),
                         notes=score_notes(scored))


def public_error(exc: BaseException) -> str:
    """What a client is told about a failure while its group was judged (see the module's docstring)."""
    if isinstance(exc, (TrajectoryError, JudgeInputError)):
        return str(exc)
    if isinstance(exc, JudgeUnavailableError):
        return "the judge is unavailable (details in the service's log)"
    if isinstance(exc, JudgeOutputError):
        return "the judge's answers held no valid scores (details in the service's log)"
    if isinstance(exc, JudgeConfigError):
        return "the judge refused the request or is misconfigured (details in the service's log)"
    return "the group could not be judged (details in the service's log)"


@dataclass(frozen=True)
class Failure:
    """How one failure to judge a group is reported.

    kind: the `ruler_errors_total` label: `timeout`, `bad_request` (the request cannot be judged as sent or
    configured: retrying will not help), `judge` (the judge failed), `internal` (a bug; logged in full).
    status: the answer on /v1/score (504, 422, 503, 500); detail: its message.
    job_error: a job group's `error`: the exception's type and the public message.
    retry: a job group is put back with a backoff (the judge was slow or unavailable).
    """

    kind: str
    status: int
    detail: str
    job_error: str
    retry: bool


def failure(exc: BaseException, cfg: ServiceConfig) -> Failure:
    """Classify `exc`, raised while judging a group with `cfg`, the same way for the endpoint and the worker."""
    if not isinstance(exc, BaseException):
        raise TypeError(f"failure takes an exception, got {type(exc).__name__}")
    name = type(exc).__name__
    if isinstance(exc, TimeoutError):
        said = f"the judge did not answer within {cfg.judge_timeout_s:g} s"
        return Failure("timeout", 504, said, f"timeout: {said}", retry=True)
    if isinstance(exc, (TrajectoryError, JudgeConfigError)):  # the client's group or options (JudgeInputError too)
        said = public_error(exc)
        return Failure("bad_request", 422, said, f"{name}: {said}", retry=False)
    if isinstance(exc, JudgeError):
        said = public_error(exc)
        return Failure("judge", 503, f"judge failed: {said}", f"{name}: {said}",
                       retry=isinstance(exc, JudgeUnavailableError))
    return Failure("internal", 500, "internal error", f"internal error: {name}", retry=False)


def judging_failed(exc: BaseException, cfg: ServiceConfig, metrics: Metrics, where: str) -> Failure:
    """`failure(exc, cfg)`, counted in `metrics` and logged with `where` (which request or job group): the
    exception's full text for the operator, its traceback too when it is `internal`."""
    failed = failure(exc, cfg)
    metrics.failed(failed.kind)
    if failed.kind == "internal":
        log.error("%s: unexpected error", where, exc_info=exc)
    else:
        log.warning("%s: not judged: %s: %s", where, type(exc).__name__, exc)
    return failed
