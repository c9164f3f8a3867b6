"""Listings and statistics: pages of sessions with previews, counts, usage per model or source.

Owns: `list_sessions` (one query per page, with each session's preview and last activity),
`count_sessions` with the same filters, `usage_by_model` and `top_sessions_by_tokens`,
`list_across_profiles` (one page merged from every profile's store), and
hermes-agent's conversation listings (`list_sessions_rich` with compression tips projected,
`search_sessions`, `search_sessions_by_id`, `list_cron_job_runs`), and the usage statistics:
`usage` (totals per model or per source, with source and time filters, optionally per day, week or
month of the sessions' start, local time), `largest_sessions` (the same filters; one query with
`top_sessions_by_tokens`), `usage_totals`, and matching what people type against the stored names
(`matching_names`: any case; a model also by the part after its provider, `gpt-5` for `openai/gpt-5`).
Does not own: session rows and their rules (hermes_state_sessions), message search
(hermes_state_search), a whole file's statistics (hermes_state_recovery), drawing usage
(hermes_state_commands, hermes_state_chart).

Transaction contract: read-only, on the caller's connection.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Iterable

from hermes_state_common import (BRANCH_LIKE_SQL, DELEGATE_LIKE_SQL, HIDDEN_SQL, SESSION_ROW_SQL, check_count, check_id,
                                 contains_sql, escape_like, prefix_range, row_dicts, session_dicts)
from hermes_state_errors import HermesStateError
from hermes_state_home import default_hermes_root, profile_homes
from hermes_state_lineage import COMPRESSION_END_REASON, compression_links, compression_successor_id, forward_chain
from hermes_state_sessions import (filter_flag, filter_name, filter_name_or_names, filter_names, session_filters,
                                   session_unread)

check_text = check_id  # a filter's text: a non-empty string SQLite can store

PREVIEW_CHARS = 63

# One statement for the whole page: the correlated subqueries run once per listed session and
# walk idx_messages_session (session_id, timestamp): the preview reads rows in time order up to
# the first active user message, last_active reads one index entry.
# The preview reads at most 2 * 63 characters, enough for 63 after every CRLF became a space.
_LIST_SQL = f"""
SELECT {SESSION_ROW_SQL},
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
 ORDER BY {{order}}
 LIMIT ? OFFSET ?"""
_ACTIVITY = "COALESCE(s.last_activity_at, s.started_at)"
_ORDERS = {"started": "s.started_at DESC, s.id", "activity": f"{_ACTIVITY} DESC, s.id"}


def _session_filters(source: Any, include_archived: bool, model: Any, since: Any,
                     until: Any) -> tuple[str, list[Any]]:
    """Return the WHERE clause and parameters of a session listing; bad filters raise SessionFilterError."""
    # Filters are spliced in only when given, so the planner can pick idx_sessions_source.
    where, params = session_filters("s.", sources=filter_name_or_names("source", source),
                                    models=filter_name_or_names("model", model), include_archived=include_archived,
                                    time_sql=_ACTIVITY, since=since, until=until)
    return " AND ".join(["1", *where]), params


def list_sessions(conn: sqlite3.Connection, source: str | list[str] | None = None, limit: int = 20, offset: int = 0,
                  include_archived: bool = False, *, model: str | list[str] | None = None, since: float | None = None,
                  until: float | None = None, order: str = "started") -> list[dict[str, Any]]:
    """Return a page of sessions, newest first, each with `preview` and `last_active`, in one query.

    Every `sessions` column is present, plus `preview` (the first active user message, its
    first 63 characters with line breaks as spaces, '' when none) and `last_active` (the latest
    message time, else `started_at`). `order` is "started" (by `started_at`, stable for paging)
    or "activity" (by last activity); pinned sessions are not moved to the top. `since`/`until`
    (epoch seconds) keep sessions whose last activity is in [since, until). `source` and `model`
    are a name, or a list of names any of which matches.
    """
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {sorted(_ORDERS)}, not {order!r}")
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    where, params = _session_filters(source, include_archived, model, since, until)
    sql = _LIST_SQL.format(where=where, order=_ORDERS[order])
    return session_dicts(conn.execute(sql, (*params, limit, offset)))


def count_sessions(conn: sqlite3.Connection, source: str | list[str] | None = None, include_archived: bool = False,
                   *, model: str | list[str] | None = None, since: float | None = None,
                   until: float | None = None) -> int:
    """Return how many sessions a listing with these filters pages through."""
    where, params = _session_filters(source, include_archived, model, since, until)
    return conn.execute(f"SELECT COUNT(*) FROM sessions s WHERE {where}", params).fetchone()[0]


def usage_by_model(conn: sqlite3.Connection, include_unset: bool = False) -> list[dict[str, Any]]:
    """Return per-model totals (sessions, input/output tokens, estimated cost), costliest first.

    Sessions without a model are left out unless `include_unset`, which adds them as one row
    with model None (last). A model whose sessions carry no cost estimate has
    `estimated_cost_usd` None and sorts after every priced model. The seed's column names
    (`total_input`, `total_output`, `total_cost`) are present too, so its callers keep working.
    """
    rows = row_dicts(conn.execute(
        """SELECT model, COUNT(*) AS session_count,
                  COALESCE(SUM(input_tokens), 0) AS input_tokens,
                  COALESCE(SUM(output_tokens), 0) AS output_tokens,
                  SUM(estimated_cost_usd) AS estimated_cost_usd,
                  COALESCE(SUM(input_tokens), 0) AS total_input,
                  COALESCE(SUM(output_tokens), 0) AS total_output,
                  SUM(estimated_cost_usd) AS total_cost
             FROM sessions WHERE model IS NOT NULL OR ?
            GROUP BY model
            ORDER BY model IS NULL, estimated_cost_usd IS NULL, estimated_cost_usd DESC, model""",
        (1 if include_unset else 0,)))
    return rows


def top_sessions_by_tokens(conn: sqlite3.Connection, limit: int = 10) -> list[dict[str, Any]]:
    """Return the sessions with the most input + output tokens (id, title, model, total_tokens, estimated_cost_usd)."""
    # hermes-agent's name for the largest sessions, unfiltered, with the estimate as its cost.
    return [_without(row, "cost_usd") for row in _largest(conn, check_count("limit", limit), "1", [])]


def list_across_profiles(open_read_only: Callable[[Path], AbstractContextManager[Any]],
                         root: Any = None, **filters: Any) -> dict[str, Any]:
    """List sessions of every profile under `root`; `open_read_only(path)` opens one store (a SessionDB).

    See `hermes_state.list_sessions_across_profiles`: one profile's failure is reported in
    "errors", never raised.
    """
    homes = profile_homes(root if root is not None else default_hermes_root())
    limit = check_count("limit", filters.pop("limit", 20))
    offset = check_count("offset", filters.pop("offset", 0))
    found: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for name, home in homes:
        try:
            with open_read_only(home / "state.db") as db:
                # The page is cut from the merged order, so each profile gives its first offset + limit.
                found += [dict(row, profile=name) for row in db.list_sessions(limit=offset + limit, **filters)]
        except (HermesStateError, sqlite3.Error, OSError) as exc:
            errors.append({"profile": name, "error": f"{type(exc).__name__}: {exc}"})
    # Merged in the order each profile was listed in: by start, or by last activity.
    when = "last_active" if filters.get("order") == "activity" else "started_at"
    found.sort(key=lambda row: (row[when], row["profile"], row["id"]), reverse=True)
    return {"sessions": found[offset:offset + limit], "errors": errors}


def workspace_key(row: dict[str, Any] | None = None, *, session: dict[str, Any] | None = None) -> str | None:
    """Return the workspace a session row belongs to: its git repo root, else its cwd, else None.

    The branch is deliberately not part of it: two branches of one repository are one workspace.
    `session` is this library's earlier name of the argument, still taken by keyword.
    """
    if session is not None and row is not None:
        raise TypeError("give the row once: row or session")
    found = row if session is None else session
    if found is None:
        raise TypeError("workspace_key() needs a session row")
    for column in ("git_repo_root", "cwd"):
        value = found.get(column)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None

# --- hermes-agent's listings: conversations, not sessions --------------------------------------
# A compression chain is listed once, as its newest part (the "tip"), in the slot of its first
# part (the "root"): the root's started_at keeps the row where the conversation began, and
# `_lineage_root_id` names the root. Children are hidden unless asked for, except branches; a
# delegate subagent's row (model_config `_delegate_from`) stays hidden even once detached.

RICH_PREVIEW_CHARS = 60
# The marks are looked up as sets (idx_sessions_marked holds the few marked sessions), so the
# listing's scan reads no session's model_config: a row of a cron run is never read whole.
_DELEGATE_SQL = (f"s.id IN (SELECT id FROM sessions WHERE {DELEGATE_LIKE_SQL} AND json_valid(model_config) "
                 "AND json_extract(model_config, '$._delegate_from') IS NOT NULL)")
_BRANCH_SQL = (f"(s.id IN (SELECT id FROM sessions WHERE {BRANCH_LIKE_SQL} AND json_valid(model_config) "
               "AND json_extract(model_config, '$._branched_from') IS NOT NULL) "
               "OR EXISTS (SELECT 1 FROM sessions bp WHERE bp.id = s.parent_session_id AND bp.end_reason = 'branched'))")
_TOP_LEVEL_SQL = f"((s.parent_session_id IS NULL OR {_BRANCH_SQL}) AND NOT {_DELEGATE_SQL})"
# The first user message's opening (enough for the preview after line breaks became spaces and
# the ends were trimmed), and the latest message time.
_PREVIEW_SQL = (f"(SELECT SUBSTR(m.content, 1, {4 * RICH_PREVIEW_CHARS}) FROM messages m "
                "WHERE m.session_id = s.id AND m.active = 1 AND m.role = 'user' AND m.content IS NOT NULL "
                "ORDER BY m.timestamp, m.id LIMIT 1)")
_LAST_ACTIVE_SQL = "COALESCE((SELECT MAX(m2.timestamp) FROM messages m2 WHERE m2.session_id = s.id), s.started_at)"


def _columns(conn: sqlite3.Connection, compact: bool) -> str:
    """Return the select list of session columns; compact rows leave out the system prompt."""
    if not compact:
        return SESSION_ROW_SQL
    names = [r[1] for r in conn.execute("PRAGMA table_info(sessions)") if r[1] != "system_prompt"]
    return ", ".join(f's."{name}"' for name in names)


def rich_preview(text: str | None) -> str:
    """Return a listing preview: line breaks as spaces, trimmed, cut to 60 characters plus "..."."""
    if not text:
        return ""
    flat = text.replace("\r", " ").replace("\n", " ").strip()
    return flat if len(flat) <= RICH_PREVIEW_CHARS else flat[:RICH_PREVIEW_CHARS] + "..."


def _rich_rows(conn: sqlite3.Connection, columns: str, where: str, params: list[Any],
               tail: str = "", tail_params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    rows = session_dicts(conn.execute(
        f"SELECT {columns}, {_PREVIEW_SQL} AS preview, {_LAST_ACTIVE_SQL} AS last_active FROM sessions s "
        f"WHERE {where} {tail}", (*params, *tail_params)))
    for row in rows:
        row["preview"] = rich_preview(row["preview"])
    return rows


def rich_rows(conn: sqlite3.Connection, where: str, params: list[Any], tail: str = "",
              tail_params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Return the sessions `where` selects (SQL over `s`), every column plus `preview` and `last_active`."""
    return _rich_rows(conn, SESSION_ROW_SQL, where, params, tail, tail_params)


def _project_tips(conn: sqlite3.Connection, rows: list[dict[str, Any]], columns: str) -> list[dict[str, Any]]:
    """Replace each compressed root on the page by its live tip, keeping the root's start."""
    out = []
    for row in rows:
        tip = compression_successor_id(conn, row["id"]) if row.get("end_reason") == COMPRESSION_END_REASON else None
        found = _rich_rows(conn, columns, "s.id = ?", [tip]) if tip and tip != row["id"] else []
        if found:
            projected = found[0]
            projected["started_at"] = row["started_at"]
            projected["_lineage_root_id"] = row["id"]
            row = projected
        out.append(row)
    return out


def _rich_filters(source: Any, exclude_sources: Any, cwd_prefix: Any, include_children: bool, min_message_count: Any,
                  include_archived: bool, archived_only: bool, id_query: Any, search_query: Any) -> tuple[str, list[Any]]:
    where, params = session_filters("s.", source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
                                    min_message_count=min_message_count, include_archived=include_archived,
                                    archived_only=archived_only)
    where.insert(0, "1")
    if not include_children:
        where.append(_TOP_LEVEL_SQL)
    if search_query is not None:
        # instr, not LIKE: the same ASCII-case-insensitive substrings, with no pattern length limit.
        text = check_text("search_query", search_query)
        matches = [contains_sql("s.title"), contains_sql("s.id")]
        params += [text, text]
        if id_query is not None:
            matches.append(contains_sql("s.id"))
            params.append(check_text("id_query", id_query))
        where.append("(" + " OR ".join(matches) + ")")
    return " AND ".join(where), params


def _sqlite_order(value: Any) -> tuple[int, Any]:
    """Return a sort key that orders values as SQLite does: NULL, then numbers, then text, then blobs."""
    if value is None:
        return (0, 0)
    if isinstance(value, (int, float)):
        return (1, value)
    return (2, value) if isinstance(value, str) else (3, bytes(value))


def _chain_activity(conn: sqlite3.Connection, where: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """Return (id, activity, started_at) of each listed session compression closed, over its whole chain."""
    links = compression_links(conn)
    if not links:
        return []
    chains: dict[str, list[str]] = {}
    for (root,) in conn.execute(f"SELECT s.id FROM sessions s WHERE {where} "
                                f"AND s.end_reason = '{COMPRESSION_END_REASON}'", params):
        chains[root] = forward_chain(root, links)
    parts = sorted({part for chain in chains.values() for part in chain})
    own = {sid: (active, started) for sid, active, started in conn.execute(
        f"SELECT s.id, {_LAST_ACTIVE_SQL}, s.started_at FROM sessions s "
        "WHERE s.id IN (SELECT value FROM json_each(?))", (json.dumps(parts),))}
    return [(root, max((own[p][0] for p in chain if p in own), key=_sqlite_order), own[root][1])
            for root, chain in chains.items() if root in own]


def _activity_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Order (id, activity, started_at) rows as the listing does: activity, then start, then id."""
    return _sqlite_order(row[1]), _sqlite_order(row[2]), row[0]


def _activity_order(conn: sqlite3.Connection, where: str, params: list[Any], limit: int, offset: int,
                    follow_chains: bool) -> list[str]:
    """Return the ids of one page of the listed sessions, latest activity first."""
    # The sessions that are not compressed come from the newest messages (or, without their
    # index, one pass over the sessions); the few compressed conversations take the walk along
    # their chain, and the two are merged.
    chained = _chain_activity(conn, where, params) if follow_chains else []
    excluded = json.dumps([c[0] for c in chained])
    plain = _latest_from_messages(conn, where, params, excluded, limit + offset)
    if plain is None:
        plain = conn.execute(
            f"SELECT s.id, {_LAST_ACTIVE_SQL} AS activity, s.started_at FROM sessions s WHERE {where} "
            "AND s.id NOT IN (SELECT value FROM json_each(?)) ORDER BY activity DESC, s.started_at DESC, s.id DESC "
            "LIMIT ?", (*params, excluded, limit + offset)).fetchall()
    merged = sorted([*plain, *chained], reverse=True, key=_activity_key)
    return [r[0] for r in merged[offset:offset + limit]]


# The walk over the newest messages reads this many index entries a step, and gives up past
# WALK_MOST (a session holding all the newest messages): one pass over the sessions costs less.
WALK_ROWS = 256
WALK_MOST = 16_384
TIMESTAMP_INDEX = "idx_messages_timestamp"


def _latest_from_messages(conn: sqlite3.Connection, where: str, params: list[Any], excluded: str,
                          wanted: int) -> list[tuple[Any, ...]] | None:
    """Return (id, activity, started_at) of the `wanted` listed sessions last active, none of `excluded`.

    Reads the messages newest first: a session's first message met is its latest, so the walk
    stops once `wanted` listed sessions are found and the messages left are older than the last
    of them. Sessions with no message (their activity is their start) come from the start index,
    started no earlier than that. None when the messages have no time index, or past WALK_MOST.
    """
    if wanted == 0:
        return []
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
                        (TIMESTAMP_INDEX,)).fetchone():
        return None  # a file of another program or release: the pass over the sessions is the only plan
    found = _walk_newest_messages(conn, where, params, excluded, wanted)
    if found is None:
        return None
    hits, bound = found
    # A range of the start index when bounded (an "? IS NULL OR" would make it a scan of all of it).
    since, since_params = ("AND s.started_at >= ? ", [bound]) if bound is not None else ("", [])
    quiet = conn.execute(
        f"SELECT s.id, s.started_at, s.started_at FROM sessions s WHERE {where} "
        f"AND s.id NOT IN (SELECT value FROM json_each(?)) {since}"
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id) "
        "ORDER BY s.started_at DESC, s.id DESC LIMIT ?", (*params, excluded, *since_params, wanted)).fetchall()
    return sorted([*hits, *quiet], reverse=True, key=_activity_key)[:wanted]


def _walk_newest_messages(conn: sqlite3.Connection, where: str, params: list[Any], excluded: str,
                          wanted: int) -> tuple[list[tuple[Any, ...]], Any] | None:
    """Return (listed sessions met, newest first, as (id, activity, started_at); the wanted-th's activity or None)."""
    seen: set[str] = set()
    hits: list[tuple[Any, ...]] = []
    cursor = conn.execute(f"SELECT session_id, timestamp FROM messages INDEXED BY {TIMESTAMP_INDEX} "
                          "ORDER BY timestamp DESC")
    try:
        for _ in range(0, WALK_MOST, WALK_ROWS):
            batch = cursor.fetchmany(WALK_ROWS)
            if not batch:
                return hits, None  # every session with a message was met
            first: dict[str, Any] = {}
            for sid, stamp in batch:
                if sid not in seen:
                    seen.add(sid)
                    first[sid] = stamp
            if first:
                listed = dict(conn.execute(
                    f"SELECT s.id, s.started_at FROM sessions s WHERE {where} "
                    "AND s.id IN (SELECT value FROM json_each(?)) AND s.id NOT IN (SELECT value FROM json_each(?))",
                    (*params, json.dumps(list(first)), excluded)).fetchall())
                hits += [(sid, stamp, listed[sid]) for sid, stamp in first.items() if sid in listed]
            if len(hits) >= wanted and _sqlite_order(batch[-1][1]) < _sqlite_order(hits[wanted - 1][1]):
                return hits, hits[wanted - 1][1]  # every message left is older than the wanted-th session
        return None
    finally:
        cursor.close()


def list_sessions_rich(conn: sqlite3.Connection, source: str | None = None, sources: list[str] | None = None,
                       exclude_sources: list[str] | None = None, cwd_prefix: str | None = None, limit: int = 20,
                       offset: int = 0, include_children: bool = False, min_message_count: int = 0,
                       project_compression_tips: bool = True, order_by_last_active: bool = False,
                       include_archived: bool = False, archived_only: bool = False, id_query: str | None = None,
                       search_query: str | None = None, compact_rows: bool = False, include_pinned: bool = False,
                       session_key: str | None = None, include_hidden: bool = False) -> list[dict[str, Any]]:
    """Return a page of conversations (hermes-agent's listing), each with `preview`, `last_active` and `unread`.

    Newest first by the conversation's start, or by its latest activity. A compressed
    conversation appears once, as its live tip with `_lineage_root_id` (unless
    `project_compression_tips` is False); children other than branches are hidden unless
    `include_children`, hidden sessions unless `include_hidden`. `compact_rows` leaves out
    `system_prompt`. Filters apply to the row listed before projection (the conversation's
    first part). `sources` selects any of several sources (`source`, when given, wins);
    `session_key` one gateway conversation scope. `include_pinned` appends the pinned
    conversations the page left out that pass the same filters.
    """
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    where, params = _rich_filters(source, exclude_sources, cwd_prefix, include_children, min_message_count,
                                  include_archived, archived_only, id_query, search_query)
    where, params = _rich_scope(where, params, None if source is not None else sources, session_key, include_hidden)
    columns = _columns(conn, compact_rows)
    if not order_by_last_active:
        rows = _rich_rows(conn, columns, where, params, "ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?",
                          (limit, offset))
    else:
        # The order is the conversation's latest activity, so it is computed over every part of
        # each chain before the page is cut (a LIMIT first could drop an old root whose tip is
        # the most recent thing in the store).
        page = _activity_order(conn, where, params, limit, offset, project_compression_tips)
        by_id = {r["id"]: r for r in _rich_rows(conn, columns, "s.id IN (SELECT value FROM json_each(?))",
                                                [json.dumps(page)])}
        rows = [by_id[sid] for sid in page if sid in by_id]
    if include_pinned:
        # A pin says "always reachable": the pinned conversations past this page come after it.
        listed = json.dumps([r["id"] for r in rows])
        rows += _rich_rows(conn, columns, f"{where} AND COALESCE(s.pinned, 0) = 1 "
                           "AND s.id NOT IN (SELECT value FROM json_each(?))", [*params, listed],
                           "ORDER BY s.started_at DESC, s.id DESC")
    if project_compression_tips:
        rows = _project_tips(conn, rows, columns)
    for row in rows:
        row["unread"] = _unread(row)
    return rows


def _rich_scope(where: str, params: list[Any], sources: Any, session_key: Any,
                include_hidden: bool) -> tuple[str, list[Any]]:
    # hermes-agent 0.20's filters of the rich listing: several sources, one gateway scope, hidden rows.
    params = list(params)
    if sources:
        names = filter_names("sources", sources) or []
        where += f" AND s.source IN ({', '.join('?' * len(names))})"
        params += names
    if session_key is not None and session_key != "":
        where += " AND s.session_key = ?"
        params.append(check_text("session_key", session_key))
    if not include_hidden:
        # Through idx_sessions_hidden: the flag is read from no session's row.
        where += f" AND s.id NOT IN (SELECT id FROM sessions WHERE {HIDDEN_SQL})"
    return where, params


def _unread(row: dict[str, Any]) -> bool:
    # Unread when anything happened after the read mark: a message, or a turn's activity stamp.
    stamps = [t for t in (row.get("last_active"), row.get("last_activity_at")) if isinstance(t, (int, float))]
    return session_unread({"last_read_at": row.get("last_read_at"), "last_active": max(stamps, default=None),
                           "started_at": row.get("started_at")})


def get_session_rich_row(conn: sqlite3.Connection, session_id: str,
                         compact_rows: bool = False) -> dict[str, Any] | None:
    """Return one session as a rich listing row (every column, `preview`, `last_active`), or None when unknown."""
    rows = _rich_rows(conn, _columns(conn, compact_rows), "s.id = ?", [session_id])
    return rows[0] if rows else None


def _source_names(name: str, value: Any) -> list[str]:
    return filter_names(name, value) or []


def search_sessions_by_id(conn: sqlite3.Connection, query: str, limit: int = 20, include_archived: bool = True,
                          source: str | None = None, sources: list[str] | None = None,
                          exclude_sources: list[str] | None = None) -> list[dict[str, Any]]:
    """Return listed conversations whose id (or their first part's id) contains `query`, exact matches first.

    Case-insensitive; then ids starting with the query, then any other match, newest first in
    each group. `source` keeps one source (it wins over `sources`, several), `exclude_sources`
    leaves some out.
    """
    text = check_text("query", query)
    limit = check_count("limit", limit)
    wanted, excluded = _source_names("sources", sources), _source_names("exclude_sources", exclude_sources)
    if source is not None and source != "":
        wanted = [filter_name("source", source)]
    where, params = _rich_filters(None, excluded, None, False, 0, include_archived, False, None, None)
    if wanted:
        where += f" AND s.source IN ({', '.join('?' * len(wanted))})"
        params += wanted
    columns = _columns(conn, False)
    rows = _rich_rows(conn, columns, f"{where} AND {contains_sql('s.id')}", [*params, text],
                      "ORDER BY CASE WHEN LOWER(s.id) = LOWER(?) THEN 0 WHEN instr(LOWER(s.id), LOWER(?)) = 1 THEN 1 "
                      "ELSE 2 END, s.started_at DESC, s.id LIMIT ?", (text, text, limit))
    return _project_tips(conn, rows, columns)


# A session's workspace (its git repo root, else its working directory) is `workspace_key` or,
# for a session known only by its working directory, a folder inside it. As in hermes-agent
# 0.20.1: the root is compared whole, a directory also by prefix (ASCII case folded, as LIKE does).
_IN_WORKSPACE_SQL = ("CASE WHEN COALESCE(s.git_repo_root, '') <> '' THEN s.git_repo_root = ? "
                     "ELSE (s.cwd = ? OR s.cwd LIKE ? ESCAPE '\\') END")


def search_sessions(conn: sqlite3.Connection, source: str | None = None, limit: int = 20,
                    offset: int = 0, workspace_key: str | None = None) -> list[dict[str, Any]]:
    """Return every session (children included), newest first, with `last_active`; `workspace_key` keeps one workspace's."""
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    where, params = ("s.source = ?", [filter_name("source", source)]) if source is not None else ("1", [])
    if workspace_key is not None and not isinstance(workspace_key, str):
        raise ValueError(f"workspace_key must be a string or None, not {workspace_key!r}")
    if workspace_key:
        key = check_text("workspace_key", workspace_key).rstrip("/")
        if not key:  # "/" names no workspace a session can have
            return []
        where += f" AND {_IN_WORKSPACE_SQL}"
        params += [key, key, escape_like(key) + "/%"]
    return session_dicts(conn.execute(
        f"SELECT {SESSION_ROW_SQL}, {_LAST_ACTIVE_SQL} AS last_active FROM sessions s WHERE {where} "
        "ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?", (*params, limit, offset)))


# --- hermes-agent 0.20.1: sessions opened by a /skill command ----------------------------------
# hermes-agent expands `/name instruction` into the skill's whole text under this heading, and
# titles made from that text describe the skill rather than the request.
SKILL_SCAFFOLD_SQL_LIKE = "[IMPORTANT: The user has invoked the %"
# Where an excerpt of a long turn joins its head and tail (ASCII record separator): an
# instruction ends there.
SKILL_EXCERPT_JOINT = "\x1e"
_SKILL_HEAD = '[IMPORTANT: The user has invoked the "'
_SKILL_BODY = "The full skill content is loaded below.]"  # an instruction follows the body, never the heading
_SKILL_INSTRUCTION = "The user has provided the following instruction alongside the skill invocation: "


def describe_skill_invocation(content: Any, separator: str = " \u2014 ") -> str | None:
    """Return a /skill turn as the user typed it ("/work — fix the title"), or None for any other content.

    `separator` joins the command and its instruction (" " gives the literal command line).
    """
    if not isinstance(separator, str):
        raise ValueError(f"separator must be a string, not {separator!r}")
    if not isinstance(content, str) or not content.startswith(_SKILL_HEAD):
        return None
    name, quote, _ = content[len(_SKILL_HEAD):].partition('"')
    name = name.strip()
    if not quote or not name:
        return None
    command = name if name.startswith("/") else "/" + name
    body = content.find(_SKILL_BODY)
    at = content.rfind(_SKILL_INSTRUCTION, body) if body >= 0 else -1
    asked = content[at + len(_SKILL_INSTRUCTION):].split(SKILL_EXCERPT_JOINT, 1)[0] if at >= 0 else ""
    instruction = " ".join(asked.split())
    return f"{command}{separator}{instruction}" if instruction else command


def list_skill_scaffolded_sessions(conn: sqlite3.Connection, limit: int = 200) -> list[dict[str, Any]]:
    """Return {"id", "title", "content"} of titled sessions whose first user turn was a /skill command, newest first.

    `content` is that whole turn, from which describe_skill_invocation gives what the user typed.
    """
    limit = check_count("limit", limit)
    return row_dicts(conn.execute(
        "SELECT s.id, s.title, m.content FROM sessions s JOIN messages m ON m.id = "
        "(SELECT MIN(id) FROM messages WHERE session_id = s.id AND role = 'user') "
        "WHERE COALESCE(s.title, '') <> '' AND m.content LIKE ? AND m.content_parts IS NULL "
        "ORDER BY s.started_at DESC, s.id DESC LIMIT ?", (SKILL_SCAFFOLD_SQL_LIKE, limit)))


def list_cron_job_runs(conn: sqlite3.Connection, job_id: str, limit: int = 20, offset: int = 0) -> list[dict[str, Any]]:
    """Return one cron job's runs (sessions `cron_<job_id>_...` of source cron), newest first, with preview."""
    job = check_text("job_id", job_id)
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    prefix = f"cron_{job}_"
    # A range over the id, not a LIKE: the true prefix only ("alpha" never takes "xalpha" or
    # "alpha2"), and the planner can walk an index on it.
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return _rich_rows(conn, _columns(conn, False), "s.source = 'cron' AND s.id >= ? AND s.id < ?", [prefix, upper],
                      "ORDER BY s.started_at DESC, s.id DESC LIMIT ? OFFSET ?", (limit, offset))


def resolve_session_id(conn: sqlite3.Connection, session_id_or_prefix: Any) -> str | None:
    """Return the session with this exact id, else the only one whose id starts with it; None otherwise.

    None as well for an ambiguous prefix, an empty text or anything that is not text. `%`
    and `_` are literal.
    """
    if not isinstance(session_id_or_prefix, str) or not session_id_or_prefix:
        return None
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id_or_prefix,)).fetchone():
        return session_id_or_prefix
    # The ids with this prefix, case-sensitive: a range of the primary key, then the exact test
    # (no LIKE pattern, so a prefix of any length is fine). Two rows are enough to say "ambiguous".
    low, high = prefix_range(session_id_or_prefix)
    rows = [r[0] for r in conn.execute(
        "SELECT id FROM sessions WHERE id >= ? AND (? IS NULL OR id < ?) AND substr(id, 1, length(?)) = ? "
        "ORDER BY id LIMIT 2", (low, high, high, low, low))]
    return rows[0] if len(rows) == 1 else None


def session_ids_with_prefix(conn: sqlite3.Connection, prefix: Any, limit: int = 20) -> list[str]:
    """Return the ids of sessions that start with `prefix` (case-sensitive, as ids are), in id order."""
    check_id("prefix", prefix)
    limit = check_count("limit", limit)
    # A range of the primary key: every id starting with the prefix sorts between these two.
    rows = conn.execute("SELECT id FROM sessions WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                        (prefix, prefix + "\U0010ffff", limit))
    return [r[0] for r in rows if r[0].startswith(prefix)]


# --- counts and lifecycle states (hermes-agent 0.20.1's names) ------------------------------------

def session_count_by_source(conn: sqlite3.Connection, *, include_archived: bool = False, archived_only: bool = False,
                            exclude_children: bool = False) -> dict[str, int]:
    """Return {source: number of sessions} in one grouped count; with `exclude_children`, as list_sessions_rich lists."""
    where, params = session_filters("s.", include_archived=filter_flag("include_archived", include_archived),
                                    archived_only=filter_flag("archived_only", archived_only))
    if filter_flag("exclude_children", exclude_children):
        where.append(_TOP_LEVEL_SQL)
    sql = "SELECT s.source, COUNT(*) FROM sessions s" + (" WHERE " + " AND ".join(where) if where else "")
    return dict(conn.execute(sql + " GROUP BY s.source ORDER BY s.source", params).fetchall())


def session_count_ge(conn: sqlite3.Connection, n: int = 1) -> bool:
    """Return whether the store holds at least `n` sessions, archived ones included (reads no more than `n`)."""
    wanted = check_count("n", n)
    return conn.execute("SELECT COUNT(*) FROM (SELECT 1 FROM sessions LIMIT ?)", (wanted,)).fetchone()[0] >= wanted


SESSION_STATUS_COMPLETE = "complete"
SESSION_STATUS_INTERRUPTED = "interrupted"
SESSION_STATUS_ERROR = "error"
SESSION_STATUS_EMPTY = "empty"
# The finish reasons that mean the last turn failed (compared trimmed, in any case).
ERROR_FINISH_REASONS = frozenset({"error", "content_filter"})


def classify_session_status(role: str | None, has_tool_calls: bool, finish_reason: str | None) -> str:
    """Name a session's state from its last message: "error", "interrupted" or "complete" (the benign default)."""
    if (finish_reason or "").strip().lower() in ERROR_FINISH_REASONS:
        return SESSION_STATUS_ERROR
    speaker = (role or "").strip().lower()
    # The agent never answered a user turn or consumed a tool result, or a tool call is still pending.
    if speaker in ("user", "tool") or (speaker == "assistant" and has_tool_calls):
        return SESSION_STATUS_INTERRUPTED
    return SESSION_STATUS_COMPLETE


def session_lifecycle_statuses(conn: sqlite3.Connection, session_ids: list[str]) -> dict[str, str]:
    """Return {session id: state} from each session's last live message; "empty" for none (an unknown id too)."""
    if isinstance(session_ids, (str, bytes)) or not isinstance(session_ids, (list, tuple, set, frozenset)):
        raise ValueError(f"session_ids must be a list of session ids, not {type(session_ids).__name__}")
    ids = list(dict.fromkeys(check_id("session_ids", sid) for sid in session_ids))
    # The newest row of each session by its id (an index seek each), then that one row.
    rows = conn.execute(
        "SELECT m.session_id, m.role, json_valid(m.tool_calls) AND json_array_length(m.tool_calls) > 0, "
        "m.finish_reason FROM messages m JOIN (SELECT session_id, MAX(id) AS last FROM messages "
        "WHERE session_id IN (SELECT value FROM json_each(?)) AND active = 1 GROUP BY session_id) t ON m.id = t.last",
        (json.dumps(ids),)).fetchall()
    found = {sid: classify_session_status(role, bool(calls), reason) for sid, role, calls, reason in rows}
    return {sid: found.get(sid, SESSION_STATUS_EMPTY) for sid in ids}


# --- usage statistics: per model or source, per period, the largest sessions ----------------------

# A period's label, from a session's start (local time): 2026-11-30, the Monday 2026-11-30, 2026-11.
PERIODS = {
    "day": "date(started_at, 'unixepoch', 'localtime')",
    "week": "date(started_at, 'unixepoch', 'localtime', '-6 days', 'weekday 1')",
    "month": "strftime('%Y-%m', started_at, 'unixepoch', 'localtime')",
}
GROUPS = {"model": "model", "source": "source"}


def matching_names(typed: str, stored: Iterable[str | None], *, provider: bool = False) -> list[str]:
    """Return the stored names `typed` stands for: equal in any case, or (`provider`) the part after a `provider/`."""
    want = typed.casefold()
    return sorted({name for name in stored if name is not None and (
        name.casefold() == want or provider and "/" in name and name.casefold().rsplit("/", 1)[1] == want)})


def _where(sources: Any, models: Any, since: Any, until: Any, include_archived: bool = True) -> tuple[str, list[Any]]:
    # The usage figures select sessions as every other listing does (one builder, one set of checks).
    where, params = session_filters(sources=filter_name_or_names("sources", sources),
                                    models=filter_name_or_names("models", models), include_archived=include_archived,
                                    time_sql="started_at", since=since, until=until)
    return " AND ".join(["1", *where]), params


def stored_names(conn: sqlite3.Connection) -> dict[str, list[str]]:
    """Return the distinct sources and models the sessions hold."""
    return {column: [r[0] for r in conn.execute(f"SELECT DISTINCT {column} FROM sessions WHERE {column} IS NOT NULL "
                                                f"ORDER BY 1")] for column in ("source", "model")}


def usage(conn: sqlite3.Connection, *, by: str = "model", period: str | None = None, sources: Any = None,
          models: Any = None, since: float | None = None, until: float | None = None,
          include_archived: bool = True) -> list[dict[str, Any]]:
    """Return session_count, input_tokens, output_tokens and cost_usd per `by` (model or source), per `period` if given.

    `period` is day, week (from Monday) or month, of the sessions' start in local time;
    `sources`/`models` are exact stored names; `since`/`until` (epoch seconds) bound the
    sessions' start. Rows are ordered by period, then by cost (costliest first); a group
    without a name (no model) comes last with `None`. Archived sessions count unless
    `include_archived` is False.
    """
    if by not in GROUPS:
        raise ValueError(f"by must be one of {sorted(GROUPS)}, not {by!r}")
    if period is not None and period not in PERIODS:
        raise ValueError(f"period must be one of {sorted(PERIODS)} or None, not {period!r}")
    where, params = _where(sources, models, since, until, include_archived)
    label = PERIODS[period] if period else "NULL"
    column = GROUPS[by]
    return row_dicts(conn.execute(
        f"""SELECT {label} AS period, {column} AS {by}, COUNT(*) AS session_count,
                   COALESCE(SUM(input_tokens), 0) AS input_tokens, COALESCE(SUM(output_tokens), 0) AS output_tokens,
                   SUM(COALESCE(actual_cost_usd, estimated_cost_usd)) AS cost_usd
              FROM sessions WHERE {where}
             GROUP BY 1, 2
             ORDER BY 1, {column} IS NULL, cost_usd IS NULL, cost_usd DESC, {column}""", params))


def _largest(conn: sqlite3.Connection, limit: int, where: str, params: list[Any]) -> list[dict[str, Any]]:
    # The one query of the largest sessions: both costs, each caller keeps the one it names.
    return row_dicts(conn.execute(
        f"""SELECT id, title, model, COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) AS total_tokens,
                   estimated_cost_usd, COALESCE(actual_cost_usd, estimated_cost_usd) AS cost_usd
              FROM sessions WHERE {where}
             ORDER BY total_tokens DESC, started_at DESC, id LIMIT ?""", (*params, limit)))


def _without(row: dict[str, Any], name: str) -> dict[str, Any]:
    del row[name]
    return row


def largest_sessions(conn: sqlite3.Connection, limit: int = 10, *, sources: Any = None, models: Any = None,
                     since: float | None = None, until: float | None = None) -> list[dict[str, Any]]:
    """Return the sessions with the most tokens in and out (id, title, model, total_tokens, cost), filtered as `usage`."""
    limit = check_count("limit", limit)
    where, params = _where(sources, models, since, until)
    return [_without(row, "estimated_cost_usd") for row in _largest(conn, limit, where, params)]


def usage_totals(conn: sqlite3.Connection, *, min_message_count: int = 1,
                 include_archived: bool = False) -> dict[str, float]:
    """Return {"tokens", "cost_usd"} (input + output; billed cost, else the estimate) of sessions this large or larger."""
    where = "COALESCE(message_count, 0) >= ?" + ("" if include_archived else " AND COALESCE(archived, 0) = 0")
    tokens, cost = conn.execute(
        "SELECT COALESCE(SUM(COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0)), 0), "
        f"COALESCE(SUM(COALESCE(actual_cost_usd, estimated_cost_usd, 0)), 0.0) FROM sessions WHERE {where}",
        (check_count("min_message_count", min_message_count),)).fetchone()
    return {"tokens": tokens, "cost_usd": float(cost)}
