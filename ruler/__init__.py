"""ruler-rl: reward-free RL for LLM agents. RULER scores a group of trajectories relative to each other.

    from ruler import ruler_score_group, Trajectory, TrajectoryGroup, group_advantages

The names here are what scoring and training loops use; everything else is importable from its module:
the errors from `ruler.errors`, `ruler_result` and `RulerResult` from `ruler.scoring`, `RulerOptions` from
`ruler.options`, `Limits` and `validate_trajectories` from `ruler.trajectory`, `score_rows` from
`ruler.results`, `group_has_signal` from `ruler.advantages`, `default_judge_model` from `ruler.providers`.

`import ruler` itself imports none of them (nor litellm or pydantic): each name loads its module on first use
(PEP 562), so the `ruler` command starts without the scoring path.
"""

import importlib
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # as judges does: no price-table download at import

_NAMES = {
    "JudgePanel": "judges.panel", "RetryPolicy": "judges.retry", "Trajectory": "ruler.trajectory",
    "TrajectoryGroup": "ruler.trajectory", "TrajectoryScore": "ruler.parse",
    "gather_trajectory_groups": "ruler.gather", "group_advantages": "ruler.advantages", "ruler": "ruler.scoring",
    "ruler_score_group": "ruler.scoring",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ruler' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})


__all__ = ["JudgePanel", "RetryPolicy", "Trajectory", "TrajectoryGroup", "TrajectoryScore", "gather_trajectory_groups",
           "group_advantages", "ruler", "ruler_score_group"]
