"""The full `ruler` command line: ruler's own commands plus `ruler eval ...` (evals sits on top of ruler)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ruler.cli import app

console = Console()
eval_app = typer.Typer(no_args_is_help=True, help="Evaluations: judge meta-evaluation, benchmarks.")
app.add_typer(eval_app, name="eval")


@eval_app.command("judge")
def eval_judge(
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: embedded judge)."),
    dataset: list[str] = typer.Option(["llmbar-natural"], "--dataset", "-d",
                                      help="llmbar-natural, llmbar-faireval, llmbar-llmeval2, llmbar-mtbench, "
                                           "pandalm, or all. Repeatable."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many pairs per dataset."),
    permutations: list[int] = typer.Option([1, 3], "--permutations", "-k", help="Orderings averaged. Repeatable."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible base URL for the judge."),
    concurrency: int = typer.Option(4, "--concurrency", help="Judgments in flight at once."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="Folder holding LLMBar/ and PandaLM/."),
    out: Path = typer.Option(Path("out/judge-meta"), "--out", help="Where the tables and the chart go."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use the judge cache (no resuming)."),
) -> None:
    """How often does a judge agree with people? Accuracy, swap consistency, Kendall tau."""
    from evals.judge_meta import DATASETS, DEFAULT_ROOT, DatasetError, evaluate, save_report
    from judges import JudgeError
    from ruler import default_judge_model

    names = DATASETS if "all" in dataset else dataset
    params = {"api_base": api_base} if api_base else None
    try:
        summary, detail = asyncio.run(evaluate(
            names, judge, params=params, ks=tuple(permutations), limit=limit, root=data_root or DEFAULT_ROOT,
            concurrency=concurrency, cache=False if no_cache else None))
    except (DatasetError, ValueError, JudgeError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2)
    model = judge or default_judge_model()
    table = Table(title=f"judge meta-evaluation: {model}")
    for col in summary.columns:
        table.add_column(str(col), justify="right")
    for row in summary.itertuples(index=False):
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row])
    Console(width=max(console.width, 240)).print(table)
    paths = save_report(summary, detail, out, f"judge meta-evaluation: {model}")
    console.print("saved: " + ", ".join(str(p) for p in paths), soft_wrap=True)


def main() -> None:  # pragma: no cover
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
