"""What the operator configures (`ServiceConfig`) and what of it a client's judging options may use.

`checked_options` checks a job's stored options against the service as it is configured now; the endpoints
check a request's options before it is judged or queued (`ruler_rl.service.validation`), with the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ruler_rl.judges.errors import JudgeConfigError, JudgeInputError
from ruler_rl.judges.rubrics import MAX_RUBRIC_CHARS, RUBRICS, RubricText
from ruler_rl.scoring import MAX_PERMUTATIONS, MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS
from ruler_rl.trajectory import Limits


@dataclass
class ServiceConfig:
    """Everything `ruler serve` can set. Limits answer 413/422/429 with the offending field named."""

    db_path: str = "ruler-service.db"
    judge_model: str | None = None            # default judge (None: $RULER_JUDGE_MODEL or the embedded one)
    judge_params: dict = field(default_factory=dict)  # api_base, api_key, ... for the judge (never from clients)
    allowed_judges: list[str] | None = None   # judge models clients may ask for; None: only the default
    allowed_api_bases: list[str] = field(default_factory=list)  # api_base values clients may send; none by default
    rubric_dir: str | None = None             # the operator's named rubrics (<name>.txt|.md), read once at start
    max_body_bytes: int = 8 * 1024 * 1024     # counted as the bytes arrive, chunked bodies included
    max_trajectories: int = 256
    max_messages: int = 512                   # per conversation
    max_message_chars: int = 200_000          # per message (text, tool-call arguments, other fields)
    max_json_depth: int = 32                  # nesting inside a message or a tool schema
    max_groups_per_job: int = 1000
    max_permutations: int = 8                 # the most orderings (k) a request may ask for
    max_prompt_tokens: int | None = None      # ceiling on any judge prompt (None: the judge's context)
    rate_per_minute: int = 600                # requests per key per minute
    max_inflight_per_key: int = 32            # concurrent /v1/score requests per key
    judge_timeout_s: float = 600.0            # one group's judging; past it the group is an error result
    judge_retries: int = 4                    # retries of one judge call on 429/5xx/timeouts, within the above
    body_timeout_s: float = 60.0              # the whole request body must arrive within this of its headers: 408
    worker_concurrency: int = 8
    max_group_attempts: int = 3               # a job group whose judge stays unavailable is tried this often
    group_retry_s: float = 5.0                # wait before a group's 2nd attempt; doubles each time, <= 300 s
    metrics_require_key: bool = False
    cache: object = None                      # passed to ruler_score_group (None: default judge cache)

    def __post_init__(self):
        def check(name: str, low: float, high: float | None = None, integer: bool = True):
            value = getattr(self, name)
            ok = (isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
            if not ok or not (low <= value and (high is None or value <= high)):
                bound = f"from {low} to {high}" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} {bound}, got {value!r}")

        for name in ("max_body_bytes", "max_trajectories", "max_messages", "max_message_chars", "max_json_depth",
                     "max_groups_per_job", "rate_per_minute", "max_inflight_per_key", "worker_concurrency"):
            check(name, 1)
        check("max_permutations", 1, MAX_PERMUTATIONS)
        check("judge_retries", 0, 19)
        check("max_group_attempts", 1, 100)
        for name in ("judge_timeout_s", "body_timeout_s", "group_retry_s"):
            check(name, 0.001, integer=False)
        if self.max_prompt_tokens is not None:
            check("max_prompt_tokens", MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
        if not isinstance(self.judge_params, dict):
            raise TypeError("judge_params must be a dict")

    @property
    def limits(self) -> Limits:
        """The trajectory limits every group passes (`validate_trajectories`) before it is judged or queued."""
        return Limits(max_trajectories=self.max_trajectories, max_messages=self.max_messages,
                      max_message_chars=self.max_message_chars, max_depth=self.max_json_depth)

    def judge_offered(self, judge_model: str | None) -> bool:
        """Whether clients may ask for `judge_model` (None: the default judge, always offered)."""
        return judge_model is None or judge_model == self.judge_model or judge_model in (self.allowed_judges or ())

    def api_base_allowed(self, api_base: str) -> bool:
        """Whether clients may send `api_base`: one of `allowed_api_bases`, a trailing slash aside."""
        if not isinstance(api_base, str):
            raise TypeError(f"api_base must be a string, got {type(api_base).__name__}")
        return api_base.rstrip("/") in {a.rstrip("/") for a in self.allowed_api_bases}


def checked_options(cfg: ServiceConfig, options: dict) -> dict:
    """A job's stored options checked again against the service as it is configured now (a job stored by an
    older process, or before the operator narrowed what clients may choose): the judge, api_base,
    num_permutations and max_prompt_tokens must still be allowed. JudgeInputError names the first that is not.
    The rubric is the text the endpoint resolved (`rubric_resolved`), never looked up again; a job stored
    before rubrics were resolved may hold a built-in name, which is looked up."""
    if not isinstance(options, dict):
        raise JudgeConfigError("the job's stored options are not an object")
    judge = options.get("judge_model")
    if not cfg.judge_offered(judge):
        raise JudgeInputError(f"judge {judge!r} is not offered here")
    api_base = options.get("api_base")
    if api_base is not None and (not isinstance(api_base, str) or not cfg.api_base_allowed(api_base)):
        raise JudgeInputError(f"api_base {api_base!r} is not allowed here")
    k = options.get("num_permutations") or 1
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= cfg.max_permutations:
        raise JudgeInputError(f"num_permutations {k!r}: at most {cfg.max_permutations} orderings here")
    tokens = options.get("max_prompt_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or not MIN_PROMPT_TOKENS <= tokens <= (cfg.max_prompt_tokens or MAX_PROMPT_TOKENS)):
        raise JudgeInputError(f"max_prompt_tokens {tokens!r}: from {MIN_PROMPT_TOKENS} to "
                               f"{cfg.max_prompt_tokens or MAX_PROMPT_TOKENS} here")
    rubric = options.get("rubric") or "default"
    if not isinstance(rubric, str) or len(rubric) > MAX_RUBRIC_CHARS:
        raise JudgeConfigError("the job's stored rubric is not rubric text")
    text = rubric if options.get("rubric_resolved") else RUBRICS.get(rubric, rubric)
    return {"judge_model": judge, "api_base": api_base, "rubric": RubricText(text), "num_permutations": k,
            "max_prompt_tokens": tokens}
