"""Distilling a cheap local judge from the judgments you paid for (`ruler distill`).

Teacher data is a list of `TeacherExample`s: a RULER prompt (the exact messages a judge is sent) and the
teacher's answer in RULER's JSON, `{"scores": [{"trajectory_id", "explanation", "score"}, ...]}`, ids in
order, written the way the local judge's constrained decoding writes it (`render_answer`). It comes from

- the judge cache (`from_cache`): every judgment a judge model made, selected by model and date
  (`ruler_rl.cache.export_judgments`), its validated scores as the answer;
- labelled groups (`from_labels`): conversations and a label per conversation (higher is better), rendered as
  the RULER prompt with the given rubric, the labels min-max scaled to [0, 1] as the scores and "ranked k of
  n" as each explanation.

`split_by_group` keeps a seeded held-out share of *groups* (every ordering of one group, which the cache
holds once per ordering, stays on one side). The student is trained with `ruler_rl.trainer.sft` (LoRA SFT on the
answer tokens) and measured with `agreement`: it is asked each held-out prompt through litellm as any
judge is (`ruler_rl.judgment.judge_once`: cache, constrained JSON, validation by id), and its scores are
compared with the teacher's: pairwise accuracy over the pairs the teacher orders (a student tie counts as
wrong and is also reported as `ties`) and Kendall's tau per prompt, averaged.

GRPO instead of (or after) SFT: `train_grpo` has a registered `ruler_rl.trainer.TrainableModel` sample a group of
answers to each training prompt, rewards each with `agreement_reward` (RULER's own parser reads it; an
invalid answer gets 0, a valid one (1 + tau) / 2 over the pairs the teacher orders, a tie worth half) and
trains on the groups with `model.train`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import re
from dataclasses import dataclass, field

from ruler_rl.cache import CachedJudgment
from ruler_rl.judges.errors import JudgeError
from ruler_rl.labels import Group, Pair, conversation
from ruler_rl.prompt import JudgePrompt, build_prompt
from ruler_rl.providers import LOCAL_EXPLANATION_CHARS

log = logging.getLogger("ruler.distill")
_TRAJECTORY = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.DOTALL)


@dataclass
class TeacherExample:
    """One teacher judgment: the prompt `messages`, the trajectory `ids` in the order shown, the teacher's
    `scores` by id (in [0, 1]) and explanations, the `answer` text to train on, and `group`, a key equal for
    every ordering of the same group (the held-out split is by it). `source` says where it came from."""

    messages: list[dict]
    ids: list[str]
    scores: dict[str, float]
    explanations: dict[str, str]
    answer: str
    group: str
    source: str = ""

    def prompt(self) -> JudgePrompt:
        return JudgePrompt(messages=self.messages, ids=self.ids, prefix_len=0, identical=False)


@dataclass
class LabelledGroup:
    """Conversations judged together and a label per conversation, higher is better (at least two differ)."""

    id: str
    message_lists: list[list[dict]]
    labels: list[float]
    tools: list[dict] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.message_lists, list) or len(self.message_lists) < 2:
            raise ValueError(f"group {self.id}: needs at least 2 conversations")
        if len(self.labels) != len(self.message_lists):
            raise ValueError(f"group {self.id}: {len(self.labels)} labels for {len(self.message_lists)} conversations")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) for x in self.labels):
            raise ValueError(f"group {self.id}: labels must be finite numbers")
        if len(set(self.labels)) < 2:
            raise ValueError(f"group {self.id}: every label is equal; nothing to rank")


def labelled_groups(items: list[Pair | Group]) -> list[LabelledGroup]:
    """Pairs and groups of `ruler_rl.labels.load_user_dataset` as labelled groups: a pair is a group of two
    labelled 1 (the preferred response) and 0; a group keeps its conversations (or prompt + responses), tools
    and labels."""
    out = []
    for x in items:
        if isinstance(x, Pair):
            if x.label not in (1, 2):
                raise ValueError(f"pair {x.id}: a tie (label 0) has no preferred response to teach")
            out.append(LabelledGroup(x.id, [conversation(x.prompt, x.a), conversation(x.prompt, x.b)],
                                     [1.0, 0.0] if x.label == 1 else [0.0, 1.0]))
        elif isinstance(x, Group):
            convs = x.convs or [conversation(x.prompt, r) for r in x.responses]
            out.append(LabelledGroup(x.id, convs, list(x.human), x.tools))
        else:
            raise TypeError(f"expected a Pair or a Group, got {type(x).__name__}")
    return out


def render_answer(ids: list[str], scores: dict[str, float], explanations: dict[str, str],
                  max_explanation_chars: int = LOCAL_EXPLANATION_CHARS) -> str:
    """The answer as the local judge writes it under its schema (`ruler_rl.prompt.response_schema`): entries in
    id order, `trajectory_id`, `explanation` (cut to `max_explanation_chars`, never empty), `score` (rounded
    to 3 decimals), JSON with `, ` and `: ` separators."""
    entries = []
    for i in sorted(ids, key=int):
        score = float(scores[i])
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"trajectory {i}: score {score} is outside [0, 1]")
        text = " ".join(str(explanations.get(i) or "").split())[:max_explanation_chars].strip() or "no explanation"
        value = round(score, 3)
        entries.append({"trajectory_id": i, "explanation": text, "score": int(value) if value.is_integer() else value})
    return json.dumps({"scores": entries}, ensure_ascii=False)


def shown_ids(messages: list[dict]) -> list[str]:
    """The trajectory ids of a RULER prompt in the order it shows them."""
    if len(messages) != 2 or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("a RULER prompt is two messages (system, user) with text content")
    return [m.group(1) for m in _TRAJECTORY.finditer(messages[1]["content"])]


def group_key(messages: list[dict]) -> str:
    """A key equal for every ordering of one group: the system prompt and the trajectories' texts, whatever ids
    they are shown under (RULER's orderings keep each trajectory's id; a pair judged as [a, b] and again as [b, a],
    as `evals/judge_meta.py` does, numbers them anew, and is still one group)."""
    blocks = sorted(text for _, text in _TRAJECTORY.findall(messages[1]["content"]))
    context = messages[1]["content"].split("Trajectories:", 1)[0]
    blob = json.dumps([messages[0]["content"].split("Answer with JSON only")[0], context, blocks], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def from_cache(judgments: list[CachedJudgment]) -> tuple[list[TeacherExample], int]:
    """Teacher examples from exported cache entries (`ruler_rl.cache.export_judgments`), and how many entries were
    left out: a prompt that is not a RULER prompt of two or more shown trajectories, or scores that do not
    match its ids (a group judged as identical, a sub-group of a split group keeps its own ids)."""
    out, skipped = [], 0
    for j in judgments:
        if not isinstance(j, CachedJudgment):
            raise TypeError(f"expected CachedJudgment, got {type(j).__name__}")
        try:
            ids = shown_ids(j.messages)
        except ValueError:
            skipped += 1
            continue
        scores = {str(s.get("trajectory_id")): s.get("score") for s in j.scores if isinstance(s, dict)}
        if len(ids) < 2 or set(ids) != set(scores) or len(ids) != len(set(ids)) or not all(
                isinstance(v, (int, float)) and 0 <= v <= 1 for v in scores.values()):
            skipped += 1
            continue
        expl = {str(s.get("trajectory_id")): str(s.get("explanation", "")) for s in j.scores}
        out.append(TeacherExample(j.messages, ids, {k: float(v) for k, v in scores.items()}, expl,
                                  render_answer(ids, scores, expl), group_key(j.messages), source=f"cache:{j.model}"))
    return out, skipped


def from_labels(groups: list[LabelledGroup], rubric: str, *, orderings: int = 1, seed: int = 0) -> list[TeacherExample]:
    """Teacher examples from labelled groups: each group's RULER prompt (`rubric`, the compact rendering), in
    `orderings` balanced orders (`ruler_rl.judgment.permutation_orders`; more orderings, more examples of the
    same group), with the labels min-max scaled to [0, 1] as the teacher's scores."""
    from ruler_rl.judgment import permutation_orders

    if not isinstance(rubric, str) or not rubric.strip():
        raise ValueError("rubric must be non-empty text")
    if isinstance(orderings, bool) or not isinstance(orderings, int) or orderings < 1:
        raise ValueError(f"orderings must be an integer >= 1, got {orderings!r}")
    out = []
    for g in groups:
        if not isinstance(g, LabelledGroup):
            raise TypeError(f"expected LabelledGroup, got {type(g).__name__}")
        n = len(g.labels)
        lo, hi = min(g.labels), max(g.labels)
        ids = [str(i + 1) for i in range(n)]
        scores = {i: (x - lo) / (hi - lo) for i, x in zip(ids, g.labels, strict=True)}
        ranks = {i: 1 + sum(y > x for y in g.labels) for i, x in zip(ids, g.labels, strict=True)}
        expl = {i: f"ranked {ranks[i]} of {n}" for i in ids}
        key = None
        for order in permutation_orders(n, orderings, seed):
            prompt = build_prompt(g.message_lists, rubric, tools=g.tools, order=order)
            if prompt.identical:
                raise ValueError(f"group {g.id}: every conversation is identical, yet the labels differ")
            key = key or group_key(prompt.messages)
            out.append(TeacherExample(prompt.messages, prompt.ids, scores, expl, render_answer(ids, scores, expl),
                                      key, source=f"labels:{g.id}"))
    return out


def split_by_group(examples: list[TeacherExample], holdout: float = 0.2, *, seed: int = 0,
                   ) -> tuple[list[TeacherExample], list[TeacherExample]]:
    """(train, held out): a seeded `holdout` share of the groups (at least one, at most all but one) and all
    their examples held out. Needs examples of at least two groups."""
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise ValueError(f"holdout must be a fraction between 0 and 1 (exclusive), got {holdout!r}")
    keys = sorted({e.group for e in examples})
    if len(keys) < 2:
        raise ValueError(f"a held-out split needs examples of at least 2 groups; got {len(keys)}")
    held = set(random.Random(seed).sample(keys, min(len(keys) - 1, max(1, round(holdout * len(keys))))))
    return [e for e in examples if e.group not in held], [e for e in examples if e.group in held]


def cap_by_group(examples: list[TeacherExample], max_prompts: int, *, seed: int = 0) -> list[TeacherExample]:
    """At most `max_prompts` of `examples`, whole groups in a seeded order (each group with all its prompts, its
    orderings included), in their original order: a group that would pass the cap is skipped, a later smaller one
    may still fit; when no group fits, the smallest one (the cap then exceeded). Not the first `max_prompts`: a cache lists its judgments oldest first, and a judge run judges
    every pair's first ordering before the second, so a prefix is one ordering only (on 2026-12-08 the first 200
    of 485 held-out prompts were all shown in the order 1, 2: the first-shown baseline 0.68 there, 0.57 over all)."""
    if isinstance(max_prompts, bool) or not isinstance(max_prompts, int) or max_prompts < 1:
        raise ValueError(f"max_prompts must be an integer >= 1, got {max_prompts!r}")
    if len(examples) <= max_prompts:
        return list(examples)
    sizes: dict = {}
    for e in examples:
        sizes[e.group] = sizes.get(e.group, 0) + 1
    keys = sorted(sizes)
    random.Random(seed).shuffle(keys)
    kept, total = set(), 0
    for key in keys:
        if total + sizes[key] <= max_prompts:
            kept.add(key)
            total += sizes[key]
    if not kept:  # every group is larger than the cap: the smallest one, whole, rather than nothing to measure
        kept.add(min(keys, key=lambda k: sizes[k]))
    return [e for e in examples if e.group in kept]


@dataclass
class Agreement:
    """A judge's agreement with the teacher on held-out prompts. `pairwise_accuracy`: over the pairs of
    trajectories the teacher scores differently, the share the judge orders the same way; `ties`: the share
    of those pairs the judge scores equal (counted as wrong); `kendall_tau`: Kendall's tau-b between the
    judge's and the teacher's scores per prompt, averaged (a prompt where either side scores all alike
    counts 0); `errors`: prompts the judge gave no valid answer to (left out of the figures)."""

    judge: str
    prompts: int
    pairs: int
    pairwise_accuracy: float
    ties: float
    kendall_tau: float
    errors: int
    scores: list[dict[str, float] | None] = field(default_factory=list, repr=False)

    def row(self) -> dict:
        return {"judge": self.judge, "prompts": self.prompts, "pairs": self.pairs,
                "pairwise_accuracy": self.pairwise_accuracy, "ties": self.ties, "kendall_tau": self.kendall_tau,
                "errors": self.errors}


def agreement_figures(judge: str, teacher: list[dict[str, float]],
                      student: list[dict[str, float] | None]) -> Agreement:
    """`Agreement` of `student` scores (None: no valid answer) with `teacher` scores, prompt by prompt."""
    from ruler_rl.judges.extras import require

    require("eval", "Kendall's tau in ruler distill's agreement figures (scipy)")
    from scipy.stats import kendalltau

    if len(teacher) != len(student):
        raise ValueError(f"{len(teacher)} teacher answers for {len(student)} student answers")
    right = tied = pairs = errors = 0
    taus = []
    for t, s in zip(teacher, student, strict=True):
        if s is None:
            errors += 1
            continue
        if set(s) != set(t):
            raise ValueError(f"student ids {sorted(s)} differ from the teacher's {sorted(t)}")
        ids = sorted(t, key=int)
        c, ti, n = pair_counts(s, t)
        right, tied, pairs = right + c, tied + ti, pairs + n
        tau = kendalltau([s[i] for i in ids], [t[i] for i in ids]).statistic
        taus.append(0.0 if math.isnan(tau) else float(tau))
    nan = float("nan")
    return Agreement(judge, len(teacher), pairs, right / pairs if pairs else nan, tied / pairs if pairs else nan,
                     sum(taus) / len(taus) if taus else nan, errors, list(student))


async def agreement(judge: str, examples: list[TeacherExample], *, params: dict | None = None, cache=None,
                    concurrency: int = 1, max_format_retries: int = 1) -> Agreement:
    """Ask `judge` (any litellm model string; `local/<folder>` for a distilled judge) each example's prompt
    as RULER asks it (`judge_once`: cache, constrained JSON, validation by id) and compare its scores with the
    teacher's (`agreement_figures`). A prompt the judge gives no valid answer to counts in `errors`."""
    from ruler_rl.judgment import judge_once
    from ruler_rl.options import RulerOptions
    from ruler_rl.providers import Judge

    if not examples:
        raise ValueError("no held-out examples to measure agreement on")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    opts = RulerOptions.build(judge, params, cache=cache, max_format_retries=max_format_retries)
    j = Judge.of(judge, dict(params or {}))
    sem = asyncio.Semaphore(concurrency)

    async def one(ex: TeacherExample) -> dict[str, float] | None:
        async with sem:
            try:
                result = await judge_once(ex.prompt(), j, opts)
            except JudgeError:
                return None
            return {s.trajectory_id: s.score for s in result.scores}

    student = await asyncio.gather(*(one(e) for e in examples))
    return agreement_figures(judge, [e.scores for e in examples], list(student))


def paired_agreement(examples: list[TeacherExample], before: Agreement, after: Agreement, *,
                     resamples: int = 4000, seed: int = 0) -> dict:
    """How much `after` (the distilled judge) agrees with the teacher beyond `before` (the untrained one) on the
    same held-out `examples`, over the pairs the teacher orders, with 95% paired-bootstrap intervals that resample
    *groups* (every ordering of one group moves together: they are not independent):

    - `before`, `after`, `difference` (`low`, `high`): pairwise accuracy with a tie, and a prompt without a valid
      answer, counted wrong (as `Agreement.pairwise_accuracy` counts ties);
    - the same with a tie worth one half (`*_half`): a student that merely stops tying gains up to 0.5 under the
      first rule, so read both;
    - `first_shown`: the agreement of a judge that always prefers the trajectory shown first (the position bias
      LLM judges have), a baseline that needs no training;
    - `excludes_zero`: whether the first interval lies above 0.

    NaN figures (and `groups` 0) when the teacher orders no pair in `examples`."""
    import numpy as np

    if not examples:
        raise ValueError("no held-out examples to compare on")
    for name, a in (("before", before), ("after", after)):
        if not isinstance(a, Agreement) or len(a.scores) != len(examples):
            raise ValueError(f"{name} must be the Agreement measured on these {len(examples)} examples")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an integer >= 1, got {resamples!r}")
    totals: dict[str, list[float]] = {}  # group -> right before, after; half-credit before, after; first; pairs
    for ex, b, a in zip(examples, before.scores, after.scores, strict=True):
        row = totals.setdefault(ex.group, [0.0] * 6)
        for i, student in ((0, b), (1, a)):
            if student is not None:
                right, ties, _ = pair_counts(student, ex.scores)
                row[i] += right
                row[i + 2] += right + ties / 2
        shown = {tid: -rank for rank, tid in enumerate(ex.ids)}  # earlier shown, higher "score"
        row[4] += pair_counts(shown, ex.scores)[0]
        row[5] += pair_counts(ex.scores, ex.scores)[2]
    table = np.array([v for v in totals.values() if v[5]], float)
    nan = float("nan")
    if not len(table):
        return {"groups": 0, "pairs": 0, **{k: nan for k in ("before", "after", "difference", "low", "high",
                                                              "before_half", "after_half", "difference_half",
                                                              "low_half", "high_half", "first_shown")},
                "excludes_zero": False}
    picks = table[np.random.default_rng(seed).integers(0, len(table), size=(resamples, len(table)))].sum(axis=1)
    boot = (picks[:, 1] - picks[:, 0]) / picks[:, 5]
    boot_half = (picks[:, 3] - picks[:, 2]) / picks[:, 5]
    right_before, right_after, half_before, half_after, first, pairs = table.sum(axis=0)
    low = float(np.quantile(boot, 0.025))
    return {"groups": len(table), "pairs": int(pairs), "before": right_before / pairs, "after": right_after / pairs,
            "difference": (right_after - right_before) / pairs, "low": low, "high": float(np.quantile(boot, 0.975)),
            "before_half": half_before / pairs, "after_half": half_after / pairs,
            "difference_half": (half_after - half_before) / pairs, "low_half": float(np.quantile(boot_half, 0.025)),
            "high_half": float(np.quantile(boot_half, 0.975)), "first_shown": first / pairs,
            "excludes_zero": low > 0}


# ---- GRPO with an agreement-with-teacher reward (`ruler distill --method grpo`) ----

TIE_TOLERANCE = 1e-9


def scores_tie(a: float, b: float) -> bool:
    """Whether two scores count as equal (closer than `TIE_TOLERANCE`): the one tie rule of the teacher's and
    the student's scores in `pair_counts`, `pair_agreement`, `teacher_orders_a_pair` and `agreement_figures`."""
    return abs(a - b) < TIE_TOLERANCE


def pair_counts(student: dict[str, float], teacher: dict[str, float]) -> tuple[int, int, int]:
    """(concordant, ties, pairs): over the pairs of ids the teacher scores differently (`scores_tie`), how many
    the student orders the same way, how many it scores alike, and how many there are. Raises ValueError when
    the two name different ids."""
    if not isinstance(student, dict) or not isinstance(teacher, dict):
        raise TypeError("student and teacher must be dicts of scores by trajectory id")
    if set(student) != set(teacher):
        raise ValueError(f"the student scores ids {sorted(student)}, the teacher {sorted(teacher)}")
    ids = sorted(teacher)
    concordant = ties = pairs = 0
    for a in range(len(ids)):
        for b in range(a + 1, len(ids)):
            ta, tb = teacher[ids[a]], teacher[ids[b]]
            if scores_tie(ta, tb):
                continue
            pairs += 1
            sa, sb = student[ids[a]], student[ids[b]]
            if scores_tie(sa, sb):
                ties += 1
            elif (sa > sb) == (ta > tb):
                concordant += 1
    return concordant, ties, pairs


def pair_agreement(student: dict[str, float], teacher: dict[str, float]) -> float:
    """Over the pairs of trajectories the teacher scores differently, the share the student orders the same
    way, a student tie counting one half: (concordant + ties / 2) / pairs (`pair_counts`), which is
    (1 + tau) / 2 for tau = (concordant - discordant) / pairs. 1: the teacher's order; 0: its reverse; 0.5: all
    scored alike. Raises ValueError when the two name different ids or the teacher orders no pair."""
    concordant, ties, pairs = pair_counts(student, teacher)
    if not pairs:
        raise ValueError("the teacher scores every trajectory alike: no pair to agree on")
    return (concordant + ties / 2) / pairs


def teacher_orders_a_pair(example: TeacherExample) -> bool:
    """Whether the teacher scores at least two of the example's trajectories differently (by `scores_tie`, the
    rule `pair_agreement` counts pairs by; else no reward)."""
    if not isinstance(example, TeacherExample):
        raise TypeError(f"expected a TeacherExample, got {type(example).__name__}")
    return pair_counts(example.scores, example.scores)[2] > 0


def answer_token_bound(ids: list[str], max_explanation_chars: int = LOCAL_EXPLANATION_CHARS) -> int:
    """A generous bound on the tokens of a RULER answer for `ids` under the answer schema
    (`ruler_rl.prompt.response_schema`): per id, two tokens per explanation character (a non-ASCII character
    can take several byte tokens), 24 for the score's digits (the schema bounds its value, not its digits) and
    64 for the entry's JSON (keys, quotes, the id, separators, whitespace), plus 16 for the wrapper. The
    default `max_tokens` of `train_grpo`, so that a cut answer means a model rambling, not a bound too tight."""
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"ids must be a non-empty list of trajectory id strings, got {ids!r}")
    if isinstance(max_explanation_chars, bool) or not isinstance(max_explanation_chars, int) or max_explanation_chars < 1:
        raise ValueError(f"max_explanation_chars must be an integer >= 1, got {max_explanation_chars!r}")
    return 16 + len(ids) * (2 * max_explanation_chars + 24 + 64)


def agreement_reward(answer: str | None, example: TeacherExample, *, valid_bonus: float = 0.0) -> float:
    """The GRPO reward of a student's `answer` to `example`'s RULER prompt, in [0, 1]: 0 when RULER's own
    parser (`ruler_rl.parse.parse_scores`: lenient extraction, strict validation by id) finds no valid score
    for every shown id (no answer, not JSON, a missing or extra id, a score outside [0, 1] on every scale);
    else `valid_bonus + (1 - valid_bonus) * pair_agreement(student, teacher)`: with the default bonus 0, 1 for
    the teacher's order, 0 for its reverse, 0.5 when every score is equal. `valid_bonus` (0 <= b < 1) rewards
    a valid answer above an invalid one even when it ranks backwards (for a student that rarely writes valid
    JSON; unneeded under constrained decoding)."""
    if not isinstance(example, TeacherExample):
        raise TypeError(f"expected a TeacherExample, got {type(example).__name__}")
    if isinstance(valid_bonus, bool) or not isinstance(valid_bonus, (int, float)) or not 0 <= valid_bonus < 1:
        raise ValueError(f"valid_bonus must be a number in [0, 1), got {valid_bonus!r}")
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"answer must be text or None, got {type(answer).__name__}")
    if not teacher_orders_a_pair(example):
        raise ValueError(f"the teacher ({example.source or 'example'}) scores every trajectory alike: no reward")
    student = answer_scores(answer, example.ids)
    if student is None:
        return 0.0
    return valid_bonus + (1 - valid_bonus) * pair_agreement(student, example.scores)


def answer_scores(answer: str | None, ids: list[str]) -> dict[str, float] | None:
    """The scores by id of a judge's `answer` to a prompt showing `ids`, read by RULER's own parser
    (`ruler_rl.parse.parse_scores`), or None when it finds no valid score for every id."""
    from ruler_rl.parse import ScoreProblems, parse_scores

    if not answer:
        return None
    try:
        parsed = parse_scores(answer, ids)
    except ScoreProblems:
        return None
    return {s.trajectory_id: s.score for s in parsed.scores}


async def train_grpo(model, examples: list[TeacherExample], config, *, steps: int, group_size: int = 4,
                     batch_size: int = 4, max_answer_tokens: int | None = None, temperature: float = 1.0,
                     valid_bonus: float = 0.0, constrained: bool = True, seed: int = 0, on_step=None,
                     stop=None) -> list[dict]:
    """`steps` GRPO steps of a registered `ruler_rl.trainer.TrainableModel` on `examples`' RULER prompts: each step takes
    `batch_size` prompts (a seeded order, reshuffled after each pass), samples `group_size` answers to each
    from the model's own server (`temperature`; `constrained`: under RULER's exact answer schema for these ids,
    `ruler_rl.prompt.response_schema`, as the `local/` judge answers), rewards each with `agreement_reward`,
    and trains on the groups with `model.train(groups, config)` (a `TrainConfig`). `max_answer_tokens`: the
    most tokens of one answer (default `answer_token_bound` of the shown ids). Prompts whose teacher scores all
    alike are left out (no reward).

    Constrained sampling and the loss: the answers are sampled under the schema's grammar (constrained
    decoding: the server masks the tokens the grammar forbids and renormalises), but `model.train` scores them
    with the unconstrained policy's log-probabilities, as it scores any sampled tokens. The PPO ratio stays
    consistent (the sampling log-probabilities the server returns and the trainer's are of the same
    unconstrained policy), but the gradient's target is log pi(token), not the constrained
    log q(token) = log pi(token) - log Z (Z: the policy's mass on the tokens the grammar allows), so the tokens
    the grammar forces (keys, quotes, ids) still get gradient. This is how GRPO is done here, not a claim that
    it is the constrained policy's exact gradient.

    Returns one row per step: the run-log row of `model.train` plus `group_rewards` (each group's rewards, in
    sampled order), `valid_share` (answers RULER's parser accepted), `answers_cut` (answers the server stopped
    at `max_answer_tokens`, finish reason "length": rewarded 0 as invalid, counted apart from the invalid ones,
    which `invalid_answers` counts without them), `prompts_refused` (answered by the server with a 400 Bad
    Request, e.g. a prompt longer than its `max_seq_length` or a schema it cannot honour: logged with the
    error's class and message, left out of the step) and `prompts_left_out`; `on_step(row)` (a callable, or
    None) is called with each. `stop` (a callable taking nothing, or None) is asked after each step: True ends
    the training there, before `steps` (a time budget's end). `seed` (an integer) seeds the prompt order and
    the server's sampling."""
    import openai

    from ruler_rl.prompt import response_schema
    from ruler_rl.providers import LOCAL_EXPLANATION_CHARS
    from ruler_rl.trainer.config import TrainConfig
    from ruler_rl.trajectory import Trajectory, TrajectoryGroup

    if not callable(getattr(model, "train", None)) or not callable(getattr(model, "openai_client", None)):
        raise TypeError(f"model must be a registered ruler_rl.trainer.TrainableModel, got {type(model).__name__}")
    if not isinstance(config, TrainConfig):
        raise TypeError("config must be a ruler_rl.trainer.TrainConfig")
    for name, value, low in (("steps", steps, 1), ("group_size", group_size, 2), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if max_answer_tokens is not None and (isinstance(max_answer_tokens, bool) or not isinstance(max_answer_tokens, int)
                                          or max_answer_tokens < 1):
        raise ValueError(f"max_answer_tokens must be an integer >= 1 or None, got {max_answer_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature <= 5:
        raise ValueError(f"temperature must be in (0, 5] (GRPO needs varied answers), got {temperature!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    if not isinstance(constrained, bool):
        raise TypeError(f"constrained must be True or False, got {constrained!r}")
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be a callable taking each step's row, or None; got {on_step!r}")
    if stop is not None and not callable(stop):
        raise TypeError(f"stop must be a callable taking nothing (True: end the training), or None; got {stop!r}")
    if not isinstance(examples, list) or not all(isinstance(e, TeacherExample) for e in examples):
        raise TypeError("examples must be a list of TeacherExample")
    usable = [e for e in examples if teacher_orders_a_pair(e)]
    if not usable:
        raise ValueError(f"none of the {len(examples)} training prompts has a teacher who orders two trajectories")
    agreement_reward("", usable[0], valid_bonus=valid_bonus)  # the bonus checked before any sampling
    client = model.openai_client()
    rng = random.Random(seed)
    order: list[int] = []
    history = []
    start = await model.get_step()

    async def group(step: int, k: int, ex: TeacherExample):
        fmt = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "ruler_scores", "schema": response_schema(ex.ids, max_explanation_chars=LOCAL_EXPLANATION_CHARS)}}
        } if constrained else {}
        try:
            reply = await client.chat.completions.create(
                model=model.get_inference_name(), messages=ex.messages, n=group_size, temperature=temperature,
                max_tokens=max_answer_tokens or answer_token_bound(ex.ids), seed=seed * 1_000_003 + step * 1000 + k,
                **fmt)
        except openai.BadRequestError as exc:  # the server refused this prompt (why: its message)
            log.warning("step %d: the student's server refused a prompt (%s: %s); left out of the step",
                        step, type(exc).__name__, exc.message)
            return None
        rewards = [agreement_reward(c.message.content, ex, valid_bonus=valid_bonus) for c in reply.choices]
        valid = [answer_scores(c.message.content, ex.ids) is not None for c in reply.choices]
        cut = [c.finish_reason == "length" for c in reply.choices]
        return TrajectoryGroup([Trajectory(messages_and_choices=[*ex.messages, c], reward=r)
                                for c, r in zip(reply.choices, rewards, strict=True)]), rewards, valid, cut

    for step in range(start + 1, start + steps + 1):
        batch = []
        while len(batch) < min(batch_size, len(usable)):
            if not order:
                order = rng.sample(range(len(usable)), len(usable))
            batch.append(usable[order.pop()])
        sampled = await asyncio.gather(*(group(step, k, ex) for k, ex in enumerate(batch)))
        found = [f for f in sampled if f is not None]
        row = await model.train([g for g, _, _, _ in found], config)
        row = {**row, **step_answer_stats([r for _, r, _, _ in found], [v for _, _, v, _ in found],
                                          [c for _, _, _, c in found]),
               "prompts_refused": len(sampled) - len(found), "prompts_left_out": len(examples) - len(usable)}
        if row["answers_cut"]:
            log.warning("step %d: %d of %d answers were cut at max_tokens (finish reason \"length\"), rewarded 0",
                        step, row["answers_cut"], sum(len(r) for r in row["group_rewards"]))
        history.append(row)
        if on_step is not None:
            on_step(row)
        if stop is not None and stop():
            log.info("GRPO stopped after step %d of %d (stop() said so)", step, start + steps)
            break
    return history


def step_answer_stats(rewards: list[list[float]], valid: list[list[bool]], cut: list[list[bool]]) -> dict:
    """A GRPO step's answer figures from its groups' rewards, validity (RULER's parser accepted the answer)
    and cut flags (finish reason "length"): `group_rewards`, `valid_share` (NaN without answers),
    `answers_cut` and `invalid_answers` (invalid and not cut: a cut answer is counted only as cut)."""
    if not (len(rewards) == len(valid) == len(cut)) or any(
            not (len(r) == len(v) == len(c)) for r, v, c in zip(rewards, valid, cut, strict=True)):
        raise ValueError("rewards, valid and cut must be lists of per-group lists of the same lengths")
    flat_valid = [x for v in valid for x in v]
    flat_cut = [x for c in cut for x in c]
    return {"group_rewards": [list(r) for r in rewards],
            "valid_share": sum(flat_valid) / len(flat_valid) if flat_valid else math.nan,
            "answers_cut": sum(flat_cut),
            "invalid_answers": sum(not v and not c for v, c in zip(flat_valid, flat_cut, strict=True))}
