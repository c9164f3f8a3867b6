"""Terminal habits: --color with NO_COLOR and FORCE_COLOR, a pager for long sessions, shell completion."""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state_cli as cli
import hermes_state_commands as commands
from hermes_state import SessionDB
from hermes_state_cli import main
from conftest import run, run_in_terminal

ESC = "\x1b["


@pytest.fixture
def store(hermes_home):
    with SessionDB() as db:
        for sid in ("demo_tokyo", "demo_docker", "demo_docker_2"):
            db.create_session(sid, "cli", title=sid.title())
            db.append_message(sid, "user", f"docker question in {sid}")
            db.append_message(sid, "assistant", "an answer")
    return hermes_home


@pytest.fixture(autouse=True)
def _auto_color():
    yield
    commands.set_color("auto")


def test_color_flag_and_environment(store, monkeypatch):
    for env, argv, coloured in (({}, [], False), ({"FORCE_COLOR": "1"}, [], True), ({"FORCE_COLOR": "0"}, [], False),
                                ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, [], False),
                                ({"NO_COLOR": "1"}, ["--color", "always"], True), ({}, ["--color", "always"], True),
                                ({"FORCE_COLOR": "1"}, ["--color", "never"], False)):
        clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        out = subprocess.run([sys.executable, "-m", "hermes_state_cli", *argv, "sessions", "search", "docker"],
                             capture_output=True, text=True, env={**clean, "HERMES_HOME": str(store), **env}).stdout
        assert (ESC in out) is coloured, (env, argv, out)
    assert main(["--color", "sometimes", "sessions", "list"]) == 2


def test_roles_headers_and_ids_are_coloured_not_only_matches(store, capsys):
    assert main(["--color", "always", "sessions", "search", "docker", "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{ESC}36mdemo_" in out and f"{ESC}34muser{ESC}0m" in out and f"{ESC}1;33mdocker{ESC}0m" in out
    assert main(["--color", "always", "sessions", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"{ESC}1mid ")
    assert main(["--color", "always", "sessions", "show", "demo_tokyo"]) == 0
    out = capsys.readouterr().out
    assert f"{ESC}32massistant{ESC}0m" in out and out.startswith(f"{ESC}1mDemo_Tokyo")


def test_show_goes_through_the_pager_on_a_terminal_only(store):
    pager = 'sed "s/^/PAGED: /"'
    paged = run_in_terminal(store, "sessions", "show", "demo_tokyo", env={"PAGER": pager, "NO_COLOR": "1"})
    lines = [line for line in paged.splitlines() if line.strip()]
    assert "PAGED: Demo_Tokyo  (demo_tokyo)" in lines and any("assistant  an answer" in line for line in lines)
    assert all(line.startswith("PAGED: ") for line in lines)  # every line went through it
    direct = run_in_terminal(store, "sessions", "show", "demo_tokyo", "--no-pager", env={"PAGER": pager,
                                                                                        "NO_COLOR": "1"})
    assert "PAGED" not in direct and "Demo_Tokyo  (demo_tokyo)" in direct
    piped = run(store, "sessions", "show", "demo_tokyo")
    assert "PAGED" not in piped.stdout and "Demo_Tokyo" in piped.stdout
    assert "PAGED" not in run_in_terminal(store, "sessions", "show", "demo_tokyo", env={"PAGER": "cat"})
    colours = run_in_terminal(store, "sessions", "show", "demo_tokyo", env={"PAGER": pager})
    assert f"PAGED: {ESC}1mDemo_Tokyo" in colours  # colours go through to the pager (less -R shows them)


def test_the_default_pager_is_less_quitting_when_the_page_fits(store):
    if not shutil.which("less"):
        pytest.skip("less is not installed: the default pager cannot be checked")
    env = {k: v for k, v in os.environ.items() if k not in ("PAGER", "LESS")}
    out = run_in_terminal(store, "sessions", "show", "demo_tokyo", env={**env, "PAGER": ""})
    assert "Demo_Tokyo" in out and "an answer" in out  # less -F printed it and quit: the run ended


def _bash_complete(store, words: list[str]) -> list[str]:
    script = run(store, "completion", "bash").stdout
    line = " ".join(shlex.quote(w) for w in words)  # quoted, so an empty current word stays a word
    program = f"""{script}
COMP_WORDS=({line}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_hermes_state
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                          env={**os.environ, "HERMES_HOME": str(store)}, timeout=60)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completes_commands_actions_and_ids_from_the_store(store, tmp_path):
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    assert _bash_complete(store, ["hermes-state", "se"]) == ["sessions", "serve"]
    assert _bash_complete(store, ["hermes-state", "sessions", "sh"]) == ["show"]
    assert _bash_complete(store, ["hermes-state", "sessions", "show", "demo_d"]) == ["demo_docker", "demo_docker_2"]
    assert _bash_complete(store, ["hermes-state", "--json", "sessions", "delete", "demo_t"]) == ["demo_tokyo"]
    other = tmp_path / "other.db"
    with SessionDB(other) as db:
        db.create_session("elsewhere", "cli")
    assert _bash_complete(store, ["hermes-state", "--db", str(other), "sessions", "show", "e"]) == ["elsewhere"]
    first_words = _bash_complete(store, ["hermes-state", ""])
    assert {"sessions", "recover", "completion"} <= set(first_words)
    assert _bash_complete(store, ["hermes-state", "--", ""]) == first_words  # "--" ends the options: a command comes next


def _bash_completions(home: Path, lines: list[list[str]]) -> list[list[str]]:
    """Complete each command line (its last word is the one being typed) with one script, in one bash."""
    script = run(home, "completion", "bash").stdout
    program = [script]
    for words in lines:
        program += [f"COMP_WORDS=({' '.join(words)}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMPREPLY=()",
                    "_hermes_state", "printf '%s\\n' \"${COMPREPLY[@]}\" '--end--'"]
    done = subprocess.run(["bash", "-c", "\n".join(program)], capture_output=True, text=True,
                          env={**os.environ, "HERMES_HOME": str(home)}, timeout=120)
    assert done.returncode == 0, done.stderr
    found: list[list[str]] = [[]]
    for word in done.stdout.splitlines():
        if word == "--end--":
            found.append([])
        elif word:
            found[-1].append(word)
    return found[:-1]


def _help_of(*words: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.parse_command([*words, "--help"])
    return out.getvalue()


def _parser_commands() -> dict[tuple[str, ...], set[str]]:
    """Return {command: its options} as the parser's own --help lists them (not the completion's reading)."""
    def listed(text: str) -> list[str]:  # the "    name   help" lines under "positional arguments:"
        return re.findall(r"^    (\w+)", text.split("\n\noptions:", 1)[0], re.MULTILINE)

    def options(text: str) -> set[str]:  # the flags before the help text of each "  -..." line under "options:"
        part = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
        return {flag for line in part.splitlines() if line.startswith("  -")
                for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", re.split(r"\s{2,}", line.strip())[0])
                } - {"-h", "--help"}
    found = {}
    for name in listed(_help_of()):
        actions = listed(_help_of(name)) if name == "sessions" else []
        found.update({(name, action): options(_help_of(name, action)) for action in actions} if actions
                     else {(name,): options(_help_of(name))})
    return found


def test_completion_offers_every_command_and_flag_of_the_parser(store):
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    commands_ = _parser_commands()
    lines = [["hermes-state", "''"], ["hermes-state", "sessions", "''"]]
    lines += [["hermes-state", *words, "-"] for words in commands_]
    lines += [["hermes-state", "fts", "''"], ["hermes-state", "sessions", "search", "--role", "''"],
              ["hermes-state", "sessions", "stats", "--by", "''"], ["hermes-state", "--color", "''"]]
    tops, actions, *flags, fts, roles, periods, colors = _bash_completions(store, lines)
    assert sorted(tops) == sorted({words[0] for words in commands_})
    assert sorted(actions) == sorted(words[1] for words in commands_ if words[0] == "sessions")
    for (words, own), offered in zip(commands_.items(), flags):
        assert own <= set(offered), (words, own - set(offered))
        assert {"--json", "--db", "--profile", "--help"} <= set(offered), words
    assert fts == ["status", "rebuild"]
    assert roles == ["system", "developer", "user", "assistant", "tool"]
    assert periods == ["day", "week", "month"] and colors == ["auto", "always", "never"]


def test_id_completion_reads_the_store_of_the_profile_on_the_line(tmp_path):
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    root = tmp_path / "root"
    (root / "profiles" / "coder").mkdir(parents=True)
    for home, sid in ((root, "home_one"), (root / "profiles" / "coder", "coder_one")):
        with SessionDB(home / "state.db") as db:
            db.create_session(sid, "cli")
    found = _bash_completions(root, [["hermes-state", "sessions", "show", "''"],
                                     ["hermes-state", "-p", "coder", "sessions", "show", "''"],
                                     ["hermes-state", "sessions", "delete", "--profile=coder", "''"],
                                     ["hermes-state", "--profile", "default", "sessions", "rename", "''"],
                                     ["hermes-state", "-p", "../../x", "sessions", "show", "''"],
                                     ["hermes-state", "-p", "''"], ["hermes-state", "--profile", "c"]])
    assert found == [["home_one"], ["coder_one"], ["coder_one"], ["home_one"], [], ["default", "coder"], ["coder"]]


def test_the_id_lister_loads_nothing_of_the_library_and_writes_nothing(store):
    before = (store / "state.db").read_bytes()
    code = ("import sys, hermes_state_complete as c; print(c.ids('demo_d')); "
            "print(sorted(m for m in sys.modules if m.startswith('hermes_state')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HERMES_HOME": str(store)}).stdout.splitlines()
    assert out == ["['demo_docker', 'demo_docker_2']", "['hermes_state_complete']"]
    assert (store / "state.db").read_bytes() == before  # SQLite's reader may add empty -wal/-shm files, no more
    assert all(p.stat().st_size == 0 for p in store.iterdir() if p.name.endswith("-wal"))
    assert subprocess.run([sys.executable, "-m", "hermes_state_complete", "ids", "x"], capture_output=True,
                          env={**os.environ, "HERMES_HOME": str(store / "nowhere")}).stdout == b""
    assert not (store / "nowhere").exists()


def test_zsh_and_fish_scripts(store):
    zsh, fish = run(store, "completion", "zsh").stdout, run(store, "completion", "fish").stdout
    assert "bashcompinit" in zsh and "complete -o default -F _hermes_state hermes-state" in zsh
    assert "hermes_state_complete ids (commandline -ct)" in fish and "-a 'list show search" in fish
    for shell, text in (("zsh", zsh), ("fish", fish)):
        if shutil.which(shell):
            assert subprocess.run([shell, "-n"], input=text, text=True).returncode == 0
    assert run(store, "completion", "tcsh").returncode == 2


def test_long_work_shows_progress_on_a_terminal_only(store, tmp_path):
    export = tmp_path / "all.jsonl"
    assert run(store, "sessions", "export", "-o", str(export)).returncode == 0
    cases = [("backing up", ["backup", str(tmp_path / "copy.db")]),
             ("recovering", ["recover", str(store / "state.db"), str(tmp_path / "rescued.db")]),
             ("importing", ["--db", str(tmp_path / "fresh.db"), "sessions", "import", str(export)])]
    for label, argv in cases:
        seen = run_in_terminal(store, *argv)
        assert f"{label}: " in seen and " MB" in seen, (label, seen)
    for label, argv in cases:
        for path in (tmp_path / "copy.db", tmp_path / "rescued.db", tmp_path / "fresh.db"):
            path.unlink(missing_ok=True)
        piped = run(store, *argv)
        assert piped.returncode == 0 and label not in piped.stderr, (label, piped.stderr)
    assert "(100%)" in render_line(1000, 1000) and "MB/s" in render_line(10**7, 2 * 10**7, elapsed=2.0)


def test_restore_vacuum_and_migrate_show_progress_on_a_terminal_only(store, tmp_path):
    import gzip
    copy = tmp_path / "copy.db"
    assert run(store, "backup", str(copy)).returncode == 0
    older = tmp_path / "agent.db"  # a hermes-agent 0.19.0 file: migrate upgrades it, copying it first
    fixture = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"
    cases = [("restoring", ["restore", str(copy)]), ("vacuuming", ["vacuum"]),
             ("upgrading", ["--db", str(older), "migrate"])]
    for piped in (False, True):
        for label, argv in cases:
            older.write_bytes(gzip.decompress(fixture.read_bytes()))
            for old in tmp_path.glob("agent.db?*"):
                old.unlink()
            if piped:
                done = run(store, *argv)
                assert done.returncode == 0 and label not in done.stderr, (label, done.stderr)
            else:
                seen = run_in_terminal(store, *argv)
                assert re.search(rf"{label}: [0-9.,]+ MB of [0-9.,]+ MB \(\d+%\)", seen), (label, seen)
                assert re.search(rf"{label}: done in \d+\.\d s", seen) and "Traceback" not in seen, (label, seen)
    assert "demo_tokyo" in run(store, "sessions", "list").stdout  # the restored store is whole
    assert list(tmp_path.glob("agent.db.pre-v*.bak")), "migrate wrote its copy first"
    missing = run_in_terminal(store, "restore", str(tmp_path / "nothing.db"))
    assert "does not exist" in missing and "restoring" not in missing  # refused before any work starts


def test_the_progress_of_a_file_written_counts_only_new_bytes_and_never_goes_back(tmp_path):
    wal, copies = tmp_path / "state.db-wal", tmp_path / "state.db.pre-v31-x.bak*"
    wal.write_bytes(b"x" * 100)  # a WAL left from before: its old bytes are not this work's
    poll = commands.files_growing(1000, wal, copies)
    assert poll() == (0, 1000)
    wal.write_bytes(b"x" * 400)
    (tmp_path / "state.db.pre-v31-x.bak.partial-1-abcdef12").write_bytes(b"y" * 200)
    assert poll() == (500, 1000)
    wal.write_bytes(b"")  # folded back into the file: the line stays where it got to
    assert poll() == (500, 1000)
    wal.write_bytes(b"x" * 5000)
    assert poll() == (1000, 1000)  # never past the total
    assert commands.files_growing(None, tmp_path / "missing-*")() == (0, None)


def test_a_failure_during_work_with_progress_is_the_commands_error(store, tmp_path):
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"SQLite format 3\x00" + b"\xff" * 8192)  # a header, then garbage
    seen = run_in_terminal(store, "restore", str(damaged))
    assert "hermes-state:" in seen and "Traceback" not in seen, seen
    assert "demo_tokyo" in run(store, "sessions", "list").stdout  # nothing was replaced


def render_line(done: int, total: int, elapsed: float = 0.0) -> str:
    import io
    import hermes_state_render as render

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    out = Terminal()
    import time
    progress = render.Progress("copying", stream=out, unit="bytes", started=time.monotonic() - elapsed)
    progress.update(done, total)
    return out.getvalue()


def test_demo_keep_fills_the_home_hermes_home_names_and_never_one_with_a_store(tmp_path):
    home = tmp_path / "fresh-home"
    env = {**os.environ, "HERMES_HOME": str(home)}
    kept = subprocess.run([sys.executable, "-m", "hermes_state_cli", "demo", "--keep"], capture_output=True,
                          text=True, env=env)
    assert kept.returncode == 0 and f"HERMES_HOME={home} hermes-state sessions list" in kept.stdout
    listed = subprocess.run([sys.executable, "-m", "hermes_state_cli", "sessions", "list"], capture_output=True,
                            text=True, env=env)
    assert "demo_tokyo" in listed.stdout
    before = (home / "state.db").read_bytes()
    again = subprocess.run([sys.executable, "-m", "hermes_state_cli", "demo", "--keep"], capture_output=True,
                           text=True, env=env)
    assert again.returncode == 1 and "holds a store already" in again.stderr
    assert (home / "state.db").read_bytes() == before
    throwaway = subprocess.run([sys.executable, "-m", "hermes_state_cli", "demo"], capture_output=True, text=True,
                               env=env)
    assert throwaway.returncode == 0 and str(home) not in throwaway.stdout  # without --keep: a new temporary home
