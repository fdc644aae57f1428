"""The inbox database: Enron maildirs (tarballs or folders) in SQLite with an FTS5 index.

One row per email per inbox: message_id, inbox (the mailbox owner's folder name, e.g. `beck-s`), from,
to, cc, bcc, date (UTC, ISO 8601), subject, body (plain text), folder. A Message-ID seen in several
folders of one inbox (inbox/, all_documents/, discussion_threads/ ...) is kept once. RFC-822 parsing
uses the standard library's `email` package (encodings, multipart, missing headers). Rebuilding is
idempotent: an inbox that is ingested again replaces its own rows. `build_inbox_db` reports what it
kept and what it skipped, and why.
"""

from __future__ import annotations

import email
import os
import sqlite3
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timezone
from email import policy
from email.utils import getaddresses, parsedate_to_datetime
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS emails (
    id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, inbox TEXT NOT NULL, from_addr TEXT,
    to_addrs TEXT, cc_addrs TEXT, bcc_addrs TEXT, date TEXT, subject TEXT, body TEXT, folder TEXT,
    UNIQUE (inbox, message_id)
);
CREATE INDEX IF NOT EXISTS emails_inbox_date ON emails (inbox, date);
CREATE VIRTUAL TABLE IF NOT EXISTS emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
CREATE TABLE IF NOT EXISTS inboxes (inbox TEXT PRIMARY KEY, address TEXT, emails INTEGER, built REAL);
"""


# the shared Enron mailboxes beside the repository (../shared/data/enron), as in this workplace and CI
ENRON_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "enron"


class InboxError(ValueError):
    """A source that cannot be ingested (missing, not a tarball or folder, corrupt)."""


@dataclass
class BuildReport:
    inboxes: dict[str, int] = field(default_factory=dict)     # inbox -> emails kept
    skipped: Counter = field(default_factory=Counter)          # reason -> count
    duplicates: int = 0
    seconds: float = 0.0
    db_bytes: int = 0

    @property
    def emails(self) -> int:
        return sum(self.inboxes.values())


def _addresses(value) -> str:
    return ", ".join(addr for _, addr in getaddresses([str(value)]) if addr) if value else ""


def parse_email(raw: bytes) -> dict | None:
    """The fields of one RFC-822 message, or None when the bytes are not an email."""
    msg = email.message_from_bytes(raw, policy=policy.default)
    if not (msg["Message-ID"] or msg["From"] or msg["Date"]):
        return None
    try:
        date = parsedate_to_datetime(str(msg["Date"])).astimezone(timezone.utc).isoformat() if msg["Date"] else None
    except (TypeError, ValueError, IndexError):
        date = None
    try:
        part = msg.get_body(preferencelist=("plain", "html"))
        body = part.get_content() if part is not None else ""
    except (LookupError, KeyError, ValueError, AttributeError):  # unknown charset, broken MIME
        payload = msg.get_payload(decode=True) if not msg.is_multipart() else b""
        body = (payload or b"").decode("utf-8", errors="replace")
    message_id = str(msg["Message-ID"] or "").strip()
    return {"message_id": message_id, "from_addr": _addresses(msg["From"]), "to_addrs": _addresses(msg["To"]),
            "cc_addrs": _addresses(msg["Cc"]), "bcc_addrs": _addresses(msg["Bcc"]), "date": date,
            "subject": str(msg["Subject"] or ""), "body": body}


def _walk(source: Path) -> Iterator[tuple[str, str, bytes]]:
    """(inbox, folder, raw bytes) for every file of a maildir tarball or folder."""
    if source.is_dir():
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source.parent).parts
            yield rel[0], "/".join(rel[1:-1]), path.read_bytes()
        return
    try:
        with tarfile.open(source) as tar:
            for member in tar:
                if member.isfile():
                    parts = member.name.split("/")
                    if len(parts) < 2:
                        continue
                    yield parts[0], "/".join(parts[1:-1]), tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:
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
    return db


def build_inbox_db(sources: list[str | Path], db_path: str | Path) -> BuildReport:
    """Ingest maildir tarballs/folders into `db_path`; each inbox seen replaces its previous rows."""
    started = time.perf_counter()
    report = BuildReport()
    paths = [Path(s) for s in sources]
    for p in paths:
        if not p.exists():
            raise InboxError(f"no such mailbox: {p}")
    for source in paths:
        ingest(db_path, _walk(source), report)
    report.seconds = time.perf_counter() - started
    return report


def ingest(db_path: str | Path, items, report: BuildReport | None = None) -> BuildReport:
    """Store (inbox, folder, raw RFC-822 bytes) items; every inbox among them replaces its previous rows."""
    report = report or BuildReport()
    rows: dict[str, list[tuple]] = {}
    seen: set[tuple[str, str]] = set()
    for inbox, folder, raw in items:
        fields = parse_email(raw)
        if fields is None:
            report.skipped["not an email"] += 1
            continue
        if not fields["message_id"]:
            report.skipped["no Message-ID"] += 1
            continue
        if (inbox, fields["message_id"]) in seen:
            report.duplicates += 1
            continue
        seen.add((inbox, fields["message_id"]))
        if fields["date"] is None:
            report.skipped["unparseable date (kept, date empty)"] += 1
        rows.setdefault(inbox, []).append((
            fields["message_id"], inbox, fields["from_addr"], fields["to_addrs"], fields["cc_addrs"],
            fields["bcc_addrs"], fields["date"], fields["subject"], fields["body"], folder))
    db = connect(db_path)
    try:
        with db:
            for inbox, batch in rows.items():
                old = [r[0] for r in db.execute("SELECT id FROM emails WHERE inbox = ?", (inbox,))]
                if old:  # idempotent rebuild: this inbox's previous rows go, from the index too
                    db.executemany("INSERT INTO emails_fts(emails_fts, rowid, subject, body) "
                                   "SELECT 'delete', id, subject, body FROM emails WHERE id = ?", [(i,) for i in old])
                    db.execute("DELETE FROM emails WHERE inbox = ?", (inbox,))
                db.executemany("INSERT INTO emails (message_id, inbox, from_addr, to_addrs, cc_addrs, bcc_addrs,"
                               " date, subject, body, folder) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
                db.execute("INSERT INTO emails_fts(rowid, subject, body) SELECT id, subject, body FROM emails "
                           "WHERE inbox = ?", (inbox,))
                db.execute("INSERT OR REPLACE INTO inboxes VALUES (?, ?, ?, ?)",
                           (inbox, _owner_address(db, inbox), len(batch), time.time()))
                report.inboxes[inbox] = len(batch)
    finally:
        db.close()
    report.db_bytes = os.path.getsize(db_path)
    return report


def _owner_address(db: sqlite3.Connection, inbox: str) -> str | None:
    """The inbox owner's address: the one most often among the recipients of the inbox's mail."""
    counts: Counter = Counter()
    for (to,) in db.execute("SELECT to_addrs FROM emails WHERE inbox = ? LIMIT 5000", (inbox,)):
        counts.update(a.strip().lower() for a in (to or "").split(",") if a.strip())
    return counts.most_common(1)[0][0] if counts else None
