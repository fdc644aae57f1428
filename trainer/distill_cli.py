"""`ruler distill`: distil a cheap local judge from the judgments you paid for (`ruler_rl.trainer.distill`).

    ruler distill --teacher openai/o3 --since 2026-11-01 --out judges/my-judge          # the cache's o3 answers
    ruler distill --dataset labels.jsonl --steps 200 --out judges/my-judge              # your labelled groups
    ruler distill --dataset labels.jsonl --method grpo --group-size 4 --out judges/my-judge   # GRPO instead
    ruler score group.jsonl --judge local/judges/my-judge                               # use it as any judge

Teacher data: `--teacher` selects one judge model's judgments from the cache (`--cache`, default the
judge cache; `--since`/`--until` bound the date they were stored), `--dataset` adds labelled pairs and
groups in the formats of `ruler eval judge --dataset` (`ruler_rl.labels.load_user_dataset`), rendered as
RULER prompts with `--rubric`. A seeded share of the groups (`--holdout`) is held out. The student
(`--student`, default the embedded SmolLM2-135M) gets a LoRA adapter trained by SFT on the teacher's answers
(`ruler_rl.trainer.sft`; `--method sft`, the default), by GRPO rewarded by agreement with the teacher's scores
(`ruler_rl.trainer.distill.train_grpo`; `--method grpo`: the student, served by `--engine`, samples `--group-size`
answers per prompt under RULER's answer schema), or by SFT then GRPO (`--method sft+grpo`), written to `--out`
as a judge folder (`local/<out>`). The command ends with the student's
agreement with the teacher on the held-out prompts next to the untrained student's.

GRPO samples under RULER's answer schema (constrained decoding), while its loss uses the unconstrained
policy's log-probabilities: the PPO ratio is consistent (both sides are the unconstrained policy's), but the
gradient's target is log pi, not the constrained log q = log pi - log Z, so the tokens the grammar forces still
get gradient (`ruler_rl.trainer.distill.train_grpo`). An answer cut at its token bound is rewarded 0 and counted apart
(`answers_cut` in each GRPO step's row).

`ruler_rl.cli` loads `app` by name when the command runs (`ruler_rl.cli.PLUGIN_COMMANDS`); it needs the `train`
extra, and scipy (the `eval` extra) for Kendall's tau.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from ruler_rl.cli import console, err
from ruler_rl.judges import DEFAULT_RUBRIC
from ruler_rl.judges.extras import require
from ruler_rl.judges.names import EMBEDDED_JUDGE

require("train", "`ruler distill`")
require("eval", "`ruler distill` (Kendall's tau: scipy)")

app = typer.Typer(help="Judge distillation.")

HELP = "Distil a cheap local judge from a judge's cached judgments and/or labelled groups."


def parse_when(value: str | None, name: str) -> datetime | None:
    """An ISO 8601 date or date-time; without a timezone it is taken as UTC."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"not an ISO 8601 date or date-time: {value!r} (e.g. 2026-11-01 or "
                                 "2026-11-01T12:00:00+00:00)", param_hint=name) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def untrained_judge(student: str) -> str:
    """The judge string of the student before training: the embedded model, or `local/<folder>`. A hub id has
    no local folder of its own: the untrained adapter is measured instead (`run_distill` writes it)."""
    from ruler_rl.judges.embedded import EMBEDDED_MODEL_NAME

    if student in (EMBEDDED_JUDGE, EMBEDDED_MODEL_NAME):
        return EMBEDDED_JUDGE
    if Path(student).expanduser().is_dir():
        return f"local/{Path(student).expanduser().resolve()}"
    return ""


METHODS = ("sft", "grpo", "sft+grpo")
ENGINES = ("auto", "transformers", "vllm")


async def run_distill(*, teacher: str | None, since: datetime | None, until: datetime | None, cache: Path | None,
                      datasets: list[Path], student: str, steps: int, lr: float, out: Path,
                      rubric: str = DEFAULT_RUBRIC,
                      holdout: float = 0.2, seed: int = 0, batch_size: int = 4, orderings: int = 1,
                      max_eval: int | None = None, method: str = "sft", group_size: int = 4,
                      grpo_steps: int | None = None, grpo_lr: float | None = None, engine: str = "transformers",
                      valid_bonus: float = 0.0, print_fn=console.print) -> dict:
    """Gather teacher data, split it by group, measure the untrained student, train, save, measure the trained
    student. `method`: `sft` (`ruler_rl.trainer.sft`), `grpo` (`ruler_rl.trainer.distill.train_grpo`: the student,
    served by `engine`, samples `group_size` answers per prompt, rewarded by agreement with the teacher; `grpo_steps`
    and `grpo_lr` default to `steps` and `lr`) or `sft+grpo` (SFT, then GRPO from the SFT adapter). GRPO's
    run (checkpoints, `history.jsonl`) is kept in `<out>.grpo/`, replaced on each run; the model loaded for
    SFT (or, `grpo` from a hub id, for the untrained adapter) is dropped, and CUDA's cache emptied, before GRPO
    loads its own. Bad input (a bool or a float where an integer is asked, a non-positive rate...) is a
    ValueError before anything is read. Returns {"train",
    "heldout", "untrained", "distilled" (Agreement rows), "paired" (`paired_agreement`: distilled minus untrained
    with its interval), "history" (SFT's rows, then GRPO's), "method", "out"}."""
    from ruler_rl.cache import default_cache_dir, export_judgments
    from ruler_rl.judges.rubrics import get_rubric
    from ruler_rl.labels import load_user_dataset
    from ruler_rl.trainer.checkpoints import save_checkpoint
    from ruler_rl.trainer.distill import (
        agreement,
        cap_by_group,
        from_cache,
        from_labels,
        labelled_groups,
        paired_agreement,
        split_by_group,
    )
    from ruler_rl.trainer.sft import SFTConfig, SFTExample, load_student, save_adapter, train_sft

    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an integer >= 2 (GRPO compares answers within a group); got {group_size!r}")
    if isinstance(valid_bonus, bool) or not isinstance(valid_bonus, (int, float)) or not 0 <= valid_bonus < 1:
        raise ValueError(f"valid_bonus must be a number in [0, 1); got {valid_bonus!r}")
    for name, value, low in (("steps", steps, 1), ("batch_size", batch_size, 1), ("orderings", orderings, 1),
                             ("grpo_steps", grpo_steps, 1), ("max_eval", max_eval, 1), ("seed", seed, None)):
        if value is None and name in ("grpo_steps", "max_eval"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
            raise ValueError(f"{name} must be an integer{f' >= {low}' if low is not None else ''}"
                             f"{' or None' if name in ('grpo_steps', 'max_eval') else ''}; got {value!r}")
    for name, value in (("lr", lr), ("grpo_lr", grpo_lr)):
        if value is None and name == "grpo_lr":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number > 0{' or None' if name == 'grpo_lr' else ''}; "
                             f"got {value!r}")
    if not isinstance(datasets, list) or not all(isinstance(d, (str, Path)) for d in datasets):
        raise ValueError(f"datasets must be a list of paths; got {datasets!r}")
    if not isinstance(student, str) or not student:
        raise ValueError(f"student must be a model name, folder or hub id; got {student!r}")
    if not teacher and not datasets:
        raise ValueError("no teacher data: give --teacher MODEL (judgments from the cache) and/or --dataset PATH")
    if (since or until) and not teacher:
        raise ValueError("--since/--until select cached judgments: give --teacher too")
    config = SFTConfig(steps=steps, learning_rate=lr, seed=seed, batch_size=batch_size)
    rubric_text = str(get_rubric(rubric))
    examples = []
    cache_dir = Path(cache).expanduser() if cache is not None else default_cache_dir()
    if teacher:
        judgments, report = export_judgments(cache_dir, teacher, since=since, until=until)
        found, skipped = from_cache(judgments)
        print_fn(f"cache {cache_dir}: {report.exported} judgments of {teacher} ({report.other_models} of other "
                 f"judges, {report.outside_dates} outside the dates, {report.unrecorded} stored before prompts "
                 f"were recorded); {len(found)} usable, {skipped} not", soft_wrap=True)
        if not found:
            seen = ", ".join(f"{m} ({n})" for m, n in sorted(report.models.items())) or "none"
            raise ValueError(f"no usable judgments of {teacher!r} in {cache_dir} in that date range; judge models "
                             f"recorded there: {seen}")
        examples += found
    for path in datasets:
        pairs, groups, skipped, uniform = load_user_dataset(Path(path))
        found = from_labels(labelled_groups([*pairs, *groups]), rubric_text, orderings=orderings, seed=seed)
        print_fn(f"{path}: {len(pairs)} pairs, {len(groups)} groups -> {len(found)} prompts ({skipped} rows "
                 f"with an empty response and {uniform} groups with equal labels skipped)", soft_wrap=True)
        examples += found
    train, held = split_by_group(examples, holdout, seed=seed)
    all_held = len(held)
    if max_eval is not None:  # whole groups, seeded: a prefix would be the oldest judgments, one ordering only
        held = cap_by_group(held, max_eval, seed=seed)
    print_fn(f"{len(train)} training prompts, {len(held)} held out "
             f"({len({e.group for e in held})} of {len({e.group for e in examples})} groups"
             + (f"; {all_held} before --max-eval" if len(held) < all_held else "") + ")", soft_wrap=True)

    out = Path(out).expanduser().resolve()
    meta = {"base": student, "teacher": teacher, "datasets": [str(p) for p in datasets], "method": method,
            "steps": steps, "learning_rate": lr, "seed": seed, "train_prompts": len(train),
            "heldout_prompts": len(held)}
    if "grpo" in method:
        meta.update(grpo_steps=grpo_steps or steps, grpo_learning_rate=grpo_lr or lr, group_size=group_size)
    judge_cache = cache_dir if cache is not None else None
    before_judge = untrained_judge(student)
    model = tokenizer = None
    if method != "grpo" or not before_judge:
        model, tokenizer, full_forward = await asyncio.to_thread(load_student, student, config)
    if not before_judge:  # a hub base: its untrained adapter (B = 0) answers exactly as the base
        untrained_dir = out.parent / f"{out.name}.untrained"
        await asyncio.to_thread(save_adapter, model, tokenizer, untrained_dir, {**meta, "steps": 0})
        before_judge = f"local/{untrained_dir}"
        if method == "grpo":  # loaded only to write that adapter: off the device before GRPO loads its own
            model = tokenizer = None
            release_memory()
    before = await agreement(before_judge, held, cache=judge_cache)
    history = []
    if method != "grpo":
        history += await asyncio.to_thread(
            train_sft, model, tokenizer, [SFTExample(e.messages, e.answer) for e in train], config,
            full_forward=full_forward,
            on_step=lambda r: print_fn(f"step {r['step']}: loss {r['loss']:.4f}, {r['trained_tokens']} answer "
                                       "tokens", soft_wrap=True))
    if method == "sft":
        await asyncio.to_thread(save_adapter, model, tokenizer, out, meta)
    else:
        runs = out.parent / f"{out.name}.grpo"
        shutil.rmtree(runs, ignore_errors=True)
        if method == "sft+grpo":  # the GRPO run resumes from the SFT adapter, written as its step 1
            await asyncio.to_thread(save_checkpoint, grpo_run_dir(runs), 1, model, None, {"sft_steps": steps})
            model = tokenizer = None  # the SFT model off the device before GRPO loads its own
            release_memory()
        history += await grpo_stage(student, train, out, meta, config, runs,
                                     steps=grpo_steps or steps, lr=grpo_lr or lr, group_size=group_size,
                                     engine=engine, valid_bonus=valid_bonus, print_fn=print_fn)
    model = tokenizer = None
    after = await agreement(f"local/{out}", held, cache=judge_cache)
    return {"train": len(train), "heldout": len(held), "untrained": before.row(), "distilled": after.row(),
            "paired": paired_agreement(held, before, after, seed=seed), "history": history, "method": method,
            "out": str(out)}


GRPO_PROJECT, GRPO_NAME = "grpo", "student"


def grpo_run_dir(runs: Path) -> Path:
    """The folder of the GRPO run (`ruler_rl.trainer.TrainableModel` project `grpo`, name `student`) under `runs`."""
    return Path(runs) / GRPO_PROJECT / GRPO_NAME


def release_memory() -> None:
    """Collect what was just dropped and, on CUDA, return the freed blocks of torch's cache to the device (so
    GRPO's own model and its engine find the memory the SFT model held)."""
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


async def grpo_stage(student: str, train: list, out: Path, meta: dict, sft_config, runs: Path, *, steps: int,
                      lr: float, group_size: int, engine: str, valid_bonus: float, print_fn,
                      engine_options: dict | None = None, stop=None) -> list[dict]:
    """GRPO on `train` in the run at `runs` (resumed from its last checkpoint when there is one: the SFT
    adapter of `sft+grpo`, written there as step 1 before the SFT model was dropped), then the last checkpoint
    written to `out` as a judge folder. `engine_options`: more `EngineConfig` fields (e.g. vLLM's
    `gpu_memory_utilization` beside another server on the GPU); `stop`: `train_grpo`'s early stop."""
    from transformers import AutoTokenizer

    import ruler_rl.trainer.checkpoints as ckpt
    from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from ruler_rl.trainer.backend import resolve_base_model
    from ruler_rl.trainer.distill import train_grpo
    from ruler_rl.trainer.sft import save_checkpoint_as_judge

    model = TrainableModel(GRPO_NAME, GRPO_PROJECT, student, ModelConfig(
        lora=sft_config.lora, seed=sft_config.seed,
        engine=EngineConfig(engine=engine, max_seq_length=sft_config.max_seq_length, **(engine_options or {}))))
    backend = LocalBackend(runs)
    try:
        await model.register(backend)
        config = TrainConfig(learning_rate=lr, max_tokens_per_micro_batch=sft_config.max_tokens_per_micro_batch,
                             logprob_chunk_size=sft_config.logprob_chunk_size, max_grad_norm=sft_config.max_grad_norm,
                             weight_decay=sft_config.weight_decay)
        history = await train_grpo(
            model, train, config, steps=steps, group_size=group_size, batch_size=sft_config.batch_size,
            valid_bonus=valid_bonus, seed=sft_config.seed, stop=stop,
            on_step=lambda r: print_fn(f"grpo step {r['step']}: reward {r['reward_mean']:.3f}, valid "
                                       f"{r['valid_share']:.2f}, cut {r['answers_cut']}, invalid "
                                       f"{r['invalid_answers']}, trained {r['trained']}", soft_wrap=True))
        last = await model.get_step()
        if not any(r["trained"] for r in history):
            if not last:
                raise RuntimeError(f"no GRPO step had a learning signal (every group's answers were rewarded alike); "
                                   f"nothing was written to {out}: see {model.run_dir / 'history.jsonl'}")
            print_fn("no GRPO step had a learning signal: the judge written is the SFT adapter", soft_wrap=True)
        tokenizer = AutoTokenizer.from_pretrained(resolve_base_model(student))
        await asyncio.to_thread(save_checkpoint_as_judge, ckpt.checkpoint_dir(model.run_dir, last), tokenizer, out,
                                {**meta, "grpo_trained_steps": sum(bool(r["trained"]) for r in history)})
    finally:
        await backend.close()
    return history


def print_agreement(result: dict) -> None:
    from rich.table import Table

    table = Table(title=f"agreement with the teacher on {result['heldout']} held-out prompts")
    for col in ("student", "pairwise accuracy", "Kendall tau", "ties", "pairs", "no valid answer"):
        table.add_column(col)
    for label in ("untrained", "distilled"):
        r = result[label]
        table.add_row(label, f"{r['pairwise_accuracy']:.3f}", f"{r['kendall_tau']:.3f}", f"{r['ties']:.3f}",
                      str(r["pairs"]), str(r["errors"]))
    console.print(table)
    p = result["paired"]
    console.print(f"distilled minus untrained, pairwise accuracy over the same {p['pairs']} teacher-ordered pairs "
                  f"(no valid answer counted wrong): {p['difference']:+.3f}, 95% interval [{p['low']:+.3f}, "
                  f"{p['high']:+.3f}]; a tie worth one half: {p['difference_half']:+.3f} [{p['low_half']:+.3f}, "
                  f"{p['high_half']:+.3f}] (paired bootstrap over {p['groups']} groups); always the first shown: "
                  f"{p['first_shown']:.3f}", soft_wrap=True)
    console.print(f"judge: local/{result['out']}", soft_wrap=True)


@app.command("distill")
def distill(
    out: Annotated[Path, typer.Option("--out", help="Folder the distilled judge is written to (local/<out>).")],
    teacher: Annotated[str | None, typer.Option(
        "--teacher", help="The judge model whose cached judgments to learn from (its litellm model string).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only judgments stored at or after this "
                                                              "ISO date/time (UTC unless given).")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Only judgments stored before this ISO date/time.")] = None,
    cache: Annotated[Path | None, typer.Option("--cache", help="The judge cache folder (default: the judge "
                                                               "cache, $RULER_CACHE_DIR).")] = None,
    dataset: Annotated[list[Path] | None, typer.Option(
        "--dataset", help="A JSONL file of labelled pairs or groups (ruler eval judge's formats); repeatable.")] = None,
    student: Annotated[str, typer.Option("--student", help="The base model to fine-tune: the embedded model, a "
                                                           "folder or a hub id.")] = EMBEDDED_JUDGE,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps (SFT's, and GRPO's unless --grpo-steps).")] = 200,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="Learning rate.")] = 2e-4,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Prompts per step.")] = 4,
    rubric: Annotated[str, typer.Option("--rubric", help="Rubric name or text for --dataset prompts.")] = "default",
    holdout: Annotated[float, typer.Option("--holdout", min=0.01, max=0.99,
                                           help="Share of the groups held out.")] = 0.2,
    orderings: Annotated[int, typer.Option("--orderings", min=1, help="Orders each labelled group is shown "
                                                                     "in (more training prompts).")] = 1,
    max_eval: Annotated[int | None, typer.Option("--max-eval", min=1, help="Measure on at most this many "
                                                                          "held-out prompts (whole groups, "
                                                                          "seeded).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seeds the split, the adapter and the example order.")] = 0,
    method: Annotated[str, typer.Option("--method", help="sft (on the teacher's answers), grpo (reward: "
                                                         "agreement with the teacher's scores) or sft+grpo.")] = "sft",
    group_size: Annotated[int, typer.Option("--group-size", help="GRPO: answers sampled per prompt (>= 2).")] = 4,
    grpo_steps: Annotated[int | None, typer.Option("--grpo-steps", help="GRPO steps (default: --steps).")] = None,
    grpo_lr: Annotated[float | None, typer.Option("--grpo-lr", help="GRPO learning rate (default: --lr).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="GRPO: what serves the student's answers: transformers "
                                                         "(CPU or GPU), vllm (GPU) or auto.")] = "transformers",
    valid_bonus: Annotated[float, typer.Option("--valid-bonus", help="GRPO: reward of a valid answer that ranks "
                                                                     "backwards, in [0, 1).")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (the progress on stderr).")
                       ] = False,
) -> None:
    """Distil a cheap local judge from a judge's cached judgments and/or labelled groups.

    Trains a LoRA adapter on --student and writes it to --out, usable as the judge local/<out>: by SFT on the
    teacher's answers (--method sft), by GRPO whose reward is the agreement of each sampled answer's scores
    with the teacher's (--method grpo), or both in turn (sft+grpo). Ends by printing its agreement with the
    teacher on held-out groups (pairwise accuracy, Kendall tau, ties) next to the untrained student's.

    GRPO samples under RULER's answer schema (constrained decoding) while its loss uses the unconstrained
    policy's log-probabilities: the PPO ratio is consistent, but the gradient's target is log pi, not the
    constrained log q = log pi - log Z, so tokens the grammar forces still get gradient.
    """
    from ruler_rl.judges.rubrics import get_rubric

    rubric_text = str(get_rubric(rubric))  # a name or the text; a typo is an error naming the rubrics
    result = asyncio.run(run_distill(
        teacher=teacher, since=parse_when(since, "--since"), until=parse_when(until, "--until"), cache=cache,
        datasets=list(dataset or []), student=student, steps=steps, lr=lr, out=out, rubric=rubric_text,
        holdout=holdout, seed=seed, batch_size=batch_size, orderings=orderings, max_eval=max_eval,
        method=method, group_size=group_size, grpo_steps=grpo_steps, grpo_lr=grpo_lr, engine=engine,
        valid_bonus=valid_bonus, print_fn=err.print if as_json else console.print))  # --json: progress on stderr
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "history"}))
    else:
        print_agreement(result)
