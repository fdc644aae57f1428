"""2048 with a programmatic reward (as in ART's examples): the model picks moves until the game ends.

Reward: log2 of the biggest tile over log2(2048) (1.0 for reaching 2048), plus a small bonus for the
board's total; an unreadable move ends the game with reward -1.

    python examples/game_2048.py --steps 10                         # embedded SmolLM2 on CPU
    python examples/game_2048.py --base-model Qwen/Qwen2.5-3B-Instruct --engine vllm --steps 100
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trajectory import choice_to_message

SYSTEM = ("You are playing 2048. Merge equal tiles to reach 2048. Reply with one word: left, right, up or down.")
MOVES = ("left", "right", "up", "down")


def slide_row(row: list[int]) -> list[int]:
    tiles = [v for v in row if v]
    out = []
    while tiles:
        if len(tiles) > 1 and tiles[0] == tiles[1]:
            out.append(tiles[0] * 2)
            tiles = tiles[2:]
        else:
            out.append(tiles.pop(0))
    return out + [0] * (4 - len(out))


def move(board: list[list[int]], direction: str) -> list[list[int]]:
    rows = [list(r) for r in board]
    if direction in ("up", "down"):
        rows = [list(c) for c in zip(*rows, strict=True)]
    if direction in ("right", "down"):
        rows = [r[::-1] for r in rows]
    rows = [slide_row(r) for r in rows]
    if direction in ("right", "down"):
        rows = [r[::-1] for r in rows]
    if direction in ("up", "down"):
        rows = [list(c) for c in zip(*rows, strict=True)]
    return rows


def spawn(board, rng: random.Random) -> None:
    empty = [(r, c) for r in range(4) for c in range(4) if not board[r][c]]
    if empty:
        r, c = rng.choice(empty)
        board[r][c] = 4 if rng.random() < 0.1 else 2


def score(board) -> float:
    top = max(max(r) for r in board)
    return math.log2(top) / 11 + 0.001 * sum(map(sum, board)) / 100


async def play(client, name: str, rng: random.Random, max_moves: int) -> Trajectory:
    board = [[0] * 4 for _ in range(4)]
    spawn(board, rng)
    spawn(board, rng)
    messages: list = [{"role": "system", "content": SYSTEM}]
    for _ in range(max_moves):
        shown = "\n".join(" ".join(f"{v or '.':>4}" for v in r) for r in board)
        messages.append({"role": "user", "content": f"Board:\n{shown}\nYour move?"})
        history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]  # Choices as messages
        reply = await client.chat.completions.create(model=name, messages=history,
                                                     max_tokens=6, temperature=1.0)
        messages.append(reply.choices[0])
        word = re.search(r"left|right|up|down", (reply.choices[0].message.content or "").lower())
        if word is None:
            return Trajectory(messages_and_choices=messages, reward=-1.0, metrics={"moves": len(messages) // 2})
        moved = move(board, word.group())
        if moved != board:
            board = moved
            spawn(board, rng)
        if max(max(r) for r in board) >= 2048 or all(move(board, d) == board for d in MOVES):
            break
    return Trajectory(messages_and_choices=messages, reward=score(board),
                      metrics={"max_tile": max(max(r) for r in board)})


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-moves", type=int, default=12)
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--out", default="./runs")
    args = ap.parse_args()
    model = TrainableModel("player", "2048", args.base_model,
                           ModelConfig(engine=EngineConfig(engine=args.engine, max_seq_length=4096)))
    backend = LocalBackend(args.out)
    await model.register(backend)
    client = model.openai_client()
    try:
        for step in range(await model.get_step(), args.steps):
            groups = await gather_trajectory_groups(
                [TrajectoryGroup(play(client, model.name, random.Random(step * 97 + g), args.max_moves)
                                 for _ in range(args.group_size)) for g in range(args.groups)],
                pbar_desc=f"step {step}", max_exceptions=0.1)
            row = await model.train(groups, TrainConfig(learning_rate=1e-4))
            print(f"step {row['step']}: reward {row['reward_mean']:.3f}", flush=True)
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
