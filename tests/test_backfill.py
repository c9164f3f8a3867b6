"""The ladder's data steps: subagent markers, usage seeded from totals, rows with no active flag."""
from __future__ import annotations

import json
import sqlite3

import pytest

import hermes_state_schema as schema
from hermes_state import SessionDB, recover


def set_version(path, version: int) -> None:
    """Make a store look as if an older release had written it last."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (version,))


def configs(conn) -> dict[str, object]:
    return {r[0]: (json.loads(r[1]) if r[1] and r[1].startswith("{") else r[1])
            for r in conn.execute("SELECT id, model_config FROM sessions")}


# --- subagent markers ---------------------------------------------------------------------------------

@pytest.fixture
def family(db):
    """Sessions of every kind the marker rule tells apart, written without any marker."""
    db.create_session("parent", "cli")
    db.create_session("helper", "cli", parent_session_id="parent", model_config={"temperature": 0})
    db.create_session("compressed", "cli")
    db.end_session("compressed", "compression")
    db.create_session("continuation", "cli", parent_session_id="compressed")
    db.create_session("forked", "cli")
    db.end_session("forked", "branched")
    db.create_session("branch", "cli", parent_session_id="forked")
    db.create_session("lost-helper", "cli")
    db.append_message("lost-helper", "user", "scan the repo")
    db.append_message("lost-helper", "tool", "3 files", tool_name="terminal")
    db.create_session("titled-chat", "cli")
    db.set_session_title("titled-chat", "My work")
    db.append_message("titled-chat", "tool", "output", tool_name="terminal")
    db.create_session("plain-chat", "cli")
    db.append_message("plain-chat", "user", "hello")
    db.append_message("plain-chat", "assistant", "hi")
    db.create_session("odd-config", "cli", parent_session_id="parent")
    return db


def test_markers_go_to_subagents_only_and_keep_what_the_config_held(family, conn):
    conn.execute("UPDATE sessions SET model_config = 'not json' WHERE id = 'odd-config'")
    conn.execute("BEGIN IMMEDIATE")
    assert schema.mark_delegate_rows(conn) == 2
    conn.execute("COMMIT")
    found = configs(conn)
    assert found["helper"] == {"temperature": 0, "_delegate_from": "parent"}
    assert found["lost-helper"] == {"_delegate_from": schema.ORPHANED}
    for kept in ("continuation", "branch", "titled-chat", "plain-chat", "parent"):
        assert found[kept] is None, kept
    assert found["odd-config"] == "not json"  # a config that is not an object is left as it is
    conn.execute("BEGIN IMMEDIATE")
    assert schema.mark_delegate_rows(conn) == 0  # a second pass finds nothing to do
    conn.execute("COMMIT")


def test_a_file_older_than_the_marker_gets_it_at_open_and_listings_and_deletes_follow(family, tmp_path):
    path = family.db_path
    family.close()
    set_version(path, 15)
    with SessionDB(path, backup_before_upgrade=False) as db:
        listed = {s["id"] for s in db.list_sessions_rich(limit=50)}
        assert "lost-helper" not in listed and {"plain-chat", "titled-chat", "branch"} <= listed
        assert db.delete_session("parent") is True
        assert db.get_session("helper") is None and db.get_session("continuation") is not None


def test_a_file_that_already_has_markers_is_not_marked_again(family):
    path = family.db_path
    family.close()
    set_version(path, 16)  # past the marker step: rows are trusted as they are
    with SessionDB(path, backup_before_upgrade=False) as db:
        assert json.loads(db.get_session("helper")["model_config"]) == {"temperature": 0}
        assert "lost-helper" in {s["id"] for s in db.list_sessions_rich(limit=50)}


def test_recover_of_a_current_file_leaves_unmarked_children_alone(family, tmp_path):
    target = tmp_path / "copy.db"
    recover(family.db_path, target)
    with sqlite3.connect(target) as copy:
        assert configs(copy) == configs(sqlite3.connect(family.db_path))


# --- usage seeded from the session totals ------------------------------------------------------------------

def test_sessions_that_used_tokens_get_one_usage_row_from_their_totals(db, conn):
    db.create_session("priced", "cli", model="gpt-x", started_at=100.0)
    db.update_token_counts("priced", input_tokens=1234, output_tokens=567, model="gpt-x",
                           billing_provider="openai", estimated_cost_usd=0.25, api_call_count=2)
    db.end_session("priced", "user_exit")
    db.create_session("anonymous", "cli")
    db.update_token_counts("anonymous", cache_read_tokens=9)
    db.create_session("idle", "cli", model="m")
    db.create_session("kept", "cli", model="m")
    db.update_token_counts("kept", input_tokens=5, model="m")
    conn.execute("DELETE FROM session_model_usage WHERE session_id != 'kept'")
    kept = conn.execute("SELECT * FROM session_model_usage").fetchall()
    conn.execute("BEGIN IMMEDIATE")
    assert schema.seed_model_usage(conn) == 2
    conn.execute("COMMIT")
    conn.row_factory = sqlite3.Row
    rows = {r["session_id"]: dict(r) for r in conn.execute("SELECT * FROM session_model_usage")}
    ended = conn.execute("SELECT ended_at FROM sessions WHERE id = 'priced'").fetchone()[0]
    assert {k: rows["priced"][k] for k in ("model", "billing_provider", "billing_base_url", "task", "input_tokens",
                                           "output_tokens", "api_call_count", "estimated_cost_usd", "first_seen",
                                           "last_seen")} == {
        "model": "gpt-x", "billing_provider": "openai", "billing_base_url": "", "task": "", "input_tokens": 1234,
        "output_tokens": 567, "api_call_count": 2, "estimated_cost_usd": 0.25, "first_seen": 100.0,
        "last_seen": ended}
    assert (rows["anonymous"]["model"], rows["anonymous"]["cache_read_tokens"]) == ("unknown", 9)
    assert "idle" not in rows
    conn.row_factory = None
    assert conn.execute("SELECT * FROM session_model_usage WHERE session_id = 'kept'").fetchall() == kept
    conn.execute("BEGIN IMMEDIATE")
    assert schema.seed_model_usage(conn) == 0
    conn.execute("COMMIT")


def test_a_file_older_than_per_model_usage_is_seeded_at_open(db, raw_conn):
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", input_tokens=7, output_tokens=3, model="m")
    path = db.db_path
    db.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM session_model_usage")
    set_version(path, 16)
    with SessionDB(path, backup_before_upgrade=False) as reopened:
        assert reopened.usage_by_model()  # the insights read the seeded row
    assert raw_conn(path).execute("SELECT model, input_tokens, output_tokens FROM session_model_usage").fetchall() \
        == [("m", 7, 3)]


# --- rows stored with no active flag -------------------------------------------------------------------------

def _file_with_unflagged_rows(path, version: int) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(f"""
        CREATE TABLE schema_version (version INTEGER NOT NULL);
        INSERT INTO schema_version VALUES ({version});
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL,
                               message_count INTEGER DEFAULT 0);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
                               content TEXT, timestamp REAL NOT NULL, active INTEGER);
        INSERT INTO sessions VALUES ('s', 'discord', 1.0, 0);
        INSERT INTO messages (session_id, role, content, timestamp, active) VALUES ('s', 'user', 'kept?', 2.0, NULL);
        INSERT INTO messages (session_id, role, content, timestamp, active) VALUES ('s', 'user', 'retired', 1.5, 0);
    """)
    conn.close()


@pytest.mark.parametrize("version", [12, 31])
def test_rows_with_no_active_flag_are_live_again_after_open_and_counted(tmp_path, version):
    path = tmp_path / "unflagged.db"
    _file_with_unflagged_rows(path, version)
    with SessionDB(path, backup_before_upgrade=False) as db:
        assert [m["content"] for m in db.get_messages_as_conversation("s")] == ["kept?"]
        assert db.get_session("s")["message_count"] == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT content, active FROM messages ORDER BY id").fetchall() == [("kept?", 1),
                                                                                               ("retired", 0)]
        assert schema.read_layout(conn) == schema.LAYOUT_REVISION


def test_healing_is_a_no_op_on_a_file_without_such_rows(db, conn):
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    before = conn.execute("SELECT * FROM messages").fetchall()
    conn.execute("BEGIN IMMEDIATE")
    assert schema.heal_null_active(conn) == 0
    conn.execute("COMMIT")
    assert conn.execute("SELECT * FROM messages").fetchall() == before


def test_the_levels_a_file_was_written_in_are_read_and_an_unreadable_file_counts_as_oldest(db, tmp_path):
    with sqlite3.connect(db.db_path) as conn:
        assert schema.written_levels(conn) == (schema.SCHEMA_VERSION, schema.LAYOUT_REVISION)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with sqlite3.connect(garbage) as conn:
        assert schema.written_levels(conn) == (0, 0)
