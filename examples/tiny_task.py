"""A tiny verifiable task that trains on a CPU in minutes: answer short questions in one word.

Reward: 1 if the right answer is among the reply's words, plus up to 0.5 for brevity (0.5 for one word,
0 from nine words on): the best replies are exactly the answer. SmolLM2-135M starts around 0.3. The task
(`QUESTIONS`, `messages`, `reward`, `questions_for_step`) is also what `evals/trainer_gpu_bench.py` trains on.

    python examples/tiny_task.py --steps 12            # embedded SmolLM2-135M + LoRA, transformers on CPU
    python examples/tiny_task.py --base-model Qwen/Qwen2.5-0.5B-Instruct --engine vllm   # on a GPU
    python examples/tiny_task.py --engine vllm --placement dedicated --inference-gpus 1 --trainer-gpus 0 --overlap
    python examples/tiny_task.py --engine transformers --placement dedicated --overlap   # the same loop on a CPU

`--overlap` gathers step k+1's rollouts while step k trains (`ruler_rl.trainer.pipeline.train_pipelined`,
`max_off_policy_steps=1` with the decoupled `tis` correction); it pays off with `--placement dedicated`,
where the server keeps answering during the step. The loop code is the same in every mode.

The run lands in {out}/tiny/{name}: checkpoints/, history.jsonl (one row per step) and, at the end,
train-report.png. Run it again with the same --out to resume from the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer.pipeline import train_pipelined
from ruler_rl.trainer.runlog import plot_train_report

QUESTIONS = [
    ("What is the capital of France?", "paris"), ("What is 2 + 3?", "5"),
    ("What color is the sky on a clear day?", "blue"), ("How many legs does a spider have?", "8"),
    ("What is the capital of Japan?", "tokyo"), ("What is 10 - 4?", "6"),
    ("What animal says moo?", "cow"), ("What is the opposite of hot?", "cold"),
]
SYSTEM = "Answer with one word."


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def reward(text: str | None, answer: str) -> float:
    words = re.findall(r"[a-z0-9]+", (text or "").lower())
    if not words:
        return 0.0
    return float(answer in words) + 0.5 * max(0.0, 1 - (len(words) - 1) / 8)


def questions_for_step(step: int, per_step: int) -> list[tuple[str, str]]:
    """The step's questions, rotating through the set (the same for every trainer compared)."""
    if per_step < 1:
        raise ValueError("per_step must be >= 1")
    return [QUESTIONS[(step * per_step + k) % len(QUESTIONS)] for k in range(per_step)]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--questions-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--loss", default="grpo", choices=["grpo", "dr_grpo", "dapo"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--placement", default="colocated", choices=["colocated", "dedicated"])
    ap.add_argument("--inference-gpus", default="", help="dedicated with vLLM: e.g. 1 or 1,2")
    ap.add_argument("--trainer-gpus", default="", help="dedicated with vLLM: e.g. 0")
    ap.add_argument("--overlap", action="store_true", help="gather step k+1 while step k trains")
    ap.add_argument("--no-share-prefix", action="store_true",
                    help="train every sequence whole (TrainConfig.share_prefix=False) instead of each group's "
                         "shared prompt once")
    ap.add_argument("--min-shared-prefix", type=int, default=None,
                    help="TrainConfig.min_shared_prefix: the shortest shared prompt worth sharing (default 32)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's share of the GPU")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="ModelConfig.dtype: the trainer's precision (auto: bf16 on a GPU, fp32 on the CPU); "
                         "float32 on a GPU with --engine transformers (vLLM serves LoRA in bf16/fp16 only)")
    ap.add_argument("--no-sleep", action="store_true", help="keep vLLM awake during training steps (EngineConfig.enable_sleep_mode=False): it keeps its memory and serves the previous adapter meanwhile; for a GPU shared with other vLLM processes, whose start-up memory profiling a sleeping neighbour would upset")
    ap.add_argument("--name", default="one-word")
    ap.add_argument("--out", default="./runs")
    args = ap.parse_args()

    gpus = {"inference_gpus": [int(g) for g in args.inference_gpus.split(",") if g],
            "trainer_gpus": [int(g) for g in args.trainer_gpus.split(",") if g]}
    model = TrainableModel(args.name, "tiny", args.base_model, ModelConfig(
        seed=args.seed, dtype=args.dtype, engine=EngineConfig(engine=args.engine, max_seq_length=256, placement=args.placement,
                                            **gpus, **({"gpu_memory_utilization": args.gpu_memory_utilization}
                                                       if args.gpu_memory_utilization is not None else {}),
                                            **({"enable_sleep_mode": False} if args.no_sleep else {}))))
    backend = LocalBackend(args.out)
    await model.register(backend)
    client = model.openai_client()

    async def group(step: int, i: int, question: str, answer: str) -> TrajectoryGroup:
        prompt = messages(question)
        reply = await client.chat.completions.create(model=model.name, messages=prompt, n=args.group_size,
                                                     max_tokens=args.max_tokens, temperature=1.0,
                                                     seed=args.seed * 100_000 + step * 100 + i)
        return TrajectoryGroup([Trajectory(messages_and_choices=[*prompt, c],
                                           reward=reward(c.message.content, answer)) for c in reply.choices])

    if await model.get_step():
        print(f"resuming from step {await model.get_step()}", flush=True)
    sharing = {"share_prefix": False} if args.no_share_prefix else (
        {"min_shared_prefix": args.min_shared_prefix} if args.min_shared_prefix is not None else {})
    config = TrainConfig(learning_rate=args.lr, loss=args.loss, **sharing,
                         **({"max_off_policy_steps": 1, "sampler_correction": "tis"} if args.overlap else {}))
    rollout_s: list[float] = []  # per gather, in order: train_pipelined trains on them in that order

    async def gather(step: int) -> list[TrajectoryGroup]:
        picked = questions_for_step(step, args.questions_per_step)
        started = time.perf_counter()
        groups = await gather_trajectory_groups([group(step, i, q, a) for i, (q, a) in enumerate(picked)],
                                                pbar_desc=None)
        rollout_s.append(time.perf_counter() - started)
        return groups

    trained: list[dict] = []

    def report(row, groups) -> None:
        trained.append(row)
        print(f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  loss {row.get('loss', 0):+.4f}  "
              f"rollout {rollout_s[len(trained) - 1]:.1f}s  train {row.get('train_s', 0):.1f}s  "
              f"policy lag {row.get('policy_lag_max', 0)}  sequence tokens {row.get('sequence_tokens', '-')} -> "
              f"{row.get('forward_tokens', '-')}", flush=True)

    try:
        remaining = args.steps - await model.get_step()
        if remaining > 0:  # overlap off: gather, train, gather, ... as in the loop of the README
            await train_pipelined(model, gather, steps=remaining, config=config, on_step=report)
    finally:
        await backend.close()
    print("report:", plot_train_report(model.run_dir))


if __name__ == "__main__":
    asyncio.run(main())
