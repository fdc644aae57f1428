"""The ART·E benchmark harness: every model answers the same questions; one table, one parquet, one chart.

    df = await run_benchmark(["openai/o3", "openai/o4-mini", "hosted_vllm/my-model@http://gpu:8000/v1"],
                             scenarios, "inbox.db", concurrency=8)
    summary = summarize(df)                     # accuracy, sources, turns, latency, tokens, cost / 1,000 runs
    save_benchmark(df, summary, "out/art-e")    # results.parquet, summary.csv, summary.png

A model is a litellm string; `MODEL@URL` sends it to an OpenAI-compatible server at URL (a local vLLM).
Correctness: an answer that contains the reference answer verbatim (case and spacing ignored) is correct
without asking anyone; any other attempted answer goes to the answer-correctness judge (cached).
Cost per 1,000 runs: litellm's prices for API models; for models litellm has no price for (local ones) the
run's wall seconds times a GPU-second price, `gpu_hour_price / 3600`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import litellm

from evals.art_e.agent import run_agent
from evals.art_e.questions import Scenario
from evals.art_e.rewards import art_e_reward, is_no_answer, judge_answer
from judges.completion import has_price
from judges.errors import JudgeError
from judges.local_provider import LOCAL_PROVIDER
from judges.vllm_engine import PROVIDER as VLLM_PROVIDER

DEFAULT_GPU_HOUR_PRICE = 3.50  # USD, one H100/H200-class GPU rented by the hour


@dataclass(frozen=True)
class ModelSpec:
    """A model under test: the litellm string, its label in tables, and its endpoint if local."""
    model: str
    label: str
    api_base: str | None = None

    @classmethod
    def parse(cls, spec: str) -> "ModelSpec":
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
        """Served by the user's own hardware: priced by GPU seconds, not by litellm's price list."""
        return self.api_base is not None or self.provider in (LOCAL_PROVIDER, VLLM_PROVIDER, "hosted_vllm")

    def params(self) -> dict | None:
        return {"api_base": self.api_base, "api_key": "local"} if self.api_base else None


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip().lower()


def contains_reference(answer: str | None, reference: str) -> bool:
    return not is_no_answer(answer) and _normal(reference) in _normal(answer)


def run_cost(model: str, prompt_tokens: int, completion_tokens: int, seconds: float, gpu_hour_price: float,
             local: bool) -> tuple[float, str]:
    """(USD, how it was priced) for one run."""
    if not local and has_price(model):
        prompt_cost, completion_cost = litellm.cost_per_token(model=model, prompt_tokens=prompt_tokens,
                                                              completion_tokens=completion_tokens)
        return prompt_cost + completion_cost, "litellm price"
    return seconds * gpu_hour_price / 3600, "GPU seconds"


async def run_one(spec: ModelSpec, scenario: Scenario, db_path, *, judge_model: str, max_turns: int,
                  gpu_hour_price: float, tool_mode: str = "auto", judge_params: dict | None = None) -> dict:
    """One model on one question: a row of the results table (errors are recorded, not raised)."""
    row = {"model": spec.label, "scenario_id": scenario.id, "question": scenario.question,
           "reference": scenario.answer, "kind": scenario.kind, "error": None}
    started = time.perf_counter()
    try:
        traj = await run_agent(scenario, db_path, spec.model, params=spec.params(), max_turns=max_turns,
                               tool_mode=tool_mode)
    except Exception as exc:  # the model's endpoint failed: a row that says so, the others go on
        seconds = time.perf_counter() - started
        return {**row, "error": f"{type(exc).__name__}: {exc}"[:500], "answer": None, "correct": False,
                "sources_correct": False, "turns": 0, "latency_s": seconds, "prompt_tokens": 0,
                "completion_tokens": 0, "cost_usd": 0.0, "priced_by": "", "reward": -2.0,
                "read_right_email": False, "ran_out_of_turns": False, "tool_errors": 0, "format_errors": 0}
    m, answer = traj.metrics, traj.metadata.get("answer")
    sources = json.loads(traj.metadata.get("sources") or "[]")
    if contains_reference(answer, scenario.answer):
        correct = True
    elif is_no_answer(answer):
        correct = False
    else:
        try:
            correct = await judge_answer(scenario, answer, judge_model, params=judge_params)
        except JudgeError as exc:  # counted as not correct, and said so in the row
            correct, row["error"] = False, f"correctness judge: {exc}"[:500]
    cost, priced_by = run_cost(spec.model, m["prompt_tokens"], m["completion_tokens"], m["latency_s"],
                               gpu_hour_price, spec.local)
    return {**row, "answer": answer, "correct": bool(correct),
            "sources_correct": any(s in scenario.message_ids for s in sources),
            "turns": m["turns"], "latency_s": m["latency_s"], "prompt_tokens": m["prompt_tokens"],
            "completion_tokens": m["completion_tokens"], "cost_usd": cost, "priced_by": priced_by,
            "reward": art_e_reward(m, answer, sources, scenario, bool(correct), max_turns=max_turns),
            "read_right_email": m["read_right_email"], "ran_out_of_turns": m["ran_out_of_turns"],
            "tool_errors": m["tool_errors"], "format_errors": m["format_errors"]}


async def run_benchmark(models: list[str | ModelSpec], scenarios: list[Scenario], db_path, *, judge_model: str,
                        concurrency: int = 4, max_turns: int = 10, gpu_hour_price: float = DEFAULT_GPU_HOUR_PRICE,
                        tool_mode: str = "auto", judge_params: dict | None = None, progress: bool = True):
    """Every model on every scenario, at most `concurrency` runs at once; the per-run results DataFrame."""
    import pandas as pd
    from tqdm.auto import tqdm

    specs = [m if isinstance(m, ModelSpec) else ModelSpec.parse(m) for m in models]
    if not specs:
        raise ValueError("no models to benchmark")
    if len({s.label for s in specs}) != len(specs):
        raise ValueError("each model may be named once")
    if not scenarios:
        raise ValueError("no questions to ask")
    if concurrency < 1 or max_turns < 1 or gpu_hour_price < 0:
        raise ValueError("concurrency and max_turns must be >= 1 and gpu_hour_price >= 0")
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"no inbox database at {db_path}")
    gate = asyncio.Semaphore(concurrency)
    # the embedded model generates one request at a time: queueing more would only count waiting as latency
    lanes = {s.label: asyncio.Semaphore(1 if s.embedded else concurrency) for s in specs}
    bar = tqdm(total=len(specs) * len(scenarios), desc="ART·E", unit="run", disable=not progress)
    wall = {s.label: [float("inf"), 0.0] for s in specs}

    async def one(spec: ModelSpec, scenario: Scenario) -> dict:
        async with lanes[spec.label], gate:
            start = time.perf_counter()
            row = await run_one(spec, scenario, db_path, judge_model=judge_model, max_turns=max_turns,
                                gpu_hour_price=gpu_hour_price, tool_mode=tool_mode, judge_params=judge_params)
            span = wall[spec.label]
            span[0], span[1] = min(span[0], start), max(span[1], time.perf_counter())
            bar.update(1)
            return row

    rows = await asyncio.gather(*(one(spec, s) for spec in specs for s in scenarios))
    bar.close()
    df = pd.DataFrame(rows)
    df.attrs["wall_s"] = {k: v[1] - v[0] for k, v in wall.items()}
    return df


def summarize(df):
    """One row per model: accuracy, sources correct, turns, latency p50/p95, tokens, cost per 1,000 runs."""
    import pandas as pd

    if df.empty:
        raise ValueError("no results to summarize")
    wall = df.attrs.get("wall_s", {})
    rows = []
    for label, g in df.groupby("model", sort=False):
        rows.append({
            "model": label, "runs": len(g), "errors": int(g["error"].notna().sum()),
            "accuracy": g["correct"].mean(), "sources_correct": g["sources_correct"].mean(),
            "mean_turns": g["turns"].mean(), "p50_latency_s": g["latency_s"].quantile(0.5),
            "p95_latency_s": g["latency_s"].quantile(0.95),
            "mean_tokens": (g["prompt_tokens"] + g["completion_tokens"]).mean(),
            "cost_per_1000_runs_usd": 1000 * g["cost_usd"].mean(), "priced_by": g["priced_by"].mode().iat[0]
            if g["priced_by"].astype(bool).any() else "",
            "mean_reward": g["reward"].mean(),
            "runs_per_s": len(g) / wall[label] if wall.get(label) else float("nan")})
    return pd.DataFrame(rows)


def save_benchmark(df, summary, out: str | Path, title: str = "ART·E benchmark") -> list[Path]:
    """results.parquet (every run), summary.csv, summary.png (accuracy, latency and cost by model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.parquet", out / "summary.csv", out / "summary.png"]
    df.to_parquet(paths[0], index=False)
    summary.to_csv(paths[1], index=False)
    fig, axes = plt.subplots(1, 3, figsize=(13, 0.6 * len(summary) + 2.4))
    for ax, (col, name) in zip(axes, [("accuracy", "accuracy"), ("p50_latency_s", "p50 latency (s)"),
                                      ("cost_per_1000_runs_usd", "cost per 1,000 runs (USD)")]):
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
