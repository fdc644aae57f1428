"""RULER against a hand-written reward (issue #36, table 3): tic-tac-toe runs of `examples/tic_tac_toe.py`, read
from their report folders and compared on the game's own reward over held-out games.

    python -m evals.ruler_vs_hand DIR [DIR ...] [--step N]

Each folder is one run (`--report DIR`): run.json (its reward, `hand` or `ruler`, and seed) and
eval-stepNNNN.csv (the same held-out games at policy step NNNN, at one or more temperatures, 0 where the file names
none; step 0 is the untrained model). Each table is given per temperature that every run measured. Printed:

- per run: the held-out hand reward (win 1, draw 0.5, loss 0, illegal -1) and win/draw/loss/illegal counts at
  step 0 and at the compared step, with the paired difference (a bootstrap over games, 95%);
- per seed run with both rewards: the RULER run minus the hand-reward run at the compared step, paired by game
  (both runs measure the same opponents' seeds), and over all such seeds the mean of that difference per game
  (its interval resamples games, the seeds held fixed: it says how sure these seeds' mean is, not how another
  seed would fare);
- per RULER run: how the judge's scores ranked the games of each training group against the hand reward: over
  every pair of games in a group whose hand rewards differ, "agree" when RULER ranks the better game higher, a
  tie, or "disagree" (accuracy counts ties as misses, with a bootstrap interval over groups);
- per run, the training curve (groups.jsonl): the hand reward and the share of illegal moves of the training
  games (sampled at temperature 1, on training opponents: not a held-out measure) in blocks of `--block` loop
  steps. A run whose judge failed every group (never trained) is the control: the untrained policy's games.

The compared step is `--step N` where given, else the largest policy step every trained run measured; a run without
it is named and left out of the comparisons. A run whose policy never left step 0 (run.json's `policy_step` 0: e.g.
its judge failed every group) is a control: listed with its untrained measure and its training games (the
untrained policy's), never compared as one of the rewards.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evals.art_e.learning import paired, share_interval

EVAL_FILE = re.compile(r"eval-step(\d{4,})\.csv")
RESULTS = ("win", "draw", "loss", "illegal")


@dataclass
class Run:
    folder: Path
    reward: str
    seed: int
    evals: dict[int, pd.DataFrame]  # policy step -> one row per held-out game and temperature
    trained: bool = True  # False: run.json says the policy never left step 0 (a control: the untrained games)

    @property
    def label(self) -> str:
        return f"{self.reward} seed {self.seed} ({self.folder.name}){'' if self.trained else ', never trained'}"


def load_run(folder: str | Path) -> Run:
    """One report folder of `examples/tic_tac_toe.py`; a clear error when it is not one."""
    folder = Path(folder)
    info_path = folder / "run.json"
    if not info_path.is_file():
        raise ValueError(f"{folder} has no run.json: not a report folder of examples/tic_tac_toe.py")
    try:
        info = json.loads(info_path.read_text())
    except ValueError as exc:
        raise ValueError(f"{info_path} is not JSON: {exc}") from None
    seed = info.get("seed") if isinstance(info, dict) else None
    if info.get("reward") not in ("hand", "ruler") or isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{info_path} names no reward ('hand' or 'ruler') and integer seed: not a tic-tac-toe run")
    evals = {}
    for path in sorted(folder.glob("eval-step*.csv")):
        if (m := EVAL_FILE.fullmatch(path.name)) is None:
            continue
        step = int(m.group(1))
        if step in evals:
            raise ValueError(f"{folder} holds two measures of policy step {step}")
        table = pd.read_csv(path)
        missing = {"seed", "result", "reward"} - set(table.columns)
        if missing:
            raise ValueError(f"{path} lacks the columns {sorted(missing)}")
        if "temperature" not in table.columns:  # written before --eval-temperatures: greedy
            table["temperature"] = 0.0
        unknown = set(table["result"]) - set(RESULTS)
        if unknown:
            raise ValueError(f"{path}: results {sorted(map(str, unknown))} are none of {', '.join(RESULTS)}")
        for column in ("reward", "temperature"):
            values = pd.to_numeric(table[column], errors="coerce")
            if values.isna().any() or not np.isfinite(values).all():
                raise ValueError(f"{path}: the {column} column holds a value that is not a finite number")
            table[column] = values.astype(float)
        if table.duplicated(["seed", "temperature"]).any():
            raise ValueError(f"{path} holds a game twice at one temperature")
        evals[step] = table
    if 0 not in evals:
        raise ValueError(f"{folder} has no eval-step0000.csv: the untrained model was not measured")
    return Run(folder, info["reward"], seed, evals, trained=info.get("policy_step", 1) != 0)


def _groups(groups_jsonl: str | Path) -> list[dict]:
    """groups.jsonl's rows; a torn last line (a run killed mid-write) is left out, any other bad line is an error
    naming the file and line."""
    path = Path(groups_jsonl)
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("rollouts"), list) or "step" not in row:
            raise ValueError(f"{path}:{number} is not a group row (step, rollouts)")
        rows.append(row)
    return rows


def measure(table: pd.DataFrame) -> dict:
    counts = table["result"].value_counts()
    return {"games": len(table), "hand_reward": float(table["reward"].mean()),
            **{r: int(counts.get(r, 0)) for r in RESULTS}}


def at(table: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """The games played at `temperature`, indexed by their seed."""
    return table[table["temperature"] == temperature].set_index("seed").sort_index()


def common_games(a: pd.DataFrame, b: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Both tables' hand rewards over the games both hold (tables of one temperature, indexed by seed)."""
    seeds = a.index.intersection(b.index)
    if not len(seeds):
        raise ValueError("the two measures hold no held-out game in common")
    return a.loc[seeds, "reward"].to_numpy(float), b.loc[seeds, "reward"].to_numpy(float)


def judge_agreement(groups_jsonl: str | Path, *, seed: int = 0) -> dict:
    """How the training reward ranked each scored group's games against their hand reward (module docstring)."""
    agree = ties = disagree = 0
    per_group = []  # per group with a pair to compare: 1 for each pair the reward ranked right, 0 otherwise
    for g in _groups(groups_jsonl):
        if not g.get("scored"):
            continue
        rows = [(r["hand_reward"], r["reward"]) for r in g["rollouts"] if r.get("reward") is not None]
        outcomes = []
        for i, (hand_a, score_a) in enumerate(rows):
            for hand_b, score_b in rows[i + 1:]:
                if hand_a == hand_b:
                    continue
                better, worse = (score_a, score_b) if hand_a > hand_b else (score_b, score_a)
                outcomes.append(int(better > worse))
                agree += better > worse
                ties += better == worse
                disagree += better < worse
        if outcomes:
            per_group.append(outcomes)
    pairs = agree + ties + disagree
    low = high = float("nan")
    if per_group:
        _, low, high = share_interval(per_group, np.random.default_rng(seed))
    return {"groups": len(per_group), "pairs": pairs, "agree": agree, "ties": ties, "disagree": disagree,
            "accuracy": agree / pairs if pairs else float("nan"), "accuracy_low": low, "accuracy_high": high}


def training_curve(groups_jsonl: str | Path, *, block: int = 5) -> list[dict]:
    """The training games' hand reward and illegal share in blocks of `block` loop steps (module docstring)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    games: dict[int, list[float]] = {}
    for g in _groups(groups_jsonl):
        games.setdefault(g["step"] // block, []).extend(r["hand_reward"] for r in g["rollouts"])
    return [{"steps": f"{b * block}-{b * block + block - 1}", "games": len(v), "hand_reward": float(np.mean(v)),
             "illegal": float(np.mean([x == -1 for x in v]))} for b, v in sorted(games.items())]


def compared_step(runs: list[Run], step: int | None) -> int:
    """`step`, or the largest policy step every trained run measured (runs that never trained, the controls, are
    read at step 0 whatever the step; 0 when no run trained)."""
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        return step
    trained = [r for r in runs if r.trained]
    return max(set.intersection(*(set(r.evals) for r in trained))) if trained else 0


def report(runs: list[Run], step: int | None = None, *, block: int = 5) -> dict[str, pd.DataFrame]:
    """The tables of the module docstring, as DataFrames: `runs` and `rewards` (RULER minus hand per seed, and the
    seeds' mean) with a row per temperature every run measured at step 0, `agreement` and `training`."""
    if not runs:
        raise ValueError("no run given")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an integer >= 1, got {block!r}")
    step_at = compared_step(runs, step)
    temperatures = sorted(set.intersection(*(set(r.evals[0]["temperature"]) for r in runs)))
    if not temperatures:
        raise ValueError("the runs measured no temperature in common")
    rows, compare = [], []
    for temperature in temperatures:
        measured = []
        for r in runs:
            before = at(r.evals[0], temperature)
            row = {"run": r.label, "reward": r.reward, "seed": r.seed, "temperature": temperature, "step": step_at,
                   **{f"before_{k}": v for k, v in measure(before).items()}}
            after = at(r.evals[step_at], temperature) if step_at in r.evals else None
            if after is not None and len(after):
                if r.trained:  # a control is not one of the rewards compared
                    measured.append((r, after))
                row.update({f"after_{k}": v for k, v in measure(after).items() if k != "games"})
                d = paired(*common_games(before, after))
                row.update(difference=d["difference"], low=d["low"], high=d["high"])
            rows.append(row)
        compare += _rewards(measured, temperature, step_at)
    compare = pd.DataFrame(compare).rename(columns={"before": "hand", "after": "ruler", "difference": "ruler_minus_hand"})
    agreement = pd.DataFrame([{"run": r.label, **judge_agreement(r.folder / "groups.jsonl")} for r in runs
                              if r.reward == "ruler" and (r.folder / "groups.jsonl").is_file()])
    training = pd.DataFrame([{"run": r.label, **row} for r in runs if (r.folder / "groups.jsonl").is_file()
                             for row in training_curve(r.folder / "groups.jsonl", block=block)])
    return {"runs": pd.DataFrame(rows), "rewards": compare, "agreement": agreement, "training": training}


def _rewards(measured: list[tuple[Run, pd.DataFrame]], temperature: float, step_at: int) -> list[dict]:
    """RULER minus hand reward at one temperature: per seed that ran both, and the seeds' mean per game."""
    by_seed: dict[int, dict[str, pd.DataFrame]] = {}
    for r, table in measured:
        if r.reward in by_seed.setdefault(r.seed, {}):
            raise ValueError(f"two {r.reward} runs of seed {r.seed} (one is {r.folder})")
        by_seed[r.seed][r.reward] = table
    pairs = {s: p for s, p in sorted(by_seed.items()) if set(p) == {"hand", "ruler"}}
    out = []
    for s, p in pairs.items():
        hand, ruler = common_games(p["hand"], p["ruler"])
        out.append({"seeds": str(s), "temperature": temperature, "step": step_at,
                    **{k: v for k, v in paired(hand, ruler).items() if k != "questions"}, "games": len(hand)})
    if len(pairs) > 1:  # per game, the mean over seeds of each reward's result: the games are shared
        tables = {kind: pd.concat([p[kind]["reward"] for p in pairs.values()], axis=1).dropna()
                  for kind in ("hand", "ruler")}
        games = tables["hand"].index.intersection(tables["ruler"].index)
        d = paired(tables["hand"].loc[games].mean(axis=1).to_numpy(),
                   tables["ruler"].loc[games].mean(axis=1).to_numpy())
        out.append({"seeds": "mean of " + ", ".join(map(str, pairs)) + " (seeds fixed)", "temperature": temperature,
                    "step": step_at, **{k: v for k, v in d.items() if k != "questions"}, "games": len(games)})
    return out


def main(argv=None) -> dict[str, pd.DataFrame]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="report folders of examples/tic_tac_toe.py")
    ap.add_argument("--step", type=int, default=None, help="the policy step compared (default: the largest every "
                    "run measured)")
    ap.add_argument("--block", type=int, default=5, help="loop steps a block of the training curve")
    args = ap.parse_args(argv)
    try:  # report() checks --step and --block
        runs = [load_run(f) for f in args.folders]
        tables = report(runs, args.step, block=args.block)
    except ValueError as exc:
        ap.error(str(exc))
    runs_table = tables["runs"]
    step_at = runs_table["step"].iloc[0]
    controls = {r.label for r in runs if not r.trained}
    missing = sorted({run for run in (runs_table.loc[runs_table["difference"].isna(), "run"]
                                      if "difference" in runs_table else runs_table["run"]) if run not in controls})
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(f"held-out hand reward, step 0 and step {step_at}:")
        print(tables["runs"].to_string(index=False))
        if missing:
            print(f"not measured at step {step_at}, left out of the comparisons: {', '.join(missing)}")
        print("\nRULER minus hand reward, paired by game:")
        print(tables["rewards"].to_string(index=False) if len(tables["rewards"]) else "(no seed ran both rewards)")
        if len(tables["agreement"]):
            print("\nthe RULER judge against the hand reward, within training groups:")
            print(tables["agreement"].to_string(index=False))
        if len(tables["training"]):
            print(f"\ntraining games (temperature 1, training opponents), in blocks of {args.block} loop steps:")
            print(tables["training"].to_string(index=False))
    return tables


if __name__ == "__main__":
    main()
