"""The LLM question writer, as ART·E built its questions: show a model a batch of one inbox's emails and
have it write realistic questions that those emails answer, each naming its source message ids.

    scenarios = await write_questions("inbox.db", "openai/gpt-4.1", inbox="sally.beck@enron.com", batches=10)

Any litellm model works (the embedded one too, if weakly). The reply is constrained by a JSON schema whose
message ids can only be the batch's own, and each question is checked again after parsing: a source id
outside the batch, an empty question or answer, or a realism outside 0..1 drops that question (counted
in the returned report). The query date is a few days after the newest source email.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from evals.art_e.inbox import IN_INBOX, mailbox_owners, normal_address, open_readonly
from evals.art_e.questions import Scenario
from ruler_rl.judges.completion import RetryPolicy, complete, json_list

WRITER_PROMPT = """You write questions a busy person might really ask about their own inbox. You are given emails from
the inbox of {address}. Write up to {per_batch} questions that one or two of these emails answer exactly, with
the short factual answer and the message ids of the emails that hold it. Prefer questions the owner would
plausibly ask (dates, amounts, who decided what, where a meeting is); skip emails with nothing worth asking.
Rate how realistic each question is from 0 (contrived) to 1 (something people ask). Reply with JSON only."""


@dataclass
class WriterReport:
    batches: int = 0
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1


def _schema(ids: list[str], per_batch: int) -> dict:
    return {"type": "object", "properties": {"questions": {"type": "array", "maxItems": per_batch, "items": {
        "type": "object", "properties": {
            "question": {"type": "string", "minLength": 8, "maxLength": 300},
            "answer": {"type": "string", "minLength": 1, "maxLength": 200},
            "message_ids": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"enum": ids}},
            "how_realistic": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["question", "answer", "message_ids", "how_realistic"], "additionalProperties": False}}},
        "required": ["questions"], "additionalProperties": False}


def _render(rows, body_chars: int) -> str:
    parts = []
    for r in rows:
        body = (r["body"] or "").strip()
        parts.append(json.dumps({"message_id": r["message_id"], "date": r["date"], "from": r["from_address"],
                                 "subject": r["subject"], "body": body[:body_chars]},
                                ensure_ascii=False))
    return "\n".join(parts)


async def write_questions(db_path: str | Path, model: str, *, inbox: str, batches: int = 1, batch_size: int = 10,
                          per_batch: int = 3, body_chars: int = 1500, seed: int = 0, params: dict | None = None,
                          retry: RetryPolicy | None = None, split: str = "train") -> tuple[list[Scenario], WriterReport]:
    """(scenarios, report): up to `per_batch` questions from each of `batches` random batches of emails.

    `inbox`: an address, or the name of a mailbox (its owner's address is used).
    """
    if min(batches, batch_size, per_batch, body_chars) < 1:
        raise ValueError("batches, batch_size, per_batch and body_chars must be >= 1")
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    address = mailbox_owners(db_path).get(inbox) or (normal_address(inbox) if "@" in str(inbox) else None)
    db = open_readonly(db_path)
    try:
        ids = [r[0] for r in db.execute(f"SELECT e.id FROM emails e WHERE {IN_INBOX} AND length(e.body) > 40 "
                                        "ORDER BY e.id", {"inbox": address})] if address else []
        if not ids:
            raise ValueError(f"inbox {inbox!r} is not in {db_path}")
        rng = random.Random(seed)
        rng.shuffle(ids)
        report, out = WriterReport(), []
        for b in range(batches):
            chunk = ids[b * batch_size:(b + 1) * batch_size]
            if not chunk:
                break
            rows = db.execute(f"SELECT * FROM emails WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
            by_id = {r["message_id"]: r for r in rows}
            messages = [{"role": "system", "content": WRITER_PROMPT.format(address=address, per_batch=per_batch)},
                        {"role": "user", "content": _render(rows, body_chars)}]
            fmt = {"type": "json_schema", "json_schema": {"name": "questions",
                                                          "schema": _schema(sorted(by_id), per_batch)}}
            reply = await complete(model, messages, response_format=fmt, params=params, retry=retry)
            report.batches += 1
            try:
                items = json_list(reply.content, "questions")
            except ValueError:
                report.drop("reply is not the questions JSON")
                continue
            for n, item in enumerate(items):
                scenario = _scenario(item, by_id, address, split, f"{address.split('@')[0]}-w{seed}-{b}-{n}", report)
                if scenario is not None:
                    out.append(scenario)
                    report.written += 1
        return out, report
    finally:
        db.close()


def _scenario(item, by_id: dict, address: str, split: str, sid: str, report: WriterReport):
    if not isinstance(item, dict):
        report.drop("not an object")
        return None
    sources = item.get("message_ids")
    if not isinstance(sources, list) or not sources or any(s not in by_id for s in sources):
        report.drop("source id not in the batch")
        return None
    question, answer = str(item.get("question") or "").strip(), str(item.get("answer") or "").strip()
    if not question or not answer:
        report.drop("empty question or answer")
        return None
    realism = item.get("how_realistic")
    if isinstance(realism, bool) or not isinstance(realism, (int, float)) or not 0 <= realism <= 1:
        report.drop("how_realistic outside 0..1")
        return None
    newest = max(datetime.fromisoformat(by_id[s]["date"]) for s in sources)
    return Scenario(id=sid, question=question, answer=answer, message_ids=list(dict.fromkeys(sources)),
                    inbox_address=address, query_date=(newest + timedelta(days=3)).date().isoformat(),
                    how_realistic=float(realism), split=split, kind="llm")
