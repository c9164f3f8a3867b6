"""Usage statistics: sessions, tokens and cost per model or source, over the whole store or per period.

Owns: `usage` (totals per model or per source, with source and time filters, optionally per day,
week or month of the sessions' start, local time), `largest_sessions` (the same filters), and
matching what people type against the stored names (`matching_names`: any case; a model also by
the part after its provider, `gpt-5` for `openai/gpt-5`).
Does not own: the unfiltered per-model totals hermes-agent's callers read (`usage_by_model` in
hermes_state_listings), drawing them (hermes_state_commands, hermes_state_web).

Transaction contract: read-only, one statement each, on the caller's connection.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Iterable

import hermes_state_fts as fts
import hermes_state_schema as schema

from hermes_state_common import check_count, check_id, check_number, row_dicts

# How long the statistics probe waits for a lock before it reports a field as unknown.
STATS_BUSY_S = 0.5

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
    where: list[str] = ["1" if include_archived else "COALESCE(archived, 0) = 0"]
    params: list[Any] = []
    for column, names in (("source", sources), ("model", models)):
        if names is not None:
            names = [check_id(column, n) for n in ([names] if isinstance(names, str) else names)]
            where.append(f"{column} IN ({', '.join('?' * len(names))})" if names else "0")
            params += names
    for op, name, value in ((">=", "since", since), ("<", "until", until)):
        if value is not None:
            where.append(f"started_at {op} ?")
            params.append(check_number(name, value))
    return " AND ".join(where), params


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


def largest_sessions(conn: sqlite3.Connection, limit: int = 10, *, sources: Any = None, models: Any = None,
                     since: float | None = None, until: float | None = None) -> list[dict[str, Any]]:
    """Return the sessions with the most tokens in and out (id, title, model, total_tokens, cost), filtered as `usage`."""
    limit = check_count("limit", limit)
    where, params = _where(sources, models, since, until)
    return row_dicts(conn.execute(
        f"""SELECT id, title, model, COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) AS total_tokens,
                   COALESCE(actual_cost_usd, estimated_cost_usd) AS cost_usd
              FROM sessions WHERE {where}
             ORDER BY total_tokens DESC, started_at DESC, id LIMIT ?""", (*params, limit)))


def usage_totals(conn: sqlite3.Connection, *, min_message_count: int = 1,
                 include_archived: bool = False) -> dict[str, float]:
    """Return {"tokens", "cost_usd"} (input + output; billed cost, else the estimate) of sessions this large or larger."""
    where = "COALESCE(message_count, 0) >= ?" + ("" if include_archived else " AND COALESCE(archived, 0) = 0")
    tokens, cost = conn.execute(
        "SELECT COALESCE(SUM(COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0)), 0), "
        f"COALESCE(SUM(COALESCE(actual_cost_usd, estimated_cost_usd, 0)), 0.0) FROM sessions WHERE {where}",
        (check_count("min_message_count", min_message_count),)).fetchone()
    return {"tokens": tokens, "cost_usd": float(cost)}


def _stat_value(conn: sqlite3.Connection, sql: str) -> Any:
    try:
        row = conn.execute(sql).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else row[0]


def _meta_int(conn: sqlite3.Connection, key: str) -> int | None:
    value = _stat_value(conn, f"SELECT value FROM state_meta WHERE key = '{key}'")
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def collect_state_db_stats(db_path: str | os.PathLike) -> dict[str, Any]:
    """Return a read-only snapshot of a database file's sizes, counts and full-text state; never raises, never writes.

    Keys (each None when it cannot be read): page_count, page_size, freelist_count,
    logical_size_bytes, wal_size_bytes (0 without a -wal), journal_mode, messages, sessions,
    fts_tables ({table: present} for the word, trigram and CJK indexes), fts_storage_version,
    fts_rebuild_pending, fts_rebuild_high_water, fts_rebuild_progress. The file is opened
    read-only without the library's schema work, so a live store held by a gateway can be probed.
    """
    stats: dict[str, Any] = dict.fromkeys((
        "page_count", "page_size", "freelist_count", "logical_size_bytes", "wal_size_bytes", "journal_mode",
        "messages", "sessions", "fts_tables", "fts_storage_version", "fts_rebuild_pending",
        "fts_rebuild_high_water", "fts_rebuild_progress"))
    try:
        stats["wal_size_bytes"] = os.stat(os.fspath(db_path) + "-wal").st_size
    except FileNotFoundError:
        stats["wal_size_bytes"] = 0
    except (OSError, TypeError, ValueError):
        pass
    try:
        conn = schema.connect(Path(db_path), read_only=True, read_busy_s=STATS_BUSY_S)
    except (sqlite3.Error, OSError, TypeError, ValueError):
        return stats
    try:
        for name in ("page_count", "page_size", "freelist_count", "journal_mode"):
            stats[name] = _stat_value(conn, f"PRAGMA {name}")
        if stats["page_count"] is not None and stats["page_size"] is not None:
            stats["logical_size_bytes"] = stats["page_count"] * stats["page_size"]
        for table in ("messages", "sessions"):
            stats[table] = _stat_value(conn, f"SELECT COUNT(*) FROM {table}")
        try:
            present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            stats["fts_tables"] = {table: table in present for table in (fts.WORD, fts.TRIGRAM,
                                                                         fts.CJK)}
        except sqlite3.Error:
            pass
        stats["fts_storage_version"] = _meta_int(conn, "fts_storage_version")
        high, done = _meta_int(conn, fts.HIGH_WATER), _meta_int(conn, fts.PROGRESS)
        stats["fts_rebuild_high_water"], stats["fts_rebuild_progress"] = high, done
        stats["fts_rebuild_pending"] = high is not None and (done is None or done < high)
    finally:
        conn.close()
    return stats


def logical_size_bytes(conn: sqlite3.Connection) -> int | None:
    """Return the database's size as SQLite counts it (pages times page size), or None if it cannot say."""
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.Error:
        return None
    return pages * size
