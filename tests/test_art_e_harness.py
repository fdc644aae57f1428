"""The ART·E benchmark harness: model specs, pricing, and `ruler eval art-e` end to end on real mail."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from evals.art_e.harness import ModelSpec, contains_reference, run_cost, summarize
from evals.art_e.question_writer import write_questions
from evals.cli import app
from judges import EMBEDDED_JUDGE
from ruler.testing import free_port


def test_model_specs_name_local_endpoints_and_reject_bad_ones():
    spec = ModelSpec.parse("hosted_vllm/smol@http://127.0.0.1:8000/v1")
    assert (spec.model, spec.api_base) == ("hosted_vllm/smol", "http://127.0.0.1:8000/v1")
    assert spec.params() == {"api_base": "http://127.0.0.1:8000/v1", "api_key": "local"}
    assert ModelSpec.parse("openai/o3").params() is None and not ModelSpec.parse("openai/o3").local
    assert ModelSpec.parse(EMBEDDED_JUDGE).embedded and ModelSpec.parse("vllm-engine//m").local and spec.local
    for bad in ("", "openai/o3@gpu-box", "@http://x/v1", None):
        with pytest.raises(ValueError):
            ModelSpec.parse(bad)


def test_correct_without_a_judge_only_when_the_reference_is_in_the_answer():
    assert contains_reference("It was  Sally.Beck@enron.com, on Monday", "sally.beck@enron.com")
    assert not contains_reference("I don't know", "i don't know")
    assert not contains_reference(None, "x") and not contains_reference("Sally", "sally.beck@enron.com")


def test_api_models_use_litellm_prices_and_local_ones_gpu_seconds():
    cost, how = run_cost("openai/gpt-4o-mini", 1_000_000, 0, 9.0, 3.6, local=False)
    assert how == "litellm price" and cost == pytest.approx(0.15, rel=0.01)
    cost, how = run_cost("hosted_vllm/smol", 10**6, 10**6, 9.0, 3.6, local=True)
    assert how == "GPU seconds" and cost == pytest.approx(0.009)


def test_summary_of_hand_made_runs():
    rows = [{"model": "a", "error": None, "correct": c, "sources_correct": s, "turns": t, "latency_s": lat,
             "prompt_tokens": 100, "completion_tokens": 10, "cost_usd": 0.002, "priced_by": "litellm price",
             "reward": 1.0} for c, s, t, lat in [(True, True, 2, 1.0), (False, True, 4, 3.0), (True, False, 6, 5.0)]]
    df = pd.DataFrame(rows)
    df.attrs["wall_s"] = {"a": 6.0}
    row = summarize(df).iloc[0]
    assert row["accuracy"] == pytest.approx(2 / 3) and row["sources_correct"] == pytest.approx(2 / 3)
    assert row["mean_turns"] == 4 and row["p50_latency_s"] == 3.0 and row["mean_tokens"] == 110
    assert row["cost_per_1000_runs_usd"] == pytest.approx(2.0) and row["runs_per_s"] == 0.5
    with pytest.raises(ValueError):
        summarize(df.iloc[0:0])


@pytest.mark.slow
def test_harness_end_to_end_on_three_questions(inbox_db, embedded_model, tmp_path):
    db, _ = inbox_db
    down = f"openai/nothing@http://127.0.0.1:{free_port()}/v1"  # a server that is not there: error rows
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), "--questions", "3", "--max-turns", "2",
                                   "--model", EMBEDDED_JUDGE, "--model", down, "--judge", EMBEDDED_JUDGE,
                                   "--out", str(tmp_path / "out")], env={"OPENAI_API_KEY": "sk-test"})
    assert res.exit_code == 0, res.output
    assert "accuracy" in res.output and "p95_latency_s" in res.output
    df = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(df) == 6 and set(df["model"]) == {EMBEDDED_JUDGE, down}
    assert len({frozenset(g) for _, g in df.groupby("model")["scenario_id"]}) == 1  # same questions for both
    mine = df[df["model"] == EMBEDDED_JUDGE]
    assert mine["error"].isna().all() and (mine["turns"].between(1, 2)).all() and (mine["prompt_tokens"] > 0).all()
    assert df[df["model"] == down]["error"].str.contains("nothing").all()
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(summary["errors"]) == [0, 3] and summary["runs"].tolist() == [3, 3]
    assert (tmp_path / "out" / "summary.png").stat().st_size > 10_000


def test_harness_reports_bad_options_clearly(inbox_db, tmp_path):
    db, _ = inbox_db
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), "--split", "dev"])
    assert res.exit_code == 2 and "--split" in res.output
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(tmp_path / "none.db"), "--mailbox",
                                   str(tmp_path / "missing.tar.gz")])
    assert res.exit_code == 2 and "missing.tar.gz" in res.output


@pytest.mark.slow
async def test_question_writer_cites_only_emails_it_was_shown(inbox_db, embedded_model):
    db, _ = inbox_db
    scenarios, report = await write_questions(db, EMBEDDED_JUDGE, inbox="beck-s", batch_size=3, per_batch=2,
                                              body_chars=300, seed=1)
    assert report.batches == 1 and report.written == len(scenarios) and report.written + sum(report.dropped.values()) >= 1
    import sqlite3

    con = sqlite3.connect(db)
    for s in scenarios:
        assert s.kind == "llm" and s.inbox == "beck-s" and s.question and s.answer
        dates = [con.execute("SELECT date FROM emails WHERE message_id = ?", (m,)).fetchone()[0] for m in s.message_ids]
        assert all(d[:10] <= s.query_date for d in dates)
    with pytest.raises(ValueError, match="not in"):
        await write_questions(db, EMBEDDED_JUDGE, inbox="nobody")
