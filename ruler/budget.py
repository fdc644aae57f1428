"""Fitting a group into the judge's context: count, truncate, then split with anchors.

`score_within_budget` is the whole decision for one judge; every prompt it weighs is built once and the
one that fits is the one sent (with the further orderings of `num_permutations`).

1. Count the prompt's tokens for the judge model (the embedded model's own tokenizer, else litellm's
   counter for that model). The budget is the judge's input limit (or `max_prompt_tokens`; else
   `UNKNOWN_CONTEXT_TOKENS`) minus room for its answer. A prompt with no more characters than that budget
   fits without counting (a token is at least one character).
2. Over budget: shorten what matters least first: long tool outputs and long message bodies (never
   the shared system prompt and question) are cut in the middle with an explicit marker, at the
   largest cap (in characters) that fits, down to `MIN_CAP`.
3. Still over: split the group into sub-groups that all contain the same *anchor* trajectories (the
   shortest ones, cheapest to repeat). Each sub-group is judged on its own; `calibrate` puts the
   sub-groups' scores on one scale by mapping each sub-group's anchor scores onto the anchors' mean.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from ruler_rl.judges.errors import JudgeInputError
from ruler_rl.judgment import judge_orderings
from ruler_rl.options import RulerOptions
from ruler_rl.parse import TrajectoryScore
from ruler_rl.prompt import JudgePrompt, common_prefix_len
from ruler_rl.providers import UNKNOWN_CONTEXT_TOKENS, Judge, TokenCounter
from ruler_rl.results import RulerResult

CAPS = (16000, 8000, 4000, 2000, 1200, 800, 500)
MIN_CAP = CAPS[-1]
ANSWER_TOKENS_PER_TRAJECTORY = 60  # room left for the judge's answer, per trajectory
ANSWER_TOKENS_BASE = 64
MARK = "[... {n} characters cut to fit the judge's context ...]"

PromptBuilder = Callable[[list[list[dict]]], JudgePrompt]
"""Builds the judge prompt for a group's message lists (`RulerOptions.prompt`)."""


def truncate_middle(text: str, cap: int) -> str:
    """`text` cut to about `cap` characters by removing its middle, with a marker saying how much."""
    if len(text) <= cap:
        return text
    keep = max(cap - 60, 40)
    head, tail = text[: keep // 2], text[len(text) - keep // 2:]
    return head + MARK.format(n=len(text) - len(head) - len(tail)) + tail


def _truncate_value(value, cap: int):
    if isinstance(value, str):
        return truncate_middle(value, cap)
    if isinstance(value, dict):
        return {k: _truncate_value(v, cap) for k, v in value.items()}
    if isinstance(value, list):
        return [_truncate_value(v, cap) for v in value]
    return value


def _truncate_message(m: dict, cap: int) -> dict:
    content = m.get("content")
    if not isinstance(content, str) or len(content) <= cap:
        return m
    if m.get("role") == "tool" and content.strip()[:1] in "[{":
        try:  # cut the long strings inside a JSON tool result, keeping it JSON
            value = json.loads(content)
            cut = json.dumps(_truncate_value(value, max(cap // 4, 200)), ensure_ascii=False)
            if len(cut) <= cap * 2:
                return {**m, "content": cut}
        except ValueError:
            pass
    return {**m, "content": truncate_middle(content, cap)}


def truncate_group(message_lists: list[list[dict]], cap: int) -> list[list[dict]]:
    """Copies with long bodies after the shared prefix cut to `cap` characters (the prefix is kept whole)."""
    prefix = common_prefix_len(message_lists) if len(message_lists) > 1 else 0
    return [ml[:prefix] + [_truncate_message(m, cap) for m in ml[prefix:]] for ml in message_lists]


def answer_reserve(n: int) -> int:
    """Tokens left free for the judge's answer about `n` trajectories."""
    return ANSWER_TOKENS_BASE + ANSWER_TOKENS_PER_TRAJECTORY * n


@dataclass
class Fit:
    """How a group (or sub-group) fits: the message lists to send, their prompt and what was done to them."""

    message_lists: list[list[dict]]
    prompt: JudgePrompt
    cap: int | None = None  # truncation cap applied, None when nothing was cut


def fit_by_truncation(message_lists: list[list[dict]], build: PromptBuilder, count: TokenCounter, limit: int,
                      prompt: JudgePrompt | None = None) -> Fit | None:
    """The least truncation that makes the prompt fit `limit` minus the answer reserve, or None.

    `prompt` is the group's prompt as it is, when already built. Each prompt is built once; a cap that
    cuts nothing more than the previous one is skipped.
    """
    budget = limit - answer_reserve(len(message_lists))
    prompt = prompt or build(message_lists)
    if count(prompt.messages) <= budget:
        return Fit(message_lists, prompt)
    previous = message_lists
    for cap in CAPS:
        cut = truncate_group(message_lists, cap)
        if cut == previous:
            continue
        previous = cut
        prompt = build(cut)
        if count(prompt.messages) <= budget:
            return Fit(cut, prompt, cap)
    return None


@dataclass
class SplitPlan:
    anchors: list[int]
    subgroups: list[list[int]]  # indices into the group; anchors first in each
    notes: list[str] = field(default_factory=list)


def plan_split(message_lists: list[list[dict]], build: PromptBuilder, count: TokenCounter, limit: int,
               n_anchors: int = 2) -> SplitPlan:
    """Sub-groups that each fit at the floor truncation, all sharing the same anchors."""
    n = len(message_lists)
    floor = truncate_group(message_lists, MIN_CAP)
    prefix = common_prefix_len(message_lists)
    empty = build([ml[:prefix] + [{"role": "assistant", "content": ""}] for ml in floor[:2]])
    context_tokens = count(empty.messages)
    sizes = [count([{"role": "user", "content": json.dumps(ml[prefix:], ensure_ascii=False)}]) for ml in floor]
    n_anchors = min(n_anchors, max(n - 2, 0))
    anchors = sorted(range(n), key=lambda i: (sizes[i], i))[:n_anchors]
    rest = [i for i in range(n) if i not in anchors]
    base = context_tokens + sum(sizes[a] for a in anchors)
    groups: list[list[int]] = []
    current: list[int] = []
    for i in rest:
        m = len(anchors) + len(current) + 1
        if current and base + sum(sizes[j] for j in current) + sizes[i] + answer_reserve(m) > limit:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    for g in groups:
        if len(g) == 1 and base + sizes[g[0]] + answer_reserve(len(anchors) + 1) > limit:
            raise JudgeInputError(
                f"the judge's budget of {limit} tokens cannot hold even one trajectory with the task context "
                f"(~{context_tokens + sizes[g[0]]} tokens after cutting bodies to {MIN_CAP} characters): "
                "raise max_prompt_tokens or use a judge with a longer context"
            )
    if len(groups) < 2:  # everything fits at the floor after all: one group
        return SplitPlan(anchors=[], subgroups=[list(range(n))])
    plan = SplitPlan(anchors=anchors, subgroups=[anchors + g for g in groups])
    plan.notes.append(f"group of {n} split into {len(groups)} sub-groups sharing anchor trajectories "
                      f"{', '.join(str(a + 1) for a in anchors)} to fit the judge's context")
    return plan


def calibrate(sub_scores: list[dict[int, float]], anchors: list[int]) -> dict[int, float]:
    """One scale for all sub-groups: map each sub-group's anchor scores onto the anchors' mean scores.

    With two or more anchors that the sub-group ranks apart, a least-squares line (positive slope) is
    fitted through them; otherwise the sub-group is shifted so its anchors' mean matches. Results are
    clipped to [0, 1]; anchors get their mean score.
    """
    if not anchors:
        merged: dict[int, float] = {}
        for s in sub_scores:
            merged.update(s)
        return merged
    ref = {a: statistics.fmean(s[a] for s in sub_scores) for a in anchors}
    out = dict(ref)
    ref_vals = [ref[a] for a in anchors]
    for s in sub_scores:
        own = [s[a] for a in anchors]
        slope, shift = 1.0, statistics.fmean(ref_vals) - statistics.fmean(own)
        if len(anchors) >= 2 and statistics.pstdev(own) > 0.02 and statistics.pstdev(ref_vals) > 0.02:
            mo, mr = statistics.fmean(own), statistics.fmean(ref_vals)
            cov = sum((o - mo) * (r - mr) for o, r in zip(own, ref_vals, strict=True))
            var = sum((o - mo) ** 2 for o in own)
            if cov > 0:
                slope = cov / var
                shift = mr - slope * mo
        for i, v in s.items():
            if i not in ref:
                out[i] = min(1.0, max(0.0, slope * v + shift))
    return out


async def score_within_budget(message_lists: list[list[dict]], judge: Judge, opts: RulerOptions) -> RulerResult:
    """`judge`'s scores for the group: as it is when it fits; else with long bodies cut; else in sub-groups
    sharing anchors, put on one scale by `calibrate`. Notes say what was done."""
    limit = opts.max_prompt_tokens or judge.context_limit()
    result = await _fit_and_score(message_lists, judge, opts, limit or UNKNOWN_CONTEXT_TOKENS)
    if limit is None and any(n.startswith(("long bodies cut", "group of")) for n in result.notes):
        result.notes.insert(0, f"litellm does not know this judge's context: {UNKNOWN_CONTEXT_TOKENS} tokens assumed "
                            "(set max_prompt_tokens)")
    return result


async def _fit_and_score(message_lists: list[list[dict]], judge: Judge, opts: RulerOptions,
                         limit: int) -> RulerResult:
    n = len(message_lists)
    prompt = opts.prompt(message_lists)
    if sum(len(m["content"]) for m in prompt.messages) <= limit - answer_reserve(n):
        return await judge_orderings(message_lists, prompt, judge, opts)
    count = judge.token_counter()
    fit = fit_by_truncation(message_lists, opts.prompt, count, limit, prompt)
    if fit is not None:
        result = await judge_orderings(fit.message_lists, fit.prompt, judge, opts)
        if fit.cap:
            result.notes.insert(0, f"long bodies cut to {fit.cap} characters to fit {limit} tokens")
        return result
    plan = plan_split(message_lists, opts.prompt, count, limit)
    fits = []
    for idx in plan.subgroups:
        sub_fit = fit_by_truncation([message_lists[i] for i in idx], opts.prompt, count, limit)
        if sub_fit is None:
            raise JudgeInputError(f"a sub-group of {len(idx)} trajectories still exceeds {limit} tokens")
        fits.append(sub_fit)
    results = await asyncio.gather(*(judge_orderings(f.message_lists, f.prompt, judge, opts) for f in fits))
    judged = list(zip(plan.subgroups, results, strict=True))
    merged = calibrate([{i: r.scores[k].score for k, i in enumerate(idx)} for idx, r in judged], plan.anchors)
    expl = {i: r.scores[k].explanation for idx, r in judged for k, i in enumerate(idx)}
    scores = [TrajectoryScore(trajectory_id=str(i + 1), explanation=expl[i], score=merged[i]) for i in range(n)]
    return RulerResult.combine(list(results), scores, [0.0] * n, plan.notes)
