"""A judge panel scores a group: every member judges it (concurrently, each within its own context budget)
and the scores of those that answered are aggregated (`ruler_rl.judges.panel`), if at least a quorum did."""

from __future__ import annotations

import asyncio
import statistics

from ruler_rl.budget import score_within_budget
from ruler_rl.judges.errors import JudgeUnavailableError
from ruler_rl.judges.panel import JudgePanel, aggregate_scores
from ruler_rl.options import RulerOptions
from ruler_rl.parse import TrajectoryScore
from ruler_rl.providers import Judge
from ruler_rl.results import RulerResult


async def score_panel(message_lists: list[list[dict]], panel: JudgePanel, opts: RulerOptions) -> RulerResult:
    """The panel's aggregated scores, with each judge's own (`per_judge`) and their disagreement.

    A member that fails is noted; fewer than `panel.quorum` answers raise `JudgeUnavailableError`."""
    async def member(model: str) -> RulerResult:
        judge = Judge.of(model, {**opts.extra_litellm_params, **panel.params.get(model, {})})
        return await score_within_budget(message_lists, judge, opts)

    outcomes = await asyncio.gather(*(member(m) for m in panel.models), return_exceptions=True)
    answered = [(m, r) for m, r in zip(panel.models, outcomes, strict=True) if isinstance(r, RulerResult)]
    failed = [(m, r) for m, r in zip(panel.models, outcomes, strict=True) if not isinstance(r, RulerResult)]
    for _, exc in failed:
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
    notes = [(f"panel of {len(panel.models)} ({panel.aggregate}): {len(answered)} answered, "
              f"disagreement {disagreement:.3f}")] + [f"judge {m} failed: {type(e).__name__}: {e}" for m, e in failed]
    result = RulerResult.combine([r for _, r in answered], scores,
                                 [statistics.pstdev([p[i] for p in per_judge]) for i in range(n)], notes)
    result.disagreement = disagreement
    result.per_judge = {m: per_judge[k] for k, (m, _) in enumerate(answered)}
    return result
