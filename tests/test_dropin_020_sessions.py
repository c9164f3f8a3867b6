"""hermes-agent 0.20.1's session-row names, differentially: pin, hide, read, stale archive, activity, titles, model_config.

Each scenario runs the same operations (tests/hermes_agent_driver.py's `run`) on the real
hermes-agent 0.20.1 in its own venv and here, each on a fresh file, and compares what a caller
sees. Where this library answers differently on purpose (docs/api.md, "hermes-agent 0.20.1:
session rows") the scenario stays on inputs both agree on and a `test_rule_*` test holds the
documented behaviour. The coexistence tests check that each program reads what the other wrote
in the shared columns (pinned, hidden, last_read_at, title_source, last_activity_*).
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import hermes_agent_driver as driver
from agent_releases import AGENT_020
from hermes_state import ActivityProvenance, SessionDB
from hermes_state_errors import SessionNotFoundError

pytestmark = pytest.mark.hermes_agent

DAY = 86400.0


@pytest.fixture
def need_agent():
    AGENT_020.require()


def ours(path: Path, ops: list) -> list:
    with SessionDB(path) as db:
        return driver.run(db, path, ops)


def both(tmp_path: Path, ops: list) -> tuple[list, list]:
    """Return (hermes-agent 0.20.1's answers, hermes-state's answers) to `ops`, each on a fresh file."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "ours").mkdir()
    return AGENT_020.run(tmp_path / "agent" / "state.db", *ops), ours(tmp_path / "ours" / "state.db", ops)


def call(method: str, *args: Any, spec: Any = None, **kwargs: Any) -> list:
    return ["call", method, list(args), kwargs, spec]


def attempt(method: str, *args: Any, **kwargs: Any) -> list:
    return ["try", method, list(args), kwargs, None]


def assert_same(theirs: list, mine: list, ops: list) -> None:
    """Equal answers; for a `try` the error hermes-agent raised must be a class this library's error is too.

    Bad input that hermes-agent trips over by accident (an AttributeError or TypeError from deep
    inside) is a ValueError here, the error this library gives bad input.
    """
    assert len(theirs) == len(mine) == len(ops)
    for n, (a, b, op) in enumerate(zip(theirs, mine, ops)):
        if op[0] == "try" and isinstance(a, dict) and "raised" in a:
            accepted = {a["raised"][0]} | ({"ValueError"} if a["raised"][0] in ("AttributeError", "TypeError") else set())
            assert isinstance(b, dict) and accepted & set(b.get("raised", [])), \
                f"operation {n} {op[:3]}: hermes-agent raised {a['raised'][0]}, hermes-state answered {b!r}"
            continue
        assert a == b, f"operation {n} {op[:3]}: hermes-agent {a!r} != hermes-state {b!r}"


def raw(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return [tuple(r) for r in conn.execute(sql, params)]


FLAGS = ["id", "pinned", "hidden"]


def test_pin_hide_and_read_flip_the_whole_chain_as_hermes_agent_does(tmp_path, need_agent):
    ops = [
        ["create", "a"], ["create", "b"], ["create", "c"], ["end", "a", "compression"], ["create_child", "a2", "a"],
        call("set_session_pinned", "a2", True), call("set_session_pinned", "a2", True),
        call("set_session_pinned", "nope", True), call("get_session", "a", spec=FLAGS),
        call("set_session_hidden", "a", True), call("set_session_hidden", "nope", False),
        call("get_session", "a2", spec=FLAGS),
        call("list_sessions_rich", spec="ids"), call("list_sessions_rich", include_hidden=True, spec="ids"),
        call("set_session_hidden", "a2", False), call("list_sessions_rich", spec="ids"),
        call("set_session_pinned", "a", False), call("get_session", "a2", spec=FLAGS),
        call("set_session_read", "b"), call("set_session_read", "nope"),
        call("list_sessions_rich", spec=["id", "unread"]),
        call("set_session_read", "c", False), call("list_sessions_rich", spec=["id", "unread"]),
        ["append", "b", "user", "after the read mark"], call("list_sessions_rich", spec=["id", "unread"]),
        call("set_session_read", "b", True), call("list_sessions_rich", spec=["id", "unread"]),
        ["query", "SELECT id, last_read_at IS NULL, last_read_at = 0 FROM sessions ORDER BY id"],
        attempt("set_session_pinned", None, True),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


def test_session_unread_reads_a_row_as_hermes_agent_does(tmp_path, need_agent):
    rows = [{}, {"last_read_at": 0, "last_active": 5}, {"last_read_at": 0}, {"last_read_at": 10, "last_active": 5},
            {"last_read_at": 10, "last_active": 10}, {"last_read_at": 10, "last_active": 11},
            {"last_read_at": 10, "started_at": 12}, {"last_read_at": 10, "last_active": None},
            {"last_read_at": None, "last_active": 99}]
    ops = [call("session_unread", row) for row in rows]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


def test_the_rich_listing_filters_new_in_0_20_answer_as_hermes_agent(tmp_path, need_agent):
    ops = [["create", "a"], ["create", "b", "telegram"], ["create", "c", "discord"], ["create", "d"], ["create", "e"]]
    ops += [["age", sid, 100 - n] for n, sid in enumerate("abcde")]
    ops += [
        ["query", "UPDATE sessions SET session_key = 'k1' WHERE id IN ('b', 'd') RETURNING id"],
        call("set_session_pinned", "a", True),
        call("list_sessions_rich", spec="ids"), call("list_sessions_rich", limit=2, spec="ids"),
        call("list_sessions_rich", limit=2, include_pinned=True, spec="ids"),
        call("list_sessions_rich", limit=2, offset=1, include_pinned=True, spec="ids"),
        call("list_sessions_rich", sources=["telegram", "discord"], spec="ids"),
        call("list_sessions_rich", source="cli", sources=["telegram"], spec="ids"),
        call("list_sessions_rich", sources=[], spec="ids"),
        call("list_sessions_rich", session_key="k1", spec="ids"), call("list_sessions_rich", session_key="", spec="ids"),
        call("set_session_hidden", "a", True),
        call("list_sessions_rich", limit=2, include_pinned=True, spec="ids"),
        call("list_sessions_rich", limit=2, include_pinned=True, include_hidden=True, spec="ids"),
        call("set_session_pinned", "b", True),
        call("list_sessions_rich", limit=1, include_pinned=True, include_hidden=True, spec="ids"),
        call("get_session_rich_row", "c", spec=["id", "source", "preview", "pinned", "hidden", "last_read_at"]),
        call("get_session_rich_row", "nope"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


ACTIVITY = ["last_activity_at", "last_activity_description", "last_activity_provenance", "last_activity_ts",
            "last_activity_desc", "description", "provenance"]


def test_activity_stamps_and_labels_answer_as_hermes_agent(tmp_path, need_agent):
    ops = [
        ["create", "a"], ["create", "b"],
        call("get_session_activity", "a", spec=ACTIVITY), call("get_session_activity", "nope"),
        call("touch_session_activity", "a", 1000.0, description="compressing", provenance="agent.compression"),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "a", 900.0, description="older", provenance="unknown"),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "a", 1100.0, description="  padded  ", provenance="not a provenance"),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "a", 1200.0, description="y" * 300),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "a", 1300.0, description="z" * 120, provenance="agent.compression_timeout"),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "a", 1400.0),
        call("get_session_activity", "a", spec=ACTIVITY),
        call("touch_session_activity", "nope", 1500.0), call("touch_session_activity", "", 1500.0),
        call("touch_session_activity", "b", 500.0, description="tool", provenance="agent.compression_cooldown"),
        call("clear_session_activity_labels", "b"), call("get_session_activity", "b", spec=ACTIVITY),
        call("clear_session_activity_labels", "nope"),
        ["query", "SELECT id, last_activity_at, last_activity_description, last_activity_provenance FROM sessions "
                  "ORDER BY id"],
        attempt("touch_session_activity", "a", "soon"),
        attempt("touch_session_activity", "a", 2000.0, description=5),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


def test_title_sources_answer_as_hermes_agent(tmp_path, need_agent):
    ops = [
        ["create", "a"], ["create", "b"], ["create", "c"], ["create", "d"],
        call("get_session_title_source", "a"), call("set_session_title", "a", "Hello"),
        call("get_session_title_source", "a"),
        call("set_auto_title", "a", "Derived", source="derived"), call("set_auto_title", "a", "Model", source="llm"),
        call("get_session_title", "a"),
        call("set_auto_title", "b", "B1", source="derived"), call("get_session_title_source", "b"),
        call("set_auto_title", "b", "B2", source="derived"), call("set_auto_title", "b", "B3", source="llm"),
        call("set_auto_title", "b", "B4", source="derived"), call("set_auto_title", "b", "B5", source="llm"),
        call("get_session_title", "b"), call("get_session_title_source", "b"),
        call("set_auto_title", "nope", "N", source="llm"), call("set_auto_title", "c", "   ", source="llm"),
        call("set_auto_title", "c", None, source="llm"), call("get_session_title_source", "c"),
        call("set_session_title_source", "c", "llm"), call("set_session_title_source", "nope", "llm"),
        call("set_session_title_source", "a", "derived"), call("get_session_title_source", "a"),
        call("set_session_title", "a", None), call("get_session_title_source", "a"),
        call("set_auto_title_if_empty", "d", "Generated"), call("get_session_title_source", "d"),
        call("set_auto_title", "c", "Derived", source="derived"), call("set_auto_title", "c", "  ", source="llm"),
        call("get_session_title", "c"), attempt("set_auto_title", "c", "Generated", source="llm"),
        ["query", "SELECT id, title, title_source FROM sessions ORDER BY id"],
        attempt("set_auto_title", "c", "C", source="user"), attempt("set_auto_title", "c", "C", source="bogus"),
        attempt("set_auto_title", "c", "C", source=None), attempt("set_auto_title", "c", "C"),
        attempt("set_auto_title", "c", "x" * 200, source="llm"),
        attempt("set_session_title_source", "b", "bogus"), attempt("set_session_title_source", "b", None),
        call("get_session_title", "c"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert theirs[-1] is None  # nothing refused wrote anything


def test_the_title_source_constants_are_hermes_agents(tmp_path, need_agent):
    ops = [["query", "SELECT 1"]]
    assert (SessionDB.TITLE_SOURCE_USER, SessionDB.TITLE_SOURCE_LLM, SessionDB.TITLE_SOURCE_DERIVED) == \
        ("user", "llm", "derived")
    assert [p.value for p in ActivityProvenance] == ["unknown", "agent.compression", "agent.compression_timeout",
                                                     "agent.compression_cooldown"]
    assert isinstance(ActivityProvenance.AGENT_COMPRESSION, str)
    assert AGENT_020.run(tmp_path / "state.db", *ops) == [[[1]]]


LOCK = ["provider", "model", "model_options", "route_source", "confirmed"]


def test_model_config_helpers_answer_as_hermes_agent(tmp_path, need_agent):
    def value(sid: str, key: str, default: Any = None, spec: Any = None) -> list:
        return call("get_session_model_config_value", sid, key, default, spec=spec)

    ops = [
        ["create", "a"], ["create", "b"], ["create", "c"],
        call("patch_session_model_config", "a", {"_branched_from": "x", "k": 1}),
        call("patch_session_model_config", "a", {"k": 2, "n": {"x": 1}}), value("a", "k"), value("a", "n"),
        call("patch_session_model_config", "a", {"k": None}), value("a", "k", 7), value("a", "_branched_from"),
        call("patch_session_model_config", "a", {}), call("patch_session_model_config", "b", {"gone": None}),
        value("nope", "k", 3), value("b", "k", 3),
        ["query", "UPDATE sessions SET model_config = 'not json' WHERE id = 'c' RETURNING id"],
        value("c", "k", 3), call("patch_session_model_config", "c", {"z": 1}), value("c", "z"),
        call("set_session_yolo", "a", True), value("a", "yolo_mode"), value("a", "_branched_from"),
        call("set_session_yolo", "a", False), value("a", "yolo_mode"), call("set_session_yolo", "nope", True),
        call("update_session_runtime_lock", "a", model="m1", provider="p1", model_options={"t": 1},
             route_source="browser", confirmed=True),
        value("a", "browser_model_lock", spec=LOCK), call("get_session", "a", spec=["model", "system_prompt"]),
        call("update_session_runtime_lock", "a", model="m2"), value("a", "browser_model_lock", spec=LOCK),
        call("update_session_runtime_lock", "a"), value("a", "browser_model_lock", spec=LOCK),
        call("get_session", "a", spec=["model"]), value("a", "yolo_mode"),
        attempt("update_session_runtime_lock", "a", "positional"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


def test_runtime_and_yolo_readers_answer_as_hermes_agent(tmp_path, need_agent):
    metas = [None, {}, {"model_config": {"yolo_mode": True}}, {"model_config": {"yolo_mode": "yes"}},
             {"model_config": '{"yolo_mode": true}'}, {"model_config": "{bad"}, {"model_config": [1]},
             {"yolo_mode": True},
             {"model_config": {"gateway_runtime": {"provider": "p", "base_url": "u", "api_mode": "m", "other": 1}}},
             {"model_config": {"provider": "p", "base_url": "u", "api_mode": "m", "model": "x"}},
             {"model_config": {"provider": "p"}}, {"model_config": None, "billing_provider": "bp"},
             {"model_config": {"gateway_runtime": {"model": "q"}}, "billing_provider": "bp"},
             {"model_config": {"gateway_runtime": {}}, "billing_provider": "bp"},
             {"model_config": {"gateway_runtime": "x"}, "billing_provider": "bp"},
             {"model_config": "{bad", "billing_provider": "bp"},
             {"model_config": '{"gateway_runtime": {"provider": "p", "model": "mm"}}'},
             {"model_config": {"provider": "", "base_url": None}, "billing_provider": "bp"},
             {"model_config": {"gateway_runtime": {"provider": "", "model": None, "x": 0}}},
             {"model_config": {"base_url": "u"}, "billing_provider": "bp"},
             {"model_config": {"gateway_runtime": {"provider": None}}},
             {"model_config": {"gateway_runtime": {"model": "q"}, "provider": "tp"}}, {"billing_provider": ""},
             {"model_config": '"text"', "billing_provider": "bp"}]
    ops = [call("session_yolo_enabled", m) for m in metas] + [call("session_gateway_runtime", m) for m in metas]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


GIT = ["cwd", "git_branch", "git_repo_root", "git_metadata_generation"]


def test_working_directory_generations_answer_as_hermes_agent(tmp_path, need_agent):
    ops = [
        ["create", "a"], ["create", "b"],
        call("update_session_cwd", "a", "/r", "main", "/r"), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/r"), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/s"), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/r", "dev", ""), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/t", None, None, True), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/t", "b2", "/t", replace_git_meta=True), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", "/t", "", "", replace_git_meta=True), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "a", None), call("update_session_cwd", "a", ""), call("get_session", "a", spec=GIT),
        call("update_session_cwd", "b", "/r"),
        call("publish_session_git_metadata", "b", "/r", 1, git_branch="main", git_repo_root="/r"),
        call("get_session", "b", spec=GIT),
        call("publish_session_git_metadata", "b", "/r", 0, git_branch="x", git_repo_root="/x"),
        call("publish_session_git_metadata", "b", "/q", 1, git_branch="x"),
        call("publish_session_git_metadata", "b", "/r", 1, git_branch="", git_repo_root=None),
        call("publish_session_git_metadata", "b", "/r", 1), call("publish_session_git_metadata", "nope", "/r", 1,
                                                                    git_branch="x"),
        call("update_session_cwd", "b", "/s"), call("publish_session_git_metadata", "b", "/s", 2, "br", "/s"),
        call("get_session", "b", spec=GIT),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


def test_a_model_switch_with_its_provider_answers_as_hermes_agent(tmp_path, need_agent):
    def config(sid: str) -> list:
        return call("get_session", sid, spec=["model", "system_prompt"])

    ops = [
        ["create", "a"], ["create", "b"],
        call("patch_session_model_config", "a", {"_branched_from": "x", "browser_model_lock": {"model": "old"}}),
        call("update_system_prompt", "a", "You are the old model."),
        call("update_session_model", "a", "m1"), config("a"),
        call("get_session_model_config_value", "a", "model"), call("get_session_model_config_value", "a", "provider"),
        call("get_session_model_config_value", "a", "browser_model_lock"),
        call("get_session_model_config_value", "a", "_branched_from"),
        call("update_session_model", "a", "m2", provider="p2"), call("get_session_model_config_value", "a", "provider"),
        call("update_session_model", "a", "m3"), call("get_session_model_config_value", "a", "provider"),
        call("update_session_model", "a", "m4", provider=""), call("get_session_model_config_value", "a", "provider"),
        call("get_session_model_config_value", "a", "model"), config("a"),
        call("update_session_model", "b", "m1", "p"), call("get_session_model_config_value", "b", "provider"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


ARCHIVED = ["id", "archived"]


def test_the_stale_sweep_answers_as_hermes_agent(tmp_path, need_agent):
    ops = [["create", s] for s in "abcdefg"]
    ops += [
        ["age", "b", 10 * DAY], ["age", "c", 10 * DAY], ["age", "d", 10 * DAY], ["age", "e", 10 * DAY],
        ["age", "f", 20 * DAY], ["age", "g", 10 * DAY],
        call("set_session_pinned", "c", True), ["append", "d", "user", "recent"],
        call("touch_session_activity", "e", 4e9),  # an activity stamp in the future
        ["end", "f", "user_exit"], ["end", "g", "compression"], ["create_child", "g2", "g"],
        ["query", "UPDATE sessions SET ended_at = ended_at - 9 * 86400 WHERE id = 'g' RETURNING id"],
        ["query", "UPDATE sessions SET started_at = (SELECT ended_at FROM sessions WHERE id = 'g') WHERE id = 'g2' "
                  "RETURNING id"],
        call("archive_stale_sessions", 5), call("archive_stale_sessions", 5),
        call("archive_stale_sessions", -1), call("archive_stale_sessions", None),
        call("list_sessions_rich", include_archived=True, include_children=True, project_compression_tips=False,
             spec=ARCHIVED),
        call("archive_stale_sessions", 5, exclude_pinned=False),
        call("maybe_auto_archive"), call("maybe_auto_archive"), call("maybe_auto_archive", 3, 0),
        ["query", "SELECT key FROM state_meta WHERE key = 'last_auto_archive'"],
        ["query", "SELECT id, archived FROM sessions ORDER BY id"],
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)


# --- rules: where this library answers differently on purpose (docs/api.md) ------------------------

def test_rule_flags_and_stamps_take_bools_and_numbers_only(db):
    db.create_session("a", "cli")
    for call_it in (lambda: db.set_session_pinned("a", "yes"), lambda: db.set_session_hidden("a", 2),
                    lambda: db.set_session_read("a", "x"), lambda: db.set_session_yolo("a", "on"),
                    lambda: db.touch_session_activity("a", float("nan")),
                    lambda: db.archive_stale_sessions("x"), lambda: db.archive_stale_sessions(float("nan")),
                    lambda: db.maybe_auto_archive("x", 0), lambda: db.maybe_auto_archive(3, "x"),
                    lambda: db.patch_session_model_config("a", [1, 2]),
                    lambda: db.patch_session_model_config("a", {"s": {1, 2}}),
                    lambda: db.update_session_runtime_lock("a", model=5),
                    lambda: db.update_session_runtime_lock("a", model_options=[1]),
                    lambda: db.update_session_model("a", "m", provider=5),
                    lambda: db.publish_session_git_metadata("a", "/r", "1", git_branch="x"),
                    lambda: db.list_sessions_rich(sources="cli"), lambda: db.list_sessions_rich(sources=[1]),
                    lambda: db.list_sessions_rich(session_key=5)):
        with pytest.raises(ValueError):
            call_it()
    row = db.get_session("a")
    assert (row["pinned"], row["hidden"], row["last_read_at"], row["model_config"], row["model"]) == (0, 0, None, None,
                                                                                                     None)


def test_rule_an_unknown_session_in_a_model_config_write_is_an_error(db):
    for call_it in (lambda: db.patch_session_model_config("nope", {"k": 1}),
                    lambda: db.update_session_runtime_lock("nope", model="m"),
                    lambda: db.update_session_model("nope", "m", provider="p"),
                    lambda: db.update_session_cwd("nope", "/r")):
        with pytest.raises(SessionNotFoundError):
            call_it()
    # Observation-only bookkeeping stays quiet, as hermes-agent documents it.
    assert db.touch_session_activity("nope") is None
    assert db.clear_session_activity_labels("nope") is None
    assert db.set_session_yolo("nope", True) is None


def test_rule_the_stale_sweeps_archive_is_lifted_when_the_conversation_resumes(db):
    db.create_session("a", "cli", started_at=1.0)
    db.create_session("p", "cli", started_at=1.0)
    db.set_session_pinned("p", True)
    assert db.archive_stale_sessions(1) == 1
    row = db.get_session("a")
    assert (row["archived"], row["auto_archived"]) == (1, 1)
    assert db.get_session("p")["archived"] == 0
    db.append_message("a", "user", "back again")
    assert db.get_session("a")["archived"] == 0


# --- one file, both programs: each reads what the other wrote in the shared columns --------------

def test_the_agent_reads_the_flags_marks_titles_and_labels_this_library_wrote(tmp_path, need_agent):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        for sid in "abc":
            db.create_session(sid, "cli")
        db.set_session_pinned("a", True)
        db.set_session_hidden("b", True)
        db.set_session_read("c", False)
        db.append_message("c", "user", "unread now")
        db.set_session_title("a", "Mine")
        db.set_auto_title("c", "Generated", source="derived")
        db.touch_session_activity("a", 1234.5, description="executing tool", provenance=ActivityProvenance.UNKNOWN)
        db.touch_session_activity("c", 4e9, description="compressing", provenance="agent.compression")
        db.update_session_cwd("c", "/repo", "main", "/repo")
    answers = AGENT_020.run(
        path, call("list_sessions_rich", spec=["id", "pinned", "unread"]),
        call("list_sessions_rich", include_hidden=True, spec="ids"),
        call("get_session_title_source", "a"), call("get_session_title_source", "c"),
        call("set_auto_title", "a", "Model title", source="llm"), call("set_auto_title", "c", "Model title", source="llm"),
        call("get_session_activity", "a", spec=["last_activity_at", "description", "provenance"]),
        call("get_session_activity", "c", spec=["last_activity_at", "description", "provenance"]),
        call("publish_session_git_metadata", "c", "/repo", 1, git_branch="dev"))
    assert answers[0] == [{"id": "c", "pinned": 0, "unread": True}, {"id": "a", "pinned": 1, "unread": False}]
    assert answers[1] == ["c", "b", "a"]
    assert answers[2:6] == ["user", "derived", False, True]
    assert answers[6] == {"last_activity_at": 1234.5, "description": "executing tool", "provenance": "unknown"}
    assert answers[7] == {"last_activity_at": 4e9, "description": "compressing", "provenance": "agent.compression"}
    assert answers[8] is True


def test_this_library_reads_the_flags_marks_titles_and_labels_the_agent_wrote(tmp_path, need_agent):
    path = tmp_path / "state.db"
    AGENT_020.run(
        path, ["create", "a"], ["create", "b"], ["create", "c"], call("set_session_pinned", "a", True),
        call("set_session_hidden", "b", True), call("set_session_read", "c", False),
        ["append", "c", "user", "unread now"], call("set_auto_title", "c", "Generated", source="llm"),
        call("set_session_title", "a", "Theirs"),
        call("touch_session_activity", "a", 1234.5, description="executing tool", provenance="agent.compression"),
        call("update_session_cwd", "c", "/repo"))
    with SessionDB(path) as db:
        assert [(r["id"], r["pinned"], r["unread"]) for r in db.list_sessions_rich()] == [("c", 0, True), ("a", 1, False)]
        assert [r["id"] for r in db.list_sessions_rich(include_hidden=True)] == ["c", "b", "a"]
        assert (db.get_session_title_source("a"), db.get_session_title_source("c")) == ("user", "llm")
        assert db.set_auto_title("a", "Derived", source="derived") is False
        activity = db.get_session_activity("a")
        assert (activity["last_activity_at"], activity["description"], activity["provenance"]) == (
            1234.5, "executing tool", "agent.compression")
        db.clear_session_activity_labels("a")
        assert db.publish_session_git_metadata("c", "/repo", 1, git_branch="main") is True
        assert db.update_session_cwd("c", "/repo") == 2
    assert raw(path, "SELECT last_activity_description, last_activity_provenance, last_activity_at FROM sessions "
                     "WHERE id = 'a'") == [("", "unknown", 1234.5)]
    assert json.loads(json.dumps(AGENT_020.run(path, call("get_session", "c", spec=["git_branch"]))))[0] == {
        "git_branch": "main"}
