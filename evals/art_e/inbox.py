"""The inbox database, as ART·E builds it: Enron maildirs (tarballs or folders) in SQLite with FTS5.

An inbox is an *address*, not a mail folder: the inbox of `sally.beck@enron.com` is every email in the
database sent from that address or to it (To, Cc or Bcc), whichever mailbox it was filed in. Each email
is stored once (`emails`), its recipients in `recipients` (address, `to`/`cc`/`bcc`), and subject and
body are indexed by FTS5. ART's filters apply while ingesting:

- a body over `MAX_BODY_CHARS` (5,000) characters: dropped;
- over `MAX_RECIPIENTS` (30) recipients, To + Cc + Bcc as listed: dropped;
- the same subject, body and sender as an email already kept: dropped as a copy (the Enron folders file
  one message under several Message-IDs: inbox/, all_documents/, discussion_threads/ ...);
- a Message-ID already kept: dropped.

Beyond ART's filters (its source data had none of these): bytes that are not an email, a message without
a Message-ID, and a Date that cannot be read are skipped too (an email without a date could not be placed
before or after a question's date). Every skip is counted by reason in the `BuildReport`.

Dates are stored as ART stores them: UTC, `YYYY-MM-DD HH:MM:SS`. Addresses are stored lower-cased.
`build_inbox_db` always builds a new database from the sources given and replaces the file only when the
build succeeded, so a corrupt tarball never leaves a half-built database behind. Each mailbox's owner
(the address most often among its recipients) is recorded in `mailboxes`; question sets use those
owners as their inboxes.
"""

from __future__ import annotations

import email
import hashlib
import json
import os
import sqlite3
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timezone
from email import policy
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path

MAX_BODY_CHARS = 5000
MAX_RECIPIENTS = 30
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

SCHEMA = """
CREATE TABLE IF NOT EXISTS emails (
    id INTEGER PRIMARY KEY, message_id TEXT NOT NULL UNIQUE, subject TEXT, from_address TEXT, date TEXT NOT NULL,
    body TEXT, file_name TEXT, dedup_key TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS recipients (
    email_id INTEGER NOT NULL REFERENCES emails(id), recipient_address TEXT NOT NULL, recipient_type TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS emails_from ON emails (from_address);
CREATE INDEX IF NOT EXISTS emails_date ON emails (date);
CREATE INDEX IF NOT EXISTS recipients_address_email ON recipients (recipient_address, email_id);
CREATE INDEX IF NOT EXISTS recipients_email ON recipients (email_id);
CREATE VIRTUAL TABLE IF NOT EXISTS emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
CREATE TABLE IF NOT EXISTS mailboxes (name TEXT PRIMARY KEY, address TEXT, files INTEGER, emails INTEGER, built REAL);
"""

# the shared Enron mailboxes beside the repository (../shared/data/enron), as in this workplace and CI
ENRON_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "enron"

# the SQL condition "email e is in the inbox of the address bound as :inbox"
IN_INBOX = ("(e.from_address = :inbox OR EXISTS (SELECT 1 FROM recipients r WHERE r.recipient_address = :inbox "
            "AND r.email_id = e.id))")


class InboxError(ValueError):
    """A source that cannot be ingested (missing, not a tarball or folder, corrupt)."""


@dataclass
class BuildReport:
    mailboxes: dict[str, int] = field(default_factory=dict)    # mailbox -> emails kept from it
    files: dict[str, int] = field(default_factory=dict)        # mailbox -> files read
    skipped: Counter = field(default_factory=Counter)          # reason -> count
    seconds: float = 0.0
    db_bytes: int = 0

    @property
    def emails(self) -> int:
        return sum(self.mailboxes.values())


def _addresses(value) -> list[str]:
    return [addr.strip().lower() for _, addr in getaddresses([str(value)]) if addr.strip()] if value else []


def parse_email(raw: bytes) -> dict | None:
    """The fields of one RFC-822 message, or None when the bytes are not an email.

    `date` is UTC as `YYYY-MM-DD HH:MM:SS`, or None when the Date header is missing or unreadable.
    """
    if not isinstance(raw, (bytes, bytearray)):
        raise TypeError(f"parse_email takes the raw bytes of a message, not {type(raw).__name__}")
    msg = email.message_from_bytes(raw, policy=policy.default)
    try:
        headers = (msg["Message-ID"], msg["From"], msg["Date"])
    except (ValueError, TypeError, IndexError):  # a header the policy cannot even read
        return None
    if not any(headers):
        return None
    try:
        date = parsedate_to_datetime(str(msg["Date"])).astimezone(timezone.utc).strftime(DATE_FORMAT)
    except (TypeError, ValueError, IndexError, OverflowError):
        date = None
    try:
        part = msg.get_body(preferencelist=("plain", "html"))
        body = part.get_content() if part is not None else ""
    except (LookupError, KeyError, ValueError, AttributeError):  # unknown charset, broken MIME
        payload = msg.get_payload(decode=True) if not msg.is_multipart() else b""
        body = (payload or b"").decode("utf-8", errors="replace")
    try:
        sender = _addresses(msg["From"])
        to, cc, bcc = _addresses(msg["To"]), _addresses(msg["Cc"]), _addresses(msg["Bcc"])
    except (ValueError, TypeError, IndexError):
        sender, to, cc, bcc = [], [], [], []
    return {"message_id": str(msg["Message-ID"] or "").strip(), "subject": str(msg["Subject"] or ""),
            "from_address": sender[0] if sender else "", "to": to, "cc": cc, "bcc": bcc, "date": date,
            "body": body}


def dedup_key(subject: str, body: str, from_address: str) -> str:
    """ART's copy test as one column: the same subject, body and sender is the same email."""
    return hashlib.sha256(json.dumps([subject, body, from_address]).encode()).hexdigest()


def _walk(source: Path) -> Iterator[tuple[str, str, bytes]]:
    """(mailbox, file path inside it, raw bytes) for every file of a maildir tarball or folder."""
    if source.is_dir():
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source.parent).parts
            yield rel[0], "/".join(rel[1:]), path.read_bytes()
        return
    try:
        with tarfile.open(source) as tar:
            for member in tar:
                if member.isfile():
                    parts = member.name.split("/")
                    if len(parts) < 2:
                        continue
                    yield parts[0], "/".join(parts[1:]), tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise InboxError(f"{source}: not a readable maildir tarball ({exc})") from None


def connect(db_path: str | Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(db_path))
    db.row_factory = sqlite3.Row
    db.executescript(SCHEMA)
    return db


def open_readonly(db_path: str | Path, **kwargs) -> sqlite3.Connection:
    """A read-only connection (rows by name) to an existing inbox database; FileNotFoundError if there is none."""
    if not Path(db_path).is_file():
        raise FileNotFoundError(f"no inbox database at {db_path}")
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, **kwargs)
    db.row_factory = sqlite3.Row
    try:
        db.execute("SELECT 1 FROM emails, recipients, mailboxes LIMIT 0")
    except sqlite3.DatabaseError as exc:
        db.close()
        raise InboxError(f"{db_path} is not an inbox database ({exc}); build it with build_inbox_db") from None
    return db


def build_inbox_db(sources: list[str | Path], db_path: str | Path) -> BuildReport:
    """A new inbox database at `db_path` from maildir tarballs/folders, in the order given.

    The database is built beside `db_path` and moved over it only once every source was read: a
    source that fails leaves the previous file as it was.
    """
    if isinstance(sources, (str, Path)) or not sources:
        raise InboxError("give a list of one or more maildir tarballs or folders")
    started = time.perf_counter()
    paths = [Path(s) for s in sources]
    for p in paths:
        if not p.exists():
            raise InboxError(f"no such mailbox: {p}")
    target = Path(db_path)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".building", dir=target.parent)
    os.close(fd)
    try:
        report = BuildReport()
        db = connect(tmp)
        try:
            for source in paths:
                ingest(db, _walk(source), report)
        finally:
            db.close()
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    report.seconds = time.perf_counter() - started
    report.db_bytes = os.path.getsize(target)
    return report


def ingest(db: sqlite3.Connection | str | Path, items: Iterable[tuple[str, str, bytes]],
           report: BuildReport | None = None) -> BuildReport:
    """Add (mailbox, file name, raw RFC-822 bytes) items to an inbox database, with ART's filters.

    Emails already in the database (same Message-ID, or same subject, body and sender) are skipped as
    copies, so adding the same mail twice changes nothing. One transaction: all of it or none.
    """
    if isinstance(db, (str, Path)):
        conn = connect(db)
        try:
            return ingest(conn, items, report)
        finally:
            conn.close()
    report = report if report is not None else BuildReport()
    db.executescript(SCHEMA)
    ids = {r[0] for r in db.execute("SELECT message_id FROM emails")}
    keys = {r[0] for r in db.execute("SELECT dedup_key FROM emails")}
    owners: dict[str, Counter] = {}
    kept: Counter = Counter()
    files: Counter = Counter()
    with db:
        for mailbox, file_name, raw in items:
            files[mailbox] += 1
            fields = parse_email(raw)
            if fields is None:
                report.skipped["not an email"] += 1
                continue
            owners.setdefault(mailbox, Counter()).update(fields["to"])
            reason = _skip_reason(fields, ids, keys)
            if reason:
                report.skipped[reason] += 1
                continue
            key = dedup_key(fields["subject"], fields["body"], fields["from_address"])
            ids.add(fields["message_id"])
            keys.add(key)
            rowid = db.execute("INSERT INTO emails (message_id, subject, from_address, date, body, file_name, dedup_key)"
                               " VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (fields["message_id"], fields["subject"], fields["from_address"], fields["date"],
                                fields["body"], f"{mailbox}/{file_name}", key)).lastrowid
            db.executemany("INSERT INTO recipients VALUES (?, ?, ?)",
                           [(rowid, a, kind) for kind in ("to", "cc", "bcc") for a in fields[kind]])
            db.execute("INSERT INTO emails_fts (rowid, subject, body) VALUES (?, ?, ?)",
                       (rowid, fields["subject"], fields["body"]))
            kept[mailbox] += 1
        for mailbox in files:
            row = db.execute("SELECT files, emails FROM mailboxes WHERE name = ?", (mailbox,)).fetchone()
            before = (row[0], row[1]) if row else (0, 0)
            owner = owners.get(mailbox, Counter()).most_common(1)
            db.execute("INSERT OR REPLACE INTO mailboxes VALUES (?, ?, ?, ?, ?)",
                       (mailbox, owner[0][0] if owner else None, before[0] + files[mailbox],
                        before[1] + kept[mailbox], time.time()))
            report.mailboxes[mailbox] = report.mailboxes.get(mailbox, 0) + kept[mailbox]
            report.files[mailbox] = report.files.get(mailbox, 0) + files[mailbox]
    return report


def _skip_reason(fields: dict, ids: set, keys: set) -> str | None:
    if not fields["message_id"]:
        return "no Message-ID"
    if fields["date"] is None:
        return "unreadable Date"
    if len(fields["body"]) > MAX_BODY_CHARS:
        return f"body over {MAX_BODY_CHARS:,} characters"
    if len(fields["to"]) + len(fields["cc"]) + len(fields["bcc"]) > MAX_RECIPIENTS:
        return f"over {MAX_RECIPIENTS} recipients"
    if fields["message_id"] in ids:
        return "Message-ID already kept"
    if dedup_key(fields["subject"], fields["body"], fields["from_address"]) in keys:
        return "copy (same subject, body and sender)"
    return None


def mailbox_owners(db_path: str | Path) -> dict[str, str]:
    """mailbox name -> its owner's address, for every mailbox ingested into the database."""
    db = open_readonly(db_path)
    try:
        return {r["name"]: r["address"] for r in db.execute("SELECT name, address FROM mailboxes ORDER BY name")
                if r["address"]}
    finally:
        db.close()


def normal_address(address) -> str:
    """An inbox address as stored: stripped and lower-cased; ValueError for anything that is not an address."""
    if not isinstance(address, str) or "@" not in address or "\x00" in address or len(address) > 320:
        raise ValueError(f"an inbox is an email address such as sally.beck@enron.com, got {address!r}")
    return address.strip().lower()


def inbox_size(db: sqlite3.Connection, address: str, before: str | None = None) -> int:
    """How many emails the inbox of `address` holds (dated before `before`, `YYYY-MM-DD HH:MM:SS`, if given)."""
    sql = f"SELECT COUNT(*) FROM emails e WHERE {IN_INBOX}" + (" AND e.date < :before" if before else "")
    return db.execute(sql, {"inbox": normal_address(address), "before": before}).fetchone()[0]
