"""Exception types of hermes-state, the SQLite error classifiers and the typed-error choke point.

Owns: the one root `HermesStateError` and every typed error the library raises,
`is_sqlite_lock_error`, `classify_persistence_error`, and `typed_errors`, the context manager
under which bad data and bad input surface as typed errors (`translate` is its one mapping;
the handle's reads and writes call `raise_typed` only when something failed). Imports nothing
of ours.

Every error says what happened and what to do next. SQLite errors are classified by their
result code (`sqlite_errorcode & 0xFF`), and only by message text when no code exists.
"""
from __future__ import annotations

import errno
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NoReturn

SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_IOERR = 10
SQLITE_CORRUPT = 11
SQLITE_CANTOPEN = 14
SQLITE_FULL = 13
SQLITE_TOOBIG = 18
SQLITE_NOTADB = 26
# Extended codes of a failed write, fsync or truncate: how a full disk or a file-size limit
# (EFBIG) surfaces when SQLite does not report SQLITE_FULL itself.
_WRITE_FAILURE_CODES = frozenset({SQLITE_IOERR | 3 << 8, SQLITE_IOERR | 4 << 8, SQLITE_IOERR | 6 << 8})

_LOCK_CODES = frozenset({SQLITE_BUSY, SQLITE_LOCKED})
_LOCK_TEXTS = ("database is locked", "database table is locked", "database schema is locked")


class HermesStateError(Exception):
    """Root of every error raised by hermes-state."""


class SessionPersistenceError(HermesStateError):
    """A write could not be made durable; `.code` says why (e.g. `session_persistence_failed:locked`)."""

    def __init__(self, message: str, code: str = "session_persistence_failed:unknown"):
        super().__init__(message)
        self.code = code


class StateDbCorruptError(HermesStateError):
    """The database file is not a database, or its schema or pages are malformed; `.path` names it when known."""

    path: Path | None = None


class StoreUnavailableError(HermesStateError):
    """The store cannot serve requests now; maps to HTTP 503 with a guidance sentence."""

    http_status = 503
    guidance = "Start the profile's owner (gateway); `hermes-state doctor` says what else is wrong."


class StateDbJournalError(StoreUnavailableError, sqlite3.OperationalError):
    """No journal mode works on the file's file system (neither WAL nor a rollback journal).

    Also an `sqlite3.OperationalError`, which is what callers written for hermes-agent catch.
    """

    guidance = ("Move HERMES_HOME to a local disk: SQLite's WAL mode does not work over a network "
                "file system (see https://www.sqlite.org/wal.html).")


class WalUnsupportedError(StoreUnavailableError, sqlite3.OperationalError):
    """WAL mode was required (`apply_wal_with_fallback(..., require_wal=True)`) and the file system refuses it.

    Also an `sqlite3.OperationalError`, as in hermes-agent, so a caller's handler for that still catches it.
    """

    guidance = ("Move the database to a local disk: SQLite's WAL mode needs shared memory, which network "
                "file systems (NFS, SMB, some FUSE mounts) lack.")


class StateDbNotWritableError(StoreUnavailableError, sqlite3.OperationalError):
    """The database file, its -wal or -shm, or its folder is not writable by this user, and was not ours to repair.

    Also an `sqlite3.OperationalError`, which is what hermes-agent raises for it.
    """

    guidance = "Give this user read-write access to the file (the message names the command)."


class StateDbIncompatibleError(StoreUnavailableError):
    """The schema is unknown, too old to read without migrating, or newer than this library."""

    guidance = "Upgrade hermes-state, or let the profile's owner migrate the database."


class ForeignDatabaseError(StateDbIncompatibleError):
    """The file is another program's SQLite database (it holds none of this store's tables)."""

    guidance = "Point the store at its own file, or open this one with force=True to add the store's tables."


class StateDbUninitializedError(StoreUnavailableError):
    """The database does not exist yet (missing or empty file)."""

    guidance = "Start the profile's owner once so it creates the database."


class StateDbBusyError(StoreUnavailableError):
    """The database stayed locked longer than a read-only open waits."""

    guidance = "Retry shortly; a writer holds the database."


class ReadOnlyError(HermesStateError):
    """A write was attempted on a handle opened with read_only=True."""


class SessionNotFoundError(HermesStateError, KeyError):
    """No session has that id."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable.
        return str(self.args[0]) if self.args else "session not found"


class AmbiguousSessionIdError(HermesStateError, ValueError):
    """An id prefix starts more than one session; `candidates` holds (some of) their ids."""

    def __init__(self, message: str, candidates: list[str]) -> None:
        super().__init__(message)
        self.candidates = candidates


class TitleConflictError(HermesStateError, ValueError):
    """Another session already carries that title."""


class TopicBindingConflictError(HermesStateError, ValueError):
    """The session is already linked to another Telegram topic; unbind that topic first."""


class SessionBusyError(HermesStateError):
    """Delete/prune refused: ledger work for the session is still live."""


# hermes-agent 0.20.1: transcript, turn leases and compression. Its callers catch these three
# (each a RuntimeError there), so the library's own errors for the same conditions derive from them.
class CompressionSessionBusyError(HermesStateError, RuntimeError):
    """Compression owns the session and the caller is not its holder (or its lease was lost)."""


class CompressionSessionClosedError(HermesStateError, RuntimeError):
    """The write targeted a session compression already closed; write to its live continuation."""


class SessionTurnLeaseLostError(HermesStateError, RuntimeError):
    """A transcript write named a turn-lease holder that no longer holds the conversation's lease."""


class SessionCompressionInProgressError(CompressionSessionBusyError):
    """Another holder is compressing the session; retry once it finishes."""


class SessionClosedByCompressionError(SessionPersistenceError, CompressionSessionClosedError):
    """The session was closed by compression rotation; write to its live continuation instead."""

    def __init__(self, session_id: str, successor_id: str | None):
        where = f"its live continuation is {successor_id!r}" if successor_id else "it has no live continuation"
        super().__init__(f"session {session_id!r} was closed by compression; {where}",
                         code="session_persistence_failed:compression")
        self.session_id = session_id
        self.successor_id = successor_id


class SessionExportTooLargeError(HermesStateError, ValueError):
    """A session holds more active messages than an in-memory export may load; export it in a stream instead."""

    def __init__(self, session_id: str, message_count: int, limit: int = 20_000):
        super().__init__(f"session {session_id!r} has at least {message_count} active messages; "
                         f"safe in-memory export limit is {limit}")
        self.session_id, self.message_count, self.limit = session_id, message_count, limit


class SessionResumeTooLargeError(HermesStateError, ValueError):
    """A resume would load more active messages than is safe; export the session instead."""

    def __init__(self, message_count: int, limit: int = 20_000, scope: str = "across its lineage"):
        super().__init__(f"session has at least {message_count} active messages {scope}; safe resume limit is "
                         f"{limit}. Export the session instead, or set sessions.max_resume_messages: 0 in "
                         "config.yaml to disable the guard.")
        self.message_count, self.limit = message_count, limit


class StaleEpochError(HermesStateError):
    """The caller's runtime epoch is older than the current one (a newer owner took over)."""


class LedgerStateError(HermesStateError, ValueError):
    """A gateway ledger row does not exist or is not in a state that allows this transition."""


class AdoptionRefusedError(HermesStateError, ValueError):
    """An orphaned gateway session was not adopted: the evidence does not name that donor alone."""


class ReceiptOrderError(HermesStateError):
    """A worker receipt arrived out of order (a gap in `seq`)."""


class ReceiptDigestError(HermesStateError):
    """A worker receipt's digest does not match its payload."""


class OwnershipReadError(HermesStateError):
    """The input-ownership lookup failed, so nothing was appended."""


class ProfileNotFoundError(HermesStateError):
    """An explicitly named profile does not exist."""


class ImportValidationError(HermesStateError, ValueError):
    """An import's input is malformed; `.problems` lists every problem found. Nothing was written.

    `.errors` holds the same problems as the import report's entries ({"index", "session_id", "error"}).
    """

    def __init__(self, problems: list[str], errors: Any = ()):
        self.problems = list(problems)
        self.errors = [dict(e) for e in errors]
        shown = "; ".join(self.problems[:10]) + (f"; and {len(self.problems) - 10} more" if len(self.problems) > 10
                                                 else "")
        super().__init__(f"nothing was imported: {shown}")


class ImportConflictError(HermesStateError, ValueError):
    """An imported session id already exists and the import was asked to fail on conflicts."""


class SessionFilterError(HermesStateError, ValueError):
    """A filter selecting sessions (a source, a list of names, a bound, a flag) has a value of the wrong type or range."""


def _primary_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_sqlite_lock_error(exc: BaseException) -> bool:
    """Return True when `exc` is SQLite reporting a lock conflict (SQLITE_BUSY/SQLITE_LOCKED)."""
    if not isinstance(exc, sqlite3.Error):
        return False
    code = _primary_code(exc)
    if code is not None:
        # An FTS5 constructor losing its lock under a rollback journal arrives as
        # "vtable constructor failed" with SQLITE_BUSY: the code alone settles it.
        return code in _LOCK_CODES
    text = str(exc).lower()
    return any(t in text for t in _LOCK_TEXTS)


# Every cause classify_persistence_error names: hermes-agent 0.20.1's, in its order, then this library's own.
PERSISTENCE_ERROR_CAUSES = ("locked", "compression", "compression_closed", "turn_lease", "disk", "unknown",
                            "corrupt", "fts_index", "session_row_missing")


_DISK_FULL_TEXTS = ("no space left on device", "enospc", "disk full", "database or disk is full",
                               "not enough space on the disk")


# What an error's text says, for a caller that kept only the text (hermes-agent's callers pass it).
_TEXT_CAUSES = (("locked", ("database is locked", "database table is locked", "database is busy")),
                ("corrupt", ("malformed", "not a database", "file is encrypted")),
                ("fts_index", ("fts5", "messages_fts")),
                ("disk", ("disk i/o error", *_DISK_FULL_TEXTS)))


def classify_persistence_error(exc_or_str: BaseException | str | None = None, *,
                               exc: BaseException | None = None) -> str:
    """Name the class of a persistence failure (an exception or its text): locked, compression, corrupt, fts_index, disk, session_row_missing or unknown.

    `exc` is this library's earlier name of the argument, still taken by keyword.
    """
    if exc is None:
        exc = exc_or_str  # type: ignore[assignment]
    elif exc_or_str is not None:
        raise TypeError("give the error once: exc_or_str or exc")
    if isinstance(exc, str):
        text = exc.lower()
        return next((cause for cause, markers in _TEXT_CAUSES if any(m in text for m in markers)), "unknown")
    if not isinstance(exc, BaseException):
        return "unknown"
    if isinstance(exc, SessionPersistenceError):
        return exc.code.rsplit(":", 1)[-1] if ":" in exc.code else "unknown"
    if isinstance(exc, SessionCompressionInProgressError):
        return "compression"
    if isinstance(exc, StateDbCorruptError):
        return "corrupt"
    if isinstance(exc, SessionNotFoundError):
        return "session_row_missing"
    if is_sqlite_lock_error(exc):
        return "locked"
    code = _primary_code(exc)
    text = str(exc).lower()
    if isinstance(exc, sqlite3.Error) and ("fts5" in text or "messages_fts" in text):
        return "fts_index"
    if code in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return "corrupt"
    if code in (SQLITE_IOERR, SQLITE_FULL) or isinstance(exc, OSError):
        return "disk"
    if isinstance(exc, sqlite3.IntegrityError) and "foreign key" in text:
        return "session_row_missing"
    return "unknown"


# What a full disk says when it surfaces as text (an RPC boundary, a log line): POSIX, SQLite, Windows.


def is_disk_full_error(exc: BaseException | str | None) -> bool:
    """Tell whether an error (or its text) is a full disk: ENOSPC, SQLite's SQLITE_FULL, or a message saying so."""
    if exc is None:
        return False
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    if isinstance(exc, sqlite3.Error) and _primary_code(exc) == SQLITE_FULL:
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _DISK_FULL_TEXTS)


# --- the typed-error choke point -------------------------------------------------------------

def is_corruption(exc: BaseException) -> bool:
    """Return True for SQLite's "not a database" and "malformed" errors."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    text = str(exc).lower()
    return "not a database" in text or "malformed" in text


def corrupt_error(path: Path, exc: BaseException) -> StateDbCorruptError:
    """Build the typed error for an unreadable database file."""
    # What can be saved depends on how much of the file is readable, which this layer cannot
    # tell: the command line and the web page add the steps that can work.
    error = StateDbCorruptError(f"{path} is not a usable SQLite database ({exc}); the file was left untouched, "
                                f"and `hermes-state --db {path} doctor` says what can be saved")
    error.path = path
    return error


# The failures `typed_errors` may translate. A hot path catches exactly these and calls
# `raise_typed`, so this module runs no code at all while nothing fails.
TRANSLATABLE: tuple[type[BaseException], ...] = (sqlite3.Error, UnicodeError, OverflowError, RecursionError)


@contextmanager
def typed_errors(path: Path, *, reading: bool = False) -> Iterator[None]:
    """Re-raise SQLite failures that mean bad data or bad input as the library's typed errors.

    A malformed file becomes StateDbCorruptError; a path SQLite cannot open (a directory, a
    file without permission) StoreUnavailableError; a full disk or a file-size limit
    SessionPersistenceError with code `session_persistence_failed:disk`;
    a value SQLite cannot bind (a list, an int past 64 bits, text with a lone surrogate)
    ValueError; a value nested too deeply for Python to walk ValueError. A value past SQLite's size limit is ValueError when writing, and
    StateDbCorruptError when `reading` (a damaged record claims it). Every other sqlite3
    error propagates untouched.
    """
    try:
        yield
    except TRANSLATABLE as exc:
        raise_typed(exc, path, reading=reading)


def raise_typed(exc: BaseException, path: Path, *, reading: bool = False) -> NoReturn:
    """Raise the typed error `typed_errors` maps `exc` to (from `exc`), or `exc` itself when it maps none."""
    typed = translate(exc, path, reading=reading)
    if typed is None:
        raise exc
    raise typed from exc


def translate(exc: BaseException, path: Path, *, reading: bool = False) -> BaseException | None:
    """Return the typed error `typed_errors` raises for `exc`, or None when `exc` propagates untouched."""
    if isinstance(exc, sqlite3.DataError) and _primary_code(exc) == SQLITE_TOOBIG:
        if reading:
            return corrupt_error(path, exc)
        return ValueError(f"a value is larger than SQLite can store ({exc})")
    if isinstance(exc, UnicodeEncodeError):
        return ValueError("a text argument contains a lone surrogate (U+D800..U+DFFF), which SQLite can "
                          "neither store nor look up")
    if isinstance(exc, UnicodeDecodeError):  # SQLite's message quotes a damaged schema name that is not UTF-8
        return corrupt_error(path, exc)
    if isinstance(exc, sqlite3.DataError):  # any other DataError propagates untouched
        return None
    if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
        text = str(exc).lower()
        if "binding parameter" in text or "not supported" in text:
            return ValueError(f"a value cannot be stored or looked up in SQLite: {exc}")
        return None
    if isinstance(exc, OverflowError):
        return ValueError(f"an integer is out of SQLite's 64-bit range: {exc}")
    if isinstance(exc, RecursionError):  # checking, encoding or quoting an argument nested thousands deep
        return ValueError("an argument is nested too deeply to check or store")
    if isinstance(exc, sqlite3.DatabaseError):
        return _typed_database_error(path, exc)
    return None


def _typed_database_error(path: Path, exc: sqlite3.DatabaseError) -> HermesStateError | None:
    # The library's error for a damaged file, a path that is no database file, or a full disk;
    # None for every other SQLite error, which propagates untouched.
    # "unsupported file format" comes with the generic SQLITE_ERROR code: the header's format
    # bytes are damaged (no SQLite ever wrote them).
    if is_corruption(exc) or "unsupported file format" in str(exc):
        return corrupt_error(path, exc)
    if _primary_code(exc) == SQLITE_CANTOPEN:
        return StoreUnavailableError(f"{path} cannot be opened as a database file ({exc}): is it a "
                                     "directory, or a file this process may not read and write?")
    if _primary_code(exc) == SQLITE_FULL or getattr(exc, "sqlite_errorcode", None) in _WRITE_FAILURE_CODES:
        return SessionPersistenceError(
            f"writing to {path} failed ({exc}): the disk is full or the file reached a size limit. "
            "The transaction was rolled back; free some space and retry.",
            code="session_persistence_failed:disk")
    return None


# --- why the last open failed ---------------------------------------------------------------------
# Gateways and dashboards open a SessionDB per request and, when it fails, answer a slash command
# later, from another frame; they read the cause here. A success never clears it: a concurrent
# open that succeeds must not erase the cause another thread is about to report.

_last_init_error: str | None = None
_NETWORK_FS_HINT = (" WAL mode needs shared memory, which network file systems (NFS/SMB) lack; "
                    "see https://www.sqlite.org/wal.html.")


def set_last_init_error(cause: str | None) -> None:
    """Record why the last SessionDB open failed (None forgets it)."""
    global _last_init_error
    _last_init_error = cause


def get_last_init_error() -> str | None:
    """Return "Type: message" of the last failed SessionDB open in this process, or None."""
    return _last_init_error


def describe_init_failure(exc: BaseException) -> str:
    """Return "Type: message" of the SQLite error at the root of a failed open (else of `exc`)."""
    root, cause = exc, exc.__cause__
    while cause is not None:  # the deepest SQLite error says what the file system refused
        if isinstance(cause, sqlite3.Error):
            root = cause
        cause = cause.__cause__
    return f"{type(root).__name__}: {root}"


def format_session_db_unavailable(prefix: str = "Session database not available") -> str:
    """Return one sentence for a user saying the store is unavailable, with the recorded cause."""
    cause = get_last_init_error()
    if not cause:
        return f"{prefix}."
    hint = _NETWORK_FS_HINT if "locking protocol" in cause.lower() else ""
    return f"{prefix}: {cause.rstrip('.')}.{hint}"
