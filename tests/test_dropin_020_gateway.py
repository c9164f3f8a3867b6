"""hermes-agent 0.20.1's gateway hygiene, count, statistics, deletion and size-guard names, differentially.

The scenarios marked `hermes_agent` run one list of operations (tests/hermes_agent_driver.py's
`run`) on the real hermes-agent 0.20.1 in its own venv and here, each on a fresh file, and
compare the projected answers. Where this library answers differently on purpose (docs/api.md,
"hermes-agent 0.20.1: gateway hygiene, counts, statistics, deletion, size guards") the
scenario stays on inputs both agree on and a test below holds the documented answer. The
unmarked tests are this library's own: bad input, the token queue across a fork, the guards'
settings.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import hermes_agent_driver as driver
import hermes_state
from agent_releases import AGENT_020
from hermes_state import SessionDB, SessionExportTooLargeError, SessionResumeTooLargeError

DAY = 86400.0
CALL = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]
differential = pytest.mark.hermes_agent


def ours(path: Path, ops: list) -> list:
    with SessionDB(path) as db:
        return driver.run(db, path, ops)


def both(tmp_path: Path, ops: list) -> tuple[list, list]:
    """Return (hermes-agent 0.20.1's answers, hermes-state's answers) to `ops`, each on a fresh file."""
    AGENT_020.require()
    (tmp_path / "agent").mkdir(exist_ok=True)
    (tmp_path / "ours").mkdir(exist_ok=True)
    return AGENT_020.run(tmp_path / "agent" / "state.db", *ops), ours(tmp_path / "ours" / "state.db", ops)


def call(method: str, *args: Any, spec: Any = None, **kwargs: Any) -> list:
    return ["call", method, list(args), kwargs, spec]


def attempt(method: str, *args: Any, **kwargs: Any) -> list:
    return ["try", method, list(args), kwargs, None]


def query(sql: str) -> list:
    return ["query", sql]


def _as_agent_sees(answer: Any) -> Any:
    # This library's errors are also HermesStateError, which hermes-agent's are not: a caller of
    # the agent catches them by the classes both share.
    if isinstance(answer, dict) and set(answer) == {"raised"}:
        return {"raised": [name for name in answer["raised"] if name != "HermesStateError"]}
    return answer


def assert_same(theirs: list, mine: list, ops: list) -> None:
    mine = [_as_agent_sees(answer) for answer in mine]
    for n, (a, b, op) in enumerate(zip(theirs, mine, ops)):
        assert a == b, f"operation {n} {op[:2]}: hermes-agent {a!r} != hermes-state {b!r}"
    assert len(theirs) == len(mine) == len(ops)


def raw(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


# --- gateway hygiene ---------------------------------------------------------------------------------

@differential
def test_the_hygiene_failure_streak_counts_per_chat_as_hermes_agent(tmp_path):
    ops = [
        call("increment_hygiene_failure_streak", "agent:main:telegram:dm:1"),
        call("increment_hygiene_failure_streak", "agent:main:telegram:dm:1"),
        call("increment_hygiene_failure_streak", "agent:main:discord:dm:東京"),
        call("reset_hygiene_failure_streak", "agent:main:telegram:dm:1"),
        call("reset_hygiene_failure_streak", "no-such-chat"),
        query("SELECT session_key, failure_streak FROM gateway_hygiene_state ORDER BY session_key"),
        call("increment_hygiene_failure_streak", "agent:main:telegram:dm:1"),
        call("increment_hygiene_failure_streak", "agent:main:discord:dm:東京"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[:3] == [1, 2, 1] and mine[5] == [["agent:main:discord:dm:東京", 1]] and mine[6:] == [1, 2]


def test_a_hygiene_streak_needs_a_session_key(db):
    for bad in (None, "", 5):
        with pytest.raises(ValueError, match="session_key"):
            db.increment_hygiene_failure_streak(bad)
        with pytest.raises(ValueError, match="session_key"):
            db.reset_hygiene_failure_streak(bad)
    assert raw(db.db_path, "SELECT COUNT(*) FROM gateway_hygiene_state") == [(0,)]


# --- counts and statistics ---------------------------------------------------------------------------

def _population() -> list:
    return [
        ["create", "a"], ["create", "b", "telegram"], ["create", "c", "cron"], ["create_child", "kid", "a"],
        ["append", "a", "user", "hello"], ["append", "a", "assistant", "hi"], ["append", "b", "user", "q"],
        ["tokens", "a", "m1", 10, 5], ["tokens", "b", "m1", 1, 2],
        call("update_token_counts", "b", actual_cost_usd=0.25, estimated_cost_usd=9.0),
        call("update_token_counts", "a", estimated_cost_usd=0.5),
    ]


@differential
def test_counts_and_totals_answer_as_hermes_agent(tmp_path):
    ops = _population() + [
        call("session_count_by_source"), call("session_count_by_source", exclude_children=True),
        call("session_count_by_source", archived_only=True),
        call("session_count_ge"), call("session_count_ge", 0), call("session_count_ge", 4), call("session_count_ge", 5),
        call("session_count", sources=["cli"]), call("session_count", sources=["cli", "telegram"]),
        call("session_count", sources=[]), call("session_count", source="telegram", sources=["cli"]),
        call("session_count", sources=["cli", "telegram"], exclude_sources=["cli"]),
        call("usage_totals"), call("usage_totals", min_message_count=0), call("usage_totals", min_message_count=2),
        call("set_meta", "loop:a", "1"), call("set_meta", "loop:b", "2"), call("set_meta", "loop%x", "3"),
        call("set_meta", "loopy", "4"), call("set_meta", "loop_z", "5", cursor=None),
        call("list_meta_prefix", "loop:"), call("list_meta_prefix", "loop%"), call("list_meta_prefix", "loop_"),
        call("list_meta_prefix", ""), call("list_meta_prefix", "nothing"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    start = len(_population())
    assert mine[start] == {"cli": 2, "cron": 1, "telegram": 1} and mine[start + 1] == {"cli": 1, "cron": 1, "telegram": 1}
    assert mine[start + 12] == {"tokens": 18, "cost_usd": 0.75}
    assert mine[start + 20] == [["loop:a", "1"], ["loop:b", "2"]]


@differential
def test_the_logical_size_is_pages_times_page_size_in_both(tmp_path):
    ops = [["create", "a"], call("logical_size_bytes")]
    theirs, mine = both(tmp_path, ops)
    assert isinstance(theirs[1], int) and isinstance(mine[1], int) and theirs[1] > 0 and mine[1] > 0
    pages, size = (raw(tmp_path / "ours" / "state.db", f"PRAGMA {p}")[0][0] for p in ("page_count", "page_size"))
    assert mine[1] == pages * size


def test_counts_refuse_what_is_not_a_count_or_a_switch(db):
    db.create_session("a", "cli")
    for bad in (-1, "x", None, 2.5, True):
        with pytest.raises(ValueError, match="n must be"):
            db.session_count_ge(bad)
    with pytest.raises(ValueError, match="min_message_count"):
        db.usage_totals(min_message_count=-1)
    with pytest.raises(ValueError, match="include_archived"):
        db.session_count_by_source(include_archived="yes")
    with pytest.raises(ValueError, match="sources"):
        db.session_count(sources="cli")  # one string is not a list of sources (the agent counts 0 here)
    with pytest.raises(ValueError, match="prefix"):
        db.list_meta_prefix(None)
    assert db.session_count_ge(1) is True and db.session_count(sources=("cli",)) == 1


def test_a_meta_prefix_is_matched_literally_and_listed_by_key(db):
    for key in ("z:1", "a:2", "a:1", "A:3", "a%:4"):
        db.set_meta(key, "v")
    # hermes-agent 0.20.1 matches with LIKE (so "a:" also finds "A:3") and lists in insertion order.
    assert db.list_meta_prefix("a:") == [("a:1", "v"), ("a:2", "v")]
    assert db.list_meta_prefix("a%") == [("a%:4", "v")]


def test_set_meta_on_a_cursor_writes_in_that_connections_transaction(db):
    other = sqlite3.connect(db.db_path, isolation_level=None, timeout=10)
    try:
        cursor = other.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        db.set_meta("mine", "1", cursor=cursor)
        cursor.execute("ROLLBACK")  # the caller's transaction decides: rolled back, nothing stays
        assert db.get_meta("mine") is None
        db.set_meta("mine", "2", cursor=cursor)  # autocommit on that connection
    finally:
        other.close()
    assert db.get_meta("mine") == "2"
    with db.transaction() as txn:  # this handle's own connection: joins the open transaction
        db.set_meta("joined", "3", cursor=txn.conn.cursor())
    assert db.get_meta("joined") == "3"
    with pytest.raises(TypeError, match="cursor"):
        db.set_meta("k", "v", cursor="not a cursor")


# --- lifecycle states ---------------------------------------------------------------------------------

@differential
def test_lifecycle_states_answer_as_hermes_agent(tmp_path):
    ops = [
        ["create", "done"], ["append", "done", "user", "q"], ["append", "done", "assistant", "a"],
        ["create", "waiting"], ["append", "waiting", "user", "q"],
        ["create", "calling"], ["append", "calling", "assistant", None, {"tool_calls": CALL}],
        ["create", "unread"], ["append", "unread", "tool", "r", {"tool_call_id": "c1"}],
        ["create", "failed"], ["append", "failed", "assistant", "x", {"finish_reason": "error"}],
        ["create", "filtered"], ["append", "filtered", "assistant", "x", {"finish_reason": "Content_Filter"}],
        ["create", "long"], ["append", "long", "assistant", "x", {"finish_reason": "length"}],
        ["create", "noted"], ["append", "noted", "assistant", "x"], ["append", "noted", "system", "note"],
        ["create", "empty"],
        call("session_lifecycle_statuses", ["done", "waiting", "calling", "unread", "failed", "filtered", "long",
                                            "noted", "empty", "nope", "done"]),
        call("session_lifecycle_statuses", []),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[-2] == {"done": "complete", "waiting": "interrupted", "calling": "interrupted", "unread": "interrupted",
                        "failed": "error", "filtered": "error", "long": "complete", "noted": "complete",
                        "empty": "empty", "nope": "empty"}


CLASSIFY_CASES = [["assistant", False, "stop"], ["assistant", True, None], ["user", False, None],
                  ["Tool", False, None], [" user", False, None], ["assistant", False, " ERROR "],
                  ["assistant", False, "content_filter"], ["user", True, "error"], [None, False, None],
                  ["system", False, None], ["assistant", False, "tool_calls"], ["assistant", [], None],
                  ["assistant", "x", None], ["function", False, "length"], ["", False, ""]]
CONSTANTS = ["SESSION_STATUS_COMPLETE", "SESSION_STATUS_EMPTY", "SESSION_STATUS_ERROR", "SESSION_STATUS_INTERRUPTED",
             "MAX_SAFE_EXPORT_MESSAGES", "MAX_SAFE_RESUME_MESSAGES", "PERSISTENCE_ERROR_CAUSES"]
_MODULE_PROBE = """
import json, sys, hermes_state as h
cases, names = json.loads(sys.stdin.read())
print(json.dumps({"classified": [h.classify_session_status(*c) for c in cases],
                  "constants": {n: getattr(h, n) for n in names},
                  "limits": [h.resolved_max_export_messages(), h.resolved_max_resume_messages()]}))
"""


def _module_answers(python: str, home: Path, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, HERMES_HOME=str(home), **(env_extra or {}))
    proc = subprocess.run([python, "-c", _MODULE_PROBE], input=json.dumps([CLASSIFY_CASES, CONSTANTS]),
                          capture_output=True, text=True, timeout=120, env=env, cwd=home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@differential
@pytest.mark.parametrize("config", [None, "sessions:\n  max_export_messages: 3\n  max_resume_messages: 0\n",
                                    "sessions:\n  max_export_messages: '7'\n  max_resume_messages: 2.5\n",
                                    "sessions:\n  max_export_messages: -5\n  max_resume_messages: abc\n",
                                    "sessions: [1]\n"])
def test_module_names_and_the_guards_settings_answer_as_hermes_agent(tmp_path, config):
    AGENT_020.require()
    answers = []
    for who, python, env in (("agent", str(AGENT_020.python), {"PYTHONPATH": ""}),
                             ("ours", os.environ.get("HERMES_TEST_PYTHON", _our_python()),
                              {"PYTHONPATH": str(Path(__file__).resolve().parents[1])})):
        home = tmp_path / who
        home.mkdir()
        if config is not None:
            (home / "config.yaml").write_text(config)
        answers.append(_module_answers(python, home, env))
    theirs, mine = answers
    # 0.20.1 names its own causes; this library names those and the three more it can tell apart.
    causes = mine["constants"].pop("PERSISTENCE_ERROR_CAUSES")
    assert causes[:6] == theirs["constants"].pop("PERSISTENCE_ERROR_CAUSES")
    assert set(causes[6:]) == {"corrupt", "fts_index", "session_row_missing"}
    assert theirs == mine


def _our_python() -> str:
    import sys
    return sys.executable


def test_the_exceptions_carry_what_hermes_agents_do():
    export = SessionExportTooLargeError("s1", 30000)
    assert isinstance(export, ValueError) and isinstance(export, hermes_state.HermesStateError)
    assert (export.session_id, export.message_count, export.limit) == ("s1", 30000, 20000)
    assert str(export) == "session 's1' has at least 30000 active messages; safe in-memory export limit is 20000"
    resume = SessionResumeTooLargeError(30000, 7, "in this session")
    assert (resume.message_count, resume.limit) == (30000, 7)
    assert str(resume).startswith("session has at least 30000 active messages in this session; safe resume limit is 7.")


# --- size guards ----------------------------------------------------------------------------------------

def _chain() -> list:
    # p (5 rows) closed by compression, continued by c (3 rows); q alone (2 rows).
    ops: list = [["create", "p"], ["appends", "p", 5, "old"], ["end", "p", "compression"],
                 ["create_child", "c", "p"], ["appends", "c", 3, "new"], ["create", "q"], ["appends", "q", 2, "x"]]
    return ops


@differential
def test_the_size_guards_answer_as_hermes_agent(tmp_path):
    ops = _chain() + [
        call("assert_export_safe", "p"), call("assert_export_safe", "p", 5), attempt("assert_export_safe", "p", 3),
        call("assert_export_safe", "c"), attempt("assert_export_safe", "c", 2), call("assert_export_safe", "nope"),
        call("assert_resume_safe", "c"), call("assert_resume_safe", "c", 8), attempt("assert_resume_safe", "c", 7),
        attempt("assert_resume_safe", "c", 2), call("assert_resume_safe", "p"), call("assert_resume_safe", "nope"),
        attempt("assert_export_safe", "p", -1), attempt("assert_resume_safe", "c", -1),
        call("get_resume_message_count", "c"), call("get_resume_message_count", "p"),
        call("get_resume_message_count", "q"), call("get_resume_message_count", "nope"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    base = len(_chain())
    assert mine[base:base + 2] == [5, 5] and mine[base + 6] == 8 and mine[base + 14:base + 18] == [8, 5, 2, 0]
    assert "SessionExportTooLargeError" in mine[base + 2]["raised"] and "ValueError" in mine[base + 2]["raised"]
    assert "SessionResumeTooLargeError" in mine[base + 8]["raised"]


def test_a_guard_says_how_many_rows_it_proved_and_a_zero_limit_counts_them_all(db):
    db.create_session("p", "cli")
    for n in range(6):
        db.append_message("p", "user", f"m{n}")
    with pytest.raises(SessionExportTooLargeError) as raised:
        db.assert_export_safe("p", 3)
    assert (raised.value.message_count, raised.value.limit) == (4, 3)  # counting stopped one past the limit
    # 0 turns the guard off and answers the count (hermes-agent 0.20.1 answers 0 there).
    assert db.assert_export_safe("p", 0) == 6 and db.assert_resume_safe("p", 0) == 6


def test_the_guards_follow_the_homes_config_and_refuse_bad_limits(db, hermes_home):
    db.create_session("p", "cli")
    for n in range(4):
        db.append_message("p", "user", f"m{n}")
    (hermes_home / "config.yaml").write_text("sessions:\n  max_export_messages: 3\n  max_resume_messages: 0\n")
    with pytest.raises(SessionExportTooLargeError):
        db.assert_export_safe("p")
    assert db.assert_resume_safe("p") == 4
    with pytest.raises(TypeError, match="max_messages"):
        db.assert_export_safe("p", "x")
    with pytest.raises(TypeError, match="max_messages"):
        db.assert_resume_safe("p", 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        db.assert_resume_safe("p", -1)
    with pytest.raises(ValueError, match="session_id"):
        db.get_resume_message_count(None)


# --- deletion -----------------------------------------------------------------------------------------

def _delegates() -> list:
    return [["create", "c"], ["append", "c", "user", "x"],
            call("create_session", "dlg", "cli", parent_session_id="c", model_config={"_delegate_from": "c"}),
            call("create_session", "dlg2", "cli", parent_session_id="dlg", model_config={"_delegate_from": "dlg"}),
            call("create_session", "br", "cli", parent_session_id="c", model_config={"_branched_from": "c"}),
            ["create_child", "plain", "c"]]


@differential
def test_delete_targets_and_the_expected_set_answer_as_hermes_agent(tmp_path):
    ops = _delegates() + [
        call("get_session_delete_targets", "c"), call("get_session_delete_targets", "nope"),
        call("delete_session", "c", expected_delete_ids=["c"]),
        call("delete_session", "c", expected_delete_ids=["c", "dlg", "dlg2", "x"]),
        call("delete_session", "nope", expected_delete_ids=[]),
        call("delete_session", "nope", expected_delete_ids=["nope"]),
        query("SELECT COUNT(*) FROM sessions"),
        call("delete_session", "c", expected_delete_ids=["dlg2", "c", "dlg", "dlg"]),
        query("SELECT id, parent_session_id FROM sessions ORDER BY id"),
        call("delete_session", "br"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    n = len(_delegates())
    assert mine[n] == ["c", "dlg", "dlg2"] and mine[n + 2:n + 6] == [False] * 4 and mine[n + 6] == [[5]]
    assert mine[n + 7] is True and mine[n + 8] == [["br", None], ["plain", None]]


def test_deleting_a_compression_part_takes_the_whole_chain_as_the_design_says(db):
    # hermes-agent 0.20.1 deletes only the part asked for and detaches the rest; here a
    # compression chain is one conversation, and it goes whole.
    db.create_session("p", "cli")
    db.append_message("p", "user", "x")
    db.end_session("p", "compression")
    db.create_session("c", "cli", parent_session_id="p")
    db.create_session("dlg", "cli", parent_session_id="c", model_config={"_delegate_from": "c"})
    db.end_session("dlg", "done")
    assert db.get_session_delete_targets("c") == ["c", "p", "dlg"]
    assert db.get_session_delete_targets("p") == ["p", "c", "dlg"]
    assert db.delete_session("p", expected_delete_ids=["p"]) is False  # 0.20.1's answer set is not the plan
    assert db.session_count(include_archived=True) == 3
    assert db.delete_session("c", expected_delete_ids=["p", "c", "dlg"]) is True
    assert db.session_count(include_archived=True) == 0


def test_an_expected_set_is_checked_in_the_deleting_transaction(db):
    db.create_session("c", "cli")
    targets = db.get_session_delete_targets("c")
    # A delegate appears between the read and the delete: the delete must not take it unseen.
    db.create_session("late", "cli", parent_session_id="c", model_config={"_delegate_from": "c"})
    assert db.delete_session("c", expected_delete_ids=targets) is False
    assert db.get_session("c") is not None and db.get_session("late") is not None


def test_deletion_refuses_bad_expected_sets_and_ids(db):
    db.create_session("c", "cli")
    with pytest.raises(ValueError, match="session_ids must be a list"):
        db.delete_session("c", expected_delete_ids="c")
    with pytest.raises(ValueError, match="expected_delete_ids"):
        db.delete_session("c", expected_delete_ids=["c", 3])
    with pytest.raises(ValueError, match="session_id"):
        db.get_session_delete_targets(None)
    assert db.get_session("c") is not None


@differential
def test_open_prune_matches_count_as_hermes_agent(tmp_path):
    ops = [["create", "o1"], ["create", "o2", "telegram"], ["create", "e1"], ["end", "e1", "user_exit"],
           ["create", "young"],
           ["age", "o1", 100 * DAY], ["age", "o2", 100 * DAY], ["age", "e1", 100 * DAY],
           call("count_open_prune_matches"), call("count_open_prune_matches", 90),
           call("count_open_prune_matches", 200), call("count_open_prune_matches", 90, "cli"),
           call("count_open_prune_matches", source="telegram"),
           call("count_open_prune_matches", 90, min_messages=1)]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[8:] == [3, 2, 0, 1, 1, 0]


def test_open_prune_matches_refuse_bad_filters(db):
    with pytest.raises(ValueError, match="older_than_days"):
        db.count_open_prune_matches(-1)
    with pytest.raises(ValueError):
        db.count_open_prune_matches("x")
    with pytest.raises(TypeError, match="bogus"):
        db.count_open_prune_matches(bogus=1)


# --- usage: routes, auxiliary calls, the token queue -----------------------------------------------------

@differential
def test_the_dominant_route_and_auxiliary_call_counts_answer_as_hermes_agent(tmp_path):
    ops = [["create", "r"], call("get_dominant_session_model_route", "r"),
           call("update_token_counts", "r", input_tokens=1, model="m1", billing_provider="p1", api_call_count=1),
           call("update_token_counts", "r", input_tokens=1, model="m2", billing_provider="p2", api_call_count=3),
           call("update_token_counts", "r", input_tokens=1, model="m1", billing_provider="p1", api_call_count=1),
           call("record_auxiliary_usage", "r", "title", model="aux", input_tokens=5, api_call_count=10),
           call("get_dominant_session_model_route", "r", spec=["model", "billing_provider", "api_call_count"]),
           call("get_dominant_session_model_route", "nope"),
           call("record_auxiliary_usage", "r", "title", model="aux", api_call_count=0),
           call("record_auxiliary_usage", "r", "review", model="aux"),
           query("SELECT task, model, api_call_count, input_tokens FROM session_model_usage WHERE task != '' "
                 "ORDER BY task"),
           ["create", "z"], call("update_token_counts", "z", input_tokens=5, model="m", api_call_count=0),
           call("get_dominant_session_model_route", "z")]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[6] == {"model": "m2", "billing_provider": "p2", "api_call_count": 3}
    assert mine[10] == [["review", "aux", 1, 0], ["title", "aux", 10, 5]]


def test_an_auxiliary_call_count_must_be_a_count(db):
    db.create_session("r", "cli")
    for bad in (-1, "x", 1.5):  # 0.20.1 subtracts a negative count from the row
        with pytest.raises(ValueError, match="api_call_count"):
            db.record_auxiliary_usage("r", "title", model="aux", api_call_count=bad)
    assert raw(db.db_path, "SELECT COUNT(*) FROM session_model_usage") == [(0,)]


@differential
def test_queued_token_counts_are_applied_at_flush_and_close_as_hermes_agent(tmp_path):
    ops = [["create", "s"],
           call("queue_token_counts", "s", input_tokens=5, output_tokens=2, model="m"),
           call("queue_token_counts", "s", input_tokens=1, api_call_count=1),
           call("flush_token_counts"), ["session", "s"],
           call("queue_token_counts", "s", output_tokens=40),
           call("flush_token_counts", 0.5), ["session", "s"], call("flush_token_counts"),
           call("queue_token_counts", "s", input_tokens=100)]  # applied by close()
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[3] is True and mine[4]["input_tokens"] == 6 and mine[7]["output_tokens"] == 42
    for who in ("agent", "ours"):
        assert raw(tmp_path / who / "state.db", "SELECT input_tokens FROM sessions") == [(106,)], who


def test_a_queued_delta_is_checked_when_it_is_queued(db):
    db.create_session("s", "cli")
    with pytest.raises(TypeError, match="bogus"):
        db.queue_token_counts("s", bogus=1)
    with pytest.raises(ValueError, match="input_tokens"):
        db.queue_token_counts("s", input_tokens="x")
    with pytest.raises(ValueError, match="session_id"):
        db.queue_token_counts(None, input_tokens=1)
    with pytest.raises(ValueError, match="timeout"):
        db.flush_token_counts(-1)
    assert db.flush_token_counts() is True and db.get_session("s")["input_tokens"] == 0


def test_a_delta_for_a_session_gone_meanwhile_is_dropped_alone(db, caplog):
    db.create_session("gone", "cli")
    db.create_session("kept", "cli")
    db.queue_token_counts("gone", input_tokens=1)
    db.queue_token_counts("kept", input_tokens=2)
    db.delete_session("gone")
    assert db.flush_token_counts() is True
    assert db.get_session("kept")["input_tokens"] == 2
    assert "dropped" in caplog.text


def test_a_busy_store_keeps_the_deltas_for_a_later_flush(db):
    db.create_session("s", "cli")
    db.queue_token_counts("s", input_tokens=3)
    other = sqlite3.connect(db.db_path, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")
    try:
        assert db.flush_token_counts(0) is False
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert db.flush_token_counts() is True and db.get_session("s")["input_tokens"] == 3


def test_the_queue_applies_itself_once_a_batch_waits(db):
    import hermes_state_sessions as sessions
    db.create_session("s", "cli")
    for _ in range(sessions.TokenQueue.BATCH - 1):
        db.queue_token_counts("s", input_tokens=1)
    assert db.get_session("s")["input_tokens"] == 0
    db.queue_token_counts("s", input_tokens=1)
    assert db.get_session("s")["input_tokens"] == sessions.TokenQueue.BATCH


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_applies_the_parents_queued_deltas(db):
    db.create_session("s", "cli")
    db.queue_token_counts("s", input_tokens=7)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its copy of the queue must be empty, so its flush and close have nothing
        status = 1
        try:
            empty = db.flush_token_counts(0) is True
            db.close()
            status = 0 if empty else 2
        finally:
            os.write(write, bytes([status]))
            os._exit(0)
    os.close(write)
    child_status = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert child_status == bytes([0]), "the child still held the parent's queued deltas"
    assert db.flush_token_counts() is True
    assert db.get_session("s")["input_tokens"] == 7  # applied once, by the parent


# --- gateway peers and automatic maintenance -----------------------------------------------------------

@differential
def test_a_peer_recorded_with_its_compression_ancestors_answers_as_hermes_agent(tmp_path):
    ops = [["create", "p", "telegram"], ["append", "p", "user", "x"], ["end", "p", "compression"],
           ["create_child", "c", "p", "telegram"], ["append", "c", "user", "y"], ["end", "c", "compression"],
           ["create_child", "t", "c", "telegram"], ["create", "other", "telegram"],
           call("record_gateway_session_peer", "t", source="telegram", session_key="K", chat_id="1",
                include_compression_ancestors=True),
           query("SELECT id, session_key, chat_id FROM sessions ORDER BY id"),
           call("record_gateway_session_peer", "t", source="telegram", session_key="K3", chat_id="9"),
           query("SELECT id, session_key, chat_id FROM sessions ORDER BY id"),
           call("record_gateway_session_peer", "c", source="discord", session_key="K4", display_name="Al",
                include_compression_ancestors=True),
           query("SELECT id, source, session_key, chat_id, display_name FROM sessions ORDER BY id")]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[9] == [["c", "K", "1"], ["other", None, None], ["p", "K", "1"], ["t", "K", "1"]]
    assert mine[13][0] == ["c", "discord", "K4", None, "Al"] and mine[13][3] == ["t", "telegram", "K3", "9", None]


def test_include_compression_ancestors_must_be_a_switch(db):
    db.create_session("t", "telegram")
    with pytest.raises(ValueError, match="include_compression_ancestors"):
        db.record_gateway_session_peer("t", source="telegram", session_key="K", include_compression_ancestors="yes")
    assert db.get_session("t")["session_key"] is None


@differential
def test_the_vacuum_has_its_own_throttle_as_in_hermes_agent(tmp_path):
    keys = query("SELECT key FROM state_meta WHERE key IN ('last_auto_prune', 'last_vacuum') ORDER BY key")
    ops = [call("maybe_auto_prune_and_vacuum", min_vacuum_interval_days=30), keys,
           ["create", "old1"], ["end", "old1", "user_exit"], ["age", "old1", 200 * DAY],
           call("maybe_auto_prune_and_vacuum", min_interval_hours=0, min_vacuum_interval_days=30), keys,
           ["create", "old2"], ["end", "old2", "user_exit"], ["age", "old2", 200 * DAY],
           call("maybe_auto_prune_and_vacuum", min_interval_hours=0, min_vacuum_interval_days=30),
           ["create", "old3"], ["end", "old3", "user_exit"], ["age", "old3", 200 * DAY],
           call("maybe_auto_prune_and_vacuum", min_interval_hours=0, min_vacuum_interval_days=0),
           ["create", "old4"], ["end", "old4", "user_exit"], ["age", "old4", 200 * DAY],
           call("maybe_auto_prune_and_vacuum", min_interval_hours=0, vacuum=False, min_vacuum_interval_days=0)]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[0] == {"skipped": False, "pruned": 0, "vacuumed": False} and mine[1] == [["last_auto_prune"]]
    assert mine[5]["vacuumed"] is True and mine[6] == [["last_auto_prune"], ["last_vacuum"]]
    assert mine[10]["vacuumed"] is False and mine[14]["vacuumed"] is True and mine[18]["vacuumed"] is False


def test_the_vacuum_interval_must_be_a_number_of_days(db):
    for bad in (-1, "x", None):
        with pytest.raises(ValueError, match="min_vacuum_interval_days"):
            db.maybe_auto_prune_and_vacuum(min_interval_hours=0, min_vacuum_interval_days=bad)
    assert db.get_meta("last_auto_prune") is None  # refused before any write
