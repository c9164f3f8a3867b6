"""The open-time upgrade (hermes_state_upgrade): detect, copy first, migrate, rebuild in the background, reclaim.

These drive the module's own functions on real files; the facade's view of the same sequence
(an upgraded hermes-agent file) is in test_portability_upgrade.py.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

import hermes_state_catalogue as catalogue
import hermes_state_fts as fts
import hermes_state_recovery as recovery
import hermes_state_schema as schema
import hermes_state_upgrade as upgrade
from hermes_state_compression import new_holder
from hermes_state import SCHEMA_VERSION, SessionDB, StoreUnavailableError
from hermes_state_writer import RetryPolicy, Writer

FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"  # a schema-22 file
POLICY = RetryPolicy()


@pytest.fixture
def old_file(tmp_path) -> Path:
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def scalar(path: Path, sql: str, *args: object) -> object:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


def open_writable(path: Path, **kwargs: object) -> tuple[sqlite3.Connection, int, Path | None]:
    opened = upgrade.open_connection(path, read_only=False, read_busy_s=1.0, patience_s=5.0, policy=POLICY, **kwargs)
    return opened.conn, opened.schema_version, opened.upgrade_backup


def test_the_sequence_copies_first_migrates_rebuilds_in_the_background_and_reclaims(old_file, caplog):
    raw = sqlite3.connect(old_file, isolation_level=None)
    raw.execute("BEGIN")  # a large old index, as in a real history: the upgrade frees its pages
    for n in range(300):
        raw.execute("INSERT INTO messages_fts(rowid, content) VALUES (?, ?)",
                    (10_000 + n, " ".join(f"word{n}x{k}" for k in range(300))))
    raw.execute("COMMIT")
    raw.close()
    messages = scalar(old_file, "SELECT COUNT(*) FROM messages")
    caplog.set_level(logging.INFO, logger="hermes_state")  # the rebuild thread logs too
    conn, version, copy = open_writable(old_file)
    writer = Writer(conn)
    try:
        assert version == SCHEMA_VERSION and copy is not None and copy.parent == old_file.parent
        # The copy is the file as it was before anything changed.
        assert scalar(copy, "SELECT version FROM schema_version") == 22
        assert scalar(copy, "SELECT COUNT(*) FROM messages") == messages
        assert scalar(old_file, "SELECT COUNT(*) FROM state_meta WHERE key = ?", recovery.RECLAIM_KEY) == 1
        rebuild = upgrade.open_fts(writer, old_file, 5.0, POLICY, writable=True, chunk_rows=7)
        assert rebuild is not None
        rebuild.thread.join(30)
        assert not rebuild.thread.is_alive()
        with writer.reading() as rconn:
            assert fts.rebuild_status(rconn)["pending"] == 0
    finally:
        writer.close()
    assert scalar(old_file, "SELECT COUNT(*) FROM state_meta WHERE key = ?", recovery.RECLAIM_KEY) == 0
    assert scalar(old_file, "PRAGMA auto_vacuum") == 2  # the reclaim ran its VACUUM
    said = [r.getMessage() for r in caplog.records]
    assert any("upgrading" in m and str(copy) in m for m in said)
    assert any("gave back" in m for m in said)


def test_an_up_to_date_file_opens_without_the_write_lock_and_without_a_copy(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        conn, version, copy = open_writable(path)
        conn.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (version, copy) == (SCHEMA_VERSION, None)
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak" in p.name) == []


def test_no_copy_when_asked_says_so(old_file, caplog):
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        conn, version, copy = open_writable(old_file, backup=False)
    conn.close()
    assert version == SCHEMA_VERSION and copy is None
    assert [p for p in old_file.parent.iterdir() if ".bak" in p.name] == []
    assert any("no copy taken first" in r.getMessage() for r in caplog.records)


def test_a_copy_that_cannot_be_written_stops_the_upgrade(old_file, monkeypatch):
    before = old_file.read_bytes()
    monkeypatch.setattr(recovery, "backup_to", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "disk full")))
    with pytest.raises(StoreUnavailableError, match="was not changed"):
        open_writable(old_file)
    assert old_file.read_bytes() == before


def test_the_ladder_rereads_the_version_under_the_lock(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    rival = sqlite3.connect(path, isolation_level=None)
    rival.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION - 1,))
    ran: list[str] = []
    step = schema.Step(SCHEMA_VERSION, "a test step", lambda conn: ran.append("this opener"))
    monkeypatch.setattr(schema, "LADDER", [step])
    writer = Writer(schema.connect(path))

    def another_process_migrates_first(conn: sqlite3.Connection, writes: int) -> None:
        if writes == 1:  # between the first transaction (tables, columns) and the ladder's step
            rival.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
            ran.append("another process")
    writer.after_commit.append(another_process_migrates_first)
    try:
        assert schema.migrate(writer, 5.0, POLICY) == SCHEMA_VERSION - 1
    finally:
        writer.close()
        rival.close()
    assert ran == ["another process"]  # the step saw the new version under the lock and did not run again
    assert scalar(path, "SELECT version FROM schema_version") == SCHEMA_VERSION


def _grow_old_index(path: Path, documents: int = 300) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN")  # a large old index, as in a real history
    for n in range(documents):
        text = " ".join(f"word{n}x{k}" for k in range(300))
        raw.execute("INSERT INTO messages_fts(rowid, content) VALUES (?, ?)", (10_000 + n, text))
        raw.execute("INSERT INTO messages_fts_trigram(rowid, content) VALUES (?, ?)", (10_000 + n, text))
    raw.execute("COMMIT")
    raw.close()


def _old_index_rows(path: Path) -> dict[str, int]:
    return {f"{table}_{shadow}": cast(int, scalar(path, f"SELECT COUNT(*) FROM {table}_{shadow}"))
            for table in ("messages_fts", "messages_fts_trigram") for shadow in ("data", "content", "docsize")}


def _nothing_freed_ahead(monkeypatch) -> None:
    # Every moved-aside row is then left for the clearing, which these tests watch.
    monkeypatch.setattr(upgrade, "FREE_RESERVE_BYTES", 0)
    monkeypatch.setattr(upgrade, "UPGRADE_BYTES_PER_MESSAGE", 0)
    monkeypatch.setattr(upgrade, "STAND_IN_ROOM_ROWS", 0)


def test_the_upgrade_moves_the_old_index_aside_and_frees_it_later_in_short_transactions(old_file, monkeypatch):
    _grow_old_index(old_file)
    _nothing_freed_ahead(monkeypatch)
    before = _old_index_rows(old_file)
    conn, version, _ = open_writable(old_file)
    writer = Writer(conn)
    try:
        assert version == SCHEMA_VERSION
        # The upgrade renamed the old tables' pages aside instead of freeing them: every row is still there,
        # the word index's in plain tables, the substring index's in the index itself, kept for searches.
        moved = {name: cast(int, scalar(old_file, f"SELECT COUNT(*) FROM {name}"))
                 for name in upgrade.retired_tables(conn)}
        kept = {f"messages_fts_trigram_{shadow}": cast(int, scalar(old_file, f"SELECT COUNT(*) FROM "
                                                                    f"{fts.OLD_SUBSTRINGS}_{shadow}"))
                for shadow in ("data", "content", "docsize")}
        assert sorted(moved.values()) == sorted(v for k, v in before.items() if not k.startswith("messages_fts_trigram"))
        assert kept == {k: v for k, v in before.items() if k.startswith("messages_fts_trigram")} and len(moved) == 3
        assert scalar(old_file, "SELECT COUNT(*) FROM sqlite_master WHERE sql LIKE '%fts5%' "
                                f"AND name <> '{fts.OLD_SUBSTRINGS}'") == 0
        assert scalar(old_file, "PRAGMA integrity_check") == "ok"  # plain tables, not a damaged index
        free_before = scalar(old_file, "PRAGMA freelist_count")
        # Emptied a few rows per transaction: here one batch of 4 each, so many turns for other writers.
        monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 4)
        turns = []

        def one_batch(c: sqlite3.Connection) -> bool:
            turns.append(1)
            return upgrade.clear_retired_step(c, budget_s=0.0)
        assert fts.run_pending(writer, 5.0, POLICY, step=one_batch)
        assert len(turns) >= max(moved.values()) // 4
        assert upgrade.retired_tables(conn) == []
        assert cast(int, scalar(old_file, "PRAGMA freelist_count")) > cast(int, free_before)
        rebuild = upgrade.open_fts(writer, old_file, 5.0, POLICY, writable=True)
        assert rebuild is not None
        rebuild.thread.join(30)
        with writer.reading() as rconn:
            assert fts.rebuild_status(rconn)["pending"] == 0
        # Once rebuilt, the kept substring index is moved aside and freed the same way.
        assert scalar(old_file, f"SELECT COUNT(*) FROM sqlite_master WHERE name GLOB '{fts.OLD_SUBSTRINGS}*'") == 0
        assert upgrade.retired_tables(conn) == []
    finally:
        writer.close()
    assert scalar(old_file, "PRAGMA integrity_check") == "ok"


@pytest.mark.parametrize("hex_text", ["E69DB1E4BAAC20FF", "EDA080", "E69DB1E4BAAC20EDA080E383"],
                         ids=["stray_byte", "lone_surrogate", "mixed"])
def test_a_message_that_is_not_utf8_neither_stops_the_rebuild_nor_keeps_the_old_index(old_file, hex_text, capsys):
    # Another program stored it as TEXT; the rebuild hands it to the CJK function like any other row.
    from hermes_state_cli import main
    raw = sqlite3.connect(old_file, isolation_level=None)
    raw.execute(f"UPDATE messages SET content = CAST(x'{hex_text}' AS TEXT) WHERE id = (SELECT MAX(id) FROM messages)")
    total = raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    raw.close()
    with SessionDB(old_file, backup_before_upgrade=False) as db:
        assert db.wait_for_fts_rebuild(60)
        status = db.fts_rebuild_status()
        assert status["in_progress"] is False and status["indexed"] == status["total"] == total
        found = {h["id"] for h in db.search_messages("部署", limit=100)}
        assert found and db.search_messages("東京", limit=100)
    assert scalar(old_file, f"SELECT COUNT(*) FROM sqlite_master WHERE name GLOB '{fts.OLD_SUBSTRINGS}*'") == 0
    conn = sqlite3.connect(old_file)
    assert upgrade.retired_tables(conn) == []
    conn.close()
    assert main(["--db", str(old_file), "fts", "rebuild"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert main(["--db", str(old_file), "--json", "fts", "status"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["pending"] == 0 and err == ""
    with SessionDB(old_file) as db:
        assert {h["id"] for h in db.search_messages("部署", limit=100)} == found


def test_a_stopped_clearing_resumes_at_the_next_open_and_searches_find_old_rows(old_file, monkeypatch):
    _grow_old_index(old_file, documents=100)
    word = scalar(old_file, "SELECT content FROM messages WHERE content LIKE '% %' AND role = 'user' LIMIT 1")
    term = max(cast(str, word).split(), key=len).strip(".,!?:;\"'()")
    monkeypatch.setattr(upgrade, "CLEAR_CHUNK_S", 0.0)  # one batch per transaction: the first open cannot finish
    monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 1)
    _nothing_freed_ahead(monkeypatch)
    SessionDB(old_file).close()  # closing stops the background work after the batch under way
    conn = sqlite3.connect(old_file)
    try:
        assert upgrade.retired_tables(conn) != []
    finally:
        conn.close()
    monkeypatch.undo()
    db = SessionDB(old_file)
    try:
        assert db.wait_for_fts_rebuild(60)
        assert db.search_messages(term) != []
    finally:
        db.close()
    conn = sqlite3.connect(old_file)
    try:
        assert upgrade.retired_tables(conn) == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def test_the_new_layout_takes_the_old_index_pages_so_the_file_does_not_grow(old_file, monkeypatch):
    raw = sqlite3.connect(old_file, isolation_level=None)
    raw.execute("BEGIN")  # long messages: the old word index keeps a copy of each, the new one does not
    raw.execute("INSERT INTO sessions (id, source, started_at) VALUES ('long', 'cli', 1.0)")
    for n in range(400):
        raw.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('long', 'user', ?, ?)",
                    (" ".join(f"word{n}x{k}" for k in range(300)), 2.0 + n))
    raw.execute("COMMIT")
    raw.close()
    monkeypatch.setattr(upgrade, "AUTO_RECLAIM_MAX_BYTES", 0)  # no VACUUM after: the pages' reuse is what is checked
    before = old_file.stat().st_size
    db = SessionDB(old_file)
    try:
        assert db.wait_for_fts_rebuild(60)
        assert db.search_messages("word7x123") != []  # the old index's rows, indexed again
    finally:
        db.close()
    conn = sqlite3.connect(old_file)
    try:
        assert upgrade.retired_tables(conn) == [] and conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        conn.close()
    assert old_file.stat().st_size <= before and free > 0  # what the new layout did not need stays free


def test_freeing_ahead_leaves_a_reserve_and_stops_when_nothing_is_left(old_file, monkeypatch):
    _grow_old_index(old_file)
    _nothing_freed_ahead(monkeypatch)
    conn, _, _ = open_writable(old_file)
    try:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("BEGIN IMMEDIATE")
        free = conn.execute("PRAGMA freelist_count").fetchone()[0] * page
        assert upgrade.free_ahead(conn, reserve_bytes=free) is False  # already that much free: nothing deleted
        assert upgrade.free_ahead(conn, reserve_bytes=free + 8 * page, budget_s=5.0) is True
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] * page >= free + 8 * page
        assert upgrade.retired_tables(conn) != []  # it stopped once twice the reserve was free
        assert upgrade.free_ahead(conn, reserve_bytes=1 << 40, budget_s=5.0) is True
        assert upgrade.retired_tables(conn) == []
        assert upgrade.free_ahead(conn, reserve_bytes=1 << 40) is False  # nothing left to free
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_a_single_ask_frees_up_to_the_reserve_and_a_repeated_one_up_to_twice_it(old_file, monkeypatch):
    # The rebuild asks before each transaction and frees in batches of twice the reserve; the
    # upgrade asks once, and writes wait meanwhile, so it stops at the reserve.
    _grow_old_index(old_file)
    _nothing_freed_ahead(monkeypatch)
    monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 1)  # the clock and the free pages looked at every row
    conn, _, _ = open_writable(old_file)
    try:
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        def free() -> int:
            return conn.execute("PRAGMA freelist_count").fetchone()[0] * page
        freed = {}
        for once in (True, False):
            conn.execute("BEGIN IMMEDIATE")
            reserve = free() + 16 * page
            assert upgrade.free_ahead(conn, reserve_bytes=reserve, budget_s=30.0, once=once) is True
            freed[once] = free()
            assert upgrade.retired_tables(conn) != []  # it stopped before the moved-aside rows ran out
            conn.execute("ROLLBACK")
        assert reserve <= freed[True] < 2 * reserve <= freed[False]
    finally:
        conn.close()


@pytest.mark.slow
def test_writers_take_turns_with_the_clearing(old_file, monkeypatch):
    _grow_old_index(old_file, documents=100)
    monkeypatch.setattr(upgrade, "CLEAR_CHUNK_S", 0.0)
    monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 2)
    first = SessionDB(old_file)  # its thread empties the old tables, two rows per transaction
    errors: list[BaseException] = []

    def write(n: int) -> None:
        db = SessionDB(old_file)
        try:
            db.create_session(f"writer-{n}", source="cli")
            for k in range(40):
                db.append_message(f"writer-{n}", role="user", content=f"turn {k} of writer {n}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            db.close()
    threads = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [] and first.wait_for_fts_rebuild(120)
        assert [first.message_count(f"writer-{n}") for n in range(3)] == [40, 40, 40]
        assert len(first.search_messages('"of writer 2"', limit=100)) == 40
    finally:
        first.close()
    conn = sqlite3.connect(old_file)
    try:
        assert upgrade.retired_tables(conn) == [] and conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


def _lease(path: Path) -> str | None:
    return cast("str | None", scalar(path, "SELECT MAX(value) FROM state_meta WHERE key = ?", fts.WORKER_KEY))


@pytest.mark.slow
def test_one_thread_of_all_the_handles_on_a_file_does_the_background_work(old_file, monkeypatch):
    _grow_old_index(old_file, documents=100)
    monkeypatch.setattr(upgrade, "CLEAR_CHUNK_S", 0.0)  # hundreds of chunks: the first thread is still at work
    monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 1)
    first = SessionDB(old_file)
    try:
        deadline = time.monotonic() + 30
        while _lease(old_file) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = cast(str, _lease(old_file))
        assert holder.startswith(f"pid={os.getpid()} ")
        second = SessionDB(old_file)  # its thread finds the lease live and waits, leaving the work to the first
        try:
            assert not second.wait_for_fts_rebuild(2 * fts.LEASE_RETRY_S)
            assert cast(str, _lease(old_file)).split(" until=")[0] == holder.split(" until=")[0]
            monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 10_000)  # the one that takes over finishes fast
            first.close()  # stops its thread, which gives the lease back: the second takes over
            assert second.wait_for_fts_rebuild(60)
            assert _lease(old_file) is None
        finally:
            second.close()
    finally:
        first.close()
    assert scalar(old_file, "SELECT COUNT(*) FROM sqlite_master WHERE name GLOB 'hermes_retired_fts_*'") == 0
    assert scalar(old_file, "SELECT COUNT(*) FROM state_meta WHERE key = 'fts_rebuild_high_water'") == 0


def test_the_lease_of_a_killed_process_is_taken_over_at_once(old_file, monkeypatch):
    _grow_old_index(old_file, documents=20)
    dead = subprocess.run([sys.executable, "-c", "import hermes_state_compression as c; print(c.new_holder())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)  # upgraded, the index work left pending
    _nothing_freed_ahead(monkeypatch)
    SessionDB(old_file, backup_before_upgrade=False).close()
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", True)
    conn = sqlite3.connect(old_file)
    assert upgrade.retired_tables(conn) != []  # else the next open would start no thread to take the lease over
    with conn:
        conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)",
                     (fts.WORKER_KEY, f"{dead} until={time.time() + 3600}"))
    conn.close()
    with SessionDB(old_file) as db:
        assert db.wait_for_fts_rebuild(60)
        assert db.fts_rebuild_status()["pending"] == 0
    assert _lease(old_file) is None and scalar(old_file, "SELECT COUNT(*) FROM sqlite_master WHERE name GLOB "
                                               "'hermes_retired_fts_*'") == 0


def _upgraded_with_work_left(old_file: Path, monkeypatch) -> None:
    _grow_old_index(old_file, documents=40)
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)  # upgraded, the index work left pending
    _nothing_freed_ahead(monkeypatch)
    SessionDB(old_file, backup_before_upgrade=False).close()
    monkeypatch.undo()
    monkeypatch.setattr(upgrade, "BACKGROUND_START_S", 3600.0)  # every handle below closes before its first turn
    monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", 1)  # and counts as a large file's


def test_a_short_command_hands_a_large_files_work_to_a_process_that_finishes_it(old_file, monkeypatch):
    _upgraded_with_work_left(old_file, monkeypatch)
    started: list[subprocess.Popen] = []
    hand_over = upgrade.hand_over
    monkeypatch.setattr(upgrade, "hand_over", lambda *a: started.append(hand_over(*a)) or started[-1])
    with SessionDB(old_file) as db:
        assert db.message_count() >= 0  # a short command: it closes long before its thread's first turn
    assert len(started) == 1 and started[0] is not None
    assert started[0].wait(120) == 0
    with SessionDB(old_file, read_only=True) as ro:
        assert ro.fts_rebuild_status()["pending"] == 0
    assert _lease(old_file) is None and scalar(old_file, "SELECT COUNT(*) FROM sqlite_master WHERE name GLOB "
                                               "'hermes_retired_fts_*'") == 0


def test_the_finishing_process_runs_the_library_it_was_started_from_not_a_file_beside_the_store(old_file, monkeypatch,
                                                                                               tmp_path):
    # A module named like the library's, next to the store (the finishing process works there):
    # it must not be what runs; the library found by the process that started it is.
    _upgraded_with_work_left(old_file, monkeypatch)
    hijacked = tmp_path / "hijacked"
    (old_file.parent / "hermes_state_upgrade.py").write_text(
        f"import pathlib\npathlib.Path({str(hijacked)!r}).write_text('ran')\nraise SystemExit(3)\n")
    started: list[subprocess.Popen] = []
    hand_over = upgrade.hand_over
    monkeypatch.setattr(upgrade, "hand_over", lambda *a: started.append(hand_over(*a)) or started[-1])
    with SessionDB(old_file) as db:
        assert db.message_count() >= 0
    assert len(started) == 1 and started[0] is not None
    assert started[0].wait(120) == 0 and not hijacked.exists()
    with SessionDB(old_file, read_only=True) as ro:
        assert ro.fts_rebuild_status()["pending"] == 0


def test_a_short_command_on_a_large_older_file_hands_over_its_copy_and_upgrade(old_file, monkeypatch):
    monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", 1)  # copied and upgraded after the open
    started: list[subprocess.Popen] = []
    hand_over = upgrade.hand_over
    monkeypatch.setattr(upgrade, "hand_over", lambda *a: started.append(hand_over(*a)) or started[-1])
    backup_to = recovery.backup_to

    def held_back(conn: sqlite3.Connection, target: Path, stop: threading.Event | None = None, **kw: object) -> object:
        assert stop is not None
        stop.wait(60)  # the copy has not got far when the command closes
        return backup_to(conn, target, stop=stop, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(recovery, "backup_to", held_back)
    db = SessionDB(old_file)
    assert db.upgrading
    db.close()  # a short command: its copy stops at the next step
    assert len(started) == 1 and started[0] is not None and started[0].wait(120) == 0
    with SessionDB(old_file, read_only=True) as ro:
        assert ro.schema_version == SCHEMA_VERSION and ro.fts_rebuild_status()["pending"] == 0
    assert len(catalogue.upgrade_copies(old_file)) == 1  # one copy, taken by the process that upgraded


@pytest.mark.slow
def test_one_process_at_a_time_finishes_a_move_in_and_openers_meanwhile_take_no_copy(old_file, monkeypatch):
    monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", 1)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        marker = upgrade.handed_over_marker(old_file)
        marker.write_text(str(sleeper.pid))  # a live process was handed the move-in
        assert upgrade.handed_over_to(old_file) == sleeper.pid
        assert upgrade.hand_over(old_file) is None  # a second one is never started
        db = SessionDB(old_file)
        try:
            assert not db.wait_for_fts_rebuild(1.5) and db.upgrading  # it waits for that process
            assert not [p for p in old_file.parent.iterdir() if ".partial-" in p.name or ".pending-" in p.name]
            sleeper.kill()
            sleeper.wait()
            assert upgrade.handed_over_to(old_file) is None  # gone: stale, taken over
            assert db.wait_for_fts_rebuild(60) and db.schema_version == SCHEMA_VERSION
        finally:
            db.close()
    finally:
        sleeper.kill()
        sleeper.wait()
    process = upgrade.hand_over(old_file)  # the stale marker is replaced; the process exits with nothing to do
    assert process is not None and process.wait(60) == 0
    assert not upgrade.handed_over_marker(old_file).exists()  # removed by the process it named


def test_no_process_is_started_when_asked_not_to_or_when_another_holds_the_work(old_file, monkeypatch):
    _upgraded_with_work_left(old_file, monkeypatch)
    calls: list[object] = []
    hand_over = upgrade.hand_over
    monkeypatch.setattr(upgrade, "hand_over", lambda *a: calls.append(hand_over(*a)))
    monkeypatch.setattr(SessionDB, "finish_after_close", False)
    SessionDB(old_file).close()
    assert calls == []
    monkeypatch.setattr(SessionDB, "finish_after_close", True)
    conn = sqlite3.connect(old_file)
    with conn:  # a live process (this one) holds the work
        conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)",
                     (fts.WORKER_KEY, f"{new_holder()} until={time.time() + 3600}"))
    conn.close()
    SessionDB(old_file).close()
    assert calls == [None]  # asked, and it started nothing
    with pytest.raises(TypeError):
        SessionDB.finish_after_close = "yes"  # type: ignore[assignment]


def _copy_named(db: Path, taken: float, version: int = SCHEMA_VERSION, suffix: str = "") -> Path:
    path = db.with_name(time.strftime(f"{db.name}.pre-v{version}-%Y%m%dT%H%M%SZ.bak", time.gmtime(taken)) + suffix)
    path.write_bytes(b"a copy")
    return path


def test_the_copies_policy_keeps_the_newest_two_for_the_days_asked(tmp_path):
    db = tmp_path / "state.db"
    now = 1_800_000_000.0
    day = 86_400.0
    fresh, recent, third = (_copy_named(db, now - d * day) for d in (1, 5, 10))
    stale = _copy_named(db, now - 40 * day, version=SCHEMA_VERSION - 1)
    pending = _copy_named(db, now - 50 * day, suffix=f".pending-{os.getpid()}-0123abcd")
    assert catalogue.copy_taken_at(fresh) == now - day and catalogue.copy_taken_at(db) is None
    assert sorted(catalogue.copies_to_remove(db, 30, now=now)) == sorted([third, stale])  # a third one; too old
    assert catalogue.copies_to_remove(db, 3, now=now) == [recent, third, stale]
    assert catalogue.copies_to_remove(db, None, now=now) == []  # None keeps every copy
    assert catalogue.remove_old_copies(db, 3, now=now) == [recent, third, stale]
    assert fresh.exists() and pending.exists() and not recent.exists()  # a pending copy is its upgrade's to settle


def test_a_writable_open_removes_the_copies_past_the_policy_and_a_read_only_one_does_not(tmp_path, monkeypatch):
    db = tmp_path / "state.db"
    SessionDB(db).close()
    old = _copy_named(db, time.time() - 31 * 86_400)
    kept = _copy_named(db, time.time() - 86_400)
    SessionDB(db, read_only=True).close()
    assert old.exists()
    monkeypatch.setattr(SessionDB, "upgrade_copy_keep_days", None)
    SessionDB(db).close()
    assert old.exists()  # None: kept until the user removes it
    monkeypatch.setattr(SessionDB, "upgrade_copy_keep_days", 30)
    SessionDB(db).close()
    assert not old.exists() and kept.exists()
    for bad, error in (("30", TypeError), (-1, ValueError), (float("inf"), ValueError), (True, TypeError)):
        with pytest.raises(error, match="upgrade_copy_keep_days"):
            SessionDB.upgrade_copy_keep_days = bad  # type: ignore[assignment]


def test_an_old_index_that_cannot_be_moved_aside_is_dropped_in_one_piece(old_file, monkeypatch, caplog):
    _grow_old_index(old_file, documents=20)
    monkeypatch.setattr(upgrade, "FTS5_HEADER_ROWS", (-1, -2))  # the table's constructor then fails to drop it
    caplog.set_level(logging.INFO, logger="hermes_state")
    conn, version, _ = open_writable(old_file)
    try:
        assert version == SCHEMA_VERSION and upgrade.retired_tables(conn) == []
        assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'messages_fts%'").fetchone()[0] == 0
    finally:
        conn.close()
    assert any("dropped in one piece" in r.getMessage() for r in caplog.records)
    assert scalar(old_file, "PRAGMA integrity_check") == "ok"


def test_a_newer_file_is_left_as_it_is(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 5,))
    raw.close()
    before = path.read_bytes()
    conn, version, copy = open_writable(path)
    conn.close()
    assert (version, copy) == (SCHEMA_VERSION + 5, None)  # the facade refuses writes to it
    assert path.read_bytes() == before


def test_stop_ends_the_rebuild_thread_before_the_reclaim(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    started, reclaimed = threading.Event(), []

    def slow_worker(writer, patience_s, policy, chunk_rows, stop, **_):  # noqa: ANN001, ANN003
        started.set()
        stop.wait(30)
    monkeypatch.setattr(fts, "background_worker", slow_worker)
    monkeypatch.setattr(upgrade, "reclaim_after_upgrade", lambda *a, **k: reclaimed.append(1))
    writer = Writer(schema.connect(path))
    try:
        rebuild = upgrade.FtsRebuild(writer, path, 5.0, POLICY, 10)
        rebuild.thread.start()
        assert started.wait(10)
        rebuild.stop()
        assert not rebuild.thread.is_alive() and reclaimed == []
    finally:
        writer.close()


def _marked_file_with_free_pages(path: Path) -> sqlite3.Connection:
    SessionDB(path).close()
    conn = schema.connect(path)
    conn.execute("CREATE TABLE filler (x BLOB)")
    conn.execute("INSERT INTO filler SELECT zeroblob(4000) FROM (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                 "SELECT i + 1 FROM n WHERE i < 300) SELECT i FROM n)")
    conn.execute("DROP TABLE filler")  # its pages are now free
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, '1')", (recovery.RECLAIM_KEY,))
    return conn


def test_a_large_file_is_not_vacuumed_unasked(tmp_path, monkeypatch, caplog):
    path = tmp_path / "state.db"
    conn = _marked_file_with_free_pages(path)
    monkeypatch.setattr(upgrade, "AUTO_RECLAIM_MAX_BYTES", 0)
    try:
        with caplog.at_level(logging.INFO, logger="hermes_state"):
            assert upgrade.reclaim_after_upgrade(conn, path, 5.0, POLICY) is False
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] > 100  # left as it was
        assert conn.execute("SELECT COUNT(*) FROM state_meta WHERE key = ?", (recovery.RECLAIM_KEY,)).fetchone()[0] == 0
    finally:
        conn.close()
    assert any("SessionDB.vacuum()" in r.getMessage() for r in caplog.records)


def test_a_failed_reclaim_is_logged_when_quiet_and_raised_otherwise(tmp_path, monkeypatch, caplog):
    path = tmp_path / "state.db"
    conn = _marked_file_with_free_pages(path)

    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(recovery, "vacuum", broken)
    try:
        with pytest.raises(sqlite3.OperationalError):
            upgrade.reclaim_after_upgrade(conn, path, 5.0, POLICY)
        with caplog.at_level(logging.WARNING, logger="hermes_state"):
            assert upgrade.reclaim_after_upgrade(conn, path, 5.0, POLICY, quiet=True) is False
    finally:
        conn.close()
    assert any("SessionDB.vacuum() does it" in r.getMessage() for r in caplog.records)
