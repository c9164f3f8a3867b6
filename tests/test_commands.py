"""The `hermes-state` command as a user runs it: a subprocess on a temporary HERMES_HOME."""
from __future__ import annotations

import hashlib
import json
import time
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_state import SessionDB
from hermes_state_common import WAL_RESET_BUG
from conftest import run, run_in_terminal


@pytest.fixture
def filled(hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli", "model-a", title="Deploy", input_tokens=1200, output_tokens=300,
                          estimated_cost_usd=0.01234)
        db.append_message("s1", "user", "deploy the kanban board")
        db.append_message("s1", "assistant", "", tool_calls=[{"id": "c1", "type": "function", "function": {
            "name": "terminal", "arguments": '{"cmd": "make deploy"}'}}], reasoning="plan the deploy")
        db.append_message("s1", "tool", "ERR_CONN_7 refused\nretrying", tool_call_id="c1", tool_name="terminal")
        db.create_session("s2", "telegram", title="東京の旅")
        db.append_message("s2", "user", "東京タワーに行きたい \x1b[31mred\x1b[0m\nnext line")
        db.create_session("s3", "cron")
        db.end_session("s3", "done")
    return hermes_home


def digest(path: Path) -> dict[str, str]:
    """Hash the database and its WAL's content (a reader may create an empty -wal and the -shm index)."""
    wal = Path(f"{path}-wal")
    return {"db": hashlib.sha256(path.read_bytes()).hexdigest(),
            "wal": hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest()}


def test_browsing_commands_with_and_without_json(filled):
    out = run(filled, "sessions", "list")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "3 sessions\n" and "Deploy" in out.stdout
    rows = json.loads(run(filled, "sessions", "list", "--json").stdout)  # a global flag after the command
    assert {r["id"] for r in rows} == {"s1", "s2", "s3"}
    assert [r["id"] for r in json.loads(run(filled, "--json", "sessions", "list", "-n", "1", "--offset", "1").stdout)] \
        == [rows[1]["id"]]
    lines = run(filled, "sessions", "list", "--nl").stdout.splitlines()
    assert len(lines) == 3 and all(json.loads(line)["id"] for line in lines)
    assert run(filled, "sessions", "list", "--csv").stdout.splitlines()[0] == "id,title,source,model,messages,active"
    assert [r["id"] for r in json.loads(run(filled, "sessions", "list", "--model", "model-a", "--json").stdout)] == ["s1"]
    shown = run(filled, "sessions", "show", "s1")
    assert "→ terminal" in shown.stdout and "tokens in 1,200 / out 300" in shown.stdout and "$0.0123" in shown.stdout
    assert "None" not in shown.stdout and "title=" not in shown.stdout
    full = run(filled, "sessions", "show", "s1", "--full").stdout
    assert "### reasoning" in full and "> plan the deploy" in full and "make deploy" in full and "## tool `terminal`" in full
    assert json.loads(run(filled, "sessions", "show", "s1", "--json").stdout)["session"]["title"] == "Deploy"
    found = run(filled, "sessions", "search", "ERR_CONN_7", "--role", "tool")
    assert "s1" in found.stdout and ">>>ERR_CONN_7<<<" in found.stdout and "\x1b" not in found.stdout
    assert json.loads(run(filled, "--json", "sessions", "search", "東京").stdout)[0]["session_id"] == "s2"
    assert run(filled, "sessions", "search", "nothing-like-this").stdout.strip() == "no match"
    stats = run(filled, "sessions", "stats")
    assert "total" in stats.stdout and "(no model)" in stats.stdout and "1,200" in stats.stdout
    assert json.loads(run(filled, "sessions", "stats", "--json").stdout)["top_sessions"][0]["id"] == "s1"
    assert json.loads(run(filled, "fts", "status", "--json").stdout)["pending"] == 0


def test_untrusted_text_never_reaches_the_terminal_raw(filled):
    for argv in (["sessions", "list"], ["sessions", "show", "s2"], ["sessions", "search", "東京"]):
        out = run(filled, *argv).stdout
        assert "\x1b" not in out, argv
        assert "\\x1b[31m" in out or "東京" in out
    table = run(filled, "sessions", "list").stdout.splitlines()
    assert all(len(line) <= 80 for line in table)


def test_browsing_never_changes_the_file(filled):
    path = filled / "state.db"
    with SessionDB() as db:
        db.close()
    before = digest(path)
    for argv in (["sessions", "list"], ["sessions", "show", "s1"], ["sessions", "search", "deploy"],
                 ["sessions", "stats"], ["fts", "status"]):
        assert run(filled, *argv).returncode == 0
    assert digest(path) == before


def test_writes_delete_prune_rename_and_doctor(filled):
    assert run(filled, "sessions", "rename", "s2", "Tokyo trip").returncode == 0
    assert "Tokyo trip" in run(filled, "sessions", "list").stdout
    pruned = json.loads(run(filled, "sessions", "prune", "--older-than", "0", "--json").stdout)
    assert pruned["deleted"] == 1 and [r["id"] for r in pruned["sessions"]] == ["s3"]
    assert run(filled, "sessions", "delete", "s2").returncode == 0
    assert [r["id"] for r in json.loads(run(filled, "sessions", "list", "--json").stdout)] == ["s1"]
    doctor = run(filled, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "integrity" in doctor.stdout and "BAD" not in doctor.stdout
    report = json.loads(run(filled, "doctor", "--json").stdout)
    assert report["ok"] is True and {c["check"] for c in report["checks"]} >= {"schema", "integrity", "wal"}
    os.chmod(filled / "state.db", 0o644)
    mended = run(filled, "doctor")  # its checks open the file writable, which makes it private
    assert mended.returncode == 0, mended.stdout + mended.stderr
    line = next(line for line in mended.stdout.splitlines() if "file modes" in line)
    assert line.startswith("ok ") and "fixed" in line and "644" in line
    assert oct(os.stat(filled / "state.db").st_mode & 0o777) == "0o600"
    again = run(filled, "doctor")
    modes = next(line for line in again.stdout.splitlines() if "file modes" in line)
    assert again.returncode == 0 and "fixed" not in modes


def test_doctor_catches_a_row_indexed_twice_and_says_what_sqlite_it_runs_on(filled):
    # What another program's FTS5 rebuild over a queue once left behind: a row in an index twice.
    conn = sqlite3.connect(filled / "state.db")
    conn.execute("INSERT INTO messages_fts(rowid, content, tool_name, tool_calls) "
                 "SELECT id, content, tool_name, tool_calls FROM messages ORDER BY id LIMIT 1")
    conn.commit()
    conn.close()
    report = json.loads(run(filled, "doctor", "--json").stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is False and checks["fts messages_fts"]["ok"] is False
    assert "fts rebuild" in checks["fts messages_fts"]["detail"]
    assert checks["fts messages_fts_trigram"]["ok"] is True
    assert checks["sqlite"]["ok"] is True and sqlite3.sqlite_version in checks["sqlite"]["detail"]
    assert checks["sqlite"].get("warn", False) is WAL_RESET_BUG  # said, with the remedy, yet no reason to exit 1
    assert ("3.51.3" in checks["sqlite"]["detail"]) is WAL_RESET_BUG
    assert run(filled, "fts", "rebuild").returncode == 0
    assert json.loads(run(filled, "doctor", "--json").stdout)["ok"] is True


def test_doctor_on_a_terminal_aligns_its_rows_and_wraps_details_at_word_boundaries(filled):
    report = json.loads(run(filled, "doctor", "--json").stdout)
    out = run_in_terminal(filled, "doctor", env={"COLUMNS": "60", "NO_COLOR": "1"})
    lines = [line.rstrip("\r") for line in out.splitlines() if line.strip()]
    assert lines and all(len(line) <= 60 for line in lines), lines
    column = 5 + max(len(c["check"]) for c in report["checks"]) + 1  # label, names as wide as the longest
    rows = [line for line in lines if not line.startswith(" ")]
    assert [line[5:column].rstrip() for line in rows] == [c["check"] for c in report["checks"]]
    assert all(line[column] != " " for line in rows)
    assert all(len(line) - len(line.lstrip()) == column for line in lines if line.startswith(" "))
    words = " ".join(line[column:] for line in lines).split()
    assert words == " ".join(c["detail"] for c in report["checks"]).split()  # no word cut in two
    assert len(lines) > len(rows)  # something was long enough to wrap


def test_error_paths_are_one_line_with_exit_codes(filled, tmp_path):
    missing = run(filled, "sessions", "show", "nope")
    assert missing.returncode == 1 and missing.stderr == "hermes-state: session 'nope' not found\n"
    for argv in (["sessions", "list", "--limit", "-1"], ["sessions", "list", "--bogus"], ["sessions"],
                 ["--profile", "x", "--db", "y.db", "sessions", "list"], ["demo", "--json"],
                 ["demo", "--db", "x.db"], ["sessions", "show", "s1", "--csv"]):
        out = run(filled, *argv)
        assert out.returncode == 2, (argv, out.stderr)
        assert "Traceback" not in out.stderr
    nope = run(filled, "--profile", "ghost", "sessions", "list")
    assert nope.returncode == 2 and "ghost" in nope.stderr
    for target, says in ((tmp_path / "absent.db", "does not exist"), (tmp_path, "is a directory")):
        out = run(filled, "--db", str(target), "sessions", "rename", "s1", "x")
        assert out.returncode == 1 and says in out.stderr and out.stderr.count("\n") == 1
    (tmp_path / "empty.db").write_bytes(b"")
    out = run(filled, "--db", str(tmp_path / "empty.db"), "fts", "rebuild")
    assert out.returncode == 1 and "empty (0 bytes)" in out.stderr
    assert not (tmp_path / "absent.db").exists() and (tmp_path / "empty.db").stat().st_size == 0
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database at all" * 200)
    corrupt = run(filled, "--db", str(garbage), "sessions", "list")
    assert corrupt.returncode == 1 and "Traceback" not in corrupt.stderr
    # Nothing of it is readable: no `recover` is offered, only what can work.
    assert "nothing in it can be salvaged" in corrupt.stderr and " recover " not in corrupt.stderr
    debug = run(filled, "--db", str(garbage), "sessions", "list", "--debug")
    assert "Traceback" in debug.stderr


def test_profiles_follow_hermes_homes_root(filled):
    (filled / "profiles" / "coder").mkdir(parents=True)
    assert run(filled, "init", "-p", "coder").returncode == 0  # -p after the command
    assert (filled / "profiles" / "coder" / "state.db").is_file()
    listed = run(filled, "sessions", "list", "--profile", "coder")
    assert listed.returncode == 0 and "no sessions" in listed.stderr
    assert "--profile" in run(filled, "--help").stdout


def test_init_creates_and_demo_keep_leaves_a_home_to_explore(tmp_path):
    home = tmp_path / "fresh"
    created = run(home, "init", "--json")
    assert created.returncode == 0 and json.loads(created.stdout)["created"] is True
    assert json.loads(run(home, "init", "--json").stdout)["created"] is False
    before = (home / "state.db").read_bytes()
    refused = run(home, "demo", "--keep")  # the samples never go into a home that holds a store
    assert refused.returncode == 1 and "holds a store already" in refused.stderr
    assert (home / "state.db").read_bytes() == before
    demo = run(tmp_path / "new-home", "demo", "--keep")
    kept = demo.stdout.split("HERMES_HOME=")[1].split()[0]
    assert Path(kept) == tmp_path / "new-home"
    assert "demo_tokyo" in run(Path(kept), "sessions", "list").stdout


def test_a_closed_pipe_ends_quietly(filled):
    with SessionDB() as db:
        for i in range(300):
            db.create_session(f"bulk{i}", "cli")
    env = {**os.environ, "HERMES_HOME": str(filled)}
    out = subprocess.run(f"{sys.executable} -m hermes_state_cli sessions list -n 300 | head -2", shell=True,
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.count("\n") == 2 and "Error" not in out.stderr and "Traceback" not in out.stderr


def test_highlighting_and_progress_appear_only_on_a_terminal(filled):
    on_tty = run_in_terminal(filled, "sessions", "search", "kanban")
    assert "\x1b[1;33mkanban\x1b[0m" in on_tty and ">>>" not in on_tty
    piped = run(filled, "sessions", "search", "kanban").stdout
    assert ">>>kanban<<<" in piped and "\x1b[" not in piped
    with SessionDB() as db:
        for i in range(3000):
            db.append_message("s1", "user", f"filler message {i}")
    progress = run_in_terminal(filled, "fts", "rebuild")
    assert "rebuilding the search index" in progress
    quiet = run(filled, "fts", "rebuild")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_export_import_backup_restore_recover_migrate_vacuum(filled, tmp_path):
    exported = run(filled, "sessions", "export", "-o", str(tmp_path / "all.jsonl"))
    assert exported.returncode == 0, exported.stderr
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["session"]["id"] for line in lines) == ["s1", "s2", "s3"]
    one = json.loads(run(filled, "sessions", "export", "s1").stdout)
    assert [m["role"] for m in one["messages"]] == ["user", "assistant", "tool"]
    assert len(json.loads(run(filled, "sessions", "export", "--json").stdout)) == 3
    other = tmp_path / "other"
    assert run(other, "init").returncode == 0
    imported = run(other, "sessions", "import", str(tmp_path / "all.jsonl"), "--json")
    assert imported.returncode == 0, imported.stderr
    assert sorted(json.loads(imported.stdout)["imported"]) == ["s1", "s2", "s3"]
    assert run(other, "sessions", "export", "s1").stdout == run(filled, "sessions", "export", "s1").stdout
    again = json.loads(run(other, "sessions", "import", "-", "--json", stdin=(tmp_path / "all.jsonl").read_text()).stdout)
    assert sorted(again["skipped"]) == ["s1", "s2", "s3"]
    assert run(other, "sessions", "import", str(tmp_path / "all.jsonl"), "--on-conflict", "error").returncode == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json")
    assert run(other, "sessions", "import", str(bad)).returncode == 1

    copy = tmp_path / "copy.db"
    assert run(filled, "backup", str(copy)).returncode == 0 and copy.stat().st_size > 0
    assert run(filled, "sessions", "delete", "s2").returncode == 0
    restored = run(filled, "restore", str(copy))
    assert restored.returncode == 0, restored.stderr
    assert {r["id"] for r in json.loads(run(filled, "sessions", "list", "--json").stdout)} == {"s1", "s2", "s3"}

    target = tmp_path / "recovered.db"
    recovered = run(filled, "recover", str(copy), str(target), "--json")
    assert recovered.returncode == 0, recovered.stderr
    assert json.loads(recovered.stdout)["tables"]["messages"]["copied"] == 4
    assert run(filled, "--db", str(target), "sessions", "show", "s1").returncode == 0
    assert run(filled, "recover", str(tmp_path / "nope.db"), str(tmp_path / "x.db")).returncode == 1

    assert run(filled, "migrate", "--json").returncode == 0  # current already: nothing to copy
    assert json.loads(run(filled, "migrate", "--json").stdout)["backup"] is None
    vacuumed = run(filled, "vacuum", "--json")
    assert vacuumed.returncode == 0 and json.loads(vacuumed.stdout)["bytes_after"] > 0


def test_doctor_says_how_much_is_free_what_gives_it_back_and_which_upgrade_copies_are_kept(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with SessionDB(home / "state.db") as db:
        for n in range(40):
            db.create_session(f"s{n}", "cli")
            db.append_message(f"s{n}", "user", "x" * 100_000)
    checks = {c["check"]: c for c in json.loads(run(home, "doctor", "--json").stdout)["checks"]}
    assert checks["space"]["detail"].endswith("0.0 MB of it free") and not checks["space"].get("warn")
    assert checks["upgrade copies"]["detail"].startswith("none; the newest 2 are kept 30 days after their upgrade")
    with SessionDB(home / "state.db") as db:
        db.delete_sessions([f"s{n}" for n in range(30)])
    taken = time.time() - 86400  # an upgrade yesterday, and one 31 days ago
    copy = home / time.strftime("state.db.pre-v31-%Y%m%dT%H%M%SZ.bak", time.gmtime(taken))
    old = home / time.strftime("state.db.pre-v30-%Y%m%dT%H%M%SZ.bak", time.gmtime(taken - 30 * 86400))
    for c in (copy, old):
        c.write_bytes((home / "state.db").read_bytes())
    checks = {c["check"]: c for c in json.loads(run(home, "doctor", "--json").stdout)["checks"]}
    assert checks["space"]["warn"] is True and "`hermes-state vacuum` gives it back" in checks["space"]["detail"]
    size = copy.stat().st_size / 2**20
    until = time.strftime("%Y-%m-%d", time.gmtime(taken + 30 * 86400))
    assert checks["upgrade copies"]["detail"].startswith(
        f"2 ({2 * size:.1f} MB): {copy.name} ({size:.1f} MB, kept until {until}); "
        f"{old.name} ({size:.1f} MB, removed at the next writable open); the newest 2 are kept 30 days")
    assert old.exists()  # doctor only said so
    assert run(home, "vacuum").returncode == 0  # a writable open: it removes the copy past the policy
    checks = {c["check"]: c for c in json.loads(run(home, "doctor", "--json").stdout)["checks"]}
    assert not checks["space"].get("warn") and copy.exists() and not old.exists()
