"""The judging service's database: SQLite in WAL mode, one connection per call, safe across threads.

Tables: API keys (only a SHA-256 of each key is stored), jobs, their groups (each group's request is
written before the job is acknowledged, and each result is committed as soon as it arrives), and
idempotency records (a repeated `Idempotency-Key` gets the first answer back).

A group's `attempts` counts the times it was taken up for judging (counted before judging starts, so
a process that dies while judging still used one); a group at its attempt budget is never taken up
again, and `not_before` holds back a group whose judge was unavailable until its backoff has passed.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, key_hash TEXT NOT NULL UNIQUE,
    created REAL NOT NULL, revoked REAL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, key_id TEXT NOT NULL, status TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL, n_groups INTEGER NOT NULL, options TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_groups (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, status TEXT NOT NULL, request TEXT NOT NULL,
    result TEXT, error TEXT, attempts INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS idempotency (
    key_id TEXT NOT NULL, idem_key TEXT NOT NULL, request_hash TEXT NOT NULL, status INTEGER NOT NULL,
    response TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (key_id, idem_key)
);
"""

KEY_PREFIX = "rk_"
SQLITE_HEADER = b"SQLite format 3\x00"
MAX_ERROR_CHARS = 2000


class StoreError(ValueError):
    """The database path cannot be used (a folder, not a SQLite file, unreadable)."""


def check_key_name(name: str) -> None:
    """Raise ValueError unless `name` can name a key: 1-200 printable characters."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a key needs a name")
    if len(name.strip()) > 200 or not name.strip().isprintable():
        raise ValueError("a key's name is at most 200 printable characters")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Store:
    def __init__(self, path: str | Path):
        self.path = str(path)
        where = Path(self.path)
        if where.is_dir():
            raise StoreError(f"database {where} is a folder; give a file path (it is created if missing)")
        if where.is_file() and where.stat().st_size > 0:
            with where.open("rb") as f:
                if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    raise StoreError(f"{where} is not a SQLite database")
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            with self.connect() as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(SCHEMA)
                columns = {row["name"] for row in db.execute("PRAGMA table_info(job_groups)")}
                if "not_before" not in columns:  # a database from before group backoff
                    db.execute("ALTER TABLE job_groups ADD COLUMN not_before REAL NOT NULL DEFAULT 0")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot use database {where}: {exc}") from None

    @contextmanager
    def connect(self):
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA synchronous=NORMAL")
            yield db
        finally:
            db.close()

    # --- keys --------------------------------------------------------------------------------
    def create_key(self, name: str) -> tuple[str, str]:
        """A new key (shown once) and its id."""
        check_key_name(name)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = uuid.uuid4().hex[:12]
        with self.connect() as db:
            db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, NULL)", (key_id, name.strip(), hash_key(key), time.time()))
        return key, key_id

    def list_keys(self) -> list[dict]:
        with self.connect() as db:
            return [dict(r) for r in db.execute("SELECT id, name, created, revoked FROM api_keys ORDER BY created")]

    def revoke_key(self, key_id: str) -> bool:
        with self.connect() as db:
            cur = db.execute("UPDATE api_keys SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), key_id))
            return cur.rowcount == 1

    def key_id_for(self, key: str) -> str | None:
        """The id of an active key, or None (unknown or revoked)."""
        with self.connect() as db:
            row = db.execute("SELECT id FROM api_keys WHERE key_hash = ? AND revoked IS NULL", (hash_key(key),)).fetchone()
            return row["id"] if row else None

    # --- jobs --------------------------------------------------------------------------------
    def create_job(self, key_id: str, groups: list[dict], options: dict) -> str:
        """Write a job and all its groups in one transaction; only then may it be acknowledged."""
        job_id = uuid.uuid4().hex
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO jobs VALUES (?, ?, 'pending', ?, ?, ?, ?)",
                       (job_id, key_id, now, now, len(groups), json.dumps(options)))
            db.executemany("INSERT INTO job_groups (job_id, idx, status, request, updated) VALUES (?, ?, 'pending', ?, ?)",
                           [(job_id, i, json.dumps(g), now) for i, g in enumerate(groups)])
            db.execute("COMMIT")
        return job_id

    def job(self, job_id: str, key_id: str) -> dict | None:
        with self.connect() as db:
            job = db.execute("SELECT * FROM jobs WHERE id = ? AND key_id = ?", (job_id, key_id)).fetchone()
            if job is None:
                return None
            groups = db.execute("SELECT idx, status, result, error, attempts FROM job_groups WHERE job_id = ? "
                                "ORDER BY idx", (job_id,)).fetchall()
        return {**dict(job), "groups": [dict(g) for g in groups]}

    def cancel_job(self, job_id: str, key_id: str) -> bool:
        """Cancel a pending or running job: every group not yet finished becomes 'cancelled' (the worker stops
        those being judged; a result that arrives later is not written)."""
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute("UPDATE jobs SET status = 'cancelled', updated = ? WHERE id = ? AND key_id = ? "
                             "AND status IN ('pending', 'running')", (now, job_id, key_id))
            if cur.rowcount:
                db.execute("UPDATE job_groups SET status = 'cancelled', updated = ? WHERE job_id = ? "
                           "AND status IN ('pending', 'running')", (now, job_id))
            db.execute("COMMIT")
            return cur.rowcount == 1

    def pending_groups(self, limit: int = 100, max_attempts: int = 3) -> list[dict]:
        """Groups to judge now: waiting (backoff passed) or left running by a stopped process, within their
        attempt budget, of jobs not cancelled."""
        with self.connect() as db:
            rows = db.execute("SELECT g.job_id, g.idx, g.request, g.attempts, j.options FROM job_groups g JOIN jobs j "
                              "ON j.id = g.job_id WHERE g.status IN ('pending', 'running') AND j.status != 'cancelled' "
                              "AND g.attempts < ? AND g.not_before <= ? ORDER BY j.created, g.idx LIMIT ?",
                              (max_attempts, time.time(), limit)).fetchall()
        return [dict(r) for r in rows]

    def mark_running(self, job_id: str, idx: int, max_attempts: int = 3) -> bool:
        """Take a group up for judging (one more attempt), unless its budget is spent or its job was cancelled."""
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute("UPDATE job_groups SET status = 'running', attempts = attempts + 1, updated = ? "
                             "WHERE job_id = ? AND idx = ? AND status IN ('pending', 'running') AND attempts < ? "
                             "AND (SELECT status FROM jobs WHERE id = ?) != 'cancelled'",
                             (now, job_id, idx, max_attempts, job_id))
            if cur.rowcount:
                db.execute("UPDATE jobs SET status = 'running', updated = ? WHERE id = ? AND status = 'pending'",
                           (now, job_id))
            db.execute("COMMIT")
            return cur.rowcount == 1

    def retry_later(self, job_id: str, idx: int, error: str, not_before: float) -> None:
        """Put a running group back in the queue, held until `not_before` (its judge was unavailable)."""
        with self.connect() as db:
            db.execute("UPDATE job_groups SET status = 'pending', error = ?, not_before = ?, updated = ? "
                       "WHERE job_id = ? AND idx = ? AND status = 'running'",
                       (error[:MAX_ERROR_CHARS], not_before, time.time(), job_id, idx))

    def finish_group(self, job_id: str, idx: int, result: dict | None, error: str | None) -> None:
        """Commit one group's result (or error) and close the job when its last group is done."""
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE job_groups SET status = ?, result = ?, error = ?, updated = ? "
                       "WHERE job_id = ? AND idx = ? AND status = 'running'",
                       ("done" if error is None else "error", json.dumps(result) if result is not None else None,
                        error[:MAX_ERROR_CHARS] if error is not None else None, now, job_id, idx))
            self._close_job_if_finished(db, job_id, now)
            db.execute("COMMIT")

    def give_up_exhausted(self, max_attempts: int, skip: set[tuple[str, int]] = frozenset(),
                          running: str = "the last attempt never finished (the service stopped while judging it)"
                          ) -> list[dict]:
        """Groups left unfinished at their attempt budget become 'error' instead of being resumed: at start, and
        while running for groups whose end could not be written (`skip`: (job, index) of groups being judged
        now; `running`: why a group left 'running' ended)."""
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            rows = [dict(r) for r in db.execute(
                "SELECT job_id, idx, status, attempts, error FROM job_groups WHERE status IN ('pending', 'running') "
                "AND attempts >= ?", (max_attempts,)) if (r["job_id"], r["idx"]) not in skip]
            for r in rows:
                why = running if r["status"] == "running" else f"last error: {r['error']}"
                db.execute("UPDATE job_groups SET status = 'error', error = ?, updated = ? WHERE job_id = ? AND idx = ?",
                           (f"gave up after {r['attempts']} attempt(s): {why}"[:MAX_ERROR_CHARS], now,
                            r["job_id"], r["idx"]))
            for job_id in {r["job_id"] for r in rows}:
                self._close_job_if_finished(db, job_id, now)
            db.execute("COMMIT")
        return rows

    @staticmethod
    def _close_job_if_finished(db, job_id: str, now: float) -> None:
        left = db.execute("SELECT COUNT(*) FROM job_groups WHERE job_id = ? AND status IN ('pending', 'running')",
                          (job_id,)).fetchone()[0]
        if left == 0:
            db.execute("UPDATE jobs SET status = 'done', updated = ? WHERE id = ? AND status IN ('pending', 'running')",
                       (now, job_id))

    def queue_depth(self) -> int:
        with self.connect() as db:
            return db.execute("SELECT COUNT(*) FROM job_groups WHERE status IN ('pending', 'running')").fetchone()[0]

    # --- idempotency -------------------------------------------------------------------------
    def idempotent_response(self, key_id: str, idem_key: str) -> dict | None:
        with self.connect() as db:
            row = db.execute("SELECT request_hash, status, response FROM idempotency WHERE key_id = ? AND idem_key = ?",
                             (key_id, idem_key)).fetchone()
        return {"request_hash": row["request_hash"], "status": row["status"], "response": json.loads(row["response"])} if row else None

    def save_idempotent_response(self, key_id: str, idem_key: str, request_hash: str, status: int, response: dict) -> None:
        with self.connect() as db:
            db.execute("INSERT OR IGNORE INTO idempotency VALUES (?, ?, ?, ?, ?, ?)",
                       (key_id, idem_key, request_hash, status, json.dumps(response), time.time()))
