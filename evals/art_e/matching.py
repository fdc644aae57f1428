"""Deciding without a model whether an answer gives the reference answer (`match_verdict`, `answer_matches`).

    match_verdict("It was $3,000.", "$3000")                          -> "accept"
    match_verdict("$3000", "$300")                                    -> "reject"
    match_verdict("March 26, not March 19", "March 26")               -> "ask"  (a model should decide)
    match_verdict("Not jan.moore@enron.com", "jan.moore@enron.com")   -> "ask"
    answer_matches("It was $3,000.", "$3000")                         -> True   (accept only)

The text of both is read into typed values (addresses, dollar amounts, percentages, phone numbers, dates,
times, plain numbers) and the words left over; values are compared as values and words as whole words, a
sentence-form reference by its values and the overlap of its content words. The same readers serve the offline
question generator (`facts`), so a question is only written about a value this module can read back.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import date

IDK = "I don't know"

MONTHS = {m: i + 1 for i, m in enumerate(["january", "february", "march", "april", "may", "june", "july", "august",
                                          "september", "october", "november", "december"])}
MONTHS.update({m[:3]: i for m, i in list(MONTHS.items())})
MONTHS["sept"] = 9
MONTH = r"(?P<mn>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|" \
        r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
WEEKDAY = r"(?:(?:mon|tues?|wed(?:nes)?|thu(?:rs?)?|fri|sat(?:ur)?|sun)(?:day)?\.?,?\s+)?"
YEAR = r"(?:,?\s+(?P<y>(?:19|20)\d\d)\b)?"
DATE_PATTERNS = [
    re.compile(r"\b(?P<y>(?:19|20)\d\d)-(?P<m>\d\d?)-(?P<d>\d\d?)\b"),
    re.compile(r"\b(?P<m>\d\d?)/(?P<d>\d\d?)(?:/(?P<y>\d{4}|\d\d))?\b"),
    re.compile(r"\b" + WEEKDAY + MONTH + r"\s+(?P<d>\d\d?)(?:st|nd|rd|th)?\b" + YEAR),
    re.compile(r"\b" + WEEKDAY + r"(?:the\s+)?(?P<d>\d\d?)(?:st|nd|rd|th)?\s+(?:of\s+)?" + MONTH + YEAR),
]
# a month's day followed by more days ("January 18, 19 and 20", "Jan 18-19", "18 and 19 March"): each day one date.
# A number is not a further day when a time, a unit or a range to a time follows it ("Jan 18, 3-4 pm", "January 18,
# 3 days before", "10:30, 18 January"), nor after "/" (Sept 29/01 is a year)
_DAY = r"\d\d?(?:st|nd|rd|th)?"
_NOT_A_DAY = (r"(?!\s*(?::|\.\d|a\.?m\b|p\.?m\b|\d|%|(?:-|to\b|until\b)\s*\d|o'?clock|(?:days?|weeks?|months?|years?|"
              r"hours?|hrs?|minutes?|mins?|people|percent)\b))")
_MORE_DAYS = r"(?:\s*(?:,|;|&|-|\band\b|\bor\b|\bto\b|\buntil\b|\bthrough\b|\bthru\b)\s*(?:the\s+)?" + _DAY + r"\b" + \
             _NOT_A_DAY + ")+"
_MORE_DAYS_FIRST = r"(?:\s*(?:&|-|\band\b|\bor\b|\bto\b|\bthrough\b|\bthru\b)\s*" + _DAY + r"\b)+"  # no commas
DAY_LISTS = [
    re.compile(r"\b" + WEEKDAY + MONTH + r"\s+(?P<days>" + _DAY + _MORE_DAYS + r")" + YEAR),
    re.compile(r"(?<![:\d.])\b(?P<days>" + _DAY + _MORE_DAYS_FIRST + r")\s+(?:of\s+)?" + MONTH + YEAR),
]
TIME = re.compile(r"\b(?P<h>\d\d?)(?::(?P<mi>\d\d))?\s*(?P<ap>a\.?m\.?|p\.?m\.?)(?![a-z])|\b(?P<h24>\d\d?):(?P<mi24>\d\d)\b")
EMAIL = re.compile(r"[a-z0-9._%+'-]+@[a-z0-9.-]+\.[a-z]{2,}")
SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mm": 1e6, "mil": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9,
         "billion": 1e9}
AMOUNT = re.compile(r"(?:\$|\busd\s?)\s?(?P<n>\d[\d,]*(?:\.\d+)?|\.\d+)"  # a scale letter is one only when attached: $5m, not $5 m&a
                    r"(?:\s?(?P<s>thousand|million|billion|mil|mm|bn)\b|(?P<sl>[kmb])\b(?![&/-]|\.\w))?"
                    r"|\b(?P<n2>\d[\d,]*(?:\.\d+)?)(?:\s?(?P<s2>thousand|million|billion|mm|bn|k|m|b))?\s?(?:dollars|usd)\b")
PERCENT = re.compile(r"\b(?P<n>\d+(?:\.\d+)?)\s?(?:%|percent\b)")
PHONE = re.compile(r"(?:\+?\b1[\s.-]?)?(?:\(\s?\d{3}\s?\)|\b\d{3})[\s.-]?\d{3}[\s.-]\d{4}\b|\b\d{3}[\s.-]\d{4}\b")
EXTENSION = re.compile(r"\b(?:x|ext\.?|extension)\s?(?P<n>\d{4,5})\b")
NUMBER = re.compile(r"\b\d[\d,]*(?:\.\d+)?\b")
NUMBER_WORDS = {w: float(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
STOPWORDS = set("""a an the of to in on at for by with from as is was were are be been being it its this that these
those and i you he she we they me him her us them my your his our their mine yours there here which what who whom
whose when where why how do does did has have had will would shall should can could s""".split())
NEGATIONS = set("""not no never none neither nor nobody nothing nowhere isn't wasn't weren't aren't didn't don't doesn't
hasn't haven't hadn't won't wouldn't can't cannot couldn't shouldn't isnt wasnt didnt dont doesnt cant wont""".split())
HEDGES = set("""or either maybe perhaps possibly probably likely unlikely might unsure unclear uncertain guess think
believe seems seem assume somewhere sometime roughly approximately""".split())


def _normal(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return text.replace("\u2019", "'").replace("\u2018", "'").replace("\u2013", "-").replace("\u2014", "-")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _take(pattern: re.Pattern, text: str, value) -> tuple[set, str]:
    """The values `pattern` finds in `text` (via `value(match)`; None: not one), and the text with them blanked."""
    found = set()

    def blank(m: re.Match) -> str:
        v = value(m)
        if v is None:
            return m.group(0)
        found.add(v)
        return " "

    return found, pattern.sub(blank, text)


def _date_value(m: re.Match):
    g = m.groupdict()
    month = MONTHS[g["mn"].rstrip(".")] if g.get("mn") else int(g["m"])
    day, year = int(g["d"]), g.get("y")
    if year is not None:
        year = int(year) + (0 if len(year) == 4 else 1900 if int(year) >= 50 else 2000)
    try:
        date(year or 2000, month, day)
    except ValueError:
        return None
    return (year, month, day)


def _day_list_values(m: re.Match) -> frozenset | None:
    """The dates of a month's day list ("January 18, 19 and 20"), or None when one of its days is not a date."""
    g = m.groupdict()
    month, year = MONTHS[g["mn"].rstrip(".")], g.get("y")
    year = int(year) if year else None
    days = [int(d) for d in re.findall(r"\d\d?", g["days"])]
    try:
        for d in days:
            date(year or 2000, month, d)
    except ValueError:
        return None
    return frozenset((year, month, d) for d in days)


def _time_value(m: re.Match):
    if m.group("h24") is not None:
        h, mi = int(m.group("h24")), int(m.group("mi24"))
    else:
        h, mi = int(m.group("h")), int(m.group("mi") or 0)
        if not 1 <= h <= 12:
            return None
        h = h % 12 + (12 if m.group("ap").startswith("p") else 0)
    return h * 60 + mi if h < 24 and mi < 60 else None


def _amount_value(m: re.Match):
    n, s = (m.group("n"), m.group("s") or m.group("sl")) if m.group("n") else (m.group("n2"), m.group("s2"))
    return round(_number(n) * SCALE.get(s or "", 1), 2)


@dataclass
class Facts:
    """What a text states, read into values: sets of each kind, and the words left over."""

    emails: set
    amounts: set
    percents: set
    phones: set
    dates: set
    times: set
    numbers: set
    words: list


_TENS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALE_WORDS = {**{w: int(v) for w, v in NUMBER_WORDS.items()}, **_TENS}
_WORDED = re.compile(r"\b(?P<w>" + "|".join(sorted(_SCALE_WORDS, key=len, reverse=True)) +
                     r")(?=\s+(?:percent|thousand|million|billion|dollars)\b)")


def facts(text: str) -> Facts:
    """Addresses, dollar amounts, percentages, phone numbers (digits; extensions as x + digits), dates
    ((year or None, month, day)), times (minutes after midnight), plain numbers, and the words left. A number
    word before "percent", a scale or "dollars" is read as its digits ("five percent" = 5%)."""
    t = _WORDED.sub(lambda m: str(_SCALE_WORDS[m.group("w")]), _normal(text))
    emails, t = _take(EMAIL, t, lambda m: m.group(0).strip(".'"))
    amounts, t = _take(AMOUNT, t, _amount_value)
    percents, t = _take(PERCENT, t, lambda m: float(m.group("n")))
    phones, t = _take(PHONE, t, lambda m: re.sub(r"\D", "", m.group(0))[-10:])
    extensions, t = _take(EXTENSION, t, lambda m: "x" + m.group("n"))
    dates: set = set()
    for p in DAY_LISTS:  # before single dates: "January 18, 19" is two dates, not one date and a number
        found, t = _take(p, t, _day_list_values)
        dates = dates.union(*found)
    for p in DATE_PATTERNS:
        found, t = _take(p, t, _date_value)
        dates |= found
    times, t = _take(TIME, t, _time_value)
    t = re.sub(r"(?<=[a-z])(?=\d)|(?<=\d)(?=[a-z])", " ", t)  # EB2626 = EB 2626
    numbers, t = _take(NUMBER, t, lambda m: _number(m.group(0)))
    words = []
    for w in re.findall(r"[a-z0-9']+", t):
        w = w.strip("'")
        if w in NUMBER_WORDS:
            numbers.add(NUMBER_WORDS[w])
        elif w:
            words.append(w)
    return Facts(emails, amounts, percents, phones | extensions, dates, times, numbers, words)


def _stem(word: str) -> str:
    word = word.replace("'", "")
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _same_dates(answer: set, reference: set) -> bool:
    """Every reference date given, and no other: a year left out of the answer is allowed, a different one is not."""
    if len(answer) != len(reference):
        return False
    return all(any((am, ad) == (rm, rd) and (ay is None or ry is None or ay == ry) for ay, am, ad in answer)
               for ry, rm, rd in reference)


def _same_phones(answer: set, reference: set) -> bool:
    """The same numbers, a local number (7 digits) matching the end of a full one (713-853-6905 = 853-6905)."""
    def same(a: str, r: str) -> bool:
        short, full = sorted((a, r), key=len)
        return a == r or (not short.startswith("x") and len(short) >= 7 and full.endswith(short))

    return len(answer) == len(reference) and all(any(same(a, r) for a in answer) for r in reference)


def _local_words(address: str) -> set[str]:
    return {_stem(p) for p in re.split(r"[._+-]", address.split("@")[0]) if p}


_ITEM_SEPARATOR = re.compile(r"\s*(?:;|/|&|,(?!\s*\d)|\band\b|\bas well as\b|\bplus\b|\bwith\b|\bthen\b|\bvs\b\.?|"
                             r"\bversus\b)\s*", re.I)
_CAPITALISED = re.compile(r"^(?:[A-Z][A-Za-z'.-]*)(?:\s+[A-Z][A-Za-z'.-]*)*$")
# words that make a capitalised item a title, an organisation or a place rather than a person's name
NOT_A_PERSON = set("""mr mrs ms dr jr sr vp ceo coo cfo cto svp evp md president vice director manager head chief
officer analyst associate assistant counsel engineer chairman chair executive senior junior principal partner
corp corporation inc llc ltd co company companies group enron services service department dept division office
team unit center centre building tower street st avenue ave road rd suite floor room lake river park hotel club
houston texas tx london city north south east west university institute bank capital energy power gas trading
international global america american""".split())


# a shared first word that says nothing of two names' kind ("Enron Corp", "Enron Center"); Room and Building do
_NOT_A_KIND = NOT_A_PERSON - {"room", "building"}
# a shared last word that does say two names' kind ("Renaissance Houston Hotel", "Four Seasons Hotel")
_PLACE_KINDS = set("hotel inn room building center centre camp club park tower restaurant lake".split())


def _person_like(text: str) -> bool:
    """Two to four capitalised words, none a title, organisation or place word: "Sally Beck", "John A. Doe" (an
    honorific before them aside: "Mr. John Doe")."""
    text = re.sub(r"^(?:mr|mrs|ms|dr)\.?\s+", "", text, flags=re.I)
    words = text.split()
    return 2 <= len(words) <= 4 and bool(_CAPITALISED.match(text)) and \
        not any(w.strip(".'").lower() in NOT_A_PERSON for w in words)


def _rival(item: str, reference: str, reference_words: set[str]) -> bool:
    """Whether a list item that does not give the reference competes with it as another answer of its kind: an
    address that is not the reference person's ("sbeck@enron.com" is Sally Beck's), another person's name
    beside a person's name, or a name of the same kind ("Camp Oak" beside "Camp Pine Tree": the same first word,
    the rest different)."""
    addresses = facts(item).emails
    if addresses:
        return any(not any(len(w) > 2 and w in addr.split("@")[0] for w in reference_words) for addr in addresses)
    if not _CAPITALISED.match(item):
        return False
    if _person_like(reference):
        return _person_like(item)
    head, first = reference.split()[0].lower(), item.split()[0].lower()
    tail, last = reference.split()[-1].lower(), item.split()[-1].lower()
    return len(reference.split()) >= 2 and ((head == first and head not in _NOT_A_KIND)
                                           or (tail == last and tail in _PLACE_KINDS))


def _lists_another_candidate(answer: str, reference: str, r: Facts) -> bool:
    """Whether `answer` is a list ("A, B", "A and B", "A; B", "A / B"; parentheses aside) in which one item gives
    the reference and another is a rival answer of its kind (`_rival`): "John Doe and Sally Beck" for "Sally
    Beck", "sally.beck@enron.com, john.doe@enron.com" for "Sally Beck", "Camp Pine Tree, Camp Oak" for "Camp Pine
    Tree"; not "Sally Beck, Vice President" or "Camp Pine Tree, Lake Conroe" (appositions). Only references that
    are names or addresses (no amounts, dates, times, phone numbers or numbers) are read this way, and a reference
    that is itself such a list is compared as a whole. `r`: the reference's `facts`."""
    if _ITEM_SEPARATOR.search(reference) or r.amounts or r.percents or r.phones or r.dates or r.times or r.numbers:
        return False
    plain = re.sub(r"\([^()]*\)", " ", answer)
    items = [re.sub(r"^(?:the|a|an|at|in)\s+", "", i.strip(" .!?\"'"), flags=re.I) for i in _ITEM_SEPARATOR.split(plain)]
    items = [i for i in items if i]
    if len(items) < 2:
        return False
    gives = [_matches(item, r) for item in items]
    if not any(gives):
        return False
    reference_words = {_stem(w) for w in r.words} | set().union(*(_local_words(a) for a in r.emails))
    return any(not g and _rival(item, reference, reference_words) for item, g in zip(items, gives, strict=True))


# ---------------------------------------------------------------------------------------------------------
# The verdict: accept, ask (a model should decide) or reject
# ---------------------------------------------------------------------------------------------------------

VERDICTS = ("accept", "ask", "reject")
# words that say the answer qualifies or overturns what it states: "former", "cancelled", "but", "instead"
CONTRAST = set("""former formerly ex previous previously old originally original cancelled canceled postponed
instead rather but however except although though longer replaced alone copying copied cc cced""".split())
# words of a sentence reference that carry no fact of their own: politeness, and the verbs that report one
FILLER = set("""please also perhaps kindly just said say says told held hold take takes taking place put reached
reach will can could would should answered replied wrote""".split())
# pairs of words of opposite meaning: an answer with one where the reference has the other may say the opposite
# ("remove their access" for "give me access")
OPPOSITES = [tuple(p.split("/")) for p in """give/remove add/remove increase/decrease raise/lower above/below
approve/reject approved/rejected accept/decline accepted/declined early/late before/after morning/evening win/lose
beat/lost buy/sell bought/sold open/close start/end first/last more/less higher/lower next/last this/next
draft/final up/down""".split()]
# units a figure may be given without ("1,517" for "1,517 MMBtu")
UNITS = set("mmbtu mmcf mcf bcf mw mwh kwh bbl bbls dth d day per month year hour".split())
# kept as content words of a short reference ("this weekend" is not "next weekend")
_DEICTIC = {"this"}
_VALUE_KINDS = ("amounts", "percents", "phones", "dates", "times", "numbers")
_NAME_SPAN = re.compile(r"\b(?:[A-Z][a-z'\u2019-]+|[A-Z]\.)(?:\s+(?:[A-Z][a-z'\u2019-]+|[A-Z]\.)){1,3}")
_NOT_A_NAME_WORD = set(MONTHS) | set("""monday tuesday wednesday thursday friday saturday sunday it the he she his her
they their not no it's i call phone send forward please give ask""".split())
# a reference of this many content words (values aside) or more is read as a sentence: by overlap, not word for word
SENTENCE_WORDS = 4


def _root(word: str) -> str:
    """A light stem for comparing sentences: resigned = resign, leading = leads = lead, update = updated."""
    word = word.replace("'", "")
    for suffix in ("ations", "ation", "ings", "ing", "edly", "ed", "ies", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4 and not word.endswith("ss"):
            word = word[:-len(suffix)] + ("y" if suffix == "ies" else "")
            break
    return word[:-1] if len(word) > 4 and word.endswith("e") else word


def _acronyms(words: list[str]) -> dict[str, set[str]]:
    """Each run of two to five content words by its initials ("energy environmental research center" -> "eerc",
    "enron building" -> "eb"), with the run's words."""
    content = [w for w in words if w not in STOPWORDS]
    out: dict[str, set[str]] = {}
    for i in range(len(content)):
        for n in range(2, 6):
            run = content[i:i + n]
            if len(run) == n:
                out.setdefault("".join(w[0] for w in run), set()).update(run)
    return out


def _content(words: list[str], keep: set[str] = frozenset()) -> list[str]:
    return [w for w in words if (w not in STOPWORDS or w in keep) and len(w.replace("'", "")) > 1]


def _value_check(a: Facts, r: Facts) -> tuple[bool, bool, bool]:
    """(every reference value given, some reference kind contradicted: the answer has values of that kind but not
    the reference's, the answer has other values of a kind the reference has)."""
    covered, contradicted, extra = True, False, False
    for kind in _VALUE_KINDS:
        ref, ans = getattr(r, kind), getattr(a, kind)
        if not ref:
            continue
        if kind == "dates":
            given = [any((am, ad) == (rm, rd) and (ay is None or ry is None or ay == ry) for ay, am, ad in ans)
                     for ry, rm, rd in ref]
            others = [v for v in ans if not any((v[1], v[2]) == (rm, rd) and (v[0] is None or ry is None or v[0] == ry)
                                                for ry, rm, rd in ref)]
        elif kind == "phones":
            given = [any(_same_phones({x}, {v}) for x in ans) for v in ref]
            others = [x for x in ans if not any(_same_phones({x}, {v}) or _extension_of(x, v) for v in ref)]
        else:
            given = [v in ans for v in ref]
            others = [x for x in ans if x not in ref]
        if not all(given):
            covered = False
            contradicted |= bool(ans) and not any(given)
        extra |= bool(others)
    return covered, contradicted, extra


def _extension_of(extension: str, number: str) -> bool:
    """Whether an extension ("x36964") is the end of a full number (713-853-6964 is x36964 inside Enron)."""
    return extension.startswith("x") and not number.startswith("x") and number.endswith(extension[1:])


def _names(text: str) -> list[str]:
    """Spans of two to four capitalised words that read as a person's name ("Mark Tawney", "John A. Doe")."""
    out = []
    for m in _NAME_SPAN.finditer(text):
        words = [w for w in m.group(0).split() if w.strip(".").lower() not in _NOT_A_NAME_WORD | STOPWORDS]
        span = " ".join(words)
        if _person_like(span):
            out.append(span)
    return out


def _rivals(answer: str, a: Facts, reference: str, r: Facts, known: set[str]) -> bool:
    """Whether the answer names another person or address beside the reference's: a name whose words are not all
    the reference's or the question's (`known`: their stems, addresses' name parts included), or an address that
    is not the reference person's."""
    for addr in a.emails - r.emails:
        if not any(len(w) > 2 and w in addr.split("@")[0] for w in known):
            return True
    return any(not {_stem(w.strip(".").lower()) for w in name.split() if len(w.strip(".")) > 1} <= known
               for name in _names(answer))


def _about_a_person(reference: str, r: Facts) -> bool:
    return bool(r.emails) or bool(_names(reference)) or _person_like(reference.strip())


def match_verdict(answer: str | None, reference: str, question: str | None = None) -> str:
    """The matcher's verdict on `answer` against the reference answer: "accept", "ask" or "reject".

    "accept": the answer gives every reference value (as `answer_matches` documents) and, for a short reference,
    each of its other words; for a sentence-form reference (`SENTENCE_WORDS` content words or more), its values
    and all of its content words (words the question already has aside), or all but one of six or more; and the
    answer holds nothing that may overturn it.
    "ask" (a model should decide): the answer gives the reference values but also other values of the same kind
    ("March 26, not March 19"), a negation, a hedge or a contrast word ("former", "cancelled", "but", "instead")
    the reference has not, another person's name or address beside a person reference ("X forwarded it to Y, who
    replied"), a list with a rival item of the reference's kind, or only some of the reference's words
    (a paraphrase, a partial answer).
    "reject": an empty answer or "I don't know", an answer whose values of a reference kind are all different
    ("$3000" for "$300"), or one that shares none of the reference's words and values.
    `question`, when given, is used for a sentence reference's words (those the question already has prove
    nothing) and so that a name the question holds is no rival.
    """
    if not isinstance(reference, str) or not reference.strip():
        raise ValueError("the reference answer must be a non-empty string")
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"the answer must be a string or None, got {type(answer).__name__}")
    if question is not None and not isinstance(question, str):
        raise TypeError(f"the question must be a string or None, got {type(question).__name__}")
    if answer is None or not answer.strip() or answer.strip() == IDK:
        return "reject"
    r, a = facts(reference), facts(answer)
    q = facts(question) if question else Facts(set(), set(), set(), set(), set(), set(), set(), [])
    a_words, r_words = set(a.words), set(r.words)
    if {"know", "sure"} & a_words and a_words & NEGATIONS and not r_words & NEGATIONS and \
            not any(getattr(a, k) for k in _VALUE_KINDS) and not a.emails and len(a.words) <= 8:
        return "reject"  # "I do not know", "not sure" in other words
    covered, contradicted, extra = _value_check(a, r)
    if contradicted:
        return "reject"
    r_roots = {_root(w) for w in r.words}
    doubt = extra or any({w for w in a_words & cues if _root(w) not in r_roots} - r_words
                         for cues in (NEGATIONS, HEDGES, CONTRAST))
    q_stems = {_stem(w) for w in q.words} | set().union(*(_local_words(e) for e in q.emails))
    known = {_stem(w) for w in r.words} | set().union(*(_local_words(e) for e in r.emails)) | q_stems
    if any((x in r_words and y in a_words and y not in r_words) or (y in r_words and x in a_words and x not in r_words)
           for x, y in OPPOSITES):
        doubt = True
    if _about_a_person(reference, r) and _rivals(answer, a, reference, r, known):
        doubt = True
    if not _ITEM_SEPARATOR.search(reference) and _lists_another_candidate(answer, reference, r):
        doubt = True
    have = {_stem(w) for w in a.words} | set().union(*(_local_words(e) for e in a.emails))
    # the reference's addresses: given as themselves or by the name they spell
    addr_given = all(e in a.emails or _local_words(e) <= have for e in r.emails)
    addr_partial = any(_local_words(e) & have for e in r.emails)
    has_values = bool(r.emails) or any(getattr(r, k) for k in _VALUE_KINDS)
    content = _content(r.words)
    sentence = len(content) >= SENTENCE_WORDS or (reference.strip().endswith(".") and len(r.words) >= 4)
    # words the question already has prove nothing; in a sentence neither do politeness and reporting verbs; a
    # figure may be given without its unit; an acronym stands for its words and the words for the acronym
    skip = {_root(w) for w in q.words} | {_root(w) for w in (FILLER if sentence else set())} | \
        ({_root(w) for w in UNITS} if has_values else set())
    need = {_root(w) for w in (content if sentence else _content(r.words, _DEICTIC))} - skip
    got = {_root(w) for w in a.words} | {_root(w) for w in have}
    for short in _acronyms(a.words):
        if short in need:
            got.add(short)
    for short, run in _acronyms(r.words).items():
        if _root(short) in got:
            got |= {_root(w) for w in run}
    missing = [w for w in need if w not in got and not (not sentence and len(w) == 1)]  # a middle initial
    any_word = len(missing) < len(need)
    words_all = not missing or (sentence and len(need) >= 6 and len(missing) <= len(need) // 5)
    values_ok = covered and addr_given
    if has_values and not values_ok:
        # a value left out: another address instead of the reference's, or no value of the kind at all
        if r.emails and not addr_given and (a.emails - r.emails) and not addr_partial:
            return "reject"
        return "ask" if (any_word or addr_partial) else "reject"
    if not has_values and not need:
        return "accept" if not doubt and words_all and content else "ask" if content else "reject"
    if doubt:
        return "ask" if (has_values or any_word) else "reject"
    if has_values and (sentence or words_all):
        return "accept"  # the values carry the fact; anything that could overturn them was asked above
    if words_all:
        return "accept"
    return "ask" if (any_word or has_values) else "reject"


def answer_matches(answer: str | None, reference: str, question: str | None = None) -> bool:
    """Whether `match_verdict` accepts `answer` ("ask" and "reject" are both False).

    Addresses, dollar amounts ($3,000 = $3000 = 3,000 dollars = $3k), percentages, dates (Jan. 18, 2001 =
    1/18/01 = 2001-01-18; a year the answer leaves out is not held against it), times (10 AM = 10:00 a.m.),
    phone numbers (713-853-6905 = (713) 853-6905 = 853-6905; extensions x35800) and plain numbers
    (three = 3) are compared as values. An address may be given by the name it spells (jan.moore@enron.com =
    Jan Moore) and a name by its address. Words are compared as whole words (case, punctuation, order and
    plural -s ignored; a single-letter middle initial may be left out). The matcher errs towards "no": an
    answer it does not accept may still be right, and an LLM judge may say so.
    """
    return match_verdict(answer, reference, question) == "accept"


def _matches(answer: str, r: Facts) -> bool:
    """Whether `answer` states every value and word of the reference (`r`: its `facts`) and nothing that negates
    or hedges it; no list rule. Used to find the list item that gives the reference."""
    a = facts(answer)
    a_words, r_words = set(a.words), set(r.words)
    if any((a_words & cues) - r_words for cues in (NEGATIONS, HEDGES)):
        return False
    have = {_stem(w) for w in a.words}
    for addr in a.emails:
        have |= _local_words(addr)
    if r.emails and (a.emails - r.emails or not all(_local_words(addr) <= have for addr in r.emails - a.emails)):
        return False
    for kind in ("amounts", "percents", "times", "numbers"):
        ref_values = getattr(r, kind)
        if ref_values and getattr(a, kind) != ref_values:
            return False
    if r.phones and not _same_phones(a.phones, r.phones):
        return False
    if r.dates and not _same_dates(a.dates, r.dates):
        return False
    need = [_stem(w) for w in r.words if w not in STOPWORDS]
    if any(len(w) > 1 and w not in have for w in need):
        return False
    return bool(need or r.emails or r.amounts or r.percents or r.dates or r.times or r.phones or r.numbers)
