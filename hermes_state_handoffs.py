"""Session handoffs: moving a live conversation to another platform, as three columns of its session row.

Owns: the handoff lifecycle kept in `sessions.handoff_state`, `handoff_platform` and
`handoff_error` (hermes-agent's columns, in its meaning): a request makes it `pending`, the
platform that takes it over claims it (`running`), and it ends `completed` or `failed` (with
the error). A new request is accepted only when no handoff is pending or running; completing
or failing is recorded whatever the state was, since the platform that did the work is the one
that knows. The yes/no calls answer False for an unknown session, as hermes-agent's gateway
expects; recording an end for one raises SessionNotFoundError, as every write naming no session.
Does not own: the session rows' other columns (hermes_state_sessions) or the gateway's routing
entries (hermes_state_routing).

Transaction contract: writes run inside the caller's BEGIN IMMEDIATE transaction; each one is
a single compare-and-set UPDATE, so a refused call changes nothing. Reads run under the
caller's lock.
"""
from __future__ import annotations

import sqlite3
from typing import Any

from hermes_state_common import SESSION_ROW_SQL, check_id, replace_surrogates, session_dicts
from hermes_state_errors import SessionNotFoundError

PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"
# The states in which a handoff is still under way: a new request waits until it ends.
_OPEN_STATES = (PENDING, RUNNING)


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    return replace_surrogates(value) or ""


def request_handoff(conn: sqlite3.Connection, session_id: str, platform: str) -> bool:
    """Ask for the session to move to `platform`; False when it is unknown or a handoff is still under way."""
    check_id("session_id", session_id)
    check_id("platform", platform)
    return conn.execute(
        "UPDATE sessions SET handoff_state = ?, handoff_platform = ?, handoff_error = NULL "
        "WHERE id = ? AND (handoff_state IS NULL OR handoff_state NOT IN (?, ?))",
        (PENDING, platform, session_id, *_OPEN_STATES)).rowcount > 0


def claim_handoff(conn: sqlite3.Connection, session_id: str) -> bool:
    """Take a pending handoff over (it becomes running); False when none is pending."""
    check_id("session_id", session_id)
    return conn.execute("UPDATE sessions SET handoff_state = ? WHERE id = ? AND handoff_state = ?",
                        (RUNNING, session_id, PENDING)).rowcount > 0


def _record_end(conn: sqlite3.Connection, session_id: str, state: str, error: str | None) -> None:
    check_id("session_id", session_id)
    if conn.execute("UPDATE sessions SET handoff_state = ?, handoff_error = ? WHERE id = ?",
                    (state, error, session_id)).rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


def complete_handoff(conn: sqlite3.Connection, session_id: str) -> None:
    """Record the handoff as completed (its error cleared); an unknown session raises SessionNotFoundError."""
    _record_end(conn, session_id, COMPLETED, None)


def fail_handoff(conn: sqlite3.Connection, session_id: str, error: str) -> None:
    """Record the handoff as failed with `error`; an unknown session raises SessionNotFoundError."""
    _record_end(conn, session_id, FAILED, _check_text("error", error))


def get_handoff_state(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return {"state", "platform", "error"} of the session's handoff (all None before any), or None when unknown."""
    row = conn.execute("SELECT handoff_state, handoff_platform, handoff_error FROM sessions WHERE id = ?",
                       (session_id,)).fetchone()
    return None if row is None else {"state": row[0], "platform": row[1], "error": row[2]}


def list_pending_handoffs(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Return the full rows of the sessions whose handoff is pending, oldest session first."""
    return session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.handoff_state = ? "
                                  "ORDER BY s.started_at, s.id",
                                  (PENDING,)))
