"""Tracing rollouts, RULER judge calls and training steps to Langfuse (the `tracing` extra).

Off by default, and free when off: nothing here imports `langfuse` until tracing is configured, and the
hooks the library calls cost one lookup when no tracer is set. Tracing is on when

- `LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY` are set (and `LANGFUSE_HOST` or `LANGFUSE_BASE_URL` names
  the server; Langfuse Cloud otherwise), unless `LANGFUSE_TRACING_ENABLED=false`; or
- a tracer is set explicitly: `set_tracer(LangfuseTracer(public_key=..., secret_key=..., host=...))`
  (`set_tracer(False)` turns tracing off whatever the environment says, `set_tracer(None)` goes back to it).

The tracer is resolved once when scoring, gathering or training starts: configured without the `langfuse`
package installed, `ruler_score_group`, `gather_trajectory_groups` and `model.train` raise
`ruler_rl.judges.extras.MissingExtraError` naming `pip install 'ruler-rl[tracing]'` before any rollout, judge call or
step. Once on, a failing Langfuse (unreachable, erroring, rejecting) or a tracer that raises never breaks
scoring, gathering or training: the SDK exports from a background thread and logs its failures, and every
hook here logs (warning, logger `ruler.tracing`) instead of raising.

What is sent, and how, is `ruler_rl.langfuse_tracer`'s (`LangfuseTracer`).

**Trajectory ids.** `Trajectory` has no id field, so the id lives in `metadata["ruler_trajectory_id"]`
(`TRAJECTORY_ID_KEY`): a uuid4 as 32 hex digits, written by `ruler_score_group` on the trajectories it
returns (always, traced or not), and by the gather and training hooks on the trajectories they are given
when tracing is on. An id already there (any non-empty string) is kept, so a recorder or the user may set
their own; any other value there is refused by `ruler_rl.trajectory.validate_trajectories` (so by scoring and
training, before any judge call or step), and the hooks leave such a trajectory untraced rather than raise.
A 32-hex-digit id is the Langfuse trace id itself; any other id is hashed into one (`langfuse_trace_id`).
Not to be confused with the judge's in-prompt numbering ("1".."N", `ruler_rl.results.ScoreRow.trajectory_id`).
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ruler_rl.langfuse_tracer import LangfuseTracer
from ruler_rl.trajectory_ids import TRAJECTORY_ID_KEY, langfuse_trace_id, new_trajectory_id

if TYPE_CHECKING:
    from ruler_rl.results import RulerResult
    from ruler_rl.trajectory import Trajectory, TrajectoryGroup

__all__ = ["TRAJECTORY_ID_KEY", "LangfuseTracer", "Tracer", "current_tracer", "ensure_trajectory_id", "flush",
           "langfuse_trace_id", "new_trajectory_id", "set_tracer", "trajectory_id"]

log = logging.getLogger("ruler.tracing")


def trajectory_id(trajectory: Trajectory, *, assign: bool = True) -> str | None:
    """The stable id of `trajectory` (`metadata["ruler_trajectory_id"]`). Without one, a new id is written into
    its metadata and returned when `assign` (the default), else None. A value there that is not a
    non-empty string is a ValueError."""
    from ruler_rl.trajectory import Trajectory

    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory_id takes a Trajectory, got {type(trajectory).__name__}")
    existing = trajectory.metadata.get(TRAJECTORY_ID_KEY)
    if isinstance(existing, str) and existing.strip():
        return existing
    if existing is not None:
        raise ValueError(f"metadata[{TRAJECTORY_ID_KEY!r}] must be a non-empty string (the trajectory's id), "
                         f"got {existing!r}")
    if not assign:
        return None
    tid = new_trajectory_id()
    trajectory.metadata[TRAJECTORY_ID_KEY] = tid
    return tid


def ensure_trajectory_id(trajectory: Trajectory) -> str | None:
    """`trajectory_id(trajectory)` that never raises for what the metadata holds: the id, written into its
    metadata when it has none; None (logged, nothing written) when its metadata holds a value that is not a
    non-empty string (`validate_trajectories` refuses such trajectories before scoring or training)."""
    try:
        return trajectory_id(trajectory)
    except ValueError as exc:
        log.warning("tracing: a trajectory is left untraced: %s", exc)
        return None


# ---------------------------------------------------------------------------------------------------------------
# the hook interface: what the library tells a tracer


@runtime_checkable
class JudgeCallSpan(Protocol):
    def finish(self, *, content: str | None, prompt_tokens: int, completion_tokens: int, cost: float,
               error: BaseException | None) -> None:
        """The call answered (`content` and usage) or failed (`error`)."""


@runtime_checkable
class Tracer(Protocol):
    """What ruler-rl calls on a tracer. `LangfuseTracer` is the one shipped; any object with these methods
    may be passed to `set_tracer`. The hooks are called from the event loop and must not block on the network.
    `judging_id` is a 32-hex-digit id naming one judgment (`ruler_score_group`, `ruler`, `ruler_result`)."""

    def rollouts(self, trajectories: list[Trajectory]) -> None:
        """Rollouts finished (gathered, or first seen when scored or trained); each has its id in metadata."""

    def start_judge_call(self, judging_id: str, model: str, messages: list[dict], attempt: int) -> JudgeCallSpan:
        """A judge call begins; the returned span is finished when it answers or fails."""

    def judge_cache_hit(self, judging_id: str, model: str, messages: list[dict]) -> None:
        """A judgment was served from the judge cache (no call made)."""

    def judged(self, judging_id: str, what: str, result: RulerResult, judge_model: str,
               pairs: list[tuple[Trajectory, Trajectory]] | None, error: BaseException | None) -> None:
        """A judgment ended. `pairs`: for `ruler_score_group`, each input trajectory with its scored copy (which
        carries its id, score and explanation); None for `ruler`/`ruler_result`. `error`: why it failed."""

    def train_step(self, model_name: str, project: str, row: dict, groups: list[TrajectoryGroup],
                   advantages: list[list[float | None]]) -> None:
        """A training step ended (`row` is the step's run-log row) on `groups`, whose trajectories have ids.
        `advantages[g][k]`: the advantage the step trained `groups[g].trajectories[k]` with (None: not trained)."""

    def flush(self) -> None:
        """Send what is buffered (may block up to the exporter's timeout)."""


# ---------------------------------------------------------------------------------------------------------------
# which tracer is on

_explicit: Tracer | bool | None = None  # a Tracer, False (off whatever the environment says), None (environment)
_from_env: tuple[tuple, Tracer] | None = None
_lock = threading.Lock()


def set_tracer(tracer: Tracer | bool | None) -> None:
    """Use `tracer` from now on (an explicit opt-in), `False` to turn tracing off even when the environment
    configures Langfuse, or `None` to go back to the environment (`LANGFUSE_PUBLIC_KEY`, ...)."""
    global _explicit
    if tracer is True:
        raise ValueError("set_tracer takes a tracer (e.g. LangfuseTracer(...)), False (off) or None (environment)")
    if tracer is not None and tracer is not False and not isinstance(tracer, Tracer):
        raise TypeError(f"set_tracer takes an object with the ruler_rl.tracing.Tracer methods, False or None, got "
                        f"{type(tracer).__name__}")
    _explicit = tracer


def current_tracer() -> Tracer | None:
    """The tracer in use, or None when tracing is off. Raises `MissingExtraError` when the environment
    configures Langfuse but the `langfuse` package is not installed, and ValueError for a bad configuration."""
    global _from_env
    if _explicit is False:
        return None
    if _explicit is not None:
        return _explicit  # type: ignore[return-value]
    env = os.environ
    public, secret = env.get("LANGFUSE_PUBLIC_KEY"), env.get("LANGFUSE_SECRET_KEY")
    if not public or not secret or env.get("LANGFUSE_TRACING_ENABLED", "true").strip().lower() == "false":
        return None
    key = (public, secret, env.get("LANGFUSE_HOST"), env.get("LANGFUSE_BASE_URL"))
    with _lock:
        if _from_env is None or _from_env[0] != key:
            _from_env = (key, LangfuseTracer())
        return _from_env[1]


def flush() -> None:
    """Send what the tracer in use has buffered (nothing when tracing is off); export errors are logged."""
    tracer = _explicit if _explicit is not None else (_from_env[1] if _from_env else None)
    if tracer:
        _safely("flush", tracer.flush)


def _safely(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # tracing must never break scoring or training
        log.warning("tracing: %s failed (%s: %s); scoring and training go on", what, type(exc).__name__, exc)
        return None


# ---------------------------------------------------------------------------------------------------------------
# hooks the library calls (each a no-op when tracing is off)


class _Judging:
    __slots__ = ("id", "tracer")

    def __init__(self, tracer: Tracer, judging_id: str):
        self.tracer, self.id = tracer, judging_id


_judging: contextvars.ContextVar[_Judging | None] = contextvars.ContextVar("ruler_tracing_judging", default=None)


@contextmanager
def judging(tracer: Tracer | None) -> Iterator[str | None]:
    """Within it, judge calls are traced as part of one judgment (yields its id; None when `tracer` is None).
    Tasks started inside inherit it, so every ordering, sub-group and panel judge is included."""
    if tracer is None:
        yield None
        return
    state = _Judging(tracer, uuid.uuid4().hex)
    token = _judging.set(state)
    try:
        yield state.id
    finally:
        _judging.reset(token)


class _NoCall:
    def answered(self, reply) -> None:
        pass


_NO_CALL = _NoCall()


class _Call:
    __slots__ = ("done", "span")

    def __init__(self, span):
        self.span, self.done = span, False

    def answered(self, reply) -> None:
        """The judge answered: `reply` is a `ruler_rl.judges.JudgeReply`."""
        self.done = True
        _safely("tracing a judge answer", self.span.finish, content=reply.content, prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens, cost=reply.cost, error=None)


@contextmanager
def judge_call(model: str, messages: list[dict], attempt: int = 0):
    """Around one judge call: yields an object whose `answered(reply)` records the answer; a call that
    raises is recorded as failed. Nothing happens outside `judging` (tracing off)."""
    state = _judging.get()
    span = None if state is None else _safely("tracing a judge call", state.tracer.start_judge_call, state.id, model,
                                                 messages, attempt)
    if span is None:
        yield _NO_CALL
        return
    call = _Call(span)
    try:
        yield call
    except BaseException as exc:
        if not call.done:
            _safely("tracing a failed judge call", span.finish, content=None, prompt_tokens=0, completion_tokens=0,
                    cost=0.0, error=exc)
        raise
    if not call.done:
        _safely("tracing a judge call", span.finish, content=None, prompt_tokens=0, completion_tokens=0, cost=0.0,
                error=None)


def judge_cache_hit(model: str, messages: list[dict]) -> None:
    """A judgment served from the cache (no-op when tracing is off)."""
    state = _judging.get()
    if state is not None:
        _safely("tracing a cache hit", state.tracer.judge_cache_hit, state.id, model, messages)


def judged(tracer: Tracer | None, judging_id: str | None, what: str, result: RulerResult | None, judge_model: str,
           pairs: list[tuple[Trajectory, Trajectory]] | None = None, error: BaseException | None = None) -> None:
    """A judgment ended (no-op when `tracer` is None); `pairs` as for `Tracer.judged`."""
    if tracer is None or judging_id is None:
        return
    from ruler_rl.results import RulerResult

    _safely("tracing a judgment", tracer.judged, judging_id, what, result or RulerResult(scores=[]), judge_model,
            pairs, error)


def rollouts_gathered(tracer: Tracer | None, group: TrajectoryGroup) -> None:
    """`gather_trajectory_groups` finished a group (`tracer`: `current_tracer()` as resolved when the gathering
    began; no-op when None): give its trajectories ids (in place) and send their rollout traces. Never raises
    (a failure is logged): the rollouts are done."""
    if tracer is None:
        return
    _safely("tracing rollouts", _rollouts_gathered, tracer, group)


def _rollouts_gathered(tracer: Tracer, group: TrajectoryGroup) -> None:
    trajectories = [t for t in group.trajectories if ensure_trajectory_id(t) is not None]
    tracer.rollouts(trajectories)


def train_step(tracer: Tracer | None, model, row: dict, groups: list[TrajectoryGroup],
               advantages: dict[tuple[int, int], float]) -> None:
    """`model.train` took a step (`tracer`: `current_tracer()` as resolved before the step; no-op when None):
    give the trajectories ids (in place) and send the step's trace. `advantages[(g, k)]`: the advantage the
    step trained trajectory `k` of `groups[g]` with (absent: not trained). Never raises (a failure is logged):
    the step is taken and its row must reach the caller."""
    if tracer is None:
        return
    _safely("tracing a training step", _train_step, tracer, model, row, groups, advantages)


def _train_step(tracer: Tracer, model, row: dict, groups: list, advantages: dict[tuple[int, int], float]) -> None:
    from ruler_rl.trajectory import TrajectoryGroup

    kept, per_group = [], []
    for g, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            continue
        for t in group.trajectories:
            ensure_trajectory_id(t)
        kept.append(group)
        per_group.append([advantages.get((g, k)) for k in range(len(group.trajectories))])
    tracer.train_step(str(getattr(model, "name", "")), str(getattr(model, "project", "")), dict(row), kept,
                      per_group)
