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
import time
from typing import Any

from hermes_state_common import MARKED_SESSION_SQL, SESSION_ROW_SQL, SESSIONS, check_id, check_number, session_dicts
from hermes_state_errors import AdoptionRefusedError, SessionNotFoundError
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


# --- orphaned gateway sessions: rows that kept their messages but lost their routing identity ------

ORPHAN_GAP_S = 900.0  # how soon after a keyed row fell quiet an unkeyed one may continue it
ADOPTED_END_REASON = "superseded_by_repair"
# The routing identity an adoption copies; a column the orphan already has is kept.
_ROUTE_COLUMNS = ("user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")
# Unkeyed by design, not by damage: tool rows, delegates and branches never carry a session key.
_ORPHAN_SQL = (f"s.session_key IS NULL AND s.source != 'tool' AND NOT COALESCE({MARKED_SESSION_SQL}, 0) "
               f"AND {_HAS_MESSAGES_SQL}")
_ORPHAN_COLUMNS = ("s.id, s.source, s.user_id, s.parent_session_id, s.started_at, "
                   "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id), "
                   "(SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id)")
# When a keyed row fell quiet: its latest message, recorded activity or start, whichever is latest.
_QUIET_SQL = ("MAX(s.started_at, COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id), "
              "s.started_at), COALESCE(s.last_activity_at, s.started_at))")


def _gap(max_gap_s: Any) -> float:
    return ORPHAN_GAP_S if max_gap_s is None else check_number("max_gap_s", max_gap_s)


def _verdict(conn: sqlite3.Connection, row: tuple[Any, ...], gap: float) -> dict[str, Any]:
    # One orphan's report: which keyed row it continues, by which evidence, or why none can be named.
    orphan_id, source, user_id, parent_id, started_at, count, last_active = row
    found = {"orphan_id": orphan_id, "source": source, "message_count": count, "started_at": started_at,
             "last_active": last_active, "donor_id": None, "session_key": None, "evidence": "",
             "adoptable": False, "reason": ""}
    if parent_id is not None:
        # A recorded parent is a fact: no time window, and no guessing past it when it does not fit.
        parent = conn.execute(f"SELECT s.id, s.session_key FROM sessions s WHERE s.id = ? AND s.source = ? AND {_KEYED_SQL}",
                              (parent_id, source)).fetchone()
        if parent is None:
            return {**found, "reason": "parent session carries no gateway identity of this source"}
        return {**found, "donor_id": parent[0], "session_key": parent[1], "evidence": "lineage", "adoptable": True}
    donors = conn.execute(
        f"SELECT s.id, s.session_key FROM sessions s WHERE s.source = ? AND {_KEYED_SQL} AND s.id != ? "
        f"AND (s.user_id IS NULL OR ? IS NULL OR s.user_id = ?) AND {_QUIET_SQL} >= ? AND {_QUIET_SQL} < ? LIMIT 2",
        (source, orphan_id, user_id, user_id, started_at - gap, last_active)).fetchall()
    if len(donors) > 1:
        return {**found, "reason": "ambiguous: more than one keyed predecessor matches this window"}
    if not donors:
        shown_gap = int(gap) if gap.is_integer() else gap
        return {**found, "reason": f"no keyed predecessor fell quiet within {shown_gap}s of this session's start"}
    return {**found, "donor_id": donors[0][0], "session_key": donors[0][1], "evidence": "contiguity", "adoptable": True}


def find_orphaned_gateway_sessions(conn: sqlite3.Connection, *, max_gap_s: float | None = None) -> list[dict[str, Any]]:
    """Report unkeyed sessions with messages, each with the keyed row it continues when exactly one can be named.

    Evidence is `lineage` (its parent is a keyed row of the same source) or `contiguity` (exactly
    one keyed row of the same source and a compatible user fell quiet within `max_gap_s`, 900 by
    default, of its start, before its last message). Otherwise `adoptable` is False with a reason.
    Tool rows, delegates and branches are unkeyed by design and never reported.
    """
    gap = _gap(max_gap_s)
    rows = conn.execute(f"SELECT {_ORPHAN_COLUMNS} FROM sessions s WHERE {_ORPHAN_SQL} "
                        "ORDER BY s.started_at, s.rowid DESC").fetchall()
    return [_verdict(conn, row, gap) for row in rows]


def adopt_orphaned_gateway_session(conn: sqlite3.Connection, orphan_id: str, donor_id: str, *,
                                   max_gap_s: float | None = None, now: float | None = None) -> bool:
    """Give the orphan the donor's routing identity (keeping columns it has) and end the donor; return whether it applied.

    The pair is judged again inside the write transaction: False when either row has changed
    shape since (the orphan got a key or went, the donor lost its key or went, their sources
    differ), so a concurrent repair makes this a no-op. AdoptionRefusedError when the evidence
    (as find_orphaned_gateway_sessions reports it with `max_gap_s`) does not name this donor
    alone: adopting a guess could splice one person's conversation into another's chat.
    """
    check_id("orphan_id", orphan_id)
    check_id("donor_id", donor_id)
    gap = _gap(max_gap_s)
    row = conn.execute(f"SELECT {_ORPHAN_COLUMNS} FROM sessions s WHERE s.id = ? AND {_ORPHAN_SQL}",
                       (orphan_id,)).fetchone()
    donor = conn.execute(f"SELECT s.source, {', '.join('s.' + c for c in _ROUTE_COLUMNS)} FROM sessions s "
                         f"WHERE s.id = ? AND {_KEYED_SQL}", (donor_id,)).fetchone()
    if row is None or donor is None or donor[0] != row[1] or orphan_id == donor_id:
        return False
    verdict = _verdict(conn, row, gap)
    if not verdict["adoptable"] or verdict["donor_id"] != donor_id:
        why = verdict["reason"] or f"the evidence names {verdict['donor_id']!r}, not this donor"
        raise AdoptionRefusedError(f"session {orphan_id!r} is not adopted by {donor_id!r}: {why}")
    kept = ", ".join(f"{c} = COALESCE({c}, ?)" for c in _ROUTE_COLUMNS)
    conn.execute(f"UPDATE sessions SET {kept}, parent_session_id = COALESCE(parent_session_id, ?) WHERE id = ?",
                 (*donor[1:], donor_id, orphan_id))
    conn.execute("UPDATE sessions SET ended_at = COALESCE(ended_at, ?), end_reason = ? WHERE id = ?",
                 (time.time() if now is None else now, ADOPTED_END_REASON, donor_id))
    return True
