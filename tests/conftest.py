"""Project fixtures: every test runs in a temporary HERMES_HOME (the plugin's `hermes_home`).

`db` is an open SessionDB in it; `rival` is a second, independent connection to the same file
that can hold locks and checks what really persisted; `conn` is a bare migrated connection
for module-level functions. Shared helpers: `raw_conn` (a factory of bare connections, closed
at teardown), `plant_lock` (writes a compression lock row as another process would) and
`fake_home` (a fake user home with no HERMES_HOME, for tests of the default locations).
"""
from __future__ import annotations

# Load the project's pytest plugin by name, so a checkout that is not pip-installed still has
# `hermes_home`; when the package is installed, its entry point registers the same name and
# pytest loads the plugin once.
pytest_plugins = ["hermes_state_pytest"]

import os
import sqlite3
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import settings

# CI must not turn red on an example nobody has seen before: there the property tests replay a
# fixed sequence of examples. Local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

from hermes_state import SessionDB
from hermes_state_home import hermes_home_override


@pytest.fixture(autouse=True)
def _isolated_home(hermes_home):
    """Point every test at a temporary home (R-GUARD)."""
    yield hermes_home


@pytest.fixture
def db(hermes_home):
    handle = SessionDB()
    yield handle
    handle.close()


@pytest.fixture
def raw_conn(hermes_home) -> Iterator[Callable[..., sqlite3.Connection]]:
    """Return a factory of bare autocommit connections (foreign keys on); all are closed at teardown.

    `raw_conn()` opens the `db` fixture's file; `raw_conn(path)` any other. They have no TEMP
    triggers or SQL functions of the library: they write as another program would.
    """
    opened: list[sqlite3.Connection] = []

    def open_conn(path: str | os.PathLike | None = None, *, timeout: float = 5.0) -> sqlite3.Connection:
        c = sqlite3.connect(path or hermes_home / "state.db", isolation_level=None, timeout=timeout,
                            check_same_thread=False)
        c.execute("PRAGMA foreign_keys = ON")
        opened.append(c)
        return c

    yield open_conn
    for c in opened:
        try:
            if c.in_transaction:
                c.execute("ROLLBACK")
        except sqlite3.ProgrammingError:  # the test closed it already
            continue
        c.close()


@pytest.fixture
def rival(db):
    conn = sqlite3.connect(db.db_path, isolation_level=None, timeout=0.1, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


@pytest.fixture
def conn(db, raw_conn):
    """A bare connection to a migrated database, for module functions (caller owns transactions)."""
    return raw_conn(db.db_path)


@pytest.fixture
def index_queue() -> Callable[[SessionDB], None]:
    """Return `index(handle)`: index the rows `handle` queued now, as its next batch (or its close) would.

    A search never does it (a read writes nothing): it scans the queued rows instead.
    """
    import hermes_state_fts as fts

    def index(handle: SessionDB) -> None:
        with handle.transaction() as txn:
            fts.index_batch(txn.conn)
    return index


@pytest.fixture
def plant_lock(db, raw_conn) -> Callable[..., None]:
    """Return `plant(session_id, holder, expires_in_s=300.0)`: write a compression lock row directly.

    The row is written through a raw connection, as another process holding (or having left)
    the lock would; a negative `expires_in_s` plants an expired lock.
    """
    planter = raw_conn(db.db_path)

    def plant(session_id: str, holder: str, expires_in_s: float = 300.0) -> None:
        now = time.time()
        planter.execute("INSERT OR REPLACE INTO compression_locks (session_id, holder, acquired_at, expires_at) "
                        "VALUES (?, ?, ?, ?)", (session_id, holder, now, now + expires_in_s))

    return plant


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Give the test a fake user home, with no HERMES_HOME or guard bypass from the outer environment."""
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("USERPROFILE", str(user))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.delenv("HERMES_STATE_DB_GUARD_BYPASS", raising=False)
    # The autouse `hermes_home` holds a context override for every test; lift it here.
    with hermes_home_override(None):
        yield user


@pytest.fixture
def fts_levels() -> Callable[[sqlite3.Connection, str], tuple[int, int]]:
    """Read an FTS5 index's (levels, segments) from its structure record, as plain rows (the index is never opened)."""
    def read(conn: sqlite3.Connection, table: str) -> tuple[int, int]:
        from hermes_state_fts import decode_structure  # the library's reader of the record, not a copy of it
        structure = decode_structure(conn.execute(f"SELECT block FROM {table}_data WHERE id = 10").fetchone()[0])
        return len(structure.levels), structure.segments
    return read
