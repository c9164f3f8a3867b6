"""The FTS5 options each index keeps in its own config table: set in a new file, an upgraded one, an older one.

The options (hermes_state_fts.FTS_OPTIONS) are read back from the `<index>_config` tables
by a plain sqlite3 connection, as any other program sees them.
"""
from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import pytest

import hermes_state_fts as fts
from hermes_state import SessionDB

FIXTURES = Path(__file__).parent / "fixtures"


def options(path: Path) -> dict[str, dict[str, object]]:
    """{index: {option: value}} for every FTS option the library sets, as the file holds them."""
    conn = sqlite3.connect(path)
    try:
        names = [name for name, _ in fts.FTS_OPTIONS]
        return {table: dict(conn.execute(f"SELECT k, v FROM {table}_config WHERE k IN "
                                         f"({', '.join('?' for _ in names)})", names).fetchall())
                for table in fts.FTS_TABLES}
    finally:
        conn.close()


def wanted() -> dict[str, dict[str, object]]:
    return {table: dict(fts.FTS_OPTIONS) for table in fts.FTS_TABLES}


def test_the_library_sets_some_option():
    assert fts.FTS_OPTIONS, "no FTS5 option is declared: the tests below would check nothing"


def test_a_new_file_holds_the_options_in_every_index(tmp_path):
    path = tmp_path / "state.db"
    SessionDB(path).close()
    assert options(path) == wanted()


def test_a_file_with_the_fts5_defaults_gets_the_options_at_a_writable_open_only(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "written before the options changed")
    shell = sqlite3.connect(path, isolation_level=None)
    for table in fts.FTS_TABLES:  # as a release before the options made it: nothing in the config
        shell.execute(f"DELETE FROM {table}_config WHERE k IN ({', '.join(repr(k) for k, _ in fts.FTS_OPTIONS)})")
    shell.close()
    with SessionDB(path, read_only=True) as ro:
        assert [h["session_id"] for h in ro.search_messages("options")] == ["s"]
    assert options(path) == {table: {} for table in fts.FTS_TABLES}  # a read-only open writes nothing
    with SessionDB(path) as db:
        assert [h["session_id"] for h in db.search_messages("options")] == ["s"]
    assert options(path) == wanted()


@pytest.mark.parametrize("fixture", ["hermes_agent_0.19.0.db.gz", "hermes_state_v32.db.gz"])
def test_an_upgraded_file_holds_the_options(tmp_path, fixture):
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress((FIXTURES / fixture).read_bytes()))
    with SessionDB(path) as db:
        db.rebuild_fts()  # the rebuild a background thread would finish; it keeps the options
        db.create_session("after", "cli")
        db.append_message("after", "user", "appended once upgraded")
        assert [h["session_id"] for h in db.search_messages("upgraded")] == ["after"]
    assert options(path) == wanted()


def test_a_rebuild_keeps_the_options(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "東京 rebuilt text")
        db.rebuild_fts()
        assert [h["session_id"] for h in db.search_messages("東京")] == ["s"]
    assert options(path) == wanted()
