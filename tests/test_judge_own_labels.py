"""`ruler eval judge --dataset PATH`: your own labelled pairs and groups, every validation error, `--by`."""

import json
import math
from pathlib import Path

import litellm
import pytest

from evals.judge_meta import evaluate
from ruler_rl.labels import DatasetError, load_user_dataset

SYSTEM = {"role": "system", "content": "Answer the question."}
USER = {"role": "user", "content": "When is the meeting?"}


def write(path: Path, rows) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def traj(answer: str, reward: float, **metrics) -> dict:
    return {"messages_and_choices": [SYSTEM, USER, {"role": "assistant", "content": answer}],
            "reward": reward, "metrics": metrics}


def test_every_format_is_read(tmp_path):
    pairs, groups, skipped, uniform = load_user_dataset(write(tmp_path / "d.jsonl", [
        {"input": "q1", "output_1": "x", "output_2": "y", "label": 2, "category": "math"},
        "",  # blank lines are skipped but counted for line numbers
        {"instruction": "Translate", "input": "hola", "output_1": "x", "output_2": "y", "label": 1, "id": "p2"},
        {"task": "q3", "response_a": "x", "response_b": "y", "preferred": "a", "difficulty": 3},
        {"task": "q4", "response_a": "x", "response_b": "y", "preferred": 2},
        {"task": "q5", "response_a": "", "response_b": "y", "preferred": "b"},  # empty response: skipped
        {"task": "g1", "responses": ["r0", "r1", "r2"], "scores": [0.1, 0.9, 0.5], "category": "code"},
        {"task": "g2", "responses": ["r0", "r1", "r2"], "ranking": [2, 0, 1]},
        {"task": "g3", "responses": ["r0", "r1"], "scores": [1, 1]},  # no preference: skipped
        {"trajectories": [traj("a", 1.0), traj("b", 0.0)], "metadata": {"category": "agent"}},
        {"trajectories": [traj("a", 0.2, independent_reward=0.0), traj("b", 0.9, independent_reward=1.0)]},
    ]))
    assert [(p.prompt, p.a, p.b, p.label) for p in pairs] == [
        ("q1", "x", "y", 2), ("Translate\n\nhola", "x", "y", 1), ("q3", "x", "y", 1), ("q4", "x", "y", 2)]
    assert [p.id for p in pairs][:2] == ["d:1", "p2"]  # line numbers count the blank line
    assert pairs[0].extra == {"category": "math"} and pairs[2].extra == {"difficulty": 3} and pairs[1].extra == {}
    assert skipped == 1 and uniform == 1
    assert groups[0].human == [0.1, 0.9, 0.5] and groups[0].extra == {"category": "code"}
    assert groups[1].human == [2.0, 1.0, 3.0]  # ranking [2, 0, 1]: response 2 best, then 0, then 1
    assert groups[2].human == [1.0, 0.0] and groups[2].extra == {"category": "agent"}
    assert groups[2].convs[0][-1] == {"role": "assistant", "content": "a"}
    assert groups[3].human == [0.0, 1.0]  # metrics.independent_reward wins over reward


GOOD = {"input": "q", "output_1": "a", "output_2": "b", "label": 1}
GROUP = {"task": "q", "responses": ["a", "b", "c"]}


@pytest.mark.parametrize("rows,match", [
    ([], "no usable rows"),
    (["", "  "], "no usable rows"),
    ([GOOD, "{not json"], r":2: not a JSON object"),
    ([GOOD, GOOD, "[1, 2]"], r":3: expected a JSON object, got list"),
    ([{"input": "q", "output_1": "a", "label": 1}], r":1: .*field 'output_2' is missing"),
    ([GOOD, {**GOOD, "label": 3}], r":2: field 'label' must be 1 or 2, got 3"),
    ([{**GOOD, "label": "1"}], r":1: field 'label' must be 1 or 2"),
    ([{**GOOD, "label": True}], r":1: field 'label' must be 1 or 2"),
    ([{"task": "q", "response_a": "a", "response_b": "b", "preferred": "c"}], r":1: field 'preferred' must be"),
    ([{"task": "q", "response_a": "a", "response_b": "b", "preferred": [1]}], r":1: field 'preferred' must be"),
    ([{"input": "q", "output_1": "a", "response_b": "b", "label": 1}], r":1: mixes LLMBar's fields"),
    ([{"output_1": "a", "output_2": "b", "label": 1}], r":1: no prompt: field 'task', 'instruction' or 'input'"),
    ([{**GOOD, "task": "t"}], r":1: give the prompt as 'task' or as 'instruction'/'input'"),
    ([{**GOOD, "output_1": ["a"]}], r":1: field 'output_1' is missing or not text"),
    ([{"task": "q", "responses": ["a"], "scores": [1]}], r":1: field 'responses' must be a list of at least 2"),
    ([{"task": "q", "responses": ["a", None], "scores": [1, 2]}], r":1: .*responses\[1\] is not text"),
    ([{**GROUP, "scores": [1, 2]}], r":1: field 'scores' must be a list of 3 numbers .*got 2"),
    ([{**GROUP, "scores": [1, "x", 2]}], r":1: scores\[1\] must be a finite number"),
    ([{**GROUP, "scores": [1, float("nan"), 2]}], r":1: scores\[1\] must be a finite number"),
    ([GROUP], r":1: a group needs exactly one of 'scores' and 'ranking'"),
    ([{**GROUP, "scores": [1, 2, 3], "ranking": [0, 1, 2]}], r":1: a group needs exactly one"),
    ([{**GROUP, "ranking": [0, 0, 1]}], r":1: field 'ranking' must be a permutation of 0..2.*duplicate \[0\]"),
    ([{**GROUP, "ranking": [1, 2, 3]}], r":1: field 'ranking' must be a permutation.*out of range \[3\]"),
    ([{**GROUP, "ranking": [0, 1]}], r":1: field 'ranking' must list the 3 response indices"),
    ([{**GROUP, "ranking": [0, 1.0, 2]}], r":1: field 'ranking' must list the 3 response indices"),
    ([{"trajectories": [traj("a", 1.0)]}], r":1: a TrajectoryGroup needs at least 2 trajectories"),
    ([{"trajectories": [{"messages": []}, traj("a", 1.0)]}], r":1: not a valid TrajectoryGroup"),
    ([{"trajectories": [traj("a", 1.0, independent_reward=1.0), traj("b", 0.0)]}],
     r":1: metrics.independent_reward is on some trajectories but not all \(missing on \[1\]\)"),
])
def test_bad_rows_are_named_by_line_and_field(tmp_path, rows, match):
    path = write(tmp_path / "bad.jsonl", rows) if rows else tmp_path / "bad.jsonl"
    if not rows:
        path.write_text("")
    with pytest.raises(DatasetError, match=match) as info:
        load_user_dataset(path)
    assert str(path) in str(info.value)


def test_paths_that_are_not_files(tmp_path):
    with pytest.raises(DatasetError, match="dataset file not found"):
        load_user_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="is a folder"):
        load_user_dataset(tmp_path)


def labelled(tmp_path: Path) -> Path:
    """Easy pairs labelled as the scripted judge sees them, hard ones labelled against it; two groups."""
    rows = []
    for i in range(4):
        good_first = i % 2 == 0
        a, b = ("GOOD answer", "BAD answer") if good_first else ("BAD answer", "GOOD answer")
        judge_pick = 1 if good_first else 2
        easy = i < 2
        rows.append({"task": f"question {i}", "response_a": a, "response_b": b,
                     "preferred": judge_pick if easy else 3 - judge_pick, "category": "easy" if easy else "hard"})
    rows.append({"task": "g", "responses": ["BAD", "GOOD", "OK"], "ranking": [1, 2, 0], "category": "easy"})
    rows.append({"trajectories": [traj("BAD", 1.0, independent_reward=0.0), traj("GOOD", 0.0, independent_reward=1.0),
                                  traj("OK", 0.0, independent_reward=0.5)], "metadata": {"category": "agent"}})
    return write(tmp_path / "mine.jsonl", rows)


async def test_own_labels_end_to_end_with_a_breakdown(tmp_path, judge):
    path = labelled(tmp_path)
    # the scripted judge answers under a priced model's name, so every call's cost is known (100 + 20 tokens)
    summary, detail = await evaluate([path], "openai/gpt-4o-mini", params=judge.params, ks=(1,), progress=False,
                                     by="category")
    rows = {r["subset"]: r for r in summary.to_dict("records")}
    assert list(rows) == ["all", "category=agent", "category=easy", "category=hard"]
    assert rows["all"]["pairs"] == 4 and rows["all"]["accuracy"] == 0.5 and rows["all"]["swap_consistency"] == 1.0
    assert rows["all"]["groups"] == 2 and rows["all"]["kendall_tau"] == 1.0  # independent_reward is the label
    assert rows["all"]["judge_ties"] == 0 and rows["all"]["pairs_per_s"] > 0
    per_call = sum(litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=100, completion_tokens=20))
    assert rows["all"]["cost"] == pytest.approx(len(judge.requests) * per_call, rel=1e-9) and per_call > 0
    assert rows["category=easy"]["accuracy"] == 1.0 and rows["category=hard"]["accuracy"] == 0.0
    assert rows["category=easy"]["groups"] == 1 and rows["category=agent"]["pairs"] == 0
    assert rows["category=agent"]["kendall_tau"] == 1.0 and math.isnan(rows["category=easy"]["pairs_per_s"])
    assert (summary["dataset"] == str(path)).all()
    assert sorted(detail["category"]) == ["agent", "easy", "easy", "easy", "hard", "hard"]
    assert len(judge.requests) == 4 * 2 + 2


async def test_mixed_with_a_built_in_set_and_bad_input_stops_before_judging(tmp_path, judge):
    from tests.test_judge_meta import write_llmbar

    write_llmbar(tmp_path, [{"input": "q", "output_1": "GOOD", "output_2": "BAD", "label": 1}])
    summary, _ = await evaluate(["llmbar-natural", labelled(tmp_path)], "openai/fake-judge", params=judge.params,
                                root=tmp_path, progress=False, by="category")
    assert list(summary["subset"])[:2] == ["all", "all"]  # the built-in set has no fields to break down by
    assert summary.iloc[0]["dataset"] == "llmbar-natural" and summary.iloc[0]["accuracy"] == 1.0
    judge.reset()
    bad = write(tmp_path / "bad.jsonl", [GOOD, {**GOOD, "label": 0}])
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: field 'label'"):
        await evaluate([labelled(tmp_path), bad], "openai/fake-judge", params=judge.params, progress=False)
    with pytest.raises(DatasetError, match="no row has the field 'difficulty'"):
        await evaluate([labelled(tmp_path)], "openai/fake-judge", params=judge.params, progress=False, by="difficulty")
    with pytest.raises(DatasetError, match="unknown dataset 'nope.jsonl': not one of"):
        await evaluate(["nope.jsonl"], "openai/fake-judge", params=judge.params, progress=False)
    assert judge.requests == []  # every dataset is checked before the first judgment


def test_command_line(tmp_path, judge, monkeypatch):
    from typer.testing import CliRunner

    from ruler_rl.cli import app

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    res = CliRunner().invoke(app, ["eval", "judge", "--judge", "openai/fake-judge", "--api-base", judge.base,
                                   "-d", str(labelled(tmp_path)), "--by", "category", "-k", "1",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "category=hard" in res.output and (tmp_path / "out" / "judge_meta.png").is_file()
    res = CliRunner().invoke(app, ["eval", "judge", "-d", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)])
    assert res.exit_code == 2 and "error: unknown dataset" in res.output
