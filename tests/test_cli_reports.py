"""The reports of `recover`, `backup`, `restore`, `vacuum` and `sessions import`: what matters, said once."""
from __future__ import annotations

import json

from conftest import run
from hermes_state import SessionDB


def _store(home, sessions: int = 3, messages: int = 2) -> None:
    with SessionDB() as db:
        for n in range(sessions):
            db.create_session(f"s{n}", "cli")
            for m in range(messages):
                db.append_message(f"s{n}", "user", f"message {m} " + "x" * 200)


def test_a_healthy_recover_says_the_counts_in_a_few_lines(hermes_home, tmp_path):
    _store(hermes_home)
    done = run(hermes_home, "recover", str(hermes_home / "state.db"), str(tmp_path / "new.db"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "error" not in done.stdout and "lost_ranges" not in done.stdout and "rejected" not in done.stdout
    whole = [line for line in lines if line.strip().startswith("copied whole:")]
    assert len(whole) == 1 and "sessions 3" in whole[0] and "messages 6" in whole[0]
    assert lines[-2:] == ["  losses: none", "  complete: yes"] and len(lines) <= 6
    machine = json.loads(run(hermes_home, "recover", str(hermes_home / "state.db"), str(tmp_path / "other.db"),
                             "--json").stdout)
    assert machine["tables"]["messages"]["error"] is None  # machines still get every field


def test_backup_and_restore_name_their_files_once(hermes_home, tmp_path):
    _store(hermes_home)
    copy = tmp_path / "copy.db"
    backed = run(hermes_home, "backup", str(copy))
    assert backed.returncode == 0 and backed.stdout == f"backed up to {copy}\n"
    restored = run(hermes_home, "restore", str(copy))
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.count(str(copy)) == 1 and len(restored.stdout.splitlines()) == 1


def test_vacuum_says_what_it_gave_back_or_why_nothing(hermes_home):
    _store(hermes_home, sessions=40, messages=20)
    first = json.loads(run(hermes_home, "vacuum", "--json").stdout)
    assert first["free_pages_before"] == 0
    again = run(hermes_home, "vacuum").stdout
    assert again.rstrip().endswith("no free pages to give back"), again
    with SessionDB() as db:
        for n in range(30):
            db.delete_session(f"s{n}")
    freed = run(hermes_home, "vacuum").stdout
    assert "bytes given back" in freed, freed


def test_vacuum_explains_a_file_that_grew():
    from hermes_state_cli import vacuum_summary
    said = vacuum_summary({"bytes_before": 647_168, "bytes_after": 655_360, "free_pages_before": 0})
    assert said.startswith("647,168 -> 655,360 bytes: grew by 8,192 bytes, with no free pages to give back")
    assert "page map" in said


def test_import_counts_read_as_they_are_said(hermes_home, tmp_path):
    export = tmp_path / "one.jsonl"
    with SessionDB(tmp_path / "src.db") as db:
        db.create_session("only", "cli")
        db.append_message("only", "user", "hello")
        export.write_text(json.dumps(db.export_session("only")) + "\n")
    _store(hermes_home, sessions=0)
    out = run(hermes_home, "sessions", "import", str(export)).stdout
    assert "; 1 message written" in out, out
