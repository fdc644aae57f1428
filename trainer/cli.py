"""`ruler train-report RUN`: the trainer's command. `ruler_rl.cli` loads `app` by name when the command is run or
listed (see `ruler_rl.cli.PLUGIN_COMMANDS`), so ruler never imports trainer; it needs the `train` extra."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ruler_rl.cli import console, print_frame

app = typer.Typer(help="The trainer's commands.")

REPORT_COLUMNS = ("step", "reward_mean", "reward_std", "loss", "kl", "grad_norm", "clip_fraction", "trained_tokens",
                  "rollout_s", "train_s")


@app.command("train-report")
def train_report(
    run: Path = typer.Argument(..., help="A run folder ({path}/{project}/{name}) holding history.jsonl."),
    out: Optional[Path] = typer.Option(None, "--out", help="PNG path (default: RUN/train-report.png)."),
) -> None:
    """Plot a training run's reward and loss curves to a PNG and print the last steps."""
    from ruler_rl.trainer.runlog import load_run_log, plot_train_report

    path = plot_train_report(run, out)
    df = load_run_log(run)
    cols = [c for c in REPORT_COLUMNS if c in df]
    print_frame(df[cols].tail(10), f"{run}: {len(df)} steps", "{:.4g}")
    console.print(f"saved: {path}", soft_wrap=True)
