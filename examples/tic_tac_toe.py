"""Tic-tac-toe: the model plays X against a random O, trained on the game's own reward or on RULER's ranking.

Hand reward, this example's own values: win 1, draw 0.5, loss 0, an illegal or unreadable move -1 (the game ends
there). With `--reward ruler` a judge ranks each group of games instead (RULER; the hand reward is still recorded
beside each rollout's RULER score in groups.jsonl, never trained on). Every game ends with the environment's last
message, the final board and the result ("You won.", "Illegal move ..."), which the judge reads like any other
message; the model is not trained on it.

Training games are sampled at temperature 1, each against its own opponent. The held-out measure:
`--eval-games` games against opponents seeded apart from every training game (the same games for every run, so
runs pair game by game), at each of `--eval-temperatures` (greedy by default; sampled moves are seeded per game
and move, so every run and step samples from the same random numbers), before training, every `--eval-every`
policy steps and after: eval-stepNNNN.csv in the report folder (one row per game and temperature: its seed,
result, hand reward, moves).
Compare runs with `python -m evals.ruler_vs_hand REPORT [REPORT ...]`. The report folder also holds run.json (the
arguments, software versions, the measures' summaries, steps run, and `stopped` when the judge failed every group
of MAX_UNSCORED_IN_A_ROW steps in a row) and groups.jsonl (each training game's hand reward beside the reward it
was trained on). A run is one go: it does not resume (a run folder past step 0, or a report folder that holds a
run, is refused).

    python examples/tic_tac_toe.py --steps 2                        # embedded SmolLM2 on CPU (slow, weak)
    python examples/tic_tac_toe.py --base-model Qwen/Qwen2.5-1.5B-Instruct --engine vllm --steps 30 --seed 0
    python examples/tic_tac_toe.py --reward ruler --judge self --base-model Qwen/Qwen2.5-1.5B-Instruct \\
        --engine vllm --steps 30 --seed 0                           # the policy's untrained weights judge

The default RULER judge is the embedded SmolLM2-135M, which ranks near chance: its scores are no quality measure,
and a run trained on them shows the pipeline works, not that RULER does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups, ruler_score_group
from ruler_rl.errors import JudgeError, TrajectoryError
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer.runlog import software_versions
from ruler_rl.trainer.vllm_server import resolved_engine
from ruler_rl.trajectory import choice_to_message

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
SYSTEM = ("You play tic-tac-toe as X. Squares are numbered 1-9, left to right, top to bottom. "
          "Reply with the number of a free square only.")
REWARDS = {"win": 1.0, "draw": 0.5, "loss": 0.0, "illegal": -1.0}
OUTCOMES = {"win": "You won.", "draw": "It is a draw.", "loss": "You lost: O has three in a row."}
EVAL_SEED = 10**9  # held-out opponents are seeded EVAL_SEED + i; training ones by text (training_seed)
MAX_REFUSED_IN_A_ROW = 3  # batches the trainer may refuse in a row before the training loop ends
JUDGE_AT_URL = re.compile(r"(\S+)@(https?://\S+)")  # --judge MODEL@URL (greedy: the URL is after the last "@http")
MAX_UNSCORED_IN_A_ROW = 3  # steps in a row whose every group the judge failed before the training loop ends


def winner(board: list[str]) -> str | None:
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if "." not in board else None


def show(board: list[str]) -> str:
    return "\n".join(" ".join(board[r * 3:r * 3 + 3]) for r in range(3))


async def play(client, name: str, seed: int | str, *, max_tokens: int, temperature: float,
               sample_seed: int | None = None) -> Trajectory:
    """One game as X against an O that plays uniformly at random (its moves drawn from `seed`); with
    `sample_seed`, the model's n-th move is sampled with the request seed `sample_seed + n` (a sampled game that
    can be played again)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, str)):
        raise TypeError(f"seed must be an int or a str (the opponent's moves come from it), got {seed!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise ValueError(f"temperature must be a number in [0, 2], got {temperature!r}")
    if sample_seed is not None and (isinstance(sample_seed, bool) or not isinstance(sample_seed, int)):
        raise TypeError(f"sample_seed must be an int or None, got {sample_seed!r}")
    rng = random.Random(seed)
    board = ["."] * 9
    messages: list = [{"role": "system", "content": SYSTEM}]
    while True:
        messages.append({"role": "user", "content": f"Board:\n{show(board)}\nYour move?"})
        history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]  # Choices as messages
        seeded = {} if sample_seed is None else {"seed": sample_seed + board.count("X")}
        reply = await client.chat.completions.create(model=name, messages=history, max_tokens=max_tokens,
                                                     temperature=temperature, **seeded)
        choice = reply.choices[0]
        messages.append(choice)
        move = re.search(r"[1-9]", choice.message.content or "")
        if move is None or board[int(move.group()) - 1] != ".":
            said = "no square number" if move is None else f"square {move.group()} is taken"
            return finished(messages, board, "illegal", seed, f"Illegal move ({said}): the game is over.")
        board[int(move.group()) - 1] = "X"
        if (w := winner(board)) is None:
            board[rng.choice([i for i, s in enumerate(board) if s == "."])] = "O"
            w = winner(board)
        if w is not None:
            result = {"X": "win", "draw": "draw", "O": "loss"}[w]
            return finished(messages, board, result, seed, OUTCOMES[result])


def finished(messages: list, board: list[str], result: str, seed: int | str, outcome: str) -> Trajectory:
    """The game as a trajectory: the environment's last message (final board, result) closes it."""
    messages.append({"role": "user", "content": f"Final board:\n{show(board)}\n{outcome}"})
    return Trajectory(messages_and_choices=messages, reward=REWARDS[result],
                      metrics={"illegal": int(result == "illegal"), "win": int(result == "win"),
                               "moves": sum(1 for m in messages if not isinstance(m, dict))},
                      metadata={"result": result, "seed": seed})


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reward", default="hand", choices=["hand", "ruler"],
                    help="the game's own reward, or RULER's ranking of each group")
    ap.add_argument("--judge", default=None, help="--reward ruler: the RULER judge, a litellm model (MODEL@URL for "
                    "an OpenAI-compatible server at URL, e.g. hosted_vllm/judge@http://127.0.0.1:8001/v1), or 'self': the "
                    "policy's own vLLM server with its untrained weights (step 0; --engine vllm) (default: RULER's "
                    "default judge, the embedded SmolLM2-135M, near chance)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--groups", type=int, default=4, help="groups a step")
    ap.add_argument("--group-size", type=int, default=6, help="games a group, each against its own opponent seed")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-seq-length", type=int, default=None, help="the longest sequence served and trained "
                    "(default 1024; 8192 with --judge self, where it is also the judge's context: RULER's prompt for "
                    "a group is kept 512 tokens below it)")
    ap.add_argument("--max-tokens", type=int, default=8, help="per move")
    ap.add_argument("--eval-games", type=int, default=200, help="held-out games measured before and after")
    ap.add_argument("--eval-temperatures", type=float, nargs="+", default=[0.0], help="each held-out measure plays "
                    "the games at each of these temperatures (0: greedy; above 0 each move is sampled with a request "
                    "seed drawn from the game's, so every measure plays the same sampled games a policy would)")
    ap.add_argument("--eval-every", type=int, default=0, help="also measure them whenever the policy reaches a "
                    "multiple of N steps (0: before and after only)")
    ap.add_argument("--concurrency", type=int, default=64, help="held-out games in flight")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed: training opponents, LoRA start")
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's share of the GPU")
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs or torch.compile: a "
                    "faster start, slower decoding")
    ap.add_argument("--no-sleep", action="store_true", help="keep vLLM awake during training steps (for a GPU "
                    "shared with other vLLM processes)")
    ap.add_argument("--time-budget-s", type=float, default=None, help="start no training step after this many "
                    "seconds from launch; the after-measure still runs")
    ap.add_argument("--name", default=None, help="model name (default: ttt-<reward>-seed<seed>)")
    ap.add_argument("--out", default="./runs", help="checkpoints and the run log go under OUT/tic-tac-toe/NAME")
    ap.add_argument("--report", type=Path, default=None, help="report folder (default: the run folder's report/)")
    args = ap.parse_args(argv)
    for name in ("groups", "group_size", "max_tokens", "eval_games", "concurrency"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("steps", "eval_every", "seed"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.group_size < 2:
        ap.error("--group-size must be >= 2: GRPO and RULER compare games within a group")
    if any(not 0 <= t <= 2 for t in args.eval_temperatures) or \
            len(set(args.eval_temperatures)) < len(args.eval_temperatures):
        ap.error("--eval-temperatures: distinct values in [0, 2]")
    if args.lr <= 0:
        ap.error("--lr must be > 0")
    if args.time_budget_s is not None and args.time_budget_s <= 0:
        ap.error("--time-budget-s must be > 0")
    if args.judge and args.reward != "ruler":
        ap.error("--judge is the RULER judge: use it with --reward ruler")
    if args.max_seq_length is None:
        args.max_seq_length = 8192 if args.judge == "self" else 1024
    if args.max_seq_length < (2048 if args.judge == "self" else 256):
        ap.error("--max-seq-length must be >= 256, and >= 2048 with --judge self (the judge's context)")
    if args.judge and "@http" in args.judge and not JUDGE_AT_URL.fullmatch(args.judge):
        ap.error("--judge MODEL@URL: a litellm model, then the server's http(s) URL")
    if args.judge == "self" and args.engine != "vllm":  # the CPU server serves only the latest adapter, not step 0
        ap.error("--judge self needs --engine vllm: only vLLM keeps serving the untrained weights (step 0) beside "
                 "the trained adapter")
    return args


def training_seed(run_seed: int, batch: int, group: int, game: int) -> str:
    """The opponent seed of one training game: text, so never one of the held-out games' integer seeds. Each game
    of a group has its own: with one opponent for the whole group, a policy that has turned deterministic plays
    the same game eight times, every group ties and training stops (tic-tac-toe on Qwen2.5-Coder-1.5B,
    2026-12-07: from the seventh or eighth update on, most steps' groups all tied)."""
    for name, value, low in (("run_seed", run_seed, 0), ("batch", batch, 1), ("group", group, 0), ("game", game, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return f"train-{run_seed}-{batch}-{group}-{game}"


async def evaluate(model: TrainableModel, args, report_dir: Path) -> list[dict]:
    """The policy as served now on the held-out games at each of `--eval-temperatures`: written as
    eval-stepNNNN.csv (one row per game and temperature); a summary per temperature returned."""
    import pandas as pd

    step = await model.get_step()
    client, name = model.openai_client(), model.get_inference_name(step)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int, temperature: float) -> dict:
        async with gate:
            game = await play(client, name, EVAL_SEED + i, max_tokens=args.max_tokens, temperature=temperature,
                              sample_seed=(EVAL_SEED + i) * 10 if temperature > 0 else None)
        return {"seed": game.metadata["seed"], "temperature": temperature, "result": game.metadata["result"],
                "reward": game.reward, "moves": game.metrics["moves"]}

    table = pd.DataFrame(await asyncio.gather(*(one(i, t) for t in args.eval_temperatures
                                                for i in range(args.eval_games))))
    table.to_csv(report_dir / f"eval-step{step:04d}.csv", index=False)
    summaries = []
    for temperature, games in table.groupby("temperature", sort=False):
        counts = games["result"].value_counts()
        summaries.append({"step": step, "temperature": temperature, "games": len(games),
                          "mean_reward": round(float(games["reward"].mean()), 4),
                          **{r: int(counts.get(r, 0)) for r in REWARDS}})
        print(f"held-out at policy step {step}: {summaries[-1]}", flush=True)
    return summaries


async def main(argv=None) -> None:
    launched = time.monotonic()
    args = parse_args(argv)
    name = args.name or f"ttt-{args.reward}-seed{args.seed}"
    engine = EngineConfig(engine=args.engine, max_seq_length=args.max_seq_length,
                          **({"gpu_memory_utilization": args.gpu_memory_utilization}
                             if args.gpu_memory_utilization is not None else {}),
                          **({"enable_sleep_mode": False} if args.no_sleep else {}),
                          **({"enforce_eager": True} if args.enforce_eager else {}))
    model = TrainableModel(name, "tic-tac-toe", args.base_model, ModelConfig(engine=engine, seed=args.seed))
    if args.report is not None and any((args.report / f).exists() for f in ("run.json", "groups.jsonl")):
        raise SystemExit(f"{args.report} already holds a run's report: give a new --report")
    backend = LocalBackend(args.out)
    await model.register(backend)
    report_dir = args.report or model.run_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    run_info = {**vars(args), **software_versions(), "eval_seed": EVAL_SEED,
                "compact_json": engine.compact_json if resolved_engine(engine) == "vllm" else None}

    def save_run_info() -> None:
        (report_dir / "run.json").write_text(json.dumps(run_info, indent=2, default=str))

    save_run_info()
    if args.judge == "self":  # the base weights on the policy's own server: step 0 stays served however far it trains
        judge = f"hosted_vllm/{model.get_inference_name(0)}"
        judge_params = {"api_base": model.inference_base_url, "api_key": model.inference_api_key}
    elif args.judge and (at_url := JUDGE_AT_URL.fullmatch(args.judge)):  # the model's name may hold "@" itself
        judge, url = at_url.groups()
        judge_params = {"api_base": url, "api_key": "local"}  # a local server; litellm needs some key
    else:
        judge, judge_params = args.judge, None
    where = {"step": 0, "batch": 0}
    judge_errors: list[str] = []  # the judge's failures, as text, in the order they came

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        scored = group
        if args.reward == "ruler":  # a group the judge fails is dropped, not trained on
            budget = {"max_prompt_tokens": args.max_seq_length - 512} if args.judge == "self" else {}
            try:
                scored = await ruler_score_group(group, judge, judge_params, **budget)
            except (JudgeError, TrajectoryError) as exc:
                judge_errors.append(f"{type(exc).__name__}: {exc}")
                print(f"group dropped, the judge failed: {judge_errors[-1]}", flush=True)
                scored = None
        rows = [{"seed": t.metadata["seed"], "result": t.metadata["result"], "hand_reward": t.reward,
                 "reward": (s.reward if scored is not None else None)}
                for t, s in zip(group.trajectories, (scored or group).trajectories, strict=True)]
        with open(report_dir / "groups.jsonl", "a") as f:
            f.write(json.dumps({**where, "reward": args.reward, "scored": scored is not None, "rollouts": rows})
                    + "\n")
        return scored

    client = model.openai_client()
    try:
        step = await model.get_step()
        if step > 0:  # a run is one go: its opponents, loop steps and measures are not picked up again
            raise SystemExit(f"{model.run_dir} is at step {step}: this example does not resume a run; start a new "
                             "--name (or --out)")
        run_info["before"] = await evaluate(model, args, report_dir)
        evaluated, refused, steps_run, unscored = step, [], 0, 0
        while step < args.steps:
            if args.time_budget_s is not None and time.monotonic() - launched > args.time_budget_s:
                print(f"--time-budget-s {args.time_budget_s:g} spent: stopping at step {step} of {args.steps}",
                      flush=True)
                break
            where["step"], where["batch"] = step, where["batch"] + 1
            name_now = model.get_inference_name(await model.get_step())  # behind `step` after tied groups
            groups = await gather_trajectory_groups(
                [TrajectoryGroup(play(client, name_now, training_seed(args.seed, where["batch"], g, i),
                                      max_tokens=args.max_tokens, temperature=1.0)
                                 for i in range(args.group_size)) for g in range(args.groups)],
                after_each=score, pbar_desc=f"step {step}", max_exceptions=0.1)
            # every group dropped: the judge failed them all; a judge that cannot work (a context too short for
            # its prompt, on 2026-12-07 for 40 steps) stops the run instead of training on nothing
            unscored = 0 if groups else unscored + 1
            if unscored >= MAX_UNSCORED_IN_A_ROW:
                run_info["stopped"] = (f"the judge failed every group of {unscored} steps in a row; the last "
                                       f"error: {judge_errors[-1] if judge_errors else 'none recorded'}")
                print(f"stopping: {run_info['stopped']}", flush=True)
                break
            try:
                row = await model.train(groups, TrainConfig(learning_rate=args.lr))
            except FloatingPointError as exc:  # refused and rolled back by the trainer: nothing of it was applied
                refused.append(where["batch"])
                print(f"batch {where['batch']} refused ({exc}): a new one is drawn", flush=True)
                if len(refused) >= MAX_REFUSED_IN_A_ROW and \
                        refused[-MAX_REFUSED_IN_A_ROW] == where["batch"] - MAX_REFUSED_IN_A_ROW + 1:
                    print(f"{MAX_REFUSED_IN_A_ROW} batches in a row refused: stopping", flush=True)
                    break
                continue
            step, steps_run = step + 1, steps_run + 1
            hand = [t.metrics.get("independent_reward", t.reward) for g in groups for t in g.trajectories]
            print(f"step {step} (policy step {row['step']}): reward {row['reward_mean']:.3f} ({args.reward}); "
                  f"hand reward of the games {sum(hand) / max(len(hand), 1):.3f}", flush=True)
            policy = await model.get_step()
            if args.eval_every and policy != evaluated and policy % args.eval_every == 0 and step < args.steps:
                run_info.setdefault("during", []).extend(await evaluate(model, args, report_dir))
                evaluated = policy
                save_run_info()
        if await model.get_step() != evaluated:  # else the last measure is of this policy already
            run_info["after"] = await evaluate(model, args, report_dir)
        run_info.update(steps_run=steps_run, batches_refused=refused, policy_step=await model.get_step(),
                        judge_errors=len(judge_errors), seconds=round(time.monotonic() - launched, 1))
        save_run_info()
    finally:
        await backend.close()
    print(f"report: {report_dir}")


if __name__ == "__main__":
    asyncio.run(main())
