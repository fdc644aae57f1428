"""The judge meta-evaluation harness: loaders, end to end, resuming, and a real slice with the embedded judge."""

import json
from pathlib import Path

import pytest

from evals.judge_meta import DEFAULT_ROOT, DatasetError, evaluate, load_llmbar, load_pandalm, save_report


def write_llmbar(root: Path, rows) -> Path:
    path = root / "LLMBar" / "Natural" / "dataset.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("rows,match", [
    ({"not": "a list"}, "expected a list"),
    ([{"output_1": "a", "output_2": "b", "label": 1}], "'input' is missing"),
    ([{"input": "q", "output_1": "a", "output_2": "b", "label": 3}], "label must be 1 or 2"),
    ([{"input": "q", "output_1": ["a"], "output_2": "b", "label": 1}], "'output_1' is missing or not text"),
])
def test_bad_records_are_named(tmp_path, rows, match):
    with pytest.raises(DatasetError, match=match):
        load_llmbar(write_llmbar(tmp_path, rows))


def test_empty_responses_are_skipped_and_counted(tmp_path):
    pairs, skipped = load_llmbar(write_llmbar(tmp_path, [
        {"input": "q", "output_1": "", "output_2": "b", "label": 1},
        {"input": "q", "output_1": "a", "output_2": "b", "label": 2}]))
    assert len(pairs) == 1 and skipped == 1


def test_pandalm_unanimous_pairs_ties_and_full_groups_from_real_data():
    path = DEFAULT_ROOT / "PandaLM" / "testset-v1.json"
    decided, ties, groups, skipped = load_pandalm(path)
    assert len(groups) == 20 and all(len(g.responses) == 5 for g in groups)
    assert all(p.label in (1, 2) for p in decided) and all(p.label == 0 for p in ties)
    # of the 999 records, 879 have three agreeing annotators; 51 of those have an empty response
    assert (len(decided), len(ties), skipped) == (744, 84, 51)
    rows = json.loads(path.read_text())
    unanimous = [r for r in rows if r["annotator1"] == r["annotator2"] == r["annotator3"]]
    empty = [r for r in unanimous if not str(r["response1"]).strip() or not str(r["response2"]).strip()]
    assert len(rows) == 999 and len(unanimous) == len(decided) + len(ties) + skipped and len(empty) == skipped
    assert all(sum(g.human) == 30 for g in groups)  # 10 pairings x 3 annotators, one point each


async def test_harness_end_to_end_and_resumes_from_cache(tmp_path, judge):
    rows = [{"input": f"question {i}", "output_1": "GOOD answer" if i % 2 else "BAD answer",
             "output_2": "BAD answer" if i % 2 else "GOOD answer", "label": 1 if i % 2 else 2} for i in range(6)]
    write_llmbar(tmp_path, rows)
    summary, detail = await evaluate(["llmbar-natural"], "openai/fake-judge", params=judge.params, ks=(1, 2),
                                     root=tmp_path, progress=False)
    assert list(summary["k"]) == [1, 2]
    assert (summary["accuracy"] == 1.0).all() and (summary["swap_consistency"] == 1.0).all()
    assert len(detail) == 12
    calls = len(judge.requests)
    assert calls == 6 * 2 + 6 * 2  # both orders; k=2 adds only the reversed orderings (the rest is cached)
    judge.reset()
    await evaluate(["llmbar-natural"], "openai/fake-judge", params=judge.params, ks=(1, 2), root=tmp_path,
                   progress=False)
    assert judge.requests == []  # a rerun is served by the judge cache
    paths = save_report(summary, detail, tmp_path / "out", "test")
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    assert paths[-1].read_bytes()[:4] == b"\x89PNG"


async def test_bad_arguments():
    with pytest.raises(DatasetError, match="unknown dataset"):
        await evaluate(["nope"], None)
    with pytest.raises(ValueError, match=">= 1"):
        await evaluate(["llmbar-natural"], None, ks=(0,))


@pytest.mark.slow
async def test_a_three_pair_slice_with_the_embedded_judge(tmp_path, embedded_model):
    summary, detail = await evaluate(["llmbar-natural"], None, ks=(1,), limit=3, progress=False)
    row = summary.iloc[0]
    assert row["pairs"] == 3 and len(detail) == 3 and row["judge_errors"] == 0  # constrained: always an answer
    assert set(detail["verdict"]) <= {0, 1, 2} and set(detail["verdict_swapped"]) <= {0, 1, 2}
    # the summary is the detail's: what the 135M judge decides is its own, the bookkeeping is not
    assert row["accuracy"] == (detail["verdict"] == detail["label"]).mean()
    assert row["swap_consistency"] == (detail["verdict"] == detail["verdict_swapped"]).mean()
    assert all(p.is_file() for p in save_report(summary, detail, tmp_path, "embedded"))
