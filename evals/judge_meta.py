"""Judge meta-evaluation: how often does a judge agree with people?

Datasets (under `../shared/data/judge-meta`, or `--data-root`):
    llmbar-natural, llmbar-faireval, llmbar-llmeval2, llmbar-mtbench   pairwise, label 1 or 2
    pandalm      pairwise with three annotators (0 = tie): accuracy on unanimous non-tie pairs, unanimous
                 ties reported separately; plus, for the instructions that have all 10 pairings of their
                 5 responses, a group of 5 judged at once and Kendall's tau against the human ranking.
Your own labels: `--dataset PATH` takes a JSONL file of pairs or groups (`load_user_dataset`, formats in the
README's `ruler eval judge` section); `by=FIELD` adds one summary row per value of an extra field.
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
from dataclasses import dataclass, field
from pathlib import Path

from ruler.errors import JudgeOutputError
from ruler.scoring import ruler_result

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "judge-meta"
LLMBAR = {
    "llmbar-natural": "LLMBar/Natural/dataset.json",
    "llmbar-faireval": "LLMBar/Processed/FairEval/dataset.json",
    "llmbar-llmeval2": "LLMBar/Processed/LLMEval2/dataset.json",
    "llmbar-mtbench": "LLMBar/Processed/MT-Bench/dataset.json",
}
PANDALM = "PandaLM/testset-v1.json"
DATASETS = [*LLMBAR, "pandalm"]


class DatasetError(ValueError):
    """A dataset file or record that cannot be used, named by path and record index."""


@dataclass
class Pair:
    id: str
    prompt: str
    a: str
    b: str
    label: int  # 1: a is better, 2: b is better, 0: a tie (PandaLM only)
    extra: dict = field(default_factory=dict)  # a user row's other fields, for `by=`


@dataclass
class Group:
    id: str
    prompt: str
    responses: list[str]
    human: list[float]  # the human label per response, higher is better (PandaLM: wins from pairwise votes)
    convs: list[list[dict]] | None = None  # whole conversations (a TrajectoryGroup row); else prompt + response
    tools: list[dict] | None = None  # tool schemas offered in those conversations
    extra: dict = field(default_factory=dict)


def _load_json(path: Path):
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not readable JSON ({exc})") from None


def _text(rec: dict, key: str, where: str) -> str:
    """A text field; plain numbers and booleans (PandaLM has a few, e.g. `true`) are taken as their text."""
    value = rec.get(key)
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {key!r} is missing or not text")
    return value


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
        a, b = _text(r, "output_1", where), _text(r, "output_2", where)
        if r.get("label") not in (1, 2):
            raise DatasetError(f"{where}: label must be 1 or 2, got {r.get('label')!r}")
        if not a.strip() or not b.strip():
            skipped += 1  # an empty response cannot be framed as an answer; counted in the report
            continue
        pairs.append(Pair(f"{path.parent.name}-{i}", _text(r, "input", where), a, b, r["label"]))
    return pairs, skipped


def _pandalm_prompt(r: dict, where: str) -> str:
    instruction, inp = _text(r, "instruction", where), r.get("input") or ""
    return instruction + (f"\n\n{inp}" if inp else "")


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
        a, b = _text(r, "response1", where), _text(r, "response2", where)
        prompt = _pandalm_prompt(r, where)
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


PAIR_FIELDS = ({"output_1", "output_2", "label"}, {"response_a", "response_b", "preferred"})
PROMPT_FIELDS = {"task", "instruction", "input"}
GROUP_FIELDS = {"responses", "scores", "ranking"}


def _user_prompt(r: dict, where: str) -> str:
    """`task`, or `instruction` (with `input` appended when both are given, as PandaLM does), or `input`."""
    if "task" in r:
        if "instruction" in r or "input" in r:
            raise DatasetError(f"{where}: give the prompt as 'task' or as 'instruction'/'input', not both")
        return _text(r, "task", where)
    if "instruction" in r:
        return _pandalm_prompt(r, where)
    if "input" in r:
        return _text(r, "input", where)
    raise DatasetError(f"{where}: no prompt: field 'task', 'instruction' or 'input' is missing")


def _number(value, where: str, what: str) -> float:
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DatasetError(f"{where}: {what} must be a finite number, got {value!r}")
    return float(value)


def _user_pair(r: dict, where: str, rid: str) -> Pair | None:
    llmbar, ours = ({f for f in names if f in r} for names in PAIR_FIELDS)
    if llmbar and ours:
        raise DatasetError(f"{where}: mixes LLMBar's fields {sorted(llmbar)} with {sorted(ours)}; use one naming")
    names = ("output_1", "output_2", "label") if llmbar or not ours else ("response_a", "response_b", "preferred")
    missing = [f for f in names if f not in r]
    if missing:
        raise DatasetError(f"{where}: not a pair nor a group: field {missing[0]!r} is missing (a pair needs "
                           f"{'/'.join(names)}; a group needs 'responses' or 'trajectories')")
    prompt, a, b = _user_prompt(r, where), _text(r, names[0], where), _text(r, names[1], where)
    raw = r[names[2]]
    labels = {1: 1, 2: 2} if names[2] == "label" else {1: 1, 2: 2, "a": 1, "b": 2, "A": 1, "B": 2}
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or raw not in labels:
        allowed = "1 or 2" if names[2] == "label" else "'a', 'b', 1 or 2"
        raise DatasetError(f"{where}: field {names[2]!r} must be {allowed}, got {raw!r}")
    if not a.strip() or not b.strip():
        return None
    extra = {k: v for k, v in r.items() if k not in {*names, *PROMPT_FIELDS, "id"}}
    return Pair(rid, prompt, a, b, labels[raw], extra)


def _user_group(r: dict, where: str, rid: str) -> Group | None:
    prompt = _user_prompt(r, where)
    responses = r["responses"]
    if not isinstance(responses, list) or len(responses) < 2:
        raise DatasetError(f"{where}: field 'responses' must be a list of at least 2 texts")
    bad = [i for i, x in enumerate(responses) if not isinstance(x, str)]
    if bad:
        raise DatasetError(f"{where}: field 'responses' must hold texts; responses[{bad[0]}] is not text")
    texts = responses
    if ("scores" in r) == ("ranking" in r):
        raise DatasetError(f"{where}: a group needs exactly one of 'scores' and 'ranking'")
    n = len(texts)
    if "scores" in r:
        scores = r["scores"]
        if not isinstance(scores, list) or len(scores) != n:
            raise DatasetError(f"{where}: field 'scores' must be a list of {n} numbers (one per response), "
                               f"got {len(scores) if isinstance(scores, list) else type(scores).__name__}")
        human = [_number(x, where, f"scores[{i}]") for i, x in enumerate(scores)]
    else:
        ranking = r["ranking"]
        if (not isinstance(ranking, list) or len(ranking) != n
                or any(isinstance(x, bool) or not isinstance(x, int) for x in ranking)):
            raise DatasetError(f"{where}: field 'ranking' must list the {n} response indices (0-based), best first")
        if sorted(ranking) != list(range(n)):
            dup = sorted({x for x in ranking if ranking.count(x) > 1})
            why = f"duplicate {dup}" if dup else f"out of range {sorted(x for x in ranking if not 0 <= x < n)}"
            raise DatasetError(f"{where}: field 'ranking' must be a permutation of 0..{n - 1}, best first ({why})")
        human = [0.0] * n
        for place, index in enumerate(ranking):
            human[index] = float(n - place)
    if not all(t.strip() for t in texts):
        return None
    extra = {k: v for k, v in r.items() if k not in {*GROUP_FIELDS, *PROMPT_FIELDS, "id"}}
    return Group(rid, prompt, texts, human, extra=extra)


def _trajectory_group(r: dict, where: str, rid: str) -> Group:
    import pydantic

    from ruler import TrajectoryGroup
    from ruler.trajectory import validate_trajectories

    try:
        group = TrajectoryGroup.model_validate(r)
        validate_trajectories(group)
    except (pydantic.ValidationError, ValueError) as exc:
        raise DatasetError(f"{where}: not a valid TrajectoryGroup: {exc}") from None
    ts = group.trajectories
    if len(ts) < 2:
        raise DatasetError(f"{where}: a TrajectoryGroup needs at least 2 trajectories, got {len(ts)}")
    marked = ["independent_reward" in t.metrics for t in ts]
    if any(marked) and not all(marked):
        raise DatasetError(f"{where}: metrics.independent_reward is on some trajectories but not all "
                           f"(missing on {[i for i, m in enumerate(marked) if not m]})")
    human = [_number(t.metrics["independent_reward"] if all(marked) else t.reward, where,
                     f"trajectories[{i}] label") for i, t in enumerate(ts)]
    tools = {json.dumps(tool, sort_keys=True): tool for t in ts for tool in t.tools or []}
    return Group(rid, "", [], human, convs=[t.messages() for t in ts], tools=list(tools.values()) or None,
                 extra=dict(group.metadata))


def load_user_dataset(path: Path) -> tuple[list[Pair], list[Group], int, int]:
    """A JSONL file of labelled pairs and/or groups: (pairs, groups, rows skipped for an empty response,
    groups skipped because every label is equal). Errors name `path:line` and the field.

    A row with `trajectories` is a TrajectoryGroup (labels: every trajectory's `metrics.independent_reward`
    when all have one, else `reward`; `--by` reads its `metadata`); a row with `responses` is a group
    (`scores`, higher is better, or `ranking`: 0-based response indices, best first); any other row is a pair.
    Fields a row does not use are kept for `by=`.
    """
    path = Path(path)
    if path.is_dir():
        raise DatasetError(f"{path} is a folder; give a JSONL file")
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    pairs, groups, skipped, uniform = [], [], 0, 0
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not a JSON object ({exc.msg})") from None
        if not isinstance(r, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(r).__name__}")
        rid = str(r.get("id", f"{path.stem}:{lineno}"))
        if "trajectories" in r:
            item = _trajectory_group(r, where, rid)
        elif "responses" in r:
            item = _user_group(r, where, rid)
        else:
            item = _user_pair(r, where, rid)
        if item is None:
            skipped += 1
        elif isinstance(item, Pair):
            pairs.append(item)
        elif len(set(item.human)) < 2:
            uniform += 1  # every response labelled the same: no preference to agree with
        else:
            groups.append(item)
    if not pairs and not groups:
        raise DatasetError(f"{path}: no usable rows (empty file, or every row skipped: {skipped} with an empty "
                           f"response, {uniform} groups with all labels equal)")
    return pairs, groups, skipped, uniform


def _convo(prompt: str, response: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


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
    ab, cost_ab = await _scores([_convo(pair.prompt, pair.a), _convo(pair.prompt, pair.b)], judge, params, k, **opts)
    ba, cost_ba = await _scores([_convo(pair.prompt, pair.b), _convo(pair.prompt, pair.a)], judge, params, k, **opts)
    v_ab = _verdict(ab[0], ab[1]) if ab else -1
    v_ba = _verdict(ba[1], ba[0]) if ba else -1
    return {"id": pair.id, "label": pair.label, "verdict": v_ab, "verdict_swapped": v_ba, "cost": cost_ab + cost_ba}


async def judge_group(group: Group, judge: str | None, params: dict | None, k: int, **opts) -> dict:
    """Kendall's tau between the judge's scores and the human labels (NaN: the judge gave no valid answer)."""
    from scipy.stats import kendalltau

    convs = group.convs or [_convo(group.prompt, r) for r in group.responses]
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
            rows = await run_all(lambda p: judge_pair(p, judge, params, k, **opts), decided, f"{name} k={k}")
            seconds = time.perf_counter() - started
            tie_rows = (await run_all(lambda p: judge_pair(p, judge, params, k, **opts), ties, f"{name} ties k={k}")
                        if ties is not None else None)
            group_rows = (await run_all(lambda g: judge_group(g, judge, params, k, **opts), groups,
                                        f"{name} groups k={k}") if groups is not None else None)
            row = summarize(name, k, rows, seconds, tie_rows, group_rows, skipped)
            if user:
                row["skipped_uniform"] = uniform
            summary.append({**row, "subset": "all"} if by else row)
            if by and user:
                keys = [_by_value(p, by) for p in decided]
                gkeys = [_by_value(g, by) for g in groups or []]
                for value in sorted(set(keys) | set(gkeys)):
                    sub_rows = [r for r, key in zip(rows, keys) if key == value]
                    sub_groups = ([r for r, key in zip(group_rows, gkeys) if key == value]
                                  if group_rows is not None else None)
                    summary.append({**summarize(name, k, sub_rows, 0.0, None, sub_groups), "subset": f"{by}={value}"})
            for kind, items, results in (("pair", decided, rows), ("tie", ties or [], tie_rows or []),
                                         ("group", groups or [], group_rows or [])):
                detail += [{"dataset": name, "k": k, "kind": kind, **({by: _by_value(x, by)} if by else {}), **r}
                           for x, r in zip(items, results)]
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
              for d, k, s in zip(summary["dataset"], summary["k"], subsets)]
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
