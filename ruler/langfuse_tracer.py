"""`LangfuseTracer`: the `ruler_rl.tracing.Tracer` that sends rollouts, RULER judge calls and training steps to
Langfuse (the `tracing` extra). `ruler_rl.tracing` says when tracing is on and which hooks call it.

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

Nothing here imports `langfuse` until a `LangfuseTracer` is made. The SDK exports from a background thread and
logs its failures; `flush` and `close` wait a bounded time and log (warning, logger `ruler.tracing`) what they
could not send instead of raising.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ruler_rl.trajectory_ids import TRAJECTORY_ID_KEY, known_trajectory_id, langfuse_trace_id

if TYPE_CHECKING:
    from ruler_rl.results import RulerResult
    from ruler_rl.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger("ruler.tracing")

_MAX_REMEMBERED = 200_000  # rollout traces a tracer remembers having sent (so each is sent once)


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
        from ruler_rl.judges.extras import require

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
            tid = known_trajectory_id(t.metadata)
            if tid is not None and self._first_time(tid):
                self._rollout(t, tid)

    # ---- the Tracer hooks ----

    def rollouts(self, trajectories: list[Trajectory]) -> None:
        self._send_rollouts(trajectories)

    def start_judge_call(self, judging_id: str, model: str, messages: list[dict], attempt: int) -> _LangfuseJudgeCall:
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
                tid = known_trajectory_id(after.metadata)
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
        for (_, after), tid in zip(pairs, ids, strict=True):
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
        if len(advantages) != len(groups) or any(len(a) != len(g.trajectories)
                                                 for a, g in zip(advantages, groups, strict=True)):
            raise ValueError("train_step: advantages must hold one list per group, one value per trajectory")
        step_trace = uuid.uuid4().hex
        ids = []
        links = []
        for g, (group, group_advantages) in enumerate(zip(groups, advantages, strict=True)):
            trajectories = list(group.trajectories)
            self._send_rollouts(trajectories)
            for t, adv in zip(trajectories, group_advantages, strict=True):
                tid = known_trajectory_id(t.metadata)
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
