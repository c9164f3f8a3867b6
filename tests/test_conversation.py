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


def _reference_dict(row: tuple, turn: dict, with_row_ids: bool) -> dict:
    """What one row becomes, key by key in the documented order, written plainly (turn: the uids of the
    last assistant turn and how many results of each call id came after it)."""
    r: dict[str, Any] = dict(zip(conversation._COLUMNS, row))
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
    out["message_uid"] = r["message_uid"] or conversation.derived_uid("s", r["id"])
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


@pytest.mark.parametrize("seed", range(4))
def test_each_row_becomes_the_documented_dict_with_its_keys_in_order(seed):
    # Rows of every shape (each column stored or NULL, JSON good and bad, merged turns' uid lists),
    # through the projection a whole session is read with, against the rules written out plainly.
    import json
    import random
    rng = random.Random(seed)
    calls = json.dumps([{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}])
    choices = {
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
    }
    for with_row_ids in (False, True):
        projector = conversation._Projector(with_row_ids)
        projector.session_id = "s"
        turn: dict = {"uids": {}, "answered": {}}
        for row_id in range(1, 1500):
            row = tuple(row_id if column == "id" else rng.choice(choices[column]) for column in conversation._COLUMNS)
            got, want = projector.message(row), _reference_dict(row, turn, with_row_ids)
            assert list(got.items()) == list(want.items()), row
