"""Checks of OpenAI-style chat messages, and the problem reports every input check raises.

A conversation is a list of message dicts and `Choice` objects. Each message dict needs a known role
(`KNOWN_ROLES`), only known fields (`MESSAGE_FIELDS`: unknown ones are an error naming the closest known
field, never dropped), content that is a string or a list of parts (required except on assistant messages),
tool calls as a list of objects each naming its function (assistant messages only), a `tool_call_id` on
tool messages, and the caps in `Limits` (characters per message, messages per conversation, nesting depth).
A `Choice` is the policy's output: only its size and nesting depth are checked, and its extra fields (an
inference server's `token_ids`, `prompt_token_ids`, logprobs, ...) pass untouched.

What is wrong is reported as `Problem`s (where, and what) in one `TrajectoryError`. `validate_message_lists`
checks bare conversations (what `ruler()` takes); `ruler_rl.trajectory.validate_trajectories` runs the same
message checks on trajectories.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
from openai.types.chat.chat_completion import Choice

from ruler_rl.limits import Limits

KNOWN_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
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


def json_path(loc: Iterable[str | int]) -> str:
    """A location as a JSON path: `("tool_calls", 0, "function")` reads "tool_calls[0].function"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def walk_json(value: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> int:
    """Characters of the strings inside a JSON value; records values nested too deeply and non-finite numbers."""
    chars = 0
    stack = [(value, loc, 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, str):
            chars += len(v)
        elif isinstance(v, float) and not math.isfinite(v):
            problems.append(Problem(at, f"{json_path(at[-3:])} is {v}: numbers must be finite"))
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
        chars += walk_json(call, at, limits, problems)
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
            problems.append(Problem((*loc, *first["loc"]), f"not a valid Choice: {json_path(first['loc'])}: {first['msg']}"))
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
        chars += walk_json(content, (*loc, "content"), limits, problems)
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
            chars += walk_json(value, (*loc, key), limits, problems)
    if chars > limits.max_message_chars:
        problems.append(Problem((*loc, "content"), f"message has {chars:,} characters; the limit is "
                                                   f"{limits.max_message_chars:,}"))
    return role in ("system", "developer", "user")


def conversation_problems(items: Any, loc: tuple, limits: Limits, problems: list[Problem]) -> None:
    """Records what is wrong with one conversation (a list of messages and choices at `loc`) in `problems`,
    stopping once `problems` holds `MAX_PROBLEMS`."""
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


def validate_message_lists(message_lists: Any, *, limits: Limits | None = None) -> list[list[dict]]:
    """The message checks of `validate_trajectories` for bare conversations (what `ruler()` takes); returns
    them as lists. Raises `TrajectoryError` naming every problem (up to `MAX_PROBLEMS`).

    Also requires a system, developer or user message somewhere in the group: without one the judge
    cannot tell what the task was.
    """
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ruler_rl.trajectory.Limits, got {type(limits).__name__}")
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
        conversation_problems(ml, (t,), limits, problems)
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
