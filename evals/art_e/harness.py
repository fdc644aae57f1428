"""The ART·E benchmark harness: every model answers the same questions; one table, one parquet, one chart.

    df = await run_benchmark(["openai/o3", "openai/o4-mini", "hosted_vllm/my-model@http://gpu:8000/v1"],
                             scenarios, "inbox.db", concurrency=8)                  # match-only accuracy
    df = await run_benchmark(models, scenarios, "inbox.db", judge_model="openai/gpt-4.1")  # match, then judge
    summary = summarize(df)                     # accuracy (+ 95% interval), sources, turns, latency, cost
    save_benchmark(df, summary, "out/art-e")    # results.parquet (with every run's messages), summary.csv/png
    print(render_transcript(df.iloc[0]))        # one run, message by message (`ruler eval art-e --show RUN_ID`)

A model is a litellm string; `MODEL@URL` sends it to an OpenAI-compatible server at URL (a local vLLM).
Correctness: `answer_matches` (evals.art_e.matching) decides first; an attempted answer it does not accept
goes to the correctness judge only when one is given. Without one, `accuracy` is match-only and the summary
says so (`accuracy_by`); the embedded 135M model is refused as a correctness judge (it is near chance as a
judge: evals/reports/judge_meta_smollm2_*.csv). The reward is ART's rubric (`evals.art_e.rewards.art_reward`),
"I don't know" scoring `idk_reward` (0, ART·E's original, by default). Models in native tool mode get
`tool_choice="required"` by default, as ART's prompted baselines do (`tool_choice="auto"` for a policy
being trained). Both are recorded in the summary.
Cost per 1,000 runs: litellm's prices for API models; a local model's machine time is shared by the runs
in flight on it (each run is charged its wall time divided by how many runs of that model were running,
moment by moment), at `gpu_hour_price` for a GPU server (`MODEL@URL`, hosted_vllm, vllm-engine) and
`cpu_hour_price` for the embedded model, which runs on the CPU.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import litellm

from evals.art_e.agent import check_tool_choice, run_agent
from evals.art_e.questions import Scenario
from evals.art_e.rewards import answer_matches, check_idk_reward, grade
from ruler_rl.judges.completion import has_price
from ruler_rl.judges.errors import JudgeError
from ruler_rl.judges.local_provider import LOCAL_PROVIDER
from ruler_rl.judges.vllm_engine import PROVIDER as VLLM_PROVIDER

DEFAULT_GPU_HOUR_PRICE = 3.50  # USD, one H100/H200-class GPU rented by the hour
DEFAULT_CPU_HOUR_PRICE = 0.10  # USD, a small CPU machine (a few cores) rented by the hour
RUBRIC_COLUMNS = ("ever_found_right_email", "ever_read_right_email", "ever_tried_to_read_invalid_email",
                  "ran_out_of_turns", "returned_i_dont_know", "failed_format_validation", "num_sources")


@dataclass(frozen=True)
class ModelSpec:
    """A model under test: the litellm string, its label in tables, its endpoint if local, any other litellm
    parameters for its calls (`extra`, e.g. {"temperature": 0}), and `on` ("cpu" or "gpu") when the machine
    behind `api_base` is known (by default a server at a URL is taken to be a GPU)."""
    model: str
    label: str
    api_base: str | None = None
    extra: dict | None = None
    on: str | None = None

    @classmethod
    def parse(cls, spec: str) -> ModelSpec:
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"model must be a non-empty litellm model string, got {spec!r}")
        model, sep, base = spec.strip().partition("@")
        if sep and not re.match(r"https?://", base):
            raise ValueError(f"{spec!r}: after '@' comes the OpenAI-compatible base URL (http://...)")
        if not model:
            raise ValueError(f"{spec!r}: no model name before '@'")
        return cls(model=model, label=spec.strip(), api_base=base or None)

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0]

    @property
    def embedded(self) -> bool:
        """The embedded CPU model: it generates one request at a time."""
        return self.provider == LOCAL_PROVIDER

    @property
    def local(self) -> bool:
        """Served by the user's own hardware: priced by machine time, not by litellm's price list."""
        return self.api_base is not None or self.provider in (LOCAL_PROVIDER, VLLM_PROVIDER, "hosted_vllm")

    @property
    def hardware(self) -> str | None:
        """"cpu" (the embedded model, or `on="cpu"`), "gpu" (any other local model) or None (priced by litellm)."""
        if self.on is not None:
            if self.on not in ("cpu", "gpu"):
                raise ValueError(f"on must be cpu or gpu, got {self.on!r}")
            return self.on
        return "cpu" if self.embedded else "gpu" if self.local else None

    def params(self) -> dict | None:
        params = {**({"api_base": self.api_base, "api_key": "local"} if self.api_base else {}), **(self.extra or {})}
        return params or None


class SharedMeter:
    """Machine time shared by the runs in flight on one machine: each run is charged, moment by moment,
    the wall time divided by how many runs are in flight then, so the charges add up to the busy time."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.running = 0
        self.last = clock()
        self.share = 0.0  # machine-seconds per run, integrated since the start

    def _advance(self) -> float:
        now = self.clock()
        if self.running:
            self.share += (now - self.last) / self.running
        self.last = now
        return self.share

    def start(self) -> float:
        mark = self._advance()
        self.running += 1
        return mark

    def stop(self, mark: float) -> float:
        """The machine-seconds charged to the run that started at `mark`."""
        if self.running < 1:
            raise RuntimeError("stop() without a start()")
        charged = self._advance() - mark
        self.running -= 1
        return charged


def run_cost(model: str, prompt_tokens: int, completion_tokens: int, machine_seconds: float, hour_price: float,
             hardware: str | None) -> tuple[float, str]:
    """(USD, how it was priced) for one run: litellm's price for API models, else its share of machine time."""
    if hardware is None and has_price(model):
        prompt_cost, completion_cost = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens,
                                                              completion_tokens=completion_tokens)
        return prompt_cost + completion_cost, "litellm price"
    return machine_seconds * hour_price / 3600, f"{(hardware or 'gpu').upper()} time, shared"


def run_id(label: str, scenario_id: str) -> str:
    """A short stable id for one model's run on one question."""
    return hashlib.sha1(f"{label}\0{scenario_id}".encode()).hexdigest()[:10]


def check_judge(judge_model: str | None) -> None:
    """ValueError for a correctness judge whose verdicts must not be called accuracy."""
    if judge_model is None:
        return
    if not isinstance(judge_model, str) or not judge_model.strip():
        raise ValueError(f"the correctness judge must be a litellm model string, got {judge_model!r}")
    if ModelSpec.parse(judge_model).embedded:
        raise ValueError(f"{judge_model} is near chance as a judge, so its verdicts cannot be accuracy; leave the "
                         "correctness judge out for match-only accuracy, or give a capable model")


async def run_one(spec: ModelSpec, scenario: Scenario, db_path, *, max_turns: int, hour_price: float,
                  meter: SharedMeter | None = None, judge_model: str | None = None, tool_mode: str = "auto",
                  judge_params: dict | None = None, tool_choice: str = "required", idk_reward: float = 0.0) -> dict:
    """One model on one question: a row of the results table (errors are recorded, not raised)."""
    row = {"run_id": run_id(spec.label, scenario.id), "model": spec.label, "scenario_id": scenario.id,
           "question": scenario.question, "reference": scenario.answer, "kind": scenario.kind,
           "inbox_address": scenario.inbox_address, "error": None}
    meter = meter or SharedMeter()
    mark, started = meter.start(), time.perf_counter()
    try:
        traj = await run_agent(scenario, db_path, spec.model, params=spec.params(), max_turns=max_turns,
                               tool_mode=tool_mode, tool_choice=tool_choice)
    except Exception as exc:  # the model's endpoint failed: a row that says so, the others go on
        charged, seconds = meter.stop(mark), time.perf_counter() - started
        cost, priced_by = run_cost(spec.model, 0, 0, charged, hour_price, spec.hardware)
        return {**row, "error": f"{type(exc).__name__}: {exc}"[:500], "answer": None, "sources": "[]",
                "matched": False, "judged": None, "correct": False, "sources_correct": False, "turns": 0,
                "latency_s": seconds, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": cost,
                "priced_by": priced_by, "reward": float("nan"), **{c: 0 for c in RUBRIC_COLUMNS},
                "unreadable_dates": 0, "tool_choice": "", "messages": "[]"}
    charged = meter.stop(mark)
    try:
        verdict = await grade(traj, scenario, max_turns=max_turns, judge_model=judge_model, judge_params=judge_params,
                              idk_reward=idk_reward)
        matched, judged, correct, reward = verdict.matched, verdict.judged, verdict.correct, verdict.reward
    except JudgeError as exc:  # the matcher's verdict stands, the reward is unknown, and the row says so
        row["error"] = f"correctness judge: {exc}"[:500]
        matched = bool(traj.metrics["attempted_answer"]) and answer_matches(traj.metadata.get("answer"),
                                                                            scenario.answer, scenario.question)
        judged, correct, reward = None, matched, float("nan")
    m = traj.metrics
    cost, priced_by = run_cost(spec.model, m["prompt_tokens"], m["completion_tokens"], charged, hour_price,
                               spec.hardware)
    return {**row, "answer": traj.metadata.get("answer"), "sources": traj.metadata.get("sources") or "[]",
            "matched": bool(matched), "judged": judged, "correct": bool(correct),
            "sources_correct": bool(m["sources_correct"]), "turns": m["turns"], "latency_s": m["latency_s"],
            "prompt_tokens": m["prompt_tokens"], "completion_tokens": m["completion_tokens"], "cost_usd": cost,
            "priced_by": priced_by, "reward": reward, **{c: m[c] for c in RUBRIC_COLUMNS},
            "unreadable_dates": m["unreadable_dates"], "tool_choice": traj.metadata.get("tool_choice") or "",
            "messages": json.dumps(traj.messages(), ensure_ascii=False)}


async def run_benchmark(models: list[str | ModelSpec], scenarios: list[Scenario], db_path, *,
                        judge_model: str | None = None, concurrency: int = 4, max_turns: int = 10,
                        gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE, cpu_hour_price: float = DEFAULT_CPU_HOUR_PRICE,
                        tool_mode: str = "auto", judge_params: dict | None = None, progress: bool = True,
                        tool_choice: str = "required", idk_reward: float = 0.0):
    """Every model on every scenario, at most `concurrency` runs at once; the per-run results DataFrame.

    `judge_model`: the correctness judge for answers the matcher does not accept (None: match only).
    `tool_choice`: sent with every native-mode turn ("required", as ART sends to prompted models; "auto";
    "none"). `idk_reward`: what "I don't know" and running out of turns score (0 to -1). Both are kept in
    the table's attrs and in `summarize`'s rows.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    specs = [m if isinstance(m, ModelSpec) else ModelSpec.parse(m) for m in models]
    if not specs:
        raise ValueError("no models to benchmark")
    if len({s.label for s in specs}) != len(specs):
        raise ValueError("each model may be named once")
    if not scenarios or not all(isinstance(s, Scenario) for s in scenarios):
        raise ValueError("give a non-empty list of Scenario objects to ask")
    if len({s.id for s in scenarios}) != len(scenarios):
        raise ValueError("scenario ids must be unique (each names a run)")
    for name, value in (("concurrency", concurrency), ("max_turns", max_turns)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for name, value in (("gpu_hour_price", gpu_hour_price), ("cpu_hour_price", cpu_hour_price)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    check_judge(judge_model)
    check_tool_choice(tool_choice)
    check_idk_reward(idk_reward)
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"no inbox database at {db_path}")
    gate = asyncio.Semaphore(concurrency)
    # the embedded model generates one request at a time: queueing more would only count waiting as latency
    lanes = {s.label: asyncio.Semaphore(1 if s.embedded else concurrency) for s in specs}
    meters = {s.label: SharedMeter() for s in specs}
    prices = {s.label: cpu_hour_price if s.hardware == "cpu" else gpu_hour_price for s in specs}
    bar = tqdm(total=len(specs) * len(scenarios), desc="ART·E", unit="run", disable=not progress)
    wall = {s.label: [float("inf"), 0.0] for s in specs}

    async def one(spec: ModelSpec, scenario: Scenario) -> dict:
        async with lanes[spec.label], gate:
            start = time.perf_counter()
            row = await run_one(spec, scenario, db_path, judge_model=judge_model, max_turns=max_turns,
                                hour_price=prices[spec.label], meter=meters[spec.label], tool_mode=tool_mode,
                                judge_params=judge_params, tool_choice=tool_choice, idk_reward=idk_reward)
            span = wall[spec.label]
            span[0], span[1] = min(span[0], start), max(span[1], time.perf_counter())
            bar.update(1)
            return row

    rows = await asyncio.gather(*(one(spec, s) for spec in specs for s in scenarios))
    bar.close()
    df = pd.DataFrame(rows)
    df.attrs["wall_s"] = {k: v[1] - v[0] for k, v in wall.items()}
    df.attrs["accuracy_by"] = f"match, then judge {judge_model}" if judge_model else "match only"
    df.attrs["tool_choice"] = tool_choice
    df.attrs["idk_reward"] = float(idk_reward)
    return df


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) for a proportion."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _sent(runs) -> str:
    """The tool_choice these runs sent ("" for none, or runs recorded before it was kept)."""
    if "tool_choice" not in runs:
        return ""
    sent = sorted({c for c in runs["tool_choice"].dropna() if c})
    return ", ".join(sent)


def summarize(df):
    """One row per model: accuracy with its 95% Wilson interval and how it was decided, sources correct, ART's
    reward (mean and 95% half-width) and what "I don't know" scored in it (`idk_reward`), format failures,
    unreadable search dates (all runs' total), the tool_choice sent ("" where none was: the text protocol),
    turns, latency p50/p95, tokens, cost per 1,000 runs. A table from before these were recorded gets NaN / ""
    for them."""
    import pandas as pd

    if df.empty:
        raise ValueError("no results to summarize")
    wall = df.attrs.get("wall_s", {})
    rows = []
    for label, g in df.groupby("model", sort=False):
        low, high = wilson_interval(int(g["correct"].sum()), len(g))
        rewards = g["reward"].dropna()
        rows.append({
            "model": label, "runs": len(g), "errors": int(g["error"].notna().sum()),
            "accuracy": g["correct"].mean(), "accuracy_low": low, "accuracy_high": high,
            "accuracy_by": df.attrs.get("accuracy_by", "match only"),
            "sources_correct": g["sources_correct"].mean(),
            "mean_reward": rewards.mean() if len(rewards) else float("nan"),
            "reward_ci95": 1.96 * rewards.std(ddof=1) / math.sqrt(len(rewards)) if len(rewards) > 1 else float("nan"),
            "idk_reward": df.attrs.get("idk_reward", float("nan")),
            "format_failures": g["failed_format_validation"].mean(),
            "unreadable_dates": int(g["unreadable_dates"].sum()) if "unreadable_dates" in g else float("nan"),
            "tool_choice": _sent(g),
            "mean_turns": g["turns"].mean(), "p50_latency_s": g["latency_s"].quantile(0.5),
            "p95_latency_s": g["latency_s"].quantile(0.95),
            "mean_tokens": (g["prompt_tokens"] + g["completion_tokens"]).mean(),
            "cost_per_1000_runs_usd": 1000 * g["cost_usd"].mean(),
            "priced_by": g["priced_by"].mode().iat[0] if g["priced_by"].astype(bool).any() else "",
            "runs_per_s": len(g) / wall[label] if wall.get(label) else float("nan")})
    return pd.DataFrame(rows)


def compare_runs(before, after, *, resamples: int = 2000, seed: int = 0):
    """Before vs after on the same questions: per measure the two means, their difference and its 95% interval
    (a paired bootstrap over questions), so "beyond noise" means the interval excludes 0.

    `before` and `after` are results tables of one model each (run_benchmark's rows); questions are paired
    by scenario_id and those missing from either side are left out (counted in `questions`).
    """
    import numpy as np
    import pandas as pd

    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 100:
        raise ValueError("resamples must be an integer >= 100")
    for name, df in (("before", before), ("after", after)):
        if df["model"].nunique() != 1 or df["scenario_id"].duplicated().any():
            raise ValueError(f"{name} must hold one model's runs, one per scenario")
    pair = before.merge(after, on="scenario_id", suffixes=("_before", "_after"))
    if pair.empty:
        raise ValueError("before and after share no questions")
    rows = []
    for measure in ("correct", "sources_correct", "reward", "turns", "failed_format_validation"):
        b = pair[f"{measure}_before"].astype(float).to_numpy()
        a = pair[f"{measure}_after"].astype(float).to_numpy()
        ok = ~(np.isnan(a) | np.isnan(b))  # a run whose reward is unknown (its judge failed) is left out
        b, a = b[ok], a[ok]
        row = {"measure": measure, "questions": len(a), "before": np.nan, "after": np.nan, "difference": np.nan,
               "low": np.nan, "high": np.nan}
        if len(a):
            d = a - b
            boot = d[np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
            row.update(before=b.mean(), after=a.mean(), difference=d.mean(), low=float(np.quantile(boot, 0.025)),
                       high=float(np.quantile(boot, 0.975)))
        rows.append(row)
    return pd.DataFrame(rows)


def render_transcript(row) -> str:
    """One run of the results table as text: the question, every message in order, the answer and the grade."""
    try:
        messages = json.loads(row["messages"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("this row has no transcript (a results table from before transcripts were kept?)") from None
    lines = [f"run {row['run_id']}  model {row['model']}  scenario {row['scenario_id']}",
             f"question:  {row['question']}", f"reference: {row['reference']}", ""]
    for n, m in enumerate(messages):
        role = m.get("role", "?")
        lines.append(f"[{n}] {role}" + (f" ({m['tool_call_id']})" if m.get("tool_call_id") else ""))
        if m.get("content"):
            lines.append("    " + str(m["content"]).replace("\n", "\n    "))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            lines.append(f"    -> {fn.get('name')}({fn.get('arguments')})  [{call.get('id')}]")
    judged = row.get("judged")
    judged = "not asked" if judged is None or (isinstance(judged, float) and math.isnan(judged)) else bool(judged)
    lines += ["", f"answer: {row['answer']!r}  sources: {row['sources']}",
              (f"matched: {bool(row['matched'])}  judged: {judged}  "
               f"correct: {bool(row['correct'])}  reward: {row['reward']:.3f}  turns: {row['turns']}")]
    if row.get("error"):
        lines.append(f"error: {row['error']}")
    return "\n".join(lines)


def load_results(out: str | Path):
    """The results table `save_benchmark` wrote to `out` (a folder or the parquet file itself)."""
    import pandas as pd

    path = Path(out)
    path = path / "results.parquet" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no results table at {path}; run `ruler eval art-e --out DIR` first")
    return pd.read_parquet(path)


def save_benchmark(df, summary, out: str | Path, title: str = "ART·E benchmark") -> list[Path]:
    """results.parquet (every run, its messages too), summary.csv, summary.png (accuracy, latency, cost)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.parquet", out / "summary.csv", out / "summary.png"]
    df.to_parquet(paths[0], index=False)
    summary.to_csv(paths[1], index=False)
    fig, axes = plt.subplots(1, 3, figsize=(13, 0.6 * len(summary) + 2.4))
    accuracy_by = summary["accuracy_by"].iat[0] if "accuracy_by" in summary else "match only"
    for ax, (col, name) in zip(axes, [("accuracy", f"accuracy ({accuracy_by})"), ("p50_latency_s", "p50 latency (s)"),
                                      ("cost_per_1000_runs_usd", "cost per 1,000 runs (USD)")], strict=True):
        ax.barh(summary["model"], summary[col], color="#4C72B0")
        ax.set_title(name)
        ax.invert_yaxis()
        for y, v in enumerate(summary[col]):
            ax.annotate(f"{v:.2f}" if col != "cost_per_1000_runs_usd" else f"${v:.2f}", (v, y), va="center",
                        xytext=(3, 0), textcoords="offset points", fontsize=8)
        if ax is not axes[0]:
            ax.set_yticklabels([])
    axes[0].set_xlim(0, 1.05)
    fig.suptitle(f"{title} ({int(summary['runs'].iat[0])} questions)")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    plt.close(fig)
    return paths
