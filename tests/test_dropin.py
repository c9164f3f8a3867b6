"""hermes-agent's own SessionDB names, differentially: the same steps on hermes-agent 0.19.0 and on hermes-state.

Each scenario is one list of operations (tests/hermes_agent_driver.py's `run`), run once by the
real hermes-agent in its own venv on a fresh file and once here by hermes-state on another
fresh file; the projected answers must be equal. Where this library answers differently on
purpose (docs/api.md, "hermes-agent's names"), the scenario stays on inputs both programs
agree on and tests/test_dropin_rules.py holds the difference. Select with `pytest -m hermes_agent`.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import hermes_agent_driver as driver
from agent_releases import AGENT_019
from hermes_state import SessionDB

pytestmark = pytest.mark.hermes_agent

DAY = 86400.0
CALL = [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]


@pytest.fixture(autouse=True)
def need_agent():
    AGENT_019.require()


def ours(path: Path, ops: list) -> list:
    """Run `ops` through hermes-state's SessionDB on `path` with the driver's own interpreter."""
    with SessionDB(path) as db:
        return driver.run(db, path, ops)


def both(tmp_path: Path, ops: list) -> tuple[list, list]:
    """Return (hermes-agent's answers, hermes-state's answers) to `ops`, each on a fresh file."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "ours").mkdir()
    return AGENT_019.run(tmp_path / "agent" / "state.db", *ops), ours(tmp_path / "ours" / "state.db", ops)


def call(method: str, *args: Any, spec: Any = None, **kwargs: Any) -> list:
    return ["call", method, list(args), kwargs, spec]


def attempt(method: str, *args: Any, **kwargs: Any) -> list:
    return ["try", method, list(args), kwargs, None]


def ref(n: int) -> dict[str, int]:
    return {"$": n}


def assert_same(theirs: list, mine: list, ops: list) -> None:
    for n, (a, b, op) in enumerate(zip(theirs, mine, ops)):
        assert a == b, f"operation {n} {op[:2]}: hermes-agent {a!r} != hermes-state {b!r}"
    assert len(theirs) == len(mine) == len(ops)


HANDOFF = ["state", "platform", "error"]


def test_the_handoff_lifecycle_answers_as_hermes_agent(tmp_path):
    ops = [
        ["create", "s1"], ["create", "s2"], ["create", "s3"], ["end", "s3", "user_exit"],
        call("get_handoff_state", "s1"), call("get_handoff_state", "nope"),
        call("request_handoff", "s1", "telegram"), call("request_handoff", "s1", "discord"),
        call("get_handoff_state", "s1"), call("list_pending_handoffs", spec="ids"),
        call("request_handoff", "nope", "telegram"),
        call("claim_handoff", "s1"), call("claim_handoff", "s1"), call("list_pending_handoffs", spec="ids"),
        call("request_handoff", "s1", "slack"),  # refused: the handoff is running
        call("complete_handoff", "s1"), call("get_handoff_state", "s1"),
        call("request_handoff", "s1", "slack"), call("claim_handoff", "s1"), call("fail_handoff", "s1", "boom"),
        call("get_handoff_state", "s1"), call("request_handoff", "s1", "matrix"), call("get_handoff_state", "s1"),
        call("fail_handoff", "s1", "never claimed"), call("complete_handoff", "s1"), call("get_handoff_state", "s1"),
        call("claim_handoff", "s2"), call("complete_handoff", "s2"), call("get_handoff_state", "s2"),
        call("request_handoff", "s3", "telegram"), call("request_handoff", "s2", "discord"),
        call("list_pending_handoffs", spec="ids"), call("list_pending_handoffs", spec=HANDOFF),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[9] == ["s1"] and mine[6] is True and mine[7] is False  # the answers are real ones


def test_gateway_routing_entries_round_trip_as_hermes_agent(tmp_path):
    ops = [
        call("load_gateway_routing_entries"),
        call("save_gateway_routing_entry", "agent:main:telegram:dm:1", '{"session_id": "s1", "n": 1}'),
        call("save_gateway_routing_entry", "agent:main:discord:dm:2", '{"session_id":"s2"}'),
        call("save_gateway_routing_entry", "agent:main:telegram:dm:1", '{"other": true}', scope="bot-2"),
        call("load_gateway_routing_entries"), call("load_gateway_routing_entries", scope="bot-2"),
        call("save_gateway_routing_entry", "agent:main:telegram:dm:1", '{"session_id": "s1", "n": 2}'),
        call("load_gateway_routing_entries"),
        call("replace_gateway_routing_entries", {"k9": '{"z": 1}', "k8": "{}", "k7": '["a", "東京"]'}),
        call("load_gateway_routing_entries"), call("load_gateway_routing_entries", scope="bot-2"),
        call("delete_gateway_routing_entries", ["k9", "no-such-key"]), call("load_gateway_routing_entries"),
        call("delete_gateway_routing_entries", []), call("delete_gateway_routing_entries", ["k8"], scope="bot-2"),
        call("load_gateway_routing_entries"),
        call("replace_gateway_routing_entries", {}, scope="bot-2"), call("load_gateway_routing_entries", scope="bot-2"),
        call("load_gateway_routing_entries"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[9] == {"k7": '["a", "東京"]', "k8": "{}", "k9": '{"z": 1}'}


def _transcript() -> list:
    # Rows 1..13 of session s1: user/assistant turns, one tool call with its result, one platform id.
    ops: list = [["create", "s1"]]
    for n in range(6):
        ops.append(["append", "s1", "user", f"question {n}", {"platform_message_id": f"pm{n}"} if n == 4 else None])
        ops.append(["append", "s1", "assistant", f"answer {n}", {"tool_calls": CALL} if n == 2 else None])
        if n == 2:
            ops.append(["append", "s1", "tool", "result", {"tool_call_id": "c1", "tool_name": "lookup"}])
    return ops


ROW = ["id", "role", "content", "active", "tool_call_id", "tool_name", "platform_message_id"]
WINDOW = {"window": ROW, "messages_before": None, "messages_after": None}
ANCHORED = {**WINDOW, "bookend_start": ROW, "bookend_end": ROW}
RECENT = ["id", "preview"]


def test_rewind_and_restore_answer_as_hermes_agent(tmp_path):
    ops = _transcript()
    user2, user1 = ref(5), ref(3)  # the appends' results: the rows' ids (question 2, question 1)
    ops += [
        call("has_archived_messages", "s1"), call("has_archived_messages", "nope"),
        call("rewind_to_message", "s1", user2, spec={"rewound_count": None, "target_message": ROW, "new_head_id": None}),
        call("has_archived_messages", "s1"), call("get_messages", "s1", spec="ids"),
        call("list_recent_user_messages", "s1", 10, spec=RECENT),
        call("list_recent_user_messages", "s1", 10, True, spec=RECENT),
        call("rewind_to_message", "s1", user1, spec={"rewound_count": None, "new_head_id": None}),
        ["query", "SELECT rewind_count FROM sessions WHERE id = 's1'"],
        call("restore_rewound", "s1", user2), call("get_messages", "s1", spec="ids"),
        call("restore_rewound", "s1", user1), call("restore_rewound", "s1", user1),
        call("has_archived_messages", "s1"), call("get_messages", "s1", spec="ids"),
        call("restore_rewound", "nope", 1),
        attempt("rewind_to_message", "s1", ref(4)),  # an assistant row
        attempt("rewind_to_message", "s1", 99999), attempt("rewind_to_message", "nope", 1),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    rewound = mine[len(_transcript()) + 2]
    assert rewound["rewound_count"] == 9 and rewound["target_message"]["content"] == "question 2"
    assert mine[-3]["raised"][:2] == ["ValueError", "Exception"]


def test_archive_and_compact_answers_as_hermes_agent(tmp_path):
    ops = _transcript() + [
        call("archive_and_compact", "s1", [{"role": "user", "content": "summary"},
                                            {"role": "assistant", "content": "ok"}]),
        call("get_messages", "s1", spec=["role", "content"]), call("has_archived_messages", "s1"),
        call("get_session", "s1", spec=["message_count", "tool_call_count"]),
        ["query", "SELECT COUNT(*), SUM(active), SUM(compacted) FROM messages WHERE session_id = 's1'"],
        call("archive_and_compact", "s1", []), call("get_messages", "s1"),
        call("get_session", "s1", spec=["message_count", "tool_call_count"]),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[-4] == [[15, 2, 13]]


def test_excerpts_answer_as_hermes_agent(tmp_path):
    ops = _transcript() + [
        ["append", "s1", "user", None, None], ["append", "s1", "assistant", "", None],
        ["append", "s1", "user", "  spaced\n\tout   text ", None], ["append", "s1", "user", "x" * 120, None],
        ["append", "s1", "user", "東京" * 50, None], ["append", "s1", "user", "   ", None],
    ]
    anchor, tool = ref(6), ref(7)  # the assistant turn with the tool call, and the tool row
    ops += [
        call("get_messages_around", "s1", anchor, 2, spec=WINDOW), call("get_messages_around", "s1", ref(1), 3, spec=WINDOW),
        call("get_messages_around", "s1", ref(19), 3, spec=WINDOW), call("get_messages_around", "s1", anchor, 0, spec=WINDOW),
        call("get_messages_around", "s1", anchor, -1, spec=WINDOW), call("get_messages_around", "s1", 99999, 2),
        call("get_messages_around", "nope", 1, 2),
        call("get_anchored_view", "s1", anchor, 1, 2, spec=ANCHORED),
        call("get_anchored_view", "s1", anchor, 1, 2, None, spec=ANCHORED),
        call("get_anchored_view", "s1", tool, 1, 1, spec=ANCHORED),
        call("get_anchored_view", "s1", anchor, 2, 1, ["tool"], spec=ANCHORED),
        call("get_anchored_view", "s1", anchor, 0, 20, None, spec=ANCHORED),
        call("get_anchored_view", "s1", ref(1), 0, 0, spec=ANCHORED), call("get_anchored_view", "s1", 99999),
        call("list_recent_user_messages", "s1", spec=RECENT), call("list_recent_user_messages", "s1", 2, spec=RECENT),
        call("list_recent_user_messages", "s1", 0), call("list_recent_user_messages", "nope"),
        call("has_platform_message_id", "s1", "pm4"), call("has_platform_message_id", "s1", "pm5"),
        call("has_platform_message_id", "nope", "pm4"),
        call("rewind_to_message", "s1", ref(8), spec=["rewound_count"]),  # pm4's row goes inactive
        call("has_platform_message_id", "s1", "pm4"), call("get_messages_around", "s1", ref(9), 1, spec=WINDOW),
        call("get_anchored_view", "s1", ref(4), 1, 3, spec=ANCHORED),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert [len(r["preview"]) for r in mine[-11]][:3] == [0, 80, 80]  # cut to 80 with "..."


def test_lineage_resume_and_session_meta_answer_as_hermes_agent(tmp_path):
    ops = [
        ["create", "root"], ["append", "root", "user", "hi", None], ["end", "root", "compression"],
        ["create_child", "c1", "root"], ["append", "c1", "user", "x", None], ["end", "c1", "compression"],
        ["create_child", "c2", "c1"], ["create_child", "branch", "c2"], ["create", "solo"],
    ]
    for sid in ("root", "c1", "c2", "branch", "solo", "nope"):
        ops += [call("get_conversation_root", sid), call("resolve_resume_session_id", sid)]
    ops += [
        call("update_session_meta", "solo", '{"reasoning": {"effort": "high"}}', "gpt-x"),
        call("get_session", "solo", spec=["model_config", "model"]),
        call("update_session_meta", "solo", '{"b": 2}'), call("get_session", "solo", spec=["model_config", "model"]),
        call("update_session_meta", "solo", None, "m4"), call("get_session", "solo", spec=["model_config", "model"]),
        ["create", "live"], ["create", "closed"], ["end", "closed", "agent_close"], ["create", "done"],
        ["end", "done", "user_exit"], ["create", "squashed"], ["end", "squashed", "compression"],
        call("promote_to_session_reset", "live"), call("get_session", "live", spec=["end_reason"]),
        call("promote_to_session_reset", "closed", "manual_reset"), call("get_session", "closed", spec=["end_reason"]),
        call("promote_to_session_reset", "done"), call("get_session", "done", spec=["end_reason"]),
        call("promote_to_session_reset", "squashed"), call("promote_to_session_reset", "live"),
        call("promote_to_session_reset", "nope"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[9:13] == ["root", "c2", "root", "c2"]


USAGE = ("SELECT model, billing_provider, task, api_call_count, input_tokens, output_tokens, cache_read_tokens, "
         "estimated_cost_usd FROM session_model_usage WHERE session_id = 'u' ORDER BY task, model")
TOTALS = ["input_tokens", "output_tokens", "api_call_count", "cache_read_tokens"]


def test_auxiliary_usage_answers_as_hermes_agent(tmp_path):
    ops = [
        ["create", "u"], ["tokens", "u", "main-model", 10, 5],
        call("record_auxiliary_usage", "u", "title", model="small", billing_provider="openrouter",
             input_tokens=100, output_tokens=7, estimated_cost_usd=0.01),
        call("record_auxiliary_usage", "u", "title", model="small", billing_provider="openrouter", input_tokens=1,
             output_tokens=1, cache_read_tokens=3, estimated_cost_usd=0.02),
        call("record_auxiliary_usage", "u", "compression"),
        call("get_session", "u", spec=TOTALS), ["query", USAGE],
    ]
    theirs, mine = both(tmp_path, ops)
    # The main call's row: hermes-agent files it under the model the session had (none here) and the
    # route it was given; this library under the call's model. The auxiliary rows must agree.
    assert_same(theirs[:-1], mine[:-1], ops[:-1])
    aux = [row for row in mine[-1] if row[2]]
    assert aux == [row for row in theirs[-1] if row[2]]
    assert [r[2] for r in aux] == ["compression", "title"] and aux[1][3:5] == [2, 101]


def test_the_start_up_sweeps_answer_as_hermes_agent(tmp_path):
    old = 8 * DAY
    ops: list = [["create", "P"], ["end", "P", "compression"], ["create", "Q"], ["end", "Q", "user_exit"]]
    cases = {"ghost": ("P", old, 0), "recent": ("P", 6 * DAY, 0), "called": ("P", old, 1),
             "other-parent": ("Q", old, 0)}
    for sid, (parent, age, calls) in cases.items():
        ops += [["create_child", sid, parent], ["append", sid, "user", "hello", None]]
        if calls:
            ops.append(call("update_token_counts", sid, 1, 1, api_call_count=1))
        ops.append(["age", sid, age])
    ops += [["create_child", "empty", "P"], ["age", "empty", old], ["create_child", "done", "P"],
            ["append", "done", "user", "x", None], ["end", "done", "user_exit"], ["age", "done", old]]
    ops += [call("finalize_orphaned_compression_sessions"), call("finalize_orphaned_compression_sessions")]
    for sid in (*cases, "empty", "done"):
        ops.append(call("get_session", sid, spec=["end_reason"]))
    # The TUI's empty ghosts: ended, untitled, no message, over a day old.
    for sid, source, age, title, ended, message in [
            ("t-old", "tui", 2 * DAY, None, True, False), ("t-young", "tui", 3600.0, None, True, False),
            ("t-live", "tui", 2 * DAY, None, False, False), ("t-titled", "tui", 2 * DAY, "Kept", True, False),
            ("t-said", "tui", 2 * DAY, None, True, True), ("cli-old", "cli", 2 * DAY, None, True, False)]:
        ops.append(["create", sid, source])
        if title:
            ops.append(["title", sid, title])
        if message:
            ops.append(["append", sid, "user", "hi", None])
        if ended:
            ops.append(["end", sid, "user_exit"])
        ops.append(["age", sid, age])
    ops += [call("prune_empty_ghost_sessions", {"dir": "sessions"}), call("prune_empty_ghost_sessions"),
            ["query", "SELECT id FROM sessions WHERE id LIKE 't-%' OR id = 'cli-old' ORDER BY id"]]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[-3] == 1 and mine[-1] == [["cli-old"], ["t-live"], ["t-said"], ["t-titled"], ["t-young"]]


def test_every_public_name_of_hermes_agent_is_here():
    # dir() of its module and of its SessionDB class, in its own venv, minus the underscore names.
    probe = ("import json, hermes_state as h; print(json.dumps({'module': [n for n in dir(h) if not n.startswith('_')], "
             "'class': [n for n in dir(h.SessionDB) if not n.startswith('_')]}))")
    proc = subprocess.run([str(AGENT_019.python), "-c", probe], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=""), cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = json.loads(proc.stdout)
    import hermes_state
    assert len(names["class"]) > 100 and "request_handoff" in names["class"]
    # Each is an attribute here; dir(hermes_state) itself lists only the API, not the imports
    # hermes-agent's module exposes (os, Any, Path...), which are attributes all the same.
    assert [name for name in names["module"] if not hasattr(hermes_state, name)] == []
    assert set(names["class"]) - set(dir(SessionDB)) == set()


MEMORY_NOTE = ("[System note: The following is recalled memory context, NOT new user input. "
               "Treat as informational background data.]")
CONTEXTS = ["hello", "", "a <memory-context>secret</memory-context> b", "<memory-context>\nmulti\nline\n</memory-context>\nrest",
            "x</memory-context>y", "<MEMORY-CONTEXT>s</MEMORY-CONTEXT>", "<memory-context attr='1'>s</memory-context>",
            "<memory-context>a</memory-context> mid <memory-context>b</memory-context>", "<memory-context>unclosed tail",
            "<memory-context>a<memory-context>b</memory-context>c</memory-context>d", "<memory_context>x</memory_context>",
            f"{MEMORY_NOTE}\nfoo", f"<memory-context>\n{MEMORY_NOTE}\n\nstuff\n</memory-context>\n\nhello", "東京\x00タワー"]


def test_the_module_values_answer_as_hermes_agent(tmp_path):
    # sanitize_context on the same texts, MAX_TITLE_LENGTH, and DEFAULT_DB_PATH under one HERMES_HOME.
    probe = ("import json, sys, hermes_state as h; texts = json.load(sys.stdin); print(json.dumps({"
             "'clean': [h.sanitize_context(t) for t in texts], 'max_title': h.SessionDB.MAX_TITLE_LENGTH, "
             "'default': str(h.DEFAULT_DB_PATH)}))")
    proc = subprocess.run([str(AGENT_019.python), "-c", probe], input=json.dumps(CONTEXTS), capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH="", HERMES_HOME=str(tmp_path)), cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout)
    import hermes_state
    with hermes_state.hermes_home_override(tmp_path):
        mine = {"clean": [hermes_state.sanitize_context(t) for t in CONTEXTS],
                "max_title": SessionDB.MAX_TITLE_LENGTH, "default": str(hermes_state.DEFAULT_DB_PATH)}
    assert theirs == mine
    assert mine["clean"][2] == "a  b" and mine["default"] == str(tmp_path / "state.db")
