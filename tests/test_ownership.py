"""Input ownership on the exception path: input_marker and persist_failed_turn_input."""
from __future__ import annotations

import sqlite3
import threading

import pytest

import hermes_state_routing
from hermes_state import (OwnershipReadError, SessionCompressionInProgressError, SessionDB, SessionNotFoundError,
                          input_marker)
from conftest import refused


@pytest.fixture
def gw(db):
    db.create_session("s", "telegram", session_key="agent:main:telegram:dm:1")
    return db


def marked(rival: sqlite3.Connection, marker: str) -> list[tuple]:
    """(session_id, role, active) of every row whose display_metadata carries the marker."""
    return [tuple(r) for r in rival.execute(
        "SELECT session_id, role, active FROM messages WHERE json_extract(display_metadata, '$.input_marker') = ? "
        "ORDER BY id", (marker,))]


def store(db: SessionDB, session_id: str, marker: str, **fields) -> int:
    return db.append_message(session_id, fields.pop("role", "user"), "hello", display_metadata={"input_marker": marker},
                             **fields)


def test_marker_is_stable_per_qualified_message_and_fresh_without_a_key():
    base = ("telegram", "default", "dm", "chat-1", None, "42")
    assert input_marker(*base) == input_marker(*base)
    for i in range(6):  # change any one qualifier: another message
        other = list(base)
        other[i] = "x" if base[i] != "x" else "y"
        assert input_marker(*other) != input_marker(*base)
    assert input_marker("telegram", "default", "dm", "chat-1", None, None) != \
        input_marker("telegram", "default", "dm", "chat-1", None, None)   # no key: a fresh marker each turn


def test_appends_once_and_the_marker_never_reaches_providers(gw, rival):
    marker = input_marker("telegram", "default", "dm", "1", None, "42")
    gw.append_message("s", "user", "earlier")
    before = [tuple(r) for r in rival.execute("SELECT * FROM messages ORDER BY id")]
    row_id = gw.persist_failed_turn_input("s", "hello", marker)
    assert isinstance(row_id, int)
    assert gw.persist_failed_turn_input("s", {"role": "user", "content": "hello"}, marker) is None
    assert marked(rival, marker) == [("s", "user", 1)]
    after = [tuple(r) for r in rival.execute("SELECT * FROM messages ORDER BY id")]
    assert after[:len(before)] == before          # past rows are never rewritten
    conversation = gw.get_messages_as_conversation("s")
    assert conversation[-1]["content"] == "hello" and "display_metadata" not in conversation[-1]
    assert "input_marker" not in repr(gw.to_provider_messages(conversation, provider="openrouter"))


def test_found_in_the_forward_target(gw, rival):
    gw.create_session("s2", "telegram", session_key="agent:main:telegram:dm:1")
    gw.set_route("gateway", "agent:main:telegram:dm:1", {"session_id": "s2"})
    store(gw, "s2", "im-fwd")
    assert gw.persist_failed_turn_input("s", "hello", "im-fwd") is None
    assert marked(rival, "im-fwd") == [("s2", "user", 1)]
    # Absent, it goes where the conversation now continues: the forward target.
    gw.persist_failed_turn_input("s", "hello", "im-new")
    assert marked(rival, "im-new") == [("s2", "user", 1)]


def test_found_in_the_compression_successor(gw, rival):
    gw.rotate_session("s", "s-c1", [{"role": "user", "content": "kept"}])
    store(gw, "s-c1", "im-succ")
    assert gw.persist_failed_turn_input("s", "hello", "im-succ") is None
    assert marked(rival, "im-succ") == [("s-c1", "user", 1)]
    gw.persist_failed_turn_input("s", "hello", "im-new")   # the closed parent is never written
    assert marked(rival, "im-new") == [("s-c1", "user", 1)]


def test_found_in_an_ancestor_and_in_the_compression_archive(gw, rival):
    store(gw, "s", "im-anc")
    gw.rotate_session("s", "s-c1", [{"role": "user", "content": "kept"}])
    assert gw.persist_failed_turn_input("s-c1", "hello", "im-anc") is None
    store(gw, "s-c1", "im-arch")
    gw.compress_in_place("s-c1", [{"role": "user", "content": "summary"}])
    assert marked(rival, "im-arch") == [("s-c1", "user", 0)]      # only in the archive now
    assert gw.persist_failed_turn_input("s-c1", "hello", "im-arch") is None
    assert len(marked(rival, "im-anc")) == 1 and len(marked(rival, "im-arch")) == 1


@pytest.mark.parametrize("fields", [{"effect_disposition": "revoked"}, {"observed": True}, {"role": "assistant"}],
                         ids=["revoked", "observed", "other-writer"])
def test_rows_that_do_not_own_the_input(gw, rival, fields):
    store(gw, "s", "im-x", **fields)
    assert isinstance(gw.persist_failed_turn_input("s", "hello", "im-x"), int)
    assert len(marked(rival, "im-x")) == 2


def test_a_failing_ownership_read_appends_nothing(gw, rival, monkeypatch):
    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(hermes_state_routing, "find_input_owner", broken)
    error = refused(rival, OwnershipReadError, gw.persist_failed_turn_input, "s", "hello", "im-fail")
    assert isinstance(error.__cause__, sqlite3.OperationalError) and "nothing was appended" in str(error)
    assert not gw.in_transaction


def test_bad_calls_append_nothing(gw, rival):
    refused(rival, SessionNotFoundError, gw.persist_failed_turn_input, "nope", "hello", "im-1")
    refused(rival, ValueError, gw.persist_failed_turn_input, "s", {"role": "assistant", "content": "x"}, "im-1")
    refused(rival, ValueError, gw.persist_failed_turn_input, "s", "hello", "")
    refused(rival, ValueError, gw.persist_failed_turn_input, "s",
            {"content": "x", "display_metadata": {"input_marker": "im-other"}}, "im-1")


def test_concurrent_writers_for_one_marker_append_exactly_once(gw, rival):
    handles = [SessionDB(gw.db_path) for _ in range(2)]
    try:
        for round_ in range(5):
            marker = f"im-race-{round_}"
            barrier = threading.Barrier(2)
            results: list = []

            def write(db: SessionDB) -> None:
                barrier.wait()
                results.append(db.persist_failed_turn_input("s", "hello", marker))

            threads = [threading.Thread(target=write, args=(h,)) for h in handles]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert len(results) == 2 and results.count(None) == 1   # one appended, one found it
            assert marked(rival, marker) == [("s", "user", 1)]
    finally:
        for h in handles:
            h.close()


def test_the_ownership_read_touches_no_history(gw, rival):
    # A long history and other marked inputs: the lookup must still go straight to the marker.
    for i in range(50):
        store(gw, "s", f"im-old-{i}")
        gw.append_message("s", "assistant", "x" * 2000)
    with gw.tracer() as statements:
        gw.persist_failed_turn_input("s", "hello", "im-new")
    on_messages = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "FROM messages" in s]
    assert on_messages, statements
    for sql in on_messages:
        plan = " | ".join(r[3] for r in rival.execute("EXPLAIN QUERY PLAN " + sql))
        assert "SCAN messages" not in plan and "idx_messages_input_marker" in plan, plan


def test_waits_out_a_compression_of_the_target(gw, rival):
    other = SessionDB(gw.db_path)
    try:
        holder = other.acquire_compression_lock("s")
        gw.compression_wait_s = 0.2
        refused(rival, SessionCompressionInProgressError, gw.persist_failed_turn_input, "s", "hi", "im-c")
        gw.compression_wait_s = 10.0
        releaser = threading.Timer(0.3, other.release_compression_lock, args=("s", holder))
        releaser.start()
        assert isinstance(gw.persist_failed_turn_input("s", "hi", "im-c"), int)   # appended once it finished
        releaser.join()
        assert marked(rival, "im-c") == [("s", "user", 1)]
    finally:
        other.close()
