"""Message rows: validate, insert, read, merge and rewrite a session's transcript, and guard its writes.

Owns: turning caller fields (keyword arguments, a `get_messages` row or a conversation dict)
into `messages` column values, issuing `message_uid`s and tool-call uids and pairing tool
results with their call, inserting rows while keeping the session's counters, queueing each new
row for its batch of index work (`reserve_id`, `after_insert`, `BATCH_ROWS`), reading raw rows,
merging same-role turns, whole-transcript rewrites, a message copied into a generation
(`message_list`: one message_uid at most once; `with_stored_fields`: what a conversation dict
drops, from the stored row of its uid), and the transcript guard
(`check_transcript_writable`, and `write_transcript`, which retries once after a compression);
and the excerpts a search hit or a session picker opens a transcript with: the rows around one
message (`get_messages_around`, over every row of the session, rewound and archived ones too),
that window narrowed to some roles with bookends (`get_anchored_view`), the latest user turns as
one-line previews (`list_recent_user_messages`) and `has_platform_message_id`.
Does not own: the session row's rules (hermes_state_sessions), compression generations and
locks (hermes_state_compression), the batch's statements (hermes_state_fts), the conversation
projection (hermes_state_conversation).

Counters: `message_count` counts a session's ACTIVE rows and `tool_call_count` the tool calls
of its active assistant rows (the data dictionary's COUNTERS); every write here keeps both in
the same transaction.

Transaction contract: write functions run inside the caller's write transaction and never open or
commit one (`write_transcript` opens its own through the callable it is given); every message is
validated before the first statement that changes anything. Reads run under the caller's lock.
"""
from __future__ import annotations

import copy
import json
import sqlite3
import time
from contextlib import AbstractContextManager, closing
from typing import Any, Callable, Iterable

import hermes_state_fts as fts
from hermes_state_common import (COUNTER_ADD_SQL, JSON_MESSAGE_FIELDS, MESSAGES, NOT_LIVE_SQL, check_count, check_id,
                                 check_number,
                                 counter_amounts, decode_json, decoded, encode_json, has_surrogate, is_uid, new_uid,
                                 replace_surrogates, row_dicts, shown)
from hermes_state_errors import (SessionClosedByCompressionError, SessionCompressionInProgressError,
                                 SessionExportTooLargeError, SessionNotFoundError, SessionResumeTooLargeError,
                                 SessionTurnLeaseLostError)
from hermes_state_lockowners import lock_is_live
from hermes_state_home import config_count
from hermes_state_lineage import COMPRESSION_END_REASON, compression_ancestor_ids, live_continuation
from hermes_state_schema import Connection
from hermes_state_sessions import ARCHIVE_LIFT_SQL, require_session, reset_counters

# --- preparing values --------------------------------------------------------------------------

# Set by insert_message's arguments, never by the fields themselves.
_POSITIONAL = frozenset({"session_id", "active", "compacted"})
# How each column a caller may give is checked and encoded: its declared rule, bound to its name.
_CHECK = {c.name: c.checker() for c in MESSAGES.columns if c.rule is not None}
_WRITABLE = frozenset(_CHECK)
# Keys a conversation dict or a get_messages row may carry: renamed, or decided by the arguments.
_ALIASES = {"name": "tool_name", "_tool_call_uids": "tool_call_uids", "_tool_call_uid": "tool_call_uid",
            "_absorbed_message_uids": "absorbed_message_uids", "message_id": "platform_message_id"}
# content_parts is derived from a list `content` (a get_messages row carries both): never taken as given.
_IGNORED = frozenset({"id", "_row_id", "content_parts"}) | _POSITIONAL
# A conversation dict's stored (display) content when it differs from what was sent.
DISPLAY_KEY = "_display_content"
_ACCEPTED = _WRITABLE | frozenset(_ALIASES) | _IGNORED | {DISPLAY_KEY}


def _text_of_parts(parts: list[dict[str, Any]]) -> str:
    # What search, previews and context see of a multimodal message: its text parts.
    return "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))


def number_as_text(value: int | float) -> str | None:
    """Return a number as SQLite turns it into TEXT for a TEXT column (None for NaN, as SQLite stores it)."""
    with closing(sqlite3.connect(":memory:")) as conn:
        return conn.execute("SELECT CAST(? AS TEXT)", (value,)).fetchone()[0]


def _split_parts(fields: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Return (fields with a list or dict `content` replaced by its text, the structure's JSON or None)."""
    content = fields.get("content")
    if content is None or type(content) is str:
        return fields, None
    if type(content) in (int, float, bool):
        # hermes-agent stores a number as its TEXT column makes it ("123", "1.5", True as "1"),
        # and agent code may rely on that: the same text here, made by SQLite itself.
        return {**fields, "content": number_as_text(content)}, None
    if not isinstance(content, (list, tuple, dict)):
        return fields, None  # the column's rule refuses it, naming the type
    if fields.get("api_content") is not None or DISPLAY_KEY in fields:
        raise ValueError(f"a list of content parts is what was sent: give no api_content or {DISPLAY_KEY} with it")
    if isinstance(content, dict):
        # A provider's wrapper object: kept whole; search and previews see its JSON text.
        encoded = encode_json(content, "content")
        return {**fields, "content": encoded}, encoded
    encoded = encode_json(list(content), "content")
    assert encoded is not None  # only None encodes to None
    parts = json.loads(encoded)
    if not all(isinstance(p, dict) for p in parts):
        raise ValueError("content must be a string, None or a list of content-part dicts")
    return {**fields, "content": _text_of_parts(parts)}, encoded


def _check_field_names(fields: dict[str, Any]) -> None:
    unknown = fields.keys() - _ACCEPTED
    if unknown:
        raise ValueError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    if fields.get("name") is not None and fields.get("tool_name") not in (None, fields["name"]):
        raise ValueError("name is another spelling of tool_name: give one of them, or the same value")


def _unwrap_display(fields: dict[str, Any]) -> dict[str, Any]:
    # A conversation dict: its content is what was sent (api_content), and the display text
    # rides in DISPLAY_KEY. Put each back in its column.
    if DISPLAY_KEY not in fields:
        return fields
    if fields.get("api_content") is not None:
        raise ValueError(f"give api_content or {DISPLAY_KEY}, not both")
    fields = dict(fields)
    fields["api_content"] = fields.get("content")
    fields["content"] = fields.pop(DISPLAY_KEY)
    return fields


def _checked_columns(fields: dict[str, Any]) -> dict[str, Any]:
    # Each given value under its column's name, checked and encoded by that column's rule.
    row: dict[str, Any] = {}
    for key, value in fields.items():
        if value is not None and key not in _IGNORED:
            name = _ALIASES.get(key, key)
            row[name] = _CHECK[name](value)
    if not isinstance(row.get("role"), str) or not row["role"]:
        raise ValueError("role must be a non-empty string")
    return row


def _decoded_calls(given: Any, stored: Any) -> list | None:
    # A list of plain dicts is used as given; JSON text or SDK objects are read back from what is stored.
    if given is not None and not (isinstance(given, list) and all(type(c) is dict for c in given)):
        given = decode_json(stored)
    return given if isinstance(given, list) else None


def _prepare(fields: dict[str, Any]) -> tuple[dict[str, Any], list | None]:
    """Validate and encode one message's fields; return (column values, decoded tool_calls)."""
    _check_field_names(fields)
    fields, parts = _split_parts(fields)
    fields = _unwrap_display(fields)
    row = _checked_columns(fields)
    if parts is not None:
        row["content_parts"] = parts
    return row, _decoded_calls(fields.get("tool_calls"), row.get("tool_calls"))


def _call_ids(calls: Iterable[Any] | None) -> list[str]:
    return [c["id"] for c in calls or () if isinstance(c, dict) and isinstance(c.get("id"), str)]


def issue_tool_call_uids(calls: list | None) -> dict[str, str] | None:
    """Return {tool_call_id: uid} for an assistant turn; repeats of one id share a uid."""
    ids = _call_ids(calls)
    return {cid: new_uid() for cid in dict.fromkeys(ids)} or None


def pick_tool_call_uid(value: Any, nth: int) -> str | None:
    """Return the uid for the `nth` (0-based) result of one id: a list gives its nth uid, a string is shared."""
    if isinstance(value, list):
        return value[min(nth, len(value) - 1)] if value else None
    return value if isinstance(value, str) else None


def _pair_tool_call_uid(conn: sqlite3.Connection, session_id: str, tool_call_id: str, active: int) -> str | None:
    # The nearest preceding assistant row of the same generation answers for this result.
    found = conn.execute(
        "SELECT id, tool_call_uids FROM messages WHERE session_id = ? AND active = ? AND role = 'assistant' "
        "ORDER BY id DESC LIMIT 1", (session_id, active)).fetchone()
    if found is None or found[1] is None:
        return None
    uids = decode_json(found[1])
    value = uids.get(tool_call_id) if isinstance(uids, dict) else None
    nth = 0
    if isinstance(value, list):
        # Two merged turns both used this provider id: the Nth result gets the Nth uid.
        nth = conn.execute(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND id > ? AND active = ? AND role = 'tool' "
            "AND tool_call_id = ?", (session_id, found[0], active, tool_call_id)).fetchone()[0]
    return pick_tool_call_uid(value, nth)


# --- a message copied into a generation -------------------------------------------------------

def message_list(messages: Iterable[dict[str, Any]], what: str = "message") -> list[dict[str, Any]]:
    """Return `messages` as a list of dicts; raise ValueError for anything else or one message_uid twice.

    A uid names one message: two live rows with the same uid would be two copies of it in one
    generation, which compression and replay cannot tell apart.
    """
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, Iterable):
        raise ValueError(f"{what}s must be a list of message dicts")
    out = list(messages)
    first_with: dict[str, int] = {}
    for index, message in enumerate(out):
        if not isinstance(message, dict):
            raise ValueError(f"{what} {index} is not a dict")
        uid = message.get("message_uid")
        if isinstance(uid, str) and uid in first_with:
            raise ValueError(f"{what}s {first_with[uid]} and {index} have the same message_uid {uid!r}; "
                             "a message appears at most once in a generation")
        if isinstance(uid, str):
            first_with[uid] = index
    return out


# What a stored row knows about a message that its conversation dict does not carry. A copy
# (compression, rotation) keeps these unless the caller's dict gives its own value.
_KEPT_FROM_STORED = ("timestamp", "effect_disposition", "observed", "platform_message_id", "display_kind",
                     "display_metadata", "token_count", "finish_reason")


def with_stored_fields(conn: sqlite3.Connection, session_id: str,
                       messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return `messages` with the fields a conversation dict drops filled from the stored row of its uid.

    The row is looked up by message_uid (this session's live row first, then its archive,
    then any other copy); keys the dict already carries (not None) win.
    """
    uids = [m["message_uid"] for m in messages if isinstance(m.get("message_uid"), str)]
    if not uids:
        return messages
    stored: dict[str | None, dict[str, Any]] = {}
    # Ascending preference: later rows overwrite earlier ones in `stored`.
    for row in row_dicts(conn.execute(
            f"SELECT message_uid, {', '.join(_KEPT_FROM_STORED)} FROM messages "
            "WHERE message_uid IN (SELECT value FROM json_each(?)) "
            "ORDER BY session_id = ?, active, id", (json.dumps(uids), session_id))):
        stored[row.pop("message_uid")] = row
    out = []
    for message in messages:
        known = stored.get(message.get("message_uid"))
        if known:
            message = {**{k: v for k, v in known.items() if v is not None},
                       **{k: v for k, v in message.items() if v is not None or k not in known}}
        out.append(message)
    return out


# --- the index queue ------------------------------------------------------------------------------
# FTS5 writes a segment in every index at the end of each statement that changes it: indexing each
# message on its own wrote three segments per message. So a library handle's new row skips the
# triggers' indexing and waits in the writer's queue (`messages_fts_pending`); every BATCH_ROWS-th
# row indexes the whole queue, one statement per index (one segment each). A queued row is
# committed like any other, searches scan the queue for it, and no index's content source holds
# it until it is indexed, so any program's FTS5 rebuild agrees with the queue. Other programs'
# rows are indexed by the triggers at once.
TURN_LEASE_TTL_S = 300.0  # how long a turn lease lasts unless refreshed
BATCH_ROWS = 256

# The new row's id, as AUTOINCREMENT would pick it, queued in one statement that also checks the schema
# cookie (see fts.cached_state): no row is queued when the catalogue may have changed since it was
# read, so a file whose triggers another program replaced is never indexed twice.
_RESERVE_SQL = (f"INSERT OR REPLACE INTO {fts.PENDING}(id) SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence "
                "WHERE name = 'messages'), 0), COALESCE((SELECT MAX(id) FROM messages), 0)) + 1 "
                "FROM pragma_schema_version WHERE schema_version = ?")


def reserve_id(conn: sqlite3.Connection) -> int | None:
    """Queue the id the next message row will get and return it; None when the triggers must index it.

    The caller inserts the row with this id in the same transaction. Only a file holding exactly
    the declared FTS objects (with no rebuild needed) queues rows, and only through a connection
    the library opened (it keeps the catalogue and the count of its queue; another's rows are
    indexed by the triggers as they are written).
    """
    if not isinstance(conn, Connection):
        return None
    for _ in range(2):
        entry = conn.fts_catalogue  # the cached catalogue: one attribute read, no lock, no call
        if entry is None:
            fts.cached_state(conn)  # reads the catalogue into the connection
            continue
        version, catalogue = entry
        if not (catalogue.declared and catalogue.pending):
            return None
        try:
            cursor = conn.execute(_RESERVE_SQL, (version,))
        except sqlite3.OperationalError:
            cursor = None  # the queue table is gone: another program dropped it since the catalogue was read
        if cursor is not None and cursor.rowcount == 1:
            return cursor.lastrowid
        fts.cached_state(conn)  # the schema changed: read the catalogue again, then decide again
    return None


def after_insert(conn: sqlite3.Connection) -> None:
    """Index the queue in one batch once it holds BATCH_ROWS rows (inside the caller's transaction)."""
    if not isinstance(conn, Connection):
        return  # only a library connection queues rows (see reserve_id)
    queued = conn.fts_queued + 1
    if queued >= BATCH_ROWS:
        queued = conn.execute(f"SELECT COUNT(*) FROM {fts.PENDING}").fetchone()[0]
        if queued >= BATCH_ROWS:
            fts.index_batch(conn)
            queued = 0
    conn.fts_queued = queued


# --- writing rows ----------------------------------------------------------------------------

# A live row moves the session's counters (by the dictionary's rule) and its activity time.
_COUNT_SQL = (f"UPDATE sessions SET {COUNTER_ADD_SQL}, "
              f"last_activity_at = MAX(COALESCE(last_activity_at, 0), ?), {ARCHIVE_LIFT_SQL} WHERE id = ?")


# INSERT text per set of columns present: binding only those is the cheapest form, and the
# combinations callers use are few (the connection caches each prepared statement too).
_INSERT_SQL: dict[tuple[str, ...], str] = {}


def _insert_sql(columns: tuple[str, ...]) -> str:
    sql = _INSERT_SQL.get(columns)
    if sql is None:
        sql = _INSERT_SQL[columns] = (f"INSERT INTO messages ({', '.join(columns)}) "
                                      f"VALUES ({', '.join('?' * len(columns))})")
    return sql


def _write_row(conn: sqlite3.Connection, session_id: str, row: dict[str, Any], calls: list | None,
               active: int, compacted: int) -> int:
    role = row["role"]
    row.setdefault("timestamp", time.time())
    if active:
        if conn.execute(_COUNT_SQL, (*counter_amounts(role, calls), row["timestamp"], session_id)).rowcount == 0:
            raise SessionNotFoundError(f"session {session_id!r} not found")
    else:
        require_session(conn, session_id)
    if "message_uid" not in row:
        row["message_uid"] = new_uid()
    if calls and role == "assistant" and "tool_call_uids" not in row:
        issued = issue_tool_call_uids(calls)
        if issued:
            row["tool_call_uids"] = json.dumps(issued)
    elif role == "tool" and "tool_call_uid" not in row and "tool_call_id" in row:
        row["tool_call_uid"] = _pair_tool_call_uid(conn, session_id, row["tool_call_id"], active)
    row["session_id"], row["active"], row["compacted"] = session_id, active, compacted
    row.setdefault("observed", 0)
    # Indexed with others in one batch instead of by the triggers one by one (the index queue above).
    queued = reserve_id(conn)
    if queued is not None:
        row["id"] = queued
    # An INSERT sets lastrowid (typed Optional for other statements).
    row_id: int = conn.execute(_insert_sql(tuple(row)), tuple(row.values())).lastrowid  # type: ignore[assignment]
    if queued is not None:
        after_insert(conn)
    return row_id


def insert_message(conn: sqlite3.Connection, session_id: str, fields: dict[str, Any], *, active: int = 1,
                   compacted: int = 0) -> int:
    """Insert one message row and return its id; keeps fields['message_uid'] when given.

    `fields` holds message columns (a get_messages row or a conversation dict also works:
    `name` means tool_name, `_tool_call_uid(s)`/`_absorbed_message_uids` their columns, a
    `_display_content` key makes `content` the api_content and itself the content, and
    id/_row_id/session_id/active/compacted are ignored). Issues a uuid4 hex uid and, for an
    assistant turn, tool_call_uids when absent; pairs a tool row's tool_call_uid from the
    nearest preceding assistant row of the same generation. Counters move only for active rows.
    """
    row, calls = _prepare(fields)
    return _write_row(conn, session_id, row, calls, 1 if active else 0, 1 if compacted else 0)


def check_runtime_keys(keys: Iterable[str]) -> None:
    """Refuse keyword arguments that are neither message fields nor a conversation's `_` keys (TypeError)."""
    for key in keys:
        if not key.startswith("_") or key not in _ACCEPTED:
            raise TypeError(f"append_message() got an unexpected keyword argument {key!r}")


def append_message(conn: sqlite3.Connection, session_id: str, role: str, content: str | None = None,
                   # Positional in hermes-agent's order, as its callers pass them; the rest by keyword only.
                   tool_name: str | None = None, tool_calls: Any = None, tool_call_id: str | None = None,
                   token_count: int | None = None, finish_reason: str | None = None,
                   reasoning: str | None = None, reasoning_content: str | None = None,
                   reasoning_details: Any = None, codex_reasoning_items: Any = None,
                   codex_message_items: Any = None, platform_message_id: str | None = None,
                   observed: bool = False, effect_disposition: str | None = None, timestamp: float | None = None,
                   api_content: str | None = None, *,
                   display_kind: str | None = None, display_metadata: Any = None,
                   name: str | None = None, message_uid: str | None = None,
                   compression_lock_holder: str | None = None, turn_lease_holder: str | None = None,
                   turn_lease_ttl_seconds: float = TURN_LEASE_TTL_S, **runtime_keys: Any) -> int:
    """Append a message and return its row id; unknown session -> SessionNotFoundError.

    `append_message(sid, **msg)` takes a conversation dict back: `name` is `tool_name`, the
    `_`-prefixed runtime keys are kept or ignored. A `message_uid` makes the row a copy of that
    message (another session's, or an archived generation's), which keeps the stored row's fields
    the call does not give; one already live in the session is refused (ValueError). The holder of
    the session's compression lock names itself in `compression_lock_holder` to write while it
    compresses; `turn_lease_holder` makes the write require that holder's turn lease
    (SessionTurnLeaseLostError otherwise; its own expired lease is renewed for `turn_lease_ttl_seconds`).
    """
    check_runtime_keys(runtime_keys)
    check_turn_lease(conn, session_id, turn_lease_holder, turn_lease_ttl_seconds)
    fields = dict(locals(), **runtime_keys)  # every keyword above, under its own name
    for own in ("conn", "session_id", "runtime_keys", "compression_lock_holder", "turn_lease_holder",
                "turn_lease_ttl_seconds"):
        del fields[own]
    uid = message_uid
    if uid is not None:
        if not is_uid(uid):
            raise ValueError(f"message_uid must be 32 lowercase hex digits, not {uid!r}")
        if conn.execute("SELECT 1 FROM messages WHERE message_uid = ? AND session_id = ? AND active = 1 LIMIT 1",
                        (uid, session_id)).fetchone():
            raise ValueError(f"message_uid {uid!r} is already a live message of session {session_id!r}")
        fields = with_stored_fields(conn, session_id, [fields])[0]
    return insert_message(conn, session_id, fields)


def _prepare_all(messages: Any) -> list:
    # Every message checked before anything is written; a bad one is named by its place.
    prepared = []
    for index, message in enumerate(message_list(messages)):
        try:
            prepared.append(_prepare(message))
        except ValueError as exc:
            raise ValueError(f"message {index}: {exc}") from exc
    return prepared


def append_messages_batch(conn: sqlite3.Connection, session_id: str, messages: list[dict[str, Any]],
                          compression_lock_holder: str | None = None, turn_lease_holder: str | None = None,
                          chunk_rows: int | None = None, turn_lease_ttl_seconds: float = TURN_LEASE_TTL_S) -> int:
    """Append `messages` (dicts as append_message takes) in one transaction, all or none; return how many.

    The holders mean what they mean for append_message, checked once for the batch. `chunk_rows`
    is accepted and must be a positive integer, but the batch is still one transaction here.
    """
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows <= 0):
        raise ValueError(f"chunk_rows must be a positive integer or None, not {shown(chunk_rows)}")
    prepared = _prepare_all(messages)
    check_turn_lease(conn, session_id, turn_lease_holder, turn_lease_ttl_seconds)
    for row, calls in prepared:
        _write_row(conn, session_id, row, calls, 1, 0)
    return len(prepared)


# --- the transcript guard: compression may have closed the session, or another holder holds it ---
def closed_error(conn: sqlite3.Connection, session_id: str) -> SessionClosedByCompressionError:
    """Return the error refusing a write to a session compression closed, naming its live continuation."""
    return SessionClosedByCompressionError(session_id, live_continuation(conn, session_id))


def check_transcript_writable(conn: sqlite3.Connection, session_id: str, holder: str | None = None, *,
                              now: float | None = None) -> None:
    """Refuse a transcript write to a session compression closed or another holder is compressing.

    Raises SessionClosedByCompressionError (naming the live continuation) or
    SessionCompressionInProgressError; call it first inside the write transaction. An unknown
    session passes: the write itself reports it.
    """
    row = conn.execute(
        "SELECT s.end_reason, l.holder, l.expires_at FROM sessions s "
        "LEFT JOIN compression_locks l ON l.session_id = s.id WHERE s.id = ?", (session_id,)).fetchone()
    if row is None:
        return
    if row[0] == COMPRESSION_END_REASON:
        raise closed_error(conn, session_id)
    if row[1] is not None and row[1] != holder and lock_is_live(row[1], row[2], time.time() if now is None else now):
        raise SessionCompressionInProgressError(
            f"session {session_id!r} is being compressed by {row[1]}; the transcript write was not made, "
            "retry after the compression finishes")


# A turn lease (hermes-agent 0.20.1's session_turn_leases) is kept under the root of the
# conversation's compression lineage; a write naming its holder is refused once another holds it.
def turn_lease_key(conn: sqlite3.Connection, session_id: str) -> str:
    """Return the id a session's turn lease is kept under: the root of its compression lineage."""
    ancestors = compression_ancestor_ids(conn, session_id)
    return ancestors[0] if ancestors else session_id


def lease_row(conn: sqlite3.Connection, key: str) -> tuple[str, float] | None:
    """Return (holder, expires_at) of the turn lease kept under `key`, or None."""
    return conn.execute("SELECT holder, expires_at FROM session_turn_leases WHERE conversation_id = ?",
                        (key,)).fetchone()


def check_named_holder(holder: Any) -> str:
    """Return `holder` when it is a non-empty string naming a lease or lock holder, else raise ValueError."""
    if not isinstance(holder, str) or not holder.strip():
        raise ValueError(f"holder must be a non-empty string naming the holder, not {type(holder).__name__}")
    return holder


def check_turn_lease(conn: sqlite3.Connection, session_id: str, holder: str | None,
                     ttl_seconds: float = TURN_LEASE_TTL_S, *, now: float | None = None) -> None:
    """Raise SessionTurnLeaseLostError unless `holder` (when given) still holds the conversation's turn lease.

    A lease of `holder`'s that expired without being taken over is renewed for `ttl_seconds`
    instead: the write is still the only one. Run it inside the write transaction, before the write.
    """
    if holder is None or holder == "":
        return
    holder = check_named_holder(holder)
    ttl_seconds = check_number("turn_lease_ttl_seconds", ttl_seconds, positive=True)
    now = time.time() if now is None else now
    key = turn_lease_key(conn, session_id)
    row = lease_row(conn, key)
    if row is None or row[0] != holder:
        raise SessionTurnLeaseLostError(
            f"{holder} no longer holds the turn lease of conversation {key!r} "
            f"({'it is held by ' + row[0] if row else 'no lease is held'}); the transcript write to "
            f"session {session_id!r} was not made")
    if row[1] <= now:
        conn.execute("UPDATE session_turn_leases SET expires_at = ? WHERE conversation_id = ? AND holder = ?",
                     (now + ttl_seconds, key, holder))


def write_transcript(write: Callable[[], AbstractContextManager[sqlite3.Connection]], session_id: str,
                     body: Callable[[sqlite3.Connection], Any], wait: Callable[[], None],
                     holder: str | None = None) -> Any:
    """Run `body(conn)` in a write transaction (`write()`) after `check_transcript_writable`; return its result.

    Only when another holder is compressing the session does it leave the transaction, call
    `wait()` (holding no lock: hermes_state_compression.wait_for_compression) and try once more.
    `holder`, the caller's own compression lock, lets the write through while it compresses.
    """
    check_id("session_id", session_id)

    def attempt() -> Any:
        with write() as conn:
            check_transcript_writable(conn, session_id, holder)
            return body(conn)
    try:
        return attempt()
    except SessionCompressionInProgressError:
        wait()
    return attempt()


def _decoded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        for name in JSON_MESSAGE_FIELDS:
            if row.get(name) is not None:
                row[name] = decode_json(row[name])
    return rows


def get_messages(conn: sqlite3.Connection, session_id: str, include_inactive: bool = False,
                 limit: int | None = None, offset: int = 0, include_compacted: bool = False,
                 latest: bool = False, after_id: int | None = None) -> list[dict[str, Any]]:
    """Return the session's rows (active only unless asked), every column, JSON decoded, by id.

    `limit`/`offset` page through those rows in insertion order (None: no limit); with `latest`
    the offset counts back from the newest row (the page still comes oldest first). `after_id`
    reads the rows after that id (not with `latest`, `offset` or `include_compacted`).
    `include_compacted` adds the archived generations compression kept (not rewound rows,
    which `include_inactive` adds). A multimodal message's `content` is its list of parts
    (also in `content_parts`).
    """
    if include_compacted or latest or after_id is not None:
        rows = _decoded(row_dicts(conn.execute(*_window_sql(session_id, include_inactive, include_compacted,
                                                             limit, offset, latest, after_id))))
        return _with_parts(rows)
    sql = "SELECT * FROM messages WHERE session_id = ?" + ("" if include_inactive else " AND active = 1") + " ORDER BY id"
    params: Any = [session_id]
    if limit is not None and offset:
        sql, params = _page_sql(session_id, include_inactive, check_count("limit", limit), check_count("offset", offset))
    elif limit is not None or offset:
        # SQLite takes OFFSET only after a LIMIT; -1 means no limit. The page's ids come from the
        # (session_id, id) index, not-live rows left out through their own index, so the rows
        # skipped are never read (the last 100 of 33,000 messages read 100 rows, not 33,000).
        live = "" if include_inactive else \
            f" AND id NOT IN (SELECT id FROM messages WHERE session_id = ? AND {NOT_LIVE_SQL})"
        sql = (f"SELECT * FROM messages WHERE id IN (SELECT id FROM messages WHERE session_id = ?{live} "
               "ORDER BY id LIMIT ? OFFSET ?) ORDER BY id")
        params += [] if include_inactive else [session_id]
        params += [-1 if limit is None else check_count("limit", limit), check_count("offset", offset)]
    return _with_parts(_decoded(row_dicts(conn.execute(sql, params))))


def _with_parts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        if row.get("content_parts") is not None:
            row["content"] = row["content_parts"]
    return rows


def _window_sql(session_id: str, include_inactive: bool, include_compacted: bool, limit: int | None, offset: int,
                latest: bool, after_id: int | None) -> tuple[str, list[Any]]:
    # hermes-agent 0.20.1's reads: archived generations, the newest page, and paging by id.
    offset = check_count("offset", offset)
    count = -1 if limit is None else check_count("limit", limit)
    which = "" if include_inactive else " AND (active = 1 OR compacted = 1)" if include_compacted else " AND active = 1"
    if after_id is not None:
        if latest or offset:
            raise ValueError("after_id pages forward by id; it cannot be combined with latest or offset")
        if include_compacted:
            raise ValueError("after_id cannot be combined with include_compacted; page those with offset")
        if isinstance(after_id, bool) or not isinstance(after_id, int):
            raise ValueError(f"after_id must be a message id (an int), not {type(after_id).__name__}")
        return (f"SELECT * FROM messages WHERE session_id = ?{which} AND id > ? ORDER BY id LIMIT ?",
                [session_id, after_id, count])
    order = "DESC" if latest else ""
    return (f"SELECT * FROM (SELECT * FROM messages WHERE session_id = ?{which} ORDER BY id {order} "
            "LIMIT ? OFFSET ?) ORDER BY id", [session_id, count, offset])


def _page_sql(session_id: str, include_inactive: bool, limit: int, offset: int) -> tuple[str, dict[str, Any]]:
    # A page past the middle is read from the end: skipping 33,000 index entries forward (each
    # checked against the not-live ids) cost 5 ms, counting them and skipping the few after the
    # page backwards costs 2. One statement, so the count and the page see the same rows.
    live = "" if include_inactive else f" AND id NOT IN (SELECT id FROM messages WHERE session_id = :s AND {NOT_LIVE_SQL})"
    ids = f"SELECT id FROM messages WHERE session_id = :s{live} ORDER BY id"
    total = "(SELECT COUNT(*) FROM messages WHERE session_id = :s)" + (
        "" if include_inactive else f" - (SELECT COUNT(*) FROM messages WHERE session_id = :s AND {NOT_LIVE_SQL})")
    sql = (f"WITH n(total) AS (SELECT {total}), "
           "w(fwd, rev_limit, rev_offset) AS (SELECT :o <= total - :o - :l, "
           "MAX(0, MIN(:o + :l, total) - :o), MAX(0, total - :o - :l) FROM n) "
           "SELECT * FROM messages WHERE id IN ("
           f"SELECT id FROM ({ids} LIMIT (SELECT CASE WHEN fwd THEN :l ELSE 0 END FROM w) OFFSET :o) "
           f"UNION ALL SELECT id FROM ({ids} DESC LIMIT (SELECT CASE WHEN fwd THEN 0 ELSE rev_limit END FROM w) "
           "OFFSET (SELECT rev_offset FROM w))) ORDER BY id")
    return sql, {"s": session_id, "l": limit, "o": offset}


def message_count(conn: sqlite3.Connection, session_id: str | None = None) -> int:
    """Return how many live messages the store holds, or one session holds (0 for an unknown one)."""
    if isinstance(session_id, str) and has_surrogate(session_id):
        return 0  # no stored id holds one
    # Every row less those not live: both counts read only b-tree pages (the second, a partial
    # index that is usually empty), where counting `active = 1` read every message.
    if session_id is None:
        return conn.execute(f"SELECT (SELECT COUNT(*) FROM messages) - "
                            f"(SELECT COUNT(*) FROM messages WHERE {NOT_LIVE_SQL})").fetchone()[0]
    return conn.execute(f"SELECT (SELECT COUNT(*) FROM messages WHERE session_id = ?) - "
                        f"(SELECT COUNT(*) FROM messages WHERE session_id = ? AND {NOT_LIVE_SQL})",
                        (session_id, session_id)).fetchone()[0]


# --- size guards: how many active rows an in-memory export or a resume would load -----------------

# The most active messages an in-memory export or a resume loads by default (hermes-agent's bounds);
# config.yaml's sessions.max_export_messages / max_resume_messages change them, 0 turns a guard off.
MAX_SAFE_EXPORT_MESSAGES = 20_000
MAX_SAFE_RESUME_MESSAGES = 20_000


def resolved_max_export_messages() -> int:
    """Return the in-memory export guard's limit: config.yaml's sessions.max_export_messages, else 20,000 (0: off)."""
    return config_count("sessions", "max_export_messages", MAX_SAFE_EXPORT_MESSAGES)


def resolved_max_resume_messages() -> int:
    """Return the resume guard's limit: config.yaml's sessions.max_resume_messages, else 20,000 (0: off)."""
    return config_count("sessions", "max_resume_messages", MAX_SAFE_RESUME_MESSAGES)


def _active_rows(conn: sqlite3.Connection, session_ids: list[str], bound: int | None = None) -> int:
    # Counting stops one row past the bound: proving a transcript too large never reads all of it.
    inner = ("SELECT 1 FROM messages WHERE session_id IN (SELECT value FROM json_each(?)) AND active = 1"
             + ("" if bound is None else " LIMIT ?"))
    params: list[Any] = [json.dumps(session_ids)] + ([] if bound is None else [bound + 1])
    return conn.execute(f"SELECT COUNT(*) FROM ({inner})", params).fetchone()[0]


def _limit(max_messages: Any, resolved: Callable[[], int]) -> int:
    if max_messages is None:
        return resolved()
    if isinstance(max_messages, bool) or not isinstance(max_messages, int):
        raise TypeError(f"max_messages must be an integer or None, not {type(max_messages).__name__}")
    if max_messages < 0:
        raise ValueError("max_messages must be non-negative")
    return check_count("max_messages", max_messages)


def _resume_ids(conn: sqlite3.Connection, session_id: str) -> list[str]:
    # What a full resume loads: the session and the compression ancestors it continues.
    return [*compression_ancestor_ids(conn, session_id), session_id]


def get_resume_message_count(conn: sqlite3.Connection, session_id: str) -> int:
    """Return how many active rows a full resume would load: the session's and its compression ancestors'."""
    return _active_rows(conn, _resume_ids(conn, check_id("session_id", session_id)))


def assert_export_safe(conn: sqlite3.Connection, session_id: str, max_messages: int | None = None) -> int:
    """Return the session's active row count, or raise SessionExportTooLargeError past the limit (None: config; 0: off).

    Only the session itself counts (an export of it leaves its compression ancestors out).
    """
    limit = _limit(max_messages, resolved_max_export_messages)
    ids = [check_id("session_id", session_id)]
    count = _active_rows(conn, ids, limit or None)
    if limit and count > limit:
        raise SessionExportTooLargeError(session_id, count, limit)
    return count


def assert_resume_safe(conn: sqlite3.Connection, session_id: str, max_messages: int | None = None) -> int:
    """Return the active rows a resume loads, or raise SessionResumeTooLargeError past the limit (None: config; 0: off)."""
    limit = _limit(max_messages, resolved_max_resume_messages)
    count = _active_rows(conn, _resume_ids(conn, check_id("session_id", session_id)), limit or None)
    if limit and count > limit:
        raise SessionResumeTooLargeError(count, limit)
    return count


def set_latest_user_api_content(conn: sqlite3.Connection, session_id: str, content: Any, api_content: str) -> int:
    """Set api_content on the session's latest live user row if its content is `content`; return 0 or 1.

    The bytes sent for a turn can differ from its display text (memory or a plugin added
    context); recording them keeps the replay byte for byte. A newer user turn in between
    means the caller's turn is gone, so nothing is written.
    """
    if not isinstance(api_content, str):
        raise ValueError(f"api_content must be a string, not {type(api_content).__name__}")
    row = conn.execute("SELECT id, content, content_parts FROM messages WHERE session_id = ? AND active = 1 "
                       "AND role = 'user' ORDER BY id DESC LIMIT 1", (session_id,)).fetchone()
    if row is None:
        require_session(conn, session_id)
        return 0
    stored = decode_json(row[2]) if row[2] is not None else row[1]
    wanted = replace_surrogates(content) if isinstance(content, str) else content
    if stored != wanted:
        return 0
    return conn.execute("UPDATE messages SET api_content = ? WHERE id = ?",
                        (replace_surrogates(api_content), row[0])).rowcount


def _join_text(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    texts = [v for v in present if v != ""]
    if not texts:
        return present[0] if present else None
    return "\n\n".join(texts)


def _join_lists(values: list[Any]) -> list | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return [item for v in present for item in (v if isinstance(v, list) else [v])]


def merge_tool_call_uids(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Merge assistant turns' tool_call_uids; an id used by several turns maps to its uids in call order."""
    occurrences: dict[str, list[tuple[int, str | None]]] = {}
    for index, row in enumerate(rows):
        uids = found if isinstance(found := row.get("tool_call_uids"), dict) else {}
        seen: dict[str, int] = {}
        for cid in _call_ids(row.get("tool_calls") if isinstance(row.get("tool_calls"), list) else None):
            if cid in uids:
                occurrences.setdefault(cid, []).append((index, pick_tool_call_uid(uids[cid], seen.get(cid, 0))))
                seen[cid] = seen.get(cid, 0) + 1
    merged: dict[str, Any] = {}
    for cid, occ in occurrences.items():
        turns = {index for index, _ in occ}
        merged[cid] = rows[occ[0][0]]["tool_call_uids"][cid] if len(turns) == 1 else [uid for _, uid in occ]
    return merged or None


def _first(rows: list[dict[str, Any]], name: str) -> Any:
    return next((r[name] for r in rows if r[name] is not None), None)


def _last(rows: list[dict[str, Any]], name: str) -> Any:
    return _first(rows[::-1], name)


def _sum(rows: list[dict[str, Any]], name: str) -> Any:
    values = [r[name] for r in rows if r[name] is not None]
    return sum(values) if values else None


def _sent_text(rows: list[dict[str, Any]], name: str) -> Any:
    # The merged turn replays what each part actually sent (its content when it had no api_content).
    if all(r[name] is None for r in rows):
        return None
    return _join_text([r[name] if r[name] is not None else r["content"] for r in rows])


def _parts(rows: list[dict[str, Any]], name: str) -> list | None:
    # A merge with a multimodal part stays multimodal: text-only parts join as text parts.
    if all(r[name] is None for r in rows):
        return None
    out: list = []
    for r in rows:
        text = r["api_content"] if r["api_content"] is not None else r["content"]
        out += r[name] if r[name] is not None else ([{"type": "text", "text": text}] if text else [])
    return out


def _absorbed(rows: list[dict[str, Any]], name: str) -> list[str] | None:
    uids = list(rows[0][name] or [])
    for r in rows[1:]:
        uids += [r["message_uid"], *(r[name] or [])]
    return [u for u in uids if u is not None] or None


def _texts(rows: list[dict[str, Any]], name: str) -> Any:
    return _join_text([r[name] for r in rows])


def _lists(rows: list[dict[str, Any]], name: str) -> list | None:
    return _join_lists([r[name] for r in rows])


# How a merge folds each column of the constituent rows into the merged row. Columns not
# listed (role, timestamp, message_uid, tool_call_id, ...) keep the first row's value.
_MERGE_RULES: dict[str, Callable[[list[dict[str, Any]], str], Any]] = {
    "content": _texts, "api_content": _sent_text, "reasoning": _texts, "reasoning_content": _texts,
    "tool_calls": _lists, "reasoning_details": _lists, "codex_reasoning_items": _lists,
    "codex_message_items": _lists, "tool_call_uids": lambda rows, _: merge_tool_call_uids(rows),
    "token_count": _sum, "finish_reason": _last, "display_kind": _first, "display_metadata": _first,
    "platform_message_id": _first, "absorbed_message_uids": _absorbed, "content_parts": _parts,
}


def _merged_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    values = {name: rule(rows, name) for name, rule in _MERGE_RULES.items()}
    for name in JSON_MESSAGE_FIELDS:
        if name in values:
            values[name] = encode_json(values[name], name)
    return values


def _merge_ids(row_ids: Any) -> list[int]:
    ids = [] if isinstance(row_ids, (str, bytes)) or not isinstance(row_ids, Iterable) else list(row_ids)
    if len(ids) < 2 or any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or len(set(ids)) != len(ids):
        raise ValueError("row_ids must be at least two distinct integer row ids")
    return ids


def _rows_to_merge(conn: sqlite3.Connection, session_id: str, ids: list[int]) -> list[dict[str, Any]]:
    rows = _decoded(row_dicts(conn.execute(
        f"SELECT * FROM messages WHERE session_id = ? AND active = 1 AND id IN ({', '.join('?' * len(ids))}) "
        "ORDER BY id", (session_id, *ids))))
    missing = sorted(set(ids) - {r["id"] for r in rows})
    if missing:
        raise ValueError(f"rows {missing} are not active messages of session {session_id!r}")
    roles = {r["role"] for r in rows}
    if len(roles) != 1 or roles & {"user", "assistant"} != roles:
        raise ValueError(f"only user/user or assistant/assistant rows merge, not {sorted(roles)}")
    return rows


def _merge_deltas(rows: list[dict[str, Any]], merged_calls: Any) -> list[int]:
    # The merged row counts once where its parts counted each (the tool calls normally just move
    # to it; non-list tool_calls text changes their count).
    role = rows[0]["role"]
    merged = counter_amounts(role, decode_json(merged_calls))
    parts = [counter_amounts(role, r["tool_calls"]) for r in rows]
    return [total - sum(p[i] for p in parts) for i, total in enumerate(merged)]


def merge_messages(conn: sqlite3.Connection, session_id: str, row_ids: Iterable[int]) -> int:
    """Fold active same-role (user or assistant) rows into the first; return its id.

    The merged row keeps its own message_uid and lists the others' uids (and what they had
    absorbed) in absorbed_message_uids; the other rows are deleted and message_count drops.
    """
    ids = _merge_ids(row_ids)
    require_session(conn, session_id)
    rows = _rows_to_merge(conn, session_id, ids)
    values = _merged_values(rows)
    deltas = _merge_deltas(rows, values["tool_calls"])
    conn.execute(f"UPDATE messages SET {', '.join(f'{n} = ?' for n in values)} WHERE id = ?",
                 [*values.values(), rows[0]["id"]])
    conn.execute(f"DELETE FROM messages WHERE id IN ({', '.join('?' * (len(rows) - 1))})",
                 [r["id"] for r in rows[1:]])
    conn.execute(f"UPDATE sessions SET {COUNTER_ADD_SQL} WHERE id = ?", (*deltas, session_id))
    return rows[0]["id"]


def replace_messages(conn: sqlite3.Connection, session_id: str, messages: Iterable[dict[str, Any]],
                     active_only: bool = False, archive_dropped: bool = False) -> int:
    """Rewrite the session's active transcript with `messages` (uids kept); return how many were written.

    Rows of earlier compression generations (active=0) are always left alone (`active_only` is
    accepted and changes nothing). With `archive_dropped` the replaced rows are kept as rewound
    rows (active=0, compacted=0) instead of deleted. Every message is validated before the
    old rows go; one message_uid twice raises ValueError.
    """
    prepared = _prepare_all(messages)
    reset_counters(conn, session_id)
    if archive_dropped:
        conn.execute("UPDATE messages SET active = 0, compacted = 0 WHERE session_id = ? AND active = 1", (session_id,))
    else:
        conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 1", (session_id,))
    for row, calls in prepared:
        _write_row(conn, session_id, row, calls, 1, 0)
    return len(prepared)


def clear_messages(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete every message row of the session (all generations), keep the session; return how many."""
    reset_counters(conn, session_id)
    return conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,)).rowcount


# --- hermes-agent 0.20.1: reactions and lookups by role -----------------------------------------
# A reaction lives where hermes-agent 0.20.1 keeps it, so both programs read and write each
# other's on one file: under REACTIONS_KEY in the row's display_metadata object, a list of
# {"emoji", "author", "at"} (plus "seen": true once announced), one per author.
REACTIONS_KEY = "reactions"
# Text a person sees as a bubble: any non-blank content (a tool-call-only turn has none).
_HAS_TEXT_SQL = "TRIM(COALESCE(content, ''), ' ' || char(9, 10, 13)) <> ''"
# hermes-agent 0.20.1 stores a list of content parts as this prefix and JSON in `content`; such a
# row has no plain text for it (this library keeps the parts' text there, the parts beside it).
_ENCODED_CONTENT = "\x00json:"


def _row_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"message_row_id must be an integer row id, not {shown(value)}")
    return value


def _metadata(text: Any) -> dict[str, Any]:
    # Another program's malformed or non-object metadata holds no reactions; a write replaces it.
    value = decode_json(text) if isinstance(text, str) else None
    return value if isinstance(value, dict) else {}


def _reactions(meta: dict[str, Any]) -> list[dict[str, Any]]:
    found = meta.get(REACTIONS_KEY)
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _store_metadata(conn: sqlite3.Connection, row_id: int, meta: dict[str, Any]) -> None:
    conn.execute("UPDATE messages SET display_metadata = ? WHERE id = ?",
                 (encode_json(meta, "display_metadata") if meta else None, row_id))


def set_message_reaction(conn: sqlite3.Connection, session_id: str, message_row_id: int, emoji: str | None, *,
                         author: str = "user") -> list[dict[str, Any]] | None:
    """Set `author`'s one reaction on a message (the same emoji again, '' or None clears it); return them all.

    None when the row is not a message of `session_id`. A new emoji replaces the author's
    earlier one and is announced again (take_unseen_reactions).
    """
    check_id("session_id", session_id)
    row_id = _row_id(message_row_id)
    if emoji is not None and not isinstance(emoji, str):
        raise ValueError(f"emoji must be a string or None, not {shown(emoji)}")
    check_id("author", author)
    row = conn.execute("SELECT display_metadata FROM messages WHERE id = ? AND session_id = ?",
                       (row_id, session_id)).fetchone()
    if row is None:
        return None
    meta = _metadata(row[0])
    reactions = _reactions(meta)
    mine = [r for r in reactions if r.get("author") == author]
    kept = [r for r in reactions if r.get("author") != author]
    if emoji and not (mine and mine[0].get("emoji") == emoji):
        kept.append({"emoji": replace_surrogates(emoji), "author": author, "at": time.time()})
    if kept:
        meta[REACTIONS_KEY] = kept
    else:
        meta.pop(REACTIONS_KEY, None)
    _store_metadata(conn, row_id, meta)
    return kept


def get_message_reactions(conn: sqlite3.Connection, session_id: str, message_row_id: int) -> list[dict[str, Any]]:
    """Return the reactions stored on one message of the session ([] for none or an unknown row)."""
    row = conn.execute("SELECT display_metadata FROM messages WHERE id = ? AND session_id = ?",
                       (_row_id(message_row_id), session_id)).fetchone()
    return [] if row is None else _reactions(_metadata(row[0]))


def take_unseen_reactions(conn: sqlite3.Connection, session_id: str, *,
                          author: str = "user") -> list[dict[str, Any]]:
    """Return `author`'s reactions on live messages not announced yet, oldest message first, and mark them seen.

    Each: {"row_id", "role", "emoji", "text"} (the message's plain text, '' when it has none).
    """
    check_id("session_id", session_id)
    check_id("author", author)
    taken = []
    for row_id, role, content, text in conn.execute(
            "SELECT id, role, content, display_metadata FROM messages WHERE session_id = ? AND active = 1 "
            "AND display_metadata LIKE '%' || ? || '%' ORDER BY id", (session_id, REACTIONS_KEY)).fetchall():
        meta = _metadata(text)
        fresh = [r for r in _reactions(meta) if r.get("author") == author and not r.get("seen")]
        if not fresh:
            continue
        plain = content if isinstance(content, str) and not content.startswith(_ENCODED_CONTENT) else ""
        for reaction in fresh:
            reaction["seen"] = True
            taken.append({"row_id": row_id, "role": role, "emoji": reaction.get("emoji"), "text": plain})
        _store_metadata(conn, row_id, meta)
    return taken


def get_message_role(conn: sqlite3.Connection, session_id: str, row_id: int) -> str | None:
    """Return the role of the live message `row_id` of the session, or None."""
    row = conn.execute("SELECT role FROM messages WHERE id = ? AND session_id = ? AND active = 1",
                       (_row_id(row_id), session_id)).fetchone()
    return None if row is None else row[0]


def latest_message_row_id(conn: sqlite3.Connection, session_id: str, *, role: str = "user", offset: int = 0,
                          require_text: bool = True) -> int | None:
    """Return the row id of the session's latest live message of `role` (`offset` turns back), or None.

    Only user and assistant turns are found (other roles: None). With `require_text` (the default) rows without visible text (a tool-call-only turn, blank
    content) are skipped. A negative offset finds nothing.
    """
    if not isinstance(role, str):
        raise ValueError(f"role must be a string, not {shown(role)}")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"offset must be an integer, not {shown(offset)}")
    if offset < 0 or role not in ("user", "assistant"):  # only a person's and the model's turns are bubbles
        return None
    text = f" AND {_HAS_TEXT_SQL}" if require_text else ""
    row = conn.execute(f"SELECT id FROM messages WHERE session_id = ? AND role = ? AND active = 1{text} "
                       "ORDER BY id DESC LIMIT 1 OFFSET ?", (session_id, role, check_count("offset", offset))).fetchone()
    return None if row is None else row[0]


def latest_user_message_row_id(conn: sqlite3.Connection, session_id: str) -> int | None:
    """Return the row id of the session's latest live user message with text, or None."""
    return latest_message_row_id(conn, session_id)


def get_first_assistant_text(conn: sqlite3.Connection, session_id: str) -> str:
    """Return the content of the session's first assistant message that has any ('' when none)."""
    row = conn.execute("SELECT content FROM messages WHERE session_id = ? AND role = 'assistant' "
                       "AND content IS NOT NULL ORDER BY id LIMIT 1", (session_id,)).fetchone()
    text = row[0] if row is not None else ""
    return "" if not isinstance(text, str) or text.startswith(_ENCODED_CONTENT) else text


def find_pr_url_messages(conn: sqlite3.Connection, session_ids: list[str]) -> list[dict[str, Any]]:
    """Return {"session_id", "content"} of every tool result in these sessions that holds '/pull/', oldest first.

    A loose candidate scan (any letter case, archived rows too): the caller decides which is a PR url.
    """
    if isinstance(session_ids, (str, bytes, dict)) or not isinstance(session_ids, Iterable):
        raise ValueError(f"session_ids must be a list of session ids, not {shown(session_ids)}")
    wanted = [s for s in session_ids if isinstance(s, str) and not has_surrogate(s)]
    if not wanted:
        return []
    return [{"session_id": sid, "content": content} for sid, content in conn.execute(
        "SELECT session_id, content FROM messages WHERE session_id IN (SELECT value FROM json_each(?)) "
        "AND role = 'tool' AND content LIKE '%/pull/%' ORDER BY id", (json.dumps(wanted),))]


def set_latest_matching_message_display_kind(conn: sqlite3.Connection, session_id: str, *, role: str, content: str,
                                             display_kind: str,
                                             display_metadata: dict[str, Any] | None = None) -> bool:
    """Stamp display_kind (and display_metadata, replacing it) on the session's latest live row with this role and content.

    False when no row matches or `display_kind` is empty. Only presentation columns change.
    """
    check_id("session_id", session_id)
    for name, value in (("role", role), ("display_kind", display_kind)):
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, not {shown(value)}")
    if display_metadata is not None and not isinstance(display_metadata, dict):
        raise ValueError(f"display_metadata must be a dict or None, not {type(display_metadata).__name__}")
    if not display_kind or not isinstance(content, str):
        return False
    row = conn.execute("SELECT id FROM messages WHERE session_id = ? AND role = ? AND content = ? AND active = 1 "
                       "ORDER BY id DESC LIMIT 1", (session_id, role, replace_surrogates(content))).fetchone()
    if row is None:
        return False
    conn.execute("UPDATE messages SET display_kind = ?, display_metadata = ? WHERE id = ?",
                 (replace_surrogates(display_kind),
                  encode_json(display_metadata, "display_metadata") if display_metadata else None, row[0]))
    return True


# --- excerpts of a transcript: the rows around one message, an anchored view, recent user turns ---

PREVIEW_CHARS = 80  # a preview longer than this ends in "..." at this length
_ELLIPSIS = "..."
# A bookend carries text: plain-text content, not empty (a multimodal row's content is its parts).
_HAS_TEXT = "content IS NOT NULL AND content != '' AND content_parts IS NULL"
# What a window around a message that is not there answers.
EMPTY_AROUND: dict[str, Any] = {"window": [], "messages_before": 0, "messages_after": 0}
EMPTY_ANCHORED: dict[str, Any] = {**EMPTY_AROUND, "bookend_start": [], "bookend_end": []}


def decoded_rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    """Run a SELECT of whole message rows; return them as get_messages does (JSON decoded, parts as content)."""
    rows = [decoded("messages", row) for row in row_dicts(conn.execute(sql, params))]
    for row in rows:
        if row.get("content_parts") is not None:
            row["content"] = row["content_parts"]
    return rows


def _check_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a message row id (an int), not {value!r}")
    return value


def _span(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, not {value!r}")
    return max(value, 0)  # a negative window is an empty one


def _roles(keep_roles: Any) -> tuple[str, ...] | None:
    if keep_roles is None:
        return None
    if isinstance(keep_roles, str) or not isinstance(keep_roles, Iterable):
        raise ValueError(f"keep_roles must be a tuple of role names or None, not {keep_roles!r}")
    roles = tuple(keep_roles)
    if not all(isinstance(role, str) for role in roles):
        raise ValueError(f"keep_roles must hold role names (str), not {roles!r}")
    return roles


def _window(conn: sqlite3.Connection, session_id: str, anchor_id: int,
            window: int) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]] | None:
    # (rows before, the anchor, rows after), or None when the anchor is not a row of the session.
    anchor = decoded_rows(conn, "SELECT * FROM messages WHERE id = ? AND session_id = ?", (anchor_id, session_id))
    if not anchor:
        return None
    before = decoded_rows(conn, "SELECT * FROM messages WHERE session_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
                          (session_id, anchor_id, window))
    after = decoded_rows(conn, "SELECT * FROM messages WHERE session_id = ? AND id > ? ORDER BY id LIMIT ?",
                         (session_id, anchor_id, window))
    return before[::-1], anchor[0], after


def get_messages_around(conn: sqlite3.Connection, session_id: str, around_message_id: int,
                        window: int = 5) -> dict[str, Any]:
    """Return {"window", "messages_before", "messages_after"}: up to `window` rows either side of the message, and it.

    An id that is not a row of the session gives an empty window.
    """
    found = _window(conn, session_id, _check_id("around_message_id", around_message_id), _span(window, "window"))
    if found is None:
        return copy.deepcopy(EMPTY_AROUND)
    before, anchor, after = found
    return {"window": [*before, anchor, *after], "messages_before": len(before), "messages_after": len(after)}


def _bookend(conn: sqlite3.Connection, session_id: str, side: str, edge: int, count: int,
             roles: tuple[str, ...] | None) -> list[dict[str, Any]]:
    if count == 0:
        return []
    role_sql = "" if roles is None else f" AND role IN ({', '.join('?' * len(roles))})"
    first = side == "start"
    rows = decoded_rows(conn, f"SELECT * FROM messages WHERE session_id = ? AND id {'<' if first else '>'} ? "
                              f"AND {_HAS_TEXT}{role_sql} ORDER BY id {'' if first else 'DESC'} LIMIT ?",
                        (session_id, edge, *(roles or ()), count))
    return rows if first else rows[::-1]


def get_anchored_view(conn: sqlite3.Connection, session_id: str, around_message_id: int, window: int = 5,
                      bookend: int = 3, keep_roles: tuple[str, ...] | None = ("user", "assistant")) -> dict[str, Any]:
    """Return get_messages_around's window narrowed to `keep_roles` (the anchor always stays), with bookends.

    `messages_before`/`messages_after` count the window's rows before the narrowing;
    "bookend_start"/"bookend_end" are the first and last `bookend` rows outside the window
    that carry text and have a kept role, in order. None keeps every role.
    """
    roles = _roles(keep_roles)
    ends = _span(bookend, "bookend")
    found = _window(conn, session_id, _check_id("around_message_id", around_message_id), _span(window, "window"))
    if found is None:
        return copy.deepcopy(EMPTY_ANCHORED)
    before, anchor, after = found

    def kept(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return rows if roles is None else [row for row in rows if row["role"] in roles]
    first, last = (before[0] if before else anchor)["id"], (after[-1] if after else anchor)["id"]
    return {"window": [*kept(before), anchor, *kept(after)], "messages_before": len(before),
            "messages_after": len(after), "bookend_start": _bookend(conn, session_id, "start", first, ends, roles),
            "bookend_end": _bookend(conn, session_id, "end", last, ends, roles)}


def preview(text: str | None) -> str:
    """Return `text` as a one-line preview: whitespace runs become one space, cut to 80 characters with "..."."""
    line = " ".join((text or "").split())
    return line if len(line) <= PREVIEW_CHARS else line[:PREVIEW_CHARS - len(_ELLIPSIS)] + _ELLIPSIS


def list_recent_user_messages(conn: sqlite3.Connection, session_id: str, limit: int = 20,
                              include_inactive: bool = False) -> list[dict[str, Any]]:
    """Return the session's latest user turns, newest first, as {"id", "timestamp", "preview"} (live rows unless asked)."""
    live = "" if include_inactive else " AND active = 1"
    rows = conn.execute(f"SELECT id, timestamp, content FROM messages WHERE session_id = ? AND role = 'user'{live} "
                        "ORDER BY id DESC LIMIT ?", (session_id, check_count("limit", limit))).fetchall()
    return [{"id": row[0], "timestamp": row[1], "preview": preview(row[2])} for row in rows]


def has_platform_message_id(conn: sqlite3.Connection, session_id: str, platform_message_id: str) -> bool:
    """True when a row of the session (any generation) carries the platform's message id."""
    return conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND platform_message_id = ? LIMIT 1",
                        (session_id, platform_message_id)).fetchone() is not None
