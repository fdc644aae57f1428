"""Score a group of trajectories with RULER and turn the scores into GRPO advantages.

    .venv/bin/python examples/score_group.py [GROUP.json] [--judge openai/o4-mini]

Without --judge it uses $RULER_JUDGE_MODEL or the embedded offline judge; with an API model, set the
provider's key (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...) as litellm expects.
"""

import argparse
import asyncio
from importlib import resources

from ruler_rl import TrajectoryGroup, group_advantages, ruler_score_group


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("group", nargs="?", help="group file (JSON/JSONL); default: the bundled demo group")
    ap.add_argument("--judge", default=None)
    ap.add_argument("--permutations", type=int, default=1)
    args = ap.parse_args()
    if args.group:
        group = TrajectoryGroup.load(args.group)
    else:
        group = TrajectoryGroup.model_validate_json((resources.files("ruler_rl") / "data" / "demo_group.json").read_text())
    scored = await ruler_score_group(group, args.judge, num_permutations=args.permutations)
    for i, (t, a) in enumerate(zip(scored, group_advantages([t.reward for t in scored]), strict=True), 1):
        print(f"trajectory {i}: score {t.reward:.3f}  advantage {a:+.2f}  {t.logs[-1] if t.logs else ''}")
    print(f"judge cost: ${scored.metadata['judge_cost']:.6f}, cached: {scored.metadata['judge_cached']}")


if __name__ == "__main__":
    asyncio.run(main())
