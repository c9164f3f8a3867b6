"""Compression generations, rotation into a compression child, compression locks, and rewinding a transcript.

Owns: compressing a transcript in place (the current rows become the archive, the kept context
is re-inserted as the live generation with its message_uids), rotating a session into a
compression child, the cross-process `compression_locks` rows and the holders it issues
(`new_holder`), waiting for another holder to finish (`wait_for_compression`), and each
session's compression failure cooldown and fallback streak; the rewound rows (active=0,
compacted=0: taken out of the live transcript by a rewind, kept so `restore_rewound` can put them
back) and the session's `rewind_count`, and hermes-agent's names for archiving the live
generation (`archive_and_compact`, `compress_in_place` under the name that program calls) and for
asking whether a session keeps rows outside its live transcript (`has_archived_messages`).
Does not own: the message rows
themselves (hermes_state_messages writes them and keeps the counters), the transcript guard
(`check_transcript_writable` and the retry of `write_transcript`, beside the message rows in
hermes_state_messages), whether a holder is alive (hermes_state_lockowners), the compression edge and its
walks (hermes_state_lineage), the conversation.

Transaction contract: every function taking `conn` runs inside the caller's transaction (the
facade opens one BEGIN IMMEDIATE per public write) and never opens or commits one itself; an
exception part-way leaves the rollback to the caller, so a write is all or nothing.
`wait_for_compression` is the exception: it polls through short reads between sleeps and must
be called OUTSIDE any write transaction, so the compressor it waits for can commit; and
`transcript_write` opens its own transactions through the callable it is given.
"""
from __future__ import annotations

import os
import random
import sqlite3
import time
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable

import hermes_state_lineage as lineage
import hermes_state_messages as messages
import hermes_state_sessions as sessions
from hermes_state_common import (COMPRESSION_WAIT_S, SESSIONS, Keywords, check_count, check_id, check_number, decode_json,
                                 encode_json, logger, recount_sql)
from hermes_state_lineage import COMPRESSION_END_REASON
from hermes_state_lockowners import lock_is_live, own_pidns
from hermes_state_messages import check_named_holder as _check_named_holder, lease_row as _lease_row
from hermes_state_messages import decoded_rows, message_list, turn_lease_key
from hermes_state_errors import CompressionSessionBusyError, SessionCompressionInProgressError, SessionNotFoundError

DEFAULT_LOCK_TTL_S = 300.0
POLL_MIN_S, POLL_MAX_S = 0.05, 0.10

# Columns a rotation child takes from its parent unless the caller overrides them: who the
# conversation belongs to, where the gateway routes it, and the workspace it runs in. Titles
# (unique), prompts, billing and counters are per session and start fresh.
INHERITED_COLUMNS = ("source", "model", "model_config", "user_id", "session_key", "chat_id", "chat_type",
                     "thread_id", "display_name", "origin_json", "cwd", "git_branch", "git_repo_root",
                     "profile_name", "transport_profile")

# --- holders and locks ----------------------------------------------------------------------------

def new_holder() -> str:
    """Return a fresh holder string for this process: `pid=<n> host=<name> pidns=<id|-> token=<hex>`."""
    import socket  # here, not at start-up: uuid and socket take a tenth of `import hermes_state`
    import uuid
    return f"pid={os.getpid()} host={socket.gethostname()} pidns={own_pidns()} token={uuid.uuid4().hex}"


def _lock_row(conn: sqlite3.Connection, session_id: str) -> tuple[str, float] | None:
    return conn.execute("SELECT holder, expires_at FROM compression_locks WHERE session_id = ?",
                        (session_id,)).fetchone()


def foreign_lock_holder(conn: sqlite3.Connection, session_id: str, holder: str | None = None, *,
                        now: float | None = None) -> str | None:
    """Return the holder of a live compression lock on the session that is not `holder`, else None.

    Expired locks and locks whose holder process is provably gone do not count.
    """
    row = _lock_row(conn, session_id)
    if row is None or row[0] == holder:
        return None
    return row[0] if lock_is_live(row[0], row[1], time.time() if now is None else now) else None


# --- compression locks ----------------------------------------------------------------------------

def acquire_compression_lock(conn: sqlite3.Connection, session_id: str, ttl_s: float = DEFAULT_LOCK_TTL_S, *,
                             now: float | None = None) -> str | None:
    """Take the session's compression lock for `ttl_s` seconds; return the new holder, or None if held.

    A lock that expired, or whose holder process on this host is provably gone, is reclaimed
    in the same transaction. Each call issues a new holder, so a second acquire by the same
    process gets None while the first is live (locks are not re-entrant).
    """
    ttl_s = check_number("ttl_s", ttl_s, positive=True)
    now = time.time() if now is None else now
    _require_open(conn, session_id)
    row = _lock_row(conn, session_id)
    if row is not None:
        if lock_is_live(row[0], row[1], now):
            return None
        logger.info("reclaiming compression lock of session %r from %s (%s)", session_id, row[0],
                    "expired" if row[1] <= now else "holder process is gone")
    holder = new_holder()
    conn.execute("INSERT INTO compression_locks (session_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, "
                 "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at",
                 (session_id, holder, now, now + ttl_s))
    return holder


def release_compression_lock(conn: sqlite3.Connection, session_id: str, holder: str) -> bool:
    """Release the lock if `holder` still holds it; return whether a lock was released."""
    if not isinstance(holder, str) or not holder:
        raise ValueError("holder must be the non-empty string acquire_compression_lock returned")
    return conn.execute("DELETE FROM compression_locks WHERE session_id = ? AND holder = ?",
                        (session_id, holder)).rowcount == 1


# --- leases under a caller-named holder --------------------------------------------------------
# hermes-agent's callers name their own holder (a compressor's id) and hold the lock as a lease
# they refresh. The row is the same as above, so both styles exclude each other; no session row
# is needed, because a compressor may take the lease before the session's first write.

def try_acquire_compression_lock(conn: sqlite3.Connection, session_id: str, holder: str,
                                 ttl_seconds: float = DEFAULT_LOCK_TTL_S, *, now: float | None = None) -> bool:
    """Take or renew the session's compression lease for `holder`; False when another holds it live.

    An empty session id is never locked (False). A lease that expired, or whose holder process
    on this host is provably gone, is taken over in the same transaction.
    """
    if not session_id:
        return False
    holder = _check_named_holder(holder)
    ttl_seconds = check_number("ttl_seconds", ttl_seconds, positive=True)
    now = time.time() if now is None else now
    row = _lock_row(conn, session_id)
    if row is not None and row[0] != holder and lock_is_live(row[0], row[1], now):
        return False
    conn.execute("INSERT INTO compression_locks (session_id, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (session_id) DO UPDATE SET holder = excluded.holder, "
                 "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at",
                 (session_id, holder, now, now + ttl_seconds))
    return True


def refresh_compression_lock(conn: sqlite3.Connection, session_id: str, holder: str,
                             ttl_seconds: float = DEFAULT_LOCK_TTL_S, *, now: float | None = None) -> bool:
    """Extend `holder`'s live lease by `ttl_seconds` from now; False when it does not hold one.

    A lease that already expired is not revived: someone else may have compressed meanwhile.
    """
    holder = _check_named_holder(holder)
    ttl_seconds = check_number("ttl_seconds", ttl_seconds, positive=True)
    now = time.time() if now is None else now
    return conn.execute("UPDATE compression_locks SET expires_at = ? "
                        "WHERE session_id = ? AND holder = ? AND expires_at > ?",
                        (now + ttl_seconds, session_id, holder, now)).rowcount == 1


def get_compression_lock_holder(conn: sqlite3.Connection, session_id: str, *, now: float | None = None) -> str | None:
    """Return who holds the session's live compression lock, or None (expired locks do not count)."""
    row = _lock_row(conn, session_id) if session_id else None
    if row is None or not lock_is_live(row[0], row[1], time.time() if now is None else now):
        return None
    return row[0]


def _check_holder(conn: sqlite3.Connection, session_id: str, holder: str | None, now: float) -> None:
    """Raise SessionCompressionInProgressError unless the caller may compress the session now.

    Without a holder: no other live lock may exist. With one: it must be the session's
    current, unexpired lock (an expired or released lock may have let someone else in, so
    the kept context the caller computed can be stale).
    """
    row = _lock_row(conn, session_id)
    if holder is None:
        if row is not None and lock_is_live(row[0], row[1], now):
            raise SessionCompressionInProgressError(
                f"session {session_id!r} is being compressed by {row[0]}; nothing was written, "
                "retry after it finishes")
        return
    if row is None or row[0] != holder or row[1] <= now:
        why = ("it is held by " + row[0]) if row is not None and row[0] != holder else "it expired or was released"
        raise SessionCompressionInProgressError(
            f"{holder} does not hold the compression lock of session {session_id!r} ({why}); nothing was "
            "written: acquire the lock again and recompute the kept context")


# --- failure cooldown and fallback streak ---------------------------------------------------------
# Per-session memory of how compression went, so a restarted agent does not retry a failing
# compression at once, nor forget how many turns in a row fell back to a cheaper one.

def _set_session(conn: sqlite3.Connection, session_id: str, assignments: str, params: tuple) -> None:
    if conn.execute(f"UPDATE sessions SET {assignments} WHERE id = ?", (*params, session_id)).rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


def record_compression_failure_cooldown(conn: sqlite3.Connection, session_id: str, cooldown_until: float,
                                        error: str | None = None) -> None:
    """Hold compression of the session off until `cooldown_until` (epoch seconds), noting the failure's `error`."""
    until = SESSIONS.column("compression_failure_cooldown_until").check(cooldown_until)
    text = None if error is None else SESSIONS.column("compression_failure_error").check(error)
    _set_session(conn, session_id, "compression_failure_cooldown_until = ?, compression_failure_error = ?",
                 (until, text))


def get_compression_failure_cooldown(conn: sqlite3.Connection, session_id: str, *,
                                     now: float | None = None) -> dict[str, Any] | None:
    """Return {"cooldown_until", "remaining_seconds", "error"} while a cooldown runs; None when none (or unknown)."""
    row = conn.execute("SELECT compression_failure_cooldown_until, compression_failure_error FROM sessions "
                       "WHERE id = ?", (session_id,)).fetchone()
    now = time.time() if now is None else now
    if row is None or not isinstance(row[0], (int, float)) or row[0] <= now:
        return None  # an expired cooldown is simply over; the row keeps it until cleared
    return {"cooldown_until": row[0], "remaining_seconds": row[0] - now, "error": row[1]}


def clear_compression_failure_cooldown(conn: sqlite3.Connection, session_id: str) -> None:
    """Forget the session's compression failure cooldown and its error."""
    _set_session(conn, session_id, "compression_failure_cooldown_until = NULL, compression_failure_error = NULL", ())


def get_compression_fallback_streak(conn: sqlite3.Connection, session_id: str) -> int:
    """Return how many compressions in a row fell back for the session (0 when none, or unknown)."""
    row = conn.execute("SELECT compression_fallback_streak FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row[0] if row is not None and isinstance(row[0], int) else 0


def set_compression_fallback_streak(conn: sqlite3.Connection, session_id: str, streak: int) -> None:
    """Store how many compressions in a row fell back for the session (0 resets it)."""
    _set_session(conn, session_id, "compression_fallback_streak = ?",
                 (SESSIONS.column("compression_fallback_streak").check(streak),))


# --- transcript write checks ----------------------------------------------------------------------

def _require_continuable(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    # A session a compression child may continue: it exists, is not closed by compression, and has not ended.
    parent = _require_open(conn, session_id)
    if parent["ended_at"] is not None:
        raise ValueError(f"session {session_id!r} already ended (end_reason={parent['end_reason']!r}); "
                         "reopen it before continuing it by compression")
    return parent


def _require_open(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    row = sessions.get_session(conn, session_id)
    if row is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    if row["end_reason"] == COMPRESSION_END_REASON:
        raise messages.closed_error(conn, session_id)
    return row


def wait_for_compression(read: Callable[[], AbstractContextManager[sqlite3.Connection]], session_id: str, *,
                         holder: str | None = None, timeout_s: float = COMPRESSION_WAIT_S,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait up to `timeout_s` until no other holder's live lock is on the session, else raise.

    `read()` opens a short read (the facade's `_read`); each poll is one SELECT, and the
    sleeps between polls hold no lock at all. Raises SessionCompressionInProgressError when
    time runs out, and at once when called inside a write transaction of this thread
    (sleeping there would hold the write lock the compressor needs to finish).
    """
    deadline = clock() + timeout_s
    while True:
        with read() as conn:
            nested = conn.in_transaction
            blocker = foreign_lock_holder(conn, session_id, holder)
        if blocker is None:
            return
        remaining = deadline - clock()
        if nested or remaining <= 0:
            raise SessionCompressionInProgressError(
                f"session {session_id!r} is being compressed by {blocker}; waited {max(timeout_s, 0):.1f}s, "
                "the transcript write was not made: retry after the compression finishes")
        sleep(min(random.uniform(POLL_MIN_S, POLL_MAX_S), remaining))


def transcript_write(write: Callable[[], AbstractContextManager[sqlite3.Connection]],
                     read: Callable[[], AbstractContextManager[sqlite3.Connection]], session_id: str,
                     body: Callable[[sqlite3.Connection], Any], *, wait_s: float = COMPRESSION_WAIT_S) -> Any:
    """Run `body(conn)` in a write transaction (`write()`) after `check_transcript_writable`; return its result.

    The common case costs one indexed lookup inside the transaction. Only when another holder
    is compressing the session does it leave the transaction, wait (holding no lock) up to
    `wait_s` with `wait_for_compression`, and try once more. (The handle calls
    hermes_state_messages.write_transcript itself, so a write runs no code of this module.)
    """
    return messages.write_transcript(write, session_id, body,
                                     lambda: wait_for_compression(read, session_id, timeout_s=wait_s))


# --- generations ---------------------------------------------------------------------------------

def _insert_kept(conn: sqlite3.Connection, session_id: str, kept: list[dict[str, Any]]) -> list[int]:
    ids = []
    for index, message in enumerate(messages.with_stored_fields(conn, session_id, kept)):
        try:
            ids.append(messages.insert_message(conn, session_id, message))
        except ValueError as exc:
            # The caller's transaction rolls back everything written so far.
            raise ValueError(f"kept message {index}: {exc}") from exc
    return ids


def compress_in_place(conn: sqlite3.Connection, session_id: str, kept_messages: Iterable[dict[str, Any]], *,
                      holder: str | None = None, now: float | None = None) -> list[int]:
    """Archive the session's live rows and re-insert `kept_messages` as the live generation; return their ids.

    The current active rows become the archive (active=0, compacted=1); each kept message
    becomes a new active row keeping its message_uid (a fresh one when absent); fields a
    conversation dict does not carry (timestamp, observed, display fields, token count, ...)
    come from the stored row of that uid unless the dict gives them. A message kept from the old generation therefore exists in both,
    same uid and content: that is correct, never a duplicate to remove. message_count and
    tool_call_count then describe the kept rows only, and an archive only the idle sweep made
    is lifted. One message_uid in two kept messages raises ValueError before any write. Must
    run inside one write transaction; on any error the caller rolls back.
    """
    kept = messages.message_list(kept_messages, "kept message")
    now = time.time() if now is None else now
    _require_open(conn, session_id)
    _check_holder(conn, session_id, holder, now)
    conn.execute("UPDATE messages SET active = 0, compacted = 1 WHERE session_id = ? AND active = 1", (session_id,))
    # The live generation is empty now; insert_message counts the kept rows back in.
    sessions.reset_counters(conn, session_id, resumed_at=now)
    return _insert_kept(conn, session_id, kept)


def rotate_session(conn: sqlite3.Connection, parent_id: str, child_id: str, kept_messages: Iterable[dict[str, Any]],
                   child_columns: Keywords | None = None, *, holder: str | None = None,
                   now: float | None = None) -> str:
    """Continue the parent in a new child session holding `kept_messages`; return the child id.

    The child gets parent_session_id = parent and the parent's INHERITED_COLUMNS (routing,
    owner, workspace) unless `child_columns` overrides them (None clears one); the parent is
    ended with end_reason='compression' at the child's started_at (the same float: that is the
    compression edge, so `started_at` may not be passed); kept messages are copied with their uids. A parent
    compression already closed raises SessionClosedByCompressionError naming its live
    continuation; a parent ended for another reason raises ValueError (reopen it first).
    An archive only the idle sweep made on the parent is lifted; the child inherits no archive.
    The lock rules of compress_in_place apply to the parent. Must run inside one write transaction.
    """
    kept = messages.message_list(kept_messages, "kept message")
    columns = dict(child_columns or {})
    if "parent_session_id" in columns:
        raise ValueError("parent_session_id of a rotation child is always the parent; do not pass it")
    if "started_at" in columns:
        # The compression edge is child.started_at == parent.ended_at (hermes_state_lineage.COMPRESSION_CHILD_SQL).
        raise ValueError("started_at of a rotation child is the moment its parent ends; do not pass it")
    now = time.time() if now is None else now
    parent = _require_continuable(conn, parent_id)
    _check_holder(conn, parent_id, holder, now)
    values = {name: parent[name] for name in INHERITED_COLUMNS}
    values.update(columns)
    values["parent_session_id"] = parent_id
    values["started_at"] = now  # the same float as the parent's ended_at: that equality is the edge
    source = values.pop("source")
    # insert_session validates the id (duplicate, empty), the columns and the title before it
    # inserts; the parent is ended only after that succeeded.
    sessions.insert_session(conn, child_id, source, values)
    sessions.close_for_compression(conn, parent_id, now=now)
    # Continuing by compression resumes the conversation, as compress_in_place does.
    sessions.lift_auto_archive(conn, parent_id)
    _insert_kept(conn, child_id, kept)
    return child_id


# --- hermes-agent 0.20.1: transcript, turn leases and compression ---------------------------------
# A turn lease is one process's claim on a conversation for one turn, so two processes never
# interleave their replies. The row is keyed by the compression lineage's root (table
# session_turn_leases, as hermes-agent 0.20.1 keeps it), so a rotation does not free the
# conversation; no session row is needed, because a turn may start before the session's first
# write. A lease past expires_at, or whose holder process is provably gone, may be taken over.

def _lease_session(session_id: Any) -> str | None:
    # An empty id names no conversation (None: "not acquired", as hermes-agent answers).
    if session_id is None or session_id == "":
        return None
    return check_id("session_id", session_id)


def try_acquire_session_turn_lease(conn: sqlite3.Connection, session_id: str, holder: str, *,
                                   ttl_seconds: float = DEFAULT_LOCK_TTL_S, patience_s: float | None = None,
                                   now: float | None = None) -> bool:
    """Take or renew the conversation's turn lease for `holder`; False while another holds it live.

    The lease is kept under the compression lineage's root. An expired lease, or one whose
    holder process on this host is provably gone, is taken over in the same transaction. An
    empty session id is never leased (False). `patience_s` bounds the wait for the write lock.
    """
    holder = _check_named_holder(holder)
    ttl_seconds = check_number("ttl_seconds", ttl_seconds, positive=True)
    if patience_s is not None:
        check_number("patience_s", patience_s)
    sid = _lease_session(session_id)
    if sid is None:
        return False
    now = time.time() if now is None else now
    key = turn_lease_key(conn, sid)
    row = _lease_row(conn, key)
    if row is not None and row[0] != holder and lock_is_live(row[0], row[1], now):
        return False
    if row is not None and row[0] != holder:
        logger.info("taking over the turn lease of conversation %r from %s (%s)", key, row[0],
                    "expired" if row[1] <= now else "holder process is gone")
    conn.execute("INSERT INTO session_turn_leases (conversation_id, holder, acquired_at, expires_at) "
                 "VALUES (?, ?, ?, ?) ON CONFLICT (conversation_id) DO UPDATE SET holder = excluded.holder, "
                 "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at",
                 (key, holder, now, now + ttl_seconds))
    return True


def refresh_session_turn_lease(conn: sqlite3.Connection, session_id: str, holder: str, *,
                               ttl_seconds: float = DEFAULT_LOCK_TTL_S, now: float | None = None) -> bool:
    """Extend `holder`'s turn lease to `ttl_seconds` from now; False when another holder has it or none exists.

    A lease that expired but was not taken over is still `holder`'s: nobody else wrote a turn
    meanwhile, so it is extended too.
    """
    holder = _check_named_holder(holder)
    ttl_seconds = check_number("ttl_seconds", ttl_seconds, positive=True)
    sid = _lease_session(session_id)
    if sid is None:
        return False
    now = time.time() if now is None else now
    return conn.execute("UPDATE session_turn_leases SET expires_at = ? WHERE conversation_id = ? AND holder = ?",
                        (now + ttl_seconds, turn_lease_key(conn, sid), holder)).rowcount == 1


def release_session_turn_lease(conn: sqlite3.Connection, session_id: str, holder: str) -> None:
    """Release the conversation's turn lease if `holder` holds it (idempotent)."""
    holder = _check_named_holder(holder)
    sid = _lease_session(session_id)
    if sid is not None:
        conn.execute("DELETE FROM session_turn_leases WHERE conversation_id = ? AND holder = ?",
                     (turn_lease_key(conn, sid), holder))


def acquire_session_turn_lease(attempt: Callable[[], bool], *, wait_seconds: float = 1800.0,
                               poll_interval_seconds: float = 1.0, on_wait: Callable[[float], Any] | None = None,
                               wait_notice_interval_seconds: float = 15.0,
                               should_abort: Callable[[], bool] | None = None,
                               clock: Callable[[], float] = time.monotonic,
                               sleep: Callable[[float], None] = time.sleep) -> bool:
    """Call `attempt()` (one short try) until it answers True or `wait_seconds` pass; return whether it did.

    Holds no lock between attempts. `should_abort()` True stops the wait at once (False);
    `on_wait(elapsed)` is told after the first refusal and then every `wait_notice_interval_seconds`;
    an error it raises is logged and ignored. Must be called OUTSIDE any write transaction.
    """
    wait_seconds = check_number("wait_seconds", wait_seconds)
    poll = check_number("poll_interval_seconds", poll_interval_seconds, positive=True)
    every = check_number("wait_notice_interval_seconds", wait_notice_interval_seconds, positive=True)
    start = clock()
    next_notice = 0.0
    while True:
        if should_abort is not None and should_abort():
            return False
        if attempt():
            return True
        elapsed = clock() - start
        if on_wait is not None and elapsed >= next_notice:
            next_notice = elapsed + every
            try:
                on_wait(elapsed)
            except Exception:  # a progress notice must never end the wait
                logger.warning("turn lease on_wait callback failed", exc_info=True)
        if elapsed >= wait_seconds:
            return False
        sleep(min(poll, wait_seconds - elapsed))


# --- per-session compression bookkeeping ----------------------------------------------------------

def get_compression_ineffective_count(conn: sqlite3.Connection, session_id: str) -> int:
    """Return how many compressions in a row freed too little for the session (0 when none, or unknown)."""
    row = conn.execute("SELECT compression_ineffective_count FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return row[0] if row is not None and isinstance(row[0], int) else 0


def set_compression_ineffective_count(conn: sqlite3.Connection, session_id: str, count: int) -> None:
    """Store how many compressions in a row freed too little for the session (0 resets it)."""
    _set_session(conn, session_id, "compression_ineffective_count = ?", (check_count("count", count),))


_COOLDOWN_KEYS = ("session_exists", "cooldown_until", "error")


def get_compression_failure_cooldown_row(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    """Return {"session_exists", "cooldown_until", "error"} as stored, an expired cooldown included."""
    row = conn.execute("SELECT compression_failure_cooldown_until, compression_failure_error FROM sessions "
                       "WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        return {"session_exists": False, "cooldown_until": None, "error": None}
    return {"session_exists": True, "cooldown_until": row[0], "error": row[1]}


def restore_compression_failure_cooldown_row(conn: sqlite3.Connection, session_id: str,
                                             snapshot: dict[str, Any]) -> None:
    """Put back a cooldown exactly as `get_compression_failure_cooldown_row` read it, and verify it.

    A snapshot of an absent session restores nothing while the session is still absent; once
    it exists, that snapshot cannot be restored (RuntimeError). A snapshot naming a session
    that no longer exists is a RuntimeError too: the rollback could not be made.
    """
    if not isinstance(snapshot, dict):
        raise ValueError(f"snapshot must be the dict get_compression_failure_cooldown_row returned, "
                         f"not {type(snapshot).__name__}")
    unknown = set(snapshot) - set(_COOLDOWN_KEYS)
    if unknown:
        raise ValueError(f"snapshot has unknown keys {sorted(unknown)}; expected {list(_COOLDOWN_KEYS)}")
    until, error = snapshot.get("cooldown_until"), snapshot.get("error")
    if until is not None:
        until = SESSIONS.column("compression_failure_cooldown_until").check(until)
    if error is not None:
        error = SESSIONS.column("compression_failure_error").check(error)
    exists = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None
    if not snapshot.get("session_exists"):
        if exists:
            raise RuntimeError(f"cannot restore the compression cooldown of session {session_id!r}: the snapshot "
                               "was taken while it did not exist, and it exists now")
        return
    if not exists:
        raise RuntimeError(f"cannot restore the compression cooldown of session {session_id!r}: it no longer exists")
    conn.execute("UPDATE sessions SET compression_failure_cooldown_until = ?, compression_failure_error = ? "
                 "WHERE id = ?", (until, error, session_id))
    stored = get_compression_failure_cooldown_row(conn, session_id)
    if (stored["cooldown_until"], stored["error"]) != (until, error):
        raise RuntimeError(f"the restored compression cooldown of session {session_id!r} did not read back")


def get_active_message_watermark(conn: sqlite3.Connection, session_id: str) -> int:
    """Return the highest id among the session's live rows (0 when none, or unknown): where a compression starts."""
    row = conn.execute("SELECT MAX(id) FROM messages WHERE session_id = ? AND active = 1", (session_id,)).fetchone()
    return row[0] or 0


def tail_rows(conn: sqlite3.Connection, session_id: str, watermark: int | None,
               ceiling: int | None = None) -> list[dict[str, Any]]:
    """Return the live rows that arrived after `watermark` (up to `ceiling`), as get_messages gives them."""
    if watermark is None:
        return []
    watermark = check_count("watermark", watermark)
    if ceiling is not None:
        ceiling = check_count("watermark_ceiling", ceiling)
    return [row for row in messages.get_messages(conn, session_id)
            if row["id"] > watermark and (ceiling is None or row["id"] <= ceiling)]


def publish_compression_child(conn: sqlite3.Connection, *, parent_session_id: str, child_session_id: str,
                              source: str, messages: list[dict[str, Any]], model: str | None = None,
                              model_config: dict[str, Any] | None = None, system_prompt: str | None = None,
                              cwd: str | None = None, profile_name: str | None = None,
                              compression_lock_holder: str | None = None, require_compression_lease: bool = True,
                              watermark: int | None = None, watermark_ceiling: int | None = None,
                              now: float | None = None) -> None:
    """Close the parent and publish its compression child holding `messages`, in one transaction.

    `rotate_session` under hermes-agent 0.20.1's name: the child continues the parent (the
    compression edge), the given columns override what it inherits. With
    `require_compression_lease`, `compression_lock_holder` must hold the parent's live
    compression lock (CompressionSessionBusyError otherwise). With `watermark`, the parent's
    live rows after it (up to `watermark_ceiling`) are copied after the handoff, so a message
    appended while the summary was written is not lost. An empty handoff is a ValueError.
    """
    kept = message_list(messages, "handoff message")
    if not kept:
        raise ValueError("a compression child's handoff must hold at least one message")
    now = time.time() if now is None else now
    parent = _require_continuable(conn, parent_session_id)
    if require_compression_lease:
        row = _lock_row(conn, parent_session_id)
        if compression_lock_holder is None or row is None or row[0] != compression_lock_holder or row[1] <= now:
            raise CompressionSessionBusyError(
                f"{compression_lock_holder or 'the caller'} does not hold the compression lock of session "
                f"{parent_session_id!r}; the compression child was not published")
    tail = tail_rows(conn, parent_session_id, watermark, watermark_ceiling)
    given = {"source": source, "model": model, "model_config": model_config, "system_prompt": system_prompt,
             "cwd": cwd, "profile_name": profile_name}
    columns = {name: value for name, value in given.items() if value is not None}
    rotate_session(conn, parent_session_id, child_session_id, [*kept, *tail], columns,
                   holder=compression_lock_holder if require_compression_lease else None, now=now)


def find_live_compression_child(conn: sqlite3.Connection, parent_session_id: str) -> dict[str, Any] | None:
    """Return the session row continuing a session compression closed, while it is live; else None."""
    row = conn.execute(f"SELECT {lineage.COMPRESSION_CHILD_SQL} FROM sessions p WHERE p.id = ?",
                       (parent_session_id,)).fetchone()
    if row is None or row[0] is None:
        return None
    child = sessions.get_session(conn, row[0])
    return child if child is not None and child["ended_at"] is None else None


def reopen_orphaned_compression_session(conn: sqlite3.Connection, session_id: str, *,
                                        now: float | None = None) -> bool:
    """Reopen a session compression closed without publishing any child; False in every other case.

    A live compression lock on it, or any child at all, means another path owns the
    conversation, so it stays closed.
    """
    row = conn.execute("SELECT end_reason FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None or row[0] != COMPRESSION_END_REASON:
        return False
    if foreign_lock_holder(conn, session_id, now=now) is not None:
        return False
    if conn.execute("SELECT 1 FROM sessions WHERE parent_session_id = ? LIMIT 1", (session_id,)).fetchone():
        return False
    sessions.reopen_session(conn, session_id)
    return True


# --- rewinding a transcript to an earlier user turn, restoring it, archiving by compaction ---

_RECOUNT_SQL = recount_sql() + " WHERE id = ?"


def _check_row_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a message row id (an int), not {value!r}")
    return value


def rewind_to_message(conn: sqlite3.Connection, session_id: str, target_message_id: int) -> dict[str, Any]:
    """Take the live user turn `target_message_id` and every later live row out of the transcript; return what moved.

    Returns {"rewound_count", "target_message" (the row as get_messages gave it before the
    rewind), "new_head_id" (the last live row left, or None)}. The rows are kept, and
    `restore_rewound` puts them back. A target that is not a live row of the session (an unknown
    session has none), or not a user turn, raises ValueError and changes nothing.
    """
    _check_row_id("target_message_id", target_message_id)
    found = decoded_rows(conn, "SELECT * FROM messages WHERE id = ? AND session_id = ? AND active = 1",
                         (target_message_id, session_id))
    if not found:
        raise ValueError(f"message {target_message_id} not found in session {session_id}")
    target = found[0]
    if target["role"] != "user":
        raise ValueError(f"rewind target must be a 'user' message (got role={target['role']!r}, id={target_message_id})")
    rewound = conn.execute("UPDATE messages SET active = 0 WHERE session_id = ? AND active = 1 AND id >= ?",
                           (session_id, target_message_id)).rowcount
    head = conn.execute("SELECT MAX(id) FROM messages WHERE session_id = ? AND active = 1", (session_id,)).fetchone()[0]
    conn.execute("UPDATE sessions SET rewind_count = COALESCE(rewind_count, 0) + 1 WHERE id = ?", (session_id,))
    conn.execute(_RECOUNT_SQL, (session_id,))
    return {"rewound_count": rewound, "target_message": target, "new_head_id": head}


def restore_rewound(conn: sqlite3.Connection, session_id: str, since_message_id: int) -> int:
    """Put the session's rewound rows from `since_message_id` on back into the live transcript; return how many."""
    _check_row_id("since_message_id", since_message_id)
    restored = conn.execute("UPDATE messages SET active = 1 WHERE session_id = ? AND active = 0 AND compacted = 0 "
                            "AND id >= ?", (session_id, since_message_id)).rowcount
    if restored:
        conn.execute(_RECOUNT_SQL, (session_id,))
    return restored


def has_archived_messages(conn: sqlite3.Connection, session_id: str) -> bool:
    """True when the session keeps rows outside its live transcript (rewound, or archived by compaction)."""
    return conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND active = 0 LIMIT 1",
                        (session_id,)).fetchone() is not None


def archive_and_compact(conn: sqlite3.Connection, session_id: str, compacted_messages: Iterable[dict[str, Any]],
                        model_config_patch: dict[str, Any] | None = None, watermark: int | None = None,
                        lock_holder: str | None = None, *, now: float | None = None) -> int:
    """Archive the live transcript and make `compacted_messages` the new one (compress_in_place); return how many.

    With `watermark` (get_active_message_watermark at the compression's start), live rows
    appended after it follow the compacted messages instead of being archived away.
    `lock_holder` must still hold the session's compression lock at commit. `model_config_patch`
    is merged into the session's model_config in the same transaction (a None value removes a key).
    """
    if model_config_patch is not None and not isinstance(model_config_patch, dict):
        raise ValueError(f"model_config_patch must be a dict or None, not {type(model_config_patch).__name__}")
    kept = [*compacted_messages, *tail_rows(conn, session_id, watermark)]
    written = len(compress_in_place(conn, session_id, kept, holder=lock_holder, now=now))
    if model_config_patch:
        row = conn.execute("SELECT model_config FROM sessions WHERE id = ?", (session_id,)).fetchone()
        config = decode_json(row[0]) if row and row[0] is not None else {}
        config = dict(config) if isinstance(config, dict) else {}
        for key, value in model_config_patch.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        conn.execute("UPDATE sessions SET model_config = ? WHERE id = ?",
                     (encode_json(config, "model_config") if config else None, session_id))
    return written
