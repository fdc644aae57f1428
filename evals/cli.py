"""`ruler eval ...`: the evaluations' commands. `ruler_rl.cli` loads `app` by name when `eval` is run or listed
(see `ruler_rl.cli.PLUGIN_COMMANDS`); evals runs from a checkout and needs the `eval` extra."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

import typer

from ruler_rl.cli import console, print_frame

app = typer.Typer(no_args_is_help=True, help="Evaluations: judge meta-evaluation, benchmarks.")


@app.command("judge")
def eval_judge(
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: embedded judge)."),
    dataset: list[str] = typer.Option(["llmbar-natural"], "--dataset", "-d",
                                      help="llmbar-natural, llmbar-faireval, llmbar-llmeval2, llmbar-mtbench, "
                                           "pandalm, all, or the path of a JSONL file of your own labelled pairs "
                                           "or groups. Repeatable."),
    by: Optional[str] = typer.Option(None, "--by", help="Also one summary row per value of this extra field of "
                                     "your rows (e.g. category); built-in sets get their whole-set row only."),
    limit: Optional[int] = typer.Option(None, "--limit", help="At most this many pairs per dataset (and, in your "
                                        "own files, this many groups)."),
    permutations: list[int] = typer.Option([1, 3], "--permutations", "-k", help="Orderings averaged. Repeatable."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible base URL for the judge."),
    concurrency: int = typer.Option(4, "--concurrency", help="Judgments in flight at once."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help="Folder holding LLMBar/ and PandaLM/."),
    out: Path = typer.Option(Path("out/judge-meta"), "--out", help="Where the tables and the chart go."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not use the judge cache (no resuming)."),
) -> None:
    """How often does a judge agree with people? Accuracy, swap consistency, Kendall tau."""
    from evals.judge_meta import DATASETS, DEFAULT_ROOT, evaluate, save_report
    from ruler_rl.providers import default_judge_model

    names = [*DATASETS, *(d for d in dataset if d != "all" and d not in DATASETS)] if "all" in dataset else dataset
    params = {"api_base": api_base} if api_base else None
    summary, detail = asyncio.run(evaluate(
        names, judge, params=params, ks=tuple(permutations), limit=limit, root=data_root or DEFAULT_ROOT,
        concurrency=concurrency, by=by, cache=False if no_cache else None))
    model = judge or default_judge_model()
    print_frame(summary, f"judge meta-evaluation: {model}")
    paths = save_report(summary, detail, out, f"judge meta-evaluation: {model}")
    console.print("saved: " + ", ".join(str(p) for p in paths), soft_wrap=True)


@app.command("art-e")
def eval_art_e(
    model: list[str] = typer.Option(None, "--model", "-m", help="litellm model string, or MODEL@http://host/v1 for an "
                                    "OpenAI-compatible server. Repeatable. Default: the embedded model."),
    questions: int = typer.Option(50, "--questions", "-n", help="How many questions (the same for every model)."),
    split: str = typer.Option("test", "--split", help="train or test (splits are by inbox)."),
    question_set: str = typer.Option("generated", "--set", help="generated (offline, from the inbox database), "
                                     "annotated (enron_annotated.json) or hub (ART·E's questions; needs the "
                                     "internet; only those whose inbox and emails are in the database are asked)."),
    scenarios_file: Optional[Path] = typer.Option(None, "--scenarios", help="A JSONL/parquet scenarios file (ours or "
                                                  "ART's format) instead."),
    db: Path = typer.Option(Path("out/art-e/inbox.db"), "--db", help="Inbox database (built if missing)."),
    mailbox: list[Path] = typer.Option(None, "--mailbox", help="Maildir tarballs/folders to build the database from "
                                       "(default: the four shared Enron mailboxes)."),
    judge: Optional[str] = typer.Option(None, "--judge", help="Correctness judge for answers the matcher does not "
                                        "accept (default: none; accuracy is then match-only)."),
    concurrency: int = typer.Option(4, "--concurrency", help="Runs in flight at once."),
    max_turns: int = typer.Option(10, "--max-turns"),
    tool_mode: str = typer.Option("auto", "--tool-mode", help="auto, native (tool calls) or text (JSON protocol)."),
    tool_choice: str = typer.Option("required", "--tool-choice", help="Native tool mode: the tool_choice sent each "
                                    "turn. required (ART's, for prompted models), auto (a trained policy's) or none."),
    idk_reward: float = typer.Option(0.0, "--idk-reward", help="What \"I don't know\" and running out of turns "
                                     "score in ART's reward: 0 (ART·E's original) or -1 (as a wrong answer)."),
    gpu_hour_price: float = typer.Option(3.5, "--gpu-hour-price", help="USD per GPU hour, to price GPU-served models."),
    cpu_hour_price: float = typer.Option(0.1, "--cpu-hour-price", help="USD per CPU-machine hour, to price the "
                                         "embedded model."),
    seed: int = typer.Option(0, "--seed", help="Which questions are drawn."),
    out: Path = typer.Option(Path("out/art-e"), "--out", help="Where results.parquet, summary.csv/png go."),
    show: Optional[str] = typer.Option(None, "--show", help="Print the transcript of one run (its run_id) from the "
                                       "results in --out, and stop."),
) -> None:
    """ART·E: models answer questions about real Enron inboxes; accuracy, reward, turns, latency, cost."""
    import random

    from evals.art_e import harness
    from evals.art_e.annotated import load_annotated
    from evals.art_e.inbox import ENRON_DIR, build_inbox_db
    from evals.art_e.questions import download_scenarios, generate_scenarios, load_scenarios, map_scenarios
    from ruler_rl.judges import EMBEDDED_JUDGE

    if show is not None:
        df = harness.load_results(out)
        rows = df[df["run_id"] == show.strip()] if "run_id" in df else df.iloc[0:0]
        if rows.empty:
            raise ValueError(f"no run {show!r} in {out}; run ids are in the run_id column of results.parquet")
        console.print(harness.render_transcript(rows.iloc[0]), soft_wrap=True, markup=False, highlight=False)
        return
    if split not in ("train", "test") or question_set not in ("generated", "annotated", "hub"):
        raise ValueError("--split is train or test; --set is generated, annotated or hub")
    if tool_mode not in ("auto", "native", "text"):
        raise ValueError("--tool-mode is auto, native or text")
    if tool_choice not in ("required", "auto", "none"):
        raise ValueError("--tool-choice is required, auto or none")
    if idk_reward not in (0.0, -1.0):
        raise ValueError("--idk-reward is 0 (ART·E's original) or -1")
    if questions < 1:
        raise ValueError("--questions must be >= 1")
    if judge is not None and not judge.strip():
        raise ValueError("--judge must not be empty (leave it out for match-only accuracy)")
    harness.check_judge(judge)
    specs = [harness.ModelSpec.parse(m) for m in (model or [EMBEDDED_JUDGE])]
    if db.is_dir():
        raise ValueError(f"--db {db} is a folder; give the inbox database's file path (built if missing)")
    if db.is_file():
        with db.open("rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise ValueError(f"--db {db} is not a SQLite database (an inbox database is built if the path is new)")
    else:
        sources = mailbox or sorted(ENRON_DIR.glob("*.tar.gz"))
        if not sources:
            raise ValueError(f"no mailboxes to build {db} from: pass --mailbox")
        db.parent.mkdir(parents=True, exist_ok=True)
        report = build_inbox_db(sources, db)
        skipped = ", ".join(f"{n} {why}" for why, n in report.skipped.most_common())
        console.print(f"built {db}: {report.emails} emails in {report.seconds:.0f} s (skipped: {skipped or 'none'})",
                      soft_wrap=True)
    skipped = None
    if scenarios_file is not None:
        pool, skipped = map_scenarios(load_scenarios(scenarios_file, split), db)
    elif question_set == "annotated":
        pool, _, _ = load_annotated(ENRON_DIR / "enron_annotated.json", db)
    elif question_set == "hub":
        pool, skipped = map_scenarios(download_scenarios(split), db)
    else:
        pool = [s for s in generate_scenarios(db, per_inbox=200) if s.split == split]
    if skipped:
        console.print("not asked (not in this database): " + ", ".join(f"{n} {why}" for why, n in skipped.items()),
                      soft_wrap=True)
    if not pool:
        raise ValueError(f"no {split} questions in the chosen set")
    picked = random.Random(seed).sample(pool, min(questions, len(pool)))
    df = asyncio.run(harness.run_benchmark(
        specs, picked, db, judge_model=judge, concurrency=concurrency, max_turns=max_turns,
        gpu_hour_price=gpu_hour_price, cpu_hour_price=cpu_hour_price, tool_mode=tool_mode, tool_choice=tool_choice,
        idk_reward=idk_reward))
    summary = harness.summarize(df)
    print_frame(summary, f"ART·E, {len(picked)} {split} questions (accuracy: {df.attrs['accuracy_by']}; "
                         f"tool_choice {tool_choice}; \"I don't know\" scores {idk_reward:g})")
    paths = harness.save_benchmark(df, summary, out)
    console.print("saved: " + ", ".join(str(p) for p in paths), soft_wrap=True)
