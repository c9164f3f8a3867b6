"""Shared ground of hermes-state: the data dictionary with each column's value rule, the declared schema, constants.

Owns: the data dictionary (`DICTIONARY`: every table's columns with their type, default, value
rule and JSON flag; which rows belong to a session; what recover and export do with a table;
how the session counters are recounted), the value rules themselves (`COLUMN_RULES` and the
checks they are made of: `check_id`, `check_count`, `check_number`, `is_uid`, JSON encoding and
decoding, lone surrogates replaced), `SCHEMA_SQL` generated from the dictionary, `SCHEMA_VERSION`,
`check_stored` (an imported value), `decoded` (a row with its JSON columns decoded as declared).
It also holds the ground floor under the dictionary: the library's one logger, the timing
policy's default values (`WRITE_PATIENCE_S`, ...), `PAGE_SIZE`, `DAY_S`, `Keywords`, SQLite's
integer range, the lone-surrogate pattern and `LENIENT_TEXT`, and the SQL and text helpers
(`split_sql`, `row_dicts`, `object_exists`/`table_exists` (the one catalogue read), `escape_like`,
`contains_sql`/`prefix_range`, `strip_surrogates`, `check_scalar`, `shown`).
Does not own: transactions (hermes_state_writer), migrations (hermes_state_schema), FTS
objects (hermes_state_fts), any query. Runs no SQL of its own beyond the catalogue read.
Imports only the standard library, so a write checks its values without leaving this module.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import reprlib
import sqlite3
from dataclasses import dataclass
from json.scanner import make_scanner
from typing import Any, Callable, cast

# --- the ground floor: the logger, timing defaults, SQL and text helpers --------------------------

# The library's one logger; applications route it (see configure_error_log). Its NullHandler keeps
# Python's last-resort handler from printing the library's warnings on stderr of a program that has
# not configured logging, as the logging HOWTO advises a library to do.
logger = logging.getLogger("hermes_state")
logger.addHandler(logging.NullHandler())

# Default values of the timing policy. SessionDB copies them as class attributes and reads
# them at call time, so applications and tests tune them there, not here.
WRITE_PATIENCE_S = 20.0             # ordinary writes
TRANSCRIPT_WRITE_PATIENCE_S = 60.0  # message appends: a failure ends the agent's turn
ACTIVITY_WRITE_PATIENCE_S = 0.5     # best-effort bookkeeping that must never stall a turn
WRITE_RETRY_MIN_S, WRITE_RETRY_MAX_S = 0.020, 0.150             # jitter while the wait is young
WRITE_RETRY_SLOW_MIN_S, WRITE_RETRY_SLOW_MAX_S = 0.250, 1.000   # jitter after the fast window
WRITE_RETRY_FAST_WINDOW_S = 2.0
CHECKPOINT_EVERY_N_WRITES = 50
# The log length, in frames, past which the checkpoint thread is treated as behind: SQLite's own
# automatic checkpoint threshold (wal_autocheckpoint's default). See docs/scaling.md, "How long the log gets".
WAL_BEHIND_FRAMES = 1000
READ_BUSY_TIMEOUT_S = 5.0    # a read-only open waits this long once, then reports busy
SQLITE_BUSY_TIMEOUT_S = 1.0  # SQLite's own wait per attempt; the writer retries above it
# How long a transcript write waits for another holder's compression before giving up.
COMPRESSION_WAIT_S = 5.0
# The full-text indexes' upkeep (hermes_state_fts does it): a bounded merge every this many writes.
FTS_MERGE_EVERY_N_WRITES = 1000
# A whole-index optimize from the write path, every this many writes of one handle (0: never).
# It rewrites every index while holding the write lock, about 65 microseconds per stored
# message (over a second at 20,000 messages), so it is rare by default: the bounded merge
# above already keeps the segment count low. See docs/search.md.
FTS_OPTIMIZE_EVERY_N_WRITES = 1_000_000
# An older file at least this large (log included) is copied and upgraded after a writable open
# returns, not inside it: its copy and upgrade take about a second per 100 MB on the bench machine.
UPGRADE_IN_BACKGROUND_BYTES = 128 << 20
UPGRADE_COPY_KEEP_DAYS = 30.0      # a pre-upgrade copy is kept this long after its upgrade (the newest two at most)
FTS_REBUILD_CHUNK_ROWS = 2000  # the most messages per rebuild transaction (long rows make chunks smaller)
# Page size of a new file. Message rows are often 1-4 KB; on 4 KB pages a fifth of each table
# page is left empty around them, on 8 KB pages about a tenth. An existing file keeps its size.
PAGE_SIZE = 8192
# Each connection's page cache, in KiB (SQLite's default is 2,000). A search reads the newest
# matching rows of a 1-4 KB-row table: a few thousand pages that SQLite's default cache cannot
# hold, so every query read them again from the OS. The cache grows only as pages are read.
CACHE_SIZE_KIB = 16384
# SQLite's soft heap limit for the whole process, in KiB, set by the first connection when the
# program has set none (0: never set). Many handles in one process (a gateway holding a profile
# each) would otherwise keep up to two full caches apiece; past this limit SQLite reuses a
# connection's own cache pages instead of taking more memory. Soft: no allocation ever fails.
SOFT_HEAP_LIMIT_KIB = 49152
DAY_S = 86400.0  # seconds in a day, for the day-counted policies (pruning, the idle sweep)


def has_wal_reset_bug(version: tuple[int, int, int]) -> bool:
    """Tell whether SQLite `version` has the WAL-reset bug (3.7.0 to 3.51.2; fixed in 3.51.3, 3.50.7 and 3.44.6)."""
    if not (3, 7, 0) <= version < (3, 51, 3):
        return False
    return not ((3, 50, 7) <= version < (3, 51, 0) or (3, 44, 6) <= version < (3, 45, 0))


# SQLite documents a race in these versions: two connections checkpointing, or one checkpointing
# while another's commit starts the log over, can leave the log's index wrong, and a later
# checkpoint then skips committed pages (sqlite.org/wal.html, "the WAL-reset bug"). The library
# reads the linked version once; on an affected build a process never gets a second checkpointing
# connection of the library's own.
WAL_RESET_BUG = has_wal_reset_bug(sqlite3.sqlite_version_info)


def is_sqlite_wal_reset_vulnerable(version_info: tuple | None = None) -> bool:
    """Tell whether SQLite `version_info` (default: the linked one) has the WAL-reset bug (hermes-agent's name)."""
    if version_info is None:
        return WAL_RESET_BUG
    # A shorter tuple counts its missing parts as 0, as a version string "3.51" means 3.51.0.
    parts = [int(part) for part in tuple(version_info)[:3]]
    major, minor, patch = parts + [0] * (3 - len(parts))
    return has_wal_reset_bug((major, minor, patch))


def sqlite_source_id() -> str:
    """Return the linked SQLite's source id (its check-in date and hash), or "" when it cannot be read."""
    try:
        conn = sqlite3.connect(":memory:")  # a private in-memory database: no file is touched
        try:
            return str(conn.execute("SELECT sqlite_source_id()").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return ""


def wal_reset_advice() -> str:
    """Return the sentence that says the linked SQLite has the WAL-reset bug, what the library does, and the remedy."""
    return (f"the SQLite this Python links ({sqlite3.sqlite_version}) has the WAL-reset bug (3.7.0 to 3.51.2), "
            "which can corrupt a WAL database when two connections checkpoint or write at the same moment; "
            "hermes-state therefore runs every checkpoint on the writing connection itself, but other "
            "processes sharing the file can still meet it. Remedy: a Python whose sqlite3 links SQLite "
            "3.51.3 or newer (or the fixed 3.50.7 / 3.44.6); pysqlite3-binary 0.5.4 bundles 3.51.1, which is "
            "still affected")

# A module function's dict parameter that its public method takes as keyword arguments:
# `db.update_session(sid, title="x")` reaches `update_session(conn, sid, columns={"title": "x"})`.
# The facade's method table reads this annotation (`Keywords`, or `Keywords | None`) from the
# function's signature, so the function itself declares which parameter that is.
Keywords = dict[str, Any]

# SQLite's INTEGER is a signed 64-bit value; Python ints outside it fail at bind time.
INT_MIN, INT_MAX = -2**63, 2**63 - 1
# A lone surrogate code point: sqlite3 can neither bind one nor find a row by it.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Stored text decoded leniently: another client can store any bytes as TEXT, and a byte that is not
# UTF-8 becomes U+FFFD. C code (no Python runs per value), so it serves as a connection's
# text_factory and as the decoder of the text the library's SQL functions receive as bytes.
LENIENT_TEXT = functools.partial(str, encoding="utf-8", errors="replace")

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


def strip_surrogates(text: str | None) -> str | None:
    """Remove lone surrogates (sqlite3 cannot bind them); leave everything else byte for byte."""
    if text is None or not isinstance(text, str):
        return text
    return LONE_SURROGATE.sub("", text) if LONE_SURROGATE.search(text) else text


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


def contains_sql(column: str) -> str:
    """Return SQL true when `column` contains the bound text, ASCII letters case-insensitive (as LIKE '%x%')."""
    # instr, not LIKE: SQLite refuses a LIKE pattern over 50,000 bytes, and instr needs no escaping.
    return f"COALESCE(instr(lower({column}), lower(?)), 0) > 0"


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """Return (low, high): the texts starting with `prefix` are those >= low and < high (None: no bound)."""
    # SQLite compares text as UTF-8 bytes, which orders as code points: the next text after every
    # one starting with `prefix` is `prefix` with its last character moved one on.
    head = prefix
    while head:
        last = ord(head[-1]) + 1
        if last == 0xD800:
            last = 0xE000  # surrogates cannot be stored
        if last <= 0x10FFFF:
            return prefix, head[:-1] + chr(last)
        head = head[:-1]
    return prefix, None


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


def object_exists(conn: sqlite3.Connection, kind: str, name: str) -> bool:
    """Tell whether the database of `conn` has a `kind` (table, view, index, trigger) named `name`."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = ? AND name = ?", (kind, name)).fetchone() is not None


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    """Tell whether the database of `conn` has a table named `name` (a catalogue read)."""
    return object_exists(conn, "table", name)


SCHEMA_VERSION = 31  # the real system's numbering; this library's own revisions: see hermes_state_schema

# --- the value rules ---------------------------------------------------------------------------
# What a caller's value for a column must be, and how it is stored: one small family of checks,
# so every API refuses the same bad values the same way. Column.rule names one of COLUMN_RULES.

def replace_surrogates(text: str | None) -> str | None:
    """Replace each lone surrogate with U+FFFD (sqlite3 cannot bind one); leave everything else as it is.

    Stored text keeps a visible mark where the unstorable code point was, so scraped text
    with one bad character is kept rather than refused.
    """
    if text is None or not isinstance(text, str) or text.isascii():
        return text
    return LONE_SURROGATE.sub("\ufffd", text) if LONE_SURROGATE.search(text) else text


def has_surrogate(text: str) -> bool:
    """Return True when `text` holds a lone surrogate (SQLite cannot store or look it up)."""
    return not text.isascii() and LONE_SURROGATE.search(text) is not None


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
            return replace_surrogates(json.dumps(value, ensure_ascii=False))
        except RecursionError as exc:
            raise ValueError(f"{field} is nested too deeply to store as JSON") from exc
        return replace_surrogates(value)
    try:
        return replace_surrogates(json.dumps(value, ensure_ascii=False, default=_model_dump))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} is not JSON-serialisable: {exc}") from exc
    except RecursionError as exc:
        raise ValueError(f"{field} is nested too deeply to store as JSON") from exc


def decode_json(text: Any) -> Any:
    """Decode a JSON column; return the text itself when it is not valid JSON."""
    if not isinstance(text, str):
        return text
    try:
        value, end = _scan_value(text, 0)
        if end == len(text):
            return value
    except StopIteration:  # no value right at the start: leading whitespace, or not JSON
        pass
    except (ValueError, RecursionError):
        return text
    try:  # json.loads itself: it skips surrounding whitespace and refuses text after the value
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past what Python can decode
        return text


# json.loads without its per-call layers (the whitespace matches, the type checks) for the common
# case, a column holding exactly one JSON value: a 33,000-message session decodes thousands of them.
# (The cast: the type stubs declare another argument type than the decoder the scanner takes.)
_scan_value: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))


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


def check_id(name: str, value: Any, *, optional: bool = False) -> Any:
    """Return `value` when it is a non-empty string SQLite can store (or None, when `optional`), else raise ValueError."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, not {shown(value)}")
    if has_surrogate(value):
        raise ValueError(f"{name} contains a lone surrogate (U+D800..U+DFFF), which cannot be stored")
    return value


_UID = re.compile(r"[0-9a-f]{32}")


def is_uid(value: Any) -> bool:
    """Tell whether `value` has the form of a message uid (32 lowercase hex digits)."""
    return isinstance(value, str) and _UID.fullmatch(value) is not None


# Rows written by older programs may lack a message_uid. They get a stable one derived from
# where they live (the version 5 UUID of "<session id>/<row id>" in this namespace), so a copy
# made from the conversation keeps naming the same message, replay across a compression seam
# shows it once, and the upgrade's back-fill stores the very uid readers were shown before it.
_DERIVED_UID_NAMESPACE = bytes.fromhex("5b0c3f522d7e4f8a9a357c1e0e6f4a21")


def derived_uid(session_id: str | bytes, row_id: int) -> str:
    """Return the stable uid of a stored row that has none: as `uuid.uuid5(namespace, f"{session_id}/{row_id}").hex`."""
    import hashlib  # here, not at start-up: few calls need it
    place = session_id if isinstance(session_id, bytes) else session_id.encode()
    raw = bytearray(hashlib.sha1(_DERIVED_UID_NAMESPACE + place + f"/{row_id}".encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


def new_uid() -> str:
    """Return a fresh uid: a random (version 4) UUID as 32 lowercase hex digits, as `uuid.uuid4().hex` gives."""
    # The same 122 random bits and the same version and variant bits as uuid.uuid4(), without
    # building a UUID object (a third of the time; every message and tool call takes one).
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


# Each rule returns the value as stored or raises ValueError naming the column; None never
# reaches one (it stores NULL).

def _as_text(name: str, value: Any) -> str:
    if type(value) is str and value.isascii():
        return value  # the common case: a C-speed scan, and only non-ASCII text can hold a lone surrogate
    if isinstance(value, str):
        return cast(str, replace_surrogates(value))  # text in, text out
    raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")


def _as_platform_id(name: str, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # platforms hand out numeric ids; the column is TEXT
    return _as_text(name, value)


def _as_time(name: str, value: Any) -> float:
    if not is_finite(value):
        raise ValueError(f"{name} must be a finite number of epoch seconds, not {shown(value)}")
    return float(value)


def _as_flag(name: str, value: Any) -> int:
    if value not in (0, 1) or not isinstance(value, (bool, int)):
        raise ValueError(f"{name} must be a bool (or 0/1), not {shown(value)}")
    return int(value)


def _as_json_text(name: str, value: Any) -> str | None:
    # Text is kept as given (the caller's own serialisation); anything else is encoded.
    return value if isinstance(value, str) else encode_json(value, name)


def _as_uid(name: str, value: Any) -> str:
    text = _as_text(name, value)
    if not is_uid(text):
        raise ValueError(f"{name} must be 32 lowercase hex digits, not {shown(text)}")
    return text


COLUMN_RULES: dict[str, Callable[[str, Any], Any]] = {
    "text": _as_text, "platform_id": _as_platform_id, "uid": _as_uid, "flag": _as_flag,
    "count": check_count, "number": check_number, "time": _as_time,
    "json": lambda name, value: encode_json(value, name), "json_text": _as_json_text,
}


# --- the data dictionary -------------------------------------------------------------------------
# Every fact about a table lives here, once: its columns (type, constraint, default, the rule a
# caller's value passes, whether it holds JSON), whether its rows belong to a session, what
# `recover` and export do with it, and how the session counters are recounted. SCHEMA_SQL, the
# column reconciliation, deletion, pruning, import, recover and the ladder all read it.

def sql_literal(value: Any) -> str:
    """Return `value` (an int, float or str) as an SQL literal."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


# How a column's rule is chosen when it names none: by the value's storage class.
_RULE_BY_TYPE = {"TEXT": "text", "INTEGER": "count", "REAL": "number"}


@dataclass(frozen=True)
class Column:
    """One declared column: SQL type, constraint and default, the rule a caller's value passes, JSON or not."""

    name: str
    type: str                  # TEXT, INTEGER or REAL: the storage class its values must have
    constraint: str = ""       # PRIMARY KEY, NOT NULL, REFERENCES ..., as SQL
    default: Any = None        # what an insert that leaves it out stores (None: no DEFAULT clause)
    rule: str | None = ""      # a key of COLUMN_RULES; "" picks one by type; None: only the library sets it
    json: bool = False         # holds JSON text, which reads decode

    def __post_init__(self) -> None:
        if self.rule == "":
            object.__setattr__(self, "rule", _RULE_BY_TYPE[self.type])

    @property
    def declaration(self) -> str:
        """Return the column's SQL declaration as CREATE TABLE takes it."""
        default = "" if self.default is None else f"DEFAULT {sql_literal(self.default)}"
        return " ".join(p for p in (self.type, self.constraint, default) if p)

    def check(self, value: Any) -> Any:
        """Return a caller's (non-None) value as stored, or raise ValueError naming the column."""
        return COLUMN_RULES[self.rule](self.name, value)  # type: ignore[index]  # only columns with a rule are checked

    def checker(self) -> Callable[[Any], Any]:
        """Return `check` as one call (the rule bound to the column's name), for a path that checks many values."""
        return functools.partial(COLUMN_RULES[self.rule], self.name)  # type: ignore[index]


@dataclass(frozen=True)
class Counter:
    """A session counter kept from its messages: which rows count and what each adds, in SQL and in Python.

    `where` and `each` are SQL over `m`, a messages row; `adds(role, tool_calls)` is the same rule
    for one live row about to be written (tool_calls decoded). Both forms sit here side by side.
    """

    column: str
    where: str
    each: str
    adds: Callable[[str, Any], int]


@dataclass(frozen=True)
class Table:
    """One declared table and what the library does with its rows."""

    name: str
    columns: tuple[Column, ...]
    constraints: tuple[str, ...] = ()
    # Rows belong to a session: an SQL expression giving the id of a row's session. Deleting and
    # pruning a session remove them; an import that replaces it rewrites those it exports.
    owner: str | None = None
    # (column, table): rows also belong to the session of the row of `table` whose id the column holds.
    owner_via: tuple[str, str] | None = None
    # What `recover` does: "verify" (copy, check the count), "copy", "exclude" (never copied, reported)
    # or "rebuild" (written anew).
    recover: str = "copy"
    export: bool = False       # an export document carries its rows
    at_open: bool = True       # created by every open (False: by its module on first use)
    counters: tuple[Counter, ...] = ()

    @property
    def column_names(self) -> tuple[str, ...]:
        """Return the declared column names in order."""
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        """Return the declared column `name` (KeyError when there is none)."""
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"{self.name} has no column {name!r}")

    def owned_by(self, sessions: str) -> tuple[str, ...]:
        """Return WHERE conditions, one per way a row names its session, selecting the rows of `sessions`.

        `sessions` is SQL for a parenthesised list or subquery of session ids, e.g. "(?)" or
        "(SELECT value FROM json_each(:ids))"; a row matching any condition belongs to them.
        """
        if self.owner is None:
            return ()
        found = [f"{self.owner} IN {sessions}"]
        if self.owner_via is not None:
            column, table = self.owner_via
            found.append(f"{column} IN (SELECT id FROM {table} WHERE {DICTIONARY[table].owner} IN {sessions})")
        return tuple(found)

    def references(self, table: str) -> bool:
        """Tell whether a column of this table holds a foreign key to `table`."""
        return any(f"REFERENCES {table}(" in c.constraint for c in self.columns)

    @property
    def sql(self) -> str:
        """Return the CREATE TABLE IF NOT EXISTS statement."""
        return table_sql(self.name, tuple((c.name, c.declaration) for c in self.columns), self.constraints)


def _tool_calls_of(role: str, calls: Any) -> int:
    return len(calls) if role == "assistant" and isinstance(calls, list) else 0


# The session counters: `message_count` counts a session's live (active) rows and
# `tool_call_count` the tool calls (a JSON array's length) of its live assistant rows.
COUNTERS: tuple[Counter, ...] = (
    Counter("message_count", "m.active = 1", "1", lambda role, calls: 1),
    Counter("tool_call_count", "m.active = 1 AND m.role = 'assistant' AND json_valid(m.tool_calls) "
            "AND json_type(m.tool_calls) = 'array'", "json_array_length(m.tool_calls)", _tool_calls_of),
)

_SESSION_ID = "session_id"
_T, _I, _R = "TEXT", "INTEGER", "REAL"
# Columns several ledgers share: a row id, the session a live ledger row pins (a session with
# ledger rows cannot be deleted under them), the runtime epoch it ran under, and its times.
_ROW_ID = Column("id", _I, "PRIMARY KEY AUTOINCREMENT")
_PINNED_SESSION = Column("session_id", _T, "NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT")
_EPOCH = Column("epoch", _I)
_STARTED, _FINISHED = Column("started_at", _R), Column("finished_at", _R)
# The token counters a session and each of its per-model usage rows keep.
_TOKEN_COLUMNS = tuple(Column(f"{kind}_tokens", _I, default=0)
                       for kind in ("input", "output", "cache_read", "cache_write", "reasoning"))

SESSIONS = Table("sessions", (
    Column("id", _T, "PRIMARY KEY", rule=None), Column("source", _T, "NOT NULL"), Column("user_id", _T),
    Column("model", _T), Column("model_config", _T, rule="json_text"), Column("system_prompt", _T),
    Column("parent_session_id", _T, "REFERENCES sessions(id)"), Column("started_at", _R, "NOT NULL"),
    Column("ended_at", _R), Column("end_reason", _T), Column("message_count", _I, default=0, rule=None),
    Column("tool_call_count", _I, default=0, rule=None),
    *_TOKEN_COLUMNS,
    Column("billing_provider", _T), Column("billing_base_url", _T), Column("billing_mode", _T),
    Column("estimated_cost_usd", _R), Column("actual_cost_usd", _R), Column("cost_status", _T),
    Column("cost_source", _T), Column("pricing_version", _T), Column("title", _T),
    Column("api_call_count", _I, default=0), Column("session_key", _T), Column("chat_id", _T, rule="platform_id"),
    Column("chat_type", _T), Column("thread_id", _T, rule="platform_id"), Column("display_name", _T),
    Column("origin_json", _T, rule="json_text"), Column("expiry_finalized", _I, default=0, rule="flag"),
    Column("cwd", _T), Column("git_branch", _T), Column("git_repo_root", _T), Column("handoff_state", _T),
    Column("handoff_platform", _T), Column("handoff_error", _T), Column("compression_failure_cooldown_until", _R),
    Column("compression_failure_error", _T), Column("compression_fallback_streak", _I, "NOT NULL", default=0),
    Column("profile_name", _T), Column("transport_profile", _T), Column("rewind_count", _I, "NOT NULL", default=0),
    Column("archived", _I, "NOT NULL", default=0, rule="flag"), Column("auto_archived", _I, default=0, rule="flag"),
    Column("pinned", _I, default=0, rule="flag"), Column("title_source", _T), Column("last_activity_at", _R),
    # hermes-agent 0.20's columns, declared as that release adds them to an existing file. The
    # prompt's hash names its row in system_prompts (see PROMPT_SQL); the library keeps it.
    Column("system_prompt_hash", _T, rule=None), Column("git_metadata_generation", _I, "NOT NULL", default=0),
    Column("last_activity_description", _T), Column("last_activity_provenance", _T),
    Column("compression_ineffective_count", _I, "NOT NULL", default=0),
    Column("hidden", _I, "NOT NULL", default=0, rule="flag"), Column("last_read_at", _R),
), recover="verify", export=True, counters=COUNTERS)

# hermes-agent 0.20 keeps each system prompt once, under the SHA-256 of its UTF-8 text, and a
# session names it by sessions.system_prompt_hash. Its rows are verified by recover like the
# sessions that name them; an export carries each session's prompt as text instead.
SYSTEM_PROMPTS = Table("system_prompts", (
    Column("hash", _T, "PRIMARY KEY", rule=None), Column("prompt", _T, "NOT NULL"),
), recover="verify")

# The roles agents store in messages.role, in a conversation's order; what a filter by role offers.
ROLES = ("system", "developer", "user", "assistant", "tool")

MESSAGES = Table("messages", (
    Column("id", _I, "PRIMARY KEY AUTOINCREMENT", rule=None),
    Column("session_id", _T, "NOT NULL REFERENCES sessions(id)", rule=None), Column("role", _T, "NOT NULL"),
    Column("content", _T), Column("tool_call_id", _T), Column("tool_calls", _T, rule="json", json=True),
    Column("tool_name", _T), Column("timestamp", _R, "NOT NULL", rule="time"), Column("token_count", _I),
    Column("finish_reason", _T), Column("reasoning", _T), Column("reasoning_content", _T),
    Column("reasoning_details", _T, rule="json", json=True),
    Column("codex_reasoning_items", _T, rule="json", json=True),
    Column("codex_message_items", _T, rule="json", json=True), Column("effect_disposition", _T),
    Column("platform_message_id", _T, rule="platform_id"), Column("observed", _I, default=0, rule="flag"),
    Column("active", _I, "NOT NULL", default=1, rule=None), Column("compacted", _I, "NOT NULL", default=0, rule=None),
    Column("api_content", _T), Column("display_kind", _T), Column("display_metadata", _T, rule="json", json=True),
    Column("message_uid", _T, rule="uid"), Column("absorbed_message_uids", _T, rule="json", json=True),
    Column("tool_call_uids", _T, rule="json", json=True), Column("tool_call_uid", _T),
    Column("content_parts", _T, rule="json", json=True),
), owner=_SESSION_ID, recover="verify", export=True)

# The runtime ledgers describe processes of the file they were written in (epochs, running
# workers): `recover` never copies them, and a recovered file's first owner starts a new epoch.
DICTIONARY: dict[str, Table] = {t.name: t for t in (
    SYSTEM_PROMPTS,
    SESSIONS,
    MESSAGES,
    # The real system's columns and key (usage per billing route too); updated_at is this library's.
    Table("session_model_usage", (
        Column("session_id", _T, "NOT NULL REFERENCES sessions(id) ON DELETE CASCADE", rule=None),
        Column("model", _T, "NOT NULL"),
        *(Column(n, _T, "NOT NULL", default="") for n in ("billing_provider", "billing_base_url", "billing_mode", "task")),
        Column("api_call_count", _I, "NOT NULL", default=0),
        *(Column(c.name, _I, "NOT NULL", default=0) for c in _TOKEN_COLUMNS),
        Column("estimated_cost_usd", _R, "NOT NULL", default=0), Column("actual_cost_usd", _R, "NOT NULL", default=0),
        Column("cost_status", _T), Column("cost_source", _T), Column("first_seen", _R), Column("last_seen", _R),
        Column("updated_at", _R),
    ), ("PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)",),
        owner=_SESSION_ID, export=True),
    Table("state_meta", (
        Column("key", _T, "PRIMARY KEY"), Column("value", _T),
    )),
    Table("gateway_routing", (
        Column("scope", _T, "NOT NULL", default=""), Column("session_key", _T, "NOT NULL"),
        Column("entry_json", _T, "NOT NULL", rule="json", json=True), Column("updated_at", _R, "NOT NULL"),
    ), ("PRIMARY KEY (scope, session_key)",),
        owner="CASE WHEN json_valid(entry_json) THEN json_extract(entry_json, '$.session_id') END"),
    Table("compression_locks", (
        Column("session_id", _T, "PRIMARY KEY"), Column("holder", _T, "NOT NULL"),
        Column("acquired_at", _R, "NOT NULL"), Column("expires_at", _R, "NOT NULL"),
    ), owner=_SESSION_ID),
    # hermes-agent's columns (delivery_* hand a result back; its index idx_async_delegations_delivery
    # is declared under its name, so it finds it) plus this library's target.
    Table("async_delegations", (
        Column("delegation_id", _T, "PRIMARY KEY"), Column("origin_session", _T, "NOT NULL"),
        Column("origin_ui_session_id", _T, "NOT NULL", default=""), Column("parent_session_id", _T),
        Column("state", _T, "NOT NULL"), Column("dispatched_at", _R, "NOT NULL"), Column("completed_at", _R),
        Column("updated_at", _R, "NOT NULL"), *(Column(n, _T, rule="json", json=True) for n in ("event_json", "result_json")),
        Column("delivery_state", _T, "NOT NULL", default="pending"),
        Column("delivery_attempts", _I, "NOT NULL", default=0), Column("delivered_at", _R),
        Column("owner_pid", _I), Column("owner_started_at", _I), Column("task_json", _T, rule="json", json=True),
        Column("delivery_claim", _T), Column("delivery_claimed_at", _R), Column("target", _T)), owner="origin_session"),
    # hermes-agent 0.20's gateway bookkeeping: a chat's run of failed session-hygiene passes (by
    # session key), and the lease a process holds on a conversation (its compression root) for
    # one turn. Durable rows of that program, copied by recover like the compression locks.
    Table("gateway_hygiene_state", (
        Column("session_key", _T, "PRIMARY KEY"), Column("failure_streak", _I, "NOT NULL", default=0),
    )),
    Table("session_turn_leases", (
        Column("conversation_id", _T, "PRIMARY KEY"), Column("holder", _T, "NOT NULL"),
        Column("acquired_at", _R, "NOT NULL"), Column("expires_at", _R, "NOT NULL"),
    )),
    Table("runtime_epoch", (
        Column("id", _I, "PRIMARY KEY CHECK (id = 1)"), Column("epoch", _I, "NOT NULL"), Column("instance_id", _T),
        Column("pid", _I), Column("started_at", _R),
    ), recover="exclude"),
    Table("session_admissions", (
        _ROW_ID, _PINNED_SESSION, Column("admission_key", _T), Column("payload_json", _T, rule="json", json=True),
        Column("state", _T, "NOT NULL", default="queued"), _EPOCH, Column("resolution", _T), Column("created_at", _R),
        _STARTED, _FINISHED,
    ), owner=_SESSION_ID, recover="exclude"),
    Table("worker_executions", (
        _ROW_ID, _PINNED_SESSION, Column("kind", _T, "NOT NULL"), Column("state", _T, "NOT NULL", default="running"),
        _EPOCH, _STARTED, _FINISHED,
    ), owner=_SESSION_ID, recover="exclude"),
    Table("worker_receipts", (
        Column("execution_id", _I, "NOT NULL REFERENCES worker_executions(id) ON DELETE RESTRICT"), _PINNED_SESSION,
        Column("seq", _I, "NOT NULL"), Column("payload_json", _T, "NOT NULL", rule="json", json=True),
        Column("digest", _T, "NOT NULL"), Column("recorded_at", _R),
    ), ("PRIMARY KEY (execution_id, seq)",), owner=_SESSION_ID, owner_via=("execution_id", "worker_executions"),
        recover="exclude"),
    Table("schema_version", (
        Column("version", _I, "NOT NULL"),
    ), recover="rebuild"),
    # The gateway outbox: created by the gateway module on first use, never at open.
    Table("delivery_obligations", (
        _ROW_ID, Column("session_id", _T, "NOT NULL"), Column("obligation_key", _T, "UNIQUE"),
        Column("payload_json", _T, "NOT NULL", rule="json", json=True), Column("platform", _T), Column("chat_id", _T),
        Column("thread_id", _T), Column("state", _T, "NOT NULL", default="pending"),
        Column("attempts", _I, "NOT NULL", default=0), Column("fence", _I, "NOT NULL", default=0),
        Column("recovered", _I, "NOT NULL", default=0), Column("last_error", _T), Column("created_at", _R),
        Column("updated_at", _R),
    ), owner=_SESSION_ID, recover="verify", at_open=False),
    # Telegram DM topic mode (hermes-agent's tables, in its columns): created by the explicit
    # opt-in of hermes_state_telegram, never at open, so a file nobody opted in keeps the
    # layout it had. A chat's mode row belongs to no session; a binding (one topic thread, one
    # session) goes with its session.
    Table("telegram_dm_topic_mode", (
        Column("chat_id", _T, "PRIMARY KEY"), Column("user_id", _T, "NOT NULL"),
        Column("enabled", _I, "NOT NULL", default=1, rule="flag"), Column("activated_at", _R, "NOT NULL"),
        Column("updated_at", _R, "NOT NULL"), Column("has_topics_enabled", _I, rule="flag"),
        Column("allows_users_to_create_topics", _I, rule="flag"), Column("capability_checked_at", _R),
        Column("intro_message_id", _T), Column("pinned_message_id", _T),
    ), at_open=False),
    Table("telegram_dm_topic_bindings", (
        Column("chat_id", _T, "NOT NULL"), Column("thread_id", _T, "NOT NULL"), Column("user_id", _T, "NOT NULL"),
        Column("session_key", _T, "NOT NULL"),
        Column("session_id", _T, "NOT NULL REFERENCES sessions(id) ON DELETE CASCADE"),
        Column("managed_mode", _T, "NOT NULL", default="auto"), Column("linked_at", _R, "NOT NULL"),
        Column("updated_at", _R, "NOT NULL"),
    ), ("PRIMARY KEY (chat_id, thread_id)",), owner=_SESSION_ID, at_open=False),
)}


def decoded(table: str, row: dict[str, Any]) -> dict[str, Any]:
    """Return a row of `table` with each JSON column decoded under its name without `_json`."""
    for column in DICTIONARY[table].columns:
        if column.json and column.name in row:
            row[column.name.removesuffix("_json")] = decode_json(row.pop(column.name))
    return row


# Tables whose rows belong to a session, children first: a table only references tables
# declared before it, so deleting in this order keeps every foreign key at each step.
SESSION_OWNED: tuple[Table, ...] = tuple(t for t in reversed(DICTIONARY.values()) if t.owner is not None)
# Tables the copy of whose rows `recover` leaves out (reported in RecoveryReport.excluded).
RECOVER_EXCLUDED: tuple[str, ...] = tuple(t.name for t in DICTIONARY.values() if t.recover == "exclude")
RECOVER_VERIFIED: tuple[str, ...] = tuple(t.name for t in DICTIONARY.values() if t.recover == "verify")


def _counter_sql(counter: Counter) -> str:
    return (f"{counter.column} = (SELECT COALESCE(SUM({counter.each}), 0) FROM messages m "
            f"WHERE m.session_id = sessions.id AND {counter.where})")


def recount_sql(columns: tuple[str, ...] | None = None) -> str:
    """Return an UPDATE that recounts the session counters (those named, or all) for every session.

    Append a WHERE clause to narrow it to some sessions.
    """
    chosen = [c for c in COUNTERS if columns is None or c.column in columns]
    return "UPDATE sessions SET " + ", ".join(_counter_sql(c) for c in chosen)


def counter_amounts(role: str, tool_calls: Any) -> tuple[int, ...]:
    """Return what one live row adds to each counter, in COUNTERS order (COUNTER_ADD_SQL's parameters)."""
    return tuple([c.adds(role, tool_calls) for c in COUNTERS])  # a list: no generator resumed per counter


# An assignment list for UPDATE sessions SET ...: the live generation is empty again.
COUNTER_RESET_SQL = ", ".join(f"{c.column} = 0" for c in COUNTERS)
# An assignment list moving each counter by a bound amount (counter_amounts gives them).
COUNTER_ADD_SQL = ", ".join(f"{c.column} = COALESCE({c.column}, 0) + ?" for c in COUNTERS)

# The dictionary in the older (name, [(column, declaration)], constraints) form, for the tables
# every open creates.
TABLES: tuple[tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]], ...] = tuple(
    (t.name, tuple((c.name, c.declaration) for c in t.columns), t.constraints)
    for t in DICTIONARY.values() if t.at_open)
SESSIONS_COLUMNS = dict((name, columns) for name, columns, _ in TABLES)["sessions"]
MESSAGES_COLUMNS = dict((name, columns) for name, columns, _ in TABLES)["messages"]

def prompt_hash(prompt: str) -> str:
    """Return the key hermes-agent 0.20 files a system prompt under: the SHA-256 hex digest of its UTF-8 text."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


# A session's system prompt whichever program stored it: the column, which this library and
# hermes-agent 0.19 write, else the prompt the row's hash names, which hermes-agent 0.20 writes
# instead (it leaves the column NULL). Every column of a sessions row `s`, and the filed prompt
# only where the column is NULL (a long prompt is never read twice), one row read by its key.
FILED_PROMPT = "_system_prompt_filed"
SESSION_ROW_SQL = (f"s.*, CASE WHEN s.system_prompt IS NULL THEN (SELECT p.prompt FROM system_prompts p "
                   f"WHERE p.hash = s.system_prompt_hash) END AS {FILED_PROMPT}")


def session_dicts(cur: Any) -> list[dict[str, Any]]:
    """Return the cursor's rows (selected with SESSION_ROW_SQL) as dicts, system_prompt as either program stored it."""
    rows = row_dicts(cur)
    for row in rows:
        filed = row.pop(FILED_PROMPT, None)
        if filed is not None:
            row["system_prompt"] = filed
    return rows


# The input marker of a message (see input ownership in docs/gateway.md), as one expression:
# the index below and every lookup must spell it identically for SQLite to use the index.
# json_valid first, so a row written with malformed display_metadata is indexed as NULL
# instead of failing its insert.
INPUT_MARKER_SQL = ("CASE WHEN json_valid(display_metadata) "
                    "THEN json_extract(display_metadata, '$.input_marker') END")
# A message that is not live; the partial index below and every query using it spell it identically.
NOT_LIVE_SQL = "active IS NOT 1"
# The states in which an admission still occupies its session's queue.
LIVE_ADMISSION_SQL = "state IN ('queued', 'started', 'unknown')"
# Sessions whose model_config may mark them as a delegate or a branch; a query naming either
# LIKE term can read them from idx_sessions_marked.
DELEGATE_LIKE_SQL = "model_config LIKE '%_delegate_from%'"
BRANCH_LIKE_SQL = "model_config LIKE '%_branched_from%'"
MARKED_SESSION_SQL = f"{DELEGATE_LIKE_SQL} OR {BRANCH_LIKE_SQL}"
# An archived session; the partial index below and every filter using it spell it identically.
ARCHIVED_SQL = "COALESCE(archived, 0) <> 0"
HIDDEN_SQL = "COALESCE(hidden, 0) <> 0"

INDEX_SQL: tuple[str, ...] = (
    "CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id)",
    "CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique ON sessions(title) WHERE title IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_sessions_key ON sessions(session_key, started_at DESC)",
    # hermes-agent 0.20's own index (same name): which sessions still name a prompt, so a prompt
    # no session names any more is found and removed without reading every session.
    "CREATE INDEX IF NOT EXISTS idx_sessions_system_prompt_hash ON sessions(system_prompt_hash)",
    # Every column after system_prompt sits behind it in the row, so reading one from a cron run's
    # row (a prompt of 200 KB or more) walks the prompt's overflow pages. Counts, listings and
    # prune's selection read these columns for many rows at once: from here they read no row.
    # No column an append moves (message_count, the counters, archived) is in it, so an append
    # never rewrites its entry.
    "CREATE INDEX IF NOT EXISTS idx_sessions_listing ON sessions(started_at DESC, id, parent_session_id, "
    "end_reason, ended_at, source, model, title)",
    # The same for ended sessions (what prune reads), with the columns an append moves: a live
    # session is not in it, so its appends leave it alone.
    "CREATE INDEX IF NOT EXISTS idx_sessions_ended ON sessions(started_at, id, parent_session_id, end_reason, "
    "ended_at, source, model, title, message_count, archived) WHERE ended_at IS NOT NULL",
    # The archived sessions, usually few: "not archived" is "not in here", read without a row.
    f"CREATE INDEX IF NOT EXISTS idx_sessions_archived ON sessions(id, archived) WHERE {ARCHIVED_SQL}",
    # The hidden sessions (hermes-agent 0.20's flag), usually few: "not hidden" is "not in here".
    f"CREATE INDEX IF NOT EXISTS idx_sessions_hidden ON sessions(id, hidden) WHERE {HIDDEN_SQL}",
    # The few delegate and branch sessions, found without reading every session's model_config.
    f"CREATE INDEX IF NOT EXISTS idx_sessions_marked ON sessions(id, parent_session_id, model_config) "
    f"WHERE {MARKED_SESSION_SQL}",
    "CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id)",
    "CREATE INDEX IF NOT EXISTS idx_messages_uid ON messages(message_uid)",
    # Rows that are not live (archived generations): usually few, and none for a live append. With
    # SQLite's count of a b-tree they count the store's or a session's live rows, and page through a
    # session's live rows, without reading a single message.
    f"CREATE INDEX IF NOT EXISTS idx_messages_not_live ON messages(session_id, id) WHERE {NOT_LIVE_SQL}",
    # Every message by its time, about 17 bytes a row: the listing by latest activity reads the
    # newest messages first, and it is the narrowest b-tree over all the messages, which SQLite's
    # COUNT(*) walks instead of the uid index (40 bytes a row, past the page cache on a large
    # store). An append adds its entry at the b-tree's right edge.
    "CREATE INDEX IF NOT EXISTS idx_messages_timestamp ON messages(timestamp)",
    "CREATE INDEX IF NOT EXISTS idx_admissions_session ON session_admissions(session_id, id)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_admissions_key ON session_admissions(session_id, admission_key)"
    " WHERE admission_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS idx_executions_session ON worker_executions(session_id, state)",
    "CREATE INDEX IF NOT EXISTS idx_receipts_session ON worker_receipts(session_id)",
    "CREATE INDEX IF NOT EXISTS idx_delegations_origin ON async_delegations(origin_session)",
    "CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery ON async_delegations(delivery_state, completed_at)",
    # A queue's head is found without walking the session's finished admissions.
    f"CREATE INDEX IF NOT EXISTS idx_admissions_live ON session_admissions(session_id, id) WHERE {LIVE_ADMISSION_SQL}",
    # The exception-path writer finds an inbound message by its marker alone, reading no bodies.
    f"CREATE INDEX IF NOT EXISTS idx_messages_input_marker ON messages({INPUT_MARKER_SQL}) "
    "WHERE display_metadata IS NOT NULL",
)

def table_sql(name: str, columns: tuple[tuple[str, str], ...], constraints: tuple[str, ...] = ()) -> str:
    """Return the CREATE TABLE IF NOT EXISTS statement for one declared table."""
    body = ",\n    ".join([f"{c} {d}" for c, d in columns] + list(constraints))
    return f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n)"


TABLE_SQL: tuple[str, ...] = tuple(t.sql for t in DICTIONARY.values() if t.at_open)
DELIVERY_OBLIGATIONS_SQL = DICTIONARY["delivery_obligations"].sql
# Indexes earlier versions created and an upgrade drops: idx_messages_session serves what
# idx_messages_session_active (session_id, active, timestamp) did; it took about 5% of a file.
RETIRED_INDEXES: tuple[str, ...] = ("idx_messages_session_active",)
# Indexes whose build reads every page of a large table (20 s for the messages of a 16 GB store
# from a cold disk): a file lacking only these is not migrated at open, which would hold the
# write lock that long. A new file has them; a file gets them at its next migration or vacuum().
LATE_INDEXES: tuple[str, ...] = ("idx_messages_timestamp",)

SCHEMA_SQL = ";\n\n".join(TABLE_SQL + INDEX_SQL) + ";\n"
# The secondary indexes alone (SCHEMA_SQL holds them too), under hermes-agent's name: that program builds
# them after its tables; this library builds them with the tables at open, so nothing is ever left to do.
DEFERRED_INDEX_SQL = ";\n".join(INDEX_SQL) + ";\n"
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {name: tuple(c for c, _ in cols) for name, cols, _ in TABLES}
SESSION_COLUMN_NAMES = frozenset(TABLE_COLUMNS["sessions"])
MESSAGE_COLUMN_NAMES = frozenset(TABLE_COLUMNS["messages"])
JSON_MESSAGE_FIELDS = tuple(c.name for c in MESSAGES.columns if c.json)


def check_stored(column: Column, value: Any) -> Any:
    """Return `value` as an import stores it in `column`, JSON encoded if needed; ValueError if it cannot be.

    Looser than the caller rules: it checks only that the value fits the column's storage class
    and that SQLite keeps it faithfully, since an export carries every value as it was stored.
    """
    if value is None:
        return None
    if column.json and not isinstance(value, str):
        return encode_json(value, column.name)
    if column.type == "TEXT":
        if not isinstance(value, str):
            raise ValueError(f"{column.name} must be a string or null, not {type(value).__name__}")
        return value
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(f"{column.name} = {value} is outside SQLite's 64-bit integers")
        return value
    if isinstance(value, float) and column.type == "REAL":
        if not math.isfinite(value):  # as every write refuses: NaN reads back NULL, and Infinity is not JSON
            raise ValueError(f"{column.name} must be a finite number or null, not {value}")
        return value
    raise ValueError(f"{column.name} must be {'an integer' if column.type == 'INTEGER' else 'a number'} or null, "
                     f"not {type(value).__name__}")
