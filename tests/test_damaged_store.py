"""A store that cannot be opened: advice that can work, and moving the damaged file aside."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_state import SessionDB, StateDbBusyError
from hermes_state_recovery import copies_beside, damaged_store_advice, move_aside, unreadable_reason


def _store(path: Path) -> Path:
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "hello there")
    return path


def _damage_a_page(path: Path) -> None:
    # Scribble over the messages table's root page: the schema stays readable, its rows go bad.
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    with open(path, "r+b") as f:
        f.seek(size * (root - 1))
        f.write(b"\xff" * size)


def test_what_recover_can_and_cannot_read(tmp_path):
    healthy = _store(tmp_path / "a" / "state.db")
    assert unreadable_reason(healthy) is None
    cut = _store(tmp_path / "b" / "state.db")
    cut.write_bytes(cut.read_bytes()[:100])
    assert "schema" in unreadable_reason(cut) or "not a SQLite database" in unreadable_reason(cut)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 100)
    assert unreadable_reason(text) == "it is not a SQLite database"
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert unreadable_reason(empty) == "it holds no tables"


def test_advice_for_an_unreadable_store_offers_copies_and_starting_empty_not_recover(tmp_path):
    path = _store(tmp_path / "state.db")
    older = path.with_name("state.db.pre-v31-20261101T000000Z.bak")
    newer = path.with_name("state.db.pre-v31-20261201T000000Z.bak")
    for n, copy in enumerate((older, newer)):
        copy.write_bytes(path.read_bytes())
        os.utime(copy, (1_800_000_000 + n, 1_800_000_000 + n))
    path.write_bytes(path.read_bytes()[:100])
    assert copies_beside(path) == [newer, older]
    advice = damaged_store_advice(path, "hermes-state -p coder")
    assert advice[0].startswith("nothing in it can be salvaged")
    assert not any(" recover " in line for line in advice)
    assert f"`hermes-state -p coder restore {newer}`" in advice[1] and f"restore {older}`" in advice[2]
    assert "init`" in advice[-1]


def test_advice_for_a_store_with_a_bad_page_starts_with_recover(tmp_path):
    path = _store(tmp_path / "state.db")
    _damage_a_page(path)
    advice = damaged_store_advice(path)
    assert advice[0].startswith(f"`hermes-state recover {path} {path}.recovered`")
    assert copies_beside(path) == [] and len(advice) == 2


def test_moving_aside_takes_the_log_with_the_file_and_keeps_every_byte(tmp_path):
    path = _store(tmp_path / "state.db")
    # A log a crashed writer left: it must go with the file, or the next file under this name
    # would have it replayed into it.
    Path(f"{path}-wal").write_bytes(b"wal frames" * 100)
    Path(f"{path}-shm").write_bytes(b"\0" * 32768)
    before = {s: Path(f"{path}{s}").read_bytes() for s in ("", "-wal", "-shm")}
    aside = move_aside(path, now=1_800_000_000)
    assert aside.name == "state.db.damaged-20270115T080000Z"
    assert not any(Path(f"{path}{s}").exists() for s in ("", "-wal", "-shm"))
    assert {s: Path(f"{aside}{s}").read_bytes() for s in before} == before
    path.write_bytes(b"")
    again = move_aside(path, now=1_800_000_000)
    assert again.name == "state.db.damaged-20270115T080000Z-2" and again.read_bytes() == b""


def test_moving_aside_refuses_while_another_process_holds_the_file(tmp_path):
    path = _store(tmp_path / "state.db")
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                               "c.execute('SELECT 1 FROM sessions').fetchall(); print('ready', flush=True); "
                               "sys.stdin.read()", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        if not sys.platform.startswith("linux"):
            pytest.skip("who holds a file open is read from /proc, on Linux only")
        with pytest.raises(StateDbBusyError, match="open in 1 other process"):
            move_aside(path)
        assert path.exists()
    finally:
        holder.stdin.close()
        holder.wait(10)
