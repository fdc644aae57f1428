"""examples/email_agent.py --judge-sees-reference: the RULER judge's rubric carries the question's reference answer
(the agent's messages do not), so a weak judge can rank answers against it."""

import re

import pytest

from ruler_rl import Trajectory, TrajectoryGroup, ruler_score_group
from ruler_rl.judges import DEFAULT_RUBRIC, get_rubric
from tests.test_email_agent_example import load_example


def test_the_flag_goes_with_the_ruler_reward_only():
    example = load_example()
    with pytest.raises(SystemExit):
        example.parse_args(["--judge-sees-reference"])  # --reward art by default
    assert example.parse_args(["--reward", "ruler", "--judge-sees-reference"]).judge_sees_reference is True
    assert example.parse_args(["--reward", "ruler"]).judge_sees_reference is False


async def test_the_judge_reads_the_reference_and_the_agent_does_not(judge):
    example = load_example()
    rubric = example.reference_rubric("  March 26, 2001 ")
    assert rubric.startswith(DEFAULT_RUBRIC.rstrip()) and "is: March 26, 2001\n" in rubric
    assert get_rubric(rubric) == rubric  # rubric text RULER accepts as it is
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match="reference must be a non-empty string"):
            example.reference_rubric(bad)
    msgs = [{"role": "system", "content": "Answer from the user's inbox."},
            {"role": "user", "content": "When was the budget meeting moved to?"}]
    group = TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, {"role": "assistant", "content": a}])
                             for a in ("March 26, 2001 GOOD", "March 19 BAD")])
    scored = await ruler_score_group(group, "openai/fake-judge", judge.params, rubric=rubric)
    assert [round(t.reward, 2) for t in scored.trajectories] == [0.9, 0.1]
    (body,) = judge.requests
    sent = "\n".join(m["content"] for m in body["messages"])
    assert "The question's reference answer, which the agent did not see, is: March 26, 2001" in sent
    blocks = re.findall(r'<trajectory id="\d+">(.*?)</trajectory>', sent, re.S)
    assert len(blocks) == 2 and not any("reference answer" in b for b in blocks)  # the rubric, not a trajectory
