"""The `ruler` CLI in-process (typer's runner), against the scripted judge."""

import json

from typer.testing import CliRunner

from ruler import Trajectory, TrajectoryGroup
from ruler.cli import app
from tests.helpers import convo

runner = CliRunner()


def write_group(tmp_path):
    g = TrajectoryGroup([Trajectory(messages_and_choices=convo(a)) for a in ("GOOD a", "BAD b", "OK c")])
    return g.save(tmp_path / "group.jsonl")


def test_score_prints_json_with_advantages(tmp_path, judge):
    res = runner.invoke(app, ["score", str(write_group(tmp_path)), "--judge", "openai/fake-judge",
                              "--api-base", judge.base, "--json"], env={"OPENAI_API_KEY": "sk-test"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [s["score"] for s in out["scores"]] == [0.9, 0.1, 0.5]
    assert out["scores"][0]["advantage"] > 0 > out["scores"][1]["advantage"]


def test_score_table_and_named_rubric(tmp_path, judge):
    res = runner.invoke(app, ["score", str(write_group(tmp_path)), "--judge", "openai/fake-judge",
                              "--api-base", judge.base, "--rubric", "strict-correctness", "--no-cache"],
                        env={"OPENAI_API_KEY": "sk-test"})
    assert res.exit_code == 0, res.output
    assert "0.900" in res.output and "advantage" in res.output
    assert "final answer is correct" in judge.requests[0]["messages"][0]["content"]


def test_score_errors_are_clear(tmp_path, judge):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe")
    res = runner.invoke(app, ["score", str(bad)])
    assert res.exit_code == 2 and "not valid UTF-8" in res.output
    res = runner.invoke(app, ["score", str(write_group(tmp_path)), "--rubric", "no-such-rubric"])
    assert res.exit_code == 2 and "unknown rubric" in res.output
    res = runner.invoke(app, ["score", str(write_group(tmp_path)), "--judge", "bogus-provider-q/x"])
    assert res.exit_code == 2 and "unknown judge model" in res.output


def test_the_demo_says_the_embedded_judge_is_not_a_quality_measure():
    res = CliRunner().invoke(app, ["demo"], env={"RULER_JUDGE_MODEL": "", "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "RULER demo" in res.output and "checks the plumbing, not quality" in res.output
    assert "--judge MODEL" in res.output
