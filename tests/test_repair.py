"""Self-repair: the malformed-error test, the health probe, repair strategies, the repair on open."""
from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state
import hermes_state_repair as repair
from hermes_state_repair import ATTEMPTED_PATHS
from hermes_state import SessionDB, StateDbCorruptError, is_malformed_db_error, repair_state_db_schema
from conftest import locks_held


def _store(path: Path, sessions: int = 2, per_session: int = 3) -> None:
    with SessionDB(path) as db:
        for s in range(sessions):
            db.create_session(f"s{s}", "cli")
            for m in range(per_session):
                db.append_message(f"s{s}", "user", f"kiwi note {s}-{m}")


def _twin_catalogue_row(path: Path, name: str = "messages_fts") -> None:
    # What a crashed schema edit by another tool leaves: one object listed twice.
    c = sqlite3.connect(path)
    c.execute("PRAGMA writable_schema = ON")
    c.execute("INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) "
              "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master WHERE name = ?", (name,))
    c.commit()
    c.close()


def _scramble_index(path: Path, *, structure: bool = False) -> None:
    # Rows 1 and 10 of an FTS5 data table are its averages and structure records: without them
    # the table cannot even be opened; with them only the term pages are garbage.
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("UPDATE messages_fts_data SET block = X'0badf00d0badf00d'"
              + ("" if structure else " WHERE id NOT IN (1, 10)"))
    c.close()


def _counts(path: Path) -> tuple[int, int]:
    c = sqlite3.connect(path)
    try:
        return (c.execute("SELECT COUNT(*) FROM sessions").fetchone()[0],
                c.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
    finally:
        c.close()


@pytest.fixture
def path(tmp_path) -> Path:
    target = tmp_path / "state.db"
    _store(target)
    return target


@pytest.fixture(autouse=True)
def fresh_attempts():
    # The paths an open already tried to repair are remembered per process; each test starts afresh.
    saved = set(ATTEMPTED_PATHS)
    ATTEMPTED_PATHS.clear()
    yield
    ATTEMPTED_PATHS.clear()
    ATTEMPTED_PATHS.update(saved)


def test_malformed_class_is_told_by_code_and_text():
    assert is_malformed_db_error(sqlite3.DatabaseError("database disk image is malformed"))
    assert not is_malformed_db_error(sqlite3.DatabaseError("file is not a database"))
    assert not is_malformed_db_error(sqlite3.OperationalError("database is locked"))
    assert not is_malformed_db_error(KeyError("malformed"))
    wrapped = StateDbCorruptError("bad")
    wrapped.__cause__ = sqlite3.DatabaseError("malformed database schema (x)")
    assert is_malformed_db_error(wrapped)


def test_real_twin_row_error_is_malformed(path):
    _twin_catalogue_row(path)
    c = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError) as info:
        c.execute("SELECT 1 FROM sessions").fetchone()
    c.close()
    assert info.value.sqlite_errorcode & 0xFF == repair.SQLITE_CORRUPT
    assert is_malformed_db_error(info.value)


def test_probe_passes_a_healthy_file_and_leaves_it_unchanged(path):
    before = path.read_bytes()
    assert repair.db_opens_cleanly(path) is None
    assert _counts(path) == (2, 6)  # the write probe was rolled back
    assert path.read_bytes() == before


def test_probe_reports_a_missing_file_without_creating_it(tmp_path):
    assert "does not exist" in repair.db_opens_cleanly(tmp_path / "none.db")
    assert not (tmp_path / "none.db").exists()


def test_probe_sees_an_index_that_only_fails_on_write(path):
    _scramble_index(path)
    assert _counts(path) == (2, 6)  # plain reads still work
    assert repair.db_opens_cleanly(path).startswith("messages_fts: ")  # the full-text index check names it


def test_healthy_file_is_left_alone_and_not_copied(path):
    report = repair_state_db_schema(path)
    assert report == {"repaired": True, "strategy": "already_healthy", "backup_path": None, "error": None}
    assert list(path.parent.glob("*.bak")) == []


def test_twin_catalogue_row_is_removed_with_every_row_kept(path, caplog):
    _twin_catalogue_row(path)
    damaged = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        report = repair_state_db_schema(path)
    assert report["repaired"] and report["strategy"] == "dedup_schema"
    copy = sqlite3.connect(report["backup_path"])  # the copy is taken before any change: twin row and all
    try:
        copy.execute("PRAGMA writable_schema = ON")
        assert copy.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0] == 2
    finally:
        copy.close()
    assert damaged != path.read_bytes() and _counts(path) == (2, 6)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "no session or message was changed" in caplog.records[0].message
    with SessionDB(path) as db:
        assert len(db.search_messages("kiwi")) == 6


def test_scrambled_index_is_rebuilt_and_writes_resume(path):
    _scramble_index(path)
    report = repair_state_db_schema(path, backup=False)
    assert report["repaired"] and report["strategy"] == "rebuild_fts" and report["backup_path"] is None
    with SessionDB(path) as db:
        db.append_message("s0", "assistant", "kiwi again")
        assert len(db.search_messages("kiwi")) == 7


def test_index_that_cannot_even_open_is_dropped_and_built_anew(path):
    _scramble_index(path, structure=True)
    report = repair_state_db_schema(path, backup=False)
    assert report["repaired"] and report["strategy"] == "drop_fts_rebuild"
    assert _counts(path) == (2, 6)
    with SessionDB(path) as db:
        assert len(db.search_messages("kiwi")) == 6


def test_escalates_to_dropping_the_index_when_earlier_passes_do_not_heal(path):
    _twin_catalogue_row(path)
    seen = []

    def strict(p: Path) -> str | None:
        # Calls: before anything, after the dedup pass (the in-place rebuild cannot run on a
        # malformed catalogue), after the drop pass. Only the last may report health.
        seen.append(p)
        if len(seen) < 3:
            return "pretend still broken"
        return repair.db_opens_cleanly(p)

    report = repair.repair_state_db_schema(path, check=strict)
    assert report["repaired"] and report["strategy"] == "drop_fts_rebuild"
    assert _counts(path) == (2, 6)
    with SessionDB(path) as db:
        assert len(db.search_messages("kiwi")) == 6


def test_garbage_file_reports_failure_keeps_its_bytes_aside_and_never_raises_or_writes(tmp_path):
    path = tmp_path / "state.db"
    damaged = b"SQLite format 3\x00" + b"\x01\x02\x03\x04" * 300
    path.write_bytes(damaged)
    report = repair_state_db_schema(path)
    assert report["repaired"] is False and report["error"]
    assert path.read_bytes() == damaged
    # SQLite cannot read it to copy it; nothing of this process has it open, so its bytes are copied.
    assert Path(report["backup_path"]).read_bytes() == damaged


def test_garbage_file_this_process_holds_open_is_not_copied_with_a_plain_descriptor(tmp_path):
    path = tmp_path / "state.db"
    damaged = b"SQLite format 3\x00" + b"\x01\x02\x03\x04" * 300
    path.write_bytes(damaged)
    with open(path, "rb"):  # closing a second descriptor on it would drop this process's locks on it
        report = repair_state_db_schema(path)
    assert report["repaired"] is False and "copied aside" in report["error"]
    assert path.read_bytes() == damaged
    assert not list(tmp_path.glob("*.bak*"))  # nor a half-made copy


def test_a_repair_that_does_not_heal_writes_no_copy_back_and_keeps_every_row(path):
    _twin_catalogue_row(path)
    report = repair.repair_state_db_schema(path, check=lambda p: "pretend never healthy")
    assert report["repaired"] is False and report["error"] == "pretend never healthy"
    assert _counts(path) == (2, 6)  # the steps touched derived objects only
    copy = sqlite3.connect(report["backup_path"])  # the copy: the file as found, twin row and all
    try:
        copy.execute("PRAGMA writable_schema = ON")
        assert copy.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0] == 2
    finally:
        copy.close()


def test_only_a_malformed_catalogue_is_repaired_at_open():
    catalogue = sqlite3.DatabaseError("malformed database schema (messages_fts) - table messages_fts already exists")
    page = sqlite3.DatabaseError("database disk image is malformed")
    assert repair.is_catalogue_error(catalogue)
    assert not repair.is_catalogue_error(page)
    wrapped = StateDbCorruptError("bad")
    wrapped.__cause__ = catalogue
    assert repair.is_catalogue_error(wrapped)


def test_missing_file_is_reported_and_not_created(tmp_path):
    report = repair_state_db_schema(tmp_path / "absent.db")
    assert report["repaired"] is False and "does not exist" in report["error"]
    assert not (tmp_path / "absent.db").exists()


def test_failed_copy_stops_before_any_change(path, monkeypatch):
    _twin_catalogue_row(path)
    damaged = path.read_bytes()

    def no_space(_path):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(repair, "copy_aside", no_space)
    report = repair_state_db_schema(path)
    assert report["repaired"] is False and "copied aside" in report["error"]
    assert path.read_bytes() == damaged


def test_open_repairs_a_malformed_file_once(path):
    _twin_catalogue_row(path)
    with SessionDB(path) as db:
        assert db.get_session("s1") is not None
        assert len(db.get_messages("s1")) == 3
    assert len(list(path.parent.glob("state.db.malformed-*.bak"))) == 1


def test_open_tries_an_unfixable_file_only_once(path, monkeypatch):
    _twin_catalogue_row(path)
    calls = []
    monkeypatch.setattr(hermes_state, "repair_state_db_schema",
                        lambda p, **kw: calls.append(p) or {"repaired": False})
    for _ in range(2):
        with pytest.raises(StateDbCorruptError):
            SessionDB(path)
    assert len(calls) == 1


def test_open_does_not_repair_a_file_that_is_not_a_database(tmp_path, monkeypatch):
    path = tmp_path / "state.db"
    path.write_bytes(b"plain text, no database here" * 10)
    monkeypatch.setattr(hermes_state, "repair_state_db_schema", lambda *a, **k: pytest.fail("repair tried"))
    with pytest.raises(StateDbCorruptError):
        SessionDB(path)
    assert path.read_bytes() == b"plain text, no database here" * 10


def test_read_only_open_never_repairs(path):
    _twin_catalogue_row(path)
    damaged = path.read_bytes()
    with pytest.raises(StateDbCorruptError):
        SessionDB(path, read_only=True)
    assert path.read_bytes() == damaged


def _repair_in_child(path: str, out) -> None:
    out.put(repair_state_db_schema(path)["repaired"])


@pytest.mark.slow
def test_two_processes_repairing_at_once_lose_no_row(path):
    # Two openers may meet the same malformed file; each change is one write transaction, so
    # the second finds the first's work done or waits for it.
    _twin_catalogue_row(path)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    children = [ctx.Process(target=_repair_in_child, args=(str(path), out)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0, 0]
    assert True in [out.get(timeout=5), out.get(timeout=5)]
    assert repair.db_opens_cleanly(path) is None
    assert _counts(path) == (2, 6)
    with SessionDB(path) as db:
        assert len(db.search_messages("kiwi")) == 6


# --- what a repair does to the locks this process holds, and to triggers it did not make --------

@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's lock table, a Linux file")
def test_no_repair_path_drops_the_locks_this_process_holds(path):
    db = SessionDB(path)  # a live handle: its WAL connection holds its locks the whole time
    try:
        db.create_session("live", "cli")
        held = locks_held(path)
        assert ("shm", "READ", "128-128") in held, held  # SQLite's mark that a connection uses the WAL
        _twin_catalogue_row(path)
        for step in (lambda: repair.db_opens_cleanly(path),
                     lambda: repair.repair_state_db_schema(path, check=lambda p: "pretend never healthy"),
                     lambda: SessionDB(path).close(),  # an open that repairs the catalogue
                     lambda: repair_state_db_schema(path)):
            step()
            assert held <= locks_held(path), step
        db.append_message("live", "user", "still writing")  # and the live handle carries on
        assert Path(f"{path}-wal").exists() and db.message_count("live") == 1
    finally:
        db.close()
    assert _counts(path) == (3, 7)


def plant_endless_trigger(path: Path) -> None:
    """Give the file a trigger of someone else's that never ends, on every new session."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TRIGGER hog AFTER INSERT ON sessions BEGIN SELECT COUNT(*) FROM (WITH RECURSIVE "
                     "c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c); END")
        conn.commit()
    finally:
        conn.close()


def test_a_planted_trigger_never_runs_and_no_step_is_unbounded(path, tmp_path):
    # A trigger that never ends on every new session, and a twin catalogue row: the repair's write
    # probe would run the trigger (for ever, holding the write lock). In a child, so a hang fails.
    plant_endless_trigger(path)
    _twin_catalogue_row(path)
    child = subprocess.run([sys.executable, "-c", (
        "import sys, json; from hermes_state import SessionDB, repair_state_db_schema; "
        "r = repair_state_db_schema(sys.argv[1]); SessionDB(sys.argv[1], read_only=True).close(); "
        "print(json.dumps(r))"), str(path)], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[1], env={**os.environ, "HERMES_HOME": str(tmp_path)})
    assert child.returncode == 0, child.stderr
    assert '"repaired": true' in child.stdout and '"dedup_schema"' in child.stdout
    assert _counts(path) == (2, 6)  # no probe row was left either


def test_a_step_past_its_deadline_is_interrupted_and_rolled_back(path, monkeypatch):
    plant_endless_trigger(path)
    monkeypatch.setattr(repair, "WRITE_PROBE_S", 0.5)
    conn = repair.connect(path)
    try:  # called directly, the probe does run the trigger: the deadline cuts it short
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            repair.write_probe(conn)
        assert not conn.in_transaction
    finally:
        conn.close()
    assert _counts(path) == (2, 6)


# --- an index grown past the levels SQLite reads --------------------------------------------------

def _deepen_index(path: Path, *, past_the_limit: bool) -> int:
    """Grow messages_fts level by level, as a loop of merges under appends did; return the messages written.

    Another program's rows, indexed at once by the file's triggers, each followed by a `merge` with
    a negative page count: every one finds segments on two levels and adds two levels for good.
    Stops a few levels short of what SQLite reads, or just past it (the index no longer opens).
    """
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("BEGIN IMMEDIATE")
    written = 0
    while True:
        depth = _depth(c)
        if depth >= (2001 if past_the_limit else 1990):
            break
        c.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s0', 'user', ?, 0)",
                  (f"kiwi deep {written}",))
        written += 1
        c.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('merge', -1)")
    c.execute("COMMIT")
    c.close()
    return written


def _depth(c: sqlite3.Connection) -> int:
    block = c.execute("SELECT block FROM messages_fts_data WHERE id = 10").fetchone()[0]
    return block[4] if block[4] < 0x80 else ((block[4] & 0x7F) << 7) | block[5]  # a 1- or 2-byte varint


def _opens(path: Path) -> bool:
    c = sqlite3.connect(path)
    try:
        c.execute("SELECT COUNT(*) FROM messages_fts").fetchone()
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        c.close()


@pytest.mark.parametrize("past_the_limit", [False, True], ids=["near-the-limit", "past-the-limit"])
def test_an_open_rebuilds_an_index_grown_past_its_levels_and_keeps_every_row(path, past_the_limit, caplog):
    deep = _deepen_index(path, past_the_limit=past_the_limit)
    assert _opens(path) is not past_the_limit  # past the limit, SQLite refuses the table outright
    caplog.set_level(logging.WARNING, logger="hermes_state")
    with SessionDB(path) as db:
        assert db.wait_for_fts_rebuild(120)
        db.append_message("s1", "user", "kiwi after the repair")
        hits = {h["id"] for h in db.search_messages("kiwi", limit=10_000)}
    c = sqlite3.connect(path)
    assert hits == {r[0] for r in c.execute("SELECT id FROM messages")} and len(hits) == 6 + deep + 1
    c.close()
    assert any("levels" in r.getMessage() and "messages_fts" in r.getMessage() for r in caplog.records)
    c = sqlite3.connect(path)
    assert _depth(c) < 16
    c.close()
    assert repair.db_opens_cleanly(path) is None


def test_repair_and_recover_save_every_row_of_an_index_past_its_levels(path, tmp_path):
    deep = _deepen_index(path, past_the_limit=True)
    assert "levels" in (repair.db_opens_cleanly(path) or "") or not _opens(path)
    saved = tmp_path / "saved.db"
    assert hermes_state.recover(path, saved).complete
    assert _counts(saved) == (2, 6 + deep)
    report = repair_state_db_schema(path, backup=False)
    assert report["repaired"] and report["strategy"] == "rebuild_fts", report
    assert _counts(path) == (2, 6 + deep)
    with SessionDB(path) as db:
        assert len(db.search_messages("kiwi", limit=10_000)) == 6 + deep


def test_the_probe_names_an_index_near_its_level_limit(path):
    _deepen_index(path, past_the_limit=False)
    assert _opens(path)  # FTS5 still reads it: only the depth tells
    reason = repair.db_opens_cleanly(path)
    assert reason is not None and "messages_fts" in reason and "levels" in reason
