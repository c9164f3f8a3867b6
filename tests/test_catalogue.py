"""hermes_state_catalogue: what in a file's catalogue the library made, another program's files, half-written copies."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

import hermes_state_catalogue as catalogue
import hermes_state_fts as fts
from hermes_state_errors import ForeignDatabaseError, StateDbIncompatibleError


def test_a_migrated_file_holds_nothing_foreign(conn):
    assert catalogue.foreign_objects(conn, fts.OBJECTS, older=False) == []


def test_planted_objects_are_named_by_kind(conn):
    conn.execute("CREATE TRIGGER wipe AFTER INSERT ON messages BEGIN DELETE FROM sessions; END")
    conn.execute("CREATE VIEW peek AS SELECT id FROM sessions")
    conn.execute("CREATE UNIQUE INDEX one_title ON sessions(source, title)")
    conn.execute("CREATE INDEX plain_index ON sessions(model)")   # not unique: refuses no write, accepted
    conn.execute("CREATE TABLE notes (x)")                        # a table is data, accepted
    found = catalogue.foreign_objects(conn, fts.OBJECTS, older=False)
    assert found == ["index 'one_title' on sessions", "trigger 'wipe' on messages", "view 'peek'"]
    with pytest.raises(StateDbIncompatibleError, match="wipe"):
        catalogue.refuse_foreign_objects(conn, _path(conn), fts.OBJECTS, 31)


def _path(conn):
    return conn.execute("PRAGMA database_list").fetchone()[2]


def test_an_older_files_full_text_objects_are_accepted_only_if_they_write_no_declared_table(conn):
    conn.execute("CREATE TRIGGER messages_fts_old AFTER INSERT ON messages BEGIN SELECT 1; END")
    conn.execute("CREATE TRIGGER messages_fts_bad AFTER INSERT ON messages BEGIN DELETE FROM sessions; END")
    assert catalogue.foreign_objects(conn, fts.OBJECTS, older=True) == ["trigger 'messages_fts_bad' on messages"]
    assert len(catalogue.foreign_objects(conn, fts.OBJECTS, older=False)) == 2


def test_another_programs_database_is_refused_unless_forced(tmp_path):
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE invoices (id)")
    with pytest.raises(ForeignDatabaseError, match="another program"):
        catalogue.check_ours(other, tmp_path / "other.db")
    catalogue.check_ours(other, tmp_path / "other.db", force=True)
    other.close()
    empty = sqlite3.connect(tmp_path / "empty.db")
    catalogue.check_ours(empty, tmp_path / "empty.db")  # an empty file becomes the store
    empty.close()


def test_only_a_dead_writers_partial_copies_are_removed(tmp_path):
    db_path = tmp_path / "state.db"
    mine = catalogue.partial_path(tmp_path / "state.db.bak")
    assert mine.name.startswith("state.db.bak.partial-") and str(os.getpid()) in mine.name
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    left = [tmp_path / f"state.db.bak.partial-{dead_pid}-0123abcd", tmp_path / f"state.db.bak.partial-{dead_pid}-0123abcd-wal"]
    kept = [mine, tmp_path / f"other.db.partial-{dead_pid}-0123abcd", tmp_path / f"state.db.partial-{dead_pid}-xyz"]
    for path in left + kept:
        path.write_text("x")
    assert sorted(catalogue.clean_partial_copies(db_path)) == sorted(left)
    assert all(p.exists() for p in kept) and not any(p.exists() for p in left)
