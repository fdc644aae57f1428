"""Checkpoints: the LoRA adapter (peft format, loadable by peft and by vLLM) plus optimizer state, one folder
per step at `{run_dir}/checkpoints/{step:04d}`. Each is written into a temporary folder and renamed into
place, so a folder with a step's name is always complete; leftovers of a crash are removed on start."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

STEP_DIR = re.compile(r"^\d{4,}$")
STATE = "trainer_state.json"


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{step:04d}"


def list_checkpoints(run_dir: str | Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE).is_file())


def latest_checkpoint(run_dir: str | Path) -> int | None:
    steps = list_checkpoints(run_dir)
    return steps[-1] if steps else None


def remove_partial(run_dir: str | Path) -> list[str]:
    """Delete half-written checkpoint folders left by a crash; their names."""
    root = Path(run_dir) / "checkpoints"
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            if p.is_dir() and (p.name.startswith(".tmp-") or (STEP_DIR.match(p.name) and not (p / STATE).is_file())):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    return removed


def save_checkpoint(run_dir: str | Path, step: int, model, optimizer=None, state: dict | None = None) -> Path:
    """Write step `step` atomically: adapter, optimizer state, then the state file, then the rename."""
    import torch

    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{step:04d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(str(tmp))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        with open(tmp / STATE, "w", encoding="utf-8") as f:
            json.dump({"step": step, "saved_at": time.time(), **(state or {})}, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # a step re-done after a crash that came after the rename
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:  # a full disk, say: no half-written folder is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def remove_checkpoint(run_dir: str | Path, step: int) -> bool:
    """Delete step `step`'s checkpoint folder (a step rolled back); whether there was one."""
    where = checkpoint_dir(run_dir, step)
    if not where.exists():
        return False
    shutil.rmtree(where)
    return True


def delete_checkpoints(run_dir: str | Path, keep: set[int]) -> list[int]:
    """Delete every complete checkpoint not in `keep`; the steps deleted."""
    gone = []
    for step in list_checkpoints(run_dir):
        if step not in keep:
            shutil.rmtree(checkpoint_dir(run_dir, step))
            gone.append(step)
    return gone
