"""ruler-rl: reward-free RL for LLM agents. RULER scores a group of trajectories relative to each other.

    from ruler import ruler_score_group, Trajectory, TrajectoryGroup, group_advantages
"""

from judges import DEFAULT_RUBRIC, EMBEDDED_JUDGE, RetryPolicy  # also registers local/... with litellm
from judges.panel import JudgePanel
from judges.errors import JudgeConfigError, JudgeError, JudgeInputError, JudgeOutputError, JudgeUnavailableError
from ruler.advantages import group_advantages, group_has_signal
from ruler.parse import TrajectoryScore
from ruler.scoring import RulerResult, default_judge_model, ruler, ruler_score_group, score_group_messages
from ruler.trajectory import (History, Limits, PydanticException, Trajectory, TrajectoryError, TrajectoryGroup,
                              convert_litellm_choice_to_openai, validate_trajectories)

__all__ = [
    "DEFAULT_RUBRIC", "EMBEDDED_JUDGE", "History", "JudgeConfigError", "JudgeError", "JudgeInputError", "JudgeOutputError",
    "JudgePanel",
    "JudgeUnavailableError", "Limits", "PydanticException", "RetryPolicy", "RulerResult", "Trajectory",
    "TrajectoryError", "TrajectoryGroup", "TrajectoryScore", "convert_litellm_choice_to_openai",
    "default_judge_model", "group_advantages",
    "group_has_signal", "ruler", "ruler_score_group", "score_group_messages", "validate_trajectories",
]
