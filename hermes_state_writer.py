"""The write path: the retrying BEGIN IMMEDIATE transaction and WAL upkeep.

Owns: `RetryPolicy` (jittered retry timing), `retry_on_lock`, `Writer` (the shared
connection, its lock, the callbacks deferred until COMMIT, and its own close),
`WriteTransaction` (the one place that says BEGIN IMMEDIATE / COMMIT / ROLLBACK), `Checkpointer` (a writer's PASSIVE
checkpoints on a thread of their own), `Transaction` (what a write body is handed),
`SharedHandles` (the process-wide handles `SessionDB.shared()` counts), `passive_checkpoint`, and
what becomes of a writer in a forked child (it refuses every use).
Does not own: opening connections or pragmas (hermes_state_schema), what a write does, the fork
gate every stretch of SQLite work passes (hermes_state_fork).

Transaction contract: `Writer.transaction()` retries only the BEGIN, with jittered sleeps
taken while NOT holding the Python lock, runs its body exactly once, commits or rolls back,
and raises `SessionPersistenceError(code="session_persistence_failed:locked")` from the
SQLite error when patience runs out. A nested call from the same thread joins the open
transaction. An exception of any kind between BEGIN and COMMIT (KeyboardInterrupt too) rolls
back and leaves the connection ready for the next write. Once COMMIT has returned, nothing the
writer runs (its upkeep hooks) can turn the committed write into an error. Time, sleep and
randomness are injectable, so retry tests never really wait.
"""
from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import hermes_state_fork as fork
from hermes_state_common import (SQLITE_BUSY_TIMEOUT_S, WAL_BEHIND_FRAMES, WAL_RESET_BUG, WRITE_RETRY_FAST_WINDOW_S, WRITE_RETRY_MAX_S,
                                 WRITE_RETRY_MIN_S, WRITE_RETRY_SLOW_MAX_S, WRITE_RETRY_SLOW_MIN_S, logger,
                                 wal_reset_advice)
from hermes_state_errors import HermesStateError, SessionPersistenceError, is_sqlite_lock_error

@dataclass(frozen=True)
class RetryPolicy:
    """Jittered retry timing for a lock conflict at BEGIN."""

    min_s: float = WRITE_RETRY_MIN_S
    max_s: float = WRITE_RETRY_MAX_S
    slow_min_s: float = WRITE_RETRY_SLOW_MIN_S
    slow_max_s: float = WRITE_RETRY_SLOW_MAX_S
    fast_window_s: float = WRITE_RETRY_FAST_WINDOW_S

    def delay(self, elapsed_s: float, rng: random.Random) -> float:
        """Return the next sleep: short jitter in the first window, then the slow band."""
        if elapsed_s < self.fast_window_s:
            return rng.uniform(self.min_s, self.max_s)
        return rng.uniform(self.slow_min_s, self.slow_max_s)


def retry_on_lock(attempt: Callable[[], Any], patience_s: float, policy: RetryPolicy, *,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep,
                  rng: random.Random | None = None, before_attempt: Callable[[float], None] | None = None,
                  on_give_up: Callable[[], None] | None = None, start: float | None = None,
                  failed: sqlite3.OperationalError | None = None) -> Any:
    """Call `attempt()` until it stops failing with a lock error or `patience_s` runs out.

    Raises SessionPersistenceError (code ...:locked) from the last lock error; any other
    error propagates untouched. `before_attempt(remaining_s)` lets the caller cap SQLite's
    own busy wait so the total never overshoots the deadline. A caller that already made the
    first attempt at `start` passes its lock error as `failed`: the wait before the next one comes first.
    """
    rng = rng or random.Random()
    start = clock() if start is None else start
    deadline = start + patience_s
    error = failed
    while True:
        if error is not None:
            now = clock()
            if now >= deadline:
                if on_give_up is not None:
                    on_give_up()
                raise SessionPersistenceError(
                    f"database is locked: gave up after {patience_s:.1f}s of retries; another process "
                    "holds the write lock (see the WARNING naming it)",
                    code="session_persistence_failed:locked") from error
            sleep(min(policy.delay(now - start, rng), max(deadline - now, 0.0)))
        if before_attempt is not None:
            before_attempt(max(deadline - clock(), 0.0))
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if not is_sqlite_lock_error(exc):
                raise
            error = exc


class Cancelled(HermesStateError):
    """A background write gave up waiting because its owner is closing (never reaches a caller of the library)."""


# Whether a writer may run its checkpoints on a connection of their own: a second checkpointing
# connection in the process is exactly the pattern the WAL-reset bug needs, so not on such a build.
SECOND_CHECKPOINTER = not WAL_RESET_BUG
WAL_RESET_SAID = threading.Event()  # set once the WAL-reset bug was said in this process


def note_wal_reset_bug(db_path: Path | None = None, *, said_elsewhere: bool = False) -> None:
    """Note, once per process, that the linked SQLite has the WAL-reset bug; `said_elsewhere` only marks it said."""
    # A library does not write to a process's stderr: the notice goes to the `hermes_state` logger
    # at INFO (an application that routes it sees it), and once per home into the home's errors.log,
    # where a user who looks for what went wrong finds it. The command line says it in `doctor`.
    if WAL_RESET_BUG and not WAL_RESET_SAID.is_set():
        WAL_RESET_SAID.set()
        if said_elsewhere:
            return
        logger.info("%s", wal_reset_advice())
        if db_path is not None and db_path.name == "state.db":  # a home's store: its folder is the home
            note_in_home_log(db_path.parent, wal_reset_advice(),
                             marker=f".noted-sqlite-{sqlite3.sqlite_version}-wal-reset")


def note_in_home_log(home: Path, message: str, *, marker: str) -> bool:
    """Append `message` to `<home>/logs/errors.log` unless `marker` says it was noted there before; never raises."""
    logs = home / "logs"
    try:
        if (logs / marker).exists():
            return False
        logs.mkdir(mode=0o700, exist_ok=True)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        fd = os.open(logs / "errors.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as log:
            log.write(f"{stamp} WARNING {logger.name}: {message}\n")
        os.close(os.open(logs / marker, os.O_WRONLY | os.O_CREAT, 0o600))
        return True
    except OSError:  # a read-only home, a full disk: the notice is advice, never a failure
        return False


# One entry per read under way in this process, any handle's: the ident of the thread reading. A
# copy that goes in steps gives way to them between its steps (see recovery.backup_to).
_READS: list[int] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_READS.clear)  # the parent's readers are not the child's


def reads_elsewhere() -> bool:
    """Tell whether a thread other than this one is inside a read of any handle of this process."""
    me = threading.get_ident()
    return any(ident != me for ident in tuple(_READS))


class Writer:
    """The shared connection, its lock, and the retrying BEGIN IMMEDIATE transaction."""

    def __init__(self, conn: sqlite3.Connection, *, on_give_up: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 open_reader: Callable[[], sqlite3.Connection] | None = None):
        self.conn = conn
        self.lock = threading.RLock()
        # Reads go through a second connection opened on first use, under their own lock, so a
        # long read (a search over a huge row) never holds the write path, and a write waiting
        # for another process never holds a read. Without `open_reader` reads share `conn`.
        self._open_reader = open_reader
        self._reader: sqlite3.Connection | None = None
        self.read_lock = threading.RLock()
        self.on_give_up = on_give_up
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.writes = 0
        # Called with the running write count after every successful COMMIT, under the lock;
        # they do periodic upkeep (PASSIVE checkpoint, FTS merge) and must not raise.
        self.after_commit: list[Callable[[sqlite3.Connection, int], None]] = []
        self.closed = False
        self.closed_reason: str | None = None  # why a closed writer refuses work, when not close() (a fork)
        self._busy_ms = int(SQLITE_BUSY_TIMEOUT_S * 1000)
        self._txn_thread: int | None = None
        self._deferred: list[Callable[[], object]] = []
        # Checkpoints off the write path need a connection of their own, so only a writer with a
        # separate reader (a file, not :memory:) has them, and only where a second checkpointing
        # connection is safe.
        self.checkpoints = Checkpointer(open_reader) if open_reader is not None and SECOND_CHECKPOINTER else None
        if self.checkpoints is not None:  # a writer dropped unclosed lets its thread end too
            weakref.finalize(self, self.checkpoints.stop, False)
        fork.tell_child(self)

    def after_fork_in_child(self, parent: int) -> None:
        """In a forked child: refuse every later use of this writer, and never touch its connections again."""
        if self.closed:
            return
        self.closed = True
        self.closed_reason = (f"this SessionDB was opened by process {parent} before os.fork(), and a SQLite "
                              "connection cannot cross a fork; open a new SessionDB in this process")
        self.lock, self.read_lock = threading.RLock(), threading.RLock()  # a parent thread may have held them
        self._txn_thread, self._deferred = None, []
        fork.INHERITED.extend(conn for conn in (self.conn, self._reader) if conn is not None)

    def close(self, *, checkpoint: bool = True) -> None:
        """Close the connections (after a PASSIVE checkpoint unless told not to); idempotent."""
        with self.lock, self.read_lock:
            if self.closed:
                return
            self.closed = True
            if self.checkpoints is not None:
                self.checkpoints.stop()  # waits for a checkpoint under way, and closes its connection
            with fork.GATE.work():  # after the thread's end: its last checkpoint may need the gate
                try:
                    if self._reader is not None:
                        self._reader.close()
                    if checkpoint:
                        passive_checkpoint(self.conn)
                finally:  # whatever went wrong above, the connection is let go of
                    self.conn.close()

    @contextmanager
    def tracing(self, callback: Callable[[str], None] | None = None) -> Iterator[list[str]]:
        """Collect every statement the connection runs inside the block; pass each to `callback` too."""
        statements: list[str] = []

        def trace(sql: str) -> None:
            statements.append(sql)
            if callback is not None:
                callback(sql)
        with self.lock, self.read_lock:
            for conn in self._connections():
                conn.set_trace_callback(trace)
        try:
            yield statements
        finally:
            with self.lock, self.read_lock:
                if not self.closed:
                    for conn in self._connections():
                        conn.set_trace_callback(None)

    def _connections(self) -> list[sqlite3.Connection]:
        return [self.conn] if self._open_reader is None else [self.conn, self._read_conn()]

    def _read_conn(self) -> sqlite3.Connection:
        # Under read_lock. Opened lazily: a handle that only writes never pays for it.
        if self._reader is None:
            assert self._open_reader is not None  # callers check there is a separate reader first
            self._reader = self._open_reader()
        return self._reader

    def drop_reader(self) -> None:
        """Close the read connection, if one is open; the next read opens a new one."""
        with self.read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def _cap_busy_timeout(self, remaining_s: float, cap_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
        # SQLite's own busy wait is 1 s, but never longer than the patience left, so a
        # 0.5 s activity write cannot block for a whole second. Runs under the lock.
        want = max(0, min(int(cap_s * 1000), int(remaining_s * 1000)))
        if want != self._busy_ms:
            self.conn.execute(f"PRAGMA busy_timeout = {want}")
            self._busy_ms = want

    def _check_open(self) -> None:
        if self.closed:
            raise HermesStateError(self.closed_reason or "this SessionDB is closed; open a new one")

    def _begin(self, remaining_s: float, background: bool = False) -> None:
        # Another thread of this process may hold the connection; waiting for it counts
        # against this write's patience like waiting for another process does. Every line from
        # the lock on is covered by the handler: an interrupt anywhere here (a KeyboardInterrupt)
        # leaves neither the Python lock held nor a transaction open. The fork gate is held from
        # the Python lock on, until the lock is let go. A library thread's write (`background`)
        # waits on SQLite in short steps so that its owner's close() never waits long for it.
        started, held, gated, was_open = self.clock(), False, False, True
        try:
            held = self.lock.acquire(timeout=max(remaining_s, 0.0))
            if not held:
                busy = sqlite3.OperationalError("database is locked (another thread of this process is writing)")
                busy.sqlite_errorcode = 5  # type: ignore[attr-defined]
                raise busy
            fork.GATE.enter()  # after the Python lock: a thread that forks holding it is not waited for
            gated = True
            self._check_open()
            self._cap_busy_timeout(remaining_s - (self.clock() - started),
                                   BACKGROUND_BUSY_S if background else SQLITE_BUSY_TIMEOUT_S)
            was_open = self.conn.in_transaction
            self.conn.execute("BEGIN IMMEDIATE")
            self._txn_thread = threading.get_ident()
        except BaseException:
            if held:
                if not was_open and self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if gated:
                    fork.GATE.leave()
                self.lock.release()  # never sleep between retries holding the Python lock
            raise

    def in_transaction(self) -> bool:
        """Return True while any of this writer's connections holds a transaction open."""
        return self.conn.in_transaction or (self._reader is not None and self._reader.in_transaction)

    def in_transaction_here(self) -> bool:
        """Return True when the calling thread is inside this writer's transaction."""
        return self._txn_thread == threading.get_ident()

    def transaction(self, patience_s: float, policy: RetryPolicy | None = None, *,
                    stop: threading.Event | None = None, quiet: bool = False) -> WriteTransaction:
        """Run the body once inside BEGIN IMMEDIATE ... COMMIT, retrying only the BEGIN.

        Any exception, KeyboardInterrupt included, raised after the BEGIN and before the COMMIT
        rolls back and frees the connection for the next write. Callbacks handed to `defer()`
        run after the COMMIT, once the lock is released, in order; a rollback drops them.
        `stop` marks a library thread's write: it gives up (Cancelled) as soon as `stop` is set.
        `quiet` is for upkeep that fails softly: running out of patience logs no lock holders.
        """
        return WriteTransaction(self, patience_s, policy, stop, quiet)

    def _roll_back_here(self) -> None:
        # Roll back the transaction this thread began, if it is still open (a failed COMMIT leaves it so).
        # This thread's first: a connection that close() closed must not be touched.
        if self.in_transaction_here() and self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def _begin_after_busy(self, busy: sqlite3.OperationalError, started: float, patience_s: float,
                          policy: RetryPolicy, stop: threading.Event | None, quiet: bool) -> None:
        # The first BEGIN (at `started`) found the file busy: retry it within what is left of the patience.
        # Only a write that fails its caller names the lock holders; upkeep that gives up says nothing.
        on_give_up = None if quiet else self.on_give_up
        remaining = [patience_s]
        sleep: Callable[[float], object] = self.sleep if stop is None else stop.wait  # a stop wakes it early

        def note_remaining(seconds: float) -> None:
            if stop is not None and stop.is_set():
                raise Cancelled("a background write stopped waiting for the lock: its handle is closing")
            remaining[0] = seconds
        retry_on_lock(lambda: self._begin(remaining[0], stop is not None), patience_s, policy, clock=self.clock,
                      sleep=sleep, rng=self.rng, before_attempt=note_remaining, start=started, failed=busy,
                      on_give_up=(lambda: on_give_up(patience_s)) if on_give_up is not None else None)

    def _end(self) -> list[Callable[[], object]]:
        # Let go of the transaction this thread began (if it began one): the lock, and the queue
        # of callbacks waiting for the COMMIT, which the caller runs or drops.
        if not self.in_transaction_here():
            return []
        deferred, self._deferred = self._deferred, []
        self._txn_thread = None
        fork.GATE.leave()
        self.lock.release()
        return deferred

    def defer(self, callback: Callable[[], object]) -> None:
        """Run `callback()` after the open transaction of this thread commits; a rollback drops it.

        Raises HermesStateError when this thread holds no transaction of this writer.
        """
        if not self.in_transaction_here():
            raise HermesStateError("after_commit needs an open write transaction of this thread; it has ended")
        self._deferred.append(callback)

    def checkpoint(self, background: bool = True) -> None:
        """Run a PASSIVE checkpoint: on the checkpoint thread when asked and this writer has one, else here.

        A thread that has fallen behind (its last checkpoint still running or not yet started, or
        its last one finding the log at WAL_BEHIND_FRAMES or more) is not asked again: this write
        waits for the checkpoint it may be running, then copies the rest of the log itself.
        """
        checkpoints = self.checkpoints
        if not background or checkpoints is None:
            passive_checkpoint(self.conn)
        elif checkpoints.behind():
            # Under the write lock no write of this process can add frames meanwhile, so the
            # whole log is copied (unless a reader elsewhere holds an older snapshot) and the
            # next write starts it over. The thread's own checkpoints copy only what was
            # committed before they began, and while one runs SQLite's automatic checkpoint in
            # the COMMIT finds the file's checkpoint lock taken and gives up: without this the
            # log grows for as long as writes keep coming faster than the thread.
            with checkpoints.running:
                checkpoints.note(passive_checkpoint(self.conn), whole=True)
        else:
            checkpoints.request()

    @contextmanager
    def exclusive(self) -> Iterator[sqlite3.Connection]:
        """Lend the write connection under the lock, outside any transaction (VACUUM, a backup into it)."""
        with self.lock, fork.GATE.work():
            self._check_open()
            yield self.conn

    @contextmanager
    def reading(self, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        """Lend a connection for reads; with `snapshot`, inside one short read transaction.

        Inside this thread's write transaction the read joins it (it must see what the
        transaction wrote); otherwise it runs on the read connection when there is one.
        """
        separate = self._open_reader is not None and not self.in_transaction_here()
        me = threading.get_ident()
        _READS.append(me)  # waiting for the lock counts: a read is what someone is waiting for
        try:
            with self.read_lock if separate else self.lock, fork.GATE.work():
                self._check_open()
                conn = self._read_conn() if separate else self.conn
                if not snapshot or conn.in_transaction:
                    yield conn
                    return
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("COMMIT")
        finally:
            if me in _READS:  # not in a child forked during this read: its list starts empty
                _READS.remove(me)


class WriteTransaction:
    """`Writer.transaction()`'s context manager: BEGIN IMMEDIATE on entry; COMMIT (or ROLLBACK) and the callbacks on exit.

    A class rather than a generator: every write enters one, and a generator-based context
    manager costs several times as much to enter and leave.
    """

    __slots__ = ("writer", "patience_s", "policy", "nested", "open", "stop", "quiet")

    def __init__(self, writer: Writer, patience_s: float, policy: RetryPolicy | None,
                 stop: threading.Event | None = None, quiet: bool = False):
        self.writer, self.patience_s, self.policy, self.nested, self.open = writer, patience_s, policy, False, False
        self.stop, self.quiet = stop, quiet

    def __enter__(self) -> sqlite3.Connection:
        writer = self.writer
        if writer.in_transaction_here():
            # A nested call from inside a transaction joins it: one all-or-nothing unit.
            self.nested = True
            return writer.conn
        started = writer.clock()
        try:
            try:
                writer._begin(self.patience_s, self.stop is not None)  # the usual case: the lock is free at once
            except sqlite3.OperationalError as exc:
                if not is_sqlite_lock_error(exc):
                    raise
                writer._begin_after_busy(exc, started, self.patience_s, self.policy or RetryPolicy(), self.stop,
                                         self.quiet)
            self.open = True
            return writer.conn
        except BaseException:  # an interrupt just after a BEGIN that succeeded: let go of it
            writer._roll_back_here()
            writer._end()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self.nested:
            return
        writer = self.writer
        try:
            if exc_type is None:
                writer.conn.execute("COMMIT")
                writer.writes += 1
                for hook in writer.after_commit:
                    try:
                        hook(writer.conn, writer.writes)
                    except Exception as exc:  # noqa: BLE001 - the write has committed: upkeep cannot undo that
                        logger.warning("upkeep after a committed write failed; the write stands (%s: %s)",
                                       type(exc).__name__, exc)
        finally:
            writer._roll_back_here()  # the body failed, the COMMIT failed or an interrupt came: none stays open
            deferred = writer._end()
            self.open = False  # only now: an interrupt before this line leaves __del__ to let go
        if exc_type is None:
            for callback in deferred:
                callback()

    def __del__(self) -> None:
        # Entered and never exited: an interrupt landed between the entry and the `with` block
        # taking over (a tracer can put one there). Let go of the transaction, as the `with` would.
        if self.open:
            self.open = False
            self.writer._roll_back_here()
            self.writer._end()


class Transaction:
    """The body's side of an open write transaction: its connection, and what to do after COMMIT."""

    __slots__ = ("conn", "_writer")

    def __init__(self, writer: Writer):
        self.conn = writer.conn
        self._writer = writer

    def after_commit(self, callback: Callable[[], object]) -> None:
        """Run `callback()` once the outermost transaction has committed; a rollback drops it."""
        self._writer.defer(callback)


class SharedHandles:
    """Process-wide open handles by key, each counted per user: only the last release closes one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list[Any]] = {}  # key -> [handle, users]
        fork.tell_child(self)

    def after_fork_in_child(self, parent: int) -> None:
        """In a forked child: forget the parent's handles (the child opens its own)."""
        self._lock = threading.Lock()
        self._entries = {}

    def take(self, key: str, open_handle: Callable[[], Any], is_closed: Callable[[Any], bool]) -> Any:
        """Return the open handle for `key` (opening one when there is none or it was closed); count one user."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or is_closed(entry[0]):
                entry = self._entries[key] = [open_handle(), 0]
            entry[1] += 1
            return entry[0]

    def release(self, key: str, handle: Any) -> bool:
        """Give back one use of `handle`; return True when it was the last one (the caller closes it then)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] is not handle:
                return True  # no longer registered (closed and replaced): nobody else counts on it
            entry[1] -= 1
            if entry[1] > 0:
                return False
            del self._entries[key]
            return True


# How long a library thread's write lets SQLite wait for the lock in one go, between looks at its stop.
BACKGROUND_BUSY_S = 0.1


class Checkpointer:
    """A writer's PASSIVE checkpoints, run on a thread of their own so that no write waits for their disk syncs.

    Only on a SQLite without the WAL-reset bug (`SECOND_CHECKPOINTER`): its connection is a second
    checkpointer in the process. Each checkpoint holds the fork gate.

    A checkpoint copies the frames committed before it began, and SQLite starts the log over at
    a write only when every frame is copied. While writes keep coming the thread's checkpoints
    therefore never finish the log, and SQLite's automatic checkpoint in a COMMIT gives up when
    it meets one of them running. So the writer asks the thread only while it keeps up
    (`behind()` is False); otherwise the due checkpoint runs in the write, after the thread's
    (`running` keeps the two apart), and copies everything. The thread ends after `IDLE_S`
    without a checkpoint to run (the next one starts another), so a process between bursts of
    writes holds no extra thread that a fork would copy.
    """

    IDLE_S = 2.0

    def __init__(self, open_conn: Callable[[], sqlite3.Connection]):
        self._open_conn = open_conn
        self._wake = threading.Event()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Held for each checkpoint of the thread's, and by a write copying the log itself: SQLite
        # refuses a second checkpoint at once instead of waiting for the first.
        self.running = threading.Lock()
        self.log_frames = 0  # the log's length when the last checkpoint (the thread's or a write's) ran

    def behind(self) -> bool:
        """Tell whether the thread has not kept up: a checkpoint asked for is still to finish, or the last found a long log."""
        return self._wake.is_set() or self.running.locked() or self.log_frames >= WAL_BEHIND_FRAMES

    def note(self, result: tuple[int, int] | None, *, whole: bool = False) -> None:
        """Remember the log length a checkpoint's (frames in the log, frames copied) reports; None (skipped) changes nothing.

        `whole`: no write could come in during that checkpoint, so when it copied every frame the
        next write starts the log over, and the log counts as empty.
        """
        if result is not None:
            frames, copied = result
            self.log_frames = 0 if whole and copied == frames else frames

    def request(self) -> None:
        """Start a checkpoint on the thread; asked while one runs, one more starts after it."""
        with self._guard:
            if self._stopping:
                return
            if self._thread is None or not self._thread.is_alive():  # first use, after an idle end, or a forked child
                self._thread = threading.Thread(target=self.run, name="hermes-state-checkpoint", daemon=True)
                self._thread.start()
            self._wake.set()  # under the guard: a thread deciding to end sees it

    def run(self) -> None:
        """The thread's body: run each checkpoint asked for, until stopped or idle for IDLE_S."""
        conn: sqlite3.Connection | None = None
        try:
            while True:
                if not self._wake.wait(self.IDLE_S):
                    with self._guard:
                        if not self._wake.is_set():  # nothing asked meanwhile: end; a request starts a new thread
                            if self._thread is threading.current_thread():
                                self._thread = None
                            return
                self._wake.clear()
                if self._stopping:
                    return
                with fork.GATE.work(), self.running:  # never inside SQLite while the process forks
                    if conn is None:
                        conn = self._open_conn()
                    self.note(passive_checkpoint(conn))
        except sqlite3.Error as exc:  # the connection could not be opened: the next request tries again
            logger.info("PASSIVE checkpoint skipped: %s", exc)
        finally:
            if conn is not None:
                with fork.GATE.work():
                    conn.close()

    def stop(self, wait: bool = True) -> None:
        """End the thread once the checkpoint it runs (if any) is done; with `wait`, return only then."""
        with self._guard:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()


def passive_checkpoint(conn: sqlite3.Connection) -> tuple[int, int] | None:
    """Run a PASSIVE WAL checkpoint and return (frames in the log, frames copied); None when it could not run.

    Logs a failure, never raises (it is upkeep, not the write).
    """
    try:
        rows = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except sqlite3.Error as exc:
        logger.info("PASSIVE checkpoint skipped: %s", exc)
        return None
    row = rows[0] if rows else None
    if row is None or row[0] or row[1] < 0:  # another checkpoint held the file's checkpoint lock, or no WAL
        return None
    return int(row[1]), int(row[2])


class RowConnection:
    """A view of a connection whose cursors return `sqlite3.Row`s (readable by index and by name).

    Everything else is the connection's own: statements run on it directly, outside the
    writer, so this is for peeking and for code that manages its own statements.
    """

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def cursor(self) -> sqlite3.Cursor:
        """Return a cursor of the connection whose rows are `sqlite3.Row`s."""
        cur = self._conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        """Run one statement and return its cursor (rows as `sqlite3.Row`)."""
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any) -> sqlite3.Cursor:
        """Run one statement once per parameter set."""
        return self.cursor().executemany(sql, seq_of_parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
