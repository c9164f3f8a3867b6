"""One state.db, hermes-state and the real hermes-agent 0.20.1: what the newer release stores is read and kept.

hermes-agent 0.20.1 files each system prompt once in `system_prompts` under the SHA-256 of its
text and leaves `sessions.system_prompt` NULL; it adds seven `sessions` columns, three tables and
its own full-text objects; on a SQLite with the WAL-reset bug (or when configured to) it makes
new files in rollback-journal mode. It runs in its own venv (tests/agent_releases.py says where
it is found), driven through its public SessionDB API.
"""
from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from agent_releases import AGENT_019, AGENT_020
from hermes_state import SessionDB, recover
from hermes_state_errors import StateDbIncompatibleError

pytestmark = pytest.mark.hermes_agent

LIB_PROMPT = "You are hermes-state's assistant. 日本語で答えてください。"
LIB_PROMPT_2 = "You are hermes-state's assistant, second edition."
AGENT_PROMPT = "You are hermes-agent 0.20's assistant. 中文也可以。"
AGENT_PROMPT_2 = "You are hermes-agent 0.20's assistant, revised."
# The seven sessions columns hermes-agent 0.20 adds, and values its own API writes into them.
NEWER_COLUMNS = ("system_prompt_hash", "git_metadata_generation", "last_activity_description",
                 "last_activity_provenance", "compression_ineffective_count", "hidden", "last_read_at")


@pytest.fixture(autouse=True)
def need_agent():
    AGENT_020.require()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_of(sid: str) -> list:
    return ["call", "get_session", [sid], None, ["system_prompt"]]


def raw(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return [tuple(r) for r in conn.execute(sql, params)]


def filed_prompts(path: Path) -> dict[str, str]:
    return dict(raw(path, "SELECT hash, prompt FROM system_prompts"))


def agent_session_with_everything(path: Path, sid: str = "ag-1") -> list:
    """Have hermes-agent 0.20 make a session and fill each of its newer columns through its own API."""
    return AGENT_020.run(
        path, ["call", "create_session", [sid, "telegram"], {"model": "gpt-x", "system_prompt": AGENT_PROMPT}],
        ["call", "append_message", [sid, "user", "the agent's message about 大阪"]],
        ["call", "set_session_hidden", [sid, True]], ["call", "set_session_read", [sid, True]],
        ["call", "touch_session_activity", [sid], {"description": "executing tool"}],
        ["call", "update_session_cwd", [sid, "/work/repo"], {"git_branch": "main"}],
        ["call", "set_compression_ineffective_count", [sid, 3]],
        ["call", "increment_hygiene_failure_streak", ["chat-key-1"]],
        ["call", "try_acquire_session_turn_lease", [sid, "holder-a"]])


def newer_columns(path: Path, sid: str) -> dict:
    names = ", ".join(NEWER_COLUMNS)
    return dict(zip(NEWER_COLUMNS, raw(path, f"SELECT {names} FROM sessions WHERE id = ?", (sid,))[0]))


# --- system prompts ---------------------------------------------------------------------------------

def test_prompts_each_program_writes_are_read_by_the_other_on_a_file_the_library_made(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("lib-1", "cli", system_prompt=LIB_PROMPT)
        db.create_session("lib-2", "cli")
        db.update_system_prompt("lib-2", LIB_PROMPT)
        db.append_message("lib-1", "user", "hello from the library")
    assert filed_prompts(path) == {sha256(LIB_PROMPT): LIB_PROMPT}  # filed once, as the agent would

    got = AGENT_020.run(path, prompt_of("lib-1"), prompt_of("lib-2"),
                        ["call", "create_session", ["ag-1", "cli"], {"system_prompt": AGENT_PROMPT}],
                        ["call", "update_system_prompt", ["lib-2", AGENT_PROMPT_2]])
    assert got[0] == got[1] == {"system_prompt": LIB_PROMPT}
    # The agent stored its prompts by hash alone.
    assert raw(path, "SELECT id, system_prompt, system_prompt_hash FROM sessions WHERE id IN ('ag-1', 'lib-2') "
               "ORDER BY id") == [("ag-1", None, sha256(AGENT_PROMPT)), ("lib-2", None, sha256(AGENT_PROMPT_2))]

    with SessionDB(path) as db:
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
        assert db.get_session("lib-2")["system_prompt"] == AGENT_PROMPT_2
        assert {r["id"]: r["system_prompt"] for r in db.list_sessions_rich(limit=10)} == {
            "ag-1": AGENT_PROMPT, "lib-2": AGENT_PROMPT_2, "lib-1": LIB_PROMPT}
        assert {r["id"]: r["system_prompt"] for r in db.search_sessions()} == {
            "ag-1": AGENT_PROMPT, "lib-2": AGENT_PROMPT_2, "lib-1": LIB_PROMPT}
        assert db.export_session("ag-1")["session"]["system_prompt"] == AGENT_PROMPT
        # A repeated create fills only an empty prompt: the agent's, stored by hash, is not empty.
        db.create_session("ag-1", "cli", system_prompt="a later create must not replace it")
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
        db.update_system_prompt("ag-1", LIB_PROMPT_2)  # over a hash the agent wrote
    # Each release reads the prompt the library wrote last: 0.20 by its hash, 0.19 by the column.
    assert AGENT_020.run(path, prompt_of("ag-1"), prompt_of("lib-1")) == [
        {"system_prompt": LIB_PROMPT_2}, {"system_prompt": LIB_PROMPT}]
    assert AGENT_019.run(path, prompt_of("ag-1"), prompt_of("lib-1")) == [
        {"system_prompt": LIB_PROMPT_2}, {"system_prompt": LIB_PROMPT}]
    # A prompt no session names any more is not kept: the agent's replaced one, then lib-1's with it.
    assert set(filed_prompts(path)) == {sha256(LIB_PROMPT), sha256(LIB_PROMPT_2), sha256(AGENT_PROMPT_2)}
    with SessionDB(path) as db:
        db.delete_session("lib-1")
        db.update_system_prompt("lib-2", None)
        assert db.get_session("lib-2")["system_prompt"] is None
    assert filed_prompts(path) == {sha256(LIB_PROMPT_2): LIB_PROMPT_2}
    assert AGENT_020.run(path, prompt_of("lib-2")) == [{"system_prompt": None}]


def test_prompts_on_a_file_the_agent_made_are_read_and_written_both_ways(tmp_path):
    path = tmp_path / "state.db"
    AGENT_020.run(path, ["call", "create_session", ["ag-1", "cli"], {"system_prompt": AGENT_PROMPT}],
                  ["call", "create_session", ["ag-2", "cli"], {"parent_session_id": "ag-1"}],
                  ["call", "update_system_prompt", ["ag-2", AGENT_PROMPT]],
                  ["call", "append_message", ["ag-2", "user", "continue"]])
    with SessionDB(path) as db:
        assert [s["system_prompt"] for s in db.get_lineage("ag-2")] == [AGENT_PROMPT, AGENT_PROMPT]
        assert db.get_session("ag-2")["system_prompt_hash"] == sha256(AGENT_PROMPT)
        db.create_session("lib-1", "cli", system_prompt=LIB_PROMPT)
        db.update_system_prompt("ag-2", LIB_PROMPT_2)
    assert AGENT_020.run(path, prompt_of("lib-1"), prompt_of("ag-2"), prompt_of("ag-1")) == [
        {"system_prompt": LIB_PROMPT}, {"system_prompt": LIB_PROMPT_2}, {"system_prompt": AGENT_PROMPT}]


# --- the newer release's columns and tables in copies --------------------------------------------------

def test_a_backup_of_a_file_the_agent_used_restores_and_a_lookalike_object_is_still_refused(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("lib-1", "cli", system_prompt=LIB_PROMPT)
        db.append_message("lib-1", "user", "before the backup")
    agent_session_with_everything(path)
    backup = tmp_path / "copy.db"
    with SessionDB(path) as db:
        db.backup(backup)
        db.append_message("lib-1", "user", "after the backup")
        db.restore(backup)
        assert [m["content"] for m in db.get_messages("lib-1")] == ["before the backup"]
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
    assert newer_columns(path, "ag-1")["hidden"] == 1
    assert AGENT_020.run(path, prompt_of("ag-1"))[0] == {"system_prompt": AGENT_PROMPT}

    # The agent's view, but reading every role: not what the agent defines, so not accepted.
    lookalike = tmp_path / "lookalike.db"
    with SessionDB(path) as db:
        db.backup(lookalike)
    with closing(sqlite3.connect(lookalike)) as conn:
        conn.execute("DROP VIEW messages_fts_trigram_src")
        conn.execute("CREATE VIEW messages_fts_trigram_src AS SELECT id, role, content, tool_name, tool_calls "
                     "FROM messages")
        conn.commit()
    planted = tmp_path / "planted.db"
    with SessionDB(path) as db:
        db.backup(planted)
    with closing(sqlite3.connect(planted)) as conn:
        conn.execute("DROP TRIGGER IF EXISTS messages_fts_cjk_insert")  # a name the agent's CJK index uses
        conn.execute("CREATE TRIGGER messages_fts_cjk_insert AFTER INSERT ON messages BEGIN "
                     "DELETE FROM sessions WHERE id = new.session_id; END")
        conn.commit()
    with SessionDB(path) as db:
        with pytest.raises(StateDbIncompatibleError, match="view 'messages_fts_trigram_src'"):
            db.restore(lookalike)
        with pytest.raises(StateDbIncompatibleError, match="trigger 'messages_fts_cjk_insert'"):
            db.restore(planted)
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT  # nothing was restored


def test_recover_keeps_the_newer_columns_and_tables(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("lib-1", "cli", system_prompt=LIB_PROMPT)
    agent_session_with_everything(path)
    before = newer_columns(path, "ag-1")
    assert before["hidden"] == 1 and before["last_read_at"] and before["compression_ineffective_count"] == 3

    target = tmp_path / "recovered.db"
    report = recover(path, target)
    assert report.complete and "sessions" not in report.dropped_columns
    assert set(report.excluded) == {"runtime_epoch", "session_admissions", "worker_executions", "worker_receipts"}
    assert newer_columns(target, "ag-1") == before
    assert filed_prompts(target) == filed_prompts(path)
    assert raw(target, "SELECT * FROM gateway_hygiene_state") == [("chat-key-1", 1)]
    assert raw(target, "SELECT conversation_id, holder FROM session_turn_leases") == [("ag-1", "holder-a")]
    with SessionDB(target) as db:
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
        assert db.get_session("lib-1")["system_prompt"] == LIB_PROMPT
    assert AGENT_020.run(target, prompt_of("ag-1"), ["call", "get_session_activity", ["ag-1"], None,
                                                     ["last_activity_description"]]) == [
        {"system_prompt": AGENT_PROMPT}, {"last_activity_description": "executing tool"}]


def test_export_and_import_carry_the_newer_columns_and_the_prompt(tmp_path):
    path = tmp_path / "state.db"
    agent_session_with_everything(path)
    with SessionDB(path) as db:
        document = db.export_session("ag-1")
    assert document["session"]["system_prompt"] == AGENT_PROMPT
    assert {k: document["session"][k] for k in NEWER_COLUMNS} == newer_columns(path, "ag-1")

    other = tmp_path / "other" / "state.db"
    other.parent.mkdir()
    with SessionDB(other) as db:
        db.import_sessions([document])
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
        assert db.export_session("ag-1")["session"] == document["session"]
    assert newer_columns(other, "ag-1") == newer_columns(path, "ag-1")
    assert filed_prompts(other) == {sha256(AGENT_PROMPT): AGENT_PROMPT}
    assert AGENT_020.run(other, prompt_of("ag-1"), ["call", "list_sessions_rich", [], {"include_hidden": True},
                                                    ["id", "hidden"]]) == [
        {"system_prompt": AGENT_PROMPT}, [{"id": "ag-1", "hidden": 1}]]


# --- the file's journal mode --------------------------------------------------------------------------

def test_a_rollback_journal_file_the_agent_made_keeps_its_mode_and_both_use_it(tmp_path, caplog):
    path = tmp_path / "state.db"
    # What the agent does on a SQLite with the WAL-reset bug; its config asks for it on any SQLite.
    (tmp_path / "config.yaml").write_text("database:\n  journal_mode: delete\n")
    AGENT_020.run(path, ["call", "create_session", ["ag-1", "cli"], {"system_prompt": AGENT_PROMPT}],
                  ["call", "append_message", ["ag-1", "user", "rollback journal 東京"]])
    assert raw(path, "PRAGMA journal_mode") == [("delete",)]

    with caplog.at_level("INFO", logger="hermes_state"), SessionDB(path) as db:
        assert db.get_session("ag-1")["system_prompt"] == AGENT_PROMPT
        db.append_message("ag-1", "assistant", "the library answers")
        db.create_session("lib-1", "cli", system_prompt=LIB_PROMPT)
        db.append_message("lib-1", "user", "a library session")
        assert [m["content"] for m in db.get_messages("ag-1")] == ["rollback journal 東京", "the library answers"]
        assert db.check_integrity(full=True)["ok"]
    assert any("journal_mode=delete" in r.getMessage() for r in caplog.records)
    assert raw(path, "PRAGMA journal_mode") == [("delete",)]
    assert not Path(f"{path}-wal").exists()

    got = AGENT_020.run(path, ["call", "get_messages", ["ag-1"], None, ["content"]], prompt_of("lib-1"),
                        ["call", "append_message", ["lib-1", "assistant", "the agent again"]])
    assert got[0] == [{"content": "rollback journal 東京"}, {"content": "the library answers"}]
    assert got[1] == {"system_prompt": LIB_PROMPT}
    assert raw(path, "PRAGMA journal_mode") == [("delete",)]
    with SessionDB(path) as db:
        assert [m["content"] for m in db.get_messages("lib-1")] == ["a library session", "the agent again"]
    assert raw(path, "PRAGMA journal_mode") == [("delete",)]
