"""Gateway sessions: recording a session's messaging peer and finding a peer's session again.

Writes go through the SessionDB facade; what persisted is read back from `rival`, a second
connection. Start times are set through `rival` where an order between rows matters, so no
test depends on the clock's resolution.
"""
from __future__ import annotations

import json
import sqlite3

import pytest

import hermes_state_sessions as sessions
from hermes_state import SessionDB, SessionNotFoundError

KEY = "agent:main:telegram:dm:42"
PEER = {"source": "telegram", "user_id": "u1", "session_key": KEY, "chat_id": "42", "chat_type": "dm"}


def row(rival: sqlite3.Connection, session_id: str) -> sqlite3.Row:
    return rival.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()


def started(rival: sqlite3.Connection, session_id: str, at: float) -> None:
    rival.execute("UPDATE sessions SET started_at = ? WHERE id = ?", (at, session_id))


def peer_session(db: SessionDB, session_id: str, *, messages: int = 1, **columns) -> str:
    """Create a gateway session of PEER (columns override it) holding `messages` user messages."""
    values = {**PEER, **columns}
    db.create_session(session_id, values.pop("source"), **values)
    for i in range(messages):
        db.append_message(session_id, "user", f"message {i}")
    return session_id


def latest(db: SessionDB, **query) -> str | None:
    found = db.find_latest_gateway_session_for_peer(**{**PEER, **query})
    return None if found is None else found["id"]


# --- recording the peer ------------------------------------------------------------------------

def test_record_peer_sets_the_route_and_the_peer_description(db, rival):
    db.create_session("s", "cli", user_id="u1")
    origin = {"platform": "telegram", "chat_id": "42", "chat_name": "Alice"}
    db.record_gateway_session_peer("s", source="telegram", user_id="u1", session_key=KEY, chat_id="42",
                                   chat_type="dm", thread_id="t1", display_name="Alice", origin_json=json.dumps(origin))
    r = row(rival, "s")
    assert (r["source"], r["session_key"], r["chat_id"], r["chat_type"], r["thread_id"]) == \
        ("telegram", KEY, "42", "dm", "t1")
    assert r["display_name"] == "Alice" and json.loads(r["origin_json"]) == origin


def test_record_peer_keeps_the_description_but_replaces_the_route_as_a_whole(db, rival):
    db.create_session("s", "telegram", user_id="u1")
    db.record_gateway_session_peer("s", source="telegram", session_key=KEY, chat_id="42", chat_type="group",
                                   thread_id="t1", display_name="Alice", origin_json='{"chat_name": "Alice"}')
    db.record_gateway_session_peer("s", source="telegram", session_key=KEY, chat_id="43", chat_type="dm")
    r = row(rival, "s")
    assert (r["chat_id"], r["chat_type"], r["thread_id"]) == ("43", "dm", None)  # no thread now
    assert r["display_name"] == "Alice" and r["origin_json"] == '{"chat_name": "Alice"}'


def test_record_peer_never_changes_the_user_the_row_was_created_for(db, rival):
    db.create_session("s", "telegram", user_id="u1")
    db.create_session("bare", "telegram")
    db.record_gateway_session_peer("s", source="telegram", user_id="u2", session_key=KEY)
    db.record_gateway_session_peer("bare", source="telegram", user_id="u2", session_key=KEY)
    assert row(rival, "s")["user_id"] == "u1"
    assert row(rival, "bare")["user_id"] is None


def test_record_peer_stores_numeric_platform_ids_as_text_and_encodes_an_origin_value(db, rival):
    db.create_session("s", "telegram")
    db.record_gateway_session_peer("s", source="telegram", session_key=KEY, chat_id=-100123, thread_id=7,
                                   origin_json={"chat_name": "Ops"})
    r = row(rival, "s")
    assert (r["chat_id"], r["thread_id"]) == ("-100123", "7")
    assert json.loads(r["origin_json"]) == {"chat_name": "Ops"}


@pytest.mark.parametrize("bad", [
    {"session_key": None}, {"session_key": ""}, {"source": None}, {"source": ""},
    {"chat_type": 5}, {"display_name": b"Alice"}, {"user_id": 3.5}, {"chat_id": True},
])
def test_record_peer_refuses_bad_input_and_writes_nothing(db, rival, bad):
    db.create_session("s", "cli", display_name="before")
    before = dict(row(rival, "s"))
    with pytest.raises(ValueError):
        db.record_gateway_session_peer("s", **{"source": "telegram", "session_key": KEY, "chat_id": "42",
                                               "display_name": "after", **bad})
    assert dict(row(rival, "s")) == before


def test_record_peer_of_an_unknown_session_raises_and_creates_nothing(db, rival):
    with pytest.raises(SessionNotFoundError):
        db.record_gateway_session_peer("nope", source="telegram", session_key=KEY)
    assert row(rival, "nope") is None


def test_expiry_finalized_sets_and_clears_the_flag(db, rival):
    db.create_session("s", "telegram", session_key=KEY)
    assert row(rival, "s")["expiry_finalized"] == 0
    db.set_expiry_finalized("s")
    assert row(rival, "s")["expiry_finalized"] == 1
    db.set_expiry_finalized("s", False)
    assert row(rival, "s")["expiry_finalized"] == 0


@pytest.mark.parametrize("bad", ["yes", None, 2, 0.5])
def test_expiry_finalized_refuses_a_value_that_is_not_a_flag(db, rival, bad):
    db.create_session("s", "telegram", session_key=KEY)
    db.set_expiry_finalized("s")
    with pytest.raises(ValueError, match="expiry_finalized"):
        db.set_expiry_finalized("s", bad)
    assert row(rival, "s")["expiry_finalized"] == 1


def test_expiry_finalized_of_an_unknown_session_raises(db):
    with pytest.raises(SessionNotFoundError):
        db.set_expiry_finalized("nope")


# --- the latest recoverable session of a peer ----------------------------------------------------

def test_latest_for_peer_returns_the_whole_row_of_the_newest_match(db, rival):
    peer_session(db, "old")
    peer_session(db, "new")
    started(rival, "old", 1000.0)
    started(rival, "new", 2000.0)
    found = db.find_latest_gateway_session_for_peer(**PEER)
    assert found == db.get_session("new")


def test_latest_for_peer_matches_the_key_whatever_the_other_fields_say(db):
    peer_session(db, "s", thread_id="t1")
    assert latest(db, user_id="someone else", chat_id="other", chat_type="group", thread_id="t2") == "s"
    assert latest(db, user_id=None, chat_id=None, chat_type=None) == "s"


def test_latest_for_peer_needs_a_key_the_same_source_and_a_conversation(db):
    peer_session(db, "s")
    peer_session(db, "empty", messages=0, session_key="agent:main:telegram:dm:7", chat_id="7")
    assert latest(db, session_key=None) is None
    assert latest(db, source="discord") is None
    assert latest(db, source="TELEGRAM") is None  # the source is the stored name, exactly
    assert latest(db, session_key="agent:main:telegram:dm:7", chat_id="7") is None  # nothing to recover yet


@pytest.mark.parametrize("reason", ["agent_close", "ws_orphan_reap"])
def test_latest_for_peer_recovers_rows_ended_by_the_process_own_cleanup(db, reason):
    peer_session(db, "s")
    db.end_session("s", reason)
    assert latest(db) == "s"


@pytest.mark.parametrize("reason", ["session_reset", "user_exit", "compression", "idle_expired"])
def test_latest_for_peer_skips_rows_ended_on_purpose(db, reason):
    peer_session(db, "s")
    db.end_session("s", reason)
    assert latest(db) is None


def test_latest_for_peer_falls_back_to_an_older_live_row_when_the_newest_was_reset(db, rival):
    peer_session(db, "old")
    peer_session(db, "new")
    started(rival, "old", 1000.0)
    started(rival, "new", 2000.0)
    db.end_session("new", "session_reset")
    assert latest(db) == "old"


def test_latest_for_peer_finds_the_compression_continuation(db):
    peer_session(db, "parent")
    db.rotate_session("parent", "child", db.get_messages_as_conversation("parent"))
    assert latest(db) == "child"


def test_latest_for_peer_under_another_key_needs_user_chat_type_and_thread_to_match(db):
    peer_session(db, "s", session_key="agent:main:telegram:42", thread_id="t1")  # the key's older format
    assert latest(db, thread_id="t1") == "s"
    assert latest(db) is None  # the stored thread differs from "no thread"
    for field, other in (("user_id", "u2"), ("chat_id", "43"), ("chat_type", "group"), ("thread_id", "t2")):
        assert latest(db, **{"thread_id": "t1", field: other}) is None, field
    for field in ("user_id", "chat_id", "chat_type"):
        assert latest(db, **{"thread_id": "t1", field: None}) is None, field


def test_latest_for_peer_prefers_the_key_match_over_a_newer_row_under_another_key(db, rival):
    peer_session(db, "by-key")
    peer_session(db, "by-fields", session_key="agent:main:telegram:42")
    started(rival, "by-key", 1000.0)
    started(rival, "by-fields", 2000.0)
    assert latest(db) == "by-key"


@pytest.mark.parametrize("bad", [{"source": None}, {"source": ""}, {"session_key": 5}, {"user_id": b"u1"}])
def test_latest_for_peer_refuses_arguments_of_the_wrong_type(db, bad):
    with pytest.raises(ValueError):
        db.find_latest_gateway_session_for_peer(**{**PEER, **bad})


def test_latest_for_peer_answers_none_for_text_no_row_can_hold(db):
    peer_session(db, "s")
    assert latest(db, session_key="agent:\ud800") is None


# --- the current session of each key --------------------------------------------------------------

def test_gateway_listing_shows_the_newest_row_of_each_key_most_recently_active_first(db, rival):
    peer_session(db, "tg-old", messages=0)
    peer_session(db, "tg-new", messages=0)
    peer_session(db, "dc", messages=0, source="discord", session_key="agent:main:discord:group:9")
    db.create_session("cli", "cli")
    started(rival, "tg-old", 1000.0)
    started(rival, "tg-new", 2000.0)
    started(rival, "dc", 1500.0)
    assert [r["id"] for r in db.list_gateway_sessions()] == ["tg-new", "dc"]
    db.append_message("dc", "user", "later", timestamp=3000.0)
    rows = db.list_gateway_sessions()
    assert [(r["id"], r["last_active"]) for r in rows] == [("dc", 3000.0), ("tg-new", 2000.0)]
    assert rows[1] == {**db.get_session("tg-new"), "last_active": 2000.0}


def test_gateway_listing_leaves_out_a_key_whose_newest_row_ended_unless_asked(db, rival):
    peer_session(db, "live-older", messages=0)
    peer_session(db, "ended-newer", messages=0)
    started(rival, "live-older", 1000.0)
    started(rival, "ended-newer", 2000.0)
    db.end_session("ended-newer", "session_reset")
    assert db.list_gateway_sessions() == []
    assert [r["id"] for r in db.list_gateway_sessions(active_only=False)] == ["ended-newer"]


def test_gateway_listing_filters_by_platform_without_case(db):
    peer_session(db, "tg", messages=0)
    peer_session(db, "dc", messages=0, source="discord", session_key="agent:main:discord:dm:1")
    assert [r["id"] for r in db.list_gateway_sessions(platform="Telegram")] == ["tg"]
    assert db.list_gateway_sessions(platform="slack") == []


def test_gateway_listing_never_shows_rows_without_a_key(db):
    db.create_session("cli", "cli")
    db.create_session("blank", "telegram", session_key="")
    assert db.list_gateway_sessions(active_only=False) == []


@pytest.mark.parametrize("platform", ["", 5])
def test_gateway_listing_refuses_a_platform_that_is_not_a_name(db, platform):
    with pytest.raises(ValueError, match="platform"):
        db.list_gateway_sessions(platform=platform)


# --- the live session of a chat --------------------------------------------------------------------

def chat_session(db: SessionDB, session_id: str, user_id: str | None, chat_id: str = "c9", **columns) -> None:
    db.create_session(session_id, columns.pop("source", "telegram"), user_id=user_id, chat_id=chat_id,
                      session_key=f"agent:main:telegram:group:{chat_id}:{session_id}", **columns)


def origin(db: SessionDB, **query) -> str | None:
    return db.find_session_by_origin(**{"platform": "telegram", "chat_id": "c9", **query})


def test_origin_prefers_the_user_newest_session_and_refuses_to_guess_between_users(db, rival):
    chat_session(db, "a1", "u1")
    chat_session(db, "a2", "u1")
    chat_session(db, "b", "u2")
    for sid, at in (("a1", 1000.0), ("a2", 2000.0), ("b", 3000.0)):
        started(rival, sid, at)
    assert origin(db, user_id="u1") == "a2"
    assert origin(db, user_id="u2") == "b"
    assert origin(db, user_id="u3") is None  # not theirs, and two users' sessions to choose from
    assert origin(db) is None


def test_origin_answers_a_lone_live_candidate_even_for_another_user(db):
    chat_session(db, "a", "u1")
    chat_session(db, "b", "u2")
    db.end_session("b", "session_reset")
    assert origin(db, user_id="u2") == "a"
    assert origin(db) == "a"


def test_origin_without_a_user_takes_the_newest_when_one_user_or_nobody_owns_the_candidates(db, rival):
    chat_session(db, "a", "u1")
    chat_session(db, "anon", None)
    started(rival, "a", 1000.0)
    started(rival, "anon", 2000.0)
    assert origin(db) == "anon"
    assert origin(db, user_id="u2") is None  # two candidates, neither the user's


def test_origin_ignores_ended_and_keyless_rows(db):
    chat_session(db, "closed", "u1")
    db.end_session("closed", "agent_close")
    db.create_session("keyless", "telegram", user_id="u1", chat_id="c9")
    assert origin(db) is None


def test_origin_filters_by_thread_only_when_one_is_given(db):
    chat_session(db, "th", "u9", chat_id="ch7", source="discord", thread_id="t7")
    assert db.find_session_by_origin(platform="discord", chat_id="ch7", thread_id="t7") == "th"
    assert db.find_session_by_origin(platform="discord", chat_id="ch7", thread_id="t8") is None
    assert db.find_session_by_origin(platform="Discord", chat_id="ch7") == "th"


def test_origin_takes_a_numeric_chat_id(db):
    chat_session(db, "s", "u1", chat_id="-100123")
    assert db.find_session_by_origin(platform="telegram", chat_id=-100123) == "s"


@pytest.mark.parametrize("bad", [{"platform": ""}, {"platform": None}, {"chat_id": ""}, {"chat_id": None},
                                 {"user_id": 1.5}, {"thread_id": b"t"}])
def test_origin_refuses_arguments_of_the_wrong_type(db, bad):
    with pytest.raises(ValueError):
        db.find_session_by_origin(**{"platform": "telegram", "chat_id": "c9", **bad})


def test_module_functions_run_on_a_bare_connection(conn):
    # A caller inside its own transaction hands the module its connection, as this bare one is.
    conn.execute("INSERT INTO sessions (id, source, started_at, session_key, chat_id) VALUES ('s', 'x', 1, 'k', 'c')")
    assert sessions.find_session_by_origin(conn, platform="X", chat_id="c") == "s"
    assert [r["id"] for r in sessions.list_gateway_sessions(conn, platform="x")] == ["s"]
