"""Reading an ART·E learning run's report folders (`examples/email_agent.py --report DIR`): accuracy before and
after with paired intervals, over one seed or several, and how well the training reward ranked right answers.

    python -m evals.art_e.learning DIR [DIR ...] [--regrade] [--keep-questions FILE.jsonl]

- accuracy: each folder's before.parquet / after.parquet (the same test questions, measured greedy before and
  after training); `--regrade` decides correctness again with today's matcher (`match_verdict`: only an
  "accept" counts, so an answer it would send to a judge counts as wrong here) from the recorded answers and
  references, so runs measured with an older matcher are read with the current one;
- paired intervals: after minus before per question (a paired bootstrap over questions, 95%); with several
  folders, also the seeds' mean after minus the shared before, per question;
- `--keep-questions`: only the test questions whose (question, reference) are in FILE (a scenarios JSONL, e.g.
  the current generator's), so questions a later generator no longer writes are left out;
- the reward's signal (`groups.jsonl`): in every training group holding right and wrong rollouts, each
  (right, wrong) pair counts as a win when the reward ranks the right one higher, a tie, or a loss.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from evals.art_e.matching import IDK


def _regraded(df: pd.DataFrame) -> pd.DataFrame:
    from evals.art_e.matching import match_verdict

    out = df.copy()
    answered = out["answer"].notna() & (out["answer"] != IDK)
    out["correct"] = [bool(a) and match_verdict(ans, ref, q) == "accept"
                      for a, ans, ref, q in zip(answered, out["answer"], out["reference"], out["question"])]
    return out


def load_run(folder: str | Path, *, regrade: bool = False, keep: set[tuple[str, str]] | None = None):
    """(before, after) results tables of one report folder, optionally regraded and filtered to `keep`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no report folder at {folder}")
    tables = []
    for name in ("before.parquet", "after.parquet"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} has no {name}: not a finished learning run")
        df = pd.read_parquet(folder / name)
        if regrade:
            df = _regraded(df)
        if keep is not None:
            df = df[[(q, r) in keep for q, r in zip(df["question"], df["reference"])]]
        tables.append(df.set_index("question").sort_index())
    return tables[0], tables[1]


def paired(before: np.ndarray, after: np.ndarray, *, resamples: int = 4000, seed: int = 0) -> dict:
    """Mean before, mean after, their difference and its 95% paired-bootstrap interval."""
    before, after = np.asarray(before, float), np.asarray(after, float)
    if before.shape != after.shape or before.ndim != 1 or not len(before):
        raise ValueError("before and after must be equal-length, non-empty 1-d arrays (one value per question)")
    d = after - before
    boot = d[np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    return {"questions": len(d), "before": before.mean(), "after": after.mean(), "difference": d.mean(),
            "low": float(np.quantile(boot, 0.025)), "high": float(np.quantile(boot, 0.975))}


def reward_signal(groups_jsonl: str | Path) -> dict:
    """How the training reward ranked right (`correct` 1) against wrong rollouts, over every scored group."""
    wins = ties = losses = mixed = groups = all_right = 0
    for line in Path(groups_jsonl).read_text().splitlines():
        g = json.loads(line)
        if not g.get("scored"):
            continue
        groups += 1
        rows = [r for r in g["rollouts"] if r.get("reward") is not None and r.get("correct") is not None]
        right = [r["reward"] for r in rows if r["correct"]]
        wrong = [r["reward"] for r in rows if not r["correct"]]
        all_right += bool(right) and not wrong
        if right and wrong:
            mixed += 1
            for a in right:
                for b in wrong:
                    wins += a > b
                    ties += a == b
                    losses += a < b
    pairs = wins + ties + losses
    return {"groups": groups, "groups_mixed": mixed, "groups_all_right": all_right, "pairs": pairs,
            "wins": wins, "ties": ties, "losses": losses,
            "pairwise_accuracy": (wins + 0.5 * ties) / pairs if pairs else float("nan")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--regrade", action="store_true", help="decide correctness again with today's matcher")
    ap.add_argument("--keep-questions", type=Path, default=None, help="a scenarios JSONL: only its questions")
    args = ap.parse_args(argv)
    keep = None
    if args.keep_questions:
        keep = {(s["question"], s["answer"]) for s in map(json.loads, args.keep_questions.read_text().splitlines())}
    runs = {f.name: load_run(f, regrade=args.regrade, keep=keep) for f in args.folders}
    rows = []
    for name, (before, after) in runs.items():
        common = before.index.intersection(after.index)
        rows.append({"run": name, **paired(before.loc[common, "correct"], after.loc[common, "correct"])})
    if len(runs) > 1:
        common = sorted(set.intersection(*(set(b.index) & set(a.index) for b, a in runs.values())))
        before = np.mean([b.loc[common, "correct"].astype(float) for b, _ in runs.values()], axis=0)
        after = np.mean([a.loc[common, "correct"].astype(float) for _, a in runs.values()], axis=0)
        rows.append({"run": "seeds' mean", **paired(before, after)})
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    for f in args.folders:
        if (f / "groups.jsonl").is_file():
            print(f"{f.name}: reward signal {reward_signal(f / 'groups.jsonl')}")


if __name__ == "__main__":
    main()
