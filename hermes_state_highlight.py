"""Highlighting search hits in text: where the needles occur, and a window with every match marked.

Owns: the needle regex (case-insensitive on the original text, accents folded as the unicode61
tokenizer folds them), `first_match` (a C-speed scan, with the regex only when it must) and
`text_snippet` (a window of text around the first match, matches wrapped in >>> <<<) and
`window_snippets` (that window for many rows at once, from the first field that has a match), and
`fts_snippets` (FTS5's own snippet() of a few rows, worked out in a private in-memory index).
Does not own: which rows or fields are highlighted, or which index expression matches them
(hermes_state_search).

Transaction contract: none on the caller's connection; `fts_snippets` writes only its own
in-memory database, one per thread, and leaves it empty.
"""
from __future__ import annotations

import re
import sqlite3
import threading
import unicodedata
from collections import defaultdict
from typing import Any, Iterable, cast

SNIPPET_CHARS = 120  # the length of a text window

# The word index folds diacritics (unicode61), so "deja" finds "Déjà"; text windows match the
# same way: a Latin letter of a needle also matches its accented forms (and an accented one its base).
_ACCENTED: dict[str, str] = defaultdict(str)
for _ch in map(chr, range(0xC0, 0x250)):
    _base = unicodedata.normalize("NFD", _ch)[0]
    if _base != _ch and _base.isascii() and _base.isalpha():
        _ACCENTED[_base.lower()] += _ch


def _folded(needle: str) -> str:
    # Only Latin letters fold (as unicode61 does); any other character, a kana with its voicing
    # mark (デ) say, matches only itself.
    out = []
    for c in needle:
        base = unicodedata.normalize("NFD", c)[0].lower()
        out.append(f"[{re.escape(c)}{re.escape(base)}{_ACCENTED[base]}]" if base in _ACCENTED else re.escape(c))
    return "".join(out)


def needle_pattern(needles: list[str]) -> re.Pattern[str] | None:
    """Return one case- and accent-insensitive regex for all `needles` (None when there are none)."""
    # Case-insensitive on the original text: lowercasing first can change the length ("İ" -> "i̇")
    # and shift every position after it. Longest needles first, so "東京都" beats "東京".
    needles = sorted({n for n in needles if n}, key=len, reverse=True)
    return re.compile("|".join(map(_folded, needles)), re.IGNORECASE) if needles else None


def text_snippet(text: str | None, needles: list[str], chars: int = SNIPPET_CHARS) -> str:
    """Return a window of `text` around the first match with every match wrapped in >>> <<<."""
    if not text:
        return ""
    pattern = needle_pattern(needles)
    first = pattern.search(text) if pattern else None
    begin = max(0, (first.start() if first else 0) - chars // 3)
    end = min(len(text), begin + chars)
    out, pos = [], begin
    for match in pattern.finditer(text, begin, end) if pattern and first else ():
        if match.end() > match.start():
            out += [text[pos:match.start()], ">>>", match.group(), "<<<"]
            pos = match.end()
    out.append(text[pos:end])
    return ("..." if begin else "") + "".join(out) + ("..." if end < len(text) else "")


def first_match(text: str | None, needles: list[str]) -> int:
    """Return the index of the first case-insensitive occurrence of any needle in `text`, or -1."""
    if not text or not needles:
        return -1
    folded = text.lower()
    found = [i for i in (folded.find(n.lower()) for n in needles) if i >= 0] if len(folded) == len(text) else []
    if found or (text.isascii() and all(n.isascii() for n in needles)):
        return min(found, default=-1)
    # A few letters change length when lowered (positions would shift), and accents fold: the regex.
    match = cast(re.Pattern[str], needle_pattern(needles)).search(text)  # a query's needles are never all empty
    return match.start() if match else -1


# How far before the first match a window starts, and how long it is: wide enough that
# text_snippet can centre its 120 characters on the match.
WINDOW_BEFORE, WINDOW_CHARS = 2 * SNIPPET_CHARS, 4 * SNIPPET_CHARS


def window_snippets(rows: Iterable[tuple[Any, ...]], needles: list[str]) -> dict[int, str]:
    """Return {id: snippet} for rows of (id, field, ...), cut around the first match in the first field with one.

    Finding the match is a C-speed scan (`str.find`) and only a window of a few hundred
    characters is highlighted, so a hit in a 10 MB tool output costs milliseconds. A row with
    no match in any field gets a window at the start of its first field.
    """
    out = {}
    for i, first, *others in rows:
        text, at = first, first_match(first, needles)
        for other in others if at < 0 else ():
            found = first_match(other, needles)
            if found >= 0:
                text, at = other, found
                break
        if not text:
            out[i] = ""
            continue
        start = max(0, at - WINDOW_BEFORE)
        end = start + WINDOW_CHARS
        snippet = text_snippet(text[start:end], needles)
        out[i] = ("..." if start and not snippet.startswith("...") else "") + snippet + (
            "..." if end < len(text) and not snippet.endswith("...") else "")
    return out


# FTS5's snippet() of a hit in the store's index must seek the row in every segment of that index
# (tens at 200,000 messages), for every hit: a few milliseconds per page of results. snippet()
# looks only at the row itself (its tokens and the phrase matches in them, never the statistics of
# the other rows), so the same rows copied into a small index with the same columns and tokenizer
# give the same snippets at a fraction of the cost. The copy lives in an in-memory database of
# this thread, inside a transaction that is rolled back: nothing of it outlives the call.
_SNIPPET_ARGS = "'>>>', '<<<', '...', 16"
_scratch = threading.local()


def scratch_conn() -> sqlite3.Connection:
    """Return this thread's in-memory scratch connection, where snippets are worked out."""
    conn = getattr(_scratch, "conn", None)
    if conn is None:
        conn = _scratch.conn = sqlite3.connect(":memory:", isolation_level=None)
        _scratch.tables = {}
    return conn


def fts_snippets(rows: list[tuple[Any, ...]], expr: str, columns: int) -> dict[int, str]:
    """Return {rowid: FTS5 snippet} for rows of (rowid, text of each of `columns` columns) matching `expr`.

    The snippets are those of an FTS5 table of that many columns with the default tokenizer
    (unicode61), as the store's word and reasoning indexes are. A row the expression does not
    match, or an expression FTS5 refuses, gives no entry.
    """
    if not rows:
        return {}
    conn = scratch_conn()
    table = _scratch.tables.get(columns)
    if table is None:
        table = f"hits{columns}"
        names = ", ".join(f"c{i}" for i in range(columns))
        conn.execute(f"CREATE VIRTUAL TABLE {table} USING fts5({names})")
        _scratch.tables[columns] = table
    conn.execute("BEGIN")
    try:
        conn.executemany(f"INSERT INTO {table}(rowid, {', '.join(f'c{i}' for i in range(columns))}) "
                         f"VALUES ({', '.join('?' * (columns + 1))})", rows)
        return dict(conn.execute(f"SELECT rowid, snippet({table}, -1, {_SNIPPET_ARGS}) FROM {table} "
                                 f"WHERE {table} MATCH ?", (expr,)))
    except sqlite3.Error:
        return {}  # the caller falls back to a text window, as for any hit without a snippet
    finally:
        conn.execute("ROLLBACK")
