"""ART·E inbox database and tools: address inboxes and ART's filters on a real shared Enron mailbox."""

import json
import sqlite3
from pathlib import Path

import pytest

from evals.art_e.inbox import ENRON_DIR as ENRON
from evals.art_e.inbox import InboxError, build_inbox_db, inbox_size, parse_email
from evals.art_e.tools import TOOL_SCHEMAS, InboxTools, ToolError, UnreadableDate, fts_query, parse_day

SALLY = "sally.beck@enron.com"


def test_real_mailbox_is_ingested_with_arts_filters(inbox_db):
    db, report = inbox_db
    conn = sqlite3.connect(db)
    assert report.files == {"beck-s": 1966} and report.mailboxes == {"beck-s": report.emails}
    # ART's three filters in ART's order, each counted: long bodies, many recipients, then copies filed under
    # other Message-IDs (107 of beck-s's files are such copies; 12 of them already went for their length or
    # their recipients)
    assert report.skipped["copy (same subject, body and sender)"] == 95
    assert report.skipped["body over 5,000 characters"] > 0 and report.skipped["over 30 recipients"] > 0
    assert report.emails + sum(report.skipped.values()) == 1966
    assert conn.execute("SELECT MAX(length(body)) FROM emails").fetchone()[0] <= 5000
    assert conn.execute("SELECT MAX(n) FROM (SELECT COUNT(*) n FROM recipients GROUP BY email_id)").fetchone()[0] <= 30
    assert conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM emails GROUP BY subject, body, from_address "
                        "HAVING COUNT(*) > 1)").fetchone()[0] == 0
    # dates as ART stores them: UTC, YYYY-MM-DD HH:MM:SS
    assert conn.execute("SELECT COUNT(*) FROM emails WHERE date NOT GLOB "
                        "'[12][0-9][0-9][0-9]-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-5][0-9]'").fetchone()[0] == 0
    assert conn.execute("SELECT address FROM mailboxes WHERE name = 'beck-s'").fetchone()[0] == SALLY


def test_an_inbox_is_the_mail_from_or_to_an_address(inbox_db):
    db, report = inbox_db
    conn = sqlite3.connect(db)
    n = inbox_size(conn, SALLY)
    by_hand = conn.execute("SELECT COUNT(*) FROM emails e WHERE e.from_address = ? OR e.id IN "
                           "(SELECT email_id FROM recipients WHERE recipient_address = ?)", (SALLY, SALLY)).fetchone()[0]
    assert n == by_hand and 1000 < n < report.emails  # not the whole mailbox folder: lists and aliases are not hers
    assert inbox_size(conn, "SALLY.Beck@enron.com ") == n
    with pytest.raises(ValueError, match="email address"):
        inbox_size(conn, "beck-s")


def _maildir(root: Path, owner: str, files: dict[str, bytes]) -> Path:
    box = root / owner
    for name, raw in files.items():
        (box / "inbox").mkdir(parents=True, exist_ok=True)
        (box / "inbox" / name).write_bytes(raw)
    return box


def _mail(mid: str, sender: str, to: str, subject: str, body: str, date="Mon, 4 Dec 2000 10:00:00 -0800",
          cc: str = "") -> bytes:
    return (f"Message-ID: <{mid}>\nDate: {date}\nFrom: {sender}\nTo: {to}\n" + (f"Cc: {cc}\n" if cc else "")
            + f"Subject: {subject}\n\n{body}").encode()


def test_an_address_inbox_spans_mailboxes_and_copies_are_kept_once(tmp_path):
    a = _maildir(tmp_path, "smith-j", {
        "1": _mail("1@x", "ann.lee@enron.com", "john.smith@enron.com", "Lunch", "Noon at the Hyatt"),
        "2": _mail("2@x", "john.smith@enron.com", "bob.ray@enron.com", "Budget", "Budget is $300"),
    })
    b = _maildir(tmp_path, "ray-b", {
        # the same email as smith-j/2, filed under another Message-ID: a copy
        "1": _mail("3@x", "john.smith@enron.com", "bob.ray@enron.com", "Budget", "Budget is $300"),
        "2": _mail("4@x", "carl.fox@enron.com", "bob.ray@enron.com", "Ping", "Hello", cc="john.smith@enron.com"),
        "3": _mail("5@x", "carl.fox@enron.com", ", ".join(f"p{i}@enron.com" for i in range(31)), "All", "x"),
        "4": _mail("6@x", "carl.fox@enron.com", "bob.ray@enron.com", "Long", "y" * 5001),
    })
    report = build_inbox_db([a, b], tmp_path / "m.db")
    assert report.mailboxes == {"smith-j": 2, "ray-b": 1} and report.skipped == {
        "copy (same subject, body and sender)": 1, "over 30 recipients": 1, "body over 5,000 characters": 1}
    tools = InboxTools(tmp_path / "m.db", "john.smith@enron.com")
    # John's inbox: his mail in his own folder, the copy once, and the email he was copied on in Bob's folder
    assert {h["message_id"] for h in tools.search_emails(["budget"])} == {"<2@x>"}
    assert [h["message_id"] for h in tools.search_emails(["hello"])] == ["<4@x>"]
    assert tools.read_email("<4@x>")["cc_addresses"] == ["john.smith@enron.com"]
    assert InboxTools(tmp_path / "m.db", "bob.ray@enron.com").search_emails(["lunch"]) == []  # not Bob's mail
    with pytest.raises(ValueError, match="no email from or to"):
        InboxTools(tmp_path / "m.db", "nobody@enron.com")


@pytest.mark.slow  # ~15 s: builds the inbox twice
def test_rebuild_is_idempotent_and_a_failed_build_keeps_the_old_database(inbox_db, tmp_path):
    db, report = inbox_db
    copy = tmp_path / "again.db"
    copy.write_bytes(Path(db).read_bytes())
    again = build_inbox_db([ENRON / "beck-s.tar.gz"], copy)
    assert again.emails == report.emails == sqlite3.connect(copy).execute("SELECT COUNT(*) FROM emails").fetchone()[0]
    before = copy.read_bytes()
    corrupt = tmp_path / "bad.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(InboxError, match="not a readable maildir tarball"):
        build_inbox_db([ENRON / "beck-s.tar.gz", corrupt], copy)
    assert copy.read_bytes() == before and [p.name for p in tmp_path.iterdir() if "building" in p.name] == []
    with pytest.raises(InboxError, match="no such mailbox"):
        build_inbox_db([tmp_path / "missing.tar.gz"], copy)


def test_search_follows_arts_semantics_on_real_mail(inbox_db):
    tools = InboxTools(inbox_db[0], SALLY, "2002-01-01")
    hits = tools.search_emails(["budget", "review"])
    assert 1 <= len(hits) <= 10 and all("<b>" in h["snippet"] for h in hits)
    dates = [tools.read_email(h["message_id"])["date"] for h in hits]
    assert dates == sorted(dates, reverse=True)  # newest first, as ART orders them
    email = tools.read_email(hits[0]["message_id"])
    assert set(email) == {"message_id", "date", "subject", "from_address", "to_addresses", "cc_addresses",
                          "bcc_addresses", "body", "file_name"}
    sender = email["from_address"]
    assert all(tools.read_email(h["message_id"])["from_address"] == sender
               for h in tools.search_emails(["budget"], from_addr=sender.upper()))
    assert tools.search_emails(["budget"], from_addr=sender.split("@")[0]) == []  # whole addresses only
    with pytest.raises(ToolError, match="no keywords"):  # as ART's search_emails: no keywords raises
        tools.search_emails([])
    assert tools.search_emails(["", " "]) == []  # blank keywords find nothing, as ART's empty FTS5 phrases
    assert tools.call("search_emails", '{"keywords": []}').problem == "bad_tool_call_args"


def test_dates_are_whole_days_and_the_query_date_hides_later_mail(inbox_db):
    assert InboxTools(inbox_db[0], SALLY, "1999-01-01").search_emails(["budget"]) == []
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    some = tools.search_emails(["budget"], sent_after="2000-06-01", sent_before="Dec 31, 2000", max_results=10)
    days = [tools.read_email(h["message_id"])["date"][:10] for h in some]
    assert some and all("2000-06-01" <= d < "2000-12-31" for d in days)
    day = days[0]
    assert any(h["message_id"] == some[0]["message_id"] for h in tools.search_emails(["budget"], sent_after=day))
    assert all(h["message_id"] != some[0]["message_id"] for h in tools.search_emails(["budget"], sent_before=day))
    later = tools.search_emails(["budget"])[0]["message_id"]
    cut = tools.read_email(later)["date"][:10]
    assert InboxTools(inbox_db[0], SALLY, cut).read_email(later) is None  # dated on the query date: not visible


def test_dates_parse_against_the_query_date_not_today():
    from datetime import date

    today = date(2001, 5, 20)
    assert parse_day("June 3", "d", today) == date(2001, 6, 3)
    assert parse_day("9th", "d", today) == date(2001, 5, 9)
    assert parse_day("2000-02-29", "d", today) == date(2000, 2, 29)
    assert parse_day("June 3", "d", date(1999, 1, 1)) == date(1999, 6, 3)
    assert parse_day("", "d", today) is None and parse_day("  ", "d", today) is None
    assert parse_day(None, "d", today) is None
    with pytest.raises(TypeError):
        parse_day("2001-01-01", "d", "2001-05-20")


def test_an_empty_date_is_no_filter(inbox_db):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    everything = tools.search_emails(["budget"])
    assert everything and tools.search_emails(["budget"], sent_after="", sent_before=" ") == everything
    assert tools.call("search_emails", '{"keywords": ["budget"], "sent_after": ""}').problem is None


@pytest.mark.parametrize("args, says, count", [
    ({"sent_after": "2001-13-45"}, "sent_after '2001-13-45' is not a date (YYYY-MM-DD)", 1),
    ({"sent_after": "99999-01-01"}, "is not a date (YYYY-MM-DD)", 1),
    ({"sent_after": "1" + "0" * 30}, "is not a date (YYYY-MM-DD)", 1),
    ({"sent_before": "3000-01-01"}, "sent_before '3000-01-01' is not a date between 1900 and 2100", 1),
    ({"sent_after": "not a date"}, "sent_after 'not a date' is not a date", 1),
    ({"sent_after": 20010101}, "sent_after 20010101 is not a date", 1),
    ({"sent_after": "bad\x00", "sent_before": "2001-02-30"}, "sent_before '2001-02-30' is not a date", 2),
])
def test_unreadable_dates_are_errors_the_agent_reads(inbox_db, args, says, count):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    outcome = tools.call("search_emails", json.dumps({"keywords": ["budget"], **args}))
    assert outcome.problem == "unreadable_date" and outcome.unreadable_dates == count
    assert says in json.loads(outcome.content)["error"]
    with pytest.raises(UnreadableDate):
        tools.search_emails(["budget"], **args)
    # any other wrong argument in the same call is the agent's bad arguments, as before (ART's -1.8)
    worse = tools.call("search_emails", json.dumps({"keywords": "budget", **args}))
    assert worse.problem == "bad_tool_call_args" and worse.unreadable_dates == 0


@pytest.mark.parametrize("args, says", [
    ({"keywords": ["bud\x00get"]}, "NUL"),
    ({"keywords": ["budget"], "from_addr": ["x"]}, "must be a string"),
    ({"keywords": "budget"}, "must be a list"),
    ({"keywords": [5]}, "must be a string"),
    ({"keywords": ["x"], "max_results": 99}, "from 1 to 10"),
    ({"keywords": ["x"], "max_results": True}, "from 1 to 10"),
    ({"keywords": ["x"], "max_results": -1}, "from 1 to 10"),
    ({"keywords": ["x"], "colour": "red"}, "bad arguments"),
    ({"keywords": ["x" * 5000]}, "over 2000 characters"),
])
def test_bad_search_arguments_come_back_as_tool_errors(inbox_db, args, says):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    outcome = tools.call("search_emails", json.dumps(args))
    assert outcome.problem == "bad_tool_call_args" and says in json.loads(outcome.content)["error"]


def test_other_tool_mistakes_are_named(inbox_db):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    assert tools.call("read_email", "{broken").problem == "bad_tool_call_args"
    assert tools.call("read_email", '{"message_id": 7}').problem == "bad_tool_call_args"
    assert tools.call("read_email", '{"message_id": "a\\u0000b"}').problem == "bad_tool_call_args"
    assert tools.call("read_email", "[1, 2]").problem == "bad_tool_call_args"
    missing = tools.call("read_email", '{"message_id": "<unknown@x>"}')
    assert missing.problem == "invalid_email" and "not found" in json.loads(missing.content)["error"].lower()
    assert tools.call("delete_everything", "{}").problem == "bad_tool_call_name"
    assert tools.call(None, "{}").problem == "bad_tool_call_name"
    assert tools.call("return_final_answer", '{"answer": 5, "sources": []}').problem == "bad_tool_call_args"
    assert tools.call("return_final_answer", '{"answer": "x", "sources": "<a>"}').problem == "bad_tool_call_args"
    ok = tools.call("return_final_answer", '{"answer": "Tuesday", "sources": ["<a>"]}')
    assert ok.problem is None and tools.final_answer == {"answer": "Tuesday", "sources": ["<a>"]}
    assert fts_query([" ", ""]) is None
    with pytest.raises(ToolError):
        fts_query("budget")
    assert [t["function"]["name"] for t in TOOL_SCHEMAS] == ["search_emails", "read_email", "return_final_answer"]


@pytest.mark.parametrize("keywords", [['NEAR("a b")'], ['" OR 1=1; DROP TABLE emails; --'], ["*"], ["budget AND"],
                                      ["'"], ['""""']])
def test_fts_operators_and_quotes_are_plain_text(inbox_db, keywords):
    tools = InboxTools(inbox_db[0], SALLY, "2001-12-31")
    outcome = tools.call("search_emails", json.dumps({"keywords": keywords}))
    assert outcome.problem is None and isinstance(json.loads(outcome.content), list)
    assert sqlite3.connect(inbox_db[0]).execute("SELECT COUNT(*) FROM emails").fetchone()[0] > 0


def test_maildir_folder_with_junk_and_odd_encodings(tmp_path):
    box = tmp_path / "smith-j" / "inbox"
    box.mkdir(parents=True)
    (box / "1").write_bytes(b"Message-ID: <1@x>\nDate: Mon, 4 Dec 2000 10:00:00 -0800\nFrom: A@X.com\nTo: smith@x.com\n"
                            b"Subject: =?iso-8859-1?q?caf=E9?=\nContent-Type: text/plain; charset=iso-8859-1\n\nna\xefve body")
    (box / "2").write_bytes(b"Message-ID: <2@x>\nDate: yesterday-ish\nFrom: b@x.com\nTo: smith@x.com\n\nhello")
    (box / "3").write_bytes(b"\x89PNG not an email at all")
    (box / "4").write_bytes(b"Date: Mon, 4 Dec 2000 10:00:00 -0800\nFrom: c@x.com\n\nno id")
    report = build_inbox_db([tmp_path / "smith-j"], tmp_path / "m.db")
    assert report.mailboxes == {"smith-j": 1}
    assert report.skipped == {"not an email": 1, "unreadable Date": 1, "no Message-ID": 1}
    row = sqlite3.connect(tmp_path / "m.db").execute("SELECT subject, body, date, from_address FROM emails").fetchone()
    assert row == ("café", "naïve body", "2000-12-04 18:00:00", "a@x.com")
    assert parse_email(b"") is None
    with pytest.raises(TypeError):
        parse_email("not bytes")
