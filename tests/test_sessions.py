"""Session records, messages and the conversation projection (R-SESS-1..4, R-SESS-9, R-MSG-1..9).

Everything goes through the public SessionDB API, and what persisted is read back from `rival`,
a second connection. Module-level helpers of hermes_state_sessions that the compression module
reuses (insert_message, compression_ancestor_ids) are exercised on the bare `conn`.
"""
from __future__ import annotations

import json
import re
import sqlite3
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_lineage as lineage
import hermes_state_messages as messages
from hermes_state import SessionDB, SessionNotFoundError, TitleConflictError

HEX32 = re.compile(r"[0-9a-f]{32}")


def row(rival: sqlite3.Connection, session_id: str) -> sqlite3.Row:
    return rival.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()


def rows(rival: sqlite3.Connection, session_id: str, active_only: bool = False) -> list[sqlite3.Row]:
    sql = "SELECT * FROM messages WHERE session_id = ?" + (" AND active = 1" if active_only else "") + " ORDER BY id"
    return rival.execute(sql, (session_id,)).fetchall()


def call(cid: str, name: str = "terminal") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


def in_txn(conn: sqlite3.Connection, fn, *args, **kwargs):
    """Run a module function the way the facade does: inside one BEGIN IMMEDIATE."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = fn(conn, *args, **kwargs)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return out


# --- session records -------------------------------------------------------------------------

def test_ensure_session_creates_then_leaves_the_row_alone(db, rival):
    assert db.ensure_session("s", "cli", model="m1", user_id="basic:alice") == "s"
    first = dict(row(rival, "s"))
    assert first["model"] == "m1" and first["user_id"] == "basic:alice"
    assert db.ensure_session("s", "telegram", model="m2", title="ignored") == "s"
    assert dict(row(rival, "s")) == first
    with pytest.raises(ValueError):
        db.ensure_session("t", "cli", no_such_column=1)
    assert row(rival, "t") is None


def test_end_session_first_end_wins_and_reopen_allows_another(db, rival):
    db.create_session("s", "cli")
    db.end_session("s", "user_exit")
    ended = row(rival, "s")
    db.end_session("s", "timeout")
    again = row(rival, "s")
    assert (again["end_reason"], again["ended_at"]) == ("user_exit", ended["ended_at"])
    db.reopen_session("s")
    assert (row(rival, "s")["ended_at"], row(rival, "s")["end_reason"]) == (None, None)
    db.end_session("s", "timeout")
    assert row(rival, "s")["end_reason"] == "timeout"


@pytest.mark.parametrize("method, args", [
    ("end_session", ("ghost", "x")), ("reopen_session", ("ghost",)), ("update_session", ("ghost",)),
    ("archive_session", ("ghost",)), ("unarchive_session", ("ghost",)), ("pin_session", ("ghost",)),
    ("update_token_counts", ("ghost", 1)), ("append_message", ("ghost", "user", "hi")),
    ("merge_messages", ("ghost", [1, 2])), ("replace_messages", ("ghost", [])), ("clear_messages", ("ghost",)),
])
def test_unknown_session_is_a_typed_key_error_and_writes_nothing(db, rival, method, args):
    with pytest.raises(SessionNotFoundError) as info:
        getattr(db, method)(*args)
    assert isinstance(info.value, KeyError)
    assert "ghost" in str(info.value)
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_end_session_rejects_blank_reason(db, rival):
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.end_session("s", "")
    assert row(rival, "s")["ended_at"] is None


def test_update_session_sets_encodes_and_clears(db, rival):
    db.create_session("p", "cli")
    db.create_session("s", "cli", model="m", cwd="/tmp")
    db.update_session("s", model_config={"temperature": 0.2}, cwd=None, title="  Hello  ", parent_session_id="p")
    r = row(rival, "s")
    assert json.loads(r["model_config"]) == {"temperature": 0.2}
    assert r["cwd"] is None and r["title"] == "Hello" and r["parent_session_id"] == "p"
    assert r["model"] == "m"


@pytest.mark.parametrize("columns, error", [
    ({"no_such_column": 1}, ValueError),
    ({"message_count": 5}, ValueError),
    ({"title": "t" * 101}, ValueError),
    ({"source": None}, ValueError),
    ({"parent_session_id": "s"}, ValueError),
    ({"parent_session_id": "ghost"}, SessionNotFoundError),
    ({"title": "Taken"}, TitleConflictError),
])
def test_update_session_bad_input_writes_nothing(db, rival, columns, error):
    db.create_session("other", "cli", title="Taken")
    db.create_session("s", "cli", model="before")
    before = dict(row(rival, "s"))
    with pytest.raises(error):
        db.update_session("s", model="after", **columns)
    assert dict(row(rival, "s")) == before


@pytest.mark.parametrize("column, value, verb", [
    ("user_id", "basic:mallory", "created"),
    ("ended_at", 123.0, "end_session"),
    ("end_reason", "x", "reopen_session"),
    ("archived", 1, "archive_session"),
    ("auto_archived", 0, "auto_archive"),
    ("pinned", 1, "pin_session"),
    ("started_at", 1.0, "creation time"),
])
def test_update_session_refuses_columns_another_verb_owns(db, rival, column, value, verb):
    db.create_session("s", "cli", user_id="basic:alice")
    db.end_session("s", "user_exit")
    before = dict(row(rival, "s"))
    with pytest.raises(ValueError) as info:
        db.update_session("s", cwd="/srv", **{column: value})
    assert column in str(info.value) and verb in str(info.value)
    assert dict(row(rival, "s")) == before


def test_create_session_may_set_verb_owned_columns_for_imports(db, rival):
    db.create_session("s", "cli", user_id="u", ended_at=5.0, end_reason="imported", archived=1, auto_archived=1,
                      pinned=1)
    r = row(rival, "s")
    assert (r["user_id"], r["ended_at"], r["end_reason"], r["archived"], r["auto_archived"], r["pinned"]) == \
        ("u", 5.0, "imported", 1, 1, 1)


def test_ensure_session_validates_columns_even_when_the_row_exists(db, rival):
    db.create_session("s", "cli")
    before = dict(row(rival, "s"))
    for bad in ({"bogus": 1}, {"message_count": 3}, {"input_tokens": 2**63}, {"cwd": ["/a"]}):
        with pytest.raises(ValueError):
            db.ensure_session("s", "cli", **bad)
    assert dict(row(rival, "s")) == before


@pytest.mark.parametrize("columns", [
    {"input_tokens": 2**63}, {"input_tokens": -2**63 - 1}, {"cwd": ["/a"]}, {"cwd": b"/a"},
    {"started_at": float("nan")}, {"display_name": object()},
])
def test_session_columns_must_be_values_sqlite_stores_faithfully(db, rival, columns):
    (name,) = columns  # the error names the column, not just "a value"
    with pytest.raises(ValueError, match=name):
        db.create_session("new", "cli", **columns)
    assert row(rival, "new") is None
    db.create_session("s", "cli")
    before = dict(row(rival, "s"))
    with pytest.raises(ValueError, match=name):
        db.update_session("s", **columns)
    assert dict(row(rival, "s")) == before


def test_session_columns_are_checked_by_their_declared_kind(db, rival):
    db.create_session("s", "cli", input_tokens=2**63 - 1, rewind_count=0, pinned=True, ended_at=5,
                      estimated_cost_usd=0.25)
    r = row(rival, "s")
    assert (r["input_tokens"], r["rewind_count"], r["pinned"], r["ended_at"]) == (2**63 - 1, 0, 1, 5.0)
    bad = [{"output_tokens": -1}, {"rewind_count": True}, {"input_tokens": 1.5}, {"started_at": "yesterday"},
           {"ended_at": float("nan")}, {"estimated_cost_usd": float("inf")}, {"actual_cost_usd": -0.5},
           {"last_activity_at": "now"}, {"pinned": 2}, {"title": 7}]
    for columns in bad:
        with pytest.raises(ValueError, match=next(iter(columns))):
            db.create_session("t", "cli", **columns)
        assert row(rival, "t") is None, columns
    for columns in [{"output_tokens": -1}, {"api_call_count": "3"}, {"source": ""}, {"source": None},
                    {"compression_failure_cooldown_until": "soon"}]:
        with pytest.raises(ValueError):
            db.update_session("s", **columns)
    with pytest.raises(ValueError, match="source"):
        db.create_session("t", "")
    assert tuple(row(rival, "s")) == tuple(r)


def test_title_conflict_error_is_also_value_error(db):
    db.create_session("a", "cli", title="T")
    db.create_session("b", "cli")
    with pytest.raises(ValueError):
        db.update_session("b", title=" T ")


@pytest.mark.parametrize("kwargs", [{"input_tokens": 2**63}, {"api_call_count": 2**70},
                                    {"estimated_cost_usd": 10**400}])
def test_update_token_counts_out_of_range_is_a_value_error(db, rival, kwargs):
    db.create_session("s", "cli", model="m")
    before = dict(row(rival, "s"))
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        db.update_token_counts("s", **kwargs)
    assert dict(row(rival, "s")) == before
    assert rival.execute("SELECT COUNT(*) FROM session_model_usage").fetchone()[0] == 0


def test_message_token_count_and_timestamp_out_of_range_are_value_errors(db, rival):
    db.create_session("s", "cli")
    for kwargs in ({"token_count": 2**63}, {"timestamp": 10**400}):
        (name,) = kwargs
        with pytest.raises(ValueError, match=name):
            db.append_message("s", "user", "hi", **kwargs)
    assert rows(rival, "s") == []
    db.append_message("s", "user", "hi", token_count=2**63 - 1)
    assert rows(rival, "s")[0]["token_count"] == 2**63 - 1


def test_update_token_counts_increments_backfills_model_and_upserts_usage(db, rival):
    db.create_session("s", "cli")
    db.update_token_counts("s", 100, 20, 5, 1, 7, estimated_cost_usd=0.5, api_call_count=1, model="gpt-x")
    db.update_token_counts("s", 10, 2, estimated_cost_usd=0.25, api_call_count=1, model="other")
    r = row(rival, "s")
    assert (r["input_tokens"], r["output_tokens"], r["cache_read_tokens"], r["cache_write_tokens"],
            r["reasoning_tokens"], r["api_call_count"]) == (110, 22, 5, 1, 7, 2)
    assert r["estimated_cost_usd"] == pytest.approx(0.75)
    assert r["model"] == "gpt-x"  # backfilled once, never overwritten
    usage = {u["model"]: dict(u) for u in rival.execute("SELECT * FROM session_model_usage WHERE session_id = 's'")}
    assert set(usage) == {"gpt-x", "other"}
    gpt = usage["gpt-x"]
    assert (gpt["task"], gpt["input_tokens"], gpt["estimated_cost_usd"]) == ("", 100, 0.5)
    assert (usage["other"]["input_tokens"], usage["other"]["api_call_count"]) == (10, 1)
    # Without a model the session's model keys the usage row.
    db.update_token_counts("s", 1)
    assert rival.execute("SELECT input_tokens FROM session_model_usage WHERE model = 'gpt-x'").fetchone()[0] == 101


def test_update_token_counts_absolute_sets(db, rival):
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", 100, 50)
    db.update_token_counts("s", 7, 3, estimated_cost_usd=1.5, absolute=True)
    r = row(rival, "s")
    assert (r["input_tokens"], r["output_tokens"], r["estimated_cost_usd"]) == (7, 3, 1.5)
    # Usage rows are sums of calls; a total set over them would count them twice, so the
    # row keeps what the one incremental call added.
    u = rival.execute("SELECT input_tokens, output_tokens FROM session_model_usage WHERE session_id = 's'").fetchone()
    assert tuple(u) == (100, 50)


def test_update_token_counts_without_any_model_keeps_no_usage_row(db, rival):
    db.create_session("s", "cli")
    db.update_token_counts("s", 5)
    assert row(rival, "s")["input_tokens"] == 5
    assert rival.execute("SELECT COUNT(*) FROM session_model_usage").fetchone()[0] == 0


@pytest.mark.parametrize("kwargs", [
    {"input_tokens": -1}, {"output_tokens": 1.5}, {"input_tokens": True}, {"estimated_cost_usd": float("nan")},
    {"estimated_cost_usd": "0.1"}, {"model": ""}, {"api_call_count": None},
])
def test_update_token_counts_bad_values_write_nothing(db, rival, kwargs):
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.update_token_counts("s", **kwargs)
    assert row(rival, "s")["input_tokens"] == 0
    assert rival.execute("SELECT COUNT(*) FROM session_model_usage").fetchone()[0] == 0


def test_archive_unarchive_pin(db, rival):
    db.create_session("s", "cli")
    db.archive_session("s")
    assert (row(rival, "s")["archived"], row(rival, "s")["auto_archived"]) == (1, 0)
    db.unarchive_session("s")
    assert row(rival, "s")["archived"] == 0
    db.pin_session("s")
    assert row(rival, "s")["pinned"] == 1
    db.pin_session("s", pinned=False)
    assert row(rival, "s")["pinned"] == 0


def test_auto_archive_sweeps_idle_unpinned_sessions_only(db, rival):
    old = time.time() - 40 * 86400
    for sid in ("idle", "pinned", "recent", "active_lately", "deliberate"):
        db.create_session(sid, "cli", started_at=old)
    db.create_session("new", "cli")
    db.pin_session("pinned")
    db.update_session("recent", last_activity_at=time.time())
    db.append_message("active_lately", "user", "still here")
    db.archive_session("deliberate")
    assert db.auto_archive(30) == 1
    archived = {r["id"]: (r["archived"], r["auto_archived"]) for r in rival.execute("SELECT * FROM sessions")}
    assert archived == {"idle": (1, 1), "pinned": (0, 0), "recent": (0, 0), "active_lately": (0, 0),
                        "deliberate": (1, 0), "new": (0, 0)}
    assert db.auto_archive(30) == 0
    with pytest.raises(ValueError):
        db.auto_archive(-1)


def test_resuming_clears_only_the_sweeps_archive(db, rival):
    old = time.time() - 40 * 86400
    db.create_session("swept", "cli", started_at=old)
    db.create_session("kept_archived", "cli", started_at=old)
    db.create_session("reopened", "cli", started_at=old)
    db.archive_session("kept_archived")
    assert db.auto_archive(1) == 2
    db.append_message("swept", "user", "back again")
    db.append_message("kept_archived", "user", "still archived")
    db.reopen_session("reopened")
    flags = {r["id"]: (r["archived"], r["auto_archived"]) for r in rival.execute("SELECT * FROM sessions")}
    assert flags == {"swept": (0, 0), "kept_archived": (1, 0), "reopened": (0, 0)}


# --- appending -------------------------------------------------------------------------------

def test_append_returns_row_id_and_keeps_counters(db, rival):
    db.create_session("s", "cli")
    a = db.append_message("s", "user", "hi")
    b = db.append_message("s", "assistant", None, tool_calls=[call("c1"), call("c2")])
    db.append_message("s", "tool", "out", tool_call_id="c1", tool_name="terminal", tool_calls=None)
    db.append_message("s", "user", "not a tool turn", tool_calls=[call("x")])
    assert b > a
    r = row(rival, "s")
    assert (r["message_count"], r["tool_call_count"]) == (4, 2)
    assert [m["id"] for m in rows(rival, "s")][:2] == [a, b]
    assert r["last_activity_at"] == max(m["timestamp"] for m in rows(rival, "s"))


def test_append_stores_every_field_and_decodes_json(db, rival):
    db.create_session("s", "cli")
    details = [{"type": "reasoning.text", "text": "hmm"}]
    db.append_message("s", "assistant", "answer", tool_calls=[call("c1")], token_count=150, finish_reason="stop",
                      reasoning="raw", reasoning_content="rc", reasoning_details=details,
                      codex_reasoning_items=[{"id": "r1"}], codex_message_items=[{"type": "message"}],
                      api_content="sent", display_kind="note", display_metadata={"marker": "m1"},
                      platform_message_id=12345, observed=True, effect_disposition="revoked", timestamp=1000.5)
    stored = rows(rival, "s")[0]
    assert json.loads(stored["tool_calls"]) == [call("c1")]  # a JSON string on disk
    assert json.loads(stored["reasoning_details"]) == details
    assert (stored["platform_message_id"], stored["observed"], stored["timestamp"]) == ("12345", 1, 1000.5)
    got = db.get_messages("s")[0]
    assert got["tool_calls"] == [call("c1")] and got["reasoning_details"] == details
    assert got["codex_reasoning_items"] == [{"id": "r1"}] and got["display_metadata"] == {"marker": "m1"}
    assert (got["reasoning"], got["reasoning_content"], got["api_content"]) == ("raw", "rc", "sent")
    assert (got["token_count"], got["finish_reason"], got["effect_disposition"]) == (150, "stop", "revoked")
    assert (got["active"], got["compacted"], got["absorbed_message_uids"]) == (1, 0, None)


def test_json_fields_given_as_strings(db, rival):
    """A str that parses as JSON is taken as already serialised; any other str round-trips as itself."""
    db.create_session("s", "cli")
    wire_calls = json.dumps([call("c1")])
    db.append_message("s", "assistant", "a", tool_calls=wire_calls, display_metadata="123")
    db.append_message("s", "user", "u", display_metadata="plain note", reasoning_details="NaN")
    db.append_message("s", "user", "v", display_metadata="", codex_message_items='{"broken": ')
    stored = rows(rival, "s")
    assert stored[0]["tool_calls"] == wire_calls and stored[0]["display_metadata"] == "123"
    for m in stored:  # every stored value is JSON text
        for name in ("display_metadata", "reasoning_details", "codex_message_items"):
            if m[name] is not None:
                json.loads(m[name])
    got = db.get_messages("s")
    assert got[0]["tool_calls"] == [call("c1")] and got[0]["display_metadata"] == 123  # the documented trade-off
    assert (got[1]["display_metadata"], got[1]["reasoning_details"]) == ("plain note", "NaN")
    assert (got[2]["display_metadata"], got[2]["codex_message_items"]) == ("", '{"broken": ')


def test_default_timestamp_is_now(db, rival):
    db.create_session("s", "cli")
    before = time.time()
    db.append_message("s", "user", "hi")
    after = time.time()
    assert before <= rows(rival, "s")[0]["timestamp"] <= after


def test_message_uids_are_fresh_32_hex(db, rival):
    db.create_session("s", "cli")
    for i in range(5):
        db.append_message("s", "user", f"m{i}")
    uids = [m["message_uid"] for m in rows(rival, "s")]
    assert all(HEX32.fullmatch(u) for u in uids) and len(set(uids)) == 5


def test_content_is_stored_byte_for_byte_including_nul_and_10_mb(db, rival):
    db.create_session("s", "cli")
    nul = "before\x00after\x00"
    big = ("0123456789abcdef日本語" * 600_000)[:10 * 1024 * 1024]
    db.append_message("s", "user", nul)
    db.append_message("s", "tool", big, tool_call_id="c")
    stored = rows(rival, "s")
    assert stored[0]["content"] == nul
    assert stored[1]["content"] == big
    assert [m["content"] for m in db.get_messages("s")] == [nul, big]


def test_lone_surrogates_become_replacement_characters_everything_else_kept(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "assistant", "a\ud800b 😀", reasoning="r\udfffs", tool_calls=[call("c\ud83d1")],
                      api_content="x\udc00y")
    stored = rows(rival, "s")[0]
    assert (stored["content"], stored["reasoning"], stored["api_content"]) == ("a\ufffdb 😀", "r\ufffds", "x\ufffdy")
    assert json.loads(stored["tool_calls"])[0]["id"] == "c\ufffd1"


@pytest.mark.parametrize("kwargs, message", [
    ({"tool_calls": [{"id": "c", "f": object()}]}, "tool_calls"),
    ({"display_metadata": {"x": {1, 2}}}, "display_metadata"),
    ({"content": ["multimodal", "parts"]}, "content"),
    ({"timestamp": "yesterday"}, "timestamp"),
    ({"token_count": -3}, "token_count"),
    ({"role": ""}, "role"),
])
def test_bad_message_input_raises_before_anything_is_written(db, rival, kwargs, message):
    db.create_session("s", "cli")
    args = {"role": "assistant", "content": "x", **kwargs}
    with pytest.raises(ValueError, match=message):
        db.append_message("s", args.pop("role"), args.pop("content"), **args)
    assert rows(rival, "s") == []
    assert row(rival, "s")["message_count"] == 0


# --- tool-call uids ----------------------------------------------------------------------------

def test_tool_results_pair_with_their_calls(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "assistant", None, tool_calls=[call("c1"), call("c2"), call("c1")])
    db.append_message("s", "tool", "r1", tool_call_id="c1")
    db.append_message("s", "tool", "r2", tool_call_id="c2")
    db.append_message("s", "tool", "r1 again", tool_call_id="c1")
    db.append_message("s", "tool", "orphan", tool_call_id="zz")
    stored = rows(rival, "s")
    uids = json.loads(stored[0]["tool_call_uids"])
    assert set(uids) == {"c1", "c2"} and uids["c1"] != uids["c2"]  # a repeated id shares one uid
    assert all(HEX32.fullmatch(u) for u in uids.values())
    assert json.loads(stored[0]["tool_calls"]) == [call("c1"), call("c2"), call("c1")]  # untouched
    assert [m["tool_call_uid"] for m in stored[1:]] == [uids["c1"], uids["c2"], uids["c1"], None]


def test_merged_turns_map_a_shared_id_to_uids_in_call_order(db, rival):
    db.create_session("s", "cli")
    a = db.append_message("s", "assistant", "first", tool_calls=[call("x"), call("y")])
    b = db.append_message("s", "assistant", "second", tool_calls=[call("x")])
    ua, ub = (json.loads(m["tool_call_uids"]) for m in rows(rival, "s"))
    assert db.merge_messages("s", [a, b]) == a
    merged = json.loads(rows(rival, "s")[0]["tool_call_uids"])
    assert merged == {"x": [ua["x"], ub["x"]], "y": ua["y"]}
    db.append_message("s", "tool", "x1", tool_call_id="x")
    db.append_message("s", "tool", "y1", tool_call_id="y")
    db.append_message("s", "tool", "x2", tool_call_id="x")
    assert [m["tool_call_uid"] for m in rows(rival, "s")[1:]] == [ua["x"], ua["y"], ub["x"]]


def test_null_tool_call_uid_is_derived_on_read(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "assistant", None, tool_calls=[call("c1")])
    db.append_message("s", "tool", "r", tool_call_id="c1")
    uids = json.loads(rows(rival, "s")[0]["tool_call_uids"])
    rival.execute("UPDATE messages SET tool_call_uid = NULL WHERE role = 'tool'")
    conv = db.get_messages_as_conversation("s")
    assert conv[0]["_tool_call_uids"] == uids
    assert conv[1]["_tool_call_uid"] == uids["c1"]


# --- merging -------------------------------------------------------------------------------------

def test_merge_user_rows_keeps_first_uid_and_records_absorbed(db, rival):
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", text, token_count=n) for text, n in (("a", 1), ("b", 2), ("c", 3))]
    uids = [m["message_uid"] for m in rows(rival, "s")]
    assert db.merge_messages("s", ids[:2]) == ids[0]
    assert db.merge_messages("s", [ids[0], ids[2]]) == ids[0]
    stored = rows(rival, "s")
    assert len(stored) == 1
    assert (stored[0]["id"], stored[0]["message_uid"], stored[0]["content"]) == (ids[0], uids[0], "a\n\nb\n\nc")
    assert json.loads(stored[0]["absorbed_message_uids"]) == uids[1:]
    assert stored[0]["token_count"] == 6
    assert row(rival, "s")["message_count"] == 1


def test_merge_assistant_rows_joins_reasoning_and_replay_bytes(db, rival):
    db.create_session("s", "cli")
    a = db.append_message("s", "assistant", "", reasoning_content="think", api_content="think",
                          reasoning_details=[{"n": 1}], finish_reason="length")
    b = db.append_message("s", "assistant", "answer", reasoning_content="more", reasoning_details=[{"n": 2}],
                          finish_reason="stop", tool_calls=[call("c")])
    db.merge_messages("s", [b, a])  # order of the ids given does not matter
    got = db.get_messages("s")[0]
    assert (got["content"], got["api_content"]) == ("answer", "think\n\nanswer")
    assert got["reasoning_content"] == "think\n\nmore"
    assert got["reasoning_details"] == [{"n": 1}, {"n": 2}] and got["finish_reason"] == "stop"
    assert row(rival, "s")["tool_call_count"] == 1


def test_merge_keeps_tool_call_count_equal_to_stored_calls_even_for_odd_tool_calls(db, rival):
    db.create_session("s", "cli")
    a = db.append_message("s", "assistant", "a", tool_calls='{"id": "lonely"}')  # not a list: counts 0
    b = db.append_message("s", "assistant", "b", tool_calls=[call("c")])
    assert row(rival, "s")["tool_call_count"] == 1
    db.merge_messages("s", [a, b])
    merged = json.loads(rows(rival, "s")[0]["tool_calls"])
    assert merged == [{"id": "lonely"}, call("c")]
    assert row(rival, "s")["tool_call_count"] == len(merged)


def test_merge_refuses_bad_row_sets_and_writes_nothing(db, rival, conn):
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    u1 = db.append_message("s", "user", "u1")
    a1 = db.append_message("s", "assistant", "a1")
    t1 = db.append_message("s", "tool", "t1", tool_call_id="c")
    t2 = db.append_message("s", "tool", "t2", tool_call_id="c")
    u2 = db.append_message("s", "user", "u2")
    other = db.append_message("t", "user", "elsewhere")
    inactive = in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "old"}, active=0)
    before = [dict(m) for m in rows(rival, "s")]
    for bad in ([u1], [u1, u1], [u1, a1], [t1, t2], [u1, other], [u1, inactive], [u1, 999_999], "12", 12, [u1, True]):
        with pytest.raises(ValueError):
            db.merge_messages("s", bad)
    assert [dict(m) for m in rows(rival, "s")] == before
    assert db.merge_messages("s", [u1, u2]) == u1


# --- reading, replacing, clearing ------------------------------------------------------------------

def test_get_messages_active_only_unless_asked(db, conn):
    db.create_session("s", "cli")
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "archived"}, active=0, compacted=1)
    db.append_message("s", "user", "live")
    assert [m["content"] for m in db.get_messages("s")] == ["live"]
    assert [m["content"] for m in db.get_messages("s", include_inactive=True)] == ["archived", "live"]
    assert db.get_messages("ghost") == []


def test_replace_messages_keeps_uids_and_recounts(db, rival, conn):
    db.create_session("s", "cli")
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "archive"}, active=0, compacted=1)
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", None, tool_calls=[call("c1"), call("c2")])
    db.append_message("s", "tool", "r", tool_call_id="c1")
    old = db.get_messages("s")
    new = [dict(old[0], content="q (edited)"), old[1]]
    assert db.replace_messages("s", new) == 2
    live = rows(rival, "s", active_only=True)
    assert [m["message_uid"] for m in live] == [old[0]["message_uid"], old[1]["message_uid"]]
    assert json.loads(live[1]["tool_call_uids"]) == old[1]["tool_call_uids"]
    assert live[0]["content"] == "q (edited)"
    assert (row(rival, "s")["message_count"], row(rival, "s")["tool_call_count"]) == (2, 2)
    assert [m["content"] for m in rows(rival, "s") if not m["active"]] == ["archive"]


def test_replace_messages_from_a_conversation_round_trips(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", "", tool_calls=[call("c1")], reasoning_content="")
    db.append_message("s", "tool", "r", tool_call_id="c1", tool_name="terminal")
    conv = db.get_messages_as_conversation("s")
    db.replace_messages("s", conv)
    assert db.get_messages_as_conversation("s") == conv


def test_replace_messages_from_a_conversation_keeps_display_text_and_sent_bytes(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "display text", api_content="sent text with memory")
    db.append_message("s", "assistant", "", reasoning_content="the answer", api_content="the answer")
    db.append_message("s", "assistant", None, api_content="only sent")
    before = [(m["content"], m["api_content"]) for m in rows(rival, "s")]
    conv = db.get_messages_as_conversation("s")
    assert [m["content"] for m in conv] == ["sent text with memory", "the answer", "only sent"]
    db.replace_messages("s", conv)
    assert [(m["content"], m["api_content"]) for m in rows(rival, "s")] == before
    assert db.get_messages_as_conversation("s") == conv
    wire = db.to_provider_messages(conv)
    assert all(not any(k.startswith("_") for k in m) for m in wire)
    assert [m["content"] for m in wire] == ["sent text with memory", "the answer", "only sent"]
    with pytest.raises(ValueError):  # both forms at once are ambiguous
        db.replace_messages("s", [dict(conv[0], api_content="other")])
    assert [(m["content"], m["api_content"]) for m in rows(rival, "s")] == before


def test_replace_messages_bad_message_writes_nothing(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "keep me")
    before = [dict(m) for m in rows(rival, "s")]
    for bad in ([{"role": "user", "content": "ok"}, {"role": "user", "bogus": 1}],
                [{"role": "user", "content": "ok"}, "not a dict"],
                [{"role": "user", "content": "ok", "message_uid": "not-a-uid"}]):
        with pytest.raises(ValueError):
            db.replace_messages("s", bad)
    assert [dict(m) for m in rows(rival, "s")] == before
    assert row(rival, "s")["message_count"] == 1


def test_clear_messages_keeps_the_session(db, rival, conn):
    db.create_session("s", "cli", title="Kept")
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "archive"}, active=0)
    db.append_message("s", "assistant", "a", tool_calls=[call("c")])
    assert db.clear_messages("s") == 2
    assert rows(rival, "s") == []
    r = row(rival, "s")
    assert (r["title"], r["message_count"], r["tool_call_count"]) == ("Kept", 0, 0)


# --- module functions the compression module reuses -------------------------------------------------

def test_insert_message_keeps_a_given_uid_and_counts_only_active_rows(db, rival, conn):
    db.create_session("s", "cli")
    uid = "ab" * 16
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "x", "message_uid": uid,
                                                 "id": 77, "_row_id": 77, "active": 0, "session_id": "zz"})
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "y", "message_uid": uid},
           active=0, compacted=1)
    stored = rows(rival, "s")
    assert [(m["message_uid"], m["active"], m["compacted"]) for m in stored] == [(uid, 1, 0), (uid, 0, 1)]
    assert stored[0]["id"] != 77
    assert row(rival, "s")["message_count"] == 1
    with pytest.raises(ValueError):
        in_txn(conn, messages.insert_message, "s", {"role": "user", "message_uid": "XYZ"})
    with pytest.raises(SessionNotFoundError):
        in_txn(conn, messages.insert_message, "ghost", {"role": "user"}, active=0)


def test_insert_message_accepts_conversation_keys(db, rival, conn):
    db.create_session("s", "cli")
    uid = "cd" * 16
    in_txn(conn, messages.insert_message, "s", {"role": "tool", "content": "r", "tool_call_id": "c", "name": "grep",
                                                 "_tool_call_uid": uid, "_absorbed_message_uids": [uid]})
    m = rows(rival, "s")[0]
    assert (m["tool_name"], m["tool_call_uid"], json.loads(m["absorbed_message_uids"])) == ("grep", uid, [uid])


def compression_closed(rival, parent: str, *, child: str) -> None:
    """Close `parent` by compression as a rotation does: ended exactly when `child` started.

    Written as another program (or an older writer) would: end_session refuses this reason.
    """
    rival.execute("UPDATE sessions SET end_reason = 'compression', "
                  "ended_at = (SELECT started_at FROM sessions WHERE id = ?) WHERE id = ?", (child, parent))


def test_compression_ancestor_ids_follow_compression_parents_only(db, rival, conn):
    db.create_session("root", "cli")
    db.create_session("a", "cli", parent_session_id="root")
    db.create_session("b", "cli", parent_session_id="a")
    db.create_session("c", "cli", parent_session_id="b")
    db.end_session("root", "branch")
    compression_closed(rival, "a", child="b")
    compression_closed(rival, "b", child="c")
    assert lineage.compression_ancestor_ids(conn, "c") == ["a", "b"]
    assert lineage.compression_ancestor_ids(conn, "a") == []
    assert lineage.compression_ancestor_ids(conn, "ghost") == []
    # A cycle left by bad data ends the walk instead of looping.
    rival.execute("UPDATE sessions SET parent_session_id = 'c' WHERE id = 'a'")
    rival.execute("UPDATE sessions SET end_reason = 'compression' WHERE id = 'c'")
    assert lineage.compression_ancestor_ids(conn, "c") == ["a", "b"]


# --- the conversation projection ------------------------------------------------------------------------

def rows_timestamp(db: SessionDB, session_id: str) -> list[float]:
    return [m["timestamp"] for m in db.get_messages(session_id)]


def test_conversation_shape(db):
    db.create_session("s", "cli")
    u = db.append_message("s", "user", "q", reasoning="never shown for users")
    db.append_message("s", "assistant", "", tool_calls=[call("c1")], reasoning_content="", reasoning="r",
                      reasoning_details=[{"d": 1}], codex_reasoning_items=[{"i": 1}], codex_message_items=[{"m": 1}])
    db.append_message("s", "tool", "out", tool_call_id="c1", tool_name="terminal", reasoning="nor for tools")
    conv = db.get_messages_as_conversation("s")
    assert [m["role"] for m in conv] == ["user", "assistant", "tool"]
    assert conv[0] == {"role": "user", "content": "q", "message_uid": conv[0]["message_uid"],
                       "timestamp": rows_timestamp(db, "s")[0]}
    assistant = conv[1]
    assert assistant["reasoning_content"] == "" and assistant["reasoning"] == "r"
    assert assistant["reasoning_details"] == [{"d": 1}] and assistant["codex_reasoning_items"] == [{"i": 1}]
    assert assistant["codex_message_items"] == [{"m": 1}] and assistant["tool_calls"] == [call("c1")]
    assert {k for k in conv[2] if not k.startswith("_")} == {"role", "content", "tool_call_id", "name", "message_uid",
                                                               "timestamp"}
    assert all("_row_id" not in m for m in conv)
    with_ids = db.get_messages_as_conversation("s", with_row_ids=True)
    assert with_ids[0]["_row_id"] == u and all(HEX32.fullmatch(m["message_uid"]) for m in with_ids)


def test_conversation_replays_api_content_and_reasoning_only_replies(db, conn):
    db.create_session("s", "cli")
    db.append_message("s", "user", "display text", api_content="sent text with memory")
    db.append_message("s", "assistant", "", reasoning_content="the answer", api_content="the answer",
                      finish_reason="stop")
    db.append_message("s", "assistant", "", codex_message_items=[{"type": "output_text", "text": "final"}])
    in_txn(conn, messages.insert_message, "s", {"role": "user", "content": "old generation"}, active=0)
    conv = db.get_messages_as_conversation("s")
    assert [m["content"] for m in conv] == ["sent text with memory", "the answer", ""]
    assert conv[1]["reasoning_content"] == "the answer"
    assert [m["content"] for m in db.get_messages("s")[:2]] == ["display text", ""]


def test_include_ancestors_replays_compression_lineage_once(db, rival):
    db.create_session("p", "cli")
    db.append_message("p", "user", "old question")
    db.append_message("p", "assistant", "old answer")
    db.append_message("p", "user", "latest prompt")
    kept = db.get_messages("p")[1:]
    db.create_session("c", "cli", parent_session_id="p")
    compression_closed(rival, "p", child="c")
    db.replace_messages("c", kept)  # the rotation copies: same uids
    db.append_message("c", "assistant", "new answer")
    conv = db.get_messages_as_conversation("c", include_ancestors=True)
    assert [m["content"] for m in conv] == ["old question", "old answer", "latest prompt", "new answer"]
    assert [m["content"] for m in db.get_messages_as_conversation("c")] == ["old answer", "latest prompt",
                                                                           "new answer"]


def test_include_ancestors_drops_a_repeated_prompt_at_the_seam_only(db, rival):
    db.create_session("p", "cli")
    db.append_message("p", "user", "go on")
    db.create_session("c", "cli", parent_session_id="p")
    compression_closed(rival, "p", child="c")
    db.append_message("c", "user", "go on")  # re-sent prompt, a new uid
    db.append_message("c", "user", "go on")  # a deliberate repeat inside the child stays
    conv = db.get_messages_as_conversation("c", include_ancestors=True)
    assert [m["content"] for m in conv] == ["go on", "go on"]


def test_include_ancestors_walks_the_whole_parent_chain(db):
    # Any parent, not only a compression one: a resumed or branched conversation shows what led to it.
    db.create_session("p", "cli")
    db.append_message("p", "user", "parent talk")
    db.create_session("c", "cli", parent_session_id="p")
    db.end_session("p", "branch")
    db.append_message("c", "user", "child talk")
    db.create_session("g", "cli", parent_session_id="c")
    db.append_message("g", "user", "grandchild talk")
    assert [m["content"] for m in db.get_messages_as_conversation("g", include_ancestors=True)] == \
        ["parent talk", "child talk", "grandchild talk"]
    assert [m["content"] for m in db.get_ancestor_display_prefix("g")] == ["parent talk", "child talk"]


def test_include_ancestors_collapses_repeated_prompts_of_the_ancestors(db):
    db.create_session("p", "cli")
    db.append_message("p", "user", "same prompt")
    db.append_message("p", "user", "same prompt")  # sent twice by a resume in the ancestor
    db.append_message("p", "assistant", "answer")
    db.create_session("c", "cli", parent_session_id="p")
    db.append_message("c", "user", "next")
    assert [m["content"] for m in db.get_messages_as_conversation("c", include_ancestors=True)] == \
        ["same prompt", "answer", "next"]
    assert [m["content"] for m in db.get_messages_as_conversation("p")] == ["same prompt", "same prompt", "answer"]


def test_replay_carries_the_stored_facts_and_leaves_out_what_is_not_the_conversation(db):
    db.create_session("s", "telegram")
    db.append_message("s", "user", "[Alice] aside", observed=True, platform_message_id="m-1", timestamp=1000.0)
    db.append_message("s", "assistant", "<memory-context>\nrecalled\n</memory-context>\n\nVisible", reasoning="",
                      finish_reason="stop")
    db.append_message("s", "user", "  Review the conversation above and update the skill library.")
    db.append_message("s", "assistant", "curator reply")
    db.append_message("s", "assistant", "<memory-context>kept</memory-context> as sent",
                      api_content="<memory-context>kept</memory-context> as sent")
    conv = db.get_messages_as_conversation("s")
    assert [m["content"] for m in conv] == ["[Alice] aside", "Visible",
                                            "<memory-context>kept</memory-context> as sent"]
    assert (conv[0]["observed"], conv[0]["message_id"], conv[0]["timestamp"]) == (True, "m-1", 1000.0)
    assert conv[1]["finish_reason"] == "stop" and "reasoning" not in conv[1] and "observed" not in conv[1]
    # The stored facts never reach a request.
    wire = SessionDB.to_provider_messages(conv)
    assert all(not {"timestamp", "observed", "message_id", "finish_reason"} & m.keys() for m in wire)
    # A conversation dict written back keeps its platform id.
    db.replace_messages("s", conv)
    assert db.get_messages("s")[0]["platform_message_id"] == "m-1"


def test_repair_alternation_and_the_resume_pair(db):
    db.create_session("p", "cli")
    db.append_message("p", "user", "old")
    db.create_session("s", "cli", parent_session_id="p")
    db.append_message("s", "tool", "orphan result", tool_call_id="nobody")
    db.append_message("s", "user", "q")
    db.append_message("s", "assistant", "draft")
    db.append_message("s", "assistant", "final")
    db.append_message("s", "assistant", "", tool_calls=[call("c1"), call("c2")])
    db.append_message("s", "tool", "half", tool_call_id="c1")  # c2 never answered
    repaired = db.get_messages_as_conversation("s", repair_alternation=True)
    assert [(m["role"], m["content"]) for m in repaired] == [("user", "q"), ("assistant", "final")]
    model, display = db.get_resume_conversations("s")
    assert model == repaired
    assert display == db.get_messages_as_conversation("s", include_ancestors=True) and display[0]["content"] == "old"
    assert db.get_resume_conversations("ghost") == ([], [])


# --- property ---------------------------------------------------------------------------------------------

_OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 3)),
    st.tuples(st.just("merge"), st.sampled_from(["user", "assistant"]), st.integers(0, 50), st.integers(2, 4)),
), max_size=25)


def test_counters_match_active_rows_and_uids_stay_hex(tmp_path_factory):
    """Any sequence of appends and merges keeps message_count = active rows, every uid 32 hex."""
    db = SessionDB(tmp_path_factory.mktemp("property") / "state.db")
    check = sqlite3.connect(db.db_path)
    counter = iter(range(10**9))

    @settings(max_examples=60, deadline=None)
    @given(ops=_OPS)
    def run(ops):
        sid = f"s{next(counter)}"  # a fresh session per example: no state leaks between examples
        db.create_session(sid, "cli")
        for op in ops:
            if op[0] == "append":
                _, role, n_calls = op
                calls = [call(f"c{i % 2}") for i in range(n_calls)] if role == "assistant" else None
                db.append_message(sid, role, "text", tool_calls=calls, tool_call_id="c0" if role == "tool" else None)
            else:
                _, role, start, width = op
                live = [r[0] for r in check.execute(
                    "SELECT id FROM messages WHERE session_id = ? AND active = 1 AND role = ? ORDER BY id",
                    (sid, role))]
                window = live[start % max(len(live), 1):][:width]
                if len(window) >= 2:
                    db.merge_messages(sid, window)
        count, tool_calls = check.execute("SELECT message_count, tool_call_count FROM sessions WHERE id = ?",
                                          (sid,)).fetchone()
        active = check.execute("SELECT COUNT(*) FROM messages WHERE session_id = ? AND active = 1",
                               (sid,)).fetchone()[0]
        assert count == active
        stored_calls = sum(len(json.loads(t)) for (t,) in check.execute(
            "SELECT tool_calls FROM messages WHERE session_id = ? AND role = 'assistant' AND active = 1 "
            "AND tool_calls IS NOT NULL", (sid,)))
        assert tool_calls == stored_calls
        for uid, absorbed, call_uids in check.execute(
                "SELECT message_uid, absorbed_message_uids, tool_call_uids FROM messages WHERE session_id = ?", (sid,)):
            assert HEX32.fullmatch(uid)
            for u in json.loads(absorbed or "[]"):
                assert HEX32.fullmatch(u)
            for v in json.loads(call_uids or "{}").values():
                assert all(HEX32.fullmatch(u) for u in (v if isinstance(v, list) else [v]))

    try:
        run()
    finally:
        check.close()
        db.close()


# --- the calls agent code written for hermes-agent makes ------------------------------------------

def test_create_session_again_fills_only_empty_columns(db, rival):
    # A gateway writes a bare row first; the agent's create later adds what it knows.
    db.create_session("s", "telegram", user_id="u1", chat_id="c1")
    assert db.create_session("s", "cli", model="m", model_config={"k": 1}, system_prompt="SYS",
                             user_id="intruder", chat_id="c2") == "s"
    r = row(rival, "s")
    assert (r["source"], r["user_id"], r["chat_id"]) == ("telegram", "u1", "c1")
    assert (r["model"], json.loads(r["model_config"]), r["system_prompt"]) == ("m", {"k": 1}, "SYS")
    db.create_session("s", "cli", model="later")
    assert row(rival, "s")["model"] == "m"  # the first write wins


def test_create_session_again_never_fills_user_id_or_a_parent_cycle(db, rival):
    db.create_session("a", "cli")
    db.create_session("b", "cli", parent_session_id="a")
    db.create_session("a", "cli", user_id="late")
    assert row(rival, "a")["user_id"] is None  # fixed when the row was made
    with pytest.raises(ValueError, match="cycle"):
        db.create_session("a", "cli", parent_session_id="b")
    assert row(rival, "a")["parent_session_id"] is None
    with pytest.raises(ValueError, match="unknown session column"):
        db.create_session("a", "cli", colour="red")


def test_end_session_accepts_compression_and_the_first_end_wins(db, rival):
    db.create_session("s", "cli")
    db.end_session("s", "compression")
    first = row(rival, "s")["ended_at"]
    db.end_session("s", "resumed_other")
    assert (row(rival, "s")["end_reason"], row(rival, "s")["ended_at"]) == ("compression", first)
    db.reopen_session("s")
    db.end_session("s", "user_exit")
    assert row(rival, "s")["end_reason"] == "user_exit"


def test_system_prompt_model_and_workspace_updates(db, rival):
    db.create_session("s", "cli", model="first")
    db.update_system_prompt("s", "You are helpful.")
    db.update_session_model("s", "second")
    assert db.update_session_cwd("s", "/work/repo/src", git_branch="main", git_repo_root="/work/repo") == 1
    assert db.update_session_cwd("s", "/work/repo/src", git_branch="", git_repo_root="") == 2  # a failed probe erases nothing
    r = row(rival, "s")
    # The prompt names the model, so a switch clears it for the next turn to rebuild.
    assert (r["system_prompt"], r["model"], r["cwd"], r["git_branch"], r["git_repo_root"]) == \
        (None, "second", "/work/repo/src", "main", "/work/repo")
    db.update_session_cwd("s", "/work/other")  # another directory: the old one's git facts do not apply
    r = row(rival, "s")
    assert (r["cwd"], r["git_branch"], r["git_repo_root"], r["git_metadata_generation"]) == ("/work/other", None, None, 3)
    for call_ in (lambda: db.update_system_prompt("ghost", "x"), lambda: db.update_session_model("ghost", "m"),
                  lambda: db.update_session_cwd("ghost", "/x")):
        with pytest.raises(SessionNotFoundError):
            call_()
    with pytest.raises(ValueError):
        db.update_session_model("s", " ")


def test_cwds_are_counted_and_repo_roots_filled_only_where_empty(db, rival):
    db.create_session("a", "cli", cwd="/repo/a")
    db.create_session("b", "cli", cwd="/repo/a", git_repo_root="/kept")
    db.create_session("c", "cli", cwd="/other")
    db.create_session("d", "cli")
    assert db.distinct_session_cwds() == [{"cwd": "/repo/a", "sessions": 2}, {"cwd": "/other", "sessions": 1}]
    assert db.backfill_repo_roots({"/repo/a": "/repo", "/missing": "/nowhere"}) == 1
    assert [row(rival, s)["git_repo_root"] for s in "abcd"] == ["/repo", "/kept", None, None]


def test_billing_route_switch_sets_route_and_clears_the_prompt(db, rival):
    db.create_session("s", "telegram", system_prompt="Model: x\nProvider: openrouter")
    db.update_session_billing_route("s", provider="ollama", base_url="http://localhost:11434/v1", billing_mode="local")
    db.update_session_billing_route("s", provider="openai", base_url="https://api.openai.com/v1")
    r = row(rival, "s")
    assert (r["billing_provider"], r["billing_base_url"], r["billing_mode"], r["system_prompt"]) == \
        ("openai", "https://api.openai.com/v1", "local", None)


def test_the_first_accounted_call_decides_the_route(db, rival):
    db.create_session("s", "cli", model="requested")
    # Metadata about another route that accounted nothing changes nothing.
    db.update_token_counts("s", model="fallback", billing_provider="fb")
    assert (row(rival, "s")["model"], row(rival, "s")["billing_provider"]) == ("requested", None)
    # The first call that really ran was the fallback: the route is the fallback's, whole.
    db.update_token_counts("s", 10, 5, model="fallback", billing_provider="fb", api_call_count=1)
    db.update_token_counts("s", 10, 5, model="requested", billing_provider="primary", api_call_count=1)
    r = row(rival, "s")
    assert (r["model"], r["billing_provider"], r["billing_base_url"], r["api_call_count"]) == \
        ("fallback", "fb", None, 2)
    usage = {u["model"]: u["input_tokens"] for u in rival.execute(
        "SELECT model, input_tokens FROM session_model_usage WHERE session_id = 's'")}
    assert usage == {"fallback": 10, "requested": 10}


def test_an_unaccounted_call_on_the_sessions_own_model_fills_an_empty_route(db, rival):
    db.create_session("s", "cli")
    db.update_token_counts("s", 1, 1, billing_provider="openrouter", billing_mode="api_key")
    db.update_token_counts("s", 1, 1, billing_provider="ollama", cost_status="estimated")
    r = row(rival, "s")
    assert (r["billing_provider"], r["billing_mode"], r["cost_status"]) == ("openrouter", "api_key", "estimated")


def test_archive_flag_and_counts(db, rival):
    for sid, source, cwd in (("a", "cli", "/repo"), ("b", "cli", "/repo/sub"), ("c", "telegram", "/repo-2")):
        db.create_session(sid, source, cwd=cwd)
    db.create_session("child", "cli", parent_session_id="a")
    assert db.set_session_archived("b", True) is True and db.set_session_archived("ghost", True) is False
    assert row(rival, "b")["archived"] == 1
    assert db.session_count() == 3
    assert db.session_count(include_archived=True) == 4 and db.session_count(archived_only=True) == 1
    assert db.session_count(source="cli", cwd_prefix="/repo", include_archived=True) == 2
    assert db.session_count(exclude_children=True, exclude_sources=["telegram"]) == 1
    db.append_message("a", "user", "one")
    db.append_message("a", "assistant", "two")
    db.append_message("c", "user", "three")
    assert (db.message_count(), db.message_count("a"), db.message_count("ghost")) == (3, 2, 0)
    assert db.session_count(min_message_count=2) == 1
    assert db.set_session_archived("b", False) is True and row(rival, "b")["archived"] == 0



def test_the_default_count_leaves_out_every_session_another_program_marked_archived(db, rival):
    # The default count subtracts the archived from all; another program may store any value.
    marks = {"zero": 0, "one": 1, "two": 2, "text": "yes", "empty": "", "real": 0.5}
    for sid in marks:
        db.create_session(sid, "cli")
    db.create_session("child", "cli", parent_session_id="zero")
    for sid, value in marks.items():
        rival.execute("UPDATE sessions SET archived = ? WHERE id = ?", (value, sid))
    live = {r[0] for r in rival.execute("SELECT id FROM sessions WHERE COALESCE(archived, 0) = 0")}
    assert live == {"zero", "child"}
    assert db.session_count() == len(live)
    assert db.session_count(exclude_children=True) == len(live) - 1

def test_count_listing_and_prune_agree_on_a_working_directory(db):
    # One definition of "inside this directory" serves the count, the listing and the prune
    # filter: the directory itself and what is below it, in the file system's own case.
    cwds = {"same": "/repo", "slash": "/repo/", "below": "/repo/x/y", "sibling": "/repo-2", "digit": "/repo0",
            "upper": "/Repo/x", "elsewhere": "/srv"}
    for sid, cwd in cwds.items():
        db.create_session(sid, "cli", cwd=cwd)
        db.end_session(sid, "user_exit")
    inside = {"same", "slash", "below"}
    for prefix in ("/repo", "/repo/", "/repo//"):
        assert db.session_count(cwd_prefix=prefix) == len(inside)
        assert {r["id"] for r in db.list_sessions_rich(cwd_prefix=prefix, limit=50)} == inside
        assert {r["id"] for r in db.list_prune_candidates(older_than_days=None, cwd_prefix=prefix)} \
            == inside
    assert db.session_count(cwd_prefix="/") == len(cwds)
    with pytest.raises(ValueError):
        db.list_sessions_rich(source=7)


def test_get_messages_pages_live_rows_in_insertion_order(db, rival):
    db.create_session("s", "cli")
    for i in range(7):
        db.append_message("s", "user", f"m{i}")
    rival.execute("UPDATE messages SET active = 0 WHERE content = 'm0'")
    assert [m["content"] for m in db.get_messages("s", limit=3)] == ["m1", "m2", "m3"]
    assert [m["content"] for m in db.get_messages("s", limit=3, offset=3)] == ["m4", "m5", "m6"]
    assert [m["content"] for m in db.get_messages("s", offset=5)] == ["m6"]
    assert db.get_messages("s", limit=2, offset=50) == []
    with pytest.raises(ValueError):
        db.get_messages("s", limit=-1)


def test_dict_content_round_trips(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", {"parts": [{"text": "hi"}]})
    assert db.get_messages("s")[0]["content"] == {"parts": [{"text": "hi"}]}
    assert db.get_messages_as_conversation("s")[0]["content"] == {"parts": [{"text": "hi"}]}


def test_set_latest_user_api_content_only_touches_the_matching_latest_turn(db, rival):
    db.create_session("s", "cli")
    db.append_message("s", "user", "first")
    db.append_message("s", "user", "turn text")
    assert db.set_latest_user_api_content("s", "first", "sent") == 0  # not the latest turn
    assert db.set_latest_user_api_content("s", "turn text", "memory + turn \ud835") == 1
    assert [r["api_content"] for r in rows(rival, "s")] == [None, "memory + turn \ufffd"]
    with pytest.raises(SessionNotFoundError):
        db.set_latest_user_api_content("ghost", "x", "y")
