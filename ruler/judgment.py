"""Judging a group that fits the judge's context: one judgment per ordering, averaged by id.

One judgment: look in the cache -> ask the judge with retries (`ruler_rl.judges.complete`) -> parse and validate
by id (`ruler_rl.parse`); an unusable answer is sent back with its problems stated, up to
`max_format_retries` times, then `JudgeOutputError` is raised. A score is never invented. With
`num_permutations=k > 1` the group is judged in k balanced orderings (`permutation_orders`, deterministic
given `seed`, so the cache still hits) and each trajectory's scores are averaged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import statistics

from ruler_rl import tracing
from ruler_rl.cache import cache_key, judgment_record
from ruler_rl.judges import JudgeOutputError, complete
from ruler_rl.options import MAX_PERMUTATIONS, RulerOptions
from ruler_rl.parse import ScoreProblems, TrajectoryScore, parse_scores
from ruler_rl.prompt import JudgePrompt
from ruler_rl.providers import Judge
from ruler_rl.results import RulerResult

log = logging.getLogger("ruler")


def _retry_messages(prompt: JudgePrompt, problems: list[str]) -> list[dict]:
    """The prompt again, with what was wrong with the last answer stated after it."""
    return [prompt.messages[0], {"role": "user", "content": prompt.messages[1]["content"]
            + "\n\nA previous answer to this prompt could not be used: " + "; ".join(problems)
            + ". Answer again with the JSON object only, one entry for each trajectory id ("
            + ", ".join(prompt.ids) + "), every score a number between 0 and 1."}]


def _finish_reason(reply) -> str | None:
    """Why the judge's answer ended (`"stop"`, `"length"`, ...), where its response says."""
    try:
        return reply.response.choices[0].finish_reason
    except (AttributeError, IndexError, TypeError):
        return None


async def judge_once(prompt: JudgePrompt, judge: Judge, opts: RulerOptions) -> RulerResult:
    """One judgment of one ordering: cache, call, validate by id, structural retries."""
    fmt = judge.response_format(prompt.ids)
    call_params = {k: v for k, v in judge.params.items() if k != "response_format"}
    cache = opts.store
    key = cache_key(judge.cache_model(), prompt.messages, fmt, call_params) if cache is not None else None
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            tracing.judge_cache_hit(judge.model, prompt.messages)
            return RulerResult(
                scores=[TrajectoryScore.model_validate(s) for s in hit["scores"]],
                notes=list(hit.get("notes", [])) + ["judge answer served from cache"], cached=True,
            )
    messages = list(prompt.messages)
    result = RulerResult(scores=[])
    problems: list[str] = []
    raw = ""
    for attempt in range(opts.max_format_retries + 1):
        with tracing.judge_call(judge.model, messages, attempt) as call:
            reply = await complete(judge.model, messages, response_format=fmt, params=call_params, retry=opts.retry)
            call.answered(reply)
        result.calls += 1
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        result.cost += reply.cost
        raw = reply.content
        if opts.debug:
            from rich import print as rprint
            rprint(f"[bold]RULER judge answer[/bold] (attempt {attempt + 1}):\n{raw}")
        try:
            parsed = parse_scores(raw, prompt.ids)
        except ScoreProblems as exc:
            problems = exc.problems
            if _finish_reason(reply) == "length":
                problems = [*problems, f"the answer was cut off at its token limit ({reply.completion_tokens} tokens)"]
            log.warning("judge %s answer rejected (attempt %d): %s", judge.model, attempt + 1, exc)
            messages = _retry_messages(prompt, problems)
            continue
        result.scores = parsed.scores
        result.notes += parsed.notes + ([f"accepted after {attempt} structural retr{'y' if attempt == 1 else 'ies'}"]
                                         if attempt else [])
        if key is not None:
            cache.set(key, judgment_record([s.model_dump() for s in parsed.scores], parsed.notes, model=judge.model,
                                           messages=prompt.messages, answer=raw))
        return result
    raise JudgeOutputError(
        f"judge {judge.model!r} gave no valid scores after {opts.max_format_retries + 1} answer(s): "
        + "; ".join(problems), problems=problems, raw=raw,
    )


def permutation_orders(n: int, k: int, seed: int) -> list[list[int]]:
    """k orderings of n items, balanced against position bias: the identity first, then cyclic shifts of it
    spread as evenly as k allows, so that while k <= n each item is shown first at most once, and with k = n
    each item stands in every position exactly once (a Latin square: a bias for any position then adds the
    same to every item). Past n, further Latin squares of seeded shuffles. Deterministic for a given seed,
    so repeated judgments of a group hit the cache."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_PERMUTATIONS:
        raise ValueError(f"num_permutations must be an integer from 1 to {MAX_PERMUTATIONS}, got {k!r}")
    k = min(k, math.factorial(min(n, 10)))  # never more orderings than there are distinct ones
    orders: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    rng = random.Random(seed)
    base = list(range(n))
    while len(orders) < k:
        m = min(n, k - len(orders))  # shifts taken from this square
        for shift in sorted({round(j * n / m) % n for j in range(m)}):
            o = base[shift:] + base[:shift]
            if tuple(o) not in seen and len(orders) < k:
                seen.add(tuple(o))
                orders.append(o)
        base = rng.sample(range(n), n)
    return orders


async def judge_orderings(message_lists: list[list[dict]], first: JudgePrompt, judge: Judge,
                          opts: RulerOptions) -> RulerResult:
    """Judge a group that fits: `first` (its prompt in the given order) and `num_permutations - 1` more
    orderings, concurrently; each trajectory's scores averaged, their spread reported."""
    n = len(message_lists)
    notes: list[str] = []
    if first.identical:
        prompts = [first]
        if n > 1:
            notes.append(f"all {n} trajectories identical: judged once, same score for all")
    else:
        orders = permutation_orders(n, opts.num_permutations, opts.seed)  # the identity first
        prompts = [first] + [opts.prompt(message_lists, order=o) for o in orders[1:]]
    results = await asyncio.gather(*(judge_once(p, judge, opts) for p in prompts))
    per_id: dict[str, list[TrajectoryScore]] = {}
    for r in results:
        for sc in r.scores:
            per_id.setdefault(sc.trajectory_id, []).append(sc)
    ids = [str(i) for i in range(1, n + 1)]
    if first.identical:
        only = per_id["1"][0]
        final = [only.model_copy(update={"trajectory_id": i}) for i in ids]
        spread = [0.0] * n
    else:
        final = [TrajectoryScore(trajectory_id=i, explanation=per_id[i][0].explanation,
                                 score=statistics.fmean(x.score for x in per_id[i])) for i in ids]
        spread = [statistics.pstdev([x.score for x in per_id[i]]) if len(per_id[i]) > 1 else 0.0 for i in ids]
    return RulerResult.combine(list(results), final, spread, notes)
