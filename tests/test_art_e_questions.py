"""ART·E scenarios: the offline generator's questions checked against the real database, its uniqueness and
leak checks on hand-made mailboxes, the annotated set's filter, ART's format and hub mapping, files."""

import json
import re
import sqlite3

import pandas as pd
import pytest

from evals.art_e.inbox import build_inbox_db
from evals.art_e.matching import facts
from evals.art_e.questions import (
    GenerationReport,
    Scenario,
    generate_scenarios,
    hub_records_to_scenarios,
    load_scenarios,
    map_scenarios,
    question_mix,
    save_scenarios,
)
from evals.art_e.tools import InboxTools

SALLY = "sally.beck@enron.com"


@pytest.fixture(scope="module")
def generated(inbox_db):
    report = GenerationReport()
    return generate_scenarios(inbox_db[0], per_inbox=60, seed=1, report=report), report


def test_generated_questions_ask_about_bodies_and_their_answers_are_in_their_emails(inbox_db, generated):
    scenarios, report = generated
    db = sqlite3.connect(inbox_db[0])
    assert len(scenarios) >= 25 and {"date", "phone"} <= {s.kind for s in scenarios}
    assert all(s.kind in ("figure", "date", "place", "phone", "reply") for s in scenarios)  # no sender: a test inbox
    assert sum(report.made.values()) == len(scenarios) and report.inboxes == {SALLY: "test"}
    for s in scenarios:
        assert s.inbox_address == SALLY and s.how_realistic in (0, 0.25, 0.5, 0.75, 1)
        rows = [db.execute("SELECT body, from_address, date FROM emails WHERE message_id = ?", (m,)).fetchone()
                for m in s.message_ids]
        assert all(r is not None and r[2] < s.query_date for r in rows)  # visible on the query date
        first = rows[0]
        if s.kind == "figure":
            want = facts(s.answer)
            got = facts(first[0])
            assert want.amounts <= got.amounts and want.percents <= got.percents and want.numbers <= got.numbers
        elif s.kind == "phone":
            assert facts(s.answer).phones <= facts(first[0]).phones
        elif s.kind == "date":
            assert {(m, d) for _, m, d in facts(s.answer).dates} <= {(m, d) for _, m, d in facts(first[0]).dates}
        elif s.kind == "place":
            assert s.answer.lower() in first[0].lower()
        elif s.kind == "reply":
            assert first[1] == s.answer and rows[1][1] == SALLY and len(rows) == 2
    assert generate_scenarios(inbox_db[0], per_inbox=60, seed=1) == scenarios  # deterministic given the seed


def test_phone_questions_are_findable_by_the_name_they_ask_about(inbox_db, generated):
    phones = [s for s in generated[0] if s.kind == "phone"]
    assert phones
    for s in phones:
        name = re.match(r"What is (.+?)'s? phone number\?", s.question).group(1)
        tools = InboxTools(inbox_db[0], s.inbox_address, s.query_date)
        assert set(s.message_ids) & {h["message_id"] for h in tools.search_emails(name.split())}


def _mail(mid, sender, to, subject, body, date):
    return (f"Message-ID: <{mid}>\nDate: {date}\nFrom: {sender}\nTo: {to}\nSubject: {subject}\n\n{body}").encode()


def test_an_answer_the_inbox_gives_two_ways_is_not_asked_and_test_emails_never_leak_into_training(tmp_path):
    files = {
        # one figure, stated once: a question
        "1": _mail("1@x", "rick.lane@enron.com", "ann.owner@enron.com", "Exposure",
                   "Ann, the credit exposure is $6 million as of today.", "Mon, 4 Dec 2000 10:00:00 -0800"),
        # the same thing with two values in the inbox: no question
        "2": _mail("2@x", "rick.lane@enron.com", "ann.owner@enron.com", "Fees",
                   "Ann, the participant fee is $600.00 for the class.", "Tue, 5 Dec 2000 10:00:00 -0800"),
        "3": _mail("3@x", "rick.lane@enron.com", "ann.owner@enron.com", "Fees again",
                   "Ann, the participant fee is $800.00 for the class.", "Wed, 6 Dec 2000 10:00:00 -0800"),
        # a figure in mail shared with the training inbox: no test question
        "4": _mail("4@x", "rick.lane@enron.com", "ann.owner@enron.com, bo.trainer@enron.com", "Plan",
                   "All, the annual budget is $2.5 million for 2001.", "Thu, 7 Dec 2000 10:00:00 -0800"),
        # my email and the one reply to it: a question that needs both
        "5": _mail("5@x", "ann.owner@enron.com", "joe.park@enron.com", "Storage contract renewal",
                   "Joe, can you check the storage contract renewal terms?", "Fri, 8 Dec 2000 10:00:00 -0800"),
        "6": _mail("6@x", "joe.park@enron.com", "ann.owner@enron.com", "RE: Storage contract renewal",
                   "Checked, the terms are fine.", "Sat, 9 Dec 2000 10:00:00 -0800"),
        # the same email sent again before the reply: still one question (it was asked twice, with one id)
        "7": _mail("7@x", "ann.owner@enron.com", "joe.park@enron.com", "Storage contract renewal",
                   "Joe, resending: can you check the storage contract renewal terms?",
                   "Fri, 8 Dec 2000 11:00:00 -0800"),
    }
    box = tmp_path / "owner-a" / "inbox"
    box.mkdir(parents=True)
    for name, raw in files.items():
        (box / name).write_bytes(raw)
    other = tmp_path / "trainer-b" / "inbox"
    other.mkdir(parents=True)
    (other / "1").write_bytes(_mail("9@x", "zed.q@enron.com", "bo.trainer@enron.com", "Hi", "Hello Bo",
                                    "Fri, 8 Dec 2000 10:00:00 -0800"))
    build_inbox_db([tmp_path / "owner-a", tmp_path / "trainer-b"], tmp_path / "m.db")
    report = GenerationReport()
    scenarios = generate_scenarios(tmp_path / "m.db", per_inbox=10, test_inboxes=["ann.owner@enron.com"], report=report)
    figures = [(s.question, s.answer, s.message_ids, s.split) for s in scenarios if s.kind == "figure"]
    assert figures == [("What did Rick say the credit exposure is?", "$6 million", ["<1@x>"], "test"),
                       # the shared email is Bo's mail too: asked in his (training) inbox, never in the test one
                       ("What did Rick say the annual budget is?", "$2.5 million", ["<4@x>"], "train")]
    assert [(s.question, s.answer, s.message_ids) for s in scenarios if s.kind == "reply"] == [
        ("Who replied to my email about Storage contract renewal?", "joe.park@enron.com", ["<6@x>", "<7@x>"])]
    assert len({s.id for s in scenarios}) == len(scenarios)
    assert report.dropped["figure: not unique in the inbox"] >= 1
    assert report.dropped["figure: an email also in a training inbox"] == 1
    assert report.inboxes == {"ann.owner@enron.com": "test", "bo.trainer@enron.com": "train"}
    with pytest.raises(ValueError, match="not an inbox"):
        generate_scenarios(tmp_path / "m.db", test_inboxes=["nobody@enron.com"])


def test_the_mix_is_reported(generated):
    mix = question_mix(generated[0])
    assert set(mix.columns) == {"split", "kind", "questions", "how_realistic", "sources"}
    assert mix["questions"].sum() == len(generated[0])
    with pytest.raises(ValueError):
        question_mix([])


def test_human_written_annotated_set_keeps_only_questions_that_identify_their_email(inbox_db, tmp_path):
    from evals.art_e.annotated import IDENTIFY_MAX, _question_words, drop_seen_in, load_annotated
    from evals.art_e.inbox import ENRON_DIR as ENRON

    db = tmp_path / "annotated.db"
    db.write_bytes(inbox_db[0].read_bytes())
    scenarios, report, skipped = load_annotated(ENRON / "enron_annotated.json", db)
    assert 20 <= len(scenarios) <= 120 and report.files == {"enron-annotated": 48}
    assert skipped["asked of several emails, with different answers"] > 300  # "Who received the email?" x 99 ...
    assert skipped["a search with its words does not find its email"] > 0
    assert not any(s.question.lower() in ("who received the email?", "who is mentioned?") for s in scenarios)
    for s in scenarios:
        tools = InboxTools(db, s.inbox_address, s.query_date)
        assert tools.read_email(s.message_ids[0]) is not None and s.how_realistic == 1.0 and s.split == "test"
        # it identifies its email: its words fit at most IDENTIFY_MAX emails of the inbox
        assert len(tools.search_emails(_question_words(s.question), max_results=10)) <= IDENTIFY_MAX
        tools.close()
    # held out from training on Sally Beck's inbox: those whose email she also holds are dropped, the rest kept
    kept, dropped = drop_seen_in(scenarios, db, {SALLY})
    assert dropped >= 1 and len(kept) == len(scenarios) - dropped
    sally = InboxTools(db, SALLY, "2003-01-01")
    try:
        for s in scenarios:
            in_sallys = any(sally.read_email(m) is not None for m in s.message_ids)
            assert in_sallys == (s not in kept), s.id
    finally:
        sally.close()
    assert drop_seen_in(scenarios, db, set()) == (scenarios, 0)
    with pytest.raises(ValueError, match="SQuAD"):
        (tmp_path / "bad.json").write_text('{"nope": 1}')
        load_annotated(tmp_path / "bad.json", db)


def test_arts_hub_rows_are_mapped_where_the_inbox_exists(inbox_db):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    real = tools.search_emails(["budget"])[0]["message_id"]
    rows = [
        {"id": 7, "question": "q1?", "answer": "a", "message_ids": [real], "how_realistic": 0.8,
         "inbox_address": SALLY, "query_date": "2001-12-31"},
        {"id": 8, "question": "q2?", "answer": "a", "message_ids": [real], "how_realistic": 0.8,
         "inbox_address": "someone.else@enron.com", "query_date": "2001-12-31"},
        {"id": 9, "question": "q3?", "answer": "a", "message_ids": ["<not-here@x>"], "how_realistic": 0.8,
         "inbox_address": SALLY, "query_date": "2001-12-31"},
        {"id": 10, "question": "q4?", "answer": "a", "message_ids": [real], "how_realistic": 0.8,
         "inbox_address": SALLY, "query_date": "1999-01-01"},
    ]
    kept, skipped = map_scenarios(hub_records_to_scenarios(rows, "test"), inbox_db[0])
    assert [s.id for s in kept] == ["hub-test-7"]
    assert skipped == {"inbox not in the database": 1, "an email not in that inbox before the query date": 2}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_files_round_trip(generated, tmp_path, suffix):
    scenarios = generated[0][:6]
    assert load_scenarios(save_scenarios(scenarios, tmp_path / f"s{suffix}")) == scenarios


def test_arts_own_format_loads(tmp_path):
    path = tmp_path / "art.parquet"
    pd.DataFrame([{"id": 3, "question": "When?", "answer": "May 1", "message_ids": ["<1@x>"], "how_realistic": 0.7,
                   "inbox_address": "A@Enron.com", "query_date": "2001-05-09", "split": "train"}]).to_parquet(path)
    [s] = load_scenarios(path)
    assert (s.id, s.inbox_address, s.split, s.kind) == ("3", "a@enron.com", "train", None)


@pytest.mark.parametrize("change, says", [
    ({"answer": None}, "answer"), ({"message_ids": []}, "message_ids"), ({"query_date": "May 5"}, "query_date"),
    ({"inbox_address": "beck-s"}, "inbox_address"), ({"how_realistic": 2}, "how_realistic"),
    ({"split": "dev"}, "split"), ({"colour": "red"}, "colour"),
])
def test_bad_scenario_files_name_line_and_field(tmp_path, change, says):
    good = Scenario(id="a", question="q?", answer="x", message_ids=["<1>"], inbox_address="a@b.com",
                    query_date="2001-01-01", how_realistic=0.5)
    bad = {**good.model_dump(), **change}
    bad = {k: v for k, v in bad.items() if v is not None}
    path = tmp_path / "s.jsonl"
    path.write_text(good.model_dump_json() + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=rf"s.jsonl:2: {says}"):
        load_scenarios(path)
    path.write_text(good.model_dump_json() + "\n{oops\n")
    with pytest.raises(ValueError, match="s.jsonl:2: not valid JSON"):
        load_scenarios(path)
    with pytest.raises(FileNotFoundError):
        load_scenarios(tmp_path / "missing.jsonl")


def test_dollar_figures_keep_their_scale_letter():
    """"$1.44m" is a figure of $1,440,000: the generator's reference keeps the "m" (it once wrote "$1.44")."""
    from evals.art_e.questions import FIGURE

    for text, figure in (("the budget was $1.44m for 2001", "$1.44m"), ("a $2.5bn deal", "$2.5bn"),
                         ("paid $40K up front", "$40K"), ("$300 million in bonds", "$300 million"),
                         ("it cost $5 by Friday", "$5")):
        assert FIGURE.search(text).group(0) == figure
