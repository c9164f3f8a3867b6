"""Self-repair of a state.db whose schema catalogue or full-text index is damaged, losing no row.

Owns: telling the "malformed" class of SQLite errors from others (`is_malformed_db_error`), the
health probe that also tries a rolled-back write through the index triggers (`db_opens_cleanly`),
and `repair_state_db_schema`, which copies the file aside and then tries, in order: rebuilding
the full-text indexes in place, removing duplicate rows of the schema catalogue, and removing
the full-text objects from the catalogue so they are built afresh. Every step touches only
derived objects (indexes, catalogue rows); sessions and messages are never rewritten. When no
strategy heals the file, the copy is put back, so the file is left exactly as it was found.
Does not own: salvaging rows from a file whose tables are damaged (hermes_state_recovery's
`recover`), nor deciding when an open tries a repair (the facade does, once per path).

Transaction contract: works on a closed file through its own short-lived connections; run it
while no handle of this process has the file open (closing a second descriptor on an open file
drops that process's locks on it). It never raises for a damaged file: the report says what
happened.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

import hermes_state_fts as fts
from hermes_state_cjk import register_functions
from hermes_state_common import WRITE_PATIENCE_S, logger
from hermes_state_errors import HermesStateError, StateDbCorruptError
from hermes_state_writer import RetryPolicy, Writer

SQLITE_CORRUPT = 11
STRATEGIES = ("rebuild_fts", "dedup_schema", "drop_fts_rebuild")
_PROBE_ID = "hermes-state-repair-probe"
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


def _open(path: Path, *, writable_schema: bool = False) -> sqlite3.Connection:
    # mode=rw: a probe or a repair must never create a file that is not there.
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True, isolation_level=None)
    if writable_schema:
        # Lets SQLite read a catalogue it would otherwise refuse as malformed, so its rows can be fixed.
        conn.execute("PRAGMA writable_schema = ON")
    register_functions(conn)
    return conn


def _write_probe(conn: sqlite3.Connection) -> None:
    # A damaged full-text index can still answer reads while every insert through its triggers
    # fails; only a write shows it. Rolled back, so the file is left exactly as it was.
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, 'repair', ?)", (_PROBE_ID, time.time()))
        conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', 'probe', ?)",
                     (_PROBE_ID, time.time()))
    finally:
        conn.execute("ROLLBACK")


def db_opens_cleanly(db_path: str | Path) -> str | None:
    """Return None when the file opens, passes SQLite's checks and takes a write; else the reason."""
    path = Path(db_path)
    if not path.is_file():
        return f"{path} does not exist"
    try:
        conn = _open(path)
    except sqlite3.Error as exc:
        return f"cannot open: {exc}"
    try:
        conn.execute("PRAGMA journal_mode").fetchone()  # the first statement parses the catalogue
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            return "quick_check: " + "; ".join(problems[:5])
        for table, verdict in fts.integrity_report(conn).items():
            if verdict != "ok":
                return f"{table}: {verdict}"
        try:
            _write_probe(conn)
        except sqlite3.DatabaseError as exc:
            if is_malformed_db_error(exc) or "not a database" in str(exc):
                return f"a write fails: {exc}"
        return None
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        conn.close()


def _backup(path: Path) -> Path:
    # The damaged bytes, as found, with the write-ahead log beside them: what a manual restore needs.
    target = path.with_name(f"{path.name}.malformed-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9}.bak")
    shutil.copy2(path, target)
    for side in ("-wal",):
        if Path(f"{path}{side}").is_file():
            shutil.copy2(f"{path}{side}", f"{target}{side}")
    return target


def _put_back(copy: Path, path: Path) -> None:
    # A repair that did not heal leaves the file exactly as it was found, for `recover` to read.
    shutil.copy2(copy, path)
    wal = Path(f"{path}-wal")
    if Path(f"{copy}-wal").is_file():
        shutil.copy2(f"{copy}-wal", wal)
    elif wal.is_file():
        wal.unlink()


def _reindex(path: Path) -> None:
    # The library's own builder: drop and recreate every full-text object, then index every row.
    conn = _open(path)
    try:
        writer = Writer(conn)
        with writer.transaction(WRITE_PATIENCE_S, RetryPolicy()):
            fts.create_fts(conn)
        fts.rebuild(writer, WRITE_PATIENCE_S, RetryPolicy())
    finally:
        conn.close()


def _forget_catalogue_rows(path: Path, where: str) -> None:
    # Catalogue rows go in one transaction through a writable schema; no table row is touched.
    conn = _open(path, writable_schema=True)
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
    # Forget every full-text object in the catalogue (their pages become free and VACUUM drops
    # them), then build the indexes anew from the messages, which were never touched.
    _forget_catalogue_rows(path, "name LIKE 'messages_fts%' OR (type = 'trigger' AND sql LIKE '%messages_fts%')")
    conn = _open(path)
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
    (strategy "already_healthy"). Otherwise the file is first copied aside (unless `backup` is
    False; a failed copy stops the repair), then each strategy runs until `check` (default
    `db_opens_cleanly`) finds the file healthy; if none does, the copy is put back. Never raises
    for a damaged file.
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
            report["backup_path"] = str(_backup(path))
        except OSError as exc:
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
    if report["backup_path"]:
        _put_back(Path(report["backup_path"]), path)
    logger.error("could not repair %s (%s)%s; `hermes-state recover` salvages what is readable", path, reason,
                 f"; the damaged file was kept as {report['backup_path']}" if report["backup_path"] else "")
    return report
