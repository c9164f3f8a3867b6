"""Session and message records, and the conversation projection.

Owns: creating/reading/updating `sessions` rows (end/reopen, token counters, archive flags),
appending and reading `messages` rows (uids, JSON fields, counters, tool-call pairing,
merges, whole-transcript rewrites), the compression edge and its walks, and turning rows into
OpenAI-format conversations.
Does not own: lineage/title/listing queries (hermes_state_search), compression generations
(hermes_state_compression), FTS (hermes_state_fts), provider wire formats (hermes_state_provider).

Counters: `message_count` counts a session's ACTIVE rows and `tool_call_count` the tool calls
of its active assistant rows; every write here keeps both in the same transaction.

Transaction contract: write functions run inside the caller's write transaction (the facade
opens it) and never open or commit one themselves; every check that can fail runs before the
first statement that changes anything. Read functions run under the caller's lock.
"""
from __future__ import annotations

import json
import math
import re
import sqlite3
import time
import uuid
from typing import Any, Iterable

import hermes_state_lineage as lineage
from hermes_state_common import (JSON_MESSAGE_FIELDS, SESSION_COLUMN_NAMES, TABLE_COLUMNS, decode_json,
                                 encode_json, strip_surrogates)
from hermes_state_errors import SessionClosedByCompressionError, SessionNotFoundError, TitleConflictError

TITLE_MAX_CHARS = 100
_DAY_S = 86400.0

# Columns the library maintains itself; callers may not set them through **columns.
_MANAGED_SESSION_COLUMNS = frozenset({"id", "message_count", "tool_call_count"})
_JSON_SESSION_COLUMNS = frozenset({"model_config", "origin_json"})
# Columns update_session refuses, each with the verb that owns it. create_session still takes
# them, so an import can write a row exactly as it was exported.
_VERB_SESSION_COLUMNS = {
    "user_id": "nothing: it is set when the session is created and never changed afterwards (R-SESS-4)",
    "ended_at": "end_session (the first end wins) or reopen_session",
    "end_reason": "end_session (the first end wins) or reopen_session",
    "archived": "archive_session or unarchive_session",
    "auto_archived": "auto_archive, or unarchive_session to clear it",
    "pinned": "pin_session",
    # The creation time also stamps the compression edge (child started_at = parent ended_at).
    "started_at": "nothing: it is the creation time, and a rotation child's start marks its compression edge",
}
# SQLite's INTEGER is a signed 64-bit value; Python ints outside it fail at bind time.
_INT_MIN, _INT_MAX = -2**63, 2**63 - 1


def _scalar(name: str, value: Any) -> Any:
    """Return `value` if SQLite stores it faithfully (None, str, bool, 64-bit int, non-NaN float)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"{name} cannot be NaN (SQLite would store NULL)")
        return value
    raise ValueError(f"{name} must be a str, int, float, bool or None, not {type(value).__name__}")


def _session_values(columns: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(columns) - SESSION_COLUMN_NAMES)
    if unknown:
        raise ValueError(f"unknown session column(s): {', '.join(unknown)}")
    managed = sorted(set(columns) & _MANAGED_SESSION_COLUMNS)
    if managed:
        raise ValueError(f"session column(s) maintained by the library cannot be set: {', '.join(managed)}")
    out = {}
    for name, value in columns.items():
        if name in _JSON_SESSION_COLUMNS and value is not None and not isinstance(value, str):
            value = encode_json(value, name)
        value = _scalar(name, value)
        out[name] = strip_surrogates(value) if isinstance(value, str) else value
    return out


def normalize_title(title: str | None) -> str | None:
    """Strip a title; None or blank clears it; over 100 characters raises ValueError."""
    if title is None:
        return None
    if not isinstance(title, str):
        raise ValueError("title must be a string or None")
    title = strip_surrogates(title).strip()
    if len(title) > TITLE_MAX_CHARS:
        raise ValueError(f"title is {len(title)} characters; the limit is {TITLE_MAX_CHARS}")
    return title or None


def check_title_free(conn: sqlite3.Connection, title: str | None, session_id: str) -> None:
    """Raise TitleConflictError when another session already carries `title`."""
    if title is None:
        return
    row = conn.execute("SELECT id FROM sessions WHERE title = ? AND id != ?", (title, session_id)).fetchone()
    if row is not None:
        raise TitleConflictError(f"title {title!r} is already used by session {row[0]!r}")


def session_exists(conn: sqlite3.Connection, session_id: str) -> bool:
    """Return True when a session row with this id exists."""
    return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None


def require_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Raise SessionNotFoundError unless the session exists."""
    if not session_exists(conn, session_id):
        raise SessionNotFoundError(f"session {session_id!r} not found")


def _updated_or_missing(cur: sqlite3.Cursor, session_id: str) -> None:
    # Folding the existence check into the UPDATE's rowcount saves a SELECT; a miss wrote nothing.
    if cur.rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


# --- session records ----------------------------------------------------------------------------

def create_session(conn: sqlite3.Connection, session_id: str, source: str, columns: dict[str, Any]) -> str:
    """Insert a new session row; raise ValueError for a duplicate id or unknown column."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    if not isinstance(source, str) or not source:
        raise ValueError("source must be a non-empty string")
    values = _session_values({k: v for k, v in columns.items() if v is not None})
    values.setdefault("started_at", time.time())
    if session_exists(conn, session_id):
        raise ValueError(f"session {session_id!r} already exists (use ensure_session for the idempotent form)")
    if "title" in values:
        values["title"] = normalize_title(values["title"])
        check_title_free(conn, values["title"], session_id)
    parent = values.get("parent_session_id")
    if parent is not None:
        require_session(conn, parent)
    names = ["id", "source", *values]
    conn.execute(f"INSERT INTO sessions ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                 [session_id, source, *values.values()])
    return session_id


def ensure_session(conn: sqlite3.Connection, session_id: str, source: str, columns: dict[str, Any]) -> str:
    """Create the session unless it exists; an existing row is left exactly as it is.

    The columns are validated either way, so a bad name or value raises even when nothing is written.
    """
    _session_values({k: v for k, v in columns.items() if v is not None})
    if isinstance(session_id, str) and session_id and session_exists(conn, session_id):
        return session_id
    return create_session(conn, session_id, source, columns)


def get_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the session row as a dict, or None when it does not exist."""
    cur = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d[0] for d in cur.description], row))


def end_session(conn: sqlite3.Connection, session_id: str, end_reason: str, *, now: float | None = None) -> None:
    """Mark the session ended; the first end wins and a later call changes nothing."""
    if not isinstance(end_reason, str) or not end_reason:
        raise ValueError("end_reason must be a non-empty string")
    cur = conn.execute("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                       (time.time() if now is None else now, strip_surrogates(end_reason), session_id))
    if cur.rowcount == 0:
        require_session(conn, session_id)


def reopen_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear ended_at/end_reason, and an archive that only the idle sweep made.

    A session compression closed is refused with SessionClosedByCompressionError naming its
    live continuation: reopening it would fork the conversation and cut the lineage.
    """
    cur = conn.execute(
        "UPDATE sessions SET ended_at = NULL, end_reason = NULL, "
        "archived = CASE WHEN auto_archived = 1 THEN 0 ELSE archived END, auto_archived = 0 "
        "WHERE id = ? AND end_reason IS NOT 'compression'", (session_id,))
    if cur.rowcount == 0:
        require_session(conn, session_id)
        raise SessionClosedByCompressionError(session_id, lineage.live_continuation(conn, session_id))


def update_session(conn: sqlite3.Connection, session_id: str, columns: dict[str, Any]) -> None:
    """Set the given columns (None clears one); unknown or library-kept columns raise ValueError.

    Columns another verb owns (user_id, started_at, ended_at, end_reason, archived, auto_archived, pinned)
    raise ValueError naming that verb: going around it would break its rule.
    """
    owned = sorted(set(columns) & _VERB_SESSION_COLUMNS.keys())
    if owned:
        raise ValueError("update_session cannot set " + "; ".join(
            f"{name} (use {_VERB_SESSION_COLUMNS[name]})" for name in owned))
    values = _session_values(columns)
    if "title" in values:
        values["title"] = normalize_title(values["title"])
    if "source" in values and values["source"] is None:
        raise ValueError("source cannot be cleared")
    if values.get("parent_session_id") == session_id:
        raise ValueError("a session cannot be its own parent")
    if not values:
        require_session(conn, session_id)
        return
    if values.get("title") is not None:
        check_title_free(conn, values["title"], session_id)
    if values.get("parent_session_id") is not None:
        require_session(conn, values["parent_session_id"])
    assignments = ", ".join(f"{name} = ?" for name in values)
    _updated_or_missing(conn.execute(f"UPDATE sessions SET {assignments} WHERE id = ?",
                                     [*values.values(), session_id]), session_id)


_TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                  "api_call_count")


def check_count(name: str, value: Any) -> int:
    """Return `value` when it is a non-negative 64-bit integer, else raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    if value > _INT_MAX:
        raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
    return value


def _finite(value: Any) -> bool:
    # math.isfinite raises OverflowError for ints too large for a float; those are not finite here.
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def update_token_counts(conn: sqlite3.Connection, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                        cache_read_tokens: int = 0, cache_write_tokens: int = 0, reasoning_tokens: int = 0, *,
                        estimated_cost_usd: float | None = None, api_call_count: int = 0,
                        model: str | None = None, absolute: bool = False, now: float | None = None) -> None:
    """Add to (or, with `absolute`, set) the token counters and upsert the per-model usage row.

    `model` fills sessions.model only while it is NULL; the usage row is keyed by the given
    model, else by the session's model, with task ''. Without any model no usage row is kept.
    """
    counts = dict(zip(_TOKEN_COLUMNS, (input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                                       reasoning_tokens, api_call_count)))
    counts = {name: check_count(name, value) for name, value in counts.items()}
    if estimated_cost_usd is not None and (isinstance(estimated_cost_usd, bool)
                                           or not isinstance(estimated_cost_usd, (int, float))
                                           or not _finite(estimated_cost_usd) or estimated_cost_usd < 0):
        raise ValueError(f"estimated_cost_usd must be a non-negative number or None, not {estimated_cost_usd!r}")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ValueError("model must be a non-empty string or None")
    model = strip_surrogates(model)
    if estimated_cost_usd is not None:
        counts["estimated_cost_usd"] = float(estimated_cost_usd)
    if absolute:
        sets = [f"{name} = ?" for name in counts]
    else:
        sets = [f"{name} = COALESCE({name}, 0) + ?" for name in counts]
    _updated_or_missing(conn.execute(
        f"UPDATE sessions SET {', '.join(sets)}, model = COALESCE(model, ?) WHERE id = ?",
        [*counts.values(), model, session_id]), session_id)
    if model is None:
        model = conn.execute("SELECT model FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]
    if model is None:
        return
    names = list(counts)
    on_conflict = ", ".join(f"{n} = excluded.{n}" if absolute else f"{n} = COALESCE({n}, 0) + excluded.{n}"
                            for n in names)
    conn.execute(
        f"INSERT INTO session_model_usage (session_id, model, task, {', '.join(names)}, updated_at) "
        f"VALUES (?, ?, '', {', '.join('?' * len(names))}, ?) "
        f"ON CONFLICT (session_id, model, task) DO UPDATE SET {on_conflict}, updated_at = excluded.updated_at",
        [session_id, model, *counts.values(), time.time() if now is None else now])


def archive_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Archive the session deliberately (the idle sweep's resume rule never clears this)."""
    _updated_or_missing(conn.execute("UPDATE sessions SET archived = 1, auto_archived = 0 WHERE id = ?",
                                     (session_id,)), session_id)


def unarchive_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear the session's archive, whoever made it."""
    _updated_or_missing(conn.execute("UPDATE sessions SET archived = 0, auto_archived = 0 WHERE id = ?",
                                     (session_id,)), session_id)


def pin_session(conn: sqlite3.Connection, session_id: str, pinned: bool = True) -> None:
    """Pin (or unpin) a session; pinned sessions are never auto-archived."""
    _updated_or_missing(conn.execute("UPDATE sessions SET pinned = ? WHERE id = ?",
                                     (1 if pinned else 0, session_id)), session_id)


def auto_archive(conn: sqlite3.Connection, idle_days: float, *, now: float | None = None) -> int:
    """Archive (archived=1, auto_archived=1) unpinned sessions idle over `idle_days`; return how many."""
    if isinstance(idle_days, bool) or not isinstance(idle_days, (int, float)) or not idle_days >= 0:
        raise ValueError(f"idle_days must be a non-negative number, not {idle_days!r}")
    cutoff = (time.time() if now is None else now) - idle_days * _DAY_S
    return conn.execute(
        "UPDATE sessions SET archived = 1, auto_archived = 1 WHERE COALESCE(archived, 0) = 0 "
        "AND COALESCE(pinned, 0) = 0 AND COALESCE(last_activity_at, started_at) < ?", (cutoff,)).rowcount


# --- message rows: preparing values -------------------------------------------------------------

_INSERT_COLUMNS = tuple(c for c in TABLE_COLUMNS["messages"] if c != "id")
# Set by insert_message's arguments, never by the fields themselves.
_POSITIONAL = frozenset({"session_id", "active", "compacted"})
_WRITABLE = frozenset(_INSERT_COLUMNS) - _POSITIONAL
# Keys a conversation dict or a get_messages row may carry: renamed, or decided by the arguments.
_ALIASES = {"name": "tool_name", "_tool_call_uids": "tool_call_uids", "_tool_call_uid": "tool_call_uid",
            "_absorbed_message_uids": "absorbed_message_uids"}
_IGNORED = frozenset({"id", "_row_id"}) | _POSITIONAL
_DISPLAY = "_display_content"  # a conversation dict's stored content when it differs from what was sent
_ACCEPTED = _WRITABLE | frozenset(_ALIASES) | _IGNORED | {_DISPLAY}
_TEXT, _JSON, _TIME, _COUNT, _FLAG = range(5)
_KIND = {**dict.fromkeys(_WRITABLE, _TEXT), **dict.fromkeys(JSON_MESSAGE_FIELDS, _JSON),
         "timestamp": _TIME, "token_count": _COUNT, "observed": _FLAG}
_UID = re.compile(r"[0-9a-f]{32}")


def _text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return strip_surrogates(value)
    if name == "platform_message_id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # platforms hand out numeric ids; the column is TEXT
    raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")


def _prepare(fields: dict[str, Any]) -> tuple[dict[str, Any], list | None]:
    """Validate and encode one message's fields; return (column values, decoded tool_calls)."""
    unknown = fields.keys() - _ACCEPTED
    if unknown:
        raise ValueError(f"unknown message field(s): {', '.join(sorted(unknown))}")
    if _DISPLAY in fields:
        # A conversation dict: its content is what was sent (api_content), and the display
        # text rides in _display_content. Put each back in its column.
        if fields.get("api_content") is not None:
            raise ValueError(f"give api_content or {_DISPLAY}, not both")
        fields = dict(fields)
        fields["api_content"] = fields.get("content")
        fields["content"] = fields.pop(_DISPLAY)
    row: dict[str, Any] = {}
    calls = None
    for key, value in fields.items():
        if value is None or key in _IGNORED:
            continue
        name = _ALIASES.get(key, key)
        kind = _KIND[name]
        if kind is _TEXT:
            # isascii() is a C-speed scan, and only non-ASCII text can hold a lone surrogate.
            if type(value) is not str or not value.isascii():
                value = _text(name, value)
        elif kind is _JSON:
            if name == "tool_calls":
                calls = decode_json(value) if isinstance(value, str) else value
            value = encode_json(value, name)
        elif kind is _TIME:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
                raise ValueError(f"timestamp must be a finite number of epoch seconds, not {value!r}")
            value = float(value)
        elif kind is _COUNT:
            value = check_count(name, value)
        else:
            value = 1 if value else 0
        row[name] = value
    if not isinstance(row.get("role"), str) or not row["role"]:
        raise ValueError("role must be a non-empty string")
    uid = row.get("message_uid")
    if uid is not None and not _UID.fullmatch(uid):
        raise ValueError(f"message_uid must be 32 lowercase hex digits, not {uid!r}")
    return row, calls if isinstance(calls, list) else None


def _call_count(calls: Any) -> int:
    return len(calls) if isinstance(calls, list) else 0


def _call_ids(calls: Iterable[Any] | None) -> list[str]:
    return [c["id"] for c in calls or () if isinstance(c, dict) and isinstance(c.get("id"), str)]


def issue_tool_call_uids(calls: list | None) -> dict[str, str] | None:
    """Return {tool_call_id: uid} for an assistant turn; repeats of one id share a uid."""
    ids = _call_ids(calls)
    return {cid: uuid.uuid4().hex for cid in dict.fromkeys(ids)} or None


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


# --- message rows: writing ----------------------------------------------------------------------

_COUNT_SQL = ("UPDATE sessions SET message_count = COALESCE(message_count, 0) + ?, "
              "tool_call_count = COALESCE(tool_call_count, 0) + ?, "
              "last_activity_at = MAX(COALESCE(last_activity_at, 0), ?), "
              # Writing to a session resumes it: an archive only the idle sweep made is lifted.
              "archived = CASE WHEN auto_archived = 1 THEN 0 ELSE archived END, auto_archived = 0 "
              "WHERE id = ?")


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
        tool_calls = _call_count(calls) if role == "assistant" else 0
        _updated_or_missing(conn.execute(_COUNT_SQL, (1, tool_calls, row["timestamp"], session_id)), session_id)
    else:
        require_session(conn, session_id)
    if "message_uid" not in row:
        row["message_uid"] = uuid.uuid4().hex
    if calls and role == "assistant" and "tool_call_uids" not in row:
        issued = issue_tool_call_uids(calls)
        if issued:
            row["tool_call_uids"] = json.dumps(issued)
    elif role == "tool" and "tool_call_uid" not in row and "tool_call_id" in row:
        row["tool_call_uid"] = _pair_tool_call_uid(conn, session_id, row["tool_call_id"], active)
    row["session_id"], row["active"], row["compacted"] = session_id, active, compacted
    row.setdefault("observed", 0)
    return conn.execute(_insert_sql(tuple(row)), tuple(row.values())).lastrowid


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


def _row_dict(names: list[str], row: tuple) -> dict[str, Any]:
    out = dict(zip(names, row))
    for name in JSON_MESSAGE_FIELDS:
        if out.get(name) is not None:
            out[name] = decode_json(out[name])
    return out


def get_messages(conn: sqlite3.Connection, session_id: str, include_inactive: bool = False) -> list[dict[str, Any]]:
    """Return the session's rows (active only unless asked), every column, JSON decoded, by id."""
    cur = conn.execute("SELECT * FROM messages WHERE session_id = ?" + ("" if include_inactive else " AND active = 1")
                       + " ORDER BY id", (session_id,))
    names = [d[0] for d in cur.description]
    return [_row_dict(names, r) for r in cur]


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
        uids = row.get("tool_call_uids") if isinstance(row.get("tool_call_uids"), dict) else {}
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


def _merged_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first, rest = rows[0], rows[1:]

    def first_of(name: str) -> Any:
        return next((r[name] for r in rows if r[name] is not None), None)
    api = None
    if any(r["api_content"] is not None for r in rows):
        # The merged turn replays what each part actually sent.
        api = _join_text([r["api_content"] if r["api_content"] is not None else r["content"] for r in rows])
    absorbed = list(first["absorbed_message_uids"] or [])
    for r in rest:
        absorbed += [r["message_uid"], *(r["absorbed_message_uids"] or [])]
    tokens = [r["token_count"] for r in rows if r["token_count"] is not None]
    values = {
        "content": _join_text([r["content"] for r in rows]),
        "api_content": api,
        "tool_calls": _join_lists([r["tool_calls"] for r in rows]),
        "tool_call_uids": merge_tool_call_uids(rows),
        "reasoning": _join_text([r["reasoning"] for r in rows]),
        "reasoning_content": _join_text([r["reasoning_content"] for r in rows]),
        "reasoning_details": _join_lists([r["reasoning_details"] for r in rows]),
        "codex_reasoning_items": _join_lists([r["codex_reasoning_items"] for r in rows]),
        "codex_message_items": _join_lists([r["codex_message_items"] for r in rows]),
        "token_count": sum(tokens) if tokens else None,
        "finish_reason": next((r["finish_reason"] for r in reversed(rows) if r["finish_reason"] is not None), None),
        "display_kind": first_of("display_kind"),
        "display_metadata": first_of("display_metadata"),
        "platform_message_id": first_of("platform_message_id"),
        "absorbed_message_uids": [u for u in absorbed if u is not None] or None,
    }
    for name in JSON_MESSAGE_FIELDS:
        if name in values:
            values[name] = encode_json(values[name], name)
    return values


def merge_messages(conn: sqlite3.Connection, session_id: str, row_ids: Iterable[int]) -> int:
    """Fold active same-role (user or assistant) rows into the first; return its id.

    The merged row keeps its own message_uid and lists the others' uids (and what they had
    absorbed) in absorbed_message_uids; the other rows are deleted and message_count drops.
    """
    ids = [] if isinstance(row_ids, (str, bytes)) or not isinstance(row_ids, Iterable) else list(row_ids)
    if len(ids) < 2 or any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or len(set(ids)) != len(ids):
        raise ValueError("row_ids must be at least two distinct integer row ids")
    require_session(conn, session_id)
    cur = conn.execute(f"SELECT * FROM messages WHERE session_id = ? AND active = 1 AND id IN "
                       f"({', '.join('?' * len(ids))}) ORDER BY id", (session_id, *ids))
    names = [d[0] for d in cur.description]
    rows = [_row_dict(names, r) for r in cur]
    missing = sorted(set(ids) - {r["id"] for r in rows})
    if missing:
        raise ValueError(f"rows {missing} are not active messages of session {session_id!r}")
    roles = {r["role"] for r in rows}
    if len(roles) != 1 or roles & {"user", "assistant"} != roles:
        raise ValueError(f"only user/user or assistant/assistant rows merge, not {sorted(roles)}")
    values = _merged_values(rows)
    calls_delta = 0
    if roles == {"assistant"}:
        # Normally zero (the calls move to the merged row); non-list tool_calls text changes it.
        calls_delta = _call_count(decode_json(values["tool_calls"])) - sum(_call_count(r["tool_calls"]) for r in rows)
    conn.execute(f"UPDATE messages SET {', '.join(f'{n} = ?' for n in values)} WHERE id = ?",
                 [*values.values(), rows[0]["id"]])
    conn.execute(f"DELETE FROM messages WHERE id IN ({', '.join('?' * (len(rows) - 1))})",
                 [r["id"] for r in rows[1:]])
    conn.execute("UPDATE sessions SET message_count = COALESCE(message_count, 0) - ?, "
                 "tool_call_count = COALESCE(tool_call_count, 0) + ? WHERE id = ?",
                 (len(rows) - 1, calls_delta, session_id))
    return rows[0]["id"]


def replace_messages(conn: sqlite3.Connection, session_id: str, messages: Iterable[dict[str, Any]]) -> int:
    """Rewrite the session's active transcript with `messages` (uids kept); return how many were written.

    Rows of earlier compression generations (active=0) are left alone. Every message is
    validated before the old rows are deleted.
    """
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"message {index} is not a dict")
        try:
            prepared.append(_prepare(message))
        except ValueError as exc:
            raise ValueError(f"message {index}: {exc}") from exc
    require_session(conn, session_id)
    conn.execute("DELETE FROM messages WHERE session_id = ? AND active = 1", (session_id,))
    conn.execute("UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = ?", (session_id,))
    for row, calls in prepared:
        _write_row(conn, session_id, row, calls, 1, 0)
    return len(prepared)


def clear_messages(conn: sqlite3.Connection, session_id: str) -> int:
    """Delete every message row of the session (all generations), keep the session; return how many."""
    _updated_or_missing(conn.execute("UPDATE sessions SET message_count = 0, tool_call_count = 0 WHERE id = ?",
                                     (session_id,)), session_id)
    return conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,)).rowcount


# --- the conversation projection ----------------------------------------------------------------

_CONVERSATION_SQL = ("SELECT id, role, content, api_content, tool_calls, tool_call_id, tool_name, reasoning, "
                     "reasoning_content, reasoning_details, codex_reasoning_items, codex_message_items, "
                     "message_uid, absorbed_message_uids, tool_call_uids, tool_call_uid FROM messages "
                     "WHERE session_id = ? AND active = 1 ORDER BY id")


class _Projector:
    """Turns rows into conversation dicts, deriving tool-call uids the rows lack."""

    def __init__(self, with_row_ids: bool):
        self.with_row_ids = with_row_ids
        self.turn_uids: dict[str, Any] = {}
        self.answered: dict[str, int] = {}

    def message(self, r: tuple) -> dict[str, Any]:
        (row_id, role, content, api_content, tool_calls, tool_call_id, tool_name, reasoning, reasoning_content,
         reasoning_details, codex_reasoning, codex_message, uid, absorbed, call_uids, call_uid) = r
        # Replay fidelity: the bytes that were sent win over the display text.
        msg: dict[str, Any] = {"role": role, "content": api_content if api_content is not None else content}
        if api_content is not None and api_content != content:
            # Runtime-only (never sent): lets replace_messages/compression write both columns back.
            msg[_DISPLAY] = content
        if tool_calls is not None:
            msg["tool_calls"] = decode_json(tool_calls)
        if tool_call_id is not None:
            msg["tool_call_id"] = tool_call_id
        if tool_name is not None:
            msg["name"] = tool_name
        if role == "assistant":
            for key, value in (("reasoning", reasoning), ("reasoning_content", reasoning_content)):
                if value is not None:  # "" is carried too: some routes need the empty field
                    msg[key] = value
            for key, value in (("reasoning_details", reasoning_details),
                               ("codex_reasoning_items", codex_reasoning), ("codex_message_items", codex_message)):
                if value is not None:
                    msg[key] = decode_json(value)
            self.turn_uids = decode_json(call_uids) if call_uids is not None else {}
            if not isinstance(self.turn_uids, dict):
                self.turn_uids = {}
            self.answered = {}
        msg["message_uid"] = uid
        if self.with_row_ids:
            msg["_row_id"] = row_id
        if role == "assistant" and call_uids is not None:
            msg["_tool_call_uids"] = self.turn_uids
        if role == "tool" and tool_call_id is not None:
            nth = self.answered.get(tool_call_id, 0)
            self.answered[tool_call_id] = nth + 1
            derived = call_uid if call_uid is not None else pick_tool_call_uid(self.turn_uids.get(tool_call_id), nth)
            if derived is not None:
                msg["_tool_call_uid"] = derived
        if absorbed is not None:
            msg["_absorbed_message_uids"] = decode_json(absorbed)
        return msg


def get_messages_as_conversation(conn: sqlite3.Connection, session_id: str, include_ancestors: bool = False,
                                 with_row_ids: bool = False) -> list[dict[str, Any]]:
    """Return the active rows as OpenAI-format dicts (R-MSG-8/9), ancestors first when asked.

    Each dict has role, content (api_content when set), tool_calls/tool_call_id/name when
    present, the assistant's reasoning fields, message_uid, `_row_id` when asked, and the
    runtime-only `_tool_call_uids`/`_tool_call_uid`/`_absorbed_message_uids` when known, and
    `_display_content` (the stored content) when api_content differs from it.
    Across a compression seam, copies of messages already replayed (same uid) and a user
    prompt identical to the one just replayed are skipped. Call it inside one read snapshot.
    """
    chain = [*lineage.compression_ancestor_ids(conn, session_id), session_id] if include_ancestors else [session_id]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    projector = _Projector(with_row_ids)
    for position, sid in enumerate(chain):
        at_seam = position > 0
        emitted = []
        for r in conn.execute(_CONVERSATION_SQL, (sid,)).fetchall():
            msg = projector.message(r)
            if msg["message_uid"] in seen:
                continue  # a rotation copy of a message an ancestor already replayed
            repeated = (at_seam and bool(out) and msg["role"] == "user" and out[-1]["role"] == "user"
                        and msg["content"] == out[-1]["content"])
            at_seam = False
            if repeated:
                continue  # the prompt the child re-sent after the seam; shown once
            out.append(msg)
            emitted.append(msg["message_uid"])
        seen.update(emitted)
    return out
