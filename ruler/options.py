"""Every option of a RULER call, checked once.

`ruler`, `ruler_result` and `ruler_score_group` take the judge and the rubric as arguments and everything
else as keyword options; `RulerOptions.build` turns them into one frozen `RulerOptions` (or raises a clear
error before anything is sent anywhere), and that object is all the rest of the scoring path reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from ruler_rl.cache import CacheLike, open_cache
from ruler_rl.judges import DEFAULT_RUBRIC, JudgeConfigError, RetryPolicy
from ruler_rl.judges.panel import JudgePanel
from ruler_rl.judges.rubrics import get_rubric
from ruler_rl.limits import MAX_PERMUTATIONS, MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS
from ruler_rl.prompt import JudgePrompt, Render, build_prompt
from ruler_rl.providers import default_judge_model
from ruler_rl.trajectory import Limits

MAX_FORMAT_RETRIES = 10


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RulerOptions:
    """How one group is judged. Built by `RulerOptions.build` from a call's arguments; checked on creation.

    judge_model: a litellm model string, or a `JudgePanel` (a list of model strings becomes a mean panel);
        `None`: `default_judge_model()` (`$RULER_JUDGE_MODEL`, else the embedded judge). Stored resolved.
    extra_litellm_params: passed to every judge call (`api_base`, `api_key`, `temperature`, ...); a panel
        member's own `JudgePanel.params` are laid over them. `None`: none.
    rubric: the grading standards: a rubric name (`ruler_rl.judges.RUBRICS`) or its text; a `RubricText` is taken as
        text as it is. Stored resolved to its text.
    tools: the tool schemas shown to the judge once (for `ruler_score_group`: the trajectories' own).
    debug: print each judge answer (rich).
    cache: a path, a cache object with get/set, `False` for none, or `None`/`True` for the default directory
        (`ruler_rl.cache`); `store` holds it opened.
    retry: how transient judge failures are retried (a `RetryPolicy`; `None`: `RetryPolicy()`).
    max_format_retries: how many times (0 to `MAX_FORMAT_RETRIES`) an unusable answer is sent back to the
        judge with its problems stated before `JudgeOutputError` is raised.
    render: "compact" (the default) or "art" (ART's JSON dump of every message), see `ruler_rl.prompt`.
    num_permutations: orderings the group is judged in (1 to `MAX_PERMUTATIONS`), scores averaged by id;
        with `seed` they are deterministic, so a repeat hits the cache.
    max_prompt_tokens: the judge's prompt budget (`MIN_PROMPT_TOKENS` to `MAX_PROMPT_TOKENS`); `None`: the
        judge's context as litellm knows it, else `UNKNOWN_CONTEXT_TOKENS`. Over it, bodies are cut, then the
        group is split (`ruler_rl.budget`).
    limits: caps on the group's size (a `Limits`; default `Limits()`), enforced by the input check.
    """

    judge_model: str | list[str] | JudgePanel | None = None
    extra_litellm_params: dict | None = None
    rubric: str = DEFAULT_RUBRIC
    tools: list[dict] | None = None
    debug: bool = False
    cache: Any = None
    retry: RetryPolicy | None = None
    max_format_retries: int = 2
    render: Render = "compact"
    num_permutations: int = 1
    seed: int = 0
    max_prompt_tokens: int | None = None
    limits: Limits | None = None
    store: CacheLike | None = field(init=False, repr=False, compare=False)  # the cache, opened

    @classmethod
    def build(cls, judge_model: Any = None, extra_litellm_params: Any = None, rubric: Any = DEFAULT_RUBRIC, *,
              caller: str = "ruler", **options: Any) -> RulerOptions:
        """The options of one call; an unknown keyword is a TypeError naming `caller`, as Python's own is."""
        for name in options:
            if name not in KEYWORD_OPTIONS:
                raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
        return cls(judge_model, extra_litellm_params, rubric, **options)

    def __post_init__(self):
        """Raise a clear error for any option that cannot work; store the judge, rubric and retry resolved."""
        judge = default_judge_model() if self.judge_model is None else self.judge_model
        if isinstance(judge, (list, tuple)):
            if not all(isinstance(m, str) for m in judge):
                raise JudgeConfigError("a list of judges must hold litellm model strings")
            judge = JudgePanel(list(judge))
        elif isinstance(judge, str):
            if not judge.strip():
                raise JudgeConfigError("judge_model is an empty string: pass None for the default judge, or a "
                                       "litellm model string")
        elif not isinstance(judge, JudgePanel):
            raise JudgeConfigError("judge_model must be a litellm model string, a list of them, a JudgePanel or "
                                   f"None, got {type(judge).__name__}")
        params = {} if self.extra_litellm_params is None else self.extra_litellm_params
        if not isinstance(params, dict):
            raise JudgeConfigError(f"extra_litellm_params must be a dict, got {type(params).__name__}")
        if not isinstance(self.rubric, str):
            raise JudgeConfigError(f"rubric must be a string (a rubric name or its text), got {type(self.rubric).__name__}")
        tools = self.tools
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise TypeError("tools must be a list of tool schemas (dicts) or None")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if not _is_int(self.max_format_retries) or not 0 <= self.max_format_retries <= MAX_FORMAT_RETRIES:
            raise ValueError(f"max_format_retries must be an integer from 0 to {MAX_FORMAT_RETRIES}, "
                             f"got {self.max_format_retries!r}")
        if self.render not in ("compact", "art"):
            raise ValueError(f"render must be 'compact' or 'art', got {self.render!r}")
        if not _is_int(self.num_permutations) or not 1 <= self.num_permutations <= MAX_PERMUTATIONS:
            raise ValueError(f"num_permutations must be an integer from 1 to {MAX_PERMUTATIONS}, "
                             f"got {self.num_permutations!r}")
        if not _is_int(self.seed):
            raise TypeError(f"seed must be an integer, got {type(self.seed).__name__}")
        tokens = self.max_prompt_tokens
        if tokens is not None and (not _is_int(tokens) or not MIN_PROMPT_TOKENS <= tokens <= MAX_PROMPT_TOKENS):
            raise ValueError(f"max_prompt_tokens must be None or an integer from {MIN_PROMPT_TOKENS} to "
                             f"{MAX_PROMPT_TOKENS:,}, got {tokens!r}")
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise TypeError(f"limits must be a ruler_rl.trajectory.Limits, got {type(self.limits).__name__}")
        resolved = {"judge_model": judge, "extra_litellm_params": dict(params), "rubric": get_rubric(self.rubric),
                    "tools": None if tools is None else list(tools), "retry": self.retry or RetryPolicy(),
                    "store": open_cache(self.cache)}
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    @property
    def judge_name(self) -> str:
        """The judge as the scored group's metadata names it: the model, or the panel's models joined by commas."""
        return ",".join(self.judge_model.models) if isinstance(self.judge_model, JudgePanel) else self.judge_model

    def prompt(self, message_lists: list[list[dict]], order: list[int] | None = None) -> JudgePrompt:
        """The judge prompt for these conversations under these options (`ruler_rl.prompt.build_prompt`)."""
        return build_prompt(message_lists, self.rubric, tools=self.tools, render=self.render, order=order)


class GroupKeywords(TypedDict, total=False):
    """The keyword options of `ruler_score_group`, typed for editors and type checkers (see `RulerOptions`)."""

    cache: Any
    retry: RetryPolicy | None
    max_format_retries: int
    render: Render
    num_permutations: int
    seed: int
    max_prompt_tokens: int | None
    limits: Limits | None


class RulerKeywords(GroupKeywords, total=False):
    """The keyword options of `ruler` and `ruler_result`: those of `ruler_score_group` and the tools shown."""

    tools: list[dict] | None


KEYWORD_OPTIONS = frozenset(f.name for f in fields(RulerOptions) if f.init) - {
    "judge_model", "extra_litellm_params", "rubric"}
"""The keyword options of `ruler`, `ruler_result` and `ruler_score_group` (the judge and rubric are arguments)."""
