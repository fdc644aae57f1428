"""ART·E scenarios: the schema, JSONL/parquet files, and an offline generator of verifiable questions.

A scenario is ART·E's shape: question, answer, message_ids (the emails that hold the answer),
inbox_address, query_date (the agent sees only mail up to it), how_realistic (0..1), plus the inbox and
the split. `generate_scenarios` writes questions whose answers are read straight from real headers
and bodies (who sent, when, what subject, which dollar figure), each checked to point at exactly one
email, so every answer can be verified against the database. Splits are by inbox: no inbox is in both.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pydantic

MONEY = re.compile(r"\$\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:million|billion|MM|mm|k|K))?")


class Scenario(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    id: str
    question: str = pydantic.Field(min_length=1)
    answer: str = pydantic.Field(min_length=1)
    message_ids: list[str]
    inbox_address: str
    query_date: str
    how_realistic: float = pydantic.Field(ge=0, le=1)
    inbox: str | None = None
    split: str = "test"
    kind: str | None = None


def save_scenarios(scenarios: list[Scenario], path: str | Path) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame([s.model_dump() for s in scenarios]).to_parquet(path, index=False)
    else:
        path.write_text("".join(s.model_dump_json() + "\n" for s in scenarios), encoding="utf-8")
    return path


def load_scenarios(path: str | Path, split: str | None = None) -> list[Scenario]:
    """Scenarios from JSONL or parquet; a bad record is an error naming its line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no scenarios file at {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        rows = [(i + 1, {k: (list(v) if hasattr(v, "tolist") else v) for k, v in r.items()})
                for i, r in enumerate(pd.read_parquet(path).to_dict("records"))]
    else:
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append((n, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    out = []
    for n, row in rows:
        try:
            out.append(Scenario.model_validate(row))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"{path}:{n}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return [s for s in out if split is None or s.split == split]


def _day(iso: str) -> str:
    return iso[:10]


def generate_scenarios(db_path: str | Path, *, per_inbox: int = 50, test_inboxes: list[str] | None = None,
                       seed: int = 0) -> list[Scenario]:
    """Verifiable questions from real mail: sender, date, subject and dollar-figure questions."""
    if per_inbox < 1:
        raise ValueError("per_inbox must be >= 1")
    db = sqlite3.connect(str(db_path))
    db.row_factory = sqlite3.Row
    inboxes = {r["inbox"]: r["address"] for r in db.execute("SELECT inbox, address FROM inboxes ORDER BY inbox")}
    if not inboxes:
        raise ValueError(f"{db_path} holds no inboxes: build it with build_inbox_db first")
    names = sorted(inboxes)
    test = set(test_inboxes) if test_inboxes is not None else set(names[-max(1, len(names) // 4):])
    rng = random.Random(seed)
    scenarios: list[Scenario] = []
    for inbox in names:
        rows = db.execute(
            "SELECT e.* FROM emails e JOIN (SELECT subject FROM emails WHERE inbox = ? AND length(subject) > 8 "
            "GROUP BY subject HAVING COUNT(*) = 1) u ON u.subject = e.subject WHERE e.inbox = ? "
            "AND e.date IS NOT NULL AND e.from_addr != '' ORDER BY e.id", (inbox, inbox)).fetchall()
        rng.shuffle(rows)
        made = 0
        for r in rows:
            if made >= per_inbox:
                break
            subject, sender, day = r["subject"].strip(), r["from_addr"].split(",")[0].strip(), _day(r["date"])
            query_date = (datetime.fromisoformat(r["date"]) + timedelta(days=rng.randint(1, 60))).date().isoformat()
            kind = ("sender", "date", "subject", "figure")[made % 4]
            if kind == "sender":
                q, a = f"Who sent the email with the subject \"{subject}\"?", sender
            elif kind == "date":
                q, a = f"On what date was the email \"{subject}\" from {sender} sent?", day
            elif kind == "subject":
                same_day = db.execute("SELECT COUNT(*) FROM emails WHERE inbox = ? AND from_addr = ? AND "
                                      "substr(date, 1, 10) = ?", (inbox, r["from_addr"], day)).fetchone()[0]
                if same_day != 1:
                    continue
                q, a = f"What was the subject of the email {sender} sent me on {day}?", subject
            else:
                money = MONEY.search(r["body"] or "")
                if not money:
                    kind, q, a = "sender", f"Who sent the email with the subject \"{subject}\"?", sender
                else:
                    q, a = f"What dollar amount is mentioned in the email \"{subject}\"?", money.group(0)
            scenarios.append(Scenario(
                id=f"{inbox}-{r['id']}-{kind}", question=q, answer=a, message_ids=[r["message_id"]],
                inbox_address=inboxes[inbox] or inbox, query_date=query_date, how_realistic=0.4, inbox=inbox,
                split="test" if inbox in test else "train", kind=kind))
            made += 1
    return scenarios


def verify_scenario(db_path: str | Path, s: Scenario) -> bool:
    """True when the scenario's answer is read from its source email as the question says."""
    db = sqlite3.connect(str(db_path))
    db.row_factory = sqlite3.Row
    row = db.execute("SELECT * FROM emails WHERE inbox = ? AND message_id = ?", (s.inbox, s.message_ids[0])).fetchone()
    if row is None or (row["date"] or "")[:10] > s.query_date:
        return False
    return {"sender": lambda: row["from_addr"].split(",")[0].strip() == s.answer,
            "date": lambda: row["date"][:10] == s.answer,
            "subject": lambda: row["subject"].strip() == s.answer,
            "figure": lambda: s.answer in (row["body"] or "")}.get(s.kind, lambda: False)()


HUB_DATASET = "corbt/enron_emails_sample_questions"


def download_scenarios(split: str = "test", *, repo: str = HUB_DATASET, limit: int | None = None) -> list[Scenario]:
    """ART·E's published questions from the Hugging Face hub (needs the internet; cached by huggingface_hub).

    Their message_ids point into the full CMU Enron corpus: build the inbox database from it
    (`build_inbox_db` on the full maildir) before running them. `inbox` is left empty; the harness finds
    the inbox by `inbox_address`.
    """
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, f"default/{split}/0000.parquet", repo_type="dataset",
                               revision="refs/convert/parquet")
    except Exception as exc:
        raise ConnectionError(f"could not download {repo} ({split}) from the hub: {type(exc).__name__}: {exc}. "
                              "Offline? Use generate_scenarios or a local JSONL/parquet file.") from None
    import pandas as pd

    out = []
    for r in pd.read_parquet(path).to_dict("records")[:limit]:
        out.append(Scenario(id=f"hub-{split}-{r['id']}", question=r["question"], answer=r["answer"],
                            message_ids=list(r["message_ids"]), inbox_address=r["inbox_address"],
                            query_date=str(r["query_date"])[:10], how_realistic=float(r["how_realistic"]),
                            inbox=None, split=split, kind="hub"))
    return out
