"""One state.db, two programs: hermes-state and the real hermes-agent 0.19.0 on the same file.

hermes-agent runs in its own virtual environment, as a black box driven through its public
SessionDB API (tests/hermes_agent_driver.py). The tests find its interpreter in the environment
variable HERMES_AGENT_PYTHON, else in bench/.venvs/hermes-agent (which .ci/run and bench/run.py
create). Without either they are skipped, saying so; with HERMES_STATE_REQUIRE_AGENT=1 (as in
CI) a missing agent is a failure instead. Select them with `pytest -m hermes_agent`.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import threading
from pathlib import Path

import pytest

from agent_releases import AGENT_019
from hermes_state import SessionDB
from hermes_state_cli import main as cli_main

pytestmark = pytest.mark.hermes_agent

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "hermes_agent_driver.py"
AGENT_FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"
UID = re.compile(r"[0-9a-f]{32}")
TOOL_CALL = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Osaka\"}"}}]


AGENT_PYTHON = AGENT_019.python


@pytest.fixture(autouse=True)
def need_agent():
    AGENT_019.require()


def _agent_env(path: Path) -> dict[str, str]:
    return dict(os.environ, HERMES_HOME=str(path.parent), PYTHONPATH="")


def agent(path: Path, *ops: list) -> list:
    """Run `ops` through hermes-agent's SessionDB on `path` and return their results; any raw error fails."""
    proc = subprocess.run([str(AGENT_PYTHON), str(DRIVER), str(path)], input=json.dumps(ops), capture_output=True,
                          text=True, timeout=120, env=_agent_env(path), cwd=path.parent)
    assert proc.returncode == 0, f"hermes-agent failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def agent_start(path: Path, *ops: list) -> subprocess.Popen:
    """Start hermes-agent on `ops` without waiting; finish with agent_wait."""
    proc = subprocess.Popen([str(AGENT_PYTHON), str(DRIVER), str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_agent_env(path),
                            cwd=path.parent)
    proc.stdin.write(json.dumps(ops))
    proc.stdin.close()
    return proc


def agent_wait(proc: subprocess.Popen) -> list:
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.wait(timeout=120) == 0, f"hermes-agent failed:\n{err[-3000:]}"
    return json.loads(out)


def fts_objects(path: Path) -> dict[str, str]:
    """The full-text tables and every trigger, as the catalogue stores them."""
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' OR "
                                 "(type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE%')"))
    finally:
        conn.close()


def assert_healthy(path: Path) -> None:
    """integrity_check passes, and FTS5's integrity-check of every index (against its content, if external)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE sql LIKE '%USING fts5%'")]
        assert tables
        for table in tables:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
    finally:
        conn.close()


def assert_uids_and_counters(db: SessionDB) -> None:
    """Every message has its own uid; every session's counters equal what its rows say."""
    conn = sqlite3.connect(db.db_path)
    try:
        uids = [r[0] for r in conn.execute("SELECT message_uid FROM messages")]
        assert uids and all(u is not None and UID.fullmatch(u) for u in uids) and len(set(uids)) == len(uids)
        wrong = conn.execute(
            "SELECT s.id, s.message_count, (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id), "
            "s.tool_call_count, (SELECT COALESCE(SUM(json_array_length(m.tool_calls)), 0) FROM messages m "
            "WHERE m.session_id = s.id AND m.role = 'assistant' AND json_valid(m.tool_calls)) FROM sessions s").fetchall()
        assert [r for r in wrong if (r[1], r[3]) != (r[2], r[4])] == []
    finally:
        conn.close()


def hits(db: SessionDB, query: str) -> list[str]:
    return sorted({h["session_id"] for h in db.search_messages(query, limit=100)})


@pytest.fixture
def no_background(monkeypatch):
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)


# --- a file hermes-state made ----------------------------------------------------------------------

def test_a_fresh_hermes_state_file_is_read_written_and_searched_by_the_agent(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("hs-1", "cli")
        db.append_message("hs-1", "user", "東京で会議: the quarterly budget review")
        db.append_message("hs-1", "assistant", "checking", tool_calls=TOOL_CALL)
        db.append_message("hs-1", "tool", "sunny in Osaka", tool_call_id="call_1", tool_name="weather")
        db.set_session_title("hs-1", "Budget")
    ours = fts_objects(path)

    got = agent(path, ["messages", "hs-1"], ["session", "hs-1"], ["search", "quarterly"], ["search", "東京で"],
                ["search", "東京で会議"], ["append", "hs-1", "user", "the agent adds quarterly numbers"],
                ["create", "ag-1", "telegram"], ["append", "ag-1", "user", "agent-only 大阪の天気 forecast"],
                ["append", "ag-1", "assistant", "on it", {"tool_calls": TOOL_CALL}], ["title", "ag-1", "Weather"],
                ["tokens", "ag-1", "gpt-x", 10, 5], ["search", "quarterly"], ["search", "forecast"], ["sessions"])
    messages, session, word, cjk3, cjk5, *_, after_word, own, sessions = got
    assert messages == [["user", "東京で会議: the quarterly budget review"], ["assistant", "checking"],
                        ["tool", "sunny in Osaka"]]
    assert session["title"] == "Budget" and session["message_count"] == 3 and session["tool_call_count"] == 1
    assert word == cjk3 == cjk5 == after_word == ["hs-1"] and own == ["ag-1"]
    assert sessions == ["ag-1", "hs-1"]
    # hermes-agent found every trigger and index it looks for: it created and rebuilt none of its own.
    assert fts_objects(path) == ours

    with SessionDB(path) as db:
        assert [m["content"] for m in db.get_messages("hs-1")][-1] == "the agent adds quarterly numbers"
        assert db.get_session("ag-1")["title"] == "Weather" and db.get_session("hs-1")["message_count"] == 4
        assert hits(db, "quarterly") == ["hs-1"] and hits(db, "大阪") == ["ag-1"] and hits(db, "only 大阪") == ["ag-1"]
        assert hits(db, "forecast") == hits(db, "orecas") == ["ag-1"]
        assert hits(db, "Osaka") == ["ag-1", "hs-1"]  # a tool call's arguments, from either program
        assert_uids_and_counters(db)
        db.append_message("ag-1", "user", "hermes-state answers in the agent's session")
        assert db.check_integrity(full=True)["ok"]
    assert agent(path, ["messages", "ag-1"], ["search", "answers"])[1] == ["ag-1"]
    assert fts_objects(path) == ours
    assert_healthy(path)


# --- a file hermes-agent made, then upgraded ----------------------------------------------------------

def test_a_fresh_agent_file_is_upgraded_and_shared_both_ways(tmp_path, no_background):
    path = tmp_path / "state.db"
    agent(path, ["create", "ag-1", "cli"], ["append", "ag-1", "user", "deploy the staging cluster 東京"],
          ["append", "ag-1", "assistant", "deploying", {"tool_calls": TOOL_CALL, "reasoning": "think first"}],
          ["tokens", "ag-1", "gpt-x", 100, 20], ["title", "ag-1", "Deploy"])
    with SessionDB(path, backup_before_upgrade=False) as db:
        assert db.get_session("ag-1")["title"] == "Deploy"
        assert hits(db, "staging") == ["ag-1"]  # found by a bounded scan before the rebuild
        db.rebuild_fts()
        assert hits(db, "staging") == hits(db, "東京") == hits(db, "tagin") == ["ag-1"]
        db.append_message("ag-1", "user", "hermes-state follows up on staging")
        db.create_session("hs-1", "cli")
        db.append_message("hs-1", "user", "a hermes-state only conversation about kubernetes")
        db.update_token_counts("hs-1", input_tokens=7, output_tokens=3, model="gpt-x")
        assert_uids_and_counters(db)
    ours = fts_objects(path)
    got = agent(path, ["messages", "hs-1"], ["search", "kubernetes"], ["search", "staging"],
                ["append", "hs-1", "user", "agent joins the kubernetes talk"], ["tokens", "hs-1", "gpt-x", 1, 1],
                ["session", "ag-1"])
    assert got[0] == [["user", "a hermes-state only conversation about kubernetes"]]
    assert got[1] == ["hs-1"] and got[2] == ["ag-1"] and got[5]["message_count"] == 3
    assert fts_objects(path) == ours
    with SessionDB(path) as db:
        assert hits(db, "kubernetes") == ["hs-1"] and db.get_session("hs-1")["message_count"] == 2
        assert db.get_session("hs-1")["input_tokens"] == 8
        assert_uids_and_counters(db)
    assert_healthy(path)


def test_the_agents_own_upgraded_history_stays_usable_by_the_agent(tmp_path, no_background):
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_FIXTURE.read_bytes()))
    before = agent(path, ["messages", "agent-00000"], ["session", "agent-00001"])
    with SessionDB(path, backup_before_upgrade=False) as db:
        db.rebuild_fts()
        db.append_message("agent-00001", "user", "hermes-state writes into an agent session")
    after = agent(path, ["messages", "agent-00000"], ["session", "agent-00001"], ["search", "部署"],
                  ["append", "agent-00001", "user", "and the agent answers"], ["search", "answers"])
    assert after[0] == before[0]
    assert after[1]["message_count"] == before[1]["message_count"] + 1
    assert after[2] == ["agent-00000", "agent-00001"] and after[4] == ["agent-00001"]
    with SessionDB(path) as db:
        assert hits(db, "answers") == ["agent-00001"]
        assert_uids_and_counters(db)
    assert_healthy(path)


def test_the_agent_works_on_while_the_old_index_is_being_freed(tmp_path, monkeypatch):
    import hermes_state_upgrade as upgrade
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_FIXTURE.read_bytes()))
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN")  # an old index worth freeing in many turns
    for n in range(100):
        raw.execute("INSERT INTO messages_fts_trigram(rowid, content) VALUES (?, ?)",
                    (50_000 + n, " ".join(f"filler{n}x{k}" for k in range(300))))
    raw.execute("COMMIT")
    raw.close()
    monkeypatch.setattr(upgrade, "CLEAR_CHUNK_S", 0.0)  # one row per transaction: still at it below
    monkeypatch.setattr(upgrade, "CLEAR_BATCH_ROWS", 1)
    monkeypatch.setattr(upgrade, "FREE_RESERVE_BYTES", 0)  # and nothing freed ahead of the new indexes
    monkeypatch.setattr(upgrade, "UPGRADE_BYTES_PER_MESSAGE", 0)
    db = SessionDB(path, backup_before_upgrade=False)
    try:
        conn = sqlite3.connect(path)
        assert upgrade.retired_tables(conn) != []
        conn.close()
        got = agent(path, ["append", "agent-00001", "user", "the agent writes while the old index is freed"],
                    ["search", "freed"], ["session", "agent-00001"])
        assert got[1] == ["agent-00001"]
        conn = sqlite3.connect(path)
        assert upgrade.retired_tables(conn) != []  # it ran while the tables were still there
        conn.close()
    finally:
        db.close()
    monkeypatch.undo()
    with SessionDB(path) as db:
        assert db.wait_for_fts_rebuild(120)
        assert hits(db, "freed") == ["agent-00001"]
        assert db.get_session("agent-00001")["message_count"] == got[2]["message_count"]
        assert_uids_and_counters(db)
    conn = sqlite3.connect(path)
    assert upgrade.retired_tables(conn) == []
    conn.close()
    assert agent(path, ["search", "freed"]) == [["agent-00001"]]
    assert_healthy(path)


@pytest.mark.parametrize("hex_text", ["E69DB1E4BAAC20FF", "EDA080", "E69DB1E4BAAC20EDA080E383"],
                         ids=["stray_byte", "lone_surrogate", "mixed"])
def test_an_agent_file_with_a_message_that_is_not_utf8_finishes_its_rebuild(tmp_path, hex_text):
    # Another program stored the text as TEXT that is not UTF-8, in a file the agent made: the upgrade's
    # rebuild indexes it like any other row, frees the older layout's index, and both programs search.
    import hermes_state_fts as fts
    import hermes_state_upgrade as upgrade
    path = tmp_path / "state.db"
    ops: list = [["create", "ag-1", "cli"], ["create", "ag-2", "telegram"]]
    for n in range(30):
        ops.append(["append", f"ag-{1 + n % 2}", "user" if n % 3 else "assistant",
                    f"turn {n}: deploy the 部署 pipeline" if n % 2 else f"turn {n}: 東京 weather report"])
    agent(path, *ops)
    raw = sqlite3.connect(path, isolation_level=None)
    poisoned = raw.execute("SELECT MAX(id) FROM messages WHERE content LIKE '%deploy%'").fetchone()[0]
    raw.execute(f"UPDATE messages SET content = CAST(x'{hex_text}' AS TEXT) WHERE id = ?", (poisoned,))
    deploys = sorted(r[0] for r in raw.execute("SELECT id FROM messages WHERE content LIKE '%deploy%'"))
    raw.close()
    assert len(deploys) == 14
    with SessionDB(path, backup_before_upgrade=False) as db:
        assert db.wait_for_fts_rebuild(120)
        status = db.fts_rebuild_status()
        assert status["in_progress"] is False and status["indexed"] == status["total"] == 30
        assert sorted(h["id"] for h in db.search_messages("deploy", limit=100)) == deploys
        assert sorted(h["id"] for h in db.search_messages("部署", limit=100)) == deploys
        assert len(db.search_messages("東京", limit=100)) == 15 + ("E69DB1" in hex_text)
        db.rebuild_fts()
        assert sorted(h["id"] for h in db.search_messages("部署", limit=100)) == deploys
    conn = sqlite3.connect(path)
    assert upgrade.retired_tables(conn) == []
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (fts.OLD_SUBSTRINGS,)).fetchone() is None
    conn.close()
    found = agent(path, ["call", "search_messages", ["deploy"], {"limit": 100}, "ids"],
                  ["call", "search_messages", ["部署"], {"limit": 100}, "ids"])
    assert [sorted(ids) for ids in found] == [deploys, deploys]
    assert_healthy(path)


# --- both at once -------------------------------------------------------------------------------------

def test_the_merge_after_a_move_in_ends_and_stays_shallow_while_the_agent_appends(tmp_path, no_background,
                                                                                  fts_levels):
    import hermes_state_fts as fts
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_FIXTURE.read_bytes()))
    db = SessionDB(path, backup_before_upgrade=False)
    rival = sqlite3.connect(path, isolation_level=None)
    try:
        more = True
        while more:
            with db.transaction() as txn:
                more = fts.rebuild_step(txn.conn, 10)  # small chunks: many segments to merge, as on a large file
        agent(path, ["create", "ag-trickle", "cli"])
        last = rival.execute("SELECT MAX(id) FROM messages").fetchone()[0]
        proc = agent_start(path, ["appends", "ag-trickle", 120, "agent trickle", 0.01])  # each indexed at once
        steps, deepest = 0, 0
        while more or steps == 0:
            while proc.poll() is None:  # one merge step after each row the agent adds
                newest = rival.execute("SELECT MAX(id) FROM messages").fetchone()[0]
                if newest != last:
                    last = newest
                    break
            with db.transaction() as txn:
                more = fts.merge_step(txn.conn, 2)
            steps += 1
            deepest = max(deepest, *(fts_levels(rival, t)[0] for t in fts.FTS_TABLES))
            assert deepest <= 16, f"{deepest} levels after {steps} merge steps"
            assert steps < 5000, "the merge never ended"
        agent_wait(proc)
        assert hits(db, "trickle") == ["ag-trickle"]
        assert len(db.search_messages("trickle", limit=1000)) == 120
    finally:
        rival.close()
        db.close()
    got = agent(path, ["search", "trickle"], ["append", "ag-trickle", "user", "one more"], ["session", "ag-trickle"])
    assert got[0] == ["ag-trickle"] and got[2]["message_count"] == 121
    assert_healthy(path)


def test_an_open_handle_keeps_writing_while_the_agent_starts_and_writes(tmp_path):
    path = tmp_path / "state.db"
    db = SessionDB(path)
    try:
        db.create_session("gw", "telegram")
        db.append_message("gw", "user", "first words from the gateway")
        agent(path, ["create", "ag-1", "cli"], ["append", "ag-1", "user", "the agent starts while the gateway runs"])
        db.append_message("gw", "user", "the gateway writes on after the agent started")
        assert hits(db, "gateway") == ["ag-1", "gw"]
        # Then both write at the same time: the agent 40 messages, the handle 40 more.
        proc = agent_start(path, ["appends", "ag-1", 40, "agent turn", 0.002], ["messages", "ag-1"])
        errors: list[BaseException] = []

        def ours() -> None:
            try:
                for n in range(40):
                    db.append_message("gw", "assistant", f"gateway turn {n}")
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
        writer = threading.Thread(target=ours)
        writer.start()
        seen = agent_wait(proc)
        writer.join(60)
        assert errors == [] and len(seen[1]) == 41
        assert len(db.get_messages("gw")) == 42 and len(db.get_messages("ag-1")) == 41
        assert len(hits(db, "turn")) == 2
        assert db.get_session("ag-1")["message_count"] == 41
        assert db.check_integrity(full=True)["ok"]
    finally:
        db.close()
    with SessionDB(path) as again:
        assert_uids_and_counters(again)
    assert_healthy(path)


# --- browsing an agent's file without changing it ----------------------------------------------------

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_telegram_topic_bindings_are_shared_and_one_topic_per_session_holds_in_both(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        for sid in ("ours", "theirs", "free"):
            db.create_session(sid, "telegram", user_id="u1")
        db.bind_telegram_topic(chat_id="c1", thread_id="1", user_id="u1", session_key="key-1", session_id="ours")
    found, refused, bound, unlinked = agent(path, ["topic", "c1", "1"], ["bind_topic", "c1", "2", "u1", "ours"],
                                            ["bind_topic", "c1", "2", "u1", "theirs"], ["unlinked", "c1", "u1"])
    assert found["session_id"] == "ours" and found["session_key"] == "key-1"
    assert "already linked" in refused and bound is None and unlinked == ["free"]
    with SessionDB(path) as db:
        assert db.get_telegram_topic_binding(chat_id="c1", thread_id="2")["session_id"] == "theirs"
        with pytest.raises(ValueError, match="already linked"):
            db.bind_telegram_topic(chat_id="c1", thread_id="3", user_id="u1", session_key="k", session_id="theirs")
        assert [s["id"] for s in db.list_unlinked_telegram_sessions_for_user(chat_id="c1", user_id="u1")] == ["free"]


def test_topic_tables_the_agent_made_are_read_as_they_are(tmp_path):
    path = tmp_path / "state.db"
    agent(path, ["create_for", "s1", "telegram", "u1"], ["bind_topic", "c1", "7", "u1", "s1"])
    with sqlite3.connect(path) as conn:
        before = sorted(conn.execute("SELECT name, sql FROM sqlite_master WHERE name LIKE '%telegram%'"))
    with SessionDB(path) as db:
        assert db.get_telegram_topic_binding(chat_id="c1", thread_id="7")["session_id"] == "s1"
        db.apply_telegram_topic_migration()  # the same tables: nothing to add
        assert db.get_meta("telegram_dm_topic_schema_version") == "2"
    with sqlite3.connect(path) as conn:
        assert sorted(conn.execute("SELECT name, sql FROM sqlite_master WHERE name LIKE '%telegram%'")) == before


def test_browsing_an_agent_file_changes_no_byte_of_it(tmp_path, capsys):
    path = tmp_path / "state.db"
    agent(path, ["create", "ag-1", "cli"], ["append", "ag-1", "user", "browse me: the release checklist 東京"],
          ["append", "ag-1", "assistant", "sure", {"tool_calls": TOOL_CALL}], ["title", "ag-1", "Release"],
          ["tokens", "ag-1", "gpt-x", 10, 2], ["end", "ag-1", "user_exit"])
    before = _digest(path)
    with SessionDB(path, read_only=True) as db:
        assert db.schema_version == 22
        assert [s["id"] for s in db.list_sessions()] == ["ag-1"]
        assert db.get_session("ag-1")["pinned"] == 0  # a column the agent's file lacks reads as its default
        assert hits(db, "checklist") == hits(db, "東京") == hits(db, "eckli") == ["ag-1"]
        assert len(db.export_session("ag-1")["messages"]) == 2
    for args in (["sessions", "list"], ["sessions", "show", "ag-1"], ["sessions", "search", "checklist"],
                 ["sessions", "stats"], ["sessions", "export"]):
        assert cli_main(["--db", str(path), *args]) == 0, args
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "ag-1" in out, (args, out, err)
    assert _digest(path) == before
    pages = _browse(path, "/-/hermes/state", "/-/hermes/state/session/ag-1", "/-/hermes/state/search?q=checklist",
                    "/-/hermes/state/search?q=Release", "/state/sessions.json")
    assert [p.status_code for p in pages] == [200] * 5
    assert "Release" in pages[0].text and "Release" in pages[1].text and "checklist" in pages[2].text
    assert "ag-1" in pages[3].text
    assert _digest(path) == before


def _browse(path: Path, *urls: str) -> list:
    """GET `urls` from `hermes-state serve`'s app (Datasette with this library's plugin) on `path`."""
    import asyncio
    from datasette.app import Datasette

    async def run():
        ds = Datasette([str(path)])
        await ds.invoke_startup()
        return [await ds.client.get(url) for url in urls]
    return asyncio.run(run())
