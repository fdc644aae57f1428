"""The answer matcher's three verdicts on the labelled table of right and wrong answers (evals/art_e/answer_pairs.jsonl),
the failure classes of issue #33 one by one, and grade() sending "ask" to a scripted judge over the real inbox."""

import json
from collections import Counter

import pytest

from evals.art_e import answer_accuracy
from evals.art_e.agent import run_agent
from evals.art_e.answer_accuracy import load_pairs, rates, wilson
from evals.art_e.matching import answer_matches, match_verdict
from evals.art_e.rewards import grade
from tests.helpers import budget_review_scenario

SALLY = "sally.beck@enron.com"

# ---- the table ----


def test_the_table_loads_and_has_the_promised_mix():
    pairs = load_pairs()
    labels, forms = Counter(p.label for p in pairs), Counter(p.form for p in pairs)
    assert len(pairs) >= 200
    assert 0.4 <= labels["right"] / len(pairs) <= 0.6
    assert 0.35 <= forms["sentence"] / len(pairs) <= 0.55
    assert len({p.id for p in pairs}) == len(pairs)
    assert all(p.note.strip() and p.source.strip() for p in pairs)
    held_out = load_pairs(answer_accuracy.PAIRS_PATH.with_name("answer_pairs_heldout.jsonl"))
    assert len(held_out) >= 70 and not {(p.reference, p.answer) for p in held_out} & {(p.reference, p.answer)
                                                                                     for p in pairs}


@pytest.mark.parametrize("change, message", [
    ({"label": "maybe"}, "label must be"),
    ({"form": "long"}, "form must be"),
    ({"answer": "  "}, "non-empty"),
    ({"extra": "x"}, "exactly the fields"),
    ({"note": 3}, "every field must be a string"),
])
def test_a_bad_row_is_refused_with_its_line(tmp_path, change, message):
    good = {"id": "a", "source": "s", "question": "When?", "reference": "May 1", "answer": "May 1", "label": "right",
            "form": "bare", "note": "same"}
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", **change}) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_pairs(path)
    assert ":2:" in str(e.value)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(ValueError, match="used twice"):
        load_pairs(path)


def test_wilson_interval():
    lo, hi = wilson(5, 157)
    assert 0.013 < lo < 0.015 and 0.071 < hi < 0.073  # 3.2% [1.4%, 7.2%]
    assert wilson(0, 0) == (0.0, 1.0) and wilson(0, 10)[0] == 0.0
    with pytest.raises(ValueError):
        wilson(3, 2)


# ---- the matcher on each failure class of the issue ----

Q_REPLY = "Who replied to my email about Introduction?"


@pytest.mark.parametrize("answer, reference, question", [
    # states the reference value but contradicts it
    ("Mark Tawney forwarded it to Joseph Hrgovcic, who replied.", "mark.tawney@enron.com", Q_REPLY),
    ("Shirley Crenshaw asked IT and Kevin Moore replied.", "shirley.crenshaw@enron.com", Q_REPLY),
    # a list with an extra member, the reference a single person or itself a list
    ("Norma Villarreal and Shirley Crenshaw", "norma.villarreal@enron.com", Q_REPLY),
    ("John Doe, Sally Beck and Mike Carson", "John Doe and Sally Beck", "Who was at the meeting?"),
    ("the Renaissance Houston Hotel, then the Four Seasons Hotel", "Renaissance Houston Hotel", "Where is it?"),
    # negations and contrast words
    ("not $300", "$300", "What was the invoice?"),
    ("Not March 29 — it was moved to April 5.", "03/29/2000", "When is the lunch?"),
    ("The luncheon moved from September 26 to October 3.", "Audrey said the luncheon is on Wednesday, September 26.",
     "What date did Audrey give for the appreciation luncheon?"),
    ("A former employee who left last year", "Employee", "Who is Sharon Hausinger?"),
])
def test_an_answer_that_states_the_value_but_contradicts_it_is_not_accepted(answer, reference, question):
    assert match_verdict(answer, reference, question) == "ask"
    assert not answer_matches(answer, reference, question)


@pytest.mark.parametrize("answer, reference", [
    ("The lunch is on March 29, not March 22 as first announced.", "03/29/2000"),   # another date, ruled out
    ("March 26 — not March 19", "March 26"),
    ("$1.44 million, up from $1.2 million last year", "$1.44m"),
    ("Celeste Roberts replied, not Charlene Jackson.", "celeste.roberts@enron.com"),
    ("A world-famous architect", "world-renowned architect"),                       # a paraphrase
])
def test_a_right_answer_with_other_values_negations_or_paraphrase_is_asked_not_rejected(answer, reference):
    assert match_verdict(answer, reference) == "ask"


@pytest.mark.parametrize("answer, reference, question", [
    ("Call Entex on Monday and ask them to stay at the current level or lower until further notice.",
     "please give Entex a call on Monday and ask them to remain at the current level or lower until further notice",
     "What is requested?"),
    ("03/29/2000", "Yannis scheduled the research lunch for March 29, 2000.",
     "What date did Yannis give for the research lunch?"),
    ("713-853-5670", "University Affairs can be reached at (713) 853-5670.", "What is University Affairs' phone number?"),
    ("molly.magee@enron.com", "Molly Magee answered your email about Yvan's application.",
     "Who replied to my email about Yvan's Application?"),
    ("Associate Director for Research at the Energy & Environmental Research Center",
     "Associate Director for Research at the EERC", "Who is Edward Steadman?"),
    ("Your work, mobile and home phone numbers", "Also please provide me with your work, mobile, and home phone numbers",
     "What is requested?"),
])
def test_sentence_references_accept_right_answers(answer, reference, question):
    assert match_verdict(answer, reference, question) == "accept"


@pytest.mark.parametrize("answer, reference, question, verdict", [
    ("Yannis scheduled the research lunch for March 22, 2000.", "Yannis scheduled the research lunch for March 29, 2000.",
     "What date did Yannis give for the research lunch?", "reject"),
    ("University Affairs can be reached at (713) 853-5607.", "University Affairs can be reached at (713) 853-5670.",
     None, "reject"),
    ("Remove their access to execute on EOL for the Short-Term Main book",
     "Please give me access to execute on EOL for the Short-Term Main book.", "What is requested?", "ask"),
    ("Greg Whalley is the president and COO of Enron.",
     "Greg Whalley has resigned as president and COO of Enron to assume a position with UBS Warburg",
     "Who is Greg Whalley?", "ask"),
    ("An accounting firm that audited Enron", "corporate recovery and crisis management firm", "Who is Zolfo Cooper?",
     "ask"),
    ("I do not know", "The RTP conference is on March 22, 2001.", None, "reject"),
])
def test_sentence_references_do_not_accept_wrong_answers(answer, reference, question, verdict):
    assert match_verdict(answer, reference, question) == verdict


def test_bad_input_is_an_error():
    with pytest.raises(ValueError):
        match_verdict("x", " ")
    with pytest.raises(TypeError):
        match_verdict(3, "$3")
    with pytest.raises(TypeError):
        match_verdict("$3", "$3", question=["When?"])
    assert match_verdict(None, "$3") == match_verdict("", "$3") == match_verdict("I don't know", "$3") == "reject"


# ---- no regression on the table: the rates measured when the matcher was tuned (in-sample) ----

MEASURED = {"all": (5, 39), "bare": (1, 21), "sentence": (4, 18)}  # (false accepts, false rejects)


def test_the_matchers_error_rates_on_the_table_do_not_grow():
    pairs = load_pairs()
    accepted = [match_verdict(p.answer, p.reference, p.question) == "accept" for p in pairs]
    got = rates(pairs, accepted)
    for part, (fa, fr) in MEASURED.items():
        assert got[part]["false_accept"] <= fa and got[part]["false_reject"] <= fr, (part, got[part])


def test_the_command_writes_matcher_and_judge_rates_with_a_hosted_vllm_judge(judge, tmp_path):
    rows = [("r1", "When is the lunch?", "March 29", "March 29", "right"),                # accepted: no judge
            ("r2", "When is the lunch?", "March 29", "March 29, not March 22", "right"),  # ask: judged right
            ("w1", "When is the lunch?", "March 29", "March 22", "wrong"),                # reject: judged wrong
            ("w2", "When is the lunch?", "March 29", "Not March 29", "wrong")]            # ask: judged right (wrongly)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"id": i, "source": "test", "question": q, "reference": r, "answer": a,
                                        "label": lab, "form": "bare", "note": "-"}) + "\n" for i, q, r, a, lab in rows))
    verdict = {"r2": True, "w1": False, "w2": True}
    judge.script = [{"content": json.dumps({"reason": "-", "correct": verdict[i]})} for i in ("r2", "w1", "w2")]
    out = answer_accuracy.main(["--pairs", str(path), "--judge", "hosted_vllm/fake-judge", "--judge-api-base",
                                judge.base, "--concurrency", "1", "--out", str(tmp_path / "out.json")])
    assert out["verdict_counts"] == {"accept": 1, "ask": 2, "reject": 1}
    alone, judged = out["results"]["matcher alone"]["all"], out["results"]["matcher + judge (hosted_vllm/fake-judge)"]["all"]
    assert (alone["false_accept"], alone["false_reject"]) == (0, 1)
    assert (judged["false_accept"], judged["false_reject"]) == (1, 0)
    assert len(judge.requests) == 3 and all(r["model"] == "fake-judge" for r in judge.requests)
    assert "March 29, not March 22" in judge.requests[0]["messages"][1]["content"]
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == 4


# ---- grade(): the judge sees "ask", including an answer with the value and a negation ----

def call(name, args):
    return {"tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)}}]}


@pytest.fixture(scope="module")
def scenario(inbox_db):
    return budget_review_scenario(inbox_db[0])


async def answered(judge, scenario, db, answer, *verdicts):
    judge.script = [call("return_final_answer", {"answer": answer, "sources": scenario.message_ids})] + \
        [{"content": json.dumps({"reason": "-", "correct": v})} for v in verdicts]
    return await run_agent(scenario, db, "openai/scripted-agent", params=judge.params, max_turns=10,
                           tool_mode="native")


async def test_grade_asks_the_judge_on_an_accept_with_a_negation(judge, inbox_db, scenario):
    address = scenario.answer
    assert answer_matches(address, scenario.answer)
    traj = await answered(judge, scenario, inbox_db[0], f"It was {address}, not the budget office.", False)
    g = await grade(traj, scenario, max_turns=10, judge_model="openai/fake-judge", judge_params=judge.params)
    assert (g.verdict, g.matched, g.judged, g.correct) == ("ask", False, False, False)
    assert traj.metrics["answer_match_asked"] == 1 and traj.metrics["answer_matched"] == 0 and traj.reward < 0
    assert len(judge.requests) == 2 and "not the budget office" in judge.requests[1]["messages"][1]["content"]
    # without a judge an "ask" is not correct, and the plain value is accepted without asking anyone
    traj = await answered(judge, scenario, inbox_db[0], f"It was {address}, not the budget office.")
    g = await grade(traj, scenario, max_turns=10)
    assert (g.verdict, g.judged, g.correct) == ("ask", None, False)
    traj = await answered(judge, scenario, inbox_db[0], address)
    asked = len(judge.requests)
    g = await grade(traj, scenario, max_turns=10, judge_model="openai/fake-judge", judge_params=judge.params)
    assert (g.verdict, g.judged, g.correct) == ("accept", None, True) and len(judge.requests) == asked
    assert traj.metrics["answer_match_asked"] == 0 and traj.reward > 1


async def test_grade_asks_the_judge_on_an_ask_and_takes_its_yes(judge, inbox_db, scenario):
    name = " ".join(w.capitalize() for w in scenario.answer.split("@")[0].split("."))
    traj = await answered(judge, scenario, inbox_db[0], f"John Doe forwarded it to {name}, who sent it on.", True)
    assert match_verdict(traj.metadata["answer"], scenario.answer, scenario.question) == "ask"
    g = await grade(traj, scenario, max_turns=10, judge_model="openai/fake-judge", judge_params=judge.params)
    assert (g.verdict, g.matched, g.judged, g.correct) == ("ask", False, True, True) and traj.reward > 1
    assert "reference answer may be a bare value" in judge.requests[-1]["messages"][0]["content"]
