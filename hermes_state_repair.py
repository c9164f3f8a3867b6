"""Self-repair of a state.db whose schema catalogue or full-text index is damaged, losing no row.

Owns: telling the "malformed" class of SQLite errors from others (`is_malformed_db_error`), the
health probe that also tries a rolled-back write through the index triggers (`db_opens_cleanly`),
and `repair_state_db_schema`, which copies the file aside and then tries, in order: rebuilding
the full-text indexes in place, removing duplicate rows of the schema catalogue, and removing
the full-text objects from the catalogue so they are built afresh. Every step touches only
derived objects (indexes, catalogue rows); sessions and messages are never rewritten. When no
strategy heals the file, it is left as the steps left it (derived objects only), and the copy
keeps the bytes as they were found, for `recover` or a manual restore.
Does not own: salvaging rows from a file whose tables are damaged (hermes_state_recovery's
`recover`), nor deciding when an open tries a repair (the facade does, once per path).

Transaction contract: works through short-lived SQLite connections of its own, never a plain
file descriptor: closing one of those on a file this process has open would drop every POSIX lock
the process holds on it, and the next program to close would delete the WAL under it. So it is
safe while other handles of this process have the file open. The copy aside is made with SQLite's
backup API; a file too damaged for it is copied byte for byte only when no descriptor of this
process is open on it (then there is no lock to lose), and otherwise the repair is refused. Each step runs under a deadline (SQLite interrupts a statement that outlives it), and
the write probe fires no trigger the library did not make. It never raises for a damaged file:
the report says what happened.
"""
from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

import hermes_state_fts as fts
from hermes_state_catalogue import foreign_objects
from hermes_state_cjk import register_functions
from hermes_state_common import WRITE_PATIENCE_S, logger
from hermes_state_errors import HermesStateError, StateDbCorruptError
from hermes_state_lockowners import open_in_this_process
from hermes_state_writer import RetryPolicy, Writer

SQLITE_CORRUPT = 11
STRATEGIES = ("rebuild_fts", "dedup_schema", "drop_fts_rebuild")
_PROBE_ID = "hermes-state-repair-probe"
# The longest one step may run (a strategy, or the health probe's checks), and the write probe;
# past it SQLite interrupts the statement under way, which rolls back.
STEP_S = 600.0
PROBE_S = 60.0
WRITE_PROBE_S = 5.0
# The paths an open of this process already tried to repair: a file the repair cannot fix is
# not tried again at every open (the facade passes it, under hermes-agent's name for it).
ATTEMPTED_PATHS: set[str] = set()


def is_malformed_db_error(exc: BaseException) -> bool:
    """Tell whether `exc` is SQLite's "malformed" class: a damaged schema catalogue, page or index.

    "file is not a database", a lock conflict or any non-SQLite error is not. The library's own
    StateDbCorruptError counts when the SQLite error it was raised from does.
    """
    if isinstance(exc, HermesStateError) and exc.__cause__ is not None:
        return is_malformed_db_error(exc.__cause__)
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == SQLITE_CORRUPT
    return "malformed" in str(exc).lower()


def is_catalogue_error(exc: BaseException) -> bool:
    """Tell whether `exc` says the schema catalogue itself is malformed (what an open may repair).

    SQLite gives a damaged catalogue and a damaged page the same code; only its message tells
    them apart. A damaged page is left to `recover`, which salvages rows instead.
    """
    cause = exc.__cause__ if isinstance(exc, HermesStateError) else exc
    return is_malformed_db_error(exc) and "malformed database schema" in str(cause).lower()


def _deadline(conn: sqlite3.Connection, seconds: float) -> None:
    # From now on, any statement still running after `seconds` is interrupted ("interrupted").
    end = time.monotonic() + seconds
    conn.set_progress_handler(lambda: time.monotonic() > end, 10_000)


def connect(path: Path, *, writable_schema: bool = False, budget_s: float = STEP_S) -> sqlite3.Connection:
    """Connect to an existing file (never creating one), each statement bounded by `budget_s` seconds."""
    # mode=rw: a probe or a repair must never create a file that is not there.
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True, isolation_level=None,
                           timeout=WRITE_PATIENCE_S)
    _deadline(conn, budget_s)
    if writable_schema:
        # Lets SQLite read a catalogue it would otherwise refuse as malformed, so its rows can be fixed.
        conn.execute("PRAGMA writable_schema = ON")
    register_functions(conn)
    return conn


def _foreign_triggers(conn: sqlite3.Connection) -> list[str]:
    # Triggers the library did not make: a write probe would run them (with no bound on what they do).
    return [name for name in foreign_objects(conn, fts.OWN_OBJECTS, older=False) if name.startswith("trigger ")]


def write_probe(conn: sqlite3.Connection) -> None:
    """Insert a session and a message through the file's triggers, bounded, then roll them back."""
    # A damaged full-text index can still answer reads while every insert through its triggers
    # fails; only a write shows it. Rolled back, so the file is left exactly as it was; bounded, as
    # the write lock is held meanwhile.
    _deadline(conn, WRITE_PROBE_S)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'repair', ?)", (_PROBE_ID, time.time()))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', 'probe', ?)",
                     (_PROBE_ID, time.time()))
    finally:
        if conn.in_transaction:  # an interrupted statement has rolled the transaction back already
            conn.execute("ROLLBACK")


def db_opens_cleanly(db_path: str | Path) -> str | None:
    """Return None when the file opens, passes SQLite's checks and takes a write; else the reason."""
    path = Path(db_path)
    if not path.is_file():
        return f"{path} does not exist"
    try:
        conn = connect(path, budget_s=PROBE_S)
    except sqlite3.Error as exc:
        return f"cannot open: {exc}"
    try:
        conn.execute("PRAGMA journal_mode").fetchone()  # the first statement parses the catalogue
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            return "quick_check: " + "; ".join(problems[:5])
        for table, verdict in fts.integrity_report(conn, compare=False).items():
            if verdict != "ok":
                return f"{table}: {verdict}"
        foreign = _foreign_triggers(conn)
        if foreign:  # what they would do is not ours to run; the reads above are the whole check
            logger.info("%s: the write probe was skipped: %s not made by hermes-state", path, ", ".join(foreign))
            return None
        try:
            write_probe(conn)
        except sqlite3.DatabaseError as exc:
            if is_malformed_db_error(exc) or "not a database" in str(exc):
                return f"a write fails: {exc}"
        return None
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        conn.close()


def copy_aside(path: Path) -> Path:
    """Copy the file as found (its log included) beside it; return the copy's path."""
    # The damaged file as found, write-ahead log included, in one file: SQLite's backup API copies
    # its pages (it reads even a catalogue it would refuse to parse); no plain descriptor is opened.
    target = path.with_name(f"{path.name}.malformed-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9}.bak")
    try:
        source = connect(path, writable_schema=True)
        try:
            copy = sqlite3.connect(str(target))
            try:
                source.backup(copy)
            finally:
                copy.close()
        finally:
            source.close()
    except sqlite3.DatabaseError:
        target.unlink(missing_ok=True)
        # Too damaged for SQLite to read. Its bytes may still be copied as they are, but only when
        # no descriptor of this process is open on it: then closing ours cannot drop a lock.
        if open_in_this_process(path):
            raise
        _copy_bytes(path, target)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


def _copy_bytes(path: Path, target: Path) -> None:
    # The file and, beside the copy, its log: what a manual restore needs, as found.
    try:
        for source, copy in ((path, target), (Path(f"{path}-wal"), Path(f"{target}-wal"))):
            if source.exists():
                with open(source, "rb") as src, open(copy, "xb") as dst:
                    while block := src.read(1 << 20):
                        dst.write(block)
    except BaseException:
        target.unlink(missing_ok=True)
        Path(f"{target}-wal").unlink(missing_ok=True)
        raise


def _reindex(path: Path) -> None:
    # The library's own builder: drop and recreate every full-text object, then index every row.
    conn = connect(path)
    try:
        writer = Writer(conn)
        with writer.transaction(WRITE_PATIENCE_S, RetryPolicy()):
            fts.create_fts(conn)
        fts.rebuild(writer, WRITE_PATIENCE_S, RetryPolicy())
    finally:
        conn.close()


def _forget_catalogue_rows(path: Path, where: str) -> None:
    # Catalogue rows go in one transaction through a writable schema; no table row is touched.
    conn = connect(path, writable_schema=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"DELETE FROM sqlite_master WHERE {where}")
        conn.execute("COMMIT")
    finally:
        conn.close()


def _dedup_schema(path: Path) -> None:
    # Two catalogue rows for one object make every statement fail; the first row is the original.
    _forget_catalogue_rows(path, "rowid NOT IN (SELECT MIN(rowid) FROM sqlite_master GROUP BY type, name)")


def _drop_fts(path: Path) -> None:
    # Forget every full-text object of the library's in the catalogue (their pages become free and
    # VACUUM drops them), then build the indexes anew from the messages, which were never touched.
    # hermes-agent's `messages_fts*` objects are its own: they stay, and so does their content.
    _forget_catalogue_rows(path, "name LIKE 'hermes\\_fts\\_%' ESCAPE '\\' "
                                 "OR (type = 'trigger' AND sql LIKE '%hermes\\_fts\\_%' ESCAPE '\\')")
    conn = connect(path)
    try:
        conn.execute("VACUUM")
    finally:
        conn.close()
    _reindex(path)


def open_repairing(connect: Callable[[], Any], path: Path, attempted: set[str],
                   repair: Callable[[Path], dict[str, Any]] | None) -> Any:
    """Return `connect()`; when it meets a malformed catalogue, `repair` the file once per path and retry.

    `attempted` holds the paths already tried in this process, so a file the repair cannot fix
    raises at once the next time. `repair` None (a read-only open) never repairs.
    """
    try:
        return connect()
    except StateDbCorruptError as exc:
        key = os.path.realpath(path)
        if repair is None or not is_catalogue_error(exc) or key in attempted:
            raise
        attempted.add(key)
        if not repair(path)["repaired"]:
            raise
        return connect()


_STEPS: dict[str, Callable[[Path], None]] = {
    "rebuild_fts": _reindex, "dedup_schema": _dedup_schema, "drop_fts_rebuild": _drop_fts}


def repair_state_db_schema(db_path: str | os.PathLike, *, backup: bool = True,
                           check: Callable[[Path], str | None] | None = None) -> dict[str, Any]:
    """Repair a malformed schema catalogue or full-text index in place; return what was done.

    The report is {repaired, strategy, backup_path, error}. A healthy file is left untouched
    (strategy "already_healthy"). Otherwise the file is first copied aside through SQLite
    (unless `backup` is False; a failed copy stops the repair), then each strategy runs until
    `check` (default `db_opens_cleanly`) finds the file healthy. If none does, nothing is copied
    back over the live file: the copy keeps the bytes as found. Never raises for a damaged file.
    """
    path = Path(db_path)
    probe = check or db_opens_cleanly
    report: dict[str, Any] = {"repaired": False, "strategy": None, "backup_path": None, "error": None}
    reason = probe(path)
    if reason is None:
        report.update(repaired=True, strategy="already_healthy")
        return report
    if not path.is_file():
        report["error"] = reason
        return report
    if backup:
        try:
            report["backup_path"] = str(copy_aside(path))
        except (OSError, sqlite3.Error) as exc:
            report["error"] = f"not repaired: the file could not be copied aside first ({exc})"
            return report
    for name in STRATEGIES:
        try:
            _STEPS[name](path)
        except (sqlite3.Error, HermesStateError, OSError) as exc:
            reason = f"{name}: {exc}"
            continue
        reason = probe(path)
        if reason is None:
            report.update(repaired=True, strategy=name)
            logger.warning("repaired %s (%s: %s); no session or message was changed%s", path, name,
                           "the full-text index was rebuilt" if name != "dedup_schema"
                           else "duplicate schema rows were removed",
                           f"; the damaged file was kept as {report['backup_path']}" if report["backup_path"] else "")
            return report
    report["error"] = reason
    logger.error("could not repair %s (%s)%s; `hermes-state recover` salvages what is readable", path, reason,
                 f"; the damaged file was kept as {report['backup_path']}" if report["backup_path"] else "")
    return report
