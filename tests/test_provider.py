"""Provider wire format (R-MSG-10): non-wire keys stripped, reasoning routed per route, rejections remembered, echoes stripped."""
from __future__ import annotations

import copy

import pytest

from hermes_state import ReasoningFieldMemory, SessionDB, to_provider_messages
from hermes_state_provider import reasoning_carriers, strip_echoed_user_input

CALL = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
CONVERSATION = [
    {"role": "user", "content": "q", "message_uid": "a" * 32, "_row_id": 1},
    {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning": "raw thought",
     "reasoning_content": "thought", "reasoning_details": [{"type": "reasoning.text", "text": "thought"}],
     "codex_reasoning_items": [{"id": "r"}], "codex_message_items": [{"id": "m"}], "message_uid": "b" * 32,
     "_row_id": 2, "_tool_call_uids": {"c1": "c" * 32}},
    {"role": "tool", "content": "out", "tool_call_id": "c1", "name": "terminal", "message_uid": "d" * 32,
     "_tool_call_uid": "c" * 32},
]


def assistant(messages):
    return next(m for m in messages if m["role"] == "assistant")


@pytest.mark.parametrize("provider, base_url, fields", [
    (None, None, {"reasoning_content"}),
    ("openai", "https://api.openai.com/v1", set()),   # the strict OpenAI route
    ("openai", "http://localhost:1234/v1", {"reasoning_content", "reasoning"}),  # the host decides
    ("openrouter", None, {"reasoning_content", "reasoning", "reasoning_details"}),
    ("custom", "https://openrouter.ai/api/v1", {"reasoning_content", "reasoning", "reasoning_details"}),
    ("kilo", None, {"reasoning_content", "reasoning", "reasoning_details"}),
    ("vercel-ai-gateway", None, {"reasoning_content", "reasoning", "reasoning_details"}),
    ("Nous Portal", None, {"reasoning_content", "reasoning", "reasoning_details"}),
    ("novita", None, {"reasoning_content", "reasoning_details"}),
    ("minimax", "https://api.minimax.io/v1", {"reasoning_content", "reasoning_details"}),
    ("minimax", "https://api.minimax.io/anthropic", {"reasoning_content"}),
    ("tokenhub", None, {"reasoning_content", "reasoning_details"}),
    ("custom", "http://localhost:8080/v1", {"reasoning_content", "reasoning"}),
    ("custom", "http://192.168.1.20:11434/v1", {"reasoning_content", "reasoning"}),
    ("ollama", None, {"reasoning_content", "reasoning"}),
    ("upstage", None, {"reasoning_content", "reasoning"}),
    ("mistral", None, set()),
    ("groq", None, set()),
    ("cerebras", None, set()),
    ("custom", "https://api.sambanova.ai/v1", set()),
    ("fireworks", None, {"reasoning_content"}),
])
def test_reasoning_goes_to_the_fields_each_route_reads(provider, base_url, fields):
    wire = to_provider_messages(CONVERSATION, provider=provider, base_url=base_url)
    got = assistant(wire)
    assert {k for k in got if k.startswith("reasoning")} == fields
    assert set(reasoning_carriers(provider, base_url)) == fields
    if "reasoning_content" in fields:
        assert got["reasoning_content"] == "thought"
    if "reasoning" in fields:
        assert got["reasoning"] == "raw thought"


def test_non_wire_keys_are_stripped_and_history_is_untouched():
    history = copy.deepcopy(CONVERSATION)
    wire = to_provider_messages(history, provider="openrouter")
    assert history == CONVERSATION
    for m in wire:
        assert "message_uid" not in m and not any(k.startswith("_") for k in m)
        assert "codex_reasoning_items" not in m and "codex_message_items" not in m
    assert wire[0] == {"role": "user", "content": "q"}
    assert wire[2] == {"role": "tool", "content": "out", "tool_call_id": "c1", "name": "terminal"}
    assert wire[1]["tool_calls"] == [CALL]


@pytest.mark.parametrize("provider, padded", [("deepseek", True), ("kimi", True), ("mimo", True),
                                              ("openrouter", False), (None, False), ("mistral", False)])
def test_only_deepseek_kimi_mimo_pad_reasoning_less_tool_turns(provider, padded):
    turn = [{"role": "assistant", "content": None, "tool_calls": [CALL], "message_uid": "e" * 32},
            {"role": "assistant", "content": "plain", "message_uid": "f" * 32}]
    wire = to_provider_messages(turn, provider=provider)
    assert (wire[0].get("reasoning_content") == " ") is padded
    assert "reasoning_content" not in wire[1]  # no tool calls: never padded
    with_reasoning = to_provider_messages([dict(turn[0], reasoning_content="real")], provider=provider)
    assert with_reasoning[0].get("reasoning_content") in ("real", None)


def test_pad_is_found_from_the_host_too():
    turn = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    assert to_provider_messages(turn, provider="custom", base_url="https://api.deepseek.com")[0][
        "reasoning_content"] == " "


def test_conversation_from_the_store_round_trips_to_the_wire(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", "", reasoning_content="thinking", api_content="thinking")
    wire = SessionDB.to_provider_messages(db.get_messages_as_conversation("s", with_row_ids=True), provider="groq")
    assert wire == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "thinking"}]


def test_reasoning_field_memory_records_a_rejection_once_per_route():
    memory = ReasoningFieldMemory()
    error = "Error 400: Extra inputs are not permitted, field: messages[3].reasoning_details"
    route = {"provider": "custom", "base_url": "https://llm.example.com/v1", "model": "m1"}
    assert memory.record(error, **route) == "reasoning_details"
    assert memory.record(error, **route) is None  # already retried once: do not loop
    assert memory.rejected(**route) == {"reasoning_details"}
    assert memory.rejected(provider="custom", base_url="https://llm.example.com/v1", model="m2") == frozenset()
    assert memory.rejected(provider="custom", base_url="https://other.example.com", model="m1") == frozenset()
    wire = to_provider_messages(CONVERSATION, provider="openrouter")
    filtered = memory.filter(wire, **route)
    assert "reasoning_details" not in assistant(filtered) and "reasoning_details" in assistant(wire)
    # Pydantic-style paths and exception objects are understood too.
    assert memory.record(ValueError("messages.1.reasoning: Extra inputs are not permitted"), **route) == "reasoning"


@pytest.mark.parametrize("error", [
    "messages[2].reasoning_content is required",  # a demand, not a rejection
    "Extra inputs are not permitted, field: messages[0].foo",  # not a reasoning carrier
    "rate limited",
])
def test_reasoning_field_memory_ignores_other_errors(error):
    memory = ReasoningFieldMemory()
    assert memory.record(error, provider="x") is None
    assert memory.rejected(provider="x") == frozenset()


# --- echoed user input ------------------------------------------------------------------------------

def user(*parts) -> dict:
    return {"type": "userMessage", "content": list(parts)}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def test_strip_drops_only_the_first_matching_user_item():
    items = [user(text("hi")), {"type": "agentMessage", "text": "hello"}, user(text("hi"))]
    assert strip_echoed_user_input(items, ["hi"]) == items[1:]   # the later identical turn stays
    assert len(items) == 3                                       # pure: the input is untouched
    assert strip_echoed_user_input(items, "hi") == items[1:]


def test_strip_keeps_non_matching_and_later_user_items():
    items = [{"type": "reasoning"}, user(text("something else")), user(text("hi"))]
    assert strip_echoed_user_input(items, ["hi"]) == items       # only the first user item is considered
    assert strip_echoed_user_input([], ["hi"]) == []
    assert strip_echoed_user_input([user(text("hi "))], ["hi"]) == [user(text("hi "))]


def test_strip_renders_rich_input_the_same_way():
    sent = [text("look at this"), {"type": "image", "url": "https://x/cat.png"}]
    echoed = user(text("look at this"), {"type": "image", "url": "https://x/cat.png"})
    assert strip_echoed_user_input([echoed, {"type": "agentMessage"}], sent) == [{"type": "agentMessage"}]
    other_image = user(text("look at this"), {"type": "image", "url": "https://x/dog.png"})
    assert strip_echoed_user_input([other_image], sent) == [other_image]
    local = user({"type": "localImage", "path": "/tmp/a.png"})
    assert strip_echoed_user_input([local], [{"type": "localImage", "path": "/tmp/a.png"}]) == []
    assert strip_echoed_user_input([local], ["[image: /tmp/a.png]"]) == []   # rendered text matches too
