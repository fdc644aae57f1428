"""ART·E rewards: the rubric's ordering on hand-made outcomes, and the correctness judge with the embedded model."""

import pytest

from evals.art_e.questions import Scenario
from evals.art_e.rewards import art_e_reward, judge_answer
from judges import EMBEDDED_JUDGE

S = Scenario(id="s", question="Who sent the budget email?", answer="sally.beck@enron.com", message_ids=["<1>"],
             inbox_address="me@enron.com", query_date="2001-01-01", how_realistic=0.5, inbox="beck-s")


def test_outcomes_are_ordered_as_the_rubric_says():
    base = {"turns": 4, "read_right_email": True, "found_right_email": True}
    correct_cited = art_e_reward(base, "Sally Beck", ["<1>"], S, True)
    correct_uncited = art_e_reward(base, "Sally Beck", ["<9>"], S, True)
    idk = art_e_reward(base, "I don't know", [], S, False)
    wrong = art_e_reward(base, "John", ["<1>"], S, False)
    lost = art_e_reward({**base, "ran_out_of_turns": True}, None, [], S, False)
    assert correct_cited > correct_uncited > idk > wrong > lost
    assert 1 <= correct_uncited <= 2 and 0 <= idk <= 1 and -1 <= wrong <= 0 and -2 <= lost <= -1
    assert art_e_reward({"turns": 2}, "x", ["<1>"], S, True) > art_e_reward({"turns": 9}, "x", ["<1>"], S, True)
    with pytest.raises(ValueError):
        art_e_reward(base, "x", [], S, True, max_turns=0)


async def test_no_answer_is_never_correct_and_needs_no_judge():
    assert await judge_answer(S, "I don't know", "nonexistent/model") is False
    assert await judge_answer(S, None, "nonexistent/model") is False


@pytest.mark.slow
async def test_correctness_judge_with_the_embedded_model_returns_a_cached_verdict(embedded_model, tmp_path):
    first = await judge_answer(S, "It was sent by sally.beck@enron.com.", EMBEDDED_JUDGE, cache=tmp_path)
    assert isinstance(first, bool)
    assert await judge_answer(S, "It was sent by sally.beck@enron.com.", EMBEDDED_JUDGE, cache=tmp_path) is first
