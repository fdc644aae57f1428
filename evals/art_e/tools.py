"""The email agent's tools, ART·E's three, as OpenAI tool schemas and Python functions bound to one inbox.

    tools = InboxTools(db_path, "sally.beck@enron.com", query_date="2001-06-30")
    tools.search_emails(["budget", "review"], from_addr="john.doe@enron.com", max_results=5)
        -> [{message_id, snippet}], newest first
    tools.read_email("<123.JavaMail.evans@thyme>")   -> the email (ART's fields), or {"error": ...}
    tools.call(name, arguments_json)                 -> ToolOutcome: the text the agent reads, and what went wrong

ART's semantics: the inbox is every email from or to the address (To/Cc/Bcc); all keywords must appear in
the subject or body; `from_addr`/`to_addr` are whole addresses (case is ignored); `sent_after` is inclusive
and `sent_before` exclusive, both whole days, and an empty date (None or "") is no filter; at most 10
results, newest first, each a message id and a snippet with the matches in `<b>`…`</b>`. An empty keyword
list is an error, as in ART (its `search_emails` raises "No keywords provided"); keywords that are all blank
find nothing, as ART's empty FTS5 phrases do.

Differences from ART's code:

- keywords are matched as quoted FTS5 phrases and every value is a bound parameter, so nothing the agent
  writes is query syntax;
- a date may be written in any common form and is read against the query date (a missing year or month
  comes from the query date, never from today), so the same call always gives the same result;
- a date that cannot be read (or lies outside 1900-2100, or is not a string) is an `UnreadableDate`: the
  agent reads a tool error naming it and the episode goes on (`ToolOutcome.problem == "unreadable_date"`).
  ART pastes the string into its SQL (`e.date >= '<sent_after> 00:00:00'`) and compares text, so there an
  unreadable date silently filters by string order and never ends the episode either;
- every other wrong argument (a wrong type, a NUL character, a `max_results` outside 1-10, no keywords)
  comes back to the agent as a tool error (`bad_tool_call_args`) instead of raising;
- `read_email` reads only the inbox's own mail dated before the query date; ART's reads any message id in
  the whole database, whoever's inbox it is in and whatever its date.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Literal

from dateutil import parser as dateparser

from evals.art_e.inbox import IN_INBOX, normal_address, open_readonly

MAX_RESULTS = 10
SNIPPET_TOKENS = 15
MAX_ARGUMENT_CHARS = 2000

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": "search_emails",
        "description": "Search the user's inbox: emails containing every keyword in the subject or body, newest "
                       "first, at most max_results of them, each as a message_id and a snippet.",
        "parameters": {"type": "object", "properties": {
            "keywords": {"type": "array", "items": {"type": "string"},
                         "description": "Words or phrases that must all appear in the email."},
            "from_addr": {"type": "string", "description": "Only emails sent from this email address."},
            "to_addr": {"type": "string", "description": "Only emails sent to this address (To, Cc or Bcc)."},
            "sent_after": {"type": "string", "description": "Only emails sent on or after this date, YYYY-MM-DD."},
            "sent_before": {"type": "string", "description": "Only emails sent before this date, YYYY-MM-DD."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS,
                            "description": f"At most this many results ({MAX_RESULTS} by default, at most {MAX_RESULTS})."}},
            "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "read_email",
        "description": "Read one email of the user's inbox by its message_id: date, subject, sender, recipients, body.",
        "parameters": {"type": "object", "properties": {"message_id": {"type": "string"}}, "required": ["message_id"]}}},
    {"type": "function", "function": {
        "name": "return_final_answer",
        "description": "Give the final answer to the user's question and the message_ids of the emails it comes "
                       "from (usually one). If the inbox does not hold the answer, answer \"I don't know\" with no "
                       "sources. Ends the task.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string"}, "sources": {"type": "array", "items": {"type": "string"}}},
            "required": ["answer", "sources"]}}},
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)


class ToolError(ValueError):
    """A tool call the agent got wrong (bad arguments); its message is shown to the agent."""


class UnreadableDate(ToolError):
    """`sent_after`/`sent_before` values that are not readable days (`count` of them in one call); the agent
    reads the message and the episode goes on."""

    def __init__(self, message: str, count: int = 1):
        super().__init__(message)
        self.count = count


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call did: the JSON text the agent reads and, if it went wrong, how (ART's rubric terms).

    problem: None; "bad_tool_call_name" (no such tool); "bad_tool_call_args" (arguments not a JSON object,
    or wrong for the tool); "invalid_email" (read_email of a message id not in the inbox); "unreadable_date"
    (search_emails with `unreadable_dates` dates it cannot read; not one of ART's failures, the episode goes on).
    """
    content: str
    problem: Literal["bad_tool_call_name", "bad_tool_call_args", "invalid_email", "unreadable_date"] | None = None
    unreadable_dates: int = 0


def _text(value, name: str, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ToolError(f"{name} must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ToolError(f"{name} must not contain a NUL character")
    if len(value) > MAX_ARGUMENT_CHARS:
        raise ToolError(f"{name} is over {MAX_ARGUMENT_CHARS} characters")
    return value


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_day(value, name: str, today: date) -> date | None:
    """A date the agent wrote, read deterministically: parts it leaves out come from `today` (the query date).

    None for None or a blank string (no filter); `UnreadableDate` for anything else that is not a day
    between 1900 and 2100 (a wrong type, a NUL, text no date parser reads, a year out of range).
    """
    if not isinstance(today, date):
        raise TypeError(f"today must be a datetime.date, got {type(today).__name__}")
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or "\x00" in value or len(value) > MAX_ARGUMENT_CHARS:
        raise UnreadableDate(f"{name} {_shown(value)} is not a date (YYYY-MM-DD)")
    try:
        parsed = dateparser.parse(value, default=datetime(today.year, today.month, today.day))
    except (ValueError, OverflowError, TypeError):  # ParserError is a ValueError; a year of 10**30 overflows
        raise UnreadableDate(f"{name} {_shown(value)} is not a date (YYYY-MM-DD)") from None
    if not 1900 <= parsed.year <= 2100:
        raise UnreadableDate(f"{name} {_shown(value)} is not a date between 1900 and 2100 (YYYY-MM-DD)")
    return parsed.date()


def _day_start(day: date) -> str:
    return day.strftime("%Y-%m-%d 00:00:00")


def fts_query(keywords) -> str | None:
    """Keywords as an FTS5 query of quoted phrases (operators and quotes inside become plain text); None if empty."""
    if not isinstance(keywords, list):
        raise ToolError(f"keywords must be a list of strings, got {type(keywords).__name__}")
    words = [_text(k, "each keyword").strip() for k in keywords]
    words = [w for w in words if w]
    if not words:
        return None
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


class InboxTools:
    """ART·E's tools over the inbox of one address, seeing only mail dated before `query_date`."""

    def __init__(self, db_path: str | Path, inbox_address: str, query_date: str | None = None):
        self.db = open_readonly(db_path, check_same_thread=False)
        self.inbox = normal_address(inbox_address)
        if query_date is None:
            self.today, self.until = date(2100, 1, 1), None
        else:
            if not isinstance(query_date, str):
                raise ValueError(f"query_date must be a YYYY-MM-DD string, got {query_date!r}")
            try:
                self.today = date.fromisoformat(query_date[:10])
            except ValueError:
                raise ValueError(f"query_date must be YYYY-MM-DD, got {query_date!r}") from None
            self.until = _day_start(self.today)
        found = self.db.execute(f"SELECT 1 FROM emails e WHERE {IN_INBOX} LIMIT 1", {"inbox": self.inbox}).fetchone()
        if found is None:
            self.db.close()
            raise ValueError(f"no email from or to {self.inbox} in {db_path}")
        self.final_answer: dict | None = None

    def close(self) -> None:
        self.db.close()

    def search_emails(self, keywords, from_addr: str | None = None, to_addr: str | None = None,
                      sent_after: str | None = None, sent_before: str | None = None,
                      max_results: int = MAX_RESULTS) -> list[dict]:
        """The inbox's emails holding every keyword (newest first), as [{message_id, snippet}].

        Raises ToolError for wrong arguments (an empty keyword list among them, as ART's raises) and, once
        every other argument is right, UnreadableDate for dates it cannot read (see the module docstring).
        """
        if isinstance(max_results, bool) or not isinstance(max_results, int) or not 1 <= max_results <= MAX_RESULTS:
            raise ToolError(f"max_results must be an integer from 1 to {MAX_RESULTS}")
        if isinstance(keywords, list) and not keywords:
            raise ToolError("keywords must hold at least one word (no keywords provided for search)")
        query = fts_query(keywords)
        from_addr = _text(from_addr, "from_addr", required=False)
        to_addr = _text(to_addr, "to_addr", required=False)
        days, unreadable = {}, []
        for name, value in (("sent_after", sent_after), ("sent_before", sent_before)):
            try:
                days[name] = parse_day(value, name, self.today)
            except UnreadableDate as exc:
                unreadable.append(str(exc))
        if unreadable:
            raise UnreadableDate("; ".join(unreadable), count=len(unreadable))
        if query is None:  # keywords all blank: ART's empty FTS5 phrases match nothing either
            return []
        sql = [f"SELECT e.message_id, snippet(emails_fts, -1, '<b>', '</b>', ' ... ', {SNIPPET_TOKENS}) AS snippet",
               "FROM emails e JOIN emails_fts ON e.id = emails_fts.rowid",
               f"WHERE emails_fts MATCH :query AND {IN_INBOX}"]
        args: dict = {"query": query, "inbox": self.inbox, "limit": max_results}
        if from_addr is not None:
            sql.append("AND e.from_address = :from_addr")
            args["from_addr"] = from_addr.strip().lower()
        if to_addr is not None:
            sql.append("AND EXISTS (SELECT 1 FROM recipients t WHERE t.recipient_address = :to_addr "
                       "AND t.email_id = e.id)")
            args["to_addr"] = to_addr.strip().lower()
        if days["sent_after"] is not None:
            sql.append("AND e.date >= :after")
            args["after"] = _day_start(days["sent_after"])
        if days["sent_before"] is not None:
            sql.append("AND e.date < :before")
            args["before"] = _day_start(days["sent_before"])
        if self.until:
            sql.append("AND e.date < :until")
            args["until"] = self.until
        sql.append("ORDER BY e.date DESC, e.id DESC LIMIT :limit")
        return [dict(r) for r in self.db.execute(" ".join(sql), args)]

    def read_email(self, message_id) -> dict | None:
        """The email (ART's fields) if it is in this inbox and dated before the query date, else None (ART's
        read_email reads any message id in the database)."""
        message_id = _text(message_id, "message_id").strip()
        row = self.db.execute(f"SELECT e.id, e.message_id, e.date, e.subject, e.from_address, e.body, e.file_name "
                              f"FROM emails e WHERE e.message_id = :mid AND {IN_INBOX}"
                              + (" AND e.date < :until" if self.until else ""),
                              {"mid": message_id, "inbox": self.inbox, "until": self.until}).fetchone()
        if row is None:
            return None
        out = {k: row[k] for k in ("message_id", "date", "subject", "from_address")}
        out.update(to_addresses=[], cc_addresses=[], bcc_addresses=[])
        for addr, kind in self.db.execute("SELECT recipient_address, recipient_type FROM recipients WHERE email_id = ?",
                                          (row["id"],)):
            out[f"{kind}_addresses"].append(addr)
        out.update(body=row["body"], file_name=row["file_name"])
        return out

    def return_final_answer(self, answer, sources) -> dict:
        answer = _text(answer, "answer")
        if not isinstance(sources, list):
            raise ToolError(f"sources must be a list of message_id strings, got {type(sources).__name__}")
        sources = [_text(s, "each source") for s in sources]
        self.final_answer = {"answer": answer, "sources": sources}
        return {"status": "final answer recorded"}

    def call(self, name, arguments: str | dict) -> ToolOutcome:
        """Run a tool call from the model. Never raises for the model's mistakes: they come back as tool errors."""
        fn = {"search_emails": self.search_emails, "read_email": self.read_email,
              "return_final_answer": self.return_final_answer}.get(name) if isinstance(name, str) else None
        if fn is None:
            return ToolOutcome(json.dumps({"error": f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}"}),
                               "bad_tool_call_name")
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
            if not isinstance(args, dict):
                raise ToolError("arguments must be a JSON object")
            result = fn(**args)
        except json.JSONDecodeError as exc:
            return ToolOutcome(json.dumps({"error": f"arguments are not valid JSON: {exc.msg}"}), "bad_tool_call_args")
        except TypeError as exc:  # unexpected or missing arguments
            return ToolOutcome(json.dumps({"error": f"bad arguments for {name}: {exc}"}), "bad_tool_call_args")
        except UnreadableDate as exc:  # the agent reads it and goes on (ART never ends the episode on a date)
            return ToolOutcome(json.dumps({"error": str(exc)}), "unreadable_date", unreadable_dates=exc.count)
        except (ToolError, RecursionError) as exc:
            return ToolOutcome(json.dumps({"error": str(exc)}), "bad_tool_call_args")
        except sqlite3.Error as exc:  # nothing the agent writes should reach here; if it does, it is still its call
            return ToolOutcome(json.dumps({"error": f"{name} failed: {exc}"}), "bad_tool_call_args")
        if name == "read_email" and result is None:
            return ToolOutcome(json.dumps({"error": "Email not found: no email with that message_id in this inbox"}),
                               "invalid_email")
        return ToolOutcome(json.dumps(result, ensure_ascii=False))

