"""The checks a request passes before anything is judged or queued; each failure is a 422 whose `detail` lists
the problems, each with its `loc` (where in the request) and `msg`, as FastAPI's own validation errors do."""

from __future__ import annotations

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from ruler_rl.judges.errors import JudgeConfigError
from ruler_rl.judges.rubrics import get_rubric
from ruler_rl.messages import MAX_PROBLEMS, TrajectoryError, unknown_field
from ruler_rl.service.config import ServiceConfig
from ruler_rl.service.models import REQUEST_FIELDS, ScoreOptions
from ruler_rl.trajectory import Trajectory, TrajectoryGroup, validate_trajectories

MAX_IDEMPOTENCY_KEY_CHARS = 200


def problem(loc: list, msg: str) -> dict:
    """One entry of a 422's `detail`."""
    return {"loc": list(loc), "msg": msg, "type": "value_error"}


def refuse(loc: list, msg: str) -> HTTPException:
    """A 422 naming one problem at `loc`, to raise."""
    return HTTPException(422, [problem(loc, msg)])


def check_group(cfg: ServiceConfig, trajectories: list[Trajectory], metadata: dict, where: list) -> None:
    """422 naming each problem (trajectory index and field) unless the group passes `validate_trajectories`
    with the service's limits; `where` is the group's place in the request (["body"], ["body", "groups", 3])."""
    if not trajectories:
        raise refuse([*where, "trajectories"], "a group needs at least one trajectory")
    try:
        validate_trajectories(TrajectoryGroup(trajectories, metadata=metadata), limits=cfg.limits)
    except TrajectoryError as exc:
        raise HTTPException(422, [problem([*where, *(("trajectories",) if not p.loc or isinstance(p.loc[0], int)
                                                      else ()), *p.loc], str(p)) for p in exc.problems]) from None


def check_job_size(cfg: ServiceConfig, n_groups: int) -> None:
    """422 unless a job's number of groups is from 1 to `max_groups_per_job`."""
    if n_groups < 1:
        raise refuse(["body", "groups"], "a job needs at least one group")
    if n_groups > cfg.max_groups_per_job:
        raise refuse(["body", "groups"], f"at most {cfg.max_groups_per_job} groups")


def check_idempotency_key(idempotency_key: str | None) -> None:
    """422 if an `Idempotency-Key` header is longer than `MAX_IDEMPOTENCY_KEY_CHARS`."""
    if idempotency_key and len(idempotency_key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise refuse(["header", "idempotency-key"], f"at most {MAX_IDEMPOTENCY_KEY_CHARS} characters")


def resolved_options(cfg: ServiceConfig, rubrics: dict[str, str], body: ScoreOptions) -> dict:
    """The judging options as stored with a job: the judge and rubric resolved (a rubric name looked up in the
    operator's `rubrics`, then the library), every option checked against what the service allows."""
    if body.api_base is not None and not cfg.api_base_allowed(body.api_base):
        raise refuse(["body", "api_base"], f"api_base {body.api_base!r} is not allowed here: the service only calls "
                                           "judge addresses its operator allowed")
    if body.num_permutations > cfg.max_permutations:
        raise refuse(["body", "num_permutations"], f"at most {cfg.max_permutations} orderings here")
    if cfg.max_prompt_tokens and body.max_prompt_tokens and body.max_prompt_tokens > cfg.max_prompt_tokens:
        raise refuse(["body", "max_prompt_tokens"], f"at most {cfg.max_prompt_tokens} here")
    try:
        rubric = get_rubric(body.rubric or "default", library=rubrics)
    except JudgeConfigError as exc:
        raise refuse(["body", "rubric"], str(exc)) from None
    if body.judge_model is not None and not cfg.judge_offered(body.judge_model):
        raise refuse(["body", "judge_model"], f"judge {body.judge_model!r} is not offered here")
    return {"judge_model": body.judge_model or cfg.judge_model, "api_base": body.api_base, "rubric": rubric,
            "rubric_resolved": True, "num_permutations": body.num_permutations,
            "max_prompt_tokens": body.max_prompt_tokens or cfg.max_prompt_tokens}


def validation_detail(exc: RequestValidationError) -> list[dict]:
    """pydantic's errors without the echoed input; unknown fields and bad JSON said in words."""
    out = []
    for e in exc.errors()[:MAX_PROBLEMS]:
        loc = [p for p in e.get("loc", ()) if p not in ("Choice", "dict[str,any]")]
        if e.get("type") == "extra_forbidden":
            msg = unknown_field(str(loc[-1]), REQUEST_FIELDS)
        elif e.get("type") == "json_invalid":
            msg = f"invalid JSON: {(e.get('ctx') or {}).get('error', 'cannot be parsed')}"
        else:
            msg = e.get("msg", "invalid")
        out.append({"loc": loc, "msg": msg, "type": e.get("type", "value_error")})
    return out
