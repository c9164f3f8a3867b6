"""Reliability against bad bytes and bad strings: damaged database files and SQL-injection-shaped input.

Damaged files: copies of a real database with random bytes overwritten, the header hit, or the
file cut short. Opening and reading each (writable and read-only) raises only this library's
typed errors, never a raw traceback, and never hangs (the probe runs in a child with a timeout);
`recover` on each raises only typed errors too, and every file it writes passes the health check.
Hostile input: strings shaped like SQL injection in every text parameter are stored and found
verbatim, and the schema is untouched.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKERS = str(REPO / "reliability" / "stress_workers.py")
sys.path.insert(0, str(REPO / "reliability"))

import stress_workers as workers  # noqa: E402
from hermes_state import SessionDB, StateDbCorruptError, recover  # noqa: E402

HOSTILE = [
    "x'; DROP TABLE sessions; --",
    "Robert'); DELETE FROM messages WHERE ('1'='1",
    "\" OR 1=1 --",
    "a' OR 'a'='a",
    "1; ATTACH DATABASE '/tmp/pwn.db' AS pwn; --",
    "messages_fts MATCH '*'",
    "%_\\%' ESCAPE '\\",
    "NEAR(a b) OR content:* AND NOT \"",
]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("sample")
    path = home / "state.db"
    old = os.environ.get("HERMES_HOME")
    os.environ["HERMES_HOME"] = str(home)
    try:
        workers.build_sample(str(path))
    finally:
        if old is None:
            os.environ.pop("HERMES_HOME")
        else:
            os.environ["HERMES_HOME"] = old
    return path


@pytest.mark.slow
def test_damaged_copies_raise_only_typed_errors_and_never_hang(sample, tmp_path):
    env = dict(os.environ, HERMES_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, WORKERS, "damaged", str(sample), "60", "7",
                          str(tmp_path)], capture_output=True, env=env, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["raw"] == []
    assert set(report["outcomes"]) <= {"ok", "StateDbCorruptError"}
    assert report["outcomes"].get("StateDbCorruptError", 0) >= 10  # the damage really damaged
    # recover salvaged files from the damaged copies, each healthy and readable (checked in the child)
    assert report["salvaged"]["files"] >= 10 and report["salvaged"]["messages"] > 0


@pytest.mark.parametrize("offset, patch", [(0, b"\x00" * 16), (18, b"\x07\x07")],
                         ids=["magic string zeroed", "file format bytes no SQLite writes"])
def test_a_damaged_header_is_a_corrupt_error_in_both_modes(sample, tmp_path, offset, patch):
    copy = tmp_path / "copy.db"
    data = bytearray(sample.read_bytes())
    data[offset:offset + len(patch)] = patch
    copy.write_bytes(bytes(data))
    for read_only in (False, True):
        with pytest.raises(StateDbCorruptError):
            SessionDB(copy, read_only=read_only).close()
    assert copy.read_bytes() == bytes(data)  # left untouched for a salvage


def test_a_schema_entry_whose_name_is_not_utf8_is_a_corrupt_error(sample, tmp_path):
    # SQLite's message quotes the damaged name; the message itself then fails to decode.
    copy = tmp_path / "copy.db"
    copy.write_bytes(sample.read_bytes())
    conn = sqlite3.connect(copy)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET name = CAST(X'909090' AS TEXT), sql = 'CREATE TABLE' "
                 "WHERE name = 'compression_locks'")
    conn.commit()
    conn.close()
    for read_only in (False, True):
        with pytest.raises(StateDbCorruptError):
            SessionDB(copy, read_only=read_only).close()
    # recover reads past the damaged entry: every message is salvaged and the entry reported as lost
    report = recover(copy, tmp_path / "salvaged.db")
    conn = sqlite3.connect(sample)
    total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    conn.close()
    assert report.tables["messages"].copied == total and report.verified == {"sessions": True, "messages": True}
    assert not report.complete and any("its definition cannot be used" in line for line in report.losses)
    with SessionDB(tmp_path / "salvaged.db") as db:
        assert db.search_messages("w1m0000003")


def test_injection_shaped_strings_are_stored_and_found_verbatim(db, raw_conn):
    for k, evil in enumerate(HOSTILE):
        sid = f"{evil}#{k}"
        db.create_session(sid, evil, model=evil)
        assert db.set_session_title(sid, f"{evil} {k}") is True
        db.append_message(sid, "user", f"{evil} token{k}", tool_name=evil)
        db.append_message(sid, "assistant", None, tool_calls=[{"id": evil, "type": "function",
                                                               "function": {"name": evil, "arguments": evil}}])
    for k, evil in enumerate(HOSTILE):
        sid = f"{evil}#{k}"
        row = db.get_session(sid)
        # Titles are cleaned (controls dropped, whitespace collapsed); everything else is verbatim.
        title = SessionDB.sanitize_title(f"{evil} {k}")
        assert (row["source"], row["model"], row["title"]) == (evil, evil, title)
        assert db.resolve_session_by_title(title) == sid
        assert [s["id"] for s in db.list_sessions(source=evil)] == [sid]
        msgs = db.get_messages(sid)
        assert msgs[0]["content"] == f"{evil} token{k}" and msgs[0]["tool_name"] == evil
        assert msgs[1]["tool_calls"][0]["function"]["arguments"] == evil
        hits = db.search_messages(f"token{k}", source_filter=[evil], role_filter=["user"], session_id=sid)
        assert [h["session_id"] for h in hits] == [sid]
        db.search_messages(evil)  # any text is a valid query
        assert db.search_messages(f"token{k}", source_filter=[evil + "x"]) == []
        assert db.search_messages(f"token{k}", role_filter=[evil]) == []
        assert db.search_messages(f"token{k}", exclude_sources=[evil]) == []
    check = raw_conn()
    assert check.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == len(HOSTILE)
    assert check.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2 * len(HOSTILE)
    assert workers.check_file(db.db_path) == {"integrity": [], "fts": [], "counters_off": []}


def test_injection_shaped_ids_of_unknown_sessions_are_just_unknown(db):
    db.create_session("real", "cli")
    for evil in HOSTILE:
        assert db.get_session(evil) is None
        assert db.get_messages(evil) == []
        assert db.resolve_session_by_title(evil) is None
    assert [s["id"] for s in db.list_sessions()] == ["real"]
    conn = sqlite3.connect(db.db_path)
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    conn.close()
