"""Where the PASSIVE checkpoint every N writes runs.

On a SQLite with the WAL-reset bug (every Python on these machines: 3.40.1) a process never gets a
second checkpointing connection of the library's own: the checkpoint runs inside the write, on the
writing connection, and the linked version is reported once. On a fixed build it runs on a thread
of the handle's own: the write that makes it due does not wait for it, nothing is lost, the log
stays bounded, and close() and a dropped handle end the thread. Those tests pretend a fixed build
(`thread_allowed`), since none is linked here.
"""
from __future__ import annotations

import functools
import gc
import os
import sqlite3
import struct
import threading
import time
from pathlib import Path

import logging

import pytest

import hermes_state_writer as writer
from hermes_state import SessionDB
from hermes_state_common import has_wal_reset_bug
import hermes_state_schema as schema
from hermes_state_writer import Checkpointer, Writer

THREAD = "hermes-state-checkpoint"


def wal_index(path: Path) -> tuple[int, int]:
    """(frames in the log, frames copied into the database), read from the -shm file's header.

    The first 48 bytes are the log's header (its frame count at offset 16), repeated once; the
    checkpoint's record follows at offset 96, starting with the frames it copied. Native byte order.
    """
    head = Path(f"{path}-shm").read_bytes()[:100]
    return struct.unpack_from("=I", head, 16)[0], struct.unpack_from("=I", head, 96)[0]


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD]


@pytest.fixture
def thread_allowed(monkeypatch):
    """Pretend the linked SQLite is free of the WAL-reset bug, so handles opened now get the thread."""
    monkeypatch.setattr(writer, "SECOND_CHECKPOINTER", True)


@pytest.fixture
def fresh(db, thread_allowed):
    """A new handle on the db fixture's file, whose write count starts at zero (and a checkpoint thread)."""
    db.close()
    handle = SessionDB(db.db_path)
    yield handle
    handle.close()


@pytest.mark.parametrize("version, affected", [
    ((3, 6, 23), False), ((3, 7, 0), True), ((3, 40, 1), True), ((3, 44, 5), True), ((3, 44, 6), False),
    ((3, 45, 0), True), ((3, 50, 6), True), ((3, 50, 7), False), ((3, 51, 1), True), ((3, 51, 2), True),
    ((3, 51, 3), False), ((3, 53, 0), False)])
def test_the_wal_reset_range_and_its_backports(version, affected):
    assert has_wal_reset_bug(version) is affected


def test_an_affected_build_checkpoints_on_the_writing_connection_only(db, monkeypatch):
    monkeypatch.setattr(writer, "SECOND_CHECKPOINTER", not has_wal_reset_bug((3, 40, 1)))  # as on this machine
    db.close()
    handle = SessionDB(db.db_path)
    try:
        handle.checkpoint_every_n_writes = 5
        before = len(checkpoint_threads())
        with handle.tracer() as traced:
            for i in range(5):
                handle.create_session(f"s{i}", "cli")
        # The checkpoint background=True asks for runs inside the 5th write, on its own connection.
        assert handle.checkpoint_in_background is True
        assert traced[-2:] == ["COMMIT", "PRAGMA wal_checkpoint(PASSIVE)"]
        frames, copied = wal_index(handle.db_path)
        assert copied == frames > 0
        assert len(checkpoint_threads()) == before
    finally:
        handle.close()


def test_an_affected_build_is_reported_once_with_the_remedy(db, monkeypatch, caplog):
    monkeypatch.setattr(writer, "WAL_RESET_BUG", True)
    monkeypatch.setattr(writer, "WAL_RESET_SAID", threading.Event())
    db.close()
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        for _ in range(3):
            SessionDB(db.db_path).close()
        SessionDB(db.db_path, read_only=True).close()
    said = [r.getMessage() for r in caplog.records if "WAL-reset" in r.getMessage()]
    assert len(said) == 1
    assert sqlite3.sqlite_version in said[0] and "3.51.3" in said[0] and "pysqlite3-binary" in said[0]


def test_a_fixed_build_says_nothing(db, monkeypatch, caplog):
    monkeypatch.setattr(writer, "WAL_RESET_BUG", False)
    monkeypatch.setattr(writer, "WAL_RESET_SAID", threading.Event())
    db.close()
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        SessionDB(db.db_path).close()
    assert not [r for r in caplog.records if "WAL-reset" in r.getMessage()]
    assert not (db.db_path.parent / "logs").exists()


_AFFECTED_OPEN = """
import sys
import hermes_state_writer
hermes_state_writer.WAL_RESET_BUG = True  # as on a Python linking an affected SQLite
from hermes_state import SessionDB
SessionDB(sys.argv[1]).close()
"""


def test_an_affected_build_prints_nothing_and_notes_it_once_in_the_homes_error_log(tmp_path):
    import subprocess
    import sys
    home = tmp_path / "home"
    home.mkdir()
    for _ in range(2):  # two processes: once per home, not once per process
        done = subprocess.run([sys.executable, "-c", _AFFECTED_OPEN, str(home / "state.db")],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "HERMES_HOME": str(home)})
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # no logging configured: a library prints nothing of its own
    log = home / "logs" / "errors.log"
    assert log.read_text().count("WAL-reset bug") == 1 and "3.51.3" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", _AFFECTED_OPEN, str(elsewhere / "notes.db")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HERMES_HOME": str(home)})
    assert done.returncode == 0 and done.stderr == ""
    assert sorted(p.name for p in elsewhere.iterdir() if not p.name.startswith("notes.db")) == []  # no logs folder


def test_the_due_checkpoint_runs_on_the_thread_not_in_the_write(fresh):
    fresh.checkpoint_every_n_writes = 5
    with fresh.tracer() as traced:
        for i in range(5):
            fresh.create_session(f"s{i}", "cli")
        # The 5th commit asked for it; the thread copies the log while the handle's own
        # connections run no checkpoint at all.
        assert wait_until(lambda: wal_index(fresh.db_path)[1] > 0)
    frames, copied = wal_index(fresh.db_path)
    assert copied == frames
    assert not [s for s in traced if "wal_checkpoint" in s]
    assert len(checkpoint_threads()) >= 1


def test_no_thread_before_a_checkpoint_is_due_nor_for_a_read_only_handle(fresh):
    before = len(checkpoint_threads())
    for i in range(3):
        fresh.create_session(f"s{i}", "cli")  # 3 of 50 writes: nothing due yet
    reader = SessionDB(fresh.db_path, read_only=True)
    try:
        assert reader.get_session("s1") is not None
        assert len(checkpoint_threads()) == before
    finally:
        reader.close()


def test_inline_checkpoints_when_asked(fresh):
    fresh.checkpoint_every_n_writes = 5
    fresh.checkpoint_in_background = False
    before = len(checkpoint_threads())
    with fresh.tracer() as traced:
        for i in range(5):
            fresh.create_session(f"s{i}", "cli")
    assert traced[-1] == "PRAGMA wal_checkpoint(PASSIVE)"  # inside the 5th write, after its COMMIT
    assert traced[-2] == "COMMIT"
    assert len(checkpoint_threads()) == before


def test_close_waits_for_the_thread_and_removes_the_log(fresh):
    fresh.checkpoint_every_n_writes = 2
    for i in range(20):
        fresh.create_session(f"s{i}", "cli")
    threads = checkpoint_threads()
    assert threads
    fresh.close()
    for thread in threads:
        assert not thread.is_alive()
    # Every connection is closed, so SQLite folded the log into the file and removed it.
    assert not Path(f"{fresh.db_path}-wal").exists()
    conn = sqlite3.connect(fresh.db_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 20
    finally:
        conn.close()


def test_an_idle_thread_ends_and_the_next_checkpoint_starts_another(fresh, monkeypatch):
    monkeypatch.setattr(Checkpointer, "IDLE_S", 0.05)
    fresh.checkpoint_every_n_writes = 2
    for i in range(2):
        fresh.create_session(f"s{i}", "cli")
    assert wait_until(lambda: wal_index(fresh.db_path)[1] > 0)
    first = checkpoint_threads()
    # No checkpoint to run for longer than IDLE_S: the thread ends (a fork now copies none).
    assert wait_until(lambda: not any(t.is_alive() for t in first))
    for i in range(2, 4):
        fresh.create_session(f"s{i}", "cli")  # the first of these starts the log over (all of it was copied)

    def copied_again() -> bool:
        frames, copied = wal_index(fresh.db_path)
        return frames > 0 and copied == frames
    assert wait_until(copied_again)  # a new thread ran the next checkpoint: nothing else copies 2 writes' frames
    assert fresh.get_session("s3") is not None


def test_a_dropped_handle_ends_its_thread(db, thread_allowed):
    db.close()
    handle = SessionDB(db.db_path)
    handle.checkpoint_every_n_writes = 2
    for i in range(4):
        handle.create_session(f"s{i}", "cli")
    assert wait_until(lambda: len(checkpoint_threads()) >= 1)
    mine = checkpoint_threads()
    del handle
    gc.collect()
    assert wait_until(lambda: not any(t.is_alive() for t in mine))


# A 3 KB append writes 9 frames on average and 18 at most (measured over 600: the message row, its
# indexes and both full-text indexes, now and then a merge step); the bound allows twice that.
FRAMES_PER_APPEND = 40


def log_bound_bytes(page: int, every: int) -> int:
    """The -wal size docs/scaling.md promises with the thread: the log found too long, plus two intervals of writes."""
    return 32 + (writer.WAL_BEHIND_FRAMES + 2 * every * FRAMES_PER_APPEND) * (page + 24)


def write_on_two_threads(handle, count: int = 300) -> None:
    handle.create_session("a", "cli")
    handle.create_session("b", "cli")
    text = "x" * 3000
    errors: list[BaseException] = []

    def write(sid: str) -> None:
        try:
            for i in range(count):
                handle.append_message(sid, "user", f"{sid} {i} {text}")
        except BaseException as exc:  # reported below; a thread's exception would vanish
            errors.append(exc)
    writers = [threading.Thread(target=write, args=(sid,)) for sid in ("a", "b")]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    assert errors == []


def check_store(handle, rival, count: int = 600) -> None:
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == count
    assert rival.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert len(handle.search_messages("b 299")) >= 1


def test_writers_on_two_threads_lose_nothing_and_the_log_stays_bounded(fresh, raw_conn):
    # A checkpoint due every 5th write: the thread is often still at work when the next one is
    # due, and then that write copies the rest of the log itself. Nothing is left to luck: the
    # -wal never grows past the bound, whatever the disk's speed (the file keeps its largest
    # size, so its size now is the log's longest).
    fresh.checkpoint_every_n_writes = 5
    write_on_two_threads(fresh)
    rival = raw_conn()
    page = rival.execute("PRAGMA page_size").fetchone()[0]
    assert os.path.getsize(f"{fresh.db_path}-wal") <= log_bound_bytes(page, 5)
    check_store(fresh, rival)


@pytest.fixture
def bare_writer(tmp_path, thread_allowed):
    """A writer on a new WAL file with a checkpoint thread, its due checkpoint every 5th write as a handle has it."""
    path = tmp_path / "bare.db"
    made = Writer(schema.connect(path), open_reader=functools.partial(schema.connect, path))
    made.conn.execute("PRAGMA journal_mode = WAL")
    made.conn.execute("CREATE TABLE t (x BLOB)")
    made.after_commit.append(lambda _conn, writes: made.checkpoint() if writes % 5 == 0 else None)
    yield made
    made.close()


def write_blobs(made: Writer, count: int) -> None:
    for _ in range(count):  # 16 KB each: a leaf and two overflow pages, 3 frames a write
        with made.transaction(5.0) as conn:
            conn.execute("INSERT INTO t VALUES (zeroblob(16000))")


def test_a_thread_that_never_keeps_up_leaves_the_log_to_the_writes(bare_writer, monkeypatch):
    # The worst case, made certain: the thread never runs a checkpoint, and SQLite's automatic
    # one (which gives up whenever it meets the thread's) never runs either. The log would hold
    # every frame of the 1,000 writes (about 3,000); instead each due checkpoint that finds the
    # thread still owing the last one runs in the write, and the log starts over.
    monkeypatch.setattr(Checkpointer, "run", lambda self: None)
    bare_writer.conn.execute("PRAGMA wal_autocheckpoint = 0")
    write_blobs(bare_writer, 1000)
    page = bare_writer.conn.execute("PRAGMA page_size").fetchone()[0]
    # The bound docs/scaling.md gives, with 3 frames a write (the blobs) in place of an append's.
    assert os.path.getsize(f"{bare_writer.conn.execute('PRAGMA database_list').fetchone()[2]}-wal") \
        <= 32 + (writer.WAL_BEHIND_FRAMES + 2 * 5 * 3) * (page + 24)
    assert bare_writer.conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1000


def test_a_long_log_found_by_the_thread_is_finished_in_the_next_due_write(bare_writer):
    checkpoints = bare_writer.checkpoints
    assert checkpoints is not None
    checkpoints.log_frames = writer.WAL_BEHIND_FRAMES  # what the thread's last checkpoint reported
    with bare_writer.tracing() as traced:
        write_blobs(bare_writer, 5)
    # The due checkpoint ran on the writing connection, after the 5th COMMIT, and copied every
    # frame: the thread is trusted again.
    assert traced[-2:] == ["COMMIT", "PRAGMA wal_checkpoint(PASSIVE)"]
    assert checkpoints.log_frames == 0 and not checkpoints.behind()


def test_a_write_copying_the_log_waits_for_the_threads_checkpoint(bare_writer):
    # SQLite refuses a second checkpoint while one runs rather than waiting: the write must
    # wait for the thread's, or it would copy nothing and the log would go on growing.
    checkpoints = bare_writer.checkpoints
    assert checkpoints is not None
    write_blobs(bare_writer, 4)
    released = threading.Event()
    seen: list[bool] = []

    def trace(sql: str) -> None:
        if "wal_checkpoint" in sql:
            seen.append(released.is_set())
    checkpoints.running.acquire()  # a checkpoint of the thread's under way
    try:
        with bare_writer.tracing(trace):
            due = threading.Thread(target=write_blobs, args=(bare_writer, 1))
            due.start()
            time.sleep(0.2)  # the due write reaches the checkpoint and waits (a slower one proves nothing, never fails)
            released.set()
            checkpoints.running.release()
            due.join()
    finally:
        if not released.is_set():
            checkpoints.running.release()
    assert seen == [True]
    assert bare_writer.conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 5
