"""trainer/runlog.py: the training-curve plot reads steps that trained nothing (nulls in the log), and the software
versions a report records name ruler-rl's own commit only."""

import json
import shutil
import subprocess

import pytest

from ruler_rl.trainer import runlog


def test_the_plot_reads_steps_whose_every_group_was_dropped(tmp_path):
    """A step with no group logs reward_mean null; with every step so (a judge that failed every group,
    2026-12-07) matplotlib was handed a column of None and raised."""
    rows = [{"step": 0, "reward_mean": None, "reward_std": None, "trained": False},
            {"step": 0, "reward_mean": None, "reward_std": None, "trained": False}]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert runlog.plot_train_report(tmp_path).stat().st_size > 1000
    rows.append({"step": 1, "reward_mean": 0.5, "reward_std": 0.1, "loss": 0.2, "kl": None})
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert runlog.plot_train_report(tmp_path, tmp_path / "two.png").stat().st_size > 1000


def test_software_versions_name_this_checkout_and_no_other_repository(tmp_path):
    found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        pytest.skip("not run from a git checkout of ruler-rl")
    assert runlog.software_versions()["commit"].removesuffix("-dirty") == found.stdout.strip()
    # the module inside some other git repository (a wheel in a project's venv): that repository's commit is not ours
    other = tmp_path / "project"
    (other / "venv" / "trainer").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    subprocess.run(["git", "-C", str(other), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    copy = other / "venv" / "trainer" / "runlog.py"
    shutil.copy(runlog.__file__, copy)
    namespace: dict = {"__file__": str(copy), "__name__": "copied_runlog"}
    exec(compile(copy.read_text(), str(copy), "exec"), namespace)
    assert namespace["software_versions"]()["commit"] is None
