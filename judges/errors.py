"""One exception class per kind of judge failure, under one base (`JudgeError`)."""

from __future__ import annotations


class JudgeError(Exception):
    """Base class for everything that goes wrong while asking a judge for scores."""


class JudgeConfigError(JudgeError, ValueError):
    """The judge was asked for in a way that cannot work (unknown model, bad parameters)."""


class JudgeInputError(JudgeConfigError):
    """What was asked cannot be judged as given (a trajectory too long for the judge's budget, an option the
    judging service does not allow): the message is about the request, never about the judge's setup."""


class JudgeUnavailableError(JudgeError):
    """The judge could not be reached or kept failing (rate limits, 5xx, timeouts) after all retries."""


class JudgeOutputError(JudgeError):
    """The judge answered, but not with a valid score for every trajectory, even after structural retries.

    `problems` lists what was wrong with the last answer; `raw` is that answer's text.
    """

    def __init__(self, message: str, *, problems: list[str] | None = None, raw: str | None = None):
        super().__init__(message)
        self.problems = problems or []
        self.raw = raw
