"""One copy per upgrade: racing openers and openers killed at the migration's start leave one complete copy.

Every opener here is a real process. The copy left must be a valid database holding every row
the older file had, and the file must end upgraded.
"""
from __future__ import annotations

import gzip
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermes_state_catalogue as catalogue
from hermes_state import SCHEMA_VERSION, SessionDB

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"  # hermes-agent's schema 22
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

# Opens the file given (in the background when asked) and waits for all the upgrade's work.
OPEN = """
import sys
from hermes_state import SessionDB
if sys.argv[2] == "background":
    SessionDB.upgrade_in_background_bytes = 0
{prepare}
db = SessionDB(sys.argv[1])
db.wait_for_fts_rebuild(120)
db.close()
"""
# Both copies complete before either opener migrates: the race at its widest.
RACE = OPEN.format(prepare="""
import os, time
from pathlib import Path
import hermes_state_recovery as recovery
real = recovery.backup_to
def copy_then_wait(*args, **kwargs):
    made = real(*args, **kwargs)
    Path(sys.argv[3], str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(sys.argv[3])) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return made
recovery.backup_to = copy_then_wait
""")
# SIGKILLed once its copy is complete: as the migration starts, inside its first transaction, or
# after that transaction committed (the ladder's first step).
KILLED = OPEN.format(prepare="""
import os, signal
import hermes_state_schema as schema, hermes_state_upgrade as upgrade, hermes_state_writer as writer
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
point = sys.argv[3]
if point == "migrate":
    schema.migrate = die
elif point == "first-transaction":
    upgrade.prepare_upgrade = die
else:  # the next transaction after the first one, which committed
    first, transaction = upgrade.prepare_upgrade, writer.Writer.transaction
    def prepare_then_arm(conn):
        first(conn)
        writer.Writer.transaction = die
    upgrade.prepare_upgrade = prepare_then_arm
""")


@pytest.fixture
def old_file(tmp_path) -> Path:
    path = tmp_path / "home" / "state.db"
    path.parent.mkdir()
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def rows(path: Path) -> dict[str, list[tuple]]:
    # immutable: a copy carries its source's WAL flag, and a plain read would leave -wal/-shm beside it
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return {table: conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                for table in ("sessions", "messages", "schema_version")}
    finally:
        conn.close()


def beside(path: Path) -> list[str]:
    """Every pre-upgrade copy beside the file, under any name (pending, half-written, named)."""
    return sorted(p.name for p in path.parent.iterdir() if ".pre-v" in p.name)


def version_of(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    finally:
        conn.close()


def run(script: str, *args: str, expect: int = 0) -> None:
    done = subprocess.run([sys.executable, "-c", script, *args], env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode == expect, done.stderr[-2000:]


def assert_one_complete_copy(old_file: Path, original: dict[str, list[tuple]]) -> Path:
    names = beside(old_file)
    assert len(names) == 1, names
    copy = old_file.parent / names[0]
    assert [c.path for c in catalogue.upgrade_copies(old_file)] == [copy]
    assert catalogue.upgrade_copies(old_file)[0].pending_pid is None  # named: its upgrade began with it
    assert rows(copy) == original  # every row, as the file was
    assert version_of(old_file) == SCHEMA_VERSION
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inside-the-open", "background"])
def test_two_processes_opening_an_older_file_at_once_leave_one_complete_copy(old_file, tmp_path, mode):
    original = rows(old_file)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    openers = [subprocess.Popen([sys.executable, "-c", RACE, str(old_file), mode, str(barrier)], env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for opener in openers:
        _, err = opener.communicate(timeout=180)
        assert opener.returncode == 0, err[-2000:]
    assert len(os.listdir(barrier)) == 2  # both copies were complete before either migrated
    assert_one_complete_copy(old_file, original)
    with SessionDB(old_file) as db:
        assert db.upgrade_backup is None  # nothing left to upgrade, nothing to copy
        assert db.message_count() == len(original["messages"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inside-the-open", "background"])
@pytest.mark.parametrize("point", ["migrate", "first-transaction"])
def test_openers_killed_as_the_migration_starts_then_one_more_open_leave_one_complete_copy(old_file, mode, point):
    original = rows(old_file)
    for _ in range(3):
        run(KILLED, str(old_file), mode, point, expect=-9)
    assert version_of(old_file) == 22  # nothing of the migration committed
    run(OPEN.format(prepare=""), str(old_file), mode)
    copy = assert_one_complete_copy(old_file, original)
    with SessionDB(old_file) as db:
        assert db.message_count() == len(original["messages"])
        db.create_session("after", "cli")
    assert beside(old_file) == [copy.name]


def test_an_upgrade_killed_after_it_began_resumes_with_the_copy_it_began_with(old_file, caplog):
    original = rows(old_file)
    run(KILLED, str(old_file), "inside-the-open", "ladder", expect=-9)
    assert 22 <= version_of(old_file) < SCHEMA_VERSION  # its first transaction committed, the rest did not
    with SessionDB(old_file) as db:  # resumes: a copy now would be of a half-upgraded file
        assert db.schema_version == SCHEMA_VERSION and db.wait_for_fts_rebuild(60)
        copy = assert_one_complete_copy(old_file, original)
        assert db.upgrade_backup == copy


def test_a_copy_of_an_earlier_finished_upgrade_is_kept(old_file):
    with SessionDB(old_file) as db:
        first = db.upgrade_backup
    assert first is not None
    time.sleep(1.1)  # a later second in the new copy's name
    old_file.unlink()
    for side in ("-wal", "-shm"):
        Path(f"{old_file}{side}").unlink(missing_ok=True)
    old_file.write_bytes(gzip.decompress(FIXTURE.read_bytes()))  # another older file put in its place
    with SessionDB(old_file) as db:
        second = db.upgrade_backup
    assert second is not None and second != first
    assert beside(old_file) == sorted([first.name, second.name])  # one per upgrade


def test_pending_copies_of_gone_processes_are_removed_and_a_running_ones_kept(old_file):
    SessionDB(old_file).close()
    named = beside(old_file)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    try:
        stem = f"{old_file.name}.pre-v{SCHEMA_VERSION}-20260101T000000Z.bak"
        dead = old_file.parent / f"{stem}.pending-{int(gone.stdout)}-0123abcd"
        running = old_file.parent / f"{stem}.pending-{live.pid}-89abcdef"
        for p in (dead, running):
            p.write_bytes(old_file.read_bytes())
        SessionDB(old_file).close()
        assert beside(old_file) == sorted(named + [running.name])
    finally:
        live.kill()
        live.wait()
