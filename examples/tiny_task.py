"""A tiny verifiable task that trains on a CPU in minutes: answer short questions in one word.

The task and its reward live in `evals/tiny_task.py` (1 for the right answer among the reply's words, plus
up to 0.5 for brevity).

    python examples/tiny_task.py --steps 12            # embedded SmolLM2-135M + LoRA, transformers on CPU
    python examples/tiny_task.py --base-model Qwen/Qwen2.5-0.5B-Instruct --engine vllm   # on a GPU

The run lands in {out}/tiny/{name}: checkpoints/, history.jsonl (one row per step) and, at the end,
train-report.png. Run it again with the same --out to resume from the last complete checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evals.tiny_task import messages, questions_for_step, reward
from ruler import Trajectory, TrajectoryGroup
from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from trainer import gather_trajectory_groups
from trainer.runlog import plot_train_report

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
    ap.add_argument("--name", default="one-word")
    ap.add_argument("--out", default="./runs")
    args = ap.parse_args()

    model = TrainableModel(args.name, "tiny", args.base_model, ModelConfig(
        seed=args.seed, engine=EngineConfig(engine=args.engine, max_seq_length=256)))
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
    try:
        for step in range(await model.get_step(), args.steps):
            picked = questions_for_step(step, args.questions_per_step)
            started = time.perf_counter()
            groups = await gather_trajectory_groups([group(step, i, q, a) for i, (q, a) in enumerate(picked)],
                                                    pbar_desc=None)
            rollout = time.perf_counter() - started
            row = await model.train(groups, TrainConfig(learning_rate=args.lr, loss=args.loss))
            print(f"step {row['step']:3d}  reward {row['reward_mean']:.3f}  loss {row.get('loss', 0):+.4f}  "
                  f"rollout {rollout:.1f}s  train {row.get('train_s', 0):.1f}s", flush=True)
    finally:
        await backend.close()
    print("report:", plot_train_report(model.run_dir))


if __name__ == "__main__":
    asyncio.run(main())
