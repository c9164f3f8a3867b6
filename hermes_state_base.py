"""The ground floor under the data dictionary: the logger, timing defaults, SQL and text helpers.

Owns: the library's one logger, the timing policy's default values (`WRITE_PATIENCE_S`, ...),
`PAGE_SIZE`, `DAY_S`, `Keywords` (a dict parameter offered as keyword arguments), SQLite's integer range (`INT_MIN`, `INT_MAX`), the lone-surrogate
pattern and the lenient decoder of stored text (`LENIENT_TEXT`); `split_sql`, `row_dicts`, `object_exists`/`table_exists` (the one catalogue read),
`escape_like`, `contains_sql`/`prefix_range` (substring and prefix tests with no LIKE pattern),
`strip_surrogates` (a search term's cleanup), `check_scalar` (a value SQLite keeps
faithfully) and `shown` (a bad value quoted cut short in an error message). Does not own:
columns, tables and the rule a column's value passes (hermes_state_common), transactions
(hermes_state_writer). Imports only the standard library; hermes_state_common re-exports every
public name, so callers import them from there.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import reprlib
import sqlite3
from typing import Any

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
