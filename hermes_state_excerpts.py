"""Excerpts of a transcript: the rows around one message, an anchored view with bookends, recent user turns.

Owns: the reads a search hit or a session picker opens a transcript with: `get_messages_around`
(a window of rows either side of one message), `get_anchored_view` (that window narrowed to
some roles, plus the first and last rows with text as bookends), `list_recent_user_messages`
(the latest user turns as one-line previews) and `has_platform_message_id`. A window walks
every row of the session in insertion order, rewound and archived ones too, since a search hit
can point at any of them; rows come as get_messages returns them.
Does not own: writing rows (hermes_state_messages), full-text search (hermes_state_search).

Transaction contract: read-only functions on the caller's connection, under its lock; each
runs a few indexed queries (session_id, id) and reads only the rows it returns.
"""
from __future__ import annotations

import copy
import sqlite3
from typing import Any, Iterable

from hermes_state_common import check_count, row_dicts
from hermes_state_common import decoded

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
