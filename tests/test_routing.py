"""Routing, the delivery outbox and async delegations (hermes_state_routing)."""
from __future__ import annotations

import sqlite3

import pytest

import hermes_state_routing as routing
from hermes_state import (LedgerStateError, ReadOnlyError, SessionDB, SessionNotFoundError, SessionPersistenceError,
                          StaleEpochError)
from conftest import refused


@pytest.fixture
def gw(db):
    db.create_session("s", "telegram", session_key="agent:main:telegram:dm:1")
    db.create_session("t", "telegram")
    return db


def outbox_row(rival: sqlite3.Connection, obligation_id: int) -> dict:
    return dict(rival.execute("SELECT * FROM delivery_obligations WHERE id = ?", (obligation_id,)).fetchone())


# --- the delivery outbox --------------------------------------------------------------------------

def test_outbox_is_created_on_first_use_not_at_open(gw, rival):
    def has_outbox() -> bool:
        return rival.execute("SELECT 1 FROM sqlite_master WHERE name = 'delivery_obligations'").fetchone() is not None

    assert gw.list_owed() == [] and gw.get_delivery(1) is None
    assert not has_outbox()                      # reads never create it
    gw.close()
    SessionDB(gw.db_path).close()
    assert not has_outbox()                      # nor does opening
    with SessionDB(gw.db_path) as db:
        db.owe_delivery("s", {"text": "hi"})
    assert has_outbox()


def test_owe_is_idempotent_by_key(gw, rival):
    first = gw.owe_delivery("s", {"text": "hi"}, platform="telegram", chat_id="1", thread_id="7", key="reply:42")
    assert gw.owe_delivery("s", {"text": "other"}, key="reply:42") == first
    refused(rival, ValueError, gw.owe_delivery, "t", {"text": "hi"}, key="reply:42")  # another session's key
    refused(rival, SessionNotFoundError, gw.owe_delivery, "nope", {"text": "hi"})
    row = outbox_row(rival, first)
    assert (row["state"], row["platform"], row["chat_id"], row["thread_id"], row["attempts"]) == (
        "pending", "telegram", "1", "7", 0)
    assert [o["payload"] for o in gw.list_owed("s")] == [{"text": "hi"}]


def test_delivery_transitions(gw, rival):
    ob = gw.owe_delivery("s", "hello")
    refused(rival, LedgerStateError, gw.mark_failed, ob, "boom")            # fail before any attempt
    fence = gw.begin_delivery(ob)
    refused(rival, LedgerStateError, gw.begin_delivery, ob)                 # one attempt at a time
    gw.mark_failed(ob, "timeout", fence=fence)
    row = outbox_row(rival, ob)
    assert (row["state"], row["attempts"], row["last_error"]) == ("failed", 1, "timeout")
    refused(rival, LedgerStateError, gw.mark_delivered, ob)                 # a failed send is not delivered
    second = gw.begin_delivery(ob)                                          # failed is retried
    assert second == fence + 1
    refused(rival, LedgerStateError, gw.mark_delivered, ob, fence=fence)    # a stale fence cannot complete it
    refused(rival, LedgerStateError, gw.mark_failed, ob, "late", fence=fence)
    gw.mark_delivered(ob, fence=second)
    assert outbox_row(rival, ob)["state"] == "delivered"
    refused(rival, LedgerStateError, gw.begin_delivery, ob)
    refused(rival, LedgerStateError, gw.mark_delivered, ob)
    refused(rival, LedgerStateError, gw.mark_delivered, 999)
    direct = gw.owe_delivery("s", "sent by a side channel")
    gw.mark_delivered(direct)                                               # pending -> delivered
    assert gw.list_owed() == []


def test_recover_deliveries_after_the_owner_died_mid_send(gw, rival):
    in_flight = gw.owe_delivery("s", "a")
    gw.begin_delivery(in_flight)
    exhausted = gw.owe_delivery("s", "b")
    for _ in range(3):
        gw.begin_delivery(exhausted)
        gw.mark_failed(exhausted, "503")
    gw.begin_delivery(exhausted)            # fourth attempt, then the owner dies
    waiting = gw.owe_delivery("s", "c")
    refused(rival, ValueError, gw.recover_deliveries, 0)
    assert gw.recover_deliveries(max_attempts=3) == {"recovered": 1, "abandoned": 1}
    states = {r["id"]: (r["state"], r["recovered"]) for r in rival.execute("SELECT * FROM delivery_obligations")}
    assert states == {in_flight: ("pending", 1), exhausted: ("abandoned", 0), waiting: ("pending", 0)}
    owed = {o["id"]: o["recovered"] for o in gw.list_owed()}
    assert owed == {in_flight: 1, waiting: 0}   # the sender sees which reply may be a duplicate
    assert gw.recover_deliveries() == {"recovered": 0, "abandoned": 0}


def test_an_owner_passing_its_epoch_is_fenced(gw, rival):
    old = gw.claim_runtime()
    ob = gw.owe_delivery("s", "a")
    fence = gw.begin_delivery(ob, epoch=old)
    new = gw.claim_runtime()
    refused(rival, StaleEpochError, gw.recover_deliveries, epoch=old)   # cannot pull back live sends
    assert gw.recover_deliveries(epoch=new) == {"recovered": 1, "abandoned": 0}
    refused(rival, StaleEpochError, gw.begin_delivery, ob, epoch=old)   # cannot start a send
    refused(rival, LedgerStateError, gw.mark_delivered, ob, fence=fence)  # its old attempt is void
    assert gw.begin_delivery(ob, epoch=new) == fence + 1


def test_delivery_bookkeeping_is_an_activity_write(gw, rival, monkeypatch):
    ob = gw.owe_delivery("s", "a")
    monkeypatch.setattr(gw, "activity_write_patience_s", 0.05)
    monkeypatch.setattr(gw, "write_patience_s", 60.0)   # would hang the test if these used it
    rival.execute("BEGIN IMMEDIATE")
    try:
        for call in (lambda: gw.begin_delivery(ob), lambda: gw.mark_delivered(ob), lambda: gw.mark_failed(ob, "x")):
            with pytest.raises(SessionPersistenceError) as info:
                call()
            assert info.value.code == "session_persistence_failed:locked"
    finally:
        rival.execute("ROLLBACK")
    assert outbox_row(rival, ob)["state"] == "pending"


def test_read_only_handle_refuses_ledger_writes(gw):
    with SessionDB(gw.db_path, read_only=True) as ro:
        for call in (lambda: ro.claim_runtime(), lambda: ro.admit_input("s", "x"), lambda: ro.owe_delivery("s", "x"),
                     lambda: ro.set_route("gw", "k", {"session_id": "s"}), lambda: ro.delete_session("s"),
                     lambda: ro.persist_failed_turn_input("s", "x", "im-1")):
            with pytest.raises(ReadOnlyError):
                call()
        assert ro.list_owed() == [] and ro.next_admission("s") is None


# --- routing ------------------------------------------------------------------------------------

def test_routes_publish_replace_and_delete(gw, rival):
    gw.set_route("gateway", "agent:main:telegram:dm:1", {"session_id": "s", "platform": "telegram"})
    gw.set_route("gateway", "agent:main:telegram:dm:1", {"session_id": "t"})
    assert gw.get_route("gateway", "agent:main:telegram:dm:1") == {"session_id": "t"}
    assert rival.execute("SELECT COUNT(*) FROM gateway_routing").fetchone()[0] == 1
    refused(rival, ValueError, gw.set_route, "gateway", "k", {"platform": "x"})        # names no session
    refused(rival, SessionNotFoundError, gw.set_route, "gateway", "k", {"session_id": "nope"})
    refused(rival, ValueError, gw.set_route, "", "k", {"session_id": "s"})
    assert [(r["scope"], r["entry"]["session_id"]) for r in gw.list_routes("gateway")] == [("gateway", "t")]
    assert gw.list_routes("other") == []
    assert gw.delete_route("gateway", "agent:main:telegram:dm:1") is True
    assert gw.delete_route("gateway", "agent:main:telegram:dm:1") is False
    assert gw.get_route("gateway", "agent:main:telegram:dm:1") is None


# --- async delegations ------------------------------------------------------------------------------

def test_delegation_lifecycle(gw, rival):
    assert gw.record_delegation("d1", "s", target="research-agent", payload={"task": "find"}) is True
    assert gw.record_delegation("d1", "s", target="ignored") is False
    refused(rival, ValueError, gw.record_delegation, "d1", "t")
    refused(rival, SessionNotFoundError, gw.record_delegation, "d2", "nope")
    refused(rival, ValueError, gw.update_delegation, "d1", state="sleeping")
    refused(rival, LedgerStateError, gw.update_delegation, "nope", state="running")
    gw.update_delegation("d1", state="running")
    refused(rival, LedgerStateError, gw.update_delegation, "d1", state="pending")   # no way back
    gw.update_delegation("d1", state="completed", result={"answer": 42})
    refused(rival, LedgerStateError, gw.update_delegation, "d1", result={"answer": 43})  # finished is final
    row = gw.get_delegation("d1")
    assert (row["state"], row["target"], row["payload"], row["result"]) == (
        "completed", "research-agent", {"task": "find"}, {"answer": 42})
    gw.record_delegation("d3", "s")
    assert [d["id"] for d in gw.list_delegations("s")] == ["d1", "d3"]
    assert [d["id"] for d in gw.list_delegations("s", state="pending")] == ["d3"]
    assert gw.get_delegation("nope") is None


def test_the_outbox_fences_a_stale_epoch_itself(gw, conn):
    obligation = gw.owe_delivery("s", "reply")
    epoch = gw.claim_runtime()
    gw.claim_runtime()  # another owner took over: `epoch` is stale now
    conn.execute("BEGIN IMMEDIATE")
    try:
        for call in (lambda: routing.begin_delivery(conn, obligation, epoch=epoch),
                     lambda: routing.recover_deliveries(conn, epoch=epoch)):
            with pytest.raises(StaleEpochError):
                call()
        assert routing.get_delivery(conn, obligation)["state"] == "pending"
        assert routing.begin_delivery(conn, obligation, epoch=epoch + 1) == 1
    finally:
        conn.execute("ROLLBACK")


def test_ledger_state_tables_keep_finished_rows_final(gw, conn):
    assert set(routing.OUTBOX.moves) == set(routing.DELIVERY_OWED_STATES)
    assert routing.DELEGATION_OPEN_STATES == ("pending", "running")
    gw.record_delegation("d", "s", payload={"task": 1})
    gw.update_delegation("d", state="completed", result=[1])
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = routing.DELEGATIONS.row(conn, "d")
        assert (row["task"], row["result"]) == ({"task": 1}, [1])  # JSON columns (task_json: the payload) decoded
        with pytest.raises(LedgerStateError, match="no way on"):
            routing.DELEGATIONS.move(conn, row, "running", "no way on")
        with pytest.raises(LedgerStateError, match="'nope' does not exist"):
            routing.DELEGATIONS.row(conn, "nope")
    finally:
        conn.execute("ROLLBACK")
    assert gw.get_delegation("d")["state"] == "completed"
