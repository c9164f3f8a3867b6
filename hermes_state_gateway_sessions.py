"""Gateway sessions: the messaging peer a session talks to, and finding a peer's session again.

Owns: the routing columns of a session row (session_key, chat_id, chat_type, thread_id) with
the peer's display_name and origin_json, the expiry_finalized flag, and the lookups a gateway
makes after a restart: the latest recoverable session of a peer, the current session of each
session key, and the live session of a chat an incoming message names.
Does not own: creating or ending session rows (hermes_state_sessions), the routing table and
the delivery ledgers (hermes_state_routing), the runtime ledgers (hermes_state_gateway).

Transaction contract: write functions run inside the caller's write transaction and check every
argument before the one UPDATE they make; reads run under the caller's lock and never write.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from hermes_state_common import SESSION_ROW_SQL, SESSIONS, check_id, session_dicts
from hermes_state_errors import SessionNotFoundError
from hermes_state_lineage import compression_ancestor_ids

# Ends the process made on its own behalf (the agent released its handle, the terminal UI's
# reaper closed what looked orphaned), not a decision to start over: the peer's next message
# still belongs to that conversation, so a lookup after a restart may recover the row.
RECOVERABLE_END_REASONS = ("agent_close", "ws_orphan_reap")
_RECOVERABLE_SQL = f"(s.ended_at IS NULL OR s.end_reason IN ({', '.join(repr(r) for r in RECOVERABLE_END_REASONS)}))"
_HAS_MESSAGES_SQL = "EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)"
# A row is a gateway session when it carries a session key; newest first, the rowid breaking ties.
_KEYED_SQL = "s.session_key IS NOT NULL AND s.session_key != ''"
_NEWEST = "s.started_at DESC, s.rowid DESC"


def _text(name: str, value: Any) -> Any:
    # The column's own rule: text, or a platform's numeric id stored as its digits.
    return None if value is None else SESSIONS.column(name).check(value)


def _platform(value: Any) -> str:
    # Platform names are compared without case: "Telegram" and "telegram" are one source.
    return check_id("platform", value).lower()


def record_gateway_session_peer(conn: sqlite3.Connection, session_id: str, *, source: str, user_id: str | None = None,
                                session_key: str | None = None, chat_id: str | None = None,
                                chat_type: str | None = None, thread_id: str | None = None,
                                display_name: str | None = None, origin_json: Any = None,
                                include_compression_ancestors: bool = False) -> None:
    """Record where a gateway session's peer is: source, session key, chat, chat type and thread.

    The route columns are set together as given (None clears one: a chat without a thread);
    display_name and origin_json (JSON text, or a value encoded as JSON) are kept when None.
    user_id is never changed: it was decided when the row was created. A session key is
    required; an unknown session raises SessionNotFoundError. With
    `include_compression_ancestors` the sessions compression closed before it get the same
    peer, so the whole conversation stays on one route when a resume moves it.
    """
    if include_compression_ancestors not in (True, False):
        raise ValueError(f"include_compression_ancestors must be True or False, not {include_compression_ancestors!r}")
    check_id("session_id", session_id)
    route = {"source": check_id("source", source), "session_key": check_id("session_key", session_key),
             "chat_id": _text("chat_id", chat_id), "chat_type": _text("chat_type", chat_type),
             "thread_id": _text("thread_id", thread_id)}
    _text("user_id", user_id)  # checked like every argument, though never written
    kept = {"display_name": _text("display_name", display_name), "origin_json": _text("origin_json", origin_json)}
    assignments = [f"{name} = ?" for name in route] + [f"{name} = COALESCE(?, {name})" for name in kept]
    cur = conn.execute(f"UPDATE sessions SET {', '.join(assignments)} WHERE id = ?",
                       [*route.values(), *kept.values(), session_id])
    if cur.rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    if include_compression_ancestors:
        conn.execute(f"UPDATE sessions SET {', '.join(assignments)} WHERE id IN (SELECT value FROM json_each(?))",
                     [*route.values(), *kept.values(), json.dumps(compression_ancestor_ids(conn, session_id))])


def set_expiry_finalized(conn: sqlite3.Connection, session_id: str, finalized: bool = True) -> None:
    """Mark (or unmark) the session's expiry as handled, so the gateway's expiry pass skips it."""
    flag = SESSIONS.column("expiry_finalized").check(finalized)
    if conn.execute("UPDATE sessions SET expiry_finalized = ? WHERE id = ?", (flag, session_id)).rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


def find_latest_gateway_session_for_peer(conn: sqlite3.Connection, *, source: str, user_id: str | None = None,
                                         session_key: str | None = None, chat_id: str | None = None,
                                         chat_type: str | None = None,
                                         thread_id: str | None = None) -> dict[str, Any] | None:
    """Return the newest recoverable session row of a peer, or None.

    Recoverable: it has messages and is live, or was ended only by the process's own cleanup
    (RECOVERABLE_END_REASONS). The session key is matched first. A row under another key still
    matches when source, user, chat, chat type and thread all do (the key's format changed
    since it was written); that needs user_id, chat_id and chat_type. No session key: None.
    """
    check_id("source", source)
    peer = {name: _text(name, value) for name, value in (("user_id", user_id), ("chat_id", chat_id),
                                                          ("chat_type", chat_type), ("thread_id", thread_id))}
    if _text("session_key", session_key) in (None, ""):
        return None
    where = f"s.source = ? AND {_RECOVERABLE_SQL} AND {_HAS_MESSAGES_SQL}"
    rows = session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.session_key = ? AND {where} "
                                  f"ORDER BY {_NEWEST} LIMIT 1", (session_key, source)))
    if rows or any(peer[name] is None for name in ("user_id", "chat_id", "chat_type")):
        return rows[0] if rows else None
    rows = session_dicts(conn.execute(
        f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.user_id = ? AND s.chat_id = ? AND s.chat_type = ? "
        f"AND s.thread_id IS ? AND {where} ORDER BY {_NEWEST} LIMIT 1", (*peer.values(), source)))
    return rows[0] if rows else None


def list_gateway_sessions(conn: sqlite3.Connection, *, platform: str | None = None,
                          active_only: bool = True) -> list[dict[str, Any]]:
    """Return the current session of each session key (its newest row), most recently active first.

    Rows without a session key are not gateway sessions and never appear. With `active_only`,
    a key whose newest row has ended is left out (an older live row does not stand in for it).
    Each row carries `last_active`: its latest message's time, else its start.
    """
    where, params = [_KEYED_SQL], []
    if platform is not None:
        where.append("lower(s.source) = ?")
        params.append(_platform(platform))
    if active_only:
        where.append("s.ended_at IS NULL")
    # Newest per key: no row of the same key started later (idx_sessions_key answers this).
    where.append("NOT EXISTS (SELECT 1 FROM sessions n WHERE n.session_key = s.session_key AND "
                 "(n.started_at > s.started_at OR (n.started_at = s.started_at AND n.rowid > s.rowid)))")
    return session_dicts(conn.execute(
        f"SELECT {SESSION_ROW_SQL}, "
        "COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id), s.started_at) "
        f"AS last_active FROM sessions s WHERE {' AND '.join(where)} ORDER BY last_active DESC, s.id", params))


def find_session_by_origin(conn: sqlite3.Connection, *, platform: str, chat_id: str, thread_id: str | None = None,
                           user_id: str | None = None) -> str | None:
    """Return the id of the live gateway session of a chat (and thread, when given), or None.

    Among several live sessions of the chat, the newest of `user_id` wins. Without a match for
    the user, a lone candidate is the answer; several are ambiguous (None), so a message never
    lands in another user's conversation. Without `user_id`, the newest answers when the
    candidates belong to at most one user.
    """
    params: list[Any] = [_platform(platform), check_id("chat_id", _text("chat_id", chat_id))]
    thread = "" if thread_id is None else " AND s.thread_id = ?"
    params += [] if thread_id is None else [_text("thread_id", thread_id)]
    user = _text("user_id", user_id)
    candidates = conn.execute(
        f"SELECT s.id, s.user_id FROM sessions s WHERE lower(s.source) = ? AND s.chat_id = ?{thread} "
        f"AND {_KEYED_SQL} AND s.ended_at IS NULL ORDER BY {_NEWEST}", params).fetchall()
    if user is not None:
        exact = [sid for sid, owner in candidates if owner == user]
        if exact or len(candidates) != 1:
            return exact[0] if exact else None
    elif len({owner for _, owner in candidates if owner is not None}) > 1:
        return None
    return candidates[0][0] if candidates else None


# --- the gateway's session-hygiene failure streak, per chat (table gateway_hygiene_state) ------------

def increment_hygiene_failure_streak(conn: sqlite3.Connection, session_key: str) -> int:
    """Count one more failed hygiene pass for the chat `session_key`; return its streak now (1 after a reset)."""
    key = check_id("session_key", session_key)
    # Read back in the same write transaction (no RETURNING: SQLite before 3.35 lacks it).
    conn.execute("INSERT INTO gateway_hygiene_state (session_key, failure_streak) VALUES (?, 1) "
                 "ON CONFLICT(session_key) DO UPDATE SET failure_streak = failure_streak + 1", (key,))
    return conn.execute("SELECT failure_streak FROM gateway_hygiene_state WHERE session_key = ?", (key,)).fetchone()[0]


def reset_hygiene_failure_streak(conn: sqlite3.Connection, session_key: str) -> None:
    """Forget the chat's failed hygiene passes (nothing to do for a chat without any)."""
    conn.execute("DELETE FROM gateway_hygiene_state WHERE session_key = ?", (check_id("session_key", session_key),))
