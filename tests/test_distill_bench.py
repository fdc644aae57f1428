"""evals.distill_bench's sampling and report plumbing, against the scripted judge server on loopback."""

import json
import time

import pytest

from evals.art_e.questions import Scenario, save_scenarios
from evals.art_e.tools import InboxTools
from evals.distill_bench import (
    _Phases,
    gpu_bench,
    room_after_grpo,
    room_after_sft,
    run_within_budget,
    sample_groups,
    write_report,
)

SALLY = "sally.beck@enron.com"


@pytest.fixture
def scenario_file(inbox_db, tmp_path):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    hit = tools.search_emails(["budget", "review"])[0]["message_id"]
    sender = tools.read_email(hit)["from_address"]
    tools.close()
    sc = Scenario(id="s1", question="Who sent the budget review?", answer=sender, message_ids=[hit],
                  inbox_address=SALLY, query_date="2001-12-31", how_realistic=0.5, split="train")
    return save_scenarios([sc], tmp_path / "scenarios.jsonl"), sc


def _text_answer(answer: str, source: str) -> dict:
    return {"content": json.dumps({"tool_name": "return_final_answer",
                                   "tool_args": {"answer": answer, "sources": [source]}})}


async def test_sample_groups_text_mode_keeps_a_group_whose_rewards_differ(judge, inbox_db, scenario_file, tmp_path):
    path, sc = scenario_file
    judge.script = [_text_answer(sc.answer, sc.message_ids[0]), _text_answer("I don't know", sc.message_ids[0])]
    out = tmp_path / "train.jsonl"
    got = await sample_groups(policy="openai/scripted", params={"api_base": judge.base, "api_key": "sk-test"},
                              db=inbox_db[0], scenarios=path, split="train", groups=1, group_size=2, max_turns=3,
                              temperature=1.0, seed=0, out=out, concurrency=1, tool_mode="text")
    assert got["groups"] == 1 and got["failed"] == 0
    row = json.loads(out.read_text().splitlines()[0])
    assert row["metadata"] == {"scenario": "s1", "inbox": SALLY, "split": "train"}
    rewards = sorted(t["reward"] for t in row["trajectories"])
    assert rewards[0] < rewards[1] and rewards[1] > 1.0  # the right answer, cited, beats "I don't know"
    assert "response_format" in judge.requests[0] and "tools" not in judge.requests[0]


async def test_sample_groups_drops_a_refused_group_and_starts_none_after_the_deadline(judge, inbox_db, scenario_file,
                                                                                     tmp_path):
    path, _sc = scenario_file
    judge.script = ["400", "400"]
    common = {"policy": "openai/scripted", "params": {"api_base": judge.base, "api_key": "sk-test"}, "db": inbox_db[0],
                  "scenarios": path, "split": "train", "groups": 1, "group_size": 2, "max_turns": 3, "temperature": 1.0, "seed": 0,
                  "concurrency": 1, "tool_mode": "text"}
    got = await sample_groups(out=tmp_path / "a.jsonl", **common)
    assert (got["groups"], got["failed"]) == (0, 1) and got["errors"]
    assert (tmp_path / "a.jsonl").read_text() == ""
    judge.reset()
    got = await sample_groups(out=tmp_path / "b.jsonl", deadline=time.perf_counter() - 1, **common)
    assert (got["groups"], got["not_started"]) == (0, 1) and judge.requests == []


async def _five_judged_groups(cache, judge):
    """A judge cache holding the scripted judge's verdicts on five groups of two (GOOD above BAD)."""
    from ruler_rl.scoring import ruler_result
    from tests.helpers import convo

    for topic in ("tea", "rain", "maps", "bees", "salt"):
        await ruler_result([convo(f"GOOD {topic}"), convo(f"BAD {topic}")], "openai/fake-judge", judge.params,
                           cache=str(cache))
    return cache


def test_write_report_keeps_what_was_measured(tmp_path):
    row = {"pairwise_accuracy": 0.5, "kendall_tau": 0.25, "ties": 0.125, "pairs": 8, "errors": 1}
    write_report(tmp_path, {"command": "x", "untrained": row, "phases": {"serve": 1.0}, "error": "TimeoutError: t"})
    readme = (tmp_path / "README.md").read_text()
    assert "| untrained | 0.500 | 0.250 | 0.125 | 8 | 1 |" in readme and "| distilled (SFT) |" not in readme
    assert "serve 1.0" in readme and "TimeoutError" in readme
    assert json.loads((tmp_path / "report.json").read_text())["untrained"] == row


async def test_the_budgets_end_is_reported_with_its_phase_and_what_was_measured_kept(tmp_path):
    import asyncio

    ph = _Phases(0.5)
    report = {"command": "x", "phases": ph.seconds}
    reached = []

    async def work():
        t = ph.begin("serve")
        ph.done("serve", t)
        report["untrained"] = {"pairwise_accuracy": 0.5, "kendall_tau": 0.25, "ties": 0.125, "pairs": 8, "errors": 0}
        ph.begin("sample")
        await asyncio.sleep(30)  # the budget ends here
        reached.append("after")

    started = time.perf_counter()
    await run_within_budget(ph, report, work)
    assert time.perf_counter() - started < 5 and reached == []
    assert report["error"] == "budget of 0.5 s reached during phase sample"
    write_report(tmp_path, report)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["error"] == "budget of 0.5 s reached during phase sample" and "serve" in saved["phases"]
    readme = (tmp_path / "README.md").read_text()
    assert "Stopped by an error: `budget of 0.5 s reached during phase sample`" in readme
    assert "| untrained | 0.500 |" in readme and "TimeoutError" not in readme

    # a failure that is not the budget keeps its class and message; a TimeoutError of its own is not the budget
    for exc, said in ((RuntimeError("no graded groups"), "RuntimeError: no graded groups"),
                      (TimeoutError("server did not start"), "TimeoutError: server did not start")):
        async def fail(exc=exc):
            ph.begin("serve")
            raise exc

        report = {}
        await run_within_budget(_Phases(60), report, fail)
        assert report["error"] == said

    async def cancelled():
        raise asyncio.CancelledError

    report = {}
    with pytest.raises(asyncio.CancelledError):
        await run_within_budget(_Phases(60), report, cancelled)
    assert report["error"].startswith("cancelled")


async def test_gpu_bench_refuses_a_data_folder_without_the_inbox(tmp_path):
    with pytest.raises(FileNotFoundError, match="inbox.db"):
        await gpu_bench(data=tmp_path, out=tmp_path / "out", dry_run=True)


@pytest.mark.slow  # ~20 s: reads mailboxes
def test_data_folder_is_made_from_mailboxes_split_by_inbox_and_never_overwritten(tmp_path):
    from evals.art_e.inbox import ENRON_DIR
    from evals.art_e.questions import load_scenarios
    from evals.distill_bench import make_data

    out = tmp_path / "data"
    counts = make_data(out, mailboxes=[ENRON_DIR / "beck-s.tar.gz", ENRON_DIR / "lokay-m.tar.gz"],
                       test_inboxes=["sally.beck@enron.com"], per_inbox=20, llmbar_root=tmp_path / "none")
    scenarios = load_scenarios(out / "scenarios.jsonl")
    assert {s.inbox_address for s in scenarios if s.split == "test"} == {"sally.beck@enron.com"}
    assert {s.inbox_address for s in scenarios if s.split == "train"} == {"michelle.lokay@enron.com"}
    assert counts["test"] == sum(s.split == "test" for s in scenarios) > 0 and counts["train"] > 0
    assert (out / "inbox.db").is_file() and not (out / "judge-meta").exists() and counts["llmbar"] is False
    with pytest.raises(FileExistsError):
        make_data(out, mailboxes=[ENRON_DIR / "beck-s.tar.gz"])


async def test_gpu_bench_with_a_judge_as_teacher_refuses_what_it_cannot_use(tmp_path):
    with pytest.raises(ValueError, match="give data"):
        await gpu_bench(data=None, out=tmp_path / "out", dry_run=True)
    with pytest.raises(FileNotFoundError, match="teacher_cache"):
        await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=tmp_path / "no",
                        dry_run=True)
    for bad in ({"holdout": 1.0}, {"llmbar_sets": "llmbar-natural"}, {"llmbar_sets": ("pandalm",)}):
        with pytest.raises(ValueError):
            await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=tmp_path,
                            dry_run=True, **bad)
    from evals.distill_bench import main

    for argv in (["gpu", "--out", str(tmp_path)], ["gpu", "--out", str(tmp_path), "--data", str(tmp_path),
                                                   "--teacher", "x/y"],
                 ["gpu", "--out", str(tmp_path), "--data", str(tmp_path), "--since", "2026-12-01"],
                 ["gpu", "--out", str(tmp_path), "--teacher", "x/y", "--teacher-cache", str(tmp_path),
                  "--since", "yesterday"],
                 ["gpu", "--out", str(tmp_path), "--data", str(tmp_path), "--grpo-steps", "2"],
                 ["gpu", "--out", str(tmp_path), "--teacher", "x/y", "--teacher-cache", str(tmp_path),
                  "--since", "2026-12-02", "--until", "2026-12-01"]):
        with pytest.raises(SystemExit):
            main(argv)


@pytest.mark.slow  # ~2 min: two SFT steps, one GRPO step, held-out prompts judged by three students on the CPU
async def test_gpu_bench_distils_a_judges_cached_judgments_and_pairs_the_two_students(tmp_path, judge):
    """Table 2 of evals/reports/judges: the teacher is a judge (here the scripted one, by its GOOD/OK/BAD markers),
    its judgments read from the judge cache between --since and --until, split by group; nothing is sampled. SFT,
    then GRPO from the SFT adapter, each student paired against the untrained one."""
    import asyncio
    from datetime import UTC, datetime

    from ruler_rl.scoring import ruler_result
    from tests.helpers import convo

    cache = tmp_path / "cache"
    await ruler_result([convo("GOOD early"), convo("BAD early")], "openai/fake-judge", judge.params, cache=str(cache))
    since = datetime.now(UTC)
    for topic in ("tea", "rain", "maps", "bees", "salt"):
        await ruler_result([convo(f"GOOD {topic}"), convo(f"BAD {topic}")], "openai/fake-judge", judge.params,
                           cache=str(cache))
    await asyncio.sleep(0.01)
    until = datetime.now(UTC)
    await ruler_result([convo("GOOD late"), convo("BAD late")], "openai/fake-judge", judge.params, cache=str(cache))
    report = await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=cache,
                             since=since, until=until, holdout=0.4, dry_run=True, steps=2, batch_size=2,
                             llmbar_limit=0, budget_s=900, judge_dir=tmp_path / "judge", grpo_steps=1,
                             grpo_group_size=2)
    assert "error" not in report, report.get("error")
    assert report["sft_steps"] == 2 and "sft_stopped" not in report  # the budget had room for every step
    assert report["teacher"]["usable"] == 5 and report["teacher"]["groups"] == 5  # the early and late ones left out
    assert report["teacher"]["heldout_groups"] == 2 and report["test_prompts"] == 2 and report["train_prompts"] == 3
    assert "sample" not in report
    paired = report["paired"]
    assert paired["pairs"] == 2 and paired["groups"] == 2  # one teacher-ordered pair in each held-out group
    assert paired["difference"] == pytest.approx(paired["after"] - paired["before"])
    # GRPO ran one step from the SFT adapter (the run resumed at step 1: its trained step is step 2) and its
    # student was measured on the same held-out pairs, against the untrained student and against the SFT one
    assert report["grpo_steps"] == 1 and report["grpo_history"][0]["step"] == 2
    assert len(report["grpo_history"][0]["group_rewards"]) == 2  # batch_size prompts, grpo_group_size answers each
    assert all(len(r) == 2 for r in report["grpo_history"][0]["group_rewards"])
    grpo = report["sft_grpo"]
    assert grpo["prompts"] == 2 and grpo["judge"].endswith("judge-grpo")  # the GRPO judge, not the SFT adapter
    assert report["paired_grpo"]["before"] == pytest.approx(paired["before"])
    assert report["paired_grpo_sft"]["before"] == pytest.approx(paired["after"])
    # the judge written is GRPO's last checkpoint: the SFT adapter's weights moved if the step trained, else equal
    grpo_weights = (tmp_path / "judge-grpo" / "adapter_model.safetensors").read_bytes()
    sft_weights = (tmp_path / "judge" / "adapter_model.safetensors").read_bytes()
    assert (grpo_weights != sft_weights) == bool(report["grpo_steps_trained"])
    assert (tmp_path / "out" / "grpo-run" / "grpo" / "student" / "history.jsonl").is_file()  # the run's log kept
    readme = (tmp_path / "out" / "README.md").read_text()
    assert readme.startswith("# Distilled judge vs openai/fake-judge")
    assert "| SFT+GRPO (1 GRPO steps" in readme and "SFT+GRPO minus SFT" in readme


def test_the_sft_leaves_room_for_each_later_students_measure_as_long_as_the_untrained_ones():
    """2026-12-08: the SFT student's measure of 485 held-out prompts had not ended after 146 s, where the bench kept
    a fixed 40 s for it. The room grows with the untrained student's measured time (a quarter more), once per later
    student (two with GRPO), 45 s a student on each LLMBar set, never below the 40-s floor."""
    plain = {"grpo_steps": 0, "grpo_budget_s": 250, "llmbar_sets": ("llmbar-natural",), "llmbar_limit": 0}
    assert room_after_sft(10, **plain) == 40 and room_after_sft(142, **plain) == 177.5
    grpo = {**plain, "grpo_steps": 80}
    assert room_after_sft(142, **grpo) == 2 * 177.5 + 250 + 30
    bars = {**grpo, "llmbar_limit": 100, "llmbar_sets": ("llmbar-natural", "llmbar-mtbench")}
    assert room_after_sft(142, **bars) == 2 * 177.5 + 250 + 30 + 2 * 3 * 45
    assert room_after_sft(142, **{**bars, "grpo_steps": 0}) == 177.5 + 2 * 2 * 45
    # GRPO leaves its own student's measure and the three students' LLMBar sets
    assert room_after_grpo(142, llmbar_sets=bars["llmbar_sets"], llmbar_limit=100) == 177.5 + 2 * 3 * 45
    assert room_after_grpo(10, llmbar_sets=bars["llmbar_sets"], llmbar_limit=0) == 40


def test_sft_stopped_by_the_budget_is_written_in_the_readme(tmp_path):
    write_report(tmp_path, {"command": "x", "sft_stopped": "by the budget after 1 of 300 steps, keeping 430 s"})
    assert "SFT stopped by the budget after 1 of 300 steps" in (tmp_path / "README.md").read_text()


async def test_gpu_bench_refuses_grpo_without_a_teacher_or_with_bad_sizes(tmp_path):
    for bad, says in (({"grpo_steps": -1}, "grpo_steps"), ({"grpo_steps": 1.5}, "grpo_steps"),
                      ({"grpo_steps": 1, "grpo_group_size": 1}, "grpo_group_size"),
                      ({"grpo_steps": 1, "grpo_budget_s": 10}, "grpo_budget_s"),
                      ({"grpo_steps": 1, "grpo_lr": 0}, "grpo_lr"), ({"max_eval": 0}, "max_eval"),
                      ({"max_eval": 2.5}, "max_eval"), ({"max_eval": True}, "max_eval")):
        with pytest.raises(ValueError, match=says):
            await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=tmp_path,
                            dry_run=True, **bad)
    (tmp_path / "data").mkdir()
    for f in ("inbox.db", "scenarios.jsonl"):
        (tmp_path / "data" / f).write_text("")
    with pytest.raises(ValueError, match="needs a teacher"):
        await gpu_bench(data=tmp_path / "data", out=tmp_path / "out", dry_run=True, grpo_steps=1)


@pytest.mark.slow  # ~1 min: two SFT steps and the held-out prompts judged by the embedded model on the CPU
async def test_a_failed_grpo_stage_is_recorded_and_the_two_students_measures_kept(tmp_path, judge, monkeypatch):
    """GRPO is the last training stage of table 2's run: its failure (here its engine refusing to start) must not
    lose the SFT student's measure, and is written in the report."""
    import ruler_rl.trainer.distill_cli

    async def broken(*a, **k):
        raise RuntimeError("the GRPO engine did not start")

    monkeypatch.setattr(ruler_rl.trainer.distill_cli, "grpo_stage", broken)
    cache = await _five_judged_groups(tmp_path / "cache", judge)
    report = await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=cache,
                             holdout=0.4, dry_run=True, steps=2, batch_size=2, llmbar_limit=0, budget_s=900,
                             judge_dir=tmp_path / "judge", grpo_steps=3)
    assert "error" not in report, report.get("error")
    assert report["grpo_error"] == "RuntimeError: the GRPO engine did not start"
    assert report["distilled"]["prompts"] == 2 and "paired" in report and "sft_grpo" not in report
    assert "GRPO failed: `RuntimeError: the GRPO engine did not start`" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.slow  # ~1 min: the embedded model judges held-out prompts and trains one SFT step on the CPU
async def test_the_budget_stops_the_sft_saying_so_and_max_eval_keeps_whole_groups(tmp_path, judge, monkeypatch):
    """The SFT stops when what is left of the budget falls below `room_after_sft` of the untrained student's
    measured time (here a room that leaves it one step), recorded and said; `max_eval` measures whole groups."""
    import evals.distill_bench

    seen = []

    def room(eval_s, **kwargs):
        seen.append(eval_s)
        return 899.0  # of a 900-s budget: the SFT stops after its first step

    monkeypatch.setattr(evals.distill_bench, "room_after_sft", room)
    cache = await _five_judged_groups(tmp_path / "cache", judge)
    report = await gpu_bench(data=None, out=tmp_path / "out", teacher="openai/fake-judge", teacher_cache=cache,
                             holdout=0.4, dry_run=True, steps=50, batch_size=1, llmbar_limit=0, budget_s=900,
                             judge_dir=tmp_path / "judge", max_eval=1)
    assert "error" not in report, report.get("error")
    assert report["heldout_prompts"] == 2 and report["test_prompts"] == 1  # one of the two held-out groups
    assert report["untrained"]["prompts"] == 1 and report["distilled"]["prompts"] == 1
    assert report["sft_steps"] == 1 and report["sft_steps_asked"] == 50
    assert report["sft_stopped"].startswith("by the budget after 1 of 50 steps")
    assert "SFT stopped by the budget after 1 of 50 steps" in (tmp_path / "out" / "README.md").read_text()
    # the room was asked with the untrained student's measured time (a dry run measures it before the SFT)
    assert seen and seen[0] == pytest.approx(report["phases"]["eval_untrained"], abs=0.5)
