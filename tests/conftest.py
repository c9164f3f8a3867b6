"""Project fixtures: every test runs in a temporary HERMES_HOME (the plugin's `hermes_home`).

`db` is an open SessionDB in it; `rival` is a second, independent connection to the same file
that can hold locks and checks what really persisted; `conn` is a bare migrated connection
for module-level functions.
"""
from __future__ import annotations

import os
import sqlite3

import pytest
from hypothesis import settings

# CI must not turn red on an example nobody has seen before: there the property tests replay a
# fixed sequence of examples. Local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

from hermes_state import SessionDB


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
def rival(db):
    conn = sqlite3.connect(db.db_path, isolation_level=None, timeout=0.1, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


@pytest.fixture
def conn(db):
    """A bare connection to a migrated database, for module functions (caller owns transactions)."""
    c = sqlite3.connect(db.db_path, isolation_level=None, timeout=5)
    c.execute("PRAGMA foreign_keys = ON")
    yield c
    if c.in_transaction:
        c.execute("ROLLBACK")
    c.close()
