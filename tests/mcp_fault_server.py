"""A small MCP server (stdio) for MCP·RL's bad-input tests: `echo` answers, `boom` raises, `hang` never returns,
`die` kills the server, `getenv` and `getcwd` show the server's environment and working directory; one resource.

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


@server.resource("faults://runbook", name="runbook", description="What to do when a tool fails.")
def runbook() -> str:
    return "Retry once, then report."


if __name__ == "__main__":
    if sys.argv[1:] == ["--mode", "silent"]:
        for _ in sys.stdin:  # read the handshake, never answer
            pass
        sys.exit(0)  # the client closed the pipe
    server.run("stdio")
