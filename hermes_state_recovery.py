"""Whole-file safety: online backups, validated restores, and salvage of damaged databases.

Owns: `backup_to` (a consistent copy through SQLite's backup API), `check_restorable` and
`restore_from` (a validated copy back into a live database), `recover` with `RecoveryReport`
(every readable row of a damaged file copied into a fresh one), `check_integrity` and `vacuum`,
and a file's statistics (`collect_state_db_stats`: sizes, counts and full-text state, read
without the library's schema work; `logical_size_bytes`).
Does not own: per-session export/import (hermes_state_portability), the open-time upgrade
(hermes_state_upgrade, which writes its first copy with `backup_to` and reclaims with `vacuum`),
the schema itself (hermes_state_schema) or the FTS indexes (hermes_state_fts), which `recover`
rebuilds through them.

Transaction contract: `backup_to` reads one snapshot of the caller's connection (the caller
holds its lock and no transaction). `restore_from` copies into the caller's connection, which
SQLite does as one write transaction: other handles see either the old or the restored file.
`recover` never writes to its source (opened read-only, immutable when it has no WAL) and
builds the target under a temporary name, renamed into place only when complete.
"""
from __future__ import annotations

import os
import re
import sqlite3
import stat
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, cast

import hermes_state_catalogue as catalogue
import hermes_state_fork as fork
import hermes_state_fts as fts
import hermes_state_lockowners as lockowners
import hermes_state_replicas as replicas
import hermes_state_schema as schema
from hermes_state_common import (DICTIONARY, RECOVER_EXCLUDED, RECOVER_VERIFIED, SCHEMA_VERSION, logger,
                                 recount_sql, table_exists)
from hermes_state_errors import StateDbBusyError, StateDbCorruptError, StateDbIncompatibleError, typed_errors
from hermes_state_writer import Cancelled, RetryPolicy, passive_checkpoint, reads_elsewhere, retry_on_lock

# Declared in the data dictionary: the runtime ledgers are never copied (a recovered file's first
# owner starts a new epoch); these tables' copied row counts are checked against the source's.
EXCLUDED_TABLES = RECOVER_EXCLUDED
VERIFIED_TABLES = RECOVER_VERIFIED
COPY_CHUNK_ROWS = 5000
# No statement recover runs on the source may work longer than this without handing back a row:
# a planted schema entry (a view over an endless recursive query posing as a table) is cut off.
STEP_LIMIT_S = 60.0
_REBUILT = frozenset({"schema_version", "sqlite_sequence", fts.CJK_PENDING})
_INT_MIN = -2**63


# --- backup and restore ---------------------------------------------------------------------------

def _private_new_file(path: Path) -> None:
    # Backups hold the same private data as the database: created 0600 and never over a file.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.close(fd)


def _link_into_place(partial: Path, target: Path) -> None:
    # A hard link never replaces anything: a file that appeared at `target` meanwhile (a restarting
    # gateway's new state.db, say) is kept, and this copy fails instead. Where the file system has no
    # hard links, the name is taken only if it is still free, with a moment's race left.
    try:
        os.link(partial, target)
    except FileExistsError:
        raise FileExistsError(f"{target} appeared while the copy was being made; it was left as it is, "
                              "and the copy was discarded: choose a new name") from None
    except OSError:
        if target.exists():
            raise FileExistsError(f"{target} appeared while the copy was being made; it was left as it is, "
                                  "and the copy was discarded: choose a new name") from None
        os.replace(partial, target)
        return
    partial.unlink()


@dataclass
class _Building:
    """A copy being built: the temporary file the body fills, and the name it takes once complete."""
    partial: Path
    target: Path


_RENAME_TRIES = 5


@contextmanager
def _built_atomically(target: Path, renamed: Callable[[], Path] | None = None) -> Iterator[_Building]:
    # The body fills a new private file under a temporary name; only a complete file takes the
    # target's name, never over a file, and a failure leaves nothing behind. With `renamed`, a
    # name taken meanwhile is no failure: the copy takes the next free one it gives.
    building = _Building(catalogue.partial_path(target), target)
    if not target.parent.is_dir():  # as open() and the command line: no folder is made on the way
        raise FileNotFoundError(f"{target.parent} does not exist: create the folder first, or write the copy elsewhere")
    _private_new_file(building.partial)
    try:
        yield building
        for attempt in range(1 if renamed is None else _RENAME_TRIES):
            try:
                _link_into_place(building.partial, building.target)
                break
            except FileExistsError:
                if renamed is None or attempt == _RENAME_TRIES - 1:
                    raise
                building.target = renamed()
    except BaseException:
        building.partial.unlink(missing_ok=True)
        raise


# A copy that can be stopped goes this many pages a step (16 MB of 4 KB pages).
STOPPABLE_STEP_PAGES = 4096
# Between two steps such a copy waits while another thread of this process reads, at most this
# long a step: on a file not in the OS cache, its reads and writes would queue in front of the
# reads someone is waiting for (a listing made while a 16 GB file was moved in took 48 s).
GIVE_WAY_MAX_S = 1.0
_GIVE_WAY_POLL_S = 0.005


def backup_to(conn: sqlite3.Connection, target_path: str | os.PathLike, stop: threading.Event | None = None,
              renamed: Callable[[], Path] | None = None, give_way: Callable[[], bool] | None = None) -> Path:
    """Write a consistent copy of the database (ledgers included) to a new file; return its path.

    Uses SQLite's backup API: other processes keep writing meanwhile (WAL), and the copy is the
    database as of one moment. Refuses an existing `target_path`. The copy appears under its
    name only once complete; with `renamed`, under the next name it gives if another file took
    the first one meanwhile. With `stop` (on a connection lent to this copy alone) it goes a
    bounded step at a time inside one read transaction, lets a fork through between steps and
    waits there while another thread of this process reads (at most GIVE_WAY_MAX_S a step, and
    only while `give_way()`, when given, says so), and ends with Cancelled, leaving nothing
    behind, once `stop` is set.
    """
    target = Path(target_path).expanduser().absolute()
    if target.exists() and renamed is None:
        raise FileExistsError(f"{target} already exists; choose a new name for the backup")
    with _built_atomically(target, renamed) as building:
        if stop is None:
            dest = sqlite3.connect(building.partial)
            try:
                conn.backup(dest)
            finally:
                dest.close()
        else:
            _stepped_backup(conn, building.partial, stop, give_way)
    return building.target


def _stepped_backup(conn: sqlite3.Connection, partial: Path, stop: threading.Event,
                    give_way: Callable[[], bool] | None = None) -> None:
    # Run on a thread of its own, so every call into SQLite is a stretch of the fork gate: a fork
    # elsewhere waits for the step under way and goes through between two steps, where this thread
    # holds none of SQLite's mutexes. The read transaction is held across the steps: SQLite's backup
    # then reads one snapshot and never starts over when another process writes between two steps
    # (under a steady trickle of appends it would never finish). Meanwhile the WAL cannot restart, so
    # it grows by what others write until the copy ends (docs/scaling.md has the figures).
    def between_steps(status: int, remaining: int, total: int) -> None:
        fork.GATE.leave()
        until = time.monotonic() + GIVE_WAY_MAX_S
        while (reads_elsewhere() and (give_way is None or give_way()) and not stop.is_set()
               and time.monotonic() < until):
            time.sleep(_GIVE_WAY_POLL_S)
        if stop.is_set():
            fork.GATE.enter()  # the block's own leave() follows the exception
            raise Cancelled("the copy was stopped before it was complete")
        fork.GATE.enter()

    with fork.GATE.work():
        dest = sqlite3.connect(partial)
        try:
            conn.execute("BEGIN")
            try:
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # the snapshot starts here
                conn.backup(dest, pages=STOPPABLE_STEP_PAGES, progress=between_steps)
            finally:
                conn.execute("COMMIT")
        finally:
            dest.close()


class _Bounded(sqlite3.Connection):
    """A source connection whose statements are interrupted after STEP_LIMIT_S without progress."""

    mark = 0.0

    def execute(self, *args) -> sqlite3.Cursor:  # type: ignore[override]
        self.mark = time.monotonic()
        return super().execute(*args)

    def overdue(self) -> bool:
        return time.monotonic() - self.mark > STEP_LIMIT_S


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _open_source(path: Path) -> sqlite3.Connection:
    # Read-only always; immutable (no locks, no -shm) when no WAL holds committed pages, so a
    # damaged file or a file on a read-only medium is read exactly as it lies on disk.
    wal = Path(f"{path}-wal")
    query = "?mode=ro" if wal.exists() and wal.stat().st_size > 0 else "?mode=ro&immutable=1"
    conn = sqlite3.connect(path.as_uri() + query, uri=True, isolation_level=None, factory=_Bounded)
    conn.execute("PRAGMA query_only = ON")
    conn.set_progress_handler(conn.overdue, 10_000)
    # Text another client stored as bytes that are not UTF-8 is salvaged with U+FFFD, as the
    # library reads it everywhere else, rather than losing the row.
    conn.text_factory = schema.LENIENT_TEXT
    return conn


def check_restorable(source: str | os.PathLike) -> Path:
    """Validate a file to restore from: integrity_check, a schema not newer than ours, only objects we create."""
    path = Path(source).expanduser().absolute()
    if not path.is_file() or path.stat().st_size == 0:
        raise FileNotFoundError(f"{path} does not exist or is empty")
    conn = _open_source(path)
    try:
        with typed_errors(path, reading=True):
            verdict = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            if verdict != ["ok"]:
                raise StateDbCorruptError(f"{path} fails integrity_check ({'; '.join(verdict[:3])}); nothing "
                                          "was restored. Run `recover` on it to salvage what is readable.")
            version = catalogue.restorable_version(conn, path, fts.OWN_OBJECTS)  # an earlier release's 32 restores as 31
    finally:
        conn.close()
    if version is None:
        raise StateDbIncompatibleError(f"{path} is not a hermes-state database (no schema_version); nothing was restored")
    if version > SCHEMA_VERSION:
        raise StateDbIncompatibleError(f"{path} has schema version {version}, newer than this library's "
                                       f"{SCHEMA_VERSION}; upgrade hermes-state to restore it")
    return path


def restore_from(conn: sqlite3.Connection, source: Path, set_up: Callable[[sqlite3.Connection], Any]) -> Any:
    """Replace the content of `conn`'s database with `source` (already checked); return what `set_up` returns.

    The copy goes through SQLite (backup API into the live connection, one write transaction),
    never a file copy over a database someone has open: every other handle sees the old file or
    the restored one. `set_up(conn)` then upgrades a backup of an older version like any older file.
    """
    src = _open_source(source)
    try:
        src.backup(conn)
    except sqlite3.OperationalError as exc:
        raise StateDbIncompatibleError(
            f"cannot restore {source} into the live database ({exc}); a WAL database only takes a "
            "copy with the same page size") from exc
    finally:
        src.close()
    logger.info("restored %s from %s", conn.execute("PRAGMA database_list").fetchone()[2], source)
    return set_up(conn)


# --- giving freed pages back ----------------------------------------------------------------------

# Set by an upgrade (hermes_state_upgrade): the old layout's index pages were freed, and the file
# should shrink once the new indexes are built. A VACUUM, asked for or not, settles it.
RECLAIM_KEY = "reclaim_after_rebuild"


def vacuum(conn: sqlite3.Connection, patience_s: float, policy: RetryPolicy) -> dict[str, int]:
    """Rewrite the file without its free pages (VACUUM) and switch it to incremental auto-vacuum.

    Runs outside any transaction, holding the write lock for the whole rewrite (seconds per GB:
    writers wait meanwhile). Then a TRUNCATE checkpoint empties the log, unless Litestream
    replicates the file: then a PASSIVE one, and the log is left for Litestream's own
    checkpoints. Returns {"bytes_before", "bytes_after"}.
    """
    def size() -> int:
        return conn.execute("PRAGMA page_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0]
    before = size()

    def attempt() -> None:
        # The rewrite holds writers anyway: the indexes an open leaves unbuilt come first, so
        # that the VACUUM packs them too.
        schema.build_late_indexes(conn)
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # takes effect with this VACUUM
        conn.execute("VACUUM")
    retry_on_lock(attempt, patience_s, policy)
    clear_reclaim_mark(conn, patience_s, policy)
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    shipping = replicas.replicating(path) if path else []
    if shipping:
        # Litestream reads the log's frames while it ships them, holding a read transaction so
        # that nothing starts the log over meanwhile; a TRUNCATE waits for that transaction with
        # every writer held up, nearly always in vain, and when it slips into the moment
        # Litestream lets go for its own checkpoint it cuts the log short under a read ("sync
        # error ... read page N @ offset: EOF"). A PASSIVE checkpoint copies what it may now;
        # Litestream's next checkpoint copies the rest, and the file shrinks then.
        logger.info("%s: Litestream (PID %s) replicates this file: its log is left for Litestream's checkpoints "
                    "rather than truncated", path, ", ".join(map(str, shipping)))
        passive_checkpoint(conn)
    else:
        try:  # fold the rewritten pages in now, so the file (not only its WAL) shrinks
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            logger.info("checkpoint after VACUUM skipped: %s", exc)
    return {"bytes_before": before, "bytes_after": size()}


def clear_reclaim_mark(conn: sqlite3.Connection, patience_s: float, policy: RetryPolicy) -> None:
    """Forget an upgrade's request to give freed pages back; one autocommit statement (VACUUM needs none open)."""
    retry_on_lock(lambda: conn.execute("DELETE FROM state_meta WHERE key = ?", (RECLAIM_KEY,)), patience_s, policy)


# --- checking a whole file ------------------------------------------------------------------------

def check_integrity(read: Callable[[], AbstractContextManager[sqlite3.Connection]],
                    write: Callable[[], AbstractContextManager[sqlite3.Connection]] | None,
                    full: bool = False) -> dict[str, Any]:
    """Return {"ok", "problems", "fts"}: SQLite's quick check (full with `full`) and each FTS index's check.

    `read()` and `write()` open the caller's transactions. The FTS checks need `write` (FTS5
    runs them as write commands, changing nothing); without it "fts" is empty.
    """
    with read() as conn:
        problems = schema.integrity_problems(conn, full)
    report: dict[str, str] = {}
    if write is not None:
        # One write transaction per index: each check reads every text its index holds.
        for table in fts.FTS_TABLES:
            with write() as conn:
                report.update(fts.integrity_report(conn, (table,)))
    return {"ok": not problems and all(v == "ok" for v in report.values()), "problems": problems, "fts": report}


# --- a file of zeros ------------------------------------------------------------------------------
# A crash of some file systems (or a copy made mid-write) leaves state.db at its size with every
# byte zero: no SQLite header, nothing to salvage. hermes-agent moves such a file aside at start-up
# so a fresh one can be made; these are its two names, with the same file names on disk.

def is_zeroed_state_db(path: str | os.PathLike, *, probe_bytes: int = 100, force: bool = False) -> bool:
    """Tell whether a file is a database zeroed out: not empty, its first `probe_bytes` bytes all NUL.

    Reading the header opens the file itself, and closing that descriptor would drop this
    process's locks on a live database; so a file this process has open is answered False unless
    `force` (for files known to be offline: copies, quarantined files).
    """
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return False
    if not force and lockowners.open_in_this_process(path):
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(max(1, min(int(probe_bytes), st.st_size)))
    except OSError:
        return False
    return bool(head) and not head.strip(b"\0")


@contextmanager
def _quarantine_lock(path: Path) -> Iterator[None]:
    # Two processes starting together must not both move the file: the second waits here, then
    # finds it already gone. The lock file is a sibling, never the database itself.
    try:
        import fcntl
    except ImportError:  # no advisory locks here (Windows): the re-check alone has to do
        yield
        return
    with open(path.with_name(path.name + ".quarantine.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def quarantine_zeroed_state_db(path: str | os.PathLike) -> Path | None:
    """Move a zeroed database file (and its -wal and -shm) aside, bytes kept; return where it went, or None when it is not zeroed.

    The copy is named `<name>.zeroed-<YYYYmmdd-HHMMSS>-<pid>.bak` beside it.
    """
    target = Path(path)
    with _quarantine_lock(target):
        if not is_zeroed_state_db(target):
            return None
        stem = f"{target.name}.zeroed-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.bak"
        aside, n = target.with_name(stem), 1
        while aside.exists():
            n += 1
            aside = target.with_name(f"{stem}.{n}")
        os.rename(target, aside)
        for suffix in ("-wal", "-shm"):
            side = Path(str(target) + suffix)
            if side.exists():
                os.rename(side, Path(str(aside) + suffix))
    logger.warning("%s held only zeros (no SQLite header); moved aside to %s", target, aside)
    return aside


# --- recover --------------------------------------------------------------------------------------

@dataclass
class TableRecovery:
    """What recover did with one table."""

    copied: int = 0
    source_rows: int | None = None  # the source's own count; None when even counting failed
    rejected: int = 0               # rows read but refused by the new schema (a NOT NULL, a duplicate key)
    lost_ranges: list[tuple[int, int | None]] = field(default_factory=list)  # unreadable rowids (None: to the end)
    error: str | None = None        # the first read error met
    lost: int | None = 0            # source rows not in the target (None: the source could not be counted)

    def finish(self) -> None:
        """Work out `lost` once copying is over."""
        if self.source_rows is None:
            self.lost = None if self.lost_ranges or self.error else 0
        else:
            self.lost = max(self.source_rows - self.copied, 0)

    def loss(self, name: str) -> str:
        """Say in a sentence what table `name` lost or had refused."""
        ranges = ", ".join(f"{a}..{'end' if b is None else b}" for a, b in self.lost_ranges)
        return (f"{name}: {'an unknown number of' if self.lost is None else self.lost} row(s) lost"
                + (f" (unreadable rowids {ranges})" if ranges else "")
                + (f", {self.rejected} refused by the schema" if self.rejected else "")
                + (f"; first error: {self.error}" if self.error else ""))


@dataclass
class RecoveryReport:
    """The outcome of `recover`: per-table counts, what was lost, excluded and rebuilt.

    Plain fields only, so `dataclasses.asdict(report)` is the whole story for a machine.
    """

    source: Path
    target: Path
    tables: dict[str, TableRecovery] = field(default_factory=dict)
    excluded: tuple[str, ...] = EXCLUDED_TABLES  # the runtime ledgers, never copied
    rebuilt: tuple[str, ...] = ("schema_version", *fts.FTS_TABLES)
    dropped_columns: dict[str, list[str]] = field(default_factory=dict)  # source columns the schema lacks
    placeholder_sessions: list[str] = field(default_factory=list)  # made for messages whose session was lost
    detached_parents: list[str] = field(default_factory=list)      # sessions whose parent was lost
    orphan_rows_dropped: dict[str, int] = field(default_factory=dict)
    # Sessions that have fewer live messages than they counted: id -> [counted, kept].
    sessions_short: dict[str, list[int]] = field(default_factory=dict)
    integrity: str = ""
    # For sessions, messages and delivery_obligations: whether copied == the source's count.
    verified: dict[str, bool] = field(default_factory=dict)
    losses: list[str] = field(default_factory=list)  # each loss in a sentence, for people
    complete: bool = False  # nothing lost or refused, and the target passed integrity_check

    def finish(self) -> None:
        """Work out `verified`, `losses` and `complete` once the target is built."""
        for table in self.tables.values():
            table.finish()
        self.verified = {name: t.source_rows is not None and t.copied == t.source_rows
                         for name, t in self.tables.items() if name in VERIFIED_TABLES}
        self.losses = [t.loss(name) for name, t in self.tables.items() if t.lost or t.lost is None or t.rejected]
        self.losses += [f"{name}: {n} row(s) dropped, their session was lost"
                        for name, n in self.orphan_rows_dropped.items()]
        self.losses += [f"session {sid}: {counted - kept} of its {counted} messages lost"
                        for sid, (counted, kept) in self.sessions_short.items()]
        self.complete = self.integrity == "ok" and not self.losses


def _source_tables(conn: sqlite3.Connection) -> list[tuple[str, str | None]]:
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' "
                        "ESCAPE '\\'").fetchall()
    # Only a table's own definition is ever read through: an entry typed `table` holding any
    # other statement (a view, say) would run stored SQL, so recover reports it and never reads it.
    rows = [(name, sql if re.match(r"\s*CREATE\s+(VIRTUAL\s+)?TABLE\b", sql or "", re.IGNORECASE)
             and not re.search(r"\bAS\s+(SELECT|WITH|VALUES)\b", sql, re.IGNORECASE) else None) for name, sql in rows]
    virtual = [name for name, sql in rows if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
    # Full-text tables and their shadow tables are derived data: rebuilt, never copied.
    def derived(name: str) -> bool:
        return name in virtual or any(name.startswith(v + "_") for v in virtual) or name.startswith("messages_fts")
    return [(name, sql) for name, sql in rows if not derived(name) and name not in _REBUILT]


def _count(conn: sqlite3.Connection, table: str) -> int | None:
    """Return the source's row count, through an index when the table itself is damaged; None if none works."""
    attempts = [f'SELECT COUNT(*) FROM {_quote(table)}']
    try:
        indexes = conn.execute("SELECT name, partial FROM pragma_index_list(?)", (table,)).fetchall()
    except sqlite3.DatabaseError:
        indexes = []
    attempts += [f'SELECT COUNT(*) FROM {_quote(table)} INDEXED BY {_quote(name)}' for name, partial in indexes
                 if not partial]
    for sql in attempts:
        try:
            return conn.execute(sql).fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if _interrupted(exc):
                return None
            continue
    return None


def _interrupted(exc: BaseException) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == 9  # SQLITE_INTERRUPT: STEP_LIMIT_S ran out


_UNREADABLE = "unreadable"


def _row_after(conn: sqlite3.Connection, table: str, names: str, x: int) -> tuple | str | None:
    """Return (rowid, *columns) of the one row after `x`, None if none, _UNREADABLE if it fails or lies <= x."""
    try:
        row = conn.execute(f'SELECT rowid, {names} FROM {_quote(table)} WHERE rowid > ? ORDER BY rowid LIMIT 1',
                           (x,)).fetchone()
    except sqlite3.DatabaseError as exc:
        if _interrupted(exc):
            raise
        return _UNREADABLE
    return _UNREADABLE if row is not None and row[0] <= x else row


def _next_readable(conn: sqlite3.Connection, table: str, names: str, after: int) -> int | None:
    """Return a rowid past `after` from which reading works again (None: nothing readable follows).

    Gallops forward to a rowid whose next row reads, then narrows down, so that only the rows of
    the damaged pages are skipped: at most about 126 one-row reads, however far apart the rowids.
    """
    def good(x: int) -> bool:
        return _row_after(conn, table, names, x) is not _UNREADABLE
    bad, step = after, 1
    while True:
        probe = after + step
        if probe >= 2**63 - 1:
            return None
        if good(probe):
            break
        bad, step = probe, step * 2
    found = probe
    while found - bad > 1:
        mid = (found + bad) // 2
        if good(mid):
            found = mid
        else:
            bad = mid
    return found if _row_after(conn, table, names, found) is not None else None


class _RowCopy:
    """One table's copy from a damaged source into the new file, recording what it met in `report`."""

    def __init__(self, src: sqlite3.Connection, dst: sqlite3.Connection, table: str, columns: list[str],
                 report: TableRecovery) -> None:
        self.src, self.dst, self.table, self.report = src, dst, table, report
        self.names = ", ".join(_quote(c) for c in columns)
        self.insert = f'INSERT INTO {_quote(table)} ({self.names}) VALUES ({", ".join("?" * len(columns))})'

    def run(self, rowid: bool) -> None:
        (self.by_rowid if rowid else self.read_on)()

    def put(self, rows: list[tuple]) -> None:
        """Insert `rows`; the ones the schema refuses are counted and the rest kept."""
        cast(_Bounded, self.src).mark = time.monotonic()  # rows arrived: the step limit counts from here
        try:
            with_savepoint(self.dst, lambda: self.dst.executemany(self.insert, rows))
            self.report.copied += len(rows)
        except sqlite3.IntegrityError:
            for row in rows:  # find the refused rows one by one; keep the rest
                try:
                    self.dst.execute(self.insert, row)
                    self.report.copied += 1
                except sqlite3.IntegrityError as exc:
                    self.report.rejected += 1
                    self.report.error = self.report.error or f"refused: {exc}"

    def step_over(self, last: int) -> int | None:
        """Move past `last` after a failed read; return the rowid to go on from, None at the end."""
        # Copy the next row alone if it reads (a cursor steps one row ahead, so the error may be
        # the following row's), else skip to where reading works again. Either way `last` moves
        # forward and the next read copies a row: bounded work per row.
        row = _row_after(self.src, self.table, self.names, last)
        if row is None:
            return None
        if isinstance(row, tuple):
            self.put([row[1:]])
            return int(row[0])
        resume = _next_readable(self.src, self.table, self.names, last)
        self.report.lost_ranges.append((last + 1, resume))
        return resume

    def read_on(self) -> None:
        """Copy a table without rowids: read on until the first error, one chunk in memory at a time."""
        cur = None
        while True:
            try:
                cur = cur or self.src.execute(f'SELECT {self.names} FROM {_quote(self.table)}')
                rows = cur.fetchmany(COPY_CHUNK_ROWS)
            except sqlite3.DatabaseError as exc:
                if _interrupted(exc):
                    raise
                self.report.error = str(exc)
                return
            self.put(rows)
            if len(rows) < COPY_CHUNK_ROWS:
                return

    def _batch(self, last: int) -> tuple[list[tuple], int, sqlite3.DatabaseError | None]:
        # The rows after `last` up to a chunk, the highest rowid seen, and the read error if one cut it short.
        batch: list[tuple] = []
        try:
            for row in self.src.execute(f'SELECT rowid, {self.names} FROM {_quote(self.table)} WHERE rowid > ? '
                                        'ORDER BY rowid LIMIT ?', (last, COPY_CHUNK_ROWS)):
                batch.append(row[1:])
                last = max(last, row[0])  # a damaged page can hand back smaller rowids: never go back
        except sqlite3.DatabaseError as exc:
            return batch, last, exc
        return batch, last, None

    def by_rowid(self) -> None:
        """Copy chunk by chunk in rowid order, stepping over what cannot be read."""
        last = _INT_MIN
        while True:
            before = last
            batch, last, failed = self._batch(last)
            self.put(batch)
            if failed is not None:
                if _interrupted(failed):
                    raise failed
                self.report.error = self.report.error or str(failed)
            elif len(batch) < COPY_CHUNK_ROWS:
                return
            elif last == before:  # a full batch of rowids at or before `last`: the order is broken here
                self.report.error = self.report.error or f"rows out of rowid order after rowid {last}"
            else:
                continue
            resumed = self.step_over(last)
            if resumed is None:
                return
            last = resumed


def with_savepoint(conn: sqlite3.Connection, body: Callable[[], object]) -> None:
    """Run `body` inside a SAVEPOINT: on an error its writes are undone and the error re-raised."""
    conn.execute("SAVEPOINT hermes_copy")
    try:
        body()
    except BaseException:
        conn.execute("ROLLBACK TO hermes_copy")
        conn.execute("RELEASE hermes_copy")
        raise
    conn.execute("RELEASE hermes_copy")


def _fix_references(dst: sqlite3.Connection, report: RecoveryReport) -> None:
    # Messages whose session row was lost keep their text under a placeholder session, so
    # nothing readable is thrown away; other rows with a foreign key to a lost session are dropped.
    report.placeholder_sessions = [r[0] for r in dst.execute(
        "SELECT DISTINCT session_id FROM messages WHERE session_id NOT IN (SELECT id FROM sessions) ORDER BY 1")]
    dst.execute("INSERT INTO sessions (id, source, started_at, title) SELECT session_id, 'recovered', MIN(timestamp), "
                "NULL FROM messages WHERE session_id NOT IN (SELECT id FROM sessions) GROUP BY session_id")
    report.detached_parents = [r[0] for r in dst.execute(
        "SELECT id FROM sessions WHERE parent_session_id IS NOT NULL "
        "AND parent_session_id NOT IN (SELECT id FROM sessions) ORDER BY id")]
    dst.execute("UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id NOT IN (SELECT id FROM sessions)")
    for table in (t for t in _ORPHANS_DROPPED if table_exists(dst, t)):  # a first-use table may be absent
        n = dst.execute(f"DELETE FROM {table} WHERE session_id NOT IN (SELECT id FROM sessions)").rowcount
        if n:
            report.orphan_rows_dropped[table] = n
    # Before the recount: a session's own count, from the source, says how many live messages it had.
    report.sessions_short = {sid: [counted, kept] for sid, counted, kept in dst.execute(
        "SELECT s.id, s.message_count, (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.active = 1) "
        "AS kept FROM sessions s WHERE s.message_count > kept ORDER BY s.id")}
    dst.execute(recount_sql())  # counters describe the rows that exist now


# Copied tables whose rows hold a foreign key to their session (messages get placeholders instead).
_ORPHANS_DROPPED = tuple(t.name for t in DICTIONARY.values() if t.recover in ("copy", "verify")
                         and t.references("sessions") and t.name not in ("sessions", "messages"))


def recover(source_path: str | os.PathLike, target_path: str | os.PathLike) -> RecoveryReport:
    """Copy every readable row of `source_path` into a fresh database at `target_path`; report what was lost.

    Tables with rows are copied (columns this schema knows; the rest are listed in
    `dropped_columns`); FTS indexes and schema_version are rebuilt; `delivery_obligations` is
    copied when present; the runtime ledgers are excluded. A table that fails midway is read on
    from the next readable rowid. The source is never written; the target must not exist.
    """
    source = Path(source_path).expanduser().absolute()
    target = Path(target_path).expanduser().absolute()
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    if target.exists():
        raise FileExistsError(f"{target} already exists; recover writes a new file")
    report = RecoveryReport(source, target)
    src = _open_source(source)
    # Read a file cut short (its header counts more pages than it holds) and a schema with a damaged
    # entry, both refused outright by default. The connection stays read-only.
    src.execute("PRAGMA writable_schema = ON")
    src.execute("BEGIN")  # one snapshot for every table, should another process still be writing
    try:
        with _built_atomically(target) as building:
            try:  # (a damaged schema name that is not UTF-8 makes SQLite's error message undecodable)
                tables = _source_tables(src)
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                unreadable = StateDbCorruptError(f"{source}: its schema cannot be read ({exc}); nothing can be salvaged")
                unreadable.path = source  # the command line adds what else can be done
                raise unreadable from exc
            dst = sqlite3.connect(building.partial, isolation_level=None)
            # The store's own page size: `restore` copies into a live WAL store page by page, which
            # takes only a file of the same page size.
            dst.execute(f"PRAGMA page_size = {schema.PAGE_SIZE}")
            try:
                _build(src, dst, tables, report)
            finally:
                dst.close()
    finally:
        src.close()
    report.finish()
    for line in report.losses:
        logger.warning("recover %s: %s", source, line)
    return report


def _create_foreign(dst: sqlite3.Connection, name: str, sql: str) -> None:
    # A damaged schema entry can pair a name with another object's statement: create only the table it names.
    objects = "SELECT type, name FROM sqlite_master WHERE type != 'index'"
    before = set(dst.execute(objects))
    dst.execute(sql)
    if set(dst.execute(objects)) - before != {("table", name)}:
        raise sqlite3.DatabaseError(f"its schema entry does not create the table {name!r} alone")


def _copy_table(src: sqlite3.Connection, dst: sqlite3.Connection, name: str, sql: str | None,
                report: RecoveryReport) -> None:
    # One source table into the new file: the columns this library declares (an undeclared table
    # is created as it was), from the first readable row to the last.
    result = report.tables[name] = TableRecovery()
    if sql is None:
        result.error = "its schema entry is not a table definition; it was not read"
        return
    result.source_rows = _count(src, name)
    try:
        src_cols = [r[0] for r in src.execute("SELECT name FROM pragma_table_info(?)", (name,))]
        without_rowid = "WITHOUT ROWID" in (sql or "").upper()
    except sqlite3.DatabaseError as exc:
        result.error = str(exc)
        return
    declared = DICTIONARY.get(name)
    if declared is not None:
        dst.execute(declared.sql)  # a table made on first use exists once the source has it
        columns = [c for c in src_cols if c in declared.column_names]
    else:
        try:  # a table this library does not declare is kept as it was
            with_savepoint(dst, lambda: _create_foreign(dst, name, sql))
        except sqlite3.DatabaseError as exc:  # its definition in the source's schema is damaged
            result.error = f"its definition cannot be used: {exc}"
            return
        columns = src_cols
    if not columns:
        result.error = result.error or "none of its columns can be read"
        return
    if dropped := [c for c in src_cols if c not in columns]:
        report.dropped_columns[name] = dropped
    try:
        _RowCopy(src, dst, name, columns, result).run(rowid=not without_rowid)
    except sqlite3.DatabaseError as exc:  # only an interrupted step gets here: the rest is read on
        result.error = f"reading it made no progress for {STEP_LIMIT_S:.0f} s ({exc}); the rest was not read"


def _build(src: sqlite3.Connection, dst: sqlite3.Connection, tables: list[tuple[str, str | None]],
           report: RecoveryReport) -> None:
    # A private file until renamed: its journal in memory (nearly empty: the file only grows), as a
    # SAVEPOINT needs one to roll back (with journal_mode OFF, ROLLBACK TO undoes nothing).
    dst.execute("PRAGMA journal_mode = MEMORY")
    dst.execute("BEGIN")
    report.excluded = EXCLUDED_TABLES  # whether or not the source has them: they are never copied

    def fill(conn: sqlite3.Connection) -> None:
        for name, sql in tables:
            if name not in EXCLUDED_TABLES:
                _copy_table(src, conn, name, sql, report)
        for name in sorted({"sessions", "messages"} - set(report.tables)):  # their schema entry was lost
            report.tables[name] = TableRecovery(source_rows=None, error="its definition cannot be read")
        conn.execute("DELETE FROM state_meta WHERE key IN (?, ?)", (fts.HIGH_WATER, fts.PROGRESS))

    schema.build_file(dst, fill, since=schema.written_levels(src))
    report.tables = {n: t for n, t in report.tables.items() if t.copied or t.source_rows or t.lost_ranges or t.error}
    _fix_references(dst, report)  # after the indexes: without them each session's recount scans every message
    fts.register_functions(dst)
    fts.create_fts(dst)
    while fts.advance(dst, fts.REBUILD_CHUNK_ROWS):
        pass
    problems = [tuple(r) for r in dst.execute("PRAGMA foreign_key_check")]
    if problems:  # _fix_references covers every declared reference; anything else is a bug here
        raise StateDbCorruptError(f"recovered rows still break references: {problems[:3]}")
    dst.execute("COMMIT")
    dst.execute("PRAGMA journal_mode = WAL")
    report.integrity = "; ".join(r[0] for r in dst.execute("PRAGMA integrity_check"))


# --- a store that cannot be opened: what can still be done ---------------------------------------

def unreadable_reason(source: str | os.PathLike) -> str | None:
    """Return why `recover` could read nothing of `source` (its header or schema is gone), or None when it can."""
    path = Path(source).expanduser().absolute()
    try:
        src = _open_source(path)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        src.execute("PRAGMA writable_schema = ON")
        tables = _source_tables(src)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        return "it is not a SQLite database" if "not a database" in str(exc) else f"its schema cannot be read ({exc})"
    finally:
        src.close()
    return None if tables else "it holds no tables"


def copies_beside(db_path: str | os.PathLike) -> list[Path]:
    """List the copies the library wrote beside a store before upgrading it, newest first."""
    path = Path(db_path).expanduser().absolute()
    try:
        found = [p for p in path.parent.glob(f"{path.name}.pre-v*.bak") if p.is_file()]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def damaged_store_advice(db_path: str | os.PathLike, command: str = "hermes-state") -> list[str]:
    """Say what can be done about a store that cannot be opened: salvage it, restore a copy, or start empty.

    `command` is the command line that selects this store (`hermes-state --db PATH`, `-p NAME`).
    """
    path = Path(db_path).expanduser().absolute()
    advice = []
    why = unreadable_reason(path)
    if why is None:
        salvaged = path.with_name(f"{path.name}.recovered")
        advice.append(f"`{command} recover {path} {salvaged}` copies every readable row into a new file; "
                      f"`{command} restore {salvaged}` then puts it in place (the damaged file is kept beside it)")
    else:
        advice.append(f"nothing in it can be salvaged: {why}")
    for copy in copies_beside(path)[:3]:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(copy.stat().st_mtime))
        advice.append(f"`{command} restore {copy}` puts back the copy written before an upgrade ({when})")
    folder = replicas.litestream_status(path)["folder"]
    if folder is not None:
        advice.append(f"Litestream replicated this file: `litestream restore -o {path}.restored {path}` "
                      f"(with its configuration) fetches the replica, and `{command} restore {path}.restored` "
                      "puts it in place")
    advice.append(f"`{command} restore` also takes a backup you made (`{command} backup`); or start empty: move "
                  f"{path.name} (with its -wal and -shm files) out of {path.parent}, then `{command} init`")
    return advice


def move_aside(db_path: str | os.PathLike, *, now: float | None = None) -> Path:
    """Rename a damaged store and its -wal/-shm files to `<name>.damaged-<UTC time>`; return the new name of the file.

    Refuses (StateDbBusyError) while another process has the file open: it may still be writing.
    """
    path = Path(db_path).expanduser().absolute()
    holders = lockowners.count_db_holders(path)
    if holders:
        raise StateDbBusyError(f"{path} is open in {holders} other process(es); stop them before it is moved aside")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 2
    while any(Path(f"{aside}{suffix}").exists() for suffix in ("", "-wal", "-shm")):
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
        n += 1
    # The log first: a -wal left behind would be replayed into the next file made under this name.
    for suffix in ("-wal", "-shm", ""):
        if os.path.lexists(f"{path}{suffix}"):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    return aside


# --- a file's statistics: sizes, counts and full-text state, read without the library's schema work ---

# How long the statistics probe waits for a lock before it reports a field as unknown.
STATS_BUSY_S = 0.5

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
