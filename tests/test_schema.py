"""Opening, creating and upgrading the database; versions, corruption, files and read-only opens."""
from __future__ import annotations

import multiprocessing
import os
import re
import sqlite3
import stat
import time

import pytest

import hermes_state_schema as schema
import hermes_state_titles as titles
from hermes_state import (ReadOnlyError, SessionDB, StateDbCorruptError, StateDbIncompatibleError,
                          StateDbUninitializedError, StoreUnavailableError)
from hermes_state_common import INDEX_SQL, PAGE_SIZE, SCHEMA_VERSION, TABLE_COLUMNS

EXPECTED_TABLES = {"sessions", "messages", "session_model_usage", "state_meta", "gateway_routing",
                   "compression_locks", "async_delegations", "runtime_epoch", "session_admissions",
                   "worker_executions", "worker_receipts", "schema_version"}


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_fresh_database_has_the_declared_shape(db, rival):
    tables = _tables(rival)
    assert EXPECTED_TABLES <= tables
    assert "delivery_obligations" not in tables  # created lazily by the gateway, never at open
    assert [tuple(r) for r in rival.execute("SELECT version FROM schema_version")] == [(SCHEMA_VERSION,)]
    for table, columns in TABLE_COLUMNS.items():
        have = [r[1] for r in rival.execute(f"PRAGMA table_info({table})")]
        assert have == list(columns), table
    indexes = {r[0] for r in rival.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    for sql in INDEX_SQL:
        assert sql.split(" IF NOT EXISTS ")[1].split()[0] in indexes
    title_index = rival.execute("SELECT sql FROM sqlite_master WHERE name='idx_sessions_title_unique'").fetchone()[0]
    assert "UNIQUE" in title_index and "WHERE title IS NOT NULL" in title_index
    for ledger in ("session_admissions", "worker_executions", "worker_receipts"):
        fks = [r for r in rival.execute(f"PRAGMA foreign_key_list({ledger})") if r[2] == "sessions"]
        assert fks and fks[0][6] == "RESTRICT", ledger
    assert rival.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with db.transaction() as txn:  # the handle's write connection
        assert txn.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert txn.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_a_new_file_gets_the_page_size_and_an_existing_file_keeps_its_own(tmp_path):
    with SessionDB(tmp_path / "new.db") as db:
        db.create_session("s", "cli")
    assert sqlite3.connect(tmp_path / "new.db").execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE != 4096
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as made:  # a file another program created with SQLite's default pages
        made.execute("PRAGMA page_size = 4096")
        made.execute("CREATE TABLE other_program (x)")
    with SessionDB(old, force=True) as db:  # upgraded in place, never rewritten page by page
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
    conn = sqlite3.connect(old)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT content FROM messages").fetchall() == [("hello",)]


def test_ledger_rows_restrict_session_delete(db, rival):
    db.create_session("s", "cli")
    rival.execute("INSERT INTO session_admissions (session_id, state) VALUES ('s', 'queued')")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        with db.transaction() as txn:
            txn.conn.execute("DELETE FROM sessions WHERE id='s'")
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE id='s'").fetchone()[0] == 1


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_files_are_private(db):
    db.create_session("s", "cli")
    for suffix in ("", "-wal", "-shm"):
        path = str(db.db_path) + suffix
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_existing_loose_file_is_tightened(tmp_path):
    path = tmp_path / "loose.db"
    sqlite3.connect(path).close()
    os.chmod(path, 0o644)
    SessionDB(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _old_layout(path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (1);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT,
                               started_at REAL NOT NULL, ended_at REAL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
                               role TEXT NOT NULL, content TEXT, timestamp REAL NOT NULL);
        INSERT INTO sessions VALUES ('old1', 'cli', 'gpt-4', 1000.0, NULL);
        INSERT INTO sessions VALUES ('old2', 'telegram', NULL, 2000.0, 2100.0);
        INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old1', 'user', 'hello', 1001.0);
        INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old1', 'assistant', 'hi', 1002.0);
        INSERT INTO messages (session_id, role, content, timestamp) VALUES ('old2', 'user', '東京', 2001.0);
    """)
    conn.close()


def test_upgrade_from_old_layout_keeps_every_row(tmp_path):
    path = tmp_path / "old.db"
    _old_layout(path)
    with SessionDB(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        old1 = db.get_session("old1")
        assert old1["model"] == "gpt-4" and old1["started_at"] == 1000.0
        assert old1["message_count"] == 2 and old1["archived"] == 0
        db.create_session("new", "cli")  # the upgraded file takes new writes
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    rows = conn.execute("SELECT session_id, role, content, timestamp, active, compacted, message_uid "
                        "FROM messages ORDER BY id").fetchall()
    assert [r[:4] for r in rows] == [("old1", "user", "hello", 1001.0), ("old1", "assistant", "hi", 1002.0),
                                     ("old2", "user", "東京", 2001.0)]
    assert all(r[4] == 1 and r[5] == 0 for r in rows)
    uids = [r[6] for r in rows]
    assert all(re.fullmatch(r"[0-9a-f]{32}", u) for u in uids) and len(set(uids)) == 3
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_upgrade_drops_an_index_no_query_needs_and_keeps_the_ones_declared(tmp_path):
    path = tmp_path / "v30.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
    conn = sqlite3.connect(path, isolation_level=None)  # as an earlier version left it
    conn.execute("CREATE INDEX idx_messages_session_active ON messages(session_id, active, timestamp)")
    conn.execute("UPDATE schema_version SET version = 30")
    conn.close()
    with SessionDB(path) as db:
        assert [m["content"] for m in db.get_messages("s")] == ["hello"]
        assert db.list_sessions()[0]["preview"] == "hello"
    conn = sqlite3.connect(path)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "idx_messages_session_active" not in indexes
    assert {sql.split(" IF NOT EXISTS ")[1].split()[0] for sql in INDEX_SQL} <= indexes
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_upgrade_numbers_duplicate_titles_before_the_unique_index(tmp_path):
    path = tmp_path / "dupes.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (20);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL, title TEXT);
        INSERT INTO sessions VALUES ('a', 'cli', 2, 'Fix bug'), ('b', 'cli', 3, 'Fix bug'),
                                    ('c', 'cli', 4, 'Fix bug #2'), ('d', 'cli', 1, 'Fix bug'),
                                    ('e', 'cli', 5, 'Notes'), ('f', 'cli', 5, 'Notes'), ('g', 'cli', 6, NULL),
                                    ('h', 'cli', 7, NULL);
    """)
    conn.close()
    with SessionDB(path) as db:
        titles = {sid: db.get_session(sid)["title"] for sid in "abcdefgh"}
    # The oldest keeps the title; later ones are numbered in start order (ties by id), skipping
    # a number another session already has; no title stays no title.
    assert titles == {"d": "Fix bug", "a": "Fix bug #3", "b": "Fix bug #4", "c": "Fix bug #2",
                      "e": "Notes", "f": "Notes #2", "g": None, "h": None}


def test_open_of_current_database_takes_no_write_lock_and_scans_nothing(db, rival, monkeypatch):
    db.create_session("s", "cli")
    statements: list[str] = []
    real_connect = schema.connect

    def traced(path, **kw):
        conn = real_connect(path, **kw)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(schema, "connect", traced)
    monkeypatch.setattr(SessionDB, "write_patience_s", 0.2)
    rival.execute("BEGIN IMMEDIATE")  # a writer elsewhere does not block a current open
    try:
        other = SessionDB(db.db_path)
    finally:
        rival.execute("ROLLBACK")
    other.close()
    # A TEMP trigger lives in the connection's temp schema: no lock on the file.
    opened = [s for s in statements if "checkpoint" not in s and not s.startswith("CREATE TEMP TRIGGER")]
    assert not any("BEGIN" in s for s in opened)
    for s in opened:
        # only catalogue reads: no statement reads the data tables
        assert not re.search(r"FROM\s+(sessions|messages)\b", s, re.I), s


def _open_and_write(path: str, tag: str) -> None:
    with SessionDB(path) as db:
        db.create_session(tag, "cli")


def test_two_processes_opening_a_fresh_file_at_once(tmp_path):
    path = str(tmp_path / "race.db")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_write, args=(path, f"p{i}")) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    conn = sqlite3.connect(path)
    assert sorted(r[0] for r in conn.execute("SELECT id FROM sessions")) == ["p0", "p1"]
    assert conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_newer_version_is_opened_but_writes_are_refused(db, rival):
    db.create_session("s", "cli")
    db.close()
    rival.execute("UPDATE schema_version SET version = 99")
    with SessionDB(db.db_path) as newer:
        assert newer.get_session("s")["id"] == "s"  # reads still work
        with pytest.raises(StateDbIncompatibleError, match="newer"):
            newer.create_session("t", "cli")
    assert rival.execute("SELECT version FROM schema_version").fetchone()[0] == 99
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    with SessionDB(db.db_path, read_only=True) as reader:  # a newer file holding every column we know
        assert reader.get_session("s")["id"] == "s" and reader.schema_version == 99
    rival.execute("ALTER TABLE sessions DROP COLUMN pinned")  # newer, but not a superset any more
    with pytest.raises(StateDbIncompatibleError) as info:
        SessionDB(db.db_path, read_only=True)
    assert isinstance(info.value, StoreUnavailableError) and info.value.http_status == 503


def test_not_a_database_raises_corrupt_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "state.db"
    garbage = b"this is my novel, not a database" * 200
    path.write_bytes(garbage)
    with pytest.raises(StateDbCorruptError, match="not a usable SQLite database"):
        SessionDB(path)
    assert path.read_bytes() == garbage


def test_malformed_schema_raises_corrupt(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # page 1 holds sqlite_master: ruin it
    path.write_bytes(bytes(data))
    with pytest.raises(StateDbCorruptError):
        SessionDB(path)


def test_read_only_opens(tmp_path, raw_conn):
    missing = tmp_path / "missing.db"
    with pytest.raises(StateDbUninitializedError):
        SessionDB(missing, read_only=True)
    assert not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StateDbUninitializedError):
        SessionDB(empty, read_only=True)
    assert empty.read_bytes() == b""
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    with SessionDB(path, read_only=True) as ro:
        assert ro.get_session("s")["source"] == "cli"
        with pytest.raises(ReadOnlyError):
            ro.create_session("t", "cli")
    old = tmp_path / "old.db"
    _old_layout(old)
    before = old.read_bytes()
    with SessionDB(old, read_only=True) as ro:  # an older layout reads, its missing columns as defaults
        assert ro.schema_version == 1
        assert ro.get_session("old1")["pinned"] == 0 and ro.get_session("old1")["title"] is None
    assert old.read_bytes() == before
    alien = tmp_path / "alien.db"
    raw = raw_conn(alien)
    raw.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY)")  # no source, no messages: not a session store
    raw.commit()
    with pytest.raises(StateDbIncompatibleError, match="lacks sessions.source"):
        SessionDB(alien, read_only=True)


def test_read_only_open_waits_then_reports_busy(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    monkeypatch.setattr(SessionDB, "read_busy_timeout_s", 0.2)  # tuned on the class, read at call time
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("PRAGMA journal_mode=DELETE")  # an exclusive lock blocks readers only without WAL
    locker.execute("BEGIN EXCLUSIVE")
    try:
        from hermes_state import StateDbBusyError
        t0 = time.monotonic()
        with pytest.raises(StateDbBusyError):
            SessionDB(path, read_only=True)
        assert time.monotonic() - t0 < 2.0  # the tuned 0.2 s, not the 5 s default
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def test_upgrade_counts_only_the_live_rows_of_a_layout_without_counters(tmp_path):
    # A layout that kept a compression archive (active = 0) before it kept counters.
    path = tmp_path / "archive.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES (5);
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
                               content TEXT, tool_calls TEXT, timestamp REAL NOT NULL, active INTEGER DEFAULT 1);
        INSERT INTO sessions VALUES ('s', 'cli', 1.0), ('empty', 'cli', 2.0);
        INSERT INTO messages (session_id, role, content, tool_calls, timestamp, active) VALUES
            ('s', 'user', 'old question', NULL, 1.0, 0),
            ('s', 'assistant', 'old answer', '[{"id": "a"}, {"id": "b"}]', 2.0, 0),
            ('s', 'user', 'summary', NULL, 3.0, 1),
            ('s', 'assistant', 'new answer', '[{"id": "c"}]', 4.0, 1),
            ('s', 'tool', 'result', '[{"id": "x"}]', 5.0, 1);
    """)
    conn.close()
    with SessionDB(path) as db:
        counts = {sid: (db.get_session(sid)["message_count"], db.get_session(sid)["tool_call_count"])
                  for sid in ("s", "empty")}
        assert len(db.get_messages("s")) == counts["s"][0]
    assert counts == {"s": (3, 1), "empty": (0, 0)}


def test_ladder_is_a_registry_of_named_steps_in_version_order():
    for ladder, top, prefix in ((schema.LADDER, SCHEMA_VERSION, "v"), (schema.LAYOUT_STEPS, schema.LAYOUT_REVISION,
                                                                         "layout")):
        numbers = [s.version for s in ladder]
        assert numbers == sorted(set(numbers)) and numbers[-1] <= top
        for entry in ladder:  # each step is named in the module: vNN_what / layoutN_what
            names = [name for name, value in vars(schema).items() if value is entry.run]
            assert entry.what and any(name.startswith(f"{prefix}{entry.version}_") for name in names), names
    versions = [s.version for s in schema.LADDER]
    for entry in schema.LADDER:
        version, run = entry  # the (version, step) pair older readers unpack
        assert (version, run) == (entry.version, entry.run)
    before = list(schema.LADDER)
    with pytest.raises(ValueError, match="out of order"):
        schema.step(versions[0], "a step that does not come after the last one")(lambda conn: None)
    with pytest.raises(ValueError, match="out of order"):
        schema.step(SCHEMA_VERSION + 1, "a step past the version this library writes")(lambda conn: None)
    assert schema.LADDER == before


def test_build_file_makes_the_same_file_as_a_fresh_open(tmp_path, db, rival):
    conn = sqlite3.connect(tmp_path / "built.db", isolation_level=None)
    conn.execute("BEGIN")
    schema.build_file(conn)
    conn.execute("COMMIT")

    declared = EXPECTED_TABLES | {sql.split(" IF NOT EXISTS ")[1].split()[0] for sql in INDEX_SQL} | {schema.UID_TRIGGER}

    def shape(c):  # the declared objects (the FTS indexes are the facade's, built after open)
        return sorted(tuple(r) for r in c.execute("SELECT type, name, sql FROM sqlite_master") if r[1] in declared)
    assert shape(conn) == shape(rival) and len(shape(conn)) == len(declared)
    assert (schema.read_version(conn), schema.read_layout(conn)) == (SCHEMA_VERSION, schema.LAYOUT_REVISION)


def test_every_ladder_step_runs_on_rows_a_build_copies_in(tmp_path, monkeypatch):
    ran = []
    for name, top in (("LADDER", SCHEMA_VERSION), ("LAYOUT_STEPS", schema.LAYOUT_REVISION)):
        monkeypatch.setattr(schema, name, [*getattr(schema, name), schema.Step(top, "a later step",
                                                                               lambda c, name=name: ran.append(name))])
    conn = sqlite3.connect(tmp_path / "built.db", isolation_level=None)
    conn.execute("BEGIN")
    schema.build_file(conn, lambda c: c.execute(
        "INSERT INTO sessions (id, source, started_at, title) VALUES ('a', 'cli', 1, 'T'), ('b', 'cli', 2, 'T')"))
    conn.execute("COMMIT")
    assert ran == ["LADDER", "LAYOUT_STEPS"]
    assert conn.execute("SELECT id, title FROM sessions ORDER BY id").fetchall() == [("a", "T"), ("b", "T #2")]


# --- journal mode where WAL cannot work ----------------------------------------------------------
# A network file system refuses WAL's shared memory with SQLITE_PROTOCOL. No such mount exists
# here, so a connection class answers `journal_mode=WAL` the way SQLite does on one.

def _refusing(code: int | None, message: str, *, also_delete: bool = False) -> type[sqlite3.Connection]:
    class Refusing(schema.Connection):  # the library's own connection class, which its code expects
        wal_attempts = 0

        def execute(self, sql, *args):  # type: ignore[override]
            flat = sql.replace(" ", "").lower()
            if flat == "pragmajournal_mode=wal" or (also_delete and flat == "pragmajournal_mode=delete"):
                type(self).wal_attempts += flat.endswith("wal")
                exc = sqlite3.OperationalError(message)
                exc.sqlite_errorcode = code  # type: ignore[attr-defined]
                raise exc
            return super().execute(sql, *args)
    return Refusing


@pytest.fixture
def file_system(monkeypatch):
    """Make every connection the library opens behave as on a file system that refuses WAL."""
    def install(code: int | None = 15, message: str = "locking protocol", **kw) -> type[sqlite3.Connection]:
        factory = _refusing(code, message, **kw)
        real = sqlite3.connect
        monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: real(*a, **{**k, "factory": factory}))
        return factory
    monkeypatch.setattr(schema, "wal_fallback_warned", set())
    return install


def test_where_wal_is_refused_the_store_runs_on_a_rollback_journal_and_says_so_once(tmp_path, file_system, caplog):
    import hermes_state
    hermes_state.set_last_init_error(None)
    factory = file_system()
    path = tmp_path / "nfs" / "state.db"
    with caplog.at_level("WARNING", logger="hermes_state"):
        for round_ in range(2):
            with SessionDB(path) as db:
                db.create_session(f"s{round_}", "cli")
                db.append_message(f"s{round_}", "user", "written without WAL")
    warned = [r.getMessage() for r in caplog.records if "journal_mode=DELETE" in r.getMessage()]
    assert len(warned) == 1 and str(path) in warned[0] and "locking protocol" in warned[0]
    assert factory.wal_attempts >= 2  # each open asked for WAL first
    rival = sqlite3.Connection(str(path))  # a plain connection, as another program would open it
    assert rival.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
    assert not (tmp_path / "nfs" / "state.db-wal").exists()
    rival.close()
    assert hermes_state.get_last_init_error() is None


def test_a_wal_file_is_never_downgraded_and_other_errors_are_not_mistaken_for_the_file_system(tmp_path):
    path = tmp_path / "wal.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    refusing = sqlite3.connect(path, factory=_refusing(15, "locking protocol"))
    assert schema.apply_wal_with_fallback(refusing, str(path)) == "wal"
    assert type(refusing).wal_attempts == 0  # already WAL: not even asked
    refusing.close()
    # A transient I/O error is not a file system without shared memory: no downgrade.
    fresh = sqlite3.connect(tmp_path / "fresh.db", factory=_refusing(10 | 15 << 8, "disk I/O error"))
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        schema.apply_wal_with_fallback(fresh, "fresh.db")
    assert fresh.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # untouched, never set
    fresh.close()


def test_when_no_journal_mode_works_the_open_fails_typed_and_the_cause_is_kept(tmp_path, file_system, monkeypatch):
    import hermes_state
    from hermes_state_errors import StateDbJournalError, StoreUnavailableError
    hermes_state.set_last_init_error(None)
    file_system(also_delete=True)
    with pytest.raises(StateDbJournalError) as raised:
        SessionDB(tmp_path / "ro-mount" / "state.db")
    assert isinstance(raised.value, StoreUnavailableError) and isinstance(raised.value, sqlite3.OperationalError)
    assert raised.value.http_status == 503 and "local disk" in raised.value.guidance
    cause = hermes_state.get_last_init_error()
    assert cause == "OperationalError: locking protocol"
    message = hermes_state.format_session_db_unavailable(prefix="Cannot resume")
    assert message.startswith("Cannot resume: OperationalError: locking protocol.") and "NFS/SMB" in message
    # A later success does not erase the cause another caller may be about to report.
    monkeypatch.undo()
    SessionDB(tmp_path / "ok.db").close()
    assert hermes_state.get_last_init_error() == cause
    hermes_state.set_last_init_error(None)
    assert hermes_state.format_session_db_unavailable() == "Session database not available."


def _drop_title_index_and_share(path, ids, title="Shared") -> None:
    # Another program dropped the unique index, then wrote one title on several sessions.
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP INDEX idx_sessions_title_unique")
    c.execute(f"UPDATE sessions SET title = ? WHERE id IN ({','.join('?' * len(ids))})", (title, *ids))
    c.close()


def test_open_frees_repeated_titles_for_the_newest_holder_keeping_every_row(tmp_path, caplog):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        for sid in ("c", "a", "b"):  # created in this order; the start times below decide
            db.create_session(sid, "cli")
            db.append_message(sid, "user", f"note {sid}")
    _drop_title_index_and_share(path, ["a", "b", "c"])
    c = sqlite3.connect(path, isolation_level=None)
    c.executemany("UPDATE sessions SET started_at = ? WHERE id = ?", [(1000.0, "a"), (2000.0, "b"), (3000.0, "c")])
    c.close()
    with caplog.at_level("WARNING", logger="hermes_state"):
        with SessionDB(path) as db:
            assert [db.get_session_title(s) for s in ("a", "b", "c")] == [None, None, "Shared"]
            assert [db.get_messages(s)[0]["content"] for s in ("a", "b", "c")] == ["note a", "note b", "note c"]
            with pytest.raises(ValueError, match="already in use"):
                db.set_session_title("a", "Shared")
    warned = [r.message for r in caplog.records if "unique again" in r.message]
    assert len(warned) == 1 and "2 older session(s)" in warned[0] and warned[0].endswith(": b, a")  # newest first
    caplog.clear()
    with caplog.at_level("WARNING", logger="hermes_state"):
        SessionDB(path).close()  # repaired once: the next open has nothing to say
    assert not [r for r in caplog.records if "unique again" in r.message]


def test_open_rebuilds_a_dropped_title_index_without_touching_distinct_titles(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("a", "cli", title="One")
        db.create_session("b", "cli", title="Two")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("DROP INDEX idx_sessions_title_unique")
    c.close()
    with SessionDB(path) as db:
        assert (db.get_session_title("a"), db.get_session_title("b")) == ("One", "Two")
    c = sqlite3.connect(path)
    assert c.execute("SELECT 1 FROM sqlite_master WHERE name = 'idx_sessions_title_unique'").fetchone()
    c.close()


def test_free_duplicate_titles_is_a_no_op_while_the_index_exists(conn):
    conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('x', 'cli', 1, 'T')")
    assert titles.free_duplicate_titles(conn) == []


def _soft_heap_limit(value: int | None = None) -> int:
    probe = sqlite3.connect(":memory:")
    try:
        sql = "PRAGMA soft_heap_limit" + ("" if value is None else f" = {value}")
        return probe.execute(sql).fetchone()[0]
    finally:
        probe.close()


def test_an_open_sets_a_soft_heap_limit_only_when_the_program_set_none(tmp_path):
    import hermes_state_common
    before = _soft_heap_limit()
    try:
        _soft_heap_limit(0)
        SessionDB(tmp_path / "a.db").close()
        assert _soft_heap_limit() == hermes_state_common.SOFT_HEAP_LIMIT_KIB * 1024
        _soft_heap_limit(7 * 1024 * 1024)  # the program's own choice stays
        SessionDB(tmp_path / "b.db").close()
        assert _soft_heap_limit() == 7 * 1024 * 1024
    finally:
        _soft_heap_limit(before)


def test_a_streamed_read_shrinks_a_large_cache_past_the_threshold_and_restores_it(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.db")
    cache = lambda: conn.execute("PRAGMA cache_size").fetchone()[0]  # noqa: E731
    conn.execute("PRAGMA cache_size = -16000")
    with schema.StreamedRead(conn) as stream:
        stream.passed(schema.STREAM_TEXT_CHARS)
        assert cache() == -16000  # not past it yet
        stream.passed(1)
        assert cache() == -schema.STREAM_CACHE_KIB
        stream.passed(schema.STREAM_TEXT_CHARS)
    assert cache() == -16000
    with pytest.raises(KeyError), schema.StreamedRead(conn) as stream:
        stream.passed(schema.STREAM_TEXT_CHARS + 1)
        raise KeyError("the caller failed mid-read")
    assert cache() == -16000
    for own in (500, -1000):  # a cache counted in pages, or one already smaller, is left alone
        conn.execute(f"PRAGMA cache_size = {own}")
        with schema.StreamedRead(conn) as stream:
            stream.passed(schema.STREAM_TEXT_CHARS + 1)
            assert cache() == own
        assert cache() == own
    conn.close()


def test_a_replaced_sqlite3_connect_is_called_as_its_caller_expects(tmp_path, monkeypatch):
    # hermes-agent's tests replace sqlite3.connect with a function that passes a connection class
    # of their own: the library adds no `factory` then, and works on the plain connections it gets.
    factories: list = []
    real = sqlite3.connect

    def connect(*args, **kwargs):
        factories.append(kwargs.get("factory"))
        return real(*args, **kwargs)
    monkeypatch.setattr(sqlite3, "connect", connect)
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        for n in range(3):
            db.append_message("s", "user", f"docker build {n} 東京")
        assert len(db.search_messages("docker")) == 3 and len(db.search_messages("東京")) == 3
    assert factories and factories == [None] * len(factories)
