"""Distilling a cheap local judge from the judgments you paid for (`ruler distill`).

Teacher data is a list of `TeacherExample`s: a RULER prompt (the exact messages a judge is sent) and the
teacher's answer in RULER's JSON, `{"scores": [{"trajectory_id", "explanation", "score"}, ...]}`, ids in
order, written the way the local judge's constrained decoding writes it (`render_answer`). It comes from

- the judge cache (`from_cache`): every judgment a judge model made, selected by model and date
  (`ruler.cache.export_judgments`), its validated scores as the answer;
- labelled groups (`from_labels`): conversations and a label per conversation (higher is better), rendered as
  the RULER prompt with the given rubric, the labels min-max scaled to [0, 1] as the scores and "ranked k of
  n" as each explanation.

`split_by_group` keeps a seeded held-out share of *groups* (every ordering of one group, which the cache
holds once per ordering, stays on one side). The student is trained with `trainer.sft` (LoRA SFT on the
answer tokens) and measured with `agreement`: it is asked each held-out prompt through litellm as any
judge is (`ruler.judgment.judge_once`: cache, constrained JSON, validation by id), and its scores are
compared with the teacher's: pairwise accuracy over the pairs the teacher orders (a student tie counts as
wrong and is also reported as `ties`) and Kendall's tau per prompt, averaged.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
from dataclasses import dataclass, field

from judges.errors import JudgeError
from ruler.cache import CachedJudgment
from ruler.prompt import JudgePrompt, build_prompt
from ruler.providers import LOCAL_EXPLANATION_CHARS

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


def render_answer(ids: list[str], scores: dict[str, float], explanations: dict[str, str],
                  max_explanation_chars: int = LOCAL_EXPLANATION_CHARS) -> str:
    """The answer as the local judge writes it under its schema (`ruler.prompt.response_schema`): entries in
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
    """A key equal for every ordering of one group: the system prompt and the set of (id, trajectory) blocks."""
    blocks = sorted(_TRAJECTORY.findall(messages[1]["content"]))
    context = messages[1]["content"].split("Trajectories:", 1)[0]
    blob = json.dumps([messages[0]["content"].split("Answer with JSON only")[0], context, blocks], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def from_cache(judgments: list[CachedJudgment]) -> tuple[list[TeacherExample], int]:
    """Teacher examples from exported cache entries (`ruler.cache.export_judgments`), and how many entries were
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
    `orderings` balanced orders (`ruler.judgment.permutation_orders`; more orderings, more examples of the
    same group), with the labels min-max scaled to [0, 1] as the teacher's scores."""
    from ruler.judgment import permutation_orders

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
        scores = {i: (x - lo) / (hi - lo) for i, x in zip(ids, g.labels)}
        ranks = {i: 1 + sum(y > x for y in g.labels) for i, x in zip(ids, g.labels)}
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
    from judges.extras import require

    require("eval", "Kendall's tau in ruler distill's agreement figures (scipy)")
    from scipy.stats import kendalltau

    if len(teacher) != len(student):
        raise ValueError(f"{len(teacher)} teacher answers for {len(student)} student answers")
    right = tied = pairs = errors = 0
    taus = []
    for t, s in zip(teacher, student):
        if s is None:
            errors += 1
            continue
        if set(s) != set(t):
            raise ValueError(f"student ids {sorted(s)} differ from the teacher's {sorted(t)}")
        ids = sorted(t, key=int)
        for a in range(len(ids)):
            for b in range(a + 1, len(ids)):
                dt = t[ids[a]] - t[ids[b]]
                if abs(dt) < 1e-9:
                    continue
                pairs += 1
                ds = s[ids[a]] - s[ids[b]]
                if abs(ds) < 1e-9:
                    tied += 1
                elif (ds > 0) == (dt > 0):
                    right += 1
        tau = kendalltau([s[i] for i in ids], [t[i] for i in ids]).statistic
        taus.append(float(tau) if tau == tau else 0.0)
    nan = float("nan")
    return Agreement(judge, len(teacher), pairs, right / pairs if pairs else nan, tied / pairs if pairs else nan,
                     sum(taus) / len(taus) if taus else nan, errors, list(student))


async def agreement(judge: str, examples: list[TeacherExample], *, params: dict | None = None, cache=None,
                    concurrency: int = 1, max_format_retries: int = 1) -> Agreement:
    """Ask `judge` (any litellm model string; `local/<folder>` for a distilled judge) each example's prompt
    as RULER asks it (`judge_once`: cache, constrained JSON, validation by id) and compare its scores with the
    teacher's (`agreement_figures`). A prompt the judge gives no valid answer to counts in `errors`."""
    from ruler.judgment import judge_once
    from ruler.options import RulerOptions
    from ruler.providers import Judge

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
