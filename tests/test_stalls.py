"""Nothing waits on another process's write lock unless it must write: opens, first reads, closes.

Also: a failure after a COMMIT never turns the committed write into an error, and the timing knobs
refuse a bad value when it is set. The rival is a real second process holding `BEGIN IMMEDIATE`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

import hermes_state_fts as fts
import hermes_state_writer as writer_mod
from hermes_state import SessionDB

HOLD_S = 8.0  # how long the rival keeps the lock: far longer than anything below may take


@contextmanager
def rival_holding_the_lock(path: Path, seconds: float = HOLD_S) -> Iterator[subprocess.Popen]:
    """Run another process that holds the file's write lock for `seconds` (or until the block ends)."""
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(float(sys.argv[2]))")
    rival = subprocess.Popen([sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert rival.stdout is not None and rival.stdout.readline().strip() == "held"
        yield rival
    finally:
        rival.kill()
        rival.wait()


def queue_rows_in_both_queues(path: Path) -> tuple[int, int]:
    """Leave one row in the writer's queue (a handle killed before it closed) and one in the CJK queue."""
    code = ("import os, sys; from hermes_state import SessionDB; db = SessionDB(sys.argv[1]); "
            "db.create_session('s', 'cli'); print(db.append_message('s', 'user', 'left queued quebec'), flush=True); "
            "os._exit(0)")
    child = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                           cwd=Path(__file__).resolve().parents[1])
    queued = int(child.stdout.strip())
    shell = sqlite3.connect(path, isolation_level=None)  # another program: its triggers queue non-ASCII rows
    try:
        cjk = shell.execute("INSERT INTO messages (session_id, role, content, timestamp, active) "
                            "VALUES ('s', 'user', 'ロメオ 🚀', 1.0, 1)").lastrowid
        assert shell.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 1
        assert shell.execute(f"SELECT COUNT(*) FROM {fts.CJK_PENDING}").fetchone()[0] == 1
    finally:
        shell.close()
    return queued, cjk


def test_an_open_and_its_first_search_do_not_wait_for_a_rival_s_lock_whatever_the_queues_hold(
        hermes_home, monkeypatch):
    path = hermes_home / "state.db"
    queued, cjk = queue_rows_in_both_queues(path)
    monkeypatch.setattr(SessionDB, "write_patience_s", 2.0)  # an open that waited would fail "…:locked"
    with rival_holding_the_lock(path):
        started = time.monotonic()
        db = SessionDB(path)
        try:
            assert [h["id"] for h in db.search_messages("quebec")] == [queued]  # complete meanwhile
            assert [h["id"] for h in db.search_messages("ロメオ")] == [cjk]
            assert time.monotonic() - started < HOLD_S / 2
        finally:
            db.close()
        assert time.monotonic() - started < HOLD_S / 2  # the close did not wait for the lock either
    with SessionDB(path) as db:  # once the lock is free, the leftovers are indexed off the open path
        assert db.wait_for_fts_rebuild(30)
        assert db.fts_rebuild_status()["cjk_pending"] == 0
    shell = sqlite3.connect(path)
    try:
        assert shell.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 0
    finally:
        shell.close()


def test_a_close_does_not_wait_for_background_work_stuck_behind_a_rival(hermes_home):
    path = hermes_home / "state.db"
    queue_rows_in_both_queues(path)
    with rival_holding_the_lock(path):
        db = SessionDB(path)  # its background work starts and waits for the lock the rival holds
        time.sleep(0.3)
        started = time.monotonic()
        db.close()
        assert time.monotonic() - started < HOLD_S / 2  # it let go of the work rather than wait


def test_searches_and_closes_with_queued_rows_warn_about_no_lock_holder(db, caplog):
    db.create_session("s", "cli")
    row = db.append_message("s", "user", "sierra queued")
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        with rival_holding_the_lock(db.db_path):
            assert [h["id"] for h in db.search_messages("sierra")] == [row]
            db.close()  # its one try to index the queue finds the file held: put off, quietly
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    assert any("put off" in r.getMessage() for r in caplog.records)
    with SessionDB(db.db_path) as again:  # the row stays queued and found, and is indexed later
        assert [h["id"] for h in again.search_messages("sierra")] == [row]


# --- after the COMMIT, and the knobs --------------------------------------------------------------

def test_a_failure_after_the_commit_never_turns_the_append_into_an_error(db, monkeypatch, caplog):
    def broken(*_a, **_k):
        raise sqlite3.OperationalError("disk I/O error")

    db.create_session("s", "cli")
    db.checkpoint_every_n_writes = 1
    db.checkpoint_in_background = False
    monkeypatch.setattr(writer_mod, "passive_checkpoint", broken)
    monkeypatch.setattr(fts, "MERGE_EVERY_N_WRITES", 1)
    monkeypatch.setattr(fts, "upkeep", broken)
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        ids = [db.append_message("s", "user", f"tango {i}") for i in range(5)]  # none raises
    assert db.message_count("s") == 5 and len(set(ids)) == 5  # each stored once
    assert any("the write stands" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()  # the close that follows checkpoints with the real function


@pytest.mark.parametrize("knob, value, error", [
    ("checkpoint_every_n_writes", "10", TypeError), ("optimize_every_n_writes", "10", TypeError),
    ("checkpoint_every_n_writes", -1, ValueError), ("optimize_every_n_writes", 2.5, TypeError),
    ("write_patience_s", "20", TypeError), ("write_patience_s", float("nan"), ValueError),
    ("fts_rebuild_chunk_rows", 0, ValueError), ("fts_rebuild_in_background", 1, TypeError),
    ("_CHECKPOINT_EVERY_N_WRITES", "10", TypeError),  # hermes-agent's name for it
])
def test_a_bad_knob_is_refused_when_set_on_the_class_or_a_handle(db, knob, value, error):
    before = getattr(db, knob)
    with pytest.raises(error, match=knob):
        setattr(db, knob, value)
    with pytest.raises(error, match=knob):
        setattr(SessionDB, knob, value)
    assert getattr(db, knob) == before and getattr(SessionDB, knob) == before


@pytest.mark.parametrize("never", [0, None])
def test_zero_or_none_means_never_for_the_write_cadences(db, never):
    db.checkpoint_every_n_writes = never
    db.optimize_every_n_writes = never
    db.create_session("s", "cli")
    with db.tracer() as traced:
        for i in range(60):
            db.append_message("s", "user", f"uniform {i}")
    assert db.message_count("s") == 60
    assert not [sql for sql in traced if "wal_checkpoint" in sql or "'optimize'" in sql]
    assert os.path.exists(f"{db.db_path}-wal")
