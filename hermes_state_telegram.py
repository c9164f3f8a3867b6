"""Telegram DM topic mode: which topic thread of a private chat holds which session.

Owns: the two topic tables (`telegram_dm_topic_mode`, one row per chat that opted in, and
`telegram_dm_topic_bindings`, one row per topic thread naming its session) and their opt-in
migration, the bindings (a session is linked to one topic at most), the per-chat mode row, and
the list of a user's Telegram sessions that no topic holds yet.
Does not own: the tables' columns (the data dictionary in hermes_state_common), session rows
(hermes_state_sessions), the listing rows with previews (hermes_state_listings).

The tables are made only by an explicit opt-in: `apply_telegram_topic_migration`, or the first
write that needs them (binding a topic, enabling the mode). Opening a file never creates them,
so a file nobody opted in keeps its layout and an older program can still run on it. Reads
never create them either: without the tables there is simply no binding.

Transaction contract: writes run inside the caller's BEGIN IMMEDIATE transaction and check every
argument before their first change, so a refused call changes nothing. Reads run under the
caller's lock.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any

from hermes_state_common import DICTIONARY, check_count, check_id, row_dicts, sql_literal, table_exists
from hermes_state_errors import TopicBindingConflictError
from hermes_state_listings import rich_rows
from hermes_state_sessions import require_session

MODE, BINDINGS = DICTIONARY["telegram_dm_topic_mode"], DICTIONARY["telegram_dm_topic_bindings"]
# state_meta records which revision of the topic tables the file has, under hermes-agent's key
# and numbering (2: the mode row carries the chat's topic capabilities).
SCHEMA_KEY = "telegram_dm_topic_schema_version"
SCHEMA_REVISION = "2"
# The source of sessions a Telegram adapter creates; only these can be linked to a topic.
TELEGRAM_SOURCE = "telegram"
_INDEX_SQL = (
    # One topic per session: the database refuses a second link even from another program.
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_session "
    "ON telegram_dm_topic_bindings(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_telegram_dm_topic_bindings_user ON telegram_dm_topic_bindings(user_id, chat_id)",
)
_BINDING_COLUMNS = ", ".join(BINDINGS.column_names)


def apply_telegram_topic_migration(conn: sqlite3.Connection) -> None:
    """Create the Telegram topic tables and indexes, and record their revision; idempotent.

    A table an earlier revision made gets the columns it lacks (empty on its rows).
    """
    for table in (MODE, BINDINGS):
        conn.execute(table.sql)
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table.name})")}
        for column in table.columns:
            if column.name not in have:  # an added column cannot promise NOT NULL to old rows
                default = "" if column.default is None else f" DEFAULT {sql_literal(column.default)}"
                conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column.type}{default}")
    for sql in _INDEX_SQL:
        conn.execute(sql)
    conn.execute("INSERT INTO state_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                 "value = excluded.value WHERE value != excluded.value", (SCHEMA_KEY, SCHEMA_REVISION))


def topic_tables_exist(conn: sqlite3.Connection) -> bool:
    """Tell whether this file has opted in to topic mode (its binding table exists)."""
    return table_exists(conn, BINDINGS.name)


def _binding_rows(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    if not topic_tables_exist(conn):
        return []
    return row_dicts(conn.execute(f"SELECT {_BINDING_COLUMNS} FROM telegram_dm_topic_bindings WHERE {where} "
                                  "ORDER BY linked_at, chat_id, thread_id", params))


def bind_telegram_topic(conn: sqlite3.Connection, *, chat_id: str, thread_id: str, user_id: str, session_key: str,
                        session_id: str, managed_mode: str = "auto", now: float | None = None) -> None:
    """Link the topic thread (chat_id, thread_id) to the session, creating the topic tables if needed.

    Binding a topic again updates its user, key and mode (it keeps its first link time); a topic
    may move to another session. A session already linked to a different topic raises
    TopicBindingConflictError (a ValueError); an unknown session raises SessionNotFoundError.
    """
    for name, value in (("chat_id", chat_id), ("thread_id", thread_id), ("user_id", user_id),
                        ("session_key", session_key), ("session_id", session_id), ("managed_mode", managed_mode)):
        check_id(name, value)
    require_session(conn, session_id)
    held = _binding_rows(conn, "session_id = ? AND NOT (chat_id = ? AND thread_id = ?)",
                         (session_id, chat_id, thread_id))
    if held:
        raise TopicBindingConflictError(
            f"session {session_id!r} is already linked to another Telegram topic (chat {held[0]['chat_id']!r}, "
            f"thread {held[0]['thread_id']!r}); unbind that topic first")
    apply_telegram_topic_migration(conn)
    stamp = time.time() if now is None else now
    conn.execute(
        f"INSERT INTO telegram_dm_topic_bindings ({_BINDING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(chat_id, thread_id) DO UPDATE SET user_id = excluded.user_id, "
        "session_key = excluded.session_key, session_id = excluded.session_id, "
        "managed_mode = excluded.managed_mode, updated_at = excluded.updated_at",
        (chat_id, thread_id, user_id, session_key, session_id, managed_mode, stamp, stamp))


def get_telegram_topic_binding(conn: sqlite3.Connection, *, chat_id: str, thread_id: str) -> dict[str, Any] | None:
    """Return the binding of the topic thread (chat_id, thread_id), or None (also before any opt-in)."""
    check_id("chat_id", chat_id)
    check_id("thread_id", thread_id)
    rows = _binding_rows(conn, "chat_id = ? AND thread_id = ?", (chat_id, thread_id))
    return rows[0] if rows else None


def get_telegram_topic_binding_by_session(conn: sqlite3.Connection, *, session_id: str) -> dict[str, Any] | None:
    """Return the binding that holds the session, or None."""
    check_id("session_id", session_id)
    rows = _binding_rows(conn, "session_id = ?", (session_id,))
    return rows[0] if rows else None


def is_telegram_session_linked_to_topic(conn: sqlite3.Connection, *, session_id: str) -> bool:
    """Tell whether some topic holds the session."""
    return get_telegram_topic_binding_by_session(conn, session_id=session_id) is not None


def list_telegram_topic_bindings_for_chat(conn: sqlite3.Connection, *, chat_id: str) -> list[dict[str, Any]]:
    """Return the chat's bindings, oldest link first ([] before any opt-in)."""
    check_id("chat_id", chat_id)
    return _binding_rows(conn, "chat_id = ?", (chat_id,))


def delete_telegram_topic_binding(conn: sqlite3.Connection, *, chat_id: str, thread_id: str) -> int:
    """Unlink the topic thread from its session; return how many bindings went (0 or 1). The session stays."""
    check_id("chat_id", chat_id)
    check_id("thread_id", thread_id)
    if not topic_tables_exist(conn):
        return 0
    return conn.execute("DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ? AND thread_id = ?",
                        (chat_id, thread_id)).rowcount


def _flag(name: str, value: Any) -> int | None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None, not {type(value).__name__}")
    return None if value is None else int(value)


def enable_telegram_topic_mode(conn: sqlite3.Connection, *, chat_id: str, user_id: str,
                               has_topics_enabled: bool | None = None,
                               allows_users_to_create_topics: bool | None = None, now: float | None = None) -> None:
    """Turn topic mode on for the chat (creating the topic tables if needed), recording its capabilities now.

    Enabling again keeps the first activation time and replaces the user and capabilities.
    """
    check_id("chat_id", chat_id)
    check_id("user_id", user_id)
    flags = (_flag("has_topics_enabled", has_topics_enabled),
             _flag("allows_users_to_create_topics", allows_users_to_create_topics))
    apply_telegram_topic_migration(conn)
    stamp = time.time() if now is None else now
    conn.execute(
        "INSERT INTO telegram_dm_topic_mode (chat_id, user_id, enabled, activated_at, updated_at, has_topics_enabled, "
        "allows_users_to_create_topics, capability_checked_at) VALUES (?, ?, 1, ?, ?, ?, ?, ?) "
        "ON CONFLICT(chat_id) DO UPDATE SET user_id = excluded.user_id, enabled = 1, "
        "updated_at = excluded.updated_at, has_topics_enabled = excluded.has_topics_enabled, "
        "allows_users_to_create_topics = excluded.allows_users_to_create_topics, "
        "capability_checked_at = excluded.capability_checked_at", (chat_id, user_id, stamp, stamp, *flags, stamp))


def disable_telegram_topic_mode(conn: sqlite3.Connection, *, chat_id: str, clear_bindings: bool = True,
                                now: float | None = None) -> None:
    """Turn topic mode off for the chat and, unless told not to, unlink its topics (the sessions stay).

    A chat that never enabled it is left as it is; nothing is created.
    """
    check_id("chat_id", chat_id)
    if not isinstance(clear_bindings, bool):
        raise ValueError(f"clear_bindings must be True or False, not {type(clear_bindings).__name__}")
    if not topic_tables_exist(conn):
        return
    conn.execute("UPDATE telegram_dm_topic_mode SET enabled = 0, updated_at = ? WHERE chat_id = ?",
                 (time.time() if now is None else now, chat_id))
    if clear_bindings:
        conn.execute("DELETE FROM telegram_dm_topic_bindings WHERE chat_id = ?", (chat_id,))


def is_telegram_topic_mode_enabled(conn: sqlite3.Connection, *, chat_id: str, user_id: str) -> bool:
    """Tell whether the chat has topic mode on for this user."""
    check_id("chat_id", chat_id)
    check_id("user_id", user_id)
    if not table_exists(conn, MODE.name):
        return False
    return conn.execute("SELECT 1 FROM telegram_dm_topic_mode WHERE chat_id = ? AND user_id = ? AND enabled = 1",
                        (chat_id, user_id)).fetchone() is not None


def list_unlinked_telegram_sessions_for_user(conn: sqlite3.Connection, *, chat_id: str, user_id: str,
                                             limit: int = 10) -> list[dict[str, Any]]:
    """Return the user's Telegram sessions that no topic holds, latest activity first, with `preview`.

    Rows are the listing's (every session column, `preview`, `last_active`). Only reads: before
    any opt-in every such session is unlinked. `chat_id` names the chat asking; a session linked
    in any chat counts as linked.
    """
    check_id("chat_id", chat_id)
    check_id("user_id", user_id)
    check_count("limit", limit)
    where = "s.source = ? AND s.user_id = ?"
    if topic_tables_exist(conn):
        where += " AND NOT EXISTS (SELECT 1 FROM telegram_dm_topic_bindings b WHERE b.session_id = s.id)"
    return rich_rows(conn, where, [TELEGRAM_SOURCE, user_id],
                     "ORDER BY last_active DESC, s.started_at DESC, s.id DESC LIMIT ?", (limit,))
