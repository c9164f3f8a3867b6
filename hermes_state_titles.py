"""Session titles: cleaning, uniqueness, and numbered lineages "T", "T #2", "T #3", ...

Owns: `sanitize_title` (what a stored title may hold), the uniqueness check, setting a title
(including taking it over from a compression ancestor), generated titles, looking sessions up
by title and the lineage numbering (`resolve_session_by_title`, `get_next_title_in_lineage`).
Does not own: the rest of the session row (hermes_state_sessions), the compression edge
(hermes_state_lineage).

Transaction contract: write functions run inside the caller's write transaction and never
open or commit one; every check runs before the first statement that changes anything.
Read functions run under the caller's lock.
"""
from __future__ import annotations

import re
import sqlite3
import unicodedata
from typing import Any, cast

import hermes_state_lineage as lineage
from hermes_state_common import SESSION_ROW_SQL, logger, object_exists, replace_surrogates, session_dicts
from hermes_state_errors import TitleConflictError

TITLE_MAX_CHARS = 100
# Characters a title never keeps: controls (Cc) and invisible format marks (Cf: zero-width
# spaces and joiners, bidi overrides, the BOM). They make look-alike titles and spoof text.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf"})


def sanitize_title(title: str | None) -> str | None:
    """Return the title as stored: cleaned, whitespace collapsed, None when nothing is left.

    Control and format characters (NUL, DEL, zero-width, bidi overrides, BOM) are removed,
    every run of whitespace becomes one space, the ends are stripped; a lone surrogate becomes
    U+FFFD. Longer than 100 characters after cleaning raises ValueError ("too long").
    """
    if title is None:
        return None
    if not isinstance(title, str):
        raise ValueError("title must be a string or None")
    if not title.isascii() or not title.isprintable():
        title = "".join(c for c in cast(str, replace_surrogates(title))  # text in, text out
                        if c.isspace() or unicodedata.category(c) not in _INVISIBLE_CATEGORIES)
    title = " ".join(title.split())
    if len(title) > TITLE_MAX_CHARS:
        raise ValueError(f"title is too long ({len(title)} characters; the limit is {TITLE_MAX_CHARS})")
    return title or None


def normalize_title(title: str | None) -> str | None:
    """Clean a title as `sanitize_title` does (the name this library used first)."""
    return sanitize_title(title)


def title_holder(conn: sqlite3.Connection, title: str | None, session_id: str) -> str | None:
    """Return the id of another session carrying `title`, or None."""
    if title is None:
        return None
    row = conn.execute("SELECT id FROM sessions WHERE title = ? AND id != ?", (title, session_id)).fetchone()
    return None if row is None else row[0]


def check_title_free(conn: sqlite3.Connection, title: str | None, session_id: str) -> None:
    """Raise TitleConflictError when another session already carries `title`."""
    holder = title_holder(conn, title, session_id)
    if holder is not None:
        raise TitleConflictError(f"title {title!r} is already in use by session {holder!r}")


def _session_exists(conn: sqlite3.Connection, session_id: str) -> bool:
    return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None


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


def set_session_title(conn: sqlite3.Connection, session_id: str, title: str | None) -> bool:
    """Set (or, with None/blank, clear) a session's title; return False for an unknown session.

    Must run inside the caller's write transaction. The title is cleaned by `sanitize_title`
    (ValueError when too long). A title held by a compression ancestor of this session moves
    here: the ancestor is closed and hidden behind this continuation, so the user renaming
    the live tip back to the base name takes it over. Any other holder raises
    TitleConflictError ("already in use"). Nothing is written when a check fails.
    """
    title = sanitize_title(title)
    if not _session_exists(conn, session_id):
        return False
    holder = title_holder(conn, title, session_id)
    if holder is not None:
        if holder not in lineage.compression_ancestor_ids(conn, session_id):
            raise TitleConflictError(f"title {title!r} is already in use by session {holder!r}")
        conn.execute("UPDATE sessions SET title = NULL, title_source = NULL WHERE id = ?", (holder,))
    try:
        conn.execute("UPDATE sessions SET title = ?, title_source = ? WHERE id = ?",
                     (title, None if title is None else TITLE_SOURCE_USER, session_id))
    except sqlite3.IntegrityError as exc:
        # Only reachable when a writer outside BEGIN IMMEDIATE took the title between the
        # check and the update; the unique index is the final word.
        if "title" not in str(exc):
            raise
        raise TitleConflictError(f"title {title!r} is already in use (just taken by another session)") from exc
    return True


def set_auto_title_if_empty(conn: sqlite3.Connection, session_id: str, title: str | None) -> bool:
    """Set a generated title only while the session has none; return True when it was set.

    A title the user (or an earlier generation) gave is never replaced. A title another
    session holds is left to it (False), since a generated name must never fail a turn.
    """
    title = sanitize_title(title)
    if title is None or title_holder(conn, title, session_id) is not None:
        return False
    return conn.execute("UPDATE sessions SET title = ?, title_source = ? WHERE id = ? "
                        "AND (title IS NULL OR title = '')",
                        (title, TITLE_SOURCE_LLM, session_id)).rowcount == 1


def get_session_by_title(conn: sqlite3.Connection, title: str | None) -> dict[str, Any] | None:
    """Return the session row whose title is exactly `title` (after cleaning), or None."""
    try:
        title = sanitize_title(title)
    except ValueError:
        return None  # too long to be anyone's title
    if title is None:
        return None
    rows = session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.title = ?", (title,)))
    return rows[0] if rows else None


def get_session_title(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Return the session's title, or None when it has none or does not exist."""
    row = conn.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def resolve_session_by_title(conn: sqlite3.Connection, title: str | None) -> str | None:
    """Return the id of the latest session of the lineage `title`, "`title` #2", ..., or None.

    The title is taken literally as the lineage base: "T" resolves among "T", "T #2", ...;
    "T #2" resolves among "T #2" and "T #2 #<n>" (an explicit number names that session).
    Latest means the highest number, never the clock (a clock stepped back between a
    session and its continuation must not resurrect the closed one). When that session was
    closed by compression, its live continuation is returned.
    """
    if title is None or not isinstance(title, str) or not title.strip():
        return None
    members = _lineage_members(conn, title.strip())
    if not members:
        return None
    latest = max(members, key=lambda m: m[0])[2]
    return lineage.compression_successor_id(conn, latest) or latest


def get_next_title_in_lineage(conn: sqlite3.Connection, base_title: str | None = None, *,
                              title: str | None = None) -> str:
    """Return the title a continuation of `base_title` should take: "T" -> "T #2" -> "T #3" ...

    `title` is this library's earlier name of the argument, still taken by keyword.

    A numbered input counts as its base ("T #2" -> base "T"). The result is the highest
    existing number plus one (gaps are not refilled); when no session carries the base or
    any numbered variant, the base itself is returned unchanged. The result always fits the
    100-character limit: a base too long for its suffix is cut (and stripped), and the number
    then also passes every title of the cut base's lineage, so the suggestion is free.
    """
    if title is not None and base_title is not None:
        raise TypeError("give the title once: base_title or title")
    normalized = normalize_title(base_title if title is None else title)
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


# --- where a title came from (sessions.title_source, as hermes-agent 0.20 reads it) ---------------
# A title the user gave outranks a model's, which outranks one derived from the text; a
# generated title never replaces one of equal or higher rank. A title with no recorded source
# was given before sources were recorded, by a user as far as anyone knows.
TITLE_SOURCE_USER = "user"
TITLE_SOURCE_LLM = "llm"
TITLE_SOURCE_DERIVED = "derived"
_TITLE_RANK = {TITLE_SOURCE_DERIVED: 1, TITLE_SOURCE_LLM: 2, TITLE_SOURCE_USER: 3}
_AUTO_SOURCES = (TITLE_SOURCE_DERIVED, TITLE_SOURCE_LLM)


def _rank(title: str | None, source: str | None) -> int:
    if not title:
        return 0
    return _TITLE_RANK[TITLE_SOURCE_USER] if source is None else _TITLE_RANK.get(source, 0)


def set_auto_title(conn: sqlite3.Connection, session_id: str, title: str | None, *, source: str) -> bool:
    """Set a generated title ("derived" or "llm") unless one of equal or higher rank holds the row; True when written.

    Cleaned like any title (too long: ValueError); a title another session holds raises
    TitleConflictError; an unknown session answers False. A title that cleans to nothing clears
    a lower-ranked one, as hermes-agent does. Any other `source` is a ValueError.
    """
    if source not in _AUTO_SOURCES:
        raise ValueError(f"invalid automatic title source: {source!r} (one of {', '.join(_AUTO_SOURCES)})")
    title = sanitize_title(title)
    row = conn.execute("SELECT title, title_source FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None or _rank(row[0], row[1]) >= _TITLE_RANK[source]:
        return False
    check_title_free(conn, title, session_id)
    conn.execute("UPDATE sessions SET title = ?, title_source = ? WHERE id = ?",
                 (title, None if title is None else source, session_id))
    return True


def get_session_title_source(conn: sqlite3.Connection, session_id: str) -> str | None:
    """Return where the session's title came from ("user", "llm", "derived"); None when untitled or unknown."""
    row = conn.execute("SELECT title_source FROM sessions WHERE id = ? AND title IS NOT NULL", (session_id,)).fetchone()
    return None if row is None else row[0]


def set_session_title_source(conn: sqlite3.Connection, session_id: str, source: str) -> bool:
    """Record where the session's title came from, the title left as it is; False when untitled or unknown."""
    if source not in _TITLE_RANK:
        raise ValueError(f"invalid title source: {source!r} (one of {', '.join(_TITLE_RANK)})")
    return conn.execute("UPDATE sessions SET title_source = ? WHERE id = ? AND title IS NOT NULL",
                        (source, session_id)).rowcount > 0


TITLE_INDEX = "idx_sessions_title_unique"


def free_duplicate_titles(conn: sqlite3.Connection) -> list[str]:
    """Clear a repeated title from every holder but the newest; return the ids that lost it.

    Run before the unique-title index is built on a file that lacks it (another program dropped
    it, then wrote duplicates): without this the index cannot be built and the file cannot open.
    No row is deleted; only the title of the older holders becomes NULL. Runs inside the
    caller's write transaction.
    """
    if object_exists(conn, "index", TITLE_INDEX):
        return []
    cleared = [sid for (sid,) in conn.execute(
        "SELECT id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY title ORDER BY started_at DESC, rowid DESC) AS n"
        " FROM sessions WHERE title IS NOT NULL) WHERE n > 1")]
    for sid in cleared:
        conn.execute("UPDATE sessions SET title = NULL WHERE id = ?", (sid,))
    if cleared:
        # Said once, at the open that repaired it: the next open finds the index and says nothing.
        logger.warning("repaired repeated session titles so titles are unique again: the newest holder of each "
                       "kept it, %d older session(s) lost it (no session or message was deleted): %s",
                       len(cleared), ", ".join(cleared[:20]) + (" ..." if len(cleared) > 20 else ""))
    return cleared
