"""ART·E scenarios: ART's scenario format, JSONL/parquet files, ART's hub questions, and an offline generator.

A scenario is ART's record: id, question, answer, message_ids (the emails that hold the answer; the first
is the one ART's rubric checks), how_realistic (0..1), inbox_address (whose inbox: mail from or to it),
query_date (YYYY-MM-DD; the agent sees mail sent before it) and split, plus `kind` (how it was made).

`generate_scenarios` asks about facts in email bodies, without a model:

- figure:  "What did Rick say the EES exposure was?"        (a dollar amount, percentage or quantity with its
                                                             unit, and the words that name it)
- date:    "What date did Mary give for the PRC meeting?"    (an event and the day it is set for)
- place:   "Where is the SAP reporting meeting?"            (an event and its room or venue)
- phone:   "What is Shirley Crenshaw's phone number?"        (a person, by a first name the corpus's addresses
                                                             use, and the number right after the name)
- reply:   "Who replied to my email about the Q3 forecast?"  (two emails: mine and the one answer to it, from
                                                             one of my recipients, quoting me or addressed to me)
- sender:  "Who emailed me about Calpine Force Majeure?"     (training inboxes only: the one email of that subject,
                                                             sent to me directly, forwarding or quoting no one)

Facts come only from the sender's own words (`own_text_end`): quoted and forwarded blocks in every style these
mailboxes use (Outlook "-----Original Message-----" and "From: ... Sent:", Lotus Notes "Forwarded by", "Name /
07/11/2000 10:23 AM" datelines and "Name on <stamp>" lines, "> " quoting, separator lines, pasted all-capitals
headlines) end them, and a sentence reporting another's words ("El Paso said", "according to") gives nothing.
A date is not taken from a header or dateline, a bound ("until May 1"), a called-off event or one day of two; a
figure must be the whole value its clause gives ("100% full", "6% ... and 6.5%", "$40.30 each", "100% of Gas
Daily" are not); a room must be where something is held ("in EB3321"); a phone must not sit on a shared line
with an extension after it, nor belong to the tail of a longer name ("Jo Ann Holloway").

Each candidate is kept only when it checks out against the inbox as the agent will see it: the answer is
unique (every visible email that mentions the same thing gives the same value; those emails are all its
message_ids), it is findable (a search with the question's own words, with the sender's address when the
question names the sender, lists one of them among the first 10 results), and, for the test split, none of
its emails is in a training inbox. `how_realistic` is the share of four checks it passes: the fact is in a
body (not a header), the email is personal (from a person's address, at most 10 recipients), the thing
asked about is named by at least two words, and the answer is at most six words. `GenerationReport`
counts what was made and what was dropped, and why. Splits are by inbox: no inbox is in both.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path

import pydantic

from evals.art_e.inbox import IN_INBOX, mailbox_owners, normal_address, open_readonly
from evals.art_e.matching import DATE_PATTERNS, STOPWORDS, facts

SPLITS = ("train", "test")


class Scenario(pydantic.BaseModel):
    """One ART·E question, in ART's format (its integer ids are read as strings)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    id: str = pydantic.Field(min_length=1)
    question: str = pydantic.Field(min_length=1)
    answer: str = pydantic.Field(min_length=1)
    message_ids: list[pydantic.constr(min_length=1)] = pydantic.Field(min_length=1)
    how_realistic: float = pydantic.Field(ge=0, le=1)
    inbox_address: str
    query_date: str
    split: str = "test"
    kind: str | None = None

    @pydantic.field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, v):
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @pydantic.field_validator("inbox_address")
    @classmethod
    def _address(cls, v: str) -> str:
        return normal_address(v)

    @pydantic.field_validator("query_date")
    @classmethod
    def _day(cls, v: str) -> str:
        try:
            return date.fromisoformat(v[:10]).isoformat() if len(v) in (10, 19) else date.fromisoformat(v).isoformat()
        except ValueError:
            raise ValueError(f"query_date must be a date, YYYY-MM-DD, got {v!r}") from None

    @pydantic.field_validator("split")
    @classmethod
    def _split(cls, v: str) -> str:
        if v not in SPLITS:
            raise ValueError(f"split must be train or test, got {v!r}")
        return v


def save_scenarios(scenarios: list[Scenario], path: str | Path) -> Path:
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame([s.model_dump() for s in scenarios]).to_parquet(path, index=False)
    else:
        path.write_text("".join(s.model_dump_json() + "\n" for s in scenarios), encoding="utf-8")
    return path


def _records(path: Path) -> list[tuple[int, dict]]:
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow's errors have no common base worth naming
            raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
        return [(i + 1, {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()})
                for i, r in enumerate(frame.to_dict("records"))]
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def load_scenarios(path: str | Path, split: str | None = None) -> list[Scenario]:
    """Scenarios from JSONL or parquet (ours or ART's); a bad record is an error naming its line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no scenarios file at {path}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be train or test, got {split!r}")
    out = []
    for n, row in _records(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: a scenario is a JSON object")
        try:
            out.append(Scenario.model_validate(row))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "record"
            raise ValueError(f"{path}:{n}: {where}: {first['msg']}") from None
    return [s for s in out if split is None or s.split == split]


# ---------------------------------------------------------------------------------------------------------
# ART's published questions (the hub), mapped onto the inboxes this database has
# ---------------------------------------------------------------------------------------------------------

HUB_DATASET = "corbt/enron_emails_sample_questions"


def map_scenarios(scenarios: list[Scenario], db_path: str | Path) -> tuple[list[Scenario], Counter]:
    """The scenarios this database can pose, and the others counted by why not.

    Kept: the inbox address has mail here and every message id is an email of that inbox dated before
    the query date. ART's hub questions point into the whole Enron corpus; only those whose inbox and
    emails were ingested survive.
    """
    db = open_readonly(db_path)
    kept, skipped = [], Counter()
    try:
        for s in scenarios:
            if db.execute(f"SELECT 1 FROM emails e WHERE {IN_INBOX} LIMIT 1", {"inbox": s.inbox_address}).fetchone() is None:
                skipped["inbox not in the database"] += 1
                continue
            visible = sum(db.execute(f"SELECT 1 FROM emails e WHERE e.message_id = :m AND {IN_INBOX} AND e.date < :d",
                                     {"m": m, "inbox": s.inbox_address, "d": s.query_date + " 00:00:00"}).fetchone()
                          is not None for m in s.message_ids)
            if visible < len(s.message_ids):
                skipped["an email not in that inbox before the query date"] += 1
                continue
            kept.append(s)
    finally:
        db.close()
    return kept, skipped


def hub_records_to_scenarios(records: list[dict], split: str) -> list[Scenario]:
    """ART's hub rows (id, question, answer, message_ids, how_realistic, inbox_address, query_date) as scenarios."""
    return [Scenario(id=f"hub-{split}-{r['id']}", question=r["question"], answer=r["answer"],
                     message_ids=list(r["message_ids"]), inbox_address=r["inbox_address"],
                     query_date=str(r["query_date"])[:10], how_realistic=float(r["how_realistic"]),
                     split=split, kind="hub") for r in records]


def download_scenarios(split: str = "test", *, repo: str = HUB_DATASET, limit: int | None = None) -> list[Scenario]:
    """ART·E's published questions from the Hugging Face hub (needs the internet; cached by huggingface_hub).

    Their message ids point into the full Enron corpus: pass them through `map_scenarios` to keep those
    this database can pose.
    """
    if split not in SPLITS:
        raise ValueError("split must be 'train' or 'test'")
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo, f"default/{split}/0000.parquet", repo_type="dataset",
                               revision="refs/convert/parquet")
    except Exception as exc:
        raise ConnectionError(f"could not download {repo} ({split}) from the hub: {type(exc).__name__}: {exc}. "
                              "Offline? Use generate_scenarios or a local JSONL/parquet file.") from None
    import pandas as pd

    return hub_records_to_scenarios(pd.read_parquet(path).to_dict("records")[:limit], split)


# ---------------------------------------------------------------------------------------------------------
# The offline generator
# ---------------------------------------------------------------------------------------------------------

STAMP = r"\d{1,2}/\d{1,2}/\d{2,4}[ \t]+\d{1,2}:\d{2}(?::\d{2})?(?:[ \t]*[AP]M)?"
# Where quoted, forwarded or pasted text starts inside a body; everything from there on is not the sender's own
# words. Outlook: "-----Original Message-----", "From: ... Sent: ..." (one line or two); Lotus Notes: "-----
# Forwarded by", a "Name\n07/11/2000 10:23 AM" dateline, "Name@ENRON on 03/27/2001 10:37:02 AM", "From: Name
# 12/20/2000 05:35 PM", a bare "To: ...\ncc:" header pair; mail quoting ("> ..."); a separator line of ten or more
# "*", "=", "#" or "~" (pasted messages follow one); a pasted article's all-capitals headline of six or more
# single-spaced words (HEADLINE, case-sensitive).
QUOTED = re.compile(r"^[ \t]*(?:-{3,}[ \t]*(?:original message|forwarded by)|_{5,}|from:[ \t].*\bsent:"
                    r"|from:[ \t][^\n]*\n[ \t]*sent:|>)"
                    + r"|^[^\n]*\n[ \t]*" + STAMP + r"[ \t\r]*$"
                    + r"|^[^\n]*\bon[ \t]+" + STAMP
                    + r"|^[ \t]*from:[ \t][^\n]*" + STAMP
                    + r"|^[ \t]*to:[ \t][^\n]*\n(?:[^\n]*\n)?[ \t]*cc:"
                    + r"|^[ \t]*[*=#~]{10,}[ \t\r]*$", re.I | re.M)
# a date that bounds something rather than sets it ("suspending the tariff until May 1, 2001", "by 7/31", "Q1 '00 -
# Nov 15th"): not the date of an event named in its sentence
BOUND = re.compile(r"(?:\b(?:until|till|through|thru|by|before|after|since|from|to|between|no later than)|-)\s*$", re.I)
# a sentence that reports another's words ("It estimated ... (normal capacity is 675 MMcf/d)", "according to"):
# pasted news or hearsay, not the sender's own statement, so no figure, date or place is taken from it
REPORTED = re.compile(r"\b(?!I\b)[A-Z][\w&.'-]*\s+(?:said|says|reported|announced|estimated)\b|\baccording to\b"
                      r"|\b(?:it|he|she|they)\s+(?:said|says|estimated|reported|announced)\b")
# an event called off ("Frank Qian's interview scheduled for Friday, February 9 has been cancelled"): its date is
# not when it is
CALLED_OFF = re.compile(r"\b(?:cancel+(?:ed|ing|ation)?|postponed?|called off)\b", re.I)
# a day before the date that shares its month ("Monday 27th & Tuesday 28th November"): the event has two days
OTHER_DAY = re.compile(r"\b\d{1,2}(?:st|nd|rd|th)?\s*(?:&|and|,|or)\s*(?:[A-Z][a-z]+day,?\s+)?$")
DATELINE = re.compile(STAMP + r"|\b(?:sent|date|from|to|cc|subject)\s*:", re.I)
HEADLINE = re.compile(r"^[ \t]*(?:[A-Z0-9$.,'&/-]+ ){5,}[A-Z0-9$.,'&/-]+[ \t\r]*$", re.M)
NUM = r"\d(?:[\d,]*\d)?(?:\.\d+)?"
FIGURE = re.compile(r"\$\s?" + NUM + r"(?:\s?(?:million|billion|thousand|mil|MM|mm|bn|BN)\b|[mMbBkK]\b(?![&/-]|\.\w))?|\b"
                    + NUM + r"\s?(?:%|percent\b)|\b" + NUM
                    + r"\s?(?:MMBtu|mmbtu|MMBTU|Dth|dth|MW|MWh|Bcf|Mcf|MMcf|bbl|barrels)(?:/d(?:ay)?)?(?![A-Za-z])")
LINK = r"\s*(?P<link>is|was|are|were|of|at|:|=|totals?|totaled|totaling|will be|would be|comes to|came to)\s*" \
       r"(?:about\s+|approximately\s+|~\s*)?$"
FIGURE_CONTEXT = re.compile(r"(?P<np>(?:[A-Za-z0-9&'/-]+\s+){0,5}[A-Za-z][A-Za-z0-9&'/-]*)" + LINK)
EVENTS = r"meeting|conference call|call|lunch|dinner|presentation|training|party|offsite|off-site|interview|review|class|" \
         r"seminar|workshop|session|luncheon|reception|conference"
EVENT = re.compile(r"\b(?P<np>(?:(?:[A-Z][A-Za-z0-9&'-]*|[A-Z0-9]{2,})\s+){1,3}(?:" + EVENTS + r")s?)\b"
                   r"|\b(?:the|our|your|a|an)\s+(?P<lower>(?:[a-z][a-z-]{2,}\s+){1,2}(?:" + EVENTS + r")s?)\b")
ROOM = re.compile(r"\b(?:EB|ECS|ECN|3AC)\s?-?\d{2,4}[A-Z]?\d*\b|\b(?:[Cc]onference [Rr]oom|[Rr]oom)\s+[A-Z0-9-]*\d[A-Z0-9-]*\b"
                  r"|\bat the (?:[A-Z][a-z]+\s){0,2}(?:Club|Hotel|Grill|Restaurant|Cafe|Center|Centre|Inn|Hyatt|Hilton|"
                  r"Marriott|Four Seasons|Warwick|Doubletree)\b")
PHONE_AFTER_NAME = re.compile(r"(?P<name>\b[A-Z][a-z]+ (?:[A-Z]\. )?[A-Z][a-zA-Z'-]+)[,:]?\s*(?:at|on|-)?\s*"
                              r"(?P<phone>\(?\b713\)?[\s.-]?\d{3}[\s.-]\d{4}\b|\bx\s?\d{5}\b|\b[Ee]xt\.?\s?\d{4,5}\b)")
NOT_NP = set("""i we you he she they it me us him her them will would can could should shall may might must has have had
be been being do does did and but or if that which who whom this these those there here what when where why how not
please thanks thank let at to in on with by from into per as than about over under after before via all while
whereas although because so then also just only is was are were am a an instead currently vs versus mmbtu
mmbtus dth mw mcfd mcf bcf volumes few several many some same other such subject third assume include includes
note see add use make get take give send call""".split())
CALENDAR = set("""january february march april may june july august september october november december jan feb mar apr
jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday saturday sunday today tomorrow yesterday week
month year""".split())
NOT_A_NAME = set("""phone fax number office desk line help support services service team group center centre department
logistics contracts management development coordinator recruiter america north south east west houston enron global
program operations business information resources assistant administrator company corp corporation inc energy
power gas bank university college school chairman""".split())
GENERIC = set("the a an our my your their his her its this that these those".split())
PREPOSITIONS = set("""to from of in on at by with for into onto over under through via about between across against
toward towards within without per""".split())
# words that may follow a figure that is the whole value asked about ("$40,000 per company", "5% from shippers");
# any other word ("100% full", "$40.30 each", "$5 a share"; "6% for fuel and 6.5% for overhead" is caught by the
# second figure) drops it
AFTER_FIGURE = set("""per for of in on at by from to through thru including include includes and or but as with
which that this these last next the be is was are were will would plus less over under before after since
until during while so versus vs compared than""".split())
REPLY_PREFIX = re.compile(r"^\s*((re|fw|fwd)\s*:\s*)+", re.I)
PERSON_ADDRESS = re.compile(r"^[a-z]+\.[a-z]+@")
KINDS = ("figure", "date", "place", "phone", "reply", "sender")
TRAIN_ONLY_KINDS = ("sender",)  # made for training inboxes only: the test set keeps the audited kinds
GENERIC_TOPICS = set("""meeting update updates fyi question questions request info information hello hi thanks follow
up reminder lunch today tomorrow call schedule notice draft report list memo""".split())


@dataclass
class GenerationReport:
    """What the generator made, per kind, and what it dropped, per reason."""

    made: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)
    inboxes: dict[str, str] = field(default_factory=dict)  # address -> split


@dataclass
class _Candidate:
    kind: str
    email: sqlite3.Row
    question: str
    answer: str
    keywords: list[str]
    from_addr: str | None
    key: str             # what the question is about, to find every email that mentions it
    value_in: object     # function(text) -> set of normalised answer values found next to `key` in a text
    realism: list[bool]


def own_text_end(body: str) -> int:
    """Where the sender's own words end in `body`: the offset of the first quoted or forwarded block, or its length."""
    if not isinstance(body, str):
        raise TypeError("body must be a string")
    ends = [m.start() for m in (QUOTED.search(body), HEADLINE.search(body)) if m is not None]
    return min(ends, default=len(body))


def _own_text(body: str) -> str:
    """The email's own words: the body before any quoted or forwarded message, hard line wraps undone within a
    paragraph (paragraphs stay apart: a blank line between them is kept)."""
    text = (body or "")[: own_text_end(body or "")].replace("\r", "")
    paragraphs = re.split(r"\n[ \t]*\n\s*", text)
    return "\n\n".join(re.sub(r"[ \t]*\n[ \t]*", " ", p) for p in paragraphs)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n\s*\n", text) if 10 <= len(s.strip()) <= 300]


def _first_name(address: str) -> str | None:
    """The first name of a first.last@ address, or None (also for role addresses: chairman.office@)."""
    if not PERSON_ADDRESS.match(address or "") or address.split(".", 1)[0] in NOT_A_NAME:
        return None
    return address.split(".", 1)[0].capitalize()


def _topic(subject: str) -> str:
    return REPLY_PREFIX.sub("", subject or "").strip()


def _content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z0-9&'-]+", text) if w.lower() not in STOPWORDS and len(w) > 1]


def _the(np: str) -> str:
    """`np` with "the " before it, unless it is a singular possessive ("Dave Foti's presentation", but "the
    Skunkworks' meetings")."""
    return np if re.search(r"\w's\b", np) else "the " + np


def _whole_figure(sentence: str, figure: re.Match) -> bool:
    """Whether `figure` is the whole value its sentence gives: no other figure in the rest of its clause ("6% for
    fuel costs and 6.5% for overhead") and no word after it that changes what it measures ("100% full")."""
    rest = re.split(r";|\.(?:\s|$)", sentence[figure.end():], maxsplit=1)[0]
    if FIGURE.search(rest):
        return False
    nxt = re.match(r"\s*([A-Za-z]+)", rest)
    if nxt is not None and nxt.group(1).lower() == "of" and re.search(r"%|percent", figure.group(0)):
        return False  # "100% of Gas Daily less a sliding scale": a share of something, not the value itself
    return nxt is None or nxt.group(1).lower() in AFTER_FIGURE


def _clean_np(np: str) -> str | None:
    """A noun phrase worth asking about, or None: 1-5 words after a leading determiner, none of them a pronoun,
    verb, adverb (-ly, -ed, -ing), preposition other than "of"/"for" inside, determiner inside, date word or
    number, and at least one word of four letters or more."""
    words = np.split()
    while words and words[0].lower() in GENERIC:
        words = words[1:]
    if not 1 <= len(words) <= 5 or words[-1].lower() in ("of", "for") or words[0].lower() in ("of", "for"):
        return None
    for i, word in enumerate(w.lower().strip("'") for w in words):
        if (word in NOT_NP or word in CALENDAR or re.sub(r"'s$", "", word) in CALENDAR
                or word.endswith(("ed", "ing", "ly")) or (i and word in GENERIC) or any(ch.isdigit() for ch in word)):
            return None
    if not any(len(w) >= 4 for w in words):
        return None
    return " ".join(words)


def _figure_np(before: str) -> tuple[str, str] | None:
    """(noun phrase, link word) naming the figure that follows `before`, or None.

    The phrase is the longest run of two to five words right before the link ("is", "was", ":", "of" ...)
    that starts the sentence or follows a determiner ("the", "our", ...) or a comma, and passes `_clean_np`.
    """
    m = FIGURE_CONTEXT.search(before)
    if not m:
        return None
    head, words = before[: m.start("np")].split(), m.group("np").split()
    context = head + words
    for start in range(len(words) - 1):
        at = len(head) + start
        prev = context[at - 1] if at else ""
        if prev and prev.lower() not in GENERIC and not prev.endswith((",", ":", "(", ";")):
            continue
        if prev.lower() in GENERIC and at >= 2 and context[at - 2].lower() in PREPOSITIONS:
            continue  # "from PG&E to the West of Thoreau Area totals $190,000": the phrase is not what totals it
        np = _clean_np(" ".join(words[start:]))
        if np and len(np.split()) >= 2:
            return np, m.group("link")
    return None


def _values(kind: str, text: str) -> set:
    """Normalised answer values of one kind ("figure", "date" or "phone") in a piece of text."""
    found = facts(text)
    if kind == "figure":
        return {("$", v) for v in found.amounts} | {("%", v) for v in found.percents} | {("n", v) for v in found.numbers}
    if kind == "date":
        return {(m, d) for _, m, d in found.dates}
    return found.phones


def _near(key: str, kind: str):
    """A function: the values of `kind` in the sentences of a text that mention `key`."""
    pattern = re.compile(r"\b" + r"\s+".join(map(re.escape, key.split())) + r"\b", re.I)

    def found(text: str) -> set:
        out: set = set()
        for sentence in _sentences(_own_text(text)):
            m = pattern.search(sentence)
            if not m:
                continue
            if kind == "figure":
                after = sentence[m.end():]
                link = re.match(LINK.replace("$", "") + r"(?P<v>" + FIGURE.pattern + ")", after, re.I)
                if link:
                    out |= _values("figure", link.group("v"))
            elif kind == "phone":
                after = PHONE_AFTER_NAME.match(sentence[m.start():])
                if after:
                    out |= _values("phone", after.group("phone"))
            elif kind == "place":
                out |= {r.group(0).lower().removeprefix("at the ") for r in ROOM.finditer(sentence)}
            else:
                out |= _values(kind, sentence)
        return out

    return found


def _candidates(email: sqlite3.Row, owner: str, recipients: list[str], first_names: set[str]) -> list[_Candidate]:
    sender = email["from_address"] or ""
    first = _first_name(sender)
    personal = bool(first) and len(recipients) <= 10
    own = sender == owner
    to_first = _first_name(recipients[0]) if own and len(recipients) == 1 else None
    out: list[_Candidate] = []
    for sentence in [t for t in _sentences(_own_text(email["body"])) if not REPORTED.search(t)]:
        for figure in FIGURE.finditer(sentence):
            if not _whole_figure(sentence, figure):
                continue
            found = _figure_np(sentence[: figure.start()])
            if not found:
                continue
            np, link = found
            verb = link if link in ("is", "was", "are", "were") else "was"
            if own and to_first:
                q, who = f"What did I tell {to_first} {_the(np)} {verb}?", None
            elif first and not own:
                q, who = f"What did {first} say {_the(np)} {verb}?", sender
            else:
                continue
            out.append(_Candidate("figure", email, q, figure.group(0).strip(), _content_words(np), who, np,
                                  _near(np, "figure"), [True, personal, len(np.split()) >= 2, True]))
        events = list(EVENT.finditer(sentence))
        if len(events) != 1:
            continue
        np = _clean_np(events[0].group("np") or events[0].group("lower"))
        if not np:
            continue
        dates = [d for p in DATE_PATTERNS for d in p.finditer(sentence.lower())]
        if (len(dates) == 1 and dates[0].groupdict().get("d") and not DATELINE.search(sentence)
                and not BOUND.search(sentence[: dates[0].start()]) and not CALLED_OFF.search(sentence)
                and not OTHER_DAY.search(sentence[: dates[0].start()])):
            when = sentence[dates[0].start(): dates[0].end()].strip(" ,")
            q = f"What date did {first} give for {_the(np)}?" if first and not own else f"When is {_the(np)}?"
            out.append(_Candidate("date", email, q, when, _content_words(np), sender if first and not own else None,
                                  np, _near(np, "date"), [True, personal, len(np.split()) >= 2,
                                                          len(when.split()) <= 6]))
        rooms = list(ROOM.finditer(sentence))
        if len(rooms) == 1 and (rooms[0].group(0).startswith("at the ")
                                or re.search(r"\b(?:in|at)\s+(?:the\s+)?$", sentence[: rooms[0].start()], re.I)):
            # the room is where something is held ("in EB3321"), not a place mail goes to ("on its way to EB5007")
            where = rooms[0].group(0).removeprefix("at the ")
            out.append(_Candidate("place", email, f"Where is {_the(np)}?", where, _content_words(np), None, np,
                                  _near(np, "place"), [True, personal, len(np.split()) >= 2, len(where.split()) <= 6]))
    own_words = _own_text(email["body"])
    for m in PHONE_AFTER_NAME.finditer(own_words):
        name = m.group("name")
        if name.split()[0].lower() not in first_names or any(w.lower() in NOT_A_NAME for w in name.split()):
            continue
        if re.search(r"(?:^|[\s(])[A-Z][A-Za-z'.-]*[ \t]+$", own_words[: m.start()]):
            continue  # "Jo Ann Holloway", "New Power Company": the two words are the end of a longer name
        if re.match(r"[ \t]*(?:x|ext\.?)[ \t]*\d", own_words[m.end():], re.I):
            continue  # "Ken Davenport 713-227-7660 x137": a shared line; the number alone is not the person's
        phone = m.group("phone").strip()
        phone = phone[1:] if phone.startswith("(") and ")" not in phone else phone  # "(713-853-9712)"
        owner_of = name + ("'" if name.endswith("s") else "'s")
        out.append(_Candidate("phone", email, f"What is {owner_of} phone number?", phone,
                              name.split(), None, name, _near(name, "phone"),
                              [True, personal, True, True]))
    return out


def _visible_mentions(db, inbox: str, until: str, cand: _Candidate) -> tuple[set, list[str]]:
    """(every value the inbox's visible emails give for the candidate's subject, the ids of those giving its answer)."""
    phrase = '"' + " ".join(re.findall(r"[A-Za-z0-9]+", cand.key)) + '"'
    sql = (f"SELECT e.message_id, e.body FROM emails e JOIN emails_fts f ON f.rowid = e.id WHERE emails_fts MATCH :q "
           f"AND {IN_INBOX} AND e.date < :until" + (" AND e.from_address = :sender" if cand.from_addr else "")
           + " ORDER BY e.date")
    values, ids = set(), []
    answer = _values(cand.kind, cand.answer) if cand.kind != "place" else {cand.answer.lower()}
    for mid, body in db.execute(sql, {"q": phrase, "inbox": inbox, "until": until, "sender": cand.from_addr}):
        found = cand.value_in(body)
        values |= found
        if found & answer:
            ids.append(mid)
    return values, ids


def _findable(db_path, inbox: str, query_date: str, cand: _Candidate, ids: list[str]) -> bool:
    from evals.art_e.tools import InboxTools

    tools = InboxTools(db_path, inbox, query_date)
    try:
        hits = tools.search_emails(cand.keywords, from_addr=cand.from_addr)
    finally:
        tools.close()
    return any(h["message_id"] in ids for h in hits)


def _squash(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", (text or "").lower()))


def _answers(db, mine: sqlite3.Row, reply: sqlite3.Row) -> bool:
    """Whether `reply` is an answer to `mine` by more than its subject: its sender was a To or Cc recipient of
    mine (not someone answering another email of mine with the same subject and words), and it quotes my own
    words (a run of at least eight of my words, or all of them when I wrote fewer) or is addressed to me within
    30 days."""
    was_asked = db.execute("SELECT 1 FROM recipients WHERE email_id = ? AND recipient_address = ? AND "
                           "recipient_type != 'bcc'", (mine["id"], reply["from_address"])).fetchone()
    if was_asked is None:
        return False
    mine_words = _squash(_own_text(mine["body"])).split()
    if mine_words:
        n = min(8, len(mine_words))
        quoted = _squash(reply["body"][own_text_end(reply["body"] or ""):] if reply["body"] else "")
        if any(" ".join(mine_words[i:i + n]) in quoted for i in range(len(mine_words) - n + 1)):
            return True
    if (datetime.fromisoformat(reply["date"]) - datetime.fromisoformat(mine["date"])).days > 30:
        return False
    to_me = db.execute("SELECT 1 FROM recipients WHERE email_id = ? AND recipient_address = ? AND recipient_type != "
                       "'bcc'", (reply["id"], mine["from_address"])).fetchone()
    return to_me is not None


def _reply_candidates(db, owner: str) -> list[tuple[sqlite3.Row, sqlite3.Row]]:
    """(my email, the one reply to it) pairs: subjects I wrote that exactly one other person answered, with thread
    evidence beyond the subject (`_answers`: the reply quotes me, or comes from one of my recipients). One pair
    per subject: when I sent the same subject more than once (a resend), the question would be asked twice with
    one answer, so only my latest email before the reply is kept."""
    mine = db.execute("SELECT * FROM emails e WHERE e.from_address = ? AND length(e.subject) > 8 ORDER BY e.id",
                      (owner,)).fetchall()
    pairs: dict[str, tuple] = {}
    for email in mine:
        topic = _topic(email["subject"])
        if len(topic) < 8 or topic.lower() != email["subject"].strip().lower():
            continue
        replies = db.execute(f"SELECT * FROM emails e WHERE {IN_INBOX} AND lower(e.subject) IN (:re1, :re2) "
                             "AND e.from_address != :inbox AND e.date > :after",
                             {"inbox": owner, "re1": "re: " + topic.lower(), "re2": "re:" + topic.lower(),
                              "after": email["date"]}).fetchall()
        if len({r["from_address"] for r in replies}) == 1 and len(replies) == 1 and _answers(db, email, replies[0]):
            key = topic.lower()
            if key not in pairs or pairs[key][0]["date"] < email["date"]:
                pairs[key] = (email, replies[0])
    return list(pairs.values())


def generate_scenarios(db_path: str | Path, *, per_inbox: int = 50, test_inboxes: list[str] | None = None,
                       seed: int = 0, report: GenerationReport | None = None,
                       sender_per_inbox: int = 100) -> list[Scenario]:
    """Up to `per_inbox` checked questions about facts in the mail of each mailbox owner's inbox.

    `test_inboxes`: the addresses (or mailbox names) whose questions form the test split; by default the
    second half of the mailboxes by name (at least one), as ART split its inboxes in half. Deterministic
    given the database and `seed`. `sender_per_inbox`: at most this many "Who emailed me about <subject>?"
    questions per training inbox (a kind made for training inboxes only; 0 makes none).
    """
    if isinstance(per_inbox, bool) or not isinstance(per_inbox, int) or per_inbox < 1:
        raise ValueError("per_inbox must be an integer >= 1")
    if isinstance(sender_per_inbox, bool) or not isinstance(sender_per_inbox, int) or sender_per_inbox < 0:
        raise ValueError("sender_per_inbox must be an integer >= 0")
    owners = mailbox_owners(db_path)
    if not owners:
        raise ValueError(f"{db_path} holds no mailboxes: build it with build_inbox_db first")
    names = sorted(owners)
    if test_inboxes is None:
        test = {owners[n] for n in names[-max(1, len(names) // 2):]}
    else:
        unknown = [t for t in test_inboxes if t not in owners and t.lower() not in owners.values()]
        if unknown:
            raise ValueError(f"not an inbox of {db_path}: {', '.join(unknown)} (inboxes: "
                             f"{', '.join(f'{n} ({a})' for n, a in owners.items())})")
        test = {owners.get(t, t.lower()) for t in test_inboxes}
    train = set(owners.values()) - test
    report = report if report is not None else GenerationReport()
    rng = random.Random(seed)
    db = open_readonly(db_path)
    scenarios: list[Scenario] = []
    try:
        first_names = _first_names(db)
        for name in names:
            inbox = owners[name]
            split = "test" if inbox in test else "train"
            report.inboxes[inbox] = split
            scenarios += _for_inbox(db, db_path, inbox, split, train, per_inbox, rng, report, first_names, seed,
                                    sender_per_inbox)
    finally:
        db.close()
    return scenarios


def in_any_inbox(db, email_id: int, others: set[str]) -> bool:
    """Whether the email of database id `email_id` is in the inbox of any address of `others` (from it or to it)."""
    if not others:
        return False
    marks = ",".join("?" * len(others))
    row = db.execute(f"SELECT 1 FROM emails e WHERE e.id = ? AND (e.from_address IN ({marks}) OR EXISTS (SELECT 1 FROM "
                     f"recipients r WHERE r.email_id = e.id AND r.recipient_address IN ({marks})))",
                     (email_id, *others, *others)).fetchone()
    return row is not None


def _first_names(db) -> set[str]:
    """First names as the corpus spells them: the first part of every first.last@ address it holds."""
    names = set()
    for (addr,) in db.execute("SELECT from_address FROM emails UNION SELECT recipient_address FROM recipients"):
        if PERSON_ADDRESS.match(addr or ""):
            names.add(addr.split(".", 1)[0])
    return names - NOT_A_NAME


def _for_inbox(db, db_path, inbox: str, split: str, train: set[str], per_inbox: int, rng: random.Random,
               report: GenerationReport, first_names: set[str], seed: int, sender_per_inbox: int) -> list[Scenario]:
    emails = db.execute(f"SELECT e.* FROM emails e WHERE {IN_INBOX} AND e.date >= '1995' ORDER BY e.id",
                        {"inbox": inbox}).fetchall()
    recipients: dict[int, list[str]] = {}
    for eid, addr in db.execute(f"SELECT r.email_id, r.recipient_address FROM recipients r JOIN emails e ON "
                                f"e.id = r.email_id WHERE {IN_INBOX} ORDER BY r.rowid", {"inbox": inbox}):
        recipients.setdefault(eid, []).append(addr)
    cands = [c for e in emails for c in _candidates(e, inbox, recipients.get(e["id"], []), first_names)]
    rng.shuffle(cands)
    pairs = _reply_candidates(db, inbox)
    rng.shuffle(pairs)
    # take the kinds in turn, so that no kind crowds out the others
    by_kind: dict[str, list] = {k: [c for c in cands if c.kind == k] for k in KINDS}
    by_kind["reply"] = pairs
    by_kind["sender"] = []
    sender_rng = random.Random(f"{seed}-{inbox}-sender")  # its own: the other kinds' draws stay as they were
    if split == "train" and "sender" in TRAIN_ONLY_KINDS:
        by_kind["sender"] = [e for e in emails if _sender_topic(e, inbox, recipients.get(e["id"], []))]
        sender_rng.shuffle(by_kind["sender"])
    made_senders = 0
    out: list[Scenario] = []
    seen: set[tuple[str, str]] = set()
    while len(out) < per_inbox and any(by_kind.values()):
        for kind in KINDS:
            if len(out) >= per_inbox or not by_kind[kind]:
                continue
            item = by_kind[kind].pop()
            if kind == "reply":
                s = _reply_scenario(db, db_path, inbox, split, train, item, rng, report)
            elif kind == "sender":
                if made_senders >= sender_per_inbox:
                    by_kind["sender"] = []
                    continue
                s = _sender_scenario(db, db_path, inbox, split, item, sender_rng, report, seen)
                made_senders += s is not None
            else:
                s = _fact_scenario(db, db_path, inbox, split, train, item, rng, report, seen)
            if s is not None:
                out.append(s)
                report.made[kind] += 1
    return out


def _sender_topic(email: sqlite3.Row, inbox: str, recipients: list[str]) -> str | None:
    """The subject of an email a person sent me directly (I am a To recipient of at most 10, the subject is not a
    reply's or a forward's and says what it is about: three or more content words, not only generic ones; the body
    holds no forwarded or quoted email), or None."""
    sender, subject = email["from_address"] or "", (email["subject"] or "").strip()
    if sender == inbox or not _first_name(sender) or inbox not in recipients or len(recipients) > 10:
        return None
    if _topic(subject) != subject or re.match(r"(?i)\s*(?:re|fw|fwd)\b", subject) or len(subject) < 12:
        return None
    if own_text_end(email["body"] or "") < len(email["body"] or ""):
        return None  # it forwards or quotes another's email: "who emailed me" could mean either of them
    words = [w.lower() for w in _content_words(subject)]
    if len(words) < 3 or all(w in GENERIC_TOPICS for w in words):
        return None
    return subject


def _sender_scenario(db, db_path, inbox, split, email, rng, report, seen) -> Scenario | None:
    """"Who emailed me about <subject>?": kept when, on the query date, this is the only email of the inbox whose
    subject (less Re:/Fw: prefixes) is that subject, I am a direct recipient, and a search with the subject's
    words finds it."""
    topic = email["subject"].strip()
    if ("sender", topic.lower()) in seen:
        report.dropped["sender: asked already"] += 1
        return None
    seen.add(("sender", topic.lower()))
    direct = db.execute("SELECT 1 FROM recipients WHERE email_id = ? AND recipient_address = ? AND recipient_type = "
                        "'to'", (email["id"], inbox)).fetchone()
    if direct is None:
        report.dropped["sender: I am not a direct recipient"] += 1
        return None
    query_date = _query_date(email["date"], rng)
    same = [r for r in db.execute(f"SELECT e.id, e.subject FROM emails e WHERE {IN_INBOX} AND e.date < :until AND "
                                  "lower(e.subject) LIKE :like", {"inbox": inbox, "until": query_date + " 00:00:00",
                                                                  "like": "%" + topic.lower() + "%"})
            if _topic(r[1]).lower() == topic.lower()]
    if [r[0] for r in same] != [email["id"]]:
        report.dropped["sender: another email has that subject"] += 1
        return None
    cand = _Candidate("sender", email, "", "", _content_words(topic), None, topic, None, [])
    if not _findable(db_path, inbox, query_date, cand, [email["message_id"]]):
        report.dropped["sender: not found by a search with the question's words"] += 1
        return None
    realism = [False, True, len(cand.keywords) >= 2, True]
    return Scenario(id=f"{inbox.split('@')[0]}-{email['id']}-sender", question=f"Who emailed me about {topic}?",
                    answer=email["from_address"], message_ids=[email["message_id"]],
                    how_realistic=round(sum(realism) / len(realism), 2), inbox_address=inbox, query_date=query_date,
                    split=split, kind="sender")


def _query_date(email_date: str, rng: random.Random) -> str:
    return (datetime.fromisoformat(email_date) + timedelta(days=rng.randint(1, 30))).date().isoformat()


def _fact_scenario(db, db_path, inbox, split, train, c: _Candidate, rng, report, seen) -> Scenario | None:
    if (c.kind, c.key.lower()) in seen:
        report.dropped[f"{c.kind}: asked already"] += 1
        return None
    seen.add((c.kind, c.key.lower()))
    query_date = _query_date(c.email["date"], rng)
    values, ids = _visible_mentions(db, inbox, query_date + " 00:00:00", c)
    if len(values) != 1 or c.email["message_id"] not in ids:
        report.dropped[f"{c.kind}: not unique in the inbox"] += 1
        return None
    ids = [c.email["message_id"]] + [i for i in ids if i != c.email["message_id"]]
    if split == "test" and any(in_any_inbox(db, r[0], train) for r in db.execute(
            f"SELECT id FROM emails WHERE message_id IN ({','.join('?' * len(ids))})", ids)):
        report.dropped[f"{c.kind}: an email also in a training inbox"] += 1
        return None
    if not c.keywords or not _findable(db_path, inbox, query_date, c, ids):
        report.dropped[f"{c.kind}: not found by a search with the question's words"] += 1
        return None
    return Scenario(id=f"{inbox.split('@')[0]}-{c.email['id']}-{c.kind}-{len(seen)}", question=c.question,
                    answer=c.answer, message_ids=ids, how_realistic=round(sum(c.realism) / len(c.realism), 2),
                    inbox_address=inbox, query_date=query_date, split=split, kind=c.kind)


def _reply_scenario(db, db_path, inbox, split, train, pair, rng, report) -> Scenario | None:
    mine, reply = pair
    if split == "test" and (in_any_inbox(db, mine["id"], train) or in_any_inbox(db, reply["id"], train)):
        report.dropped["reply: an email also in a training inbox"] += 1
        return None
    topic = _topic(mine["subject"])
    query_date = _query_date(reply["date"], rng)
    cand = _Candidate("reply", reply, "", "", _content_words(topic), None, topic, None, [])
    if not cand.keywords or not _findable(db_path, inbox, query_date, cand, [reply["message_id"], mine["message_id"]]):
        report.dropped["reply: not found by a search with the question's words"] += 1
        return None
    replier = reply["from_address"]
    realism = [False, bool(_first_name(replier)), len(cand.keywords) >= 2, True]
    return Scenario(id=f"{inbox.split('@')[0]}-{reply['id']}-reply", question=f"Who replied to my email about {topic}?",
                    answer=replier, message_ids=[reply["message_id"], mine["message_id"]],
                    how_realistic=round(sum(realism) / len(realism), 2), inbox_address=inbox, query_date=query_date,
                    split=split, kind="reply")


def question_mix(scenarios: list[Scenario]):
    """One row per (split, kind): how many questions, mean how_realistic, mean source emails per question."""
    import pandas as pd

    if not scenarios:
        raise ValueError("no scenarios")
    df = pd.DataFrame([{"split": s.split, "kind": s.kind or "", "how_realistic": s.how_realistic,
                        "sources": len(s.message_ids)} for s in scenarios])
    out = df.groupby(["split", "kind"]).agg(questions=("kind", "size"), how_realistic=("how_realistic", "mean"),
                                            sources=("sources", "mean")).reset_index()
    return out
