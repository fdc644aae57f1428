"""ruler-rl: reward-free RL for LLM agents. RULER scores a group of trajectories relative to each other.

    from ruler_rl import ruler_score_group, Trajectory, TrajectoryGroup, group_advantages

The names here are what scoring and training loops use; everything else is importable from its module:
the errors from `ruler_rl.errors`, `ruler_result` and `RulerResult` from `ruler_rl.scoring`, `RulerOptions` from
`ruler_rl.options`, `Limits` and `validate_trajectories` from `ruler_rl.trajectory`, `score_rows` from
`ruler_rl.results`, `group_has_signal` from `ruler_rl.advantages`, `default_judge_model` from `ruler_rl.providers`.

`import ruler_rl` itself imports none of them (nor litellm or pydantic): each name loads its module on first use
(PEP 562), so the `ruler` command starts without the scoring path.
"""

if __name__ != "ruler_rl":  # one name, so one copy (pyproject's package-dir)
    raise ImportError(f"the folder ruler/ is the package ruler_rl: import ruler_rl, not {__name__} "
                      "(install the checkout with `pip install -e .`, as .ci/setup does)")

import importlib
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # as judges does: no price-table download at import

_NAMES = {
    "JudgePanel": "ruler_rl.judges.panel", "RetryPolicy": "ruler_rl.judges.retry",
    "Trajectory": "ruler_rl.trajectory", "TrajectoryGroup": "ruler_rl.trajectory",
    "TrajectoryScore": "ruler_rl.parse", "gather_trajectory_groups": "ruler_rl.gather",
    "group_advantages": "ruler_rl.advantages", "ruler": "ruler_rl.scoring", "ruler_score_group": "ruler_rl.scoring",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ruler_rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})


__all__ = ["JudgePanel", "RetryPolicy", "Trajectory", "TrajectoryGroup", "TrajectoryScore", "gather_trajectory_groups",
           "group_advantages", "ruler", "ruler_score_group"]
