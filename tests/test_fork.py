"""A process may fork at any moment: the child opens a handle of its own and works.

The library's own threads (the checkpoint thread on a fixed SQLite, the background index rebuild)
never hold SQLite or Python locks across fork(): fork waits for the unit of work under way (a
checkpoint, a rebuild chunk) and none starts until it returns. A handle the child inherited from
its parent refuses every call with a sentence saying to open a new one: a SQLite connection cannot
cross a fork.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import sys
import threading
import time
import traceback
import warnings
from contextlib import closing
from pathlib import Path

import pytest

import hermes_state_writer as writer
from hermes_state import HermesStateError, SessionDB

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only"),
              pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")]

CHILD_DEADLINE_S = 30.0  # a child that has not finished by then is stuck for good


def run_child(body) -> int | str:
    """Fork; run `body()` in the child and exit 0 (1 on an error); return the exit status, or "hung"."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            body()
            code = 0
        except BaseException:  # noqa: BLE001 - reported on stderr, the status says it failed
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + CHILD_DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def child_writes(path: Path, sid: str):
    def body() -> None:
        with SessionDB(path) as own:
            own.append_message(sid, "user", f"from child {os.getpid()}")
            assert own.search_messages("child", session_id=sid)
    return body


def fork_many(path: Path, sid: str, forks: int) -> list[int | str]:
    with warnings.catch_warnings():  # Python 3.12+ warns about fork() in a threaded process: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        return [run_child(child_writes(path, sid)) for _ in range(forks)]


def test_forks_while_the_checkpoint_thread_works_never_hang_the_child(db, monkeypatch):
    # A checkpoint after every write, on the thread (a fixed SQLite's path: none is linked here),
    # while the parent keeps writing: the thread is inside SQLite, holding the file's own mutexes,
    # most of the time. Without the fork gate some children wait on one of those for ever.
    monkeypatch.setattr(writer, "SECOND_CHECKPOINTER", True)
    db.close()
    parent = SessionDB(db.db_path)
    parent.checkpoint_every_n_writes = 1
    parent.create_session("p", "cli")
    parent.create_session("c", "cli")
    stop, errors = threading.Event(), []

    def keep_writing() -> None:
        try:
            n = 0
            while not stop.is_set():
                parent.append_message("p", "user", f"parent {n} " + "x" * 2000)
                n += 1
                time.sleep(0.001)  # lets a child's write in: the parent would win every race for the lock
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    busy = threading.Thread(target=keep_writing)
    busy.start()
    try:
        statuses = fork_many(parent.db_path, "c", 80)
    finally:
        stop.set()
        busy.join()
    assert errors == []
    assert statuses == [0] * len(statuses)
    assert parent.message_count("c") == len(statuses)
    parent.close()


def test_forks_during_a_background_rebuild_never_hang_the_child(db):
    db.create_session("r", "cli")
    for i in range(400):
        db.append_message("r", "user", f"rebuild me {i} " + "y" * 500)
    with db.transaction() as txn:  # every row left to a rebuild, as after an upgrade
        import hermes_state_fts as fts
        fts.start_rebuild(txn.conn)
    db.close()
    SessionDB.fts_rebuild_chunk_rows = 3  # many short chunks: the thread is inside SQLite most of the time
    try:
        handle = SessionDB(db.db_path)
    finally:
        del SessionDB.fts_rebuild_chunk_rows
    try:
        handle.create_session("c", "cli")
        assert any(t.name == "hermes-state-fts" for t in threading.enumerate())  # the rebuild runs meanwhile
        statuses = fork_many(handle.db_path, "c", 40)
        assert statuses == [0] * len(statuses)
        assert handle.wait_for_fts_rebuild(60)
        assert len(handle.search_messages("rebuild", limit=1000)) == 400
        assert handle.message_count("c") == len(statuses)
    finally:
        handle.close()


def test_an_inherited_handle_refuses_every_call_and_the_child_opens_its_own(db):
    db.create_session("s", "cli")
    shared = SessionDB.shared(db.db_path)

    def body() -> None:
        for call in (lambda: db.get_session("s"), lambda: db.append_message("s", "user", "x"),
                     lambda: shared.search_messages("x")):
            try:
                call()
            except HermesStateError as exc:
                assert "before os.fork()" in str(exc) and "open a new SessionDB" in str(exc)
            else:
                raise AssertionError("an inherited handle answered")
        assert db.closed
        db.close()  # harmless, and touches no connection of the parent's
        fresh = SessionDB.shared(db.db_path)  # the parent's registry is not the child's
        assert fresh is not shared and not fresh.closed
        fresh.append_message("s", "user", "from the child")
        fresh.release()
    try:
        assert run_child(body) == 0
        # The parent's handles were never touched by the child: they keep working.
        assert [m["content"] for m in db.get_messages("s")] == ["from the child"]
        db.append_message("s", "user", "from the parent")
        assert shared.message_count("s") == 2
    finally:
        shared.release()


def test_a_forked_child_s_connections_keep_state_of_their_own(db):
    # The child's copy of the parent's connection carries the parent's state, unused; the child's
    # own handle starts with none, indexes what it queued when it closes, and the parent's count
    # of its own queue is untouched by whatever the child did.
    import hermes_state_fts as fts
    db.create_session("s", "cli")
    db.append_message("s", "user", "queued by the parent")
    with db.transaction() as txn:
        inherited = txn.conn
    assert inherited.fts_queued == 1

    def body() -> None:
        with SessionDB(db.db_path) as own:
            with own.transaction() as txn:
                mine = txn.conn
            assert mine is not inherited and mine.fts_queued == 0
            own.append_message("s", "user", "queued by the child")
            assert mine.fts_queued == 1 and inherited.fts_queued == 1
        with closing(sqlite3.connect(db.db_path)) as bare:
            assert bare.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0] == 0

    assert run_child(body) == 0
    assert inherited.fts_queued == 1
    assert len(db.search_messages("queued")) == 2
