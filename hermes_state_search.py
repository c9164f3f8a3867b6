"""Read-side queries over sessions and messages: lineage, titles, listings, statistics, search.

Owns: recursive-CTE lineage walks (cycle-safe), title uniqueness/lineage numbering and
resolution, `list_sessions` with previews in one query, usage statistics, the idle
auto-archive sweep, and `search_messages` over the FTS indexes (hermes_state_fts).
Does not own: writing message rows (hermes_state_sessions) or FTS maintenance.

Transaction contract: functions run on the caller's connection; writers among them run inside
the caller's write transaction and never commit; readers run under the caller's lock.
"""
from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from typing import Any

from hermes_state_errors import TitleConflictError
from hermes_state_sessions import check_title_free, normalize_title, require_session

# --- titles ----------------------------------------------------------------------------------
# A title lineage is "T", "T #2", "T #3", ...: when a conversation continues in a new session
# (compression, a resumed topic) the new session takes the next number, so every title stays
# unique while the family stays recognisable.

_LINEAGE_SUFFIX = re.compile(r" #([0-9]+)")  # matched with fullmatch against what follows "T"
_WALK_CAP = 10_000  # rows a lineage walk may visit: bad data is bounded, never an endless loop


def _dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    return value


def _split_lineage(title: str) -> str:
    """Return the base of a lineage title: "T #3" -> "T"; any other title is its own base."""
    head, sep, tail = title.rpartition(" #")
    if sep and head and tail.isascii() and tail.isdigit():
        return head
    return title


def _lineage_members(conn: sqlite3.Connection, base: str) -> list[tuple[int, float, str]]:
    """Return (number, started_at, id) for "base" (number 1) and every "base #<n>"."""
    # "base #..." titles sort between "base #" and "base $" ('$' follows '#'), so a range on the
    # unique title index finds them without LIKE/GLOB metacharacter worries.
    prefix = base + " #"
    rows = conn.execute(
        "SELECT id, title, started_at FROM sessions WHERE title = ? OR (title >= ? AND title < ?)",
        (base, prefix, base + " $")).fetchall()
    out = []
    for session_id, title, started_at in rows:
        if title == base:
            out.append((1, started_at or 0.0, session_id))
            continue
        match = _LINEAGE_SUFFIX.fullmatch(title, len(base))
        if match:
            out.append((int(match.group(1)), started_at or 0.0, session_id))
    return out


def set_session_title(conn: sqlite3.Connection, session_id: str, title: str | None) -> str | None:
    """Set (or, with None/blank, clear) a session's title and return what was stored.

    Must run inside the caller's write transaction. The title is stripped and at most 100
    characters (ValueError); another session holding it raises TitleConflictError; an unknown
    session raises SessionNotFoundError. Nothing is written when any check fails.
    """
    title = normalize_title(title)
    require_session(conn, session_id)
    check_title_free(conn, title, session_id)
    try:
        conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
    except sqlite3.IntegrityError as exc:
        # Only reachable when a writer outside BEGIN IMMEDIATE took the title between the
        # check and the update; the unique index is the final word.
        if "title" not in str(exc):
            raise
        raise TitleConflictError(f"title {title!r} was just taken by another session") from exc
    return title


def get_session_title(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Return the session's title, or None when it has none or does not exist."""
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def resolve_session_by_title(conn: sqlite3.Connection, title: str | None) -> str | None:
    """Return the id of the newest session titled `title` or "`title` #<n>", or None.

    The title is taken literally as the lineage base: "T" resolves among "T", "T #2", ...;
    "T #2" resolves among "T #2" and "T #2 #<n>" (an explicit number names that session).
    Newest means the latest `started_at`, ties going to the higher number.
    """
    if title is None or not isinstance(title, str) or not title.strip():
        return None
    members = _lineage_members(conn, title.strip())
    if not members:
        return None
    return max(members, key=lambda m: (m[1], m[0]))[2]


def get_next_title_in_lineage(conn: sqlite3.Connection, title: str) -> str:
    """Return the title a continuation of `title` should take: "T" -> "T #2" -> "T #3" ...

    A numbered input counts as its base ("T #2" -> base "T"). The result is the highest
    existing number plus one (gaps are not refilled); when no session carries the base or
    any numbered variant, the base itself is returned unchanged. The result is not checked
    against the 100-character limit: set_session_title does that when it is stored.
    """
    normalized = normalize_title(title)
    if normalized is None:
        raise ValueError("title must be a non-blank string")
    base = _split_lineage(normalized)
    members = _lineage_members(conn, base)
    if not members:
        return base
    return f"{base} #{max(m[0] for m in members) + 1}"


# --- lineage walks ---------------------------------------------------------------------------
# Both walks collect ids with a recursive CTE using UNION (not UNION ALL): a row already in the
# result is not queued again, so a parent_session_id cycle planted by bad data ends the walk
# instead of looping; LIMIT bounds it besides. Order is then rebuilt in Python from the links.

def get_lineage(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Return the session's ancestors oldest first, ending with the session itself.

    Every row is a full `sessions` row. An unknown session gives []. On a cycle the walk stops
    at the first repeated session; at most 10,000 sessions are returned.
    """
    rows = _dicts(conn.execute(
        f"""WITH RECURSIVE lineage(id) AS (
                SELECT id FROM sessions WHERE id = ?
                UNION
                SELECT s.parent_session_id FROM sessions s JOIN lineage l ON s.id = l.id
                 WHERE s.parent_session_id IS NOT NULL
                LIMIT {_WALK_CAP}
            )
            SELECT s.* FROM sessions s JOIN lineage l ON s.id = l.id""", (session_id,)))
    by_id = {row["id"]: row for row in rows}
    chain: list[dict[str, Any]] = []
    current: str | None = session_id
    while current in by_id:
        chain.append(by_id.pop(current))  # pop: a cycle cannot revisit a row
        current = chain[-1]["parent_session_id"]
    chain.reverse()
    return chain


def get_descendants(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Return every descendant of the session (not the session itself), breadth-first.

    Siblings come in (started_at, id) order. An unknown session or a leaf gives []. On a cycle
    each session appears once; at most 10,000 sessions are visited.
    """
    rows = _dicts(conn.execute(
        f"""WITH RECURSIVE descendants(id) AS (
                SELECT id FROM sessions WHERE id = ?
                UNION
                SELECT s.id FROM sessions s JOIN descendants d ON s.parent_session_id = d.id
                LIMIT {_WALK_CAP}
            )
            SELECT s.* FROM sessions s JOIN descendants d ON s.id = d.id
             WHERE s.id != ? ORDER BY s.started_at, s.id""", (session_id, session_id)))
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:  # already in (started_at, id) order, so each child list is too
        children[row["parent_session_id"]].append(row)
    out: list[dict[str, Any]] = []
    seen = {session_id}
    level = [session_id]
    while level:
        following = []
        for parent in level:
            for row in children.get(parent, ()):
                if row["id"] not in seen:
                    seen.add(row["id"])
                    out.append(row)
                    following.append(row["id"])
        level = following
    return out


# --- listings and statistics -----------------------------------------------------------------

PREVIEW_CHARS = 63

# One statement for the whole page: the correlated subqueries run once per listed session and
# are served by idx_messages_session_active (preview) and idx_messages_session (last_active).
# The preview reads at most 2 * 63 characters, enough for 63 after every CRLF became a space.
_LIST_SQL = f"""
SELECT s.*,
       COALESCE((SELECT SUBSTR(REPLACE(REPLACE(REPLACE(SUBSTR(m.content, 1, {2 * PREVIEW_CHARS}),
                                                       char(13) || char(10), ' '),
                                               char(13), ' '),
                                       char(10), ' '), 1, {PREVIEW_CHARS})
                   FROM messages m
                  WHERE m.session_id = s.id AND m.active = 1 AND m.role = 'user' AND m.content IS NOT NULL
                  ORDER BY m.timestamp, m.id LIMIT 1), '') AS preview,
       COALESCE((SELECT MAX(m2.timestamp) FROM messages m2 WHERE m2.session_id = s.id),
                s.started_at) AS last_active
  FROM sessions s
 WHERE {{where}}
 ORDER BY s.started_at DESC, s.id
 LIMIT ? OFFSET ?"""


def list_sessions(conn: sqlite3.Connection, source: str | None = None, limit: int = 20, offset: int = 0,
                  include_archived: bool = False) -> list[dict[str, Any]]:
    """Return a page of sessions, newest first, each with `preview` and `last_active`, in one query.

    Every `sessions` column is present, plus `preview` (the first active user message, its
    first 63 characters with line breaks as spaces, '' when none) and `last_active` (the latest
    message time, else `started_at`). Pinned sessions are not moved to the top: ordering is by
    `started_at` only, so paging stays stable; callers that show pins first do it themselves.
    """
    if source is not None and not isinstance(source, str):
        raise ValueError("source must be a string or None")
    limit, offset = _check_count("limit", limit), _check_count("offset", offset)
    # Filters are spliced in only when given, so the planner can pick idx_sessions_source.
    where, params = ["1"], []
    if source is not None:
        where.append("s.source = ?")
        params.append(source)
    if not include_archived:
        where.append("COALESCE(s.archived, 0) = 0")
    sql = _LIST_SQL.format(where=" AND ".join(where))
    return _dicts(conn.execute(sql, (*params, limit, offset)))


def usage_by_model(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Return per-model totals (sessions, input/output tokens, estimated cost), costliest first.

    Sessions without a model are left out; a model whose sessions carry no cost estimate has
    `estimated_cost_usd` None and sorts after every priced model. The seed's column names
    (`total_input`, `total_output`, `total_cost`) are present too, so its callers keep working.
    """
    return _dicts(conn.execute(
        """SELECT model, COUNT(*) AS session_count,
                  COALESCE(SUM(input_tokens), 0) AS input_tokens,
                  COALESCE(SUM(output_tokens), 0) AS output_tokens,
                  SUM(estimated_cost_usd) AS estimated_cost_usd,
                  COALESCE(SUM(input_tokens), 0) AS total_input,
                  COALESCE(SUM(output_tokens), 0) AS total_output,
                  SUM(estimated_cost_usd) AS total_cost
             FROM sessions WHERE model IS NOT NULL
            GROUP BY model
            ORDER BY estimated_cost_usd IS NULL, estimated_cost_usd DESC, model"""))


def top_sessions_by_tokens(conn: sqlite3.Connection, limit: int = 10) -> list[dict[str, Any]]:
    """Return the sessions with the most input + output tokens (id, title, model, total_tokens, cost)."""
    limit = _check_count("limit", limit)
    return _dicts(conn.execute(
        """SELECT id, title, model,
                  COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) AS total_tokens,
                  estimated_cost_usd
             FROM sessions
            ORDER BY total_tokens DESC, started_at DESC, id
            LIMIT ?""", (limit,)))
