"""RULER through real litellm against the scripted judge on loopback: calls, cache, faults."""

import pytest

from ruler_rl import RetryPolicy, Trajectory, TrajectoryGroup, ruler, ruler_score_group
from ruler_rl.errors import JudgeConfigError, JudgeOutputError, JudgeUnavailableError, TrajectoryError
from tests.helpers import SYSTEM, USER, convo

FAST = RetryPolicy(attempts=4, initial_wait=0.01, max_wait=0.05, timeout=5)
MODEL = "openai/fake-judge"


def group(*answers: str) -> TrajectoryGroup:
    return TrajectoryGroup([Trajectory(messages_and_choices=convo(a), reward=0.25) for a in answers])


async def score(judge, g, **kw):
    return await ruler_score_group(g, MODEL, judge.params, retry=kw.pop("retry", FAST), **kw)


async def test_one_call_per_group_prefix_sent_once_and_scores_by_marker(judge):
    g = group("GOOD: Tuesday 2pm", "BAD: no idea, Friday", "OK: Tuesday, probably")
    scored = await score(judge, g)
    assert len(judge.requests) == 1
    user = judge.requests[0]["messages"][-1]["content"]
    assert user.count(SYSTEM["content"]) == 1 and user.count(USER["content"]) == 1
    assert user.index("<context>") < user.index(SYSTEM["content"]) < user.index("</context>")
    assert [t.reward for t in scored.trajectories] == [0.9, 0.1, 0.5]
    assert scored.metadata["judge_calls"] == 1


async def test_cache_hit_makes_zero_calls_and_same_scores(judge):
    g = group("GOOD a", "BAD b")
    first = await score(judge, g)
    judge.reset()
    second = await score(judge, g)
    assert judge.requests == []
    assert [t.reward for t in second] == [t.reward for t in first]
    assert second.metadata["judge_cached"] is True and all(t.metrics["judge_cached"] for t in second)
    assert any("served from cache" in line for line in second.trajectories[0].logs)


async def test_cache_false_always_calls(judge):
    g = group("GOOD a", "BAD b")
    await score(judge, g, cache=False)
    await score(judge, g, cache=False)
    assert len(judge.requests) == 2


async def test_cache_key_changes_with_rubric_and_temperature(judge):
    g = group("GOOD a", "BAD b")
    await score(judge, g)
    await ruler_score_group(g, MODEL, {**judge.params, "temperature": 0.7}, retry=FAST)
    await ruler_score_group(g, MODEL, judge.params, "efficiency", retry=FAST)
    assert len(judge.requests) == 3


async def test_input_group_is_untouched_and_metrics_recorded(judge):
    g = group("GOOD a", "BAD b")
    before = g.model_dump_json()
    scored = await score(judge, g)
    assert g.model_dump_json() == before
    assert scored is not g and scored.trajectories[0] is not g.trajectories[0]
    t = scored.trajectories[0]
    assert t.metrics["independent_reward"] == 0.25 and t.metrics["ruler_score"] == 0.9
    assert t.metrics["judge_prompt_tokens"] == 50 and t.metrics["judge_completion_tokens"] == 10
    assert "judge_cost" in t.metrics
    assert any(line.startswith("RULER explanation: ") for line in t.logs)


@pytest.mark.parametrize("fault", ["500", "503", "429", "slow"])
async def test_transient_faults_are_retried(judge, fault):
    judge.script = [fault, fault]
    policy = RetryPolicy(attempts=4, initial_wait=0.01, max_wait=0.05, timeout=0.8 if fault == "slow" else 5)
    scored = await score(judge, group("GOOD a", "BAD b"), retry=policy)
    assert [t.reward for t in scored] == [0.9, 0.1]
    assert len(judge.requests) == 3


async def test_retry_after_is_honoured(judge):
    judge.retry_after = "1"
    try:
        judge.script = ["429"]
        await score(judge, group("GOOD a", "BAD b"))
        assert len(judge.times) == 2 and judge.times[1] - judge.times[0] >= 0.95
    finally:
        judge.retry_after = "0"


async def test_transient_faults_beyond_budget_raise_unavailable(judge):
    judge.script = ["500"] * 10
    with pytest.raises(JudgeUnavailableError, match="after 4 attempt"):
        await score(judge, group("GOOD a", "BAD b"))
    assert len(judge.requests) == 4


@pytest.mark.parametrize("fault", ["malformed", "prose", "empty", "missing_id", "extra_id", "duplicate_id",
                                   "string_scores", "nan", "negative"])
async def test_bad_answers_get_a_structural_retry_stating_the_problem(judge, fault):
    judge.script = [fault]
    scored = await score(judge, group("GOOD a", "BAD b", "OK c"))
    assert [t.reward for t in scored] == [0.9, 0.1, 0.5]
    assert len(judge.requests) == 2
    retry_text = judge.requests[1]["messages"][-1]["content"]
    assert "could not be used" in retry_text
    assert any("accepted after 1 structural retry" in line for line in scored.trajectories[0].logs)


@pytest.mark.parametrize("fault", ["fenced", "bare_list", "shuffled"])
async def test_lenient_parsing_and_id_matching_need_no_retry(judge, fault):
    judge.script = [fault]
    scored = await score(judge, group("GOOD a", "BAD b", "OK c"))
    assert [t.reward for t in scored] == [0.9, 0.1, 0.5]
    assert len(judge.requests) == 1


@pytest.mark.parametrize("fault,scale", [("out_of_range_10", "0-10"), ("out_of_range_100", "0-100")])
async def test_consistent_other_scale_is_rescaled_and_logged(judge, fault, scale):
    judge.script = [fault]
    scored = await score(judge, group("GOOD a", "BAD b"))
    assert [round(t.reward, 6) for t in scored] == [0.9, 0.1]
    assert any(scale in line for line in scored.trajectories[0].logs)


async def test_persistent_bad_output_raises_never_defaults(judge):
    judge.script = ["missing_id"] * 5
    with pytest.raises(JudgeOutputError) as info:
        await score(judge, group("GOOD a", "BAD b"), max_format_retries=2)
    assert "missing trajectory ids: 1" in str(info.value)
    assert len(judge.requests) == 3
    assert info.value.problems == ["missing trajectory ids: 1"]  # what was wrong with the last answer
    assert '"trajectory_id": "2"' in info.value.raw and '"trajectory_id": "1"' not in info.value.raw


async def test_an_answer_cut_at_the_token_limit_says_so_to_the_judge_and_in_the_error(judge):
    judge.script = ["cut_off"] * 3  # '{"scores": [' then newlines until max_tokens (vLLM 0.24's any-whitespace JSON)
    with pytest.raises(JudgeOutputError) as info:
        await score(judge, group("GOOD a", "BAD b"), max_format_retries=2)
    assert "cut off at its token limit (4096 tokens)" in str(info.value)
    assert "cut off at its token limit" in judge.requests[1]["messages"][-1]["content"]  # the retry tells the judge
    judge.reset()
    judge.script = ["malformed"] * 3  # ended by itself: not cut off
    with pytest.raises(JudgeOutputError) as info:
        await score(judge, group("GOOD a", "BAD b"), max_format_retries=2)
    assert "cut off" not in str(info.value)


async def test_swallow_exceptions_returns_none(judge):
    judge.script = ["malformed"] * 5
    assert await score(judge, group("GOOD a", "BAD b"), swallow_exceptions=True) is None


async def test_identical_trajectories_sent_once_same_score(judge):
    scored = await score(judge, group("GOOD same", "GOOD same", "GOOD same"))
    user = judge.requests[0]["messages"][-1]["content"]
    assert user.count("<trajectory id=") == 1
    assert [t.reward for t in scored] == [0.9, 0.9, 0.9]


async def test_permutations_average_by_id_and_report_spread(judge):
    g = group("GOOD a", "BAD b", "OK c", "BAD d")
    scored = await score(judge, g, num_permutations=3, seed=7)
    assert len(judge.requests) == 3
    orders = [[int(i) for i in __import__("re").findall(r'<trajectory id="(\d+)">', r["messages"][-1]["content"])]
              for r in judge.requests]
    assert [1, 2, 3, 4] in orders and len({tuple(o) for o in orders}) == 3  # sent concurrently: any order
    assert [t.reward for t in scored] == pytest.approx([0.9, 0.1, 0.5, 0.1])
    assert all(t.metrics["ruler_score_spread"] == 0 for t in scored)
    judge.reset()
    await score(judge, g, num_permutations=3, seed=7)
    assert judge.requests == []  # same seed, same orderings: all three from cache


async def test_balanced_orderings_cancel_a_judges_first_position_bias(judge):
    """Four equally good answers and a judge that adds 0.3 to whichever it sees first: k=4 orderings (each
    answer once in every position) give identical scores; k=3 (each first at most once) cut the spread to
    0.1, a third of the bias, where orderings that show one answer first twice would leave 0.2."""
    from ruler_rl.judgment import permutation_orders

    g = group("OK a", "OK b", "OK c", "OK d")
    judge.first_bonus = 0.3
    scored = await score(judge, g, num_permutations=4, seed=3)
    assert len({round(t.reward, 9) for t in scored}) == 1
    judge.reset()
    judge.first_bonus = 0.3
    scored = await score(judge, g, num_permutations=3, seed=3)
    rewards = [t.reward for t in scored]
    assert max(rewards) - min(rewards) == pytest.approx(0.1, abs=1e-6)
    for n in range(1, 7):
        for k in range(1, n + 1):
            orders = permutation_orders(n, k, seed=11)
            assert orders[0] == list(range(n)) and len({tuple(o) for o in orders}) == k
            firsts = [o[0] for o in orders]
            assert len(set(firsts)) == k  # nobody shown first twice
            if k == n:  # a Latin square: every item in every position once
                assert all(sorted(o[p] for o in orders) == list(range(n)) for p in range(n))
    assert permutation_orders(5, 9, seed=2) == permutation_orders(5, 9, seed=2)  # deterministic (cache-stable)
    assert len({tuple(o) for o in permutation_orders(4, 20, seed=2)}) == 20


async def test_tools_sent_once(judge):
    tools = [{"type": "function", "function": {"name": "search_inbox", "parameters": {"type": "object"}}}]
    g = TrajectoryGroup([Trajectory(messages_and_choices=convo(a), tools=tools) for a in ("GOOD", "BAD")])
    await score(judge, g)
    assert judge.requests[0]["messages"][-1]["content"].count('"search_inbox"') == 1


async def test_ruler_low_level_returns_trajectory_scores(judge):
    scores = await ruler([convo("BAD x"), convo("GOOD y")], MODEL, judge.params, retry=FAST)
    assert [(s.trajectory_id, s.score) for s in scores] == [("1", 0.1), ("2", 0.9)]


async def test_response_format_asks_for_exact_schema(judge):
    await score(judge, group("GOOD a", "BAD b"))
    fmt = judge.requests[0]["response_format"]
    items = fmt["json_schema"]["schema"]["properties"]["scores"]["prefixItems"]
    assert [i["properties"]["trajectory_id"]["const"] for i in items] == ["1", "2"]


async def test_an_empty_group_is_refused_before_any_judge_call(judge):
    with pytest.raises(TrajectoryError, match="a group needs at least one trajectory: this one is empty"):
        await score(judge, TrajectoryGroup([]))
    with pytest.raises(TrajectoryError, match="a group needs at least one trajectory"):
        await ruler([], MODEL, judge.params, retry=FAST)
    assert await ruler_score_group(TrajectoryGroup([]), MODEL, judge.params, swallow_exceptions=True) is None
    assert judge.requests == []


async def test_single_trajectory_is_scored_with_a_note(judge):
    with pytest.warns(UserWarning, match="group of one"):
        scored = await score(judge, group("GOOD alone"))
    assert scored.trajectories[0].reward == 0.9
    assert any("single trajectory" in line for line in scored.trajectories[0].logs)


async def test_unknown_judge_model_is_a_config_error(judge):
    with pytest.raises(JudgeConfigError, match="unknown judge model"):
        await ruler_score_group(group("a", "b"), "nonexistent-provider-xyz/model")
    with pytest.raises(JudgeConfigError, match="unknown local model"):
        await ruler_score_group(group("a", "b"), "local/no-such-model", retry=FAST)


@pytest.mark.parametrize("messages,match", [
    ([], "has no messages"),
    (["hello"], "expected a dict"),
    ([{"role": "robot", "content": "x"}], "unknown role 'robot'"),
    ([{"role": "user", "content": 5}], "content must be"),
    ([{"role": "assistant", "content": "only the agent speaks"}], "cannot tell the task"),
])
async def test_bad_trajectories_are_named(judge, messages, match):
    with pytest.raises((ValueError, TypeError), match=match):
        await ruler([messages, messages + [{"role": "assistant", "content": "x"}]] if messages else [messages, []],
                    MODEL, judge.params)
    assert judge.requests == []


async def test_group_without_system_prompt_is_judged_with_a_note(judge):
    g = TrajectoryGroup([Trajectory(messages_and_choices=[USER, {"role": "assistant", "content": a}])
                         for a in ("GOOD", "BAD")])
    scored = await score(judge, g)
    assert any("no system prompt" in line for line in scored.trajectories[0].logs)


async def test_huge_message_is_cut_in_the_middle_to_fit(judge):
    huge = "GOOD start " + "word " * 60_000 + " the end"
    scored = await score(judge, group(huge, "BAD"), max_prompt_tokens=8000)
    assert [t.reward for t in scored] == [0.9, 0.1]
    sent = judge.requests[0]["messages"][-1]["content"]
    assert "characters cut to fit the judge's context" in sent and "the end" in sent and len(sent) < 40_000
    assert any("cut to" in line for line in scored.trajectories[0].logs)


async def test_budget_too_small_for_one_trajectory_is_a_clear_error(judge):
    with pytest.raises(JudgeConfigError, match="cannot hold even one trajectory"):
        await score(judge, group(*(f"GOOD {i} " + "x" * 3000 for i in range(6))), max_prompt_tokens=400)
    assert judge.requests == []


async def test_additional_histories_are_judged_inside_their_trajectory(judge):
    a = Trajectory(messages_and_choices=convo("a"), additional_histories=[{"messages_and_choices": convo("GOOD b")}])
    b = Trajectory(messages_and_choices=convo("a"), additional_histories=[{"messages_and_choices": convo("c")}])
    scored = await ruler_score_group(TrajectoryGroup([a, b]), MODEL, judge.params)
    assert [t.metrics["ruler_score"] for t in scored.trajectories] == [pytest.approx(0.9), pytest.approx(0.3)]
    bad = Trajectory(messages_and_choices=convo("a"), additional_histories=[{"messages_and_choices": [
        {"role": "narrator", "content": "x"}]}])
    with pytest.raises(ValueError, match="history 1, message 1: unknown role"):  # still checked by validation
        await ruler_score_group(TrajectoryGroup([a, bad]), MODEL, judge.params)


async def test_a_rescored_group_shows_its_latest_explanation_everywhere(judge):
    from ruler_rl.results import score_rows

    g = group("GOOD a", "BAD b")
    for t in g.trajectories:
        t.log("RULER explanation: stale, from an earlier scoring")
    scored = await score(judge, g, cache=False)
    rows = score_rows(scored)
    assert [r.explanation for r in rows] == [t.metadata["ruler_explanation"] for t in scored.trajectories]
    assert all(r.explanation.endswith(" chars") for r in rows)
    assert [r.trajectory_id for r in rows] == ["1", "2"] and rows[0].advantage > 0 > rows[1].advantage
    assert f"RULER explanation: {rows[0].explanation}" in scored.trajectories[0].logs  # ART's log line too


async def test_swallow_exceptions_does_not_hide_a_mistake_in_the_call(judge):
    g = group("GOOD a", "BAD b")
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_permutatons'"):
        await score(judge, g, swallow_exceptions=True, num_permutatons=3)
    with pytest.raises(ValueError, match="num_permutations must be an integer"):
        await score(judge, g, swallow_exceptions=True, num_permutations=0)
    with pytest.raises(TypeError, match="limits must be a ruler_rl.trajectory.Limits"):
        await score(judge, g, swallow_exceptions=True, limits=5)
    assert judge.requests == []
    bad_group = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "wizard", "content": "hi"}])] * 2)
    assert await score(judge, bad_group, swallow_exceptions=True) is None  # a group that cannot be judged: swallowed


async def test_notes_are_a_field_of_the_scored_group_and_replaced_on_rescoring(judge):
    from ruler_rl.results import score_notes

    with pytest.warns(UserWarning, match="group of one"):
        one = await score(judge, group("GOOD a"), cache=False)
    assert score_notes(one) == ["single trajectory: scored on its own, without relative grounding"]
    assert "RULER note: single trajectory: scored on its own, without relative grounding" in one.trajectories[0].logs
    two = await score(judge, TrajectoryGroup([*one.trajectories, *group("BAD b").trajectories],
                                             metadata=one.metadata), cache=False)
    assert score_notes(two) == []  # the earlier judgment's notes are gone with it


async def test_gathering_keeps_a_group_whose_rollouts_all_raised_without_scoring_it(judge):
    from ruler_rl.gather import gather_trajectory_groups

    async def boom():
        raise RuntimeError("rollout failed")

    async def scored(g):
        return await ruler_score_group(g, MODEL, judge.params, retry=FAST)

    kept = await gather_trajectory_groups([TrajectoryGroup([boom(), boom()]), group("GOOD a", "BAD b")],
                                          after_each=scored, max_exceptions=2, pbar_desc=None)
    assert [len(g) for g in kept] == [0, 2] and len(kept[0].exceptions) == 2
    assert len(judge.requests) == 1  # only the group with trajectories was judged
