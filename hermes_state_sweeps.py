"""hermes-agent's two start-up sweeps: empty TUI ghost sessions, and compression continuations left open.

Owns: which sessions each sweep takes. A ghost is a TUI session (the TUI creates its row before
the first turn) that ended without a message or a title and started over a day ago; it is
deleted like every swept session, whole conversations only and never while work is owed, its
transcript files after COMMIT. An orphaned continuation is a session a compression created
whose process died before its first API call: still open, with message rows, no accounted call,
a parent compression ended, and started over a week ago; it is ended as 'orphaned_compression'.
Does not own: deleting rows or files (hermes_state_maintenance), the compression edge
(hermes_state_lineage).

Transaction contract: each sweep runs inside the caller's BEGIN IMMEDIATE transaction; the
files go only after its COMMIT.
"""
from __future__ import annotations

import os
import sqlite3
import time

from hermes_state_common import DAY_S
from hermes_state_lineage import COMPRESSION_END_REASON
from hermes_state_maintenance import Selection, delete_rows, plan_sweep, remove_transcripts
from hermes_state_writer import Transaction

GHOST_SOURCE = "tui"
GHOST_MIN_AGE_S = DAY_S
ORPHANED_COMPRESSION_REASON = "orphaned_compression"
ORPHANED_COMPRESSION_MIN_AGE_S = 7 * DAY_S


def prune_empty_ghost_sessions(conn: sqlite3.Connection, *, now: float | None = None) -> list[str]:
    """Delete TUI sessions ended without a message or title, started over a day ago; return their ids."""
    selection = Selection(
        "s.source = ? AND s.ended_at IS NOT NULL AND s.title IS NULL AND COALESCE(s.archived, 0) = 0 "
        "AND s.started_at < ? AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)",
        (GHOST_SOURCE, (time.time() if now is None else now) - GHOST_MIN_AGE_S))
    plan = plan_sweep(conn, selection, delegates=False)
    if plan.ids:
        delete_rows(conn, plan.ids)
    return plan.ids


def prune_empty_ghost_sessions_and_transcripts(txn: Transaction, sessions_dir: str | os.PathLike | None = None) -> int:
    """Delete the empty TUI ghost sessions (their transcript files after COMMIT); return how many."""
    removed = prune_empty_ghost_sessions(txn.conn)
    if removed:
        txn.after_commit(lambda: remove_transcripts(sessions_dir, removed))
    return len(removed)


def finalize_orphaned_compression_sessions(conn: sqlite3.Connection, *, now: float | None = None) -> int:
    """End, as 'orphaned_compression', week-old compression continuations that never made an API call; return how many."""
    now = time.time() if now is None else now
    return conn.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE ended_at IS NULL AND COALESCE(api_call_count, 0) = 0 "
        "AND started_at < ? AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id) "
        "AND EXISTS (SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id AND p.end_reason = ?)",
        (now, ORPHANED_COMPRESSION_REASON, now - ORPHANED_COMPRESSION_MIN_AGE_S, COMPRESSION_END_REASON)).rowcount
