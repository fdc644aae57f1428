"""Rollouts overlapping training: gather step k+1's groups while step k trains.

    async def gather(step: int) -> list[TrajectoryGroup]:
        return await gather_trajectory_groups(...)           # the user's own rollouts, as in the plain loop

    rows = await train_pipelined(model, gather, steps=10,
                                 config=TrainConfig(max_off_policy_steps=1, sampler_correction="tis"))

With `config.max_off_policy_steps` 0 this is the plain loop (gather, train, gather, ...). With 1 or more,
`model.train(groups_k)` runs as a task and `gather(k + 1)` runs beside it: on a dedicated placement
(`EngineConfig(placement="dedicated")`) the server keeps answering with the step-k adapter during the
step, so step k+1 trains on rollouts one step off-policy (each choice says so in `policy_step`), corrected
by the decoupled loss (`sampler_correction="tis"`). Colocated, the overlap is allowed but buys little:
vLLM queues the requests while it sleeps, the CPU engine runs them between training and generation.
Only one step is ever in flight, so rollouts are never more than one step behind whatever the bound.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from ruler_rl.trainer.config import TrainConfig


async def train_pipelined(model, gather: Callable[[int], Awaitable[list]], *, steps: int,
                          config: TrainConfig | None = None,
                          on_step: Callable[[dict, list], object] | None = None) -> list[dict]:
    """Train `model` for `steps` steps from its current step on the groups `gather(step)` returns (`step`: the
    index of the step those groups are for, counted from the model's current step), overlapping each step
    with the next gather when `config.max_off_policy_steps` >= 1. `on_step(row, groups)` (may be async) is
    called after each step with its run-log row. Returns the rows, in order.

    An exception in a gather or a step is raised after the other one in flight has finished (a step is never
    abandoned half-way: its checkpoint is either written or not)."""
    if not callable(gather):
        raise TypeError(f"gather must be an async function of the step index, got {type(gather).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    config = config or TrainConfig()
    if not isinstance(config, TrainConfig):
        raise TypeError("config must be a ruler_rl.trainer.TrainConfig")
    if on_step is not None and not callable(on_step):
        raise TypeError("on_step must be callable")
    overlap = config.max_off_policy_steps >= 1
    start = await model.get_step()
    rows: list[dict] = []

    async def collect(step: int) -> list:
        groups = gather(step)
        if not inspect.isawaitable(groups):
            raise TypeError("gather(step) must return an awaitable (define it with async def)")
        return list(await groups)

    groups = await collect(start)
    for k in range(start, start + steps):
        last = k == start + steps - 1
        training = asyncio.ensure_future(model.train(groups, config))
        upcoming = asyncio.ensure_future(collect(k + 1)) if overlap and not last else None
        try:
            row = await training
        except BaseException:
            if upcoming is not None:
                await asyncio.gather(upcoming, return_exceptions=True)
            raise
        rows.append(row)
        if on_step is not None:
            result = on_step(row, groups)
            if inspect.isawaitable(result):
                await result
        if not last:
            groups = await upcoming if upcoming is not None else await collect(k + 1)
    return rows
