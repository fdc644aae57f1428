"""The CPU learning run (SmolLM2-135M + LoRA, GRPO on the tiny verifiable task: reward must rise) and a
trainer killed mid-step that resumes from its last complete checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import checkpoints as ckpt
from trainer.runlog import load_run_log

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STEPS = 8


def tiny(out, *args, **popen):
    cmd = [sys.executable, str(ROOT / "examples" / "tiny_task.py"), "--out", str(out), *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **popen)


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
    proc = tiny(tmp_path, "--steps", 3, *args)
    deadline = time.time() + 600
    while time.time() < deadline and ckpt.latest_checkpoint(run) != 1:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    # step 2 is under way: kill it the moment its checkpoint starts being written (or soon after)
    tmp_seen = False
    until = time.time() + 120
    while time.time() < until and ckpt.latest_checkpoint(run) == 1:
        if any(p.name.startswith(".tmp-0002") for p in (run / "checkpoints").iterdir()):
            tmp_seen = True
            break
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    complete = ckpt.list_checkpoints(run)
    assert complete in ([1], [1, 2])  # every folder with a step's name is complete
    for step in complete:
        assert (ckpt.checkpoint_dir(run, step) / "adapter_model.safetensors").stat().st_size > 0
    print(f"killed with the step-2 checkpoint {'half-written' if tmp_seen else 'not started'}; complete: {complete}")
    proc = tiny(tmp_path, "--steps", 3, *args)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    after = ckpt.list_checkpoints(run)
    assert after[:len(complete)] == complete and after == list(range(1, len(after) + 1))
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert f"resuming from step {complete[-1]}" in out
    trained = load_run_log(run).query("trained")["step"].tolist()
    assert trained == sorted(set(trained)) and trained[0] == 1  # no step trained twice, none lost before the kill


def test_train_report_command_plots_a_run(tmp_path):
    from typer.testing import CliRunner

    from ruler.cli import app
    from trainer.runlog import append_row

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
