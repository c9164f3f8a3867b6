"""Rewinding a transcript to an earlier user turn, restoring what was rewound, and archiving by compaction.

Owns: the rewound rows (active=0, compacted=0: taken out of the live transcript by a rewind,
kept so `restore_rewound` can put them back), the session's `rewind_count`, and
hermes-agent's names for archiving the live generation (`archive_and_compact`, which is
`compress_in_place` under the name that program calls) and for asking whether a session keeps
any rows outside its live transcript (`has_archived_messages`).
Does not own: writing message rows (hermes_state_messages), compression's rules
(hermes_state_compression).

Transaction contract: writes run inside the caller's BEGIN IMMEDIATE transaction (a transcript
write: it waits out another holder's compression), every check before the first change; the
session's counters are recounted in the same transaction, so `message_count` and
`tool_call_count` always describe the live rows. Reads run under the caller's lock.
"""
from __future__ import annotations

import sqlite3
from typing import Any, Iterable

import hermes_state_compression as compression
from hermes_state_common import decode_json, encode_json, recount_sql
from hermes_state_messages import decoded_rows

_RECOUNT_SQL = recount_sql() + " WHERE id = ?"


def _check_row_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a message row id (an int), not {value!r}")
    return value


def rewind_to_message(conn: sqlite3.Connection, session_id: str, target_message_id: int) -> dict[str, Any]:
    """Take the live user turn `target_message_id` and every later live row out of the transcript; return what moved.

    Returns {"rewound_count", "target_message" (the row as get_messages gave it before the
    rewind), "new_head_id" (the last live row left, or None)}. The rows are kept, and
    `restore_rewound` puts them back. A target that is not a live row of the session (an unknown
    session has none), or not a user turn, raises ValueError and changes nothing.
    """
    _check_row_id("target_message_id", target_message_id)
    found = decoded_rows(conn, "SELECT * FROM messages WHERE id = ? AND session_id = ? AND active = 1",
                         (target_message_id, session_id))
    if not found:
        raise ValueError(f"message {target_message_id} not found in session {session_id}")
    target = found[0]
    if target["role"] != "user":
        raise ValueError(f"rewind target must be a 'user' message (got role={target['role']!r}, id={target_message_id})")
    rewound = conn.execute("UPDATE messages SET active = 0 WHERE session_id = ? AND active = 1 AND id >= ?",
                           (session_id, target_message_id)).rowcount
    head = conn.execute("SELECT MAX(id) FROM messages WHERE session_id = ? AND active = 1", (session_id,)).fetchone()[0]
    conn.execute("UPDATE sessions SET rewind_count = COALESCE(rewind_count, 0) + 1 WHERE id = ?", (session_id,))
    conn.execute(_RECOUNT_SQL, (session_id,))
    return {"rewound_count": rewound, "target_message": target, "new_head_id": head}


def restore_rewound(conn: sqlite3.Connection, session_id: str, since_message_id: int) -> int:
    """Put the session's rewound rows from `since_message_id` on back into the live transcript; return how many."""
    _check_row_id("since_message_id", since_message_id)
    restored = conn.execute("UPDATE messages SET active = 1 WHERE session_id = ? AND active = 0 AND compacted = 0 "
                            "AND id >= ?", (session_id, since_message_id)).rowcount
    if restored:
        conn.execute(_RECOUNT_SQL, (session_id,))
    return restored


def has_archived_messages(conn: sqlite3.Connection, session_id: str) -> bool:
    """True when the session keeps rows outside its live transcript (rewound, or archived by compaction)."""
    return conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND active = 0 LIMIT 1",
                        (session_id,)).fetchone() is not None


def archive_and_compact(conn: sqlite3.Connection, session_id: str, compacted_messages: Iterable[dict[str, Any]],
                        model_config_patch: dict[str, Any] | None = None, watermark: int | None = None,
                        lock_holder: str | None = None, *, now: float | None = None) -> int:
    """Archive the live transcript and make `compacted_messages` the new one (compress_in_place); return how many.

    With `watermark` (get_active_message_watermark at the compression's start), live rows
    appended after it follow the compacted messages instead of being archived away.
    `lock_holder` must still hold the session's compression lock at commit. `model_config_patch`
    is merged into the session's model_config in the same transaction (a None value removes a key).
    """
    if model_config_patch is not None and not isinstance(model_config_patch, dict):
        raise ValueError(f"model_config_patch must be a dict or None, not {type(model_config_patch).__name__}")
    kept = [*compacted_messages, *compression.tail_rows(conn, session_id, watermark)]
    written = len(compression.compress_in_place(conn, session_id, kept, holder=lock_holder, now=now))
    if model_config_patch:
        row = conn.execute("SELECT model_config FROM sessions WHERE id = ?", (session_id,)).fetchone()
        config = decode_json(row[0]) if row and row[0] is not None else {}
        config = dict(config) if isinstance(config, dict) else {}
        for key, value in model_config_patch.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        conn.execute("UPDATE sessions SET model_config = ? WHERE id = ?",
                     (encode_json(config, "model_config") if config else None, session_id))
    return written
