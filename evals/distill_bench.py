"""The distillation measurement (issue #15 part 2): a judge distilled from ART·E's rubric, measured on groups
of inboxes it never saw, and outside its task on LLMBar Natural.

Without a strong LLM the teacher is a verifiable one: ART·E rollouts graded by ART's rubric (correct answer,
sources; `evals.art_e.rewards.grade`), each group's rewards as the labels, rendered as RULER prompts with the
default rubric (`ruler_rl.trainer.distill.from_labels`: the rewards min-max scaled as the teacher's scores).

    # 1. sample graded groups (a policy served by vLLM; the embedded model works on a CPU, slowly)
    python -m evals.distill_bench sample --policy hosted_vllm/Qwen/Qwen2.5-7B-Instruct@http://127.0.0.1:8000/v1 \\
        --db runs/art-e-inbox.db --scenarios runs/scenarios.json --split train --groups 400 --group-size 4 \\
        --out runs/distill/train.jsonl
    python -m evals.distill_bench sample ... --split test --groups 100 --out runs/distill/test.jsonl
    # 2. distil and measure: before vs after on the test groups, and LLMBar Natural (needs ../shared/data)
    python -m evals.distill_bench run --train runs/distill/train.jsonl --test runs/distill/test.jsonl \\
        --student local/smollm2-135m-instruct --steps 400 --lr 2e-4 --llmbar-limit 200 --out evals/reports/distill

`run` writes `report.json` (both agreements, the training history, the commands) and `README.md` (a table)
under `--out`, and the judge under `--out/judge`; it measures the judge through `local/<folder>`
(transformers, constrained JSON, one generation at a time: slow on a CPU), so a prompt longer than the
student's context (SmolLM2: 8192 tokens) counts as "no valid answer".

`gpu` does it all in one process under a wall-clock budget, for one GPU:

    # data: the inbox DB and scenarios (train and test split by inbox) in one folder
    python -m evals.distill_bench data --out .gpudata/distill --llmbar-root ../shared/data/judge-meta
    python -m evals.distill_bench gpu --data .gpudata/distill --out runs/distill-gpu --budget-s 400 \\
        --llmbar-root .gpudata/distill/judge-meta
    # the same plumbing on a CPU at tiny size (the embedded model in process instead of vLLM)
    python -m evals.distill_bench gpu --data .gpudata/distill --out /tmp/dry --budget-s 1400 --dry-run

1. serve: vLLM's OpenAI server for `--model-dir` (SmolLM2-135M-Instruct) as `smollm2`, LoRA enabled with
   runtime loading, started and health-checked by `ruler_rl.trainer.vllm_server.ServerProcess`, its log in `--out`;
2. sample: train and test groups at once (`--concurrency` rollouts in flight each), the agent in `text`
   tool mode (SmolLM2 makes no native tool calls: one JSON tool call per turn, constrained by vLLM's
   structured output); no group starts after 40% of the budget;
3. the untrained student (the served base model) is measured on the test groups while the SFT (bf16 on
   CUDA, `ruler_rl.trainer.sft`) trains; the SFT stops at `--steps` or when only the room the later phases
   need is left of the budget (40 s, 45 s an LLMBar set, 1.5 times that with GRPO, and GRPO's budget + 30 s),
   and the adapter is saved to `--judge-dir` (under /tmp, not `--out`);
4. the adapter is loaded into the running server (`/v1/load_lora_adapter`, as `smollm2@1`) and measured
   on the same test groups; LLMBar's `--llmbar-sets` (`--llmbar-limit` pairs each, every student) if
   `--llmbar-root` holds `LLMBar/`, a set skipped when under 30 s are left; then the server stops.

With `--teacher` (a judge's cached judgments as the data: `evals/device/distill_run.sh`, table 2 of
`evals/reports/judges/README.md`) nothing is sampled, and `--grpo-steps N` adds GRPO after the SFT, from its
adapter (`ruler distill --method sft+grpo`'s stage on the trainer's own vLLM beside this server), measured as
`smollm2@2` on the same held-out prompts and LLMBar.

Every phase prints its seconds; `--out` gets `train.jsonl`, `test.jsonl`, `report.json`, `README.md` and
`vllm-server.log`, written whatever happened (an error is recorded in the report, exit status 1; the budget's
end as "budget of N s reached during phase X").
Checked on a CPU with `--dry-run`, and run once on an H200 (vLLM 0.24; `evals/reports/distill/README.md`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

from evals.judge_meta import LLMBAR


def _policy(spec: str) -> tuple[str, dict]:
    model, _, url = spec.partition("@")
    return model, ({"api_base": url} if url else {})


async def sample_groups(*, policy: str, db: Path, scenarios: Path, split: str, groups: int, group_size: int,
                        max_turns: int, temperature: float, seed: int, out: Path, concurrency: int = 8,
                        params: dict | None = None, tool_mode: str = "auto", deadline: float | None = None,
                        grace_s: float = 30.0) -> dict:
    """Roll out `group_size` times on each of up to `groups` scenarios of `split` (all groups at once, at most
    `concurrency` rollouts in flight), grade every rollout with ART's rubric, and save the groups whose rewards
    differ as TrajectoryGroup JSONL rows (one group a line, written as each group finishes).

    `params` are extra litellm parameters of the policy (e.g. `api_base`). With `deadline` (a
    `time.perf_counter()` value) no group starts after it, and groups still running `grace_s` later are
    cancelled; a group with a rollout that raised (the endpoint refused it, e.g. a context over the server's
    limit) is dropped and counted."""
    from evals.art_e.agent import run_agent
    from evals.art_e.questions import load_scenarios
    from evals.art_e.rewards import grade
    from ruler_rl import TrajectoryGroup

    if groups < 1 or group_size < 2:
        raise ValueError("need groups >= 1 and group_size >= 2")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    found = load_scenarios(scenarios, split=split)
    if not found:
        raise ValueError(f"{scenarios}: no scenarios of split {split!r}")
    chosen = random.Random(seed).sample(found, min(groups, len(found)))
    model, spec_params = _policy(policy)
    params = {**spec_params, **(params or {}), "temperature": temperature}
    sem = asyncio.Semaphore(concurrency)
    counts = {"groups": 0, "skipped_equal_rewards": 0, "failed": 0, "not_started": 0, "cancelled": 0}
    errors: list[str] = []

    async def rollout(sc, k):
        async with sem:
            t = await run_agent(sc, db, model, params={**params, "seed": seed * 1000 + k}, max_turns=max_turns,
                                tool_mode=tool_mode, tool_choice="auto")  # as its recorded runs sent
            await grade(t, sc, max_turns=max_turns)
            return t

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:  # noqa: ASYNC230 - small appends between awaits
        async def group(sc):
            if deadline is not None and time.perf_counter() > deadline:
                counts["not_started"] += 1
                return
            try:
                trajs = await asyncio.gather(*(rollout(sc, k) for k in range(group_size)))
            except Exception as exc:  # noqa: BLE001 - one refused rollout drops its group, not the run
                counts["failed"] += 1
                errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                return
            if len({t.reward for t in trajs}) < 2:
                counts["skipped_equal_rewards"] += 1
                return
            g = TrajectoryGroup(trajs, metadata={"scenario": sc.id, "inbox": sc.inbox_address, "split": split})
            f.write(g.model_dump_json() + "\n")
            f.flush()
            counts["groups"] += 1

        tasks = [asyncio.ensure_future(group(sc)) for sc in chosen]
        timeout = None if deadline is None else max(0.0, deadline + grace_s - time.perf_counter())
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        counts["cancelled"] = len(pending)
    return {**counts, "scenarios": len(chosen), "out": str(out), "errors": errors[:5]}


async def run_bench(*, train: Path, test: Path, student: str, steps: int, lr: float, batch_size: int, seed: int,
                    out: Path, max_eval: int | None, llmbar_limit: int, llmbar_root: Path | None,
                    max_seq_length: int = 8192) -> dict:
    """Distil `student` on the graded groups of `train`; agreement with the rubric on `test` before and after;
    the distilled judge on LLMBar Natural (`llmbar_limit` pairs; 0 skips it)."""
    from ruler_rl.judges import DEFAULT_RUBRIC
    from ruler_rl.labels import load_user_dataset
    from ruler_rl.trainer.distill import agreement, cap_by_group, from_labels, labelled_groups
    from ruler_rl.trainer.distill_cli import untrained_judge
    from ruler_rl.trainer.sft import SFTConfig, SFTExample, load_student, save_adapter, train_sft

    def examples(path: Path):
        pairs, groups, _, _ = load_user_dataset(path)
        return from_labels(labelled_groups([*pairs, *groups]), DEFAULT_RUBRIC, seed=seed)

    if max_eval is not None and (isinstance(max_eval, bool) or not isinstance(max_eval, int) or max_eval < 1):
        raise ValueError(f"max_eval must be an integer >= 1 or None, got {max_eval!r}")
    train_ex, test_ex = examples(train), examples(test)
    if max_eval is not None:  # whole groups, seeded (cap_by_group), not the file's first prompts
        test_ex = cap_by_group(test_ex, max_eval, seed=seed)
    config = SFTConfig(steps=steps, learning_rate=lr, batch_size=batch_size, seed=seed, max_seq_length=max_seq_length,
                       max_tokens_per_micro_batch=max(8192, max_seq_length))
    started = time.perf_counter()
    model, tokenizer, full_forward = await asyncio.to_thread(load_student, student, config)
    judge_dir = out / "judge"
    before_judge = untrained_judge(student)
    if not before_judge:
        await asyncio.to_thread(save_adapter, model, tokenizer, out / "untrained", {"base": student, "steps": 0})
        before_judge = f"local/{(out / 'untrained').resolve()}"
    before = await agreement(before_judge, test_ex, cache=False)
    history = await asyncio.to_thread(train_sft, model, tokenizer, [SFTExample(e.messages, e.answer) for e in train_ex],
                                      config, full_forward=full_forward)
    await asyncio.to_thread(save_adapter, model, tokenizer, judge_dir,
                            {"base": student, "teacher": "ART·E rubric", "train": str(train), "steps": steps})
    after = await agreement(f"local/{judge_dir.resolve()}", test_ex, cache=False)
    report = {"train_prompts": len(train_ex), "test_prompts": len(test_ex), "untrained": before.row(),
              "distilled": after.row(), "history": history, "seconds": time.perf_counter() - started,
              "command": "python -m evals.distill_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
    if llmbar_limit:
        from evals.judge_meta import DEFAULT_ROOT, evaluate

        summary, _ = await evaluate(["llmbar-natural"], f"local/{judge_dir.resolve()}", limit=llmbar_limit,
                                    root=llmbar_root or DEFAULT_ROOT, progress=False, cache=False)
        base_summary, _ = await evaluate(["llmbar-natural"], before_judge, limit=llmbar_limit,
                                         root=llmbar_root or DEFAULT_ROOT, progress=False, cache=False)
        report["llmbar_natural"] = {"distilled": summary.iloc[0].to_dict(), "untrained": base_summary.iloc[0].to_dict()}
    write_report(out, report)
    return report


VLLM_MODEL = "/tmp/models/SmolLM2-135M-Instruct"
SERVED = "smollm2"
STUDENT_LABELS = {"untrained": "untrained", "distilled": "distilled (SFT)", "sft_grpo": "SFT+GRPO"}


def student_measure_s(eval_s: float) -> float:
    """The seconds kept for one later student's measure of the held-out prompts: the untrained student's own
    measure of them (`eval_s`, or its time so far while it runs) plus a quarter, at least 40 s. The untrained
    measure runs beside the SFT, so it can err either way (a shared GPU)."""
    return max(40.0, 1.25 * eval_s)


def room_after_sft(eval_s: float, *, grpo_steps: int, grpo_budget_s: float, llmbar_sets: tuple[str, ...],
                   llmbar_limit: int) -> float:
    """Seconds of the budget the SFT leaves for what follows it: each later student's measure on the held-out
    prompts (`student_measure_s`; two students with GRPO), GRPO's budget + 30 s, and 45 s per student on each
    LLMBar set (`llmbar_limit` 0: none). On 2026-12-08 the SFT student's measure of 485 held-out prompts had not
    ended after 146 s on an H100, where the bench kept a fixed 40 s for it: the planned 1,000-s run would have
    left GRPO half its time and none for its student's measure."""
    students = 3 if grpo_steps else 2
    room = student_measure_s(eval_s) * (students - 1)
    if llmbar_limit:
        room += 45 * students * len(llmbar_sets)
    return room + (grpo_budget_s + 30 if grpo_steps else 0)


def room_after_grpo(eval_s: float, *, llmbar_sets: tuple[str, ...], llmbar_limit: int) -> float:
    """Seconds GRPO leaves for what follows it: its student's measure and the three students on each LLMBar set."""
    return student_measure_s(eval_s) + (45 * 3 * len(llmbar_sets) if llmbar_limit else 0)


class _Phases:
    """Seconds per phase, printed as each ends, against one wall-clock budget; `current` is the phase last
    begun."""

    def __init__(self, budget_s: float):
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.seconds: dict[str, float] = {}
        self.current = "start"

    def begin(self, name: str) -> float:
        """Mark phase `name` as begun; returns its start (for `done`)."""
        self.current = name
        return time.perf_counter()

    def budget_reached(self) -> str:
        """What the report says when the budget ends: "budget of N s reached during phase X"."""
        return f"budget of {self.budget_s:g} s reached during phase {self.current}"

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def at(self, seconds_from_start: float) -> float:
        return self.start + seconds_from_start

    def done(self, name: str, since: float) -> None:
        self.seconds[name] = time.perf_counter() - since
        print(f"[distill-bench] {name}: {self.seconds[name]:.1f} s (elapsed {time.perf_counter() - self.start:.1f} "
              f"of {self.budget_s:.0f} s)", flush=True)


class BudgetReached(TimeoutError):
    """A phase's own time limit, drawn from the budget, ran out (its message says which)."""


async def run_within_budget(ph: _Phases, report: dict, work) -> None:
    """Await `work()` (a coroutine function) within what is left of `ph`'s budget, a SIGTERM cancelling it.
    The budget's end is recorded in `report["error"]` as "budget of N s reached during phase X" (X: the phase
    last begun), a failure as "Class: message", a cancellation as such (and re-raised); what `work` measured
    stays in `report`."""
    loop = asyncio.get_running_loop()
    handler = False
    try:  # a SIGTERM (a wall-clock limit outside) cancels this task: what was measured is still written
        loop.add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        handler = True
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    timer = asyncio.timeout(ph.left())
    try:
        async with timer:
            await work()
    except BaseException as exc:  # the budget's end or a failure: keep and report what was measured
        if isinstance(exc, asyncio.CancelledError):
            report["error"] = "cancelled (SIGTERM, or by the caller)"
        elif isinstance(exc, BudgetReached):
            report["error"] = str(exc)
        elif isinstance(exc, TimeoutError) and timer.expired():
            report["error"] = ph.budget_reached()
        else:
            report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"[distill-bench] stopped: {report['error']}", flush=True)
        if not isinstance(exc, Exception):
            raise
    finally:
        if handler:
            loop.remove_signal_handler(signal.SIGTERM)


def _vllm_server(model_dir: str, log_dir: Path, port: int, lora_rank: int, gpu_memory_utilization: float,
                 startup_timeout_s: float, enforce_eager: bool):
    """vLLM's OpenAI server for `model_dir` served as `smollm2`, with runtime LoRA loading on (the distilled
    adapter is loaded into the same server as `smollm2@1`); `ruler_rl.trainer.vllm_server.ServerProcess` starts it,
    waits for /health, loads adapters and stops it."""
    from ruler_rl.judges.vllm_settings import COMPACT_JSON
    from ruler_rl.trainer.config import EngineConfig
    from ruler_rl.trainer.vllm_server import ServerProcess, lora_serving_rank

    class DistillVLLM(ServerProcess):
        name = "vllm"

        def _require(self) -> None:
            from ruler_rl.judges.checkpoint import check_checkpoint

            check_checkpoint(model_dir)  # vLLM would serve a tensor the folder lacks uninitialized, silently

        def command(self) -> list[str]:
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                    "--served-model-name", SERVED, "--host", self.host, "--port", str(self.port),
                    "--gpu-memory-utilization", str(gpu_memory_utilization), "--max-model-len", "8192",
                    "--enable-lora", "--max-lora-rank", str(lora_serving_rank(lora_rank)), "--max-loras", "2",
                    "--max-cpu-loras", "3",
                    "--generation-config", "vllm", "--disable-uvicorn-access-log",
                    # one-line JSON scores, as the library's vLLM engines ask (vLLM 0.24's default grammar let a
                    # judge write whitespace until its token limit, 2026-12-07)
                    "--structured-outputs-config", json.dumps(COMPACT_JSON)]
            return argv + (["--enforce-eager"] if enforce_eager else [])

        def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
            return {**super().environment(base), "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}

    config = EngineConfig(startup_timeout_s=max(1.0, startup_timeout_s), server_timeout_s=300)
    return DistillVLLM(config, served_name=SERVED, log_dir=log_dir, port=port or None)


async def gpu_bench(*, data: Path | None, out: Path, budget_s: float = 400, train_groups: int = 160, test_groups: int = 60,
                    group_size: int = 4, max_turns: int = 4, temperature: float = 1.0, concurrency: int = 64,
                    steps: int = 200, lr: float = 2e-4, batch_size: int = 8, seed: int = 0,
                    model_dir: str = VLLM_MODEL, judge_dir: Path = Path("/tmp/distill-bench/judge"),
                    port: int = 0, gpu_memory_utilization: float = 0.3, enforce_eager: bool = False,
                    llmbar_limit: int = 50, llmbar_root: Path | None = None, dry_run: bool = False,
                    teacher: str | None = None, teacher_cache: Path | None = None, since: datetime | None = None,
                    until: datetime | None = None, holdout: float = 0.2,
                    llmbar_sets: tuple[str, ...] = ("llmbar-natural",), grpo_steps: int = 0,
                    grpo_lr: float | None = None, grpo_group_size: int = 4, grpo_budget_s: float = 240,
                    max_eval: int | None = None) -> dict:
    """The whole measurement in one process under `budget_s` seconds of wall clock: serve the policy (vLLM;
    `dry_run`: the embedded model in process on the CPU), sample train and test groups from `data`
    (`inbox.db`, `scenarios.jsonl`), measure the untrained student while the SFT runs, load the distilled
    adapter into the same server and measure it, LLMBar (`llmbar_sets`) if its data is there and time is left.

    With `teacher` (a judge's litellm model string) the teacher is that judge instead of ART·E's rubric: its
    judgments recorded in `teacher_cache` (a judge cache: `ruler_rl.cache.export_judgments`, from `since` on)
    are the data, split by group (`holdout` of the groups held out, seeded), and nothing is sampled (`data` is
    not read; `until`, when given, ends the span of judgments). The report then holds `paired`: the distilled
    minus the untrained student's agreement with the teacher over the same held-out pairs, with a
    paired-bootstrap interval over groups (`ruler_rl.trainer.distill.paired_agreement`).

    `grpo_steps` > 0 adds GRPO after the SFT (`ruler distill --method sft+grpo`'s stage,
    `ruler_rl.trainer.distill_cli.grpo_stage`: the trainer's own vLLM engine beside this server, at the same
    `gpu_memory_utilization`; `dry_run`: transformers on the CPU), from the SFT adapter, rewarded by agreement
    with the teacher on the training prompts, `grpo_group_size` answers a prompt, `batch_size` prompts a step,
    learning rate `grpo_lr` (default `lr`), for `grpo_steps` steps or until the first step that ends past
    `grpo_budget_s` seconds from the stage's start (engine start included; a step is not cut, so the stage ends
    after that; the SFT ends that much earlier to leave the room). Its judge (`<judge_dir>-grpo`, the SFT adapter
    when no GRPO step trained: `grpo_steps_trained` says) is loaded as `smollm2@2` and measured on the same
    held-out prompts (`sft_grpo`, paired against the untrained student, `paired_grpo`, and against the SFT
    adapter, `paired_grpo_sft`) and on LLMBar; the run's history and logs are copied to `out/grpo-run/`. A GRPO
    stage that fails is recorded as `grpo_error` and the rest goes on.

    `max_eval`: measure every student on at most this many held-out prompts, whole groups chosen by `seed`
    (`ruler_rl.trainer.distill.cap_by_group`; `heldout_prompts` records how many there were before).

    Each phase stops early rather than overrun (sampling by about 40% of the budget; the SFT when only
    `room_after_sft` is left, the untrained student's measured time standing for each later student's, and says
    so: `sft_stopped`; GRPO when only `room_after_grpo` is) and `report.json` + `README.md` are written under `out` whatever happened, with the
    seconds per phase (the budget's end recorded as "budget of N s reached during phase X",
    `run_within_budget`)."""
    from evals.judge_meta import DEFAULT_ROOT, evaluate
    from ruler_rl.cache import export_judgments
    from ruler_rl.judges import DEFAULT_RUBRIC
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
    from ruler_rl.trainer.distill_cli import grpo_run_dir, grpo_stage, release_memory
    from ruler_rl.trainer.sft import SFTConfig, SFTExample, load_student, save_adapter, train_sft

    db, scenarios = (Path(data) / "inbox.db", Path(data) / "scenarios.jsonl") if data is not None else (None, None)
    if teacher is None:
        if data is None:
            raise ValueError("give data (ART·E's rubric on sampled groups) or teacher with teacher_cache")
        for path in (db, scenarios):
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: --data must hold inbox.db and scenarios.jsonl")
    elif teacher_cache is None or not Path(teacher_cache).is_dir():
        raise FileNotFoundError(f"teacher_cache {teacher_cache} is not a folder: the judge cache holding the "
                                f"teacher's judgments")
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be in (0, 1), got {holdout!r}")
    if not dry_run and not (Path(model_dir) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} holds no config.json: the student's Hugging Face folder (on the GPU host "
                                "evals/device/distill_run.sh converts SmolLM2 there)")
    if isinstance(llmbar_sets, str) or not llmbar_sets or not all(x in LLMBAR for x in llmbar_sets):
        raise ValueError(f"llmbar_sets must be LLMBar set names ({', '.join(LLMBAR)}), got {llmbar_sets!r}")
    if budget_s < 30:
        raise ValueError("budget_s must be >= 30")
    if min(train_groups, test_groups, steps, batch_size, concurrency) < 1 or group_size < 2:
        raise ValueError("need train/test groups, steps, batch size, concurrency >= 1 and group_size >= 2")
    if isinstance(grpo_steps, bool) or not isinstance(grpo_steps, int) or grpo_steps < 0:
        raise ValueError(f"grpo_steps must be an integer >= 0 (0: no GRPO), got {grpo_steps!r}")
    if grpo_steps and teacher is None:
        raise ValueError("grpo_steps needs a teacher (the GRPO reward is agreement with the teacher's judgments)")
    if grpo_steps and (isinstance(grpo_group_size, bool) or not isinstance(grpo_group_size, int)
                       or grpo_group_size < 2):
        raise ValueError(f"grpo_group_size must be an integer >= 2, got {grpo_group_size!r}")
    if grpo_steps and not grpo_budget_s > 30:
        raise ValueError(f"grpo_budget_s must be > 30 seconds, got {grpo_budget_s!r}")
    if max_eval is not None and (isinstance(max_eval, bool) or not isinstance(max_eval, int) or max_eval < 1):
        raise ValueError(f"max_eval must be an integer >= 1 or None, got {max_eval!r}")
    if grpo_lr is not None and not (isinstance(grpo_lr, (int, float)) and not isinstance(grpo_lr, bool)
                                    and 0 < grpo_lr < 1):
        raise ValueError(f"grpo_lr must be a number in (0, 1) or None, got {grpo_lr!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ph = _Phases(budget_s)
    report: dict = {"command": "python -m evals.distill_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                    "dry_run": dry_run, "budget_s": budget_s, "phases": ph.seconds}
    server = None

    async def measure() -> None:
        nonlocal server
        t = ph.begin("serve")
        if dry_run:
            policy, params = "local/smollm2-135m-instruct", {}
            student, before_judge = "local/smollm2-135m-instruct", "local/smollm2-135m-instruct"
        else:
            server = _vllm_server(model_dir, out, port, SFTConfig().lora.rank, gpu_memory_utilization,
                                  ph.left() - 120, enforce_eager)
            await server.start()
            policy, params = f"hosted_vllm/{SERVED}", {"api_base": server.base_url}
            student, before_judge = model_dir, f"hosted_vllm/{SERVED}"
        report["policy"] = policy
        ph.done("serve", t)

        if teacher is not None:  # a judge's cached judgments are the data: nothing to sample
            t = ph.begin("teacher_data")
            judgments, exported = export_judgments(Path(teacher_cache), teacher, since=since, until=until)
            found, unusable = from_cache(judgments)
            groups = len({e.group for e in found})
            if groups < 2:
                raise RuntimeError(f"{len(found)} usable judgments of {teacher} in {teacher_cache} (since {since}): "
                                   f"too few groups to hold some out; judges recorded there: {exported.models}")
            train_ex, test_ex = split_by_group(found, holdout, seed=seed)
            report["teacher"] = {"judge": teacher, "cache": str(teacher_cache), "since": str(since) if since else None,
                                 "until": str(until) if until else None,
                                 "judgments": exported.exported, "usable": len(found), "unusable": unusable,
                                 "groups": groups,
                                 "heldout_groups": len({e.group for e in test_ex})}
            ph.done("teacher_data", t)
        else:
            t = ph.begin("sample")
            deadline = ph.at(budget_s * 0.4)
            common = {"policy": policy, "db": db, "scenarios": scenarios, "group_size": group_size,
                      "max_turns": max_turns, "temperature": temperature, "seed": seed, "concurrency": concurrency,
                      "params": params, "tool_mode": "text", "deadline": deadline, "grace_s": 20.0}
            tr, te = await asyncio.gather(
                sample_groups(split="train", groups=train_groups, out=out / "train.jsonl", **common),
                sample_groups(split="test", groups=test_groups, out=out / "test.jsonl", **common))
            report["sample"] = {"train": tr, "test": te}
            print(f"[distill-bench] sampled: {json.dumps(report['sample'])[:1500]}", flush=True)
            ph.done("sample", t)

            def examples(path: Path):
                pairs, groups, _, _ = load_user_dataset(path)
                return from_labels(labelled_groups([*pairs, *groups]), DEFAULT_RUBRIC, seed=seed)

            if not tr["groups"] or not te["groups"]:
                raise RuntimeError("no graded groups with differing rewards to train or test on")
            train_ex, test_ex = examples(out / "train.jsonl"), examples(out / "test.jsonl")
        report["heldout_prompts"] = len(test_ex)
        if max_eval is not None:  # whole groups, seeded: a prefix would be the oldest judgments, one ordering only
            test_ex = cap_by_group(test_ex, max_eval, seed=seed)
        report.update(train_prompts=len(train_ex), test_prompts=len(test_ex))
        judge_params = {**params, "temperature": 0.0}  # greedy, as the local judge (vLLM's default is 1)

        t = ph.begin("sft_and_eval_untrained")
        config = SFTConfig(steps=steps, learning_rate=lr, batch_size=batch_size, seed=seed, max_seq_length=8192)
        # room after the SFT: the distilled student's measure, GRPO and its measure, and every student on each
        # LLMBar set (none without its data); a student's measure is estimated by the untrained one's: its time so
        # far while it runs (beside the SFT), its whole time once it has ended
        root = Path(llmbar_root) if llmbar_root else DEFAULT_ROOT
        bar_limit = llmbar_limit if (root / "LLMBar").is_dir() else 0
        eval_start, eval_s = [time.perf_counter()], [None]

        def measure_estimate() -> float:
            return eval_s[0] if eval_s[0] is not None else time.perf_counter() - eval_start[0]

        def sft_room() -> float:
            return room_after_sft(measure_estimate(), grpo_steps=grpo_steps, grpo_budget_s=grpo_budget_s,
                                  llmbar_sets=llmbar_sets, llmbar_limit=bar_limit)
        # GRPO's run and its judge sit beside --judge-dir, named after it (replaced only when GRPO runs)
        grpo_runs = Path(judge_dir).parent / f"{Path(judge_dir).name}-grpo-runs"
        grpo_dir = Path(judge_dir).parent / f"{Path(judge_dir).name}-grpo"
        if grpo_steps:
            shutil.rmtree(grpo_runs, ignore_errors=True)
        history: list[dict] = []

        class OutOfTime(Exception):
            pass

        def on_step(row: dict) -> None:
            history.append(row)
            if len(history) < steps and ph.left() < sft_room():
                raise OutOfTime

        def sft() -> None:
            model, tokenizer, full_forward = load_student(student, config)
            try:
                train_sft(model, tokenizer, [SFTExample(e.messages, e.answer) for e in train_ex], config,
                          full_forward=full_forward, on_step=on_step)
            except OutOfTime:
                report["sft_stopped"] = (f"by the budget after {len(history)} of {steps} steps, at "
                                         f"{budget_s - ph.left():.0f} s of {budget_s:g}: {ph.left():.0f} s left, "
                                         f"{sft_room():.0f} s needed after it (a student's measure taken as "
                                         f"{student_measure_s(measure_estimate()):.0f} s)")
                print(f"[distill-bench] SFT stopped {report['sft_stopped']}"
                      + ("; the budget left it no room: a larger --budget-s or a smaller --max-eval"
                         if len(history) <= 1 else ""), flush=True)
            save_adapter(model, tokenizer, judge_dir, {"base": student, "teacher": teacher or "ART·E rubric",
                                                       "steps": len(history)})
            if grpo_steps:  # GRPO resumes from the SFT adapter, written as the run's step 1 (as `ruler distill` does)
                save_checkpoint(grpo_run_dir(grpo_runs), 1, model, None, {"sft_steps": len(history)})

        async def before_eval():
            b = eval_start[0] = time.perf_counter()
            result = await agreement(before_judge, test_ex, params=judge_params, cache=False,
                                     concurrency=concurrency)
            ph.done("eval_untrained", b)
            eval_s[0] = time.perf_counter() - b  # how long each later student's measure will take, about
            return result

        # the untrained student is measured while the SFT trains (both on the GPU; the server's is capped). In a dry
        # run both load transformers models in this process, and two loads at once in two threads raced
        # ("Cannot copy out of meta tensor", 2026-12-07): one after the other there
        if dry_run:
            before = await before_eval()
            await asyncio.to_thread(sft)
        else:
            before, _ = await asyncio.gather(before_eval(), asyncio.to_thread(sft))
        report["untrained"] = before.row()
        report.update(history=history, sft_steps=len(history), sft_steps_asked=steps)
        ph.done("sft_and_eval_untrained", t)

        async def measure_adapter(slot: int, folder: Path):
            """The judge folder `folder` served as `smollm2@slot` (in process in a dry run) and its agreement with the
            teacher on the held-out prompts: (its judge string, the Agreement)."""
            if server is not None:
                await server.load_adapter(slot, folder)
                name = f"hosted_vllm/{SERVED}@{slot}"
            else:
                name = f"local/{Path(folder).resolve()}"
            return name, await agreement(name, test_ex, params=judge_params, cache=False, concurrency=concurrency)

        t = ph.begin("eval_distilled")
        after_judge, after = await measure_adapter(1, judge_dir)
        report["distilled"] = after.row()
        report["paired"] = paired_agreement(test_ex, before, after, seed=seed)
        ph.done("eval_distilled", t)

        async def grpo() -> None:
            t = ph.begin("grpo")
            release_memory()  # the SFT model's blocks back to the device before GRPO's engine starts
            # `stop` is asked after each step: the step running at this time ends first, so leave room after it for
            # the GRPO student's measure and LLMBar
            # 30 s for the step that runs past the cap (as room_after_sft keeps), then its student's measure
            # (the longer of the two measured so far) and LLMBar
            measured = max(measure_estimate(), report["phases"].get("eval_distilled", 0.0))
            grpo_end = time.perf_counter() + min(grpo_budget_s, max(0.0, ph.left() - 30 - room_after_grpo(
                measured, llmbar_sets=llmbar_sets, llmbar_limit=bar_limit)))
            meta = {"base": student, "teacher": teacher, "method": "sft+grpo", "sft_steps": len(history),
                    "grpo_steps": grpo_steps, "grpo_learning_rate": grpo_lr or lr, "group_size": grpo_group_size}
            options = None if dry_run else {"gpu_memory_utilization": gpu_memory_utilization,
                                            "enforce_eager": enforce_eager}
            try:
                report["grpo_history"] = await grpo_stage(
                    student, train_ex, grpo_dir, meta, config, grpo_runs, steps=grpo_steps, lr=grpo_lr or lr,
                    group_size=grpo_group_size, engine="transformers" if dry_run else "vllm", valid_bonus=0.0,
                    print_fn=lambda text, **_: print(f"[distill-bench] {text}", flush=True),
                    engine_options=options, stop=lambda: time.perf_counter() > grpo_end)
            finally:  # the run's history and logs (not its checkpoints) into --out, whatever happened
                for f in grpo_runs.rglob("*"):
                    if f.is_file() and f.suffix in (".jsonl", ".log", ".json") and "checkpoints" not in f.parts:
                        dest = out / "grpo-run" / f.relative_to(grpo_runs)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(f, dest)
            report["grpo_steps"] = len(report["grpo_history"])
            report["grpo_steps_trained"] = sum(bool(r["trained"]) for r in report["grpo_history"])
            ph.done("grpo", t)
            t = ph.begin("eval_grpo")
            grpo_judge, tuned = await measure_adapter(2, grpo_dir)
            report["sft_grpo"] = {**tuned.row(), "grpo_steps": report["grpo_steps"],
                                  "grpo_steps_trained": report["grpo_steps_trained"]}
            report["paired_grpo"] = paired_agreement(test_ex, before, tuned, seed=seed)
            report["paired_grpo_sft"] = paired_agreement(test_ex, after, tuned, seed=seed)
            judges.append(("sft_grpo", grpo_judge))
            ph.done("eval_grpo", t)

        judges = [("untrained", before_judge), ("distilled", after_judge)]
        if grpo_steps:
            try:
                await grpo()
            except Exception as exc:  # GRPO failed: keep the two students' measures, LLMBar still runs for them
                report["grpo_error"] = f"{type(exc).__name__}: {exc}"
                print(f"[distill-bench] GRPO failed ({report['grpo_error']}); going on without it", flush=True)

        if llmbar_limit and not (root / "LLMBar").is_dir():
            report["llmbar"] = {d: {"skipped": f"no LLMBar data under {root}"} for d in llmbar_sets}
        elif llmbar_limit:
            t = ph.begin("llmbar")
            report["llmbar"] = {}
            for dataset in llmbar_sets:  # a set the budget has no room for is skipped, saying so: not an error
                if ph.left() < 30:
                    report["llmbar"][dataset] = {"skipped": f"{ph.left():.0f} s left of the budget"}
                    continue
                bar = report["llmbar"][dataset] = {}
                # the trained students first: when the budget cuts a set, it cuts the untrained one (table 1 of
                # evals/reports/judges measures it on every set)
                for label, judge in reversed(judges):
                    try:  # stops 10 s before the budget's end, leaving time to write the report
                        summary, _ = await asyncio.wait_for(
                            evaluate([dataset], judge, params=judge_params, limit=llmbar_limit, root=root,
                                     concurrency=concurrency, progress=False, cache=False), max(5.0, ph.left() - 10))
                    except TimeoutError:
                        bar[label] = {"skipped": ph.budget_reached() + f" (judging {dataset} as the {label} judge)"}
                        break
                    bar[label] = summary.iloc[0].to_dict()
            if "llmbar-natural" in report["llmbar"]:  # the key earlier reports (and readers of them) use
                report["llmbar_natural"] = report["llmbar"]["llmbar-natural"]
            ph.done("llmbar", t)

    try:
        await run_within_budget(ph, report, measure)
    finally:
        report["seconds"] = time.perf_counter() - ph.start
        write_report(out, report)  # before stopping the server, in case that is slow
        if server is not None:
            t = time.perf_counter()
            await server.close()
            ph.done("stop_server", t)
            report["seconds"] = time.perf_counter() - ph.start
            write_report(out, report)
    return report


def write_report(out: Path, report: dict) -> None:
    """`report.json` and a README table under `out`; rows for the judges measured so far (a run stopped early
    by its budget or an error still writes what it has)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    teacher = (report.get("teacher") or {}).get("judge") or "the ART·E rubric"
    lines = [f"# Distilled judge vs {teacher}", "", f"Rerun: `{report.get('command', '')}`", "",
             "| student | pairwise accuracy | Kendall tau | ties | pairs | no valid answer |",
             "|---|---|---|---|---|---|"]
    for label in ("untrained", "distilled", "sft_grpo"):
        r = report.get(label)
        if r:
            name = STUDENT_LABELS[label] + (f" ({r['grpo_steps']} GRPO steps, {r['grpo_steps_trained']} trained)"
                                            if "grpo_steps" in r else "")
            lines.append(f"| {name} | {r['pairwise_accuracy']:.3f} | {r['kendall_tau']:.3f} | {r['ties']:.3f} | "
                         f"{r['pairs']} | {r['errors']} |")
    for key, what in (("paired", "Distilled (SFT) minus untrained"), ("paired_grpo", "SFT+GRPO minus untrained"),
                      ("paired_grpo_sft", "SFT+GRPO minus SFT")):
        p = report.get(key)
        if p:
            lines += ["", f"{what}, over the same {p['pairs']} teacher-ordered held-out pairs: "
                          f"{p['difference']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] with a tie counted wrong, "
                          f"{p['difference_half']:+.3f} [{p['low_half']:+.3f}, {p['high_half']:+.3f}] with a tie "
                          f"worth one half (paired bootstrap over {p['groups']} groups); a judge that always prefers "
                          f"the trajectory shown first agrees on {p['first_shown']:.3f} of them"]
    bars = report.get("llmbar") or ({"llmbar-natural": report["llmbar_natural"]} if report.get("llmbar_natural")
                                    else {})
    for dataset, bar in bars.items():
        if "skipped" in bar:
            lines += ["", f"{dataset}: skipped, {bar['skipped']}"]
        else:
            done = [f"{STUDENT_LABELS[label]} {bar[label]['accuracy']:.3f}" for label in STUDENT_LABELS
                    if "accuracy" in bar.get(label, {})]
            skipped = [f"{STUDENT_LABELS[label]} skipped ({bar[label]['skipped']})" for label in STUDENT_LABELS
                       if "skipped" in bar.get(label, {})]
            lines += ["", f"{dataset} accuracy: " + ", ".join(done + skipped)]
    if report.get("sft_stopped"):
        lines += ["", f"SFT stopped {report['sft_stopped']}"]
    if report.get("phases"):
        lines += ["", "Seconds per phase: " + ", ".join(f"{k} {v:.1f}" for k, v in report["phases"].items())]
    if report.get("grpo_error"):
        lines += ["", f"GRPO failed: `{report['grpo_error']}`"]
    if report.get("error"):
        lines += ["", f"Stopped by an error: `{report['error']}`"]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def make_data(out: Path, *, mailboxes: list[Path] | None = None, test_inboxes: list[str] | None = None,
              per_inbox: int = 400, seed: int = 0, llmbar_root: Path | None = None) -> dict:
    """The `--data` folder of `gpu`: `inbox.db` from the Enron mailboxes (`mailboxes`, default every shared one)
    and `scenarios.jsonl` (the offline generator's questions, split by inbox; `test_inboxes` default: beck and
    farmer, which leaves the two larger inboxes to training), plus a copy of LLMBar Natural under
    `judge-meta/` when `llmbar_root` holds it. The folder must not exist yet. Returns the counts."""
    import shutil

    from evals.art_e.inbox import ENRON_DIR, build_inbox_db
    from evals.art_e.questions import generate_scenarios, save_scenarios

    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: give a new folder")
    boxes = [Path(m) for m in mailboxes] if mailboxes else sorted(ENRON_DIR.glob("*.tar.gz"))
    if not boxes:
        raise FileNotFoundError(f"no mailboxes given and none in {ENRON_DIR}")
    out.mkdir(parents=True)
    build = build_inbox_db(boxes, out / "inbox.db")
    scenarios = generate_scenarios(out / "inbox.db", per_inbox=per_inbox, seed=seed,
                                   test_inboxes=test_inboxes or ["sally.beck@enron.com", "daren.farmer@enron.com"])
    save_scenarios(scenarios, out / "scenarios.jsonl")
    natural = Path(llmbar_root) / "LLMBar" / "Natural" if llmbar_root else None
    if natural is not None and natural.is_dir():
        shutil.copytree(natural, out / "judge-meta" / "LLMBar" / "Natural")
    counts = {"emails": build.emails, "train": sum(sc.split == "train" for sc in scenarios),
              "test": sum(sc.split == "test" for sc in scenarios), "llmbar": natural is not None and natural.is_dir()}
    print(json.dumps(counts), flush=True)
    return counts


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (its checks across arguments are in `main`)."""
    p = argparse.ArgumentParser(prog="python -m evals.distill_bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="Roll out ART·E groups and grade them with ART's rubric.")
    s.add_argument("--policy", required=True, help="litellm model, MODEL@URL for a served one")
    s.add_argument("--db", type=Path, required=True)
    s.add_argument("--scenarios", type=Path, required=True)
    s.add_argument("--split", default="train")
    s.add_argument("--groups", type=int, default=100)
    s.add_argument("--group-size", type=int, default=4)
    s.add_argument("--max-turns", type=int, default=10)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--concurrency", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="Distil on --train groups; measure on --test groups and LLMBar Natural.")
    r.add_argument("--train", type=Path, required=True)
    r.add_argument("--test", type=Path, required=True)
    r.add_argument("--student", default="local/smollm2-135m-instruct")
    r.add_argument("--steps", type=int, default=400)
    r.add_argument("--lr", type=float, default=2e-4)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-eval", type=int, default=None, help="measure on about this many held-out prompts: whole "
                   "groups chosen by --seed (the smallest group when every one is larger)")
    r.add_argument("--llmbar-limit", type=int, default=200)
    r.add_argument("--llmbar-root", type=Path, default=None)
    r.add_argument("--max-seq-length", type=int, default=8192, help="longer prompts are skipped in training")
    r.add_argument("--out", type=Path, default=Path("evals/reports/distill"))
    d = sub.add_parser("data", help="Make gpu's --data folder: the inbox database, the questions split by inbox, "
                                    "LLMBar Natural.")
    d.add_argument("--out", type=Path, required=True, help="a new folder, e.g. .gpudata/distill")
    d.add_argument("--mailbox", type=Path, nargs="*", default=None, help="default: every shared Enron mailbox")
    d.add_argument("--test-inboxes", nargs="*", default=None, help="default: sally.beck and daren.farmer")
    d.add_argument("--per-inbox", type=int, default=400)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--llmbar-root", type=Path, default=None, help="judge-meta data root (../shared/data/judge-meta)")
    g = sub.add_parser("gpu", help="Everything in one command under a time budget: serve SmolLM2 with vLLM, sample, "
                                   "distil, measure before and after.")
    g.add_argument("--data", type=Path, default=None, help="folder with inbox.db and scenarios.jsonl (not read "
                   "with --teacher)")
    g.add_argument("--teacher", default=None, help="a judge's litellm model string: its judgments in "
                   "--teacher-cache are the data instead of ART·E's rubric on sampled groups")
    g.add_argument("--teacher-cache", type=Path, default=None, help="the judge cache holding the teacher's judgments")
    g.add_argument("--since", default=None, help="--teacher: only judgments stored from this ISO date-time on (UTC "
                   "unless given)")
    g.add_argument("--until", default=None, help="--teacher: only judgments stored before this ISO date-time (UTC "
                   "unless given)")
    g.add_argument("--holdout", type=float, default=0.2, help="--teacher: the share of groups held out")
    g.add_argument("--grpo-steps", type=int, default=0, help="--teacher: GRPO steps after the SFT, from its adapter "
                   "(reward: agreement with the teacher); 0 (default): SFT only")
    g.add_argument("--grpo-lr", type=float, default=None, help="GRPO's learning rate (default: --lr)")
    g.add_argument("--grpo-group-size", type=int, default=4, help="GRPO: answers sampled per prompt")
    g.add_argument("--grpo-budget-s", type=float, default=240, help="GRPO stops after the first step that ends past "
                   "this many seconds from its start, its engine's start included (taken from the SFT's)")
    g.add_argument("--max-eval", type=int, default=None,
                   help="measure every student on about this many held-out prompts: whole groups chosen by --seed "
                        "(the smallest group when every one is larger)")
    g.add_argument("--llmbar-sets", nargs="+", default=["llmbar-natural"], choices=list(LLMBAR),
                   help="LLMBar sets measured (every student)")
    g.add_argument("--out", type=Path, required=True, help="report.json, README.md, train/test JSONL, vLLM's log")
    g.add_argument("--budget-s", type=float, default=400)
    g.add_argument("--train-groups", type=int, default=160)
    g.add_argument("--test-groups", type=int, default=60)
    g.add_argument("--group-size", type=int, default=4)
    g.add_argument("--max-turns", type=int, default=4, help="4 keeps most RULER prompts of 4 rollouts under 8192 tokens")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--steps", type=int, default=200, help="at most; the SFT stops earlier when the budget says")
    g.add_argument("--lr", type=float, default=2e-4)
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--model-dir", default=VLLM_MODEL, help="SmolLM2-135M-Instruct folder (vLLM and the SFT)")
    g.add_argument("--judge-dir", type=Path, default=Path("/tmp/distill-bench/judge"), help="the adapter (not in --out)")
    g.add_argument("--port", type=int, default=0, help="vLLM's port; 0: a free one")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    g.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (starts faster)")
    g.add_argument("--llmbar-limit", type=int, default=50, help="0 skips; skipped too when the data is absent")
    g.add_argument("--llmbar-root", type=Path, default=None, help="judge-meta data root (holds LLMBar/)")
    g.add_argument("--dry-run", action="store_true",
                   help="CPU plumbing check: the embedded model in process instead of vLLM, tiny sizes")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.cmd == "data":
        make_data(a.out, mailboxes=a.mailbox, test_inboxes=a.test_inboxes, per_inbox=a.per_inbox, seed=a.seed,
                  llmbar_root=a.llmbar_root)
        return 0
    if a.cmd == "gpu":
        if a.max_eval is not None and a.max_eval < 1:
            p.error(f"--max-eval must be >= 1, got {a.max_eval}")
        if (a.teacher is None) == (a.data is None):
            p.error("gpu: give --data (ART·E's rubric on sampled groups) or --teacher with --teacher-cache")
        if a.teacher is None and (a.teacher_cache or a.since or a.until or a.grpo_steps):
            p.error("--teacher-cache, --since, --until and --grpo-steps go with --teacher")
        import typer

        from ruler_rl.trainer.distill_cli import parse_when

        try:  # `ruler distill --since`'s rule: ISO 8601, UTC unless given
            since, until = parse_when(a.since, "--since"), parse_when(a.until, "--until")
        except typer.BadParameter as exc:
            p.error(str(exc))
        if since and until and until <= since:
            p.error("--until must come after --since")
        sizes = {"train_groups": a.train_groups, "test_groups": a.test_groups, "group_size": a.group_size,
                     "max_turns": a.max_turns, "steps": a.steps, "batch_size": a.batch_size, "llmbar_limit": a.llmbar_limit}
        if a.dry_run:
            sizes = {"train_groups": 4, "test_groups": 4, "group_size": 4, "max_turns": 2, "steps": 2, "batch_size": 2,
                         "llmbar_limit": min(a.llmbar_limit, 2)}
        report = asyncio.run(gpu_bench(data=a.data, out=a.out, budget_s=a.budget_s, temperature=a.temperature,
                                       concurrency=a.concurrency, lr=a.lr, seed=a.seed, model_dir=a.model_dir,
                                       judge_dir=a.judge_dir, port=a.port,
                                       gpu_memory_utilization=a.gpu_memory_utilization,
                                       enforce_eager=a.enforce_eager, llmbar_root=a.llmbar_root,
                                       dry_run=a.dry_run, teacher=a.teacher, teacher_cache=a.teacher_cache,
                                       since=since, until=until, holdout=a.holdout,
                                       llmbar_sets=tuple(a.llmbar_sets), grpo_steps=a.grpo_steps,
                                       grpo_lr=a.grpo_lr, grpo_group_size=a.grpo_group_size,
                                       grpo_budget_s=a.grpo_budget_s, max_eval=a.max_eval, **sizes))
        print(json.dumps({k: report.get(k) for k in ("sample", "teacher", "train_prompts", "test_prompts",
                                                      "sft_steps", "sft_stopped", "untrained", "distilled", "paired",
                                                      "grpo_steps", "sft_grpo", "paired_grpo", "llmbar",
                                                      "phases", "seconds", "error")}, default=str))
        return 1 if report.get("error") else 0
    if a.cmd == "sample":
        result = asyncio.run(sample_groups(policy=a.policy, db=a.db, scenarios=a.scenarios, split=a.split,
                                           groups=a.groups, group_size=a.group_size, max_turns=a.max_turns,
                                           temperature=a.temperature, seed=a.seed, out=a.out,
                                           concurrency=a.concurrency))
    else:
        report = asyncio.run(run_bench(train=a.train, test=a.test, student=a.student, steps=a.steps, lr=a.lr,
                                       batch_size=a.batch_size, seed=a.seed, out=a.out, max_eval=a.max_eval,
                                       llmbar_limit=a.llmbar_limit, llmbar_root=a.llmbar_root,
                                       max_seq_length=a.max_seq_length))
        result = {k: report[k] for k in ("train_prompts", "test_prompts", "untrained", "distilled")}
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
