"""Transcript writes through the facade honour compression (R-COMP-3, issue 5 wiring).

append_message, replace_messages, merge_messages and clear_messages wait up to
`SessionDB.compression_wait_s` while another holder compresses the session, then raise
SessionCompressionInProgressError; a session compression closed refuses them with
SessionClosedByCompressionError naming its live continuation. Checked from `rival`.
"""
from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time

import pytest

from hermes_state import SessionClosedByCompressionError, SessionCompressionInProgressError
from hermes_state_lockowners import own_pidns

OTHER = f"pid={os.getpid()} host={socket.gethostname()} token=someone-else"



def transcript(rival, sid: str) -> list[tuple]:
    return [tuple(r) for r in rival.execute("SELECT id, role, content, active FROM messages WHERE session_id = ? "
                                            "ORDER BY id", (sid,))]


@pytest.fixture
def quick(db):
    """The handle with a short compression wait, so giving up is quick."""
    db.compression_wait_s = 0.3
    return db


def two_users(db, sid: str = "s") -> list[int]:
    db.create_session(sid, "cli")
    return [db.append_message(sid, "user", "a"), db.append_message(sid, "user", "b")]


WRITES = {
    "append_message": lambda db, ids: db.append_message("s", "user", "c"),
    "replace_messages": lambda db, ids: db.replace_messages("s", [{"role": "user", "content": "new"}]),
    "merge_messages": lambda db, ids: db.merge_messages("s", ids),
    "clear_messages": lambda db, ids: db.clear_messages("s"),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_transcript_write_waits_then_raises_in_progress(quick, rival, write, plant_lock):
    ids = two_users(quick)
    before = transcript(rival, "s")
    plant_lock("s", OTHER)
    started = time.monotonic()
    with pytest.raises(SessionCompressionInProgressError):
        WRITES[write](quick, ids)
    waited = time.monotonic() - started
    # It gave the holder the handle's whole wait (not the 5 s default) before giving up.
    assert quick.compression_wait_s <= waited < 3.0
    assert transcript(rival, "s") == before


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_transcript_write_to_a_rotated_session_names_its_continuation(db, rival, write):
    ids = two_users(db)
    db.rotate_session("s", "s2", [])
    db.rotate_session("s2", "s3", [])
    before = transcript(rival, "s")
    with pytest.raises(SessionClosedByCompressionError) as info:
        WRITES[write](db, ids)
    assert info.value.successor_id == "s3"
    assert transcript(rival, "s") == before


def test_the_write_goes_through_once_the_holder_releases(db, rival, plant_lock):
    two_users(db)
    plant_lock("s", OTHER)
    # The holder (another process, here the rival connection) finishes while the write waits.
    releasing = threading.Event()

    def release() -> None:
        releasing.set()  # before the row goes: a write that waited for it returns only after this
        rival.execute("DELETE FROM compression_locks WHERE session_id = 's'")

    releaser = threading.Timer(0.3, release)
    releaser.start()
    try:
        db.append_message("s", "user", "after the compression")
        waited_for_the_release = releasing.is_set()
    finally:
        releaser.join()
    assert waited_for_the_release  # neither failing at once nor writing past the holder's lock
    assert transcript(rival, "s")[-1][2] == "after the compression"


@pytest.mark.parametrize("holder", [
    pytest.param(OTHER, id="expired"),
    pytest.param("dead", id="dead-holder"),
])
def test_expired_or_dead_locks_do_not_block_writes(quick, rival, holder, plant_lock):
    two_users(quick)
    if holder == "dead":
        proc = multiprocessing.get_context("spawn").Process(target=int)
        proc.start()
        proc.join(60)
        plant_lock("s", f"pid={proc.pid} host={socket.gethostname()} pidns={own_pidns()} token=gone")
    else:
        plant_lock("s", holder, expires_in_s=-1)
    quick.append_message("s", "user", "c")
    assert [r[2] for r in transcript(rival, "s")] == ["a", "b", "c"]


def test_other_sessions_are_not_held_up(quick, rival, plant_lock):
    two_users(quick, "s")
    two_users(quick, "t")
    plant_lock("s", OTHER)
    quick.append_message("t", "user", "c")
    assert [r[2] for r in transcript(rival, "t")] == ["a", "b", "c"]
