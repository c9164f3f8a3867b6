"""A page of search hits: what each one carries (details, snippet, context), whatever found it.

Owns: the result dict of a hit (message and session details), its snippet (FTS5 snippet() for a
word or reasoning hit, worked out on a copy of the page's rows by hermes_state_highlight, else a
text window around the first match) and its context (the previous message, the hit and the next
one of the same session and generation), each fetched for the whole page in one statement.
Does not own: which rows are hits, in what order (hermes_state_search), how text is marked
(hermes_state_highlight).

Transaction contract: read-only, on the caller's connection, inside the caller's read snapshot.
"""
from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from typing import Any

import hermes_state_fts as fts
import hermes_state_highlight as highlight

_CONTEXT_CHARS = 200
_SNIPPET_ARGS = "'>>>', '<<<', '...', 16"
# Longer rows get a snippet cut from a window around the first match: snippet() tokenizes the whole
# row (the copy's insert, then snippet() itself), which on a page of tool output cost more than
# finding the hits did.
_FTS_SNIPPET_MAX_CHARS = 4_000

# The columns of the indexes whose hits FTS5 snippet() highlights, in their declared order.
_SNIPPET_COLUMNS = {fts.WORD: ("content", "tool_name", "tool_calls"), fts.REASONING: ("reasoning",)}


def _snippets(conn: sqlite3.Connection, needles: list[str],
              hits: list[tuple[int, tuple[str, str] | None]]) -> dict[int, str]:
    """Return {id: snippet}: FTS5 snippet() for word/reasoning hits, a text window for the others."""
    out: dict[int, str] = {}
    by_source: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, source in hits:
        if source is not None:
            by_source[source].append(i)
    declared = bool(by_source) and fts.cached_state(conn).declared
    for (table, expr), ids in by_source.items():  # one statement per index and OR branch, not per hit
        # FTS5's snippet() re-tokenizes the whole row for every phrase match, so its cost grows
        # with the square of a long row's size; long rows take the text-window path below.
        columns = _SNIPPET_COLUMNS.get(table)
        if declared and columns:
            # The index is the declared one (default tokenizer): a copy of the rows gives the same
            # snippets without a seek through every segment of the index per hit (highlight.fts_snippets).
            out.update(highlight.fts_snippets(conn.execute(
                f"SELECT rowid, {', '.join(columns)} FROM {table} WHERE rowid IN (SELECT value FROM json_each(?)) "
                f"AND {' + '.join(f'COALESCE(length({c}), 0)' for c in columns)} <= ?",
                (json.dumps(ids), _FTS_SNIPPET_MAX_CHARS)).fetchall(), expr, len(columns)))
            continue
        column = 0 if table == fts.TRIGRAM else -1
        sizes = ("reasoning", "reasoning_content") if table == fts.REASONING else ("content", "tool_calls", "tool_name")
        out.update(conn.execute(
            f"SELECT rowid, snippet({table}, {column}, {_SNIPPET_ARGS}) FROM {table} "
            f"WHERE {table} MATCH ? AND rowid IN (SELECT id FROM messages WHERE id IN (SELECT value FROM json_each(?)) "
            f"AND {' + '.join(f'COALESCE(length({c}), 0)' for c in sizes)} <= ?)",
            (expr, json.dumps(ids), _FTS_SNIPPET_MAX_CHARS)))
    rest = [i for i, _ in hits if ">>>" not in (out.get(i) or "")]
    if rest:
        out.update(_window_snippets(conn, rest, needles))
    return out


def _window_snippets(conn: sqlite3.Connection, ids: list[int], needles: list[str]) -> dict[int, str]:
    """Return {id: snippet} cut from a window around the first match of content (else tool_calls, reasoning)."""
    return highlight.window_snippets(conn.execute(
        "SELECT id, content, tool_calls, reasoning_content, reasoning FROM messages "
        "WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)), needles)


# Previous message, the hit itself and next message of the same session and generation (active
# or archived), for every hit in one statement; `+active` keeps the planner on the (session_id,
# id) index.
_CONTEXT_SQL = f"""
SELECT h.id, h.id, h.role, substr(h.content, 1, {_CONTEXT_CHARS})
  FROM messages h WHERE h.id IN (SELECT value FROM json_each(:batch))
UNION ALL
SELECT h.id, c.id, c.role, substr(c.content, 1, {_CONTEXT_CHARS})
  FROM messages h JOIN messages c ON c.id = (
       SELECT p.id FROM messages p WHERE p.session_id = h.session_id AND p.id < h.id AND +p.active IS h.active
        ORDER BY p.id DESC LIMIT 1)
 WHERE h.id IN (SELECT value FROM json_each(:batch))
UNION ALL
SELECT h.id, c.id, c.role, substr(c.content, 1, {_CONTEXT_CHARS})
  FROM messages h JOIN messages c ON c.id = (
       SELECT n.id FROM messages n WHERE n.session_id = h.session_id AND n.id > h.id AND +n.active IS h.active
        ORDER BY n.id LIMIT 1)
 WHERE h.id IN (SELECT value FROM json_each(:batch))"""


def present(conn: sqlite3.Connection, needles: list[str],
            hits: list[tuple[int, tuple[str, str] | None]], *, with_context: bool = True) -> list[dict[str, Any]]:
    """Return the result dicts of a page of hits, in its order: (id, (index, expression) or None) each.

    The second item names the FTS5 index and expression that can give the hit's snippet; without
    one the snippet is a text window around the first of `needles`. A hit whose row is gone is
    left out. A fixed number of statements for the whole page; without `with_context` each hit's
    context is left empty, unread.
    """
    batch = json.dumps([i for i, _ in hits])
    rows = {r[0]: r for r in conn.execute(
        "SELECT m.id, m.session_id, m.role, m.timestamp, m.tool_name, s.source, s.model, s.started_at, s.title "
        "FROM messages m LEFT JOIN sessions s ON s.id = m.session_id "
        "WHERE m.id IN (SELECT value FROM json_each(?))", (batch,))}
    snippets = _snippets(conn, needles, hits)
    context: dict[int, list[dict[str, Any]]] = defaultdict(list)
    rows_around = conn.execute(_CONTEXT_SQL, {"batch": batch}) if with_context else []
    for hit, cid, role, content in sorted(rows_around, key=lambda r: (r[0], r[1])):
        context[hit].append({"id": cid, "role": role, "content": content})
    out = []
    for hit, _ in hits:
        row = rows.get(hit)
        if row is None:
            continue
        out.append({"id": row[0], "session_id": row[1], "role": row[2], "timestamp": row[3], "tool_name": row[4],
                    "snippet": snippets.get(hit, ""), "context": context.get(hit, []),
                    "source": row[5], "model": row[6], "session_started": row[7], "title": row[8]})
    return out
