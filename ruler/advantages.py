"""Group advantages for GRPO: how much better each rollout did than its siblings.

    A_i = (r_i - mean(r)) / (std(r) + eps)      (scale=True; population std, as in GRPO)
    A_i =  r_i - mean(r)                         (scale=False; Dr. GRPO)

A group whose rewards are all equal carries no learning signal: its advantages are all zero and
`group_has_signal` is False for it, so trainers can drop it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

log = logging.getLogger("ruler")
EPS = 1e-6


def _check(rewards: Sequence[float]) -> list[float]:
    if isinstance(rewards, (str, bytes)):
        raise TypeError("rewards must be a sequence of numbers")
    values = []
    for i, r in enumerate(rewards):
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise TypeError(f"reward {i} is {r!r}, not a number")
        if math.isnan(r) or math.isinf(r):
            raise ValueError(f"reward {i} is {r}; rewards must be finite")
        values.append(float(r))
    return values


def group_has_signal(rewards: Sequence[float], eps: float = EPS) -> bool:
    """True when the rewards differ, i.e. the group can teach the policy something."""
    values = _check(rewards)
    return len(values) > 1 and max(values) - min(values) > eps


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = EPS) -> list[float]:
    """Reward minus the group mean, divided by the group std (+eps) when `scale`."""
    values = _check(rewards)
    if not values:
        return []
    if not group_has_signal(values, eps):
        log.info("group of %d rewards all equal to %.4g: no signal, advantages are zero", len(values), values[0])
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    centered = [v - mean for v in values]
    if not scale:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(values))
    return [c / (std + eps) for c in centered]
