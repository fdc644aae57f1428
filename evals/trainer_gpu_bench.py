"""GPU benchmarks of the trainer (rollouts through vLLM's own OpenAI server) against raw vLLM and TRL's
GRPOTrainer, one command per part.

    python evals/trainer_gpu_bench.py ours --out DIR --mailboxes ENRON_DIR
    python evals/trainer_gpu_bench.py trl  --out DIR
    python evals/trainer_gpu_bench.py report --out DIR      # the comparison table from the JSON files

`ours`, in one registration of SmolLM2 behind vLLM's server: (1) 32 multi-turn ART·E rollouts (ART's
litellm parameters, native tools, 3 turns) checked turn by turn — training context == served
`prompt_token_ids`, trained ids == sampled `token_ids`, old logprobs == sampled — then one training step,
whose importance ratios (before the update) compare vLLM's bf16 logprobs with the trainer's; requests sent
during that step must come back whole; (2) the tiny task (`examples/tiny_task.py`) for `--steps` GRPO steps:
seconds per step, reward, sleep/wake and adapter-load seconds; (3) rollout tokens/s through the served
path vs raw `vllm.LLM.generate` on the same prompt tokens, fixed length (`ignore_eos`), after the server
is closed; (4) peak GPU memory (NVML, whole device, sampled every 50 ms). `--steps 0 --art-e-groups 0`
measures only (3). `trl`: the tiny task with TRL's `GRPOTrainer` (vLLM colocate, LoRA), same model,
LoRA, group size, questions per step, learning rate and steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the tiny task: one copy, the example's
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tiny_task import QUESTIONS, messages, questions_for_step, reward

LORA = {"rank": 8, "alpha": 16.0}


def _nvml():
    try:
        import pynvml
    except ImportError:
        from vllm.third_party import pynvml
    return pynvml


def _cuda_torch():
    """torch, when it is imported and has an initialised CUDA device; else None (nothing is imported here)."""
    import sys

    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


class PeakMemory:
    """Peak used memory of GPU 0 over the block, in GiB (all processes: vLLM's engine core included); and
    `torch_gib`, the peak torch allocated in this process over the block (None without CUDA)."""

    def __enter__(self):
        self.peak = self.base = 0
        self.torch_gib = None
        self._torch = _cuda_torch()
        if self._torch is not None:
            self._torch.cuda.reset_peak_memory_stats()
        try:
            pynvml = _nvml()
        except ImportError:  # no GPU tooling (a CPU check of the script): no memory figure
            self.thread = None
            return self
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.base = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
        self.peak, self.stop = self.base, False
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        pynvml = _nvml()
        while not self.stop:
            self.peak = max(self.peak, pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            time.sleep(0.05)

    def __exit__(self, *exc):
        if self._torch is not None:
            self.torch_gib = self._torch.cuda.max_memory_allocated() / 2**30
        self.stop = True
        if self.thread is not None:
            self.thread.join()

    @property
    def gib(self) -> float:
        return (self.peak - self.base) / 2**30


def step_clock(on_step_end=None):
    """A TRL/transformers callback stamping each optimizer step's begin and end (`clock.stamps`, alternating),
    calling `on_step_end(clock)` after each step (e.g. to write partial results); `clock.step_s()`: seconds per
    step, from one step's start to the next's (TRL generates inside the step), the last one to its end."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self):
            self.stamps: list[float] = []

        def on_step_begin(self, a, state, control, **kw):
            self.stamps.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            self.stamps.append(time.perf_counter())
            if on_step_end is not None:
                on_step_end(self)

        def step_s(self) -> list[float]:
            begins = self.stamps[0::2]
            if not begins:
                return []
            last = [self.stamps[-1] - begins[-1]] if len(self.stamps) % 2 == 0 else []
            return [b - a for a, b in zip(begins, begins[1:], strict=False)] + last

    return StepClock()


def rollout_prompts(n_prompts: int) -> list[list[dict]]:
    return [messages(QUESTIONS[i % len(QUESTIONS)][0] + f" (case {i})") for i in range(n_prompts)]


class RawVLLM:
    """In-process `vllm.LLM.generate` on the same prompt tokens and the same fixed-length sampling
    (ignore_eos): the ceiling the served path is measured against."""

    def __init__(self, model: str, util: float):
        from vllm import LLM

        self.llm = LLM(model=model, gpu_memory_utilization=util, max_model_len=1024, enable_lora=True,
                       max_lora_rank=8, seed=0)

    def tokens_per_s(self, prompts, n: int, max_tokens: int) -> float:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(n=n, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                                temperature=1.0, logprobs=0)
        started = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outs for o in r.outputs) / (time.perf_counter() - started)

    def close(self) -> None:
        try:  # free its GPU memory now, not whenever the garbage collector gets to it
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del self.llm


async def art_e_token_exact(model, args, tokenizer) -> dict:
    """32 multi-turn ART·E rollouts through the served path (ART's litellm parameters, native tools): per
    turn, is the training context the served prompt and are the trained ids the sampled ones?"""
    from openai.types.chat.chat_completion import Choice

    from evals.art_e.agent import run_agent
    from evals.art_e.inbox import build_inbox_db
    from evals.art_e.questions import generate_scenarios
    from ruler_rl import TrajectoryGroup
    from ruler_rl.trainer.sequences import SequenceReport, trained_spans, training_sequences

    db = args.out / "inbox.db"
    if not db.is_file():
        build_inbox_db(sorted(Path(args.mailboxes).glob("*.tar.gz")), db)
    scenarios = generate_scenarios(db, per_inbox=50, seed=1)[: args.art_e_groups]
    params = model.litellm_completion_params()
    name = params.pop("model")

    async def group(s):
        trajs = await asyncio.gather(*(run_agent(s, db, name, params={**params, "max_tokens": 96}, max_turns=3,
                                                 tool_mode="native", tool_choice="auto")  # a trained policy's
                                       for _ in range(args.art_e_group_size)))
        for i, t in enumerate(trajs):
            t.reward = float(i % 3)  # any varying reward: the point is the tokens and the ratio
        return TrajectoryGroup(trajs)

    started = time.perf_counter()
    groups = await asyncio.gather(*(group(s) for s in scenarios))
    rollout_s = time.perf_counter() - started
    turns = equal_context = equal_tokens = equal_logprobs = 0
    report = SequenceReport()
    tool_calls = 0
    for g in groups:
        for t in g:
            choices = [c for c in t.messages_and_choices if isinstance(c, Choice)]
            tool_calls += sum(bool(c.message.tool_calls) for c in choices)
            spans = trained_spans(training_sequences(t, tokenizer, report=report))
            for (context, trained, old), c in zip(spans, choices, strict=True):
                turns += 1
                extra = c.model_extra or {}
                nested = extra.get("provider_specific_fields") or {}
                prompt = extra.get("prompt_token_ids") or nested.get("prompt_token_ids")
                ids = extra.get("token_ids") or nested.get("token_ids")
                equal_context += context == prompt
                equal_tokens += trained == ids
                lps = extra.get("token_logprobs") or nested.get("token_logprobs")
                equal_logprobs += old == lps
    from ruler_rl.trainer import TrainConfig

    # requests sent just before and during the training step: answered in full (queued while vLLM sleeps),
    # never aborted
    client = model.openai_client(timeout=600)

    async def probe(delay):
        await asyncio.sleep(delay)
        sent = time.perf_counter()
        r = await client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "Count."}],
                                                 max_tokens=64, extra_body={"min_tokens": 64, "ignore_eos": True})
        return {"sent": sent, "done": time.perf_counter(), "finish_reason": r.choices[0].finish_reason,
                "tokens": len(r.choices[0].model_extra["token_ids"])}

    probes = [asyncio.create_task(probe(d)) for d in (0.0, 0.05, 0.2, 0.5)]
    train_started = time.perf_counter()
    row = await model.train(groups, TrainConfig(learning_rate=1e-5))
    train_ended = time.perf_counter()
    during = [dict(p, sent=p["sent"] - train_started, done=p["done"] - train_started)
              for p in await asyncio.gather(*probes)]
    return {"art_e_rollouts": sum(len(g) for g in groups), "art_e_turns": turns, "art_e_tool_calls": tool_calls,
            "art_e_context_equal": equal_context, "art_e_tokens_equal": equal_tokens,
            "art_e_logprobs_equal": equal_logprobs, "art_e_sequences": report.sequences,
            "art_e_context_breaks": report.context_breaks, "art_e_rollout_s": rollout_s,
            "ratio_dev_mean_before_update": row.get("ratio_dev_mean"),
            "ratio_dev_max_before_update": row.get("ratio_dev_max"), "ratio_mean_before_update": row.get("ratio_mean"),
            "art_e_trained_tokens": row.get("trained_tokens"), "train_call_s": train_ended - train_started,
            "requests_during_training": during}


async def ours(args) -> dict:
    from transformers import AutoTokenizer

    from ruler_rl import Trajectory, TrajectoryGroup
    from ruler_rl.trainer import (
        EngineConfig,
        LocalBackend,
        ModelConfig,
        TrainableModel,
        TrainConfig,
        gather_trajectory_groups,
    )
    from ruler_rl.trainer.config import LoRAConfig

    result: dict = {"model": args.model, "steps": args.steps, "group_size": args.group_size,
                    "questions_per_step": args.questions_per_step, "lr": args.lr, "engine": args.engine}
    out_json = args.out / "ours.json"

    def save():
        out_json.write_text(json.dumps(result, indent=1))

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    cfg = ModelConfig(lora=LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), seed=0,
                      engine=EngineConfig(engine=args.engine, max_seq_length=4096, gpu_memory_utilization=0.25))
    with PeakMemory() as mem:
        model = TrainableModel("bench", "gpu", args.model, cfg)
        backend = LocalBackend(args.out / "runs")
        started = time.perf_counter()
        await model.register(backend)
        result["register_s"] = time.perf_counter() - started
        client = model.openai_client(timeout=600)
        try:
            # 1. token-exactness on multi-turn ART·E rollouts, and the ratio before the first update
            if args.art_e_groups:
                result.update(await art_e_token_exact(model, args, tokenizer))
                save()
                print({k: v for k, v in result.items() if k.startswith(("art_e", "ratio"))}, flush=True)

            # 2. the tiny task for --steps GRPO steps, through the bare name (the middleware's latest adapter)
            async def group(question, answer):
                prompt = messages(question)
                reply = await client.chat.completions.create(model=model.name, messages=prompt, n=args.group_size,
                                                             max_tokens=args.max_tokens, temperature=1.0)
                return TrajectoryGroup([Trajectory(messages_and_choices=[*prompt, c],
                                                   reward=reward(c.message.content, answer)) for c in reply.choices])

            rows = []
            for step in range(args.steps):
                started = time.perf_counter()
                groups = await gather_trajectory_groups(
                    [group(q, a) for q, a in questions_for_step(step, args.questions_per_step)], pbar_desc=None)
                row = await model.train(groups, TrainConfig(learning_rate=args.lr, loss="grpo"))
                row["wall_s"] = time.perf_counter() - started
                rows.append(row)
                print(f"ours step {row['step']}: reward {row['reward_mean']:.3f} in {row['wall_s']:.2f}s "
                      f"(ratio dev max {row.get('ratio_dev_max', float('nan')):.4f})", flush=True)
            if rows:
                result["rewards"] = [r["reward_mean"] for r in rows]
                result["step_s"] = [r["wall_s"] for r in rows]
                for key in ("sleep_wake_s", "adapter_swap_s", "train_s", "rollout_s", "ratio_dev_max"):
                    result[key] = [r.get(key) for r in rows]
                save()

            # 3. rollout tokens/s: the served path (HTTP, vLLM's server, middleware, OpenAI client) vs raw
            # vllm.LLM.generate on the same prompt tokens, fixed length, taking turns run by run
            prompt_tokens = []
            if args.engine == "vllm" and args.rollout_runs:
                prompts = rollout_prompts(args.rollout_prompts)
                fixed = {"min_tokens": args.rollout_max_tokens, "ignore_eos": True}

                async def served_run():
                    started = time.perf_counter()
                    replies = await asyncio.gather(*(client.chat.completions.create(
                        model=model.name, messages=p, n=args.rollout_n, max_tokens=args.rollout_max_tokens,
                        temperature=1.0, extra_body=fixed) for p in prompts))
                    rate = sum(r.usage.completion_tokens for r in replies) / (time.perf_counter() - started)
                    return rate, [r.model_extra["prompt_token_ids"] for r in replies]

                _, prompt_tokens = await served_run()  # warm-up
                ours_runs = [(await served_run())[0] for _ in range(args.rollout_runs)]
                result.update(ours_runs=ours_runs, ours_tokens_per_s=statistics.median(ours_runs))
                save()
        finally:
            await backend.close()
    result["peak_gpu_gib"] = mem.gib
    save()
    if args.engine == "vllm" and args.rollout_runs:
        # raw vllm.LLM.generate after the server is gone (one vLLM engine in another's presence hung once)
        raw = RawVLLM(args.model, 0.25)
        raw.tokens_per_s(prompt_tokens[:8], args.rollout_n, args.rollout_max_tokens)  # warm-up
        raw_runs = [raw.tokens_per_s(prompt_tokens, args.rollout_n, args.rollout_max_tokens)
                    for _ in range(args.rollout_runs)]
        raw.close()
        result.update(raw_runs=raw_runs, raw_tokens_per_s=statistics.median(raw_runs),
                      rollout_ratio=result["ours_tokens_per_s"] / statistics.median(raw_runs))
        save()
        print({k: result[k] for k in ("ours_tokens_per_s", "raw_tokens_per_s", "rollout_ratio")}, flush=True)
    return result


def trl(args) -> dict:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from ruler_rl.trainer.config import LLAMA_LIKE_TARGETS

    rows = [{"prompt": messages(q), "answer": a} for s in range(args.steps)
            for q, a in questions_for_step(s, args.questions_per_step)]
    data = Dataset.from_list(rows)

    def tiny_reward(prompts, completions, answer, **_):
        return [reward(c[0]["content"] if isinstance(c, list) else c, a)
                for c, a in zip(completions, answer, strict=True)]

    clock = step_clock()
    config = GRPOConfig(
        output_dir=str(args.out / "trl"), learning_rate=args.lr, num_generations=args.group_size,
        per_device_train_batch_size=args.group_size * args.questions_per_step, gradient_accumulation_steps=1,
        max_completion_length=args.max_tokens, max_steps=args.steps, loss_type="grpo", beta=0.0,
        temperature=1.0, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.25,
        vllm_enable_sleep_mode=True, bf16=True, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        shuffle_dataset=False, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0)
    lora = LoraConfig(r=LORA["rank"], lora_alpha=LORA["alpha"], target_modules=LLAMA_LIKE_TARGETS,
                      task_type="CAUSAL_LM")
    with PeakMemory() as mem:
        started = time.perf_counter()
        trainer = GRPOTrainer(model=args.model, reward_funcs=tiny_reward, args=config, train_dataset=data,
                              peft_config=lora, callbacks=[clock])
        setup = time.perf_counter() - started
        trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    step_s = clock.step_s()
    return {"model": args.model, "steps": args.steps, "setup_s": setup, "rewards": [h["reward"] for h in logs],
            "step_s": step_s, "peak_gpu_gib": mem.gib, "trl_version": __import__("trl").__version__}


def report(out: Path) -> str:
    """The markdown table of `ours.json` and `trl.json` (and `rollout.json`, a throughput-only rerun, if any)."""
    a = json.loads((out / "ours.json").read_text())
    b = json.loads((out / "trl.json").read_text()) if (out / "trl.json").is_file() else None
    r = json.loads((out / "rollout.json").read_text()) if (out / "rollout.json").is_file() else None
    tail = 5

    def steady(xs):
        xs = [x for x in xs[1:] if x is not None] or xs  # step 1 includes warm-up; untrained steps have None
        return statistics.median(xs)

    lines = ["| measure | ours | TRL GRPOTrainer / raw vLLM | ratio |", "|---|---|---|---|"]
    if "art_e_turns" in a:
        n = a["art_e_turns"]
        lines += [f"| ART·E turns (of {a['art_e_rollouts']} rollouts) whose training context is the served prompt "
                  f"| {a['art_e_context_equal']}/{n} | | |",
                  f"| ... whose trained tokens are the sampled ids / old logprobs the sampled ones "
                  f"| {a['art_e_tokens_equal']}/{n} / {a['art_e_logprobs_equal']}/{n} | | |",
                  f"| sequences (turns sharing a forward pass; new sequences at context breaks) "
                  f"| {a['art_e_sequences']} ({a['art_e_context_breaks']} breaks) | | |",
                  f"| mean / max abs(ratio - 1) before the first update (vLLM bf16 vs trainer bf16) "
                  f"| {a['ratio_dev_mean_before_update']:.3f} / {a['ratio_dev_max_before_update']:.3f} | | |"]
    if b and a.get("step_s"):
        ours_step, trl_step = steady(a["step_s"]), steady(b["step_s"])
        lines += [f"| tiny task: seconds per step (median, steps 2..{a['steps']}) | {ours_step:.2f} | {trl_step:.2f} | "
                  f"{ours_step / trl_step:.2f}x |",
                  f"| reward, mean of first {tail} steps | {statistics.mean(a['rewards'][:tail]):.3f} | "
                  f"{statistics.mean(b['rewards'][:tail]):.3f} | |",
                  f"| reward, mean of last {tail} steps | {statistics.mean(a['rewards'][-tail:]):.3f} | "
                  f"{statistics.mean(b['rewards'][-tail:]):.3f} | |",
                  f"| peak GPU memory (GiB, NVML, whole device) | {a['peak_gpu_gib']:.1f} | {b['peak_gpu_gib']:.1f} | "
                  f"{a['peak_gpu_gib'] / b['peak_gpu_gib']:.2f}x |",
                  f"| sleep + wake / adapter load / training part per step (s, median) | "
                  f"{steady(a['sleep_wake_s']):.3f} / {steady(a['adapter_swap_s']):.3f} / {steady(a['train_s']):.3f} | | |"]
    for label, src in (("first run, standard logprobs objects", a), ("rerun, compact token_logprobs", r)):
        if src and "rollout_ratio" in src:
            lines.append(f"| rollout tokens/s through vLLM's server vs raw vllm.LLM.generate ({label}) | "
                         f"{src['ours_tokens_per_s']:.0f} | {src['raw_tokens_per_s']:.0f} | {src['rollout_ratio']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["ours", "trl", "report"])
    ap.add_argument("--model", default="/tmp/models/SmolLM2-135M-Instruct")
    ap.add_argument("--out", type=Path, default=Path("out/trainer-bench"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--questions-per-step", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--rollout-prompts", type=int, default=64)
    ap.add_argument("--rollout-n", type=int, default=8)
    ap.add_argument("--rollout-max-tokens", type=int, default=128)
    ap.add_argument("--rollout-runs", type=int, default=6, help="served and raw runs, taking turns")
    ap.add_argument("--engine", default="vllm", choices=["vllm", "transformers"])
    ap.add_argument("--art-e-groups", type=int, default=4)
    ap.add_argument("--art-e-group-size", type=int, default=8)
    ap.add_argument("--mailboxes", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "enron"),
                    help="folder with Enron mailbox .tar.gz files (the GPU host gets a carried copy)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "report":
        print(report(args.out))
        return
    result = asyncio.run(ours(args)) if args.part == "ours" else trl(args)
    (args.out / f"{args.part}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, indent=1))


if __name__ == "__main__":
    main()
