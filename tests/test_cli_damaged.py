"""The command line on a store it cannot open: advice that can work, a doctor that still checks, a restore that keeps the file."""
from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from conftest import run
from hermes_state import SessionDB, StateDbCorruptError


def _store(path: Path, sessions: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with SessionDB(path) as db:
        for n in range(sessions):
            db.create_session(f"s{n}", "cli")
            db.append_message(f"s{n}", "user", f"hello number {n}")
    return path


def _truncate(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()  # (a connection's `with` ends its transaction, not the connection)
    path.write_bytes(path.read_bytes()[:5000])


def _damage_a_page(path: Path) -> None:
    # The messages table's root page overwritten: the schema stays readable, its rows do not.
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek(size * (root - 1))
        f.write(b"\xff" * size)


def _sessions(path: Path) -> list[str]:
    with SessionDB(path, read_only=True) as db:
        return sorted(r["id"] for r in db.list_sessions(limit=100))


def test_the_library_error_names_no_step_that_may_not_work(tmp_path):
    path = _store(tmp_path / "state.db")
    _truncate(path)
    with pytest.raises(StateDbCorruptError) as raised:
        SessionDB(path, read_only=True)
    assert raised.value.path == path.absolute() and "recover" not in str(raised.value)
    assert f"`hermes-state --db {path.absolute()} doctor`" in str(raised.value)


def test_a_truncated_store_gets_steps_that_can_work_with_the_store_the_user_chose(tmp_path):
    root = tmp_path / "root"
    path = _store(root / "profiles" / "coder" / "state.db")
    copy = path.with_name("state.db.pre-v31-20261101T000000Z.bak")
    copy.write_bytes(path.read_bytes())
    _truncate(path)
    out = run(root, "-p", "coder", "sessions", "list")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    first, *advice = out.stderr.splitlines()
    assert first.startswith("hermes-state: ") and "not a usable SQLite database" in first
    assert advice[0] == "  nothing in it can be salvaged: its schema cannot be read (database disk image is malformed)"
    assert f"`hermes-state -p coder restore {copy}`" in advice[1] and advice[-1].endswith("`hermes-state -p coder init`")
    assert not any(" recover " in line for line in out.stderr.splitlines())
    by_path = run(root, "--db", str(path), "sessions", "list")
    assert f"`hermes-state --db {path} restore {copy}`" in by_path.stderr


def test_recover_that_can_read_nothing_says_what_else_can_be_done(tmp_path):
    path = _store(tmp_path / "state.db")
    _truncate(path)
    out = run(tmp_path, "recover", str(path), str(tmp_path / "new.db"))
    assert out.returncode == 1 and "nothing can be salvaged" in out.stderr
    assert "`hermes-state init`" in out.stderr and out.stderr.count("nothing") == 1


def test_doctor_on_a_damaged_file_runs_the_checks_it_can_and_advises(tmp_path):
    path = _store(tmp_path / "state.db")
    _truncate(path)
    out = run(tmp_path, "--json", "doctor")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert {"file", "header", "open", "salvage", "copies", "replication"} <= set(checks)
    assert checks["file"]["detail"] == "5,000 bytes" and checks["header"]["ok"] is True
    assert checks["salvage"]["ok"] is False and checks["copies"]["detail"] == "none beside it"
    assert report["ok"] is False and report["advice"][0].startswith("nothing in it can be salvaged")
    human = run(tmp_path, "doctor")
    assert human.returncode == 1 and "what can be done:" in human.stdout and "BAD  salvage" in human.stdout


def test_doctor_on_a_file_with_a_bad_page_offers_recover(tmp_path):
    path = _store(tmp_path / "state.db")
    _damage_a_page(path)
    out = run(tmp_path, "--json", "doctor")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["advice"][0].startswith(f"`hermes-state recover {path} {path}.recovered`")


def test_restore_over_a_store_that_does_not_open_moves_it_aside(tmp_path):
    good = _store(tmp_path / "good.db")
    path = _store(tmp_path / "home" / "state.db", sessions=1)
    _truncate(path)
    damaged = path.read_bytes()
    out = run(tmp_path / "home", "restore", str(good))
    assert out.returncode == 0, out.stderr
    aside = [p for p in path.parent.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert f"the damaged file it replaced is now {aside[0]}" in out.stdout
    assert _sessions(path) == ["s0", "s1"]


def test_a_bad_page_is_recovered_then_restored_in_place_and_the_damaged_file_kept(tmp_path):
    path = _store(tmp_path / "state.db")
    _damage_a_page(path)
    damaged = path.read_bytes()
    recovered = Path(f"{path}.recovered")
    out = run(tmp_path, "recover", str(path), str(recovered))
    assert out.stdout.startswith(f"recovered {path} into {recovered} (`hermes-state restore {recovered}` puts it in place)")
    back = run(tmp_path, "restore", str(recovered))
    assert back.returncode == 0, back.stderr
    aside = [p for p in path.parent.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert _sessions(path) == ["s0", "s1"]  # the sessions came back; their messages were on the bad page


def test_a_restore_that_cannot_happen_leaves_the_damaged_store_where_it_is(tmp_path):
    path = _store(tmp_path / "state.db")
    _truncate(path)
    (tmp_path / "not-a-backup.db").write_bytes(b"\x00\x01garbage" * 100)
    out = run(tmp_path, "restore", str(tmp_path / "not-a-backup.db"))
    assert out.returncode == 1 and path.stat().st_size == 5000
    assert not [p for p in tmp_path.iterdir() if ".damaged-" in p.name]


def test_restore_of_an_export_says_it_is_one(tmp_path):
    _store(tmp_path / "state.db")
    export = tmp_path / "all.jsonl"
    assert run(tmp_path, "sessions", "export", "-o", str(export)).returncode == 0
    out = run(tmp_path, "restore", str(export))
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert f"is an export (JSON), not a database: `hermes-state sessions import {export}`" in out.stderr


def test_a_healthy_store_is_restored_over_with_nothing_moved(tmp_path):
    good = _store(tmp_path / "good.db", sessions=1)
    _store(tmp_path / "state.db")
    out = run(tmp_path, "restore", str(good))
    assert out.returncode == 0 and "damaged" not in out.stdout
    assert not [p for p in tmp_path.iterdir() if ".damaged-" in p.name]
    assert _sessions(tmp_path / "state.db") == ["s0"]


# Random bytes from a fixed seed, after a first byte no export starts with: a "{" first would be an export.
@pytest.mark.parametrize("content", [b"\x8f" + random.Random(7).randbytes(3000), b"hello there\n" * 200])
def test_a_file_that_was_never_a_database_is_not_sent_to_recover(tmp_path, content):
    (tmp_path / "state.db").write_bytes(content)
    out = run(tmp_path, "sessions", "list")
    assert out.returncode == 1 and "nothing in it can be salvaged" in out.stderr
    assert not any(" recover " in line for line in out.stderr.splitlines())


def test_an_empty_file_given_with_db_is_advised_with_that_db(tmp_path):
    (tmp_path / "empty.db").write_bytes(b"")
    out = run(tmp_path / "home", "--db", str(tmp_path / "empty.db"), "sessions", "list")
    assert out.returncode == 1 and f"`hermes-state --db {tmp_path / 'empty.db'} init` creates one" in out.stderr
    absent = run(tmp_path / "home", "-p", "default", "sessions", "list")
    assert "(`hermes-state -p default init` creates it)" in absent.stderr


def test_init_says_its_mode_change_once(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    empty.chmod(0o644)
    out = run(tmp_path / "home", "--db", str(empty), "init")
    assert out.returncode == 0 and out.stderr == ""
    assert (out.stdout + out.stderr).count("mode 0644 -> 0600") == 1, out
