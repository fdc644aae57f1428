"""Context budgets: truncation first, then sub-groups with anchors put on one scale."""

import json
import random
import re

import litellm
import pytest

from ruler_rl import RetryPolicy, Trajectory, TrajectoryGroup, ruler_score_group
from ruler_rl.budget import MARK, calibrate, truncate_group, truncate_middle
from tests.helpers import SYSTEM, USER

FAST = RetryPolicy(attempts=2, initial_wait=0.01, max_wait=0.05)
MARKS = {"GOOD": 0.9, "OK": 0.5, "BAD": 0.1}


def multi_turn(i: int, quality: str, rng: random.Random) -> list[dict]:
    """A rollout with three tool calls whose results are ~1,500 characters each."""
    msgs = [SYSTEM, USER]
    for k in range(3):
        words = " ".join(rng.choice(["budget", "meeting", "room", "Sally", "Q3", "report", "cost"]) for _ in range(250))
        msgs += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}_{k}", "type": "function",
                  "function": {"name": "search_inbox", "arguments": json.dumps({"keywords": [str(i), str(k)]})}}]},
                 {"role": "tool", "tool_call_id": f"c{i}_{k}", "content": json.dumps({"body": words})}]
    return msgs + [{"role": "assistant", "content": f"{quality}: answer number {i}"}]


def big_group(n: int, seed: int = 0):
    rng = random.Random(seed)
    qualities = [rng.choice(list(MARKS)) for _ in range(n)]
    return TrajectoryGroup([Trajectory(messages_and_choices=multi_turn(i, q, rng)) for i, q in enumerate(qualities)]), qualities


def subgroups(scored) -> int:
    """How many sub-groups the group was split into, as its log says."""
    (line,) = [line for line in scored.trajectories[0].logs if "split into" in line]
    return int(re.search(r"split into (\d+) sub-groups", line).group(1))


def test_truncate_middle_keeps_both_ends_and_says_how_much():
    text = "HEAD" + "x" * 5000 + "TAIL"
    cut = truncate_middle(text, 500)
    assert cut.startswith("HEAD") and cut.endswith("TAIL") and len(cut) < 600
    removed = int(re.search(r"\[\.\.\. (\d+) characters cut", cut).group(1))
    marker = MARK.format(n=removed)
    assert marker in cut and len(cut) - len(marker) + removed == len(text)
    assert truncate_middle("short", 500) == "short"


def test_truncate_group_never_touches_the_shared_prefix():
    g, _ = big_group(3)
    lists = [t.messages() for t in g]
    cut = truncate_group(lists, 500)
    assert [ml[:2] for ml in cut] == [ml[:2] for ml in lists]
    assert all(len(m.get("content") or "") < 1200 for ml in cut for m in ml[2:])
    assert json.loads(cut[0][3]["content"])["body"]  # JSON tool results stay JSON


@pytest.mark.parametrize("s2", [
    {0: 0.4, 1: 1.0, 3: 0.5},  # the second sub-group's judge sees everything 0.2 higher
    {0: 0.0, 1: 1.0, 3: 1 / 6},  # ... or stretched by 5/3 around 0.5
], ids=["shifted", "stretched"])
def test_calibrate_puts_subgroups_on_one_scale_through_anchors(s2):
    # the true scores; the first sub-group is judged truthfully; 0 and 1 are the anchors both sub-groups see
    truth = {0: 0.2, 1: 0.8, 2: 0.5, 3: 0.3}
    s1 = {0: 0.2, 1: 0.8, 2: 0.5}
    out = calibrate([s1, s2], [0, 1])
    assert sorted(out) == [0, 1, 2, 3]
    # anchors get their mean score; every trajectory lands on the one line through the anchors (truth -> out)
    assert out[0] == pytest.approx((s1[0] + s2[0]) / 2) and out[1] == pytest.approx((s1[1] + s2[1]) / 2)
    slope = (out[1] - out[0]) / (truth[1] - truth[0])
    for i, true in truth.items():
        assert out[i] == pytest.approx(out[0] + slope * (true - truth[0]), abs=1e-9), i


async def test_64_multi_turn_trajectories_score_under_an_8k_judge(judge):
    g, qualities = big_group(64)
    scored = await ruler_score_group(g, "openai/fake-judge", judge.params, retry=FAST, max_prompt_tokens=8000)
    assert len(judge.requests) == subgroups(scored) >= 2  # one judge call per sub-group
    for req in judge.requests:
        assert litellm.token_counter(model="openai/fake-judge", messages=req["messages"]) <= 8000
    assert [round(t.reward, 6) for t in scored] == [MARKS[q] for q in qualities]


async def test_anchors_remove_a_judge_that_drifts_between_subgroups(judge):
    g, qualities = big_group(24, seed=3)
    judge.drift = 0.02  # each later sub-group is judged more generously
    scored = await ruler_score_group(g, "openai/fake-judge", judge.params, retry=FAST, max_prompt_tokens=6000)
    assert len(judge.requests) == subgroups(scored) >= 3
    got = [t.reward for t in scored]
    for a, qa in zip(got, qualities):
        for b, qb in zip(got, qualities):
            if MARKS[qa] > MARKS[qb]:
                assert a > b
    assert max(abs(x - MARKS[q]) for x, q in zip(got, qualities)) < 0.1


def count_prompt_builds(monkeypatch) -> list[str]:
    """Every judge prompt built from now on (as JSON text), in order: all are built by `RulerOptions.prompt`."""
    import ruler_rl.options

    built: list[str] = []
    real = ruler_rl.options.build_prompt

    def counting(*args, **kwargs):
        prompt = real(*args, **kwargs)
        built.append(json.dumps(prompt.messages))
        return prompt

    monkeypatch.setattr(ruler_rl.options, "build_prompt", counting)
    return built


async def test_an_over_budget_group_builds_its_prompt_once_per_decision(judge, monkeypatch):
    """Three rollouts of ~3,200 tokens under a 2,000-token budget: the full prompt is built once (measured, too
    long), then the first cap that cuts anything (1,200 characters: the ~1,500-character tool results are
    untouched by 16,000 to 2,000) once, and that prompt is the one sent. No prompt is built twice."""
    built = count_prompt_builds(monkeypatch)
    g, qualities = big_group(3)
    scored = await ruler_score_group(g, "openai/fake-judge", judge.params, retry=FAST, max_prompt_tokens=2000,
                                     cache=False)
    assert [round(t.reward, 6) for t in scored] == [MARKS[q] for q in qualities]
    assert any("long bodies cut to 1200 characters" in line for line in scored.trajectories[0].logs)
    assert len(built) == 2
    assert len(judge.requests) == 1 and json.dumps(judge.requests[0]["messages"]) == built[-1]


async def test_a_split_group_builds_no_prompt_twice_and_sends_only_prompts_it_measured(judge, monkeypatch):
    built = count_prompt_builds(monkeypatch)
    g, qualities = big_group(12)
    scored = await ruler_score_group(g, "openai/fake-judge", judge.params, retry=FAST, max_prompt_tokens=2000,
                                     num_permutations=2, cache=False)
    assert any("split into" in line for line in scored.trajectories[0].logs)
    assert [round(t.reward, 6) for t in scored] == [MARKS[q] for q in qualities]
    assert len(built) == len(set(built))
    sent = [json.dumps(r["messages"]) for r in judge.requests]
    assert len(sent) >= 4 and set(sent) <= set(built)  # two orderings of each sub-group, each built once
