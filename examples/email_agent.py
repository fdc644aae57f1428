"""The ART·E email agent trained with RULER rewards: no reward function, one judge call per group.

Each step: for a few training questions, a group of agent rollouts against our server (native tool calls,
Hermes-style for models whose template lacks tools), scored relative to each other by `ruler_score_group`
inside `gather_trajectory_groups(after_each=...)`, then one GRPO step.

    python examples/email_agent.py --steps 2 --questions 2 --group-size 3 --max-turns 3   # CPU, embedded
    python examples/email_agent.py --base-model Qwen/Qwen2.5-7B-Instruct --engine vllm \\
        --judge openai/o4-mini --steps 50                                               # the real thing
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evals.art_e.agent import run_agent  # noqa: E402
from evals.art_e.inbox import ENRON_DIR, build_inbox_db  # noqa: E402
from evals.art_e.questions import generate_scenarios  # noqa: E402
from ruler import TrajectoryGroup, ruler_score_group  # noqa: E402
from trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig  # noqa: E402
from trainer import gather_trajectory_groups  # noqa: E402



async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--questions", type=int, default=2, help="groups per step")
    ap.add_argument("--group-size", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256, help="per agent turn")
    ap.add_argument("--judge", default=None, help="RULER judge (default: RULER's default judge)")
    ap.add_argument("--mailbox", type=Path, default=ENRON_DIR / "beck-s.tar.gz")
    ap.add_argument("--db", type=Path, default=Path("./runs/art-e-inbox.db"))
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--out", default="./runs")
    args = ap.parse_args()
    if not args.db.is_file():
        args.db.parent.mkdir(parents=True, exist_ok=True)
        build_inbox_db([args.mailbox], args.db)
    scenarios = generate_scenarios(args.db, per_inbox=200, seed=1)
    model = TrainableModel("email-agent", "art-e", args.base_model,
                           ModelConfig(engine=EngineConfig(engine=args.engine, max_seq_length=8192)))
    backend = LocalBackend(args.out)
    await model.register(backend)
    rng = random.Random(0)

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        return await ruler_score_group(group, args.judge, swallow_exceptions=True)  # None when the judge fails

    try:
        for step in range(await model.get_step(), args.steps):
            picked = rng.sample(scenarios, args.questions)
            params = model.litellm_completion_params()  # ART's shape: hosted_vllm/<name>@<step> at the model's server
            name = params.pop("model")
            groups = await gather_trajectory_groups(
                [TrajectoryGroup(run_agent(s, args.db, name, params={**params, "max_tokens": args.max_tokens},
                                           max_turns=args.max_turns, tool_mode="native")
                                 for _ in range(args.group_size)) for s in picked],
                after_each=score, pbar_desc=f"step {step}", max_exceptions=0.25)
            row = await model.train(groups, TrainConfig(learning_rate=5e-5))
            print(f"step {row['step']}: RULER score {row['reward_mean']:.3f}, trained on {row['sequences']} "
                  f"rollouts", flush=True)
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
