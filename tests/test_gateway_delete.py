"""delete_session and prune_sessions: a session goes with all its rows, or not at all."""
from __future__ import annotations

import sqlite3
import time

import pytest

from hermes_state import SessionBusyError, receipt_digest
from hermes_state_common import SESSION_OWNED
from conftest import refused

_DAY_S = 86400.0


def count(rival: sqlite3.Connection, sql: str, *args) -> int:
    return rival.execute(sql, args).fetchone()[0]


def rows_naming(rival: sqlite3.Connection, session_id: str) -> dict[str, int]:
    """How many rows of each table belong to or point at the session."""
    found = {
        "sessions": count(rival, "SELECT COUNT(*) FROM sessions WHERE id = ?", session_id),
        "messages": count(rival, "SELECT COUNT(*) FROM messages WHERE session_id = ?", session_id),
        "usage": count(rival, "SELECT COUNT(*) FROM session_model_usage WHERE session_id = ?", session_id),
        "locks": count(rival, "SELECT COUNT(*) FROM compression_locks WHERE session_id = ?", session_id),
        "admissions": count(rival, "SELECT COUNT(*) FROM session_admissions WHERE session_id = ?", session_id),
        "executions": count(rival, "SELECT COUNT(*) FROM worker_executions WHERE session_id = ?", session_id),
        "receipts": count(rival, "SELECT COUNT(*) FROM worker_receipts WHERE session_id = ?", session_id),
        "delegations": count(rival, "SELECT COUNT(*) FROM async_delegations WHERE origin_session = ?", session_id),
        "routes": count(rival, "SELECT COUNT(*) FROM gateway_routing "
                               "WHERE json_extract(entry_json, '$.session_id') = ?", session_id),
        "children": count(rival, "SELECT COUNT(*) FROM sessions WHERE parent_session_id = ?", session_id),
    }
    if rival.execute("SELECT 1 FROM sqlite_master WHERE name = 'delivery_obligations'").fetchone():
        found["outbox"] = count(rival, "SELECT COUNT(*) FROM delivery_obligations WHERE session_id = ?", session_id)
    if rival.execute("SELECT 1 FROM sqlite_master WHERE name = 'telegram_dm_topic_bindings'").fetchone():
        found["topics"] = count(rival, "SELECT COUNT(*) FROM telegram_dm_topic_bindings WHERE session_id = ?",
                                session_id)
    return found


def fill(db, session_id: str, epoch: int) -> None:
    """Give a session rows in every table, with all ledger work finished."""
    db.append_message(session_id, "user", f"zebra crossing in {session_id}")
    db.append_message(session_id, "assistant", "東京 reply")
    db.compress_in_place(session_id, [{"role": "user", "content": "zebra summary"}])   # two generations
    db.update_token_counts(session_id, 10, 5, model="m")
    db.acquire_compression_lock(session_id)
    admission = db.admit_input(session_id, "x")
    db.start_admission(admission, epoch)
    db.finish_admission(admission, "completed", epoch)
    execution = db.start_execution(session_id, "worker", epoch)
    db.record_receipt(execution, 1, {"ok": True}, receipt_digest({"ok": True}))
    db.finish_execution(execution, "completed", epoch)
    delivered = db.owe_delivery(session_id, "reply")
    db.mark_delivered(delivered)
    db.record_delegation(f"d-{session_id}", session_id)
    db.update_delegation(f"d-{session_id}", state="completed")
    db.set_route("gateway", f"key-{session_id}", {"session_id": session_id})
    db.bind_telegram_topic(chat_id="chat", thread_id=f"thread-{session_id}", user_id="u", session_key="k",
                           session_id=session_id)


@pytest.fixture
def filled(db):
    epoch = db.claim_runtime()
    for sid in ("a", "b"):
        db.create_session(sid, "cli")
        fill(db, sid, epoch)
    db.create_session("a-child", "cli", parent_session_id="a")
    return db, epoch


def test_delete_removes_every_row_of_the_session_and_keeps_the_rest(filled, rival):
    db, _ = filled
    other_before = rows_naming(rival, "b")
    assert all(rows_naming(rival, "a").values())
    db.delete_session("a")
    assert set(rows_naming(rival, "a").values()) == {0}
    assert rows_naming(rival, "b") == other_before
    assert rival.execute("SELECT parent_session_id FROM sessions WHERE id = 'a-child'").fetchone()[0] is None
    assert [r["session_id"] for r in db.search_messages("zebra")] == ["b"]   # FTS rows went with the messages
    for table in ("messages_fts", "messages_fts_trigram"):
        rival.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
    assert rival.execute("PRAGMA foreign_key_check").fetchall() == []
    assert rival.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_delete_refused_while_ledger_work_is_live(filled, rival):
    db, epoch = filled
    queued = db.admit_input("a", "waiting")
    refused(rival, SessionBusyError, db.delete_session, "a")
    db.start_admission(queued, epoch)
    refused(rival, SessionBusyError, db.delete_session, "a")            # started
    epoch = db.claim_runtime()
    refused(rival, SessionBusyError, db.delete_session, "a")            # unknown
    db.resolve_unknown(queued, "failed", epoch)
    running = db.start_execution("a", "cron", epoch)
    refused(rival, SessionBusyError, db.delete_session, "a")            # running
    epoch = db.claim_runtime()
    refused(rival, SessionBusyError, db.delete_session, "a")            # unknown execution
    db.finish_execution(running, "failed", epoch)
    db.delete_session("a")
    assert rows_naming(rival, "a")["sessions"] == 0


def test_delete_unknown_session_and_nothing_half_deleted(filled, rival):
    db, _ = filled
    assert db.delete_session("nope") is False
    # A failure at the very last statement rolls back every delete before it.
    rival.execute("CREATE TRIGGER refuse_delete BEFORE DELETE ON sessions BEGIN SELECT RAISE(ABORT, 'no'); END")
    refused(rival, sqlite3.IntegrityError, db.delete_session, "a")
    rival.execute("DROP TRIGGER refuse_delete")
    assert all(v for k, v in rows_naming(rival, "a").items())


def test_delete_does_not_create_the_outbox(db, rival):
    db.create_session("x", "cli")
    db.delete_session("x")
    assert rival.execute("SELECT 1 FROM sqlite_master WHERE name = 'delivery_obligations'").fetchone() is None


def test_prune_deletes_old_ended_sessions_only(db, rival):
    old = time.time() - 40 * _DAY_S
    epoch = db.claim_runtime()
    db.create_session("old-ended", "cli", started_at=old)
    db.create_session("old-ended-tg", "telegram", started_at=old)
    db.create_session("old-open", "cli", started_at=old)
    db.create_session("old-busy", "cli", started_at=old)
    db.create_session("new-ended", "cli")
    db.create_session("child", "cli", parent_session_id="old-ended")
    db.append_message("old-ended", "user", "bye")
    for sid in ("old-ended", "old-ended-tg", "old-busy", "new-ended"):
        db.end_session(sid, "user_exit")
    db.admit_input("old-busy", "still queued")
    db.start_execution("old-ended", "worker", epoch)   # running: this one must wait
    assert db.prune_sessions(30, source="cli") == 0
    db.finish_execution(db.list_executions("old-ended")[0]["id"], "completed", epoch)
    assert db.prune_sessions(30, source="cli") == 1
    remaining = {r[0] for r in rival.execute("SELECT id FROM sessions")}
    assert remaining == {"old-ended-tg", "old-open", "old-busy", "new-ended", "child"}
    assert rival.execute("SELECT parent_session_id FROM sessions WHERE id = 'child'").fetchone()[0] is None
    assert count(rival, "SELECT COUNT(*) FROM messages WHERE session_id = 'old-ended'") == 0
    assert db.prune_sessions(30) == 1                      # any source: the telegram one
    assert db.prune_sessions(0) == 1                       # everything ended: new-ended; old-busy stays busy
    for bad in (-1, float("nan"), True, "30"):
        refused(rival, ValueError, db.prune_sessions, bad)


def test_the_tables_a_session_owns_are_the_ones_the_dictionary_declares():
    # rows_naming above checks each of them; a table added to the dictionary joins deletion by itself.
    assert {t.name for t in SESSION_OWNED} == {
        "messages", "session_model_usage", "compression_locks", "session_admissions", "worker_executions",
        "worker_receipts", "async_delegations", "gateway_routing", "delivery_obligations", "telegram_dm_topic_bindings"}
