"""Every error RULER raises on purpose, importable from one place.

    JudgeError                  anything that went wrong while asking a judge for scores
        JudgeConfigError        the judge was asked for in a way that cannot work (also a ValueError)
            JudgeInputError     what was asked cannot be judged as given (a group too long for the budget)
        JudgeUnavailableError   the judge could not be reached or kept failing after all retries
        JudgeOutputError        the judge never gave a valid score for every trajectory (`problems`, `raw`)
    TrajectoryError             the input is not a valid group (a ValueError naming trajectory and field)
    TooManyExceptions           `gather_trajectory_groups`: more rollouts raised than `max_exceptions` allows
"""

from ruler_rl.judges.errors import (
    JudgeConfigError,
    JudgeError,
    JudgeInputError,
    JudgeOutputError,
    JudgeUnavailableError,
)
from ruler_rl.messages import TrajectoryError


class TooManyExceptions(RuntimeError):
    """More rollouts raised than `gather_trajectory_groups(max_exceptions=...)` allows."""


__all__ = ["JudgeConfigError", "JudgeError", "JudgeInputError", "JudgeOutputError", "JudgeUnavailableError",
           "TooManyExceptions", "TrajectoryError"]
