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



keys_app = typer.Typer(no_args_is_help=True, help="API keys of the judging service.")
app.add_typer(keys_app, name="keys")
DEFAULT_DB = "ruler-service.db"


@keys_app.command("create")
def keys_create(name: str = typer.Argument(..., help="Who the key is for."),
                db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """Create a key; it is printed once and only its hash is stored."""
    from ruler.service.store import Store

    key, key_id = Store(db).create_key(name)
    console.print(f"key id {key_id}: [bold]{key}[/bold]  (shown once; store it now)", soft_wrap=True)


@keys_app.command("list")
def keys_list(db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """List keys (ids, names, when created and revoked), never the keys themselves."""
    from ruler.service.store import Store

    table = Table("id", "name", "created", "revoked")
    for k in Store(db).list_keys():
        table.add_row(k["id"], k["name"], time.strftime("%Y-%m-%d %H:%M", time.gmtime(k["created"])),
                      time.strftime("%Y-%m-%d %H:%M", time.gmtime(k["revoked"])) if k["revoked"] else "")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(...), db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """Revoke a key by id: requests with it get 401 from then on."""
    from ruler.service.store import Store

    if not Store(db).revoke_key(key_id):
        err.print(f"[red]error:[/red] no active key with id {key_id!r}")
        raise typer.Exit(2)
    console.print(f"revoked {key_id}")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port"),
    judge: Optional[str] = typer.Option(None, "--judge", help="Default judge (litellm model string)."),
    judge_api_base: Optional[str] = typer.Option(None, "--judge-api-base", help="api_base for the judge."),
    allow_judge: list[str] = typer.Option([], "--allow-judge", help="Other judges clients may ask for."),
    db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="SQLite database (keys, jobs, results)."),
    max_body_mb: float = typer.Option(8.0, "--max-body-mb"),
    max_trajectories: int = typer.Option(256, "--max-trajectories"),
    rate_per_minute: int = typer.Option(600, "--rate-per-minute", help="Requests per key per minute."),
    max_inflight: int = typer.Option(32, "--max-inflight-per-key", help="Concurrent /v1/score requests per key."),
    judge_timeout: float = typer.Option(600.0, "--judge-timeout", help="Seconds one group may take."),
    workers: int = typer.Option(8, "--worker-concurrency", help="Job groups judged at once."),
    metrics_key: bool = typer.Option(False, "--metrics-require-key", help="Protect /metrics with an API key."),
) -> None:
    """Run the judging service (FastAPI + uvicorn): /v1/score, /v1/jobs, /healthz, /metrics, /docs."""
    import logging

    import uvicorn

    from ruler.service.app import ServiceConfig, create_app

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = ServiceConfig(db_path=str(db), judge_model=judge, judge_params={"api_base": judge_api_base} if judge_api_base else {},
                        allowed_judges=allow_judge or None, max_body_bytes=int(max_body_mb * 1024 * 1024),
                        max_trajectories=max_trajectories, rate_per_minute=rate_per_minute,
                        max_inflight_per_key=max_inflight,
                        judge_timeout_s=judge_timeout, worker_concurrency=workers, metrics_require_key=metrics_key)
    uvicorn.run(create_app(cfg), host=host, port=port, log_level="warning", timeout_keep_alive=5,
                timeout_graceful_shutdown=30, limit_concurrency=1024)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
