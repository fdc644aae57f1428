"""The data model: `Trajectory` and `TrajectoryGroup`, with OpenPipe ART's fields and meaning.

A trajectory is one rollout: `messages_and_choices` holds OpenAI-format message dicts (what the
environment said) and `Choice` objects (what the model generated, which the trainer learns from).
A group is the set of rollouts for one scenario that RULER scores relative to each other.
Groups load and save as JSON (one object, or a bare list) or JSONL (one trajectory per line).

`validate_trajectories` is the one check every surface runs before judging or training (the library's
`ruler_score_group`, the command line, the judging service and its job worker, the trainer): finite
rewards, metrics and metadata, the trajectory id, tool schemas, the caps in `Limits`, and each message
through `ruler_rl.messages` (shapes, tool calls, tool messages, unknown fields). Unknown fields are rejected,
never dropped: on a trajectory (`Trajectory` forbids extra fields, except ART's own bookkeeping fields,
which are accepted and ignored) and on a message dict. Extra fields on a `Choice` (an inference server's
`token_ids`, `prompt_token_ids`, logprobs, ...) are the server's business and pass untouched (only nesting
past `Limits.max_depth` is refused).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import traceback
from collections.abc import Awaitable, Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import pydantic
from openai.types.chat.chat_completion import Choice

from ruler_rl.limits import Limits
from ruler_rl.messages import (
    MAX_PROBLEMS,
    Problem,
    TrajectoryError,
    conversation_problems,
    json_path,
    unknown_field,
    walk_json,
)
from ruler_rl.trajectory_ids import TRAJECTORY_ID_KEY

MetadataValue = Union[float, int, str, bool, None]
MessageOrChoice = Union[Choice, dict[str, Any]]


class PydanticException(pydantic.BaseModel):
    """An exception raised by a rollout, kept on its group (type, message, traceback)."""

    type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, exc: BaseException) -> "PydanticException":
        return cls(
            type=str(type(exc)),
            message=str(exc),
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )


class History(pydantic.BaseModel):
    """A further conversation of the same rollout (ART's `additional_histories`)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    messages_and_choices: list[MessageOrChoice]
    tools: list[dict[str, Any]] | None = None

    @pydantic.field_validator("messages_and_choices", mode="before")
    @classmethod
    def _accept_litellm_choices(cls, items: Any) -> Any:
        return _openai_choices(items)


def choice_to_message(choice: Choice) -> dict[str, Any]:
    """An assistant message dict with the content, tool calls and (when the server parsed some) reasoning of
    a generated `Choice`. Reasoning goes back as `reasoning`, which vLLM hands to chat templates that show
    it (Qwen3 keeps the think block of turns after the last user message), so the next prompt extends this
    turn exactly."""
    msg = choice.message
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in msg.tool_calls]
    extra = msg.model_extra or {}
    nested = extra.get("provider_specific_fields") if isinstance(extra.get("provider_specific_fields"), dict) else {}
    reasoning = extra.get("reasoning") or extra.get("reasoning_content") or nested.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning"] = reasoning
    return out


def _openai_choices(items: Any) -> Any:
    """litellm response choices in a conversation become OpenAI `Choice`s (their server fields kept)."""
    if not isinstance(items, list):
        return items
    return [convert_litellm_choice_to_openai(i) if not isinstance(i, (dict, Choice)) and hasattr(i, "message")
            and hasattr(i, "finish_reason") and hasattr(i, "model_dump") else i for i in items]


def convert_litellm_choice_to_openai(choice: Any) -> Choice:
    """An OpenAI `Choice` from a litellm response choice, keeping what the server sent beside the standard
    fields (`prompt_token_ids`, `token_ids`, `token_logprobs`, `policy_step`, `constrained`, `aborted`, which
    litellm keeps in `provider_specific_fields`): training needs them. Same name and use as ART's helper."""
    if isinstance(choice, Choice):
        return choice
    if not hasattr(choice, "model_dump") or not hasattr(choice, "message"):
        raise TypeError(f"expected a litellm or OpenAI choice, got {type(choice).__name__}")
    data = choice.model_dump()
    nested = data.get("provider_specific_fields") or {}
    for key in ("prompt_token_ids", "token_ids", "token_logprobs", "policy_step", "constrained", "aborted"):
        if data.get(key) is None and isinstance(nested, dict) and nested.get(key) is not None:
            data[key] = nested[key]
    return Choice.model_validate(data)


ART_ONLY_FIELDS = ("initial_policy_version", "final_policy_version", "auto_metrics", "start_time")
"""Fields OpenPipe ART writes on a trajectory that mean nothing here: accepted and ignored, so ART's files load."""


class Trajectory(pydantic.BaseModel):
    """One rollout: messages and generated choices, tools offered, reward, metrics, metadata, logs.

    Unknown fields are an error (`tool` for `tools` is caught, not dropped); ART's bookkeeping fields
    (`ART_ONLY_FIELDS`) are accepted and ignored.
    """

    model_config = pydantic.ConfigDict(extra="forbid")

    messages_and_choices: list[MessageOrChoice]
    tools: list[dict[str, Any]] | None = None
    additional_histories: list[History] = []
    reward: float = 0.0
    metrics: dict[str, float | int | bool] = {}
    metadata: dict[str, MetadataValue] = {}
    logs: list[str] = []

    @pydantic.field_validator("messages_and_choices", mode="before")
    @classmethod
    def _accept_litellm_choices(cls, items: Any) -> Any:
        return _openai_choices(items)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _ignore_art_only_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(k in data for k in ART_ONLY_FIELDS):
            data = {k: v for k, v in data.items() if k not in ART_ONLY_FIELDS}
        return data

    def __str__(self) -> str:
        return f"Trajectory(reward={self.reward}, metrics={self.metrics}, metadata={self.metadata})"

    def messages(self) -> list[dict[str, Any]]:
        """The conversation as plain OpenAI message dicts (choices become assistant messages)."""
        return [choice_to_message(m) if isinstance(m, Choice) else m for m in self.messages_and_choices]

    def log(self, message: str) -> None:
        self.logs.append(message)

    def for_logging(self) -> dict[str, Any]:
        return {
            "reward": self.reward, "metrics": self.metrics, "metadata": self.metadata, "logs": self.logs,
            "messages": [
                {**(choice_to_message(m) if isinstance(m, Choice) else m), "trainable": isinstance(m, Choice)}
                for m in self.messages_and_choices
            ],
        }


class TrajectoryGroup(pydantic.BaseModel):
    """Rollouts of one scenario. Built from trajectories, or awaited when built from awaitables.

    `TrajectoryGroup([t1, t2])` is a group; `await TrajectoryGroup(rollout(...) for _ in range(4))` runs
    the rollouts concurrently and keeps those that raised in `exceptions` (as ART does).
    """

    model_config = pydantic.ConfigDict(extra="forbid")

    trajectories: list[Trajectory]
    metadata: dict[str, MetadataValue] = {}
    exceptions: list[PydanticException] = []

    def __new__(cls, trajectories: Iterable[Any] = (), **kwargs):
        items = list(trajectories) if not isinstance(trajectories, (str, bytes, dict)) else trajectories
        if isinstance(items, list) and any(inspect.isawaitable(t) for t in items):
            return _gather_group(cls, items, kwargs.get("metadata") or {}, list(kwargs.get("exceptions") or []))
        return super().__new__(cls)

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | dict] = (),
        *,
        metadata: dict[str, MetadataValue] | None = None,
        exceptions: list[BaseException | PydanticException | dict] | None = None,
    ) -> None:
        if isinstance(trajectories, (str, bytes, dict)):
            raise TypeError("TrajectoryGroup takes an iterable of Trajectory objects")
        items = list(trajectories)
        kept = [t for t in items if not isinstance(t, BaseException)]
        raised = [t for t in items if isinstance(t, BaseException)] + list(exceptions or [])
        super().__init__(
            trajectories=kept,
            metadata=metadata or {},
            exceptions=[PydanticException.from_exception(e) if isinstance(e, BaseException) else e for e in raised],
        )

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    # --- files -------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the group as JSON (`.json`) or one trajectory per line (`.jsonl`)."""
        path = Path(path)
        if path.suffix == ".jsonl":
            text = "".join(t.model_dump_json() + "\n" for t in self.trajectories)
        else:
            text = self.model_dump_json(indent=2)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "TrajectoryGroup":
        """Read a group from JSON or JSONL (see `group_from_data` for the accepted shapes)."""
        path = Path(path)
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a group file")
        if not path.is_file():
            raise FileNotFoundError(f"no such group file: {path}")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path} is not valid UTF-8 (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
        if path.suffix == ".jsonl":
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{n}: not valid JSON: {exc.msg}") from None
                    except RecursionError:
                        raise ValueError(f"{path}:{n}: JSON nested too deeply to read") from None
            return group_from_data(rows, source=str(path))
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        except RecursionError:
            raise ValueError(f"{path}: JSON nested too deeply to read") from None
        return group_from_data(data, source=str(path))


def group_from_data(data: Any, *, source: str = "input") -> TrajectoryGroup:
    """A group from parsed JSON: a group object, a list of trajectory objects, or a list of message lists."""
    if isinstance(data, dict) and "trajectories" in data:
        unknown = [k for k in data if k not in TrajectoryGroup.model_fields]
        if unknown:
            raise ValueError(f"{source}: {unknown_field(unknown[0], TrajectoryGroup.model_fields)} in the group object")
        items, meta = data["trajectories"], data.get("metadata") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"{source}: the group's 'metadata' must be an object")
    elif isinstance(data, list):
        items, meta = data, {}
    else:
        raise ValueError(f"{source}: expected a group object with 'trajectories' or a list of trajectories")
    if not isinstance(items, list):
        raise ValueError(f"{source}: 'trajectories' must be a list")
    trajectories = []
    for i, item in enumerate(items, 1):
        if isinstance(item, list):
            item = {"messages_and_choices": item}
        if not isinstance(item, dict):
            raise ValueError(f"{source}: trajectory {i} must be an object or a list of messages, got {type(item).__name__}")
        try:
            trajectories.append(Trajectory.model_validate(item))
        except pydantic.ValidationError as exc:
            raise ValueError(f"{source}: {pydantic_problems(exc, (i - 1,))[0]}") from None
    try:
        return TrajectoryGroup(trajectories, metadata=meta)
    except pydantic.ValidationError as exc:
        raise ValueError(f"{source}: the group's {pydantic_problems(exc)[0]}") from None


def _gather_group(cls, items: list, metadata: dict, exceptions: list) -> Awaitable[TrajectoryGroup]:
    async def gather() -> TrajectoryGroup:
        async def settle(item):
            if not inspect.isawaitable(item):
                return item
            try:
                return await item
            except Exception as exc:  # a failed rollout is kept, not raised
                return exc

        results = await asyncio.gather(*(settle(i) for i in items))
        return cls(results, metadata=metadata, exceptions=exceptions)

    return gather()


def pydantic_problems(exc: pydantic.ValidationError, prefix: tuple[str | int, ...] = ()) -> list[Problem]:
    """A pydantic error as problems; an extra field reads "unknown field 'x' (did you mean 'y'?)"."""
    known = {*Trajectory.model_fields, *History.model_fields, *TrajectoryGroup.model_fields}
    out = []
    for e in exc.errors(include_url=False)[:MAX_PROBLEMS]:
        loc = tuple(p for p in e["loc"] if p not in ("Choice", "dict[str,any]"))
        if e["type"] == "extra_forbidden":
            msg = unknown_field(str(loc[-1]), known)
        else:
            msg = f"{json_path(loc) or 'value'}: {e['msg']}"
        out.append(Problem((*prefix, *loc), msg))
    return out or [Problem(prefix, str(exc))]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_values(values: Any, loc: tuple, what: str, problems: list[Problem]) -> None:
    for key, value in (values or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(Problem((*loc, key), f"{what}[{key!r}] is {value}: {what} values must be finite"))


def _trajectory_id_problems(metadata: dict, i: int, problems: list[Problem]) -> None:
    """A trajectory id the user (or a recorder) set must be a non-empty string (`ruler_rl.tracing`)."""
    value = metadata.get(TRAJECTORY_ID_KEY)
    if value is not None and not (isinstance(value, str) and value.strip()):
        problems.append(Problem((i, "metadata", TRAJECTORY_ID_KEY),
                                f"metadata[{TRAJECTORY_ID_KEY!r}] is {value!r}: the trajectory's id must be a "
                                "non-empty string (or absent, to get a fresh one)"))


def _trajectory_problems(t: Any, i: int, limits: Limits, problems: list[Problem]) -> None:
    if not isinstance(t, Trajectory):
        problems.append(Problem((i,), f"expected a Trajectory, got {type(t).__name__}"))
        return
    if not _is_number(t.reward) or not math.isfinite(t.reward):
        problems.append(Problem((i, "reward"), f"reward is {t.reward!r}: rewards must be finite numbers"))
    _finite_values(t.metrics, (i, "metrics"), "metrics", problems)
    _finite_values(t.metadata, (i, "metadata"), "metadata", problems)
    _trajectory_id_problems(t.metadata, i, problems)
    if t.tools is not None:
        for k, tool in enumerate(t.tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if fn is not None and (not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]):
                problems.append(Problem((i, "tools", k, "function", "name"), f"tools[{k}].function.name is missing"))
            walk_json(tool, (i, "tools", k), limits, problems)
    conversation_problems(t.messages_and_choices, (i, "messages_and_choices"), limits, problems)
    for h, history in enumerate(t.additional_histories):
        conversation_problems(history.messages_and_choices,
                              (i, "additional_histories", h, "messages_and_choices"), limits, problems)


def validate_trajectories(trajectories: TrajectoryGroup | Iterable[Trajectory], *,
                          limits: Limits | None = None) -> None:
    """Raise `TrajectoryError` naming every problem (trajectory index and field) in a group; else return.

    The one check shared by the library, the command line, the judging service, its job worker and the
    trainer. Checks: each item is a `Trajectory` with at least one message and at most
    `limits.max_messages`; every message is a `Choice` (the policy's output: only its size and nesting depth
    are checked, its extra fields pass untouched) or a dict with a known role, only known fields
    (`ruler_rl.messages.MESSAGE_FIELDS`), content that is a string or a list of parts (required except on assistant
    messages), tool calls as a list of objects each naming its function (assistant messages only),
    a `tool_call_id` on tool messages, at most `limits.max_message_chars` characters and JSON nested at
    most `limits.max_depth` deep; rewards, metrics and metadata are finite; a trajectory id in
    `metadata["ruler_trajectory_id"]` (`ruler_rl.tracing`) is a non-empty string; at most
    `limits.max_trajectories` trajectories. An empty group passes (callers decide whether it may be empty).
    """
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ruler_rl.trajectory.Limits, got {type(limits).__name__}")
    limits = limits or Limits()
    if isinstance(trajectories, (str, bytes, dict)):
        raise TypeError(f"expected trajectories or a TrajectoryGroup, got {type(trajectories).__name__}")
    items = list(trajectories.trajectories if isinstance(trajectories, TrajectoryGroup) else trajectories)
    if len(items) > limits.max_trajectories:
        raise TrajectoryError([Problem((), f"{len(items):,} trajectories; the limit is {limits.max_trajectories:,} "
                                           "per group")])
    problems: list[Problem] = []
    if isinstance(trajectories, TrajectoryGroup):
        _finite_values(trajectories.metadata, ("metadata",), "metadata", problems)
    for i, t in enumerate(items):
        _trajectory_problems(t, i, limits, problems)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise TrajectoryError(problems[:MAX_PROBLEMS])

