"""The FTS indexes: objects, triggers, the CJK queue, rebuild markers, catch-up, merge (R-FTS-1..6).

State is checked from a second connection (`rival`, or a plain sqlite3 connection/shell that
has no hermes function) as well as through the handle.
"""
from __future__ import annotations

import json

import logging
import multiprocessing
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state_cjk as cjk
import hermes_state_fts as fts
import hermes_state_messages as message_rows
import hermes_state_schema as schema
import hermes_state_upgrade as upgrade
from hermes_state import SessionDB, StateDbIncompatibleError, StoreUnavailableError
from hermes_state_writer import RetryPolicy, Writer

ALL = fts.FTS_TABLES


def index_queue(db: SessionDB) -> None:
    """Index the rows the handle queued now, as its next batch (or its close) would."""
    with db.transaction() as txn:
        fts.index_batch(txn.conn)


def integrity(conn) -> None:
    # rank 1: FTS5 also compares each index with its content source (rank 0 checks the structure only)
    for table in ALL:
        conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")


def lay_out(path, layout) -> None:
    """Turn the file's full-text objects into an older release's `layout`, keeping what the indexes hold."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    wanted = {name for _, name, _ in layout}
    for kind, name, _ in fts.OBJECTS:
        if name not in wanted:
            conn.execute(f"DROP {kind.upper()} {name}")
    for kind, name, sql in layout:
        if kind == "table":  # FTS5 reads its options from the statement: rewrite it, as an older release wrote it
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (sql, name))
            conn.execute(f"PRAGMA schema_version = {conn.execute('PRAGMA schema_version').fetchone()[0] + 1}")
            conn.execute("PRAGMA writable_schema = OFF")
        else:
            conn.execute(f"DROP {kind.upper()} IF EXISTS {name}")
            conn.execute(sql)
    conn.execute("COMMIT")
    conn.close()


def ids(conn, table: str, expr: str) -> list[int]:
    return sorted(r[0] for r in conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ?", (expr,)))


def substring_ids(conn, piece: str) -> list[int]:
    return sorted(r[0] for r in conn.execute(
        f"SELECT rowid FROM {fts.TRIGRAM} WHERE content LIKE ?", (f"%{piece}%",)))


def _varint(blob: bytes) -> int:
    """Decode the SQLite varint at the start of `blob`."""
    value = 0
    for i, byte in enumerate(blob[:9]):
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value
    return value


def indexed_counts(conn) -> tuple[int, ...]:
    """Rows in the word, trigram, CJK and reasoning indexes, as each index counts them.

    The count is the first varint of FTS5's averages record (id 1 of the data table), which every
    insert and delete updates: the trigram index keeps no per-row docsize table to count instead.
    """
    counts = []
    for table in ALL:
        row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
        counts.append(_varint(row[0]) if row and row[0] else 0)
    return tuple(counts)


def expected_counts(conn) -> tuple[int, ...]:
    assert_exact(conn)
    rows = conn.execute("SELECT role, content, tool_calls, reasoning, reasoning_content FROM messages").fetchall()
    return (len(rows), len(rows),
            sum(cjk.cjk_terms(r[1], r[2]) is not None for r in rows), sum(bool(r[3] or r[4]) for r in rows))


def assert_exact(conn) -> None:
    """Every index holds exactly the current text: same (term, rows, occurrences) as a fresh index.

    integrity-check of an external-content table only checks the index's own structure; a row
    indexed twice, or stale terms, show up here instead.
    """
    reasoning = ("SELECT id, CASE WHEN reasoning_content IS NULL OR reasoning_content = reasoning THEN reasoning "
                 "WHEN reasoning IS NULL THEN reasoning_content ELSE reasoning_content || char(10) || reasoning END "
                 "FROM messages WHERE reasoning <> '' OR reasoning_content <> ''")
    for table, columns, source, options in (
            (fts.WORD, "content, tool_name, tool_calls", "SELECT id, content, tool_name, tool_calls FROM messages", ""),
            (fts.TRIGRAM, "content", "SELECT id, content FROM messages_fts_trigram_source",
             ", tokenize='trigram', detail='none'"),
            (fts.REASONING, "reasoning", reasoning, "")):
        conn.execute(f"CREATE VIRTUAL TABLE temp.ref USING fts5({columns}{options})")
        conn.execute(f"INSERT INTO temp.ref(rowid, {columns}) {source}")
        conn.execute("CREATE VIRTUAL TABLE temp.v_ref USING fts5vocab(temp, ref, 'row')")
        conn.execute(f"CREATE VIRTUAL TABLE temp.v_got USING fts5vocab(main, {table}, 'row')")
        try:
            want = set(conn.execute("SELECT term, doc, cnt FROM temp.v_ref"))
            got = set(conn.execute("SELECT term, doc, cnt FROM temp.v_got"))
            assert got == want, (table, sorted(got ^ want)[:5])
        finally:
            for name in ("v_got", "v_ref", "ref"):
                conn.execute(f"DROP TABLE temp.{name}")
    terms = dict(conn.execute(f"SELECT rowid, terms FROM {fts.CJK}"))
    for row_id, content, calls in conn.execute("SELECT id, content, tool_calls FROM messages"):
        assert terms.pop(row_id, None) == cjk.cjk_terms(content, calls), row_id
    assert not terms, f"CJK rows of deleted messages: {sorted(terms)}"


def plain(path) -> sqlite3.Connection:
    """A connection without the hermes SQL function or TEMP triggers, like any other program."""
    return sqlite3.connect(path, isolation_level=None, timeout=5)


def insert_raw(conn, session_id: str, role: str, content: str) -> int:
    return conn.execute("INSERT INTO messages (session_id, role, content, timestamp, message_uid, active) "
                        "VALUES (?, ?, ?, 1.0, lower(hex(randomblob(16))), 1)", (session_id, role, content)).lastrowid


@pytest.fixture
def manual(monkeypatch):
    """Rebuilds are driven by hand in these tests: no background thread."""
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)


# --- objects and triggers ----------------------------------------------------------------------

def test_fresh_database_has_every_fts_object_and_no_rebuild(db, rival):
    names = {r[0] for r in rival.execute("SELECT name FROM sqlite_master")}
    assert {name for _, name, _ in fts.OBJECTS} <= names
    vt = {r[0]: r[1] for r in rival.execute(
        "SELECT name, sql FROM sqlite_master WHERE name IN (SELECT value FROM json_each(?))", (json.dumps(ALL),))}
    assert "content='messages_fts_source'" in vt["messages_fts"] and "tool_calls" in vt["messages_fts"]
    assert "tokenize='trigram'" in vt["messages_fts_trigram"]
    assert rival.execute("SELECT COUNT(*) FROM state_meta WHERE key LIKE 'fts_rebuild%'").fetchone()[0] == 0
    # persistent triggers never call a function a plain shell lacks
    for (sql,) in rival.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'"):
        assert "hermes_" not in sql
    assert db.fts_rebuild_status() == {"pending": 0, "total": 0, "indexed": 0, "percent": 100.0,
                                       "in_progress": False, "cjk_pending": 0}


def test_triggers_follow_insert_update_delete_from_any_connection(db, rival):
    db.create_session("s", "cli")
    user = db.append_message("s", "user", "alpha bravo")
    tool = db.append_message("s", "tool", "alpha charlie output", tool_name="terminal")
    other = insert_raw(rival, "s", "assistant", "delta echo")  # a writer without our function
    assert ids(rival, "messages_fts", "alpha") == []  # the handle's rows wait in its queue
    assert substring_ids(rival, "elta ec") == [other]  # the rival's row is indexed by the triggers at once
    index_queue(db)
    assert ids(rival, "messages_fts", "alpha") == [user, tool]
    assert ids(rival, "messages_fts", "terminal") == [tool]
    assert substring_ids(rival, "lph") == [user, tool]  # tool output too
    assert substring_ids(rival, "minal") == [tool]  # and the tool's name
    assert substring_ids(rival, "elta ec") == [other]
    rival.execute("UPDATE messages SET content = 'foxtrot' WHERE id = ?", (user,))
    rival.execute("UPDATE messages SET role = 'tool' WHERE id = ?", (other,))
    assert ids(rival, "messages_fts", "alpha") == [tool]
    assert ids(rival, "messages_fts", "foxtrot") == [user]
    assert substring_ids(rival, "elta") == [other]  # every role is in the substring index
    rival.execute("UPDATE messages SET content = 'golf hotel' WHERE id = ?", (other,))
    assert substring_ids(rival, "elta") == [] and substring_ids(rival, "f hot") == [other]
    rival.execute("DELETE FROM messages WHERE id = ?", (tool,))
    assert ids(rival, "messages_fts", "alpha OR terminal") == []
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)


def test_updates_that_do_not_touch_text_leave_the_indexes_alone(db, rival):
    db.create_session("s", "cli")
    row = db.append_message("s", "user", "東京 alpha")
    index_queue(db)
    traced: list[str] = []
    rival.set_trace_callback(traced.append)
    rival.execute("UPDATE messages SET active = 0, compacted = 1 WHERE id = ?", (row,))
    assert not [s for s in traced if "messages_fts" in s and "INSERT" in s]
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_cjk_pending").fetchone()[0] == 0


def test_library_writes_feed_the_cjk_index_with_their_batch(db, rival):
    db.create_session("s", "cli")
    cjk = db.append_message("s", "user", "iPhone16を買った")
    db.append_message("s", "user", "café au lait, plain latin")
    calls = db.append_message("s", "assistant", "", tool_calls=[{"id": "c1", "function": {"name": "web_search",
                                                                                          "arguments": '{"q": "天気"}'}}])
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_cjk").fetchone()[0] == 0  # queued for the batch
    index_queue(db)
    rows = dict(rival.execute("SELECT rowid, terms FROM messages_fts_cjk"))
    assert sorted(rows) == [cjk, calls]
    assert rows[cjk] == "iPhone16 を買 買っ った た"
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_cjk_pending").fetchone()[0] == 0
    db.merge_messages("s", [cjk, db.append_message("s", "user", "東京")])
    assert ids(rival, "messages_fts_cjk", '"東京"') == [cjk]
    integrity(rival)


def test_cjk_index_text_and_query_text():
    assert cjk.cjk_index_text("東京都に行く") == "東京 京都 都に に行 行く く"
    assert cjk.cjk_index_text("a 東 b") == "a 東 b"
    assert cjk.cjk_index_text("구글 검색") == "구글 글 검색 색"
    assert cjk.cjk_index_text("「東京」。") == "「 東京 京 」。"
    assert cjk.cjk_query_text("東京都") == ("東京 京都", False)
    assert cjk.cjk_query_text("東") == ("東", True)
    assert cjk.cjk_query_text("東京X") == ("東京 京 X", False)
    assert cjk.cjk_query_text("iPhone16を") == ("iPhone16 を", True)
    assert cjk.cjk_terms("plain ascii") is None and cjk.cjk_terms("café naïve") is None
    assert cjk.cjk_terms(None, '{"q": "検索"}') == '{"q": " 検索 索 "}'
    assert cjk.cjk_terms(b"\xe6\x9d\xb1", 3) == "東\n3"  # stored text arrives as bytes; a number as its str()
    assert cjk.cjk_terms(b"\xed\xa0\x80", b"\xff") is None  # bytes that are not UTF-8 never raise


# --- writers without the tokenizer ---------------------------------------------------------------

def test_plain_sqlite3_writes_are_caught_up_after_the_next_open(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        kept = db.append_message("s", "user", "大阪の天気")
        gone = db.append_message("s", "user", "名古屋の天気")
        tool = db.append_message("s", "tool", "日本語のログ", tool_name="terminal")
    shell = plain(path)
    new = insert_raw(shell, "s", "user", "新しい項目です")
    shell.execute("UPDATE messages SET content = '福岡に変更' WHERE id = ?", (kept,))
    shell.execute("DELETE FROM messages WHERE id = ?", (gone,))
    shell.execute("UPDATE messages SET content = 'ascii now' WHERE id = ?", (tool,))
    assert sorted(r[0] for r in shell.execute("SELECT id FROM messages_fts_cjk_pending")) == [kept, gone, tool, new]
    integrity(shell)
    with SessionDB(path, read_only=True) as ro:  # before any catch-up: queued rows are still found
        assert [h["id"] for h in ro.search_messages("項目")] == [new]
        assert [h["id"] for h in ro.search_messages("福岡")] == [kept]
        assert ro.search_messages("名古屋") == [] and ro.search_messages("ログ") == []
    assert shell.execute("SELECT COUNT(*) FROM messages_fts_cjk_pending").fetchone()[0] == 4  # ro wrote nothing
    with SessionDB(path) as db:  # the open leaves the queue to its background work
        assert db.wait_for_fts_rebuild(30)
        assert db.fts_rebuild_status()["cjk_pending"] == 0
        assert ids(shell, "messages_fts_cjk", '"項目"') == [new]
        assert ids(shell, "messages_fts_cjk", '"福岡"') == [kept]
        assert ids(shell, "messages_fts_cjk", '"大阪" OR "名古屋" OR "ログ"') == []
        assert [h["id"] for h in db.search_messages("項目")] == [new]
    integrity(shell)
    assert indexed_counts(shell) == expected_counts(shell)
    shell.close()


def test_delete_from_a_plain_sqlite3_shell(db, rival):
    db.create_session("s", "cli")
    doomed = db.append_message("s", "user", "東京 delete me")
    kept = db.append_message("s", "user", "東京 keep me")
    db.close()
    sql = f"DELETE FROM messages WHERE id = {doomed};"
    cli = shutil.which("sqlite3")
    if cli:  # the real shell, as an operator would use it
        done = subprocess.run([cli, str(db.db_path), sql], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    else:  # no shell binary on this machine: the same statement from a function-less connection
        plain(db.db_path).execute(sql)
    assert ids(rival, "messages_fts", "delete") == []
    assert ids(rival, "messages_fts", "keep") == [kept]
    integrity(rival)
    with SessionDB(db.db_path) as again:
        assert [h["id"] for h in again.search_messages("東京")] == [kept]  # found before the queue is worked off
        assert again.wait_for_fts_rebuild(30)
    assert ids(rival, "messages_fts_cjk", '"東京"') == [kept]


# --- rebuild markers -----------------------------------------------------------------------------

def _drop_fts(path) -> None:
    conn = plain(path)
    for kind, name in conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('trigger', 'view') "
                                   "AND name LIKE 'messages_fts%'").fetchall():
        conn.execute(f"DROP {kind} {name}")
    for name in (*ALL, fts.CJK_PENDING):
        conn.execute(f"DROP TABLE {name}")
    conn.close()


def _fill(path, n: int) -> list[int]:
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.create_session("t", "telegram")
        return [db.append_message("s" if i % 2 else "t", ("user", "assistant", "tool")[i % 3],
                                  f"word{i} common" + (" 検索の語" if i % 4 == 0 else ""))
                for i in range(n)]


def test_a_database_without_fts_is_rebuilt_in_chunks_never_twice(tmp_path, manual):
    path = tmp_path / "state.db"
    rows = _fill(path, 40)
    _drop_fts(path)
    traced: list[str] = []
    real = fts.ensure_fts

    def spy(writer, *a, **kw):
        writer.conn.set_trace_callback(traced.append)
        try:
            return real(writer, *a, **kw)
        finally:
            writer.conn.set_trace_callback(None)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fts, "ensure_fts", spy)
        db = SessionDB(path)
    rival = plain(path)
    # open created the objects and markers (and set the indexes' options), but indexed nothing
    assert not [s for s in traced if s.startswith("INSERT INTO messages_fts") and ", rank)" not in s]
    assert [s for s in traced if re.search(r"FROM\s+messages\b", s) and not s.startswith("CREATE")] == [
        "SELECT MAX(id) FROM messages"]
    markers = dict(rival.execute("SELECT key, value FROM state_meta WHERE key LIKE 'fts_rebuild%'"))
    assert markers == {fts.HIGH_WATER: str(rows[-1]), fts.PROGRESS: "0"}
    assert db.fts_rebuild_status() == {"pending": 40, "total": 40, "indexed": 0, "percent": 0.0,
                                       "in_progress": True, "cjk_pending": 0}
    # The rebuild is driven by hand, one chunk per transaction of the handle's own connection.
    with db.transaction() as txn:
        assert fts.rebuild_step(txn.conn, 10)
    # writes while the rebuild runs: above H (trigger), inside (P, H] (left to the rebuild), below P (trigger)
    fresh = db.append_message("s", "user", "fresh 検索")
    with db.transaction() as txn:  # raw SQL on the handle's connection, so its TEMP trigger runs too
        txn.conn.execute("UPDATE messages SET content = 'changed 語彙' WHERE id = ?", (rows[30],))
        txn.conn.execute("DELETE FROM messages WHERE id = ?", (rows[31],))
        txn.conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp) "
                         "VALUES (?, 's', 'user', 'reborn', 1.0)", (rows[31],))  # an explicit id in (P, H]
        txn.conn.execute("UPDATE messages SET content = 'renewed' WHERE id = ?", (rows[31],))
        txn.conn.execute("UPDATE messages SET content = 'early 語彙' WHERE id = ?", (rows[2],))
    assert db.fts_rebuild_status()["indexed"] == 10
    assert [h["id"] for h in db.search_messages("changed")] == [rows[30]]  # found while not indexed yet
    while True:
        with db.transaction() as txn:
            if not fts.rebuild_step(txn.conn, 10):
                break
    assert rival.execute("SELECT COUNT(*) FROM state_meta WHERE key LIKE 'fts_rebuild%'").fetchone()[0] == 0
    with db.transaction() as txn:  # the row the handle queued meanwhile, as its next batch would
        fts.index_batch(txn.conn)
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)
    assert ids(rival, "messages_fts", "changed") == [rows[30]] and ids(rival, "messages_fts", "word31") == []
    assert ids(rival, "messages_fts", "reborn") == [] and ids(rival, "messages_fts", "renewed") == [rows[31]]
    assert ids(rival, "messages_fts", "early") == [rows[2]] and ids(rival, "messages_fts", "word2") == []
    assert ids(rival, "messages_fts", "fresh") == [fresh]
    assert ids(rival, "messages_fts_cjk", '"語彙"') == sorted([rows[2], rows[30]])
    assert db.fts_rebuild_status()["percent"] == 100.0
    db.close()
    rival.close()


def _partial_rebuild(path: str, chunks: int) -> None:
    SessionDB.fts_rebuild_in_background = False
    db = SessionDB(path)
    with db.transaction() as txn:
        fts.start_rebuild(txn.conn)
    for _ in range(chunks):
        with db.transaction() as txn:
            fts.rebuild_step(txn.conn, 25)
    os._exit(0)  # stop here, as a killed process would: no close, no checkpoint, no tidy-up


def _finish_rebuild(path: str) -> None:
    SessionDB.fts_rebuild_in_background = False
    with SessionDB(path) as db:
        assert db.fts_rebuild_status()["in_progress"]
        db.append_message("s", "user", "written by the resumer 再開")
        assert db.rebuild_fts()["percent"] == 100.0


@pytest.mark.slow
def test_a_rebuild_interrupted_halfway_resumes_in_another_process(tmp_path):
    path = tmp_path / "state.db"
    rows = _fill(path, 120)
    ctx = multiprocessing.get_context("spawn")
    first = ctx.Process(target=_partial_rebuild, args=(str(path), 2))
    first.start()
    first.join(60)
    assert first.exitcode == 0
    conn = plain(path)
    assert dict(conn.execute("SELECT key, value FROM state_meta WHERE key LIKE 'fts_rebuild%'")) == {
        fts.HIGH_WATER: str(rows[-1]), fts.PROGRESS: str(rows[49])}
    second = ctx.Process(target=_finish_rebuild, args=(str(path),))
    second.start()
    second.join(60)
    assert second.exitcode == 0
    assert conn.execute("SELECT COUNT(*) FROM state_meta WHERE key LIKE 'fts_rebuild%'").fetchone()[0] == 0
    integrity(conn)
    assert indexed_counts(conn) == expected_counts(conn)
    assert ids(conn, "messages_fts", "word0 OR word119") == [rows[0], rows[119]]
    assert len(ids(conn, "messages_fts_cjk", '"検索"')) == 30
    conn.close()


def test_rebuild_fts_rebuilds_an_up_to_date_index_from_scratch(db, rival):
    db.create_session("s", "cli")
    rows = [db.append_message("s", "user", f"item{i} 項目{i}") for i in range(30)]
    index_queue(db)
    before = indexed_counts(rival)
    status = db.rebuild_fts()
    assert status == {"pending": 0, "total": 30, "indexed": 30, "percent": 100.0, "in_progress": False,
                      "cjk_pending": 0}
    assert indexed_counts(rival) == before == expected_counts(rival)
    integrity(rival)
    assert [h["id"] for h in db.search_messages("item7")] == [rows[7]]


def test_the_background_thread_finishes_a_rebuild(tmp_path):
    path = tmp_path / "state.db"
    _fill(path, 60)
    _drop_fts(path)
    with SessionDB(path) as db:
        assert db.wait_for_fts_rebuild(30)
        assert db.fts_rebuild_status()["percent"] == 100.0
    conn = plain(path)
    assert indexed_counts(conn) == expected_counts(conn)
    conn.close()


def segments(conn, table: str) -> int:
    """The number of b-trees (segments) an FTS5 index holds: every one has a row in its idx table."""
    return conn.execute(f"SELECT COUNT(DISTINCT segid) FROM {table}_idx").fetchone()[0]


def merge_marked(conn) -> bool:
    return conn.execute("SELECT 1 FROM state_meta WHERE key = ?", (fts.MERGE_PENDING,)).fetchone() is not None


def test_a_finished_rebuild_merges_each_index_into_one_segment(tmp_path, manual):
    path = tmp_path / "state.db"
    rows = _fill(path, 120)
    _drop_fts(path)
    db = SessionDB(path)
    rival = plain(path)
    while True:  # small chunks leave many segments, as a rebuild of a large store does
        with db.transaction() as txn:
            more = fts.rebuild_step(txn.conn, 5)
        assert merge_marked(rival) is not more  # marked by the last chunk, in its own transaction
        if not more:
            break
    assert segments(rival, fts.WORD) > 4 and segments(rival, fts.TRIGRAM) > 4
    steps = 0
    while True:
        with db.transaction() as txn:
            more = fts.merge_step(txn.conn, 2)  # two pages a step: many bounded steps
        steps += 1
        if not more:
            break
    assert steps > 3
    assert not merge_marked(rival)
    assert [segments(rival, t) for t in (fts.WORD, fts.TRIGRAM, fts.CJK)] == [1, 1, 1]
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)
    assert [h["id"] for h in db.search_messages("word77")] == [rows[77]]
    with db.transaction() as txn:  # nothing marked: a step is a no-op
        assert fts.merge_step(txn.conn) is False
    db.close()
    rival.close()


AGENT_FILE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"  # hermes-agent 0.19.0's layout
INDEXES = (fts.WORD, fts.TRIGRAM, fts.CJK, fts.REASONING)


def test_the_merge_after_a_move_in_ends_and_stays_shallow_under_a_trickle_of_appends(tmp_path, manual, fts_levels):
    import gzip
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_FILE.read_bytes()))
    db = SessionDB(path, backup_before_upgrade=False)
    rival = plain(path)
    db.create_session("trickle", "cli")
    appended: list[int] = []

    def append() -> None:  # indexed at once, as another program's rows (or its own, at times) are: a new segment
        appended.append(db.append_message("trickle", "user", f"trickle note{len(appended)} arrives"))
        index_queue(db)

    more = True
    while more:
        append()
        with db.transaction() as txn:
            more = fts.rebuild_step(txn.conn, 10)
    before = fts_levels(rival, fts.WORD)[1]
    append()
    assert fts_levels(rival, fts.WORD)[1] == before + 1  # each append is one more segment, as it was in the field
    steps, deepest = 0, 0
    while more or steps == 0:
        append()  # one append before every step: the segments sit on different levels at each step
        with db.transaction() as txn:
            more = fts.merge_step(txn.conn, 2)  # two pages a step: the merge takes many steps
        steps += 1
        deepest = max(deepest, *(fts_levels(rival, t)[0] for t in INDEXES))
        assert deepest <= 16, f"{deepest} levels after {steps} merge steps"
        assert steps < 5000, "the merge never ended"
    assert not merge_marked(rival)
    with db.transaction() as txn:  # what arrives later is the automerge's: a step is a no-op
        assert fts.merge_step(txn.conn) is False
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)
    for n in (0, len(appended) // 2, len(appended) - 1):
        assert [h["id"] for h in db.search_messages(f"note{n}")] == [appended[n]]
    db.close()
    rival.close()


def test_the_merge_after_a_rebuild_resumes_at_the_next_open(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    _fill(path, 100)  # 20 chunks: past FTS5's crisis merge at 16 segments, 5 are left
    _drop_fts(path)
    monkeypatch.setattr(SessionDB, "fts_rebuild_chunk_rows", 5)
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    with SessionDB(path) as db:
        more = True
        while more:  # one transaction a chunk, as the background thread does
            with db.transaction() as txn:
                more = fts.rebuild_step(txn.conn, 5)
    rival = plain(path)
    assert merge_marked(rival) and segments(rival, fts.WORD) > 1
    with SessionDB(path, read_only=True) as ro:  # searches are complete before the merge
        assert ro.fts_rebuild_status()["in_progress"] is False
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", True)
    with SessionDB(path) as db:  # the open sees the marker and its thread merges
        assert db.wait_for_fts_rebuild(30)
    assert not merge_marked(rival) and segments(rival, fts.WORD) == 1
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)
    rival.close()


def test_close_stops_the_background_thread_and_another_open_finishes_its_rebuild(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    _fill(path, 60)
    _drop_fts(path)
    monkeypatch.setattr(SessionDB, "fts_rebuild_chunk_rows", 1)
    # A long pause between chunks makes the interruption deterministic: the worker indexes one
    # row, then waits on its stop event, which close() sets.
    worker = fts.background_worker
    monkeypatch.setattr(fts, "background_worker", lambda *args, **kwargs: worker(*args, **kwargs, pause_s=60.0))
    monkeypatch.setattr(upgrade, "BACKGROUND_START_S", 0.0)  # its first turn at once, before close()
    db = SessionDB(path)
    deadline = time.monotonic() + 60
    while db.fts_rebuild_status()["pending"] == 60 and time.monotonic() < deadline:
        time.sleep(0.01)  # the first chunk
    db.close()
    assert db.wait_for_fts_rebuild(timeout_s=0)  # close() stopped it
    with SessionDB(path, read_only=True) as ro:  # what it did not finish is still marked pending
        status = ro.fts_rebuild_status()
    assert status["in_progress"] is True and 0 < status["pending"] < 60
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    with SessionDB(path) as db:
        assert db.rebuild_fts()["pending"] == 0  # resumes the interrupted rebuild
    conn = plain(path)
    assert indexed_counts(conn) == expected_counts(conn) == (60, 60, 15, 0)
    integrity(conn)
    conn.close()


def test_a_handle_closed_before_its_first_turn_leaves_the_work_untouched(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    _fill(path, 30)
    _drop_fts(path)
    monkeypatch.setattr(upgrade, "BACKGROUND_START_S", 3600.0)
    for _ in range(3):  # short commands: each closes long before its thread would take a turn
        with SessionDB(path) as db:
            assert db.message_count() == 30
    conn = plain(path)
    try:
        # No chunk was indexed and no lease taken: the open and close of a short command wrote nothing.
        assert conn.execute("SELECT COUNT(*) FROM state_meta WHERE key = ?", (fts.WORKER_KEY,)).fetchone()[0] == 0
        assert fts.rebuild_status(conn)["pending"] == 30
    finally:
        conn.close()
    with SessionDB(path) as db:
        assert db.wait_for_fts_rebuild(60)  # waiting for the work starts it at once, whatever the delay
        assert db.fts_rebuild_status()["pending"] == 0
        assert db.search_messages("common") != []


def test_an_older_layouts_trigger_is_replaced_not_doubled(tmp_path, manual):
    path = tmp_path / "state.db"
    _fill(path, 6)
    conn = plain(path)
    conn.execute("CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN "
                 "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END")
    with SessionDB(path) as db:
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'messages_ai'").fetchone()[0] == 0
        db.rebuild_fts()
        db.append_message("s", "user", "after the upgrade")
    integrity(conn)
    assert indexed_counts(conn) == expected_counts(conn)
    conn.close()


def test_sqlite_without_fts5_is_a_clear_incompatible_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fts, "fts5_available", lambda conn: False)
    with pytest.raises(StateDbIncompatibleError, match="FTS5") as info:
        SessionDB(tmp_path / "state.db")
    assert isinstance(info.value, StoreUnavailableError)


def test_open_of_a_current_database_starts_no_worker_and_installs_the_temp_trigger(db, raw_conn):
    db.create_session("s", "cli")
    db.append_message("s", "user", "東京")
    db.close()
    again = SessionDB(db.db_path)
    assert again.wait_for_fts_rebuild(timeout_s=0) and not again.fts_rebuild_status()["in_progress"]
    osaka = again.append_message("s", "user", "大阪")
    again.merge_messages("s", [again.append_message("s", "user", "京都"), again.append_message("s", "user", "神戸")])
    index_queue(again)
    # The batch indexed the appended rows; the merge's update was indexed by the handle's TEMP
    # trigger in the write itself: nothing is left queued.
    shell = raw_conn()
    assert shell.execute(f"SELECT COUNT(*) FROM {fts.CJK_PENDING}").fetchone()[0] == 0
    assert ids(shell, fts.CJK, '"大阪"') == [osaka]
    assert ids(shell, fts.CJK, '"神戸"') == [osaka + 1]
    assert [h["content"] for h in again.search_messages("大阪")[0]["context"]] == ["東京", "大阪", "京都\n\n神戸"]
    again.close()


# --- merge upkeep ------------------------------------------------------------------------------------

def test_a_bounded_merge_runs_every_1000_writes(db, raw_conn, monkeypatch):
    assert fts.MERGE_EVERY_N_WRITES == 1000
    monkeypatch.setattr(fts, "MERGE_EVERY_N_WRITES", 3)  # read at each commit: 1,000 real writes would take seconds
    db.create_session("s", "cli")
    with db.tracer() as traced:
        for n in range(6):  # wherever the count stands, six writes hold exactly two multiples of 3
            db.append_message("s", "user", f"message {n}")
    merges = [s for s in traced if "'merge'" in s]
    assert len(merges) == 2 * len(ALL) and all(t in " ".join(merges) for t in ALL)
    assert not [s for s in traced if "optimize" in s]
    integrity(raw_conn())


def test_upkeep_logs_instead_of_raising(caplog):
    conn = sqlite3.connect(":memory:")
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        fts.upkeep(conn, fts.MERGE_EVERY_N_WRITES)
    assert "merge of messages_fts skipped" in caplog.text


# --- R-FTS-6: integrity after any sequence ----------------------------------------------------------

_TEXT = st.text(alphabet=st.sampled_from(list("ab c東京検索 구글é-")), max_size=12)
_OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.sampled_from(["user", "assistant", "tool"]), _TEXT, st.booleans()),
    st.tuples(st.just("update"), st.integers(0, 30), _TEXT, st.booleans()),
    st.tuples(st.just("role"), st.integers(0, 30), st.sampled_from(["user", "tool"]), st.booleans()),
    st.tuples(st.sampled_from(["reasoning", "reasoning_content"]), st.integers(0, 30), st.none() | _TEXT,
              st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 30), st.none(), st.booleans()),
), max_size=25)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_every_index_stays_consistent_after_random_writes(ops):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        db = SessionDB(path)
        db.create_session("s", "cli")
        shell = plain(path)
        for op, arg, text, by_shell in ops:
            existing = [r[0] for r in shell.execute("SELECT id FROM messages ORDER BY id")]
            # Raw SQL from another program, or on the handle's own connection (its TEMP trigger runs).
            with nullcontext(shell) if by_shell else db.transaction() as txn:
                conn = shell if by_shell else txn.conn
                if op == "insert":
                    insert_raw(conn, "s", arg, text)
                elif existing:
                    target = existing[arg % len(existing)]
                    if op == "update":
                        conn.execute("UPDATE messages SET content = ? WHERE id = ?", (text, target))
                    elif op == "role":
                        conn.execute("UPDATE messages SET role = ? WHERE id = ?", (text, target))
                    elif op.startswith("reasoning"):
                        conn.execute(f"UPDATE messages SET {op} = ? WHERE id = ?", (text, target))
                    else:
                        conn.execute("DELETE FROM messages WHERE id = ?", (target,))
        integrity(shell)
        db.close()
        with SessionDB(path) as again:  # its background work catches up what the shell wrote
            assert again.wait_for_fts_rebuild(30)
        integrity(shell)
        assert indexed_counts(shell) == expected_counts(shell)
        shell.close()


# --- the state a search reads, cached per connection -------------------------------------------------

def test_a_second_search_reads_no_catalogue(db):
    db.create_session("s", "cli")
    hit = db.append_message("s", "user", "cached catalogue 東京")
    with db.tracer() as first:
        assert [h["id"] for h in db.search_messages("catalogue")] == [hit]
    with db.tracer() as second:
        assert [h["id"] for h in db.search_messages("東京")] == [hit]
        assert [h["id"] for h in db.search_messages("catalogue")] == [hit]
    assert any("sqlite_master" in sql for sql in first)  # the first search of a connection reads it
    assert not any("sqlite_master" in sql for sql in second), second


def test_another_process_dropping_an_index_is_noticed_at_the_next_search(db, rival):
    db.create_session("s", "cli")
    hit = db.append_message("s", "user", "東京タワー")
    assert [h["id"] for h in db.search_messages("東京")] == [hit]
    rival.execute(f"DROP TABLE {fts.CJK}")  # another process, between two searches of this handle
    assert [h["id"] for h in db.search_messages("東京")] == [hit]  # the bounded scan now answers
    assert fts.CJK not in fts.cached_state(rival).tables


def test_a_rebuild_started_elsewhere_is_noticed_at_the_next_search(db, rival):
    db.create_session("s", "cli")
    rows = [db.append_message("s", "user", f"alpha {i}") for i in range(5)]
    assert len(db.search_messages("alpha")) == 5
    rival.execute("BEGIN IMMEDIATE")
    fts.start_rebuild(rival)  # empties the indexes; rows wait in (P, H] for the rebuild
    rival.execute("COMMIT")
    assert ids(rival, fts.WORD, "alpha") == []
    assert sorted(h["id"] for h in db.search_messages("alpha")) == rows  # found by scanning (P, H]
    db.rebuild_fts()
    assert sorted(h["id"] for h in db.search_messages("alpha")) == rows


def test_a_new_connection_never_reads_a_closed_ones_cached_state(tmp_path):
    # A closed connection's id() is soon given to a new one; the cache must tell them apart,
    # for the library's connections (which keep it) and for bare ones (which read afresh).
    with SessionDB(tmp_path / "state.db"):
        pass
    bare = tmp_path / "bare.db"
    sqlite3.connect(bare).execute("CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT)").connection.close()
    for opener in (schema.connect, sqlite3.connect):
        for _ in range(10):
            for path, tables in ((tmp_path / "state.db", frozenset(ALL)), (bare, frozenset())):
                conn = opener(path)
                assert fts.cached_state(conn).tables == tables
                assert fts.cached_state(conn).tables == tables
                conn.close()
                del conn


def _queue_one(conn, sid: str) -> int:
    # One message written on `conn` as the library writes it, in a transaction of its own.
    conn.execute("BEGIN IMMEDIATE")
    row = message_rows.insert_message(conn, sid, {"role": "user", "content": f"queued on {sid}"})
    conn.execute("COMMIT")
    return row


def _connections_come_and_go(path, count: int) -> list:
    """Open `count` library connections one after another, each queueing a row and closing; return them."""
    others = []
    for _ in range(count):
        other = schema.connect(path)
        _queue_one(other, "s")
        other.close()
        others.append(other)
    return others


def test_each_library_connection_keeps_its_own_state_for_as_long_as_it_lives(db, rival):
    db.create_session("s", "cli")
    first, second = schema.connect(db.db_path), schema.connect(db.db_path)
    try:
        _queue_one(first, "s")
        assert (first.fts_queued, second.fts_queued) == (1, 0)
        assert first.fts_catalogue is not None and second.fts_catalogue is None
        # Hundreds of other connections come and go (each queueing a row): none touches first's state.
        others = _connections_come_and_go(db.db_path, 300)  # noqa: F841 - kept, so no id() is given again
        assert first.fts_queued == 1 and first.fts_catalogue is not None
    finally:
        first.close()
        second.close()


def test_a_closing_handle_indexes_its_queue_however_many_connections_came_before(db, rival):
    # A handle indexes on close what it queued: however many other connections have queued rows
    # meanwhile, its count of its own queue is never thrown away.
    db.create_session("s", "cli")
    db.append_message("s", "user", "the handle's own row")
    others = _connections_come_and_go(db.db_path, 300)  # noqa: F841 - kept, so no id() is given again
    assert rival.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 301
    db.close()
    assert rival.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 0
    assert len(ids(rival, "messages_fts", "queued OR own")) == 301


def test_a_new_connection_never_takes_a_closed_ones_queue_count(db):
    # The closed connection queued a row; a new one given the same id() has queued nothing, so
    # flushing its queue runs no SQL at all.
    db.create_session("s", "cli")
    conn = schema.connect(db.db_path)
    _queue_one(conn, "s")
    old = id(conn)
    conn.close()
    del conn
    kept = []
    for _ in range(200):  # CPython gives a freed object's memory to the next of its size
        conn = schema.connect(db.db_path)
        if id(conn) == old:
            break
        kept.append(conn)
    assert id(conn) == old
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    fts.flush_queue(Writer(conn), RetryPolicy())
    assert statements == []
    for other in (conn, *kept):
        other.close()


def test_a_connection_the_library_did_not_open_keeps_no_state_and_queues_nothing(db, rival):
    # A caller's bare connection cannot carry the cache: its rows are indexed by the triggers as
    # they are written, and its searches read the catalogue afresh.
    db.create_session("s", "cli")
    row = _queue_one(rival, "s")
    assert rival.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 0
    assert ids(rival, "messages_fts", "queued") == [row]
    assert message_rows.reserve_id(rival) is None
    assert fts.CJK in fts.cached_state(rival).tables
    rival.execute(f"DROP TABLE {fts.CJK}")
    assert fts.CJK not in fts.cached_state(rival).tables


def test_optimize_merges_every_present_index_and_changes_no_result(db):
    db.create_session("s", "cli")
    for i in range(30):  # one segment per write: something to merge
        db.append_message("s", "user", f"walrus tusk {i} 北海道の海")
    before = [(r["id"], r["snippet"]) for r in db.search_messages("walrus", limit=50)]
    cjk_before = [r["id"] for r in db.search_messages("北海道", limit=50)]
    assert db.optimize_fts() == len(fts.FTS_TABLES)
    assert db.optimize_fts() == len(fts.FTS_TABLES)  # idempotent
    assert [(r["id"], r["snippet"]) for r in db.search_messages("walrus", limit=50)] == before
    assert [r["id"] for r in db.search_messages("北海道", limit=50)] == cjk_before
    assert db.check_integrity()["fts"] == {table: "ok" for table in fts.FTS_TABLES}


def test_optimize_counts_only_the_indexes_that_exist(conn):
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"DROP TABLE {fts.REASONING}")
    assert fts.optimize(conn) == len(fts.FTS_TABLES) - 1
    conn.execute("ROLLBACK")


def test_optimize_is_never_run_by_writes(db):
    with db.tracer() as statements:
        db.create_session("s", "cli")
        for i in range(5):
            db.append_message("s", "user", f"m {i}")
    assert not [s for s in statements if "'optimize'" in s]


def test_the_write_path_optimizes_on_the_handles_cadence_after_commit(db):
    db.optimize_every_n_writes = 3
    count, expected = db.write_count, 0  # the handle's commits so far (opening may have written)
    for _ in range(6):
        count += 1
        if count % 3 == 0:
            count, expected = count + 1, expected + 1  # the optimize commits too, and starts no other
    with db.tracer() as statements:
        db.create_session("s", "cli")
        for i in range(5):
            db.append_message("s", "user", f"kelp {i}")
    optimizes = [n for n, s in enumerate(statements) if "'optimize'" in s]
    assert expected >= 2 and len(optimizes) == expected * len(fts.FTS_TABLES)
    # Each optimize runs in a transaction of its own, begun after the triggering write committed.
    before = statements[:optimizes[0]]
    begin = len(before) - 1 - before[::-1].index("BEGIN IMMEDIATE")
    assert "COMMIT" in before[:begin] and "COMMIT" not in before[begin:]
    assert len(db.search_messages("kelp")) == 5


def test_a_cadence_of_one_optimizes_once_per_write_and_zero_never(db):
    calls = []
    db.optimize_fts = lambda: calls.append(1)  # looked up on the handle each time
    db.optimize_every_n_writes = 1
    db.create_session("s", "cli")
    db.append_message("s", "user", "one")
    assert len(calls) == 2
    db.optimize_every_n_writes = 0
    db.append_message("s", "user", "two")
    assert len(calls) == 2


def test_a_failing_periodic_optimize_is_logged_and_the_write_stands(db, rival, caplog):
    def fail():
        raise sqlite3.OperationalError("disk I/O error")
    db.optimize_fts = fail
    db.optimize_every_n_writes = 1
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        db.create_session("s", "cli")
        assert db.append_message("s", "user", "kept") > 0
    assert rival.execute("SELECT content FROM messages").fetchone()[0] == "kept"
    assert "periodic FTS optimize skipped: disk I/O error" in caplog.text
    assert db.append_message("s", "user", "and the next write too") > 0


def test_optimize_refused_on_a_read_only_handle(db):
    db.create_session("s", "cli")
    with SessionDB(db.db_path, read_only=True) as reader, pytest.raises(Exception) as info:
        reader.optimize_fts()
    assert "read-only" in str(info.value)


# --- the writer's queue: the handle's own rows, indexed in batches -------------------------------------

def test_appended_rows_wait_in_the_queue_and_are_indexed_in_one_batch(db, rival):
    db.create_session("s", "cli")
    rows = [db.append_message("s", "user", f"batchword{i} shared") for i in range(message_rows.BATCH_ROWS - 1)]
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == message_rows.BATCH_ROWS - 1
    assert ids(rival, "messages_fts", "shared") == []
    last = db.append_message("s", "user", "batchword shared")  # the batch's last row indexes all of them
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0
    assert ids(rival, "messages_fts", "shared") == [*rows, last]
    assert substring_ids(rival, "chword") == [*rows, last]
    integrity(rival)


def test_other_writers_change_queued_rows_and_the_batch_indexes_what_is_there(db, rival):
    db.create_session("s", "cli")
    kept = db.append_message("s", "user", "kilo lima")
    changed = db.append_message("s", "assistant", "mike november", reasoning="oscar thought")
    gone = db.append_message("s", "tool", "papa quebec", tool_name="terminal")
    rival.execute("UPDATE messages SET content = 'romeo sierra', reasoning = 'tango' WHERE id = ?", (changed,))
    rival.execute("DELETE FROM messages WHERE id = ?", (gone,))
    index_queue(db)
    assert ids(rival, "messages_fts", "kilo") == [kept]
    assert ids(rival, "messages_fts", "mike OR papa OR terminal") == []
    assert ids(rival, "messages_fts", "romeo") == [changed]
    assert ids(rival, "messages_fts_reasoning", "tango") == [changed]
    assert substring_ids(rival, "ebec") == []
    integrity(rival)
    assert indexed_counts(rival) == expected_counts(rival)


def test_every_search_finds_queued_rows(db, hermes_home):
    db.create_session("s", "cli")
    for i in range(5):
        db.append_message("s", "user", f"common{i} zulu")
    row = db.append_message("s", "assistant", "common tail-only-word yankee", reasoning="xray musing")
    reader = SessionDB(db.db_path, read_only=True)  # another handle: it cannot index them, it scans them
    try:
        assert [h["id"] for h in reader.search_messages("yankee")] == [row]
        assert [h["id"] for h in reader.search_messages("ankee")] == [row]
        assert [h["id"] for h in reader.search_messages("xray", include_reasoning=True)] == [row]
        assert len(reader.search_messages("zulu")) == 5
    finally:
        reader.close()
    assert [h["id"] for h in db.search_messages("yankee")] == [row]  # this handle scans its own queue too
    assert [h["id"] for h in db.search_messages("ankee")] == [row]
    conn = sqlite3.connect(db.db_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 6  # a search writes nothing
        db.close()
        assert conn.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0  # its close indexes them
    finally:
        conn.close()


def test_a_handle_that_closes_leaves_nothing_queued(hermes_home):
    handle = SessionDB()
    handle.create_session("s", "cli")
    row = handle.append_message("s", "user", "whiskey")
    handle.close()
    conn = sqlite3.connect(handle.db_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0
        assert ids(conn, "messages_fts", "whiskey") == [row]
        integrity(conn)
    finally:
        conn.close()


def test_rows_left_queued_by_a_handle_that_died_are_indexed_after_the_next_open(hermes_home):
    path = hermes_home / "died.db"
    # A process that appends and dies without closing its handle: its row stays queued.
    died = subprocess.run([sys.executable, "-c", "import os, signal; from hermes_state import SessionDB; "
                           f"db = SessionDB({str(path)!r}); db.create_session('s', 'cli'); "
                           "db.append_message('s', 'user', 'echo foxtrot'); os.kill(os.getpid(), signal.SIGKILL)"],
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, "HERMES_HOME": str(hermes_home)})
    assert died.returncode == -9
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 1
    finally:
        conn.close()
    with SessionDB(path) as again:  # off the open path: the open returns, its background work indexes the row
        assert [h["id"] for h in again.search_messages("foxtrot")] == [1]
        assert again.wait_for_fts_rebuild(30)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0
        assert ids(conn, "messages_fts", "foxtrot") == [1]
        integrity(conn)
    finally:
        conn.close()


def test_triggers_another_program_replaced_are_never_bypassed(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "before")
    index_queue(db)
    # Another program swaps in its own insert trigger (same name, no queue gate) while the handle is open.
    rival.execute("DROP TRIGGER messages_fts_insert")
    rival.execute("CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN "
                  "INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) "
                  "VALUES (new.id, new.content, new.tool_name, new.tool_calls); END")
    row = db.append_message("s", "user", "after hotel")
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 0  # not queued
    assert ids(rival, "messages_fts", "hotel") == [row]  # indexed once, by that trigger
    rival.execute(f"INSERT INTO {fts.WORD}({fts.WORD}) VALUES ('integrity-check')")


def test_the_layout_before_the_queue_is_converted_without_a_rebuild(db, rival, hermes_home):
    db.create_session("s", "cli")
    rows = [db.append_message("s", "user", f"india{i}") for i in range(3)]
    db.close()
    lay_out(db.db_path, fts.UNQUEUED_OBJECTS)
    with SessionDB(db.db_path) as again:
        assert [h["id"] for h in again.search_messages("india1")] == [rows[1]]
    conn = sqlite3.connect(db.db_path)
    try:
        state = fts.inspect(conn)
        assert state.declared and state.rebuild is None
        integrity(conn)
    finally:
        conn.close()


def test_the_layout_whose_sources_held_queued_rows_is_converted_without_a_rebuild(hermes_home):
    path = hermes_home / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        rows = [db.append_message("s", "user", f"juliet{i}") for i in range(3)]
    lay_out(path, fts.UNGATED_OBJECTS)
    with SessionDB(path) as again:
        assert again.wait_for_fts_rebuild(30)
        assert [h["id"] for h in again.search_messages("juliet1")] == [rows[1]]
    conn = sqlite3.connect(path)
    try:
        state = fts.inspect(conn)
        assert state.declared and state.rebuild is None
        integrity(conn)
        assert "messages_fts_source" in conn.execute(f"SELECT sql FROM sqlite_master WHERE name = '{fts.WORD}'").fetchone()[0]
    finally:
        conn.close()


def test_another_programs_fts5_rebuild_while_rows_are_queued_leaves_every_index_exact(db, rival):
    # hermes-agent's rebuild_fts() runs FTS5's own 'rebuild' on the indexes it knows, in place: it
    # reads each index's content source, which holds no queued row, so the batch indexes each once.
    db.create_session("s", "cli")
    queued = [db.append_message("s", "user", f"kilo{i} lima", reasoning=f"mike{i}") for i in range(3)]
    assert rival.execute("SELECT COUNT(*) FROM messages_fts_pending").fetchone()[0] == 3
    for table in (fts.WORD, fts.TRIGRAM, fts.REASONING):
        rival.execute(f"INSERT INTO {table}({table}) VALUES ('rebuild')")
    integrity(rival)
    db.close()  # its close indexes the queue
    integrity(rival)
    assert ids(rival, "messages_fts", "lima") == queued
    assert ids(rival, "messages_fts_reasoning", "mike1") == [queued[1]]
    assert substring_ids(rival, "ilo2") == [queued[2]]
    assert indexed_counts(rival) == expected_counts(rival)


def test_the_background_pause_is_at_least_as_long_as_the_lock_was_held(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(fts, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    holds = iter([3.0, 0.01, 0.5])

    def step(conn: sqlite3.Connection) -> bool:
        clock[0] += next(holds)  # this transaction holds the lock that long
        return True

    class Stop:  # the thread's stop event, recording each pause instead of sleeping
        waits: list[float] = []

        def is_set(self) -> bool:
            return len(self.waits) == 3

        def wait(self, timeout: float) -> bool:
            self.waits.append(timeout)
            return False
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None, check_same_thread=False)
    try:
        assert fts.run_pending(Writer(conn), 5.0, RetryPolicy(), stop=Stop(), pause_s=0.12, step=step) is False
    finally:
        conn.close()
    assert Stop.waits == [3.0, 0.12, 0.5]  # others get the lock at least half of the time


def test_a_chunk_ends_at_a_piece_once_its_time_is_spent(tmp_path, monkeypatch, manual):
    path = tmp_path / "state.db"
    _fill(path, 64)
    _drop_fts(path)
    with SessionDB(path) as db:  # the objects made again, every row left to the rebuild
        pass
    conn = plain(path)
    try:
        cjk.register_functions(conn)  # the SQL functions the CJK index is filled with
        monkeypatch.setattr(fts, "CHUNK_BUDGET_S", 0.0)  # spent after the first piece
        conn.execute("BEGIN IMMEDIATE")
        assert fts.rebuild_step(conn, 64) is True
        assert fts.rebuild_status(conn)["pending"] == 64 - 64 // fts.CHUNK_PIECES  # one eighth of the chunk
        monkeypatch.setattr(fts, "CHUNK_BUDGET_S", 3600.0)
        assert fts.rebuild_step(conn, 64) is False  # the whole chunk asked for: the rest
        conn.execute("COMMIT")
        assert indexed_counts(conn) == expected_counts(conn)
    finally:
        conn.close()


def test_a_piece_ends_at_its_text_limit_and_a_long_row_is_a_piece_of_its_own(tmp_path, monkeypatch, manual):
    # The time a piece takes follows its text (the trigram index tokenizes every character), so a
    # piece holds at most CHUNK_PIECE_CHARS of it, or one row however long.
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        for size in (10_000, 10_000, 10_000, 100_000, 5_000, 5_000):
            db.append_message("s", "tool", "x" * (size - 9) + " tail end", tool_call_id="c")
    _drop_fts(path)
    with SessionDB(path) as db:
        pass
    conn = plain(path)
    try:
        cjk.register_functions(conn)
        monkeypatch.setattr(fts, "CHUNK_BUDGET_S", 0.0)  # one piece per chunk
        monkeypatch.setattr(fts, "CHUNK_PIECE_CHARS", 25_000)
        conn.execute("BEGIN IMMEDIATE")
        pending = []
        while fts.rebuild_step(conn, 64):
            pending.append(fts.rebuild_status(conn)["pending"])
        conn.execute("COMMIT")
        assert pending == [4, 3, 2]  # 10k + 10k, then 10k (the next is long), the long row alone, then the rest
        assert indexed_counts(conn) == expected_counts(conn)
        assert [r[0] for r in conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts "
                                           "MATCH '\"tail end\"' ORDER BY rowid")] == [1, 2, 3, 4, 5, 6]
    finally:
        conn.close()


def test_a_chunk_that_took_long_makes_the_next_one_smaller_within_bounds():
    most = 2000
    assert fts.next_chunk_rows(2000, fts.CHUNK_TARGET_S * 4, most) == 500  # four times too long: a quarter
    assert fts.next_chunk_rows(500, fts.CHUNK_TARGET_S / 2, most) == 1000  # quick: it grows again
    assert fts.next_chunk_rows(1500, fts.CHUNK_TARGET_S / 100, most) == most  # never past the size asked for
    assert fts.next_chunk_rows(40, 60.0, most) == fts.CHUNK_FLOOR_ROWS  # never under the floor
    assert fts.next_chunk_rows(1, 60.0, 1) == 1  # nor over a size asked for below it
    assert fts.next_chunk_rows(300, 0.0, most) == most


def test_the_rebuild_takes_smaller_chunks_when_one_takes_long(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    _fill(path, 60)
    _drop_fts(path)
    monkeypatch.setattr(fts, "CHUNK_TARGET_S", 1e-9)  # every chunk is too long: the next takes the floor
    monkeypatch.setattr(fts, "CHUNK_FLOOR_ROWS", 7)
    taken: list[int] = []
    step = fts.rebuild_step

    def counting(conn, chunk_rows=fts.REBUILD_CHUNK_ROWS):  # noqa: ANN001
        taken.append(chunk_rows)
        return step(conn, chunk_rows)
    monkeypatch.setattr(fts, "rebuild_step", counting)
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    monkeypatch.setattr(SessionDB, "fts_rebuild_chunk_rows", 30)
    with SessionDB(path) as db:
        db.rebuild_fts()
        assert db.fts_rebuild_status()["pending"] == 0
        assert len(db.search_messages("common", limit=100)) == 60
    assert taken[0] == 30 and set(taken[1:]) == {7} and len(taken) >= 5
