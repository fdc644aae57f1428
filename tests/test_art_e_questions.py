"""ART·E scenarios: the offline generator's answers verified against the real database; files."""

import json

import pytest

from evals.art_e.questions import Scenario, generate_scenarios, load_scenarios, save_scenarios, verify_scenario


def test_generated_answers_are_verified_against_the_database(inbox_db):
    db, _ = inbox_db
    scenarios = generate_scenarios(db, per_inbox=40, seed=1)
    assert len(scenarios) == 40 and {s.kind for s in scenarios} >= {"sender", "date", "subject"}
    assert all(verify_scenario(db, s) for s in scenarios)
    assert all(s.inbox_address == "sally.beck@enron.com" and s.query_date >= "1999" for s in scenarios)
    assert generate_scenarios(db, per_inbox=40, seed=1) == scenarios  # deterministic given the seed


def test_splits_are_by_inbox(inbox_db):
    db, _ = inbox_db
    assert {s.split for s in generate_scenarios(db, per_inbox=5, test_inboxes=["beck-s"])} == {"test"}
    assert {s.split for s in generate_scenarios(db, per_inbox=5, test_inboxes=[])} == {"train"}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_files_round_trip(inbox_db, tmp_path, suffix):
    scenarios = generate_scenarios(inbox_db[0], per_inbox=6)
    assert load_scenarios(save_scenarios(scenarios, tmp_path / f"s{suffix}")) == scenarios


def test_bad_scenario_files_name_line_and_field(tmp_path):
    good = Scenario(id="a", question="q?", answer="x", message_ids=["<1>"], inbox_address="a@b",
                    query_date="2001-01-01", how_realistic=0.5)
    path = tmp_path / "s.jsonl"
    bad = good.model_dump()
    del bad["answer"]
    path.write_text(good.model_dump_json() + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"s.jsonl:2: answer"):
        load_scenarios(path)
    path.write_text(good.model_dump_json() + "\n{oops\n")
    with pytest.raises(ValueError, match="s.jsonl:2: not valid JSON"):
        load_scenarios(path)


def test_human_written_annotated_set_is_usable(tmp_path):
    from conftest import ENRON

    from evals.art_e.annotated import INBOX, load_annotated
    from evals.art_e.tools import InboxTools

    db = tmp_path / "annotated.db"
    scenarios, report, skipped = load_annotated(ENRON / "enron_annotated.json", db)
    assert report.inboxes[INBOX] >= 40 and len(scenarios) > 400 and skipped > 50
    tools = InboxTools(db, INBOX)
    emails = [tools.read_email(s.message_ids[0]) for s in scenarios]
    assert all("error" not in e for e in emails)
    visible = sum(s.answer in "\n".join(str(v) for v in e.values()) for s, e in zip(scenarios, emails))
    assert visible / len(scenarios) > 0.7  # the rest quote X-From/X-To display names, not stored as fields
