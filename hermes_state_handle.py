"""The handle SessionDB is: one open store, its shared-handle registry, its timing knobs, its transactions.

Owns: `Handle`, the base of SessionDB: opening (through the upgrade; a writable open may repair a
malformed catalogue once) and closing a handle, `shared()` and the process-wide registry behind
it, the timing knobs (`KNOBS`; `HERMES_AGENT_ALIASES`, hermes-agent's name for each, kept equal
by the `Knobs` metaclass), `transaction()`, and `_run`, the one place that turns a method table
entry's kind into its transaction.
Does not own: the method table (hermes_state_methods), what a module function does, the upgrade
an open runs (hermes_state_upgrade), BEGIN/COMMIT themselves (hermes_state_writer).

Transaction contract: a write kind is one `Writer.transaction()` (BEGIN IMMEDIATE) with the
patience the kind names; a transcript write first checks, inside it, that compression neither
closed the session nor holds it (the transcript guard of hermes_state_messages), and waits once
if another holder does; reads run under the read lock, "snapshot" in one read transaction.
"""
from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Self

import hermes_state_common as common
from hermes_state_common import (COMPRESSION_WAIT_S, FTS_OPTIMIZE_EVERY_N_WRITES, FTS_REBUILD_CHUNK_ROWS,
                                 SCHEMA_VERSION)
from hermes_state_errors import (TRANSLATABLE, HermesStateError, ReadOnlyError, SessionPersistenceError,
                                 StateDbIncompatibleError, StoreUnavailableError, describe_init_failure, raise_typed,
                                 set_last_init_error, typed_errors)
from hermes_state_home import check_db_path_allowed, get_hermes_home
from hermes_state_methods import READS, Entry, deferred_imports
from hermes_state_writer import RetryPolicy, RowConnection, SharedHandles, Transaction, Writer, note_wal_reset_bug

# What a handle needs only once it opens, writes or closes: imported then, not with the facade.
with deferred_imports(globals()):
    import hermes_state_compression as compression
    import hermes_state_fts as fts
    import hermes_state_lockowners as lockowners
    import hermes_state_messages as messages
    import hermes_state_repair as repairs
    import hermes_state_schema as schema
    import hermes_state_upgrade as upgrade


def resolve_path(db_path: str | os.PathLike | None, home: Path) -> Path:
    """Return the absolute path a handle opens: `home`/state.db by default, ":memory:" as it is."""
    if db_path is None:
        return home / "state.db"
    if str(db_path) == ":memory:":
        return Path(":memory:")
    return Path(db_path).expanduser().absolute()


SHARED = SharedHandles()  # the process-wide handles SessionDB.shared() hands out
# The repair a writable open may try once per path: the paths tried so far, and the repair itself
# (asked for only when the open can repair, so a read-only open loads none of the repair's code).
Repair = Callable[[], tuple[set[str], Callable[..., dict[str, Any]]]]


# The timing knobs: each public name, and the name hermes-agent's code and tests use for it (the
# same words in capitals after an underscore). Setting either, on the class or on one handle, sets
# both; every call reads them afresh.
KNOBS = {name: "_" + name.upper() for name in (
    "write_patience_s", "transcript_write_patience_s", "activity_write_patience_s", "read_busy_timeout_s",
    "write_retry_min_s", "write_retry_max_s", "write_retry_slow_min_s", "write_retry_slow_max_s",
    "checkpoint_every_n_writes", "optimize_every_n_writes", "compression_wait_s",
    "fts_rebuild_chunk_rows", "fts_rebuild_in_background")}
# hermes-agent's name of each knob and the public twin it stands for, as SessionDB.HERMES_AGENT_ALIASES
# shows them (read-only): agent code keeps its names, new code and the tests use the public ones.
HERMES_AGENT_ALIASES = MappingProxyType({agents: public for public, agents in KNOBS.items()})
TWINS = {**KNOBS, **HERMES_AGENT_ALIASES}


def _seconds(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__} {common.shown(value)}")
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds, 0 or more, not {value!r}")
    return value


def _cadence(name: str, value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be a whole number of writes (0 or None: never), not "
                        f"{type(value).__name__} {common.shown(value)}")
    if value is not None and value < 0:
        raise ValueError(f"{name} must be 0 or more (0 or None: never), not {value}")
    return value


def _rows(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{name} must be a whole number of rows, 1 or more, not {common.shown(value)}")
    return value


def _bytes(name: str, value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise (ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError)(
            f"{name} must be a whole number of bytes, 0 or more (None: never), not {common.shown(value)}")
    return value


def _days(name: str, value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"{name} must be a number of days (None: keep for ever), not {type(value).__name__} "
                        f"{common.shown(value)}")
    if value is not None and not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a finite number of days, 0 or more (None: keep for ever), not {value!r}")
    return value


def _flag(name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} {common.shown(value)}")
    return value


# What each knob accepts, checked when it is set (on the class or one handle): a bad value is refused
# there, with its name, instead of failing every later write, perhaps after that write's COMMIT.
KNOB_RULES: dict[str, Callable[[str, Any], Any]] = {
    **{name: _seconds for name in KNOBS if name.endswith("_s")},
    "checkpoint_every_n_writes": _cadence, "optimize_every_n_writes": _cadence,
    "fts_rebuild_chunk_rows": _rows, "fts_rebuild_in_background": _flag, "checkpoint_in_background": _flag,
    "upgrade_in_background_bytes": _bytes, "finish_after_close": _flag, "upgrade_copy_keep_days": _days}


def check_knob(name: str, value: Any) -> Any:
    """Return `value` if the knob `name` (public or hermes-agent's name) accepts it; else raise TypeError or ValueError."""
    rule = KNOB_RULES.get(HERMES_AGENT_ALIASES.get(name, name))
    return value if rule is None else rule(name, value)


class Knobs(type):
    """Keeps each knob's two names equal on a class: setting or deleting one does the same to the other."""

    def __setattr__(cls, name: str, value: Any) -> None:
        super().__setattr__(name, check_knob(name, value))
        if name in TWINS:
            super().__setattr__(TWINS[name], value)

    def __delattr__(cls, name: str) -> None:  # a monkeypatch undoing a class-level setting
        super().__delattr__(name)
        if TWINS.get(name) in vars(cls):
            super().__delattr__(TWINS[name])


class Handle(metaclass=Knobs):
    """The base of SessionDB: one open handle, its transactions, and `_run` for the method table."""

    # Timing policy (see docs/architecture.md, "Timing knobs"), read at call time so an
    # application or a test can tune it on the class or on one instance.
    write_patience_s = _WRITE_PATIENCE_S = common.WRITE_PATIENCE_S  # a write's whole wait for the lock
    transcript_write_patience_s = _TRANSCRIPT_WRITE_PATIENCE_S = common.TRANSCRIPT_WRITE_PATIENCE_S
    activity_write_patience_s = _ACTIVITY_WRITE_PATIENCE_S = common.ACTIVITY_WRITE_PATIENCE_S
    read_busy_timeout_s = _READ_BUSY_TIMEOUT_S = common.READ_BUSY_TIMEOUT_S  # a read-only open's busy wait
    # The jittered sleeps between BEGIN attempts: short ones first, then the slow band.
    write_retry_min_s = _WRITE_RETRY_MIN_S = common.WRITE_RETRY_MIN_S
    write_retry_max_s = _WRITE_RETRY_MAX_S = common.WRITE_RETRY_MAX_S
    write_retry_slow_min_s = _WRITE_RETRY_SLOW_MIN_S = common.WRITE_RETRY_SLOW_MIN_S
    write_retry_slow_max_s = _WRITE_RETRY_SLOW_MAX_S = common.WRITE_RETRY_SLOW_MAX_S
    checkpoint_every_n_writes = _CHECKPOINT_EVERY_N_WRITES = common.CHECKPOINT_EVERY_N_WRITES
    # Whether that checkpoint runs on a thread of the handle's own (a write then never waits for
    # its disk syncs) or inside the write that makes it due.
    checkpoint_in_background = True
    # Writes between whole-index FTS optimizes, run after COMMIT in a write of their own (0: never).
    optimize_every_n_writes = _OPTIMIZE_EVERY_N_WRITES = FTS_OPTIMIZE_EVERY_N_WRITES
    # Transcript writes wait this long for another holder's compression.
    compression_wait_s = _COMPRESSION_WAIT_S = COMPRESSION_WAIT_S
    # Rows per FTS rebuild transaction; whether open leaves a rebuild to a background thread.
    fts_rebuild_chunk_rows = _FTS_REBUILD_CHUNK_ROWS = FTS_REBUILD_CHUNK_ROWS
    fts_rebuild_in_background = _FTS_REBUILD_IN_BACKGROUND = True
    # A writable open of an older file at least this large (log included) returns at once: the
    # copy taken first and the upgrade run on a thread, reads meanwhile read the file as it is,
    # and writes wait until it is upgraded. None: every upgrade runs inside the open.
    upgrade_in_background_bytes: int | None = common.UPGRADE_IN_BACKGROUND_BYTES
    # A handle of such a file that closes before its background work took a turn (a short command)
    # starts a process of its own that finishes the work (a rebuild, freeing the old index's pages)
    # and exits; the next handle that stays open would do it otherwise. False: leave it to that one.
    finish_after_close = True
    # The copies upgrades take first: the newest two are kept, each this many days after its upgrade,
    # and a writable open removes the others. None: every copy is kept until the user removes it.
    upgrade_copy_keep_days: float | None = common.UPGRADE_COPY_KEEP_DAYS
    # {hermes-agent's name: the public name it is an alias of}; setting either sets both.
    HERMES_AGENT_ALIASES = HERMES_AGENT_ALIASES
    _shared_key: str | None = None  # set on handles handed out by shared()
    _fts: upgrade.FtsRebuild | None = None  # the background index rebuild this open started, if any
    _move_in: upgrade.MoveIn | None = None  # the background copy and upgrade of an older file, if any
    # The patience of each kind of table write that does not wait the default write_patience_s.
    _PATIENCE = {"activity": "activity_write_patience_s", "compression": "transcript_write_patience_s"}
    _built_policy: tuple[tuple[float, ...], RetryPolicy] | None = None  # (the knobs it was built from, it)
    db_path: Path
    profile_home: Path
    read_only: bool
    schema_version: int | None
    upgrade_backup: Path | None
    mode_changes: list[str]

    def __setattr__(self, name: str, value: Any) -> None:  # one handle's knob: both names, as on the class
        object.__setattr__(self, name, check_knob(name, value))
        if name in TWINS:
            object.__setattr__(self, TWINS[name], value)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if TWINS.get(name) in vars(self):
            object.__delattr__(self, TWINS[name])

    def __init__(self, db_path: str | os.PathLike | None = None, *, read_only: bool = False,
                 backup_before_upgrade: bool = True, force: bool = False, repair: Repair | None = None):
        # Absolute, so a later chdir or HERMES_HOME change cannot move this handle.
        self.profile_home = get_hermes_home().absolute()
        self.db_path = resolve_path(db_path, self.profile_home)
        self.read_only, self._backup_before_upgrade = read_only, backup_before_upgrade
        self._closed, self._fts = False, None
        check_db_path_allowed(self.db_path)  # before any directory, file or pragma
        # A writable file gets a second connection for reads (opened on first read); read-only
        # handles and in-memory databases (a second connection would be another database) do not.
        separate_reads = not read_only and str(self.db_path) != ":memory:"
        # force: add the store's tables even to another program's database. upgrade_backup: the copy
        # written before this handle upgraded the file; mode_changes: files this open tightened to 0600.
        later_bytes = self.upgrade_in_background_bytes if separate_reads else None
        try:
            def connect() -> upgrade.Opened:
                return upgrade.open_connection(
                    self.db_path, read_only=read_only, read_busy_s=self.read_busy_timeout_s,
                    patience_s=self.write_patience_s, policy=self._policy(), backup=backup_before_upgrade,
                    force=force, on_give_up=self._log_lock_holders, later_bytes=later_bytes,
                    keep_copies_days=self.upgrade_copy_keep_days)
            # A read-only open never repairs the file, so it does not load the repair's code.
            opened = connect() if read_only or repair is None else repairs.open_repairing(connect, self.db_path, *repair())
            conn, self.schema_version = opened.conn, opened.schema_version
            self.upgrade_backup, self.mode_changes = opened.upgrade_backup, opened.mode_changes
            migrated = threading.Event() if opened.upgrade_later else None
            # The opener names the path, not the handle: the checkpoint thread keeps it, and must
            # not keep a dropped handle alive.
            self._writer = Writer(conn, on_give_up=self._log_lock_holders, open_reader=(
                functools.partial(upgrade.connect_reader, self.db_path, migrated)) if separate_reads else None)
            self._writer.after_commit.append(self._upkeep)
            if separate_reads:
                note_wal_reset_bug(self.db_path)
            if migrated is None:
                self._open_fts(delay_s=upgrade.BACKGROUND_START_S)
            else:
                self._move_in = upgrade.MoveIn(self._writer, self.db_path, self.write_patience_s, self._policy(),
                                               backup=backup_before_upgrade, migrated=migrated,
                                               finish=self._moved_in, on_give_up=self._log_lock_holders)
                self._move_in.thread.start()
        except Exception as exc:  # kept for a caller that reports the failure later (a slash command)
            set_last_init_error(describe_init_failure(exc))
            raise

    # --- lifecycle -----------------------------------------------------------------------------------

    def _open_fts(self, delay_s: float = 0.0) -> None:
        writable = not self.read_only and (self.schema_version or 0) <= SCHEMA_VERSION
        try:
            with typed_errors(self.db_path, reading=True):  # a damaged index page -> StateDbCorruptError
                self._fts = upgrade.open_fts(self._writer, self.db_path, self.write_patience_s, self._policy(),
                                             writable=writable, chunk_rows=self.fts_rebuild_chunk_rows,
                                             background=self.fts_rebuild_in_background, delay_s=delay_s)
        except BaseException:
            self._writer.close(checkpoint=False)
            raise

    def _moved_in(self, version: int, copy: Path | None) -> None:
        # On the upgrade's thread, holding the writer's locks, once the file has the current layout.
        self.schema_version, self.upgrade_backup = version, copy
        if self._move_in is not None and self._move_in.stop.is_set():
            return  # a handle closing starts no index work
        try:
            self._open_fts()  # closes the writer when it fails: say why to the calls refused from now on
        except BaseException as exc:
            self._writer.closed_reason = (f"{self.db_path} was upgraded, but its full-text indexes could not be "
                                          f"opened ({exc}); open it again")
            raise

    @property
    def upgrading(self) -> bool:
        """True while this open's copy and upgrade of an older file run in the background (writes wait for them)."""
        return self._move_in is not None and not self._move_in.done.is_set()

    def _wait_moved_in(self, move_in: upgrade.MoveIn, patience_s: float) -> float:
        # A write made while the file is moved in waits for it, as the open itself would have, but no
        # longer than its own patience: a bookkeeping write must never stall a turn for a whole copy.
        # While it waits, the copy stops giving way to this process's reads between its steps.
        waited = 0.0
        if not move_in.done.is_set():
            started = time.monotonic()
            with move_in.write_waiting():
                finished = move_in.done.wait(max(0.0, patience_s))
            waited = time.monotonic() - started
            if not finished:
                raise SessionPersistenceError(
                    f"{self.db_path} is being copied and upgraded in the background (an older file moved in); "
                    f"this write waited its {patience_s:.1f}s and was not made. Retry once `upgrading` is false.",
                    code="session_persistence_failed:locked")
        self._refuse_if_closed()
        if move_in.error is not None and not move_in.migrated.is_set():
            raise StoreUnavailableError(
                f"{self.db_path} could not be upgraded ({move_in.error}); it was left as it was and this write "
                "was not made. Open it again to retry the upgrade.") from move_in.error
        return waited

    @property
    def _fts_worker(self) -> Any:  # the background rebuild thread, or None (the FTS tests join it)
        return self._fts.thread if self._fts is not None else None

    def wait_for_fts_rebuild(self, timeout_s: float | None = None) -> bool:
        """Wait up to `timeout_s` (None: until it ends) for this open's background work; True once none runs.

        That is the copy and upgrade of an older file, then the index rebuild. True at once when the
        open started none; work that close() stopped counts as ended.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._move_in is not None:
            self._move_in.thread.join(timeout_s)
            if self._move_in.thread.is_alive():
                return False
        work = self._fts
        if work is None:
            return True
        work.hurry()  # someone waits for it: no reason to let the open settle first
        work.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not work.thread.is_alive()

    def close(self) -> None:
        """Checkpoint (PASSIVE) and close; twice is harmless. A `shared()` handle gives back one use, like `release()`."""
        if self._shared_key is None or SHARED.release(self._shared_key, self):
            self._close_now()

    def _close_now(self) -> None:
        if self._closed:
            return
        move_in = self._move_in
        if move_in is not None:
            move_in.stop.set()  # a copy under way ends at its next step, and no upgrade follows it
            if move_in.migrating.is_set():
                move_in.thread.join()  # the upgrade itself is not stopped halfway: close once it is done
            elif (not move_in.migrated.is_set() and self.finish_after_close and not self.read_only
                  and move_in.error is None):
                upgrade.hand_over(self.db_path)  # a short command: the copy and upgrade go on elsewhere
        work = self._fts
        if work is not None:
            work.stop()
            if not work.started and work.moving_in and self.finish_after_close and self._large_file():
                upgrade.hand_over(self.db_path, self._writer.conn)  # else nobody would: see finish_after_close
        # The rows this handle queued, for other programs (a file not upgraded has no queue).
        if not self.read_only and not self._writer.closed and (move_in is None or move_in.migrated.is_set()):
            fts.flush_queue(self._writer, self._policy())
        self._closed = True
        self._writer.close(checkpoint=not self.read_only)

    def _large_file(self) -> bool:
        limit = self.upgrade_in_background_bytes
        try:
            return limit is not None and self.db_path.stat().st_size >= limit
        except OSError:
            return False

    def __repr__(self) -> str:
        # Safe on a handle whose open failed halfway: a traceback or a debugger may show one.
        writer = vars(self).get("_writer")
        if writer is None or vars(self).get("_closed", True) or writer.closed:
            mode = "closed"
        else:
            mode = "read-only" if self.read_only else "writable"
        return f"<{type(self).__name__} {str(vars(self).get('db_path', '?'))!r} {mode}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def shared(cls, db_path: str | os.PathLike | None = None) -> Self:
        """Return the process-wide handle for a path, counting one more user of it."""
        path = resolve_path(db_path, get_hermes_home().absolute())
        key = os.path.realpath(path)

        def open_handle() -> Handle:
            handle = cls(path)
            handle._shared_key = key
            return handle
        return SHARED.take(key, open_handle, lambda handle: handle.closed)

    def release(self) -> None:
        """Give back one use of a shared handle; the last release closes it."""
        self.close()

    @property
    def closed(self) -> bool:
        """True once this handle is closed (for a shared handle: once its last user released it; in a forked child: always)."""
        return self._closed or self._writer.closed

    @property
    def in_transaction(self) -> bool:
        """True while this handle holds a transaction open (a write, or a read snapshot)."""
        return not self._closed and self._writer.in_transaction()

    @property
    def write_count(self) -> int:
        """How many write transactions this handle has committed: the count the upkeep cadences follow."""
        return self._writer.writes

    @contextmanager
    def tracer(self, callback: Callable[[str], None] | None = None) -> Iterator[list[str]]:
        """Record every SQL statement this handle runs inside the block (and pass each to `callback`).

        Yields the list the statements are appended to; meant for tests and debugging.
        """
        with self._writer.tracing(callback) as statements:
            yield statements

    @property
    def _conn(self) -> Any:
        """The handle's connection, rows readable by column name (for tests and agent code that peek)."""
        return RowConnection(self._writer.conn)

    # --- the transactions -------------------------------------------------------------------------------

    def transaction(self, *, patience_s: float | None = None) -> AbstractContextManager[Transaction]:
        """Open one BEGIN IMMEDIATE write transaction for a `with` block; it gets `txn.conn`, `txn.after_commit(fn)`.

        Commits when the block ends, rolls back on any exception (KeyboardInterrupt too). The
        handle's own methods called inside join it. Callbacks run after COMMIT, in order.
        """
        self._check_writable(patience_s)  # refused at the call, before any SQL, like every write
        return self._transaction(patience_s)

    @contextmanager
    def _transaction(self, patience_s: float | None) -> Iterator[Transaction]:
        with self._write(patience_s):
            yield Transaction(self._writer)

    def _policy(self) -> RetryPolicy:
        # The knobs are read at each write (callers tune them on the class or the handle); the
        # policy is built again only when one of them changed.
        knobs = (self.write_retry_min_s, self.write_retry_max_s, self.write_retry_slow_min_s, self.write_retry_slow_max_s)
        if self._built_policy is None or self._built_policy[0] != knobs:
            self._built_policy = (knobs, RetryPolicy(*knobs))
        return self._built_policy[1]

    def _log_lock_holders(self, patience_s: float) -> None:
        lockowners.log_write_lock_holders(self.db_path, patience_s)

    def _upkeep(self, conn: sqlite3.Connection, writes: int) -> None:
        every = self.checkpoint_every_n_writes  # 0 or None: never (SQLite's own automatic checkpoint remains)
        if every and writes % every == 0:
            self._writer.checkpoint(background=self.checkpoint_in_background)
        # The cadences are checked here, so the usual write never enters the FTS module.
        if writes % fts.MERGE_EVERY_N_WRITES == 0:  # a bounded FTS merge every 1,000 writes
            fts.upkeep(conn, writes)
        every = self.optimize_every_n_writes
        if every and writes % every == 0 and fts.optimize_due(writes, every):
            # After the lock is let go, in its own transaction; by name, so a caller's replacement runs.
            self._writer.defer(lambda: fts.optimize_quietly(lambda: getattr(self, "optimize_fts")()))

    def _refuse_if_closed(self) -> None:
        if self._closed or self._writer.closed:  # the writer alone is closed in a forked child
            raise HermesStateError(self._writer.closed_reason or f"SessionDB for {self.db_path} is closed")

    def _check_writable(self, patience_s: float | None = None) -> float:
        # Returns how long the write waited for a move-in: that much of its patience is spent.
        self._refuse_if_closed()
        if self.read_only:
            raise ReadOnlyError(f"{self.db_path} was opened read-only; open it without read_only to write")
        waited = 0.0
        if self._move_in is not None:
            waited = self._wait_moved_in(self._move_in, self.write_patience_s if patience_s is None else patience_s)
        if self.schema_version is not None and self.schema_version > SCHEMA_VERSION:
            raise StateDbIncompatibleError(
                f"{self.db_path} has schema version {self.schema_version}, newer than this library's "
                f"{SCHEMA_VERSION}; writes are refused so nothing is downgraded. Upgrade hermes-state.")
        return waited

    @contextmanager
    def _write(self, patience_s: float | None = None, *, checked: bool = False) -> Iterator[sqlite3.Connection]:
        patience = self.write_patience_s if patience_s is None else patience_s
        if not checked:  # a transcript write checked already, before its session id
            patience = max(0.0, patience - self._check_writable(patience))
        # Not `with typed_errors(...)`: a successful write runs no code of the errors module.
        try:
            with self._writer.transaction(patience, self._policy()) as conn:
                yield conn
        except TRANSLATABLE as exc:
            raise_typed(exc, self.db_path)

    def _transcript_write(self, session_id: str, body: Callable[[sqlite3.Connection], Any],
                          holder: str | None = None) -> Any:
        self._check_writable(self.transcript_write_patience_s)
        # The guard and the retry sit beside the message rows; compression's code runs only when
        # another holder is compressing the session (the wait, holding no lock). `holder` is the
        # caller's own compression lock, which lets its writes through.
        return messages.write_transcript(
            lambda: self._write(self.transcript_write_patience_s, checked=True), session_id, body,
            lambda: compression.wait_for_compression(self._read, session_id, holder=holder,
                                                     timeout_s=self.compression_wait_s), holder)

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        self._refuse_if_closed()
        try:
            with self._writer.reading(snapshot) as conn:
                yield conn
        except TRANSLATABLE as exc:
            raise_typed(exc, self.db_path, reading=True)

    def _run(self, entry: Entry, args: tuple, kwargs: dict) -> Any:
        # Every table method comes through here: the one place that maps a kind to its transaction.
        if entry.kind in READS and (key := entry.unstorable(args, kwargs)) is not None:
            return entry.answer_unknown(key)
        if kwargs or entry.pack is not None:  # positional arguments pass as they are
            args, kwargs = entry.arguments(args, kwargs)
        if entry.kind in READS:
            with self._read(snapshot=entry.kind == "snapshot") as conn:
                # sqlite3's own UTF-8 decoding, the lenient one only if a value needs it: the
                # lenient decoder is a Python call per text value, a third of a large listing's time.
                return schema.read_strict_text(conn, lambda: entry.function(conn, *args, **kwargs))
        if entry.kind == "transcript":
            return self._transcript_write(entry.key(args, kwargs), lambda conn: entry.function(conn, *args, **kwargs),
                                          entry.holder(args, kwargs))
        patience = getattr(self, self._PATIENCE[entry.kind]) if entry.kind in self._PATIENCE else None
        with self._write(patience) as conn:
            return entry.function(Transaction(self._writer) if entry.txn else conn, *args, **kwargs)


