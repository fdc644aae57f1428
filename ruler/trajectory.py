"""The data model: `Trajectory` and `TrajectoryGroup`, with OpenPipe ART's fields and meaning.

A trajectory is one rollout: `messages_and_choices` holds OpenAI-format message dicts (what the
environment said) and `Choice` objects (what the model generated, which the trainer learns from).
A group is the set of rollouts for one scenario that RULER scores relative to each other.
Groups load and save as JSON (one object, or a bare list) or JSONL (one trajectory per line).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import traceback
from collections.abc import Awaitable, Iterable, Iterator
from pathlib import Path
from typing import Any, Union

import pydantic
from openai.types.chat.chat_completion import Choice

MetadataValue = Union[float, int, str, bool, None]
MessageOrChoice = Union[Choice, dict[str, Any]]
KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


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

    messages_and_choices: list[MessageOrChoice]
    tools: list[dict[str, Any]] | None = None


def choice_to_message(choice: Choice) -> dict[str, Any]:
    """An assistant message dict with the content and tool calls of a generated `Choice`."""
    msg = choice.message
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [tc.model_dump(exclude_none=True) for tc in msg.tool_calls]
    return out


class Trajectory(pydantic.BaseModel):
    """One rollout: messages and generated choices, tools offered, reward, metrics, metadata, logs."""

    messages_and_choices: list[MessageOrChoice]
    tools: list[dict[str, Any]] | None = None
    additional_histories: list[History] = []
    reward: float = 0.0
    metrics: dict[str, float | int | bool] = {}
    metadata: dict[str, MetadataValue] = {}
    logs: list[str] = []

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
            return group_from_data(rows, source=str(path))
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
        return group_from_data(data, source=str(path))


def group_from_data(data: Any, *, source: str = "input") -> TrajectoryGroup:
    """A group from parsed JSON: a group object, a list of trajectory objects, or a list of message lists."""
    if isinstance(data, dict) and "trajectories" in data:
        items, meta = data["trajectories"], data.get("metadata") or {}
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
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{source}: trajectory {i}: {where}: {first['msg']}") from None
    return TrajectoryGroup(trajectories, metadata=meta)


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
