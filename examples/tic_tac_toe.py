"""Tic-tac-toe with a programmatic reward (as in ART's examples): the model plays X against a random O.

Reward: win 1, draw 0.5, loss 0, an illegal or unreadable move -1 (the game ends there).

    python examples/tic_tac_toe.py --steps 20                       # embedded SmolLM2 on CPU (slow, weak)
    python examples/tic_tac_toe.py --base-model Qwen/Qwen2.5-1.5B-Instruct --engine vllm --steps 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
SYSTEM = ("You play tic-tac-toe as X. Squares are numbered 1-9, left to right, top to bottom. "
          "Reply with the number of a free square only.")


def winner(board: list[str]) -> str | None:
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


def show(board: list[str]) -> str:
    return "\n".join(" ".join(board[r * 3:r * 3 + 3]) for r in range(3))


async def play(client, name: str, rng: random.Random, max_tokens: int) -> Trajectory:
    board = ["."] * 9
    messages: list = [{"role": "system", "content": SYSTEM}]
    while True:
        messages.append({"role": "user", "content": f"Board:\n{show(board)}\nYour move?"})
        reply = await client.chat.completions.create(model=name, messages=messages, max_tokens=max_tokens,
                                                     temperature=1.0)
        choice = reply.choices[0]
        messages.append(choice)
        move = re.search(r"[1-9]", choice.message.content or "")
        if move is None or board[int(move.group()) - 1] != ".":
            return Trajectory(messages_and_choices=messages, reward=-1.0, metrics={"illegal": 1})
        board[int(move.group()) - 1] = "X"
        if (w := winner(board)) is None:
            board[rng.choice([i for i, s in enumerate(board) if s == "."])] = "O"
            w = winner(board)
        if w is not None:
            reward = {"X": 1.0, "draw": 0.5, "O": 0.0}[w]
            return Trajectory(messages_and_choices=messages, reward=reward, metrics={"illegal": 0})


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=6)
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--out", default="./runs")
    args = ap.parse_args()
    model = TrainableModel("ttt", "tic-tac-toe", args.base_model,
                           ModelConfig(engine=EngineConfig(engine=args.engine, max_seq_length=1024)))
    backend = LocalBackend(args.out)
    await model.register(backend)
    client = model.openai_client()
    try:
        for step in range(await model.get_step(), args.steps):
            groups = await gather_trajectory_groups(
                [TrajectoryGroup(play(client, model.name, random.Random(step * 1000 + g * 10 + i), 8)
                                 for i in range(args.group_size)) for g in range(args.groups)],
                pbar_desc=f"step {step}", max_exceptions=0.1)
            row = await model.train(groups, TrainConfig(learning_rate=2e-4))
            print(f"step {row['step']}: reward {row['reward_mean']:.3f}", flush=True)
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
