"""MCP·RL's tasks: `write_tasks` has a litellm model (any model string) write realistic tasks that need an MCP
server's tools, answered under a JSON schema; each task is checked (a non-empty text of bounded length, naming
only tools the server has) and deduplicated (case and spacing ignored), more are asked for until `n` are kept or
the attempts run out (`TaskWriterError`, with the count of each kind of rejection), and they are split into train
and test with a seed (`TaskSet`, saved and loaded as JSON).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pydantic

from ruler_rl.judges.completion import RetryPolicy, complete, json_list
from ruler_rl.judges.errors import JudgeError

MAX_RESOURCES, RESOURCE_TEXT_CHARS = 50, 300  # what the task writer is shown of a server's resources
TASK_MIN_CHARS, TASK_MAX_CHARS = 12, 2000


class TaskWriterError(JudgeError):
    """The task writer answered, but not with enough valid tasks; `report` says what was asked, kept and
    rejected. (A `JudgeError`: the model failed, not the input.)"""

    def __init__(self, message: str, report: TaskReport):
        super().__init__(message)
        self.report = report


class MCPTask(pydantic.BaseModel):
    """One task for the agent: its text, the tools the writer said it needs, and its split."""

    model_config = pydantic.ConfigDict(extra="forbid")

    id: str
    task: str = pydantic.Field(min_length=1)
    tools: list[str] = []
    split: Literal["train", "test"] = "train"


@dataclass
class TaskReport:
    """How task writing went: asked for, writer calls made, items written, tasks kept, rejections by reason."""

    requested: int = 0
    attempts: int = 0
    written: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1


@dataclass
class TaskSet:
    """The tasks written for a server, split into train and test; `report` says how writing went."""

    train: list[MCPTask]
    test: list[MCPTask]
    report: TaskReport

    def save(self, path: str | Path) -> Path:
        """Write the tasks as JSON (`{"train": [...], "test": [...]}`); the path written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"train": [t.model_dump() for t in self.train],
                                    "test": [t.model_dump() for t in self.test]}, indent=1, ensure_ascii=False))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TaskSet:
        """Tasks saved by `save`; ValueError naming the file when it is not such a file."""
        try:
            data = json.loads(Path(path).read_text())
            train = [MCPTask.model_validate(t) for t in data["train"]]
            test = [MCPTask.model_validate(t) for t in data["test"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is not an MCP·RL task file ({type(exc).__name__}: {exc})") from None
        return cls(train, test, TaskReport(requested=len(train) + len(test), kept=len(train) + len(test)))


WRITER_PROMPT = """You write tasks for training an AI agent that can use the tools of an MCP server. The tools, as \
OpenAI function schemas:
{tools}
{instructions}
Write {count} different, realistic tasks a user of this server might really ask the agent to do. Each task must \
need at least one of the tools, be answerable with them, and state everything the agent needs to start (no \
placeholders). Vary the tools and the difficulty; some tasks may need several tool calls. For each task list the \
names of the tools it needs. Reply with JSON only: {{"tasks": [{{"task": "...", "tools": ["tool_name", ...]}}]}}."""


def _writer_schema(names: list[str], count: int) -> dict:
    return {"type": "object", "required": ["tasks"], "additionalProperties": False, "properties": {"tasks": {
        "type": "array", "minItems": 1, "maxItems": count, "items": {
            "type": "object", "required": ["task", "tools"], "additionalProperties": False, "properties": {
                "task": {"type": "string", "minLength": TASK_MIN_CHARS, "maxLength": TASK_MAX_CHARS},
                "tools": {"type": "array", "minItems": 1, "items": {"enum": names}}}}}}}


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def _check_tools_list(tools: Any) -> list[str]:
    if isinstance(tools, (str, bytes)) or not isinstance(tools, (list, tuple)) or not tools:
        raise ValueError("tools must be a non-empty list of OpenAI tool schemas (MCPToolbox.openai_tools)")
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}] is not an OpenAI tool schema ({{'type': 'function', 'function': "
                             "{'name': ...}})")
        names.append(fn["name"])
    return names


async def write_tasks(tools: list[dict], model: str, *, n: int, test_fraction: float = 0.25, seed: int = 0,
                      params: dict | None = None, instructions: str | None = None, guidance: str | None = None,
                      resources: list[dict] | None = None, max_attempts: int = 3,
                      retry: RetryPolicy | None = None) -> TaskSet:
    """`n` distinct tasks for an agent with `tools` (OpenAI tool schemas), written by litellm `model`.

    Each call asks for the tasks still missing under a JSON schema; every item is checked again after parsing
    (an object whose `task` is a string of 12-2000 characters and whose `tools` name only tools in `tools`)
    and deduplicated (case, punctuation and spacing ignored). Up to `max_attempts` calls; fewer than `n` kept
    tasks then raise `TaskWriterError` with the counts of each rejection. The kept tasks are shuffled with
    `seed`; `round(n * test_fraction)` of them (at least one when `test_fraction` > 0) are the test split.
    The writer is shown the server's `instructions` (`MCPToolbox.instructions`), the user's own `guidance`
    (what kind of tasks to write: a text of at most 20000 characters) and the server's `resources`
    (`MCPToolbox.resources`: only their uri, name and description, at most 50, each text cut to 300
    characters).
    A writer endpoint that keeps failing raises `ruler_rl.judges.JudgeError` (its calls are retried by `retry`).
    """
    names = _check_tools_list(tools)
    if isinstance(model, bool) or not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a litellm model string, got {model!r}")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10000:
        raise ValueError(f"n must be an integer from 1 to 10000, got {n!r}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be a number in [0, 1), got {test_fraction!r}")
    n_test = 0 if test_fraction == 0 else max(1, round(n * test_fraction))
    if n - n_test < 1:
        raise ValueError(f"n={n} with test_fraction={test_fraction} leaves no training task: ask for more tasks")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100:
        raise ValueError(f"max_attempts must be an integer from 1 to 100, got {max_attempts!r}")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError(f"instructions must be a string or None, got {type(instructions).__name__}")
    if guidance is not None and (not isinstance(guidance, str) or len(guidance) > 20000):
        raise ValueError("guidance must be a text of at most 20000 characters or None")
    if resources is not None and (not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources)):
        raise ValueError("resources must be a list of dicts (MCPToolbox.resources) or None")
    if params is not None and not isinstance(params, dict):
        raise ValueError(f"params must be a dict of litellm parameters, got {type(params).__name__}")
    report, kept, seen = TaskReport(requested=n), [], set()
    tool_text = json.dumps(tools, indent=1, ensure_ascii=False)
    extra = f"The server describes itself: {instructions.strip()}\n" if instructions and instructions.strip() else ""
    if resources:
        shown = [{k: str(r.get(k) or "")[:RESOURCE_TEXT_CHARS] for k in ("uri", "name", "description")}
                 for r in resources[:MAX_RESOURCES]]
        extra += ("The server also offers these resources (data the tasks may be about):\n"
                  + "\n".join(f"- {r['name'] or r['uri']} ({r['uri']}): {r['description']}".rstrip(": ")
                              for r in shown) + "\n")
    if guidance and guidance.strip():
        extra += f"Instructions from the user for the tasks (follow them):\n{guidance.strip()}\n"
    while len(kept) < n and report.attempts < max_attempts:
        count = n - len(kept)
        messages = [{"role": "user", "content": WRITER_PROMPT.format(tools=tool_text, instructions=extra, count=count)}]
        if kept:
            messages[0]["content"] += "\nDo not repeat these tasks:\n" + "\n".join(f"- {t.task}" for t in kept)
        fmt = {"type": "json_schema", "json_schema": {"name": "tasks", "schema": _writer_schema(names, count)}}
        reply = await complete(model, messages, response_format=fmt, params=params, retry=retry)
        report.attempts += 1
        try:
            items = json_list(reply.content, "tasks")
        except ValueError:
            report.reject("reply is not JSON with a tasks list")
            continue
        for item in items:
            report.written += 1
            if len(kept) >= n:
                report.reject("more tasks than asked for")
                continue
            task = _checked_task(item, names, seen, report)
            if task is not None:
                kept.append(MCPTask(id=f"task-{len(kept)}", task=task, tools=list(dict.fromkeys(item["tools"]))))
    report.kept = len(kept)
    if len(kept) < n:
        why = ", ".join(f"{k}: {v}" for k, v in report.rejected.items()) or "none"
        raise TaskWriterError(f"the task writer {model} gave {len(kept)} valid tasks of the {n} asked for after "
                              f"{report.attempts} attempt(s); rejected: {why}", report)
    random.Random(seed).shuffle(kept)
    test = [t.model_copy(update={"split": "test"}) for t in kept[:n_test]]
    return TaskSet(train=kept[n_test:], test=test, report=report)


def _checked_task(item: Any, names: list[str], seen: set, report: TaskReport) -> str | None:
    if not isinstance(item, dict):
        report.reject("not an object")
        return None
    task = item.get("task")
    if not isinstance(task, str) or not TASK_MIN_CHARS <= len(task.strip()) <= TASK_MAX_CHARS:
        report.reject(f"task is not a text of {TASK_MIN_CHARS}-{TASK_MAX_CHARS} characters")
        return None
    used = item.get("tools")
    if not isinstance(used, list) or not used or not all(isinstance(u, str) and u in names for u in used):
        report.reject("tools missing or naming a tool the server does not have")
        return None
    key = _norm(task)
    if key in seen:
        report.reject("duplicate")
        return None
    seen.add(key)
    return task.strip()
