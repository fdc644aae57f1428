"""A relay between MCP·RL's client and an MCP server command over stdio, bounding what the client reads.

    python mcp_relay.py --max-bytes N -- <server command ...>

The server runs as this process's child; its stdin and stderr are passed through. Each newline-delimited
JSON-RPC message it writes to stdout is passed on whole when it is at most N bytes. A longer one is not read
into memory: the relay keeps its first and last few kilobytes, drops the rest as it arrives, and sends the
client, in its place, a JSON-RPC error answering the same request, so the tool call ends with an error naming
the limit instead of the client reading 50 MB to keep 8,000 characters of it. The request is the one among the
client's requests still unanswered (the relay reads their ids on the way in) whose id stands first or last in
the message (Python SDKs write it first, the TypeScript SDK last). A message that answers none of them (the
server's own request or notification) is dropped and logged to stderr.

Standard library only, run by path: it works whatever environment the server command is given.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading

CHUNK = 64 * 1024
ENDS = 4096  # bytes kept of each end of a message over the limit
ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
OVERSIZED = -32090  # a JSON-RPC server-defined error code no MCP SDK uses: the message was over the limit


class Pending:
    """The ids of the client's requests not yet answered (thread-safe: filled on the way in, read on the way out)."""

    def __init__(self):
        self.ids: dict[str, None] = {}
        self.lock = threading.Lock()

    def sent(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            return
        for m in message if isinstance(message, list) else [message]:
            if isinstance(m, dict) and "method" in m and m.get("id") is not None:
                with self.lock:
                    self.ids[json.dumps(m["id"])] = None
                    while len(self.ids) > 10_000:
                        del self.ids[next(iter(self.ids))]

    def passed(self, line: bytes) -> None:
        """A message passed on whole: the request it answers (its top-level id) is no longer pending."""
        if len(line) <= 2 * ENDS:
            try:
                message = json.loads(line)
            except ValueError:
                return
            if isinstance(message, dict) and "method" not in message and message.get("id") is not None:
                with self.lock:
                    self.ids.pop(json.dumps(message["id"]), None)
        else:
            self.answered(line[:ENDS], line[-ENDS:])

    def answered(self, head: bytes, tail: bytes) -> str | None:
        """The pending id among the first id in `head` and the last in `tail` (taken off the list), or None."""
        firsts = ID.findall(head)[:1]
        lasts = ID.findall(tail)[-1:]
        with self.lock:
            for raw in [*firsts, *lasts]:
                key = json.dumps(json.loads(raw))
                if key in self.ids:
                    del self.ids[key]
                    return key
        return None


def oversized_error(request_id: str, limit: int) -> bytes:
    """The JSON-RPC error line that answers request `request_id` (as JSON) in place of a message over `limit`."""
    error = {"jsonrpc": "2.0", "id": json.loads(request_id),
             "error": {"code": OVERSIZED, "message": f"the server's answer was over {limit:,} bytes; MCP·RL stopped "
                                                     "reading it (MCPToolbox max_message_bytes)"}}
    return json.dumps(error).encode() + b"\n"


def relay_stdout(source, sink, limit: int, pending: Pending) -> None:
    """Copy newline-delimited messages from `source` to `sink`, standing in for those over `limit` bytes."""
    line = bytearray()
    dropping = False
    head = tail = b""
    while True:
        chunk = source.read1(CHUNK) if hasattr(source, "read1") else source.read(CHUNK)
        if not chunk:
            break
        while chunk:
            end = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if end < 0 else (chunk[:end + 1], chunk[end + 1:])
            if not dropping and len(line) + len(piece) - piece.endswith(b"\n") > limit:
                dropping, head, tail = True, bytes((line + piece)[:ENDS]), b""
                line.clear()
            if not dropping:
                line += piece
                if piece.endswith(b"\n"):
                    pending.passed(bytes(line))
                    sink.write(bytes(line))
                    sink.flush()
                    line.clear()
                continue
            tail = (tail + piece)[-ENDS:]
            if piece.endswith(b"\n"):
                dropping = False
                answered = pending.answered(head, tail)
                if answered is None:
                    print(f"mcp_relay: dropped a message over {limit:,} bytes that answers no pending request: "
                          f"{head[:200]!r}", file=sys.stderr, flush=True)
                else:
                    sink.write(oversized_error(answered, limit))
                    sink.flush()
    if line and not dropping:
        sink.write(bytes(line))
        sink.flush()


def relay_stdin(source, sink, pending: Pending) -> None:
    """Pass the client's messages to the server, noting the ids of its requests."""
    try:
        for line in iter(source.readline, b""):
            pending.sent(line)
            sink.write(line)
            sink.flush()
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            sink.close()
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, required=True, help="the longest message passed on, in bytes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.max_bytes < 1 or not command:
        parser.error("give --max-bytes >= 1 and the server command after --")
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # stderr: inherited
    except OSError as exc:
        print(f"mcp_relay: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127

    def forward(signum, _frame):
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    pending = Pending()
    threading.Thread(target=relay_stdin, args=(sys.stdin.buffer, child.stdin, pending), daemon=True).start()
    try:
        relay_stdout(child.stdout, sys.stdout.buffer, args.max_bytes, pending)
    except BrokenPipeError:  # the client went away
        child.terminate()
    return child.wait()


if __name__ == "__main__":
    os._exit(main())
