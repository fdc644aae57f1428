"""The `ruler` command starts light: every `--help` runs without importing litellm, torch, transformers, pandas
(or the OpenAI SDK, numpy, FastAPI) -- they load inside the command that needs them -- and `import ruler_rl` /
`import ruler_rl.judges` stay light while every public name still imports. Each check runs in a fresh interpreter, so
nothing an earlier test imported counts."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("litellm", "torch", "transformers", "pandas", "numpy", "openai", "fastapi", "uvicorn")

# the `ruler` console script's own code (`from ruler_rl.cli import main; main()`), then which heavy modules got loaded
RUN_CLI = """
import json, sys
argv = json.loads(sys.argv[1])
sys.argv = ["ruler", *argv]
from ruler_rl.cli import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
print("\\nLOADED " + json.dumps({"code": code, "heavy": sorted(m for m in HEAVY if m in sys.modules)}))
""".replace("HEAVY", repr(HEAVY))


def run_in_fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120, check=False)


@functools.cache
def run_cli(*argv: str) -> tuple[int, list[str], str]:
    """Exit code, heavy modules loaded, and stdout of `ruler ARGV...` run as the console script runs it (once per
    test session: the tests that read the same command's help share its run)."""
    proc = run_in_fresh_python(RUN_CLI, json.dumps(argv))
    out, _, tail = proc.stdout.rpartition("\nLOADED ")
    assert tail, f"no report from `ruler {' '.join(argv)}`: {proc.stdout}{proc.stderr}"
    report = json.loads(tail)
    return report["code"], report["heavy"], out + proc.stderr


HELPS = [["--help"], ["score", "--help"], ["demo", "--help"], ["serve", "--help"], ["keys", "--help"],
         ["keys", "create", "--help"], ["train-report", "--help"], ["eval", "--help"], ["eval", "judge", "--help"],
         ["mcp-rl", "--help"], ["distill", "--help"]]


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_help_imports_no_heavy_module(argv):
    code, heavy, out = run_cli(*argv)
    assert heavy == [], f"`ruler {' '.join(argv)}` imported {heavy}"
    assert code in (0, 2), out  # 2: a plugin whose extra is missing here prints one line saying what to install
    assert "Usage:" in out or "error:" in out, out


def test_score_help_lists_its_options():
    code, heavy, out = run_cli("score", "--help")
    assert code == 0, out
    assert heavy == []
    for option in ("--judge", "--api-base", "--rubric", "--no-cache", "--permutations", "--timeout", "--retries",
                   "--max-prompt-tokens", "--json", "--allow-hub-downloads"):
        assert option in out, f"{option} missing from `ruler score --help`:\n{out}"
    assert "Usage: ruler score" in out


def test_root_help_lists_every_command():
    code, _, out = run_cli("--help")
    assert code == 0, out
    for command in ("score", "demo", "serve", "keys", "train-report", "eval", "mcp-rl", "distill"):
        assert f" {command} " in out, f"{command} missing from `ruler --help`:\n{out}"


def test_import_ruler_and_judges_is_light_and_every_name_still_imports():
    code = """
import json, sys
import ruler_rl, ruler_rl.judges
light = sorted(m for m in HEAVY if m in sys.modules)
from ruler_rl.judges import RetryPolicy, DEFAULT_RUBRIC, JudgeError
still_light = sorted(m for m in HEAVY if m in sys.modules)
from ruler_rl import *
import ruler_rl as r, ruler_rl.judges as j
names = {"ruler": [n for n in r.__all__ if getattr(r, n, None) is None],
         "judges": [n for n in j.__all__ if getattr(j, n, None) is None]}
import litellm
providers = sorted(p["provider"] for p in litellm.custom_provider_map)
print(json.dumps({"light": light, "still_light": still_light, "missing": names, "providers": providers,
                  "dir": sorted(set(r.__all__) - set(dir(r))), "quiet": litellm.suppress_debug_info}))
""".replace("HEAVY", repr(HEAVY))
    proc = run_in_fresh_python(code)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["light"] == [] and report["still_light"] == []
    assert report["missing"] == {"ruler": [], "judges": []}
    assert report["dir"] == []
    # the scoring path (or any judges name that calls litellm) registers the local/ and vllm-engine/ providers
    assert report["providers"] == ["local", "vllm-engine"] and report["quiet"] is True


def test_embedded_judge_name_registers_the_providers():
    """Code that calls litellm itself with `local/...` (tests/test_embedded.py) gets the provider registered by
    importing the name, as `import ruler_rl.judges` did before it became lazy."""
    code = """
import json
from ruler_rl.judges import EMBEDDED_JUDGE
import litellm
print(json.dumps([EMBEDDED_JUDGE, sorted(p["provider"] for p in litellm.custom_provider_map)]))
"""
    proc = run_in_fresh_python(code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["local/smollm2-135m-instruct", ["local", "vllm-engine"]]


def test_unknown_names_still_raise_attribute_error():
    import ruler_rl
    import ruler_rl.judges

    for module in (ruler_rl, ruler_rl.judges):
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018
