"""Where a conversation's traffic goes: gateway routing, the delivery outbox, async delegations,
and who owns an inbound input on the exception path.

Owns: `gateway_routing` (scope, session_key -> an entry naming the session that serves it),
`delivery_obligations` (replies owed, created here on first use and never at open),
`async_delegations` (work handed to another agent, by origin session), input markers and
`persist_failed_turn_input`, and the pure `strip_echoed_user_input`.
Does not own: the runtime epoch, admissions or receipts (hermes_state_gateway; the outbox is
fenced per send attempt instead of per epoch), message rows (hermes_state_messages), lineage
walks (hermes_state_lineage).

Transaction contract: writes run inside the caller's BEGIN IMMEDIATE transaction as
compare-and-sets: every check runs before the first change, so a refused call changes nothing.
Reads run under the caller's lock and never create anything.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import uuid
from typing import Any, Iterable, Sequence

import hermes_state_lineage as lineage
from hermes_state_common import (DELIVERY_OBLIGATIONS_SQL, INPUT_MARKER_SQL, check_count, check_id, check_scalar, decode_json,
                                 encode_json, row_dicts, table_exists)
from hermes_state_compression import check_transcript_writable
from hermes_state_errors import LedgerStateError, OwnershipReadError, SessionNotFoundError
from hermes_state_messages import insert_message
from hermes_state_sessions import require_session

# The key of a routing entry that names the session serving a (scope, session_key).
ROUTE_SESSION_KEY = "session_id"
# The key in a message's display_metadata that carries its input marker (INPUT_MARKER_SQL reads it).
MARKER_KEY = "input_marker"


def _now(now: float | None) -> float:
    return time.time() if now is None else now


# --- routing ------------------------------------------------------------------------------------

def _route_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["entry"] = decode_json(row.pop("entry_json"))
    return row


def set_route(conn: sqlite3.Connection, scope: str, session_key: str, entry: dict[str, Any], *,
              now: float | None = None) -> None:
    """Publish (or replace) the entry for (scope, session_key); it names its session in `session_id`."""
    check_id("scope", scope)
    check_id("session_key", session_key)
    if not isinstance(entry, dict) or not isinstance(entry.get(ROUTE_SESSION_KEY), str):
        raise ValueError(f"a routing entry is a dict with a str {ROUTE_SESSION_KEY!r}")
    encoded = encode_json(entry, "entry")
    require_session(conn, entry[ROUTE_SESSION_KEY])
    conn.execute("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT(scope, session_key) DO UPDATE SET entry_json = excluded.entry_json, "
                 "updated_at = excluded.updated_at", (scope, session_key, encoded, _now(now)))


def get_route(conn: sqlite3.Connection, scope: str, session_key: str) -> dict[str, Any] | None:
    """Return the entry published for (scope, session_key), or None."""
    row = conn.execute("SELECT entry_json FROM gateway_routing WHERE scope = ? AND session_key = ?",
                       (scope, session_key)).fetchone()
    return None if row is None else decode_json(row[0])


def list_routes(conn: sqlite3.Connection, scope: str | None = None) -> list[dict[str, Any]]:
    """Return {scope, session_key, entry, updated_at} rows, optionally of one scope."""
    sql, args = "SELECT * FROM gateway_routing", []
    if scope is not None:
        sql, args = sql + " WHERE scope = ?", [scope]
    return [_route_dict(r) for r in row_dicts(conn.execute(sql + " ORDER BY scope, session_key", args))]


def delete_route(conn: sqlite3.Connection, scope: str, session_key: str) -> bool:
    """Remove the entry for (scope, session_key); return whether there was one."""
    return conn.execute("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?",
                        (scope, session_key)).rowcount > 0


def forward_targets(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Return the sessions the routing now points to for this session's key, newest entry first.

    These are where the conversation moved on (a reset or a new session for the same chat).
    Only existing sessions are returned; a session without a session_key has none.
    """
    rows = conn.execute(
        "SELECT CASE WHEN json_valid(r.entry_json) THEN json_extract(r.entry_json, '$.session_id') END AS target "
        "FROM gateway_routing r JOIN sessions s ON s.session_key = r.session_key "
        "WHERE s.id = ? ORDER BY r.updated_at DESC", (session_id,)).fetchall()
    out: list[str] = []
    for (target,) in rows:
        if isinstance(target, str) and target not in out and conn.execute(
                "SELECT 1 FROM sessions WHERE id = ?", (target,)).fetchone():
            out.append(target)
    return out


# --- the delivery outbox --------------------------------------------------------------------------

DELIVERY_OWED_STATES = ("pending", "attempting", "failed")
_DELIVERY_INDEX_SQL = ("CREATE INDEX IF NOT EXISTS idx_delivery_owed "
                       "ON delivery_obligations(state, session_id)")


def ensure_outbox(conn: sqlite3.Connection) -> None:
    """Create `delivery_obligations` and its index if missing (inside the caller's write transaction)."""
    conn.execute(DELIVERY_OBLIGATIONS_SQL)
    conn.execute(_DELIVERY_INDEX_SQL)


def outbox_exists(conn: sqlite3.Connection) -> bool:
    """Return True once the outbox table has been created."""
    return table_exists(conn, "delivery_obligations")


def _obligation(conn: sqlite3.Connection, obligation_id: Any) -> dict[str, Any]:
    check_count("obligation_id", obligation_id)
    ensure_outbox(conn)
    rows = row_dicts(conn.execute("SELECT * FROM delivery_obligations WHERE id = ?", (obligation_id,)))
    if not rows:
        raise LedgerStateError(f"delivery obligation {obligation_id} does not exist")
    return rows[0]


def _obligation_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["payload"] = decode_json(row.pop("payload_json"))
    return row


def owe_delivery(conn: sqlite3.Connection, session_id: str, payload: Any, *, platform: str | None = None,
                 chat_id: str | None = None, thread_id: str | None = None, key: str | None = None,
                 now: float | None = None) -> int:
    """Record a reply the session owes, before any send (state pending); return its id.

    Idempotent by `key`: a key already recorded for this session returns the existing id;
    a key recorded for another session raises ValueError.
    """
    check_id("key", key, optional=True)
    for name, value in (("platform", platform), ("chat_id", chat_id), ("thread_id", thread_id)):
        check_scalar(name, value)
    encoded = encode_json(payload, "payload") or "null"
    require_session(conn, session_id)
    ensure_outbox(conn)
    if key is not None:
        row = conn.execute("SELECT id, session_id FROM delivery_obligations WHERE obligation_key = ?",
                           (key,)).fetchone()
        if row is not None:
            if row[1] != session_id:
                raise ValueError(f"delivery key {key!r} already belongs to session {row[1]!r}")
            return row[0]
    stamp = _now(now)
    return conn.execute(
        "INSERT INTO delivery_obligations (session_id, obligation_key, payload_json, platform, chat_id, thread_id, "
        "state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (session_id, key, encoded, platform, chat_id, thread_id, stamp, stamp)).lastrowid


def begin_delivery(conn: sqlite3.Connection, obligation_id: int, *, now: float | None = None) -> int:
    """Move a pending (or failed) obligation to attempting; return the attempt's fence.

    Each attempt gets a new fence; mark_delivered/mark_failed given an older fence are
    refused, so a sender that lost its attempt (recovered, then retried) cannot complete it.
    """
    row = _obligation(conn, obligation_id)
    if row["state"] not in ("pending", "failed"):
        raise LedgerStateError(f"delivery obligation {obligation_id} is {row['state']}; "
                               "only a pending or failed one can begin an attempt")
    fence = row["fence"] + 1
    conn.execute("UPDATE delivery_obligations SET state = 'attempting', attempts = attempts + 1, fence = ?, "
                 "updated_at = ? WHERE id = ? AND state = ?", (fence, _now(now), obligation_id, row["state"]))
    return fence


def _check_fence(row: dict[str, Any], fence: int | None, verb: str) -> None:
    if fence is None:
        return
    check_count("fence", fence)
    if row["state"] != "attempting" or row["fence"] != fence:
        raise LedgerStateError(
            f"delivery obligation {row['id']}: fence {fence} is stale (the row is {row['state']} with fence "
            f"{row['fence']}); this attempt may not {verb} it")


def mark_delivered(conn: sqlite3.Connection, obligation_id: int, *, fence: int | None = None,
                   now: float | None = None) -> None:
    """Mark a pending or attempting obligation delivered (terminal); with `fence`, only that attempt may."""
    row = _obligation(conn, obligation_id)
    _check_fence(row, fence, "complete")
    if row["state"] not in ("pending", "attempting"):
        raise LedgerStateError(f"delivery obligation {obligation_id} is {row['state']}; "
                               "only a pending or attempting one can be marked delivered")
    conn.execute("UPDATE delivery_obligations SET state = 'delivered', updated_at = ? WHERE id = ? AND state = ?",
                 (_now(now), obligation_id, row["state"]))


def mark_failed(conn: sqlite3.Connection, obligation_id: int, error: str, *, fence: int | None = None,
                now: float | None = None) -> None:
    """Record a failed attempt (attempting -> failed, still owed); with `fence`, only that attempt may."""
    row = _obligation(conn, obligation_id)
    _check_fence(row, fence, "fail")
    if row["state"] != "attempting":
        raise LedgerStateError(f"delivery obligation {obligation_id} is {row['state']}; "
                               "only an attempting one can fail")
    conn.execute("UPDATE delivery_obligations SET state = 'failed', last_error = ?, updated_at = ? "
                 "WHERE id = ? AND state = 'attempting'", (str(error), _now(now), obligation_id))


def recover_deliveries(conn: sqlite3.Connection, max_attempts: int = 3, *, now: float | None = None) -> dict[str, int]:
    """At owner start, settle what a dead owner left mid-send; return {"recovered": n, "abandoned": m}.

    An `attempting` row's send may or may not have happened: it goes back to `pending` with
    `recovered = 1`, so the sender can say the reply may be a duplicate. Attempting or failed
    rows that already used `max_attempts` become `abandoned` (terminal) instead.
    """
    check_count("max_attempts", max_attempts)
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    ensure_outbox(conn)
    stamp = _now(now)
    abandoned = conn.execute("UPDATE delivery_obligations SET state = 'abandoned', updated_at = ? "
                             "WHERE state IN ('attempting', 'failed') AND attempts >= ?",
                             (stamp, max_attempts)).rowcount
    recovered = conn.execute("UPDATE delivery_obligations SET state = 'pending', recovered = 1, updated_at = ? "
                             "WHERE state = 'attempting'", (stamp,)).rowcount
    return {"recovered": recovered, "abandoned": abandoned}


def list_owed(conn: sqlite3.Connection, session_id: str | None = None) -> list[dict[str, Any]]:
    """Return obligations still owed (pending, attempting, failed) oldest first; [] before first use."""
    if not outbox_exists(conn):
        return []
    sql = "SELECT * FROM delivery_obligations WHERE state IN ('pending', 'attempting', 'failed')"
    args: list[Any] = []
    if session_id is not None:
        sql, args = sql + " AND session_id = ?", [session_id]
    return [_obligation_dict(r) for r in row_dicts(conn.execute(sql + " ORDER BY id", args))]


def get_delivery(conn: sqlite3.Connection, obligation_id: int) -> dict[str, Any] | None:
    """Return one obligation (payload decoded), or None."""
    check_count("obligation_id", obligation_id)
    if not outbox_exists(conn):
        return None
    rows = row_dicts(conn.execute("SELECT * FROM delivery_obligations WHERE id = ?", (obligation_id,)))
    return _obligation_dict(rows[0]) if rows else None


# --- async delegations ------------------------------------------------------------------------------

DELEGATION_STATES = ("pending", "running", "completed", "failed", "cancelled")
_DELEGATION_NEXT = {"pending": {"pending", "running", "completed", "failed", "cancelled"},
                    "running": {"running", "completed", "failed", "cancelled"}}
DELEGATION_OPEN_STATES = tuple(_DELEGATION_NEXT)  # the states a delegation can still move on from
_UNSET: Any = object()


def _delegation_dict(row: dict[str, Any]) -> dict[str, Any]:
    row["payload"] = decode_json(row.pop("payload_json"))
    row["result"] = decode_json(row.pop("result_json"))
    return row


def get_delegation(conn: sqlite3.Connection, delegation_id: str) -> dict[str, Any] | None:
    """Return one delegation (payload and result decoded), or None."""
    rows = row_dicts(conn.execute("SELECT * FROM async_delegations WHERE id = ?", (delegation_id,)))
    return _delegation_dict(rows[0]) if rows else None


def record_delegation(conn: sqlite3.Connection, delegation_id: str, origin_session_id: str, *,
                      target: str | None = None, payload: Any = None, now: float | None = None) -> bool:
    """Record work the origin session handed off (state pending); return False if the id exists.

    Idempotent: recording an id again for the same origin changes nothing; for another origin
    it raises ValueError.
    """
    check_id("delegation_id", delegation_id)
    check_id("target", target, optional=True)
    encoded = encode_json(payload, "payload")
    row = conn.execute("SELECT origin_session_id FROM async_delegations WHERE id = ?", (delegation_id,)).fetchone()
    if row is not None:
        if row[0] != origin_session_id:
            raise ValueError(f"delegation {delegation_id!r} already belongs to session {row[0]!r}")
        return False
    require_session(conn, origin_session_id)
    stamp = _now(now)
    conn.execute("INSERT INTO async_delegations (id, origin_session_id, target, state, payload_json, created_at, "
                 "updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                 (delegation_id, origin_session_id, target, encoded, stamp, stamp))
    return True


def update_delegation(conn: sqlite3.Connection, delegation_id: str, *, state: str | None = None,
                      result: Any = _UNSET, target: Any = _UNSET, now: float | None = None) -> None:
    """Move a delegation on (pending -> running -> completed/failed/cancelled) and/or set its result or target.

    A finished delegation is final: any update raises LedgerStateError.
    """
    row = conn.execute("SELECT state FROM async_delegations WHERE id = ?", (delegation_id,)).fetchone()
    if row is None:
        raise LedgerStateError(f"delegation {delegation_id!r} does not exist")
    if state is not None and state not in DELEGATION_STATES:
        raise ValueError(f"state must be one of {', '.join(DELEGATION_STATES)}, not {state!r}")
    allowed = _DELEGATION_NEXT.get(row[0], set())
    if not allowed or (state is not None and state not in allowed):
        raise LedgerStateError(f"delegation {delegation_id!r} is {row[0]}; it cannot move to {state or row[0]}")
    changes: dict[str, Any] = {"updated_at": _now(now)}
    if state is not None:
        changes["state"] = state
    if result is not _UNSET:
        changes["result_json"] = encode_json(result, "result")
    if target is not _UNSET:
        changes["target"] = check_id("target", target, optional=True)
    sets = ", ".join(f"{c} = ?" for c in changes)
    conn.execute(f"UPDATE async_delegations SET {sets} WHERE id = ? AND state = ?",
                 (*changes.values(), delegation_id, row[0]))


def list_delegations(conn: sqlite3.Connection, origin_session_id: str,
                     state: str | None = None) -> list[dict[str, Any]]:
    """Return the origin session's delegations oldest first, optionally of one state."""
    sql, args = "SELECT * FROM async_delegations WHERE origin_session_id = ?", [origin_session_id]
    if state is not None:
        sql, args = sql + " AND state = ?", args + [state]
    return [_delegation_dict(r) for r in row_dicts(conn.execute(sql + " ORDER BY created_at, id", args))]


# --- input ownership on the exception path ------------------------------------------------------------

def input_marker(platform: str | None, profile: str | None, scope: str | None, chat_id: str | None,
                 thread_id: str | None, message_id: str | None) -> str:
    """Return the marker of one inbound message: the same for the same qualified message, else new.

    The marker is derived from every qualifier, so the same message id in another chat,
    thread, scope, profile or platform gets another marker. A message without an id gets a
    fresh random marker: identical text at an identical time is still another turn.
    """
    if message_id is None or message_id == "":
        return "im-" + uuid.uuid4().hex
    parts = [None if v is None else str(v) for v in (platform, profile, scope, chat_id, thread_id, message_id)]
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return "im-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def ownership_places(conn: sqlite3.Connection, session_id: str) -> tuple[list[str], str]:
    """Return (sessions that may own an input of `session_id`, the session a missing input goes to).

    Searched, in order: the forward targets the routing publishes (and their live compression
    tips), the session's current compression tip, then the tip's compression ancestors (which
    include the session itself when it was compressed). Missing input goes to the live tip of
    the newest forward target, or else to the session's own live tip.
    """
    tip = lineage.compression_successor_id(conn, session_id)
    if tip is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    places: list[str] = []
    targets = forward_targets(conn, session_id)
    forwards = [lineage.compression_successor_id(conn, f) or f for f in targets]
    for sid in [*targets, *forwards, tip, *lineage.compression_ancestor_ids(conn, tip)]:
        if sid not in places:
            places.append(sid)
    return places, (forwards[0] if forwards else tip)


def input_target(conn: sqlite3.Connection, session_id: str) -> str:
    """Return the live session a missing input of `session_id` goes to (OwnershipReadError if unreadable)."""
    try:
        return ownership_places(conn, session_id)[1]
    except sqlite3.Error as exc:
        raise OwnershipReadError(f"could not resolve where session {session_id!r} continues ({exc})") from exc


def find_input_owner(conn: sqlite3.Connection, session_ids: Iterable[str], marker: str) -> tuple[str, int] | None:
    """Return (session_id, row id) of a row that owns `marker` among those sessions, or None.

    Only user rows count, live or in the compression archive; revoked rows, observed inputs
    (a mirror of someone else's message) and rows of other roles do not. The lookup goes
    through the marker index, so it touches only the rows carrying that marker, never a
    session's history or any message body.
    """
    row = conn.execute(
        f"SELECT session_id, id FROM messages WHERE display_metadata IS NOT NULL AND {INPUT_MARKER_SQL} = ? "
        "AND session_id IN (SELECT value FROM json_each(?)) AND role = 'user' "
        "AND (active = 1 OR compacted = 1) AND COALESCE(effect_disposition, '') != 'revoked' "
        "AND COALESCE(observed, 0) = 0 ORDER BY id LIMIT 1", (marker, json.dumps(list(session_ids)))).fetchone()
    return None if row is None else (row[0], row[1])


def _marked_fields(message: Any, marker: str) -> dict[str, Any]:
    if not isinstance(message, (str, dict)):
        raise ValueError("message must be a str or a message dict")
    fields = {"role": "user", "content": message} if isinstance(message, str) else dict(message)
    if fields.setdefault("role", "user") != "user":
        raise ValueError(f"a turn's input is a user message, not {fields['role']!r}")
    meta = fields.get("display_metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise ValueError("display_metadata of a marked input must be a dict")
    if meta.get(MARKER_KEY, marker) != marker:
        raise ValueError(f"display_metadata already carries another {MARKER_KEY}")
    fields["display_metadata"] = {**meta, MARKER_KEY: marker}
    return fields


def persist_failed_turn_input(conn: sqlite3.Connection, session_id: str, message: Any, marker: str) -> int | None:
    """Append a failed turn's user input unless a row already owns its marker; return the new row id or None.

    The lookup covers the forward target, the compression tip and its ancestors (see
    ownership_places and find_input_owner). When that read fails, OwnershipReadError is raised
    and nothing is appended. The row goes to the live session the conversation continues in;
    past rows are never rewritten. Runs inside the caller's write transaction, so two writers
    for one marker append exactly once.
    """
    check_id("marker", marker)
    fields = _marked_fields(message, marker)
    require_session(conn, session_id)
    try:
        places, target = ownership_places(conn, session_id)
        if find_input_owner(conn, places, marker) is not None:
            return None
    except sqlite3.Error as exc:
        raise OwnershipReadError(f"could not tell whether input {marker!r} is already stored ({exc}); "
                                 "nothing was appended") from exc
    check_transcript_writable(conn, target)
    return insert_message(conn, target, fields)


# --- echoed user input ------------------------------------------------------------------------------

def render_user_input(content: Any) -> str:
    """Render user input (a str or a list of rich input parts) as one text, parts joined by newlines.

    Text parts give their text; images give `[image: <url or path>]`; any other part gives
    `[<type>: <name or path>]`. Both sides of an echo comparison are rendered this way.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, (list, tuple)):
        return "" if content is None else str(content)
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
        elif not isinstance(part, dict):
            out.append(str(part))
        elif isinstance(part.get("text"), str):
            out.append(part["text"])
        elif part.get("type") in ("image", "localImage", "input_image"):
            out.append(f"[image: {part.get('url') or part.get('path') or part.get('image_url') or ''}]")
        else:
            out.append(f"[{part.get('type', 'input')}: {part.get('name') or part.get('path') or ''}]")
    return "\n".join(out)


def strip_echoed_user_input(items: Sequence[dict[str, Any]], sent_texts: Any) -> list[dict[str, Any]]:
    """Return `items` without the server's echo of the input just sent, if the first user item is that echo.

    Only the first `userMessage` item is considered, and it is dropped only when its rendered
    content equals the rendered `sent_texts` (what turn/start sent: a str or a list of parts).
    Later user items, a first one that differs, and a separately admitted identical turn stay.
    Pure: the input list is not modified.
    """
    out = list(items)
    sent = render_user_input(list(sent_texts) if isinstance(sent_texts, tuple) else sent_texts)
    for index, item in enumerate(out):
        if isinstance(item, dict) and item.get("type") == "userMessage":
            content = item["content"] if "content" in item else item.get("text")
            if render_user_input(content) == sent:
                del out[index]
            break
    return out
