"""ruler-rl: reward-free RL for LLM agents. RULER scores a group of trajectories relative to each other.

    from ruler import ruler_score_group, Trajectory, TrajectoryGroup, group_advantages

The names here are what scoring and training loops use; everything else is importable from its module:
the errors from `ruler.errors`, `ruler_result` and `RulerResult` from `ruler.scoring`, `RulerOptions` from
`ruler.options`, `Limits` and `validate_trajectories` from `ruler.trajectory`, `score_rows` from
`ruler.results`, `group_has_signal` from `ruler.advantages`, `default_judge_model` from `ruler.providers`.
"""

from judges import RetryPolicy  # importing judges also registers the local/ and vllm-engine/ judges with litellm
from judges.panel import JudgePanel
from ruler.advantages import group_advantages
from ruler.gather import gather_trajectory_groups
from ruler.parse import TrajectoryScore
from ruler.scoring import ruler, ruler_score_group
from ruler.trajectory import Trajectory, TrajectoryGroup

__all__ = ["JudgePanel", "RetryPolicy", "Trajectory", "TrajectoryGroup", "TrajectoryScore", "gather_trajectory_groups",
           "group_advantages", "ruler", "ruler_score_group"]
