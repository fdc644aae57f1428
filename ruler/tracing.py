"""Tracing rollouts, RULER judge calls and training steps to Langfuse (the `tracing` extra).

Off by default, and free when off: nothing here imports `langfuse` until tracing is configured, and the
hooks the library calls cost one lookup when no tracer is set. Tracing is on when

- `LANGFUSE_PUBLIC_KEY` and `LANGFUSE_SECRET_KEY` are set (and `LANGFUSE_HOST` or `LANGFUSE_BASE_URL` names
  the server; Langfuse Cloud otherwise), unless `LANGFUSE_TRACING_ENABLED=false`; or
- a tracer is set explicitly: `set_tracer(LangfuseTracer(public_key=..., secret_key=..., host=...))`
  (`set_tracer(False)` turns tracing off whatever the environment says, `set_tracer(None)` goes back to it).

The tracer is resolved once when scoring, gathering or training starts: configured without the `langfuse`
package installed, `ruler_score_group`, `gather_trajectory_groups` and `model.train` raise
`judges.extras.MissingExtraError` naming `pip install 'ruler-rl[tracing]'` before any rollout, judge call or
step. Once on, a failing Langfuse (unreachable, erroring, rejecting) or a tracer that raises never breaks
scoring, gathering or training: the SDK exports from a background thread and logs its failures, and every
hook here logs (warning, logger `ruler.tracing`) instead of raising.

What is sent (through the langfuse SDK, which exports OpenTelemetry spans to `{host}/api/public/otel/v1/traces`
and scores to `{host}/api/public/scores`):

- **each rollout** as one trace named `rollout`: its conversation and tools (input), last message (output),
  reward, metrics, metadata and the trajectory id (trace metadata `trajectory_id`); sent when its group is
  gathered (`gather_trajectory_groups`), scored (`ruler_score_group`) or trained (`model.train`),
  whichever comes first, once per trajectory;
- **each judgment** (`ruler_score_group`, `ruler`, `ruler_result`) as one trace named `ruler-judging`: one
  generation per judge call (model, the judge prompt and answer with their sizes, token usage, cost,
  latency, attempt, `cached`; an answer served from the cache is a generation with `cached: true` and no
  usage) and a summary span (scores, explanations, the trajectory ids judged, the bill, notes);
- **each trajectory's judgment** on its rollout trace: a Langfuse score `ruler_score` (the judge's score,
  its explanation as the comment) and an event `ruler-judgment` pointing at the judging trace;
- **each training step** as one trace named `train-step` (step, loss, rewards and the rest of the run-log
  row; the ids of the trajectories given), and on each of those trajectories' traces an event
  `train-step` with the step, the advantage the step trained the trajectory with (as the configured loss
  computed it, e.g. unscaled for `dr_grpo`), whether the step trained it at all (`trajectory_trained`; not for
  a group without a learning signal, a zero advantage, an aborted turn or nothing within `max_seq_length`,
  and its advantage is then 0) and the step's trace id.

**Trajectory ids.** `Trajectory` has no id field, so the id lives in `metadata["ruler_trajectory_id"]`
(`TRAJECTORY_ID_KEY`): a uuid4 as 32 hex digits, written by `ruler_score_group` on the trajectories it
returns (always, traced or not), and by the gather and training hooks on the trajectories they are given
when tracing is on. An id already there (any non-empty string) is kept, so a recorder or the user may set
their own; any other value there is refused by `ruler.trajectory.validate_trajectories` (so by scoring and
training, before any judge call or step), and the hooks leave such a trajectory untraced rather than raise.
A 32-hex-digit id is the Langfuse trace id itself; any other id is hashed into one (`langfuse_trace_id`).
Not to be confused with the judge's in-prompt numbering ("1".."N", `ruler.results.ScoreRow.trajectory_id`).
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ruler.results import RulerResult
    from ruler.trajectory import Trajectory, TrajectoryGroup

__all__ = ["TRAJECTORY_ID_KEY", "LangfuseTracer", "Tracer", "current_tracer", "ensure_trajectory_id", "flush",
           "langfuse_trace_id", "new_trajectory_id", "set_tracer", "trajectory_id"]

log = logging.getLogger("ruler.tracing")

TRAJECTORY_ID_KEY = "ruler_trajectory_id"
"""The trajectory metadata key holding its stable id (see the module docstring)."""

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_MAX_REMEMBERED = 200_000  # rollout traces a tracer remembers having sent (so each is sent once)


def new_trajectory_id() -> str:
    """A fresh trajectory id: a uuid4 as 32 lowercase hex digits (also a valid Langfuse trace id)."""
    return uuid.uuid4().hex


def trajectory_id(trajectory: Trajectory, *, assign: bool = True) -> str | None:
    """The stable id of `trajectory` (`metadata["ruler_trajectory_id"]`). Without one, a new id is written into
    its metadata and returned when `assign` (the default), else None. A value there that is not a
    non-empty string is a ValueError."""
    from ruler.trajectory import Trajectory

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


def langfuse_trace_id(trajectory_id: str) -> str:
    """The Langfuse trace id of a trajectory id: the id itself when it is 32 lowercase hex digits, else the
    first 16 bytes of its SHA-256 (the same as `langfuse.Langfuse.create_trace_id(seed=id)`)."""
    import hashlib

    if not isinstance(trajectory_id, str) or not trajectory_id.strip():
        raise ValueError(f"a trajectory id is a non-empty string, got {trajectory_id!r}")
    if _HEX32.match(trajectory_id):
        return trajectory_id
    return hashlib.sha256(trajectory_id.encode("utf-8")).digest()[:16].hex()


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
        raise TypeError(f"set_tracer takes an object with the ruler.tracing.Tracer methods, False or None, got "
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


def _close_at_exit(ref) -> None:
    tracer = ref()
    if tracer is not None:
        tracer.close()


def _bounded(fn, seconds: float, what: str) -> bool:
    """Run `fn` in a daemon thread and wait at most `seconds` for it; whether it finished (a warning when not:
    the thread is left to the process's exit)."""
    done = threading.Event()

    def run():
        try:
            fn()
        except Exception as exc:
            log.warning("tracing: could not %s (%s: %s)", what, type(exc).__name__, exc)
        finally:
            done.set()

    threading.Thread(target=run, name="ruler-tracing-flush", daemon=True).start()
    if not done.wait(seconds):
        log.warning("tracing: could not %s within %g s; what was buffered is dropped", what, seconds)
        return False
    return True


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
        """The judge answered: `reply` is a `judges.JudgeReply`."""
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
    from ruler.results import RulerResult

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
    from ruler.trajectory import TrajectoryGroup

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


# ---------------------------------------------------------------------------------------------------------------
# Langfuse


def _known_id(t: Trajectory) -> str | None:
    """The trajectory's valid id, or None (none, or not a non-empty string): never raises, never assigns."""
    value = t.metadata.get(TRAJECTORY_ID_KEY)
    return value if isinstance(value, str) and value.strip() else None


def _last_message(messages: list[dict]) -> dict | None:
    return messages[-1] if messages else None


def _chars(messages: list[dict]) -> int:
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
    return total


class _LangfuseJudgeCall:
    def __init__(self, tracer: LangfuseTracer, generation, started: float):
        self.tracer, self.generation, self.started = tracer, generation, started

    def finish(self, *, content: str | None, prompt_tokens: int, completion_tokens: int, cost: float,
               error: BaseException | None) -> None:
        latency = time.perf_counter() - self.started
        meta: dict[str, Any] = {"cached": False, "latency_s": round(latency, 6)}
        if error is not None:
            self.generation.update(level="ERROR", status_message=f"{type(error).__name__}: {error}"[:2000],
                                   metadata=meta)
        else:
            meta["answer_chars"] = len(content or "")
            self.generation.update(
                output=content if self.tracer.capture_content else None, metadata=meta,
                usage_details={"input": int(prompt_tokens), "output": int(completion_tokens),
                               "total": int(prompt_tokens) + int(completion_tokens)},
                cost_details={"total": float(cost)})
        self.generation.end()


class LangfuseTracer:
    """Sends rollouts, judge calls and training steps to Langfuse through the `langfuse` SDK (v3+, which
    exports OpenTelemetry spans). Keys and host default to `LANGFUSE_PUBLIC_KEY`, `LANGFUSE_SECRET_KEY` and
    `LANGFUSE_HOST` (or `LANGFUSE_BASE_URL`; Langfuse Cloud when neither is set). `capture_content=False`
    sends sizes instead of the conversations, judge prompts and answers. `timeout`: seconds one export may
    take. `flush_timeout_s`: the longest `flush()`, and the shutdown at the process's exit, wait for the SDK to
    hand over what it buffered (a Langfuse that is down or silent then costs that much, not the SDK's retries:
    what is not sent by then is dropped, with a warning). The SDK's spans go through a tracer provider of their
    own (the process's global OpenTelemetry provider is left alone). Raises `MissingExtraError` without the
    `tracing` extra, ValueError for missing or malformed settings."""

    def __init__(self, public_key: str | None = None, secret_key: str | None = None, host: str | None = None, *,
                 environment: str | None = None, release: str | None = None, capture_content: bool = True,
                 timeout: int | None = None, flush_interval: float | None = None, flush_timeout_s: float = 3.0):
        from judges.extras import require

        require("tracing", "tracing to Langfuse", "or unset LANGFUSE_PUBLIC_KEY/LANGFUSE_SECRET_KEY to trace nothing")
        public_key = public_key if public_key is not None else os.environ.get("LANGFUSE_PUBLIC_KEY")
        secret_key = secret_key if secret_key is not None else os.environ.get("LANGFUSE_SECRET_KEY")
        for name, value in (("public_key", public_key), ("secret_key", secret_key)):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"LangfuseTracer needs {name} (or LANGFUSE_{name.upper()} in the environment)")
        host = host if host is not None else (os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST"))
        if host is not None and (not isinstance(host, str) or not re.match(r"^https?://[^\s/]+", host)):
            raise ValueError(f"the Langfuse host must be an http(s) URL, got {host!r}")
        if not isinstance(capture_content, bool):
            raise TypeError("capture_content must be True or False")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1):
            raise ValueError(f"timeout must be a whole number of seconds >= 1, got {timeout!r}")
        if flush_interval is not None and (isinstance(flush_interval, bool)
                                           or not isinstance(flush_interval, (int, float)) or not flush_interval > 0):
            raise ValueError(f"flush_interval must be a number of seconds > 0, got {flush_interval!r}")
        if isinstance(flush_timeout_s, bool) or not isinstance(flush_timeout_s, (int, float)) \
                or not 0 < flush_timeout_s <= 600:
            raise ValueError(f"flush_timeout_s must be a number of seconds in (0, 600], got {flush_timeout_s!r}")
        from langfuse import Langfuse, propagate_attributes
        from opentelemetry.sdk.trace import TracerProvider

        self.capture_content = capture_content
        self.host = host
        self._propagate = propagate_attributes
        self._client = Langfuse(public_key=public_key, secret_key=secret_key, base_url=host or None,
                                environment=environment, release=release, timeout=timeout,
                                flush_interval=flush_interval,
                                tracer_provider=TracerProvider(shutdown_on_exit=False))  # close() at exit instead
        self._sent: OrderedDict[str, None] = OrderedDict()
        self._sent_lock = threading.Lock()
        self.flush_timeout_s = float(flush_timeout_s)
        # the SDK shuts down at exit with no bound (its exporter retries a dead host for seconds): ours is bounded
        resources = getattr(self._client, "_resources", None)
        if resources is not None and callable(getattr(resources, "shutdown", None)):
            atexit.unregister(resources.shutdown)
        self._stuck = False  # a flush or close ran past its bound: the export is not answering
        atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def client(self):
        """The `langfuse.Langfuse` client (to add your own observations or scores)."""
        return self._client

    # ---- helpers ----

    def _first_time(self, tid: str) -> bool:
        with self._sent_lock:
            if tid in self._sent:
                return False
            self._sent[tid] = None
            if len(self._sent) > _MAX_REMEMBERED:
                self._sent.popitem(last=False)
            return True

    def _content(self, value):
        return value if self.capture_content else None

    def _rollout(self, t: Trajectory, tid: str) -> None:
        messages = t.messages()
        meta = {"trajectory_id": tid, "reward": t.reward, "metrics": dict(t.metrics),
                "metadata": dict(t.metadata), "turns": sum(1 for m in messages if m.get("role") == "assistant"),
                "messages": len(messages), "message_chars": _chars(messages),
                "tools": [(tool.get("function") or {}).get("name", "") for tool in t.tools or []]}
        if t.logs:
            meta["logs"] = list(t.logs)
        with self._propagate(trace_name="rollout", metadata={"trajectory_id": tid}, tags=["ruler-rl"]):
            span = self._client.start_observation(
                trace_context={"trace_id": langfuse_trace_id(tid)}, name="rollout", as_type="agent",
                input=self._content({"messages": messages, "tools": t.tools}),
                output=self._content(_last_message(messages)), metadata=meta)
            span.end()

    def _send_rollouts(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            tid = _known_id(t)
            if tid is not None and self._first_time(tid):
                self._rollout(t, tid)

    # ---- the Tracer hooks ----

    def rollouts(self, trajectories: list[Trajectory]) -> None:
        self._send_rollouts(trajectories)

    def start_judge_call(self, judging_id: str, model: str, messages: list[dict], attempt: int) -> JudgeCallSpan:
        started = time.perf_counter()
        with self._propagate(trace_name="ruler-judging", tags=["ruler-rl"]):
            generation = self._client.start_observation(
                trace_context={"trace_id": judging_id}, name="ruler-judge-call", as_type="generation",
                model=model, input=self._content(messages),
                metadata={"attempt": attempt, "prompt_messages": len(messages), "prompt_chars": _chars(messages)})
        return _LangfuseJudgeCall(self, generation, started)

    def judge_cache_hit(self, judging_id: str, model: str, messages: list[dict]) -> None:
        with self._propagate(trace_name="ruler-judging", tags=["ruler-rl"]):
            generation = self._client.start_observation(
                trace_context={"trace_id": judging_id}, name="ruler-judge-call", as_type="generation", model=model,
                input=self._content(messages),
                metadata={"cached": True, "latency_s": 0.0, "prompt_messages": len(messages),
                          "prompt_chars": _chars(messages)},
                usage_details={"input": 0, "output": 0, "total": 0}, cost_details={"total": 0.0})
            generation.end()

    def judged(self, judging_id: str, what: str, result: RulerResult, judge_model: str,
               pairs: list[tuple[Trajectory, Trajectory]] | None, error: BaseException | None) -> None:
        ids = []
        if pairs:
            # the rollouts first (as they were before judging), under the ids the scored copies carry
            for before, after in pairs:
                tid = _known_id(after)
                ids.append(tid)
                if tid is not None and self._first_time(tid):
                    self._rollout(before.model_copy(update={"metadata": {**before.metadata, TRAJECTORY_ID_KEY: tid}}),
                                  tid)
        summary = {"judge_model": judge_model, "calls": result.calls, "prompt_tokens": result.prompt_tokens,
                   "completion_tokens": result.completion_tokens, "cost": result.cost, "cached": result.cached,
                   "notes": list(result.notes)}
        if result.disagreement is not None:
            summary["disagreement"] = result.disagreement
        scores = [{"trajectory_id": ids[i] if i < len(ids) else s.trajectory_id, "score": s.score,
                   "explanation": s.explanation} for i, s in enumerate(result.scores)]
        with self._propagate(trace_name="ruler-judging", tags=["ruler-rl"]):
            span = self._client.start_observation(
                trace_context={"trace_id": judging_id}, name=what, as_type="evaluator",
                input={"trajectory_ids": ids} if pairs else None,
                output={"scores": scores} if error is None else None, metadata=summary,
                level="ERROR" if error is not None else None,
                status_message=f"{type(error).__name__}: {error}"[:2000] if error is not None else None)
            span.end()
        if error is not None or not pairs:
            return
        for (_, after), tid in zip(pairs, ids):
            if tid is None:
                continue
            explanation = str(after.metadata.get("ruler_explanation", ""))
            score = after.metrics.get("ruler_score", after.reward)
            trace = langfuse_trace_id(tid)
            self._client.create_event(
                trace_context={"trace_id": trace}, name="ruler-judgment",
                output={"score": score, "explanation": explanation},
                metadata={"trajectory_id": tid, "judging_trace_id": judging_id, "judge_model": judge_model,
                          "independent_reward": after.metrics.get("independent_reward")})
            self._client.create_score(name="ruler_score", value=float(score), trace_id=trace, data_type="NUMERIC",
                                      comment=explanation,
                                      metadata={"trajectory_id": tid, "judge_model": judge_model,
                                                "judging_trace_id": judging_id})

    def train_step(self, model_name: str, project: str, row: dict, groups: list[TrajectoryGroup],
                   advantages: list[list[float | None]]) -> None:
        if len(advantages) != len(groups) or any(len(a) != len(g.trajectories) for a, g in zip(advantages, groups)):
            raise ValueError("train_step: advantages must hold one list per group, one value per trajectory")
        step_trace = uuid.uuid4().hex
        ids = []
        links = []
        for g, (group, group_advantages) in enumerate(zip(groups, advantages)):
            trajectories = list(group.trajectories)
            self._send_rollouts(trajectories)
            for t, adv in zip(trajectories, group_advantages):
                tid = _known_id(t)
                ids.append(tid)
                links.append((tid, g, t.reward, adv))
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float, bool, str)) or v is None}
        with self._propagate(trace_name="train-step", tags=["ruler-rl"],
                             metadata={"model": f"{project}/{model_name}"[:150], "step": str(row.get("step"))}):
            span = self._client.start_observation(
                trace_context={"trace_id": step_trace}, name="train-step", as_type="span",
                input={"model": model_name, "project": project, "trajectory_ids": ids, "groups": len(groups)},
                output=numbers, metadata={"step": row.get("step"), "loss": row.get("loss"),
                                          "reward_mean": row.get("reward_mean"), "reward_std": row.get("reward_std"),
                                          "trained": row.get("trained")})
            span.end()
        for tid, g, reward, adv in links:
            if tid is None:
                continue
            self._client.create_event(
                trace_context={"trace_id": langfuse_trace_id(tid)}, name="train-step",
                metadata={"trajectory_id": tid, "step": row.get("step"), "train_trace_id": step_trace,
                          "group": g, "reward": reward, "advantage": 0.0 if adv is None else adv,
                          "trajectory_trained": adv is not None, "trained": row.get("trained"),
                          "model": model_name})

    def flush(self) -> None:
        """Hand what is buffered to Langfuse, waiting at most `flush_timeout_s` (not at all once an earlier flush
        ran past it: the export is not answering)."""
        if self._stuck:
            return
        self._stuck = not _bounded(self._client.flush, self.flush_timeout_s, f"flush to {self.host or 'Langfuse'}")

    def close(self) -> None:
        """Flush and stop the SDK's threads, waiting at most `flush_timeout_s` (also run at the process's exit);
        after a flush that ran past it, only a moment."""
        bound = 0.1 if self._stuck else self.flush_timeout_s
        self._stuck = not _bounded(self._client.shutdown, bound, f"shut down the export to {self.host or 'Langfuse'}")
