"""Input ownership on the exception path: which stored row owns an inbound input, and the one append.

Owns: input markers (`input_marker`, the `input_marker` key of a message's display_metadata),
where an input of a session may already be stored (`ownership_places`: the forward targets the
routing publishes, the compression tip and its ancestors), `find_input_owner`, `input_target`
and `persist_failed_turn_input`, which appends a failed turn's input exactly once. It sits next
to the message rows: its one write is a transcript append through hermes_state_messages.
Does not own: the routing table (hermes_state_routing gives `forward_targets`), compression
lineage walks (hermes_state_lineage), message validation (hermes_state_messages).

Transaction contract: `persist_failed_turn_input` runs inside the caller's write transaction,
so two writers for one marker append exactly once; the lookups run under the caller's lock
and never write. A failed lookup raises OwnershipReadError and appends nothing.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from typing import Any, Iterable

import hermes_state_lineage as lineage
from hermes_state_common import INPUT_MARKER_SQL, check_id
from hermes_state_messages import check_transcript_writable
from hermes_state_errors import OwnershipReadError, SessionNotFoundError
from hermes_state_messages import insert_message
from hermes_state_routing import forward_targets
from hermes_state_sessions import require_session

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
