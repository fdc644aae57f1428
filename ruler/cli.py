"""The `ruler` command line: `ruler score FILE`, `ruler demo`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RULER: reward-free scores for agent trajectories.")
console = Console()
err = Console(stderr=True, soft_wrap=True)

DEMO_GROUP = "demo_group.json"


def _score(group, judge: str | None, api_base: str | None, rubric: str, cache: bool, permutations: int):
    from ruler import ruler_score_group

    params = {"api_base": api_base} if api_base else None
    return asyncio.run(ruler_score_group(group, judge, params, rubric, cache=None if cache else False,
                                         num_permutations=permutations))


def _print_table(scored, title: str) -> None:
    from ruler import group_advantages, group_has_signal

    rewards = [t.reward for t in scored.trajectories]
    adv = group_advantages(rewards)
    table = Table(title=title, show_lines=True)
    for col, kw in (("id", {"justify": "right"}), ("label", {}), ("score", {"justify": "right"}),
                    ("advantage", {"justify": "right"}), ("explanation", {"overflow": "fold"})):
        table.add_column(col, **kw)
    for i, (t, a) in enumerate(zip(scored.trajectories, adv), 1):
        expl = next((line.removeprefix("RULER explanation: ") for line in reversed(t.logs)
                     if line.startswith("RULER explanation: ")), "")
        table.add_row(str(i), str(t.metadata.get("label", "")), f"{t.reward:.3f}", f"{a:+.2f}", expl)
    console.print(table)
    meta = scored.metadata
    console.print(
        f"judge {meta.get('judge_model')}: {meta.get('judge_calls')} call(s), "
        f"{meta.get('judge_prompt_tokens')} prompt + {meta.get('judge_completion_tokens')} completion tokens, "
        f"${meta.get('judge_cost', 0):.6f}{' (from cache)' if meta.get('judge_cached') else ''}"
        + ("" if group_has_signal(rewards) else "  [yellow]all scores equal: no training signal[/yellow]")
    )
    notes = sorted({line for t in scored.trajectories for line in t.logs if line.startswith("RULER note: ")})
    for n in notes:
        console.print(f"[dim]{n}[/dim]")


def _to_json(scored) -> str:
    from ruler import group_advantages

    adv = group_advantages([t.reward for t in scored.trajectories])
    return json.dumps({
        "metadata": scored.metadata,
        "scores": [{"trajectory_id": str(i), "score": t.reward, "advantage": a,
                    "explanation": next((x.removeprefix("RULER explanation: ") for x in t.logs
                                         if x.startswith("RULER explanation: ")), "")}
                   for i, (t, a) in enumerate(zip(scored.trajectories, adv), 1)],
    }, indent=2)


@app.command()
def score(
    file: Path = typer.Argument(..., help="A group as JSON (object or list) or JSONL (one trajectory per line)."),
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: embedded judge)."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible base URL for the judge."),
    rubric: str = typer.Option("default", "--rubric", help="Rubric name (default, strict-correctness, "
                               "efficiency, tool-hygiene, hallucination-penalty) or a file."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the judge cache."),
    permutations: int = typer.Option(1, "--permutations", "-k", help="Judge under k orderings and average."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Score one group of trajectories with RULER and print id, score, advantage and explanation."""
    from judges import JudgeError
    from judges.rubrics import get_rubric
    from ruler import TrajectoryGroup

    try:
        group = TrajectoryGroup.load(file)
        rubric_text = get_rubric(rubric)
        scored = _score(group, judge, api_base, rubric_text, not no_cache, permutations)
    except (FileNotFoundError, ValueError, TypeError, JudgeError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)
    if as_json:
        print(_to_json(scored))
    else:
        _print_table(scored, f"RULER scores for {file}")


@app.command()
def demo(
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: embedded judge)."),
    no_cache: bool = typer.Option(True, "--no-cache/--cache", help="Judge afresh (default) or allow cache hits."),
) -> None:
    """Score the bundled example group (an email agent's rollouts of differing quality)."""
    from ruler import TrajectoryGroup, default_judge_model

    path = resources.files("ruler") / "data" / DEMO_GROUP
    group = TrajectoryGroup.model_validate_json(path.read_text(encoding="utf-8"))
    model = judge or default_judge_model()
    console.print(f"Scoring {len(group)} trajectories of the bundled email-agent group with [bold]{model}[/bold] "
                  "(the first run converts the embedded model, ~1 min)...")
    started = time.perf_counter()
    scored = _score(group, model, None, "default", not no_cache, 1)
    _print_table(scored, "RULER demo: who answered the inbox question best?")
    console.print(f"demo wall time: {time.perf_counter() - started:.1f} s")


def main() -> None:  # pragma: no cover
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
