"""A relay between MCP·RL's client and an MCP server command over stdio, bounding what the client reads.

    python mcp_relay.py --max-bytes N -- <server command ...>

The server runs as this process's child; its stdin and stderr are passed through. Each newline-delimited
JSON-RPC message it writes to stdout is passed on whole when it is at most N bytes. A longer one is not read
into memory: the relay keeps its first bytes, drops the rest as it arrives, and sends the client, in its place,
a JSON-RPC error answering the same request id (found in those first bytes), so the tool call ends with an
error naming the limit instead of the client reading 50 MB to keep 8,000 characters of it. (A message whose id
is not among its first bytes is dropped and logged to stderr; its call then times out.)

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
ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
OVERSIZED = -32090  # a JSON-RPC server-defined error code no MCP SDK uses: the message was over the limit


def oversized_error(prefix: bytes, limit: int) -> bytes | None:
    """The JSON-RPC error line that stands in for a message over `limit` bytes, answering the request id found
    in its first bytes `prefix`; None when none is there (or the message is a request or a notification)."""
    if b'"method"' in prefix:  # the server's own request or notification: nothing answers it
        return None
    found = ID.search(prefix)
    if found is None:
        return None
    error = {"jsonrpc": "2.0", "id": json.loads(found.group(1)),
             "error": {"code": OVERSIZED, "message": f"the server's answer was over {limit:,} bytes; MCP·RL stopped "
                                                     "reading it (MCPToolbox max_message_bytes)"}}
    return json.dumps(error).encode() + b"\n"


def relay_stdout(source, sink, limit: int) -> None:
    """Copy newline-delimited messages from `source` to `sink`, standing in for those over `limit` bytes."""
    line = bytearray()
    dropping = False
    prefix = b""
    while True:
        chunk = source.read1(CHUNK) if hasattr(source, "read1") else source.read(CHUNK)
        if not chunk:
            break
        while chunk:
            end = chunk.find(b"\n")
            piece, chunk = (chunk, b"") if end < 0 else (chunk[:end + 1], chunk[end + 1:])
            if dropping:
                if piece.endswith(b"\n"):
                    dropping = False
                    stand_in = oversized_error(prefix, limit)
                    if stand_in is None:
                        print(f"mcp_relay: dropped a message over {limit:,} bytes with no request id in its first "
                              f"bytes: {prefix[:200]!r}", file=sys.stderr, flush=True)
                    else:
                        sink.write(stand_in)
                        sink.flush()
                continue
            line += piece
            if piece.endswith(b"\n"):
                sink.write(bytes(line))
                sink.flush()
                line.clear()
            elif len(line) > limit:
                dropping, prefix = True, bytes(line[:4096])
                line.clear()
    if line and not dropping:
        sink.write(bytes(line))
        sink.flush()


def relay_stdin(source, sink) -> None:
    try:
        while True:
            chunk = source.read1(CHUNK) if hasattr(source, "read1") else source.read(CHUNK)
            if not chunk:
                break
            sink.write(chunk)
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
    threading.Thread(target=relay_stdin, args=(sys.stdin.buffer, child.stdin), daemon=True).start()
    try:
        relay_stdout(child.stdout, sys.stdout.buffer, args.max_bytes)
    except BrokenPipeError:  # the client went away
        child.terminate()
    return child.wait()


if __name__ == "__main__":
    os._exit(main())
