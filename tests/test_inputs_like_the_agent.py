"""Odd inputs a caller may pass, decided with hermes-agent as the reference, and what happens downstream.

Each case runs on both programs (each on a file of its own) and compares what they answer and
what they store. Where the agent accepts a value, this library accepts it too and stores the same
row; where nothing downstream could use it as stored (a request to a provider), the projection
for that use refuses it with a typed error instead of passing it on broken.
"""
from __future__ import annotations

import math

import pytest

from agent_releases import AGENT_019, AGENT_020, attempt, call
from hermes_state import SessionDB, to_provider_messages

def RELEASES(test):  # noqa: N802 - a decorator named as the constant it replaces
    """Run `test` against each hermes-agent release (in the marked set CI runs after the default one)."""
    return pytest.mark.hermes_agent(pytest.mark.parametrize("release", [AGENT_019, AGENT_020],
                                                            ids=["0.19.0", "0.20.1"])(test))
ROWS = ["query", "SELECT role, content FROM messages ORDER BY id"]


@RELEASES
def test_an_unknown_role_and_numbers_as_content_are_stored_as_the_agent_stores_them(tmp_path, release):
    ops = [["create", "s1"], ["append", "s1", "robot", "hi"],
           call("append_message", "s1", "user", 123), call("append_message", "s1", "user", 1.5),
           call("append_message", "s1", "user", True), call("append_message", "s1", "user", 1e20),
           call("append_message", "s1", "user", -0.0), ROWS]
    theirs, mine = release.both(tmp_path, ops)
    assert mine[-1] == theirs[-1] == [["robot", "hi"], ["user", "123"], ["user", "1.5"], ["user", "1"],
                                      ["user", "1.0e+20"], ["user", "0.0"]]
    assert mine[:-1] == theirs[:-1]  # the ids each append returned


@RELEASES
def test_creating_an_existing_session_again_keeps_its_row_as_the_agent_does(tmp_path, release):
    ops = [["create", "s1"], call("create_session", "s1", "telegram"), call("create_session", "s1", "cli"),
           ["query", "SELECT id, source FROM sessions"]]
    theirs, mine = release.both(tmp_path, ops)
    assert mine == theirs and mine[-1] == [["s1", "cli"]]


@RELEASES
def test_a_query_that_is_no_text_finds_nothing_for_none_and_is_refused_otherwise(tmp_path, release):
    ops = [["create", "s1"], ["append", "s1", "user", "42 apples"], call("search_messages", None),
           attempt("search_messages", 42), attempt("search_messages", ["42"])]
    theirs, mine = release.both(tmp_path, ops)
    assert mine[2] == theirs[2] == []
    # hermes-agent fails on them too, with whatever its code met first; here it is a TypeError.
    assert all("raised" in answer for answer in theirs[3:])
    assert mine[3] == mine[4] == {"raised": ["TypeError", "Exception", "BaseException", "object"]}


def test_a_content_that_is_not_text_parts_or_a_number_is_refused_with_nothing_written(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s1", "cli")
        for bad in (b"bytes", {1, 2}, object(), [1, 2]):
            with pytest.raises(ValueError, match="content must be"):
                db.append_message("s1", "user", bad)
        db.append_message("s1", "user", math.nan)  # SQLite stores NaN as NULL, in hermes-agent's file too
        assert [(m["role"], m["content"]) for m in db.get_messages("s1")] == [("user", None)]
        assert db.get_session("s1")["message_count"] == 1


def test_what_no_provider_takes_is_refused_by_the_strict_route_not_sent_broken(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "robot", "hi")
        robot = db.get_messages_as_conversation("s1")
        db.create_session("s2", "cli")
        db.append_message("s2", "user", {"a": 1})  # a provider's wrapper object, kept whole
        wrapped = db.get_messages_as_conversation("s2")
    with pytest.raises(ValueError, match="message 0: role 'robot'"):
        to_provider_messages(robot, "openai")
    with pytest.raises(ValueError, match="message 0: its content is a dict"):
        to_provider_messages(wrapped, "openai")
    # A route that takes the wrapper gets it as it was stored; the row keeps its search text.
    assert to_provider_messages(wrapped, "anthropic") == [{"role": "user", "content": {"a": 1}}]


@RELEASES
def test_empty_filter_lists_mean_what_they_mean_in_the_agent(tmp_path, release):
    ops = [["create", "s1"], ["append", "s1", "user", "docker works"],
           call("search_messages", "docker", source_filter=[], spec="ids"),
           call("search_messages", "docker", role_filter=[], spec="ids"),
           call("search_messages", "docker", exclude_sources=[], spec="ids")]
    theirs, mine = release.both(tmp_path, ops)
    assert [len(a) for a in mine[2:]] == [len(a) for a in theirs[2:]] == [0, 1, 1]


@RELEASES
def test_the_agents_argument_names_are_taken_and_ours_still_are(tmp_path, release):
    ops = [["create", "s1"], call("set_session_title", "s1", "Fix the build"),
           call("get_next_title_in_lineage", base_title="Fix the build")]
    theirs, mine = release.both(tmp_path, ops)
    assert mine[-1] == theirs[-1] == "Fix the build #2"
    with SessionDB(tmp_path / "again.db") as db:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Fix the build")
        assert db.get_next_title_in_lineage(title="Fix the build") == "Fix the build #2"
        with pytest.raises(TypeError, match="once"):
            db.get_next_title_in_lineage("a", title="b")


def test_an_error_kept_only_as_text_is_classified_by_what_it_says():
    import sqlite3

    from hermes_state import classify_persistence_error, workspace_key
    assert [classify_persistence_error(t) for t in ("database is locked", "disk I/O error", "fts5: syntax error",
                                                    "database disk image is malformed", "no such table: x", "")] == \
        ["locked", "disk", "fts_index", "corrupt", "unknown", "unknown"]
    assert classify_persistence_error(exc=sqlite3.OperationalError("database is locked")) == "locked"
    assert classify_persistence_error(sqlite3.OperationalError("database is locked")) == "locked"
    assert workspace_key(row={"cwd": "/repo"}) == workspace_key(session={"cwd": "/repo"}) == "/repo"
    with pytest.raises(TypeError):
        workspace_key({"cwd": "/a"}, session={"cwd": "/b"})
