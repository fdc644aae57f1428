"""One scored group as rows: the same id, score, advantage and explanation for the CLI table, its JSON
and the service's answer."""

from __future__ import annotations

from pydantic import BaseModel

from ruler.advantages import group_advantages
from ruler.trajectory import TrajectoryGroup

EXPLANATION_KEY = "ruler_explanation"
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
            for i, (t, a) in enumerate(zip(group.trajectories, advantages), 1)]
