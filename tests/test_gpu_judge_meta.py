"""evals.gpu_judge_meta's meta-evaluation keeps what it finished: a run cut short after its first dataset still
leaves that dataset's rows on disk (the device call that runs it has a hard time limit)."""

import argparse
import asyncio
import json
from datetime import datetime

import pandas as pd
import pytest

from evals import judge_meta
from evals.gpu_judge_meta import run_eval


def test_each_finished_dataset_is_written_before_the_next_starts(tmp_path, monkeypatch):
    seen, loops = [], set()

    async def evaluate(datasets, judge, **kwargs):
        seen.append(list(datasets))
        loops.add(id(asyncio.get_running_loop()))
        if len(seen) == 2:
            raise RuntimeError("the device call ran out of time")
        name = datasets[0]
        return (pd.DataFrame([{"dataset": name, "k": k, "accuracy": 0.5} for k in kwargs["ks"]]),
                pd.DataFrame([{"dataset": name, "k": 1, "id": "p0"}]))

    monkeypatch.setattr(judge_meta, "evaluate", evaluate)
    args = argparse.Namespace(limit=3, concurrency=8, out=tmp_path, datasets=judge_meta.DATASETS, by=None)
    with pytest.raises(RuntimeError, match="ran out of time"):
        run_eval(args, "hosted_vllm/judge", {"api_base": "http://127.0.0.1:1/v1"}, 12.0)
    first = judge_meta.DATASETS[0]
    assert seen == [[first], [judge_meta.DATASETS[1]]]  # one dataset per evaluation, in order
    assert len(loops) == 1  # one event loop: an in-process engine stays bound to the loop it was made in
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["dataset"].tolist() == [first, first] and summary["k"].tolist() == [1, 3]
    assert pd.read_csv(tmp_path / "detail.csv")["dataset"].tolist() == [first]
    assert json.loads((tmp_path / "run.json").read_text())["datasets_done"] == 1


def test_a_complete_run_writes_every_dataset(tmp_path, monkeypatch):
    async def evaluate(datasets, judge, **kwargs):
        return (pd.DataFrame([{"dataset": datasets[0], "k": k} for k in kwargs["ks"]]),
                pd.DataFrame([{"dataset": datasets[0], "id": "p0"}]))

    monkeypatch.setattr(judge_meta, "evaluate", evaluate)
    run_eval(argparse.Namespace(limit=None, concurrency=4, out=tmp_path, datasets=judge_meta.DATASETS,
                                        by=None), "hosted_vllm/judge", None, 1.0)
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["dataset"].tolist() == [d for d in judge_meta.DATASETS for _ in (1, 3)]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["datasets_done"] == len(judge_meta.DATASETS)
    # when each set began, in order: `ruler distill --since` selects one set's judgments from the cache by it
    assert [s["dataset"] for s in run["stages"]] == list(judge_meta.DATASETS)
    started = [datetime.fromisoformat(s["started"]) for s in run["stages"]]
    assert started == sorted(started) and all(t.tzinfo is not None for t in started)


def test_the_judge_server_samples_compact_json_as_the_library_engines_do():
    """Under vLLM 0.24's default grammar the served 1.5B judge wrote whitespace until its token limit (2026-12-07):
    the server is started with the library's compact-JSON settings."""
    from evals.gpu_judge_meta import parse_args, server_command
    from ruler_rl.judges.vllm_settings import COMPACT_JSON

    args = parse_args(["--model", "/m/qwen", "--out", "/tmp/x", "--enforce-eager"])
    cmd = server_command(args, "qwen")
    assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1]) == COMPACT_JSON
    assert cmd[cmd.index("--served-model-name") + 1] == "qwen" and cmd[-1] == "--enforce-eager"
    assert "--enforce-eager" not in server_command(parse_args(["--model", "/m/qwen", "--out", "/tmp/x"]), "qwen")


def test_the_meta_evaluation_leaves_each_sets_judgments_in_the_cache_selectable_by_its_start(tmp_path, judge):
    """Table 2 distils the judge from its cached PandaLM judgments: every judgment of the run is in the judge cache
    under the judge's model string with its prompt, and run.json's stage start selects the last set's alone."""
    from ruler_rl.cache import export_judgments
    from ruler_rl.trainer.distill import from_cache

    run_eval(argparse.Namespace(limit=1, concurrency=4, out=tmp_path, datasets=judge_meta.DATASETS, by=None), "openai/fake-judge", judge.params, 0.0)
    stages = json.loads((tmp_path / "run.json").read_text())["stages"]
    cache = tmp_path / "judge-cache"  # the test's RULER_CACHE_DIR (conftest), as gpu_judge_meta sets OUT/judge-cache
    everything, _ = export_judgments(cache, "openai/fake-judge")
    last, report = export_judgments(cache, "openai/fake-judge", since=datetime.fromisoformat(stages[-1]["started"]))
    assert stages[-1]["dataset"] == "pandalm" and 0 < len(last) < len(everything)
    assert report.outside_dates == len(everything) - len(last)
    examples, unusable = from_cache(last)  # prompts recorded: usable as teacher data
    assert examples and unusable == 0 and all(len(e.ids) >= 2 for e in examples)


def test_datasets_run_in_the_order_given_and_by_reaches_only_a_users_file(tmp_path, monkeypatch):
    """--datasets picks and orders the stages (table 2 puts PandaLM last so that the judgments after its start are
    its own); --by breaks a user's JSONL file down by one of its fields and is not passed for a built-in set."""
    from evals.gpu_judge_meta import parse_args

    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"input": "q", "output_1": "a", "output_2": "b", "label": 1, "case": "x"}) + "\n")
    calls = []

    async def evaluate(datasets, judge, **kwargs):
        calls.append((datasets[0], kwargs["by"]))
        return (pd.DataFrame([{"dataset": datasets[0], "k": k} for k in kwargs["ks"]]),
                pd.DataFrame([{"dataset": datasets[0], "id": "p0"}]))

    monkeypatch.setattr(judge_meta, "evaluate", evaluate)
    args = parse_args(["--model", "/m", "--out", str(tmp_path), "--datasets", str(mine), "pandalm", "--by", "case"])
    run_eval(args, "hosted_vllm/judge", None, 1.0)
    assert calls == [(str(mine), "case"), ("pandalm", None)]
    run = json.loads((tmp_path / "run.json").read_text())
    assert [s["dataset"] for s in run["stages"]] == [str(mine), "pandalm"]
    assert parse_args(["--model", "/m", "--out", str(tmp_path)]).datasets == judge_meta.DATASETS
    for bad in (["--datasets", "no-such-set"], ["--datasets", "pandalm", "pandalm"], ["--by", "case"],
                ["--datasets", "pandalm", "--by", "case"]):
        with pytest.raises(SystemExit):
            parse_args(["--model", "/m", "--out", str(tmp_path), *bad])


def test_llmbar_case_studies_are_written_in_the_users_labelled_pairs_format(tmp_path):
    """Table 1's user-label row: LLMBar's five case-study sets (gold labels, not among the built-in sets) as a file
    `ruler eval judge --dataset` reads, each pair's case kept for --by."""
    from ruler_rl.labels import load_user_dataset

    if not (judge_meta.DEFAULT_ROOT / judge_meta.CASESTUDY).is_dir():
        pytest.skip("../shared/data/judge-meta is not beside this checkout")
    out = tmp_path / "casestudy.jsonl"
    n = judge_meta.write_casestudy_jsonl(out)
    pairs, groups, skipped, _ = load_user_dataset(out)
    assert n == len(pairs) + skipped == 315 and not groups  # 54 + 54 + 89 + 59 + 59
    cases = {p.extra["case"] for p in pairs}
    assert cases == {"Base_9", "Base_10", "Constraint", "Negation", "Normal"}
    first = json.loads((judge_meta.DEFAULT_ROOT / judge_meta.CASESTUDY / "Base_10" / "dataset.json").read_text())[0]
    assert (pairs[0].id, pairs[0].label) == ("Base_10-0", first["label"])
    few = judge_meta.write_casestudy_jsonl(tmp_path / "few.jsonl", per_case=3)
    pairs, _, _, _ = load_user_dataset(tmp_path / "few.jsonl")
    assert few == 15 and sorted(p.id for p in pairs if p.extra["case"] == "Negation") == [
        "Negation-0", "Negation-1", "Negation-2"]
    with pytest.raises(ValueError, match="per_case"):
        judge_meta.write_casestudy_jsonl(tmp_path / "bad.jsonl", per_case=0)
    with pytest.raises(judge_meta.DatasetError, match="no LLMBar case-study"):
        judge_meta.write_casestudy_jsonl(tmp_path / "none.jsonl", root=tmp_path)
    assert not (tmp_path / "none.jsonl").exists()
