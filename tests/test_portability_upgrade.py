"""Moving in from hermes-agent: a file its 0.19.0 release wrote (schema 22) upgrades safely.

The fixture was written through hermes-agent's public API by bench/make_agent_db.py (48 messages
in two sessions: tool calls, reasoning, CJK, titles, token counts).
"""
from __future__ import annotations

import gzip
import logging
import re
import sqlite3
from pathlib import Path

import pytest

import hermes_state_fts as fts
import hermes_state_schema as schema
from hermes_state import SCHEMA_VERSION, SessionDB

FIXTURE = Path(__file__).parent / "fixtures" / "hermes_agent_0.19.0.db.gz"


@pytest.fixture
def agent_db(tmp_path) -> Path:
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    return path


def rows(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


OLD_MESSAGES = "SELECT id, session_id, role, content, tool_calls, reasoning, timestamp FROM messages ORDER BY id"


def test_the_fixture_is_an_old_layout(agent_db):
    assert rows(agent_db, "SELECT version FROM schema_version") == [(22,)]
    assert len(rows(agent_db, OLD_MESSAGES)) == 48


def test_opening_writable_backs_up_first_then_upgrades_with_every_row(agent_db, caplog, monkeypatch):
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    original = rows(agent_db, OLD_MESSAGES)
    with caplog.at_level(logging.INFO, logger="hermes_state"):
        db = SessionDB(agent_db)
    try:
        backup = db.upgrade_backup
        assert backup is not None and re.fullmatch(rf"state\.db\.pre-v{SCHEMA_VERSION}-\d{{8}}T\d{{6}}Z\.bak",
                                                   backup.name)
        assert backup.parent == agent_db.parent
        assert [r for r in caplog.records if "upgrading" in r.getMessage() and str(backup) in r.getMessage()]
        assert db.schema_version == SCHEMA_VERSION
        db.rebuild_fts()
        hits = db.search_messages("東京", limit=100)
        assert hits and all(h["session_id"].startswith("agent-") for h in hits)
        assert db.get_session("agent-00000")["message_count"] == 40
    finally:
        db.close()
    # The backup is the file as it was: schema 22 and the same rows; the upgraded file keeps them all.
    assert rows(backup, "SELECT version FROM schema_version") == [(22,)]
    assert rows(backup, OLD_MESSAGES) == original
    assert rows(agent_db, OLD_MESSAGES) == original
    uids = [r[0] for r in rows(agent_db, "SELECT message_uid FROM messages")]
    assert len(set(uids)) == 48 and all(re.fullmatch(r"[0-9a-f]{32}", u) for u in uids)
    assert rows(agent_db, "PRAGMA integrity_check") == [("ok",)]
    # The triggers are exactly the declared ones: the old layout's word and substring indexes (the
    # file's only ones, under the document's names) became the document's, and their triggers too.
    declared = {fts_name: " ".join(sql.split()) for kind, fts_name, sql in fts.OBJECTS if kind == "trigger"}
    found = dict(rows(agent_db, "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name <> "
                                f"'{schema.UID_TRIGGER}'"))
    agents = dict(rows(backup, "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
    assert agents and set(agents) <= {name for _, name, _ in fts.DOCUMENT_OBJECTS}
    assert {name: " ".join(sql.split()) for name, sql in found.items()} == declared


def test_the_caller_can_opt_out_of_the_backup_but_the_upgrade_is_still_said(agent_db, caplog):
    with caplog.at_level(logging.INFO, logger="hermes_state"), SessionDB(agent_db, backup_before_upgrade=False) as db:
        assert db.upgrade_backup is None and db.schema_version == SCHEMA_VERSION
    assert [r for r in caplog.records if "upgrading" in r.getMessage() and "no copy" in r.getMessage()]
    assert sorted(p.name for p in agent_db.parent.iterdir() if ".bak" in p.name) == []


def test_a_current_file_is_not_backed_up_again(agent_db):
    SessionDB(agent_db).close()
    with SessionDB(agent_db) as again:
        assert again.upgrade_backup is None
    assert len([p for p in agent_db.parent.iterdir() if p.name.endswith(".bak")]) == 1


def bulk_up_old_index(path: Path) -> None:
    """Make the old layout's index large, as in a real history: its pages are freed by the upgrade."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for n in range(400):
        conn.execute("INSERT INTO messages_fts(rowid, content) VALUES (?, ?)",
                     (10_000 + n, " ".join(f"word{n}x{k}" for k in range(400))))
    conn.execute("COMMIT")
    conn.close()


def test_after_upgrade_and_rebuild_the_file_is_no_larger_than_a_fresh_one(agent_db, tmp_path, monkeypatch):
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    bulk_up_old_index(agent_db)
    with SessionDB(agent_db, backup_before_upgrade=False) as db:
        db.rebuild_fts()  # the background rebuild's work; the freed pages are given back after it
        fresh = tmp_path / "fresh.db"
        with sqlite3.connect(fresh) as made:  # the same page size as the old file: like for like
            made.execute(f"PRAGMA page_size = {rows(agent_db, 'PRAGMA page_size')[0][0]}")
            made.execute("PRAGMA journal_mode = WAL")
        with SessionDB(fresh) as other:
            other.import_sessions(db.iter_export())
    size = {p: rows(p, "PRAGMA page_count")[0][0] for p in (agent_db, fresh)}
    assert rows(fresh, "PRAGMA page_size") == rows(agent_db, "PRAGMA page_size")
    assert rows(agent_db, "PRAGMA freelist_count")[0][0] == 0
    # The old layout's own extra tables and indexes stay (a page each at least), and so do
    # hermes-agent's own indexes (its, live); beyond them the upgraded file is the size of a fresh one.
    names = {p: {r[0] for r in rows(p, "SELECT name FROM sqlite_master WHERE rootpage > 0")} for p in size}
    agents = rows(agent_db, "SELECT COUNT(*) FROM dbstat WHERE name LIKE 'messages\\_fts%' ESCAPE '\\'")[0][0]
    assert size[agent_db] <= size[fresh] * 1.10 + len(names[agent_db] - names[fresh]) + agents


def test_the_background_rebuild_makes_the_old_word_index_the_documents(agent_db):
    bulk_up_old_index(agent_db)
    with SessionDB(agent_db, backup_before_upgrade=False) as db:
        assert db.wait_for_fts_rebuild(30)
        assert db.fts_rebuild_status()["pending"] == 0
    # Rebuilt over the messages themselves: the rows only the old index held are gone, and each
    # index agrees with its content source.
    assert rows(agent_db, "SELECT COUNT(*) FROM messages_fts") == rows(agent_db, "SELECT COUNT(*) FROM messages")
    conn = sqlite3.connect(agent_db, isolation_level=None)
    try:
        for table in (fts.WORD, fts.DOC_TRIGRAM):
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 1)")
    finally:
        conn.close()
    assert rows(agent_db, "SELECT COUNT(*) FROM sqlite_master WHERE name GLOB 'hermes_retired_fts_*'") == [(0,)]
    assert rows(agent_db, "SELECT COUNT(*) FROM state_meta WHERE key = 'reclaim_after_rebuild'") == [(0,)]


def test_read_only_reads_the_old_file_and_leaves_it_alone(agent_db):
    before = agent_db.read_bytes()
    with SessionDB(agent_db, read_only=True) as db:
        assert db.schema_version == 22
        assert db.get_session("agent-00000")["message_count"] == 40
        assert db.search_messages("東京", limit=100)
    assert agent_db.read_bytes() == before


def test_no_upgrade_without_the_promised_copy(agent_db, monkeypatch):
    import hermes_state_recovery as recovery
    from hermes_state import StoreUnavailableError

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(recovery, "backup_to", full)
    before = agent_db.read_bytes()
    with pytest.raises(StoreUnavailableError, match="backup_before_upgrade=False"):
        SessionDB(agent_db)
    assert rows(agent_db, "SELECT version FROM schema_version") == [(22,)]
    assert agent_db.read_bytes() == before


# Written by this library's own release that labelled its layout schema version 32 (main at
# e6a6f64, through its public API): three messages (CJK, a tool call, a tool result) in one
# titled session, one in another, two delegations of the layout that release had.
V32_FIXTURE = Path(__file__).parent / "fixtures" / "hermes_state_v32.db.gz"


@pytest.fixture
def v32_db(tmp_path) -> Path:
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(V32_FIXTURE.read_bytes()))
    return path


def test_a_file_this_library_labelled_32_is_relabelled_31_with_its_layout_revision(v32_db, monkeypatch):
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    assert rows(v32_db, "SELECT version FROM schema_version") == [(32,)]
    before = rows(v32_db, "SELECT id, session_id, role, content, message_uid FROM messages ORDER BY id")
    with SessionDB(v32_db) as db:
        assert db.schema_version == SCHEMA_VERSION == 31
        assert db.upgrade_backup is None  # same version: nothing to copy first
        db.rebuild_fts()
        assert [h["session_id"] for h in db.search_messages("東京")] == ["v32-a"]
        assert [h["session_id"] for h in db.search_messages("needle-in")] == ["v32-b"]
        assert db.get_session("v32-a")["title"] == "Written at 32"
        assert db.check_integrity(full=True)["ok"]
    assert rows(v32_db, "SELECT version FROM schema_version") == [(31,)]
    assert rows(v32_db, f"SELECT value FROM state_meta WHERE key = '{schema.LAYOUT_KEY}'") == [
        (str(schema.LAYOUT_REVISION),)]
    assert rows(v32_db, "SELECT id, session_id, role, content, message_uid FROM messages ORDER BY id") == before
    conn = sqlite3.connect(v32_db)
    try:  # relabelled once: the next open finds nothing to do and takes no write lock
        assert not schema.needs_migration(conn)
    finally:
        conn.close()


def test_a_newer_real_version_is_not_mistaken_for_this_librarys_32(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 32")  # the real system's own 32, one day
    conn.commit()
    conn.close()
    with SessionDB(path) as db:
        assert db.schema_version == 32  # newer than this library: read, never relabelled
    assert rows(path, "SELECT version FROM schema_version") == [(32,)]


def test_a_row_another_program_inserts_gets_a_uid_at_once(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
    conn = sqlite3.connect(path)  # a sqlite3 shell, or hermes-agent: neither knows message_uid
    conn.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', 'from a shell', 1)")
    conn.commit()
    (uid,) = conn.execute("SELECT message_uid FROM messages").fetchone()
    conn.close()
    assert re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", uid)  # a uuid4, as append_message issues
    with SessionDB(path) as db:
        assert db.get_messages("s")[0]["message_uid"] == uid
        assert [h["session_id"] for h in db.search_messages("shell")] == ["s"]


# --- the real system's table shapes ------------------------------------------------------------------

def test_every_table_hermes_agent_writes_keeps_its_shape_in_a_fresh_file(agent_db, tmp_path):
    # Column names, types, NOT NULL, defaults and keys as hermes-agent 0.19.0 writes them; this
    # library's columns come on top, never instead.
    fresh = tmp_path / "fresh.db"
    SessionDB(fresh).close()
    theirs = [r[0] for r in rows(agent_db, "SELECT name FROM sqlite_master WHERE type = 'table' "
                                           "AND name NOT LIKE 'messages_fts%' AND name NOT LIKE 'sqlite_%'")]
    assert {"sessions", "messages", "session_model_usage", "async_delegations", "gateway_routing"} <= set(theirs)
    for table in theirs:
        want = {r[1]: r[2:] for r in rows(agent_db, f"PRAGMA table_info({table})")}
        have = {r[1]: r[2:] for r in rows(fresh, f"PRAGMA table_info({table})")}
        assert {c: have.get(c) for c in want} == want, table


DELEGATION_COLUMNS = {"delegation_id", "origin_session", "origin_ui_session_id", "parent_session_id", "state",
                      "dispatched_at", "completed_at", "updated_at", "event_json", "result_json", "delivery_state",
                      "delivery_attempts", "delivered_at", "owner_pid", "owner_started_at", "task_json",
                      "delivery_claim", "delivery_claimed_at", "target"}


def test_delegations_of_this_librarys_32_move_to_the_real_columns_with_their_rows(v32_db):
    with SessionDB(v32_db) as db:
        done = db.get_delegation("dlg-1")
        assert (done["origin_session_id"], done["target"], done["state"], done["payload"], done["result"]) == (
            "v32-a", "research", "completed", {"q": "weather"}, {"answer": 42})
        assert done["completed_at"] == done["updated_at"] and done["delivery_state"] == "pending"
        assert [d["id"] for d in db.list_delegations("v32-b", state="pending")] == ["dlg-2"]
        assert db.record_delegation("dlg-3", "v32-a", payload={"q": "more"}) is True
        db.update_delegation("dlg-2", state="running")
    assert {r[1] for r in rows(v32_db, "PRAGMA table_info(async_delegations)")} == DELEGATION_COLUMNS
    assert rows(v32_db, "SELECT delegation_id, origin_session FROM async_delegations ORDER BY 1") == [
        ("dlg-1", "v32-a"), ("dlg-2", "v32-b"), ("dlg-3", "v32-a")]


AGENT_UPGRADED_AT_32 = Path(__file__).parent / "fixtures" / "hermes_agent_upgraded_at_v32.db.gz"


def test_an_agent_file_an_earlier_release_upgraded_keeps_its_delegations_and_takes_new_ones(tmp_path):
    # hermes_agent_0.19.0.db.gz opened writable by the release that labelled its layout 32: both
    # column sets grafted onto async_delegations; then one delegation row as hermes-agent writes it.
    path = tmp_path / "state.db"
    path.write_bytes(gzip.decompress(AGENT_UPGRADED_AT_32.read_bytes()))
    assert {"id", "origin_session_id", "delegation_id"} <= {r[1] for r in rows(path, "PRAGMA table_info(async_delegations)")}
    with SessionDB(path, backup_before_upgrade=False) as db:
        assert db.record_delegation("ours-1", "agent-00000", target="helper") is True  # no IntegrityError
        theirs = db.get_delegation("agent-dlg")
        assert (theirs["origin_session_id"], theirs["state"], theirs["payload"]) == (
            "agent-00000", "completed", {"goal": "summarise"})
        assert [d["id"] for d in db.list_delegations("agent-00000")] == ["agent-dlg", "ours-1"]
        db.update_token_counts("agent-00000", input_tokens=5, model="gpt-test")  # the real usage key
        assert db.get_session("agent-00000")["input_tokens"] == 1005
    assert {r[1] for r in rows(path, "PRAGMA table_info(async_delegations)")} == DELEGATION_COLUMNS
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]


def test_delegations_and_usage_work_on_a_file_upgraded_from_hermes_agent(agent_db):
    with SessionDB(agent_db, backup_before_upgrade=False) as db:
        assert db.record_delegation("d1", "agent-00000", payload={"task": "find"}) is True
        db.update_delegation("d1", state="completed", result={"ok": True})
        assert db.get_delegation("d1")["result"] == {"ok": True}
        db.update_token_counts("agent-00000", input_tokens=5, output_tokens=1, model="gpt-test")
        usage = rows(agent_db, "SELECT model, billing_provider, task, input_tokens FROM session_model_usage "
                               "WHERE session_id = 'agent-00000'")
        assert usage == [("gpt-test", "", "", 1005)]


def test_usage_of_this_librarys_32_gets_the_real_key_and_keeps_its_counts(v32_db):
    conn = sqlite3.connect(v32_db)  # a usage row in that release's key (session_id, model, task)
    conn.execute("INSERT INTO session_model_usage (session_id, model, task, input_tokens, updated_at) "
                 "VALUES ('v32-a', 'm1', '', 40, 5.0)")
    conn.commit()
    conn.close()
    with SessionDB(v32_db) as db:
        db.update_token_counts("v32-a", input_tokens=3, model="m1")
    pk = [r[1] for r in sorted((r for r in rows(v32_db, "PRAGMA table_info(session_model_usage)") if r[5]),
                               key=lambda r: r[5])]
    assert pk == ["session_id", "model", "billing_provider", "billing_base_url", "billing_mode", "task"]
    assert rows(v32_db, "SELECT session_id, model, billing_provider, task, input_tokens, first_seen "
                        "FROM session_model_usage") == [("v32-a", "m1", "", "", 43, 5.0)]
