"""What a RULER call gives back: `RulerResult` (the scores and what it took to get them) and, for a scored
group, its rows: the same id, score, advantage and explanation for the CLI table, its JSON and the service's
answer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pydantic import BaseModel

from ruler_rl.advantages import group_advantages
from ruler_rl.parse import TrajectoryScore
from ruler_rl.trajectory import TrajectoryGroup


@dataclass
class RulerResult:
    """Scores, ids "1".."N" in input order, plus what it took to get them."""

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

    @classmethod
    def combine(cls, results: list[RulerResult], scores: list[TrajectoryScore], spread: list[float],
                notes: list[str]) -> RulerResult:
        """One result for `scores` made of several judgments: their usage summed, their notes after `notes`
        (each once), cached only if every one was."""
        notes = list(notes)
        for r in results:
            notes += [x for x in r.notes if x not in notes]
        return cls(scores=scores, prompt_tokens=sum(r.prompt_tokens for r in results),
                   completion_tokens=sum(r.completion_tokens for r in results), cost=sum(r.cost for r in results),
                   calls=sum(r.calls for r in results), cached=all(r.cached for r in results), spread=spread,
                   notes=notes)

EXPLANATION_KEY = "ruler_explanation"
NOTES_KEY = "ruler_notes"
"""The metadata key under which `ruler_score_group` stores the judge's explanation of each trajectory."""


class ScoreRow(BaseModel):
    """One trajectory of a scored group: its 1-based id in the group, score, advantage, explanation."""

    trajectory_id: str
    score: float
    advantage: float
    explanation: str


def score_rows(group: TrajectoryGroup) -> list[ScoreRow]:
    """The rows of a group that `ruler_score_group` returned, in the group's order.

    The advantage is the score's standard score within the group (`group_advantages`); the explanation is
    the one the judge gave this time (the metadata field, so a re-scored group shows its latest one).
    """
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"score_rows takes a TrajectoryGroup, got {type(group).__name__}")
    rewards = [t.reward for t in group.trajectories]
    advantages = group_advantages(rewards) if rewards else []
    return [ScoreRow(trajectory_id=str(i), score=t.reward, advantage=a,
                     explanation=str(t.metadata.get(EXPLANATION_KEY, "")))
            for i, (t, a) in enumerate(zip(group.trajectories, advantages, strict=True), 1)]


def score_notes(group: TrajectoryGroup) -> list[str]:
    """What was done to judge a group that `ruler_score_group` returned (cuts, splits, retries, a panel's
    failures, a single trajectory...), in order; empty when nothing was worth noting."""
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(f"score_notes takes a TrajectoryGroup, got {type(group).__name__}")
    stored = group.metadata.get(NOTES_KEY)
    if not stored:
        return []
    try:
        notes = json.loads(str(stored))
    except json.JSONDecodeError:
        raise ValueError(f"the group's metadata[{NOTES_KEY!r}] is not the JSON list ruler_score_group writes") from None
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError(f"the group's metadata[{NOTES_KEY!r}] is not a JSON list of strings")
    return notes
