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

from hermes_state import SCHEMA_VERSION, SessionDB, StateDbIncompatibleError

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
    monkeypatch.setattr(SessionDB, "_FTS_REBUILD_IN_BACKGROUND", False)
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
    # No trigger of the old layout survives: each row is indexed once, by the current triggers.
    triggers = {r[0] for r in rows(agent_db, "SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    assert not {t for t in triggers if "trigram" in t}


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
    monkeypatch.setattr(SessionDB, "_FTS_REBUILD_IN_BACKGROUND", False)
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
    # The old layout's own extra tables and indexes stay (a page each at least); beyond them the
    # upgraded file is the size of a fresh one.
    names = {p: {r[0] for r in rows(p, "SELECT name FROM sqlite_master WHERE rootpage > 0")} for p in size}
    assert size[agent_db] <= size[fresh] * 1.10 + len(names[agent_db] - names[fresh])


def test_the_background_rebuild_gives_the_space_back_too(agent_db):
    bulk_up_old_index(agent_db)
    before = agent_db.stat().st_size
    with SessionDB(agent_db, backup_before_upgrade=False) as db:
        db._fts_worker.join(30)
        assert not db._fts_worker.is_alive()
        assert db.fts_rebuild_status()["pending"] == 0
    assert rows(agent_db, "PRAGMA auto_vacuum") == [(2,)]  # incremental from now on
    assert agent_db.stat().st_size < before / 2
    assert rows(agent_db, "SELECT COUNT(*) FROM state_meta WHERE key = 'reclaim_after_rebuild'") == [(0,)]


def test_read_only_refuses_the_old_file_and_leaves_it_alone(agent_db):
    before = agent_db.read_bytes()
    with pytest.raises(StateDbIncompatibleError, match="schema version 22"):
        SessionDB(agent_db, read_only=True)
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
