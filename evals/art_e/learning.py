"""Reading an ART·E learning run's report folders (`examples/email_agent.py --report DIR`): accuracy before and
after with paired intervals, over one seed or several, and how well the training reward ranked right answers.

    python -m evals.art_e.learning DIR [DIR ...] [--regrade] [--keep-questions FILE.jsonl] [--step N]

- accuracy: each folder's before.parquet / after.parquet (the same test questions, measured greedy before and
  after training); `--regrade` decides correctness again with today's matcher (`match_verdict`: only an
  "accept" counts, so an answer it would send to a judge counts as wrong here) from the recorded answers and
  references, so runs measured with an older matcher are read with the current one;
- paired intervals: after minus before per question (a paired bootstrap over questions, 95%); with several
  folders, also the seeds' mean after minus the shared before, per question;
- `--keep-questions`: only the test questions whose (question, reference) are in FILE (a scenarios JSONL, e.g.
  the current generator's), so questions a later generator no longer writes are left out;
- the reward's signal (`groups.jsonl`): in every training group holding right and wrong rollouts, each
  (right, wrong) pair counts as a win when the reward ranks the right one higher, a tie, or a loss;
- both count the groups of a batch the trainer refused (run.json's `batches_refused`, each group's `batch`): its
  rollouts were sampled by the policy of that step and ranked by the reward all the same;
- the training curve (`groups.jsonl`): the share of training rollouts (sampled at the run's temperature, on
  training questions: not a held-out measure) answered right, in blocks of `--block` steps, with a bootstrap
  interval over the block's groups, and the first block against the rest;
- `--step N`: every folder read at policy step N (its eval-stepNNNN.parquet, or after.parquet where the run ended
  at step N; a folder with neither is left out, saying so), so seeds whose runs ended at different steps are
  compared, and averaged, where all of them were measured;
- a folder without after.parquet (a run whose after-evaluation was not brought back) is read against its latest
  eval-stepNNNN.parquet (`examples/email_agent.py --eval-every`), named so in the table; without either, it gives
  its before count and its training curve only; the seeds' mean is formed only over folders whose run.json agree
  beyond seed, names and stopping rules (time budget, `--steps`) and that measured the same policy step (the
  run's `policy_step` for after.parquet, NNNN for eval-stepNNNN.parquet): a seed the budget stopped at step 3
  is not averaged with one measured at step 6;
- held-out accuracy is also given within each question kind (`paired_by_kind`), to show where a change came from;
- the training curve is also given within each question kind: the questions drawn differ by step, and kinds
  differ in how often they are answered right, so a rise over all kinds can be a change of mix.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from evals.art_e.matching import IDK


def _regraded(df: pd.DataFrame) -> pd.DataFrame:
    from evals.art_e.matching import match_verdict

    out = df.copy()
    answered = out["answer"].notna() & (out["answer"] != IDK)
    out["correct"] = [bool(a) and match_verdict(ans, ref, q) == "accept"
                      for a, ans, ref, q in zip(answered, out["answer"], out["reference"], out["question"],
                                                strict=True)]
    return out


def latest_eval(folder: str | Path) -> str | None:
    """The name of the report folder's latest eval-stepNNNN.parquet (`--eval-every`), or None."""
    found = sorted(Path(folder).glob("eval-step[0-9][0-9][0-9][0-9].parquet"))
    return found[-1].name if found else None


def load_run(folder: str | Path, *, regrade: bool = False, keep: set[tuple[str, str]] | None = None,
             after: str = "after.parquet"):
    """(before, after) results tables of one report folder, optionally regraded and filtered to `keep`; `after`
    names the table measured after training (e.g. `latest_eval(folder)` for a run cut before its end). Tables are
    indexed by question text, which pairs before with after: a table holding a question twice raises ValueError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no report folder at {folder}")
    tables = []
    for name in ("before.parquet", after):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} has no {name}: not a finished learning run")
        df = pd.read_parquet(folder / name)
        if regrade:
            df = _regraded(df)
        if keep is not None:
            df = df[[(q, r) in keep for q, r in zip(df["question"], df["reference"], strict=True)]]
        twice = df["question"][df["question"].duplicated()]
        if len(twice):  # pairing is by question text: a question held twice would pair ambiguously
            raise ValueError(f"{folder / name} holds {twice.nunique()} question(s) more than once (first: "
                             f"{twice.iloc[0]!r}); before/after pairing is by question text")
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


def paired_by_kind(before: pd.DataFrame, after: pd.DataFrame, *, resamples: int = 4000,
                   seed: int = 0) -> pd.DataFrame:
    """`paired` within each question kind (`before`'s `kind` column: phone, date, ..., human for the annotated
    set; "?" where missing) over the questions both tables hold, matched by index, one row per kind: the kinds a
    run trained on can move while the others do not, which the overall interval blurs. Not a second test of the
    overall result: read it as where a change came from."""
    for name, df in (("before", before), ("after", after)):
        if not isinstance(df, pd.DataFrame) or "kind" not in df.columns or "correct" not in df.columns:
            raise ValueError(f"{name} must be a results table with 'kind' and 'correct' columns (load_run's)")
    common = before.index.intersection(after.index)
    if not len(common):
        raise ValueError("before and after hold no question in common")
    kinds = before.loc[common, "kind"].fillna("?")
    rows = []
    for kind in sorted(set(kinds)):
        idx = common[(kinds == kind).to_numpy()]
        b, a = before.loc[idx, "correct"].astype(float), after.loc[idx, "correct"].astype(float)
        rows.append({"kind": kind, "right_before": int(b.sum()), "right_after": int(a.sum()),
                     **paired(b, a, resamples=resamples, seed=seed)})
    return pd.DataFrame(rows)


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


def _resampled(groups: list[list[int]], rng, resamples: int = 4000) -> np.ndarray:
    """Bootstrap totals over `groups` (each a list of 0/1): a (resamples, 2) array of (right, rollouts), resampling
    groups (rollouts of one question are not independent)."""
    totals = np.array([[sum(g), len(g)] for g in groups], float)
    return totals[rng.integers(0, len(groups), size=(resamples, len(groups)))].sum(axis=1)


def share_interval(groups: list[list[int]], rng, resamples: int = 4000) -> tuple[float, float, float]:
    """Share of right rollouts over `groups` (each a list of 0/1) and its 95% bootstrap interval over groups."""
    boot = _resampled(groups, rng, resamples)
    boot = boot[:, 0] / boot[:, 1]
    return sum(map(sum, groups)) / sum(map(len, groups)), float(np.quantile(boot, 0.025)), \
        float(np.quantile(boot, 0.975))


def scenario_kind(scenario_id: str) -> str | None:
    """The question kind a generated scenario's id carries (`inbox-email-KIND[-n]`), or None (annotated ids)."""
    from evals.art_e.questions import KINDS

    return next((part for part in str(scenario_id).split("-")[1:] if part in KINDS), None)


def training_curve(groups_jsonl: str | Path, *, block: int = 4, seed: int = 0,
                   kind: str | None = None) -> tuple[pd.DataFrame, dict]:
    """The training rollouts' correctness by blocks of `block` steps, and the first block against the rest.

    Returns (table, comparison): one row per block (the steps it holds, groups, rollouts, right, share and its 95%
    interval over groups, mean ART reward, mean turns), and the later blocks' share minus the first block's with a
    95% bootstrap interval (groups resampled within each side; no `difference` with one block). Every logged group
    counts, scored or not: the rollouts were sampled either way. `kind` keeps the groups of one question kind
    (`scenario_kind`): the questions drawn differ from step to step, and kinds differ in how often they are
    answered right, so a rise over all kinds can be a change of mix; compare within a kind."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    rows = [json.loads(line) for line in Path(groups_jsonl).read_text().splitlines() if line.strip()]
    if kind is not None:
        rows = [g for g in rows if scenario_kind(g.get("scenario_id", "")) == kind]
    if not rows:
        raise ValueError(f"{groups_jsonl} holds no groups" + (f" of kind {kind!r}" if kind else ""))
    rng = np.random.default_rng(seed)
    blocks: dict[int, list[dict]] = {}
    for g in rows:
        blocks.setdefault(int(g["step"]) // block, []).append(g)

    def right_of(gs):
        return [[int(bool(r.get("correct"))) for r in g["rollouts"]] for g in gs if g["rollouts"]]

    table = []
    for _, gs in sorted(blocks.items()):
        rs = [r for g in gs for r in g["rollouts"]]
        share, low, high = share_interval(right_of(gs), rng)
        art = [r["art_reward"] for r in rs if r.get("art_reward") is not None]
        turns = [r["turns"] for r in rs if r.get("turns") is not None]
        steps = [int(g["step"]) for g in gs]
        table.append({"steps": f"{min(steps)}-{max(steps)}", "groups": len(gs), "rollouts": len(rs),
                      "right": sum(map(sum, right_of(gs))), "share": share, "low": low, "high": high,
                      "art_reward": float(np.mean(art)) if art else float("nan"),
                      "turns": float(np.mean(turns)) if turns else float("nan")})
    first = right_of(blocks[min(blocks)])
    rest = right_of([g for b, gs in blocks.items() if b != min(blocks) for g in gs])
    comparison = {"first": table[0]["steps"], "first_share": sum(map(sum, first)) / sum(map(len, first))}
    if rest:
        bf, br = _resampled(first, rng), _resampled(rest, rng)
        diff = br[:, 0] / br[:, 1] - bf[:, 0] / bf[:, 1]
        later = sum(map(sum, rest)) / sum(map(len, rest))
        comparison.update(later_share=float(later), difference=float(later - comparison["first_share"]),
                          low=float(np.quantile(diff, 0.025)), high=float(np.quantile(diff, 0.975)))
    return pd.DataFrame(table), comparison


# run.json keys that may differ between seeds of one configuration (names, paths, stopping rules, what they did)
# (`commit` too, though a commit can change what a run does without another key showing it: the seeds' mean names
# the commits when they differ)
_PER_RUN = {"seed", "name", "out", "report", "db", "time_budget_s", "steps", "steps_run", "steps_refused",
            "batches_refused", "policy_step", "seconds", "commit"}


def run_info(folder: Path) -> dict | None:
    """The report folder's run.json (`examples/email_agent.py`), or None where it has none."""
    path = folder / "run.json"
    return json.loads(path.read_text()) if path.is_file() else None


def measured_step(after: str, info: dict | None) -> int | None:
    """The policy step the table `after` measured: NNNN of eval-stepNNNN.parquet, the run's `policy_step` (its
    run.json, `info`) for after.parquet; None where run.json does not say."""
    found = re.fullmatch(r"eval-step(\d{4})\.parquet", after)
    if found:
        return int(found.group(1))
    step = (info or {}).get("policy_step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _configuration(info: dict | None) -> dict | None:
    return None if info is None else {k: v for k, v in info.items() if k not in _PER_RUN}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--regrade", action="store_true", help="decide correctness again with today's matcher")
    ap.add_argument("--keep-questions", type=Path, default=None, help="a scenarios JSONL: only its questions")
    ap.add_argument("--block", type=int, default=4, help="steps per block of the training curve")
    ap.add_argument("--step", type=int, default=None, help="read every folder at this policy step")
    args = ap.parse_args(argv)
    if args.block < 1:
        ap.error("--block must be >= 1")
    if args.step is not None and args.step < 1:
        ap.error("--step must be >= 1 (step 0 is before.parquet)")
    keep = None
    if args.keep_questions:
        keep = {(s["question"], s["answer"]) for s in map(json.loads, args.keep_questions.read_text().splitlines())}
    for f in args.folders:
        if not f.is_dir():
            ap.error(f"no report folder at {f}")
        if not (f / "before.parquet").is_file():
            ap.error(f"{f} has no before.parquet: not a learning run's report folder")

    def read(folder: Path, after: str):
        try:
            return load_run(folder, regrade=args.regrade, keep=keep, after=after)
        except ValueError as e:  # a table that cannot be paired: a message, not a traceback
            ap.error(str(e))

    runs, measured, commits = {}, {}, {}
    for f in args.folders:
        info = run_info(f)
        after = "after.parquet" if (f / "after.parquet").is_file() else latest_eval(f)
        if args.step is not None:
            at = f"eval-step{args.step:04d}.parquet"
            if (f / at).is_file():
                after = at
            elif after != "after.parquet" or measured_step(after, info) != args.step:
                print(f"{f.name}: not measured at policy step {args.step}; left out")
                continue
        if after is None:  # the before count alone: nothing to pair it with
            before, _ = read(f, "before.parquet")
            print(f"{f.name}: no after.parquet, no eval-step*.parquet; before {int(before['correct'].sum())}/"
                  f"{len(before)} right")
            continue
        name = (f.name if after == "after.parquet" else f"{f.name} ({after})" if (f / "after.parquet").is_file()
                else f"{f.name} ({after}, no after.parquet)")
        runs[name] = read(f, after)
        measured[name] = (measured_step(after, info), _configuration(info))
        commits[name] = (info or {}).get("commit")
    rows = []
    for name, (before, after) in runs.items():
        common = before.index.intersection(after.index)
        rows.append({"run": name, **paired(before.loc[common, "correct"], after.loc[common, "correct"])})
    if len(runs) > 1:
        points, configurations = zip(*measured.values(), strict=True)
        if (len(set(points)) > 1 or None in points or None in configurations
                or any(c != configurations[0] for c in configurations)):
            print("no seeds' mean: the folders are not seeds of one configuration measured at the same policy step "
                  f"(steps measured: {', '.join(f'{n} {p}' for n, p in zip(measured, points, strict=True))}; "
                  "or their run.json differ beyond seed, names and stopping rules)")
        else:
            common = sorted(set.intersection(*(set(b.index) & set(a.index) for b, a in runs.values())))
            before = np.mean([b.loc[common, "correct"].astype(float) for b, _ in runs.values()], axis=0)
            after = np.mean([a.loc[common, "correct"].astype(float) for _, a in runs.values()], axis=0)
            rows.append({"run": "seeds' mean", **paired(before, after)})
            if len(set(commits.values())) > 1:
                print("note: these seeds ran from different commits (" + ", ".join(
                    f"{n} {c[:12] if c else 'unknown'}" for n, c in commits.items()) + "); the mean assumes the "
                    "commits between them do not change what a run does")
    if rows:
        print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    for name, (before, after) in runs.items():
        print(f"{name}: held out, by question kind (where a change came from; the overall row above is the test)")
        print(paired_by_kind(before, after).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    for f in args.folders:
        if (f / "groups.jsonl").is_file():
            print(f"{f.name}: reward signal {reward_signal(f / 'groups.jsonl')}")
            table, comparison = training_curve(f / "groups.jsonl", block=args.block)
            print(f"{f.name}: training rollouts answered right, by {args.block} steps (training questions; the "
                  "questions drawn differ by step: compare within a kind)")
            print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
            print(f"{f.name}: later blocks minus the first {comparison}")
            kinds = sorted({k for line in (f / "groups.jsonl").read_text().splitlines() if line.strip()
                            if (k := scenario_kind(json.loads(line).get("scenario_id", ""))) is not None})
            for kind in kinds:
                print(f"{f.name}: {kind} questions only, later blocks minus the first "
                      f"{training_curve(f / 'groups.jsonl', block=args.block, kind=kind)[1]}")

if __name__ == "__main__":
    main()
