"""Listings and statistics: pages of sessions with previews, counts, usage per model.

Owns: `list_sessions` (one query per page, with each session's preview and last activity),
`count_sessions` with the same filters, `usage_by_model` and `top_sessions_by_tokens`, and
`list_across_profiles` (one page merged from every profile's store).
Does not own: session rows and their rules (hermes_state_sessions), message search
(hermes_state_search).

Transaction contract: read-only, on the caller's connection.
"""
from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

from hermes_state_common import check_count, check_number, row_dicts
from hermes_state_errors import HermesStateError
from hermes_state_home import default_hermes_root

PREVIEW_CHARS = 63

# One statement for the whole page: the correlated subqueries run once per listed session and
# walk idx_messages_session (session_id, timestamp): the preview reads rows in time order up to
# the first active user message, last_active reads one index entry.
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
 ORDER BY {{order}}
 LIMIT ? OFFSET ?"""
_ACTIVITY = "COALESCE(s.last_activity_at, s.started_at)"
_ORDERS = {"started": "s.started_at DESC, s.id", "activity": f"{_ACTIVITY} DESC, s.id"}


def _session_filters(source: Any, include_archived: bool, model: Any, since: Any,
                     until: Any) -> tuple[str, list[Any]]:
    """Return the WHERE clause and parameters of a session listing; bad filter types raise ValueError."""
    for name, value in (("source", source), ("model", model)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None")
    # Filters are spliced in only when given, so the planner can pick idx_sessions_source.
    where, params = ["1"], []
    for column, value in (("s.source", source), ("s.model", model)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    for op, name, value in ((">=", "since", since), ("<", "until", until)):
        if value is not None:
            where.append(f"{_ACTIVITY} {op} ?")
            params.append(check_number(name, value))
    if not include_archived:
        where.append("COALESCE(s.archived, 0) = 0")
    return " AND ".join(where), params


def list_sessions(conn: sqlite3.Connection, source: str | None = None, limit: int = 20, offset: int = 0,
                  include_archived: bool = False, *, model: str | None = None, since: float | None = None,
                  until: float | None = None, order: str = "started") -> list[dict[str, Any]]:
    """Return a page of sessions, newest first, each with `preview` and `last_active`, in one query.

    Every `sessions` column is present, plus `preview` (the first active user message, its
    first 63 characters with line breaks as spaces, '' when none) and `last_active` (the latest
    message time, else `started_at`). `order` is "started" (by `started_at`, stable for paging)
    or "activity" (by last activity); pinned sessions are not moved to the top. `since`/`until`
    (epoch seconds) keep sessions whose last activity is in [since, until).
    """
    if order not in _ORDERS:
        raise ValueError(f"order must be one of {sorted(_ORDERS)}, not {order!r}")
    limit, offset = check_count("limit", limit), check_count("offset", offset)
    where, params = _session_filters(source, include_archived, model, since, until)
    sql = _LIST_SQL.format(where=where, order=_ORDERS[order])
    return row_dicts(conn.execute(sql, (*params, limit, offset)))


def count_sessions(conn: sqlite3.Connection, source: str | None = None, include_archived: bool = False, *,
                   model: str | None = None, since: float | None = None, until: float | None = None) -> int:
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
    """Return the sessions with the most input + output tokens (id, title, model, total_tokens, cost)."""
    limit = check_count("limit", limit)
    return row_dicts(conn.execute(
        """SELECT id, title, model,
                  COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) AS total_tokens,
                  estimated_cost_usd
             FROM sessions
            ORDER BY total_tokens DESC, started_at DESC, id
            LIMIT ?""", (limit,)))


def list_across_profiles(open_read_only: Callable[[Path], AbstractContextManager[Any]],
                         root: Any = None, **filters: Any) -> dict[str, Any]:
    """List sessions of every profile under `root`; `open_read_only(path)` opens one store (a SessionDB).

    See `hermes_state.list_sessions_across_profiles`: one profile's failure is reported in
    "errors", never raised.
    """
    base = Path(root).expanduser() if root is not None else default_hermes_root()
    homes = [("default", base)]
    profiles_dir = base / "profiles"
    if profiles_dir.is_dir():
        homes += sorted((p.name, p) for p in profiles_dir.iterdir() if p.is_dir())
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
    found.sort(key=lambda row: (row["started_at"], row["profile"], row["id"]), reverse=True)
    return {"sessions": found[offset:offset + limit], "errors": errors}
