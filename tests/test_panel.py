"""Judge panels: aggregation, disagreement, quorum."""

import pytest

from ruler_rl import JudgePanel, RetryPolicy, Trajectory, TrajectoryGroup, ruler_score_group
from ruler_rl.errors import JudgeConfigError, JudgeUnavailableError
from ruler_rl.judges.panel import aggregate_scores, borda
from tests.helpers import convo

ONCE = RetryPolicy(attempts=1, timeout=3)


def group():
    return TrajectoryGroup([Trajectory(messages_and_choices=convo(a)) for a in ("GOOD a", "BAD b", "OK c")])


def test_aggregations():
    per_judge = [[0.9, 0.1, 0.5], [0.8, 0.3, 0.2], [0.1, 0.9, 0.5]]
    mean, d = aggregate_scores(per_judge, "mean")
    assert mean == pytest.approx([0.6, 1.3 / 3, 0.4]) and d > 0.2
    assert aggregate_scores(per_judge, "median")[0] == [0.8, 0.3, 0.5]
    assert borda([[0.9, 0.1, 0.5]]) == [1.0, 0.0, 0.5]
    assert borda([[0.5, 0.5]]) == [0.5, 0.5]
    assert aggregate_scores([[0.2, 0.4], [0.2, 0.4]], "mean")[1] == 0


@pytest.mark.parametrize("bad", [dict(models=[]), dict(models="openai/x"), dict(models=["a", "a"]),
                                 dict(models=["a", "b"], quorum=3), dict(models=["a"], aggregate="max")])
def test_bad_panels_are_refused(bad):
    with pytest.raises(JudgeConfigError):
        JudgePanel(**bad)


async def test_panel_aggregates_and_reports_disagreement(judge):
    panel = JudgePanel(["openai/judge-a", "openai/judge-b", "openai/contrarian"], aggregate="median")
    scored = await ruler_score_group(group(), panel, judge.params, retry=ONCE)
    assert len(judge.requests) == 3
    assert [t.reward for t in scored] == [0.9, 0.1, 0.5]  # the median outvotes the contrarian
    assert scored.metadata["judge_disagreement"] > 0.2
    assert scored.trajectories[0].metrics["ruler_score[openai/contrarian]"] == pytest.approx(0.1)


async def test_one_failing_judge_does_not_sink_the_group(judge):
    panel = JudgePanel(["openai/judge-a", "openai/judge-b", "openai/dead"], quorum=2,
                       params={"openai/dead": {"api_base": "http://127.0.0.1:9/v1"}})
    scored = await ruler_score_group(group(), panel, judge.params, retry=ONCE)
    assert [t.reward for t in scored] == [0.9, 0.1, 0.5]
    assert any("judge openai/dead failed" in line for line in scored.trajectories[0].logs)


async def test_below_quorum_raises(judge):
    dead = {"api_base": "http://127.0.0.1:9/v1"}
    panel = JudgePanel(["openai/judge-a", "openai/dead-1", "openai/dead-2"], quorum=2,
                       params={"openai/dead-1": dead, "openai/dead-2": dead})
    with pytest.raises(JudgeUnavailableError, match="only 1 of 3 judges answered"):
        await ruler_score_group(group(), panel, judge.params, retry=ONCE)


async def test_list_of_models_is_a_mean_panel(judge):
    scored = await ruler_score_group(group(), ["openai/judge-a", "openai/contrarian"], judge.params, retry=ONCE)
    assert [round(t.reward, 6) for t in scored] == [0.5, 0.5, 0.5]
    assert scored.metadata["judge_model"] == "openai/judge-a,openai/contrarian"
