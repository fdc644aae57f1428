"""A reading sample of generated ART·E questions: each question with its reference answer and the full text of
its source emails (headers and body), so that a person can judge whether the reference is right.

    .venv/bin/python -m evals.art_e_questions --audit-sample 50 --seed 3

`audit_sample` draws the sample (both splits, a fixed seed); `render_audit` writes it as plain text. Lines of a
source body that hold the answer are marked `>>>` at the left margin; lines the generator reads as quoted or
forwarded text (not the sender's own words) are marked `q |`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from evals.art_e.inbox import open_readonly
from evals.art_e.questions import Scenario, own_text_end


@dataclass
class AuditItem:
    """One sampled question and its source emails, as rows of the emails table plus their recipients."""

    number: int
    scenario: Scenario
    sources: list[dict]


def audit_sample(db_path: str | Path, scenarios: list[Scenario], n: int, seed: int) -> list[AuditItem]:
    """`n` questions drawn at random (by `seed`) from `scenarios`, each with its source emails read from the
    database. All of them when there are fewer than `n`. A source id missing from the database is an error."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("n must be an integer >= 1")
    if not scenarios:
        raise ValueError("no scenarios to sample")
    if not all(isinstance(s, Scenario) for s in scenarios):
        raise TypeError("scenarios must be Scenario objects")
    picked = random.Random(seed).sample(scenarios, min(n, len(scenarios)))
    db = open_readonly(db_path)
    try:
        items = []
        for i, s in enumerate(picked, 1):
            sources = []
            for mid in s.message_ids:
                row = db.execute("SELECT * FROM emails WHERE message_id = ?", (mid,)).fetchone()
                if row is None:
                    raise ValueError(f"question {s.id}: source {mid} is not in {db_path}")
                rcpt = db.execute("SELECT recipient_type, recipient_address FROM recipients WHERE email_id = ? "
                                  "ORDER BY rowid", (row["id"],)).fetchall()
                sources.append({**dict(row), "recipients": [(t, a) for t, a in rcpt]})
            items.append(AuditItem(i, s, sources))
        return items
    finally:
        db.close()


def _answer_pattern(answer: str) -> re.Pattern | None:
    words = re.findall(r"[A-Za-z0-9]+", answer.split("@")[0] if "@" in answer else answer)
    if not words:
        return None
    return re.compile(r"[^A-Za-z0-9]*".join(map(re.escape, words)), re.I)


def render_audit(items: list[AuditItem], body_chars: int = 6000) -> str:
    """The sample as text: per question its id, split, kind, query date, question, answer, then each source."""
    if body_chars < 1:
        raise ValueError("body_chars must be >= 1")
    out = []
    for item in items:
        s = item.scenario
        out += ["=" * 100, f"[{item.number}] {s.id}  split={s.split} kind={s.kind} query_date={s.query_date}",
                f"Q: {s.question}", f"A: {s.answer}", ""]
        pattern = _answer_pattern(s.answer)
        for k, src in enumerate(item.sources, 1):
            to = ", ".join(f"{t}:{a}" for t, a in src["recipients"][:12])
            more = len(src["recipients"]) - 12
            out += [f"--- source {k}/{len(item.sources)}: {src['message_id']}",
                    f"    Date: {src['date']}  From: {src['from_address']}",
                    f"    To: {to}" + (f" (+{more} more)" if more > 0 else ""), f"    Subject: {src['subject']}"]
            body = src["body"] or ""
            cut = own_text_end(body)
            shown, pos = body[:body_chars], 0
            for line in shown.split("\n"):
                quoted = cut < len(body) and pos >= cut
                mark = ">>>" if pattern and pattern.search(line) else "   "
                out.append(f"{mark}{'q |' if quoted else '  |'} {line.rstrip(chr(13))}")
                pos += len(line) + 1
            if len(body) > body_chars:
                out.append(f"      ... ({len(body) - body_chars} more characters)")
            out.append("")
    return "\n".join(out) + "\n"
