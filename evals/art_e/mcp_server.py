"""The ART·E inbox as an MCP server: `search_emails` and `read_email` over one inbox of an inbox database, for
MCP·RL tests and demos (`ruler_rl.trainer.mcp_rl`).

    python -m evals.art_e.mcp_server --db runs/art-e-inbox.db                 # stdio
    python -m evals.art_e.mcp_server --db runs/art-e-inbox.db --http 8765     # streamable HTTP at :8765/mcp

The tools are `evals.art_e.tools.InboxTools`' (ART·E's semantics: all keywords must appear, newest first, at
most 10 results; mail dated on or after `--query-date` is not visible). A wrong argument or an unknown message
id comes back as an MCP tool error (`isError`) with the message the ART·E agent would read. The inbox is
`--inbox` (an address or a mailbox name); without it, the database must hold exactly one mailbox.

Built on the `mcp` SDK's `MCPServer` (what `FastMCP` is called in mcp 2); needs the `mcp` extra.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ruler_rl.judges.extras import require

require("mcp", "the ART·E MCP server (evals.art_e.mcp_server)")

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as MCPToolError

from evals.art_e.inbox import mailbox_owners, normal_address
from evals.art_e.tools import MAX_RESULTS, InboxTools, ToolError

INSTRUCTIONS = ("Search and read the emails of one person's inbox ({address}). search_emails finds emails that "
                "contain every keyword; read_email shows one email by its message_id.")


def resolve_inbox(db_path: str | Path, inbox: str | None) -> str:
    """The inbox address to serve: `inbox` (an address, or a mailbox name of the database), or the database's
    only mailbox when `inbox` is None. ValueError when it cannot be decided or is not in the database."""
    owners = mailbox_owners(db_path)
    if inbox is None:
        if len(owners) != 1:
            raise ValueError(f"{db_path} holds {len(owners)} mailboxes ({', '.join(sorted(owners)) or 'none'}): "
                             "name one with --inbox")
        return next(iter(owners.values()))
    if not isinstance(inbox, str) or not inbox.strip():
        raise ValueError(f"inbox must be an address or a mailbox name, got {inbox!r}")
    return owners.get(inbox) or normal_address(inbox)


def build_server(db_path: str | Path, inbox: str | None = None, query_date: str | None = None) -> MCPServer:
    """An `MCPServer` exposing `search_emails` and `read_email` over the inbox of `inbox` in `db_path` (see the
    module docstring). Raises FileNotFoundError/InboxError for a missing or wrong database and ValueError for
    an inbox it does not hold or a query date that is not YYYY-MM-DD."""
    address = resolve_inbox(db_path, inbox)
    tools = InboxTools(db_path, address, query_date)  # checks the database, the inbox and the date now
    server = MCPServer("art-e-inbox", instructions=INSTRUCTIONS.format(address=address))

    @server.tool()
    def search_emails(keywords: list[str], from_addr: str | None = None, to_addr: str | None = None,
                      sent_after: str | None = None, sent_before: str | None = None,
                      max_results: int = MAX_RESULTS) -> str:
        """Search the inbox: emails containing every keyword in the subject or body, newest first, at most
        max_results (1-10) of them, each as a message_id and a snippet. from_addr/to_addr are whole email
        addresses; sent_after (inclusive) and sent_before (exclusive) are dates, YYYY-MM-DD."""
        try:
            hits = tools.search_emails(keywords, from_addr=from_addr, to_addr=to_addr, sent_after=sent_after,
                                       sent_before=sent_before, max_results=max_results)
        except ToolError as exc:
            raise MCPToolError(str(exc)) from None
        return json.dumps(hits, ensure_ascii=False)

    @server.tool()
    def read_email(message_id: str) -> str:
        """Read one email of the inbox by its message_id: date, subject, sender, recipients and body."""
        try:
            email = tools.read_email(message_id)
        except ToolError as exc:
            raise MCPToolError(str(exc)) from None
        if email is None:
            raise MCPToolError(f"Email not found: no email with message_id {message_id!r} in this inbox")
        return json.dumps(email, ensure_ascii=False)

    return server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="an inbox database (evals.art_e.inbox.build_inbox_db)")
    ap.add_argument("--inbox", default=None, help="address or mailbox name (default: the database's only one)")
    ap.add_argument("--query-date", default=None, help="YYYY-MM-DD: mail dated on or after it is not visible")
    ap.add_argument("--http", type=int, default=None, metavar="PORT",
                    help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    ap.add_argument("--host", default="127.0.0.1", help="with --http: the address to listen on")
    args = ap.parse_args(argv)
    if args.http is not None and not 1 <= args.http <= 65535:
        ap.error(f"--http must be a TCP port (1-65535), got {args.http}")
    try:
        server = build_server(args.db, args.inbox, args.query_date)
    except (OSError, ValueError) as exc:  # InboxError is a ValueError
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.http)


if __name__ == "__main__":
    main()
