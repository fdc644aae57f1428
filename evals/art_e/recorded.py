"""The training loop the framework examples share (`examples/email_agent_langgraph.py`,
`examples/email_agent_agents_sdk.py`): ART·E data, a model on a `LocalBackend`, rollouts recorded by the
example's own agent, each group ranked by RULER, one `model.train` step per --steps."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from evals.art_e import harness
from evals.art_e.inbox import ENRON_DIR, build_inbox_db
from evals.art_e.questions import Scenario, generate_scenarios
from evals.art_e.tools import InboxTools
from ruler_rl import Trajectory, TrajectoryGroup, gather_trajectory_groups, ruler_score_group
from ruler_rl.trainer import EngineConfig, LocalBackend, ModelConfig, TrainableModel, TrainConfig
from ruler_rl.trainer.record import aclose_recording


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    """The options both framework examples take."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups-per-step", type=int, default=2, help="training questions per step")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    ap.add_argument("--max-turns", type=int, default=4, help="model calls per rollout")
    ap.add_argument("--max-tokens", type=int, default=256, help="per model call")
    ap.add_argument("--judge", default=None, help="RULER judge: a litellm model or MODEL@http://host/v1 (default: "
                    "RULER's default, $RULER_JUDGE_MODEL or the embedded SmolLM2-135M, offline)")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--per-inbox", type=int, default=50, help="questions generated per inbox (at most)")
    ap.add_argument("--mailbox", type=Path, nargs="*", default=None, help="default: every shared Enron mailbox")
    ap.add_argument("--db", type=Path, default=Path("./runs/art-e-inbox.db"))
    ap.add_argument("--base-model", default="local/smollm2-135m-instruct")
    ap.add_argument("--engine", default="auto", choices=["auto", "transformers", "vllm"])
    ap.add_argument("--name", default=None, help="model name (default: from the example)")
    ap.add_argument("--out", default="./runs", help="checkpoints and the run log go under OUT/art-e/NAME")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("steps", "groups_per_step", "group_size", "max_turns", "max_tokens", "per_inbox"):
        if getattr(args, name) < (0 if name == "steps" else 1):
            ap.error(f"--{name.replace('_', '-')} must be >= {0 if name == 'steps' else 1}")
    if args.judge is not None:
        harness.ModelSpec.parse(args.judge)  # a malformed spec is an error before anything loads
    return args


def finish(traj: Trajectory, scenario: Scenario, inbox: InboxTools) -> Trajectory:
    """What every recorded rollout keeps beside its conversation: the question's id, the answer given, the
    number of model calls."""
    final = inbox.final_answer or {}
    traj.metadata.update(scenario_id=scenario.id, answer=final.get("answer"))
    traj.metrics["turns"] = sum(not isinstance(m, dict) for m in traj.messages_and_choices)
    traj.metrics["answered"] = int(bool(final))
    return traj


async def train(rollout, default_name: str, argv=None, description: str = "", *, policy) -> list[dict]:
    """The training loop both examples share: data, model, `--steps` RULER-scored GRPO steps of
    `rollout(agent_model, scenario, db, args)`; the run-log rows. `policy(model, args)` makes the framework's
    model (`langchain_chat_model`, `agents_sdk_model`): once per step, since it names that step's adapter,
    shared by the step's rollouts and closed (`ruler_rl.trainer.record.aclose_recording`) when the step ends."""
    if not callable(rollout) or not callable(policy):
        raise TypeError("train needs a rollout function and a policy factory (model, args) -> framework model")
    args = parse_args(argv, description)
    rng = random.Random(args.seed)
    if not args.db.is_file():
        args.db.parent.mkdir(parents=True, exist_ok=True)
        report = build_inbox_db(args.mailbox or sorted(ENRON_DIR.glob("*.tar.gz")), args.db)
        print(f"built {args.db}: {report.emails} emails", flush=True)
    # questions of every inbox: these examples train only (examples/email_agent.py measures on held-out inboxes)
    train_set = generate_scenarios(args.db, per_inbox=args.per_inbox, test_inboxes=[], seed=args.seed)
    if not train_set:
        raise SystemExit(f"no training questions could be generated from {args.db}")
    model = TrainableModel(args.name or default_name, "art-e", args.base_model,
                           ModelConfig(engine=EngineConfig(engine=args.engine, max_seq_length=8192), seed=args.seed))
    backend = LocalBackend(args.out)
    await model.register(backend)
    judge = harness.ModelSpec.parse(args.judge) if args.judge else None

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:  # every rollout raised (counted against max_exceptions)
            return None
        return await ruler_score_group(group, judge.model if judge else None, judge.params() if judge else None,
                                       swallow_exceptions=True)

    rows = []
    try:
        for step in range(await model.get_step(), args.steps):
            picked = rng.sample(train_set, min(args.groups_per_step, len(train_set)))
            agent_model = policy(model, args)  # one per step (its HTTP clients too), closed when the step ends
            try:
                groups = await gather_trajectory_groups(
                    [TrajectoryGroup(rollout(agent_model, s, args.db, args) for _ in range(args.group_size))
                     for s in picked], after_each=score, pbar_desc=f"step {step}", max_exceptions=0.25)
            finally:
                await aclose_recording(agent_model)
            row = await model.train(groups, TrainConfig(learning_rate=args.lr))
            rows.append(row)
            print(f"step {row['step']}: trained={row['trained']} RULER reward {row.get('reward_mean', float('nan')):.3f}, "
                  f"{row.get('sequences', 0)} sequences {row.get('skipped') or ''}", flush=True)
    finally:
        await backend.close()
    return rows
