"""MCP·RL's connection to an MCP server (`MCPToolbox`): the official `mcp` SDK (a command run over stdio behind
`trainer/mcp_relay.py`, or a streamable HTTP URL), the server's tools (every page) as OpenAI tool schemas, its
resources and instructions, and `MCPToolbox.call`, which runs one tool call with a per-call timeout and turns every
failure (an MCP tool error, a protocol error, an unknown tool, a timeout) into a `ToolCallResult` the agent reads.
A server that cannot be started or reached raises `MCPServerError`, naming the command (or URL) and, for a
command, the end of what it wrote to stderr. What the client reads is bounded (`max_message_bytes`).

Needs the `mcp` extra (`pip install 'ruler-rl[mcp]'`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import sys
import threading
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ruler_rl.judges.extras import require

require("mcp", "MCP·RL (ruler_rl.trainer.mcp_rl)")

import anyio  # installed with mcp
import httpx2  # installed with mcp (its HTTP client)
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from ruler_rl.trainer.mcp_tasks import MAX_RESOURCES, RESOURCE_TEXT_CHARS

log = logging.getLogger("ruler")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-compatible servers accept as a function name
STDERR_TAIL_CHARS = 2000
STDERR_KEEP_BYTES = 64 * 1024  # of a server command's stderr, only the end is kept
MAX_TOOL_PAGES = 100


class MCPServerError(ConnectionError):
    """An MCP server could not be started, reached or listed, or lost its connection (the message names it
    and, for a command, the end of its stderr)."""


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
