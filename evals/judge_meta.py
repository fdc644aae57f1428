"""Judge meta-evaluation: how often does a judge agree with people?

Datasets (under `../shared/data/judge-meta`, or `--data-root`):
    llmbar-natural, llmbar-faireval, llmbar-llmeval2, llmbar-mtbench   pairwise, label 1 or 2
    pandalm      pairwise with three annotators (0 = tie): accuracy on unanimous non-tie pairs, unanimous
                 ties reported separately; plus, for the instructions that have all 10 pairings of their
                 5 responses, a group of 5 judged at once and Kendall's tau against the human ranking.
Your own labels: `--dataset PATH` takes a JSONL file of pairs or groups (`ruler_rl.labels.load_user_dataset`,
formats in the README's `ruler eval judge` section); `by=FIELD` adds one summary row per value of an extra field.
Every pair and group goes through `ruler_result`, the code path of `ruler()` that scores training groups. Each pair is
judged in both orders (A,B) and (B,A): swap consistency is how often the two verdicts agree. With
`num_permutations=k > 1` every judgment is itself averaged over k orderings. Resumable: every judgment
is cached, so a rerun only pays for what is missing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

from ruler_rl.errors import JudgeOutputError
from ruler_rl.labels import DatasetError, Group, Pair, conversation, instruction_prompt, load_user_dataset, text_field
from ruler_rl.scoring import ruler_result

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "judge-meta"
LLMBAR = {
    "llmbar-natural": "LLMBar/Natural/dataset.json",
    "llmbar-faireval": "LLMBar/Processed/FairEval/dataset.json",
    "llmbar-llmeval2": "LLMBar/Processed/LLMEval2/dataset.json",
    "llmbar-mtbench": "LLMBar/Processed/MT-Bench/dataset.json",
}
PANDALM = "PandaLM/testset-v1.json"
DATASETS = [*LLMBAR, "pandalm"]


def _load_json(path: Path):
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not readable JSON ({exc})") from None


def load_llmbar(path: Path) -> tuple[list[Pair], int]:
    """The pairs, and how many records were skipped for an empty response (a few exist in LLMEval2)."""
    rows = _load_json(path)
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: expected a list of records")
    pairs, skipped = [], 0
    for i, r in enumerate(rows):
        where = f"{path}[{i}]"
        if not isinstance(r, dict):
            raise DatasetError(f"{where}: not an object")
        a, b = text_field(r, "output_1", where), text_field(r, "output_2", where)
        if r.get("label") not in (1, 2):
            raise DatasetError(f"{where}: label must be 1 or 2, got {r.get('label')!r}")
        if not a.strip() or not b.strip():
            skipped += 1  # an empty response cannot be framed as an answer; counted in the report
            continue
        pairs.append(Pair(f"{path.parent.name}-{i}", text_field(r, "input", where), a, b, r["label"]))
    return pairs, skipped


def load_pandalm(path: Path) -> tuple[list[Pair], list[Pair], list[Group], int]:
    """(unanimous non-tie pairs, unanimous ties, full 5-response groups, unanimous pairs skipped as empty)."""
    rows = _load_json(path)
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: expected a list of records")
    decided, ties, skipped = [], [], 0
    by_prompt: dict[str, list[tuple[str, str, str, str, list[int]]]] = defaultdict(list)
    for i, r in enumerate(rows):
        where = f"{path}[{i}]"
        votes = [r.get(f"annotator{k}") for k in (1, 2, 3)]
        if any(v not in (0, 1, 2) for v in votes):
            raise DatasetError(f"{where}: annotator labels must be 0, 1 or 2, got {votes}")
        a, b = text_field(r, "response1", where), text_field(r, "response2", where)
        prompt = instruction_prompt(r, where)
        models = str(r.get("cmp_key", "")).split("_")
        if len(models) == 2:
            by_prompt[prompt].append((models[0], models[1], a, b, votes))
        if len(set(votes)) == 1:
            if not a.strip() or not b.strip():
                skipped += 1
                continue
            (ties if votes[0] == 0 else decided).append(Pair(f"pandalm-{r.get('idx', i)}", prompt, a, b, votes[0]))
    groups = []
    for prompt, entries in by_prompt.items():
        models = sorted({m for e in entries for m in e[:2]})
        if len(models) != 5 or len(entries) != 10:
            continue
        response = {e[0]: e[2] for e in entries} | {e[1]: e[3] for e in entries}
        wins = dict.fromkeys(models, 0.0)
        for m1, m2, _, _, votes in entries:
            for v in votes:
                wins[m1] += 1.0 if v == 1 else 0.5 if v == 0 else 0.0
                wins[m2] += 1.0 if v == 2 else 0.5 if v == 0 else 0.0
        groups.append(Group(f"pandalm-group-{len(groups)}", prompt, [response[m] for m in models],
                            [wins[m] for m in models]))
    return decided, ties, groups, skipped


def _verdict(s1: float, s2: float) -> int:
    return 0 if abs(s1 - s2) < 1e-9 else (1 if s1 > s2 else 2)


async def _scores(convs, judge, params, k, **opts) -> tuple[list[float] | None, float]:
    """(The judge's scores, or None when it gave no valid answer (an error, not a verdict); what the call cost)."""
    try:
        result = await ruler_result(convs, judge, params, num_permutations=k, **opts)
    except JudgeOutputError:
        return None, 0.0
    return [s.score for s in result.scores], result.cost


async def judge_pair(pair: Pair, judge: str | None, params: dict | None, k: int, **opts) -> dict:
    """Verdicts for (a, b) and for (b, a) mapped back: 1 = a better, 2 = b better, 0 = tie, -1 = error."""
    ab, cost_ab = await _scores([conversation(pair.prompt, pair.a), conversation(pair.prompt, pair.b)], judge, params, k, **opts)
    ba, cost_ba = await _scores([conversation(pair.prompt, pair.b), conversation(pair.prompt, pair.a)], judge, params, k, **opts)
    v_ab = _verdict(ab[0], ab[1]) if ab else -1
    v_ba = _verdict(ba[1], ba[0]) if ba else -1
    return {"id": pair.id, "label": pair.label, "verdict": v_ab, "verdict_swapped": v_ba, "cost": cost_ab + cost_ba}


async def judge_group(group: Group, judge: str | None, params: dict | None, k: int, **opts) -> dict:
    """Kendall's tau between the judge's scores and the human labels (NaN: the judge gave no valid answer)."""
    from scipy.stats import kendalltau

    convs = group.convs or [conversation(group.prompt, r) for r in group.responses]
    if group.tools:
        opts = {**opts, "tools": group.tools}
    scores, cost = await _scores(convs, judge, params, k, **opts)
    if scores is None:
        return {"id": group.id, "tau": float("nan"), "cost": cost}
    tau = kendalltau(scores, group.human).statistic
    return {"id": group.id, "tau": float(tau) if tau == tau else 0.0, "cost": cost}  # NaN (all equal) -> 0


def summarize(dataset: str, k: int, rows: list[dict], seconds: float, ties: list[dict] | None = None,
              groups: list[dict] | None = None, skipped: int = 0) -> dict:
    """One summary row. `cost` is what this run paid the judge (cached judgments cost nothing);
    `pairs_per_s` is NaN when `seconds` is 0 (a breakdown row, whose items were judged among others)."""
    n = len(rows)
    out = {
        "dataset": dataset, "k": k, "pairs": n, "skipped_empty": skipped,
        "accuracy": sum(r["verdict"] == r["label"] for r in rows) / n if n else float("nan"),
        "swap_consistency": sum(r["verdict"] == r["verdict_swapped"] for r in rows) / n if n else float("nan"),
        "judge_ties": sum(r["verdict"] == 0 for r in rows) / n if n else float("nan"),
        "judge_errors": sum(r["verdict"] == -1 or r["verdict_swapped"] == -1 for r in rows),
        "pairs_per_s": n / seconds if seconds > 0 else float("nan"),
    }
    if ties is not None:
        out["human_tie_pairs"] = len(ties)
        out["judge_tie_on_human_ties"] = (sum(r["verdict"] == 0 for r in ties) / len(ties)) if ties else float("nan")
    if groups is not None:
        out["groups"] = len(groups)
        taus = [g["tau"] for g in groups if g["tau"] == g["tau"]]
        out["kendall_tau"] = sum(taus) / len(taus) if taus else float("nan")
    out["cost"] = sum(r.get("cost", 0.0) for r in [*rows, *(ties or []), *(groups or [])])
    return out


MISSING = "(missing)"


def _by_value(item: Pair | Group, by: str) -> str:
    """The row's value of the field `by`, as text (JSON for anything but a string)."""
    value = item.extra.get(by, MISSING)
    return value if isinstance(value, str) else json.dumps(value)


def _load(name, root: Path, limit: int | None, by: str | None):
    """(name, decided pairs, human-tie pairs or None, groups or None, skipped, groups all-equal or None, user?)."""
    if name in DATASETS:
        if name == "pandalm":
            decided, ties, groups, skipped = load_pandalm(root / PANDALM)
        else:
            (decided, skipped), ties, groups = load_llmbar(root / LLMBAR[name]), None, None
        return (name, decided[:limit] if limit else decided, ties[:limit] if (ties is not None and limit) else ties,
                groups[: max(1, limit // 5)] if (groups is not None and limit) else groups, skipped, None, False)
    path = Path(name)
    if not path.exists():
        raise DatasetError(f"unknown dataset {str(name)!r}: not one of {DATASETS} and not a file")
    decided, groups, skipped, uniform = load_user_dataset(path)
    if by is not None and not any(by in x.extra for x in [*decided, *groups]):
        raise DatasetError(f"{path}: no row has the field {by!r} to break results down by")
    return (str(name), decided[:limit] if limit else decided, None, (groups[:limit] if limit else groups) or None,
            skipped, uniform, True)


async def evaluate(datasets: list[str | Path], judge: str | None, *, params: dict | None = None,
                   ks: tuple[int, ...] = (1,), limit: int | None = None, root: Path = DEFAULT_ROOT,
                   concurrency: int = 4, progress: bool = True, by: str | None = None, **opts):
    """One summary row per (dataset, k) plus every per-item row, as pandas DataFrames.

    A dataset is a built-in name (`DATASETS`) or the path of a JSONL file of your own labels
    (`load_user_dataset`; `limit` then caps its pairs and its groups each). Every dataset is loaded and
    checked before the first judgment. With `by=FIELD`, each of your files also gets one summary row per
    value of that field (column `subset`: `all`, or `FIELD=value`; rows without it are `FIELD=(missing)`;
    those rows' `pairs_per_s` is NaN); built-in sets, which have no extra fields, get only their `all` row.
    """
    import pandas as pd
    from tqdm import tqdm

    if any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"permutation counts must be integers >= 1, got {ks}")
    if limit is not None and limit < 1:
        raise ValueError("limit must be >= 1")
    if by is not None and not by.strip():
        raise ValueError("by must name a field")
    loaded = [_load(d, root, limit, by) for d in datasets]
    sem = asyncio.Semaphore(max(1, concurrency))

    async def bounded(coro, bar):
        async with sem:
            try:
                return await coro
            finally:
                bar.update(1)

    async def run_all(make, items, desc):
        bar = tqdm(total=len(items), desc=desc, disable=not progress, leave=False)
        try:
            return list(await asyncio.gather(*(bounded(make(x), bar) for x in items)))
        finally:
            bar.close()

    summary, detail = [], []
    for name, decided, ties, groups, skipped, uniform, user in loaded:
        for k in ks:
            started = time.perf_counter()
            rows = await run_all(lambda p, k=k: judge_pair(p, judge, params, k, **opts), decided, f"{name} k={k}")
            seconds = time.perf_counter() - started
            tie_rows = (await run_all(lambda p, k=k: judge_pair(p, judge, params, k, **opts), ties, f"{name} ties k={k}")
                        if ties is not None else None)
            group_rows = (await run_all(lambda g, k=k: judge_group(g, judge, params, k, **opts), groups,
                                        f"{name} groups k={k}") if groups is not None else None)
            row = summarize(name, k, rows, seconds, tie_rows, group_rows, skipped)
            if user:
                row["skipped_uniform"] = uniform
            summary.append({**row, "subset": "all"} if by else row)
            if by and user:
                keys = [_by_value(p, by) for p in decided]
                gkeys = [_by_value(g, by) for g in groups or []]
                for value in sorted(set(keys) | set(gkeys)):
                    sub_rows = [r for r, key in zip(rows, keys, strict=True) if key == value]
                    sub_groups = ([r for r, key in zip(group_rows, gkeys, strict=True) if key == value]
                                  if group_rows is not None else None)
                    summary.append({**summarize(name, k, sub_rows, 0.0, None, sub_groups), "subset": f"{by}={value}"})
            for kind, items, results in (("pair", decided, rows), ("tie", ties or [], tie_rows or []),
                                         ("group", groups or [], group_rows or [])):
                detail += [{"dataset": name, "k": k, "kind": kind, **({by: _by_value(x, by)} if by else {}), **r}
                           for x, r in zip(items, results, strict=True)]
    columns = ["dataset", "subset"] if by else ["dataset"]
    frame = pd.DataFrame(summary)
    return frame[columns + [c for c in frame.columns if c not in columns]], pd.DataFrame(detail)


def save_report(summary, detail, out: Path, title: str) -> list[Path]:
    """summary.parquet/.csv, detail.parquet and a bar chart PNG of accuracy and swap consistency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.parquet", out / "summary.csv", out / "detail.parquet", out / "judge_meta.png"]
    summary.to_parquet(paths[0], index=False)
    summary.to_csv(paths[1], index=False)
    detail.astype({c: "string" for c in detail.columns if detail[c].dtype == object}).to_parquet(paths[2], index=False)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(summary)), 4))
    subsets = summary["subset"] if "subset" in summary else [""] * len(summary)
    labels = [f"{Path(str(d)).name}{'' if s in ('', 'all') else chr(10) + s}\nk={k}"
              for d, k, s in zip(summary["dataset"], summary["k"], subsets, strict=True)]
    x = range(len(summary))
    ax.bar([i - 0.27 for i in x], summary["accuracy"], width=0.27, label="accuracy vs humans")
    ax.bar(list(x), summary["swap_consistency"], width=0.27, label="swap consistency")
    ax.bar([i + 0.27 for i in x], summary["judge_ties"], width=0.27, label="judge ties (count as wrong)")
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance (pairwise)")
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[3], dpi=120)
    plt.close(fig)
    return paths


CASESTUDY = "LLMBar/CaseStudy"


def write_casestudy_jsonl(out: Path, root: Path = DEFAULT_ROOT, per_case: int | None = None) -> int:
    """LLMBar's case-study pairs (`CaseStudy/<case>/dataset.json`: Base_9, Base_10, Constraint, Negation, Normal;
    gold labels, none of them in `DATASETS`) written to `out` as a labelled-pairs JSONL file in the format
    `ruler eval judge --dataset` reads from users (LLMBar's own field names, one pair a line, its case in the
    extra field `case` for `by="case"`); `per_case` (an integer >= 1, or None for all) keeps the first that many
    pairs of each case. Returns the number of pairs written; a missing or malformed set is a DatasetError, and
    `out` is not written then."""
    if per_case is not None and (isinstance(per_case, bool) or not isinstance(per_case, int) or per_case < 1):
        raise ValueError(f"per_case must be an integer >= 1 or None, got {per_case!r}")
    base = Path(root) / CASESTUDY
    cases = sorted(p.name for p in base.iterdir() if (p / "dataset.json").is_file()) if base.is_dir() else []
    if not cases:
        raise DatasetError(f"no LLMBar case-study sets under {base}")
    lines = []
    for case in cases:
        path = base / case / "dataset.json"
        rows = _load_json(path)
        if not isinstance(rows, list):
            raise DatasetError(f"{path}: expected a list of records")
        for i, r in enumerate(rows[:per_case]):
            where = f"{path}[{i}]"
            if not isinstance(r, dict) or r.get("label") not in (1, 2):
                raise DatasetError(f"{where}: expected a record with label 1 or 2")
            lines.append(json.dumps({"id": f"{case}-{i}", "input": text_field(r, "input", where),
                                     "output_1": text_field(r, "output_1", where),
                                     "output_2": text_field(r, "output_2", where), "label": r["label"],
                                     "case": case}, ensure_ascii=False))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


if __name__ == "__main__":  # python -m evals.judge_meta casestudy OUT [--root ROOT]
    import argparse

    ap = argparse.ArgumentParser(prog="python -m evals.judge_meta", description="Write LLMBar's case-study pairs as a "
                                 "labelled-pairs JSONL file (the format `ruler eval judge --dataset` reads).")
    ap.add_argument("what", choices=["casestudy"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="judge-meta data root (holds LLMBar/)")
    ap.add_argument("--per-case", type=int, default=None, help="the first N pairs of each case (default: all)")
    a = ap.parse_args()
    try:
        print(f"{write_casestudy_jsonl(a.out, a.root, a.per_case)} pairs written to {a.out}")
    except (DatasetError, ValueError) as exc:  # a missing set, or --per-case below 1
        raise SystemExit(f"error: {exc}") from None
