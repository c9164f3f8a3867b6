"""Schema setup: connect, build a new file, reconcile columns, run the versioned ladder, check versions.

Owns: opening the SQLite connection with the library's pragmas (a `Connection`, which carries the
state the library keeps for that connection alone), `build_file()` (the one
builder of a new file: a fresh open and `recover` both use it), `_reconcile_columns()`
(declarative ADD COLUMN from the data dictionary), the versioned migration ladder (a registry
filled by `step()`/`layout_step()`, each step saying what changed) and the bodies of its data
steps (marking subagent rows, seeding per-model usage from the session totals, un-hiding rows
stored with no `active` flag, rebuilding a table in its declared shape, `table_columns`); the
read-only check lives in hermes_state_catalogue.
Does not own: the FTS tables (hermes_state_fts), the declared tables themselves
(hermes_state_common) or any session/message query.

Transaction contract: `migrate()` opens its own write transactions through the Writer (an
empty file is built in one; an existing one gets one for tables + columns, one per ladder step
with its version bump, one for indexes), re-reading the state under the lock each time because
another process may have migrated first. An up-to-date database is detected with a few
catalogue reads and takes no write lock, so opening costs the same for any number of rows.
"""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar, cast

from hermes_state_cjk import register_functions
from hermes_state_common import (CACHE_SIZE_KIB, COUNTERS, DICTIONARY, INDEX_SQL, LATE_INDEXES, LENIENT_TEXT, PAGE_SIZE,
                                 READ_BUSY_TIMEOUT_S, RETIRED_INDEXES, SCHEMA_VERSION, SOFT_HEAP_LIMIT_KIB,
                                 SQLITE_BUSY_TIMEOUT_S, TABLE_SQL, TABLES, derived_uid, logger, object_exists, recount_sql,
                                 sql_literal, table_exists)
from hermes_state_titles import free_duplicate_titles
from hermes_state_writer import RetryPolicy, Writer, retry_on_lock
from hermes_state_errors import StateDbJournalError, StateDbNotWritableError, WalUnsupportedError
from hermes_state_home import config_section, get_hermes_home

_SIDE_FILES = ("-wal", "-shm")


# --- files and connections --------------------------------------------------------------------

def _tighten(path: Path) -> str | None:
    # chmod by path (never through a descriptor: closing one would drop this process's
    # fcntl locks on the database). The caller passes the resolved path, so a symlinked store
    # gets its real file tightened. Says what it changed, so no mode changes silently.
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or not stat.S_IMODE(st.st_mode) & 0o077:
        return None
    os.chmod(path, 0o600)
    change = f"{path}: mode {stat.S_IMODE(st.st_mode):04o} -> 0600 (it held private data others could read)"
    logger.warning("%s", change)
    return change


def real_path(path: Path) -> Path:
    """Return the file a database path stands for, through any symlinks (SQLite opens that one)."""
    return path if str(path) == ":memory:" else Path(os.path.realpath(path))


def prepare_file(path: Path) -> bool:
    """Create the database file 0600 if it does not exist yet; return whether it was created.

    Through a symlink (the store kept on another disk) the target is created, 0600 as well.
    An existing file is left as it is here: `tighten_files` runs once the file is known to be ours.
    """
    if str(path) == ":memory:":
        return False  # SQLite's in-memory database: there is no file to create or protect
    target = real_path(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        os.close(fd)  # a brand-new file: nobody holds locks on it yet
    except FileExistsError:
        return os.path.getsize(target) == 0
    return True


def tighten_files(path: Path) -> list[str]:
    """Make the database file and its -wal and -shm 0600 (through symlinks); return what changed.

    Each change is also logged as a warning naming the old mode.
    """
    if os.name != "posix" or str(path) == ":memory:":
        return []
    target = real_path(path)
    return [c for c in (_tighten(Path(str(target) + suffix)) for suffix in ("",) + _SIDE_FILES) if c]


def tighten_side_files(path: Path) -> list[str]:
    """Make the -wal and -shm files 0600 once SQLite has created them; return what changed."""
    return tighten_files(path)





class Connection(sqlite3.Connection):
    """A connection the library opened: sqlite3's own, plus the state the library keeps for it alone.

    The state lives and dies with the connection object, so two connections never share it and a
    new one never inherits a closed one's (as a table keyed by id() would once the id is reused).
    A forked child's copy of a parent connection carries the parent's state but is never used; the
    child's own connections start empty. Connections other code opened (a caller's raw sqlite3
    connection) are plain `sqlite3.Connection`s: code reading this state checks the type first and
    treats them as keeping none. Slots, not a __dict__: reading them is as cheap as attributes get.
    """

    __slots__ = ("fts_catalogue", "fts_queued")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # (schema version, catalogue) of the FTS objects as hermes_state_fts last read them, or None.
        self.fts_catalogue: tuple[int, Any] | None = None
        # Rows queued for the index batch through this connection since its queue was last counted:
        # the queue is counted only when this says a batch may be due (a rollback, or another path
        # emptying the queue, only makes it too high).
        self.fts_queued = 0


_SQLITE_CONNECT = sqlite3.connect


def library_connection(database: str, **options: Any) -> sqlite3.Connection:
    """Open a connection of the library's own class, through `sqlite3.connect` as a caller may have replaced it.

    A program or test harness that replaced `sqlite3.connect` (to hand in a connection class of
    its own, as hermes-agent's tests do) gets its call with the arguments it expects, no `factory`
    added; the library then keeps no state for that connection, as for any it did not open.
    """
    if sqlite3.connect is _SQLITE_CONNECT:
        return sqlite3.connect(database, factory=Connection, **options)
    return sqlite3.connect(database, **options)


def connect(path: Path, *, read_only: bool = False, read_busy_s: float = READ_BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """Open the connection with explicit transactions, foreign keys and a short busy timeout.

    A read-only handle waits `read_busy_s` once for locks; a writable one 1 s per attempt
    (its writer retries at application level).
    """
    if read_only:
        target, uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro", True
    else:
        target, uri = str(path), False
    conn = library_connection(target, uri=uri, isolation_level=None, check_same_thread=False,
                              timeout=read_busy_s if read_only else SQLITE_BUSY_TIMEOUT_S)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.text_factory = LENIENT_TEXT
    return conn


def size_cache(conn: sqlite3.Connection) -> None:
    """Give the connection the library's page cache size; a file locked right now keeps SQLite's default."""
    if SOFT_HEAP_LIMIT_KIB and not conn.execute("PRAGMA soft_heap_limit").fetchone()[0]:
        # Process-wide, and only when the program has not chosen one itself (see SOFT_HEAP_LIMIT_KIB).
        conn.execute(f"PRAGMA soft_heap_limit = {SOFT_HEAP_LIMIT_KIB * 1024}")
    try:  # SQLite reads the schema for this pragma, so it waits for a rival's exclusive lock
        conn.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
    except sqlite3.OperationalError as exc:
        logger.debug("page cache left at its default: %s", exc)


def lenient_text(raw: bytes) -> str:
    """Decode stored text, replacing bytes that are not UTF-8 with U+FFFD.

    Another client (the sqlite3 shell, a C program) can store any bytes as TEXT; one such row
    must not make a whole listing or search unreadable.
    """
    return LENIENT_TEXT(raw)


_T = TypeVar("_T")


def read_strict_text(conn: sqlite3.Connection, read: Callable[[], _T]) -> _T:
    """Return `read()` run with text decoded by sqlite3's own UTF-8 path, again leniently if a value is not UTF-8.

    For reads on a connection lent to one caller (every read of the method table): the lenient
    factory costs a bytes copy and a call per value (a third of reading a 33,000-message session).
    """
    factory = conn.text_factory
    conn.text_factory = str
    try:
        return read()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    finally:
        conn.text_factory = factory
    return read()


# A read that streams a large session (tens of megabytes of tool output) passes through far more
# pages than the cache holds and reads none of them again: caching them only pushes out the pages
# searches and listings reuse, and grows the process by the whole cache. Past this much text a
# read goes on with SQLite's default cache, and the connection's own is given back after it.
STREAM_TEXT_CHARS = 2_000_000
STREAM_CACHE_KIB = 2000  # SQLite's default page cache


class StreamedRead:
    """One bulk read on a connection lent to one caller: `passed(n)` after each batch of n characters of text."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.chars = 0
        self.restore: int | None = None  # the connection's own cache_size, while the small one is in use

    def __enter__(self) -> StreamedRead:
        return self

    def passed(self, chars: int) -> None:
        """Count `chars` more characters read; past STREAM_TEXT_CHARS, go on with the small page cache."""
        self.chars += chars
        if self.restore is None and self.chars > STREAM_TEXT_CHARS:
            own = self.conn.execute("PRAGMA cache_size").fetchone()[0]
            if own < 0 and -own > STREAM_CACHE_KIB and _set_cache(self.conn, -STREAM_CACHE_KIB):
                self.restore = own  # a cache sized in KiB, larger than the small one

    def __exit__(self, *exc: object) -> None:
        if self.restore is not None:
            _set_cache(self.conn, self.restore)
            self.restore = None


def _set_cache(conn: sqlite3.Connection, size: int) -> bool:
    # Only the cache's size is at stake: a refusal leaves the read itself to go on.
    try:
        conn.execute(f"PRAGMA cache_size = {size}")
    except sqlite3.OperationalError as exc:
        logger.debug("page cache left as it was: %s", exc)
        return False
    return True


def connect_reader(path: Path) -> sqlite3.Connection:
    """Open a handle's second connection, for reads only (it refuses writes), on a writable database."""
    conn = library_connection(str(path), isolation_level=None, check_same_thread=False,
                              timeout=SQLITE_BUSY_TIMEOUT_S)
    conn.text_factory = LENIENT_TEXT
    conn.execute("PRAGMA query_only = ON")
    size_cache(conn)
    register_functions(conn)  # its scans of rows not indexed yet fold text as the index does
    return conn


# SQLite's answers when a file system cannot give WAL its shared memory (NFS, SMB, some FUSE
# mounts): SQLITE_PROTOCOL and SQLITE_AUTH, by code, or by text when an error carries no code.
# Anything else (a transient EIO above all) is re-raised: one process downgrading while its
# siblings keep WAL would mix two locking protocols on one file.
_WAL_INCOMPATIBLE_CODES = frozenset({15, 23})
_WAL_INCOMPATIBLE_TEXT = ("locking protocol", "not authorized")
# Labels already warned about, so a caller that reconnects per operation logs one line, not many.
wal_fallback_warned: set[str] = set()


def _wal_incompatible(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _WAL_INCOMPATIBLE_CODES
    return any(marker in str(exc).lower() for marker in _WAL_INCOMPATIBLE_TEXT)


def apply_wal_with_fallback(conn: sqlite3.Connection, db_label: str = "state.db", *, require_wal: bool = False) -> str:
    """Put the connection in WAL mode, or in rollback-journal (DELETE) mode where WAL cannot work; return the mode.

    A file already in WAL is left as it is. Only a file system that refuses WAL's shared
    memory causes the fallback, logged once per label; any other error propagates. With
    `require_wal` that refusal raises WalUnsupportedError instead, the mode untouched. On macOS
    the checkpoint and commit barriers are made durable (fullfsync, synchronous=FULL), since
    its fsync does not reach the platter.
    """
    try:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    except sqlite3.OperationalError:
        mode = ""  # the probe is an optimisation; setting the mode below decides
    if mode != "wal":
        try:
            mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if not _wal_incompatible(exc):
                raise
            if require_wal:
                raise WalUnsupportedError(f"{db_label}: WAL mode is not available on this file system ({exc})") from exc
            mode = str(conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).lower()
            if db_label not in wal_fallback_warned:
                wal_fallback_warned.add(db_label)
                logger.warning("%s: WAL mode is not available on this file system (%s); using "
                               "journal_mode=DELETE instead: readers now wait while a write commits",
                               db_label, exc)
        if require_wal and mode not in ("wal", "memory"):  # some network mounts refuse by answering the old mode
            raise WalUnsupportedError(f"{db_label}: WAL mode is not available on this file system "
                                      f"(journal_mode stayed {mode!r})")
    if sys.platform == "darwin":
        conn.execute("PRAGMA checkpoint_fullfsync=1")
        conn.execute("PRAGMA synchronous=FULL")
    else:
        conn.execute("PRAGMA synchronous=NORMAL")
    return mode


def resolve_journal_mode() -> str:
    """Return the journal mode config.yaml's database.journal_mode asks for: "delete" when it says so, else "wal".

    hermes-agent's setting, for file systems where WAL is not durable (virtiofs, NFS, SMB). This
    library's own opens do not follow it: they put a file in WAL unless its file system refuses,
    and keep the mode of a file hermes-agent made in a rollback journal (see kept_journal_mode).
    """
    value = config_section("database").get("journal_mode")
    return "delete" if isinstance(value, str) and value.strip().lower() == "delete" else "wal"


# The database section's optional tuning PRAGMAs, each taking an integer.
CONFIG_PRAGMAS = ("cache_size", "mmap_size", "temp_store", "wal_autocheckpoint", "journal_size_limit")


def _config_integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None  # YAML's yes/no: not a size
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def apply_database_pragmas(conn: sqlite3.Connection, *, db_label: str = "state.db") -> None:
    """Apply config.yaml's database tuning PRAGMAs (cache_size, mmap_size, temp_store, wal_autocheckpoint, journal_size_limit) to `conn`.

    Only integer values are applied (a non-integer is skipped with a warning); a missing or
    malformed section, or a PRAGMA SQLite refuses, changes nothing and raises nothing. The
    journal mode is not among them (resolve_journal_mode).
    """
    settings = config_section("database")
    for name in CONFIG_PRAGMAS:
        if name not in settings:
            continue
        value = _config_integer(settings[name])
        if value is None:
            logger.warning("%s: ignoring non-integer database.%s=%r", db_label, name, settings[name])
            continue
        try:
            conn.execute(f"PRAGMA {name} = {value}")  # an int, so nothing but digits reaches the statement
        except sqlite3.Error as exc:
            logger.warning("%s: database.%s=%d not applied (%s)", db_label, name, value, exc)


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _make_writable(path: Path, kind: str, db_label: str, home: Path) -> None:
    # A file or folder inside the home is the store's own: give its owner read-write back (chmod
    # fails on another user's file, which bounds the repair). Anything else is named, never changed.
    need = os.R_OK | os.W_OK | (os.X_OK if kind == "directory" else 0)
    if os.access(path, need):
        return
    bits = stat.S_IRUSR | stat.S_IWUSR | (stat.S_IXUSR if kind == "directory" else 0)
    if _inside(path, home):
        try:
            os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | bits)
        except OSError:
            pass
        else:
            if os.access(path, need):
                logger.warning("%s: %s %s was not writable by this user; gave its owner read-write access",
                               db_label, kind, path)
                return
    mode = "u+rwx" if kind == "directory" else "u+rw"
    raise StateDbNotWritableError(
        f"{db_label} cannot be opened for writing: {kind} {path} is not writable by this user. Run "
        f"`chmod {mode} '{path}'` (a file another user owns needs that user, or sudo/chown). "
        "Never delete its -wal file: it holds committed writes.")


def preflight_db_writability(db_path: str | os.PathLike, *, db_label: str = "state.db") -> None:
    """Check, before any connection, that the database, its -wal and -shm and its folder are writable; repair them inside the home.

    Inside HERMES_HOME a read-only file or folder gets its owner's read-write back; anywhere else,
    or where that fails, StateDbNotWritableError (an sqlite3.OperationalError) names the path and the
    chmod to run. Nothing is created, deleted or truncated; ":memory:" and "file:" URIs are skipped.
    """
    text = os.fspath(db_path)
    if text == ":memory:" or text.startswith("file:"):
        return
    target = real_path(Path(text))
    home = real_path(get_hermes_home())
    for suffix in ("",) + _SIDE_FILES:
        side = Path(str(target) + suffix)
        if side.is_file():
            _make_writable(side, "file", db_label, home)
    if target.parent.is_dir():  # SQLite creates its -wal, -shm and rollback journal beside the file
        _make_writable(target.parent, "directory", db_label, home)


# hermes-agent 0.20 makes a new file in a rollback-journal mode on a SQLite with the WAL-reset bug
# (or when its config asks for it), and never switches an existing file's mode. Turning WAL on
# here would undo that choice for good (the agent keeps WAL once a file has it), so such a file
# keeps its mode: found at this library's first open (the newer release's system_prompts table,
# none of this library's layout yet) and remembered under JOURNAL_KEPT_KEY. Every other file is
# put in WAL as before, one this library fell back from WAL on included (it asks again each open).
ROLLBACK_MODES = ("delete", "truncate", "persist")
JOURNAL_KEPT_KEY = "hermes_state_journal_kept"
kept_rollback_said: set[str] = set()  # paths already logged, so a caller reopening per call logs once


def kept_journal_mode(conn: sqlite3.Connection) -> str | None:
    """Return the rollback-journal mode a file hermes-agent made so keeps, or None when the open sets WAL.

    Records the choice in state_meta the first time (a file the agent made, not yet opened here).
    """
    mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    if mode not in ROLLBACK_MODES or not table_exists(conn, "state_meta"):
        return None
    if conn.execute("SELECT 1 FROM state_meta WHERE key = ?", (JOURNAL_KEPT_KEY,)).fetchone() is not None:
        return mode
    if not table_exists(conn, "system_prompts") or read_layout(conn) != 0:
        return None
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)", (JOURNAL_KEPT_KEY, mode))
    return mode


def enable_wal(conn: sqlite3.Connection, path: Path | str, patience_s: float, policy: RetryPolicy) -> str:
    """Give a new file its page size, then WAL (or the fallback journal), waiting out other openers; return the mode.

    A file hermes-agent made in a rollback-journal mode keeps it (see kept_journal_mode), said once per path.
    """
    def attempt() -> str:
        if conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # only an empty file takes it
        elif (kept := kept_journal_mode(conn)) is not None:
            if str(path) not in kept_rollback_said:
                kept_rollback_said.add(str(path))
                logger.info("%s is in journal_mode=%s, as hermes-agent leaves a file it made on a SQLite with the "
                            "WAL-reset bug (or configured so); it stays so: readers wait while a write commits. "
                            "Once every program using it links SQLite 3.51.3+ (or 3.50.7 / 3.44.6), "
                            "`sqlite3 %s 'PRAGMA journal_mode=WAL'` with nothing else open switches it",
                            path, kept, path)
            conn.execute("PRAGMA synchronous=FULL")  # rollback mode is durable only with FULL
            return kept
        return apply_wal_with_fallback(conn, str(path))
    try:
        return retry_on_lock(attempt, patience_s, policy)
    except sqlite3.OperationalError as exc:
        if not _wal_incompatible(exc):
            raise
        raise StateDbJournalError(f"{path}: no journal mode works on this file system ({exc})") from exc


# --- reading the current shape ------------------------------------------------------------------

def read_version(conn: sqlite3.Connection) -> int | None:
    """Return the stored schema version, or None when there is no schema_version table."""
    if not table_exists(conn, "schema_version"):
        return None
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return row[0] if row and row[0] is not None else 0


def missing_columns(conn: sqlite3.Connection) -> dict[str, list[tuple[str, str]]]:
    """Return {table: [(column, declaration), ...]} for declared columns the file lacks."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, columns, _ in TABLES:
        have = table_columns(conn, name)
        lacking = [(c, d) for c, d in columns if c not in have]
        if lacking:
            out[name] = lacking
    return out


def _missing_indexes(conn: sqlite3.Connection) -> bool:
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    return any(name not in have and name not in LATE_INDEXES for name in (index_name(sql) for sql in INDEX_SQL))


def index_name(sql: str) -> str:
    """Return the name a `CREATE INDEX IF NOT EXISTS` statement gives its index."""
    return sql.split(" IF NOT EXISTS ")[1].split()[0]


def build_late_indexes(conn: sqlite3.Connection) -> list[str]:
    """Build the late indexes the file lacks (one statement each, autocommit); return their names."""
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    built = []
    for sql in INDEX_SQL:
        if index_name(sql) in LATE_INDEXES and index_name(sql) not in have:
            conn.execute(sql)
            built.append(index_name(sql))
    return built


def needs_migration(conn: sqlite3.Connection) -> bool:
    """Tell, from catalogue reads only, whether open must take the write lock."""
    version = read_version(conn)
    if version is None or version < SCHEMA_VERSION:
        return True
    if version > SCHEMA_VERSION:
        return is_own_relabel(conn, version)
    return (read_layout(conn) < LAYOUT_REVISION or bool(missing_columns(conn)) or _missing_indexes(conn)
            or not _has_uid_trigger(conn))


# --- the layout revision ------------------------------------------------------------------------------
# schema_version holds the real system's numbering, which only it defines. Changes this library
# makes to its own objects (the FTS layout, page size, the columns it adds) are counted apart,
# under LAYOUT_KEY in state_meta, the way the real system counts its FTS layout apart too.
#   1  the layout earlier releases recorded as schema version 32 (substring index over every
#      role, 8 KB pages, content_parts);
#   2  full-text triggers and columns shaped so hermes-agent finds them (its six trigger
#      names, a `content` column in the substring index); a uid for every row any program inserts;
#   3  async_delegations and session_model_usage in the real system's columns and keys;
#   4  no message row with active NULL (hidden from every read by a column added without its default).
LAYOUT_KEY = "hermes_state_layout"
LAYOUT_REVISION = 4
# The number earlier releases of this library wrote as their schema version; the real system has
# not defined it, so a file carrying it is relabelled at its next writable open.
RELABELLED_VERSION = 32


def read_layout(conn: sqlite3.Connection) -> int:
    """Return this library's layout revision recorded in the file (0 when none is)."""
    if not table_exists(conn, "state_meta"):
        return 0
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (LAYOUT_KEY,)).fetchone()
    try:
        return int(row[0]) if row else 0
    except (TypeError, ValueError):
        return 0


def is_own_relabel(conn: sqlite3.Connection, version: int | None) -> bool:
    """Tell whether `version` is the 32 an earlier release of this library wrote (not a newer real version).

    Only this library creates the view `messages_fts_trigram_source`; a file with it, version 32
    and no layout revision is one of ours.
    """
    return version == RELABELLED_VERSION and read_layout(conn) == 0 and object_exists(
        conn, "view", "messages_fts_trigram_source")


def effective_version(conn: sqlite3.Connection) -> int | None:
    """Return the stored schema version, reading this library's own former 32 as 31."""
    version = read_version(conn)
    return SCHEMA_VERSION if is_own_relabel(conn, version) else version


def written_levels(conn: sqlite3.Connection) -> tuple[int, int]:
    """Return the (schema version, layout revision) a file's rows were written in; (0, 0) when unreadable.

    The ladder steps at or below them already hold for those rows (`recover` passes this to build_file).
    """
    try:
        return effective_version(conn) or 0, read_layout(conn)
    except sqlite3.DatabaseError:
        return 0, 0


def _set_layout(conn: sqlite3.Connection, revision: int) -> None:
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)", (LAYOUT_KEY, str(revision)))


# Rows inserted by any program (hermes-agent, a sqlite3 shell) without a uid get one at once,
# in plain SQL: a uuid4 in hex (version nibble 4, variant 8-b), as append_message issues.
UID_TRIGGER = "messages_assign_uid"
UID_TRIGGER_SQL = (
    f"CREATE TRIGGER IF NOT EXISTS {UID_TRIGGER} AFTER INSERT ON messages WHEN new.message_uid IS NULL BEGIN "
    "UPDATE messages SET message_uid = lower(hex(randomblob(6)) || '4' || substr(hex(randomblob(2)), 2) "
    "|| substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || hex(randomblob(6))) "
    "WHERE id = new.id; END")


def _has_uid_trigger(conn: sqlite3.Connection) -> bool:
    return object_exists(conn, "trigger", UID_TRIGGER)


# --- reconciling columns --------------------------------------------------------------------------

def _addable(declaration: str) -> str:
    # ALTER TABLE ADD COLUMN refuses PRIMARY KEY/UNIQUE and NOT NULL without a default;
    # a column added to old rows cannot promise either, so the added form drops them.
    decl = declaration.replace("PRIMARY KEY AUTOINCREMENT", "").replace("PRIMARY KEY", "").replace("UNIQUE", "")
    if "NOT NULL" in decl and "DEFAULT" not in decl:
        decl = decl.replace("NOT NULL", "")
    return " ".join(decl.split())


def _reconcile_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """Add every declared column the tables lack; return the (table, column) pairs added.

    Idempotent: a "duplicate column" from a racing opener is tolerated. Runs inside the
    caller's write transaction.
    """
    added = []
    for table, lacking in missing_columns(conn).items():
        for column, declaration in lacking:
            try:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {_addable(declaration)}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc).lower():
                    raise
                continue
            added.append((table, column))
    return added


def backfill_message_uids(conn: sqlite3.Connection) -> int:
    """Give every message without a uid the stable uid derived from its place, in one statement; return how many.

    Rows written before message_uid existed get the uid every reader was shown for them before
    (a read-only handle, a conversation, an export: see derived_uid), so nothing a client kept
    from an older file changes name. Set-based, so an upgrade of a large file costs one pass,
    not one statement per row. The session id goes in as its stored bytes: a damaged one cannot
    stop the upgrade.
    """
    conn.create_function("hermes_derived_uid", 2, derived_uid, deterministic=True)
    return conn.execute("UPDATE messages SET message_uid = hermes_derived_uid(COALESCE(CAST(session_id AS BLOB), "
                        "X''), id) WHERE message_uid IS NULL").rowcount


def _backfill_counter(column: str) -> Callable[[sqlite3.Connection], object]:
    # Old layouts had no counters: derive them from the rows they summarise, by the declared
    # rule the write path keeps (live rows only).
    return lambda conn: conn.execute(recount_sql((column,)))


# A column that arrives in an old file with rows already present gets its meaning back here,
# in the same transaction as the ADD COLUMN.
_BACKFILL_ON_ADD: dict[tuple[str, str], Callable[[sqlite3.Connection], object]] = {
    ("messages", "message_uid"): backfill_message_uids,
    **{("sessions", c.column): _backfill_counter(c.column) for c in COUNTERS},
}


# --- the bodies of the ladders' data steps: set-based rewrites of an older file's rows -----------
# Each is one pass of a few statements, whatever the number of rows, inside the ladder's write
# transaction; rows already in the shape a step gives come out unchanged.

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


# --- the ladders ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One released ladder step: the version (or layout revision) it reaches, what changed, and its function.

    Iterates as (version, run), the pair older readers of the ladders unpack.
    """

    version: int
    what: str
    run: Callable[[sqlite3.Connection], object]  # what it returns (a backfill's count) is not read

    def __iter__(self) -> Iterator:
        return iter((self.version, self.run))


# Two ladders, oldest step first, filled by their decorators: LADDER for the real system's
# schema versions, LAYOUT_STEPS for this library's own layout revisions (run after it).
# Released steps are never edited; fix forward with a new one. A step runs once the tables hold
# every declared column, on the rows an upgrade found or `recover` copied (from a file of any
# version), so rows already in its shape must come out unchanged.
LADDER: list[Step] = []
LAYOUT_STEPS: list[Step] = []
_Run = TypeVar("_Run", bound=Callable[[sqlite3.Connection], object])  # a step's function, handed back as it came


def _registrar(ladder: list[Step], top: int, version: int, what: str) -> Callable[[_Run], _Run]:
    def register(run: _Run) -> _Run:
        if ladder and version <= ladder[-1].version or version > top:
            raise ValueError(f"ladder step {version} is out of order or past {top}, the newest this library writes")
        ladder.append(Step(version, what, run))
        return run
    return register


def step(version: int, what: str) -> Callable[[_Run], _Run]:
    """Register the decorated function as the LADDER step reaching schema `version`; `what` says what changed."""
    return _registrar(LADDER, SCHEMA_VERSION, version, what)


def layout_step(revision: int, what: str) -> Callable[[_Run], _Run]:
    """Register the decorated function as the LAYOUT_STEPS step reaching layout `revision`; `what` says what changed."""
    return _registrar(LAYOUT_STEPS, LAYOUT_REVISION, revision, what)


# A step that is one backfill is registered as data: the step's name, the version it reaches,
# what changed, and the backfill itself, whose own docstring says what it does to the rows.
v16_delegate_markers = step(16, "a subagent's session names its parent in model_config `_delegate_from` "
                                "('__orphaned__' once unlinked)")(mark_delegate_rows)
v17_seed_model_usage = step(17, "token usage is kept per model in session_model_usage; older sessions get one "
                                "row from their totals")(seed_model_usage)


@step(27, "session titles are unique: later holders of a repeated title become 'T #2', 'T #3', ...")
def v27_unique_titles(conn: sqlite3.Connection) -> None:
    """Number duplicate titles (`T`, `T #2`, ...) so the unique-title index can be built."""
    dupes = conn.execute(
        "SELECT title FROM sessions WHERE title IS NOT NULL GROUP BY title HAVING COUNT(*) > 1").fetchall()
    for (title,) in dupes:
        rows = conn.execute("SELECT id FROM sessions WHERE title = ? ORDER BY started_at, id", (title,)).fetchall()
        n = 2
        for (sid,) in rows[1:]:
            while conn.execute("SELECT 1 FROM sessions WHERE title = ?", (f"{title} #{n}",)).fetchone():
                n += 1
            conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (f"{title} #{n}", sid))
            n += 1


layout2_foreign_rows = layout_step(2, "every message row has a uid, also one another program inserted "
                                     "without it")(backfill_message_uids)
layout3_real_tables = layout_step(3, "async_delegations and session_model_usage have the real system's columns "
                                     "and keys")(adopt_real_tables)
layout4_null_active = layout_step(4, "a message stored with no active flag (a column added without its default) "
                                     "is live again")(heal_null_active)


def _set_version(conn: sqlite3.Connection, version: int) -> None:
    conn.execute("DELETE FROM schema_version")
    conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))


def is_older_file(conn: sqlite3.Connection) -> bool:
    """Tell whether the file holds sessions in a layout older than SCHEMA_VERSION (an upgrade is due)."""
    version = read_version(conn)
    if version is not None:
        return version < SCHEMA_VERSION
    return table_exists(conn, "sessions")


# --- building and migrating ------------------------------------------------------------------------

def _finish(conn: sqlite3.Connection) -> None:
    # What every open leaves in place: the declared indexes, the uid trigger, the current numbers.
    free_duplicate_titles(conn)  # else the unique-title index cannot be built
    for sql in INDEX_SQL:
        conn.execute(sql)
    conn.execute(UID_TRIGGER_SQL)
    if cast(int, read_version(conn)) < SCHEMA_VERSION:  # the version table exists by now
        _set_version(conn, SCHEMA_VERSION)
    if read_layout(conn) < LAYOUT_REVISION:
        _set_layout(conn, LAYOUT_REVISION)


def build_file(conn: sqlite3.Connection, fill: Callable[[sqlite3.Connection], None] | None = None, *,
               since: tuple[int, int] = (0, 0)) -> None:
    """Give an empty database the whole current layout: every declared table, index and trigger, the versions.

    The one way a new file is made: a fresh open and `recover` both come here. `fill(conn)` runs
    once the tables exist and before any index is built (recover copies rows there); the rows it
    wrote then get message uids and go through the steps of both ladders past `since` (the schema
    version and layout revision the rows were written in; by default every step, since rows
    salvaged from a damaged file may predate any of them). Runs inside the caller's write transaction.
    """
    for sql in TABLE_SQL:
        conn.execute(sql)
    _set_version(conn, 0)
    if fill is not None:
        fill(conn)
        backfill_message_uids(conn)
        for ladder, reached in ((LADDER, since[0]), (LAYOUT_STEPS, since[1])):
            for later in ladder:
                if later.version > reached:
                    later.run(conn)
    _finish(conn)


def _climb(writer: Writer, patience_s: float, policy: RetryPolicy, ladder: list[Step],
           read: Callable[[sqlite3.Connection], int], write: Callable[[sqlite3.Connection, int], None]) -> None:
    # One transaction per step with its number, re-read under the lock: another opener may be ahead.
    for later in ladder:
        with writer.transaction(patience_s, policy):
            if read(writer.conn) < later.version:
                later.run(writer.conn)
                write(writer.conn, later.version)


def migrate(writer: Writer, patience_s: float, policy: RetryPolicy,
            before_upgrade: Callable[[sqlite3.Connection], None] | None = None) -> int:
    """Bring the database up to SCHEMA_VERSION and LAYOUT_REVISION; return the version it had before.

    A newer-than-known version is returned untouched (the caller refuses writes); the 32 earlier
    releases of this library wrote is relabelled 31 and counts as 31 here. An empty file is
    built in one transaction (build_file). `before_upgrade(conn)` runs in the first transaction
    of an upgrade of an existing file, before any column is added or back-filled: the caller
    drops derived objects there (an older layout's FTS triggers would otherwise re-index every
    back-filled row).
    """
    conn = writer.conn
    with writer.transaction(patience_s, policy):
        found = read_version(conn)
        if found is not None and found > SCHEMA_VERSION:
            if not is_own_relabel(conn, found):
                return found
            _set_version(conn, SCHEMA_VERSION)
            _set_layout(conn, 1)
            found = SCHEMA_VERSION
        if found is None and not table_exists(conn, "sessions"):
            build_file(conn)
            return SCHEMA_VERSION
        if (found is None or found < SCHEMA_VERSION) and before_upgrade is not None:
            before_upgrade(conn)
        for sql in TABLE_SQL:
            conn.execute(sql)
        for key in _reconcile_columns(conn):
            if key in _BACKFILL_ON_ADD:
                _BACKFILL_ON_ADD[key](conn)
        if found is None:
            _set_version(conn, 0)
    _climb(writer, patience_s, policy, LADDER, cast(Callable[[sqlite3.Connection], int], read_version),
           _set_version)  # the version table exists from here on
    _climb(writer, patience_s, policy, LAYOUT_STEPS, read_layout, _set_layout)
    with writer.transaction(patience_s, policy):
        for name in RETIRED_INDEXES:  # an index no query needs any more only costs space and writes
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        _finish(conn)
    return found or 0


def integrity_problems(conn: sqlite3.Connection, full: bool = False) -> list[str]:
    """Return what SQLite's quick check (the full integrity check with `full`) finds; [] when healthy."""
    rows = conn.execute("PRAGMA integrity_check" if full else "PRAGMA quick_check").fetchall()
    return [] if rows == [("ok",)] else [str(r[0]) for r in rows]
