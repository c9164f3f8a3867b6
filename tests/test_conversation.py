"""hermes_state_conversation: stored rows as replayable conversation dicts, and the repairs made for a resend."""
from __future__ import annotations

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
