"""The human-written QA pairs of `enron_annotated.json` (SQuAD format over 48 full Enron emails) as a
second ART·E question set: the emails become the inbox `enron-annotated`, each answerable question a
scenario whose source is the email it was written about (how_realistic 1.0: people wrote them)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from evals.art_e.inbox import BuildReport, ingest, parse_email
from evals.art_e.questions import Scenario

INBOX = "enron-annotated"


def load_annotated(path: str | Path, db_path: str | Path) -> tuple[list[Scenario], BuildReport, int]:
    """(scenarios, ingest report, questions skipped as unanswerable or without an answer)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a SQuAD-format file with 'data' ({exc})") from None
    items, questions = [], []
    for d, doc in enumerate(data):
        for p, para in enumerate(doc.get("paragraphs", [])):
            raw = str(para.get("context", "")).encode("utf-8")
            fields = parse_email(raw)
            if fields is None or not fields["message_id"]:
                continue
            items.append((INBOX, "annotated", raw))
            questions += [(qa, fields) for qa in para.get("qas", [])]
    report = ingest(db_path, items)
    import sqlite3

    address = sqlite3.connect(str(db_path)).execute("SELECT address FROM inboxes WHERE inbox = ?", (INBOX,)).fetchone()
    scenarios, skipped = [], 0
    for qa, fields in questions:
        answers = [a.get("text", "") for a in qa.get("answers", []) if a.get("text")]
        if qa.get("is_impossible") or not answers or not str(qa.get("question", "")).strip():
            skipped += 1
            continue
        sent = datetime.fromisoformat(fields["date"]) if fields["date"] else datetime(2002, 1, 1)
        scenarios.append(Scenario(
            id=f"annotated-{qa.get('id')}", question=str(qa["question"]).strip(), answer=answers[0],
            message_ids=[fields["message_id"]], inbox_address=(address[0] if address else None) or INBOX,
            query_date=(sent + timedelta(days=1)).date().isoformat(), how_realistic=1.0, inbox=INBOX,
            split="test", kind="human"))
    return scenarios, report, skipped
