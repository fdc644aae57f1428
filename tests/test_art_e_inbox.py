"""ART·E inbox database and tools on a real shared Enron mailbox."""

import json
import sqlite3
from pathlib import Path

import pytest

from evals.art_e.inbox import InboxError, build_inbox_db, parse_email
from evals.art_e.tools import TOOL_SCHEMAS, InboxTools, ToolError, fts_query

from conftest import ENRON


def test_real_mailbox_is_ingested_with_owner_and_fts(inbox_db):
    db, report = inbox_db
    assert report.inboxes == {"beck-s": report.emails} and report.emails > 1500
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT address FROM inboxes WHERE inbox='beck-s'").fetchone()[0] == "sally.beck@enron.com"
    n, distinct = conn.execute("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM emails").fetchone()
    assert n == distinct == report.emails  # one row per Message-ID per inbox
    assert conn.execute("SELECT COUNT(*) FROM emails WHERE date IS NULL OR date NOT LIKE '%+00:00'").fetchone()[0] == 0


def test_rebuild_is_idempotent(inbox_db, tmp_path):
    db, report = inbox_db
    copy = tmp_path / "again.db"
    copy.write_bytes(Path(db).read_bytes())
    again = build_inbox_db([ENRON / "beck-s.tar.gz"], copy)
    conn = sqlite3.connect(copy)
    assert again.emails == report.emails == conn.execute("SELECT COUNT(*) FROM emails").fetchone()[0]
    assert conn.execute("SELECT COUNT(*) FROM emails_fts WHERE emails_fts MATCH 'budget'").fetchone()[0] == \
        sqlite3.connect(db).execute("SELECT COUNT(*) FROM emails_fts WHERE emails_fts MATCH 'budget'").fetchone()[0]


def test_search_and_read_real_mail(inbox_db):
    tools = InboxTools(inbox_db[0], "beck-s", "2001-12-31")
    hits = tools.search_inbox(["budget", "review"], max_results=5)
    assert 1 <= len(hits) <= 5 and all("**" in h["snippet"] for h in hits)
    email = tools.read_email(hits[0]["message_id"])
    assert "budget" in (email["subject"] + email["body"]).lower() and email["from_addr"]
    sender = email["from_addr"].split("@")[0]
    assert all(tools.read_email(h["message_id"])["from_addr"].startswith(sender)
               for h in tools.search_inbox(["budget"], from_addr=sender))


def test_query_date_hides_later_mail(inbox_db):
    early = InboxTools(inbox_db[0], "beck-s", "1999-01-01")
    assert early.search_inbox(["budget"]) == []
    late = InboxTools(inbox_db[0], "beck-s", "2001-12-31")
    some = late.search_inbox(["budget"], sent_after="2000-06-01", sent_before="Dec 31, 2000")
    assert some and all("2000-06" <= late.read_email(h["message_id"])["date"][:7] <= "2000-12" for h in some)


@pytest.mark.parametrize("keywords", [['NEAR("a b")'], ['" OR 1=1; DROP TABLE emails; --'], ["*"], ["budget AND"],
                                      ["'"], ['""""']])
def test_fts_operators_and_quotes_are_plain_text(inbox_db, keywords):
    tools = InboxTools(inbox_db[0], "beck-s", "2001-12-31")
    assert isinstance(tools.search_inbox(keywords), list)
    assert sqlite3.connect(inbox_db[0]).execute("SELECT COUNT(*) FROM emails").fetchone()[0] > 0


def test_tool_calls_with_bad_arguments_get_errors_the_agent_can_read(inbox_db):
    tools = InboxTools(inbox_db[0], "beck-s", "2001-12-31")
    assert "error" in json.loads(tools.call("search_inbox", '{"keywords": 5}'))
    assert "error" in json.loads(tools.call("search_inbox", '{"keywords": ["x"], "max_results": 99}'))
    assert "error" in json.loads(tools.call("search_inbox", '{"keywords": ["x"], "sent_after": "not a date"}'))
    assert "error" in json.loads(tools.call("search_inbox", '{"keywords": ["x"], "colour": "red"}'))
    assert "error" in json.loads(tools.call("read_email", "{broken"))
    assert "no email" in json.loads(tools.call("read_email", '{"message_id": "<unknown@x>"}'))["error"]
    assert "unknown tool" in json.loads(tools.call("delete_everything", "{}"))["error"]
    assert json.loads(tools.call("return_final_answer", '{"answer": "Tuesday", "sources": ["<a>"]}'))
    assert tools.final_answer == {"answer": "Tuesday", "sources": ["<a>"]}
    with pytest.raises(ToolError):
        fts_query([])
    assert {t["function"]["name"] for t in TOOL_SCHEMAS} == {"search_inbox", "read_email", "return_final_answer"}


def test_bad_sources(tmp_path):
    corrupt = tmp_path / "bad.tar.gz"
    corrupt.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(InboxError, match="not a readable maildir tarball"):
        build_inbox_db([corrupt], tmp_path / "x.db")
    with pytest.raises(InboxError, match="no such mailbox"):
        build_inbox_db([tmp_path / "missing.tar.gz"], tmp_path / "x.db")


def test_maildir_folder_with_junk_and_odd_encodings(tmp_path):
    box = tmp_path / "smith-j" / "inbox"
    box.mkdir(parents=True)
    (box / "1").write_bytes(b"Message-ID: <1@x>\nDate: Mon, 4 Dec 2000 10:00:00 -0800\nFrom: a@x.com\nTo: smith@x.com\n"
                            b"Subject: =?iso-8859-1?q?caf=E9?=\nContent-Type: text/plain; charset=iso-8859-1\n\nna\xefve body")
    (box / "2").write_bytes(b"Message-ID: <2@x>\nDate: yesterday-ish\nFrom: b@x.com\nTo: smith@x.com\n\n")
    (box / "3").write_bytes(b"\x89PNG not an email at all")
    (box / "4").write_bytes((box / "1").read_bytes())  # the same Message-ID again
    report = build_inbox_db([tmp_path / "smith-j"], tmp_path / "m.db")
    assert report.inboxes == {"smith-j": 2} and report.duplicates == 1
    assert report.skipped["not an email"] == 1 and report.skipped["unparseable date (kept, date empty)"] == 1
    row = sqlite3.connect(tmp_path / "m.db").execute("SELECT subject, body, date FROM emails WHERE message_id='<1@x>'").fetchone()
    assert row[0] == "café" and "naïve" in row[1] and row[2].startswith("2000-12-04T18:00:00")
    assert parse_email(b"") is None
