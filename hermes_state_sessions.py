"""Session rows: create, read, update, end/reopen, token counters, archive flags and titles.

Owns: the `sessions` table's rows and the rules on them: which columns a caller may set and
with which verb, the first end wins, token counters and the per-model usage rows, the archive
flags and the idle sweep, and titles (unique, stripped, numbered lineages "T", "T #2", ...).
Also the SQL fragments other writers reuse so each rule is written once: `ARCHIVE_LIFT_SQL`
(writing to a session lifts an archive only the idle sweep made); `COUNTER_RESET_SQL` is the dictionary's.
Does not own: message rows (hermes_state_messages), lineage walks (hermes_state_lineage).

Transaction contract: write functions run inside the caller's write transaction (the facade
opens it) and never open or commit one themselves; every check that can fail runs before the
first statement that changes anything. Read functions run under the caller's lock.
"""
from __future__ import annotations

import re
import sqlite3
import time
from typing import Any

import hermes_state_lineage as lineage
from hermes_state_common import (COUNTER_RESET_SQL, DAY_S,  # noqa: F401 - COUNTER_RESET_SQL re-exported
                                 INT_MAX, SESSION_COLUMN_NAMES, SESSIONS, check_count, check_id, check_number,
                                 row_dicts, strip_surrogates)
from hermes_state_errors import SessionClosedByCompressionError, SessionNotFoundError, TitleConflictError

# Writing to a session resumes it: an archive only the idle sweep made is lifted, never a
# deliberate one. An assignment list for UPDATE sessions SET ...
ARCHIVE_LIFT_SQL = "archived = CASE WHEN auto_archived = 1 THEN 0 ELSE archived END, auto_archived = 0"
# COUNTER_RESET_SQL (the live generation is empty again) comes from the data dictionary, which
# defines the counters; it stays importable from here.

TITLE_MAX_CHARS = 100

# Columns the library maintains itself (the dictionary gives them no caller rule); callers may
# not set them through **columns.
_MANAGED_SESSION_COLUMNS = frozenset(c.name for c in SESSIONS.columns if c.rule is None)
# Columns update_session refuses, each with the verb that owns it. create_session still takes
# them, so an import can write a row exactly as it was exported.
_VERB_SESSION_COLUMNS = {
    "user_id": "nothing: it is set when the session is created and never changed afterwards",
    "ended_at": "end_session (the first end wins) or reopen_session",
    "end_reason": "end_session (the first end wins) or reopen_session",
    "archived": "archive_session or unarchive_session",
    "auto_archived": "auto_archive, or unarchive_session to clear it",
    "pinned": "pin_session",
    # The creation time also stamps the compression edge (child started_at = parent ended_at).
    "started_at": "nothing: it is the creation time, and a rotation child's start marks its compression edge",
}


# Each settable column's value is checked by its declared rule (times and costs are finite
# non-negative numbers, since text there would break sorting and the idle sweep; counters
# non-negative 64-bit integers; flags 0/1).
_CHECK = {c.name: c.check for c in SESSIONS.columns if c.rule is not None}


def _session_values(columns: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(columns) - SESSION_COLUMN_NAMES)
    if unknown:
        raise ValueError(f"unknown session column(s): {', '.join(unknown)}")
    managed = sorted(set(columns) & _MANAGED_SESSION_COLUMNS)
    if managed:
        raise ValueError(f"session column(s) maintained by the library cannot be set: {', '.join(managed)}")
    out = {name: None if value is None else _CHECK[name](value) for name, value in columns.items()}
    if out.get("parent_session_id") is not None:
        check_id("parent_session_id", out["parent_session_id"])
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
        raise TitleConflictError(f"title {title!r} is already in use by session {row[0]!r}")


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
    check_id("session_id", session_id)
    check_id("source", source)
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
    check_id("session_id", session_id)
    check_id("source", source)
    _session_values({k: v for k, v in columns.items() if v is not None})
    if session_exists(conn, session_id):
        return session_id
    return create_session(conn, session_id, source, columns)


def get_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the session row as a dict, or None when it does not exist."""
    rows = row_dicts(conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)))
    return rows[0] if rows else None


def end_session(conn: sqlite3.Connection, session_id: str, end_reason: str, *, now: float | None = None) -> None:
    """Mark the session ended; the first end wins and a later call changes nothing.

    The end reason 'compression' is reserved for rotate_session, which creates the
    continuation in the same transaction: ending a session so by hand would leave it closed
    with nothing to continue it.
    """
    check_id("end_reason", end_reason)
    if end_reason == lineage.COMPRESSION_END_REASON:
        raise ValueError(f"end_reason {end_reason!r} is reserved for rotate_session, which also creates the "
                         "session that continues this one; end it with another reason")
    _close(conn, session_id, end_reason, now)


def close_for_compression(conn: sqlite3.Connection, session_id: str, *, now: float) -> None:
    """End the session with end_reason 'compression' at `now` (rotate_session's step; nothing else calls it)."""
    _close(conn, session_id, lineage.COMPRESSION_END_REASON, now)


def _close(conn: sqlite3.Connection, session_id: str, end_reason: str, now: float | None) -> None:
    cur = conn.execute("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                       (time.time() if now is None else now, strip_surrogates(end_reason), session_id))
    if cur.rowcount == 0:
        require_session(conn, session_id)


def reopen_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear ended_at/end_reason, and an archive that only the idle sweep made.

    A session compression closed and continued elsewhere is refused with
    SessionClosedByCompressionError naming its live continuation: reopening it would fork the
    conversation. One closed so with no continuation (written by another program) reopens.
    """
    cur = conn.execute(
        f"UPDATE sessions SET ended_at = NULL, end_reason = NULL, {ARCHIVE_LIFT_SQL} "
        f"WHERE id = ? AND end_reason IS NOT '{lineage.COMPRESSION_END_REASON}'", (session_id,))
    if cur.rowcount:
        return
    require_session(conn, session_id)
    tip = lineage.live_continuation(conn, session_id)
    if tip is not None:
        raise SessionClosedByCompressionError(session_id, tip)
    conn.execute(f"UPDATE sessions SET ended_at = NULL, end_reason = NULL, {ARCHIVE_LIFT_SQL} WHERE id = ?",
                 (session_id,))


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
    if "source" in values:
        check_id("source", values["source"])  # never cleared or blank: listings group by it
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
    if estimated_cost_usd is not None:
        check_number("estimated_cost_usd", estimated_cost_usd)
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ValueError("model must be a non-empty string or None")
    model = strip_surrogates(model)
    if estimated_cost_usd is not None:
        counts["estimated_cost_usd"] = float(estimated_cost_usd)
    if absolute:
        sets = [f"{name} = ?" for name in counts]
    else:
        _check_sums_fit(conn, session_id, model, counts)
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


def _check_sums_fit(conn: sqlite3.Connection, session_id: str, model: str | None, counts: dict[str, Any]) -> None:
    # SQLite turns an integer sum past 2**63-1 into a float without a word; refuse it instead,
    # before anything is written. Checked for the session row and its per-model usage rows.
    integers = [name for name in counts if name != "estimated_cost_usd"]
    peak = ", ".join(f"MAX(COALESCE({n}, 0))" for n in integers)
    rows = [conn.execute(f"SELECT {peak} FROM sessions WHERE id = ?", (session_id,)).fetchone(),
            conn.execute(f"SELECT {peak} FROM session_model_usage WHERE session_id = ?", (session_id,)).fetchone()]
    for row in rows:
        for name, current in zip(integers, row or ()):
            if isinstance(current, int) and current + counts[name] > INT_MAX:
                raise ValueError(f"{name} would pass SQLite's 64-bit integer range ({current} + {counts[name]})")


def reset_counters(conn: sqlite3.Connection, session_id: str, *, resumed_at: float | None = None) -> None:
    """Zero the session's counters (its live generation is about to be rewritten).

    With `resumed_at` the write also counts as activity: last_activity_at moves forward and
    an archive only the idle sweep made is lifted. Raises SessionNotFoundError for an unknown id.
    """
    resume = "" if resumed_at is None else f", last_activity_at = MAX(COALESCE(last_activity_at, 0), ?), {ARCHIVE_LIFT_SQL}"
    params = (session_id,) if resumed_at is None else (resumed_at, session_id)
    _updated_or_missing(conn.execute(f"UPDATE sessions SET {COUNTER_RESET_SQL}{resume} WHERE id = ?", params),
                        session_id)


def lift_auto_archive(conn: sqlite3.Connection, session_id: str) -> None:
    """Lift an archive only the idle sweep made on the session (continuing it resumes it)."""
    conn.execute(f"UPDATE sessions SET {ARCHIVE_LIFT_SQL} WHERE id = ?", (session_id,))


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
    check_number("idle_days", idle_days)
    cutoff = (time.time() if now is None else now) - idle_days * DAY_S
    return conn.execute(
        "UPDATE sessions SET archived = 1, auto_archived = 1 WHERE COALESCE(archived, 0) = 0 "
        "AND COALESCE(pinned, 0) = 0 AND COALESCE(last_activity_at, started_at) < ?", (cutoff,)).rowcount


# --- titles ----------------------------------------------------------------------------------
# A title lineage is "T", "T #2", "T #3", ...: when a conversation continues in a new session
# (compression, a resumed topic) the new session takes the next number, so every title stays
# unique while the family stays recognisable.

_LINEAGE_SUFFIX = re.compile(r" #([0-9]+)")  # matched with fullmatch against what follows "T"


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
    any numbered variant, the base itself is returned unchanged. The result always fits the
    100-character limit: a base too long for its suffix is cut (and stripped), and the number
    then also passes every title of the cut base's lineage, so the suggestion is free.
    """
    normalized = normalize_title(title)
    if normalized is None:
        raise ValueError("title must be a non-blank string")
    base = _split_lineage(normalized)
    members = _lineage_members(conn, base)
    if not members:
        return base
    number = max(m[0] for m in members) + 1
    while True:
        suffix = f" #{number}"
        if len(base) + len(suffix) <= TITLE_MAX_CHARS:
            return base + suffix
        cut = base[:TITLE_MAX_CHARS - len(suffix)].rstrip()
        # "cut #n" belongs to the cut base's lineage: step past its numbers so it is not taken.
        # A longer number may shorten the cut again, hence the loop (it ends: numbers only grow).
        taken = max((m[0] for m in _lineage_members(conn, cut)), default=0)
        if taken < number:
            return cut + suffix
        number = taken + 1
