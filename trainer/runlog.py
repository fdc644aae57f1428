"""The run log: one JSON line per training step in `{run_dir}/history.jsonl`, a DataFrame to analyse it,
a PNG of the reward and loss curves (`ruler train-report RUN`), W&B when asked for, and the software versions a
run's report records (`software_versions`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

HISTORY = "history.jsonl"


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_row(run_dir: str | Path, row: dict, *, wandb_run=None) -> None:
    path = Path(run_dir) / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
    if wandb_run is not None:
        wandb_run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=row.get("step"))


def software_versions() -> dict:
    """The ruler-rl checkout's commit, `-dirty` when its files differ from it (None for an installed wheel, outside
    a git checkout, or where the checkout came without its .git), and the vLLM version (None without vLLM)."""
    import importlib.metadata
    import subprocess

    here = Path(__file__).resolve()

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=here.parent, check=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:  # only a checkout of ruler-rl itself: a wheel inside some other repository's venv names no commit
        ours = (Path(git("rev-parse", "--show-toplevel")) / "trainer" / here.name).resolve() == here
        commit = (git("describe", "--always", "--dirty", "--abbrev=40") or None) if ours else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    try:
        vllm = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        vllm = None
    return {"commit": commit, "vllm": vllm}


def load_run_log(run_dir: str | Path):
    """The run's history as a pandas DataFrame (one row per step; a torn last line is ignored)."""
    import pandas as pd

    path = Path(run_dir) / HISTORY
    if not path.is_file():
        raise FileNotFoundError(f"no run log at {path}")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a crash mid-write
    return pd.DataFrame(rows)


def plot_train_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Reward (mean ± std) and loss per step, to a PNG (default `{run_dir}/train-report.png`)."""
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = load_run_log(run_dir)
    if df.empty or "step" not in df:
        raise ValueError(f"the run log in {run_dir} has no steps yet")
    df = df.drop_duplicates("step", keep="last").sort_values("step")
    for column in ("reward_mean", "reward_std", "loss", "kl"):  # a step with no group logs nulls: NaN, not objects
        if column in df:
            df[column] = pd.to_numeric(df[column], errors="coerce")
    out = Path(out) if out else Path(run_dir) / "train-report.png"
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(df["step"], df["reward_mean"], marker="o", color="#4C72B0")
    if "reward_std" in df:
        std = df["reward_std"].fillna(0)
        a.fill_between(df["step"], df["reward_mean"] - std, df["reward_mean"] + std, alpha=0.2, color="#4C72B0")
    a.set_title("reward (mean ± std of the step's rollouts)")
    a.set_xlabel("step")
    if "loss" in df:  # a step without a learning signal trains nothing and logs no loss
        b.plot(df["step"], df["loss"], marker="o", color="#C44E52", label="loss")
    if "kl" in df and df["kl"].fillna(0).abs().sum() > 0:
        b.plot(df["step"], df["kl"], marker=".", color="#55A868", label="KL")
    b.set_title("loss" if "loss" in df else "loss (no step trained yet)")
    b.set_xlabel("step")
    if b.lines:
        b.legend()
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
