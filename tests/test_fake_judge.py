"""`ruler_rl.testing.FakeJudge`, the scripted judge shipped for offline pipelines: its script is checked when set,
consumed one item per request over real HTTP, and `reset()` restores every setting."""

import json

import httpx
import pytest

from ruler_rl.testing import MODES, FakeJudge

BODY = {"model": "fake", "messages": [{"role": "user", "content": '<trajectory id="1">GOOD</trajectory>'
                                                                  '<trajectory id="2">BAD</trajectory>'}]}


def post(judge: FakeJudge) -> httpx.Response:
    return httpx.post(f"{judge.base}/chat/completions", json=BODY, timeout=10)


def test_an_unknown_fault_mode_is_refused_when_the_script_is_set(judge):
    judge.script = ["500"]
    with pytest.raises(ValueError, match=r"script\[1\]: unknown fault mode 'rate_limit'.*'429'"):
        judge.script = ["503", "rate_limit"]
    with pytest.raises(ValueError, match=r"script\[0\].*'content' or 'tool_calls'"):
        judge.script = [{"text": "hello"}]
    with pytest.raises(TypeError, match="list of fault modes"):
        judge.script = "500"
    with pytest.raises(ValueError, match="unknown fault mode 'typo'"):
        judge.answer(BODY, "typo")
    assert judge.script == ("500",)  # a refused script leaves the one set before
    judge.script = sorted(MODES)  # every mode it names is accepted
    assert len(judge.script) == len(MODES)


def test_the_script_is_consumed_one_item_per_request_then_it_answers_ok(judge):
    judge.script = ["500", {"content": "scripted reply"}, "shuffled"]
    first = post(judge)
    assert first.status_code == 500 and judge.base in first.json()["error"]["message"]
    assert post(judge).json()["choices"][0]["message"]["content"] == "scripted reply"
    shuffled = post(judge).json()["choices"][0]["message"]["content"]
    assert [s["trajectory_id"] for s in json.loads(shuffled)["scores"]] == ["2", "1"]
    assert judge.script == ()
    plain = json.loads(post(judge).json()["choices"][0]["message"]["content"])
    assert [(s["trajectory_id"], s["score"]) for s in plain["scores"]] == [("1", 0.9), ("2", 0.1)]
    assert len(judge.requests) == len(judge.times) == 4
    assert [r["_index"] for r in judge.requests] == [0, 1, 2, 3] and judge.requests[0]["messages"] == BODY["messages"]


def test_reset_restores_every_setting_the_constructor_gave():
    judge = FakeJudge(slow_seconds=0.5, retry_after="2", latency_s=0.01)
    try:
        defaults = {"slow_seconds": 0.5, "retry_after": "2", "latency_s": 0.01, "drift": 0.0, "first_bonus": 0.0}
        judge.script = ["429", "slow"]
        judge.slow_seconds, judge.retry_after, judge.latency_s, judge.drift, judge.first_bonus = 9, "7", 3, 0.2, 0.3
        limited = post(judge)
        assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
        judge.reset()
        assert {name: getattr(judge, name) for name in defaults} == defaults
        assert judge.script == () and judge.requests == [] and judge.times == []
        answer = json.loads(post(judge).json()["choices"][0]["message"]["content"])
        assert [s["score"] for s in answer["scores"]] == [0.9, 0.1]  # no drift, no first-position bonus
    finally:
        judge.close()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"slow_seconds": -1}, ValueError, "slow_seconds"),
    ({"latency_s": float("nan")}, ValueError, "latency_s"),
    ({"retry_after": 1}, TypeError, "retry_after"),
])
def test_bad_settings_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        FakeJudge(**kwargs)
