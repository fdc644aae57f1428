"""RULER: one judge call scores a whole group of trajectories relative to each other.

    ruler(message_lists, judge_model, ...)         -> list[TrajectoryScore]   (ids "1".."N")
    ruler_result(message_lists, judge_model, ...)  -> RulerResult: the scores plus usage, cost, cache, notes
    ruler_score_group(group, judge_model, ...)     -> a new TrajectoryGroup with reward = judge score

Each checks its input once (`ruler_rl.trajectory`) and its options once (`RulerOptions.build`), then
`_judge_group` hands the conversations to the judge (`ruler_rl.budget.score_within_budget`: fit the context,
judge in `num_permutations` orderings, `ruler_rl.judgment`) or to each judge of a panel (`ruler_rl.panel`).
`ruler_score_group` then writes the scores, the explanations and each trajectory's share of the bill
into a copy of the group.
"""

from __future__ import annotations

import json
import logging
import warnings
from typing import Unpack

from ruler_rl import tracing
from ruler_rl.budget import score_within_budget
from ruler_rl.judges import DEFAULT_RUBRIC
from ruler_rl.judges.panel import JudgePanel
from ruler_rl.messages import Problem, TrajectoryError, require_task_stated, validate_message_lists
from ruler_rl.options import (
    MAX_PERMUTATIONS,
    MAX_PROMPT_TOKENS,
    MIN_PROMPT_TOKENS,
    GroupKeywords,
    RulerKeywords,
    RulerOptions,
)
from ruler_rl.panel import score_panel
from ruler_rl.parse import TrajectoryScore
from ruler_rl.prompt import flatten_histories
from ruler_rl.providers import UNKNOWN_CONTEXT_TOKENS, Judge
from ruler_rl.results import EXPLANATION_KEY, NOTES_KEY, RulerResult
from ruler_rl.trajectory import Choice, Trajectory, TrajectoryGroup, choice_to_message, validate_trajectories

__all__ = ["MAX_PERMUTATIONS", "MAX_PROMPT_TOKENS", "MIN_PROMPT_TOKENS", "UNKNOWN_CONTEXT_TOKENS", "RulerResult",
           "ruler", "ruler_result", "ruler_score_group"]

log = logging.getLogger("ruler")

JudgeSpec = str | list[str] | JudgePanel | None
"""A judge: a litellm model string, a list of them (a mean panel), a `JudgePanel`, or None for the default."""


async def ruler(
    message_lists: list[list[dict]],
    judge_model: JudgeSpec = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    debug: bool = False,
    **options: Unpack[RulerKeywords],
) -> list[TrajectoryScore]:
    """Score conversations relative to each other with one judge call (ART's `ruler`).

    Returns one `TrajectoryScore` per conversation, ids "1".."N" in input order. Any litellm model
    string works as `judge_model` (default: `$RULER_JUDGE_MODEL`, else the embedded judge), as does a list
    of them or a `JudgePanel`; `extra_litellm_params` pass through (`api_base`, `api_key`, `temperature`,
    ...). Keyword options (`tools`, `cache`, `retry`, `max_format_retries`, `render`, `num_permutations`,
    `seed`, `max_prompt_tokens`, `limits`) are described on `ruler_rl.options.RulerOptions`. Bad input raises
    `TrajectoryError` (a ValueError naming the trajectory and field), a bad option `JudgeConfigError`,
    TypeError or ValueError, before any call; a failing judge raises `JudgeError` subclasses; a made-up
    score is never returned. `ruler_result` returns the same scores with what it took to get them.
    """
    result = await ruler_result(message_lists, judge_model, extra_litellm_params, rubric, debug=debug, **options)
    return result.scores


async def ruler_result(message_lists: list[list[dict]], judge_model: JudgeSpec = None,
                       extra_litellm_params: dict | None = None, rubric: str = DEFAULT_RUBRIC, *,
                       debug: bool = False, **options: Unpack[RulerKeywords]) -> RulerResult:
    """`ruler`, returning the whole `RulerResult` instead of only its scores: token usage, cost, judge calls,
    whether it all came from the cache, each trajectory's spread across orderings (or judges), notes on what
    was done (cuts, splits, retries), and for a panel each judge's scores and their disagreement. Options
    as for `ruler`."""
    opts = RulerOptions.build(judge_model, extra_litellm_params, rubric, debug=debug, caller="ruler", **options)
    checked = validate_message_lists(message_lists, limits=opts.limits)
    _require_trajectories(checked)
    tracer = tracing.current_tracer()  # None when tracing is off (ruler_rl.tracing)
    with tracing.judging(tracer) as judging_id:
        try:
            result = await _judge_group(checked, opts)
        except Exception as exc:
            tracing.judged(tracer, judging_id, "ruler", None, opts.judge_name, error=exc)
            raise
        tracing.judged(tracer, judging_id, "ruler", result, opts.judge_name)
    return result


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: JudgeSpec = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
    **options: Unpack[GroupKeywords],
) -> TrajectoryGroup | None:
    """Score a group with RULER and return a **new** group whose rewards are the judge's scores.

    Each trajectory gets `metrics["ruler_score"]`, `metrics["independent_reward"]` (its old reward),
    its share of the judge bill (`judge_prompt_tokens`, `judge_completion_tokens`, `judge_cost`; shares
    add up to the group's total), `judge_cached`, the judge's explanation in `metadata["ruler_explanation"]`
    (also written to `logs` as ART does; `ruler_rl.results.score_rows` reads it) and a stable id in
    `metadata["ruler_trajectory_id"]` (kept if it has one; `ruler_rl.tracing`); the group's metadata gets the
    judge, its calls and bill, and what was done to judge it (`ruler_rl.results.score_notes`; also in each
    trajectory's `logs` as "RULER note: ..."). The input group is
    not modified. An empty group is refused (`TrajectoryError`: there is nothing to judge). With
    `swallow_exceptions=True` a failure of the group (input that cannot be judged, an empty group, a judge that
    fails) returns None instead of raising, as ART does; a mistake in the call itself (an unknown
    or impossible option, an unknown rubric) is raised all the same. Options as for `ruler`, except `tools`:
    the judge is shown the trajectories' own.

    The group is checked once, by `validate_trajectories`: a `Choice` is judged as the policy wrote it (a
    tool call with an empty name or of another type included), never refused by a second check of the
    message it becomes.
    """
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"ruler_score_group takes a TrajectoryGroup, got {type(group).__name__}")
    # a mistake in the call itself (a mistyped or impossible option, an unknown rubric) is raised even with
    # swallow_exceptions: swallowing it would silently drop every group of a run
    if "tools" in options:
        raise TypeError("ruler_score_group() got an unexpected keyword argument 'tools': the judge is shown "
                        "the trajectories' own")
    opts = RulerOptions.build(judge_model, extra_litellm_params, rubric, tools=_group_tools(group.trajectories),
                              debug=debug, caller="ruler_score_group", **options)
    # resolved once, before any work: None when tracing is off, MissingExtraError when configured without langfuse
    tracer = tracing.current_tracer()
    judging_id = None
    try:
        _require_trajectories(group.trajectories)
        validate_trajectories(group, limits=opts.limits)
        # every conversation is judged: additional histories follow the main one in the trajectory's block
        message_lists = [flatten_histories(t.messages(), [_history_messages(h) for h in t.additional_histories])
                         for t in group.trajectories]
        require_task_stated(message_lists)
        with tracing.judging(tracer) as judging_id:
            result = await _judge_group(message_lists, opts)
    except Exception as exc:
        tracing.judged(tracer, judging_id, "ruler_score_group", None, opts.judge_name, error=exc)
        if swallow_exceptions:
            log.warning("RULER swallowed %s: %s", type(exc).__name__, exc)
            return None
        raise
    scored = _scored_group(group, result, opts)
    tracing.judged(tracer, judging_id, "ruler_score_group", result, opts.judge_name,
                   list(zip(group.trajectories, scored.trajectories, strict=True)))
    return scored


def _require_trajectories(items: list) -> None:
    """An empty group is a mistake upstream (every rollout failed, a filter dropped them all), never a judgment:
    `TrajectoryError`, before any judge call."""
    if not items:
        raise TrajectoryError([Problem((), "a group needs at least one trajectory: this one is empty, so there is "
                                           "nothing to judge")])


async def _judge_group(message_lists: list[list[dict]], opts: RulerOptions) -> RulerResult:
    """Scores for checked, non-empty conversations from the judge, or from each judge of a panel; notes on the
    group first."""
    notes = []
    if len(message_lists) == 1:
        notes.append("single trajectory: scored on its own, without relative grounding")
        warnings.warn("RULER got a group of one trajectory; its score is absolute, not relative", stacklevel=3)
    if not any(m["role"] in ("system", "developer") for ml in message_lists for m in ml):
        notes.append("no system prompt: the judge infers the task from the user messages")
    if isinstance(opts.judge_model, JudgePanel):
        result = await score_panel(message_lists, opts.judge_model, opts)
    else:
        result = await score_within_budget(message_lists, Judge.of(opts.judge_model, opts.extra_litellm_params), opts)
    result.notes = notes + result.notes
    return result


def _history_messages(history) -> list[dict]:
    """A further conversation as plain message dicts (choices become assistant messages)."""
    return [choice_to_message(m) if isinstance(m, Choice) else m for m in history.messages_and_choices]


def _group_tools(trajectories: list[Trajectory]) -> list[dict] | None:
    """The tool schemas offered in the group, each once."""
    seen: dict[str, dict] = {}
    for t in trajectories:
        for tool in [*(t.tools or []), *(x for h in t.additional_histories for x in h.tools or [])]:
            seen.setdefault(json.dumps(tool, sort_keys=True, default=repr), tool)
    return list(seen.values()) or None


def _scored_group(group: TrajectoryGroup, result: RulerResult, opts: RulerOptions) -> TrajectoryGroup:
    """A copy of `group` carrying the judgment: rewards, scores, explanations, notes, shares of the bill."""
    n = max(1, len(group.trajectories))
    spreads = result.spread or [0.0] * len(result.scores)
    scored = []
    for t, s, spread in zip(group.trajectories, result.scores, spreads, strict=True):
        # fresh containers for everything we change (reward, metrics, logs); messages are only read
        t = t.model_copy(update={"messages_and_choices": list(t.messages_and_choices), "metrics": dict(t.metrics),
                                 "metadata": dict(t.metadata), "logs": list(t.logs), "tools": t.tools and list(t.tools)})
        t.metrics.update(independent_reward=t.reward, ruler_score=s.score, judge_prompt_tokens=result.prompt_tokens / n,
                         judge_completion_tokens=result.completion_tokens / n, judge_cost=result.cost / n,
                         judge_cached=result.cached)
        if opts.num_permutations > 1 or result.per_judge:
            t.metrics["ruler_score_spread"] = spread
        t.metrics.update({f"ruler_score[{m}]": judge_scores[len(scored)]
                          for m, judge_scores in result.per_judge.items()})
        t.reward = s.score
        t.metadata[EXPLANATION_KEY] = s.explanation
        # a stable id in metadata["ruler_trajectory_id"], kept if it has one; never raises: a bad one was refused
        # by validate_trajectories before any judge call
        tracing.ensure_trajectory_id(t)
        t.log(f"RULER explanation: {s.explanation}")  # as ART writes it
        for note in result.notes:
            t.log(f"RULER note: {note}")
        scored.append(t)
    meta = dict(group.metadata)
    meta.pop(NOTES_KEY, None)  # a re-scored group carries this judgment's notes only
    if result.notes:
        meta[NOTES_KEY] = json.dumps(result.notes)
    if result.disagreement is not None:
        meta["judge_disagreement"] = result.disagreement
    meta.update(judge_model=opts.judge_name, judge_calls=result.calls, judge_prompt_tokens=result.prompt_tokens,
                judge_completion_tokens=result.completion_tokens, judge_cost=result.cost, judge_cached=result.cached)
    return TrajectoryGroup(scored, metadata=meta, exceptions=[e.model_copy() for e in group.exceptions])
