"""Deciding without a model whether an answer gives the reference answer (`answer_matches`).

    answer_matches("It was $3,000.", "$3000")                 -> True
    answer_matches("$3000", "$300")                           -> False
    answer_matches("Not jan.moore@enron.com", "jan.moore@enron.com")  -> False

The text of both is read into typed values (addresses, dollar amounts, percentages, phone numbers, dates,
times, plain numbers) and the words left over; values are compared as values and words as whole words.
The same readers serve the offline question generator (`facts`), so a question is only written about a
value this module can read back.
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
AMOUNT = re.compile(r"(?:\$|\busd\s?)\s?(?P<n>\d[\d,]*(?:\.\d+)?)"  # a scale letter is one only when attached: $5m, not $5 m&a
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


def facts(text: str) -> Facts:
    """Addresses, dollar amounts, percentages, phone numbers (digits; extensions as x + digits), dates
    ((year or None, month, day)), times (minutes after midnight), plain numbers, and the words left."""
    t = _normal(text)
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
    return len(reference.split()) >= 2 and head == first and head not in _NOT_A_KIND


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
    items = [i.strip(" .!?\"'") for i in _ITEM_SEPARATOR.split(plain)]
    items = [i for i in items if i]
    if len(items) < 2:
        return False
    gives = [_matches(item, r) for item in items]
    if not any(gives):
        return False
    reference_words = {_stem(w) for w in r.words} | set().union(*(_local_words(a) for a in r.emails))
    return any(not g and _rival(item, reference, reference_words) for item, g in zip(items, gives))


def answer_matches(answer: str | None, reference: str) -> bool:
    """Whether `answer` gives the reference answer, decided without a model.

    Addresses, dollar amounts ($3,000 = $3000 = 3,000 dollars = $3k), percentages, dates (Jan. 18, 2001 =
    1/18/01 = 2001-01-18; a year the answer leaves out is not held against it), times (10 AM = 10:00 a.m.),
    phone numbers (713-853-6905 = (713) 853-6905 = 853-6905; extensions x35800) and plain numbers
    (three = 3) are compared as values: the answer must give exactly the reference's values of each kind
    the reference has, so a list of several candidate dates ("January 18, 19 and 20", "Jan 18-19") does not
    match one date. A list that gives the reference beside another address or name-like item ("John Doe and
    Sally Beck" for "Sally Beck") does not match either. An address may be
    given by the name it spells (jan.moore@enron.com = Jan Moore) and a name by its address. The
    reference's other words must each appear in the answer as whole words (case, punctuation, order and
    plural -s ignored; a single-letter middle initial may be left out). An answer that negates or hedges
    ("not", "never", "maybe", "I think", "either ... or") where the reference does not is not a match,
    nor is "I don't know" or an empty answer. The matcher errs towards "no": an answer it rejects may
    still be right, and an LLM judge may say so.
    """
    if not isinstance(reference, str) or not reference.strip():
        raise ValueError("the reference answer must be a non-empty string")
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"the answer must be a string or None, got {type(answer).__name__}")
    if answer is None or not answer.strip() or answer.strip() == IDK:
        return False
    r = facts(reference)
    return _matches(answer, r) and not _lists_another_candidate(answer, reference, r)


def match_verdict(answer: str | None, reference: str, question: str | None = None) -> str:
    """The matcher's verdict: "accept" when `answer_matches`, else "reject" (the matcher before three-way verdicts)."""
    return "accept" if answer_matches(answer, reference) else "reject"


def _matches(answer: str, r: Facts) -> bool:
    """`answer_matches` but for the list rule (`_lists_another_candidate`), on checked, non-empty text and the
    reference's `facts`."""
    a = facts(answer)
    a_words, r_words = set(a.words), set(r.words)
    if any((a_words & cues) - r_words for cues in (NEGATIONS, HEDGES)):  # "I don't know" in other words too
        return False
    have = {_stem(w) for w in a.words}
    for addr in a.emails:  # "Sally Beck" is given by sally.beck@enron.com
        have |= _local_words(addr)
    # the reference's addresses may be given by name instead (each name in full), but not by other addresses
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
