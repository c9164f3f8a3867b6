"""Moving in a large older file: the open returns at once, the copy and the upgrade run on a thread.

Meanwhile reads read the file as it is, writes wait for the upgrade, close() stops a copy under
way without leaving anything behind, a failed copy refuses writes with a typed error, and a fork
during the copy neither hangs nor lets the child use the parent's handle.
"""
from __future__ import annotations

import errno
import json
import gzip
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hermes_state_recovery as recovery
import hermes_state_schema as schema
from hermes_state import HermesStateError, SCHEMA_VERSION, SessionDB, StoreUnavailableError

FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"  # hermes-agent's schema 22


@pytest.fixture
def old_file(tmp_path) -> Path:
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


@pytest.fixture
def in_background(monkeypatch):
    """Every older file is moved in after the open returns, whatever its size."""
    monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", 0)


class HeldCopy:
    """The copy an upgrade takes first, held at its start until released (or stopped by close)."""

    def __init__(self, monkeypatch, fail: BaseException | None = None):
        self.release, self.started = threading.Event(), threading.Event()
        real = recovery.backup_to

        def held(conn, target, stop=None, renamed=None, give_way=None):
            self.started.set()
            while not self.release.wait(0.02):
                if stop is not None and stop.is_set():
                    break
            if fail is not None:
                raise fail
            return real(conn, target, stop=stop, renamed=renamed, give_way=give_way)
        monkeypatch.setattr(recovery, "backup_to", held)


def version_of(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT version FROM schema_version").fetchone()[0]
    finally:
        conn.close()


def copies(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if ".pre-v" in p.name)


def test_the_open_returns_at_once_reads_meanwhile_and_a_write_waits_for_the_upgrade(old_file, in_background,
                                                                                    monkeypatch):
    with SessionDB(old_file, read_only=True) as ro:  # what a reader of the file as it is sees
        want_sessions = [s["id"] for s in ro.list_sessions_rich(limit=50)]
        sid = want_sessions[0]
        want_conversation = ro.get_messages_as_conversation(sid)
        want_count = ro.message_count()
    assert want_conversation and want_count
    held = HeldCopy(monkeypatch)
    db = SessionDB(old_file)
    try:
        assert held.started.wait(10) and db.upgrading
        assert db.schema_version == 22 and db.upgrade_backup is None
        # Nothing is indexed the new way yet, and the work that will index it is under way.
        status = db.fts_rebuild_status()
        assert status["in_progress"] is True and status["pending"] == status["total"] == want_count
        assert version_of(old_file) == 22 and copies(old_file) == []  # nothing changed, nothing copied yet
        # Reads read the file as it is.
        assert [s["id"] for s in db.list_sessions_rich(limit=50)] == want_sessions
        assert db.get_messages_as_conversation(sid) == want_conversation
        assert db.message_count() == want_count
        # A write waits for the upgrade, then goes through.
        done: list[object] = []
        writer = threading.Thread(target=lambda: done.append(db.append_message(sid, "user", "after the move")))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and not done and version_of(old_file) == 22
        held.release.set()
        writer.join(30)
        assert done and not db.upgrading
        assert db.schema_version == SCHEMA_VERSION and version_of(old_file) == SCHEMA_VERSION
        assert db.upgrade_backup is not None and version_of(db.upgrade_backup) == 22  # the file as it was
        assert db.message_count() == want_count + 1
        assert db.get_messages_as_conversation(sid)[:-1] == want_conversation  # uids too: the back-fill derives the same
        assert db.wait_for_fts_rebuild(60)
        assert [h["id"] for h in db.search_messages('"after the move"')] == [done[0]]
    finally:
        db.close()


def test_a_write_waits_for_the_move_in_no_longer_than_its_own_patience(old_file, in_background, monkeypatch):
    from hermes_state import SessionPersistenceError
    held = HeldCopy(monkeypatch)  # the copy stays at its start until released: the move-in cannot end meanwhile
    db = SessionDB(old_file)
    try:
        assert held.started.wait(10) and db.upgrading
        sid = db.list_sessions_rich(limit=1)[0]["id"]
        db.activity_write_patience_s = 0.01  # the bookkeeping write that must never stall a turn
        db.transcript_write_patience_s = 0.01
        outcomes: list[object] = []
        ended = threading.Event()

        def writes() -> None:
            for write in (lambda: db.record_auxiliary_usage(sid, "title", input_tokens=3),
                          lambda: db.append_message(sid, "user", "during the move")):
                try:
                    outcomes.append(write())
                except SessionPersistenceError as exc:
                    outcomes.append(exc)
            ended.set()
        threading.Thread(target=writes, daemon=True).start()
        assert ended.wait(20), "a write waited for the whole move-in, past its patience"
        assert not held.release.is_set() and db.upgrading  # both gave up while the copy was still held
        assert [type(o) for o in outcomes] == [SessionPersistenceError] * 2
        assert all(o.code == "session_persistence_failed:locked" and "upgraded" in str(o) for o in outcomes)
        held.release.set()
        db.transcript_write_patience_s = 60.0  # a patient write waits for the move-in, then goes through
        row = db.append_message(sid, "user", "after the move")
        assert not db.upgrading and db.message_count(sid) == db.get_session(sid)["message_count"]
        assert [m["id"] for m in db.get_messages(sid)][-1] == row
    finally:
        held.release.set()
        db.close()


def test_the_copy_stops_giving_way_to_reads_while_a_write_waits_for_it(old_file, in_background, monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 4)  # many steps for this file
    monkeypatch.setattr(recovery, "GIVE_WAY_MAX_S", 600.0)  # a read under way would hold every step
    inside, release = threading.Event(), threading.Event()
    reader = threading.Thread(target=_read_until, args=(old_file, inside, release))
    reader.start()
    db = None
    try:
        assert inside.wait(10)
        db = SessionDB(old_file)
        assert db.upgrading
        finished = threading.Event()
        appended: list[int] = []

        def write() -> None:
            appended.append(db.append_message(db.list_sessions_rich(limit=1)[0]["id"], "user", "moved in"))
            finished.set()
        threading.Thread(target=write, daemon=True).start()
        finished.wait(20)  # a bound for the test only: release below ends a copy that gives way
        assert appended and not release.is_set() and reader.is_alive()  # it went through, the read still on
        assert version_of(old_file) == SCHEMA_VERSION
    finally:
        release.set()
        reader.join(10)
        if db is not None:
            db.close()


def test_a_small_older_file_is_still_upgraded_inside_the_open(old_file):
    assert old_file.stat().st_size < SessionDB.upgrade_in_background_bytes
    with SessionDB(old_file) as db:
        assert not db.upgrading and db.schema_version == SCHEMA_VERSION and db.upgrade_backup is not None


def test_close_during_the_copy_stops_it_and_leaves_the_file_and_no_copy(old_file, in_background, monkeypatch):
    held = HeldCopy(monkeypatch)
    monkeypatch.setattr(SessionDB, "finish_after_close", False)  # no process finishes the move-in for it
    db = SessionDB(old_file)
    assert held.started.wait(10)
    started = time.monotonic()
    db.close()
    assert time.monotonic() - started < 5
    assert db.wait_for_fts_rebuild(10)  # the thread ended
    assert version_of(old_file) == 22
    assert copies(old_file) == [] and not [p for p in old_file.parent.iterdir() if ".partial-" in p.name]
    with pytest.raises(HermesStateError):
        db.create_session("late", "cli")
    monkeypatch.undo()
    with SessionDB(old_file) as again:  # the next open upgrades it, with a copy of its own
        assert again.schema_version == SCHEMA_VERSION and len(copies(old_file)) == 1


def test_a_file_another_process_upgraded_meanwhile_keeps_that_ones_copy_only(old_file, in_background, monkeypatch):
    held = HeldCopy(monkeypatch)
    db = SessionDB(old_file)
    try:
        assert held.started.wait(10)
        other = subprocess.run([sys.executable, "-c", "import sys; from hermes_state import SessionDB; "
                                "SessionDB(sys.argv[1]).close()", str(old_file)],
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
        assert version_of(old_file) == SCHEMA_VERSION and len(copies(old_file)) == 1
        held.release.set()
        assert db.wait_for_fts_rebuild(60) and not db.upgrading
        assert db.upgrade_backup is None and len(copies(old_file)) == 1  # its own copy, of the new file, is gone
        assert version_of(next(old_file.parent.glob("*.pre-v*"))) == 22
        db.create_session("after", "cli")
    finally:
        db.close()


def test_a_stopped_stepped_copy_leaves_no_partial_file(old_file, monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 1)
    stop = threading.Event()
    steps: list[tuple[int, ...]] = []

    class Counting(sqlite3.Connection):
        def backup(self, target, *, pages=-1, progress=None, **kwargs):  # type: ignore[override]
            def seen(*args):
                steps.append(args)
                if len(steps) == 3:
                    stop.set()
                return progress(*args)
            return super().backup(target, pages=pages, progress=seen, **kwargs)
    conn = sqlite3.connect(old_file, isolation_level=None, factory=Counting)
    target = old_file.with_name("copy.db")
    try:
        with pytest.raises(HermesStateError):
            recovery.backup_to(conn, target, stop=stop)
        assert not conn.in_transaction  # its read transaction ended with it
    finally:
        conn.close()
    assert len(steps) == 3 and steps[-1][1] > 0  # stopped between steps, pages still to copy
    assert not target.exists() and not [p for p in old_file.parent.iterdir() if ".partial-" in p.name]


def test_a_failed_copy_refuses_writes_with_a_typed_error_and_reads_go_on(old_file, in_background, monkeypatch):
    held = HeldCopy(monkeypatch, fail=OSError(errno.ENOSPC, "No space left on device"))
    db = SessionDB(old_file)
    try:
        held.release.set()
        assert db.wait_for_fts_rebuild(10) and not db.upgrading
        with pytest.raises(StoreUnavailableError, match="could not be upgraded"):
            db.create_session("s", "cli")
        assert db.list_sessions_rich(limit=5)  # still read as it is
        assert version_of(old_file) == 22 and copies(old_file) == []
    finally:
        db.close()


def test_reads_made_while_the_schema_changes_wait_and_see_the_new_layout(old_file, in_background, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real_migrate = schema.migrate

    def slow_migrate(*args, **kwargs):
        entered.set()
        assert gate.wait(10)
        return real_migrate(*args, **kwargs)
    monkeypatch.setattr(schema, "migrate", slow_migrate)
    db = SessionDB(old_file)
    try:
        assert entered.wait(30)
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(db.get_messages_as_conversation(
            db.list_sessions_rich(limit=1)[0]["id"])))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not got  # waits: the layout is changing under it
        gate.set()
        reader.join(30)
        assert got and all(m["message_uid"] for m in got[0])  # read with the new layout's columns
    finally:
        db.close()


def test_the_knob_takes_a_size_or_none(monkeypatch):
    for bad, error in ((-1, ValueError), ("1", TypeError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="upgrade_in_background_bytes"):
            SessionDB.upgrade_in_background_bytes = bad
    monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", None)
    assert SessionDB.upgrade_in_background_bytes is None


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forks_during_the_copy_never_hang_and_children_cannot_use_the_parents_handle(old_file, in_background,
                                                                                    monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 1)  # many steps: forks land between and during them

    class Slow(sqlite3.Connection):  # each step a little slower, before and after the gate is let go
        def backup(self, target, *, pages=-1, progress=None, **kwargs):  # type: ignore[override]
            def paced(*args):
                time.sleep(0.02)
                progress(*args)
                time.sleep(0.02)
            return super().backup(target, pages=pages, progress=paced, **kwargs)
    real_reader = schema.connect_reader

    def slow_reader(path):
        conn = real_reader(path)
        conn.close()
        slow = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, factory=Slow)
        slow.execute("PRAGMA query_only = ON")
        return slow
    monkeypatch.setattr(schema, "connect_reader", slow_reader)
    db = SessionDB(old_file)
    try:
        codes, during = [], []
        for _ in range(30):
            during.append(db.upgrading)
            pid = os.fork()
            if pid == 0:  # the child: the parent's handle refuses, a handle of its own reads the file
                code = 0
                try:
                    try:
                        db.create_session("child", "cli")
                        code = 3
                    except HermesStateError:
                        pass
                    with SessionDB(old_file, read_only=True) as own:
                        code = code or (0 if own.list_sessions_rich(limit=5) else 4)
                except BaseException:  # noqa: BLE001 - any failure is the child's exit code
                    code = 5
                os._exit(code)
            deadline = time.monotonic() + 30
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes.append(os.waitstatus_to_exitcode(status))
                    break
                assert time.monotonic() < deadline, "a forked child hung"
                time.sleep(0.01)
        assert codes == [0] * 30
        assert sum(during) >= 20, during  # most of them while the copy ran
        assert db.wait_for_fts_rebuild(60) and db.schema_version == SCHEMA_VERSION
        db.create_session("parent", "cli")
    finally:
        db.close()


def test_a_copy_whose_name_was_taken_meanwhile_takes_the_next_one(old_file):
    first, second = old_file.with_name("copy.db"), old_file.with_name("copy-2.db")

    class TakenMeanwhile(sqlite3.Connection):
        def backup(self, target, **kwargs):  # type: ignore[override]
            first.write_bytes(b"another opener's copy")  # appears while this one is written
            return super().backup(target, **kwargs)
    conn = sqlite3.connect(old_file, isolation_level=None, factory=TakenMeanwhile)
    try:
        with pytest.raises(FileExistsError):  # without a next name the copy is refused, as before
            recovery.backup_to(conn, first)
        first.unlink()
        assert recovery.backup_to(conn, first, renamed=lambda: second) == second
    finally:
        conn.close()
    assert first.read_bytes() == b"another opener's copy" and version_of(second) == 22
    assert not [p for p in old_file.parent.iterdir() if ".partial-" in p.name]


def test_the_migrate_command_upgrades_inside_its_open_however_large_the_file(old_file, in_background, capsys):
    from hermes_state_cli import main
    assert main(["--db", str(old_file), "--json", "migrate"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["schema_version"] == SCHEMA_VERSION and version_of(old_file) == SCHEMA_VERSION
    assert done["backup"] and version_of(Path(done["backup"])) == 22


def test_a_cli_write_on_a_large_older_file_waits_for_the_upgrade(old_file, in_background, capsys):
    from hermes_state_cli import main
    assert main(["--db", str(old_file), "--json", "sessions", "list"]) == 0  # a read: read-only, nothing changes
    assert version_of(old_file) == 22 and copies(old_file) == []
    listed = json.loads(capsys.readouterr().out)
    assert main(["--db", str(old_file), "sessions", "delete", listed[0]["id"]]) == 0
    assert version_of(old_file) == SCHEMA_VERSION and len(copies(old_file)) == 1


# --- searches while the upgrade's rebuild runs: hermes-agent's substring index is kept until it ends ---

@pytest.fixture
def rebuilding(old_file, monkeypatch):
    """The upgraded file with its rebuild not started (driven by hand), and scans limited to 3 rows."""
    import hermes_state_search as search
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    monkeypatch.setattr(search, "LIKE_SCAN_ROWS", 3)  # a scan of the rows not rebuilt yet stops early
    db = SessionDB(old_file)
    yield db
    db.close()


def names(path: Path, pattern: str) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB ?",
                                           (pattern,))]
    finally:
        conn.close()


def test_searches_during_the_rebuild_are_complete_through_the_older_substring_index(rebuilding, old_file):
    db = rebuilding
    assert db.fts_rebuild_status()["in_progress"] and names(old_file, "hermes_old_substrings") != []
    during = db.search_messages("socket", limit=100)
    assert during.complete and len(during) > 3  # more than the scan's 3 rows: not a bounded scan
    short = db.search_messages("so", limit=100)  # under 3 characters: the older index cannot answer
    assert not short.complete
    db.rebuild_fts()
    assert names(old_file, "hermes_old_substrings*") == [] and names(old_file, "hermes_retired_fts_*") == []
    after = db.search_messages("socket", limit=100)
    assert after.complete and sorted(h["id"] for h in during) == sorted(h["id"] for h in after)


def test_rows_changed_after_the_upgrade_are_judged_by_their_text_now(rebuilding, old_file):
    db = rebuilding
    hits = [h["id"] for h in db.search_messages("socket", limit=100)]
    gone, changed = hits[0], hits[1]
    with db.transaction() as txn:  # raw SQL, as another program's edits would be
        txn.conn.execute("DELETE FROM messages WHERE id = ?", (gone,))
        txn.conn.execute("UPDATE messages SET content = 'nothing left here' WHERE id = ?", (changed,))
    later = [h["id"] for h in db.search_messages("socket", limit=100)]
    assert gone not in later and changed not in later and sorted(later) == sorted(set(hits) - {gone, changed})
    fresh = db.append_message(db.list_sessions_rich(limit=1)[0]["id"], "user", "a socket written after the upgrade")
    assert fresh in [h["id"] for h in db.search_messages("socket", limit=100)]


def test_a_new_rebuild_does_without_the_older_index_and_the_thread_removes_it(old_file, monkeypatch):
    import hermes_state_fts as fts
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    with SessionDB(old_file) as db:
        more = True
        while more:  # the upgrade's rebuild, to its end (the older index is still there)
            with db.transaction() as txn:
                more = fts.rebuild_step(txn.conn)
        assert names(old_file, "hermes_old_substrings") != []
        with db.transaction() as txn:  # a later full rebuild (as rebuild_fts starts one) ...
            fts.start_rebuild(txn.conn)
        conn = sqlite3.connect(old_file)
        try:  # ... no longer trusts it: rows written since the upgrade are not in it
            assert conn.execute("SELECT COUNT(*) FROM state_meta WHERE key = ?", (fts.OLD_SUBSTRINGS_UPTO,)
                                ).fetchone()[0] == 0
        finally:
            conn.close()
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", True)
    with SessionDB(old_file) as db:  # the background work rebuilds, then moves the older index aside and frees it
        assert db.wait_for_fts_rebuild(60)
    assert names(old_file, "hermes_old_substrings*") == [] and names(old_file, "hermes_retired_fts_*") == []


def test_only_an_index_that_answers_phrases_from_its_own_text_is_kept(tmp_path, monkeypatch):
    import hermes_state_upgrade as upgrade
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("BEGIN")
    for sql in ("CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram', detail='none')",
                "CREATE VIRTUAL TABLE messages_fts USING fts5(content)"):
        name = sql.split()[3]
        conn.execute(sql)
        assert upgrade.keep_old_substrings(conn, name, sql, []) is False  # no positions / not a substring index
    conn.execute("DROP TABLE messages_fts_trigram")
    sql = "CREATE VIRTUAL TABLE messages_fts_trigram USING fts5(content, tokenize='trigram')"
    conn.execute(sql)
    kept: list[str] = []
    assert upgrade.keep_old_substrings(conn, "messages_fts_trigram", sql, kept) is True and kept
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'hermes_old_substrings'").fetchone()[0] == 1
    conn.execute("ROLLBACK")


# --- a stepped copy gives way to reads ----------------------------------------------------------

def _read_until(path: Path, inside: threading.Event, release: threading.Event) -> None:
    """Stay inside a read of a writer of our own on `path` until `release` is set."""
    from hermes_state_writer import Writer
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        with Writer(conn).reading():
            inside.set()
            release.wait(30)
    finally:
        conn.close()


def _copy_in_thread(path: Path, target: Path, finished: list[float]) -> threading.Thread:
    def copy() -> None:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            recovery.backup_to(conn, target, stop=threading.Event())
            finished.append(time.monotonic())
        finally:
            conn.close()
    thread = threading.Thread(target=copy)
    thread.start()
    return thread


def test_a_stepped_copy_waits_between_its_steps_while_another_thread_reads(old_file, monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 4)  # 25 steps for this file
    inside, release = threading.Event(), threading.Event()
    reader = threading.Thread(target=_read_until, args=(old_file, inside, release))
    reader.start()
    assert inside.wait(10)
    finished: list[float] = []
    target = old_file.with_name("copy.db")
    copier = _copy_in_thread(old_file, target, finished)
    try:
        copier.join(0.4)  # unhindered, this copy takes milliseconds
        assert copier.is_alive() and not finished and not target.exists()
    finally:
        released = time.monotonic()
        release.set()
        reader.join(10)
    copier.join(30)
    assert finished and finished[0] > released
    assert version_of(target) == 22 and sqlite3.connect(target).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_read_that_never_ends_only_slows_the_copy_a_bounded_time_a_step(old_file, monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 4)
    monkeypatch.setattr(recovery, "GIVE_WAY_MAX_S", 0.02)
    inside, release = threading.Event(), threading.Event()
    reader = threading.Thread(target=_read_until, args=(old_file, inside, release))
    reader.start()
    try:
        assert inside.wait(10)
        finished: list[float] = []
        copier = _copy_in_thread(old_file, old_file.with_name("copy.db"), finished)
        copier.join(30)
        assert finished and reader.is_alive()  # done while the read still went on
    finally:
        release.set()
        reader.join(10)


def test_the_copys_own_read_does_not_make_it_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "STOPPABLE_STEP_PAGES", 1)
    monkeypatch.setattr(recovery, "GIVE_WAY_MAX_S", 60.0)
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "x" * 20_000)
        done: list[Path] = []
        stop = threading.Event()
        copier = threading.Thread(target=lambda: done.append(db.backup(tmp_path / "copy.db", stop=stop)), daemon=True)
        copier.start()
        copier.join(20)  # the backup runs inside a read of its own thread: waiting for it would take minutes
        stop.set()  # a copy still waiting ends now, not after a minute a step
        copier.join(10)
        assert done and done[0].exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_count_its_parents_reads(old_file, monkeypatch):
    import hermes_state_fork as fork
    from hermes_state_writer import reads_elsewhere
    monkeypatch.setattr(fork, "FORK_WAIT_S", 0.2)  # the fork goes ahead while the read still holds the gate
    inside, release = threading.Event(), threading.Event()
    reader = threading.Thread(target=_read_until, args=(old_file, inside, release))
    reader.start()
    try:
        assert inside.wait(10) and reads_elsewhere()
        pid = os.fork()
        if pid == 0:  # the child: the reading thread was not copied, nor is its read
            os._exit(1 if reads_elsewhere() else 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        reader.join(10)
    assert not reads_elsewhere()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_child_forked_inside_a_read_ends_that_read_cleanly(old_file):
    from hermes_state_writer import Writer, reads_elsewhere
    conn = sqlite3.connect(old_file, isolation_level=None)
    pid = -1
    try:
        with Writer(conn).reading():
            pid = os.fork()
        if pid == 0:
            os._exit(0 if not reads_elsewhere() else 2)
    except BaseException:
        if pid == 0:
            os._exit(3)  # leaving the read failed in the child
        raise
    finally:
        if pid != 0:
            conn.close()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
