"""Telegram DM topic mode: the opt-in tables, topic bindings (one topic per session), unlinked sessions."""
from __future__ import annotations

import sqlite3

import pytest

import hermes_state_telegram as telegram
from hermes_state import SessionDB, SessionNotFoundError, recover
from hermes_state_errors import TopicBindingConflictError

TOPIC_TABLES = {"telegram_dm_topic_mode", "telegram_dm_topic_bindings"}


def topic_objects(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '%telegram_dm_topic%'")}


def bind(db, session_id: str, thread_id: str = "17", chat_id: str = "chat-1", **extra) -> None:
    db.bind_telegram_topic(chat_id=chat_id, thread_id=thread_id, user_id=extra.pop("user_id", "u1"),
                           session_key=extra.pop("session_key", f"key-{thread_id}"), session_id=session_id, **extra)


@pytest.fixture
def tg(db):
    """A store with two Telegram sessions of user u1."""
    for sid in ("s1", "s2"):
        db.create_session(sid, "telegram", user_id="u1")
    return db


# --- the opt-in tables --------------------------------------------------------------------------------

def test_opening_and_reading_never_create_the_topic_tables(tg, rival):
    assert tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="17") is None
    assert tg.get_telegram_topic_binding_by_session(session_id="s1") is None
    assert tg.is_telegram_session_linked_to_topic(session_id="s1") is False
    assert tg.list_telegram_topic_bindings_for_chat(chat_id="chat-1") == []
    assert tg.is_telegram_topic_mode_enabled(chat_id="chat-1", user_id="u1") is False
    assert tg.delete_telegram_topic_binding(chat_id="chat-1", thread_id="17") == 0
    tg.disable_telegram_topic_mode(chat_id="chat-1")
    assert {s["id"] for s in tg.list_unlinked_telegram_sessions_for_user(chat_id="chat-1", user_id="u1")} == {"s1", "s2"}
    assert topic_objects(rival) == set()
    assert tg.get_meta(telegram.SCHEMA_KEY) is None


def test_the_explicit_migration_creates_tables_indexes_and_revision_once(tg, rival):
    tg.apply_telegram_topic_migration()
    made = topic_objects(rival)
    assert TOPIC_TABLES <= made and "idx_telegram_dm_topic_bindings_session" in made
    assert rival.execute("SELECT value FROM state_meta WHERE key = ?", (telegram.SCHEMA_KEY,)).fetchone()[0] == "2"
    schema_before = rival.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall()
    tg.apply_telegram_topic_migration()  # idempotent
    assert rival.execute("SELECT sql FROM sqlite_master ORDER BY name").fetchall() == schema_before


def test_a_mode_table_of_an_earlier_revision_gains_the_capability_columns(tg, rival):
    rival.execute("CREATE TABLE telegram_dm_topic_mode (chat_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, "
                  "enabled INTEGER NOT NULL DEFAULT 1, activated_at REAL NOT NULL, updated_at REAL NOT NULL)")
    rival.execute("INSERT INTO telegram_dm_topic_mode VALUES ('chat-1', 'u1', 1, 5.0, 5.0)")
    tg.apply_telegram_topic_migration()
    row = dict(rival.execute("SELECT * FROM telegram_dm_topic_mode").fetchone())
    assert row["activated_at"] == 5.0 and row["has_topics_enabled"] is None and "pinned_message_id" in row
    assert tg.is_telegram_topic_mode_enabled(chat_id="chat-1", user_id="u1") is True


# --- bindings ---------------------------------------------------------------------------------------------------

def test_a_binding_reads_back_and_creates_the_tables_on_first_use(tg, rival):
    bind(tg, "s1", session_key="telegram:dm:chat-1:thread:17")
    binding = tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="17")
    assert {k: binding[k] for k in ("chat_id", "thread_id", "user_id", "session_key", "session_id", "managed_mode")} \
        == {"chat_id": "chat-1", "thread_id": "17", "user_id": "u1", "session_key": "telegram:dm:chat-1:thread:17",
            "session_id": "s1", "managed_mode": "auto"}
    assert binding["linked_at"] == binding["updated_at"]
    assert TOPIC_TABLES <= topic_objects(rival)
    assert tg.get_meta(telegram.SCHEMA_KEY) == "2"
    assert tg.get_telegram_topic_binding_by_session(session_id="s1") == binding
    assert tg.is_telegram_session_linked_to_topic(session_id="s1") is True
    assert tg.list_telegram_topic_bindings_for_chat(chat_id="chat-1") == [binding]
    assert tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="18") is None


def test_binding_a_topic_again_updates_it_and_keeps_its_first_link_time(tg, rival):
    bind(tg, "s1")
    first = tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="17")
    bind(tg, "s1", user_id="u9", session_key="new-key", managed_mode="manual")
    again = tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="17")
    assert (again["user_id"], again["session_key"], again["managed_mode"]) == ("u9", "new-key", "manual")
    assert again["linked_at"] == first["linked_at"] and again["updated_at"] >= first["updated_at"]
    bind(tg, "s2")  # the topic moves on to another session: s1 is free again
    assert tg.get_telegram_topic_binding(chat_id="chat-1", thread_id="17")["session_id"] == "s2"
    assert tg.is_telegram_session_linked_to_topic(session_id="s1") is False
    assert rival.execute("SELECT COUNT(*) FROM telegram_dm_topic_bindings").fetchone()[0] == 1


@pytest.mark.parametrize("elsewhere", [{"thread_id": "99"}, {"chat_id": "chat-2"}])
def test_a_session_linked_to_one_topic_refuses_another_and_nothing_changes(tg, rival, elsewhere):
    bind(tg, "s1")
    before = rival.execute("SELECT * FROM telegram_dm_topic_bindings").fetchall()
    with pytest.raises(TopicBindingConflictError, match="already linked to another Telegram topic") as refused:
        bind(tg, "s1", **elsewhere)
    assert isinstance(refused.value, ValueError)
    assert rival.execute("SELECT * FROM telegram_dm_topic_bindings").fetchall() == before


def test_the_database_itself_refuses_a_second_topic_for_a_session(tg, rival):
    bind(tg, "s1")
    with pytest.raises(sqlite3.IntegrityError):  # another program writing past the library's check
        rival.execute("INSERT INTO telegram_dm_topic_bindings VALUES ('chat-1', '99', 'u1', 'k', 's1', 'auto', 1, 1)")


@pytest.mark.parametrize("field, value", [
    ("chat_id", ""), ("chat_id", 208214988), ("thread_id", None), ("user_id", ""), ("session_key", None),
    ("managed_mode", ""), ("session_id", "\ud800"),
])
def test_bad_arguments_are_refused_before_anything_is_written(tg, rival, field, value):
    args = {"chat_id": "chat-1", "thread_id": "17", "user_id": "u1", "session_key": "k", "session_id": "s1",
            field: value}
    with pytest.raises(ValueError, match=field):
        tg.bind_telegram_topic(**args)
    assert topic_objects(rival) == set()


def test_an_unknown_session_is_refused_typed_and_the_file_keeps_its_layout(tg, rival):
    with pytest.raises(SessionNotFoundError, match="nope"):
        bind(tg, "nope")
    assert topic_objects(rival) == set()


def test_a_failure_after_the_tables_were_made_rolls_all_of_it_back(tg, rival, monkeypatch):
    class BrokenClock:
        @staticmethod
        def time() -> float:
            raise RuntimeError("clock gone")
    monkeypatch.setattr(telegram, "time", BrokenClock)
    with pytest.raises(RuntimeError, match="clock gone"):
        bind(tg, "s1")  # the tables were created in this transaction, then the insert failed
    assert topic_objects(rival) == set()
    assert rival.execute("SELECT COUNT(*) FROM state_meta WHERE key = ?", (telegram.SCHEMA_KEY,)).fetchone()[0] == 0


def test_deleting_a_binding_keeps_the_session_and_deleting_the_session_takes_its_binding(tg, rival):
    bind(tg, "s1")
    bind(tg, "s2", thread_id="18")
    assert tg.delete_telegram_topic_binding(chat_id="chat-1", thread_id="17") == 1
    assert tg.delete_telegram_topic_binding(chat_id="chat-1", thread_id="17") == 0
    assert tg.get_session("s1") is not None
    assert tg.delete_session("s2") is True
    assert rival.execute("SELECT COUNT(*) FROM telegram_dm_topic_bindings").fetchone()[0] == 0


# --- the mode row ------------------------------------------------------------------------------------------------

def test_topic_mode_is_enabled_per_chat_and_user_and_disabling_unlinks_the_topics(tg, rival):
    tg.enable_telegram_topic_mode(chat_id="chat-1", user_id="u1", has_topics_enabled=True)
    assert tg.is_telegram_topic_mode_enabled(chat_id="chat-1", user_id="u1") is True
    assert tg.is_telegram_topic_mode_enabled(chat_id="chat-1", user_id="u2") is False
    first = dict(rival.execute("SELECT * FROM telegram_dm_topic_mode").fetchone())
    assert (first["enabled"], first["has_topics_enabled"], first["allows_users_to_create_topics"]) == (1, 1, None)
    tg.enable_telegram_topic_mode(chat_id="chat-1", user_id="u1", allows_users_to_create_topics=False)
    again = dict(rival.execute("SELECT * FROM telegram_dm_topic_mode").fetchone())
    assert again["activated_at"] == first["activated_at"]
    assert (again["has_topics_enabled"], again["allows_users_to_create_topics"]) == (None, 0)
    bind(tg, "s1")
    tg.disable_telegram_topic_mode(chat_id="chat-1", clear_bindings=False)
    assert tg.is_telegram_topic_mode_enabled(chat_id="chat-1", user_id="u1") is False
    assert tg.is_telegram_session_linked_to_topic(session_id="s1") is True
    tg.disable_telegram_topic_mode(chat_id="chat-1")
    assert tg.is_telegram_session_linked_to_topic(session_id="s1") is False
    with pytest.raises(ValueError, match="has_topics_enabled"):
        tg.enable_telegram_topic_mode(chat_id="chat-1", user_id="u1", has_topics_enabled="yes")
    with pytest.raises(ValueError, match="clear_bindings"):
        tg.disable_telegram_topic_mode(chat_id="chat-1", clear_bindings=None)


# --- the user's unlinked sessions -------------------------------------------------------------------------------

def test_unlinked_sessions_are_the_users_telegram_sessions_no_topic_holds_latest_first(db):
    db.create_session("older", "telegram", user_id="u1", started_at=100.0)
    db.set_session_title("older", "Research")
    db.append_message("older", "user", "first\nprompt " + "x" * 80, timestamp=300.0)  # latest activity
    db.create_session("newer", "telegram", user_id="u1", started_at=200.0)
    db.create_session("bound-elsewhere", "telegram", user_id="u1", started_at=150.0)
    db.create_session("other-user", "telegram", user_id="u2")
    db.create_session("not-telegram", "cli", user_id="u1")
    db.create_session("a-group", "telegram:-100", user_id="u1")
    bind(db, "bound-elsewhere", chat_id="another-chat")
    rows = db.list_unlinked_telegram_sessions_for_user(chat_id="chat-1", user_id="u1")
    assert [r["id"] for r in rows] == ["older", "newer"]
    assert rows[0]["title"] == "Research" and rows[0]["preview"] == ("first prompt " + "x" * 80)[:60] + "..."
    assert rows[0]["last_active"] == 300.0 and rows[1]["preview"] == ""
    assert [r["id"] for r in db.list_unlinked_telegram_sessions_for_user(chat_id="chat-1", user_id="u1", limit=1)] \
        == ["older"]
    assert db.list_unlinked_telegram_sessions_for_user(chat_id="chat-1", user_id="u1", limit=0) == []
    for bad in ({"limit": -1}, {"limit": "3"}, {"user_id": ""}, {"chat_id": None}):
        with pytest.raises(ValueError):
            db.list_unlinked_telegram_sessions_for_user(**{"chat_id": "chat-1", "user_id": "u1", **bad})


# --- the file as a whole -------------------------------------------------------------------------------------------

def test_recover_copies_the_bindings_and_a_file_without_them_stays_without(tg, tmp_path):
    untouched = tmp_path / "untouched.db"
    recover(tg.db_path, untouched)
    with sqlite3.connect(untouched) as plain:
        assert topic_objects(plain) == set()
    bind(tg, "s1")
    target = tmp_path / "recovered.db"
    recover(tg.db_path, target)
    with SessionDB(target) as copy:
        assert copy.get_telegram_topic_binding(chat_id="chat-1", thread_id="17")["session_id"] == "s1"
        with pytest.raises(TopicBindingConflictError):
            bind(copy, "s1", thread_id="99")
