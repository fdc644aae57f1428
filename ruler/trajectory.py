"""The data model: `Trajectory` and `TrajectoryGroup`, with OpenPipe ART's fields and meaning.

A trajectory is one rollout: `messages_and_choices` holds OpenAI-format message dicts (what the
environment said) and `Choice` objects (what the model generated, which the trainer learns from).
A group is the set of rollouts for one scenario that RULER scores relative to each other.
Groups load and save as JSON (one object, or a bare list) or JSONL (one trajectory per line).

`validate_trajectories` is the one check every surface runs before judging or training (the library's
`ruler_score_group`, the command line, the judging service and its job worker, the trainer): message
shapes, tool calls, tool messages, finite rewards, metrics and metadata, unknown fields, and the caps
in `Limits`. Unknown fields are rejected, never dropped: on a trajectory (`Trajectory` forbids extra
fields, except ART's own bookkeeping fields, which are accepted and ignored) and on a message dict.
Extra fields on a `Choice` (an inference server's `token_ids`, `prompt_token_ids`, logprobs, ...)
are the server's business and pass untouched (only nesting past `Limits.max_depth` is refused).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import json
import math
import traceback
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import pydantic
from openai.types.chat.chat_completion import Choice

from ruler.limits import Limits
from ruler.tracing import TRAJECTORY_ID_KEY

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


# --- validation: one check for every surface ------------------------------------------------------

MESSAGE_FIELDS = frozenset({
    "role", "content", "name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio", "images",
    "reasoning", "reasoning_content", "thinking_blocks", "reasoning_items", "annotations", "provider_specific_fields",
})
"""Fields a message dict may carry: OpenAI's chat message fields plus those litellm adds to assistant messages."""
NEEDS_CONTENT = frozenset({"system", "developer", "user", "tool", "function"})
MAX_PROBLEMS = 20  # a report stops listing after this many


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input. `loc` is the JSON path from the list of trajectories (0-based, as in
    `trajectories[loc[0]]...`); `msg` names the field. `str()` reads "trajectory 2, message 3: ..." (counted
    from 1, like the judge's trajectory ids)."""

    loc: tuple[str | int, ...]
    msg: str

    def __str__(self) -> str:
        return f"{where(self.loc)}: {self.msg}" if self.loc else self.msg


class TrajectoryError(ValueError):
    """Trajectories that cannot be judged or trained on. `problems` lists each (up to `MAX_PROBLEMS`)."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        more = len(self.problems) - 1
        super().__init__(str(self.problems[0]) + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""))


def where(loc: tuple[str | int, ...]) -> str:
    """"trajectory 2, message 3" for a location in a list of trajectories (numbers counted from 1)."""
    parts, rest = [], list(loc)
    if rest and isinstance(rest[0], int):
        parts.append(f"trajectory {rest.pop(0) + 1}")
    if len(rest) >= 2 and rest[0] == "additional_histories" and isinstance(rest[1], int):
        parts.append(f"history {rest[1] + 1}")
        rest = rest[2:]
    if rest and rest[0] == "messages_and_choices":
        rest.pop(0)
    if rest and isinstance(rest[0], int):
        parts.append(f"message {rest.pop(0) + 1}")
    return ", ".join(parts) or "the group"


def unknown_field(name: str, known: Iterable[str]) -> str:
    """"unknown field 'tool' (did you mean 'tools'?)"."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    return f"unknown field {str(name)!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def pydantic_problems(exc: pydantic.ValidationError, prefix: tuple[str | int, ...] = ()) -> list[Problem]:
    """A pydantic error as problems; an extra field reads "unknown field 'x' (did you mean 'y'?)"."""
    known = {*Trajectory.model_fields, *History.model_fields, *TrajectoryGroup.model_fields}
    out = []
    for e in exc.errors(include_url=False)[:MAX_PROBLEMS]:
        loc = tuple(p for p in e["loc"] if p not in ("Choice", "dict[str,any]"))
        if e["type"] == "extra_forbidden":
            msg = unknown_field(str(loc[-1]), known)
        else:
            msg = f"{_path(loc) or 'value'}: {e['msg']}"
        out.append(Problem((*prefix, *loc), msg))
    return out or [Problem(prefix, str(exc))]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _walk(value: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> int:
    """Characters of the strings inside a JSON value; records values nested too deeply and non-finite numbers."""
    chars = 0
    stack = [(value, loc, 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, str):
            chars += len(v)
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append(Problem(at, f"{_path(at[-3:])} is {v}: numbers must be finite"))
        elif isinstance(v, (dict, list, tuple)):
            if depth >= limits.max_depth:
                problems.append(Problem(at, f"value nested more than {limits.max_depth} levels deep"))
                continue
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str):
                    chars += len(k)
                stack.append((x, (*at, k), depth + 1))
    return chars


_CONTAINERS = (dict, list, tuple, pydantic.BaseModel)


def _nesting_problems(value: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> None:
    """Records where a value (pydantic models included: their fields and extra fields) nests past
    `limits.max_depth`. Only containers are visited: a Choice with thousands of logprobs costs milliseconds."""
    stack = [(value, loc, 0)]
    while stack:
        v, at, depth = stack.pop()
        if depth >= limits.max_depth:
            problems.append(Problem(at, f"value nested more than {limits.max_depth} levels deep"))
            continue
        if isinstance(v, pydantic.BaseModel):
            items = [*v.__dict__.items(), *(v.__pydantic_extra__ or {}).items()]
        else:
            items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if isinstance(x, _CONTAINERS):
                stack.append((x, (*at, k), depth + 1))


def _tool_call_problems(calls: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> int:
    if not isinstance(calls, list):
        problems.append(Problem((*loc, "tool_calls"), f"tool_calls must be a list of tool calls, got {type(calls).__name__}"))
        return 0
    chars = 0
    for c, call in enumerate(calls):
        at = (*loc, "tool_calls", c)
        if not isinstance(call, dict):
            problems.append(Problem(at, f"tool_calls[{c}] must be an object, got {type(call).__name__}"))
            continue
        fn = call.get("function")
        if not isinstance(fn, dict):
            problems.append(Problem((*at, "function"), f"tool_calls[{c}].function must be an object with the tool's "
                                                       "name and arguments"))
            continue
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip():
            problems.append(Problem((*at, "function", "name"), f"tool_calls[{c}].function.name is missing: every tool "
                                                               "call needs the name of the tool it calls"))
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            problems.append(Problem((*at, "function", "arguments"), f"tool_calls[{c}].function.arguments must be a JSON "
                                                                    f"string or an object, got {type(args).__name__}"))
        if call.get("id") is not None and not isinstance(call["id"], str):
            problems.append(Problem((*at, "id"), f"tool_calls[{c}].id must be a string"))
        chars += _walk(call, at, limits, problems)
    return chars


def _message_problems(m: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> bool:
    """Check one message dict or Choice; True when it is a system, developer or user message."""
    if isinstance(m, Choice):
        # the policy's own output: its shape was checked by its model, and what it says (a malformed tool
        # call included) is for the judge to see, not a reason to refuse the group; its extra fields are the
        # inference server's. Only its size counts here, and how deeply its (extra) fields nest, which
        # nothing downstream could serialise past.
        _nesting_problems(m, loc, limits, problems)
        msg = m.message
        chars = len(msg.content or "")
        for call in msg.tool_calls or []:
            fn = getattr(call, "function", None)
            chars += len(getattr(fn, "name", "") or "") + len(getattr(fn, "arguments", "") or "")
        if chars > limits.max_message_chars:
            problems.append(Problem((*loc, "message"), f"message has {chars:,} characters; the limit is "
                                                       f"{limits.max_message_chars:,}"))
        return False
    if not isinstance(m, dict):
        problems.append(Problem(loc, f"expected a dict (a message) or a Choice, got {type(m).__name__}"))
        return False
    if "message" in m and ("finish_reason" in m or "index" in m):  # meant as a Choice, but not a valid one
        try:
            Choice.model_validate(m)
        except pydantic.ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            problems.append(Problem((*loc, *first["loc"]), f"not a valid Choice: {_path(first['loc'])}: {first['msg']}"))
            return False
    role = m.get("role")
    if not isinstance(role, str) or role not in KNOWN_ROLES:
        problems.append(Problem((*loc, "role"), "role is missing" if role is None else
                                f"unknown role {role!r} (known: {', '.join(sorted(KNOWN_ROLES))})"))
        return False
    for key in m:
        if key not in MESSAGE_FIELDS:
            problems.append(Problem((*loc, key), unknown_field(key, MESSAGE_FIELDS) + " in a message"))
    content, chars = m.get("content"), 0
    if content is None:
        if role in NEEDS_CONTENT:
            problems.append(Problem((*loc, "content"), f"a {role} message needs content (a string or a list of parts)"))
    elif isinstance(content, str):
        chars += len(content)
    elif isinstance(content, list):
        for p, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                problems.append(Problem((*loc, "content", p), f"content[{p}] must be an object with a \"type\""))
            elif part["type"] == "text" and not isinstance(part.get("text"), str):
                problems.append(Problem((*loc, "content", p, "text"), f"content[{p}].text must be a string"))
        chars += _walk(content, (*loc, "content"), limits, problems)
    else:
        problems.append(Problem((*loc, "content"), "content must be a string, a list of content parts or null, "
                                                   f"got {type(content).__name__}"))
    if m.get("name") is not None and not isinstance(m["name"], str):
        problems.append(Problem((*loc, "name"), f"name must be a string, got {type(m['name']).__name__}"))
    if m.get("tool_calls") is not None:
        if role != "assistant":
            problems.append(Problem((*loc, "tool_calls"), f"only assistant messages make tool calls, not {role} messages"))
        else:
            chars += _tool_call_problems(m["tool_calls"], loc, limits, problems)
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id.strip():
            problems.append(Problem((*loc, "tool_call_id"), "a tool message needs a tool_call_id (the id of the tool "
                                                            "call it answers)"))
    if role == "function" and not isinstance(m.get("name"), str):
        problems.append(Problem((*loc, "name"), "a function message needs the function's name"))
    for key, value in m.items():
        if key not in ("role", "content", "tool_calls") and key in MESSAGE_FIELDS:
            chars += _walk(value, (*loc, key), limits, problems)
    if chars > limits.max_message_chars:
        problems.append(Problem((*loc, "content"), f"message has {chars:,} characters; the limit is "
                                                   f"{limits.max_message_chars:,}"))
    return role in ("system", "developer", "user")


def _conversation_problems(items: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> None:
    if not isinstance(items, (list, tuple)):
        problems.append(Problem(loc, f"expected a list of messages, got {type(items).__name__}"))
        return
    if not items:
        problems.append(Problem(loc, "the conversation has no messages"))
    if len(items) > limits.max_messages:
        problems.append(Problem(loc, f"{len(items):,} messages; the limit is {limits.max_messages:,} per conversation"))
        return
    for k, m in enumerate(items):
        _message_problems(m, (*loc, k), limits, problems)
        if len(problems) >= MAX_PROBLEMS:
            return


def _finite_values(values: Any, loc: tuple, what: str, problems: list[Problem]) -> None:
    for key, value in (values or {}).items():
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(Problem((*loc, key), f"{what}[{key!r}] is {value}: {what} values must be finite"))


def _trajectory_id_problems(metadata: dict, i: int, problems: list[Problem]) -> None:
    """A trajectory id the user (or a recorder) set must be a non-empty string (`ruler.tracing`)."""
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
            _walk(tool, (i, "tools", k), limits, problems)
    _conversation_problems(t.messages_and_choices, (i, "messages_and_choices"), limits, problems)
    for h, history in enumerate(t.additional_histories):
        _conversation_problems(history.messages_and_choices,
                               (i, "additional_histories", h, "messages_and_choices"), limits, problems)


def validate_trajectories(trajectories: TrajectoryGroup | Iterable[Trajectory], *,
                          limits: Limits | None = None) -> None:
    """Raise `TrajectoryError` naming every problem (trajectory index and field) in a group; else return.

    The one check shared by the library, the command line, the judging service, its job worker and the
    trainer. Checks: each item is a `Trajectory` with at least one message and at most
    `limits.max_messages`; every message is a `Choice` (the policy's output: only its size and nesting depth
    are checked, its extra fields pass untouched) or a dict with a known role, only known fields
    (`MESSAGE_FIELDS`), content that is a string or a list of parts (required except on assistant
    messages), tool calls as a list of objects each naming its function (assistant messages only),
    a `tool_call_id` on tool messages, at most `limits.max_message_chars` characters and JSON nested at
    most `limits.max_depth` deep; rewards, metrics and metadata are finite; a trajectory id in
    `metadata["ruler_trajectory_id"]` (`ruler.tracing`) is a non-empty string; at most
    `limits.max_trajectories` trajectories. An empty group passes (callers decide whether it may be empty).
    """
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ruler.trajectory.Limits, got {type(limits).__name__}")
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


def validate_message_lists(message_lists: Any, *, limits: Limits | None = None) -> list[list[dict]]:
    """The same message checks for bare conversations (what `ruler()` takes); returns them as lists.

    Also requires a system, developer or user message somewhere in the group: without one the judge
    cannot tell what the task was.
    """
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ruler.trajectory.Limits, got {type(limits).__name__}")
    limits = limits or Limits()
    if not isinstance(message_lists, (list, tuple)):
        raise TypeError(f"message_lists must be a list of message lists, got {type(message_lists).__name__}")
    for t, ml in enumerate(message_lists, 1):
        if not isinstance(ml, (list, tuple)):
            raise TypeError(f"trajectory {t}: expected a list of messages, got {type(ml).__name__}")
    if len(message_lists) > limits.max_trajectories:
        raise TrajectoryError([Problem((), f"{len(message_lists):,} trajectories; the limit is "
                                           f"{limits.max_trajectories:,} per group")])
    problems: list[Problem] = []
    for t, ml in enumerate(message_lists):
        _conversation_problems(ml, (t,), limits, problems)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise TrajectoryError(problems[:MAX_PROBLEMS])
    out = [list(ml) for ml in message_lists]
    require_task_stated(out)
    return out


def require_task_stated(message_lists: list[list[dict]]) -> None:
    """Raise `TrajectoryError` unless some conversation of a (non-empty) group has a system, developer or user
    message: without one the judge cannot tell what the task was."""
    if message_lists and not any(isinstance(m, dict) and m.get("role") in ("system", "developer", "user")
                                 for ml in message_lists for m in ml):
        raise TrajectoryError([Problem((), "no trajectory has a system, developer or user message: the judge cannot "
                                           "tell the task")])
