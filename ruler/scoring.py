"""The RULER algorithm: one judge call scores a whole group relative to each other.

    ruler(message_lists, judge_model, ...)        -> list[TrajectoryScore]   (ids "1".."N")
    ruler_score_group(group, judge_model, ...)    -> new TrajectoryGroup with reward = judge score

Per judge call: build the prompt (ruler/prompt.py) -> look in the cache -> ask the judge with
retries (judges.complete) -> parse and validate by id (ruler/parse.py); an invalid answer is sent
back with its problems stated, up to `max_format_retries` times, then a `JudgeOutputError` is raised.
A score is never invented. With `num_permutations=k > 1` the group is judged under k orderings
(deterministic given `seed`, so the cache still hits) and scores are averaged by id.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import os
import random
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any

import litellm

from judges import EMBEDDED_JUDGE, DEFAULT_RUBRIC, JudgeConfigError, JudgeOutputError, RetryPolicy, complete
from judges.errors import JudgeInputError, JudgeUnavailableError
from judges.panel import JudgePanel, aggregate_scores
from judges.rubrics import RubricText, get_rubric
from ruler import budget
from ruler.cache import CacheLike, cache_key, open_cache
from ruler.parse import ScoreProblems, TrajectoryScore, parse_scores
from ruler.results import EXPLANATION_KEY
from ruler.prompt import JudgePrompt, Render, build_prompt, response_schema
from ruler.trajectory import (Limits, Trajectory, TrajectoryGroup, require_task_stated, validate_message_lists,
                              validate_trajectories)

log = logging.getLogger("ruler")


MAX_PERMUTATIONS = 32  # orderings per group (each one is a judge call)
MIN_PROMPT_TOKENS = 256  # smaller budgets cannot hold the instructions and an answer
MAX_PROMPT_TOKENS = 2_000_000
UNKNOWN_CONTEXT_TOKENS = 131_072  # assumed for a judge whose context litellm does not know
LOCAL_EXPLANATION_CHARS = 80  # the embedded judge decodes ~10 tokens/s on CPU: keep its explanations short
SERVED_EXPLANATION_CHARS = 400  # self-served models under constrained decoding: bound run-on explanations


def default_judge_model() -> str:
    """`$RULER_JUDGE_MODEL` when set, else the embedded offline judge."""
    return os.environ.get("RULER_JUDGE_MODEL") or EMBEDDED_JUDGE


@dataclass
class RulerResult:
    """Scores plus what it took to get them."""

    scores: list[TrajectoryScore]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    calls: int = 0          # judge calls actually made (0 when everything came from the cache)
    cached: bool = False    # every judgment came from the cache
    spread: list[float] = field(default_factory=list)  # per-trajectory std across orderings (or judges)
    notes: list[str] = field(default_factory=list)
    disagreement: float | None = None  # panels: mean per-trajectory std of the judges' scores
    per_judge: dict[str, list[float]] = field(default_factory=dict)  # panels: each judge's scores


def _provider(model: str, params: dict) -> str:
    return _provider_of(model, params.get("api_base"))


@functools.lru_cache(maxsize=256)
def _provider_of(model: str, api_base: str | None) -> str:
    from judges.local_provider import check_local_model

    check_local_model(model)
    try:
        return litellm.get_llm_provider(model, api_base=api_base)[1]
    except Exception as exc:
        raise JudgeConfigError(f"unknown judge model {model!r}: {str(exc).splitlines()[0]}") from None


def _response_format(model: str, provider: str, ids: list[str], params: dict) -> dict | None:
    """Ask for the answer's JSON schema where the provider supports it (exact schema for local models)."""
    if "response_format" in params:
        return params["response_format"]
    if provider == "local":
        schema = response_schema(ids, max_explanation_chars=LOCAL_EXPLANATION_CHARS)
    elif provider in ("hosted_vllm", "vllm-engine") or (provider == "openai" and params.get("api_base")):
        schema = response_schema(ids, max_explanation_chars=SERVED_EXPLANATION_CHARS)
    else:
        try:
            if not litellm.supports_response_schema(model=model, custom_llm_provider=provider):
                return None
        except Exception:
            return None
        schema = response_schema(None)
    return {"type": "json_schema", "json_schema": {"name": "ruler_scores", "schema": schema, "strict": True}}


@functools.lru_cache(maxsize=256)
def _context_limit(model: str, provider: str) -> int | None:
    if provider == "local":
        from judges.embedded import load_embedded_model

        return load_embedded_model().max_context - 256  # room for the answer
    try:
        info = litellm.get_model_info(model=model, custom_llm_provider=provider)
        return info.get("max_input_tokens") or info.get("max_tokens")
    except Exception:  # a model litellm does not know: the caller may pass max_prompt_tokens
        return None


async def _judge_once(
    prompt: JudgePrompt,
    model: str,
    provider: str,
    params: dict,
    cache: CacheLike | None,
    retry: RetryPolicy,
    max_format_retries: int,
    debug: bool,
) -> RulerResult:
    """One judgment of one ordering: cache, call, validate by id, structural retries."""
    fmt = _response_format(model, provider, prompt.ids, params)
    call_params = {k: v for k, v in params.items() if k != "response_format"}
    key = cache_key(model, prompt.messages, fmt, call_params) if cache is not None else None
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            return RulerResult(
                scores=[TrajectoryScore.model_validate(s) for s in hit["scores"]],
                notes=list(hit.get("notes", [])) + ["judge answer served from cache"], cached=True,
            )
    messages = list(prompt.messages)
    result = RulerResult(scores=[])
    problems: list[str] = []
    raw = ""
    for attempt in range(max_format_retries + 1):
        reply = await complete(model, messages, response_format=fmt, params=call_params, retry=retry)
        result.calls += 1
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        result.cost += reply.cost
        raw = reply.content
        if debug:
            from rich import print as rprint
            rprint(f"[bold]RULER judge answer[/bold] (attempt {attempt + 1}):\n{raw}")
        try:
            parsed = parse_scores(raw, prompt.ids)
        except ScoreProblems as exc:
            problems = exc.problems
            log.warning("judge %s answer rejected (attempt %d): %s", model, attempt + 1, exc)
            messages = [prompt.messages[0], {"role": "user", "content": prompt.messages[1]["content"]
                        + "\n\nA previous answer to this prompt could not be used: " + "; ".join(problems)
                        + ". Answer again with the JSON object only, one entry for each trajectory id ("
                        + ", ".join(prompt.ids) + "), every score a number between 0 and 1."}]
            continue
        result.scores = parsed.scores
        result.notes += parsed.notes + ([f"accepted after {attempt} structural retr{'y' if attempt == 1 else 'ies'}"]
                                         if attempt else [])
        if key is not None:
            cache.set(key, {"scores": [s.model_dump() for s in parsed.scores], "notes": parsed.notes})
        return result
    raise JudgeOutputError(
        f"judge {model!r} gave no valid scores after {max_format_retries + 1} answer(s): " + "; ".join(problems),
        problems=problems, raw=raw,
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


@dataclass
class _Setup:
    """What stays fixed while one group (and its sub-groups or orderings) is judged."""

    model: str
    provider: str
    params: dict
    rubric: str
    tools: list[dict] | None
    render: Render
    store: CacheLike | None
    policy: RetryPolicy
    max_format_retries: int
    debug: bool
    num_permutations: int
    seed: int


async def _score_fitting(message_lists: list[list[dict]], s: _Setup, first: JudgePrompt | None = None) -> RulerResult:
    """Judge a group that fits the context: k orderings, averaged by id."""
    n = len(message_lists)
    notes: list[str] = []
    orders = permutation_orders(n, s.num_permutations if n > 1 else 1, s.seed)  # the identity first
    prompts = [first if (k == 0 and first is not None) else
               build_prompt(message_lists, s.rubric, tools=s.tools, render=s.render, order=o)
               for k, o in enumerate(orders)]
    if prompts[0].identical:
        prompts = prompts[:1]
        if n > 1:
            notes.append(f"all {n} trajectories identical: judged once, same score for all")
    results = await asyncio.gather(*(
        _judge_once(p, s.model, s.provider, s.params, s.store, s.policy, s.max_format_retries, s.debug)
        for p in prompts
    ))
    per_id: dict[str, list[TrajectoryScore]] = {}
    for r in results:
        for sc in r.scores:
            per_id.setdefault(sc.trajectory_id, []).append(sc)
    ids = [str(i) for i in range(1, n + 1)]
    if prompts[0].identical:
        only = per_id["1"][0]
        final = [only.model_copy(update={"trajectory_id": i}) for i in ids]
        spread = [0.0] * n
    else:
        final = [TrajectoryScore(trajectory_id=i, explanation=per_id[i][0].explanation,
                                 score=statistics.fmean(x.score for x in per_id[i])) for i in ids]
        spread = [statistics.pstdev([x.score for x in per_id[i]]) if len(per_id[i]) > 1 else 0.0 for i in ids]
    return _combine(results, final, spread, notes)


def _combine(results: list[RulerResult], scores, spread, notes) -> RulerResult:
    for r in results:
        notes += [x for x in r.notes if x not in notes]
    return RulerResult(
        scores=scores,
        prompt_tokens=sum(r.prompt_tokens for r in results),
        completion_tokens=sum(r.completion_tokens for r in results),
        cost=sum(r.cost for r in results),
        calls=sum(r.calls for r in results),
        cached=all(r.cached for r in results),
        spread=spread,
        notes=notes,
    )


def _token_counter(model: str, provider: str):
    """Prompt tokens as the judge counts them: the embedded tokenizer, else litellm's counter for `model`."""
    if provider == "local":
        from judges.embedded import load_embedded_model

        tok = load_embedded_model().tokenizer
        return lambda msgs: sum(len(tok(m["content"])["input_ids"]) + 4 for m in msgs) + 3
    return lambda msgs: litellm.token_counter(model=model, messages=msgs)


async def _score_within_budget(message_lists: list[list[dict]], s: _Setup, limit: int | None) -> RulerResult:
    """Judge the group as is when it fits; else truncate bodies; else split with anchors and calibrate."""
    n = len(message_lists)
    first = None  # the prompt in the given order, built once: for the size check and for judging
    if limit is not None and limit < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {limit}")
    if limit is not None:
        first = build_prompt(message_lists, s.rubric, tools=s.tools, render=s.render)
        chars = sum(len(m["content"]) for m in first.messages)
        if chars > limit - budget.answer_reserve(n):  # a token is at least one character: else it fits
            count = _token_counter(s.model, s.provider)
            fit = budget.fit_by_truncation(message_lists, s.rubric, s.tools, s.render, count, limit)
            if fit is not None:
                result = await _score_fitting(fit.message_lists, s)
                if fit.cap:
                    result.notes.insert(0, f"long bodies cut to {fit.cap} characters to fit {limit} tokens")
                return result
            plan = budget.plan_split(message_lists, s.rubric, s.tools, s.render, count, limit)
            subs = []
            for idx in plan.subgroups:
                sub = [message_lists[i] for i in idx]
                sub_fit = budget.fit_by_truncation(sub, s.rubric, s.tools, s.render, count, limit)
                if sub_fit is None:
                    raise JudgeInputError(f"a sub-group of {len(sub)} trajectories still exceeds {limit} tokens")
                subs.append(sub_fit.message_lists)
            results = await asyncio.gather(*(_score_fitting(sub, s) for sub in subs))
            merged = budget.calibrate(
                [{i: r.scores[k].score for k, i in enumerate(idx)} for idx, r in zip(plan.subgroups, results)],
                plan.anchors,
            )
            expl = {i: r.scores[k].explanation for idx, r in zip(plan.subgroups, results) for k, i in enumerate(idx)}
            scores = [TrajectoryScore(trajectory_id=str(i + 1), explanation=expl[i], score=merged[i]) for i in range(n)]
            return _combine(list(results), scores, [0.0] * n, list(plan.notes))
    return await _score_fitting(message_lists, s, first)


async def _score_panel(message_lists, panel: JudgePanel, extra_litellm_params, rubric, **options) -> RulerResult:
    """Every panel member judges the group (concurrently); scores are aggregated if a quorum answered."""
    async def member(model: str):
        params = {**(extra_litellm_params or {}), **panel.params.get(model, {})}
        return await _score_checked(message_lists, model, params, rubric, **options)

    outcomes = await asyncio.gather(*(member(m) for m in panel.models), return_exceptions=True)
    answered = [(m, r) for m, r in zip(panel.models, outcomes) if isinstance(r, RulerResult)]
    failed = [(m, r) for m, r in zip(panel.models, outcomes) if not isinstance(r, RulerResult)]
    for m, exc in failed:
        if not isinstance(exc, Exception):
            raise exc  # cancellation and the like are not judge failures
    if len(answered) < panel.quorum:
        detail = "; ".join(f"{m}: {type(e).__name__}: {e}" for m, e in failed)
        raise JudgeUnavailableError(f"only {len(answered)} of {len(panel.models)} judges answered "
                                    f"(quorum {panel.quorum}): {detail}")
    per_judge = [[s.score for s in r.scores] for _, r in answered]
    agg, disagreement = aggregate_scores(per_judge, panel.aggregate)
    n = len(message_lists)
    scores = [TrajectoryScore(trajectory_id=str(i + 1), score=agg[i], explanation=" | ".join(
        f"{m}: {r.scores[i].explanation}" for m, r in answered)) for i in range(n)]
    notes = [f"panel of {len(panel.models)} ({panel.aggregate}): {len(answered)} answered, "
             f"disagreement {disagreement:.3f}"] + [f"judge {m} failed: {type(e).__name__}: {e}" for m, e in failed]
    result = _combine([r for _, r in answered], scores,
                      [statistics.pstdev([p[i] for p in per_judge]) for i in range(n)], notes)
    result.disagreement = disagreement
    result.per_judge = {m: [s.score for s in r.scores] for m, r in answered}
    return result


async def score_group_messages(
    message_lists: list[list[dict]],
    judge_model: "str | list[str] | JudgePanel | None" = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    tools: list[dict] | None = None,
    debug: bool = False,
    cache: Any = None,
    retry: RetryPolicy | None = None,
    max_format_retries: int = 2,
    render: Render = "compact",
    num_permutations: int = 1,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    limits: Limits | None = None,
) -> RulerResult:
    """`ruler()` with everything it measured: usage, cost, cache use, spread, notes."""
    _check_options(judge_model, extra_litellm_params, rubric, tools, retry, max_format_retries, render,
                   num_permutations, seed, max_prompt_tokens, limits)
    message_lists = validate_message_lists(message_lists, limits=limits)
    return await _score_checked(
        message_lists, judge_model, extra_litellm_params, get_rubric(rubric), tools=tools, debug=debug, cache=cache,
        retry=retry, max_format_retries=max_format_retries, render=render, num_permutations=num_permutations,
        seed=seed, max_prompt_tokens=max_prompt_tokens)


async def _score_checked(
    message_lists: list[list[dict]],
    judge_model: str | list[str] | JudgePanel | None,
    extra_litellm_params: dict | None,
    rubric: RubricText,
    *,
    tools: list[dict] | None,
    debug: bool,
    cache: Any,
    retry: RetryPolicy | None,
    max_format_retries: int,
    render: Render,
    num_permutations: int,
    seed: int,
    max_prompt_tokens: int | None,
) -> RulerResult:
    """`score_group_messages` once its input passed its one check (`validate_message_lists`, or
    `validate_trajectories` for `ruler_score_group`), its options `_check_options` and its rubric `get_rubric`."""
    if isinstance(judge_model, (list, tuple)):
        judge_model = JudgePanel(list(judge_model))
    if isinstance(judge_model, JudgePanel):
        if not message_lists:
            return RulerResult(scores=[])
        return await _score_panel(
            message_lists, judge_model, extra_litellm_params, rubric, tools=tools, debug=debug, cache=cache,
            retry=retry, max_format_retries=max_format_retries, render=render, num_permutations=num_permutations,
            seed=seed, max_prompt_tokens=max_prompt_tokens)
    if not message_lists:
        return RulerResult(scores=[])
    model = judge_model or default_judge_model()
    params = dict(extra_litellm_params or {})
    provider = _provider(model, params)
    setup = _Setup(model, provider, params, rubric, tools, render, open_cache(cache),
                   retry or RetryPolicy(), max_format_retries, debug, num_permutations, seed)
    notes = []
    if len(message_lists) == 1:
        notes.append("single trajectory: scored on its own, without relative grounding")
        warnings.warn("RULER got a group of one trajectory; its score is absolute, not relative", stacklevel=3)
    if not any(m["role"] in ("system", "developer") for ml in message_lists for m in ml):
        notes.append("no system prompt: the judge infers the task from the user messages")
    limit = max_prompt_tokens or _context_limit(model, provider)
    result = await _score_within_budget(message_lists, setup, limit or UNKNOWN_CONTEXT_TOKENS)
    if limit is None and any(n.startswith(("long bodies cut", "group of")) for n in result.notes):
        notes.append(f"litellm does not know this judge's context: {UNKNOWN_CONTEXT_TOKENS} tokens assumed "
                     "(set max_prompt_tokens)")
    result.notes = notes + result.notes
    return result


_OPTION_DEFAULTS = {name: p.default for name, p in inspect.signature(score_group_messages).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("tools", "debug")}
"""The options `ruler_score_group` passes on (as `score_group_messages` takes them) and their defaults."""


def _check_options(judge_model, extra_litellm_params, rubric, tools, retry, max_format_retries, render,
                   num_permutations, seed, max_prompt_tokens, limits) -> None:
    """Raise a clear error for any option that cannot work, before anything is sent anywhere."""
    if isinstance(judge_model, str):
        if not judge_model.strip():
            raise JudgeConfigError("judge_model is an empty string: pass None for the default judge, or a litellm "
                                   "model string")
    elif isinstance(judge_model, (list, tuple)):
        if not all(isinstance(m, str) for m in judge_model):
            raise JudgeConfigError("a list of judges must hold litellm model strings")
    elif judge_model is not None and not isinstance(judge_model, JudgePanel):
        raise JudgeConfigError("judge_model must be a litellm model string, a list of them, a JudgePanel or None, "
                               f"got {type(judge_model).__name__}")
    if extra_litellm_params is not None and not isinstance(extra_litellm_params, dict):
        raise JudgeConfigError(f"extra_litellm_params must be a dict, got {type(extra_litellm_params).__name__}")
    if not isinstance(rubric, str):
        raise JudgeConfigError(f"rubric must be a string (a rubric name or its text), got {type(rubric).__name__}")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise TypeError("tools must be a list of tool schemas (dicts) or None")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
    if isinstance(max_format_retries, bool) or not isinstance(max_format_retries, int) or not 0 <= max_format_retries <= 10:
        raise ValueError(f"max_format_retries must be an integer from 0 to 10, got {max_format_retries!r}")
    if render not in ("compact", "art"):
        raise ValueError(f"render must be 'compact' or 'art', got {render!r}")
    if isinstance(num_permutations, bool) or not isinstance(num_permutations, int) \
            or not 1 <= num_permutations <= MAX_PERMUTATIONS:
        raise ValueError(f"num_permutations must be an integer from 1 to {MAX_PERMUTATIONS}, got {num_permutations!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__}")
    if max_prompt_tokens is not None and (
            isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int)
            or not MIN_PROMPT_TOKENS <= max_prompt_tokens <= MAX_PROMPT_TOKENS):
        raise ValueError(f"max_prompt_tokens must be None or an integer from {MIN_PROMPT_TOKENS} to "
                         f"{MAX_PROMPT_TOKENS:,}, got {max_prompt_tokens!r}")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ruler.Limits, got {type(limits).__name__}")


async def ruler(
    message_lists: list[list[dict]],
    judge_model: "str | list[str] | JudgePanel | None" = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    tools: list[dict] | None = None,
    debug: bool = False,
    **options: Any,
) -> list[TrajectoryScore]:
    """Score conversations relative to each other with one judge call (ART's `ruler`).

    Returns one `TrajectoryScore` per conversation, ids "1".."N" in input order. Any litellm model
    string works as `judge_model` (default: `$RULER_JUDGE_MODEL`, else the embedded judge);
    `extra_litellm_params` pass through (`api_base`, `api_key`, `temperature`, ...). Options: `cache`,
    `retry` (a `RetryPolicy`: attempts, per-attempt timeout, total deadline), `max_format_retries` (0-10),
    `render`, `num_permutations` (1 to `MAX_PERMUTATIONS`), `seed`, `max_prompt_tokens` (`MIN_PROMPT_TOKENS`
    to `MAX_PROMPT_TOKENS`; default: the judge's context, or `UNKNOWN_CONTEXT_TOKENS` when litellm does
    not know it), `limits` (a `Limits`: trajectories, messages, message size, nesting). Bad input raises
    `TrajectoryError` (a ValueError naming the trajectory and field) or `JudgeConfigError` before any call;
    a failing judge raises `JudgeError` subclasses; a made-up score is never returned.
    """
    result = await score_group_messages(
        message_lists, judge_model, extra_litellm_params, rubric, tools=tools, debug=debug, **options
    )
    return result.scores


def _group_tools(trajectories: list[Trajectory]) -> list[dict] | None:
    """The tool schemas offered in the group, each once."""
    seen: dict[str, dict] = {}
    for t in trajectories:
        for tool in t.tools or []:
            seen.setdefault(json.dumps(tool, sort_keys=True), tool)
    return list(seen.values()) or None


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: "str | list[str] | JudgePanel | None" = None,
    extra_litellm_params: dict | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
    **options: Any,
) -> TrajectoryGroup | None:
    """Score a group with RULER and return a **new** group whose rewards are the judge's scores.

    Each trajectory gets `metrics["ruler_score"]`, `metrics["independent_reward"]` (its old reward),
    its share of the judge bill (`judge_prompt_tokens`, `judge_completion_tokens`, `judge_cost`; shares
    add up to the group's total), `judge_cached`, and the judge's explanation in `metadata["ruler_explanation"]`
    (also written to `logs` as ART does; `ruler.results.score_rows` reads it). The input group is
    not modified. With `swallow_exceptions=True` a failure returns None instead of raising (ART's
    behaviour). Options as for `ruler`.

    The group is checked once, by `validate_trajectories`: a `Choice` is judged as the policy wrote it (a
    tool call with an empty name or of another type included), never refused by a second check of the
    message it becomes.
    """
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"ruler_score_group takes a TrajectoryGroup, got {type(group).__name__}")
    try:
        validate_trajectories(group, limits=options.get("limits"))
    except Exception as exc:
        if swallow_exceptions:
            log.warning("RULER swallowed %s: %s", type(exc).__name__, exc)
            return None
        raise
    for i, t in enumerate(group.trajectories, 1):
        if t.additional_histories:
            raise ValueError(f"trajectory {i} has additional_histories, which RULER does not score yet")
    # fresh containers for everything we change (reward, metrics, logs); messages are only read
    new = [t.model_copy(update={"messages_and_choices": list(t.messages_and_choices), "metrics": dict(t.metrics),
                                "metadata": dict(t.metadata), "logs": list(t.logs), "tools": t.tools and list(t.tools)})
           for t in group.trajectories]
    try:
        unknown = [k for k in options if k not in _OPTION_DEFAULTS]
        if unknown:
            raise TypeError(f"ruler_score_group() got an unexpected keyword argument {unknown[0]!r}")
        o = {**_OPTION_DEFAULTS, **options}
        tools = _group_tools(new)
        _check_options(judge_model, extra_litellm_params, rubric, tools, o["retry"], o["max_format_retries"],
                       o["render"], o["num_permutations"], o["seed"], o["max_prompt_tokens"], o["limits"])
        message_lists = [t.messages() for t in new]
        require_task_stated(message_lists)
        del o["limits"]  # the trajectories were checked against them above
        result = await _score_checked(message_lists, judge_model, extra_litellm_params, get_rubric(rubric),
                                      tools=tools, debug=debug, **o)
    except Exception as exc:
        if swallow_exceptions:
            log.warning("RULER swallowed %s: %s", type(exc).__name__, exc)
            return None
        raise
    n = max(1, len(new))
    for t, s, spread in zip(new, result.scores, result.spread or [0.0] * len(new)):
        t.metrics["independent_reward"] = t.reward
        t.metrics["ruler_score"] = s.score
        t.metrics["judge_prompt_tokens"] = result.prompt_tokens / n
        t.metrics["judge_completion_tokens"] = result.completion_tokens / n
        t.metrics["judge_cost"] = result.cost / n
        t.metrics["judge_cached"] = result.cached
        if options.get("num_permutations", 1) > 1 or result.per_judge:
            t.metrics["ruler_score_spread"] = spread
        t.reward = s.score
        t.metadata[EXPLANATION_KEY] = s.explanation
        t.log(f"RULER explanation: {s.explanation}")  # as ART writes it
        for note in result.notes:
            t.log(f"RULER note: {note}")
    for k, t in enumerate(new):
        for m, judge_scores in result.per_judge.items():
            t.metrics[f"ruler_score[{m}]"] = judge_scores[k]
    meta = dict(group.metadata)
    if result.disagreement is not None:
        meta["judge_disagreement"] = result.disagreement
    shown = ",".join(judge_model.models) if isinstance(judge_model, JudgePanel) else (
        ",".join(judge_model) if isinstance(judge_model, (list, tuple)) else judge_model or default_judge_model())
    meta.update(judge_model=shown, judge_calls=result.calls,
                judge_prompt_tokens=result.prompt_tokens, judge_completion_tokens=result.completion_tokens,
                judge_cost=result.cost, judge_cached=result.cached)
    return TrajectoryGroup(new, metadata=meta, exceptions=[e.model_copy() for e in group.exceptions])
