"""The open-time upgrade: what a writable open does before the handle serves its first call.

Owns the whole sequence, in order: opening the main connection (`open_connection`); WAL and
private file modes; detecting a file of an older
layout; writing the copy taken before anything changes (`start_upgrade`); the migration, with the
old layout's FTS objects removed first (`prepare_upgrade`: the pages of a large old index are
moved aside into plain `hermes_retired_fts_*` tables, not freed there); on a background thread,
emptying those tables a short transaction at a time (`clear_retired_step`) and building the FTS
indexes again (`open_fts`, `FtsRebuild`); and giving back the space the old layout freed
(`reclaim_after_upgrade`).
Does not own: the ladder's steps and the declared tables (hermes_state_schema), FTS index
maintenance (hermes_state_fts), whole-file copies and VACUUM (hermes_state_recovery).

Transaction contract: `set_up` runs on a connection no other thread uses yet, and migrates
through a private Writer of its own (one transaction per step, see `schema.migrate`). The rebuild
thread writes through the handle's Writer, one short transaction per chunk, so other writers get
turns; `FtsRebuild.stop()` makes it finish the chunk under way and stop.
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import hermes_state_catalogue as catalogue
import hermes_state_fork as fork
import hermes_state_fts as fts
import hermes_state_schema as schema
from hermes_state_common import (READ_BUSY_TIMEOUT_S, SCHEMA_VERSION, TABLE_SQL, UPGRADE_COPY_KEEP_DAYS, WRITE_PATIENCE_S,
                                 logger, object_exists)
from hermes_state_errors import StateDbUninitializedError, StoreUnavailableError, typed_errors
from hermes_state_writer import Cancelled, RetryPolicy, Writer

# An older layout's FTS5 tables are dropped at the upgrade only after their big tables were moved
# aside under these names (a catalogue change); freeing their pages is left to short transactions.
RETIRED_PREFIX = "hermes_retired_fts_"
CLEAR_CHUNK_S = 0.05             # one clearing transaction holds the write lock about this long
CLEAR_BATCH_ROWS = 4             # rows deleted between two looks at the clock (one may own MBs of overflow)
STAND_IN_ROOM_ROWS = 32          # rows of a moved-aside text freed before its empty stand-ins are made
_ROW_SHADOWS = ("data", "content", "docsize")  # an FTS5 table's rowid tables: nearly all of its pages
FTS5_HEADER_ROWS = (1, 10)      # the averages and structure records its constructor reads, even to drop it
RECLAIM_MIN_FREE = 0.10          # reclaim when more than this share of the file is free pages
AUTO_RECLAIM_MAX_BYTES = 1 << 30  # above this, a VACUUM blocks writers too long to run unasked
STOP_WAIT_S = 5.0                # how long close() waits for the chunk under way
# The most the upgrade's first transaction spends freeing pages ahead of its back-fill. Writes wait
# for the whole upgrade anyway (minutes on a large file), and a budget of a few seconds freed too
# little on a loaded machine, so the file grew; this cap only guards against a runaway.
UPGRADE_FREE_S = 60.0


# --- before the migration: the copy, and the old FTS objects -------------------------------------
# One copy per upgrade: written complete under a pending name, recorded by the upgrade's first
# transaction (one opener of all holds its write lock), then named; the rest is in
# hermes_state_catalogue ("the copies an upgrade takes first"). An upgrade resumed after a kill
# takes no second copy (the file is no longer as it was): it keeps the recorded one.

def upgrade_backup_path(db_path: Path, *, now: float | None = None) -> Path:
    """Return the name of the copy an upgrade writes first: `state.db.pre-v31-<UTC time>.bak` (the version it upgrades to)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    path = db_path.with_name(f"{db_path.name}.pre-v{SCHEMA_VERSION}-{stamp}.bak")
    n = 2
    while path.exists():
        path = db_path.with_name(f"{db_path.name}.pre-v{SCHEMA_VERSION}-{stamp}-{n}.bak")
        n += 1
    return path


def tidy_upgrade_copies(conn: sqlite3.Connection, db_path: Path,
                        keep_days: float | None = UPGRADE_COPY_KEEP_DAYS) -> None:
    """At a writable open of an upgraded file: settle the pending copies killed openers left, remove those past the policy."""
    if str(db_path) == ":memory:":
        return
    copies = catalogue.upgrade_copies(db_path)
    if not copies or schema.is_older_file(conn):
        return  # the upgrade to come settles them, once its own copy is complete
    if any(c.pending_pid is not None for c in copies):
        catalogue.settle_pending_copies(db_path, catalogue.recorded_copy(conn))
    catalogue.remove_old_copies(db_path, keep_days)


class PreUpgradeCopy:
    """The copy one opener took (or found) before an upgrade, until the upgrade began with it or without it."""

    def __init__(self, db_path: Path, pending: Path | None = None, resumed: Path | None = None):
        self.db_path, self.pending, self.resumed = db_path, pending, resumed
        self.recorded = False   # begin() recorded `pending`, in a transaction that may not have committed
        self.settled = False
        self.result: Path | None = None

    def begin(self, conn: sqlite3.Connection) -> None:
        """In the upgrade's first transaction: record this copy as the one it begins with, unless one began earlier.

        The write lock held makes one opener of all the one that records.
        """
        recorded = catalogue.recorded_copy(conn)
        if recorded is None and self.pending is not None:
            if not self.pending.is_file():
                raise StoreUnavailableError(f"the copy taken before upgrading {self.db_path} ({self.pending}) "
                                            "disappeared before the upgrade began; the file was not changed")
            conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, ?)",
                         (catalogue.UPGRADE_COPY_KEY, self.pending.name))
            self.recorded = True

    def settle(self, conn: sqlite3.Connection) -> Path | None:
        """After the upgrade (or its failure): name the copy it began with, or remove this opener's own; return the handle's copy.

        The handle's copy is the one this opener began the upgrade with, or the recorded one of
        an upgrade it resumed; None when another opener began the upgrade. Once an upgrade began,
        the pending copies of killed openers are removed too.
        """
        if self.settled:
            return self.result
        try:
            recorded = catalogue.recorded_copy(conn)  # what committed: outside any transaction
        except sqlite3.Error as exc:  # left as it is: the next open settles it
            logger.info("the copy taken before upgrading %s is left as %s (%s)", self.db_path, self.pending, exc)
            return None
        self.settled, mine, self.pending = True, self.pending, None
        if mine is not None and recorded == mine.name:
            try:
                self.result = catalogue.name_upgrade_copy(mine)
            except OSError as exc:  # complete and recorded all the same: a later open names it
                logger.warning("the copy taken before upgrading %s keeps the name %s (%s)", self.db_path, mine.name, exc)
                self.result = mine
            logger.info("upgrading %s to schema version %s; a copy of the file as it was is in %s",
                        self.db_path, SCHEMA_VERSION, self.result)
        else:
            try:
                if mine is not None:
                    mine.unlink(missing_ok=True)  # another opener began the upgrade, with a copy of its own
            except OSError as exc:  # its process's pid in the name: a later open removes it once it is gone
                logger.warning("could not remove %s (%s)", mine, exc)
            self.result = self.resumed
        if recorded is not None:  # the upgrade began with a complete copy: those of killed openers go
            catalogue.settle_pending_copies(self.db_path, recorded)
        return self.result

    def discard(self) -> None:
        """Remove this opener's own copy, unless an upgrade transaction of this opener recorded it (settle decides then)."""
        if self.pending is not None and not self.recorded:
            self.pending.unlink(missing_ok=True)
            self.pending = None


def start_upgrade(conn: sqlite3.Connection, db_path: Path, *, backup: bool = True, stop: threading.Event | None = None,
                  give_way: Callable[[], bool] | None = None) -> PreUpgradeCopy | None:
    """Before an older file is upgraded: copy it next to itself, complete and synced, under a pending name.

    Returns the copy to pass to the migration (`before_upgrade`) and to settle after it, or None
    when no upgrade is due (or no copy was asked for: one INFO line says so). An upgrade that
    began earlier and was cut short takes no new copy: the returned one names the copy it began
    with. With `stop` the copy can be stopped between two of its steps, and `give_way()` says
    whether it may wait there for this process's reads (see recovery.backup_to).
    """
    with fork.GATE.work():  # a stretch of SQLite work: on MoveIn's thread, a fork elsewhere waits for it
        if str(db_path) == ":memory:" or not schema.is_older_file(conn):
            return None
        began = catalogue.recorded_copy(conn)
    if began is not None:
        found = catalogue.settle_pending_copies(db_path, began)
        logger.info("resuming the upgrade of %s to schema version %s begun earlier; the copy taken before it "
                    "began is %s", db_path, SCHEMA_VERSION, found or f"gone ({began})")
        return PreUpgradeCopy(db_path, resumed=found)
    if not backup:
        logger.info("upgrading %s to schema version %s (no copy taken first: backup_before_upgrade=False)",
                    db_path, SCHEMA_VERSION)
        return None
    final = upgrade_backup_path(db_path)
    import hermes_state_recovery as recovery  # here: a read-only open never copies, and never loads it
    try:
        pending = recovery.backup_to(conn, catalogue.pending_path(final), stop=stop, give_way=give_way)
        catalogue.sync_copy(pending)
    except (OSError, sqlite3.Error) as exc:
        # Never upgrade without the copy the caller was promised; nothing has been changed yet.
        raise StoreUnavailableError(
            f"{db_path} needs an upgrade, and the copy taken first could not be written ({exc}); the file "
            "was not changed. Free some space (the copy is as large as the file) or open it with "
            "backup_before_upgrade=False.") from exc
    return PreUpgradeCopy(db_path, pending)


def upgrade_step(copy: PreUpgradeCopy | None) -> Callable[[sqlite3.Connection], None]:
    """Return the migration's first-transaction step: the old FTS objects out, then the copy recorded."""
    def before_upgrade(conn: sqlite3.Connection) -> None:
        prepare_upgrade(conn)
        if copy is not None:
            copy.begin(conn)
    return before_upgrade


def prepare_upgrade(conn: sqlite3.Connection) -> None:
    """Remove an older layout's FTS objects and mark the file for reclaiming the space they held.

    Runs in the upgrade's first transaction, before any back-fill: the old triggers would
    otherwise re-index every back-filled row one by one. An FTS5 table's pages are moved aside
    (`retire_fts5_table`) rather than freed here; the indexes are rebuilt in the background.
    """
    import hermes_state_recovery as recovery  # here: a read-only open never upgrades, and never loads it
    kept: list[str] = []
    fts.drop_fts_objects(conn, retire=lambda c, name, sql: keep_old_substrings(c, name, sql, kept)
                         or retire_fts5_table(c, name, sql))
    conn.execute(next(sql for sql in TABLE_SQL if " state_meta (" in sql))  # an old layout may lack it yet
    conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, '1')", (recovery.RECLAIM_KEY,))
    # The back-fill and the new indexes that follow take their pages from these.
    rows = conn.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0] \
        if object_exists(conn, "table", "messages") else 0
    free_ahead(conn, reserve_bytes=FREE_RESERVE_BYTES + rows * UPGRADE_BYTES_PER_MESSAGE, budget_s=UPGRADE_FREE_S,
               once=True)
    if kept:  # what it holds: every message written before the upgrade began
        conn.execute("INSERT OR REPLACE INTO state_meta (key, value) VALUES (?, (SELECT COALESCE(MAX(id), 0) "
                     "FROM messages))", (fts.OLD_SUBSTRINGS_UPTO,))


def keep_old_substrings(conn: sqlite3.Connection, name: str, sql: str, kept: list[str]) -> bool:
    """Keep an older layout's positional trigram index under OLD_SUBSTRINGS; return False (nothing changed) when it cannot.

    While the new indexes are rebuilt, a search finds the rows not rebuilt yet through it (a
    phrase of a trigram index is a substring) instead of a bounded scan. FTS5 renames its own
    tables with it. Inside the caller's write transaction.
    """
    folded = " ".join(sql.lower().split())
    if (name != fts.TRIGRAM or "fts5" not in folded or "trigram" not in folded or "detail" in folded
            or "content=" in folded.replace(" ", "") or object_exists(conn, "table", fts.OLD_SUBSTRINGS)):
        return False  # not one whose own text answers a phrase (hermes-agent's is)
    conn.execute("SAVEPOINT hermes_keep")
    try:
        conn.execute(f'ALTER TABLE "{name}" RENAME TO "{fts.OLD_SUBSTRINGS}"')
    except sqlite3.DatabaseError as exc:
        conn.execute("ROLLBACK TO hermes_keep")
        conn.execute("RELEASE hermes_keep")
        logger.info("the old substring index is not kept for the rebuild (%s)", exc)
        return False
    conn.execute("RELEASE hermes_keep")
    kept.append(name)
    return True


def retire_old_substrings(conn: sqlite3.Connection) -> None:
    """Once no rebuild needs it, move the kept older substring index aside for clearing (or drop it whole).

    Inside the caller's write transaction; nothing to do when there is none or a rebuild still runs.
    """
    found = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                         (fts.OLD_SUBSTRINGS,)).fetchone()
    if found is None or fts.inspect(conn).rebuild is not None:
        return
    conn.execute("DELETE FROM state_meta WHERE key = ?", (fts.OLD_SUBSTRINGS_UPTO,))
    if not retire_fts5_table(conn, fts.OLD_SUBSTRINGS, found[0]):
        conn.execute(f'DROP TABLE "{fts.OLD_SUBSTRINGS}"')


def retire_fts5_table(conn: sqlite3.Connection, name: str, sql: str) -> bool:
    """Drop the FTS5 table `name` after moving its rowid tables aside; return False (nothing changed) when it cannot.

    Dropping an index of gigabytes frees every one of its pages in the dropping transaction,
    reading each: seconds per gigabyte with writers waiting. Renamed to `hermes_retired_fts_<n>_*`,
    they are plain tables (nothing reads them) that `clear_retired_step` empties later; the
    table itself is then dropped over empty stand-ins of the same names. Inside the caller's write
    transaction; a SQLite that refuses a step (defensive mode) leaves everything as it was.
    """
    if "fts5" not in sql.lower():
        return False
    number = 1
    while conn.execute("SELECT 1 FROM sqlite_master WHERE name GLOB ?", (f"{RETIRED_PREFIX}{number}_*",)).fetchone():
        number += 1
    conn.execute("SAVEPOINT hermes_retire")
    try:
        stand_ins = []
        for shadow in _ROW_SHADOWS:
            found = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                 (f"{name}_{shadow}",)).fetchone()
            if found is not None:
                conn.execute(f'ALTER TABLE "{name}_{shadow}" RENAME TO "{RETIRED_PREFIX}{number}_{shadow}"')
                stand_ins.append(found[0])
        if stand_ins and object_exists(conn, "table", f"{RETIRED_PREFIX}{number}_content"):
            # A few pages of its text freed first: the stand-ins take those, not new ones at the file's end.
            conn.execute(f'DELETE FROM "{RETIRED_PREFIX}{number}_content" WHERE rowid IN '
                         f'(SELECT rowid FROM "{RETIRED_PREFIX}{number}_content" LIMIT {STAND_IN_ROOM_ROWS})')
        for sql in stand_ins:
            conn.execute(sql)  # the empty stand-ins the table's constructor opens
        conn.execute(f'INSERT INTO "{name}_data" SELECT * FROM "{RETIRED_PREFIX}{number}_data" '
                     f"WHERE id IN ({', '.join(map(str, FTS5_HEADER_ROWS))})")
        conn.execute(f'DROP TABLE "{name}"')
    except sqlite3.DatabaseError as exc:
        conn.execute("ROLLBACK TO hermes_retire")
        conn.execute("RELEASE hermes_retire")
        logger.info("the old full-text table %s is dropped in one piece (%s)", name, exc)
        return False
    conn.execute("RELEASE hermes_retire")
    return True


def retired_tables(conn: sqlite3.Connection) -> list[str]:
    """Return the tables an upgrade moved aside that still wait to be emptied."""
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB ? "
                                       "ORDER BY name", (f"{RETIRED_PREFIX}*",))]


def clear_retired_step(conn: sqlite3.Connection, budget_s: float | None = None) -> bool:
    """Free the next share of the pages an upgrade moved aside (about `budget_s` of work); return whether more remains.

    Inside the caller's write transaction: the older substring index kept for a rebuild is moved
    aside first once no rebuild needs it, then rows are deleted a few at a time until the budget
    is spent, and a table is dropped once empty.
    """
    retire_old_substrings(conn)
    return _clear_retired(conn, time.monotonic() + (CLEAR_CHUNK_S if budget_s is None else budget_s))


def _clear_retired(conn: sqlite3.Connection, deadline: float, enough: Callable[[], bool] = lambda: False) -> bool:
    # Deletes moved-aside rows until the deadline passes or `enough()`; True while rows remain.
    for name in retired_tables(conn):
        while conn.execute(f'DELETE FROM "{name}" WHERE rowid IN '
                           f'(SELECT rowid FROM "{name}" LIMIT {CLEAR_BATCH_ROWS})').rowcount:
            if time.monotonic() >= deadline or enough():
                return True
        conn.execute(f'DROP TABLE "{name}"')
    return False


# SQLite takes free pages before it makes the file longer. Freeing the old index's pages just ahead
# of the writes that need new ones (the upgrade's back-fill and new indexes, then each chunk of the
# rebuild) lets the new layout fill them, so the file grows only if it needs more than the old
# index held. The background work keeps this much free while moved-aside pages remain.
FREE_RESERVE_BYTES = 32 << 20
UPGRADE_BYTES_PER_MESSAGE = 256  # what the upgrade adds per message: its uid, and the new indexes' entries


def _free_bytes(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA freelist_count").fetchone()[0]) * int(conn.execute("PRAGMA page_size").fetchone()[0])


def free_ahead(conn: sqlite3.Connection, reserve_bytes: int | None = None, budget_s: float | None = None,
               once: bool = False) -> bool:
    """Free moved-aside pages when fewer than `reserve_bytes` are free (about `budget_s` of work); return whether it freed any.

    Inside the caller's write transaction. Leaves the older substring index a rebuild reads alone.
    It frees up to twice the reserve, so that a caller asking before each transaction frees in
    batches; `once` (a single ask, the upgrade's) frees up to the reserve only.
    """
    reserve = FREE_RESERVE_BYTES if reserve_bytes is None else reserve_bytes
    if _free_bytes(conn) >= reserve or not retired_tables(conn):
        return False
    enough = reserve if once else 2 * reserve
    _clear_retired(conn, time.monotonic() + (CLEAR_CHUNK_S if budget_s is None else budget_s),
                   lambda: _free_bytes(conn) >= enough)
    return True


@dataclass
class Opened:
    """What `open_connection` hands the handle: its main connection and what opening did to the file."""

    conn: sqlite3.Connection
    schema_version: int
    upgrade_backup: Path | None = None  # the copy written before an upgrade
    mode_changes: list[str] = field(default_factory=list)  # files tightened to 0600, each with its old mode
    upgrade_later: bool = False  # an older file left as it is, for MoveIn to copy and upgrade after the open


def open_connection(path: Path, *, read_only: bool, read_busy_s: float, patience_s: float, policy: RetryPolicy,
                    backup: bool = True, force: bool = False,
                    on_give_up: Callable[[float], None] | None = None, later_bytes: int | None = None,
                    keep_copies_days: float | None = UPGRADE_COPY_KEEP_DAYS) -> Opened:
    """Open a handle's main connection and make its file ready for it.

    A writable open creates the file 0600 when missing, refuses another program's database
    (ForeignDatabaseError, unless `force`) before anything is written or chmodded, and runs
    `set_up`; a read-only one only checks that the file can be read as it is. An older file of
    `later_bytes` or more is only put in WAL mode: its copy and upgrade are left to MoveIn
    (`Opened.upgrade_later`). Failures are the library's typed errors, and the connection is
    closed again on any of them.
    """
    if read_only:
        if not path.is_file() or path.stat().st_size == 0:
            raise StateDbUninitializedError(f"{path} does not exist yet")
    else:
        try:
            schema.prepare_file(path)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create or open {path}: {exc}") from exc
    with typed_errors(path):  # a directory or a path SQLite cannot open -> StoreUnavailableError
        conn = schema.connect(path, read_only=read_only, read_busy_s=read_busy_s)
    try:
        with typed_errors(path, reading=True):  # "not a database" at open -> StateDbCorruptError
            if read_only:
                opened = Opened(conn, catalogue.check_read_only(conn, path, read_busy_s))
            else:
                catalogue.check_ours(conn, path, force=force)  # before any write or chmod: it may be another's file
                changes = schema.tighten_files(path)
                catalogue.clean_partial_copies(path)  # a killed upgrade's half-written copy
                tidy_upgrade_copies(conn, path, keep_copies_days)  # its complete one, and those past the policy
                if later_bytes is not None and _large_older_file(conn, path, later_bytes):
                    more = prepare_journal(conn, path, patience_s, policy)
                    opened = Opened(conn, schema.read_version(conn) or 0, None, changes + more, upgrade_later=True)
                else:
                    version, copy, more = set_up(conn, path, patience_s, policy, backup=backup, on_give_up=on_give_up)
                    opened = Opened(conn, version, copy, changes + more)
        schema.size_cache(conn)  # once the file has been read: the pragma waits on a locked one
        return opened
    except BaseException:
        conn.close()
        raise


def set_up(conn: sqlite3.Connection, db_path: Path, patience_s: float, policy: RetryPolicy, *,
           backup: bool = True, on_give_up: Callable[[float], None] | None = None
           ) -> tuple[int, Path | None, list[str]]:
    """Bring a writable connection's file to the current layout; return (version, copy taken first, mode changes).

    An up-to-date file costs a few catalogue reads and takes no write lock. A file of a newer
    release is left as it is, with a WARNING: the handle then refuses writes.
    """
    changes = prepare_journal(conn, db_path, patience_s, policy)
    if not schema.needs_migration(conn):
        return schema.read_version(conn) or 0, None, changes
    taken = start_upgrade(conn, db_path, backup=backup)
    try:
        found = schema.migrate(Writer(conn, on_give_up=on_give_up), patience_s, policy,
                               before_upgrade=upgrade_step(taken))
    finally:
        copy = taken.settle(conn) if taken is not None else None
    if found > SCHEMA_VERSION:
        logger.warning("%s has schema version %s, newer than %s: writes are refused", db_path, found, SCHEMA_VERSION)
    return max(found, SCHEMA_VERSION), copy, changes


def prepare_journal(conn: sqlite3.Connection, db_path: Path, patience_s: float, policy: RetryPolicy) -> list[str]:
    """Put the file in WAL mode and make its side files private; return the mode changes."""
    schema.enable_wal(conn, db_path, patience_s, policy)
    return schema.tighten_side_files(db_path)


def _large_older_file(conn: sqlite3.Connection, path: Path, limit: int) -> bool:
    # Its size on disk, log included: what the copy taken first has to read.
    if not schema.is_older_file(conn):
        return False
    size = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    return size >= limit


# --- an older file moved in after the open returned -------------------------------------------------

def connect_reader(path: Path, migrated: threading.Event | None = None) -> sqlite3.Connection:
    """Open the handle's read connection; while `migrated` is not set, one that reads the older layout as it is."""
    conn = schema.connect_reader(path)
    if migrated is not None and not migrated.is_set():
        # Temp views are no change to the file, but query_only refuses them too.
        conn.execute("PRAGMA query_only = OFF")
        try:
            catalogue.shadow_missing(conn)
        finally:
            conn.execute("PRAGMA query_only = ON")
    return conn


class MoveIn:
    """An older file's copy and upgrade, on a thread of their own, once the open has returned.

    The copy is taken first, on a connection of its own, and can be stopped between its steps;
    the upgrade then runs holding the writer's two locks, so the handle's reads (which read the
    older layout through temp views until `migrated` is set) wait while the schema changes and
    its writes wait for `done`. `finish(version, copy)` runs once the file is upgraded, still
    holding both locks. A failure is kept in `error`; the file is then as it was.
    """

    def __init__(self, writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, *, backup: bool,
                 migrated: threading.Event, finish: Callable[[int, Path | None], None],
                 on_give_up: Callable[[float], None] | None = None):
        self.migrated = migrated            # the file has the current layout: readers need no shadow views
        self.done = threading.Event()       # the thread has ended, with the file upgraded or not
        self.stop = threading.Event()       # set by close(): end as soon as that is safe
        self.migrating = threading.Event()  # the upgrade itself is under way (close waits for it)
        self.error: BaseException | None = None
        self._waiting = 0                   # writes of this handle waiting for `done`
        self._waiting_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="hermes-state-upgrade", daemon=True,
                                       args=(writer, db_path, patience_s, policy, backup, finish, on_give_up))

    def _run(self, writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, backup: bool,
             finish: Callable[[int, Path | None], None], on_give_up: Callable[[float], None] | None) -> None:
        # Every call into SQLite on this thread is a stretch of the fork gate (the migration's
        # transactions are, by their writer): a fork in another thread while this one holds one of
        # SQLite's mutexes would leave the child unable to open any database.
        taken: PreUpgradeCopy | None = None
        try:
            self._wait_for_hand_over(db_path)
            taken = self._copy(db_path, backup)
            with writer.lock, writer.read_lock:
                if self.stop.is_set() or writer.closed:
                    raise Cancelled("the handle was closed before its file was upgraded")
                self.migrating.set()
                try:
                    with typed_errors(db_path):
                        found = schema.migrate(Writer(writer.conn, on_give_up=on_give_up), patience_s, policy,
                                               before_upgrade=upgrade_step(taken))
                finally:  # named if the upgrade began with it, else removed (another opener began first)
                    with fork.GATE.work():
                        copy = taken.settle(writer.conn) if taken is not None else None
                self.migrated.set()
                with fork.GATE.work():
                    writer.drop_reader()  # the next read opens a connection without the temp views
                    finish(max(found, SCHEMA_VERSION), copy)
        except BaseException as exc:  # noqa: BLE001 - a background thread has nobody to raise to
            self.error = exc
            if taken is not None:
                taken.discard()  # unless the upgrade began with it: the next open takes a copy of its own
            if not isinstance(exc, Cancelled):
                logger.warning("upgrading %s failed (%s); it was left as it was, and writes are refused until "
                               "it is opened again", db_path, exc)
        finally:
            self.done.set()

    @contextmanager
    def write_waiting(self) -> Iterator[None]:
        """Count a write waiting for `done` while the block runs: meanwhile the copy gives way to no read."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def give_way(self) -> bool:
        """Tell whether the copy may wait for this process's reads now: not while a write waits for it."""
        return self._waiting == 0

    def _wait_for_hand_over(self, db_path: Path) -> None:
        # A process a short command handed the move-in to is copying and upgrading it: a second
        # copy would only race it. Once the file is upgraded this one has nothing left to copy.
        if handed_over_to(db_path) in (None, os.getpid()):
            return
        with fork.GATE.work():
            conn = schema.connect_reader(db_path)
        try:
            while handed_over_to(db_path) not in (None, os.getpid()):
                with fork.GATE.work():
                    older = schema.is_older_file(conn)
                if not older or self.stop.wait(1.0):
                    return
        finally:
            with fork.GATE.work():
                conn.close()

    def _copy(self, db_path: Path, backup: bool) -> PreUpgradeCopy | None:
        with fork.GATE.work():
            conn = schema.connect_reader(db_path)
        try:
            # The copy's steps are stretches of the fork gate.
            return start_upgrade(conn, db_path, backup=backup, stop=self.stop, give_way=self.give_way)
        finally:
            with fork.GATE.work():
                conn.close()


# --- after the migration: the FTS indexes, and the space the old layout held ------------------------

# A handle that lives less than this never takes a turn at the background work: a short command
# (a listing, one append) then costs no more to open and close than on a file with nothing pending.
# The work is left to a handle that stays open, or to the one `wait_for_fts_rebuild` is called on.
BACKGROUND_START_S = 2.0


class FtsRebuild:
    """The background thread that finishes pending index work (a rebuild, queued rows), then gives back freed space."""

    def __init__(self, writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, chunk_rows: int, *,
                 rebuilding: bool = True, clearing: bool = False, delay_s: float = 0.0):
        self.stop_event = threading.Event()
        self.wake = threading.Event()  # ends the delay early: the handle closes, or someone waits for the work
        self.started = False           # the delay is over: the thread has taken (or tried) a turn
        self.moving_in = rebuilding or clearing  # long work: worth a process of its own when the handle leaves
        from hermes_state_compression import new_holder  # here: only an open that starts a thread needs it
        self.holder = new_holder()  # its lease: one thread of any process does this work at a time
        self.thread = threading.Thread(target=self._run, name="hermes-state-fts", daemon=True,
                                       args=(writer, db_path, patience_s, policy, chunk_rows, rebuilding, clearing,
                                             delay_s))

    def _run(self, writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, chunk_rows: int,
             rebuilding: bool, clearing: bool, delay_s: float) -> None:
        if delay_s > 0:
            self.wake.wait(delay_s)
        if self.stop_event.is_set():
            return  # closed before its first turn: it took no lease and wrote nothing
        self.started = True
        try:
            self._work(writer, db_path, patience_s, policy, chunk_rows, rebuilding, clearing)
        finally:
            if self.stop_event.is_set():  # stopped by close(): the next open's thread takes over at once
                fts.release_turn(writer, self.holder, policy)

    def hurry(self) -> None:
        """Start the work now instead of after the delay."""
        self.wake.set()

    def _work(self, writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, chunk_rows: int,
              rebuilding: bool, clearing: bool) -> None:
        fts.background_worker(writer, patience_s, policy, chunk_rows, self.stop_event, holder=self.holder,
                              free=free_ahead if clearing else None)
        if clearing and not self.stop_event.is_set():
            # What the new indexes did not need: pages later writes reuse (or vacuum() gives back).
            try:
                fts.run_pending(writer, patience_s, policy, stop=self.stop_event, pause_s=fts.BACKGROUND_PAUSE_S,
                                step=clear_retired_step, holder=self.holder)
            except Exception as exc:  # noqa: BLE001 - a background thread has nobody to raise to
                if not self.stop_event.is_set():
                    logger.warning("freeing the pages of the old full-text index stopped (%s); it resumes at the "
                                   "next open", exc)
        if rebuilding and not self.stop_event.is_set():
            # The fork gate after the lock, as for every write of a library thread; nobody to raise to.
            with writer.exclusive() as conn, fork.GATE.work():
                reclaim_after_upgrade(conn, db_path, patience_s, policy, quiet=True)

    def stop(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Ask the thread to stop after the chunk under way and wait for it (bounded)."""
        self.stop_event.set()
        self.wake.set()
        self.thread.join(timeout_s)  # a chunk is short; a worker stuck on a lock just fails later


def open_fts(writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy, *, writable: bool,
             chunk_rows: int = fts.REBUILD_CHUNK_ROWS, background: bool = True,
             delay_s: float = 0.0) -> FtsRebuild | None:
    """Build missing FTS objects, and start the background thread when index work is pending.

    Returns the running thread's handle, or None. Pending work is a rebuild, or rows left queued
    (by another program's non-ASCII writes, or a handle that died): the open itself never takes
    the write lock for them, and the thread waits `delay_s` before its first turn. On a writable
    handle this also installs the connection's TEMP trigger that feeds the CJK index as rows are
    written.
    """
    state = fts.ensure_fts(writer, patience_s, policy, writable=writable)
    if writable:
        # The trigger lives in the connection's temp schema only: no lock on the file, no cost at open.
        fts.install_write_triggers(writer.conn)
    clearing = state is not None and (bool(retired_tables(writer.conn))
                                      or object_exists(writer.conn, "table", fts.OLD_SUBSTRINGS))
    if state is None or not ((state.work_pending or clearing) and background):
        return None
    work = FtsRebuild(writer, db_path, patience_s, policy, chunk_rows, rebuilding=state.rebuild is not None or clearing,
                      clearing=clearing, delay_s=delay_s)
    work.thread.start()
    return work


# --- a move-in's work finished by a process of its own -----------------------------------------------
# A user who only runs short commands on a store just moved in would never see its work end: each
# closes before its thread's first turn. The handle that closes so hands the work to a process of
# its own, which opens the file, does the work to the end with the same lease and pauses, and exits.

# The finishing process imports this library from where this process found it, never from the
# store's directory: `-P` keeps the working directory off its path (a `hermes_state_upgrade.py`
# lying next to a store is not run), and the library's own directory goes first.
_FINISH = ("import sys; sys.path.insert(0, sys.argv[1]); import pathlib, hermes_state_upgrade as u; "
           "u.finish_pending(pathlib.Path(sys.argv[2]))")
_LIBRARY_DIR = str(Path(__file__).resolve().parent)


def hand_over(db_path: Path, conn: sqlite3.Connection | None = None) -> subprocess.Popen[bytes] | None:
    """Start a detached process that finishes `db_path`'s move-in (the copy and upgrade, the index work), unless one holds it.

    With `conn` (the closing handle's, idle) a live holder of the index work is looked for first;
    the process looks again itself. Returns the process (nobody needs to wait for it), or None
    when another live holder has the work or no interpreter can be started. Never raises.
    """
    try:
        if (conn is not None and _worked_by_another(conn)) or not sys.executable or not _claim_hand_over(db_path):
            return None
        marker = handed_over_marker(db_path)
        try:
            process = subprocess.Popen([sys.executable, "-P", "-c", _FINISH, _LIBRARY_DIR, str(db_path)],
                                       cwd=db_path.parent,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       close_fds=True, start_new_session=True)
        except BaseException:
            marker.unlink(missing_ok=True)
            raise
        _write_pid(marker, process.pid)
        return process
    except (OSError, sqlite3.Error, ValueError) as exc:  # the next open that stays long enough does the work
        logger.info("the background work on %s is left to the next open (%s)", db_path, exc)
        return None


# One finishing process per file at a time, whatever the number of short commands that close:
# `<db>.finishing` holds its pid (first the pid of the process starting it, so it is never empty
# while live). A marker whose process is gone is stale and taken over.

def handed_over_marker(db_path: Path) -> Path:
    """Return the file naming the process a move-in was handed to."""
    return db_path.with_name(f"{db_path.name}.finishing")


def handed_over_to(db_path: Path) -> int | None:
    """Return the pid of the live process finishing `db_path`'s move-in, or None."""
    try:
        pid = int(handed_over_marker(db_path).read_text(encoding="ascii").strip() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and catalogue.process_running(pid) else None


def _write_pid(marker: Path, pid: int) -> None:
    staged = marker.with_name(f"{marker.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # private, as every file beside the store
    try:
        os.write(fd, str(pid).encode("ascii"))
    finally:
        os.close(fd)
    os.replace(staged, marker)


def _claim_hand_over(db_path: Path) -> bool:
    # Created exclusively: of two commands closing at once, one starts the process.
    marker = handed_over_marker(db_path)
    for _ in range(2):
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if handed_over_to(db_path) is not None:
                return False
            marker.unlink(missing_ok=True)  # its process is gone: taken over
            continue
        try:
            os.write(fd, str(os.getpid()).encode("ascii"))
        finally:
            os.close(fd)
        return True
    return False


def _worked_by_another(conn: sqlite3.Connection) -> bool:
    return object_exists(conn, "table", "state_meta") and fts.live_worker(conn) is not None


def finish_pending(db_path: Path, patience_s: float = WRITE_PATIENCE_S, policy: RetryPolicy | None = None) -> bool:
    """Open `db_path` and do its pending background work to the end; return whether there was any.

    What the process `hand_over` starts runs. An older file is copied and upgraded first, inside
    the open. It leaves at once when another process holds the index work.
    """
    policy = policy or RetryPolicy()
    try:
        opened = open_connection(db_path, read_only=False, read_busy_s=READ_BUSY_TIMEOUT_S, patience_s=patience_s,
                                 policy=policy)
        writer = Writer(opened.conn)
        try:
            if _worked_by_another(writer.conn):
                return False
            work = open_fts(writer, db_path, patience_s, policy, writable=True)
            if work is None:
                return False
            work.thread.join()
            return True
        finally:
            writer.close(checkpoint=True)
    finally:
        if handed_over_to(db_path) == os.getpid():
            handed_over_marker(db_path).unlink(missing_ok=True)


def rebuild_fts(writer: Writer, db_path: Path, patience_s: float, policy: RetryPolicy,
                chunk_rows: int = fts.REBUILD_CHUNK_ROWS) -> None:
    """Rebuild the FTS indexes to the end (one transaction per chunk), free what an upgrade moved aside, then reclaim."""
    fts.rebuild(writer, patience_s, policy, chunk_rows, free=free_ahead)
    fts.run_pending(writer, patience_s, policy, step=clear_retired_step)
    with writer.exclusive() as conn:
        reclaim_after_upgrade(conn, db_path, patience_s, policy)


def reclaim_after_upgrade(conn: sqlite3.Connection, path: Path, patience_s: float, policy: RetryPolicy, *,
                          quiet: bool = False) -> bool:
    """After an upgrade's index rebuild, VACUUM when much of the file is free; return whether it ran.

    Runs outside any transaction, holding the write connection. Files over 1 GiB are left as they
    are (with an INFO line saying how to reclaim), since their VACUUM would block writers for long.
    With `quiet` a failure is logged, not raised.
    """
    try:
        return _reclaim(conn, path, patience_s, policy)
    except Exception as exc:  # noqa: BLE001 - see docstring
        if not quiet:
            raise
        logger.warning("giving back the space an upgrade freed failed (%s); SessionDB.vacuum() does it", exc)
        return False


def _reclaim(conn: sqlite3.Connection, path: Path, patience_s: float, policy: RetryPolicy) -> bool:
    import hermes_state_recovery as recovery  # here: a read-only open never reclaims, and never loads it
    if fts.inspect(conn).rebuild is not None or retired_tables(conn) or not conn.execute(
            "SELECT 1 FROM state_meta WHERE key = ?", (recovery.RECLAIM_KEY,)).fetchone():
        return False  # nothing to give back, or the new indexes are still filling the free pages
    free, pages, page_size = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                              for p in ("freelist_count", "page_count", "page_size"))
    if free <= RECLAIM_MIN_FREE * pages:
        recovery.clear_reclaim_mark(conn, patience_s, policy)
        return False
    if pages * page_size > AUTO_RECLAIM_MAX_BYTES:
        logger.info("%s holds %.0f MB of free pages left by the upgrade; call SessionDB.vacuum() at a quiet "
                    "moment to give them back", path, free * page_size / 1e6)
        recovery.clear_reclaim_mark(conn, patience_s, policy)
        return False
    result = recovery.vacuum(conn, patience_s, policy)  # the VACUUM settles the mark too
    logger.info("%s: gave back %.0f MB freed by the upgrade", path,
                (result["bytes_before"] - result["bytes_after"]) / 1e6)
    return True

