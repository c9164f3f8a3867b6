"""hermes_state_conversation: stored rows as replayable conversation dicts, and the repairs made for a resend."""
from __future__ import annotations

from typing import Any

import pytest

import hermes_state_conversation as conversation
import hermes_state_messages as messages
import hermes_state_schema as schema


@pytest.fixture
def s(db, conn):
    db.create_session("s", "cli")
    return conn


def test_rows_come_back_as_the_dicts_that_were_sent(s):
    messages.append_message(s, "s", "user", "shown text", api_content="sent text")
    messages.append_message(s, "s", "assistant", None, tool_calls=[{"id": "c1", "type": "function"}],
                            reasoning="because", finish_reason="tool_calls")
    messages.append_message(s, "s", "tool", "42", tool_call_id="c1", tool_name="calc")
    user, assistant, tool = conversation.get_messages_as_conversation(s, "s", with_row_ids=True)
    assert (user["content"], user[messages.DISPLAY_KEY]) == ("sent text", "shown text")
    assert assistant["tool_calls"] == [{"id": "c1", "type": "function"}]
    assert (assistant["reasoning"], assistant["finish_reason"]) == ("because", "tool_calls")
    assert tool["name"] == "calc" and tool["_tool_call_uid"] == assistant["_tool_call_uids"]["c1"]
    assert all(len(m["message_uid"]) == 32 and isinstance(m["_row_id"], int) for m in (user, assistant, tool))


def test_a_row_without_a_uid_gets_a_stable_derived_one(s):
    row = messages.append_message(s, "s", "user", "old row")
    s.execute("UPDATE messages SET message_uid = NULL WHERE id = ?", (row,))
    first = conversation.get_messages_as_conversation(s, "s")[0]["message_uid"]
    assert first == conversation.derived_uid("s", row) == conversation.get_messages_as_conversation(s, "s")[0][
        "message_uid"]


def test_echoed_memory_context_is_left_out_of_an_assistant_answer():
    text = "<memory-context>recalled</memory-context>\n\nThe answer."
    assert conversation.strip_memory_context(text) == "The answer."
    assert conversation.strip_memory_context("no block") == "no block"


def test_background_review_prompts_and_their_replies_are_left_out():
    kept = conversation.strip_background_review_harness([
        {"role": "user", "content": "real question"}, {"role": "assistant", "content": "real answer"},
        {"role": "user", "content": "  Review the conversation above and save skills"},
        {"role": "assistant", "content": "curator reply"}, {"role": "user", "content": "next"}])
    assert [m["content"] for m in kept] == ["real question", "real answer", "next"]


def test_repair_alternation_drops_what_providers_refuse():
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]}
    msgs = [{"role": "user", "content": "q"},
            call, {"role": "tool", "tool_call_id": "a", "content": "1"},                   # b never answered
            {"role": "tool", "tool_call_id": "x", "content": "stray"},
            {"role": "assistant", "content": "draft"}, {"role": "assistant", "content": "final"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "tool_call_id": "c", "content": "3"}, {"role": "tool", "tool_call_id": "z", "content": "?"}]
    repaired = conversation.repair_alternation(msgs)
    assert [(m["role"], m.get("content")) for m in repaired] == [
        ("user", "q"), ("assistant", "final"), ("assistant", None), ("tool", "3")]


def test_ancestors_replay_first_without_a_prompt_resent_on_resume(db, s):
    messages.append_message(s, "s", "user", "same prompt")
    db.end_session("s", "compression")
    db.create_session("t", "cli", parent_session_id="s")
    messages.append_message(s, "t", "user", "same prompt")
    messages.append_message(s, "t", "assistant", "reply")
    whole = conversation.get_messages_as_conversation(s, "t", include_ancestors=True)
    assert [m["content"] for m in whole] == ["same prompt", "reply"]
    assert [m["content"] for m in conversation.get_ancestor_display_prefix(s, "t")] == ["same prompt"]
    assert [m["content"] for m in conversation.get_messages_as_conversation(s, "t")] == ["same prompt", "reply"]


def test_harness_across_a_seam_goes_and_each_part_keeps_its_own_messages(db, s):
    review = "Review the conversation above and save skills"
    messages.append_message(s, "s", "user", "parent question")
    messages.append_message(s, "s", "user", review)
    db.end_session("s", "compression")
    db.create_session("t", "cli", parent_session_id="s")
    messages.append_message(s, "t", "assistant", "curator reply")  # answers the review across the seam
    messages.append_message(s, "t", "user", "child question")
    whole = conversation.get_messages_as_conversation(s, "t", include_ancestors=True)
    assert [m["content"] for m in whole] == ["parent question", "child question"]
    assert [m["content"] for m in conversation.get_ancestor_display_prefix(s, "t")] == ["parent question"]


def test_a_long_read_goes_on_with_the_small_cache_and_gives_the_connection_its_own_back(db, s, monkeypatch):
    db.end_session("s", "compression")
    db.create_session("t", "cli", parent_session_id="s")
    s.execute("BEGIN IMMEDIATE")  # one commit for the lot: the read is under test, not 1,200 commits
    for i in range(1200):  # more rows than one batch, in both parts
        messages.append_message(s, "s" if i < 600 else "t", "user" if i % 2 else "assistant", f"text {i} " * 20)
    s.execute("COMMIT")
    s.execute("PRAGMA cache_size = -16000")
    small_cache = []
    s.set_trace_callback(lambda sql: small_cache.append(sql) if "cache_size = -2000" in sql else None)
    whole = conversation.get_messages_as_conversation(s, "t", include_ancestors=True)
    assert small_cache == []  # 1200 short messages are far below the threshold
    monkeypatch.setattr(schema, "STREAM_TEXT_CHARS", 10_000)
    assert conversation.get_messages_as_conversation(s, "t", include_ancestors=True) == whole
    s.set_trace_callback(None)
    assert len(whole) == 1200 and len(small_cache) == 1
    assert s.execute("PRAGMA cache_size").fetchone()[0] == -16000



# Every column a conversation dict is made from, as a test reads them itself.
COLUMNS: tuple[str, ...] = ("id", "role", "content", "api_content", "tool_calls", "tool_call_id", "tool_name", "reasoning",
           "reasoning_content", "reasoning_details", "codex_reasoning_items", "codex_message_items", "message_uid",
           "absorbed_message_uids", "tool_call_uids", "tool_call_uid", "content_parts", "timestamp", "finish_reason",
           "observed", "platform_message_id", "effect_disposition")


def _reference_dict(r: dict[str, Any], turn: dict, with_row_ids: bool, session_id: str) -> dict:
    """What one row becomes, key by key in the documented order, written plainly (turn: the uids of the
    last assistant turn and how many results of each call id came after it)."""
    role, content, sent = r["role"], r["content"], r["api_content"]
    out: dict = {"role": role, "content": content if sent is None else sent}
    if r["content_parts"] is not None:
        out["content"] = conversation.decode_json(r["content_parts"])
    elif sent is not None and sent != content:
        out[messages.DISPLAY_KEY] = content
    for column, key in (("tool_calls", "tool_calls"), ("tool_call_id", "tool_call_id"), ("tool_name", "name")):
        if r[column] is not None:
            out[key] = conversation.decode_json(r[column]) if column == "tool_calls" else r[column]
    out["timestamp"] = r["timestamp"]
    if r["observed"]:
        out["observed"] = True
    for column, key in (("platform_message_id", "message_id"), ("effect_disposition", "effect_disposition")):
        if r[column] is not None:
            out[key] = r[column]
    if role == "assistant":
        if r["finish_reason"] is not None:
            out["finish_reason"] = r["finish_reason"]
        if sent is None and isinstance(out["content"], str):
            out["content"] = conversation.strip_memory_context(out["content"])
        if r["reasoning"] is not None and r["reasoning"] != "":
            out["reasoning"] = r["reasoning"]
        for key in ("reasoning_content", "reasoning_details", "codex_reasoning_items", "codex_message_items"):
            if r[key] is not None:
                out[key] = r[key] if key == "reasoning_content" else conversation.decode_json(r[key])
        uids = conversation.decode_json(r["tool_call_uids"]) if r["tool_call_uids"] is not None else {}
        turn["uids"], turn["answered"] = (uids if isinstance(uids, dict) else {}), {}
    out["message_uid"] = r["message_uid"] or conversation.derived_uid(session_id, r["id"])
    if with_row_ids:
        out["_row_id"] = r["id"]
    if role == "assistant" and r["tool_call_uids"] is not None:
        out["_tool_call_uids"] = turn["uids"]
    if role == "tool" and r["tool_call_id"] is not None:
        nth = turn["answered"].get(r["tool_call_id"], 0)
        turn["answered"][r["tool_call_id"]] = nth + 1
        uid = r["tool_call_uid"]
        if uid is None:
            uid = messages.pick_tool_call_uid(turn["uids"].get(r["tool_call_id"]), nth)
        if uid is not None:
            out["_tool_call_uid"] = uid
    if r["absorbed_message_uids"] is not None:
        out["_absorbed_message_uids"] = conversation.decode_json(r["absorbed_message_uids"])
    return out


def _insert(conn, session_id: str, rows: list[dict[str, Any]]) -> None:
    # Rows written as another program writes them: plain INSERTs, no uids unless given. One
    # transaction for all of them: a commit per row took most of these tests' time.
    conn.execute("BEGIN IMMEDIATE")
    for row in rows:
        row = {"session_id": session_id, **row}
        conn.execute(f"INSERT INTO messages ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))
    conn.execute("COMMIT")


def _check_against_the_rules(conn, session_id: str) -> None:
    # The session read as a conversation (live rows, then every row; with and without row ids)
    # is, dict by dict and key by key, what the rules written out plainly make of its rows.
    for live in (True, False):
        rows = [dict(zip(COLUMNS, row)) for row in conn.execute(
            f"SELECT {', '.join(COLUMNS)} FROM messages WHERE session_id = ?{' AND active = 1' * live} ORDER BY id",
            (session_id,))]
        for with_row_ids in (False, True):
            turn: dict = {"uids": {}, "answered": {}}
            want = [_reference_dict(r, turn, with_row_ids, session_id) for r in rows]
            got = conversation.get_messages_as_conversation(conn, session_id, with_row_ids=with_row_ids,
                                                            include_inactive=not live)
            assert [list(m.items()) for m in got] == [list(m.items()) for m in want]


@pytest.mark.parametrize("seed", range(3))
def test_each_row_becomes_the_documented_dict_with_its_keys_in_order(s, seed):
    # Rows of every shape (each column stored or NULL, JSON good and bad, merged turns' uid lists,
    # bytes where text is expected) against the rules written out plainly.
    import json
    import random
    rng = random.Random(seed)
    calls = json.dumps([{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}])
    choices: dict[str, list] = {
        "role": ["user", "assistant", "tool", "system", "assistant", "tool"],
        "content": [None, "", "plain", "a <memory-context>x</memory-context>\n b", b"\xffbytes", "<memory-context>"],
        "api_content": [None, None, "sent", "plain"], "tool_calls": [None, None, calls, "not json", " [1] "],
        "tool_call_id": [None, "c1", "c2", "c3"], "tool_name": [None, "terminal"],
        "reasoning": [None, "", "thought", b""], "reasoning_content": [None, "", "rc"],
        "reasoning_details": [None, None, '{"a": 1}', "bad"], "codex_reasoning_items": [None, None, "[1, 2]"],
        "codex_message_items": [None, None, '"s"'], "message_uid": [None, "", "u"],
        "absorbed_message_uids": [None, None, '["a", "b"]'],
        "tool_call_uids": [None, None, json.dumps({"c1": "U1", "c2": ["L1", "L2"], "c3": []}), '["x"]', "bad",
                           json.dumps({"c1": 5})],
        "tool_call_uid": [None, None, None, "S"],
        "content_parts": [None, None, None, '[{"type": "text", "text": "p"}]', '"a string"', "bad"],
        "timestamp": [1.5, 2.0], "finish_reason": [None, "stop"], "observed": [0, 0, 1, None],
        "platform_message_id": [None, None, "m1"], "effect_disposition": [None, None, "done"],
        "active": [1, 1, 1, 0],
    }
    _insert(s, "s", [{column: rng.choice(values) for column, values in choices.items()} for _ in range(1200)])
    s.execute("UPDATE messages SET message_uid = NULL WHERE id % 4 = 0")  # rows older than uids
    _check_against_the_rules(s, "s")


@pytest.mark.parametrize("shape", ["no row holds more", "a few rows hold more", "most rows hold more from the middle",
                                   "most rows hold more"])
def test_a_large_session_read_lean_gives_the_same_dicts(s, shape):
    # A large session's first batch is read with every column; the rest, unless most rows of that
    # batch hold more than the common columns, with the common columns and a flag: flagged rows are
    # read again by id, and once most rows of a batch are flagged the rest goes with every column.
    # Rows as hermes-agent writes them: no uids, some with reasoning, delivery fields, observed;
    # inactive rows among them.
    import json
    calls = json.dumps([{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}])
    rows = []
    for n in range(1300):
        role = ("user", "assistant", "tool")[n % 3]
        extra: dict = {}
        if shape == "a few rows hold more" and n % 23 == 0:
            extra = [{"reasoning": "hm"}, {"observed": 1}, {"platform_message_id": "m"}, {"observed": 0},
                     {"tool_call_uid": "U"}, {"api_content": "sent"}][n % 6]
        elif shape == "a few rows hold more" and n == 901:  # a turn with uids: the plain result after it pairs one
            extra = {"tool_call_uids": json.dumps({"c1": ["L1", "L2"]})}
        elif shape.startswith("most rows hold more") and (n >= 700 or not shape.endswith("middle")):
            extra = {"finish_reason": "stop"} if role == "assistant" else {"tool_call_uid": f"U{n}"}
        rows.append({"role": role, "content": f"text {n}" + " <memory-context>m</memory-context>" * (n % 7 == 1),
                     "tool_calls": calls if role == "assistant" and n % 2 else None,
                     "tool_call_id": "c1" if role == "tool" else None, "tool_name": "t" if role == "tool" else None,
                     "timestamp": 1000.0 + n, "active": 0 if n % 97 == 5 else 1, **extra})
    _insert(s, "s", rows)
    s.execute("UPDATE messages SET message_uid = NULL WHERE id % 5 = 0")
    _check_against_the_rules(s, "s")
