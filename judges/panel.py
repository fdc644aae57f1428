"""Judge panels: several judge models score the same group; their scores are aggregated.

    JudgePanel(["openai/o4-mini", "anthropic/claude-sonnet-4-5", "local/smollm2-135m-instruct"],
               aggregate="borda", quorum=2)

Aggregations (per trajectory, over the judges that answered):
    mean    the average score
    median  the median score (robust to one odd judge)
    borda   rank-based: each judge gives a trajectory one point per trajectory it scored lower (ties
            half a point); points are summed and divided by (n - 1) * judges, so the result is in [0, 1]
Disagreement: the mean over trajectories of the standard deviation of the judges' scores.
A judge that fails does not sink the group unless fewer than `quorum` judges answer.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Literal

from ruler_rl.judges.errors import JudgeConfigError

Aggregate = Literal["mean", "median", "borda"]


@dataclass
class JudgePanel:
    models: list[str]
    aggregate: Aggregate = "mean"
    quorum: int | None = None  # default: a majority of the panel
    params: dict[str, dict] = field(default_factory=dict)  # per-model extra litellm params

    def __post_init__(self):
        if isinstance(self.models, str) or not self.models:
            raise JudgeConfigError("a judge panel needs a non-empty list of judge models")
        if any(not isinstance(m, str) or not m.strip() for m in self.models):
            raise JudgeConfigError("every panel member must be a litellm model string")
        if len(set(self.models)) != len(self.models):
            raise JudgeConfigError("panel members must be distinct")
        if self.aggregate not in ("mean", "median", "borda"):
            raise JudgeConfigError(f"aggregate must be mean, median or borda, got {self.aggregate!r}")
        if self.quorum is None:
            self.quorum = math.ceil(len(self.models) / 2)
        if not 1 <= self.quorum <= len(self.models):
            raise JudgeConfigError(f"quorum must be between 1 and {len(self.models)}, got {self.quorum}")


def borda(per_judge: list[list[float]]) -> list[float]:
    """Rank-based aggregate in [0, 1] of several judges' score lists (same trajectories, same order)."""
    n = len(per_judge[0])
    if n == 1:
        return [statistics.fmean(s[0] for s in per_judge)]
    points = [0.0] * n
    for scores in per_judge:
        for i in range(n):
            points[i] += sum(1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
                             for j in range(n) if j != i)
    return [p / ((n - 1) * len(per_judge)) for p in points]


def aggregate_scores(per_judge: list[list[float]], how: Aggregate) -> tuple[list[float], float]:
    """Aggregated scores per trajectory and the panel's disagreement (mean per-trajectory std)."""
    if not per_judge:
        raise JudgeConfigError("no judge scores to aggregate")
    n = len(per_judge[0])
    if any(len(s) != n for s in per_judge):
        raise ValueError("every judge must score the same trajectories")
    columns = [[s[i] for s in per_judge] for i in range(n)]
    if how == "mean":
        agg = [statistics.fmean(c) for c in columns]
    elif how == "median":
        agg = [statistics.median(c) for c in columns]
    else:
        agg = borda(per_judge)
    disagreement = statistics.fmean(statistics.pstdev(c) for c in columns) if n else 0.0
    return agg, disagreement
