"""The docs run as shown: every code example in README.md and docs/, and the transcript in docs/cli.md.

A Python example runs alone, in a fresh process, in a temporary HERMES_HOME and working
directory. A fenced block preceded by a line `<!-- not run: REASON -->` is not run (REASON says
why: it installs something, serves forever, needs the network); every other block must run.
The transcript in docs/cli.md sits between `<!-- transcript: begin -->` and
`<!-- transcript: end -->`; `python tests/test_cli_docs.py` writes it from a real run, and the
test runs the same commands again and compares, times and temporary paths aside.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_OPEN = re.compile(r"^(`{3,})([\w+-]*)")
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")
RUNNABLE = {"python", "py"}


def code_blocks(path: Path) -> list[tuple[int, str, str, str | None]]:
    """Return (line, language, code, reason it is not run or None) for each fenced block of `path`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        opened = _OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        # A fence closes at a line of at least as many backticks, so a ```` block may hold ``` lines.
        fence, start = opened.group(1), i
        i += 1
        while i < len(lines) and not (lines[i].startswith(fence) and not lines[i].strip("`").strip()):
            i += 1
        previous = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = _NOT_RUN.search(previous)
        out.append((start + 1, opened.group(2), "\n".join(lines[start + 1:i]) + "\n",
                    marker.group(1) if marker else None))
        i += 1
    return out


EXAMPLES = [pytest.param(path, line, code, reason, id=f"{path.name}:{line}")
            for path in DOCS for line, language, code, reason in code_blocks(path) if language in RUNNABLE]


def test_there_are_examples_to_run():
    assert len([e for e in EXAMPLES if e.values[3] is None]) >= 10


@pytest.mark.parametrize("path, line, code, reason", EXAMPLES)
def test_example_runs_as_shown(path, line, code, reason, tmp_path):
    if reason is not None:
        assert len(reason) > 10, f"{path.name}:{line}: say why the example is not run"
        return  # documented as not run, with the reason; nothing to execute
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HERMES_HOME": str(home)}
    env.pop("HERMES_STATE_DB_GUARD_BYPASS", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{path.name}:{line} failed:\n{done.stderr[-3000:]}"
    # What an example says it prints (`print(...)  # prints: TEXT`, one line each) is what it printed.
    shown = _PRINTS.findall(code)
    if shown:
        assert done.stdout.splitlines() == shown, f"{path.name}:{line} printed something else:\n{done.stdout}"


_PRINTS = re.compile(r"^\s*print\(.*\)\s*# prints: (.*)$", re.MULTILINE)


def test_shell_blocks_say_why_they_are_not_run():
    # A shell block installs, serves or touches a real home: each one says so rather than silently not running.
    for path in DOCS:
        for line, language, _, reason in code_blocks(path):
            if language in ("sh", "bash", "shell", "console"):
                assert reason, f"{path.name}:{line}: a shell block needs <!-- not run: REASON --> or to be Python"


# --- the transcript of docs/cli.md ---------------------------------------------------------------

TRANSCRIPT = [
    "demo --keep",
    "sessions list",
    "sessions show demo_docker",
    "sessions show demo_docker_2 --full",
    "sessions show demo_t",
    "sessions show demo_d",
    "sessions search 東京",
    "sessions search ocker --role user -n 5",
    "sessions search docker -dockerfile",
    "sessions search compiler",
    "sessions search compiler --reasoning",
    "sessions stats",
    "sessions prune --older-than 0 --dry-run",
    "sessions delete demo_docker --dry-run",
    "sessions delete demo_docker_2 --dry-run",
    "doctor",
    "sessions show nope",
    "sessions list --limit -1",
    "sessions lst",
    "sessions list --limt 5",
]
_BEGIN, _END = "<!-- transcript: begin -->\n", "<!-- transcript: end -->"


def run_transcript() -> str:
    """Run the transcript's commands on a fresh demo home; return what a terminal-less run prints."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "HERMES_HOME": str(Path(scratch) / "unused"), "COLUMNS": "100", "LC_ALL": "C.UTF-8"}
        env.pop("NO_COLOR", None)
        parts, home = [], None
        for command in TRANSCRIPT:
            argv = [sys.executable, "-m", "hermes_state_cli", *shlex.split(command)]
            done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=120)
            out = done.stdout
            if home is None:
                home = re.search(r"HERMES_HOME=(\S+)", out).group(1)
                env["HERMES_HOME"] = home
            parts.append(f"$ hermes-state {command}\n{out}" + (f"[exit {done.returncode}]\n" if done.returncode else ""))
        import shutil
        shutil.rmtree(home, ignore_errors=True)
    return "".join(parts).replace(home, "/tmp/hermes-demo-XXXX")


def comparable(text: str) -> str:
    """Return the transcript with what changes between runs masked: times, ages, temporary homes."""
    text = re.sub(r"/tmp/hermes-demo-\w+", "<home>", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<when>", text)
    text = re.sub(r"\b\d\d:\d\d:\d\d\b", "<clock>", text)
    text = re.sub(r"\b\d+ (s|min|h) ago\b|\byesterday\b|\b\d+ days ago\b", "<ago>", text)
    text = re.sub(r"^(ok|warn) +sqlite .*$", "<the linked SQLite>", text, flags=re.MULTILINE)  # per Python build
    return "\n".join(re.sub(r" {2,}", "  ", line).rstrip() for line in text.splitlines())


def documented_transcript() -> str:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    block = text[start:end].strip("\n")
    assert block.startswith("````text\n") and block.endswith("\n````")
    return block[len("````text\n"):-len("````")]


def test_the_cli_transcript_is_what_the_commands_print():
    assert comparable(documented_transcript()) == comparable(run_transcript()), (
        "docs/cli.md's transcript is out of date: run `python tests/test_cli_docs.py` to write it again")


def write_transcript() -> None:
    """Write a fresh transcript into docs/cli.md."""
    path = ROOT / "docs" / "cli.md"
    text = path.read_text(encoding="utf-8")
    start, end = text.index(_BEGIN) + len(_BEGIN), text.index(_END)
    path.write_text(text[:start] + "````text\n" + run_transcript() + "````\n" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    write_transcript()
