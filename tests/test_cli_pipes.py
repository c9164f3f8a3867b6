"""`hermes-state` in pipes and narrow terminals: rows alone on stdout, chosen columns, counts that read well."""
from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run, run_in_terminal
from hermes_state import SessionDB

ROOT = Path(__file__).resolve().parents[1]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture
def four(hermes_home):
    with SessionDB() as db:
        db.create_session("alpha_session", "cli", "anthropic/claude-sonnet-4.6", title="A title long enough to be cut")
        db.append_message("alpha_session", "user", "hello")
        db.create_session("beta_session", "telegram", "openai/gpt-5", title="東京旅行の計画")
        db.create_session("gamma_session", "cron", "openai/gpt-5-mini")
        db.append_message("gamma_session", "user", "summarise the logs")
        db.create_session("delta_session", "cli", "openai/gpt-5", title="Delta", input_tokens=1200)
    return hermes_home


def _shell(home: Path, tmp_path: Path, line: str) -> subprocess.CompletedProcess:
    # A `hermes-state` on PATH that runs this checkout, as an installed one would.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "hermes-state"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hermes_state_cli "$@"\n')
    script.chmod(0o755)
    env = {**os.environ, "HERMES_HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, env=env,
                          timeout=120)


def _documented_pipes() -> list[str]:
    # Every `hermes-state sessions list ... | ...` the README and docs/cli.md show inline.
    found = []
    for path in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        text = " ".join(path.read_text(encoding="utf-8").split())
        found += [m for m in re.findall(r"`(hermes-state sessions list[^`]*\|[^`]*)`", text)]
    return found


def test_the_documented_pipelines_run_and_give_ids_the_next_command_takes(four, tmp_path):
    pipes = _documented_pipes()
    assert any("xargs" in p for p in pipes) and any("awk" in p for p in pipes), pipes
    for line in pipes:
        done = _shell(four, tmp_path, line)
        assert done.returncode == 0, (line, done.stderr)
        if "xargs" in line:  # every session shown, each by its own `sessions show`
            for sid in ("alpha_session", "beta_session", "gamma_session", "delta_session"):
                assert f"({sid})" in done.stdout, line
        else:
            assert sorted(done.stdout.split()) == ["alpha_session", "beta_session", "delta_session",
                                                   "gamma_session"], line


def test_piped_list_gives_rows_alone_and_says_the_count_on_stderr(four):
    done = run(four, "sessions", "list", "-n", "2")
    assert done.stdout.splitlines()[0].split()[0] == "id" and len(done.stdout.splitlines()) == 3
    assert done.stderr == "1-2 of 4 sessions (--offset 2 for more)\n"
    bare = run(four, "sessions", "list", "--no-headers", "-c", "id")
    assert bare.stdout.split("\n") == ["delta_session", "gamma_session", "beta_session", "alpha_session", ""]


def test_columns_are_chosen_in_order_and_an_unknown_one_names_the_choices(four):
    out = run(four, "sessions", "list", "-c", "source", "-c", "id", "--no-headers").stdout
    assert out.splitlines()[0].split() == ["cli", "delta_session"]
    wrong = run(four, "sessions", "list", "-c", "nope")
    assert wrong.returncode == 2 and "no column 'nope'" in wrong.stderr
    assert all(name in wrong.stderr for name in ("id", "title", "started_at", "input_tokens", "all"))
    assert run(four, "sessions", "list", "--json", "--no-headers").returncode == 2
    assert "input_tokens" in run(four, "completion", "bash").stdout  # Tab offers the column names


def test_csv_and_tsv_give_the_tables_columns_unless_asked(four):
    rows = list(csv.DictReader(io.StringIO(run(four, "sessions", "list", "--csv").stdout)))
    assert list(rows[0]) == ["id", "title", "source", "model", "messages", "active"]
    assert rows[0]["id"] == "delta_session" and rows[0]["messages"] == "0"
    every = list(csv.DictReader(io.StringIO(run(four, "sessions", "list", "--csv", "-c", "all").stdout)))
    assert {"started_at", "input_tokens", "system_prompt"} <= set(every[0]) and every[0]["input_tokens"] == "1200"
    tsv = run(four, "sessions", "list", "--tsv", "-c", "id", "-c", "title").stdout.splitlines()
    assert tsv[0] == "id\ttitle" and "beta_session\t東京旅行の計画" in tsv
    assert run(four, "sessions", "list", "--tsv", "--no-headers", "-c", "id").stdout.split() == [
        "delta_session", "gamma_session", "beta_session", "alpha_session"]
    chosen = run(four, "sessions", "list", "--json", "-c", "id", "-c", "input_tokens").stdout
    assert '"input_tokens": 1200' in chosen and '"title"' not in chosen


def test_tsv_is_a_global_format_of_the_commands_with_rows(four):
    out = run(four, "--tsv", "sessions", "stats").stdout.splitlines()
    assert out[0].split("\t")[:2] == ["model", "session_count"]
    assert run(four, "sessions", "show", "alpha", "--tsv").returncode == 2


def test_counts_read_as_they_are_said(four):
    assert run(four, "sessions", "list").stderr == "4 sessions\n"
    assert run(four, "sessions", "list", "--source", "telegram").stderr == "1 session\n"
    assert run(four, "sessions", "list", "-n", "1", "--offset", "3").stderr == "session 4 of 4\n"
    assert run(four, "sessions", "list", "-n", "1", "--offset", "1").stderr == (
        "session 2 of 4 (--offset 2 for more)\n")
    assert run(four, "sessions", "list", "--offset", "2").stderr == "3-4 of 4 sessions\n"


def test_on_a_terminal_the_count_follows_the_table(four):
    out = _ANSI.sub("", run_in_terminal(four, "sessions", "list", env={"COLUMNS": "120"}))
    assert out.rstrip().splitlines()[-1] == "4 sessions"


def test_a_narrow_terminal_leaves_out_columns_before_cutting_the_title(four):
    out = _ANSI.sub("", run_in_terminal(four, "sessions", "list", env={"COLUMNS": "50"}))
    lines = out.rstrip().splitlines()
    assert lines[0].split() == ["id", "title", "messages"]
    assert all(len(line) <= 50 for line in lines)
    assert "A title long enough to b…" in out and "東京旅行の計画" in out  # a title keeps 20 columns or more
    wide = _ANSI.sub("", run_in_terminal(four, "sessions", "list", env={"COLUMNS": "120"}))
    assert wide.splitlines()[0].split() == ["id", "title", "source", "model", "messages", "active"]


def test_stats_by_day_fits_its_bars_in_the_terminal(four):
    for columns in (80, 90):
        out = _ANSI.sub("", run_in_terminal(four, "sessions", "stats", "--by", "day", env={"COLUMNS": str(columns)}))
        lines = out.rstrip().splitlines()
        assert lines[0].split() == ["period", "model", "sessions", "input", "output", "cost"]
        assert "…" not in out and "█" in out
        assert all(len(line) <= columns for line in lines), (columns, out)
