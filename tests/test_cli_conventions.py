"""What a first-time user of `hermes-state` expects: whole ids, plain output, the usual flags, safe files."""
from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state
from hermes_state import SessionDB
from hermes_state_cli import main
from conftest import run, run_in_terminal

LONG_ID = "00000000-0000-0000-0000-000000000000-very-long-session-key"


@pytest.fixture
def long_ids(hermes_home):
    with SessionDB() as db:
        db.create_session(LONG_ID, "cli", "anthropic/claude-sonnet-4.6-with-a-long-model-name",
                          title="A title long enough that a table has to cut it somewhere on the way")
        db.append_message(LONG_ID, "user", "first words of a long session")
        db.create_session("tg:1001/thread-7-with-another-long-key", "telegram")
    return hermes_home


# --- ids and keys are never cut ---------------------------------------------------------------

def test_piped_output_cuts_nothing_so_ids_can_be_copied(long_ids):
    done = run(long_ids, "sessions", "list")
    out = done.stdout
    assert LONG_ID in out and "A title long enough that a table has to cut it somewhere on the way" in out
    assert "…" not in out
    assert done.stderr == "2 sessions\n"  # piped, the count is for the person watching, not for the next command
    first_column = [line.split()[0] for line in out.splitlines()[1:]]
    assert sorted(first_column) == sorted([LONG_ID, "tg:1001/thread-7-with-another-long-key"])
    for sid in first_column:  # what `| awk '{print $1}'` yields is accepted by the next command
        assert run(long_ids, "sessions", "show", sid).returncode == 0
    hits = run(long_ids, "sessions", "search", "words").stdout
    assert hits.startswith(LONG_ID + "  ")


def test_a_narrow_terminal_cuts_other_columns_never_the_id(long_ids):
    out = run_in_terminal(long_ids, "sessions", "list", env={"COLUMNS": "70"})
    assert LONG_ID in out and "…" in out  # the title was cut, the id was not
    assert "A title long enough that a table has to cut it somewhere on the way" not in out
    stats = run_in_terminal(long_ids, "sessions", "stats", env={"COLUMNS": "70"})
    assert LONG_ID in stats


# --- conventions ---------------------------------------------------------------------------------

def test_version_is_the_distributions_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hermes-state {hermes_state.__version__}\n"
    assert importlib.metadata.version("hermes-state") == hermes_state.__version__


def test_no_color_turns_highlighting_off_on_a_terminal(long_ids):
    assert "\x1b[1;33m" in run_in_terminal(long_ids, "sessions", "search", "words")
    plain = run_in_terminal(long_ids, "sessions", "search", "words", env={"NO_COLOR": "1"})
    assert "\x1b[" not in plain and ">>>words<<<" in plain


def test_limit_zero_means_all_and_a_huge_limit_is_a_usage_error(hermes_home, capsys):
    with SessionDB() as db:
        for i in range(25):
            db.create_session(f"s{i:02}", "cli")
            db.append_message(f"s{i:02}", "user", "needle")
    assert main(["--json", "sessions", "list"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 20
    assert main(["--json", "sessions", "list", "-n", "0"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 25
    assert main(["--json", "sessions", "search", "needle", "-n", "0"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 25
    for argv in (["sessions", "list", "-n", str(2**64)], ["sessions", "list", "--offset", "99999999999"],
                 ["sessions", "search", "needle", "-n", "-1"], ["sessions", "search", "needle", "--role", "robot"],
                 ["sessions", "show", "s01", "--tail", "-2"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("hermes-state: ") and err.count("\n") == 1 and "--help" in err, err


def test_show_tail_prints_only_the_last_messages(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("long", "cli")
        for i in range(30):
            db.append_message("long", "user" if i % 2 == 0 else "assistant", f"message number {i}")
    assert main(["sessions", "show", "long", "--tail", "3"]) == 0
    out = capsys.readouterr().out
    assert "message number 27" in out and "message number 29" in out and "message number 26" not in out
    assert "27 earlier messages not shown" in out
    assert main(["--json", "sessions", "show", "long", "--tail", "3"]) == 0
    assert [m["content"] for m in json.loads(capsys.readouterr().out)["messages"]] == [
        "message number 27", "message number 28", "message number 29"]
    assert main(["sessions", "show", "long", "--tail", "0"]) == 0
    assert "message number 0\n" in capsys.readouterr().out


def test_an_untitled_session_is_named_the_same_way_everywhere(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("s1", "cli", "m", input_tokens=5)
        db.append_message("s1", "user", "fix the flaky upload test")
    for argv in (["sessions", "list"], ["sessions", "show", "s1"], ["sessions", "search", "flaky"],
                 ["sessions", "stats"]):
        assert main(argv) == 0
        assert "(untitled)" in capsys.readouterr().out, argv


def test_doctor_lists_its_checks_in_the_same_order_every_run(hermes_home):
    SessionDB().close()
    orders = {tuple(c["check"] for c in json.loads(run(hermes_home, "doctor", "--json").stdout)["checks"])
              for _ in range(3)}
    assert len(orders) == 1
    (order,) = orders
    fts = [c for c in order if c.startswith("fts messages")]
    assert fts == sorted(fts) and len(fts) >= 2


def test_an_ascii_locale_prints_escapes_instead_of_failing(long_ids):
    with SessionDB() as db:
        db.create_session("tokyo", "telegram", title="東京旅行")
        db.append_message("tokyo", "user", "東京タワー")
    env = {**os.environ, "HERMES_HOME": str(long_ids), "LC_ALL": "POSIX", "PYTHONUTF8": "0"}
    for argv in (["sessions", "list"], ["sessions", "show", "tokyo"], ["sessions", "search", "東京"]):
        out = subprocess.run([sys.executable, "-m", "hermes_state_cli", *argv], capture_output=True, env=env,
                             timeout=120)
        assert out.returncode == 0, (argv, out.stderr)
        assert b"\\u6771\\u4eac" in out.stdout and b"Traceback" not in out.stderr
        out.stdout.decode("ascii")
    listed = subprocess.run([sys.executable, "-m", "hermes_state_cli", "--json", "sessions", "list"],
                            capture_output=True, env=env, timeout=120)
    assert {r["title"] for r in json.loads(listed.stdout)} >= {"東京旅行"}  # still valid JSON


# --- plain output, not Python reprs ---------------------------------------------------------------

def test_import_and_recover_print_plain_lines(hermes_home, tmp_path, capsys):
    with SessionDB() as db:
        db.create_session("a", "cli")
        db.append_message("a", "user", "hello")
        db.create_session("b", "cli")
    assert main(["sessions", "export", "-o", str(tmp_path / "all.jsonl")]) == 0
    other = tmp_path / "other.db"
    SessionDB(other).close()
    capsys.readouterr()
    assert main(["--db", str(other), "sessions", "import", str(tmp_path / "all.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "  imported: a, b\n" in out and "  skipped: none\n" in out
    assert "('" not in out and "()" not in out
    assert main(["recover", str(other), str(tmp_path / "new.db")]) == 0
    out = capsys.readouterr().out
    assert "('" not in out and "{" not in out and "True" not in out
    assert "  complete: yes" in out and "  copied whole: sessions 2, messages 1" in out


def test_importing_a_binary_file_names_it(hermes_home, tmp_path, capsys):
    SessionDB().close()
    blob = tmp_path / "photo.jpg"
    blob.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\xd0\x00")
    assert main(["sessions", "import", str(blob)]) == 1
    err = capsys.readouterr().err
    assert str(blob) in err and "not UTF-8" in err and err.count("\n") == 1


# --- files and paths ---------------------------------------------------------------------------

def test_backup_and_recover_never_create_directories(hermes_home, tmp_path, capsys):
    SessionDB().close()
    for argv in (["backup", str(tmp_path / "nope" / "x.db")],
                 ["recover", str(hermes_home / "state.db"), str(tmp_path / "nope" / "y.db")],
                 ["sessions", "export", "-o", str(tmp_path / "nope" / "z.jsonl")]):
        assert main(argv) == 1, argv
        assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()


def test_the_library_agrees_with_the_command_line_on_a_missing_folder(hermes_home, tmp_path):
    from hermes_state_recovery import recover
    with SessionDB() as db:
        db.create_session("keep", "cli")
        with pytest.raises(FileNotFoundError, match="does not exist: create the folder first"):
            db.backup(tmp_path / "nope" / "x.db")
        made = tmp_path / "made"
        made.mkdir()
        assert db.backup(made / "x.db") == made / "x.db"  # an existing folder is all it needs
    with pytest.raises(FileNotFoundError, match="create the folder first"):
        recover(hermes_home / "state.db", tmp_path / "nope" / "y.db")
    assert not (tmp_path / "nope").exists() and [p.name for p in made.iterdir()] == ["x.db"]


def test_restore_onto_the_live_file_itself_is_refused(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("keep", "cli")
    assert main(["restore", str(hermes_home / "state.db")]) == 1
    assert "the database itself" in capsys.readouterr().err
    with SessionDB() as db:
        assert db.get_session("keep") is not None


def test_hermes_home_naming_a_file_says_so(hermes_home, monkeypatch, capsys):
    SessionDB().close()
    monkeypatch.setenv("HERMES_HOME", str(hermes_home / "state.db"))
    out = run(hermes_home / "state.db", "sessions", "list")
    assert out.returncode == 1 and "a file" in out.stderr and "--db" in out.stderr
    assert "state.db/state.db" not in out.stderr


def test_init_with_a_new_profile_creates_it(hermes_home):
    created = run(hermes_home, "-p", "work", "init", "--json")
    assert created.returncode == 0, created.stderr
    assert Path(json.loads(created.stdout)["path"]) == hermes_home / "profiles" / "work" / "state.db"
    assert (hermes_home / "profiles" / "work" / "state.db").is_file()
    listed = run(hermes_home, "-p", "work", "sessions", "list")
    assert listed.stdout == "" and listed.stderr.strip() == "no sessions"
    assert run(hermes_home, "-p", "other", "sessions", "list").returncode == 2  # only init creates one


# --- the export file ---------------------------------------------------------------------------

def test_export_file_is_private_and_written_whole(hermes_home, tmp_path, capsys):
    with SessionDB() as db:
        db.create_session("a", "cli")
    target = tmp_path / "out.jsonl"
    assert main(["sessions", "export", "-o", str(target)]) == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert json.loads(target.read_text())["session"]["id"] == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hermes_home", "out.jsonl"]  # no partial left


def test_a_wrong_db_leaves_an_existing_export_as_it_was(hermes_home, tmp_path, capsys):
    target = tmp_path / "out.jsonl"
    target.write_text("the previous export\n")
    assert main(["--db", str(tmp_path / "typo.db"), "sessions", "export", "-o", str(target)]) == 1
    assert target.read_text() == "the previous export\n"
    assert main(["sessions", "export", "no-such-session", "-o", str(target)]) == 1
    assert target.read_text() == "the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hermes_home", "out.jsonl"]


def test_export_never_follows_a_symlink_planted_at_the_file(hermes_home, tmp_path, capsys):
    with SessionDB() as db:
        db.create_session("a", "cli")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = tmp_path / "out.jsonl"
    planted.symlink_to(victim)
    assert main(["sessions", "export", "-o", str(planted)]) == 0
    assert victim.read_text() == "precious\n"
    assert not planted.is_symlink() and json.loads(planted.read_text())["session"]["id"] == "a"


# --- delete and prune: dry runs, and what went ---------------------------------------------------

@pytest.fixture
def ended(hermes_home):
    with SessionDB() as db:
        for sid in ("old1", "old2"):
            db.create_session(sid, "cli", title=f"Old {sid}")
            db.append_message(sid, "user", "done with this")
            db.end_session(sid, "user_exit")
        db.create_session("open", "cli")
    return hermes_home


def test_prune_dry_run_lists_and_changes_nothing_then_prune_says_what_went(ended, capsys):
    before = (ended / "state.db").read_bytes()
    assert main(["sessions", "prune", "--older-than", "0d", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would delete 2 ended sessions" in out and "old1  Old old1  (1 message)" in out and "old2" in out
    assert "open" not in out.replace("nothing was changed", "")
    assert (ended / "state.db").read_bytes() == before
    assert main(["--json", "sessions", "prune", "--older-than", "0", "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] is True and sorted(r["id"] for r in dry["sessions"]) == ["old1", "old2"]
    assert main(["sessions", "prune", "--older-than", "1h"]) == 0  # started seconds ago: nothing is that old
    assert "deleted 0 ended sessions" in capsys.readouterr().out
    assert main(["sessions", "prune", "--older-than", "0"]) == 0
    out = capsys.readouterr().out
    assert "deleted 2 ended sessions:" in out and "old1" in out and "old2" in out
    with SessionDB() as db:
        assert [r["id"] for r in db.list_sessions()] == ["open"]


def test_older_than_takes_ages_like_since(ended, capsys):
    for good in ("7d", "12h", "2w", "30m", "3mo", "1y", "1.5", "0"):
        assert main(["sessions", "prune", "--older-than", good, "--dry-run"]) == 0, good
    for bad in ("soon", "-3", "7x", ""):
        assert main(["sessions", "prune", "--older-than", bad]) == 2, bad
    capsys.readouterr()


def test_delete_dry_run_then_delete_say_what_goes(ended, capsys):
    assert main(["sessions", "delete", "old1", "--dry-run"]) == 0
    assert capsys.readouterr().out == "would delete 1 session:\n  old1  Old old1  (1 message)\nnothing was changed\n"
    with SessionDB() as db:
        assert db.get_session("old1") is not None
    assert main(["sessions", "delete", "old1"]) == 0
    assert capsys.readouterr().out == "deleted 1 session:\n  old1  Old old1  (1 message)\n"
    assert main(["sessions", "delete", "old1", "--dry-run"]) == 1
    assert "not found" in capsys.readouterr().err


def test_delete_of_a_conversation_lists_every_part_and_a_live_continuation_is_refused(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("part1", "cli", title="Long talk")
        db.append_message("part1", "user", "start")
        db.rotate_session("part1", "part2", db.get_messages_as_conversation("part1"), title="Long talk #2")
        db.create_session("helper", "cli", parent_session_id="part2", model_config={"_delegate_from": "part2"})
        db.create_session("branch", "cli", parent_session_id="part2")
    before = (hermes_home / "state.db").read_bytes()
    assert main(["sessions", "delete", "part1", "--dry-run"]) == 1  # its continuation part2 is live
    assert "live session 'part2'" in capsys.readouterr().err
    assert main(["--json", "sessions", "delete", "part2", "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in dry["sessions"]] == ["part1", "part2", "helper"]  # the branch stays
    assert (hermes_home / "state.db").read_bytes() == before
    assert main(["--json", "sessions", "delete", "part2"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["deleted"] == 3 and sorted(r["id"] for r in done["sessions"]) == ["helper", "part1", "part2"]
    with SessionDB() as db:
        assert [r["id"] for r in db.list_sessions()] == ["branch"]


def test_rename_prints_the_stored_title_and_refuses_an_unknown_id(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("s1", "cli")
    assert main(["sessions", "rename", "s1", "  Kanban deploy  "]) == 0
    assert capsys.readouterr().out == "s1: Kanban deploy\n"
    assert main(["--json", "sessions", "rename", "s1", ""]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": "s1", "title": None}
    assert main(["sessions", "rename", "nope", "x"]) == 1
    assert "not found" in capsys.readouterr().err


def test_delete_dry_run_lists_exactly_what_the_delete_then_removes(hermes_home, capsys):
    # A delegate is known by the session its model_config names as well as by its parent link, and
    # a delegate's own delegates go too: the dry run prints the library's plan, so it agrees.
    with SessionDB() as db:
        db.create_session("main", "cli", title="Main")
        db.create_session("helper", "cli", model_config={"_delegate_from": "main"})  # no parent link
        db.create_session("sub", "cli", parent_session_id="helper", model_config={"_delegate_from": "helper"})
        db.create_session("branch", "cli", parent_session_id="main")
        for sid in ("main", "helper", "sub", "branch"):
            db.end_session(sid, "user_exit")
    assert main(["--json", "sessions", "delete", "main", "--dry-run"]) == 0
    planned = [r["id"] for r in json.loads(capsys.readouterr().out)["sessions"]]
    assert main(["--json", "sessions", "delete", "main"]) == 0
    removed = [r["id"] for r in json.loads(capsys.readouterr().out)["sessions"]]
    assert planned == removed == ["main", "helper", "sub"]
    with SessionDB() as db:
        assert [r["id"] for r in db.list_sessions()] == ["branch"]


def test_delete_dry_run_is_refused_where_the_delete_is(hermes_home, capsys):
    with SessionDB() as db:
        db.create_session("s", "telegram", title="Owes a reply")
        db.owe_delivery("s", {"text": "your build is green"})
    assert main(["sessions", "delete", "s", "--dry-run"]) == 1  # not "would delete 1 session"
    dry = capsys.readouterr()
    assert dry.out == "" and "cannot delete 's': work is still owed for 's'" in dry.err
    assert main(["sessions", "delete", "s"]) == 1
    assert capsys.readouterr().err == dry.err
    with SessionDB() as db:
        assert db.get_session("s") is not None
