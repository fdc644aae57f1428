"""The human-written QA pairs of `enron_annotated.json` (SQuAD format over 48 full Enron emails) as a
second ART·E question set, kept only where a question identifies its email.

The emails are added to the inbox database (mailbox `enron-annotated`, with ART's filters; an email the
database already holds is used as it is). A question's inbox is its email's first To address (the person
who received it), and its query date the day after the email. The people who wrote these questions asked
many of them of every email ("Who received the email?" was asked 99 times, with 99 answers), so a question
is kept only when

- its text, asked of several emails, has the same answer for all of them (those emails are its sources);
- it names what it is about: after stop words and words any email question has ("email", "sent",
  "mentioned" ...) some words are left, and a search of the inbox with them (as the agent's tool searches)
  lists one of its emails among the first 10 results, and at most `IDENTIFY_MAX` - 1 (2) other emails: a question
  whose words fit more emails ("Where will the conference call take place?") does not identify its email.

Everything else is counted by reason. how_realistic is 1.0: people wrote them. All are test questions; an
evaluation that also trains on generated questions drops those whose email a training inbox holds too
(`drop_seen_in`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from evals.art_e.inbox import BuildReport, connect, dedup_key, ingest, parse_email
from evals.art_e.matching import STOPWORDS, answer_matches
from evals.art_e.questions import Scenario, in_any_inbox
from evals.art_e.tools import InboxTools

MAILBOX = "enron-annotated"
IDENTIFY_MAX = 3  # a question identifies its email when its words fit at most this many emails of the inbox
ANY_EMAIL_QUESTION = set("""email emails e-mail mail message sent send sender received receive recipient recipients
main also mentioned mention attached attachment requested request requester subject event events described
describe entities entity take place being someone anyone""".split())


def _question_words(question: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z0-9][A-Za-z0-9'&-]*", question)
            if w.lower() not in STOPWORDS and w.lower() not in ANY_EMAIL_QUESTION and len(w) > 1]


def load_annotated(path: str | Path, db_path: str | Path) -> tuple[list[Scenario], BuildReport, Counter]:
    """(scenarios, what adding the emails did, questions skipped by reason)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        if not isinstance(data, list):
            raise TypeError("'data' is not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a SQuAD-format file with 'data' ({exc})") from None
    items, asked, skipped = [], [], Counter()
    for d, doc in enumerate(data):
        for p, para in enumerate(doc.get("paragraphs", []) if isinstance(doc, dict) else []):
            raw = str(para.get("context", "")).encode("utf-8")
            fields = parse_email(raw)
            qas = para.get("qas", []) if isinstance(para.get("qas"), list) else []
            if fields is None or not fields["message_id"]:
                skipped["context is not an email"] += len(qas)
                continue
            items.append((MAILBOX, f"{d}/{p}", raw))
            asked += [(qa, fields) for qa in qas if isinstance(qa, dict)]
    report = ingest(db_path, items)
    db = connect(db_path)
    try:
        kept_as = {}  # the message id under which each annotated email is in the database, if it is
        for _, fields in asked:
            row = db.execute("SELECT message_id, date FROM emails WHERE message_id = ? OR dedup_key = ?",
                             (fields["message_id"], dedup_key(fields["subject"], fields["body"],
                                                              fields["from_address"]))).fetchone()
            if row is not None:
                kept_as[fields["message_id"]] = (row[0], row[1])
    finally:
        db.close()
    groups: dict[str, list] = {}
    for qa, fields in asked:
        answers = [a.get("text", "") for a in qa.get("answers", []) if isinstance(a, dict) and a.get("text")]
        question = str(qa.get("question", "")).strip()
        if qa.get("is_impossible") or not answers or not question:
            skipped["unanswerable or without an answer"] += 1
            continue
        if fields["message_id"] not in kept_as:
            skipped["its email was dropped by ART's filters"] += 1
            continue
        groups.setdefault(re.sub(r"\s+", " ", question.lower()), []).append((qa, question, answers[0], fields))
    scenarios = []
    for members in groups.values():
        qa, question, answer, fields = members[0]
        if any(not (answer_matches(a, answer) and answer_matches(answer, a)) for _, _, a, _ in members[1:]):
            skipped["asked of several emails, with different answers"] += len(members)
            continue
        inbox = (fields["to"] or [fields["from_address"]])[0]
        newest = max(datetime.fromisoformat(kept_as[f["message_id"]][1]) for _, _, _, f in members)
        query_date = (newest + timedelta(days=1)).date().isoformat()
        words = _question_words(question)
        if not words:
            skipped["does not say what it is about"] += len(members)
            continue
        try:
            tools = InboxTools(db_path, inbox, query_date)
        except ValueError:  # its email was kept as a copy filed for other people
            skipped["its email is not in its recipient's inbox"] += len(members)
            continue
        try:
            ids = [i for i in dict.fromkeys(kept_as[f["message_id"]][0] for _, _, _, f in members)
                   if tools.read_email(i) is not None]
            hits = [h["message_id"] for h in tools.search_emails(words)]
        finally:
            tools.close()
        if not ids:
            skipped["its email is not in its recipient's inbox"] += len(members)
            continue
        if not set(hits) & set(ids):
            skipped["a search with its words does not find its email"] += len(members)
            continue
        if len(set(hits) - set(ids)) > IDENTIFY_MAX - 1:  # its own emails (copies of one answer) do not count
            skipped[f"its words fit more than {IDENTIFY_MAX} emails (it does not identify its email)"] += len(members)
            continue
        scenarios.append(Scenario(id=f"annotated-{qa.get('id')}", question=question, answer=answer, message_ids=ids,
                                  inbox_address=inbox, query_date=query_date, how_realistic=1.0, split="test",
                                  kind="human"))
    return scenarios, report, skipped


def drop_seen_in(scenarios: list[Scenario], db_path: str | Path, inboxes) -> tuple[list[Scenario], int]:
    """(the scenarios none of whose emails is in any of `inboxes`, how many were dropped): the annotated questions
    an evaluation may use when it trains on those inboxes (an email filed in a training inbox would have been
    seen in training)."""
    from evals.art_e.inbox import open_readonly

    inboxes = {str(i).strip().lower() for i in inboxes if str(i).strip()}
    if not inboxes:
        return list(scenarios), 0
    db = open_readonly(db_path)
    try:
        def seen(message_id: str) -> bool:  # the generator's own test for its test split (`in_any_inbox`)
            return any(in_any_inbox(db, row[0], inboxes)
                       for row in db.execute("SELECT id FROM emails WHERE message_id = ?", (message_id,)))

        kept = [s for s in scenarios if not any(seen(m) for m in s.message_ids)]
    finally:
        db.close()
    return kept, len(scenarios) - len(kept)
