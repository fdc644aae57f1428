"""The service's request and response bodies as pydantic models: the OpenAPI contract at /docs, and what
`ruler_rl.client` reads (a score answer's `group` is what `ruler_score_group` returns, as JSON)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ruler_rl.judges.rubrics import MAX_RUBRIC_CHARS
from ruler_rl.results import ScoreRow
from ruler_rl.scoring import MAX_PERMUTATIONS, MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS
from ruler_rl.trajectory import History, MetadataValue, Trajectory

# --- requests ------------------------------------------------------------------------------------


class GroupIn(BaseModel):
    """One group of a job: its trajectories and the group's metadata."""

    model_config = ConfigDict(extra="forbid")
    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = {}


class ScoreOptions(BaseModel):
    """How to judge: the options a score request and a job share."""

    model_config = ConfigDict(extra="forbid")
    judge_model: str | None = Field(None, min_length=1, max_length=256,
                                    description="A judge the service offers; default: its own.")
    api_base: str | None = Field(None, min_length=1, max_length=2048,
                                 description="Only one of the addresses the operator allowed (--allow-api-base).")
    rubric: str | None = Field(None, min_length=1, max_length=MAX_RUBRIC_CHARS,
                               description="A rubric name or the rubric text; never a path.")
    num_permutations: int = Field(1, ge=1, le=MAX_PERMUTATIONS, strict=True)
    max_prompt_tokens: int | None = Field(None, ge=MIN_PROMPT_TOKENS, le=MAX_PROMPT_TOKENS, strict=True)


class ScoreRequest(ScoreOptions):
    """POST /v1/score: one group, judged now."""

    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = {}


class JobRequest(ScoreOptions):
    """POST /v1/jobs: many groups, judged in the background with the same options."""

    groups: list[GroupIn]


REQUEST_FIELDS = frozenset({*ScoreRequest.model_fields, *JobRequest.model_fields, *GroupIn.model_fields,
                            *Trajectory.model_fields, *History.model_fields})
"""Every field name a request may hold: what an unknown field is compared with (`did you mean ...?`)."""

# --- responses -----------------------------------------------------------------------------------

GroupStatus = Literal["pending", "running", "done", "error", "cancelled"]
JobState = Literal["pending", "running", "done", "cancelled"]


class Usage(BaseModel):
    """What judging the group took (None where the judge did not say)."""

    judge_calls: int | None = None
    judge_prompt_tokens: int | None = None
    judge_completion_tokens: int | None = None
    judge_cost: float | None = None


class ScoreResponse(BaseModel):
    """One judged group: a row per trajectory, the scored group itself, usage, cache hit, the judge used."""

    scores: list[ScoreRow]
    group: dict[str, Any] = Field(description="The scored TrajectoryGroup as JSON, as ruler_score_group returns it.")
    usage: Usage
    cached: bool
    judge_model: str
    notes: list[str] = Field(default_factory=list, description="What was done to judge the group (cuts, splits, "
                             "a panel member's failure, ...), as `ruler_rl.results.score_notes` reads them.")


class JobCreated(BaseModel):
    """A job accepted (202): every group is stored before this answer is sent."""

    job_id: str
    status: Literal["pending"] = "pending"
    groups: int


class GroupResult(BaseModel):
    """One group of a job: its result once `done`, its error (and, while it waits for a retry, the last one)."""

    index: int
    status: GroupStatus
    attempts: int
    result: ScoreResponse | None
    error: str | None


class JobStatus(BaseModel):
    """A job: its state, how many groups it has and how many have ended, each group's result so far."""

    job_id: str
    status: JobState
    groups: int
    done: int = Field(description="Groups that ended: done, error or cancelled.")
    results: list[GroupResult]


class Cancelled(BaseModel):
    """DELETE /v1/jobs/{id}: whether this call cancelled the job (false: it had already ended)."""

    job_id: str
    cancelled: bool


class Health(BaseModel):
    """GET /healthz: `ok` while the database answers and the worker runs; otherwise `error` and which failed."""

    status: Literal["ok", "error"]
    queue_depth: int | None = None
    database: Literal["unavailable"] | None = None
    worker: Literal["running", "failing", "stopped"]
    error: str | None = Field(None, description="While the worker fails: the type of the error its passes raise.")
    failing_for_s: float | None = None
