"""ART's rubric: every branch of the reward on hand-made rubrics, and every way the agent loop fills the rubric in,
driven by a scripted model over the real inbox database; the optional correctness judge."""

import json

import pytest

from evals.art_e.agent import run_agent
from evals.art_e.rewards import Rubric, art_reward, grade, judge_answer
from ruler_rl.judges import EMBEDDED_JUDGE
from ruler_rl.judges.errors import JudgeError
from tests.helpers import budget_review_scenario

SALLY = "sally.beck@enron.com"


# ---- the reward on hand-made rubrics: one case per branch of ART's calculate_reward ----

def R(**kw) -> Rubric:
    return Rubric(**kw)


@pytest.mark.parametrize("rubric, expected", [
    # partial credit: 0.1 found + 0.1 read + 0.1 never read an invalid email + 0.1 cited
    (R(cant_parse_tool_call=True), -2 + 0.1),
    (R(cant_parse_tool_call=True, ever_tried_to_read_invalid_email=True), -2.0),
    (R(bad_tool_call_name=True, ever_found_right_email=True), -1.9 + 0.2),
    (R(bad_tool_call_args=True, ever_found_right_email=True, ever_read_right_email=True), -1.8 + 0.3),
    (R(cant_parse_tool_call=True, bad_tool_call_name=True, bad_tool_call_args=True), -2 + 0.1),  # first branch wins
    (R(attempted_answer=True, answer_correct=False, sources_correct=True, ever_found_right_email=True,
       ever_read_right_email=True), -1 + 0.4),
    (R(returned_i_dont_know=True, ever_found_right_email=True), 0 + 0.2),
    (R(ran_out_of_turns=True, num_turns=11), 0 + 0.1),
    (R(attempted_answer=True, answer_correct=True, sources_correct=True, num_sources=1, num_turns=3), 1 + 0.3 + 0.1 + 0.07),
    (R(attempted_answer=True, answer_correct=True, sources_correct=False, num_sources=2, num_turns=10), 1 + 0.05),
    (R(attempted_answer=True, answer_correct=True, sources_correct=True, num_sources=21, num_turns=5), 1.3 + 0.1 / 21 + 0.05),
    (R(attempted_answer=True, answer_correct=True, num_sources=0, num_turns=1), 1 + 0.09),
])
def test_every_branch_of_arts_reward(rubric, expected):
    assert art_reward(rubric, max_turns=10) == pytest.approx(expected)


def test_i_dont_know_scores_idk_reward():
    idk = R(returned_i_dont_know=True, ever_found_right_email=True)
    out_of_turns = R(ran_out_of_turns=True, num_turns=11)
    assert art_reward(idk) == pytest.approx(0.2) and art_reward(idk, idk_reward=0) == pytest.approx(0.2)
    assert art_reward(idk, 10, -1) == pytest.approx(-1 + 0.2)
    assert art_reward(out_of_turns, idk_reward=-1.0) == pytest.approx(-1 + 0.1)
    assert art_reward(idk, idk_reward=-0.5) == pytest.approx(-0.5 + 0.2)
    # the other branches do not move
    wrong = R(attempted_answer=True, ever_found_right_email=True)
    right = R(attempted_answer=True, answer_correct=True, num_sources=1, num_turns=2)
    for rubric in (wrong, right, R(bad_tool_call_args=True)):
        assert art_reward(rubric, idk_reward=-1) == art_reward(rubric)
    for bad in (-1.5, 0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="idk_reward"):
            art_reward(idk, idk_reward=bad)
    for bad in ("-1", None, True):
        with pytest.raises(TypeError, match="idk_reward"):
            art_reward(idk, idk_reward=bad)


def test_outcomes_are_ordered_and_bad_input_is_refused():
    correct = art_reward(R(attempted_answer=True, answer_correct=True, sources_correct=True, num_sources=1, num_turns=4))
    many = art_reward(R(attempted_answer=True, answer_correct=True, sources_correct=True, num_sources=21, num_turns=4))
    idk = art_reward(R(returned_i_dont_know=True, ever_found_right_email=True, ever_read_right_email=True))
    wrong = art_reward(R(attempted_answer=True, ever_found_right_email=True, ever_read_right_email=True))
    bad = art_reward(R(bad_tool_call_args=True, ever_found_right_email=True, ever_read_right_email=True))
    assert correct > many > idk > wrong > bad
    with pytest.raises(ValueError, match="no branch"):
        art_reward(R())  # nothing happened at all: ART raises too
    with pytest.raises(ValueError):
        art_reward(R(ran_out_of_turns=True), max_turns=0)
    with pytest.raises(TypeError):
        art_reward({"ran_out_of_turns": True})


# ---- the agent loop fills the rubric in as ART's rollout does (a scripted model over the real database) ----

@pytest.fixture(scope="module")
def scenario(inbox_db):
    return budget_review_scenario(inbox_db[0])


def call(name, args, cid="c1"):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def turn(*calls):
    return {"tool_calls": list(calls)}


async def rollout(judge, scenario, db, script, max_turns=10, mode="native"):
    judge.script = list(script)
    traj = await run_agent(scenario, db, "openai/scripted-agent", params=judge.params, max_turns=max_turns,
                           tool_mode=mode)
    return traj


async def test_a_correct_cited_answer(judge, inbox_db, scenario):
    right = scenario.message_ids[0]
    traj = await rollout(judge, scenario, inbox_db[0], [
        turn(call("search_emails", {"keywords": ["budget", "review"]})),
        turn(call("read_email", {"message_id": right})),
        turn(call("return_final_answer", {"answer": f"It came from {scenario.answer}", "sources": [right]}))])
    g = await grade(traj, scenario, max_turns=10)
    m = traj.metrics
    assert (m["ever_found_right_email"], m["ever_read_right_email"], m["attempted_answer"], m["sources_correct"],
            m["num_sources"], m["num_turns"], m["turns"]) == (1, 1, 1, 1, 1, 3, 3)
    assert g.matched and g.judged is None and traj.reward == pytest.approx(1 + 0.3 + 0.1 + 0.1 * 0.7)
    assert [msg["role"] for msg in traj.messages()] == ["system", "user"] + ["assistant", "tool"] * 3
    assert len(judge.requests) == 3 and judge.requests[0]["tools"][0]["function"]["name"] == "search_emails"


async def test_a_wrong_answer_and_an_invalid_read(judge, inbox_db, scenario):
    traj = await rollout(judge, scenario, inbox_db[0], [
        turn(call("read_email", {"message_id": "<made-up@x>"})),
        turn(call("return_final_answer", {"answer": "nobody.else@enron.com", "sources": ["<made-up@x>"]}))])
    await grade(traj, scenario, max_turns=10)
    assert traj.metrics["ever_tried_to_read_invalid_email"] == 1 and "not found" in traj.messages()[3]["content"].lower()
    assert traj.reward == pytest.approx(-1.0)


async def test_i_dont_know_and_running_out_of_turns(judge, inbox_db, scenario):
    traj = await rollout(judge, scenario, inbox_db[0], [
        turn(call("return_final_answer", {"answer": "I don't know", "sources": []}))])
    await grade(traj, scenario, max_turns=10)
    assert traj.metrics["returned_i_dont_know"] == 1 and traj.metrics["attempted_answer"] == 0
    assert traj.reward == pytest.approx(0.1)
    g = await grade(traj, scenario, max_turns=10, idk_reward=-1)  # the later RULER example's scoring
    assert traj.reward == g.reward == pytest.approx(-1 + 0.1) and not g.correct
    traj = await rollout(judge, scenario, inbox_db[0], [turn(call("search_emails", {"keywords": ["budget"]}))] * 2,
                         max_turns=2)
    await grade(traj, scenario, max_turns=2)
    assert traj.metrics["ran_out_of_turns"] == 1 and traj.metrics["turns"] == 2 and traj.metrics["num_turns"] == 3
    assert traj.reward == pytest.approx(0.1 + 0.1 * traj.metrics["ever_found_right_email"])


@pytest.mark.parametrize("script, flag, reward", [
    ([{"content": "The answer is Sally."}], "bad_tool_call_args", -1.8 + 0.1),          # no tool call at all
    ([turn(call("delete_everything", {}))], "bad_tool_call_name", -1.9 + 0.1),
    ([turn(call("search_emails", "{not json"))], "bad_tool_call_args", -1.8 + 0.1),
    ([turn(call("search_emails", {"keywords": ["bud\x00get"]}))], "bad_tool_call_args", -1.8 + 0.1),
    ([turn(call("search_emails", {"keywords": []}))], "bad_tool_call_args", -1.8 + 0.1),  # ART raises on no keywords
])
async def test_format_errors_end_the_episode_with_arts_tiers(judge, inbox_db, scenario, script, flag, reward):
    traj = await rollout(judge, scenario, inbox_db[0], script + [turn(call("return_final_answer",
                                                                           {"answer": "x", "sources": []}))])
    await grade(traj, scenario, max_turns=10)
    assert traj.metrics[flag] == 1 and traj.metrics["turns"] == 1 and traj.metrics["failed_format_validation"] == 1
    assert traj.reward == pytest.approx(reward)
    assert traj.metrics["prompt_tokens"] == 100  # the turn that ended the episode is counted too
    if "tool_calls" in script[0]:  # the bad call is answered with the error, so the conversation stays well formed
        assert traj.messages()[-1]["role"] == "tool" and "error" in json.loads(traj.messages()[-1]["content"])


@pytest.mark.parametrize("mode", ["native", "text"])
async def test_an_unreadable_date_is_an_error_the_agent_reads_and_the_episode_goes_on(judge, inbox_db, scenario,
                                                                                      mode):
    right = scenario.message_ids[0]
    bad = {"keywords": ["budget", "review"], "sent_after": "2001-13-45"}
    good = {"keywords": ["budget", "review"], "sent_after": ""}  # an empty date is no filter
    finish = {"answer": scenario.answer, "sources": [right]}
    if mode == "native":
        script = [turn(call("search_emails", bad)), turn(call("search_emails", good)),
                  turn(call("return_final_answer", finish))]
    else:
        script = [{"content": json.dumps({"tool_name": name, "tool_args": args})}
                  for name, args in (("search_emails", bad), ("search_emails", good), ("return_final_answer", finish))]
    traj = await rollout(judge, scenario, inbox_db[0], script, mode=mode)
    g = await grade(traj, scenario, max_turns=10)
    m = traj.metrics
    assert m["unreadable_dates"] == 1 and m["turns"] == 3 and m["failed_format_validation"] == 0
    assert m["bad_tool_call_args"] == 0 and m["ever_found_right_email"] == 1 and g.correct
    assert traj.reward == pytest.approx(1 + 0.3 + 0.1 + 0.1 * 0.7)  # no -1.8: the date cost nothing but a turn
    first_result = traj.messages()[3]["content"]
    assert "sent_after '2001-13-45' is not a date (YYYY-MM-DD)" in first_result
    traj = await rollout(judge, scenario, inbox_db[0], [  # both dates of one call unreadable: two
        turn(call("search_emails", {"keywords": ["budget"], "sent_after": "soon", "sent_before": "3000-01-01"})),
        turn(call("return_final_answer", {"answer": "I don't know", "sources": []}))])
    assert traj.metrics["unreadable_dates"] == 2 and traj.metrics["returned_i_dont_know"] == 1


async def test_tool_choice_reaches_every_native_request(judge, inbox_db, scenario):
    script = [turn(call("search_emails", {"keywords": ["budget"]})),
              turn(call("return_final_answer", {"answer": "x", "sources": []}))]
    traj = await rollout(judge, scenario, inbox_db[0], script)  # the default: ART's for prompted models
    assert [r["tool_choice"] for r in judge.requests] == ["required", "required"]
    assert traj.metadata["tool_choice"] == "required"
    for choice in ("auto", "none"):
        judge.reset()
        judge.script = list(script)
        traj = await run_agent(scenario, inbox_db[0], "openai/scripted-agent", params=judge.params,
                               tool_mode="native", tool_choice=choice)
        assert [r["tool_choice"] for r in judge.requests] == [choice, choice] and traj.metadata["tool_choice"] == choice
    judge.reset()
    judge.script = [{"content": json.dumps({"tool_name": "return_final_answer",
                                            "tool_args": {"answer": "x", "sources": []}})}]
    traj = await run_agent(scenario, inbox_db[0], "openai/scripted-agent", params=judge.params, tool_mode="text")
    assert "tool_choice" not in judge.requests[0] and traj.metadata["tool_choice"] is None  # text protocol: not sent
    for bad in ("any", None, "REQUIRED"):
        with pytest.raises(ValueError, match="tool_choice"):
            await run_agent(scenario, inbox_db[0], "openai/scripted-agent", params=judge.params, tool_choice=bad)
    with pytest.raises(ValueError, match="tool_choice"):
        await run_agent(scenario, inbox_db[0], "openai/scripted-agent", params={**judge.params, "tool_choice": "auto"})


async def test_only_the_first_tool_call_of_a_turn_runs(judge, inbox_db, scenario):
    traj = await rollout(judge, scenario, inbox_db[0], [
        turn(call("search_emails", {"keywords": ["budget"]}, "a"), call("return_final_answer",
                                                                        {"answer": "x", "sources": []}, "b")),
        turn(call("return_final_answer", {"answer": "I don't know", "sources": []}))])
    assert traj.metrics["turns"] == 2 and traj.metadata["answer"] == "I don't know"
    tool_msgs = [m for m in traj.messages() if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs[:2]] == ["a", "b"] and "not run" in tool_msgs[1]["content"]


async def test_text_protocol_parse_failures_and_calls(judge, inbox_db, scenario):
    traj = await rollout(judge, scenario, inbox_db[0], [{"content": "I will search now"}], mode="text")
    await grade(traj, scenario, max_turns=10)
    assert traj.metrics["cant_parse_tool_call"] == 1 and traj.reward == pytest.approx(-2 + 0.1)
    traj = await rollout(judge, scenario, inbox_db[0], [{"content": '{"tool_name": "read_email"}'}], mode="text")
    assert traj.metrics["bad_tool_call_args"] == 1
    right = scenario.message_ids[0]
    traj = await rollout(judge, scenario, inbox_db[0], [
        {"content": json.dumps({"tool_name": "read_email", "tool_args": {"message_id": right}})},
        {"content": "Sure: " + json.dumps({"tool_name": "return_final_answer",
                                           "tool_args": {"answer": scenario.answer, "sources": [right]}})}],
        mode="text")
    g = await grade(traj, scenario, max_turns=10)
    assert g.correct and traj.metrics["ever_read_right_email"] == 1 and traj.messages()[3]["role"] == "user"
    assert judge.requests[-1]["response_format"]["type"] == "json_schema"


async def test_a_rate_limited_model_is_retried_in_native_mode(judge, inbox_db, scenario):
    traj = await rollout(judge, scenario, inbox_db[0], ["429", "503", turn(call("return_final_answer",
                                                                                 {"answer": "x", "sources": []}))])
    assert traj.metrics["turns"] == 1 and traj.metrics["attempted_answer"] == 1 and len(judge.requests) == 3


async def test_a_rate_limited_model_is_retried_in_text_mode(judge, inbox_db, scenario):
    answer = {"content": json.dumps({"tool_name": "return_final_answer", "tool_args": {"answer": "x", "sources": []}})}
    traj = await rollout(judge, scenario, inbox_db[0], ["429", "503", answer], mode="text")
    assert traj.metrics["turns"] == 1 and traj.metrics["attempted_answer"] == 1 and len(judge.requests) == 3
    assert all(r["response_format"]["type"] == "json_schema" for r in judge.requests)  # the text protocol each time


# ---- the correctness judge: only for answers the matcher does not accept, and only when given ----

async def test_the_judge_is_asked_only_when_given_and_the_matcher_said_no(judge, inbox_db, scenario):
    right = scenario.message_ids[0]
    finish = turn(call("return_final_answer", {"answer": "the finance person", "sources": [right]}))
    traj = await rollout(judge, scenario, inbox_db[0], [finish])
    g = await grade(traj, scenario, max_turns=10)
    assert (g.matched, g.judged, g.correct) == (False, None, False) and len(judge.requests) == 1
    traj = await rollout(judge, scenario, inbox_db[0], [finish, {"content": '{"reason": "same person", "correct": true}'}])
    g = await grade(traj, scenario, max_turns=10, judge_model="openai/fake-judge", judge_params=judge.params)
    assert (g.matched, g.judged, g.correct) == (False, True, True) and traj.reward > 1
    assert "the finance person" in judge.requests[-1]["messages"][1]["content"]
    asked = len(judge.requests)
    again = await judge_answer(scenario, "the finance person", "openai/fake-judge", params=judge.params)
    assert again is True and len(judge.requests) == asked == 3  # cached: the judge is not asked again
    traj = await rollout(judge, scenario, inbox_db[0], [finish, "500", "500", "500", "500", "500"])
    with pytest.raises(JudgeError):
        from ruler_rl.judges.completion import RetryPolicy

        await grade(traj, scenario, max_turns=10, judge_model="openai/other-judge", judge_params=judge.params,
                    retry=RetryPolicy(attempts=2, initial_wait=0, max_wait=0))


async def test_no_answer_is_never_correct_and_needs_no_judge(scenario):
    assert await judge_answer(scenario, "I don't know", "nonexistent/model") is False
    assert await judge_answer(scenario, None, "nonexistent/model") is False


@pytest.mark.slow
async def test_correctness_judge_with_the_embedded_model_returns_a_cached_verdict(embedded_model, scenario, tmp_path,
                                                                                monkeypatch):
    from evals.art_e import rewards

    first = await judge_answer(scenario, "It was sent by someone.", EMBEDDED_JUDGE, cache=tmp_path)
    assert isinstance(first, bool)

    async def no_judge(*args, **kwargs):
        raise AssertionError("the judge was asked again: the verdict was not cached")

    monkeypatch.setattr(rewards, "complete", no_judge)  # a readable verdict is cached: the rerun asks nobody
    assert await judge_answer(scenario, "It was sent by someone.", EMBEDDED_JUDGE, cache=tmp_path) is first
