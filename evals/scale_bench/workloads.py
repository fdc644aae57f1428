"""What the parts run on: random text of whole words that renders back to the same token ids, the prefix
workload's prompts, the agent workload's multi-turn rollouts, the rewards both are trained with, and the time
budget a part stops starting new work at."""

from __future__ import annotations

import asyncio
import random
import time


def word_ids(tokenizer) -> list[int]:
    """Ids of single tokens that are one lowercase word with a leading space ('Ġword'): a run of them decodes
    to text that tokenizes back to the same ids."""
    vocab = tokenizer.get_vocab()
    return sorted(i for t, i in vocab.items() if t.startswith("Ġ") and t[1:].isalpha() and t[1:].islower()
                  and 3 <= len(t) <= 9)


def synthetic_text(tokenizer, words: list[int], n_tokens: int, rng: random.Random) -> str:
    """Text of about `n_tokens` tokens (random words of the vocabulary)."""
    return tokenizer.decode([rng.choice(words) for _ in range(n_tokens)]).strip()


def prefix_prompts(tokenizer, words: list[int], args, rng: random.Random) -> list[list[dict]]:
    """The prefix workload's prompts (#18): per group (`--groups`) one user message of ~`--prefix-tokens` random
    words, which all `--group-size` rollouts of the group share."""
    return [[{"role": "user", "content": synthetic_text(tokenizer, words, args.prefix_tokens, rng)}]
            for _ in range(args.groups)]


async def agent_rollouts(ask, tokenizer, words: list[int], args, rng: random.Random) -> list[list]:
    """One step's rollouts of the agent workload (#12): per group (`--groups`) a first user message of
    ~`--turn-tokens` random words, rolled out `--group-size` times (group by group in the returned list); each
    rollout is `--turns` replies of `await ask(messages)` (a chat completion, its first choice kept) with a
    "Tool result: ..." user message of ~`--turn-tokens` random words between two turns. A rollout is the items
    `Trajectory.messages_and_choices` takes: the user messages as dicts, the replies as their choices."""
    async def rollout(first: str) -> list:
        items: list = [{"role": "user", "content": first}]
        for k in range(args.turns):
            history = [it if isinstance(it, dict) else {"role": "assistant", "content": it.message.content}
                       for it in items]
            reply = await ask(history)
            items.append(reply.choices[0])
            if k < args.turns - 1:
                items.append({"role": "user", "content": "Tool result: " +
                              synthetic_text(tokenizer, words, args.turn_tokens, rng)})
        return items

    firsts = [synthetic_text(tokenizer, words, args.turn_tokens, rng) for _ in range(args.groups)]
    return list(await asyncio.gather(*(rollout(firsts[g]) for g in range(args.groups)
                                       for _ in range(args.group_size))))


def varied_rewards(n: int) -> list[float]:
    """0, 1, 2, 0, 1, ...: rewards that differ within any group of two or more, so every group trains."""
    return [float(i % 3) for i in range(n)]


def rewarded_groups(rollouts: list[list], group_size: int) -> list:
    """Rollouts, `group_size` after `group_size`, as TrajectoryGroups rewarded by `varied_rewards`."""
    from ruler_rl import Trajectory, TrajectoryGroup

    return [TrajectoryGroup([Trajectory(messages_and_choices=items, reward=w) for items, w in
                             zip(rollouts[g:g + group_size], varied_rewards(group_size), strict=True)])
            for g in range(0, len(rollouts), group_size)]


class Budget:
    """The seconds a part may still start new work in, from `Budget(seconds)` on."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()
