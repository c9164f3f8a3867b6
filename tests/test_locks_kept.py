"""No path of the library drops the POSIX locks this process holds on a live database.

Closing any descriptor on a file cancels every POSIX lock the process holds on it; a program that
closes after that believes it is the last connection and deletes the WAL under the live one. So a
live handle's locks are read from `/proc/locks` before and after every path that touches the file:
opens of all kinds, the maintenance calls, the command line run in-process, the repair.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import hermes_state_lockowners as lockowners
from hermes_state import SessionDB, recover, repair_state_db_schema
from hermes_state_cli import main
from conftest import locks_held

pytestmark = pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's lock table, a Linux file")


def test_every_path_that_touches_a_live_file_keeps_this_process_s_locks(hermes_home, tmp_path, capsys):
    path = hermes_home / "state.db"
    live = SessionDB(path)
    try:
        live.create_session("live", "cli")
        live.append_message("live", "user", "lima written before")
        held = locks_held(path)
        assert ("shm", "READ", "128-128") in held, held  # the mark that a connection uses the WAL
        out = tmp_path / "out"
        out.mkdir()
        steps = {
            "a second handle": lambda: SessionDB(path).close(),
            "a read-only handle": lambda: SessionDB(path, read_only=True).close(),
            "backup": lambda: live.backup(out / "backup.db"),
            "vacuum": lambda: live.vacuum(),
            "integrity": lambda: live.check_integrity(full=True),
            "export": lambda: list(live.iter_export()),
            "recover": lambda: recover(path, out / "recovered.db"),
            "repair of a healthy file": lambda: repair_state_db_schema(path),
            "cli sessions list": lambda: main(["--db", str(path), "sessions", "list"]),
            "cli search": lambda: main(["--db", str(path), "search", "lima"]),
            "cli doctor": lambda: main(["--db", str(path), "doctor"]),
            "cli backup": lambda: main(["--db", str(path), "backup", str(out / "cli-backup.db")]),
        }
        for name, step in steps.items():
            step()
            assert held <= locks_held(path), name
        capsys.readouterr()
        live.append_message("live", "user", "lima written after")  # and the live handle carries on
        assert Path(f"{path}-wal").exists() and live.message_count("live") == 2
    finally:
        live.close()
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        check.close()


def test_open_in_this_process_sees_a_plain_descriptor_and_a_connection(tmp_path):
    path = tmp_path / "state.db"
    sqlite3.connect(path).close()
    assert lockowners.open_in_this_process(path) is False
    with open(path, "rb"):
        assert lockowners.open_in_this_process(path) is True
    conn = sqlite3.connect(path)
    try:
        conn.execute("SELECT 1 FROM sqlite_master").fetchall()
        assert lockowners.open_in_this_process(path) is True
    finally:
        conn.close()
    assert lockowners.open_in_this_process(tmp_path / "missing.db") is False


def test_a_move_in_after_the_open_keeps_a_live_handle_s_locks(tmp_path, monkeypatch):
    import gzip
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress((Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz").read_bytes()))
    reader = SessionDB(path, read_only=True)  # a live connection of this process on the old file
    try:
        assert reader.list_sessions_rich(limit=1)
        held = locks_held(path)
        assert ("shm", "READ", "128-128") in held, held
        monkeypatch.setattr(SessionDB, "upgrade_in_background_bytes", 0)
        moving = SessionDB(path)  # its copy (a connection of its own) and its upgrade run on a thread
        try:
            assert held <= locks_held(path)
            assert moving.wait_for_fts_rebuild(60) and not moving.upgrading and moving.upgrade_backup is not None
            assert held <= locks_held(path)
            moving.create_session("after", "cli")
        finally:
            moving.close()
        assert held <= locks_held(path)
        assert reader.get_session("after") is not None  # the live handle reads on
    finally:
        reader.close()
