"""The CPU learning run (SmolLM2-135M + LoRA, GRPO on the tiny verifiable task: reward must rise) and a
trainer killed mid-step that resumes from its last complete checkpoint."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ruler_rl.trainer import checkpoints as ckpt
from ruler_rl.trainer.runlog import load_run_log

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 8


# Run as `python -c HOLD script args`: the script runs as written, except that when the optimizer state of
# step $HOLD_STEP's checkpoint is written (into its temporary folder, `.tmp-NNNN-pid`), only half of it is
# written, $HOLD_SIGNAL is created, and the process waits there to be killed. So a test kills the trainer
# mid-write every time, not by luck of timing.
HOLD = """
import io, os, runpy, sys, time
from pathlib import Path

import torch

prefix, signal_file = f".tmp-{int(os.environ['HOLD_STEP']):04d}-", Path(os.environ["HOLD_SIGNAL"])
real_save = torch.save


def save(obj, f, *args, **kwargs):
    if not (isinstance(f, (str, os.PathLike)) and Path(f).parent.name.startswith(prefix)):
        return real_save(obj, f, *args, **kwargs)
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    with open(f, "wb") as out:
        out.write(data[: len(data) // 2])
        out.flush()
        os.fsync(out.fileno())
    signal_file.with_suffix(".tmp").write_text(str(f))
    os.replace(signal_file.with_suffix(".tmp"), signal_file)
    time.sleep(3600)


torch.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def tiny(out, *args, hold: tuple[int, Path] | None = None, **popen):
    """examples/tiny_task.py in a child process (its own process group); `hold=(step, signal_file)` holds
    it half-way through writing that step's checkpoint (see HOLD)."""
    script = [str(ROOT / "examples" / "tiny_task.py"), "--out", str(out), *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    if hold:
        env.update(HOLD_STEP=str(hold[0]), HOLD_SIGNAL=str(hold[1]))
    cmd = [sys.executable, *(["-c", HOLD] if hold else []), *script]
    return subprocess.Popen(cmd, env=env, stdout=popen.pop("stdout", subprocess.PIPE), stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **popen)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_reward_rises_on_the_tiny_task(tmp_path):
    proc = tiny(tmp_path, "--steps", STEPS, "--seed", 0)
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-3000:]
    df = load_run_log(tmp_path / "tiny" / "one-word")
    assert list(df["step"]) == list(range(1, STEPS + 1)) and df["trained"].all()
    first, last = df["reward_mean"].iloc[:3].mean(), df["reward_mean"].iloc[-3:].mean()
    print(f"reward first 3 steps {first:.3f}, last 3 steps {last:.3f}: {list(df['reward_mean'].round(3))}")
    assert last > first + 0.1, list(df["reward_mean"])
    assert (tmp_path / "tiny" / "one-word" / "train-report.png").is_file()


def test_killed_mid_step_resumes_from_the_last_complete_checkpoint(tmp_path):
    run = tmp_path / "tiny" / "one-word"
    args = ("--questions-per-step", 2, "--group-size", 3, "--max-tokens", 6)
    signal_file, log = tmp_path / "holding", tmp_path / "first-run.log"
    with open(log, "w") as first_out:
        proc = tiny(tmp_path, "--steps", 4, *args, hold=(2, signal_file), stdout=first_out)
    deadline = time.time() + 900
    try:
        while not signal_file.exists():
            assert proc.poll() is None, f"the trainer ended before step 2's checkpoint: {log.read_text()[-3000:]}"
            assert ckpt.latest_checkpoint(run) in (None, 1), ("step 2's checkpoint completed without the hold: is "
                                                              "its optimizer state still written with torch.save?")
            assert time.time() < deadline, "step 2's checkpoint was not reached in time"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # half-way through writing step 2's optimizer state
        proc.wait()
    half = Path(signal_file.read_text())
    assert half.parent.parent == run / "checkpoints" and half.parent.name.startswith(".tmp-0002-")
    assert (half.parent / "adapter_model.safetensors").is_file() and not (half.parent / ckpt.STATE).exists()
    # the half-written folder is never taken for a checkpoint; step 1's is complete, and step 2 was not logged
    assert ckpt.list_checkpoints(run) == [1] and ckpt.latest_checkpoint(run) == 1
    step_one = digest(ckpt.checkpoint_dir(run, 1))
    assert load_run_log(run).query("trained")["step"].tolist() == [1]

    proc = tiny(tmp_path, "--steps", 4, *args)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming from step 1" in out
    after = ckpt.list_checkpoints(run)  # a round whose groups all tie takes no step: not every round makes one
    assert after[:2] == [1, 2] and after == list(range(1, len(after) + 1))
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]  # the leftover is gone
    assert digest(ckpt.checkpoint_dir(run, 1)) == step_one  # the complete checkpoint was not touched
    for step in after[1:]:  # the redone step 2 and any later one are whole: state file, loadable optimizer state
        where = ckpt.checkpoint_dir(run, step)
        assert json.loads((where / ckpt.STATE).read_text())["step"] == step
        assert torch.load(where / "optimizer.pt", weights_only=True)["state"]
    # each step trained once: step 2 only after the restart, none lost before the kill
    assert load_run_log(run).query("trained")["step"].tolist() == after


def test_train_report_command_plots_a_run(tmp_path):
    from typer.testing import CliRunner

    from ruler_rl.cli import app
    from ruler_rl.trainer.runlog import append_row

    run = tmp_path / "proj" / "m"
    for step, reward in enumerate([0.1, 0.3, 0.5], 1):
        append_row(run, {"step": step, "reward_mean": reward, "reward_std": 0.1, "loss": -0.01 * step, "kl": 0.0})
    (run / "history.jsonl").open("a").write('{"step": 4, "rew')  # a line torn by a crash is skipped
    res = CliRunner().invoke(app, ["train-report", str(run)])
    assert res.exit_code == 0, res.output
    assert (run / "train-report.png").stat().st_size > 10_000 and "0.5" in res.output
    res = CliRunner().invoke(app, ["train-report", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no run log" in res.output
    # a run whose steps had no learning signal trained nothing and logged no loss: still plotted
    flat = tmp_path / "proj" / "flat"
    append_row(flat, {"step": 0, "reward_mean": -1.7, "reward_std": 0.0, "trained": False})
    res = CliRunner().invoke(app, ["train-report", str(flat)])
    assert res.exit_code == 0, res.output
    assert (flat / "train-report.png").stat().st_size > 5_000
