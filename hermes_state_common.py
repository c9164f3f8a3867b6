"""Shared ground of hermes-state: the declared schema, constants and small text/JSON helpers.

Owns: `SCHEMA_SQL` (the declared shape of every table created at open), `SCHEMA_VERSION`,
the column lists, the timing constants' default values, JSON/text helpers, `escape_like`,
`split_sql` and `row_dicts`.
Does not own: transactions (hermes_state_writer), migrations (hermes_state_schema), FTS
objects (hermes_state_fts), any query. Runs no SQL of its own. Imports only hermes_state_errors.
"""
from __future__ import annotations

import json
import logging
import math
import re
import reprlib
import sqlite3
from typing import Any

# The library's one logger; applications route it (see configure_error_log).
logger = logging.getLogger("hermes_state")

SCHEMA_VERSION = 31  # the real system's numbering; this library's own revisions: see hermes_state_schema

# Default values of the timing policy. SessionDB copies them as class attributes and reads
# them at call time, so applications and tests tune them there, not here.
WRITE_PATIENCE_S = 20.0             # ordinary writes
TRANSCRIPT_WRITE_PATIENCE_S = 60.0  # message appends: a failure ends the agent's turn
ACTIVITY_WRITE_PATIENCE_S = 0.5     # best-effort bookkeeping that must never stall a turn
WRITE_RETRY_MIN_S, WRITE_RETRY_MAX_S = 0.020, 0.150             # jitter while the wait is young
WRITE_RETRY_SLOW_MIN_S, WRITE_RETRY_SLOW_MAX_S = 0.250, 1.000   # jitter after the fast window
WRITE_RETRY_FAST_WINDOW_S = 2.0
CHECKPOINT_EVERY_N_WRITES = 50
READ_BUSY_TIMEOUT_S = 5.0    # a read-only open waits this long once, then reports busy
SQLITE_BUSY_TIMEOUT_S = 1.0  # SQLite's own wait per attempt; the writer retries above it
# Page size of a new file. Message rows are often 1-4 KB; on 4 KB pages a fifth of each table
# page is left empty around them, on 8 KB pages about a tenth. An existing file keeps its size.
PAGE_SIZE = 8192

# --- declared schema -------------------------------------------------------------------------
# Each table is (name, columns, constraints). Columns are (name, declaration). The same lists
# build SCHEMA_SQL and drive _reconcile_columns(), so a new column is added in one place.

SESSIONS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "TEXT PRIMARY KEY"),
    ("source", "TEXT NOT NULL"),
    ("user_id", "TEXT"),
    ("model", "TEXT"),
    ("model_config", "TEXT"),
    ("system_prompt", "TEXT"),
    ("parent_session_id", "TEXT REFERENCES sessions(id)"),
    ("started_at", "REAL NOT NULL"),
    ("ended_at", "REAL"),
    ("end_reason", "TEXT"),
    ("message_count", "INTEGER DEFAULT 0"),
    ("tool_call_count", "INTEGER DEFAULT 0"),
    ("input_tokens", "INTEGER DEFAULT 0"),
    ("output_tokens", "INTEGER DEFAULT 0"),
    ("cache_read_tokens", "INTEGER DEFAULT 0"),
    ("cache_write_tokens", "INTEGER DEFAULT 0"),
    ("reasoning_tokens", "INTEGER DEFAULT 0"),
    ("billing_provider", "TEXT"),
    ("billing_base_url", "TEXT"),
    ("billing_mode", "TEXT"),
    ("estimated_cost_usd", "REAL"),
    ("actual_cost_usd", "REAL"),
    ("cost_status", "TEXT"),
    ("cost_source", "TEXT"),
    ("pricing_version", "TEXT"),
    ("title", "TEXT"),
    ("api_call_count", "INTEGER DEFAULT 0"),
    ("session_key", "TEXT"),
    ("chat_id", "TEXT"),
    ("chat_type", "TEXT"),
    ("thread_id", "TEXT"),
    ("display_name", "TEXT"),
    ("origin_json", "TEXT"),
    ("expiry_finalized", "INTEGER DEFAULT 0"),
    ("cwd", "TEXT"),
    ("git_branch", "TEXT"),
    ("git_repo_root", "TEXT"),
    ("handoff_state", "TEXT"),
    ("handoff_platform", "TEXT"),
    ("handoff_error", "TEXT"),
    ("compression_failure_cooldown_until", "REAL"),
    ("compression_failure_error", "TEXT"),
    ("profile_name", "TEXT"),
    ("transport_profile", "TEXT"),
    ("rewind_count", "INTEGER DEFAULT 0"),
    ("archived", "INTEGER DEFAULT 0"),
    ("auto_archived", "INTEGER DEFAULT 0"),
    ("pinned", "INTEGER DEFAULT 0"),
    ("title_source", "TEXT"),
    ("last_activity_at", "REAL"),
)

MESSAGES_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "INTEGER PRIMARY KEY AUTOINCREMENT"),
    ("session_id", "TEXT NOT NULL REFERENCES sessions(id)"),
    ("role", "TEXT NOT NULL"),
    ("content", "TEXT"),
    ("tool_call_id", "TEXT"),
    ("tool_calls", "TEXT"),
    ("tool_name", "TEXT"),
    ("timestamp", "REAL NOT NULL"),
    ("token_count", "INTEGER"),
    ("finish_reason", "TEXT"),
    ("reasoning", "TEXT"),
    ("reasoning_content", "TEXT"),
    ("reasoning_details", "TEXT"),
    ("codex_reasoning_items", "TEXT"),
    ("codex_message_items", "TEXT"),
    ("effect_disposition", "TEXT"),
    ("platform_message_id", "TEXT"),
    ("observed", "INTEGER DEFAULT 0"),
    ("active", "INTEGER DEFAULT 1"),
    ("compacted", "INTEGER DEFAULT 0"),
    ("api_content", "TEXT"),
    ("display_kind", "TEXT"),
    ("display_metadata", "TEXT"),
    ("message_uid", "TEXT"),
    ("absorbed_message_uids", "TEXT"),
    ("tool_call_uids", "TEXT"),
    ("tool_call_uid", "TEXT"),
    ("content_parts", "TEXT"),
)

TABLES: tuple[tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]], ...] = (
    ("sessions", SESSIONS_COLUMNS, ()),
    ("messages", MESSAGES_COLUMNS, ()),
    ("session_model_usage", (
        ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE"),
        ("model", "TEXT NOT NULL"),
        ("task", "TEXT NOT NULL DEFAULT ''"),
        ("input_tokens", "INTEGER DEFAULT 0"),
        ("output_tokens", "INTEGER DEFAULT 0"),
        ("cache_read_tokens", "INTEGER DEFAULT 0"),
        ("cache_write_tokens", "INTEGER DEFAULT 0"),
        ("reasoning_tokens", "INTEGER DEFAULT 0"),
        ("estimated_cost_usd", "REAL DEFAULT 0"),
        ("api_call_count", "INTEGER DEFAULT 0"),
        ("updated_at", "REAL"),
    ), ("PRIMARY KEY (session_id, model, task)",)),
    ("state_meta", (
        ("key", "TEXT PRIMARY KEY"),
        ("value", "TEXT"),
    ), ()),
    ("gateway_routing", (
        ("scope", "TEXT NOT NULL"),
        ("session_key", "TEXT NOT NULL"),
        ("entry_json", "TEXT NOT NULL"),
        ("updated_at", "REAL"),
    ), ("PRIMARY KEY (scope, session_key)",)),
    ("compression_locks", (
        ("session_id", "TEXT PRIMARY KEY"),
        ("holder", "TEXT NOT NULL"),
        ("acquired_at", "REAL NOT NULL"),
        ("expires_at", "REAL NOT NULL"),
    ), ()),
    ("async_delegations", (
        ("id", "TEXT PRIMARY KEY"),
        ("origin_session_id", "TEXT NOT NULL"),
        ("target", "TEXT"),
        ("state", "TEXT NOT NULL DEFAULT 'pending'"),
        ("payload_json", "TEXT"),
        ("result_json", "TEXT"),
        ("created_at", "REAL"),
        ("updated_at", "REAL"),
    ), ()),
    ("runtime_epoch", (
        ("id", "INTEGER PRIMARY KEY CHECK (id = 1)"),
        ("epoch", "INTEGER NOT NULL"),
        ("instance_id", "TEXT"),
        ("pid", "INTEGER"),
        ("started_at", "REAL"),
    ), ()),
    ("session_admissions", (
        ("id", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT"),
        ("admission_key", "TEXT"),
        ("payload_json", "TEXT"),
        ("state", "TEXT NOT NULL DEFAULT 'queued'"),
        ("epoch", "INTEGER"),
        ("resolution", "TEXT"),
        ("created_at", "REAL"),
        ("started_at", "REAL"),
        ("finished_at", "REAL"),
    ), ()),
    ("worker_executions", (
        ("id", "INTEGER PRIMARY KEY AUTOINCREMENT"),
        ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT"),
        ("kind", "TEXT NOT NULL"),
        ("state", "TEXT NOT NULL DEFAULT 'running'"),
        ("epoch", "INTEGER"),
        ("started_at", "REAL"),
        ("finished_at", "REAL"),
    ), ()),
    ("worker_receipts", (
        ("execution_id", "INTEGER NOT NULL REFERENCES worker_executions(id) ON DELETE RESTRICT"),
        ("session_id", "TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT"),
        ("seq", "INTEGER NOT NULL"),
        ("payload_json", "TEXT NOT NULL"),
        ("digest", "TEXT NOT NULL"),
        ("recorded_at", "REAL"),
    ), ("PRIMARY KEY (execution_id, seq)",)),
    ("schema_version", (
        ("version", "INTEGER NOT NULL"),
    ), ()),
)

# The input marker of a message (see input ownership in docs/gateway.md), as one expression:
# the index below and every lookup must spell it identically for SQLite to use the index.
# json_valid first, so a row written with malformed display_metadata is indexed as NULL
# instead of failing its insert.
INPUT_MARKER_SQL = ("CASE WHEN json_valid(display_metadata) "
                    "THEN json_extract(display_metadata, '$.input_marker') END")
# The states in which an admission still occupies its session's queue.
LIVE_ADMISSION_SQL = "state IN ('queued', 'started', 'unknown')"

INDEX_SQL: tuple[str, ...] = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_sessions_key ON sessions(session_key, started_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id)",
    "CREATE INDEX IF NOT EXISTS idx_messages_uid ON messages(message_uid)",
    "CREATE INDEX IF NOT EXISTS idx_admissions_session ON session_admissions(session_id, id)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_admissions_key ON session_admissions(session_id, admission_key)"
    " WHERE admission_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_executions_session ON worker_executions(session_id, state)",
    "CREATE INDEX IF NOT EXISTS idx_receipts_session ON worker_receipts(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_delegations_origin ON async_delegations(origin_session_id)",
    # A queue's head is found without walking the session's finished admissions.
    f"CREATE INDEX IF NOT EXISTS idx_admissions_live ON session_admissions(session_id, id) WHERE {LIVE_ADMISSION_SQL}",
    # The exception-path writer finds an inbound message by its marker alone, reading no bodies.
    f"CREATE INDEX IF NOT EXISTS idx_messages_input_marker ON messages({INPUT_MARKER_SQL}) "
    "WHERE display_metadata IS NOT NULL",
)

# The gateway outbox: created by hermes_state_routing on first use, never at open.
DELIVERY_OBLIGATIONS_SQL = """CREATE TABLE IF NOT EXISTS delivery_obligations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    obligation_key TEXT UNIQUE,
    payload_json TEXT NOT NULL,
    platform TEXT,
    chat_id TEXT,
    thread_id TEXT,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    fence INTEGER NOT NULL DEFAULT 0,
    recovered INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at REAL,
    updated_at REAL
)"""


def table_sql(name: str, columns: tuple[tuple[str, str], ...], constraints: tuple[str, ...] = ()) -> str:
    """Return the CREATE TABLE IF NOT EXISTS statement for one declared table."""
    body = ",\n    ".join([f"{c} {d}" for c, d in columns] + list(constraints))
    return f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n)"


TABLE_SQL: tuple[str, ...] = tuple(table_sql(*t) for t in TABLES)
# Indexes earlier versions created and an upgrade drops: idx_messages_session serves what
# idx_messages_session_active (session_id, active, timestamp) did; it took about 5% of a file.
RETIRED_INDEXES: tuple[str, ...] = ("idx_messages_session_active",)

SCHEMA_SQL = ";\n\n".join(TABLE_SQL + INDEX_SQL) + ";\n"
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {name: tuple(c for c, _ in cols) for name, cols, _ in TABLES}
SESSION_COLUMN_NAMES = frozenset(TABLE_COLUMNS["sessions"])
MESSAGE_COLUMN_NAMES = frozenset(TABLE_COLUMNS["messages"])
JSON_MESSAGE_FIELDS = ("tool_calls", "reasoning_details", "codex_reasoning_items", "codex_message_items",
                       "display_metadata", "absorbed_message_uids", "tool_call_uids", "content_parts")


# --- value checks ------------------------------------------------------------------------------
# One small family of validators, so every API refuses the same bad numbers the same way.

# SQLite's INTEGER is a signed 64-bit value; Python ints outside it fail at bind time.
INT_MIN, INT_MAX = -2**63, 2**63 - 1

# Error messages quote the bad value, cut short: a plain repr() of a deeply nested list raises
# RecursionError, and one of a huge string floods the message.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 60, 60


def shown(value: Any) -> str:
    """Return a short repr of `value` for an error message; never raises, however deep or large the value."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not replace the error being reported
        return f"<{type(value).__name__}>"


def is_finite(value: Any) -> bool:
    """Return True for an int or float that is a finite number (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def check_count(name: str, value: Any) -> int:
    """Return `value` when it is a non-negative 64-bit integer, else raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, not {shown(value)}")
    if value > INT_MAX:
        raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
    return value


def check_number(name: str, value: Any, *, positive: bool = False) -> float:
    """Return `value` as a float when it is finite and >= 0 (> 0 with `positive`), else raise ValueError."""
    if not is_finite(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {kind} finite number, not {shown(value)}")
    return float(value)


def has_surrogate(text: str) -> bool:
    """Return True when `text` holds a lone surrogate (SQLite cannot store or look it up)."""
    return not text.isascii() and _SURROGATES.search(text) is not None


def check_id(name: str, value: Any, *, optional: bool = False) -> Any:
    """Return `value` when it is a non-empty string SQLite can store (or None, when `optional`), else raise ValueError."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, not {shown(value)}")
    if has_surrogate(value):
        raise ValueError(f"{name} contains a lone surrogate (U+D800..U+DFFF), which cannot be stored")
    return value


def check_scalar(name: str, value: Any) -> Any:
    """Return `value` if SQLite stores it faithfully (None, str, bool, 64-bit int, non-NaN float)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"{name} = {value} is out of range: SQLite integers are signed 64-bit")
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"{name} cannot be NaN (SQLite would store NULL)")
        return value
    raise ValueError(f"{name} must be a str, int, float, bool or None, not {type(value).__name__}")


# --- text and JSON helpers --------------------------------------------------------------------

_SURROGATES = re.compile("[\ud800-\udfff]")


def strip_surrogates(text: str | None) -> str | None:
    """Remove lone surrogates (sqlite3 cannot bind them); leave everything else byte for byte."""
    if text is None or not isinstance(text, str):
        return text
    return _SURROGATES.sub("", text) if _SURROGATES.search(text) else text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not standard JSON")


def _model_dump(obj: Any) -> Any:
    # Provider SDK objects (pydantic models such as the openai package's tool calls) dump
    # themselves; duck-typed, so the library imports neither the SDK nor pydantic.
    dump = getattr(obj, "model_dump", None)
    if callable(dump) and not isinstance(obj, type):
        return dump(mode="json", exclude_none=True)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def encode_json(value: Any, field: str) -> str | None:
    """Serialise `value` for a JSON column; raise ValueError naming `field` when it cannot be.

    A str that parses as (standard) JSON is taken as already serialised and stored as it is,
    since callers pass provider payloads pre-encoded; so "123" reads back as the int 123. Any
    other str is encoded as a JSON string, so it reads back as that same str. Objects with a
    `model_dump()` method (pydantic models, e.g. provider SDK types), at any depth, are stored
    as their JSON dump without None fields.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            json.loads(value, parse_constant=_reject_constant)  # NaN/Infinity are not JSON text
        except ValueError:
            return strip_surrogates(json.dumps(value, ensure_ascii=False))
        except RecursionError as exc:
            raise ValueError(f"{field} is nested too deeply to store as JSON") from exc
        return strip_surrogates(value)
    try:
        return strip_surrogates(json.dumps(value, ensure_ascii=False, default=_model_dump))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ValueError(f"{field} is nested too deeply to store as JSON") from exc


def decode_json(text: Any) -> Any:
    """Decode a JSON column; return the text itself when it is not valid JSON."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python can decode
        return text


def escape_like(text: str, escape: str = "\\") -> str:
    """Escape `%`, `_` and the escape character for a LIKE pattern using ESCAPE `escape`."""
    return text.replace(escape, escape * 2).replace("%", escape + "%").replace("_", escape + "_")


def split_sql(script: str) -> list[str]:
    """Split an SQL script into complete statements (never use executescript inside a transaction)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip().strip(";").strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


def row_dicts(cur: sqlite3.Cursor) -> list[dict[str, Any]]:
    """Return the cursor's remaining rows as dicts keyed by column name."""
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
