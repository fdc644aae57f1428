"""The judging service's database: SQLite in WAL mode, one connection per call, safe across threads.

Tables: API keys (only a SHA-256 of each key is stored), jobs, their groups (each group's request is
written before the job is acknowledged, and each result is committed as soon as it arrives), and
idempotency records (a repeated `Idempotency-Key` gets the first answer back).
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
    PRIMARY KEY (job_id, idx)
);
CREATE TABLE IF NOT EXISTS idempotency (
    key_id TEXT NOT NULL, idem_key TEXT NOT NULL, request_hash TEXT NOT NULL, status INTEGER NOT NULL,
    response TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (key_id, idem_key)
);
"""

KEY_PREFIX = "rk_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Store:
    def __init__(self, path: str | Path):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

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
        if not name or not name.strip():
            raise ValueError("a key needs a name")
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
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            cur = db.execute("UPDATE jobs SET status = 'cancelled', updated = ? WHERE id = ? AND key_id = ? "
                             "AND status IN ('pending', 'running')", (time.time(), job_id, key_id))
            if cur.rowcount:
                db.execute("UPDATE job_groups SET status = 'cancelled', updated = ? WHERE job_id = ? "
                           "AND status = 'pending'", (time.time(), job_id))
            db.execute("COMMIT")
            return cur.rowcount == 1

    def pending_groups(self, limit: int = 100) -> list[dict]:
        """Groups still to judge (after a restart: everything not done, including those that were running)."""
        with self.connect() as db:
            rows = db.execute("SELECT g.job_id, g.idx, g.request, j.options FROM job_groups g JOIN jobs j "
                              "ON j.id = g.job_id WHERE g.status IN ('pending', 'running') "
                              "ORDER BY j.created, g.idx LIMIT ?", (limit,)).fetchall()
        return [dict(r) for r in rows]

    def mark_running(self, job_id: str, idx: int) -> bool:
        with self.connect() as db:
            cur = db.execute("UPDATE job_groups SET status = 'running', attempts = attempts + 1, updated = ? "
                             "WHERE job_id = ? AND idx = ? AND status IN ('pending', 'running')",
                             (time.time(), job_id, idx))
            db.execute("UPDATE jobs SET status = 'running', updated = ? WHERE id = ? AND status = 'pending'",
                       (time.time(), job_id))
            return cur.rowcount == 1

    def finish_group(self, job_id: str, idx: int, result: dict | None, error: str | None) -> None:
        """Commit one group's result (or error) and close the job when its last group is done."""
        now = time.time()
        with self.connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE job_groups SET status = ?, result = ?, error = ?, updated = ? "
                       "WHERE job_id = ? AND idx = ? AND status = 'running'",
                       ("done" if error is None else "error", json.dumps(result) if result is not None else None,
                        error, now, job_id, idx))
            left = db.execute("SELECT COUNT(*) FROM job_groups WHERE job_id = ? AND status IN ('pending', 'running')",
                              (job_id,)).fetchone()[0]
            if left == 0:
                db.execute("UPDATE jobs SET status = 'done', updated = ? WHERE id = ? AND status = 'running'", (now, job_id))
            db.execute("COMMIT")

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
