"""A small MCP server (stdio) for MCP·RL's bad-input tests: `echo` answers, `boom` raises, `hang` never returns,
`die` kills the server, `getenv` and `getcwd` show the server's environment and working directory, `huge` answers
megabytes, `shout` writes megabytes to stderr; one resource. `--http PORT`: over streamable HTTP instead of stdio.

`--mode silent`: a process that reads its stdin and never answers (a server stuck before the handshake)."""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("faults", instructions=f"Tools that work, fail and hang. (FAULTS_NOTE: "
                                         f"{os.environ.get('FAULTS_NOTE', '<unset>')}; cwd: {os.getcwd()})")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return f"echo: {text}"


@server.tool()
def boom(reason: str = "") -> str:
    """Always fails."""
    raise RuntimeError(f"boom {reason}")


@server.tool()
async def hang() -> str:
    """Never returns."""
    await asyncio.sleep(3600)
    return "never"


@server.tool()
def die() -> str:
    """Kills the server."""
    print("fatal: the index is corrupt", file=sys.stderr, flush=True)
    os._exit(1)


@server.tool()
def getenv(name: str) -> str:
    """The value of an environment variable of the server ('<unset>' when it has none)."""
    return os.environ.get(name, "<unset>")


@server.tool()
def getcwd() -> str:
    """The server's working directory."""
    return os.getcwd()


@server.tool()
def huge(megabytes: int) -> str:
    """A result of that many megabytes."""
    return "x" * (megabytes * 2**20)


@server.tool()
def shout(megabytes: int) -> str:
    """Writes that many megabytes to stderr, then answers."""
    block = "e" * 2**20
    for _ in range(megabytes):
        sys.stderr.write(block)
    sys.stderr.write("\nlast words\n")
    sys.stderr.flush()
    return "shouted"


@server.resource("faults://runbook", name="runbook", description="What to do when a tool fails.")
def runbook() -> str:
    return "Retry once, then report."


if __name__ == "__main__":
    if sys.argv[1:] == ["--mode", "silent"]:
        for _ in sys.stdin:  # read the handshake, never answer
            pass
        sys.exit(0)  # the client closed the pipe
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    server.run("stdio")
