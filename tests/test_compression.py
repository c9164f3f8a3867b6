"""Compression generations, rotation lineage and compression locks (R-COMP-1..3, R-MSG-4).

Writes go through the SessionDB facade (or the module with the bare `conn` fixture for the
lock and transcript-check functions); what persisted is checked from `rival`, a second
connection. Multi-process races use spawn, as a real second agent process would.
"""
from __future__ import annotations

import multiprocessing
import os
import socket
import sqlite3
import time
from contextlib import contextmanager

import pytest

import hermes_state_compression as compression
import hermes_state_lockowners as lockowners
import hermes_state_messages as message_rows
from hermes_state import (SessionClosedByCompressionError, SessionCompressionInProgressError, SessionDB,
                          SessionNotFoundError)

UID_HEX = set("0123456789abcdef")


def fill(db: SessionDB, sid: str, n: int = 6, t0: float = 1000.0) -> list[dict]:
    """Append a small transcript with one tool round trip; return its rows."""
    db.ensure_session(sid, "cli", "m")
    script = [("user", "hello"), ("assistant", None), ("tool", "42"), ("assistant", "the answer is 42"),
              ("user", "thanks"), ("assistant", "you're welcome")]
    for i in range(n):
        role, content = script[i % len(script)]
        extra = {}
        if role == "assistant" and content is None:
            extra["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                    "function": {"name": "calc", "arguments": "{}"}}]
        if role == "tool":
            extra.update(tool_call_id=f"call_{i - 1}", tool_name="calc")
        db.append_message(sid, role, content, timestamp=t0 + i, **extra)
    return db.get_messages(sid)


def rows(rival: sqlite3.Connection, sid: str, where: str = "1") -> list[sqlite3.Row]:
    return rival.execute(f"SELECT * FROM messages WHERE session_id = ? AND {where} ORDER BY id", (sid,)).fetchall()


def session_row(rival: sqlite3.Connection, sid: str) -> sqlite3.Row:
    return rival.execute("SELECT * FROM sessions WHERE id = ?", (sid,)).fetchone()



def here(pid: int, token: str = "t", pidns: str | None = None) -> str:
    """Return a holder string for `pid` on this host, in this process's pid namespace unless `pidns` is given."""
    return f"pid={pid} host={socket.gethostname()} pidns={pidns or lockowners.own_pidns()} token={token}"


def exited_pid() -> int:
    """Return the pid of a process that has run, exited and been reaped."""
    proc = multiprocessing.get_context("spawn").Process(target=int)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    return proc.pid


def snapshot(rival: sqlite3.Connection, sid: str) -> tuple:
    msgs = [tuple(r) for r in rows(rival, sid)]
    s = session_row(rival, sid)
    return msgs, s["message_count"], s["tool_call_count"], s["ended_at"], s["end_reason"]


# --- in-place generations ---------------------------------------------------------------------------

def test_generation_counts_uids_and_flags(db, rival):
    old = fill(db, "s")
    summary = {"role": "user", "content": "[summary of the first turns]"}
    kept = [summary, old[4], old[5]]
    ids = db.compress_in_place("s", kept)

    live = rows(rival, "s", "active = 1")
    archive = rows(rival, "s", "active = 0")
    assert [r["id"] for r in live] == ids
    assert len(live) == 3 and len(archive) == 6
    assert all(r["compacted"] == 1 for r in archive) and all(r["compacted"] == 0 for r in live)
    # Every old row is archived under its own uid; the live rows keep the protected uids.
    assert [r["message_uid"] for r in archive] == [m["message_uid"] for m in old]
    fresh = live[0]["message_uid"]
    assert len(fresh) == 32 and set(fresh) <= UID_HEX and fresh not in {m["message_uid"] for m in old}
    assert [r["message_uid"] for r in live[1:]] == [old[4]["message_uid"], old[5]["message_uid"]]
    # The same protected message is in both generations: same uid, content and timestamp.
    for kept_row in live[1:]:
        twin = [r for r in archive if r["message_uid"] == kept_row["message_uid"]]
        assert len(twin) == 1
        assert (twin[0]["content"], twin[0]["timestamp"], twin[0]["role"]) == \
               (kept_row["content"], kept_row["timestamp"], kept_row["role"])
    s = session_row(rival, "s")
    assert s["message_count"] == 3 and s["tool_call_count"] == 0


def test_readers_see_only_the_live_generation_and_the_archive_stays(db, rival):
    old = fill(db, "s")
    db.compress_in_place("s", [old[5]])
    conversation = db.get_messages_as_conversation("s")
    assert [m["message_uid"] for m in conversation] == [old[5]["message_uid"]]
    assert [m["message_uid"] for m in db.get_messages("s")] == [old[5]["message_uid"]]
    everything = db.get_messages("s", include_inactive=True)
    assert len(everything) == 7
    assert [m["message_uid"] for m in everything if m["active"] == 0] == [m["message_uid"] for m in old]


def test_a_message_protected_twice_is_in_three_generations(db, rival):
    old = fill(db, "s")
    db.compress_in_place("s", [old[0], old[5]])
    db.append_message("s", "user", "more", timestamp=2000.0)
    live = db.get_messages("s")
    db.compress_in_place("s", [live[0], live[2]])
    uid = old[0]["message_uid"]
    copies = rival.execute("SELECT active, compacted, content, timestamp FROM messages WHERE message_uid = ? "
                           "ORDER BY id", (uid,)).fetchall()
    assert [tuple(c) for c in copies] == [(0, 1, "hello", 1000.0), (0, 1, "hello", 1000.0), (1, 0, "hello", 1000.0)]
    assert len(rows(rival, "s", "active = 0")) == 6 + 3
    assert [r["content"] for r in rows(rival, "s", "active = 1")] == ["hello", "more"]
    assert session_row(rival, "s")["message_count"] == 2


def test_kept_conversation_dicts_round_trip_with_tool_pairing(db, rival):
    fill(db, "s")
    before = db.get_messages_as_conversation("s")
    kept = before[1:4]  # assistant tool call, tool result, assistant answer
    db.compress_in_place("s", kept)
    after = db.get_messages_as_conversation("s")
    assert after == kept
    assert after[1]["_tool_call_uid"] == after[0]["_tool_call_uids"]["call_1"]
    s = session_row(rival, "s")
    assert s["message_count"] == 3 and s["tool_call_count"] == 1


def test_kept_conversation_dicts_keep_display_text_and_sent_bytes(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "display text", api_content="sent text with memory")
    db.append_message("s", "assistant", "", reasoning_content="the answer", api_content="the answer")
    db.append_message("s", "assistant", "same", api_content="same")  # equal: nothing extra to carry
    kept = db.get_messages_as_conversation("s")
    assert [m.get("_display_content") for m in kept] == ["display text", "", None]
    db.compress_in_place("s", kept)
    live = rows(rival, "s", "active = 1")
    assert [(r["content"], r["api_content"]) for r in live] == [
        ("display text", "sent text with memory"), ("", "the answer"), ("same", None)]
    assert db.get_messages_as_conversation("s") == kept
    db.rotate_session("s", "c", kept)
    assert [(r["content"], r["api_content"]) for r in rows(rival, "c")] == [
        (r["content"], r["api_content"]) for r in live]


def test_kept_timestamp_is_kept_when_given_and_now_otherwise(db, rival):
    old = fill(db, "s", 2)
    before = time.time()
    db.compress_in_place("s", [old[1], {"role": "user", "content": "summary"}])
    live = rows(rival, "s", "active = 1")
    assert live[0]["timestamp"] == old[1]["timestamp"]
    assert live[1]["timestamp"] >= before


def test_compressing_to_nothing_leaves_an_empty_live_generation(db, rival):
    fill(db, "s", 3)
    assert db.compress_in_place("s", []) == []
    assert rows(rival, "s", "active = 1") == []
    assert len(rows(rival, "s", "active = 0 AND compacted = 1")) == 3
    assert session_row(rival, "s")["message_count"] == 0


def test_compression_lifts_only_an_idle_sweep_archive(db, rival):
    fill(db, "idle", 2)
    fill(db, "kept", 2)
    rival.execute("UPDATE sessions SET archived = 1, auto_archived = 1 WHERE id = 'idle'")
    db.archive_session("kept")
    db.compress_in_place("idle", [])
    db.compress_in_place("kept", [])
    assert (session_row(rival, "idle")["archived"], session_row(rival, "idle")["auto_archived"]) == (0, 0)
    assert session_row(rival, "kept")["archived"] == 1


def test_rotation_lifts_only_an_idle_sweep_archive_of_the_parent(db, rival):
    db.create_session("idle", "cli")
    db.create_session("kept", "cli")
    rival.execute("UPDATE sessions SET archived = 1, auto_archived = 1 WHERE id = 'idle'")
    db.archive_session("kept")
    db.rotate_session("idle", "idle2", [])
    db.rotate_session("kept", "kept2", [])
    assert (session_row(rival, "idle")["archived"], session_row(rival, "idle")["auto_archived"]) == (0, 0)
    assert (session_row(rival, "kept")["archived"], session_row(rival, "kept")["auto_archived"]) == (1, 0)
    for child in ("idle2", "kept2"):  # a child inherits no archive
        assert (session_row(rival, child)["archived"], session_row(rival, child)["auto_archived"]) == (0, 0)


def test_unknown_session_raises_not_found(db, rival):
    with pytest.raises(SessionNotFoundError):
        db.compress_in_place("nope", [{"role": "user", "content": "x"}])
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


@pytest.mark.parametrize("bad", [
    [{"role": "user", "content": "ok"}, {"role": "assistant", "tool_calls": {1, 2}}],   # not JSON
    [{"role": "user", "content": "ok"}, {"role": "", "content": "x"}],                 # empty role
    [{"role": "user", "content": "ok"}, {"role": "user", "message_uid": "not-a-uid"}],
    [{"role": "user", "content": "ok"}, "not a dict"],
    "a string is not a list",
])
def test_a_bad_kept_message_writes_nothing(db, rival, bad):
    fill(db, "s")
    before = snapshot(rival, "s")
    with pytest.raises(ValueError):
        db.compress_in_place("s", bad)
    assert snapshot(rival, "s") == before
    assert rows(rival, "s", "compacted = 1") == []


@pytest.mark.parametrize("verb", ["compress_in_place", "rotate_session"])
def test_one_uid_kept_twice_is_refused_before_writing(db, rival, verb):
    old = fill(db, "s")
    before = snapshot(rival, "s")
    twice = [old[4], {"role": "user", "content": "summary"}, dict(old[5]), {"role": "user", "content": "x"},
             dict(old[5], content="edited copy")]
    write = (lambda kept: db.compress_in_place("s", kept)) if verb == "compress_in_place" else \
        (lambda kept: db.rotate_session("s", "c", kept))
    with pytest.raises(ValueError, match=r"kept messages 2 and 4 have the same message_uid"):
        write(twice)
    assert snapshot(rival, "s") == before and session_row(rival, "c") is None
    # Messages without a uid (each gets a fresh one) are not duplicates of each other.
    write([{"role": "user", "content": "a"}, {"role": "user", "content": "a"}, old[5]])
    live = rows(rival, "c" if verb == "rotate_session" else "s", "active = 1")
    assert len({r["message_uid"] for r in live}) == len(live) == 3


def test_compress_respects_the_compression_lock(db, rival, plant_lock):
    old = fill(db, "s")
    before = snapshot(rival, "s")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=other")
    with pytest.raises(SessionCompressionInProgressError):
        db.compress_in_place("s", [old[5]])
    with pytest.raises(SessionCompressionInProgressError):
        db.compress_in_place("s", [old[5]], holder="pid=1 host=x token=mine")
    assert snapshot(rival, "s") == before
    # The holder itself may compress.
    rival.execute("DELETE FROM compression_locks")
    holder = db.acquire_compression_lock("s")
    db.compress_in_place("s", [old[5]], holder=holder)
    assert len(rows(rival, "s", "active = 1")) == 1


def test_a_holder_whose_lock_expired_or_was_released_may_not_compress(db, rival):
    old = fill(db, "s")
    holder = db.acquire_compression_lock("s")
    rival.execute("UPDATE compression_locks SET expires_at = ?", (time.time() - 1,))
    before = snapshot(rival, "s")
    with pytest.raises(SessionCompressionInProgressError, match="expired or was released"):
        db.compress_in_place("s", [old[5]], holder=holder)
    assert db.release_compression_lock("s", holder) is True
    with pytest.raises(SessionCompressionInProgressError):
        db.compress_in_place("s", [old[5]], holder=holder)
    assert snapshot(rival, "s") == before


def test_expired_and_dead_holder_locks_do_not_block_a_lockless_compress(db, rival, plant_lock):
    old = fill(db, "s")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=t", expires_in_s=-1)
    db.compress_in_place("s", [old[5]])
    plant_lock("s", here(exited_pid()))
    db.compress_in_place("s", [old[5]])
    assert len(rows(rival, "s", "active = 0")) == 7


def test_compressing_a_session_closed_by_rotation_names_its_continuation(db, rival):
    old = fill(db, "a")
    db.rotate_session("a", "b", [old[5]])
    db.rotate_session("b", "c", [])
    with pytest.raises(SessionClosedByCompressionError) as info:
        db.compress_in_place("a", [])
    assert info.value.successor_id == "c" and "'c'" in str(info.value)
    assert len(rows(rival, "a", "active = 1")) == 6


# --- rotation ------------------------------------------------------------------------------------------

def test_rotation_creates_the_child_ends_the_parent_and_copies_uids(db, rival):
    db.create_session("p", "telegram", "gpt-x", user_id="u1", session_key="agent:main:telegram:dm:7",
                      chat_id="7", chat_type="dm", thread_id="th", profile_name="coder", transport_profile="bot2",
                      title="Trip", system_prompt="be brief")
    old = fill(db, "p")
    assert db.rotate_session("p", "c", old[4:], title="Trip #2") == "c"

    parent, child = session_row(rival, "p"), session_row(rival, "c")
    assert parent["end_reason"] == "compression" and parent["ended_at"] is not None
    assert child["parent_session_id"] == "p" and child["ended_at"] is None
    for name in ("source", "model", "user_id", "session_key", "chat_id", "chat_type", "thread_id",
                 "profile_name", "transport_profile"):
        assert child[name] == parent[name], name
    assert child["title"] == "Trip #2" and child["system_prompt"] is None
    assert child["message_count"] == 2
    assert [r["message_uid"] for r in rows(rival, "c")] == [m["message_uid"] for m in old[4:]]
    assert [r["timestamp"] for r in rows(rival, "c")] == [m["timestamp"] for m in old[4:]]
    # The parent's transcript is untouched: still its own live generation.
    assert [r["message_uid"] for r in rows(rival, "p", "active = 1")] == [m["message_uid"] for m in old]


def test_rotation_overrides_and_clears_inherited_columns(db, rival):
    db.create_session("p", "telegram", "old-model", user_id="u1", chat_id="7")
    db.rotate_session("p", "c", [], model="new-model", chat_id=None)
    child = session_row(rival, "c")
    assert (child["model"], child["chat_id"], child["user_id"]) == ("new-model", None, "u1")


def test_rotation_refusals_write_nothing(db, rival):
    db.create_session("p", "cli", title="Taken")
    old = fill(db, "p", 2)
    db.create_session("other", "cli")
    before = snapshot(rival, "p")
    count = rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    with pytest.raises(ValueError, match="already exists"):
        db.rotate_session("p", "other", old)
    with pytest.raises(ValueError, match="already exists"):
        db.rotate_session("p", "p", old)
    with pytest.raises(ValueError, match="parent_session_id"):
        db.rotate_session("p", "c", old, parent_session_id="other")
    with pytest.raises(ValueError, match="unknown session column"):
        db.rotate_session("p", "c", old, colour="red")
    with pytest.raises(ValueError):
        db.rotate_session("p", "c", old, title="Taken")
    with pytest.raises(ValueError, match="kept message 1"):
        db.rotate_session("p", "c", [old[0], {"role": "user", "display_metadata": object()}])
    with pytest.raises(SessionNotFoundError):
        db.rotate_session("missing", "c", old)
    assert snapshot(rival, "p") == before
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == count
    assert session_row(rival, "c") is None


def test_rotating_an_ended_parent_is_refused(db, rival):
    fill(db, "p", 1)
    db.end_session("p", "user_exit")
    with pytest.raises(ValueError, match="reopen it"):
        db.rotate_session("p", "c", [])
    db.reopen_session("p")
    db.rotate_session("p", "c", [])
    with pytest.raises(SessionClosedByCompressionError) as info:
        db.rotate_session("p", "c2", [])
    assert info.value.successor_id == "c"
    assert session_row(rival, "c2") is None


def test_reopening_a_session_compression_closed_is_refused(db, rival):
    fill(db, "a", 2)
    db.rotate_session("a", "b", [])
    db.rotate_session("b", "c", [])
    for closed in ("a", "b"):
        before = tuple(session_row(rival, closed))
        with pytest.raises(SessionClosedByCompressionError) as info:
            db.reopen_session(closed)
        assert info.value.successor_id == "c" and info.value.session_id == closed
        assert tuple(session_row(rival, closed)) == before
    assert db.get_compression_ancestors("c") == ["a", "b"]
    # A session ended by compression with no continuation reopens (nothing else could ever
    # write to it again).
    db.create_session("lone", "cli")
    db.end_session("lone", "compression")
    assert session_row(rival, "lone")["end_reason"] == "compression"
    db.reopen_session("lone")
    assert (session_row(rival, "lone")["ended_at"], session_row(rival, "lone")["end_reason"]) == (None, None)
    db.append_message("lone", "user", "usable again")
    # Other ends reopen as before; an unknown id is still SessionNotFoundError.
    db.end_session("c", "user_exit")
    db.reopen_session("c")
    assert session_row(rival, "c")["ended_at"] is None
    with pytest.raises(SessionNotFoundError):
        db.reopen_session("ghost")


def test_rotation_respects_the_compression_lock(db, rival, plant_lock):
    fill(db, "p", 2)
    plant_lock("p", f"pid={os.getpid()} host={socket.gethostname()} token=other")
    with pytest.raises(SessionCompressionInProgressError):
        db.rotate_session("p", "c", [])
    assert session_row(rival, "c") is None and session_row(rival, "p")["ended_at"] is None
    rival.execute("DELETE FROM compression_locks")
    holder = db.acquire_compression_lock("p")
    db.rotate_session("p", "c", [], holder=holder)
    assert db.release_compression_lock("p", holder)
    assert db.get_compression_successor("p") == "c"


def test_compression_walks_follow_compression_edges_only(db, rival):
    a = fill(db, "a", 2)
    db.rotate_session("a", "b", [a[1]])
    db.append_message("b", "user", "in b", timestamp=3000.0)
    db.end_session("b", "reset")
    db.create_session("r", "cli", parent_session_id="b")
    db.append_message("r", "user", "after reset", timestamp=4000.0)

    with_ancestors = db.get_messages_as_conversation("b", include_ancestors=True)
    assert [m["content"] for m in with_ancestors] == ["hello", None, "in b"]
    uids = [m["message_uid"] for m in with_ancestors]
    assert uids[:2] == [a[0]["message_uid"], a[1]["message_uid"]] and len(uids) == len(set(uids)) == 3
    # The replay walks every parent; the compression walks follow the compression edge only.
    assert [m["content"] for m in db.get_messages_as_conversation("r", include_ancestors=True)] == \
        ["hello", None, "in b", "after reset"]
    assert db.get_compression_ancestors("r") == []
    assert db.get_compression_ancestors("b") == ["a"]
    assert db.get_compression_successor("b") == "b"  # a reset child is not a continuation
    assert db.get_compression_successor("a") == "b"


def test_a_later_child_of_a_compression_closed_session_never_takes_over(db, rival):
    old = fill(db, "p", 2)
    db.rotate_session("p", "c1", [old[1]])
    # A branch of the closed session, made later and ended: it is not the continuation.
    db.create_session("b", "cli", parent_session_id="p")
    db.append_message("b", "user", "in the branch", timestamp=5000.0)
    db.end_session("b", "branch_done")
    # A child planted later (say, a retried rotation) does not take over either.
    db.create_session("c2", "cli", parent_session_id="p", started_at=time.time() + 10)
    assert db.get_compression_successor("p") == "c1"
    with pytest.raises(SessionClosedByCompressionError) as info:
        db.compress_in_place("p", [])
    assert info.value.successor_id == "c1"
    for later in ("b", "c2"):
        assert db.get_compression_ancestors(later) == []
        assert db.get_compression_successor(later) == later
    assert db.get_compression_ancestors("c1") == ["p"]
    # The branch's replay shows the closed parent's transcript before its own.
    assert [m["content"] for m in db.get_messages_as_conversation("b", include_ancestors=True)][-1] == "in the branch"


def test_rotation_stamps_the_edge_and_ties_go_to_the_lowest_rowid(db, rival):
    db.create_session("p", "cli")
    db.rotate_session("p", "c1", [])
    parent, child = session_row(rival, "p"), session_row(rival, "c1")
    assert child["started_at"] == parent["ended_at"]  # one float: the compression edge
    # Another child with the very same start, inserted after the rotation's child, loses the tie.
    db.create_session("c0", "cli", parent_session_id="p", started_at=parent["ended_at"])
    assert db.get_compression_successor("p") == "c1"
    assert db.get_compression_ancestors("c0") == [] and db.get_compression_ancestors("c1") == ["p"]
    with pytest.raises(ValueError, match="started_at"):
        db.rotate_session("c1", "c3", [], started_at=1.0)
    assert session_row(rival, "c3") is None and session_row(rival, "c1")["ended_at"] is None


def test_lineage_written_before_the_edge_stamp_falls_back_to_the_oldest_child_near_the_end(db, rival):
    # Older writers ended the parent, then created the child in a separate write: its start is
    # a little after the end (or, with clock jitter, a little before).
    end = 1_000_000.0
    for parent, children in {"old": [("sub", end - 5.0), ("next", end + 0.4), ("branch", end + 30.0)],
                             "jit": [("early", end - 0.5), ("late", end + 2.0)],
                             "mix": [("near", end - 0.5), ("exact", end), ("after", end + 0.1)],
                             "none": [("before", end - 60.0)]}.items():
        db.create_session(parent, "cli", started_at=end - 100)
        for child, started in children:
            db.create_session(child, "cli", parent_session_id=parent, started_at=started)
        rival.execute("UPDATE sessions SET ended_at = ?, end_reason = 'compression' WHERE id = ?", (end, parent))
    expected = {"old": "next", "jit": "early", "mix": "exact", "none": "none"}
    assert {p: db.get_compression_successor(p) for p in expected} == expected
    for parent, child in expected.items():
        if child != parent:
            assert db.get_compression_ancestors(child) == [parent]
    for stranger in ("sub", "branch", "late", "near", "after", "before"):
        assert db.get_compression_ancestors(stranger) == [], stranger


def test_unknown_ids_for_successor_and_ancestors(db):
    assert db.get_compression_successor("nope") is None
    assert db.get_compression_ancestors("nope") == []
    db.create_session("alone", "cli")
    assert db.get_compression_successor("alone") == "alone"
    assert db.get_compression_ancestors("alone") == []


def test_a_chain_of_fifty_rotations(db, rival):
    ids = [f"s{i:02d}" for i in range(50)]
    first = fill(db, ids[0], 2)
    protected = first[1]
    for parent, child in zip(ids, ids[1:]):
        db.rotate_session(parent, child, [protected])
    for i, sid in enumerate(ids):
        assert db.get_compression_successor(sid) == ids[-1]
        assert db.get_compression_ancestors(sid) == ids[:i]
    # The protected message is in every session of the chain, once per session, same uid.
    assert rival.execute("SELECT COUNT(DISTINCT session_id) FROM messages WHERE message_uid = ?",
                         (protected["message_uid"],)).fetchone()[0] == 50
    conversation = db.get_messages_as_conversation(ids[-1], include_ancestors=True)
    assert [m["message_uid"] for m in conversation] == [m["message_uid"] for m in first]
    with pytest.raises(SessionClosedByCompressionError) as info:
        db.compress_in_place(ids[10], [])
    assert info.value.successor_id == ids[-1]


def test_a_planted_cycle_does_not_hang(db, rival):
    ids = [f"s{i:02d}" for i in range(50)]
    db.create_session(ids[0], "cli")
    for parent, child in zip(ids, ids[1:]):
        db.rotate_session(parent, child, [])
    # Bad data: the tip ends by compression and points back at the root.
    rival.execute("UPDATE sessions SET parent_session_id = ?, end_reason = 'compression', ended_at = 1 "
                  "WHERE id = ?", (ids[-1], ids[0]))
    rival.execute("UPDATE sessions SET end_reason = 'compression', ended_at = 1 WHERE id = ?", (ids[-1],))
    for sid in (ids[0], ids[25], ids[-1]):
        tip = db.get_compression_successor(sid)
        assert tip in ids
        ancestors = db.get_compression_ancestors(sid)
        assert len(ancestors) == len(set(ancestors)) <= 49 and sid not in ancestors
    assert db.get_compression_successor(ids[25]) == ids[24]  # the walk stops before revisiting
    assert len(db.get_messages_as_conversation(ids[25], include_ancestors=True)) == 0
    with pytest.raises(SessionClosedByCompressionError):
        db.compress_in_place(ids[25], [])


# --- compression locks ---------------------------------------------------------------------------------

def test_acquire_and_release(db, rival):
    db.create_session("s", "cli")
    holder = db.acquire_compression_lock("s", ttl_s=60)
    assert lockowners.parse_holder(holder) == (os.getpid(), socket.gethostname(), lockowners.own_pidns())
    assert "token=" in holder
    row = rival.execute("SELECT * FROM compression_locks WHERE session_id = 's'").fetchone()
    assert row["holder"] == holder and 59 <= row["expires_at"] - row["acquired_at"] <= 61
    assert db.acquire_compression_lock("s") is None  # not re-entrant, even for this process
    assert db.release_compression_lock("s", "pid=1 host=x token=y") is False
    assert rival.execute("SELECT holder FROM compression_locks").fetchone()[0] == holder
    assert db.release_compression_lock("s", holder) is True
    assert db.release_compression_lock("s", holder) is False
    assert rival.execute("SELECT COUNT(*) FROM compression_locks").fetchone()[0] == 0
    second = db.acquire_compression_lock("s")
    assert second is not None and second != holder


def test_a_stale_holder_cannot_release_the_lock_its_successor_took(db, rival):
    db.create_session("s", "cli")
    stale = db.acquire_compression_lock("s")
    rival.execute("UPDATE compression_locks SET expires_at = ? WHERE session_id = 's'", (time.time() - 1,))
    current = db.acquire_compression_lock("s")  # the expired lock is taken over
    assert current is not None and current != stale
    assert db.release_compression_lock("s", stale) is False
    assert [tuple(r) for r in rival.execute("SELECT session_id, holder FROM compression_locks")] == [("s", current)]
    assert db.release_compression_lock("s", current) is True
    assert rival.execute("SELECT COUNT(*) FROM compression_locks").fetchone()[0] == 0


@pytest.mark.parametrize("ttl", [0, -5, float("nan"), float("inf"), True, "300"])
def test_bad_ttl_raises(db, ttl):
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.acquire_compression_lock("s", ttl_s=ttl)


def test_acquire_on_unknown_or_closed_session(db, rival):
    with pytest.raises(SessionNotFoundError):
        db.acquire_compression_lock("nope")
    db.create_session("p", "cli")
    db.rotate_session("p", "c", [])
    with pytest.raises(SessionClosedByCompressionError):
        db.acquire_compression_lock("p")
    assert rival.execute("SELECT COUNT(*) FROM compression_locks").fetchone()[0] == 0


def test_dead_holder_on_this_host_is_reclaimed(db, rival, plant_lock):
    db.create_session("s", "cli")
    dead = here(exited_pid(), "gone")
    plant_lock("s", dead)
    holder = db.acquire_compression_lock("s")
    assert holder is not None and holder != dead
    assert rival.execute("SELECT holder FROM compression_locks").fetchone()[0] == holder


@pytest.mark.parametrize("pid", [os.getpid(), 1], ids=["this-process", "pid-1"])
def test_a_live_holder_is_not_robbed(db, rival, pid, plant_lock):
    # pid 1 always exists; as a normal user signalling it raises PermissionError: still alive.
    db.create_session("s", "cli")
    live = f"pid={pid} host={socket.gethostname()} token=other"
    plant_lock("s", live)
    assert db.acquire_compression_lock("s") is None
    assert rival.execute("SELECT holder FROM compression_locks").fetchone()[0] == live


def test_an_expired_lock_is_reclaimed_even_from_a_live_holder(db, plant_lock):
    db.create_session("s", "cli")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=old", expires_in_s=-0.5)
    assert db.acquire_compression_lock("s") is not None


def test_another_hosts_dead_pid_is_never_reclaimed_before_ttl(db, rival, plant_lock):
    db.create_session("s", "cli")
    elsewhere = f"pid={exited_pid()} host=not-{socket.gethostname()} pidns={lockowners.own_pidns()} token=t"
    plant_lock("s", elsewhere)
    assert db.acquire_compression_lock("s") is None
    rival.execute("UPDATE compression_locks SET expires_at = ?", (time.time() - 1,))
    assert db.acquire_compression_lock("s") is not None


@pytest.mark.parametrize("holder", ["", "who knows", "pid=abc host={host}", "pid=0 host={host}",
                                    "pid=-1 host={host}", "host={host}", "pid={dead}"])
def test_doubtful_holders_are_treated_as_alive(db, holder, plant_lock):
    db.create_session("s", "cli")
    holder = holder.format(host=socket.gethostname(), dead=exited_pid() if "{dead}" in holder else 0)
    plant_lock("s", holder or "x")
    assert db.acquire_compression_lock("s") is None


def test_a_dead_pid_in_another_pid_namespace_waits_for_the_ttl(db, conn, rival, plant_lock):
    # A container with host networking shares the host name but numbers its pids apart: a
    # pid that is gone here may be alive there.
    db.create_session("s", "cli")
    foreign = here(exited_pid(), "container", pidns="4026500001")
    assert foreign.split()[2] != f"pidns={lockowners.own_pidns()}"
    plant_lock("s", foreign)
    assert db.acquire_compression_lock("s") is None
    with pytest.raises(SessionCompressionInProgressError):
        message_rows.check_transcript_writable(conn, "s")
    assert rival.execute("SELECT holder FROM compression_locks").fetchone()[0] == foreign
    rival.execute("UPDATE compression_locks SET expires_at = ?", (time.time() - 1,))
    assert db.acquire_compression_lock("s") is not None


@pytest.mark.parametrize("holder", ["pid={dead} host={host} token=old-format", "pid={dead} host={host} pidns=- token=t"])
def test_a_dead_pid_without_a_known_pid_namespace_waits_for_the_ttl(db, holder, plant_lock):
    db.create_session("s", "cli")
    plant_lock("s", holder.format(dead=exited_pid(), host=socket.gethostname()))
    assert db.acquire_compression_lock("s") is None


def test_an_unreadable_own_pid_namespace_reclaims_nothing_early(db, monkeypatch, plant_lock):
    db.create_session("s", "cli")
    monkeypatch.setattr(compression, "own_pidns", lambda: lockowners.UNKNOWN_PIDNS)
    assert " pidns=- " in compression.new_holder()
    plant_lock("s", here(exited_pid(), pidns="-"))
    assert db.acquire_compression_lock("s") is None


def test_holders_name_this_process_pid_namespace():
    try:
        expected = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        expected = "-"
    assert lockowners.own_pidns() == expected
    assert f" pidns={lockowners.own_pidns()} " in compression.new_holder()


def test_holder_parsing():
    assert lockowners.parse_holder("pid=12 host=box pidns=4026531836 token=ab") == (12, "box", "4026531836")
    assert lockowners.parse_holder("pid=12 host=box token=ab") == (12, "box", None)
    assert lockowners.parse_holder("host=box pidns=- pid=7") == (7, "box", "-")
    assert lockowners.parse_holder("mypid=12 host=box") == (None, "box", None)
    assert lockowners.parse_holder("") == (None, None, None)
    assert lockowners.holder_is_gone(compression.new_holder()) is False


# --- transcript write checks (module level) ------------------------------------------------------------

def test_check_transcript_writable(db, conn, plant_lock):
    fill(db, "s", 1)
    message_rows.check_transcript_writable(conn, "s")
    message_rows.check_transcript_writable(conn, "unknown")  # the write itself reports it
    other = f"pid={os.getpid()} host={socket.gethostname()} token=other"
    plant_lock("s", other)
    with pytest.raises(SessionCompressionInProgressError, match="token=other"):
        message_rows.check_transcript_writable(conn, "s")
    message_rows.check_transcript_writable(conn, "s", other)  # the holder itself writes
    plant_lock("s", other, expires_in_s=-1)
    message_rows.check_transcript_writable(conn, "s")
    plant_lock("s", here(exited_pid(), "dead"))
    message_rows.check_transcript_writable(conn, "s")

    db.rotate_session("s", "t", [])
    with pytest.raises(SessionClosedByCompressionError) as info:
        message_rows.check_transcript_writable(conn, "s")
    assert info.value.successor_id == "t" and info.value.code == "session_persistence_failed:compression"


def test_closed_without_a_live_child_names_no_continuation(db, conn, rival):
    db.create_session("s", "cli")
    rival.execute("UPDATE sessions SET ended_at = 1, end_reason = 'compression' WHERE id = 's'")
    with pytest.raises(SessionClosedByCompressionError) as info:
        message_rows.check_transcript_writable(conn, "s")
    assert info.value.successor_id is None and "no live continuation" in str(info.value)


class FakeClock:
    """Injected clock and sleep: no real waiting in unit tests."""

    def __init__(self, on_sleep=None):
        self.t, self.sleeps, self.on_sleep = 0.0, [], on_sleep

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
        if self.on_sleep:
            self.on_sleep(len(self.sleeps))


def reader(conn):
    @contextmanager
    def read():
        yield conn
    return read


def test_wait_returns_at_once_without_a_lock(db, conn):
    db.create_session("s", "cli")
    fake = FakeClock()
    compression.wait_for_compression(reader(conn), "s", clock=fake.clock, sleep=fake.sleep)
    assert fake.sleeps == []


def test_wait_polls_until_the_holder_releases(db, conn, rival, plant_lock):
    db.create_session("s", "cli")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=other")
    fake = FakeClock(on_sleep=lambda n: n == 3 and rival.execute("DELETE FROM compression_locks"))
    compression.wait_for_compression(reader(conn), "s", clock=fake.clock, sleep=fake.sleep)
    assert len(fake.sleeps) == 3
    assert all(compression.POLL_MIN_S <= s <= compression.POLL_MAX_S for s in fake.sleeps)


def test_wait_gives_up_after_the_timeout(db, conn, plant_lock):
    db.create_session("s", "cli")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=other")
    fake = FakeClock()
    with pytest.raises(SessionCompressionInProgressError, match="waited 5.0s"):
        compression.wait_for_compression(reader(conn), "s", clock=fake.clock, sleep=fake.sleep)
    assert fake.t == pytest.approx(5.0)  # never sleeps past the deadline
    assert len(fake.sleeps) >= 5000 / (compression.POLL_MAX_S * 1000)


def test_wait_inside_a_write_transaction_raises_without_sleeping(db, conn, plant_lock):
    db.create_session("s", "cli")
    plant_lock("s", f"pid={os.getpid()} host={socket.gethostname()} token=other")
    fake = FakeClock()
    conn.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SessionCompressionInProgressError):
            compression.wait_for_compression(reader(conn), "s", clock=fake.clock, sleep=fake.sleep)
    finally:
        conn.execute("ROLLBACK")
    assert fake.sleeps == []


# --- two processes -------------------------------------------------------------------------------------

def _compress_with_lock(path: str, sid: str, keep: int, start, after_try, results) -> None:
    with SessionDB(path) as db:
        start.wait()
        holder = db.acquire_compression_lock(sid)
        after_try.wait()  # the winner keeps the lock until the loser has tried
        if holder is None:
            results.put(("none", None))
            return
        kept = db.get_messages(sid)[-keep:]
        ids = db.compress_in_place(sid, kept, holder=holder)
        db.release_compression_lock(sid, holder)
        results.put(("won", ids))


def _compress_without_lock(path: str, sid: str, keep: int, start, results) -> None:
    with SessionDB(path) as db:
        kept = db.get_messages(sid)[-keep:]
        start.wait()
        try:
            results.put(("won", db.compress_in_place(sid, kept)))
        except SessionCompressionInProgressError:
            results.put(("busy", None))


def _run(ctx, target, args, n=2):
    procs = [ctx.Process(target=target, args=args) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def _check_consistent(path: str, sid: str, original: list[dict], keep: int, generations: int) -> None:
    check = sqlite3.connect(path)
    live = check.execute("SELECT message_uid FROM messages WHERE session_id = ? AND active = 1 ORDER BY id",
                         (sid,)).fetchall()
    assert [r[0] for r in live] == [m["message_uid"] for m in original[-keep:]]
    archived = check.execute("SELECT COUNT(*) FROM messages WHERE session_id = ? AND active = 0 AND compacted = 1",
                             (sid,)).fetchone()[0]
    assert archived == len(original) + (generations - 1) * keep
    assert check.execute("SELECT message_count FROM sessions WHERE id = ?", (sid,)).fetchone()[0] == keep
    assert check.execute("SELECT COUNT(*) FROM compression_locks").fetchone()[0] == 0
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    check.close()


@pytest.mark.slow
def test_two_processes_racing_with_the_lock_exactly_one_wins(db):
    original = fill(db, "s", 12)
    ctx = multiprocessing.get_context("spawn")
    start, after_try, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    procs = _run(ctx, _compress_with_lock, (str(db.db_path), "s", 3, start, after_try, results))
    outcomes = sorted(results.get(timeout=120)[0] for _ in procs)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert outcomes == ["none", "won"]
    _check_consistent(str(db.db_path), "s", original, 3, generations=1)


def test_two_processes_compressing_without_the_lock_stay_consistent(db):
    original = fill(db, "s", 12)
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = _run(ctx, _compress_without_lock, (str(db.db_path), "s", 3, start, results))
    outcomes = [results.get(timeout=120)[0] for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    # BEGIN IMMEDIATE serialises them: both generations are whole, one after the other.
    assert outcomes == ["won", "won"]
    _check_consistent(str(db.db_path), "s", original, 3, generations=2)


def test_a_lockless_compress_while_another_process_holds_the_lock(db, rival):
    original = fill(db, "s")
    with SessionDB(db.db_path) as other:
        holder = other.acquire_compression_lock("s")
        with pytest.raises(SessionCompressionInProgressError):
            db.compress_in_place("s", original[-1:])
        assert db.acquire_compression_lock("s") is None
        other.compress_in_place("s", original[-2:], holder=holder)
        assert other.release_compression_lock("s", holder)
    assert [r["message_uid"] for r in rows(rival, "s", "active = 1")] == [m["message_uid"] for m in original[-2:]]


def test_search_sees_only_the_live_generation_unless_asked(db):
    db.create_session("gen", "cli")
    db.append_message("gen", "user", "please deploy the zeppelin service")
    db.append_message("gen", "assistant", "deploying zeppelin now; 東京 region")
    kept = db.get_messages_as_conversation("gen")[-1:]
    new_ids = db.compress_in_place("gen", kept)
    live = db.search_messages("zeppelin")
    assert [h["id"] for h in live] == new_ids
    everything = db.search_messages("zeppelin", include_inactive=True)
    assert len(everything) == 3  # two archived rows and the kept copy
    assert {h["id"] for h in db.search_messages("東京", include_inactive=True)} > set(new_ids)
    assert [h["id"] for h in db.search_messages("東京")] == new_ids


# --- leases under a caller-named holder -------------------------------------------------------------

def test_named_lease_excludes_other_holders_until_released(db, rival):
    assert db.try_acquire_compression_lock("s-lease", "compressor-a") is True
    assert db.try_acquire_compression_lock("s-lease", "compressor-b") is False
    assert db.get_compression_lock_holder("s-lease") == "compressor-a"
    # A late compressor cannot release what it does not hold.
    assert db.release_compression_lock("s-lease", "compressor-b") is False
    assert rival.execute("SELECT holder FROM compression_locks WHERE session_id = 's-lease'").fetchone()[0] \
        == "compressor-a"
    assert db.release_compression_lock("s-lease", "compressor-a") is True
    assert db.get_compression_lock_holder("s-lease") is None
    assert db.try_acquire_compression_lock("s-lease", "compressor-b") is True


def test_named_lease_needs_no_session_row_and_ignores_empty_ids(db, rival):
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    assert db.try_acquire_compression_lock("not-created-yet", "c") is True
    assert db.try_acquire_compression_lock("", "c") is False
    assert db.get_compression_lock_holder("") is None
    assert rival.execute("SELECT COUNT(*) FROM compression_locks WHERE session_id = ''").fetchone()[0] == 0


def test_named_lease_expires_and_refresh_only_extends_a_live_one(db, rival):
    import hermes_state_compression as module
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    original = module.time.time
    module.time.time = clock
    try:
        assert db.try_acquire_compression_lock("s", "a", ttl_seconds=10) is True
        assert db.refresh_compression_lock("s", "b", ttl_seconds=10) is False  # not b's
        now[0] = 1005.0
        assert db.refresh_compression_lock("s", "a", ttl_seconds=10) is True
        assert rival.execute("SELECT expires_at FROM compression_locks").fetchone()[0] == 1015.0
        now[0] = 1012.0
        assert db.try_acquire_compression_lock("s", "b") is False  # refreshed: still a's
        now[0] = 1016.0
        assert db.get_compression_lock_holder("s") is None
        assert db.refresh_compression_lock("s", "a", ttl_seconds=10) is False  # lost, never revived
        assert db.try_acquire_compression_lock("s", "b") is True
    finally:
        module.time.time = original


def test_named_lease_and_issued_holder_exclude_each_other(db):
    db.ensure_session("s2", "cli")
    assert db.try_acquire_compression_lock("s2", "named") is True
    assert db.acquire_compression_lock("s2") is None
    db.release_compression_lock("s2", "named")
    issued = db.acquire_compression_lock("s2")
    assert issued is not None
    assert db.try_acquire_compression_lock("s2", "named") is False
    assert db.get_compression_lock_holder("s2") == issued


@pytest.mark.parametrize("holder", ["", "   ", None, 7])
def test_named_lease_refuses_a_holder_that_names_nobody(db, holder):
    with pytest.raises(ValueError, match="holder"):
        db.try_acquire_compression_lock("s3", holder)


def test_named_lease_has_one_winner_among_racing_threads(tmp_path):
    import threading
    path = tmp_path / "race.db"
    handles = [SessionDB(path) for _ in range(6)]
    barrier, won = threading.Barrier(len(handles)), []

    def race(i: int) -> None:
        barrier.wait()
        won.append((handles[i].try_acquire_compression_lock("contended", f"t{i}"), i))
    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    holder = handles[0].get_compression_lock_holder("contended")
    winners = [i for got, i in won if got]
    assert len(won) == 6 and len(winners) == 1
    assert holder == f"t{winners[0]}"
    for h in handles:
        h.close()


# --- failure cooldown and fallback streak ------------------------------------------------------------

def test_failure_cooldown_round_trips_while_it_runs_and_clears(db, rival):
    db.create_session("s", "cli")
    until = time.time() + 600.0
    db.record_compression_failure_cooldown("s", until, "summary model timed out")
    state = db.get_compression_failure_cooldown("s")
    assert state is not None and state["cooldown_until"] == until and state["error"] == "summary model timed out"
    assert 0 < state["remaining_seconds"] <= 600.0
    db.clear_compression_failure_cooldown("s")
    assert db.get_compression_failure_cooldown("s") is None
    r = rival.execute("SELECT compression_failure_cooldown_until, compression_failure_error FROM sessions "
                      "WHERE id = 's'").fetchone()
    assert tuple(r) == (None, None)


def test_failure_cooldown_is_over_once_its_time_passed(conn, db):
    db.create_session("s", "cli")
    db.record_compression_failure_cooldown("s", 5000.0)
    state = compression.get_compression_failure_cooldown(conn, "s", now=4000.0)
    assert state == {"cooldown_until": 5000.0, "remaining_seconds": 1000.0, "error": None}
    assert compression.get_compression_failure_cooldown(conn, "s", now=5000.0) is None
    assert db.get_compression_failure_cooldown("s") is None  # 5000 s after the epoch is long gone
    # An expired cooldown is left in the row (reading never writes); a new record replaces it.
    assert conn.execute("SELECT compression_failure_cooldown_until FROM sessions").fetchone()[0] == 5000.0


@pytest.mark.parametrize("until, error", [("soon", None), (float("nan"), None), (-1.0, None), (None, None),
                                          (time.time() + 60, 5)],
                         ids=["text", "nan", "negative", "none", "a-minute-ahead"])
def test_failure_cooldown_refuses_bad_input_and_keeps_the_running_one(db, until, error):
    db.create_session("s", "cli")
    running = time.time() + 600.0
    db.record_compression_failure_cooldown("s", running, "first")
    with pytest.raises(ValueError, match="compression_failure"):
        db.record_compression_failure_cooldown("s", until, error)
    assert db.get_compression_failure_cooldown("s")["cooldown_until"] == running


def test_failure_cooldown_of_an_unknown_session(db):
    with pytest.raises(SessionNotFoundError):
        db.record_compression_failure_cooldown("nope", time.time() + 60.0, "x")
    with pytest.raises(SessionNotFoundError):
        db.clear_compression_failure_cooldown("nope")
    assert db.get_compression_failure_cooldown("nope") is None


def test_fallback_streak_round_trips_and_resets(db, rival):
    db.create_session("s", "cli")
    assert db.get_compression_fallback_streak("s") == 0
    db.set_compression_fallback_streak("s", 3)
    assert db.get_compression_fallback_streak("s") == 3
    assert rival.execute("SELECT compression_fallback_streak FROM sessions WHERE id = 's'").fetchone()[0] == 3
    db.set_compression_fallback_streak("s", 0)
    assert db.get_compression_fallback_streak("s") == 0


@pytest.mark.parametrize("streak", [-1, "3", 2.5, None, True])
def test_fallback_streak_refuses_a_value_that_is_not_a_count(db, streak):
    db.create_session("s", "cli")
    db.set_compression_fallback_streak("s", 2)
    with pytest.raises(ValueError, match="compression_fallback_streak"):
        db.set_compression_fallback_streak("s", streak)
    assert db.get_compression_fallback_streak("s") == 2


def test_fallback_streak_of_an_unknown_session(db):
    assert db.get_compression_fallback_streak("nope") == 0
    with pytest.raises(SessionNotFoundError):
        db.set_compression_fallback_streak("nope", 1)
