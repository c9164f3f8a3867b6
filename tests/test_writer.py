"""The write path (hermes_state_writer, through the facade): BEGIN IMMEDIATE retries, patience,
rollback, nested transactions and the PASSIVE checkpoint cadence."""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

import pytest

from hermes_state import SessionDB, SessionPersistenceError
from hermes_state_writer import RetryPolicy, retry_on_lock
from hermes_state_errors import classify_persistence_error


def _locked() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database is locked")
    exc.sqlite_errorcode = 5  # type: ignore[attr-defined]
    return exc


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_retry_sleeps_in_fast_then_slow_band_and_never_past_deadline():
    clock = FakeClock()

    def always_locked():
        raise _locked()

    with pytest.raises(SessionPersistenceError) as info:
        retry_on_lock(always_locked, 5.0, RetryPolicy(), clock=clock, sleep=clock.sleep)
    assert info.value.code == "session_persistence_failed:locked"
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    fast = [s for s, t in zip(clock.sleeps, _elapsed(clock.sleeps)) if t < 2.0]
    slow = [s for s, t in zip(clock.sleeps, _elapsed(clock.sleeps)) if t >= 2.0]
    assert fast and all(0.020 <= s <= 0.150 for s in fast)
    assert slow and all(s <= 1.0 for s in slow)
    assert all(0.250 <= s for s in slow[:-1])  # the last sleep may be cut short by the deadline
    assert clock.now == pytest.approx(5.0)


def _elapsed(sleeps: list[float]) -> list[float]:
    out, t = [], 0.0
    for s in sleeps:
        out.append(t)
        t += s
    return out


def test_retry_returns_once_lock_clears_and_other_errors_propagate():
    clock = FakeClock()
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise _locked()
        return "done"

    assert retry_on_lock(flaky, 1.0, RetryPolicy(), clock=clock, sleep=clock.sleep) == "done"
    assert len(calls) == 3

    def broken():
        raise sqlite3.OperationalError("no such table: nope")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_on_lock(broken, 1.0, RetryPolicy(), clock=clock, sleep=clock.sleep)


def test_write_waits_for_rival_then_succeeds(db, rival):
    rival.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.4, lambda: rival.execute("ROLLBACK"))
    timer.start()
    try:
        t0 = time.monotonic()
        db.create_session("after_wait", "cli")
        waited = time.monotonic() - t0
    finally:
        timer.join()
    assert waited >= 0.3
    assert rival.execute("SELECT id FROM sessions WHERE id='after_wait'").fetchone() is not None
    assert not db.in_transaction


def test_write_gives_up_after_patience_with_typed_error_and_warning(db, rival, caplog):
    db._WRITE_PATIENCE_S = 0.3  # tune one instance (SPEC R-WRITE-3)
    rival.execute("BEGIN IMMEDIATE")
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        t0 = time.monotonic()
        with pytest.raises(SessionPersistenceError) as info:
            db.create_session("never", "cli")
        waited = time.monotonic() - t0
    rival.execute("ROLLBACK")
    assert info.value.code == "session_persistence_failed:locked"
    assert classify_persistence_error(info.value) == "locked"
    assert waited < 3.0  # patience, not SQLite's busy timeout, bounds the wait
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    if os.path.exists("/proc/locks"):
        assert f"PID {os.getpid()} (" in warnings[0].getMessage()
        assert "WAL write lock" in warnings[0].getMessage()
    assert not db.in_transaction
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE id='never'").fetchone()[0] == 0
    # the handle stays usable once the rival is gone
    db.create_session("later", "cli")
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE id='later'").fetchone()[0] == 1


def test_patience_is_a_class_attribute_read_at_call_time(db, rival, monkeypatch):
    monkeypatch.setattr(SessionDB, "_WRITE_PATIENCE_S", 0.2)  # after the handle opened
    rival.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(SessionPersistenceError):
            db.create_session("x", "cli")
        waited = time.monotonic() - started
    finally:
        rival.execute("ROLLBACK")
    # The new class value bounds the wait, not the 20 s default the handle was opened with.
    assert 0.2 <= waited < 5.0


def test_failed_body_rolls_back_everything(db, rival):
    with pytest.raises(ZeroDivisionError):
        with db._write() as conn:
            conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('half', 'cli', 1)")
            1 / 0
    assert not db.in_transaction
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0


def test_passive_checkpoint_every_n_writes(db):
    db.close()
    # Opening a current database writes nothing, so this handle's write count starts at zero.
    handle = SessionDB(db.db_path)
    handle._CHECKPOINT_EVERY_N_WRITES = 5
    with handle.tracer() as traced:
        for i in range(12):
            handle.create_session(f"s{i}", "cli")
    commits, checkpoints = 0, []
    for sql in traced:
        if sql == "COMMIT":
            commits += 1
        elif "wal_checkpoint" in sql:
            checkpoints.append((commits, sql))
    # Right after the 5th and 10th commit, and PASSIVE: a checkpoint that waits for readers
    # (FULL, RESTART, TRUNCATE) would stall a write behind another process's long read.
    assert checkpoints == [(5, "PRAGMA wal_checkpoint(PASSIVE)"), (10, "PRAGMA wal_checkpoint(PASSIVE)")]
    with handle.tracer() as at_close:
        handle.close()
    assert [s for s in at_close if "wal_checkpoint" in s] == ["PRAGMA wal_checkpoint(PASSIVE)"]


def test_nested_transaction_joins_the_outer_one(db, rival):
    with pytest.raises(RuntimeError):
        with db._write() as conn:
            conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('outer', 'cli', 1)")
            with db._write() as inner:
                inner.execute("INSERT INTO sessions (id, source, started_at) VALUES ('inner', 'cli', 1)")
            raise RuntimeError("abort both")
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
