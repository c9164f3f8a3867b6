"""Where the PASSIVE checkpoint every N writes runs.

On a SQLite with the WAL-reset bug (every Python on these machines: 3.40.1) a process never gets a
second checkpointing connection of the library's own: the checkpoint runs inside the write, on the
writing connection, and the linked version is reported once. On a fixed build it runs on a thread
of the handle's own: the write that makes it due does not wait for it, nothing is lost, the log
stays bounded, and close() and a dropped handle end the thread. Those tests pretend a fixed build
(`thread_allowed`), since none is linked here.
"""
from __future__ import annotations

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
from hermes_state_writer import Checkpointer

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
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
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
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        SessionDB(db.db_path).close()
    assert not [r for r in caplog.records if "WAL-reset" in r.getMessage()]


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


def test_writers_on_two_threads_lose_nothing_and_the_log_stays_bounded(fresh, raw_conn):
    # A checkpoint due every 5th write: the thread is often asked again while it runs, and the
    # writers never wait for it. While writes keep coming, SQLite's own checkpoint (at 1,000
    # frames, in the COMMIT that crosses it) copies what the thread left and the log starts over.
    fresh.checkpoint_every_n_writes = 5
    fresh.create_session("a", "cli")
    fresh.create_session("b", "cli")
    text = "x" * 3000
    errors: list[BaseException] = []

    def write(sid: str) -> None:
        try:
            for i in range(300):
                fresh.append_message(sid, "user", f"{sid} {i} {text}")
        except BaseException as exc:  # reported below; a thread's exception would vanish
            errors.append(exc)
    writers = [threading.Thread(target=write, args=(sid,)) for sid in ("a", "b")]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    assert errors == []
    rival = raw_conn()
    page = rival.execute("PRAGMA page_size").fetchone()[0]
    # Thousands of frames were written; the log never held much more than SQLite's threshold.
    assert os.path.getsize(f"{fresh.db_path}-wal") < 3000 * (page + 24)
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 600
    assert rival.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert len(fresh.search_messages("b 299")) >= 1
