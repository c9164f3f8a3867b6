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
    releasing = threading.Event()

    def release() -> None:
        releasing.set()  # before the lock goes: a write that waited for it returns only after this
        rival.execute("ROLLBACK")

    timer = threading.Timer(0.4, release)
    timer.start()
    try:
        db.create_session("after_wait", "cli")
        waited_for_the_rival = releasing.is_set()
    finally:
        timer.join()
    assert waited_for_the_rival
    assert rival.execute("SELECT id FROM sessions WHERE id='after_wait'").fetchone() is not None
    assert not db.in_transaction


def test_write_gives_up_after_patience_with_typed_error_and_warning(db, rival, caplog):
    db.write_patience_s = 0.3  # tune one instance (SPEC R-WRITE-3)
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
    monkeypatch.setattr(SessionDB, "write_patience_s", 0.2)  # after the handle opened
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
        with db.transaction() as txn:
            txn.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('half', 'cli', 1)")
            1 / 0
    assert not db.in_transaction
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0


def test_passive_checkpoint_every_n_writes(db):
    db.close()
    # Opening a current database writes nothing, so this handle's write count starts at zero.
    handle = SessionDB(db.db_path)
    handle.checkpoint_every_n_writes = 5
    handle.checkpoint_in_background = False  # inline, so the trace shows where (tests/test_checkpoints.py: the thread)
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
        with db.transaction() as outer:
            outer.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('outer', 'cli', 1)")
            with db.transaction() as inner:
                inner.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('inner', 'cli', 1)")
            raise RuntimeError("abort both")
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0


# --- the public transaction ----------------------------------------------------------------------------

def test_transaction_commits_then_runs_its_callbacks_with_the_lock_free(db, rival):
    seen: list[tuple] = []

    def after() -> None:
        # After COMMIT: another connection sees the row, and the handle takes a new write at once.
        seen.append(tuple(rival.execute("SELECT id FROM sessions ORDER BY id").fetchall()[0]))
        db.create_session("from_callback", "cli")

    with db.transaction() as txn:
        txn.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('raw', 'cli', 1)")
        db.create_session("api", "cli")  # the handle's own methods join the open transaction
        txn.after_commit(after)
        txn.after_commit(lambda: seen.append(("second",)))
        assert seen == [] and rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    assert seen == [("api",), ("second",)]
    assert [r[0] for r in rival.execute("SELECT id FROM sessions ORDER BY id")] == ["api", "from_callback", "raw"]
    assert not db.in_transaction


def test_a_rolled_back_transaction_drops_its_callbacks(db, rival):
    called: list[int] = []
    with pytest.raises(ValueError, match="planned"):
        with db.transaction() as txn:
            db.create_session("gone", "cli")
            txn.after_commit(lambda: called.append(1))
            raise ValueError("planned")
    assert called == [] and rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    with db.transaction() as txn:  # the next transaction starts with an empty queue
        txn.after_commit(lambda: called.append(2))
    assert called == [2]


def test_nested_transactions_run_callbacks_after_the_outer_commit(db, rival):
    order: list[str] = []
    with db.transaction() as outer:
        with db.transaction() as inner:
            inner.conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('n', 'cli', 1)")
            inner.after_commit(lambda: order.append("inner"))
        order.append("inner block left")  # nothing committed yet: the inner block joined the outer one
        assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
        outer.after_commit(lambda: order.append("outer"))
    assert order == ["inner block left", "inner", "outer"]


def test_after_commit_outside_its_transaction_is_refused(db):
    with db.transaction() as txn:
        pass
    from hermes_state import HermesStateError
    with pytest.raises(HermesStateError, match="after_commit"):
        txn.after_commit(lambda: None)


def test_a_read_only_handle_refuses_a_transaction(db):
    from hermes_state import ReadOnlyError
    with SessionDB(db.db_path, read_only=True) as reader:
        with pytest.raises(ReadOnlyError):
            with reader.transaction():
                pass


def test_a_callback_error_reaches_the_caller_after_the_commit(db, rival):
    with pytest.raises(ZeroDivisionError):
        with db.transaction() as txn:
            db.create_session("kept", "cli")
            txn.after_commit(lambda: 1 / 0)
    assert rival.execute("SELECT id FROM sessions").fetchone()[0] == "kept"
    db.create_session("next", "cli")


def test_transaction_patience_is_the_callers(db, rival):
    rival.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SessionPersistenceError, match="locked"):
            with db.transaction(patience_s=0.05):
                pass
    finally:
        rival.execute("ROLLBACK")


# --- interrupts: KeyboardInterrupt and friends between BEGIN and COMMIT --------------------------------

def _lock_is_free_for_another_thread(db: SessionDB) -> bool:
    done: list[bool] = []

    def other() -> None:
        with db.transaction(patience_s=2.0) as txn:
            txn.conn.execute("SELECT 1")
        done.append(True)
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    return done == [True]


def _assert_usable(db: SessionDB, rival: sqlite3.Connection) -> None:
    assert not db.in_transaction
    rival.execute("BEGIN IMMEDIATE")  # the file's write lock was given back too
    rival.execute("ROLLBACK")
    assert _lock_is_free_for_another_thread(db)
    counted, rows = rival.execute("SELECT message_count, (SELECT COUNT(*) FROM messages) FROM sessions").fetchone()
    assert counted == rows  # all of a write, or nothing of it


def test_keyboard_interrupt_in_a_write_body_rolls_back_and_the_handle_stays_usable(db, rival):
    db.create_session("s", "cli")
    with pytest.raises(KeyboardInterrupt):
        with db.transaction() as txn:
            db.append_message("s", "user", "half")
            txn.conn.execute("UPDATE sessions SET title = 'never' WHERE id = 's'")
            raise KeyboardInterrupt
    _assert_usable(db, rival)
    assert tuple(rival.execute("SELECT title, message_count FROM sessions").fetchone()) == (None, 0)
    db.append_message("s", "user", "next")  # not "cannot start a transaction within a transaction"
    assert rival.execute("SELECT message_count FROM sessions").fetchone()[0] == 1


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_at_any_line_between_begin_and_commit_leaves_the_handle_usable(db, rival, interrupt):
    """Raise `interrupt` at the k-th line of the library's code run after BEGIN IMMEDIATE, for every k."""
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = {os.path.join(root, name) for name in os.listdir(root) if name.startswith("hermes_state")}
    db.create_session("s", "cli")
    k, fired_at = 0, []
    while True:
        k += 1
        state = {"begun": False, "committed": False, "lines": 0, "fired": False}

        def statement(sql: str) -> None:
            state["begun"] = state["begun"] or sql == "BEGIN IMMEDIATE"
            state["committed"] = state["committed"] or (state["begun"] and sql == "COMMIT")

        def line(frame, event, arg):  # noqa: ANN001 - sys.settrace's protocol
            if event == "line" and state["begun"] and not state["committed"]:
                state["lines"] += 1
                if state["lines"] == k:
                    state["fired"] = True
                    raise interrupt
            return line

        def call(frame, event, arg):  # noqa: ANN001
            # The library's code, except the tracer's own callback (SQLite swallows what it raises).
            code = frame.f_code
            return line if code.co_filename in ours and not code.co_qualname.startswith("Writer.tracing") else None

        before = sys.gettrace()
        with db.tracer(statement):
            sys.settrace(call)
            try:
                db.append_message("s", "user", f"message {k}", tool_calls=[{"id": f"c{k}"}])
            except interrupt:
                assert state["fired"]
            finally:
                sys.settrace(before)
        _assert_usable(db, rival)
        if not state["fired"]:
            break
        fired_at.append(k)
    assert len(fired_at) > 20  # the write really ran through many lines of the library between the two
    rows = rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    db.append_message("s", "user", "after all of them")
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == rows + 1


# --- the read connection and snapshots -----------------------------------------------------------------

def _writer_on(path) -> "Writer":  # noqa: F821
    from hermes_state_schema import connect, connect_reader
    from hermes_state_writer import Writer
    return Writer(connect(path), open_reader=lambda: connect_reader(path))


def test_the_read_connection_refuses_writes(db, rival):
    db.create_session("s", "cli")
    w = _writer_on(db.db_path)
    try:
        with w.reading() as conn:
            with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
                conn.execute("DELETE FROM sessions")
        with w.reading(snapshot=True) as conn:
            with pytest.raises(sqlite3.OperationalError):
                conn.execute("UPDATE sessions SET title = 'x'")
    finally:
        w.close()
    assert tuple(rival.execute("SELECT COUNT(*), MAX(title) FROM sessions").fetchone()) == (1, None)


def test_a_snapshot_read_does_not_see_a_concurrent_commit(db, rival):
    db.create_session("s", "cli")
    w = _writer_on(db.db_path)
    count = "SELECT COUNT(*) FROM sessions"
    try:
        with w.reading(snapshot=True) as conn:
            first = conn.execute(count).fetchone()[0]
            rival.execute("INSERT INTO sessions (id, source, started_at) VALUES ('late', 'cli', 1)")
            assert conn.execute(count).fetchone()[0] == first == 1  # one snapshot for the whole block
        with w.reading() as conn:  # without a snapshot each statement sees the latest commit
            a = conn.execute(count).fetchone()[0]
            rival.execute("INSERT INTO sessions (id, source, started_at) VALUES ('later', 'cli', 1)")
            assert (a, conn.execute(count).fetchone()[0]) == (2, 3)
    finally:
        w.close()


def test_snapshot_methods_read_inside_one_transaction(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    with db.tracer() as traced:
        db.export_session("s")
    assert traced[0] == "BEGIN" and traced[-1] == "COMMIT"
    with db.tracer() as traced:
        db.get_session("s")
    assert "BEGIN" not in traced
