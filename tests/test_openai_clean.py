"""OpenAI-clean conversations: the strict openai route, the append round trip, SDK objects, multimodal content.

The strict route is checked against the openai package's own message param types: every key of
every message (tool calls and content parts included) must be declared by the TypedDict of its
role, and every required key present.
"""
from __future__ import annotations

import collections.abc
import json
import sqlite3
import types
import typing

import openai.types.chat as chat
import pytest
import typing_extensions as te
from openai.types.chat import ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_message_tool_call import Function

from hermes_state import SessionDB, to_provider_messages

_REQUIRED = {te.Required, getattr(typing, "Required", te.Required)}
_OPTIONAL = {te.NotRequired, getattr(typing, "NotRequired", te.NotRequired)}


def _unwrap(tp):
    while typing.get_origin(tp) in _REQUIRED | _OPTIONAL | {te.Annotated}:
        tp = typing.get_args(tp)[0]
    return tp


def schema_problems(value, tp=chat.ChatCompletionMessageParam, path="$"):
    """Return why `value` is not a `tp` (a TypedDict, union, literal, list...); [] when it is."""
    tp = _unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        branches = [schema_problems(value, a, path) for a in args]
        return [] if any(not b for b in branches) else min(branches, key=len)
    if te.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected {tp.__name__}, got {type(value).__name__}"]
        hints = typing.get_type_hints(tp, include_extras=True)
        out = [f"{path}.{k}: not a key of {tp.__name__}" for k in value if k not in hints]
        out += [f"{path}.{k}: required by {tp.__name__}" for k, h in hints.items() if k not in value and (
            typing.get_origin(h) in _REQUIRED or (tp.__total__ and typing.get_origin(h) not in _OPTIONAL))]
        return out + [p for k, v in value.items() if k in hints for p in schema_problems(v, hints[k], f"{path}.{k}")]
    if origin in (typing.Literal, te.Literal):
        return [] if value in args else [f"{path}: {value!r} is not one of {args}"]
    if origin in (collections.abc.Iterable, collections.abc.Sequence, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in schema_problems(v, args[0], f"{path}[{i}]")]
    if tp is type(None):
        return [] if value is None else [f"{path}: expected None"]
    if tp in (str, int, float, bool):
        return [] if isinstance(value, tp) else [f"{path}: expected {tp.__name__}, got {type(value).__name__}"]
    return []


def test_the_schema_check_is_real():
    assert schema_problems({"role": "tool", "content": "x", "tool_call_id": "c"}) == []
    assert schema_problems({"role": "tool", "content": "x", "tool_call_id": "c", "name": "t"})
    assert schema_problems({"role": "assistant", "content": "", "reasoning_content": "r"})
    assert schema_problems({"role": "user", "content": "x", "message_uid": "a" * 32})
    assert schema_problems({"role": "tool", "content": "x"})  # tool_call_id is required
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert schema_problems({"role": "assistant", "tool_calls": [call]}) == []
    assert schema_problems({"role": "assistant", "tool_calls": [dict(call, index=0)]})
    assert schema_problems({"role": "user", "content": [{"type": "text", "text": "a", "extra": 1}]})


CALL = {"id": "call_1", "type": "function", "index": 0,
        "function": {"name": "terminal", "arguments": "{\"cmd\": \"ls\"}"}}
PARTS = [{"type": "text", "text": "What is in this picture of a zebrafish?"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}]


def _fill(db, sid="s"):
    db.create_session(sid, "cli")
    db.append_message(sid, "system", "You are terse.")
    db.append_message(sid, "user", PARTS)
    db.append_message(sid, "assistant", "", tool_calls=[CALL], reasoning="raw", reasoning_content="Need ls.",
                      reasoning_details=[{"type": "reasoning.text", "text": "Need ls."}],
                      codex_reasoning_items=[{"id": "rs_1"}])
    db.append_message(sid, "tool", "a.txt", tool_call_id="call_1", tool_name="terminal")
    db.append_message(sid, "assistant", "", reasoning_content="Only thinking.", api_content="Only thinking.")
    db.append_message(sid, "assistant", "Done.", display_kind="final", display_metadata={"marker": "m1"})


@pytest.mark.parametrize("route", [{"provider": "openai"},
                                   {"provider": "custom", "base_url": "https://api.openai.com/v1"},
                                   {"provider": "OpenAI", "base_url": "api.openai.com"}])
def test_openai_route_sends_only_what_the_chat_completions_schema_declares(db, route):
    _fill(db)
    conversation = db.get_messages_as_conversation("s", with_row_ids=True)
    assert any(schema_problems(m) for m in conversation)  # the stored form is not a request
    wire = to_provider_messages(conversation, **route)
    assert [schema_problems(m) for m in wire] == [[]] * len(wire)
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool", "assistant", "assistant"]
    assert wire[1]["content"] == PARTS
    assert wire[2]["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "terminal", "arguments": "{\"cmd\": \"ls\"}"}}]
    assert wire[3] == {"role": "tool", "content": "a.txt", "tool_call_id": "call_1"}
    assert wire[4] == {"role": "assistant", "content": "Only thinking."}  # the bytes that were sent
    assert wire[5] == {"role": "assistant", "content": "Done."}


def test_openai_route_repairs_what_the_schema_requires_and_refuses_unknown_roles():
    conv = [{"role": "user", "content": None}, {"role": "assistant", "content": None},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
            {"role": "tool", "tool_call_id": "c", "name": "f",
             "content": [{"type": "text", "text": "ok"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    wire = to_provider_messages(conv, provider="openai")
    assert [schema_problems(m) for m in wire] == [[]] * 4
    assert wire[0]["content"] == "" and wire[1]["content"] == ""
    assert wire[2]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert wire[3]["content"] == [{"type": "text", "text": "ok"}]  # a tool result takes text parts only
    with pytest.raises(ValueError, match="session_meta"):
        to_provider_messages([{"role": "session_meta", "content": "x"}], provider="openai")


def test_other_routes_are_unchanged_by_the_openai_route():
    conv = [{"role": "tool", "content": "out", "tool_call_id": "c", "name": "terminal", "message_uid": "a" * 32}]
    assert to_provider_messages(conv) == [{"role": "tool", "content": "out", "tool_call_id": "c", "name": "terminal"}]
    local = to_provider_messages([{"role": "assistant", "content": "", "reasoning": "r"}], provider="openai",
                                 base_url="http://localhost:1234/v1")
    assert local[0]["reasoning"] == "r"  # provider "openai" aimed at a local server keeps that server's route


# --- the round trip ---------------------------------------------------------------------------------

def _without_row_ids(conversation):
    return [{k: v for k, v in m.items() if k != "_row_id"} for m in conversation]


def test_every_conversation_message_appends_back_as_a_copy(db, rival):
    _fill(db)
    original = db.get_messages_as_conversation("s", with_row_ids=True)
    db.create_session("s2", "cli")
    for msg in original:
        db.append_message("s2", **msg)
    copied = db.get_messages_as_conversation("s2")
    assert copied == _without_row_ids(original)  # uids kept: a copy keeps its uid
    counts = rival.execute("SELECT id, message_count, tool_call_count FROM sessions ORDER BY id").fetchall()
    assert [tuple(r) for r in counts] == [("s", 6, 1), ("s2", 6, 1)]
    stored = rival.execute("SELECT tool_name, content, api_content FROM messages WHERE session_id = 's2' "
                           "ORDER BY id").fetchall()
    assert tuple(stored[3]) == ("terminal", "a.txt", None)
    assert tuple(stored[4]) == (None, "", "Only thinking.")  # both columns come back
    kept = ("timestamp", "display_kind", "display_metadata", "content", "tool_call_uids", "tool_call_uid")
    assert ([{k: m[k] for k in kept} for m in db.get_messages("s2")]
            == [{k: m[k] for k in kept} for m in db.get_messages("s")])  # a copy keeps the stored fields


def test_a_live_uid_is_not_appended_twice_to_one_session(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello")
    msg = db.get_messages_as_conversation("s")[0]
    with pytest.raises(ValueError, match="already a live message"):
        db.append_message("s", **msg)
    for bad in ("\ud800" * 32, "A" * 32, 7):
        with pytest.raises(ValueError, match="message_uid"):
            db.append_message("s", "user", "x", message_uid=bad)
    assert tuple(rival.execute("SELECT COUNT(*), MAX(message_count) FROM messages, sessions").fetchone()) == (1, 1)


def test_name_is_tool_name_and_unknown_keywords_are_type_errors(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "tool", "out", tool_call_id="c1", name="terminal")
    db.append_message("s", "tool", "out", tool_call_id="c2", name="terminal", tool_name="terminal")
    assert [r[0] for r in rival.execute("SELECT tool_name FROM messages")] == ["terminal", "terminal"]
    with pytest.raises(ValueError, match="tool_name"):
        db.append_message("s", "tool", "out", name="terminal", tool_name="browser")
    with pytest.raises(TypeError, match="colour"):
        db.append_message("s", "user", "x", colour="red")
    with pytest.raises(TypeError, match="_nonsense"):
        db.append_message("s", "user", "x", _nonsense=1)
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2


def test_sdk_objects_are_stored_as_their_json_dump(db, rival):
    db.create_session("s", "cli")
    call = ChatCompletionMessageToolCall(id="call_9", type="function",
                                         function=Function(name="search", arguments='{"q": "tide"}'))
    db.append_message("s", "assistant", None, tool_calls=[call], display_metadata={"sdk": call})
    row = db.get_messages("s")[0]
    dumped = {"id": "call_9", "type": "function", "function": {"name": "search", "arguments": '{"q": "tide"}'}}
    assert row["tool_calls"] == [dumped] and row["display_metadata"] == {"sdk": dumped}
    assert set(row["tool_call_uids"]) == {"call_9"}  # the call's id was read from the dump
    assert rival.execute("SELECT tool_call_count FROM sessions").fetchone()[0] == 1
    db.append_message("s", "tool", "high", tool_call_id="call_9", name="search")
    assert db.get_messages("s")[1]["tool_call_uid"] == row["tool_call_uids"]["call_9"]


# --- multimodal content -----------------------------------------------------------------------------

def test_a_list_of_parts_comes_back_as_the_same_list_and_its_text_is_searchable(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", PARTS)
    assert db.get_messages("s")[0]["content"] == PARTS
    assert db.get_messages_as_conversation("s")[0]["content"] == PARTS
    stored = rival.execute("SELECT content, api_content, content_parts FROM messages").fetchone()
    assert stored[0] == "What is in this picture of a zebrafish?" and stored[1] is None
    assert json.loads(stored[2]) == PARTS
    hits = db.search_messages("zebrafish")
    assert [h["id"] for h in hits] == [1] and ">>>zebrafish<<<" in hits[0]["snippet"]
    assert db.list_sessions()[0]["preview"] == "What is in this picture of a zebrafish?"[:63]


def test_a_string_that_looks_like_parts_stays_a_string(db):
    db.create_session("s", "cli")
    text = json.dumps(PARTS)
    db.append_message("s", "user", text)
    db.append_message("s", "assistant", text, api_content=text)
    assert [m["content"] for m in db.get_messages("s")] == [text, text]
    assert [m["content"] for m in db.get_messages_as_conversation("s")] == [text, text]


def test_bad_parts_are_refused_before_anything_is_written(db, rival):
    db.create_session("s", "cli")
    for bad in (["just a string"], [{"type": "text", "text": object()}]):
        with pytest.raises(ValueError, match="content"):
            db.append_message("s", "user", bad)
    with pytest.raises(ValueError, match="api_content"):
        db.append_message("s", "user", PARTS, api_content="x")
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_parts_survive_replace_compression_and_merge(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", PARTS)
    db.append_message("s", "user", "and this one?")
    db.replace_messages("s", db.get_messages("s"))  # raw rows carry content_parts too: derived, not doubled
    assert [m["content"] for m in db.get_messages("s")] == [PARTS, "and this one?"]
    db.compress_in_place("s", db.get_messages_as_conversation("s"))
    assert [m["content"] for m in db.get_messages_as_conversation("s")] == [PARTS, "and this one?"]
    ids = [m["id"] for m in db.get_messages("s")]
    db.merge_messages("s", ids)
    merged = db.get_messages("s")[0]
    assert merged["content"] == [*PARTS, {"type": "text", "text": "and this one?"}]
    assert [h["id"] for h in db.search_messages("zebrafish")] == [merged["id"]]
    assert [h["id"] for h in db.search_messages('"this one"')] == [merged["id"]]


def test_a_file_without_the_parts_column_opens_and_gains_it(tmp_path):
    path = tmp_path / "old.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "before")
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE messages DROP COLUMN content_parts")
    raw.execute("UPDATE schema_version SET version = 31")
    raw.commit()
    raw.close()
    with SessionDB(path) as db:
        db.append_message("s", "user", PARTS)
        assert [m["content"] for m in db.get_messages_as_conversation("s")] == ["before", PARTS]
