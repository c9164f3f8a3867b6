"""The error hierarchy and the SQLite error classifiers."""
from __future__ import annotations

import sqlite3

import pytest

import hermes_state_errors as errors


def _err(cls, text, code=None):
    exc = cls(text)
    if code is not None:
        exc.sqlite_errorcode = code
    return exc


@pytest.mark.parametrize("exc, expected", [
    (_err(sqlite3.OperationalError, "database is locked", 5), True),
    (_err(sqlite3.OperationalError, "database table is locked", 6), True),
    (_err(sqlite3.OperationalError, "database is locked", 5 | (1 << 8)), True),  # SQLITE_BUSY_RECOVERY
    (_err(sqlite3.OperationalError, "vtable constructor failed: messages_fts", 5), True),
    (_err(sqlite3.OperationalError, "database is locked", 1), False),  # the code wins over the text
    (_err(sqlite3.OperationalError, "database is locked"), True),  # no code: fall back to text
    (_err(sqlite3.OperationalError, "no such table: x"), False),
    (ValueError("database is locked"), False),
])
def test_is_sqlite_lock_error(exc, expected):
    assert errors.is_sqlite_lock_error(exc) is expected


def test_real_busy_error_is_recognised(tmp_path, raw_conn):
    path = tmp_path / "x.db"
    a, b = raw_conn(path, timeout=0), raw_conn(path, timeout=0)
    a.execute("CREATE TABLE t (x)")
    a.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError) as info:
        b.execute("BEGIN IMMEDIATE")
    a.execute("ROLLBACK")
    assert errors.is_sqlite_lock_error(info.value)
    assert errors.classify_persistence_error(info.value) == "locked"


@pytest.mark.parametrize("exc, kind", [
    (errors.SessionPersistenceError("x", code="session_persistence_failed:locked"), "locked"),
    (errors.SessionCompressionInProgressError("x"), "compression"),
    (errors.SessionClosedByCompressionError("a", "b"), "compression"),
    (errors.StateDbCorruptError("x"), "corrupt"),
    (_err(sqlite3.DatabaseError, "file is not a database", 26), "corrupt"),
    (_err(sqlite3.DatabaseError, "database disk image is malformed", 11), "corrupt"),
    (_err(sqlite3.OperationalError, "disk I/O error", 10), "disk"),
    (_err(sqlite3.OperationalError, "database or disk is full", 13), "disk"),
    (_err(sqlite3.DatabaseError, "fts5: corruption found in messages_fts", 267), "fts_index"),
    (errors.SessionNotFoundError("s"), "session_row_missing"),
    (_err(sqlite3.IntegrityError, "FOREIGN KEY constraint failed", 787), "session_row_missing"),
    (RuntimeError("?"), "unknown"),
])
def test_classify_persistence_error(exc, kind):
    assert errors.classify_persistence_error(exc) == kind


def test_hierarchy():
    for name in ("SessionPersistenceError", "StateDbCorruptError", "StateDbIncompatibleError", "ReadOnlyError",
                 "SessionNotFoundError", "TitleConflictError", "SessionBusyError", "StaleEpochError",
                 "ReceiptOrderError", "ReceiptDigestError", "OwnershipReadError", "ProfileNotFoundError",
                 "SessionCompressionInProgressError", "StateDbUninitializedError", "StateDbBusyError"):
        assert issubclass(getattr(errors, name), errors.HermesStateError)
    assert issubclass(errors.SessionNotFoundError, KeyError)
    assert issubclass(errors.TitleConflictError, ValueError)
    for name in ("StateDbIncompatibleError", "StateDbUninitializedError", "StateDbBusyError"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.StoreUnavailableError) and cls.http_status == 503 and cls.guidance
    assert str(errors.SessionNotFoundError("session 'x' not found")) == "session 'x' not found"
    assert errors.SessionClosedByCompressionError("a", "b").successor_id == "b"


@pytest.mark.parametrize("exc, typed", [
    (_err(sqlite3.OperationalError, "database or disk is full", 13), "disk"),
    (_err(sqlite3.OperationalError, "disk I/O error", 778), "disk"),          # write(2) failed: EFBIG, ENOSPC
    (_err(sqlite3.OperationalError, "disk I/O error", 1034), "disk"),         # fsync failed
    (_err(sqlite3.OperationalError, "disk I/O error", 266), None),            # a failed read stays untouched
    (_err(sqlite3.OperationalError, "unsupported file format", 1), "corrupt"),
    (_err(sqlite3.OperationalError, "no such table: x", 1), None),
])
def test_typed_errors_maps_disk_and_format_failures(tmp_path, exc, typed):
    with pytest.raises(Exception) as caught:
        with errors.typed_errors(tmp_path / "state.db"):
            raise exc
    if typed is None:
        assert caught.value is exc
    else:
        assert isinstance(caught.value, errors.HermesStateError) and caught.value.__cause__ is exc
        assert errors.classify_persistence_error(caught.value) == typed


def test_a_value_past_sqlites_size_limit_is_bad_input_when_writing_and_damage_when_reading(tmp_path):
    path = tmp_path / "state.db"
    for reading, typed in ((False, ValueError), (True, errors.StateDbCorruptError)):
        exc = _err(sqlite3.DataError, "string or blob too big", 18)
        with pytest.raises(typed) as caught:
            with errors.typed_errors(path, reading=reading):
                raise exc
        assert caught.value.__cause__ is exc
    other = _err(sqlite3.DataError, "datatype mismatch", 20)
    with pytest.raises(sqlite3.DataError) as caught:
        with errors.typed_errors(path, reading=True):
            raise other
    assert caught.value is other


def test_a_message_past_the_length_limit_is_refused_whole(db):
    # SQLite's default limit is 1 GB; lowered on the handle's own connection to stand in for it.
    db.create_session("s", "cli")
    with db.transaction() as txn:
        txn.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
    with pytest.raises(ValueError, match="larger than SQLite can store"):
        db.append_message("s", "user", "x" * 5000)
    assert db.get_messages("s") == [] and db.get_session("s")["message_count"] == 0
    db.append_message("s", "user", "short")
    assert [m["content"] for m in db.get_messages("s")] == ["short"]
