"""The email agent's tools, as OpenAI tool schemas and Python functions bound to one inbox and date.

    tools = InboxTools(db_path, inbox="beck-s", query_date="2001-06-30")
    tools.search_inbox(["budget", "review"], from_addr="sally", max_results=5)  -> [{message_id, snippet}]
    tools.read_email("<123.JavaMail.evans@thyme>")                               -> the email, or an error
    tools.call(name, arguments_json)                                             -> what the agent sees

Keywords are matched as quoted FTS5 phrases (all must match), so FTS5 operators and quotes in them
are plain text, never query syntax; every value reaches SQLite as a bound parameter. Dates may be
given in any common format and are read as UTC. Only emails of the inbox dated up to the query date
are visible.
"""

from __future__ import annotations

import json
from datetime import timezone
from pathlib import Path

from dateutil import parser as dateparser

from evals.art_e.inbox import open_readonly

MAX_RESULTS = 10

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": "search_inbox",
        "description": "Full-text search of the user's inbox. Returns up to max_results emails as message_id and a snippet.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "array", "items": {"type": "string"}, "description": "Words that must all appear."},
            "from_addr": {"type": "string", "description": "Part of the sender's address."},
            "to_addr": {"type": "string", "description": "Part of a recipient's address (to or cc)."},
            "sent_after": {"type": "string", "description": "Only emails sent after this date (YYYY-MM-DD)."},
            "sent_before": {"type": "string", "description": "Only emails sent before this date (YYYY-MM-DD)."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email",
        "description": "Read one email by its message_id.",
        "parameters": {"type": "object", "properties": {"message_id": {"type": "string"}}, "required": ["message_id"]}}},
    {"type": "function", "function": {
        "name": "return_final_answer",
        "description": "Give the final answer and the message_ids of the emails it comes from. Ends the task.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}}},
            "required": ["answer", "sources"]}}},
]


class ToolError(ValueError):
    """A tool call the agent got wrong (bad arguments); its message is shown to the agent."""


def to_utc_iso(value: str, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{name} must be a date string such as 2001-05-31")
    try:
        dt = dateparser.parse(value)
    except (ValueError, OverflowError):
        raise ToolError(f"{name}: cannot read the date {value!r}; use YYYY-MM-DD") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat()


def fts_query(keywords) -> str:
    """Keywords as an FTS5 query of quoted phrases (operators and quotes inside become plain text)."""
    if isinstance(keywords, str):
        keywords = keywords.split()
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise ToolError("keywords must be a list of strings")
    words = [k.strip() for k in keywords if k and k.strip()]
    if not words:
        raise ToolError("give at least one keyword")
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


def inbox_for_address(db_path: str | Path, address: str) -> str:
    """The inbox whose owner is `address` (hub questions name the address, not the maildir owner)."""
    db = open_readonly(db_path)
    try:
        row = db.execute("SELECT inbox FROM inboxes WHERE lower(address) = lower(?)", (address.strip(),)).fetchone()
    finally:
        db.close()
    if row is None:
        raise ValueError(f"no inbox owned by {address!r} in {db_path}")
    return row[0]


class InboxTools:
    def __init__(self, db_path: str | Path, inbox: str, query_date: str | None = None):
        self.db = open_readonly(db_path, check_same_thread=False)
        if self.db.execute("SELECT 1 FROM inboxes WHERE inbox = ?", (inbox,)).fetchone() is None:
            raise ValueError(f"inbox {inbox!r} is not in {db_path}")
        self.inbox = inbox
        self.until = to_utc_iso(query_date, "query_date") if query_date else None
        self.final_answer: dict | None = None

    def search_inbox(self, keywords, from_addr: str | None = None, to_addr: str | None = None,
                     sent_after: str | None = None, sent_before: str | None = None,
                     max_results: int = MAX_RESULTS) -> list[dict]:
        if isinstance(max_results, bool) or not isinstance(max_results, int) or not 1 <= max_results <= MAX_RESULTS:
            raise ToolError(f"max_results must be an integer from 1 to {MAX_RESULTS}")
        sql = ["SELECT e.message_id, snippet(emails_fts, 1, '**', '**', ' ... ', 24) AS snippet",
               "FROM emails_fts JOIN emails e ON e.id = emails_fts.rowid",
               "WHERE emails_fts MATCH ? AND e.inbox = ?"]
        args: list = [fts_query(keywords), self.inbox]
        for value, clause, name in ((from_addr, "e.from_addr LIKE ?", "from_addr"),
                                    (to_addr, "(e.to_addrs LIKE ? OR e.cc_addrs LIKE ?)", "to_addr")):
            if value is not None:
                if not isinstance(value, str):
                    raise ToolError(f"{name} must be a string")
                sql.append("AND " + clause)
                args += [f"%{value.strip()}%"] * clause.count("?")
        if sent_after is not None:
            sql.append("AND e.date > ?")
            args.append(to_utc_iso(sent_after, "sent_after"))
        if sent_before is not None:
            sql.append("AND e.date < ?")
            args.append(to_utc_iso(sent_before, "sent_before"))
        if self.until:
            sql.append("AND e.date <= ?")
            args.append(self.until)
        sql.append("ORDER BY bm25(emails_fts) LIMIT ?")
        args.append(max_results)
        return [dict(r) for r in self.db.execute(" ".join(sql), args)]

    def read_email(self, message_id) -> dict:
        if not isinstance(message_id, str) or not message_id.strip():
            raise ToolError("message_id must be a non-empty string")
        row = self.db.execute("SELECT message_id, date, from_addr, to_addrs, cc_addrs, bcc_addrs, subject, body "
                              "FROM emails WHERE inbox = ? AND message_id = ?" + (" AND date <= ?" if self.until else ""),
                              (self.inbox, message_id.strip(), *([self.until] if self.until else []))).fetchone()
        if row is None:
            return {"error": f"no email with message_id {message_id!r} in this inbox"}
        return dict(row)

    def return_final_answer(self, answer, sources) -> dict:
        if not isinstance(answer, str):
            raise ToolError("answer must be a string")
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise ToolError("sources must be a list of message_id strings")
        self.final_answer = {"answer": answer, "sources": sources}
        return {"status": "final answer recorded"}

    def call(self, name: str, arguments: str | dict) -> str:
        """Run a tool call from the model; the result (or the error) as the JSON text the agent reads."""
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
            if not isinstance(args, dict):
                raise ToolError("arguments must be a JSON object")
            fn = {"search_inbox": self.search_inbox, "read_email": self.read_email,
                  "return_final_answer": self.return_final_answer}.get(name)
            if fn is None:
                raise ToolError(f"unknown tool {name!r}")
            return json.dumps(fn(**args), ensure_ascii=False)
        except json.JSONDecodeError as exc:
            return json.dumps({"error": f"arguments are not valid JSON: {exc.msg}"})
        except TypeError as exc:  # unexpected or missing arguments
            return json.dumps({"error": f"bad arguments for {name}: {exc}"})
        except ToolError as exc:
            return json.dumps({"error": str(exc)})
