"""How transient judge failures are retried (`RetryPolicy`); `ruler_rl.judges.completion` does the retrying. Imports no
litellm, so a policy can be built, and the command line can show its bounds, without loading a judge client."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ruler_rl.judges.errors import JudgeConfigError

MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class RetryPolicy:
    """How transient judge failures are retried.

    attempts: total tries per call (1 = no retry; at most `MAX_ATTEMPTS`). initial/max_wait: backoff
    bounds in seconds. max_retry_after: the longest `Retry-After` we will honour (longer ones are capped).
    timeout: seconds one HTTP attempt may take. deadline: seconds one judge call may take in all,
    attempts and waits included; past it the call fails with `JudgeUnavailableError` (a judge that
    accepts connections and never answers costs at most `deadline`, not `attempts * timeout`).
    """

    attempts: int = 5
    initial_wait: float = 0.5
    max_wait: float = 30.0
    max_retry_after: float = 60.0
    timeout: float = 300.0
    deadline: float = 600.0

    def __post_init__(self):
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise JudgeConfigError(f"RetryPolicy.attempts must be an integer from 1 to {MAX_ATTEMPTS}, got {self.attempts!r}")
        for name in ("initial_wait", "max_wait", "max_retry_after", "timeout", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise JudgeConfigError(f"RetryPolicy.{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.timeout <= 0 or self.deadline <= 0:
            raise JudgeConfigError("RetryPolicy.timeout and RetryPolicy.deadline must be > 0")
