"""A small MCP server (stdio) for MCP·RL's bad-input tests: `echo` answers, `boom` raises, `hang` never returns,
`die` kills the server."""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("faults", instructions="Tools that work, fail and hang.")


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


if __name__ == "__main__":
    server.run("stdio")
