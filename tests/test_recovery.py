"""Whole files: recover from healthy and damaged sources, backup while another process writes, restore."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from contextlib import closing
from pathlib import Path

import pytest

from hermes_state import (SCHEMA_VERSION, SessionDB, StateDbCorruptError, StateDbIncompatibleError, recover)
from hermes_state_common import DELIVERY_OBLIGATIONS_SQL

LEDGERS = ("runtime_epoch", "session_admissions", "worker_executions", "worker_receipts")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def build(path: Path, sessions: int = 3, per_session: int = 4, filler: int = 0) -> None:
    """Sessions with messages (a MARKER-nnnnnn per message), a usage row, a child, ledger and outbox rows."""
    with SessionDB(path) as db:
        n = 0
        for s in range(sessions):
            sid = f"s{s:03d}"
            db.create_session(sid, "cli", parent_session_id="s000" if s else None, title=f"T{s}")
            for _ in range(per_session):
                db.append_message(sid, "user", f"MARKER-{n:06d} 東京 docker " + "x" * filler)
                n += 1
            db.update_token_counts(sid, 3, 4, model="m")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(DELIVERY_OBLIGATIONS_SQL)
    conn.executemany("INSERT INTO delivery_obligations (session_id, payload_json, state) VALUES (?, ?, 'pending')",
                     [("s000", '{"text": "owed"}'), ("s001", '{"text": "owed too"}')])
    conn.execute("INSERT INTO runtime_epoch (id, epoch, instance_id) VALUES (1, 7, 'gw')")
    conn.execute("INSERT INTO session_admissions (session_id, payload_json, state) VALUES ('s000', '{}', 'queued')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_recover_a_healthy_database_copies_everything_and_rebuilds_the_rest(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    before = digest(src)
    report = recover(src, dst)
    assert digest(src) == before  # the source is never written
    assert report.complete and report.integrity == "ok" and report.losses == []
    assert report.verified == {"sessions": True, "messages": True, "delivery_obligations": True}
    assert report.tables["messages"].copied == 12 and report.tables["delivery_obligations"].copied == 2
    assert set(report.excluded) == set(LEDGERS) and "messages_fts" in report.rebuilt
    conn = sqlite3.connect(dst)
    assert conn.execute("SELECT COUNT(*) FROM session_admissions").fetchone()[0] == 0  # not copied
    assert conn.execute("SELECT COUNT(*) FROM runtime_epoch").fetchone()[0] == 0
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert conn.execute("SELECT parent_session_id FROM sessions WHERE id = 's002'").fetchone()[0] == "s000"
    conn.close()
    with SessionDB(dst) as db:
        assert db.get_session("s001")["message_count"] == 4
        assert {h["session_id"] for h in db.search_messages("東京", limit=50)} == {"s000", "s001", "s002"}
        assert db.fts_rebuild_status()["pending"] == 0


def test_recover_refuses_an_existing_target_and_a_non_database(tmp_path):
    src = tmp_path / "state.db"
    build(src, sessions=1)
    (tmp_path / "taken.db").write_bytes(b"mine")
    with pytest.raises(FileExistsError):
        recover(src, tmp_path / "taken.db")
    assert (tmp_path / "taken.db").read_bytes() == b"mine"
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all " * 300)
    with pytest.raises(StateDbCorruptError):
        recover(junk, tmp_path / "out.db")
    assert not (tmp_path / "out.db").exists()
    assert not list(tmp_path.glob("*.partial-*"))


@pytest.mark.parametrize("how", ["backup", "recover"])
def test_a_target_that_appears_while_the_copy_is_made_is_kept(tmp_path, monkeypatch, how):
    # A restarting gateway creates a new state.db at the name after the check that it was free.
    import hermes_state_recovery as recovery
    src, target = tmp_path / "state.db", tmp_path / "copy.db"
    build(src, sessions=1)
    real = os.link

    def a_gateway_got_there_first(partial, into, **kwargs):
        if Path(into) == target:  # just before the finished copy is linked into place
            target.write_bytes(b"a new store")
        real(partial, into, **kwargs)

    monkeypatch.setattr(os, "link", a_gateway_got_there_first)
    with pytest.raises(FileExistsError, match="appeared while the copy was being made"):
        if how == "backup":
            with SessionDB(src) as db:
                db.backup(target)
        else:
            recover(src, target)
    assert target.read_bytes() == b"a new store"
    assert not list(tmp_path.glob("*.partial-*"))


def test_recover_rebuilds_fts_shadow_tables_damaged_by_raw_writes(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("DELETE FROM messages_fts_data WHERE id > 10")  # the segments the structure record names
    conn.execute("DELETE FROM messages_fts_trigram_data WHERE id > 1")
    conn.execute("DELETE FROM messages_fts_cjk_idx")
    with pytest.raises(sqlite3.DatabaseError):
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
    conn.close()
    report = recover(src, dst)
    assert report.complete, report.losses
    conn = sqlite3.connect(dst)
    for table in ("messages_fts", "messages_fts_trigram", "messages_fts_cjk"):
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
    conn.close()
    with SessionDB(dst) as db:
        assert len(db.search_messages("docker", limit=50)) == 12
        assert len(db.search_messages("MARKER-000007")) == 1


def test_recover_salvages_around_a_garbage_page_and_reports_the_loss(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src, sessions=4, per_session=150, filler=300)  # 600 messages over ~60 pages
    data = bytearray(src.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    conn = sqlite3.connect(src)
    leaves = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf'")]
    conn.close()
    at = data.find(b"MARKER-000300")
    while (at // page_size + 1) not in leaves:  # the text's copy in the table, not in an index
        at = data.find(b"MARKER-000300", at + 1)
    start = at - at % page_size
    data[start:start + page_size] = os.urandom(page_size)
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(bytes(data))
    before = digest(damaged)
    report = recover(damaged, dst)
    assert digest(damaged) == before
    messages = report.tables["messages"]
    assert messages.source_rows == 600  # counted through an intact index
    assert 0 < messages.lost < 30 and messages.lost_ranges and messages.copied == 600 - messages.lost
    assert report.verified["messages"] is False and report.verified["sessions"] is True
    assert not report.complete and any("messages" in line for line in report.losses)
    assert report.integrity == "ok" and integrity(dst) == "ok"
    with SessionDB(dst) as db:
        kept = {m["content"][:13] for s in ("s000", "s001", "s002", "s003") for m in db.get_messages(s)}
        assert "MARKER-000000" in kept and "MARKER-000599" in kept and "MARKER-000300" not in kept
        assert sum(db.get_session(s)["message_count"] for s in ("s000", "s001", "s002", "s003")) == messages.copied
        assert db.search_messages("MARKER-000599")


def test_recover_salvages_a_file_cut_short(tmp_path):
    # The header still counts every page; SQLite refuses such a file outright unless told to read
    # what is there, and a copy cut short is the commonest damage of all.
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src, sessions=4, per_session=150, filler=300)
    data = src.read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(data[:len(data) * 3 // 4])
    with pytest.raises(StateDbCorruptError):
        SessionDB(cut, read_only=True).close()
    report = recover(cut, dst)
    messages = report.tables["messages"]
    assert 0 < messages.copied < 600 and not report.complete and report.losses
    assert report.integrity == "ok" and integrity(dst) == "ok"
    with SessionDB(dst) as db:
        assert db.search_messages("MARKER-000000")


def test_recover_keeps_the_rest_of_a_chunk_when_the_schema_refuses_one_row(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")  # an older layout: role could be NULL
    conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'role TEXT NOT NULL', 'role TEXT') "
                 "WHERE name = 'messages'")
    conn.close()
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("UPDATE messages SET role = NULL WHERE id = 3")
    conn.close()
    report = recover(src, dst)
    messages = report.tables["messages"]
    # the chunk is undone and retried row by row: exactly the refused row is missing
    assert (messages.copied, messages.rejected) == (11, 1) and "NOT NULL" in messages.error
    conn = sqlite3.connect(dst)
    assert [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")] == [i for i in range(1, 13) if i != 3]
    conn.close()


def test_recover_skips_a_schema_entry_whose_name_and_statement_disagree(tmp_path):
    # Damage renamed an index's shadow table in the catalogue while its CREATE statement still
    # names the original: creating it "as it was" would collide with the rebuilt index.
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET name = 'zz_notes', tbl_name = 'zz_notes' WHERE name = 'messages_fts_data'")
    conn.close()
    report = recover(src, dst)
    assert report.tables["messages"].copied == 12 and report.verified["messages"]
    assert "does not create the table 'zz_notes'" in report.tables["zz_notes"].error and not report.complete
    assert integrity(dst) == "ok"
    with SessionDB(dst) as db:
        assert len(db.search_messages("docker", limit=50)) == 12


RECOVER_CHILD = textwrap.dedent("""
    import dataclasses, json, os, sys
    os.environ["HERMES_TEST_ISOLATION"] = "1"
    from hermes_state import recover
    report = recover(sys.argv[1], sys.argv[2])
    print(json.dumps(dataclasses.asdict(report)["tables"]["messages"]))
""")


def test_recover_steps_over_an_unreadable_row_far_past_the_others_in_bounded_time(tmp_path):
    # A damaged copy had one message whose key still read (a rowid in the billions) but whose
    # text did not: recover then skipped one rowid at a time towards it, for ever. It must skip
    # that row alone and finish.
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src, sessions=2, per_session=5)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("INSERT INTO messages (id, session_id, role, content, timestamp, message_uid) "
                 "VALUES (?, 's001', 'user', ?, 5, ?)", (10**12, "MARKER-FAR " + "z" * 20_000, "f" * 32))
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    page_count = conn.execute("PRAGMA page_count").fetchone()[0]
    overflow = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'messages' "
                                            "AND pagetype = 'overflow'")]
    conn.close()
    assert overflow
    data = bytearray(src.read_bytes())
    for page in overflow:  # every link of the text's overflow chain now points past the end of the file
        at = (page - 1) * page_size
        data[at:at + 4] = (page_count + 1000).to_bytes(4, "big")
    src.write_bytes(bytes(data))
    before = digest(src)
    out = subprocess.run([sys.executable, "-c", RECOVER_CHILD, str(src), str(dst)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                         timeout=60)  # a guard against the old endless loop, not a speed check
    assert out.returncode == 0, out.stderr
    messages = json.loads(out.stdout)
    assert messages["source_rows"] == 11 and messages["copied"] == 10 and messages["lost"] == 1
    assert messages["lost_ranges"] == [[11, None]]  # the far row was the last one
    assert digest(src) == before and integrity(dst) == "ok"
    with SessionDB(dst) as db:
        assert len(db.get_messages("s001")) == 5 and not db.search_messages("MARKER-FAR")


@pytest.mark.slow
def test_recover_work_grows_in_step_with_the_file(tmp_path, monkeypatch):
    # Counted in SQLite VM steps, not seconds: recounting each session's messages before the
    # indexes existed scanned every message once per session, so 4x the file cost 8x the work
    # (a 366 MB file took 9 minutes). Linear work gives about 4x.
    real_connect = sqlite3.connect

    def steps(name: str, sessions: int) -> int:
        src = tmp_path / f"{name}.db"
        build(src, sessions=sessions, per_session=25)
        count = [0]

        def connect(*args, **kwargs):
            conn = real_connect(*args, **kwargs)
            conn.set_progress_handler(lambda: count.__setitem__(0, count[0] + 1), 1000)
            return conn

        monkeypatch.setattr(sqlite3, "connect", connect)
        try:
            assert recover(src, tmp_path / f"{name}-recovered.db").complete
        finally:
            monkeypatch.setattr(sqlite3, "connect", real_connect)
        return count[0]

    small, large = steps("small", 20), steps("large", 80)
    assert large < 6 * small, (small, large)


def test_recover_copies_a_without_rowid_table_in_chunks_and_in_full(tmp_path, monkeypatch):
    import hermes_state_recovery as recovery
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src, sessions=1)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("CREATE TABLE plugin_notes (k TEXT PRIMARY KEY, v TEXT) WITHOUT ROWID")
    conn.executemany("INSERT INTO plugin_notes VALUES (?, ?)", [(f"k{i:03d}", f"v{i}") for i in range(25)])
    conn.close()
    monkeypatch.setattr(recovery, "COPY_CHUNK_ROWS", 10)  # two full chunks and a part: all must arrive
    report = recover(src, dst)
    assert report.tables["plugin_notes"].copied == 25 and report.complete
    conn = sqlite3.connect(dst)
    assert conn.execute("SELECT COUNT(*), MIN(k), MAX(k) FROM plugin_notes").fetchone() == (25, "k000", "k024")
    conn.close()


def test_recover_keeps_messages_whose_session_row_was_lost(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src, sessions=2)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("UPDATE sessions SET parent_session_id = NULL WHERE id = 's001'")
    conn.execute("DELETE FROM sessions WHERE id = 's000'")  # as if its page had been lost
    conn.close()
    report = recover(src, dst)
    assert report.placeholder_sessions == ["s000"]
    with SessionDB(dst) as db:
        assert db.get_session("s000")["source"] == "recovered"
        assert len(db.get_messages("s000")) == 4


# --- backup and restore ----------------------------------------------------------------------------

APPENDER = textwrap.dedent("""
    import os, sys, time
    os.environ["HERMES_TEST_ISOLATION"] = "1"
    from hermes_state import SessionDB
    path, stop = sys.argv[1], sys.argv[2]
    with SessionDB(path) as db:
        n = 0
        while not os.path.exists(stop):
            db.append_message("live", "user", f"message {n} docker")
            n += 1
""")


def check_consistent(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        counted = conn.execute("SELECT message_count FROM sessions WHERE id = 'live'").fetchone()[0]
        rows = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'live'").fetchone()[0]
        assert counted == rows  # the counter moves in the same transaction as the row
        return rows
    finally:
        conn.close()


def test_backup_while_another_process_appends_is_consistent(db, tmp_path):
    db.create_session("live", "cli")
    stop = tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", APPENDER, str(db.db_path), str(stop)],
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        deadline = time.monotonic() + 20
        while db.get_session("live")["message_count"] < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        copies = [db.backup(tmp_path / f"copy{n}.db") for n in range(3)]
    finally:
        stop.write_text("")
        child.wait(20)
    assert child.returncode == 0
    counts = [check_consistent(c) for c in copies]
    assert counts[0] >= 50 and counts == sorted(counts)
    assert all(os.stat(c).st_mode & 0o777 == 0o600 for c in copies)
    assert not list(tmp_path.glob("*.partial-*"))


def test_backup_refuses_to_overwrite(db, tmp_path):
    (tmp_path / "there.db").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        db.backup(tmp_path / "there.db")
    assert (tmp_path / "there.db").read_bytes() == b"keep"


def test_a_read_only_handle_can_back_up(db, tmp_path):
    db.create_session("s", "cli")
    with SessionDB(db.db_path, read_only=True) as ro:
        ro.backup(tmp_path / "copy.db")
    with SessionDB(tmp_path / "copy.db", read_only=True) as copy:
        assert copy.get_session("s")["source"] == "cli"


def test_restore_replaces_the_content_for_every_open_handle(db, tmp_path):
    db.create_session("before", "cli")
    db.append_message("before", "user", "kept in the backup")
    saved = db.backup(tmp_path / "saved.db")
    db.create_session("after", "cli")
    other = SessionDB(db.db_path)  # another handle, open across the restore
    try:
        assert other.get_session("after") is not None
        db.restore(saved)
        assert db.get_session("after") is None and other.get_session("after") is None
        assert other.get_messages("before")[0]["content"] == "kept in the backup"
        other.append_message("before", "user", "written after the restore")  # the other handle keeps working
        assert db.search_messages("restore")[0]["session_id"] == "before"
    finally:
        other.close()
    assert integrity(db.db_path) == "ok"


def test_restore_refuses_a_damaged_or_foreign_file_and_changes_nothing(db, tmp_path, rival):
    db.create_session("s", "cli")
    saved = db.backup(tmp_path / "saved.db")
    data = bytearray(saved.read_bytes())
    data[-2000:] = os.urandom(2000)
    bad = tmp_path / "bad.db"
    bad.write_bytes(bytes(data))
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    for source, error in ((bad, StateDbCorruptError), (foreign, StateDbIncompatibleError),
                          (tmp_path / "missing.db", FileNotFoundError)):
        with pytest.raises(error):
            db.restore(source)
    assert [r[0] for r in rival.execute("SELECT id FROM sessions")] == ["s"]
    db.create_session("t", "cli")  # still writable


def _fails_on_a_huge_value(path) -> bool:
    try:
        SessionDB(path, read_only=True).close()
    except StateDbCorruptError as exc:
        return "too big" in str(exc)
    return False


def test_restore_and_open_call_a_record_that_claims_a_huge_value_damage(db, tmp_path):
    # Random bytes over a page of the schema sometimes make SQLite read a length past its limit
    # ("string or blob too big"): that is a damaged file, not a raw DataError.
    import random
    db.create_session("s", "cli")
    saved = db.backup(tmp_path / "saved.db")
    base = saved.read_bytes()
    with closing(sqlite3.connect(saved)) as conn:
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'sqlite_schema' "
                                            "AND pagetype = 'leaf' ORDER BY pageno")]
    bad = tmp_path / "bad.db"
    for seed in range(20_000):  # a few patterns in a thousand do it
        data = bytearray(base)
        end = pages[seed % len(pages)] * size
        data[end - 2000:end] = random.Random(seed).randbytes(2000)
        bad.write_bytes(bytes(data))
        raw = sqlite3.connect(bad)
        try:
            raw.execute("PRAGMA integrity_check").fetchall()
        except sqlite3.DataError:
            if _fails_on_a_huge_value(bad):  # not first on a catalogue entry the same bytes broke
                break
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            pass
        finally:
            raw.close()
    else:
        pytest.fail("no damage pattern made SQLite read a value past its size limit")
    with pytest.raises(StateDbCorruptError, match="too big"):
        db.restore(bad)
    assert [s["id"] for s in db.list_sessions()] == ["s"]
    before = digest(bad)
    for read_only in (True, False):
        with pytest.raises(StateDbCorruptError, match="too big"):
            SessionDB(bad, read_only=read_only)
    assert digest(bad) == before


def test_recover_keeps_rows_whose_text_is_not_utf8(db, tmp_path):
    db.create_session("s", "cli")
    db.append_message("s", "user", "fine")
    path = db.db_path
    db.close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO messages (session_id, role, content, timestamp, message_uid) "
                "VALUES ('s', 'user', CAST(X'6F6B20C328' AS TEXT), 5, ?)", ("a" * 32,))
    raw.commit()
    raw.close()
    report = recover(path, tmp_path / "out.db")
    assert report.tables["messages"].copied == 2
    with SessionDB(tmp_path / "out.db") as out:
        assert sorted(m["content"] for m in out.get_messages("s")) == ["fine", "ok \ufffd("]


PLANTED = {
    "trigger that empties a transcript": "CREATE TRIGGER wipe AFTER UPDATE OF ended_at ON sessions BEGIN "
                                         "DELETE FROM messages WHERE session_id = new.id; END",
    "trigger named like a full-text one": "CREATE TRIGGER messages_fts_insert_extra AFTER INSERT ON messages BEGIN "
                                          "INSERT INTO messages_fts(rowid, content) VALUES (new.id, ''); "
                                          "DELETE FROM messages WHERE id = new.id; END",
    "view": "CREATE VIEW every_message AS SELECT * FROM messages",
    "unique index": "CREATE UNIQUE INDEX one_message_per_session ON messages(session_id)",
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_restore_refuses_schema_objects_the_library_does_not_create(db, tmp_path, rival, planted):
    db.create_session("s", "cli")
    db.append_message("s", "user", "kept")
    saved = db.backup(tmp_path / "saved.db")
    raw = sqlite3.connect(saved)
    raw.execute(PLANTED[planted])
    raw.commit()
    raw.close()
    name = PLANTED[planted].split()[3 if planted == "unique index" else 2]
    with pytest.raises(StateDbIncompatibleError, match=name):
        db.restore(saved)
    assert rival.execute("SELECT name FROM sqlite_master WHERE name = ?", (name,)).fetchone() is None
    db.end_session("s", "done")
    db.append_message("s", "user", "still here")
    assert [m["content"] for m in db.get_messages("s")] == ["kept", "still here"]


def test_restore_accepts_its_own_backups_and_an_older_layouts_full_text_objects(db, tmp_path):
    import hermes_state_catalogue as catalogue
    import hermes_state_fts as fts
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    db.restore(db.backup(tmp_path / "own.db"))
    assert db.get_messages("s")[0]["content"] == "hello"
    # An earlier layout's full-text triggers only index rows; an upgrade drops them first.
    older = sqlite3.connect(":memory:")
    older.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT)")
    older.execute("CREATE VIRTUAL TABLE messages_fts USING fts5(content)")
    older.execute("CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN "
                  "INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END")
    assert catalogue.foreign_objects(older, fts.OBJECTS, older=True) == []
    assert catalogue.foreign_objects(older, fts.OBJECTS, older=False) != []


# --- recover runs no stored SQL but reading the tables, and bounds every step ------------------------

ENDLESS_VIEW = ("CREATE VIEW endless AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                "SELECT x FROM r")


def test_recover_never_runs_a_view_posing_as_a_table(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES "
                 "('table', 'endless', 'endless', 0, ?)", (ENDLESS_VIEW,))
    conn.close()
    code = ("import sys, json; from hermes_state import recover; r = recover(sys.argv[1], sys.argv[2]); "
            "print(json.dumps({'complete': r.complete, 'losses': r.losses, "
            "'copied': {n: t.copied for n, t in r.tables.items()}}))")
    out = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["copied"]["sessions"] == 3 and result["copied"]["messages"] == 12
    assert not result["complete"] and any("endless" in line and "not a table definition" in line
                                          for line in result["losses"])


def test_recover_quotes_names_holding_a_double_quote(tmp_path):
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute('CREATE TABLE "odd""name" ("a""b" TEXT, "c" INTEGER)')
    conn.execute('INSERT INTO "odd""name" VALUES (\'kept\', 1)')
    conn.close()
    report = recover(src, dst)
    assert report.complete, report.losses
    assert report.tables['odd"name'].copied == 1
    check = sqlite3.connect(dst)
    assert check.execute('SELECT "a""b", c FROM "odd""name"').fetchall() == [("kept", 1)]
    check.close()


def test_a_recover_step_past_its_limit_is_reported_not_raised(tmp_path, monkeypatch):
    import hermes_state_recovery as recovery
    src, dst = tmp_path / "state.db", tmp_path / "recovered.db"
    build(src)
    conn = sqlite3.connect(src, isolation_level=None)
    conn.execute("CREATE TABLE bulk (x INTEGER)")
    conn.execute("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 50000) "
                 "INSERT INTO bulk SELECT x FROM r")
    conn.close()
    monkeypatch.setattr(recovery, "STEP_LIMIT_S", -1.0)  # every step that reaches the handler is overdue
    report = recover(src, dst)
    assert "no progress" in (report.tables["bulk"].error or "")
    assert not report.complete and dst.exists()


# --- vacuum beside a replica --------------------------------------------------------------------

def _grown_and_emptied(db: SessionDB) -> None:
    db.create_session("big", "cli")
    for i in range(40):
        db.append_message("big", "user", f"filler {i} " + "q" * 4000)
    db.delete_session("big")
    db.create_session("kept", "cli")
    db.append_message("kept", "user", "the row that stays")


def test_vacuum_truncates_the_log_when_nothing_replicates_the_file(db):
    _grown_and_emptied(db)
    with db.tracer() as traced:
        result = db.vacuum()
    assert "PRAGMA wal_checkpoint(TRUNCATE)" in traced
    assert os.path.getsize(f"{db.db_path}-wal") == 0
    assert result["bytes_after"] < result["bytes_before"]


def test_vacuum_leaves_the_log_to_litestream_while_it_replicates_the_file(db, monkeypatch, caplog):
    # Litestream reads the log's frames as it ships them; a TRUNCATE that slips in cuts the log
    # short under its read (its "sync error ... read page N @ offset: EOF"). While a Litestream
    # process has the file open, vacuum() never truncates the log: a PASSIVE checkpoint instead.
    import hermes_state_replicas as replicas
    asked: list[str] = []
    monkeypatch.setattr(replicas, "replicating", lambda path: asked.append(str(path)) or [4242])
    _grown_and_emptied(db)
    wal_before = os.path.getsize(f"{db.db_path}-wal")
    with caplog.at_level("INFO", logger="hermes_state"), db.tracer() as traced:
        result = db.vacuum()
    assert asked == [str(db.db_path)]
    assert not [s for s in traced if "TRUNCATE" in s]
    assert "PRAGMA wal_checkpoint(PASSIVE)" in traced
    assert os.path.getsize(f"{db.db_path}-wal") >= wal_before  # the log is Litestream's to empty
    assert any("Litestream (PID 4242)" in r.getMessage() for r in caplog.records)
    # Nothing held a snapshot here, so the PASSIVE copy was whole: the file shrank all the same.
    assert result["bytes_after"] < result["bytes_before"]
    assert os.path.getsize(db.db_path) == result["bytes_after"]
    assert [s["id"] for s in db.list_sessions_rich()] == ["kept"]
    assert db.check_integrity()["problems"] == []
