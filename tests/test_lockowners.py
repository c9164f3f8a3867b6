"""Tests for hermes_state_lockowners: /proc/locks decoding, descriptions, and real SQLite locks."""
from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys

import pytest

from hermes_state_lockowners import (
    LockHolder,
    configure_error_log,
    describe,
    log_write_lock_holders,
    parse_proc_locks,
    write_lock_holders,
)

DEV = os.makedev(0x08, 0x01)
DEV_2E = os.makedev(0x00, 0x2E)
INODES = {
    (DEV, 1000): "state.db",
    (DEV, 1001): "state.db-wal",
    (DEV, 1002): "state.db-shm",
    (DEV_2E, 123): "state.db-shm",
}


def parse(text: str) -> list[LockHolder]:
    return parse_proc_locks(text, INODES)


def test_wal_write_lock_on_shm():
    text = "1: POSIX  ADVISORY  WRITE 12345 08:01:1002 120 120\n"
    assert parse(text) == [LockHolder(pid=12345, file="state.db-shm", what="WAL write lock", ofd=False)]


def test_checkpoint_and_recover_locks():
    text = (
        "1: POSIX  ADVISORY  WRITE 7 08:01:1002 121 121\n"
        "2: POSIX  ADVISORY  WRITE 8 08:01:1002 122 122\n"
    )
    assert [(h.pid, h.what) for h in parse(text)] == [(7, "WAL checkpoint lock"), (8, "WAL recover lock")]


def test_read_slots_map_to_slot_numbers():
    text = "".join(f"{i}: POSIX  ADVISORY  WRITE 42 08:01:1002 {off} {off}\n"
                   for i, off in enumerate(range(123, 128), start=1))
    assert [h.what for h in parse(text)] == [f"WAL read slot {n} lock" for n in range(5)]


def test_range_is_described_by_its_start():
    text = "1: POSIX  ADVISORY  WRITE 9 08:01:1002 120 127\n"
    assert [h.what for h in parse(text)] == ["WAL write lock"]


def test_unknown_offsets_are_reported_by_number():
    text = (
        "1: POSIX  ADVISORY  WRITE 9 08:01:1002 200 200\n"
        "2: POSIX  ADVISORY  WRITE 9 08:01:1000 0 EOF\n"
        "3: POSIX  ADVISORY  WRITE 9 08:01:1001 0 0\n"
    )
    assert [(h.file, h.what) for h in parse(text)] == [
        ("state.db-shm", "lock at offset 200"),
        ("state.db", "lock at offset 0"),
        ("state.db-wal", "lock at offset 0"),
    ]


def test_pending_reserved_shared_on_main_db():
    text = (
        "1: POSIX  ADVISORY  WRITE 11 08:01:1000 1073741824 1073741824\n"
        "2: POSIX  ADVISORY  WRITE 12 08:01:1000 1073741825 1073741825\n"
        "3: POSIX  ADVISORY  WRITE 13 08:01:1000 1073741826 1073742335\n"
        "4: POSIX  ADVISORY  WRITE 14 08:01:1000 1073742335 1073742335\n"
    )
    assert [(h.pid, h.file, h.what) for h in parse(text)] == [
        (11, "state.db", "PENDING lock"),
        (12, "state.db", "RESERVED lock"),
        (13, "state.db", "SHARED lock"),
        (14, "state.db", "SHARED lock"),
    ]


def test_main_db_offsets_are_not_read_as_shm_offsets():
    text = "1: POSIX  ADVISORY  WRITE 3 08:01:1000 120 120\n"
    assert [h.what for h in parse(text)] == ["lock at offset 120"]


def test_read_locks_are_ignored():
    text = (
        "1: POSIX  ADVISORY  READ 12345 08:01:1002 124 124\n"
        "2: POSIX  ADVISORY  READ 12345 08:01:1002 128 128\n"
        "3: POSIX  ADVISORY  READ 12345 08:01:1000 1073741826 1073742335\n"
    )
    assert parse(text) == []


def test_blocked_waiters_are_ignored():
    text = (
        "1: POSIX  ADVISORY  WRITE 12345 08:01:1002 120 120\n"
        "1: -> POSIX  ADVISORY  WRITE 6789 08:01:1002 120 120\n"
    )
    assert [h.pid for h in parse(text)] == [12345]


def test_ofd_lock_has_no_pid():
    text = "2: OFDLCK ADVISORY  WRITE -1 00:2e:123 120 120\n"
    assert parse(text) == [LockHolder(pid=-1, file="state.db-shm", what="WAL write lock", ofd=True)]


def test_other_inodes_and_devices_are_ignored():
    text = (
        "1: POSIX  ADVISORY  WRITE 1 08:01:9999 120 120\n"   # other inode, same device
        "2: POSIX  ADVISORY  WRITE 2 08:02:1002 120 120\n"   # same inode, other device
        "3: POSIX  ADVISORY  WRITE 3 00:2e:1002 120 120\n"
    )
    assert parse(text) == []


def test_garbage_and_odd_lines_are_skipped():
    text = (
        "\n"
        "garbage\n"
        "1: POSIX\n"
        "2: POSIX  ADVISORY  WRITE notapid 08:01:1002 120 120\n"
        "3: POSIX  ADVISORY  WRITE 5 zz:01:1002 120 120\n"
        "4: POSIX  ADVISORY  WRITE 5 08:01 120 120\n"
        "5: POSIX  ADVISORY  WRITE 5 08:01:1002 EOF EOF\n"
        "6: FLOCK  ADVISORY  WRITE 999 08:01:1000 0 EOF\n"
        "7: LEASE  ACTIVE    READ 999 08:01:1000 0 EOF\n"
        "8: DELEG  ACTIVE    READ 999 08:01:1000 0 EOF\n"
        "9: -> \n"
        "10: POSIX  ADVISORY  WRITE 77 08:01:1002 121 121\n"
    )
    assert [(h.pid, h.what) for h in parse(text)] == [(77, "WAL checkpoint lock")]


def test_describe_formats():
    holder = LockHolder(pid=594094, file="state.db-shm", what="WAL write lock", ofd=False)
    assert describe(holder, "hermes --worktree --yolo") == (
        "PID 594094 (hermes --worktree --yolo) holds WAL write lock on state.db-shm")
    assert describe(holder, None) == "PID 594094 (?) holds WAL write lock on state.db-shm"
    ofd = LockHolder(pid=-1, file="state.db-shm", what="WAL write lock", ofd=True)
    assert describe(ofd, None) == "an OFD lock (no owning pid) holds WAL write lock on state.db-shm"


def test_missing_database_has_no_holders(tmp_path):
    assert write_lock_holders(tmp_path / "nope.db") == []


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="/proc/locks exists only on Linux")


@pytest.fixture
def held_writer(tmp_path):
    """A WAL database with an open write transaction on this process's connection."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        conn.execute("CREATE TABLE t (x)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (1)")
        yield path, conn
    finally:
        conn.close()


def _our_wal_write(lines: list[str]) -> list[str]:
    return [line for line in lines
            if line.startswith(f"PID {os.getpid()} (") and "WAL write lock on state.db-shm" in line]


@linux_only
def test_real_sqlite_write_lock_is_seen_and_released(held_writer, raw_conn):
    path, conn = held_writer
    holders = write_lock_holders(path)
    assert len(_our_wal_write(holders)) == 1, holders
    assert len(holders) == len(set(holders))
    conn.execute("ROLLBACK")
    assert _our_wal_write(write_lock_holders(path)) == []
    # The rolled-back row is gone for a second connection too.
    assert raw_conn(path).execute("SELECT count(*) FROM t").fetchone()[0] == 0


@linux_only
def test_write_lock_holders_does_not_drop_our_locks(held_writer):
    path, _conn = held_writer
    write_lock_holders(path)
    # Closing any descriptor on a file drops this process's POSIX locks on it. Connections inside
    # one process share SQLite's in-memory lock table, so only another process can tell.
    probe = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0)\n"
        "try:\n"
        "    c.execute('BEGIN IMMEDIATE'); print('acquired')\n"
        "except sqlite3.OperationalError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(path)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == "database is locked"
    assert _our_wal_write(write_lock_holders(path))


@linux_only
def test_log_write_lock_holders_logs_one_warning(held_writer, caplog):
    path, _conn = held_writer
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        holders = log_write_lock_holders(path, 20.0)
    records = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(records) == 1
    message = records[0].getMessage()
    assert message.startswith("state.db write lock still held after 20.0s: ")
    assert f"PID {os.getpid()} (" in message
    assert _our_wal_write(holders)


def test_log_write_lock_holders_without_holders(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        assert log_write_lock_holders(tmp_path / "state.db", 1.5) == []
    assert [r.getMessage() for r in caplog.records] == [
        "state.db write lock still held after 1.5s: no holder visible in /proc/locks"]


def test_configure_error_log_writes_file_once(tmp_path):
    logger = logging.getLogger("hermes_state")
    before, level = list(logger.handlers), logger.level
    handler = configure_error_log(tmp_path)
    try:
        assert configure_error_log(tmp_path) is handler
        assert [h for h in logger.handlers if h not in before] == [handler]
        logger.warning("disk wobble %d", 7)
        handler.flush()
        text = (tmp_path / "logs" / "errors.log").read_text(encoding="utf-8")
        assert text.count("disk wobble 7") == 1
        assert "WARNING" in text and "hermes_state" in text
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


@linux_only
def test_cmdline_of_another_process_is_one_line(tmp_path):
    path = tmp_path / "state.db"
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA journal_mode=WAL'); c.execute('CREATE TABLE t (x)')\n"
        "c.execute('BEGIN IMMEDIATE'); c.execute('INSERT INTO t VALUES (1)')\n"
        "print('held', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        holders = write_lock_holders(path)
        assert len(holders) == 1, holders
        assert holders[0].startswith(f"PID {child.pid} ({sys.executable} -c import sqlite3")
        assert "\n" not in holders[0] and len(holders[0]) < 300
        assert holders[0].endswith(") holds WAL write lock on state.db-shm")
    finally:
        child.stdin.close()
        child.wait(timeout=10)
