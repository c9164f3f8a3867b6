"""Read-only handles: never create or touch the file, refuse every write before any SQL, report 503s."""
from __future__ import annotations

import gzip
import hashlib
import inspect
import sqlite3
import time
from pathlib import Path

import pytest

from hermes_state import (ReadOnlyError, SessionDB, StateDbBusyError, StateDbIncompatibleError,
                          StateDbUninitializedError, StoreUnavailableError)

# Public methods that only read. Every other public method is a write and must be refused.
READS = {
    "get_session", "find_orphaned_gateway_sessions", "list_never_active_keyed_sessions", "get_messages", "get_messages_as_conversation", "get_session_title", "resolve_session_by_title",
    "get_next_title_in_lineage", "get_lineage", "get_descendants", "list_sessions", "usage_by_model",
    "top_sessions_by_tokens", "search_messages", "fts_rebuild_status", "wait_for_fts_rebuild",
    "get_compression_successor",
    "get_compression_ancestors", "export_session", "export_all", "iter_export", "backup",
    "close", "release", "shared", "to_provider_messages", "tracer",
    "count_sessions", "check_integrity", "get_runtime", "next_admission", "get_admission", "list_admissions",
    "get_execution", "list_executions", "list_receipts", "list_owed", "get_delivery", "get_route", "list_routes",
    "get_delegation", "list_delegations",
    "sanitize_title", "get_session_by_title", "session_count", "message_count", "distinct_session_cwds",
    "get_resume_conversations", "get_ancestor_display_prefix",
    "get_compression_lock_holder",
    "count_empty_sessions", "get_meta", "list_prune_candidates", "list_sessions_rich", "search_sessions",
    "search_sessions_by_id", "list_cron_job_runs", "get_compression_tip", "resolve_session_id",
    "get_compression_lineage", "export_session_lineage",
    "get_telegram_topic_binding", "get_telegram_topic_binding_by_session", "is_telegram_session_linked_to_topic",
    "list_telegram_topic_bindings_for_chat", "is_telegram_topic_mode_enabled", "list_unlinked_telegram_sessions_for_user",
    "find_latest_gateway_session_for_peer", "list_gateway_sessions", "find_session_by_origin",
    "get_compression_failure_cooldown", "get_compression_fallback_streak",
    "get_handoff_state", "list_pending_handoffs", "load_gateway_routing_entries", "has_archived_messages",
    "get_messages_around", "get_anchored_view", "list_recent_user_messages", "has_platform_message_id",
    "get_conversation_root", "resolve_resume_session_id",
    "session_ids_with_prefix", "usage", "largest_sessions", "stored_names",
    # hermes-agent 0.20.1's reads
    "assert_export_safe", "assert_resume_safe", "count_open_prune_matches", "find_live_compression_child",
    "find_pr_url_messages", "get_active_message_watermark", "get_compression_failure_cooldown_row",
    "get_compression_ineffective_count", "get_dominant_session_model_route", "get_first_assistant_text",
    "get_message_reactions", "get_message_role", "get_resume_message_count", "get_session_delete_targets", "get_session_delete_plan",
    "latest_message_row_id", "latest_user_message_row_id", "list_meta_prefix", "list_skill_scaffolded_sessions",
    "logical_size_bytes", "session_count_by_source", "session_count_ge", "session_lifecycle_statuses", "usage_totals",
    "get_session_activity", "get_session_title_source", "get_session_model_config_value", "get_session_rich_row",
    "session_unread", "session_yolo_enabled", "session_gateway_runtime",
}


def write_methods() -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(SessionDB, callable)
                  if not name.startswith("_") and name not in READS)


def test_the_write_list_is_not_empty_and_names_the_obvious_ones():
    names = write_methods()
    assert {"create_session", "append_message", "import_sessions", "restore", "vacuum", "rebuild_fts"} <= set(names)


@pytest.mark.parametrize("name", write_methods())
def test_every_write_method_raises_read_only_before_any_sql(db, name):
    db.create_session("s", "cli")
    reader = SessionDB(db.db_path, read_only=True)
    try:
        params = [p for p in inspect.signature(getattr(SessionDB, name)).parameters.values()
                  if p.name != "self" and p.default is inspect.Parameter.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keywords = {p.name: "s" for p in inspect.signature(getattr(SessionDB, name)).parameters.values()
                    if p.kind is p.KEYWORD_ONLY and p.default is inspect.Parameter.empty}
        with reader.tracer() as statements, pytest.raises(ReadOnlyError):
            getattr(reader, name)(*["s"] * len(params), **keywords)
        assert statements == []
    finally:
        reader.close()


def test_missing_and_empty_files_are_left_alone(tmp_path):
    for name in ("missing.db", "empty.db"):
        path = tmp_path / "odd ?#dir" / name
        path.parent.mkdir(exist_ok=True)
        if name == "empty.db":
            path.write_bytes(b"")
        with pytest.raises(StateDbUninitializedError) as info:
            SessionDB(path, read_only=True)
        assert info.value.http_status == 503
    assert sorted(p.name for p in (tmp_path / "odd ?#dir").iterdir()) == ["empty.db"]
    assert (tmp_path / "odd ?#dir" / "empty.db").read_bytes() == b""


def test_a_path_with_question_mark_and_hash_is_read(tmp_path):
    path = tmp_path / "what?#x" / "state#1?.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    with SessionDB(path, read_only=True) as ro:
        assert ro.get_session("s")["source"] == "cli"
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(("-wal", "-shm"))) == ["state#1?.db"]


def test_a_read_only_session_leaves_the_file_bytes_unchanged(db, tmp_path):
    db.create_session("s", "cli", title="T")
    db.append_message("s", "user", "東京 docker")
    db.close()
    before = hashlib.sha256(db.db_path.read_bytes()).hexdigest()
    with SessionDB(db.db_path, read_only=True) as ro:
        ro.get_messages_as_conversation("s")
        ro.search_messages("東京")
        ro.list_sessions()
        ro.export_all()
        ro.fts_rebuild_status()
        with pytest.raises(ReadOnlyError):
            ro.append_message("s", "user", "no")
    assert hashlib.sha256(db.db_path.read_bytes()).hexdigest() == before


def test_an_exclusive_rival_makes_the_open_wait_then_report_busy(db, monkeypatch):
    db.create_session("s", "cli")
    db.close()
    monkeypatch.setattr(SessionDB, "read_busy_timeout_s", 1.0)  # the 5 s default, shortened for the suite
    rival = sqlite3.connect(db.db_path, isolation_level=None)
    rival.execute("PRAGMA locking_mode = EXCLUSIVE")
    rival.execute("BEGIN IMMEDIATE")
    rival.execute("UPDATE sessions SET title = 'mine'")
    rival.execute("COMMIT")  # exclusive mode keeps the lock after the write
    try:
        started = time.monotonic()
        with pytest.raises(StateDbBusyError) as info:
            SessionDB(db.db_path, read_only=True)
        assert time.monotonic() - started >= 0.9  # it waited for the lock, then gave up
        assert isinstance(info.value, StoreUnavailableError) and not isinstance(info.value, sqlite3.Error)
    finally:
        rival.close()
    with SessionDB(db.db_path, read_only=True) as ro:  # once the rival is gone it reads
        assert ro.get_session("s")["title"] == "mine"


def test_an_older_schema_names_how_to_upgrade_it(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (22);"
                       "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);")
    conn.close()
    with pytest.raises(StateDbIncompatibleError, match=r"`hermes-state --db .*old\.db migrate`"):
        SessionDB(path, read_only=True)


def test_a_newer_schema_with_extra_columns_and_tables_is_read(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    db.close()
    rival.execute("ALTER TABLE sessions ADD COLUMN shiny_new TEXT")
    rival.execute("CREATE TABLE future_things (x)")
    rival.execute("UPDATE schema_version SET version = 40")
    with SessionDB(db.db_path, read_only=True) as ro:
        assert ro.schema_version == 40
        assert ro.get_session("s")["shiny_new"] is None
        assert ro.search_messages("hello")[0]["session_id"] == "s"


# --- older layouts, read as they are ----------------------------------------------------------------

AGENT_FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"


def test_every_read_of_a_hermes_agent_file_works_and_changes_no_byte(tmp_path):
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_FIXTURE.read_bytes()))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with SessionDB(path, read_only=True) as db:
        assert db.schema_version == 22
        session = db.get_session("agent-00000")
        # Columns hermes-agent 0.19.0 never had read as their defaults.
        assert (session["pinned"], session["auto_archived"], session["last_activity_at"]) == (0, 0, None)
        messages = db.get_messages("agent-00000")
        assert len(messages) == 40 and all(m["display_kind"] is None for m in messages)
        assert [s["id"] for s in db.list_sessions()] == ["agent-00001", "agent-00000"]
        assert db.count_sessions() == 2 and db.usage_by_model() and db.top_sessions_by_tokens()
        assert db.get_messages_as_conversation("agent-00000")
        assert {h["session_id"] for h in db.search_messages("部署", limit=100)} == {"agent-00000", "agent-00001"}
        assert db.search_messages("config", role_filter=["user"])
        assert len(db.export_session("agent-00000")["messages"]) == 40
        # Tables the file lacks altogether read as empty.
        assert db.get_runtime() is None and db.list_admissions("agent-00000") == []
        assert db.list_executions("agent-00000") == [] and db.list_delegations("agent-00000") == []
        assert db.list_routes() == []
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_file_that_is_no_session_store_is_a_503_with_guidance(tmp_path):
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL)")
    conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StateDbIncompatibleError, match="lacks messages.session_id") as info:
        SessionDB(path, read_only=True)
    assert info.value.http_status == 503 and info.value.guidance
