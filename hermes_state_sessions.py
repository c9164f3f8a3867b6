"""Session and message records, and the conversation projection.

Owns: creating/reading/updating `sessions` rows, appending and reading `messages` rows
(uids, JSON fields, counters), and turning rows into OpenAI-format conversations.
Does not own: lineage/title/listing queries (hermes_state_search), compression
(hermes_state_compression), FTS (hermes_state_fts).

Transaction contract: write functions run inside the caller's write transaction (the facade
opens it) and never open or commit one themselves; read functions run under the caller's lock.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any

from hermes_state_common import SESSION_COLUMN_NAMES, encode_json, strip_surrogates
from hermes_state_errors import SessionNotFoundError, TitleConflictError

TITLE_MAX_CHARS = 100

# Columns the library maintains itself; callers may not set them through **columns.
_MANAGED_SESSION_COLUMNS = frozenset({"id", "message_count", "tool_call_count"})
_JSON_SESSION_COLUMNS = frozenset({"model_config", "origin_json"})


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


def get_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the session row as a dict, or None when it does not exist."""
    cur = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d[0] for d in cur.description], row))
