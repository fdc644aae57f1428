"""The ART·E benchmark harness: model specs, shared machine-time pricing, honest accuracy, transcripts, and
`ruler eval art-e` end to end on real mail."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from evals.art_e.harness import (
    ModelSpec,
    SharedMeter,
    compare_runs,
    load_results,
    render_transcript,
    run_benchmark,
    run_cost,
    summarize,
    wilson_interval,
)
from evals.art_e.question_writer import write_questions
from evals.art_e.questions import Scenario, save_scenarios
from evals.art_e.tools import InboxTools
from ruler_rl.cli import app
from ruler_rl.judges import EMBEDDED_JUDGE
from ruler_rl.testing import free_port

SALLY = "sally.beck@enron.com"


def test_model_specs_name_local_endpoints_and_reject_bad_ones():
    spec = ModelSpec.parse("hosted_vllm/smol@http://127.0.0.1:8000/v1")
    assert (spec.model, spec.api_base) == ("hosted_vllm/smol", "http://127.0.0.1:8000/v1")
    assert spec.params() == {"api_base": "http://127.0.0.1:8000/v1", "api_key": "local"}
    assert ModelSpec.parse("openai/o3").params() is None and ModelSpec.parse("openai/o3").hardware is None
    assert ModelSpec.parse(EMBEDDED_JUDGE).hardware == "cpu" and spec.hardware == "gpu"
    assert ModelSpec.parse("vllm-engine//m").hardware == "gpu"
    cpu_server = ModelSpec("hosted_vllm/agent@0", "agent", "http://127.0.0.1:9/v1", extra={"temperature": 0}, on="cpu")
    assert cpu_server.hardware == "cpu" and cpu_server.params()["temperature"] == 0
    with pytest.raises(ValueError):
        _ = ModelSpec("m", "m", on="tpu").hardware
    for bad in ("", "openai/o3@gpu-box", "@http://x/v1", None):
        with pytest.raises(ValueError):
            ModelSpec.parse(bad)


def test_machine_time_is_shared_by_the_runs_in_flight():
    now = [0.0]
    meter = SharedMeter(clock=lambda: now[0])
    a = meter.start()            # t=0: a alone
    now[0] = 10.0
    b = meter.start()            # t=10: a and b share the machine
    now[0] = 20.0
    cost_a = meter.stop(a)       # a: 10 s alone + 10 s shared by two = 15 s
    now[0] = 30.0
    cost_b = meter.stop(b)       # b: 10 s shared + 10 s alone = 15 s
    assert (cost_a, cost_b) == (15.0, 15.0) and cost_a + cost_b == 30.0  # the busy time, not 40 s
    with pytest.raises(RuntimeError):
        meter.stop(0.0)


def test_api_models_use_litellm_prices_and_local_ones_their_share_of_cpu_or_gpu_time():
    cost, how = run_cost("openai/gpt-4o-mini", 1_000_000, 0, 9.0, 3.6, hardware=None)
    assert how == "litellm price" and cost == pytest.approx(0.15, rel=0.01)
    cost, how = run_cost("hosted_vllm/smol", 10**6, 10**6, 9.0, 3.6, hardware="gpu")
    assert how == "GPU time, shared" and cost == pytest.approx(0.009)
    cost, how = run_cost(EMBEDDED_JUDGE, 10**6, 10**6, 36.0, 0.1, hardware="cpu")
    assert how == "CPU time, shared" and cost == pytest.approx(0.001)


def test_summary_of_hand_made_runs():
    rows = [{"model": "a", "error": None, "correct": c, "sources_correct": s, "turns": t, "latency_s": lat,
             "prompt_tokens": 100, "completion_tokens": 10, "cost_usd": 0.002, "priced_by": "litellm price",
             "reward": r, "failed_format_validation": f} for c, s, t, lat, r, f in
            [(True, True, 2, 1.0, 1.4, 0), (False, True, 4, 3.0, -0.6, 0), (True, False, 6, 5.0, 1.1, 1)]]
    df = pd.DataFrame(rows)
    df.attrs.update(wall_s={"a": 6.0}, accuracy_by="match only")
    row = summarize(df).iloc[0]
    assert row["accuracy"] == pytest.approx(2 / 3) and row["sources_correct"] == pytest.approx(2 / 3)
    assert (row["accuracy_low"], row["accuracy_high"]) == pytest.approx(wilson_interval(2, 3))
    assert row["accuracy_low"] < 2 / 3 < row["accuracy_high"] and row["accuracy_by"] == "match only"
    assert row["mean_reward"] == pytest.approx(1.9 / 3) and row["reward_ci95"] > 0 and row["format_failures"] == 1 / 3
    assert row["mean_turns"] == 4 and row["p50_latency_s"] == 3.0 and row["mean_tokens"] == 110
    assert row["cost_per_1000_runs_usd"] == pytest.approx(2.0) and row["runs_per_s"] == 0.5
    assert wilson_interval(0, 10)[0] == 0 and wilson_interval(10, 10)[1] == 1
    with pytest.raises(ValueError):
        summarize(df.iloc[0:0])


def _runs(label, correct, reward):
    return pd.DataFrame([{"model": label, "scenario_id": f"q{i}", "correct": c, "sources_correct": c, "reward": r,
                          "turns": 3, "failed_format_validation": 0} for i, (c, r) in enumerate(zip(correct, reward))])


def test_before_and_after_are_compared_on_the_same_questions_with_a_paired_interval():
    n = 200
    before = _runs("before", [i % 10 == 0 for i in range(n)], [-1.0] * n)          # 10% right
    after = _runs("after", [i % 10 < 4 for i in range(n)], [0.5] * n)              # 40% right
    row = compare_runs(before, after).set_index("measure").loc["correct"]
    assert row["questions"] == n and row["difference"] == pytest.approx(0.3) and 0.2 < row["low"] < 0.3 < row["high"]
    same = compare_runs(before, before).set_index("measure").loc["correct"]
    assert same["difference"] == 0 and same["low"] == same["high"] == 0  # no change, no interval
    noise = _runs("after", [i % 10 == 1 for i in range(n)], [-1.0] * n)            # other questions, same rate
    row = compare_runs(before, noise).set_index("measure").loc["correct"]
    assert row["low"] < 0 < row["high"]  # not beyond noise
    assert compare_runs(before, after.iloc[:50]).set_index("measure").loc["reward", "questions"] == 50
    with pytest.raises(ValueError):
        compare_runs(before, pd.concat([after, after]))


def _scenarios(db, n=2):
    tools = InboxTools(db, SALLY, "2001-12-31")
    hits = tools.search_emails(["budget"], max_results=n)
    return [Scenario(id=f"q{i}", question=f"Who sent budget email {i}?",
                     answer=tools.read_email(h["message_id"])["from_address"], message_ids=[h["message_id"]],
                     inbox_address=SALLY, query_date="2001-12-31", how_realistic=0.5) for i, h in enumerate(hits)]


def _answer(answer, source):
    return {"tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "return_final_answer", "arguments": json.dumps({"answer": answer, "sources": [source]})}}]}


async def test_transcripts_round_trip_through_results_parquet_and_show(judge, inbox_db, tmp_path):
    db = inbox_db[0]
    s1, s2 = _scenarios(db)
    judge.script = [_answer(s1.answer, s1.message_ids[0]), _answer("somebody", s2.message_ids[0])]
    df = await run_benchmark([f"openai/scripted@{judge.base}"], [s1, s2], db, concurrency=1, tool_mode="native",
                             progress=False)
    assert list(df["correct"]) == [True, False] and list(df["matched"]) == [True, False]
    assert df["judged"].isna().all() and df.attrs["accuracy_by"] == "match only"
    summary = summarize(df)
    from evals.art_e.harness import save_benchmark

    save_benchmark(df, summary, tmp_path / "out")
    back = load_results(tmp_path / "out")
    first = back.iloc[0]
    messages = json.loads(first["messages"])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "return_final_answer"
    text = render_transcript(first)
    assert s1.question in text and "return_final_answer" in text and "matched: True" in text
    res = CliRunner().invoke(app, ["eval", "art-e", "--out", str(tmp_path / "out"), "--show", first["run_id"]])
    assert res.exit_code == 0 and s1.question in res.output and "final answer recorded" in res.output
    res = CliRunner().invoke(app, ["eval", "art-e", "--out", str(tmp_path / "out"), "--show", "nope"])
    assert res.exit_code == 2 and "no run 'nope'" in res.output


async def test_a_failing_judge_or_model_is_a_row_that_says_so_and_the_others_go_on(judge, inbox_db):
    db = inbox_db[0]
    s1, s2 = _scenarios(db)
    judge.script = [_answer("the finance person", s1.message_ids[0]), "400", _answer(s2.answer, s2.message_ids[0])]
    df = await run_benchmark([f"openai/scripted@{judge.base}"], [s1, s2], db, concurrency=1, tool_mode="native",
                             judge_model="openai/fake-judge", judge_params=judge.params, progress=False)
    bad, good = df.iloc[0], df.iloc[1]
    assert bad["error"].startswith("correctness judge") and not bad["correct"] and pd.isna(bad["reward"])
    assert pd.isna(good["error"]) and good["correct"] and good["reward"] > 1
    assert summarize(df).iloc[0]["errors"] == 1  # (a model that is down: test_harness_end_to_end_on_three_questions)


async def test_tool_choice_and_idk_reward_reach_the_runs_and_the_summary(judge, inbox_db, tmp_path):
    db = inbox_db[0]
    s1, s2 = _scenarios(db)
    search = {"tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "search_emails",
        "arguments": json.dumps({"keywords": ["budget"], "sent_before": "next Thursday-ish"})}}]}
    judge.script = [search, _answer("I don't know", s1.message_ids[0]), _answer(s2.answer, s2.message_ids[0])]
    df = await run_benchmark([f"openai/scripted@{judge.base}"], [s1, s2], db, concurrency=1, tool_mode="native",
                             idk_reward=-1, progress=False)
    assert [r["tool_choice"] for r in judge.requests] == ["required"] * 3  # the default, ART's for prompted models
    assert [r["parallel_tool_calls"] for r in judge.requests] == [False] * 3  # one call per turn, asked for
    idk, right = df.iloc[0], df.iloc[1]
    assert idk["returned_i_dont_know"] == 1 and idk["unreadable_dates"] == 1 and idk["turns"] == 2
    assert idk["reward"] == pytest.approx(-1 + 0.1) and right["correct"] and right["unreadable_dates"] == 0
    row = summarize(df).iloc[0]
    assert row["idk_reward"] == -1 and row["tool_choice"] == "required" and row["unreadable_dates"] == 1
    from evals.art_e.harness import save_benchmark

    save_benchmark(df, summarize(df), tmp_path / "out")  # what the table says survives its parquet file
    assert summarize(load_results(tmp_path / "out")).iloc[0][["idk_reward", "tool_choice"]].tolist() == [-1, "required"]
    judge.reset()
    judge.script = [_answer(s1.answer, s1.message_ids[0])]
    df = await run_benchmark([f"openai/scripted@{judge.base}"], [s1], db, tool_mode="native", tool_choice="auto",
                             progress=False)
    assert judge.requests[0]["tool_choice"] == "auto" and summarize(df).iloc[0]["idk_reward"] == 0
    assert summarize(df).iloc[0]["tool_choice"] == "auto"
    judge.reset()
    judge.script = [{"content": json.dumps({"tool_name": "return_final_answer",
                                            "tool_args": {"answer": s1.answer, "sources": []}})}]
    df = await run_benchmark([f"openai/scripted@{judge.base}"], [s1], db, tool_mode="text", progress=False)
    assert "tool_choice" not in judge.requests[0] and summarize(df).iloc[0]["tool_choice"] == ""  # none was sent
    with pytest.raises(ValueError, match="tool_choice"):
        await run_benchmark(["openai/x"], [s1], db, tool_choice="sometimes")
    with pytest.raises(ValueError, match="idk_reward"):
        await run_benchmark(["openai/x"], [s1], db, idk_reward=-2)
    for flag, value in (("--tool-choice", "sometimes"), ("--idk-reward", "-0.5")):
        res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), flag, value])
        assert res.exit_code == 2 and flag in res.output


async def test_the_embedded_model_is_never_the_correctness_judge(inbox_db):
    with pytest.raises(ValueError, match="near chance"):
        await run_benchmark(["openai/x"], _scenarios(inbox_db[0]), inbox_db[0], judge_model=EMBEDDED_JUDGE)
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(inbox_db[0]), "--judge", EMBEDDED_JUDGE])
    assert res.exit_code == 2 and "near chance" in res.output


@pytest.mark.slow
def test_harness_end_to_end_on_three_questions(inbox_db, embedded_model, tmp_path):
    db, _ = inbox_db
    down = f"openai/nothing@http://127.0.0.1:{free_port()}/v1"  # a server that is not there: error rows
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), "--questions", "3", "--max-turns", "2",
                                   "--model", EMBEDDED_JUDGE, "--model", down, "--out", str(tmp_path / "out")],
                             env={"OPENAI_API_KEY": "sk-test"})
    assert res.exit_code == 0, res.output
    assert "accuracy" in res.output and "match only" in res.output
    df = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(df) == 6 and set(df["model"]) == {EMBEDDED_JUDGE, down}
    assert len({frozenset(g) for _, g in df.groupby("model")["scenario_id"]}) == 1  # same questions for both
    mine = df[df["model"] == EMBEDDED_JUDGE]
    assert mine["error"].isna().all() and (mine["turns"].between(1, 2)).all() and (mine["prompt_tokens"] > 0).all()
    assert (mine["priced_by"] == "CPU time, shared").all() and mine["messages"].str.startswith("[").all()
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
    bad = tmp_path / "s.jsonl"
    bad.write_text('{"id": "a", "question": "q"}\n')
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), "--scenarios", str(bad)])
    assert res.exit_code == 2 and "s.jsonl:1" in res.output
    elsewhere = tmp_path / "elsewhere.jsonl"
    save_scenarios([Scenario(id="x", question="q?", answer="a", message_ids=["<1@x>"],
                             inbox_address="someone@else.com", query_date="2001-01-01", how_realistic=1)], elsewhere)
    res = CliRunner().invoke(app, ["eval", "art-e", "--db", str(db), "--scenarios", str(elsewhere)])
    assert res.exit_code == 2 and "1 inbox not in the database" in res.output and "no test questions" in res.output
    res = CliRunner().invoke(app, ["eval", "art-e", "--out", str(tmp_path / "empty"), "--show", "abc"])
    assert res.exit_code == 2 and "no results table" in res.output


@pytest.mark.slow
async def test_question_writer_cites_only_emails_it_was_shown(inbox_db, embedded_model):
    db, _ = inbox_db
    scenarios, report = await write_questions(db, EMBEDDED_JUDGE, inbox="beck-s", batch_size=3, per_batch=2,
                                              body_chars=300, seed=1)
    assert report.batches == 1 and report.written == len(scenarios)
    assert 1 <= report.written + sum(report.dropped.values()) <= 2  # the schema allows per_batch questions
    import sqlite3

    con = sqlite3.connect(db)
    for s in scenarios:
        assert s.kind == "llm" and s.inbox_address == SALLY and s.question and s.answer
        dates = [con.execute("SELECT date FROM emails WHERE message_id = ?", (m,)).fetchone()[0] for m in s.message_ids]
        assert all(d[:10] < s.query_date for d in dates)
    with pytest.raises(ValueError, match="not in"):
        await write_questions(db, EMBEDDED_JUDGE, inbox="nobody")
