"""GPU benchmarks of the trainer against raw vLLM and TRL's GRPOTrainer, one command per part.

    python evals/trainer_gpu_bench.py ours --model /tmp/models/SmolLM2-135M-Instruct --out $OUT
    python evals/trainer_gpu_bench.py trl  --model /tmp/models/SmolLM2-135M-Instruct --out $OUT
    python evals/trainer_gpu_bench.py report --out DIR         # the comparison table from both JSON files

`ours`: (a) rollout tokens/s through our server + vLLM engine vs raw `vllm.LLM.generate` on the same
prompts and sampling parameters in the same process; then the tiny task (`evals/tiny_task.py`) for
`--steps` GRPO steps: seconds per step, reward, (c) sleep/wake and adapter hot-swap seconds per step,
(d) peak GPU memory (NVML, whole device, sampled every 50 ms).
`trl`: the same task, model, LoRA, group size, questions per step, learning rate and steps with TRL's
`GRPOTrainer` (vLLM colocate, LoRA): seconds per step, reward, peak GPU memory.
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
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evals.tiny_task import QUESTIONS, messages, questions_for_step, reward  # noqa: E402

LORA = {"rank": 8, "alpha": 16.0}


def _nvml():
    try:
        import pynvml
    except ImportError:
        from vllm.third_party import pynvml
    return pynvml


class PeakMemory:
    """Peak used memory of GPU 0 over the block, in GiB (all processes: vLLM's engine core included)."""

    def __enter__(self):
        pynvml = _nvml()
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
        self.stop = True
        self.thread.join()

    @property
    def gib(self) -> float:
        return (self.peak - self.base) / 2**30


def rollout_prompts(n_prompts: int) -> list[list[dict]]:
    return [messages(QUESTIONS[i % len(QUESTIONS)][0] + f" (case {i})") for i in range(n_prompts)]


def raw_vllm(model: str, prompts, n: int, max_tokens: int, util: float) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from trainer.chat import prompt_ids

    tok = AutoTokenizer.from_pretrained(model)
    llm = LLM(model=model, gpu_memory_utilization=util, max_model_len=1024, enable_lora=True, max_lora_rank=8,
              seed=0)
    ids = [TokensPrompt(prompt_token_ids=prompt_ids(tok, p)) for p in prompts]
    params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, logprobs=0)
    llm.generate(ids[:8], params, use_tqdm=False)  # warm-up
    runs = []
    for _ in range(3):
        started = time.perf_counter()
        outs = llm.generate(ids, params, use_tqdm=False)
        seconds = time.perf_counter() - started
        runs.append(sum(len(o.token_ids) for r in outs for o in r.outputs) / seconds)
    try:  # free its GPU memory now, not whenever the garbage collector gets to it
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    time.sleep(3)
    return {"raw_tokens_per_s": statistics.median(runs), "raw_runs": runs}


async def ours(args) -> dict:
    from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
    from trainer import gather_trajectory_groups
    from trainer.config import LoRAConfig
    from ruler import Trajectory, TrajectoryGroup

    result: dict = {"model": args.model, "steps": args.steps, "group_size": args.group_size,
                    "questions_per_step": args.questions_per_step, "lr": args.lr}
    prompts = rollout_prompts(args.rollout_prompts)
    result.update(raw_vllm(args.model, prompts, args.rollout_n, args.rollout_max_tokens, 0.25))
    import gc

    gc.collect()
    cfg = ModelConfig(lora=LoRAConfig(rank=LORA["rank"], alpha=LORA["alpha"]), seed=0,
                      engine=EngineConfig(engine="vllm", max_seq_length=1024, gpu_memory_utilization=0.25))
    with PeakMemory() as mem:
        model = TrainableModel("bench", "gpu", args.model, cfg)
        backend = LocalBackend(args.out / "runs")
        started = time.perf_counter()
        await model.register(backend)
        result["register_s"] = time.perf_counter() - started
        client = model.openai_client(timeout=600)
        try:
            # (a) the same prompts and sampling through our server, concurrently as agents would send them
            rates = []
            for _ in range(4):
                started = time.perf_counter()
                replies = await asyncio.gather(*(client.chat.completions.create(
                    model=model.name, messages=p, n=args.rollout_n, max_tokens=args.rollout_max_tokens,
                    temperature=1.0) for p in prompts))
                seconds = time.perf_counter() - started
                rates.append(sum(r.usage.completion_tokens for r in replies) / seconds)
            result["ours_tokens_per_s"] = statistics.median(rates[1:])
            result["ours_runs"] = rates
            result["rollout_ratio"] = result["ours_tokens_per_s"] / result["raw_tokens_per_s"]

            async def group(step, i, question, answer):
                prompt = messages(question)
                reply = await client.chat.completions.create(model=model.name, messages=prompt, n=args.group_size,
                                                             max_tokens=args.max_tokens, temperature=1.0)
                return TrajectoryGroup([Trajectory(messages_and_choices=[*prompt, c],
                                                   reward=reward(c.message.content, answer)) for c in reply.choices])

            rows = []
            for step in range(args.steps):
                started = time.perf_counter()
                groups = await gather_trajectory_groups(
                    [group(step, i, q, a) for i, (q, a) in enumerate(questions_for_step(step, args.questions_per_step))],
                    pbar_desc=None)
                row = await model.train(groups, TrainConfig(learning_rate=args.lr, loss="grpo",
                                                              micro_batch_size=args.group_size * args.questions_per_step))
                row["wall_s"] = time.perf_counter() - started
                rows.append(row)
                print(f"ours step {step + 1}: reward {row['reward_mean']:.3f} in {row['wall_s']:.2f}s", flush=True)
        finally:
            await backend.close()
    result["peak_gpu_gib"] = mem.gib
    result["rewards"] = [r["reward_mean"] for r in rows]
    result["step_s"] = [r["wall_s"] for r in rows]
    for key in ("sleep_wake_s", "adapter_swap_s", "train_s", "rollout_s"):
        result[key] = [r.get(key) for r in rows]
    return result


def trl(args) -> dict:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trainer.config import LLAMA_LIKE_TARGETS

    rows = [{"prompt": messages(q), "answer": a} for s in range(args.steps)
            for q, a in questions_for_step(s, args.questions_per_step)]
    data = Dataset.from_list(rows)

    def tiny_reward(prompts, completions, answer, **_):
        return [reward(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            stamps.append(time.perf_counter())

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
                              peft_config=lora, callbacks=[Clock()])
        setup = time.perf_counter() - started
        trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    # a step's wall time: from one step's start to the next's (generation happens inside the step)
    begins = stamps[0::2]
    step_s = [b - a for a, b in zip(begins, begins[1:])] + [stamps[-1] - begins[-1]]
    return {"model": args.model, "steps": args.steps, "setup_s": setup, "rewards": [h["reward"] for h in logs],
            "step_s": step_s, "peak_gpu_gib": mem.gib, "trl_version": __import__("trl").__version__}


def report(out: Path) -> str:
    a = json.loads((out / "ours.json").read_text())
    b = json.loads((out / "trl.json").read_text()) if (out / "trl.json").is_file() else None
    tail = 5

    def steady(xs):
        xs = [x for x in xs[1:] if x is not None] or xs  # step 1 includes warm-up; untrained steps have None
        return statistics.median(xs)

    lines = ["| measure | ours | TRL GRPOTrainer | ratio |", "|---|---|---|---|"]
    ours_step, ours_reward = steady(a["step_s"]), statistics.mean(a["rewards"][-tail:])
    if b:
        trl_step, trl_reward = steady(b["step_s"]), statistics.mean(b["rewards"][-tail:])
        lines += [f"| seconds per step (median, steps 2..{a['steps']}) | {ours_step:.2f} | {trl_step:.2f} | "
                  f"{ours_step / trl_step:.2f}x |",
                  f"| reward, first step | {a['rewards'][0]:.3f} | {b['rewards'][0]:.3f} | |",
                  f"| reward, mean of last {tail} steps | {ours_reward:.3f} | {trl_reward:.3f} | |",
                  f"| peak GPU memory (GiB, NVML) | {a['peak_gpu_gib']:.1f} | {b['peak_gpu_gib']:.1f} | "
                  f"{a['peak_gpu_gib'] / b['peak_gpu_gib']:.2f}x |"]
    lines += [f"| first registration incl. vLLM start (s) | {a['register_s']:.0f} | {b['setup_s']:.0f} (trainer init) | |"
              if b else "",
              f"| rollout tokens/s, ours vs raw vllm.LLM.generate | {a['ours_tokens_per_s']:.0f} | "
              f"raw {a['raw_tokens_per_s']:.0f} | {a['rollout_ratio']:.2f}x |",
              f"| sleep + wake per step (s, median) | {steady(a['sleep_wake_s']):.3f} | | |",
              f"| adapter hot swap per step (s, median) | {steady(a['adapter_swap_s']):.3f} | | |",
              f"| train part of a step (s, median) | {steady(a['train_s']):.3f} | | |"]
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
