"""Where a conversation's traffic goes: the routing table, the delivery outbox, async delegations, input ownership.

Owns: `gateway_routing` (scope, session_key -> an entry naming the session that serves it, and
`forward_targets`, where a conversation moved on; also hermes-agent's verbs over the same table,
which keep each entry as opaque JSON text), `delivery_obligations` (replies owed,
created here on first use and never at open) and `async_delegations` (work handed to another
agent, by origin session). The outbox and the delegations are ledgers on the gateway's
machinery (hermes_state_gateway.Ledger): a state table each, one compare-and-set transition.
Also input ownership on the exception path, which reads where the routing says a conversation
moved on: input markers (`input_marker`), where an input of a session may already be stored
(`ownership_places`: the forward targets, the compression tip and its ancestors),
`find_input_owner`, `input_target` and `persist_failed_turn_input`, which appends a failed
turn's input exactly once (one transcript append through hermes_state_messages).
Does not own: the runtime epoch, admissions or receipts (hermes_state_gateway, whose
`check_epoch` fences the outbox calls that take an epoch; each send attempt is fenced on its
own too), message rows and their validation (hermes_state_messages).

Transaction contract: writes run inside the caller's BEGIN IMMEDIATE transaction as
compare-and-sets: every check runs before the first change, so a refused call changes nothing.
Reads run under the caller's lock and never create anything.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from typing import Any, Iterable, cast

import hermes_state_lineage as lineage
from hermes_state_common import (DELIVERY_OBLIGATIONS_SQL, INPUT_MARKER_SQL, check_count, check_id, check_scalar,
                                 encode_json, has_surrogate, table_exists)
from hermes_state_errors import LedgerStateError, OwnershipReadError, SessionNotFoundError
from hermes_state_gateway import Ledger, check_epoch_if_given, fetch, stamp
from hermes_state_messages import check_transcript_writable, insert_message
from hermes_state_sessions import require_session

# The key of a routing entry that names the session serving a (scope, session_key).
ROUTE_SESSION_KEY = "session_id"


# --- routing ------------------------------------------------------------------------------------

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
                 "updated_at = excluded.updated_at", (scope, session_key, encoded, stamp(now)))


def get_route(conn: sqlite3.Connection, scope: str, session_key: str) -> dict[str, Any] | None:
    """Return the entry published for (scope, session_key), or None."""
    rows = fetch(conn, "gateway_routing", "scope = ? AND session_key = ?", (scope, session_key), order="scope")
    return rows[0]["entry"] if rows else None


def list_routes(conn: sqlite3.Connection, scope: str | None = None) -> list[dict[str, Any]]:
    """Return {scope, session_key, entry, updated_at} rows, optionally of one scope."""
    where, args = ("1", ()) if scope is None else ("scope = ?", (scope,))
    return fetch(conn, "gateway_routing", where, args, order="scope, session_key")


def delete_route(conn: sqlite3.Connection, scope: str, session_key: str) -> bool:
    """Remove the entry for (scope, session_key); return whether there was one."""
    return conn.execute("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?",
                        (scope, session_key)).rowcount > 0


# hermes-agent's gateway keeps its session-key map here as JSON text per key, in one scope (''
# by default): the text is stored and read back byte for byte, and it need not name a session.

def _check_scope(scope: Any) -> str:
    if not isinstance(scope, str) or has_surrogate(scope):
        raise ValueError(f"scope must be a string ('' for the default scope), not {scope!r}")
    return scope


def _check_entry_json(session_key: Any, entry_json: Any) -> tuple[str, str]:
    check_id("session_key", session_key)
    if not isinstance(entry_json, str) or has_surrogate(entry_json):
        raise ValueError(f"entry_json for {session_key!r} must be JSON text (a str), not {type(entry_json).__name__}")
    try:
        json.loads(entry_json)
    except ValueError:
        raise ValueError(f"entry_json for {session_key!r} is not valid JSON: {entry_json[:80]!r}") from None
    return session_key, entry_json


def save_gateway_routing_entry(conn: sqlite3.Connection, session_key: str, entry_json: str, *, scope: str = "",
                               now: float | None = None) -> None:
    """Store (or replace) the JSON text of one session key's routing entry in `scope`."""
    row = _check_entry_json(session_key, entry_json)
    conn.execute("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT(scope, session_key) DO UPDATE SET entry_json = excluded.entry_json, "
                 "updated_at = excluded.updated_at", (_check_scope(scope), *row, stamp(now)))


def load_gateway_routing_entries(conn: sqlite3.Connection, *, scope: str = "") -> dict[str, str]:
    """Return {session_key: entry JSON text} of `scope`, by key."""
    return dict(conn.execute("SELECT session_key, entry_json FROM gateway_routing WHERE scope = ? ORDER BY session_key",
                             (_check_scope(scope),)).fetchall())


def replace_gateway_routing_entries(conn: sqlite3.Connection, entries: dict[str, str], *, scope: str = "",
                                    now: float | None = None) -> None:
    """Make `entries` ({session_key: entry JSON text}) the whole content of `scope`; other scopes are kept."""
    if not isinstance(entries, dict):
        raise ValueError(f"entries must be a dict of session_key -> JSON text, not {type(entries).__name__}")
    rows = [_check_entry_json(key, text) for key, text in entries.items()]  # all checked before the first change
    scope, when = _check_scope(scope), stamp(now)
    conn.execute("DELETE FROM gateway_routing WHERE scope = ?", (scope,))
    conn.executemany("INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?)",
                     [(scope, key, text, when) for key, text in rows])


def delete_gateway_routing_entries(conn: sqlite3.Connection, session_keys: list[str], *, scope: str = "") -> None:
    """Remove the entries of `session_keys` from `scope`; keys with no entry are ignored."""
    if isinstance(session_keys, str) or not isinstance(session_keys, (list, tuple, set, frozenset)):
        raise ValueError(f"session_keys must be a list of keys, not {type(session_keys).__name__}")
    keys = [check_id("session_key", key) for key in session_keys]
    conn.executemany("DELETE FROM gateway_routing WHERE scope = ? AND session_key = ?",
                     [(_check_scope(scope), key) for key in keys])


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
# A reply is owed (pending), being sent (attempting) or failed and owed again; it ends delivered
# or, past its attempts, abandoned. recover_deliveries moves rows back set-based.
OUTBOX = Ledger("delivery_obligations", "delivery obligation", {
    "pending": frozenset({"attempting", "delivered"}),
    "attempting": frozenset({"delivered", "failed", "pending", "abandoned"}),
    "failed": frozenset({"attempting", "abandoned"})})
_DELIVERY_INDEX_SQL = ("CREATE INDEX IF NOT EXISTS idx_delivery_owed "
                       "ON delivery_obligations(state, session_id)")


def ensure_outbox(conn: sqlite3.Connection) -> None:
    """Create `delivery_obligations` and its index if missing (inside the caller's write transaction)."""
    conn.execute(DELIVERY_OBLIGATIONS_SQL)
    conn.execute(_DELIVERY_INDEX_SQL)


def outbox_exists(conn: sqlite3.Connection) -> bool:
    """Return True once the outbox table has been created."""
    return table_exists(conn, OUTBOX.table)


def _obligation(conn: sqlite3.Connection, obligation_id: Any) -> dict[str, Any]:
    check_count("obligation_id", obligation_id)
    ensure_outbox(conn)
    return OUTBOX.row(conn, obligation_id)


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
    at = stamp(now)
    return cast(int, conn.execute(  # an INSERT always sets lastrowid
        "INSERT INTO delivery_obligations (session_id, obligation_key, payload_json, platform, chat_id, thread_id, "
        "state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?)",
        (session_id, key, encoded, platform, chat_id, thread_id, at, at)).lastrowid)


def begin_delivery(conn: sqlite3.Connection, obligation_id: int, *, epoch: int | None = None,
                   now: float | None = None) -> int:
    """Move a pending (or failed) obligation to attempting; return the attempt's fence.

    Each attempt gets a new fence; mark_delivered/mark_failed given an older fence are
    refused, so a sender that lost its attempt (recovered, then retried) cannot complete it.
    With `epoch`, a replaced owner is refused before anything starts (StaleEpochError).
    """
    check_epoch_if_given(conn, epoch)
    row = _obligation(conn, obligation_id)
    fence = row["fence"] + 1
    OUTBOX.move(conn, row, "attempting", f"delivery obligation {obligation_id} is {row['state']}; "
                "only a pending or failed one can begin an attempt",
                attempts=row["attempts"] + 1, fence=fence, updated_at=stamp(now))
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
    OUTBOX.move(conn, row, "delivered", f"delivery obligation {obligation_id} is {row['state']}; "
                "only a pending or attempting one can be marked delivered", updated_at=stamp(now))


def mark_failed(conn: sqlite3.Connection, obligation_id: int, error: str, *, fence: int | None = None,
                now: float | None = None) -> None:
    """Record a failed attempt (attempting -> failed, still owed); with `fence`, only that attempt may."""
    row = _obligation(conn, obligation_id)
    _check_fence(row, fence, "fail")
    OUTBOX.move(conn, row, "failed", f"delivery obligation {obligation_id} is {row['state']}; "
                "only an attempting one can fail", last_error=str(error), updated_at=stamp(now))


def recover_deliveries(conn: sqlite3.Connection, max_attempts: int = 3, *, epoch: int | None = None,
                       now: float | None = None) -> dict[str, int]:
    """At owner start, settle what a dead owner left mid-send; return {"recovered": n, "abandoned": m}.

    An `attempting` row's send may or may not have happened: it goes back to `pending` with
    `recovered = 1`, so the sender can say the reply may be a duplicate. Attempting or failed
    rows that already used `max_attempts` become `abandoned` (terminal) instead. With `epoch`, a
    replaced owner is refused (StaleEpochError): it must not pull back its successor's sends.
    """
    check_epoch_if_given(conn, epoch)
    check_count("max_attempts", max_attempts)
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    ensure_outbox(conn)
    at = stamp(now)
    # Set-based, for every row at once; the moves are the state table's attempting/failed -> abandoned
    # and attempting -> pending.
    abandoned = conn.execute("UPDATE delivery_obligations SET state = 'abandoned', updated_at = ? "
                             "WHERE state IN ('attempting', 'failed') AND attempts >= ?",
                             (at, max_attempts)).rowcount
    recovered = conn.execute("UPDATE delivery_obligations SET state = 'pending', recovered = 1, updated_at = ? "
                             "WHERE state = 'attempting'", (at,)).rowcount
    return {"recovered": recovered, "abandoned": abandoned}


def list_owed(conn: sqlite3.Connection, session_id: str | None = None) -> list[dict[str, Any]]:
    """Return obligations still owed (pending, attempting, failed) oldest first; [] before first use."""
    if not outbox_exists(conn):
        return []
    where, args = "state IN ('pending', 'attempting', 'failed')", []
    if session_id is not None:
        where, args = where + " AND session_id = ?", [session_id]
    return fetch(conn, OUTBOX.table, where, args)


def get_delivery(conn: sqlite3.Connection, obligation_id: int) -> dict[str, Any] | None:
    """Return one obligation (payload decoded), or None."""
    check_count("obligation_id", obligation_id)
    return OUTBOX.get(conn, obligation_id) if outbox_exists(conn) else None


# --- async delegations ----------------------------------------------------------------------------
# The table is the real system's (delegation_id, origin_session, state, dispatched_at, task_json,
# result_json, delivery_*, ...) plus this library's `target`. The API keeps the names it has
# always returned: id, origin_session_id, payload and created_at are delegation_id,
# origin_session, task_json and dispatched_at; the real system's other columns come as they are.

DELEGATION_STATES = ("pending", "running", "completed", "failed", "cancelled")
# A delegation waits pending, runs, and ends; until it ends an update may keep its state.
DELEGATIONS = Ledger("async_delegations", "delegation", {
    "pending": frozenset({"pending", "running", "completed", "failed", "cancelled"}),
    "running": frozenset({"running", "completed", "failed", "cancelled"})}, key="delegation_id")
DELEGATION_OPEN_STATES = tuple(DELEGATIONS.moves)  # the states a delegation can still move on from
_UNSET: Any = object()


def _delegation_view(row: dict[str, Any]) -> dict[str, Any]:
    # A decoded row under the API's names (task_json decodes as "task", shown as "payload").
    out = {"id": row.pop("delegation_id"), "origin_session_id": row.pop("origin_session"),
           "target": row.pop("target", None), "state": row.pop("state"), "payload": row.pop("task", None),
           "result": row.pop("result", None), "created_at": row.pop("dispatched_at"),
           "updated_at": row.pop("updated_at")}
    out.update(row)  # completed_at and the real system's delivery columns
    return out


def get_delegation(conn: sqlite3.Connection, delegation_id: str) -> dict[str, Any] | None:
    """Return one delegation (payload and result decoded), or None."""
    row = DELEGATIONS.get(conn, delegation_id)
    return None if row is None else _delegation_view(row)


def record_delegation(conn: sqlite3.Connection, delegation_id: str, origin_session_id: str, *,
                      target: str | None = None, payload: Any = None, now: float | None = None) -> bool:
    """Record work the origin session handed off (state pending); return False if the id exists.

    Idempotent: recording an id again for the same origin changes nothing; for another origin
    it raises ValueError.
    """
    check_id("delegation_id", delegation_id)
    check_id("target", target, optional=True)
    encoded = encode_json(payload, "payload")
    row = conn.execute("SELECT origin_session FROM async_delegations WHERE delegation_id = ?",
                       (delegation_id,)).fetchone()
    if row is not None:
        if row[0] != origin_session_id:
            raise ValueError(f"delegation {delegation_id!r} already belongs to session {row[0]!r}")
        return False
    require_session(conn, origin_session_id)
    at = stamp(now)
    conn.execute("INSERT INTO async_delegations (delegation_id, origin_session, target, state, task_json, "
                 "dispatched_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
                 (delegation_id, origin_session_id, target, encoded, at, at))
    return True


def update_delegation(conn: sqlite3.Connection, delegation_id: str, *, state: str | None = None,
                      result: Any = _UNSET, target: Any = _UNSET, now: float | None = None) -> None:
    """Move a delegation on (pending -> running -> completed/failed/cancelled) and/or set its result or target.

    A finished delegation is final: any update raises LedgerStateError. Finishing sets completed_at.
    """
    row = DELEGATIONS.row(conn, delegation_id)
    if state is not None and state not in DELEGATION_STATES:
        raise ValueError(f"state must be one of {', '.join(DELEGATION_STATES)}, not {state!r}")
    to = state or row["state"]
    refusal = f"delegation {delegation_id!r} is {row['state']}; it cannot move to {to}"
    DELEGATIONS.check(row, to, refusal)  # before the new values are checked: a finished one is final
    changes: dict[str, Any] = {"updated_at": stamp(now)}
    if to not in DELEGATIONS.moves:
        changes["completed_at"] = changes["updated_at"]
    if result is not _UNSET:
        changes["result_json"] = encode_json(result, "result")
    if target is not _UNSET:
        changes["target"] = check_id("target", target, optional=True)
    DELEGATIONS.move(conn, row, to, refusal, **changes)


def list_delegations(conn: sqlite3.Connection, origin_session_id: str,
                     state: str | None = None) -> list[dict[str, Any]]:
    """Return the origin session's delegations oldest first, optionally of one state."""
    where, args = "origin_session = ?", [origin_session_id]
    if state is not None:
        where, args = where + " AND state = ?", args + [state]
    return [_delegation_view(r) for r in fetch(conn, DELEGATIONS.table, where, args,
                                               order="dispatched_at, delegation_id")]


# --- input ownership on the exception path: which stored row owns an inbound input, the one append ---

# The key in a message's display_metadata that carries its input marker (INPUT_MARKER_SQL reads it).
MARKER_KEY = "input_marker"


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
    fields: dict[str, Any] = {"role": "user", "content": message} if isinstance(message, str) else dict(message)
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
