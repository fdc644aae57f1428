"""The `ruler` CLI in-process (typer's runner) against the scripted judge, and as `python -m ruler_rl`."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.cli import PLUGIN_COMMANDS, app
from ruler_rl.judges import EMBEDDED_JUDGE
from ruler_rl.judges.choice import JUDGES_BY_KEY, JudgeChoice, choose_judge
from ruler_rl.judges.extras import pip_command
from tests.helpers import convo

ROOT = Path(__file__).resolve().parents[1]

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


NO_JUDGE_ENV = {"RULER_JUDGE_MODEL": None, **{var: None for var, _ in JUDGES_BY_KEY}}


def said_in(res) -> str:
    """The command's output with its line breaks and runs of spaces as single spaces: rich wraps at the console's
    width, which COLUMNS sets only where the console is made after it (not under pytest-xdist's workers)."""
    return " ".join(res.output.split())


@pytest.mark.slow  # loads the embedded model in a subprocess
def test_the_demo_says_the_embedded_judge_is_not_a_quality_measure():
    res = CliRunner().invoke(app, ["demo"], env={**NO_JUDGE_ENV, "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    said = said_in(res)
    assert "RULER demo" in said and "checks the plumbing, not quality" in said
    assert "local/smollm2-135m-instruct" in said and "no API key in the environment" in said
    assert "--judge MODEL" in said and "OPENAI_API_KEY picks openai/gpt-4.1-mini" in said


def test_the_demo_uses_the_judge_of_an_api_key_in_the_environment(judge):
    res = CliRunner().invoke(app, ["demo", "--api-base", judge.base],
                             env={**NO_JUDGE_ENV, "OPENAI_API_KEY": "sk-test", "COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert [r["model"] for r in judge.requests] == ["gpt-4.1-mini"]  # litellm sends the name without "openai/"
    assert "openai/gpt-4.1-mini (OPENAI_API_KEY is set)" in said_in(res)
    assert "plumbing" not in said_in(res) and "RULER demo" in said_in(res)


def test_the_demo_prefers_judge_then_env_over_a_key(judge):
    env = {**NO_JUDGE_ENV, "OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-other", "COLUMNS": "200"}
    res = CliRunner().invoke(app, ["demo", "--api-base", judge.base],
                             env={**env, "RULER_JUDGE_MODEL": "openai/from-env"})
    assert res.exit_code == 0, res.output
    assert "openai/from-env ($RULER_JUDGE_MODEL)" in said_in(res)
    res = CliRunner().invoke(app, ["demo", "--api-base", judge.base, "--judge", "openai/given"],
                             env={**env, "RULER_JUDGE_MODEL": "openai/from-env"})
    assert res.exit_code == 0, res.output
    assert [r["model"] for r in judge.requests] == ["from-env", "given"]


def test_judge_choice_order():
    env = {"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": "a", "GEMINI_API_KEY": "g"}
    assert choose_judge(None, env) == JudgeChoice("anthropic/claude-sonnet-4-5", "key", "ANTHROPIC_API_KEY")
    assert choose_judge(None, {**env, "OPENAI_API_KEY": "o"}).model == "openai/gpt-4.1-mini"
    assert choose_judge(None, {**env, "RULER_JUDGE_MODEL": " openai/x "}) == JudgeChoice("openai/x", "env")
    assert choose_judge("openai/y", {**env, "RULER_JUDGE_MODEL": "openai/x"}) == JudgeChoice("openai/y", "given")
    assert choose_judge("  ", {"RULER_JUDGE_MODEL": "  "}) == JudgeChoice(EMBEDDED_JUDGE, "embedded")
    with pytest.raises(TypeError, match="litellm model string"):
        choose_judge(3, {})


def run_cli(*args: str, argv0: str | None = None) -> subprocess.CompletedProcess:
    """`python -m ruler_rl ARGS`, or (argv0 given) the console script as pip writes it: import the entry point
    named in pyproject.toml, set argv[0], call it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    if argv0 is None:
        cmd = [sys.executable, "-m", "ruler_rl", *args]
    else:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, func = scripts["ruler"].partition(":")
        cmd = [sys.executable, "-c", f"import sys; sys.argv[0] = {argv0!r}; from {module} import {func}; "
               f"sys.exit({func}())", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_python_m_ruler_is_the_console_script():
    script, module = run_cli("--help", argv0="/venv/bin/ruler"), run_cli("--help")
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    assert script.stdout == module.stdout
    listed = re.findall(r"^[^\w\s] ([a-z][\w-]*) ", module.stdout.split("Commands")[1], re.M)  # the box border, a name
    assert listed == ["score", "demo", "serve", "keys", "train-report", "eval", "mcp-rl", "distill"]
    assert "Usage: ruler " in module.stdout and "unavailable" not in module.stdout


def test_trainer_and_evals_commands_run_through_ruler(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--help"])
    assert res.exit_code == 0 and "judge" in res.output and "art-e" in res.output
    res = CliRunner().invoke(app, ["train-report", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no run log" in res.output


def test_ruler_imports_neither_trainer_nor_evals():
    code = ("import sys, ruler_rl, ruler_rl.cli; print(sorted({m for m in sys.modules if m.split('.')[0] == 'evals'"
            " or m.startswith('ruler_rl.trainer')}))")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_a_command_whose_package_is_missing_says_what_to_do(monkeypatch):
    monkeypatch.setitem(PLUGIN_COMMANDS, "ghost", ("no_such_package_q.cli", "app", "eval", "A ghost."))
    res = CliRunner().invoke(app, ["ghost", "judge", "--limit", "3", "--help"])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "runs from a checkout of the ruler-rl repository" in res.output
    assert pip_command("eval") in res.output
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert res.exit_code == 0 and re.search(r"ghost +unavailable: `ruler ghost` runs from a checkout", res.output)


def test_listing_the_commands_imports_no_plugin_and_their_help_is_their_own():
    code = ("import sys; from typer.testing import CliRunner; from ruler_rl.cli import app; "
            "res = CliRunner().invoke(app, ['--help']); assert res.exit_code == 0, res.output; "
            "print(sorted({m for m in sys.modules if m.split('.')[0] in ('evals', 'torch')"
            " or m.startswith('ruler_rl.trainer')}))")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
    from ruler_rl.cli import load_plugin_command

    for name, (_, _, _, short) in PLUGIN_COMMANDS.items():  # the stand-in's line is the loaded command's own
        command = load_plugin_command(name)
        assert (command.short_help or command.help).strip().splitlines()[0] == short, name
