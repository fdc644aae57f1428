"""MCP·RL: train an agent on the tools of any MCP server, with RULER as the reward (no reward function written).

    async with MCPToolbox("python -m evals.art_e.mcp_server --db inbox.db") as box:     # or url="http://…/mcp"
        tasks = await write_tasks(box.openai_tools, "openai/gpt-4.1", n=16, instructions=box.instructions,
                                  resources=box.resources, guidance="Tasks a sales assistant would get.")
        result = await train_mcp_rl(model, box, tasks, judge="openai/o4-mini", config=MCPRLConfig(steps=10))

or, from the command line, `ruler mcp-rl --server "CMD ARGS" --task-model MODEL --judge MODEL`.

The loop:

1. `MCPToolbox` connects with the official `mcp` SDK (a command run over stdio, or a streamable HTTP URL),
   lists the server's tools (every page) and converts them to OpenAI tool schemas. A server that cannot be
   started or reached raises `MCPServerError`, naming the command (or URL) and, for a command, the end of
   what it wrote to stderr.
2. `write_tasks`: a litellm model (any model string) writes realistic tasks that need those tools, answered
   under a JSON schema; each task is checked (a non-empty text of bounded length, naming only tools the
   server has) and deduplicated (case and spacing ignored), more are asked for until `n` are kept or the
   attempts run out (`TaskWriterError`, with the count of each kind of rejection), and they are split into
   train and test with a seed.
3. `rollout`: the policy (an OpenAI-compatible client: `model.openai_client()` for a `TrainableModel`) is
   given the tools natively; each of its tool calls runs on the server through MCP `call_tool` with a
   per-call timeout. A tool that fails (an MCP tool error, a protocol error, bad JSON arguments, an unknown
   tool name) or runs past the timeout becomes a tool message the agent reads, and is counted in the
   trajectory's metrics (`tool_errors`, `tool_timeouts`). The served `Choice`s are kept whole in the
   trajectory, so the trainer gets their token ids. A policy or connection that fails raises: as a rollout
   of a `TrajectoryGroup` it is recorded in `group.exceptions` and counted by `gather_trajectory_groups`.
4. `train_mcp_rl`: each step, `groups_per_step` training tasks are rolled out `group_size` times, each group
   is scored by `ruler_score_group` (a group the judge cannot score is dropped) and `model.train` takes one
   step, until the model has taken `steps` steps in total. The test tasks are rolled out before the first
   step and after the last, and RULER ranks the two together (`MCPRLResult.evaluation`).

Needs the `mcp` extra (`pip install 'ruler-rl[mcp]'`) beside `train`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shlex
import sys
import threading
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import pydantic

from judges.extras import require

require("mcp", "MCP·RL (trainer.mcp_rl)")

import anyio  # installed with mcp
import httpx2  # installed with mcp (its HTTP client)
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from judges.completion import RetryPolicy, complete, json_list
from judges.errors import JudgeError
from ruler.gather import gather_trajectory_groups
from ruler.scoring import ruler_score_group
from ruler.trajectory import Trajectory, TrajectoryGroup, choice_to_message

log = logging.getLogger("ruler")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible servers accept as a function name
STDERR_TAIL_CHARS = 2000
STDERR_KEEP_BYTES = 64 * 1024  # of a server command's stderr, only the end is kept
MAX_TOOL_PAGES = 100
MAX_RESOURCES, RESOURCE_TEXT_CHARS = 50, 300  # what the task writer is shown of a server's resources
TASK_MIN_CHARS, TASK_MAX_CHARS = 12, 2000


class MCPServerError(ConnectionError):
    """An MCP server could not be started, reached or listed, or lost its connection (the message names it
    and, for a command, the end of its stderr)."""


class TaskWriterError(JudgeError):
    """The task writer answered, but not with enough valid tasks; `report` says what was asked, kept and
    rejected. (A `JudgeError`: the model failed, not the input.)"""

    def __init__(self, message: str, report: TaskReport):
        super().__init__(message)
        self.report = report


# ---- the MCP connection ----------------------------------------------------------------------------------


def openai_tool_schema(tool: Any) -> dict:
    """An MCP tool (`mcp.types.Tool`, or a dict with `name`, `description`, `inputSchema`) as an OpenAI tool
    schema. ValueError for a name OpenAI-compatible servers refuse (1-64 letters, digits, `_`, `-`) or an
    input schema that is not a JSON object schema."""
    if isinstance(tool, dict):
        name, description = tool.get("name"), tool.get("description")
        schema = tool.get("inputSchema", tool.get("input_schema"))
    else:
        name, description = getattr(tool, "name", None), getattr(tool, "description", None)
        schema = getattr(tool, "input_schema", None)
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ValueError(f"MCP tool name {name!r} is not a valid function name (1-64 letters, digits, '_' or '-')")
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ValueError(f"MCP tool {name!r}: its input schema is not a JSON object schema")
    return {"type": "function", "function": {"name": name, "description": (description or "").strip(),
                                             "parameters": {"type": "object", **schema}}}


def result_text(result: Any, max_chars: int = 8000) -> str:
    """The text an agent reads for an MCP `CallToolResult`: its text blocks joined (other blocks named, e.g.
    `[image image/png]`), its structured content as JSON when there is no text, cut to `max_chars`."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(getattr(block, "resource", None), "text", None) is not None:
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind} {getattr(block, 'mime_type', '') or ''}]".replace(" ]", "]"))
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... cut: {len(text) - max_chars} more characters]"
    return text


@dataclass(frozen=True)
class ToolCallResult:
    """What one tool call gave the agent: the text it reads, whether it failed, whether it timed out."""

    text: str
    is_error: bool = False
    timed_out: bool = False


class StderrTail:
    """Where a server command's stderr goes: a pipe whose reader keeps only the last `keep` bytes (what error
    messages quote), so a command that writes without end fills neither memory nor disk. A context manager;
    `writer` is the file the command writes to."""

    def __init__(self, keep: int = STDERR_KEEP_BYTES):
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w", encoding="utf-8", errors="replace")
        self._reader = os.fdopen(read_fd, "rb")
        self._kept = bytearray()
        self._keep = keep
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="mcp-stderr", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := self._reader.read1(65536):
                with self._lock:
                    self._kept += chunk
                    del self._kept[:-self._keep]
        except (OSError, ValueError):  # closed under the read
            pass

    def tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        """The last `chars` characters written so far (after a short wait for what is in the pipe)."""
        self._thread.join(0.05)
        with self._lock:
            return bytes(self._kept).decode("utf-8", errors="replace")[-chars:].strip()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.writer.close()  # the command's copy closes when it exits; the reader sees the end then
        self._thread.join(1.0)
        if self._thread.is_alive():
            self._reader.close()


class _CappedStream(httpx2.AsyncByteStream):
    """A response body that stops at `limit` bytes (`MessageTooLarge`) instead of being read whole."""

    def __init__(self, stream, limit: int):
        self._stream, self._limit = stream, limit

    async def __aiter__(self):
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise MessageTooLarge(f"the server's answer was over {self._limit:,} bytes; MCP·RL stopped reading "
                                      "it (MCPToolbox max_message_bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class MessageTooLarge(httpx2.StreamError):
    """A response from an MCP server over `MCPToolbox.max_message_bytes` (the SDK answers the call with it)."""


class _CappedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int):
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request):
        response = await self._inner.handle_async_request(request)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            response.stream = _CappedStream(response.stream, self._limit)  # an event stream: bounded per event
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_http_client(limit: int) -> httpx2.AsyncClient:
    """An HTTP client with the MCP SDK's timeouts whose JSON responses stop at `limit` bytes (an event stream is
    bounded per event by the SDK's `max_sse_event_size`, which the toolbox sets to the same limit)."""
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    return httpx2.AsyncClient(timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
                              transport=_CappedTransport(httpx2.AsyncHTTPTransport(), limit))


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = [e for e in _leaves(exc) if not isinstance(e, anyio.get_cancelled_exc_class())] or _leaves(exc)
    return "; ".join(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__ for e in leaves[:3])


class MCPToolbox:
    """A connection to one MCP server and its tools, as an async context manager.

    `server`: a command line (split like a shell would, e.g. `"python -m evals.art_e.mcp_server --db x.db"`)
    run as a subprocess over stdio; or `url`: a streamable HTTP endpoint (`http://host:port/mcp`). Exactly
    one of the two.

    The command's environment: the `mcp` SDK passes a command only a short list of safe variables (`HOME`,
    `PATH`, `USER`, ... on POSIX), not the caller's whole environment (which may hold API keys). `env` adds
    variables to that list; `inherit_env=True` passes the caller's whole environment (`os.environ`, then
    `env` over it). `cwd` is the command's working directory (default: the caller's).

    `connect_timeout`: seconds the whole start-up may take (starting the command, the protocol handshake, the
    tool and resource listings: one deadline); running past it raises `MCPServerError` naming
    `connect_timeout`. `tool_timeout`: seconds one tool call may take. Inside the `async with`: `tools` (the
    MCP tools), `openai_tools` (their OpenAI schemas; tools whose name or schema cannot be offered are left
    out and named in `skipped_tools`), `instructions` (the server's own, or None), `resources` (the server's
    MCP resources, if it offers any: at most 50, each a dict of `uri`, `name` and `description`, texts cut to
    300 characters), `call(name, arguments)`.

    What it reads is bounded: a message from the server over `max_message_bytes` (default 1 MiB) is not read
    into memory — over stdio a relay in front of the command (`trainer/mcp_relay.py`) drops it as it arrives and
    answers its call with an error naming the limit; over HTTP the response is cut off at the limit (SSE events
    too) — so that call's result is an error the agent reads, and `max_result_chars` then cuts what is kept of a
    result that fits. The command's stderr is kept only as its last `STDERR_KEEP_BYTES` (for error messages).

    One toolbox may serve many concurrent rollouts (MCP requests are multiplexed on one session); enter and
    leave it in the same task.
    """

    def __init__(self, server: str | None = None, *, url: str | None = None, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, inherit_env: bool = False, connect_timeout: float = 60.0,
                 tool_timeout: float = 30.0, max_result_chars: int = 8000,
                 max_message_bytes: int = 1024 * 1024):
        if (server is None) == (url is None):
            raise ValueError("give exactly one of server (a command line, run over stdio) and url (streamable HTTP)")
        if server is not None:
            if not isinstance(server, str) or not server.strip():
                raise ValueError(f"server must be a command line such as \"python -m my_server\", got {server!r}")
            try:
                argv = shlex.split(server)
            except ValueError as exc:
                raise ValueError(f"server command {server!r} cannot be split into arguments: {exc}") from None
            if env is not None and (not isinstance(env, dict) or not all(
                    isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items())):
                raise ValueError("env must be a dict of variable names (no '=') to string values, got "
                                 f"{env!r}")
            if not isinstance(inherit_env, bool):
                raise ValueError(f"inherit_env must be True or False, got {inherit_env!r}")
            if cwd is not None and not Path(cwd).is_dir():
                raise ValueError(f"cwd {str(cwd)!r} is not a directory")
            if inherit_env:
                env = {**os.environ, **(env or {})}
            self.params = None  # made below, once max_message_bytes is checked
            self._argv, self._env, self._cwd = argv, env, str(cwd) if cwd is not None else None
        else:
            if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url):
                raise ValueError(f"url must be an http(s) URL of a streamable HTTP MCP endpoint, got {url!r}")
            if env is not None or cwd is not None or inherit_env:
                raise ValueError("env, inherit_env and cwd are for a server command, not a URL")
            self.params = None
        for name, value in (("connect_timeout", connect_timeout), ("tool_timeout", tool_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6:
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if isinstance(max_result_chars, bool) or not isinstance(max_result_chars, int) or max_result_chars < 1:
            raise ValueError(f"max_result_chars must be an integer >= 1, got {max_result_chars!r}")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) \
                or not 4096 <= max_message_bytes <= 2**31:
            raise ValueError(f"max_message_bytes must be an integer from 4096 to 2**31, got {max_message_bytes!r}")
        self.max_message_bytes = max_message_bytes
        if server is not None:  # the command behind the relay that bounds what it writes (trainer/mcp_relay.py)
            relay = [str(Path(__file__).with_name("mcp_relay.py")), "--max-bytes", str(max_message_bytes), "--"]
            self.params = StdioServerParameters(command=sys.executable, args=[*relay, *self._argv], env=self._env,
                                                cwd=self._cwd)
        self.server, self.url = server, url
        self.connect_timeout, self.tool_timeout = float(connect_timeout), float(tool_timeout)
        self.max_result_chars = max_result_chars
        self.tools: list = []
        self.openai_tools: list[dict] = []
        self.skipped_tools: dict[str, str] = {}
        self.instructions: str | None = None
        self.resources: list[dict] = []
        self._client: Client | None = None
        self._stack: AsyncExitStack | None = None
        self._errlog = None

    @property
    def label(self) -> str:
        """The server as the user gave it: its command line or URL."""
        return f"MCP server `{self.server}`" if self.server is not None else f"MCP server at {self.url}"

    def stderr_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        """The end of what the server command wrote to stderr so far ('' for a URL)."""
        return self._errlog.tail(chars) if self._errlog is not None else ""

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("this MCPToolbox is already connected")
        self._stack = AsyncExitStack()
        try:
            if self.params is not None:
                self._errlog = self._stack.enter_context(StderrTail())  # closed by the exit stack
                transport = stdio_client(self.params, errlog=self._errlog.writer)
            else:
                http = await self._stack.enter_async_context(bounded_http_client(self.max_message_bytes))
                transport = streamable_http_client(self.url, http_client=http,
                                                   max_sse_event_size=self.max_message_bytes)
            # one deadline for the whole start-up (starting the command, the protocol handshake, the tool and
            # resource listings); each request is bounded by it too. asyncio.timeout, not an anyio cancel
            # scope: the client's task group, entered inside, outlives the block.
            async with asyncio.timeout(self.connect_timeout):
                self._client = await self._stack.enter_async_context(
                    Client(transport, read_timeout_seconds=self.connect_timeout))
                await self._list_tools()
                await self._list_resources()
        except BaseException as exc:
            tail = self.stderr_tail()
            try:
                await self._close()
            except Exception as close_exc:  # noqa: BLE001 (the original failure is the one to report)
                log.debug("%s: closing after a failed start failed too: %r", self.label, close_exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            if isinstance(exc, MCPServerError):
                raise
            if isinstance(exc, TimeoutError) or any(isinstance(e, MCPError) and e.code == REQUEST_TIMEOUT
                                                    for e in _leaves(exc)):
                why = (f"did not finish starting (handshake and tool listing) within connect_timeout="
                       f"{self.connect_timeout:g} s")
            else:
                why = f"failed to start or connect ({_describe(exc)})"
            where = f"; its stderr ends:\n{tail}" if tail else ("; it wrote nothing to stderr"
                                                               if self.params is not None else "")
            raise MCPServerError(f"{self.label} {why}{where}") from exc
        return self

    async def _list_tools(self) -> None:
        tools, cursor = [], None
        for _ in range(MAX_TOOL_PAGES):
            page = await self._client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools
        self.instructions = self._client.instructions
        self.openai_tools, self.skipped_tools = [], {}
        for tool in tools:
            try:
                self.openai_tools.append(openai_tool_schema(tool))
            except ValueError as exc:
                self.skipped_tools[str(tool.name)] = str(exc)
                log.warning("%s: tool left out: %s", self.label, exc)
        if not self.openai_tools:
            raise MCPServerError(f"{self.label} lists no tool an agent can be given"
                                 + (f" (left out: {self.skipped_tools})" if self.skipped_tools else ""))

    async def _list_resources(self) -> None:
        self.resources = []
        if getattr(self._client.server_capabilities, "resources", None) is None:
            return
        cursor = None
        try:
            for _ in range(MAX_TOOL_PAGES):
                page = await self._client.list_resources(cursor=cursor)
                for r in page.resources:
                    self.resources.append({"uri": str(r.uri)[:RESOURCE_TEXT_CHARS],
                                           "name": (r.name or "")[:RESOURCE_TEXT_CHARS],
                                           "description": (r.description or "").strip()[:RESOURCE_TEXT_CHARS]})
                cursor = page.next_cursor
                if not cursor or len(self.resources) >= MAX_RESOURCES:
                    break
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise
            log.warning("%s: listing its resources failed (left out): %s", self.label, exc)
        del self.resources[MAX_RESOURCES:]

    async def __aexit__(self, *exc_info) -> None:
        await self._close()

    async def _close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    def _lost(self, name: str) -> MCPServerError:
        tail = self.stderr_tail()
        return MCPServerError(f"{self.label} closed the connection during a call of {name}"
                              + (f"; its stderr ends:\n{tail}" if tail else ""))

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.openai_tools]

    async def call(self, name: str, arguments: dict | None = None) -> ToolCallResult:
        """Run tool `name` on the server. Never raises for the tool's failures: an MCP tool error, a protocol
        error, an unknown tool and a call that runs past `tool_timeout` come back as a `ToolCallResult` with
        `is_error` (and `timed_out`). A lost connection raises MCPServerError."""
        if self._client is None:
            raise RuntimeError("MCPToolbox is not connected: use it inside `async with`")
        if name not in self.tool_names:
            return ToolCallResult(f"error: unknown tool {name!r}; the tools are {', '.join(self.tool_names)}",
                                  is_error=True)
        if arguments is not None and not isinstance(arguments, dict):
            return ToolCallResult(f"error: the arguments of {name} must be a JSON object", is_error=True)
        try:
            with anyio.fail_after(self.tool_timeout + 5):  # a guard: the request's own timeout comes first
                result = await self._client.call_tool(name, arguments or {}, read_timeout_seconds=self.tool_timeout)
        except TimeoutError:
            return ToolCallResult(f"error: tool {name} gave no result within {self.tool_timeout:g} s (timed out)",
                                  is_error=True, timed_out=True)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                return ToolCallResult(f"error: tool {name} gave no result within {self.tool_timeout:g} s (timed out)",
                                      is_error=True, timed_out=True)
            if exc.code == CONNECTION_CLOSED and str(exc) == "Connection closed":  # the SDK's own, not the server's
                raise self._lost(name) from exc
            return ToolCallResult(f"error: tool {name} failed: {exc}", is_error=True)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise self._lost(name) from exc
        text = result_text(result, self.max_result_chars)
        if result.is_error:
            return ToolCallResult(text if text.lower().startswith("error") else f"error: {text}", is_error=True)
        return ToolCallResult(text)


# ---- tasks -----------------------------------------------------------------------------------------------


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
    A writer endpoint that keeps failing raises `judges.JudgeError` (its calls are retried by `retry`).
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


# ---- rollouts --------------------------------------------------------------------------------------------

SYSTEM = """You are an agent with the tools of an MCP server. Do the user's task by calling the tools you need and \
reading their results; call tools again if a result does not settle it. When the task is done, reply with the final \
answer in plain text, without a tool call. You may take up to {max_turns} turns.{instructions}"""


async def rollout(task: MCPTask, toolbox: MCPToolbox, client: Any, model: str, *, max_turns: int = 6,
                  max_tokens: int = 256, temperature: float = 1.0, system: str | None = None,
                  tool_choice: str | dict = "auto") -> Trajectory:
    """One episode of the agent on `task`: a `Trajectory` of the conversation, the served `Choice`s kept whole.

    `client`: an `openai.AsyncOpenAI` (or compatible) serving `model` (for a `TrainableModel`:
    `model.openai_client()` and `model.get_inference_name()`). Each turn is one completion with the server's
    tools; every tool call in it runs (in order) and gets a tool message; the episode ends at a reply without
    a tool call (the answer) or after `max_turns` turns (`metrics["ran_out_of_turns"]`). Tool failures are
    tool messages (see `MCPToolbox.call`); a failing policy or connection raises.

    `tool_choice` is the OpenAI `tool_choice` of the first turn (`"auto"`, the default; `"required"`; or
    `{"type": "function", "function": {"name": NAME}}` naming one of the toolbox's tools): `"required"` or a
    name makes the agent start with a tool call; later turns are always `"auto"`, so the agent can still
    answer. (The CPU server forces exactly one call for a forced turn; vLLM may make several.)
    """
    if not isinstance(task, MCPTask):
        raise TypeError(f"rollout takes an MCPTask, got {type(task).__name__}")
    if not isinstance(toolbox, MCPToolbox):
        raise TypeError(f"toolbox must be a connected MCPToolbox, got {type(toolbox).__name__}")
    if not callable(getattr(getattr(getattr(client, "chat", None), "completions", None), "create", None)):
        raise TypeError("client must be an OpenAI-compatible async client (openai.AsyncOpenAI)")
    for name, value, low in (("max_turns", max_turns, 1), ("max_tokens", max_tokens, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise ValueError(f"temperature must be a number in [0, 2], got {temperature!r}")
    if not toolbox.openai_tools:
        raise RuntimeError("the toolbox has no tools: use it inside `async with`")
    _check_tool_choice(tool_choice, toolbox.tool_names)
    instructions = f"\n\nAbout the server: {toolbox.instructions.strip()}" if toolbox.instructions else ""
    messages: list = [{"role": "system", "content": system if system is not None else
                       SYSTEM.format(max_turns=max_turns, instructions=instructions)},
                      {"role": "user", "content": task.task}]
    metrics = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0, "ran_out_of_turns": False,
               "answered": False}
    started = time.perf_counter()
    while True:
        if metrics["turns"] >= max_turns:
            metrics["ran_out_of_turns"] = True
            break
        metrics["turns"] += 1
        history = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]
        response = await client.chat.completions.create(model=model, messages=history, tools=toolbox.openai_tools,
                                                        tool_choice=tool_choice if metrics["turns"] == 1
                                                        else "auto", max_tokens=max_tokens,
                                                        temperature=temperature)
        if not getattr(response, "choices", None):
            raise RuntimeError(f"the policy {model} answered with no choice")
        choice = response.choices[0]
        messages.append(choice)
        calls = choice.message.tool_calls or []
        if not calls:
            metrics["answered"] = bool((choice.message.content or "").strip())
            break
        for call in calls:
            metrics["tool_calls"] += 1
            result = await _run_call(toolbox, call)
            metrics["tool_errors"] += result.is_error
            metrics["tool_timeouts"] += result.timed_out
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text or "(no output)"})
    metrics["latency_s"] = time.perf_counter() - started
    return Trajectory(messages_and_choices=messages, tools=toolbox.openai_tools, metrics=metrics,
                      metadata={"task_id": task.id, "task": task.task, "split": task.split, "policy": model})


def _check_tool_choice(tool_choice: Any, names: list[str] | None = None) -> None:
    if tool_choice in ("auto", "required"):
        return
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not isinstance(name, str) or tool_choice.get("type", "function") != "function":
        raise ValueError("tool_choice must be 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}, "
                         f"got {tool_choice!r}")
    if names is not None and name not in names:
        raise ValueError(f"tool_choice names {name!r}, which is not a tool of the server ({', '.join(names)})")


async def _run_call(toolbox: MCPToolbox, call: Any) -> ToolCallResult:
    fn = getattr(call, "function", None)
    name = getattr(fn, "name", None)
    if fn is None or not isinstance(name, str):
        return ToolCallResult("error: a tool call must name a function", is_error=True)
    try:
        arguments = json.loads(fn.arguments or "{}")
    except (ValueError, TypeError) as exc:
        return ToolCallResult(f"error: the arguments of {name} are not valid JSON ({exc})", is_error=True)
    return await toolbox.call(name, arguments)


# ---- training --------------------------------------------------------------------------------------------


class MCPRLConfig(pydantic.BaseModel):
    """The loop's settings.

    `steps` is the total number of training steps of the model, not a count added to it: a model at step
    `k` (a resumed run) takes `steps - k` more, none when `steps <= k` (as the examples count to a total).
    Each step rolls out `groups_per_step` training tasks (drawn with `seed`) `group_size` times;
    `max_exceptions` (a count, or a fraction < 1 of the step's rollouts) may raise before the step fails
    with `TooManyExceptions`. `tool_choice` is the first turn's (see `rollout`). `eval_rollouts`: rollouts
    of each test task before and after training for the evaluation (0: no evaluation). The rest go to
    `rollout`."""

    model_config = pydantic.ConfigDict(extra="forbid")

    steps: int = pydantic.Field(1, ge=0)
    groups_per_step: int = pydantic.Field(2, ge=1)
    group_size: int = pydantic.Field(4, ge=2)
    max_turns: int = pydantic.Field(6, ge=1)
    max_tokens: int = pydantic.Field(256, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0, le=2)
    max_exceptions: float = pydantic.Field(0.25, ge=0)
    tool_choice: str | dict = "auto"
    eval_rollouts: int = pydantic.Field(2, ge=0, le=64)
    seed: int = 0

    @pydantic.field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value):
        _check_tool_choice(value)
        return value


@dataclass
class MCPRLEvaluation:
    """The policy on the test tasks before and after training, judged by RULER relative within groups: for
    each test task, `eval_rollouts` rollouts of the policy before training and as many after it form one
    group that the judge ranks together. `before_mean` and `after_mean` are the mean RULER scores of the two
    halves over the groups the judge scored (`groups_scored` of `tasks`; None when it scored none); an
    after-mean above the before-mean says the judge preferred the trained policy. `groups`: the scored
    groups (each trajectory's `metadata["eval"]` is "before" or "after")."""

    tasks: int
    groups_scored: int
    before_mean: float | None
    after_mean: float | None
    groups: list[TrajectoryGroup] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "groups_scored": self.groups_scored, "before_mean": self.before_mean,
                "after_mean": self.after_mean}


@dataclass
class MCPRLResult:
    """What `train_mcp_rl` did: each step's run-log row, its scored groups, and the test-split evaluation
    (None when there are no test tasks, `eval_rollouts` is 0 or no step was taken)."""

    rows: list[dict] = field(default_factory=list)
    groups: list[list[TrajectoryGroup]] = field(default_factory=list)
    evaluation: MCPRLEvaluation | None = None


async def train_mcp_rl(model: Any, toolbox: MCPToolbox, tasks: TaskSet, *, judge: str | None = None,
                       judge_params: dict | None = None, config: MCPRLConfig | None = None,
                       train_config: Any = None) -> MCPRLResult:
    """Train registered `model` (a `trainer.TrainableModel`) on `tasks.train` with the tools of `toolbox`,
    RULER (`judge`, any litellm model; RULER's default when None) as the reward, until the model's step is
    `config.steps` (a total; see `MCPRLConfig`); `train_config` is the `trainer.TrainConfig` of every step.
    Groups the judge cannot score are dropped (logged), rollouts that raise are counted against
    `config.max_exceptions`. When there are test tasks (and `config.eval_rollouts` > 0 and a step is taken),
    the policy is rolled out on them before the first step and after the last, and RULER ranks the two
    together (`MCPRLResult.evaluation`, see `MCPRLEvaluation`)."""
    from trainer.config import TrainConfig

    config = config or MCPRLConfig()
    if not isinstance(config, MCPRLConfig):
        raise TypeError(f"config must be an MCPRLConfig, got {type(config).__name__}")
    if train_config is not None and not isinstance(train_config, TrainConfig):
        raise TypeError(f"train_config must be a trainer.TrainConfig, got {type(train_config).__name__}")
    if not isinstance(tasks, TaskSet) or not tasks.train:
        raise ValueError("tasks must be a TaskSet with at least one training task (write_tasks)")
    if not isinstance(toolbox, MCPToolbox) or not toolbox.openai_tools:
        raise ValueError("toolbox must be a connected MCPToolbox (inside `async with`)")
    if not callable(getattr(model, "openai_client", None)) or not callable(getattr(model, "train", None)):
        raise TypeError(f"model must be a registered trainer.TrainableModel, got {type(model).__name__}")
    _check_tool_choice(config.tool_choice, toolbox.tool_names)
    rng = random.Random(config.seed)
    result = MCPRLResult()
    max_exceptions = config.max_exceptions if config.max_exceptions < 1 else int(config.max_exceptions)

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if len(group.trajectories) < 2:  # every rollout (or all but one) raised: nothing to rank
            return None
        return await ruler_score_group(group, judge, judge_params, swallow_exceptions=True)

    def rollouts(task: MCPTask, n: int) -> list:
        return [rollout(task, toolbox, client, model.get_inference_name(), max_turns=config.max_turns,
                        max_tokens=config.max_tokens, temperature=config.temperature,
                        tool_choice=config.tool_choice) for _ in range(n)]

    async def eval_rollouts(label: str) -> list[list[Trajectory]]:
        groups = await gather_trajectory_groups(
            [TrajectoryGroup(rollouts(t, config.eval_rollouts), metadata={"task_id": t.id}) for t in tasks.test],
            max_exceptions=max_exceptions, pbar_desc=f"mcp-rl eval {label}")
        for g in groups:
            for t in g.trajectories:
                t.metadata["eval"] = label
        return [list(g.trajectories) for g in groups]

    client = model.openai_client()
    start = await model.get_step()
    evaluate = bool(tasks.test) and config.eval_rollouts > 0 and start < config.steps
    before = await eval_rollouts("before") if evaluate else []
    for step in range(start, config.steps):
        picked = rng.sample(tasks.train, min(config.groups_per_step, len(tasks.train)))
        groups = await gather_trajectory_groups(
            [TrajectoryGroup(rollouts(t, config.group_size), metadata={"task_id": t.id}) for t in picked],
            after_each=score, max_exceptions=max_exceptions, pbar_desc=f"mcp-rl step {step}")
        if len(groups) < len(picked):
            log.warning("step %d: the judge scored %d of %d groups", step, len(groups), len(picked))
        row = await model.train(groups, train_config or TrainConfig())
        result.rows.append(row)
        result.groups.append(groups)
    if evaluate:
        after = await eval_rollouts("after")
        mixed = [TrajectoryGroup(b + a, metadata={"task_id": t.id, "eval": True})
                 for t, b, a in zip(tasks.test, before, after, strict=True)]
        scored = [g for g in await asyncio.gather(*(score(g) for g in mixed)) if g is not None]
        halves = {label: [t.reward for g in scored for t in g.trajectories if t.metadata.get("eval") == label]
                  for label in ("before", "after")}
        result.evaluation = MCPRLEvaluation(
            tasks=len(tasks.test), groups_scored=len(scored),
            before_mean=sum(halves["before"]) / len(halves["before"]) if halves["before"] else None,
            after_mean=sum(halves["after"]) / len(halves["after"]) if halves["after"] else None, groups=scored)
    return result
