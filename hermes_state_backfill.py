"""What the migration ladders' steps do to rows: set-based rewrites of an older file's data.

Owns: the bodies of the data steps (marking subagent rows, seeding per-model usage from the
session totals, un-hiding rows stored with no `active` flag, rebuilding a table in its declared
shape) and the catalogue reads they need (`table_columns`). Each function is one pass of a few
statements, whatever the number of rows.
Does not own: which step runs when and what version it reaches (the registry in
hermes_state_schema), the declared tables (hermes_state_common).

Transaction contract: every function runs inside the caller's write transaction (the ladder's,
one per step) and never opens or commits one itself. Rows already in the shape a step gives
come out unchanged, so running a step twice changes nothing the second time.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import replace

from hermes_state_common import DICTIONARY, recount_sql, sql_literal


def table_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """Return the names of `table`'s columns (hidden ones included), from PRAGMA table_xinfo."""
    return {r[1] for r in conn.execute(f"PRAGMA table_xinfo({table})")}


def default_sql(default: object) -> str:
    """Return SQL for the value a column the file lacks reads as: its declared default, else NULL."""
    return "NULL" if default is None else sql_literal(default)


# --- subagent markers -----------------------------------------------------------------------------
# A delegate subagent's session carries `_delegate_from` in its model_config (the parent's id, or
# ORPHANED once the link is gone); listings hide such rows and deleting the parent takes them.
# Files from before the marker existed get it here. The rule reads only columns and message
# roles, so it is the same on every file: a row whose model_config is not a JSON object (or
# already names a delegate or a branch) is left alone, row by row.
ORPHANED = "__orphaned__"
_MARKABLE_SQL = ("(model_config IS NULL OR CASE WHEN json_valid(model_config) AND json_type(model_config) = 'object' "
                 "THEN json_extract(model_config, '$._delegate_from') IS NULL "
                 "AND json_extract(model_config, '$._branched_from') IS NULL ELSE 0 END)")


def mark_delegate_rows(conn: sqlite3.Connection) -> int:
    """Give `_delegate_from` to the subagent rows of a file older than the marker; return how many.

    A child is a subagent unless its parent ended by compression or by a branch (those children
    are continuations and branches). A root row with no title that holds tool results is a
    subagent whose parent link was lost: it gets ORPHANED.
    """
    linked = conn.execute(
        "UPDATE sessions SET model_config = json_set(COALESCE(model_config, '{}'), '$._delegate_from', "
        f"parent_session_id) WHERE parent_session_id IS NOT NULL AND {_MARKABLE_SQL} AND NOT EXISTS "
        "(SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id "
        "AND p.end_reason IN ('compression', 'branched'))").rowcount
    orphaned = conn.execute(
        "UPDATE sessions SET model_config = json_set(COALESCE(model_config, '{}'), '$._delegate_from', ?) "
        f"WHERE parent_session_id IS NULL AND title IS NULL AND {_MARKABLE_SQL} AND EXISTS "
        "(SELECT 1 FROM messages m WHERE m.session_id = sessions.id AND m.role = 'tool')", (ORPHANED,)).rowcount
    return linked + orphaned


# --- per-model usage --------------------------------------------------------------------------------
_TOKENS = tuple(c.name for c in DICTIONARY["session_model_usage"].columns if c.name.endswith("_tokens"))


def seed_model_usage(conn: sqlite3.Connection) -> int:
    """Give each session that used tokens and has no usage row one row from its totals; return how many.

    The row takes the session's model ('unknown' when it names none), billing route ('' for a
    part not known), counters and costs, seen from the session's start to its end.
    """
    used = " + ".join(f"COALESCE({n}, 0)" for n in _TOKENS)
    return conn.execute(
        "INSERT INTO session_model_usage (session_id, model, billing_provider, billing_base_url, billing_mode, task, "
        f"api_call_count, {', '.join(_TOKENS)}, estimated_cost_usd, actual_cost_usd, cost_status, cost_source, "
        "first_seen, last_seen, updated_at) "
        "SELECT id, COALESCE(NULLIF(model, ''), 'unknown'), COALESCE(billing_provider, ''), "
        "COALESCE(billing_base_url, ''), COALESCE(billing_mode, ''), '', COALESCE(api_call_count, 0), "
        f"{', '.join(f'COALESCE({n}, 0)' for n in _TOKENS)}, COALESCE(estimated_cost_usd, 0), "
        "COALESCE(actual_cost_usd, 0), cost_status, cost_source, started_at, COALESCE(ended_at, started_at), "
        f"COALESCE(ended_at, started_at) FROM sessions s WHERE {used} > 0 "
        "AND NOT EXISTS (SELECT 1 FROM session_model_usage u WHERE u.session_id = s.id)").rowcount


# --- the active flag ------------------------------------------------------------------------------------

def heal_null_active(conn: sqlite3.Connection) -> int:
    """Mark live every message stored with no `active` flag, recounting its sessions; return how many.

    A file whose `active` column was added without a default holds such rows; every read treats
    them as hidden, though no compression ever retired them.
    """
    sessions = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM messages WHERE active IS NULL")]
    if not sessions:
        return 0
    healed = conn.execute("UPDATE messages SET active = 1 WHERE active IS NULL").rowcount
    conn.execute(f"{recount_sql()} WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(sessions),))
    return healed


# --- rebuilding a table in its declared shape ---------------------------------------------------------------

def rebuild_to_declared(conn: sqlite3.Connection, table: str, sources: dict[str, tuple[str, ...]] | None = None,
                        computed: dict[str, str] | None = None) -> None:
    """Rebuild `table` in its declared shape, keeping every row; runs inside the caller's write transaction.

    A declared column takes its value from the column of the same name, else from the first of
    its `sources` (names an older layout gave it) that holds one, else from `computed` (SQL over
    the old row), else its default ('' or 0 for a NOT NULL column without one). Columns the
    declaration does not know are dropped; indexes are rebuilt afterwards by the open.
    """
    have = table_columns(conn, table)
    declared = DICTIONARY[table]
    picks = []
    for column in declared.columns:
        found = [c for c in (column.name, *(sources or {}).get(column.name, ())) if c in have]
        fallback = (computed or {}).get(column.name, default_sql(column.default))
        if fallback == "NULL" and "NOT NULL" in column.constraint:
            fallback = "''" if column.type == "TEXT" else "0"
        picks.append(f"COALESCE({', '.join(found)}, {fallback})" if found else fallback)
    rebuilt = f"{table}_rebuilt"
    conn.execute(replace(declared, name=rebuilt).sql)
    conn.execute(f"INSERT INTO {rebuilt} ({', '.join(declared.column_names)}) SELECT {', '.join(picks)} FROM {table}")
    conn.execute(f"DROP TABLE {table}")
    conn.execute(f"ALTER TABLE {rebuilt} RENAME TO {table}")


def table_pk(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """Return the primary-key columns of `table` as the file has them, in key order."""
    return tuple(r[1] for r in sorted((r for r in conn.execute(f"PRAGMA table_info({table})") if r[5]),
                                      key=lambda r: r[5]))


def declared_pk(table: str) -> tuple[str, ...]:
    """Return the primary-key columns the data dictionary declares for `table`."""
    declared = DICTIONARY[table]
    for constraint in declared.constraints:
        if constraint.startswith("PRIMARY KEY"):
            return tuple(c.strip() for c in constraint[constraint.index("(") + 1:constraint.rindex(")")].split(","))
    return tuple(c.name for c in declared.columns if "PRIMARY KEY" in c.constraint)


# The columns earlier releases of this library invented for async_delegations, by the real
# column each stands for; a file hermes-agent made and such a release upgraded has both, the
# invented ones empty.
INVENTED_DELEGATION_COLUMNS = {"delegation_id": ("id",), "origin_session": ("origin_session_id",),
                               "task_json": ("payload_json",), "dispatched_at": ("created_at", "updated_at"),
                               "updated_at": ("created_at",)}


def adopt_real_tables(conn: sqlite3.Connection) -> None:
    """Rebuild async_delegations and session_model_usage in the real shape, keeping their rows.

    A delegation's id, origin, payload and creation time move to delegation_id, origin_session,
    task_json and dispatched_at; a finished one gets completed_at. Usage rows get the real key
    (session, model, billing provider, base URL, mode, task), with '' for the billing parts.
    """
    invented = {old for olds in INVENTED_DELEGATION_COLUMNS.values() for old in olds} - {"updated_at"}
    if invented & table_columns(conn, "async_delegations"):
        rebuild_to_declared(conn, "async_delegations", sources=INVENTED_DELEGATION_COLUMNS, computed={
            "completed_at": "CASE WHEN state IN ('completed', 'failed', 'cancelled') THEN updated_at END"})
    if table_pk(conn, "session_model_usage") != declared_pk("session_model_usage"):
        rebuild_to_declared(conn, "session_model_usage", sources={"first_seen": ("updated_at",),
                                                                  "last_seen": ("updated_at",)})
