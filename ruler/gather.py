"""`gather_trajectory_groups`, with ART's semantics: run every group's rollouts concurrently, count the
rollouts that raised, let `after_each` rescore a finished group (e.g. `ruler_score_group`) or drop it
(return None), and show a progress bar."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

from tqdm.auto import tqdm

from ruler_rl import tracing
from ruler_rl.errors import TooManyExceptions
from ruler_rl.trajectory import TrajectoryGroup

log = logging.getLogger("ruler")


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup] | TrajectoryGroup],
    *,
    after_each: Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None] | TrajectoryGroup | None] | None = None,
    max_exceptions: int | float = 0,
    pbar_desc: str | None = "gather",
) -> list[TrajectoryGroup]:
    """The finished groups, in the order given (groups dropped by `after_each` left out). A group whose every
    rollout raised is kept empty, with its exceptions, without calling `after_each` (`ruler_score_group` refuses
    an empty group; training skips it).

    `max_exceptions`: how many rollouts may raise (an int) or what fraction of them (a float < 1) before
    the whole gather fails with TooManyExceptions, whose message carries the first exception and its traceback;
    rollouts that raised are kept in `group.exceptions`.
    Tracing (`ruler_rl.tracing`) configured without the `langfuse` package raises `MissingExtraError` before any
    rollout runs.
    """
    items = list(groups)
    if isinstance(max_exceptions, bool) or not isinstance(max_exceptions, (int, float)) or max_exceptions < 0:
        raise ValueError("max_exceptions must be a count >= 0 or a fraction in [0, 1)")
    for i, g in enumerate(items):
        if not (isinstance(g, TrajectoryGroup) or inspect.isawaitable(g)):
            raise TypeError(f"group {i} is a {type(g).__name__}: pass TrajectoryGroup(...) objects")
    # resolved once, before any rollout runs: a tracing misconfiguration (MissingExtraError: langfuse not installed)
    # is raised now, not after the first group's rollouts finished
    tracer = tracing.current_tracer()
    bar = tqdm(total=len(items), desc=pbar_desc, unit="group", disable=pbar_desc is None)
    state = {"exceptions": 0, "trajectories": 0, "first": None}

    async def one(g) -> TrajectoryGroup | None:
        group = g if isinstance(g, TrajectoryGroup) else await g
        state["exceptions"] += len(group.exceptions)
        if group.exceptions and state["first"] is None:
            state["first"] = group.exceptions[0]
        state["trajectories"] += len(group) + len(group.exceptions)
        tracing.rollouts_gathered(tracer, group)  # ids and rollout traces, when tracing is on; never raises
        if after_each is not None and len(group) > 0:  # a group whose every rollout raised has nothing to score
            result = after_each(group)
            group = await result if inspect.isawaitable(result) else result
        bar.update(1)
        bar.set_postfix(exceptions=state["exceptions"])
        return group

    try:
        results = await asyncio.gather(*(one(g) for g in items))
    finally:
        bar.close()
    limit = max_exceptions if isinstance(max_exceptions, int) or max_exceptions >= 1 \
        else max_exceptions * max(1, state["trajectories"])
    if state["exceptions"] > limit:
        first = state["first"]
        raise TooManyExceptions(f"{state['exceptions']} of {state['trajectories']} rollouts raised "
                                f"(max_exceptions={max_exceptions}); the first: {first.type}: {first.message}\n"
                                f"{first.traceback}")
    kept = [g for g in results if g is not None]
    if len(kept) < len(results):
        log.info("after_each dropped %d of %d groups", len(results) - len(kept), len(results))
    return kept
