"""Gateway ledgers: runtime epoch fencing, the admissions FIFO, executions and receipts, a crash.

Every transition is exercised, legal and illegal; an illegal one raises its typed error and the
ledgers read the same from a second connection afterwards.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
from typing import Any

import pytest

import hermes_state_gateway as gateway

from hermes_state import (AsyncSessionDB, LedgerStateError, ReceiptDigestError, ReceiptOrderError, SessionDB,
                          SessionNotFoundError, StaleEpochError, receipt_digest)
from conftest import refused

def state_of(rival: sqlite3.Connection, table: str, row_id: int) -> str:
    return rival.execute(f"SELECT state FROM {table} WHERE id = ?", (row_id,)).fetchone()[0]


@pytest.fixture
def gw(db):
    db.create_session("s", "telegram", session_key="agent:main:telegram:dm:1")
    db.create_session("t", "telegram")
    return db


# --- runtime epoch ------------------------------------------------------------------------------

def test_claim_runtime_bumps_the_epoch_and_records_the_owner(gw, rival):
    assert gw.get_runtime() is None
    first = gw.claim_runtime("gateway-a")
    second = gw.claim_runtime()
    assert (first, second) == (1, 2)
    row = rival.execute("SELECT epoch, instance_id, pid FROM runtime_epoch").fetchall()
    assert len(row) == 1 and row[0]["epoch"] == 2 and row[0]["pid"] == os.getpid()
    assert row[0]["instance_id"] and row[0]["instance_id"] != "gateway-a"  # a fresh id when none is given
    assert gw.get_runtime()["epoch"] == 2


def test_claim_turns_started_and_running_work_of_older_epochs_unknown(gw, rival):
    epoch = gw.claim_runtime()
    started = gw.admit_input("s", "one")
    queued = gw.admit_input("s", "two")
    done = gw.admit_input("t", "three")
    gw.start_admission(started, epoch)
    gw.start_admission(done, epoch)
    gw.finish_admission(done, "completed", epoch)
    running = gw.start_execution("s", "cron", epoch)
    finished = gw.start_execution("t", "worker", epoch)
    gw.finish_execution(finished, "failed", epoch)
    gw.claim_runtime()
    assert state_of(rival, "session_admissions", started) == "unknown"
    assert state_of(rival, "session_admissions", queued) == "queued"      # never ran: still just waiting
    assert state_of(rival, "session_admissions", done) == "completed"
    assert state_of(rival, "worker_executions", running) == "unknown"
    assert state_of(rival, "worker_executions", finished) == "failed"


def test_every_epoch_taking_write_is_fenced(gw, rival):
    refused(rival, StaleEpochError, gw.start_execution, "s", "worker", 1)   # nobody claimed yet
    old = gw.claim_runtime()
    queued = gw.admit_input("s", "one")
    execution = gw.start_execution("s", "worker", old)
    new = gw.claim_runtime()
    assert state_of(rival, "worker_executions", execution) == "unknown"
    refused(rival, StaleEpochError, gw.start_admission, queued, old)
    refused(rival, StaleEpochError, gw.start_execution, "s", "worker", old)
    refused(rival, StaleEpochError, gw.finish_execution, execution, "completed", old)
    refused(rival, StaleEpochError, gw.start_admission, queued, new + 1)  # a future epoch is no better
    gw.start_admission(queued, new)
    refused(rival, StaleEpochError, gw.finish_admission, queued, "completed", old)
    refused(rival, StaleEpochError, gw.record_receipt, execution, 1, {"a": 1}, receipt_digest({"a": 1}), epoch=old)
    gw.claim_runtime()
    refused(rival, StaleEpochError, gw.resolve_unknown, queued, "failed", new)


def test_epoch_must_be_an_int(gw, rival):
    gw.claim_runtime()
    refused(rival, ValueError, gw.start_execution, "s", "worker", True)
    refused(rival, ValueError, gw.start_execution, "s", "worker", "1")


# --- admissions ---------------------------------------------------------------------------------

def test_admit_is_idempotent_by_key_and_keeps_the_first_payload(gw, rival):
    first = gw.admit_input("s", {"text": "hi"}, "tg:42")
    again = gw.admit_input("s", {"text": "changed"}, "tg:42")
    other_session = gw.admit_input("t", {"text": "hi"}, "tg:42")
    assert first == again != other_session
    rows = rival.execute("SELECT session_id, payload_json, state FROM session_admissions ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("s", '{"text": "hi"}', "queued"), ("t", '{"text": "hi"}', "queued")]


def test_admit_into_an_unknown_session_writes_nothing(gw, rival):
    refused(rival, SessionNotFoundError, gw.admit_input, "nope", "x")
    refused(rival, ValueError, gw.admit_input, "s", object())


def test_fifo_runs_in_order_and_a_started_head_blocks_the_queue(gw, rival):
    epoch = gw.claim_runtime()
    ids = [gw.admit_input("s", f"m{i}") for i in range(3)]
    assert gw.next_admission("s")["id"] == ids[0]
    assert gw.next_admission("s")["payload"] == "m0"
    refused(rival, LedgerStateError, gw.start_admission, ids[1], epoch)   # not the head
    gw.start_admission(ids[0], epoch)
    assert gw.next_admission("s") is None                                 # blocked by a started input
    refused(rival, LedgerStateError, gw.start_admission, ids[1], epoch)   # still behind a started one
    refused(rival, LedgerStateError, gw.start_admission, ids[0], epoch)   # started twice
    gw.finish_admission(ids[0], "completed", epoch)
    assert gw.next_admission("s")["id"] == ids[1]
    assert gw.next_admission("t") is None                                 # other sessions have their own queue
    row = rival.execute("SELECT state, epoch, started_at, finished_at FROM session_admissions WHERE id = ?",
                        (ids[0],)).fetchone()
    assert row["state"] == "completed" and row["epoch"] == epoch and row["finished_at"] >= row["started_at"]


def test_finish_transitions(gw, rival):
    epoch = gw.claim_runtime()
    first, second, third = (gw.admit_input("s", str(i)) for i in range(3))
    refused(rival, LedgerStateError, gw.finish_admission, first, "completed", epoch)  # finish before start
    refused(rival, LedgerStateError, gw.finish_admission, first, "failed", epoch)
    refused(rival, ValueError, gw.finish_admission, first, "queued", epoch)           # not a terminal state
    refused(rival, ValueError, gw.finish_admission, first, "unknown", epoch)
    gw.start_admission(first, epoch)
    gw.finish_admission(first, "failed", epoch)
    refused(rival, LedgerStateError, gw.finish_admission, first, "completed", epoch)  # finished twice
    gw.finish_admission(third, "cancelled", epoch)   # a queued input may be withdrawn before it runs
    assert state_of(rival, "session_admissions", third) == "cancelled"
    assert gw.next_admission("s")["id"] == second
    refused(rival, LedgerStateError, gw.finish_admission, 999, "completed", epoch)    # no such admission


def test_unknown_blocks_until_resolved_and_is_never_requeued(gw, rival):
    epoch = gw.claim_runtime()
    lost = gw.admit_input("s", "lost")
    waiting = gw.admit_input("s", "waiting")
    gw.start_admission(lost, epoch)
    epoch = gw.claim_runtime()
    assert gw.next_admission("s") is None
    refused(rival, LedgerStateError, gw.start_admission, waiting, epoch)       # blocked by the unknown one
    refused(rival, LedgerStateError, gw.start_admission, lost, epoch)          # unknown is not retried
    refused(rival, LedgerStateError, gw.finish_admission, lost, "completed", epoch)
    refused(rival, ValueError, gw.resolve_unknown, lost, "queued")             # never requeued
    refused(rival, LedgerStateError, gw.resolve_unknown, waiting, "failed")    # resolve a non-unknown
    gw.resolve_unknown(lost, "failed", epoch)
    row = rival.execute("SELECT state, resolution FROM session_admissions WHERE id = ?", (lost,)).fetchone()
    assert tuple(row) == ("failed", "failed")
    refused(rival, LedgerStateError, gw.resolve_unknown, lost, "completed")    # resolved twice
    assert gw.next_admission("s")["id"] == waiting


def test_list_and_get_admissions(gw):
    gw.admit_input("s", [1, 2])
    gw.admit_input("t", None)
    assert [a["payload"] for a in gw.list_admissions("s")] == [[1, 2]]
    assert [a["session_id"] for a in gw.list_admissions(state="queued")] == ["s", "t"]
    assert gw.get_admission(999) is None


@pytest.mark.parametrize("bad", [-1, True, "1", 1.5, 2**63])
def test_every_accessor_of_a_ledger_row_refuses_a_bad_id_by_its_name(gw, bad):
    epoch = gw.claim_runtime()
    for name, call in (("admission_id", gw.get_admission), ("execution_id", gw.get_execution),
                       ("admission_id", lambda i: gw.start_admission(i, epoch)),
                       ("execution_id", lambda i: gw.finish_execution(i, "completed", epoch))):
        with pytest.raises(ValueError, match=f"^{name} "):
            call(bad)


# --- executions and receipts ---------------------------------------------------------------------

def test_receipt_digest_is_sha256_of_canonical_json():
    payload = {"b": [1, 2.5, None], "a": "東京", "c": {"z": True, "y": "x"}}
    canonical = '{"a":"東京","b":[1,2.5,null],"c":{"y":"x","z":true}}'
    assert receipt_digest(payload) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert receipt_digest(json.loads(canonical)) == receipt_digest(payload)
    with pytest.raises(ValueError):
        receipt_digest({"x": object()})


def test_execution_transitions(gw, rival):
    epoch = gw.claim_runtime()
    refused(rival, SessionNotFoundError, gw.start_execution, "nope", "worker", epoch)
    refused(rival, ValueError, gw.start_execution, "s", "", epoch)
    ran = gw.start_execution("s", "kanban", epoch)
    assert gw.get_execution(ran)["state"] == "running"
    refused(rival, ValueError, gw.finish_execution, ran, "running", epoch)
    gw.finish_execution(ran, "completed", epoch)
    refused(rival, LedgerStateError, gw.finish_execution, ran, "failed", epoch)  # finished twice
    refused(rival, LedgerStateError, gw.finish_execution, 999, "failed", epoch)
    lost = gw.start_execution("s", "child", epoch)
    epoch = gw.claim_runtime()
    gw.finish_execution(lost, "cancelled", epoch)   # the new owner settles what its predecessor lost
    assert [e["state"] for e in gw.list_executions("s")] == ["completed", "cancelled"]


def test_receipts_in_order_with_digests(gw, rival):
    epoch = gw.claim_runtime()
    ex = gw.start_execution("s", "worker", epoch)
    one, two = {"step": 1}, {"step": 2, "out": "ok"}
    refused(rival, ReceiptOrderError, gw.record_receipt, ex, 2, two, receipt_digest(two))    # gap
    refused(rival, ReceiptOrderError, gw.record_receipt, ex, 0, one, receipt_digest(one))
    refused(rival, ReceiptDigestError, gw.record_receipt, ex, 1, one, receipt_digest(two))   # mismatch
    assert gw.record_receipt(ex, 1, one, receipt_digest(one).upper()) is True
    assert gw.record_receipt(ex, 1, {"step": 1}, receipt_digest(one)) is False                # identical repeat
    refused(rival, ReceiptDigestError, gw.record_receipt, ex, 1, two, receipt_digest(two))   # seq 1 is taken
    refused(rival, ReceiptOrderError, gw.record_receipt, ex, 3, two, receipt_digest(two))
    assert gw.record_receipt(ex, 2, two, receipt_digest(two), epoch=epoch) is True
    stored = rival.execute("SELECT seq, payload_json, digest, session_id FROM worker_receipts ORDER BY seq").fetchall()
    assert [tuple(r) for r in stored] == [(1, '{"step":1}', receipt_digest(one), "s"),
                                          (2, '{"out":"ok","step":2}', receipt_digest(two), "s")]
    assert [(r["seq"], r["payload"]) for r in gw.list_receipts(ex)] == [(1, one), (2, two)]
    gw.finish_execution(ex, "completed", epoch)
    three = {"step": 3}
    refused(rival, LedgerStateError, gw.record_receipt, ex, 3, three, receipt_digest(three))  # closed
    assert gw.record_receipt(ex, 2, two, receipt_digest(two)) is False   # a late resend is still a no-op
    refused(rival, LedgerStateError, gw.record_receipt, 999, 1, one, receipt_digest(one))


# --- crash simulation ------------------------------------------------------------------------------

def _crashing_owner(path: str, ready: Any) -> None:
    """Child process: claim the runtime, start work, record two receipts, then wait to be killed."""
    db = SessionDB(path)
    epoch = db.claim_runtime("doomed")
    first = db.admit_input("s", {"text": "first"}, "msg-1")
    db.admit_input("s", {"text": "second"}, "msg-2")
    db.start_admission(first, epoch)
    execution = db.start_execution("s", "worker", epoch)
    for seq in (1, 2):
        payload = {"seq": seq, "result": f"r{seq}"}
        db.record_receipt(execution, seq, payload, receipt_digest(payload))
    ready.put((epoch, first, execution))
    signal.pause()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_owner_leaves_one_unknown_admission_and_intact_receipts(gw, rival):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    child = ctx.Process(target=_crashing_owner, args=(str(gw.db_path), ready))
    child.start()
    try:
        old_epoch, first, execution = ready.get(timeout=60)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    with SessionDB(gw.db_path) as owner:
        epoch = owner.claim_runtime("successor")
        assert epoch == old_epoch + 1
        unknown = owner.list_admissions(state="unknown")
        assert [a["id"] for a in unknown] == [first]
        assert owner.get_execution(execution)["state"] == "unknown"
        assert [(r["seq"], r["payload"]["result"]) for r in owner.list_receipts(execution)] == [(1, "r1"), (2, "r2")]
        assert owner.next_admission("s") is None            # the queue waits for a decision
        with pytest.raises(StaleEpochError):
            owner.start_execution("s", "worker", old_epoch)  # the dead owner's epoch is fenced off
        owner.resolve_unknown(first, "completed", epoch)
        head = owner.next_admission("s")
        assert head["payload"] == {"text": "second"}
        owner.start_admission(head["id"], epoch)
    assert rival.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert [tuple(r) for r in rival.execute("SELECT id, state FROM session_admissions ORDER BY id")] == [
        (first, "completed"), (head["id"], "started")]


def test_the_queue_head_is_found_without_walking_finished_admissions(gw, rival):
    epoch = gw.claim_runtime()
    for i in range(20):
        done = gw.admit_input("s", i)
        gw.start_admission(done, epoch)
        gw.finish_admission(done, "completed", epoch)
    gw.admit_input("s", "next")
    with gw.tracer() as statements:
        assert gw.next_admission("s")["payload"] == "next"
    plans = [" | ".join(r[3] for r in rival.execute("EXPLAIN QUERY PLAN " + s)) for s in statements
             if "session_admissions" in s]
    assert plans and all("idx_admissions_live" in p for p in plans), plans


def test_ledger_calls_have_coroutine_twins(gw):
    async def owner_start() -> tuple:
        adb = AsyncSessionDB(gw)
        epoch = await adb.claim_runtime("async-owner")
        admission = await adb.admit_input("s", "hi")
        await adb.start_admission(admission, epoch)
        return epoch, await adb.list_admissions(state="started")

    epoch, started = asyncio.run(owner_start())
    assert epoch == 1 and [a["payload"] for a in started] == ["hi"]


def test_each_runtime_ledger_has_a_state_table_with_final_terminal_states():
    for ledger in (gateway.ADMISSIONS, gateway.EXECUTIONS):
        assert not set(gateway.TERMINAL_STATES) & set(ledger.moves)  # a finished row never moves again
        assert all(targets <= set(gateway.TERMINAL_STATES) | set(ledger.moves) for targets in ledger.moves.values())
    assert set(gateway.ADMISSIONS.moves) == set(gateway.LIVE_ADMISSION_STATES)
    assert set(gateway.EXECUTIONS.moves) == set(gateway.LIVE_EXECUTION_STATES)


def test_receipts_come_back_with_their_payload_decoded(db, conn):
    epoch = db.claim_runtime()
    db.create_session("s", "cli")
    execution = db.start_execution("s", "worker", epoch)
    db.record_receipt(execution, 1, {"n": [1, 2]}, receipt_digest({"n": [1, 2]}))
    rows = gateway.fetch(conn, "worker_receipts", "execution_id = ?", (execution,), order="seq")
    assert [r["payload"] for r in rows] == [{"n": [1, 2]}] and "payload_json" not in rows[0]
