"""examples/email_agent.py on the CPU (embedded SmolLM2-135M): --time-budget-s stops the training loop but not the
measurement after it, and run.json says how many steps ran; bad arguments are refused by name."""

import importlib.util
import json

import pytest

pytestmark = pytest.mark.slow


def load_example():
    spec = importlib.util.spec_from_file_location("email_agent", "examples/email_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_arguments_are_refused():
    example = load_example()
    for argv in (["--time-budget-s", "0"], ["--steps", "-1"], ["--reward", "art", "--judge", "x/y"],
                 ["--reward", "ruler", "--judge-max-prompt-tokens", "10"],
                 ["--reward", "ruler", "--judge", "self", "--engine", "transformers"],
                 ["--tool-choice", "sometimes"], ["--idk-reward", "0.5"], ["--idk-reward", "-2"],
                 ["--sender-per-inbox", "-1"]):
        with pytest.raises(SystemExit):
            example.parse_args(argv)
    args = example.parse_args([])
    assert (args.tool_choice, args.idk_reward) == ("auto", 0.0)  # the trained policy: auto, ART·E's original 0
    args = example.parse_args(["--tool-choice", "required", "--idk-reward", "-1"])
    assert (args.tool_choice, args.idk_reward) == ("required", -1.0)
    assert example.parse_args([]).sender_per_inbox == 100
    assert example.parse_args(["--sender-per-inbox", "0"]).sender_per_inbox == 0


async def test_a_spent_time_budget_skips_training_and_still_measures(tmp_path):
    from evals.art_e.inbox import ENRON_DIR

    example = load_example()
    report = tmp_path / "report"
    await example.main(["--steps", "3", "--groups-per-step", "1", "--group-size", "2", "--max-turns", "1",
                        "--max-tokens", "16", "--eval-questions", "1", "--per-inbox", "4", "--engine", "transformers",
                        "--tool-mode", "text", "--mailbox", str(ENRON_DIR / "beck-s.tar.gz"),
                        str(ENRON_DIR / "farmer-d.tar.gz"), "--db", str(tmp_path / "inbox.db"), "--out",
                        str(tmp_path / "runs"), "--report", str(report), "--test-inboxes", "daren.farmer@enron.com",
                        "--time-budget-s", "0.001", "--idk-reward", "-1"])
    run = json.loads((report / "run.json").read_text())
    import pandas as pd

    assert pd.read_csv(report / "summary.csv")["idk_reward"].tolist() == [-1, -1]  # reported with the run
    assert run["steps_run"] == 0 and run["policy_step"] == 0 and run["time_budget_s"] == 0.001
    assert (report / "before.parquet").is_file() and (report / "after.parquet").is_file()


async def test_eval_every_writes_a_held_out_measure_between_steps(tmp_path):
    from evals.art_e.inbox import ENRON_DIR
    from evals.art_e.learning import latest_eval, load_run

    example = load_example()
    with pytest.raises(SystemExit):
        example.parse_args(["--eval-every", "-1"])
    report = tmp_path / "report"
    await example.main(["--steps", "2", "--eval-every", "1", "--groups-per-step", "1", "--group-size", "2",
                        "--max-turns", "1", "--max-tokens", "16", "--eval-questions", "1", "--per-inbox", "4",
                        "--engine", "transformers", "--tool-mode", "text", "--mailbox", str(ENRON_DIR / "beck-s.tar.gz"),
                        str(ENRON_DIR / "farmer-d.tar.gz"), "--db", str(tmp_path / "inbox.db"), "--out",
                        str(tmp_path / "runs"), "--report", str(report), "--test-inboxes", "daren.farmer@enron.com"])
    # after step 1 only: step 2 is the last, which after.parquet measures
    assert sorted(p.name for p in report.glob("eval-step*.parquet")) == ["eval-step0001.parquet"]
    before, mid = load_run(report, after=latest_eval(report))
    assert list(before.index) == list(mid.index) and mid["model"].iloc[0].startswith("after step 1")
