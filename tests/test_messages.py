"""hermes_state_messages on a bare connection: rows, uids, tool-call pairing, counters, merge and rewrite."""
from __future__ import annotations

import json
import re
import sqlite3

import pytest

import hermes_state_messages as messages
from hermes_state import SessionDB
from hermes_state_errors import SessionNotFoundError


@pytest.fixture
def s(db, conn):
    db.create_session("s", "cli")
    return conn


def _counters(conn, sid="s"):
    return tuple(conn.execute("SELECT message_count, tool_call_count FROM sessions WHERE id = ?", (sid,)).fetchone())


def test_insert_issues_a_uid_and_only_live_rows_move_the_counters(s):
    first = messages.insert_message(s, "s", {"role": "user", "content": "hi"})
    messages.insert_message(s, "s", {"role": "user", "content": "archived"}, active=0)
    uid = s.execute("SELECT message_uid FROM messages WHERE id = ?", (first,)).fetchone()[0]
    assert len(uid) == 32 and int(uid, 16) >= 0
    assert _counters(s) == (1, 0)
    with pytest.raises(SessionNotFoundError):
        messages.insert_message(s, "ghost", {"role": "user", "content": "x"})


def test_a_tool_result_is_paired_with_the_call_that_asked_for_it(s):
    messages.append_message(s, "s", "assistant", tool_calls=[{"id": "c1", "type": "function"},
                                                            {"id": "c2", "type": "function"}])
    messages.append_message(s, "s", "tool", "result two", tool_call_id="c2")
    rows = messages.get_messages(s, "s")
    issued = rows[0]["tool_call_uids"]
    assert set(issued) == {"c1", "c2"} and rows[1]["tool_call_uid"] == issued["c2"]
    assert _counters(s) == (2, 2)


def test_bad_fields_are_refused_before_anything_is_written(s):
    for fields, match in (({"role": "user", "colour": "red"}, "unknown message field"),
                          ({"role": "tool", "name": "a", "tool_name": "b"}, "another spelling"),
                          ({"role": ""}, "role"),
                          ({"role": "user", "content": [1, 2]}, "content-part")):
        with pytest.raises(ValueError, match=match):
            messages.insert_message(s, "s", fields)
    assert s.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0 and _counters(s) == (0, 0)


def test_list_content_is_stored_as_its_text_and_its_parts(s):
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    messages.insert_message(s, "s", {"role": "user", "content": parts})
    stored = s.execute("SELECT content FROM messages").fetchone()[0]
    assert stored == "look"
    assert messages.get_messages(s, "s")[0]["content"] == parts


def test_merge_folds_same_role_rows_into_the_first_and_fixes_the_counters(s):
    a = messages.append_message(s, "s", "assistant", "one", tool_calls=[{"id": "c1"}])
    b = messages.append_message(s, "s", "assistant", "two", tool_calls=[{"id": "c2"}])
    uid_b = s.execute("SELECT message_uid FROM messages WHERE id = ?", (b,)).fetchone()[0]
    assert messages.merge_messages(s, "s", [a, b]) == a
    rows = messages.get_messages(s, "s")
    assert [r["id"] for r in rows] == [a]
    assert uid_b in rows[0]["absorbed_message_uids"]
    assert _counters(s) == (1, 2)  # the row counts once; both calls moved to it


def test_merge_refuses_what_cannot_be_folded_and_changes_nothing(s):
    u = messages.append_message(s, "s", "user", "question")
    a = messages.append_message(s, "s", "assistant", "answer")
    for ids, match in (([u], "at least two"), ([u, u], "distinct"), ([u, True], "integer"),
                       ([u, a], "only user/user"), ([u, 999], "not active messages")):
        with pytest.raises(ValueError, match=match):
            messages.merge_messages(s, "s", ids)
    assert len(messages.get_messages(s, "s")) == 2 and _counters(s) == (2, 0)


def test_replace_validates_every_message_before_deleting_the_old_ones(s):
    messages.append_message(s, "s", "user", "old")
    with pytest.raises(ValueError, match="message 1"):
        messages.replace_messages(s, "s", [{"role": "user", "content": "new"}, {"role": ""}])
    assert [r["content"] for r in messages.get_messages(s, "s")] == ["old"]
    assert messages.replace_messages(s, "s", [{"role": "user", "content": "new"},
                                              {"role": "assistant", "content": "reply"}]) == 2
    assert [r["content"] for r in messages.get_messages(s, "s")] == ["new", "reply"] and _counters(s) == (2, 0)


def test_message_list_refuses_one_uid_twice_and_what_is_not_a_list_of_dicts():
    uid = "a" * 32
    with pytest.raises(ValueError, match="same message_uid"):
        messages.message_list([{"message_uid": uid}, {"message_uid": uid}])
    for bad in ("text", {"role": "user"}, None, [1]):
        with pytest.raises(ValueError):
            messages.message_list(bad)


def test_with_stored_fields_fills_what_a_conversation_dict_drops(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hi", timestamp=123.0, finish_reason="stop")
        uid = db.get_messages("s")[0]["message_uid"]
        with db.transaction() as txn:
            filled = messages.with_stored_fields(txn.conn, "s", [{"message_uid": uid, "content": "hi again"}])
    assert filled[0]["timestamp"] == 123.0 and filled[0]["finish_reason"] == "stop"
    assert filled[0]["content"] == "hi again"  # the dict's own keys win


def test_tool_call_uid_helpers():
    issued = messages.issue_tool_call_uids([{"id": "c1"}, {"id": "c1"}, {"id": "c2"}, "junk"])
    assert set(issued) == {"c1", "c2"} and issued["c1"] != issued["c2"]
    assert messages.issue_tool_call_uids([]) is None
    assert messages.pick_tool_call_uid(["u0", "u1"], 1) == "u1"
    assert messages.pick_tool_call_uid(["u0", "u1"], 5) == "u1"  # past the list: the last one
    assert messages.pick_tool_call_uid("shared", 3) == "shared" and messages.pick_tool_call_uid(None, 0) is None


def test_clear_and_count(s):
    messages.append_message(s, "s", "user", "a")
    messages.insert_message(s, "s", {"role": "user", "content": "old"}, active=0)
    assert messages.message_count(s, "s") == 1 and messages.message_count(s) == 1
    assert messages.message_count(s, "\ud800") == 0
    assert messages.clear_messages(s, "s") == 2 and _counters(s) == (0, 0)


def test_counts_and_pages_leave_out_rows_that_are_not_live(db):
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    ids = [db.append_message("s" if i % 3 else "t", "user", f"m{i}") for i in range(40)]
    with db.transaction() as txn:  # archived generations, as a compression leaves them
        txn.conn.execute("UPDATE messages SET active = 0 WHERE id IN (SELECT value FROM json_each(?))",
                         (json.dumps(ids[5:30:4]),))
    live = [i for i in ids if i not in ids[5:30:4]]
    mine = [i for k, i in enumerate(ids) if k % 3]
    assert db.message_count() == len(live)
    assert db.message_count(session_id="s") == len([i for i in mine if i in live])
    every = [m["id"] for m in db.get_messages("s")]
    assert every == [i for i in mine if i in live]
    for limit, offset in ((5, 0), (5, 3), (100, 7), (1, len(every) - 1), (4, len(every))):
        assert [m["id"] for m in db.get_messages("s", limit=limit, offset=offset)] == every[offset:offset + limit]
    assert [m["id"] for m in db.get_messages("s", include_inactive=True, limit=6, offset=2)] == mine[2:8]
    assert [m["id"] for m in db.get_messages("s", offset=len(every) - 2)] == every[-2:]


def test_every_page_is_the_slice_of_the_whole_list_from_either_end(s):
    # Pages past the middle are read backwards; each must still be exactly the slice, inactive rows too.
    for i in range(23):
        messages.insert_message(s, "s", {"role": "user", "content": f"m{i}"}, active=0 if i % 4 == 1 else 1)
    for include_inactive in (False, True):
        whole = messages.get_messages(s, "s", include_inactive=include_inactive)
        for limit in (None, 0, 1, 3, 7, 30):
            for offset in range(len(whole) + 3):
                page = messages.get_messages(s, "s", include_inactive=include_inactive, limit=limit, offset=offset)
                assert page == (whole[offset:] if limit is None else whole[offset:offset + limit])


def _plan(rival, sql: str) -> str:
    while True:
        try:
            return " | ".join(r[3] for r in rival.execute("EXPLAIN QUERY PLAN " + sql))
        except sqlite3.OperationalError as exc:  # a function of the library's connections: the plan needs only its name
            missing = re.fullmatch(r"no such function: (\w+)", str(exc))
            if missing is None:
                raise
            rival.create_function(missing[1], -1, lambda *args: None)


def test_the_store_count_walks_the_narrowest_index_and_only_the_activity_listing_reads_it_too(db, rival):
    db.create_session("s", "cli")
    db.create_session("t", "cron")
    for i in range(30):
        db.append_message("s" if i % 3 else "t", "user" if i % 2 else "assistant", f"message {i} about the orange submarine")
    with db.tracer() as statements:
        assert db.message_count() == 30 and db.message_count("s") == 20
        db.get_messages("s")
        db.get_messages("s", limit=5, offset=3)
        db.get_messages_as_conversation("s")
        db.search_messages("orange")
        db.search_messages("marin")
        db.list_sessions_rich(limit=10)
        assert [r["id"] for r in db.list_sessions_rich(limit=10, order_by_last_active=True)] == ["s", "t"]
        db.list_prune_candidates(older_than_days=0)
    reads = [sql for sql in dict.fromkeys(statements) if sql.lstrip().upper().startswith(("SELECT", "WITH"))]
    picked = [sql for sql in reads if "idx_messages_timestamp" in _plan(rival, sql)]
    counts = [sql for sql in picked if "SELECT COUNT(*) FROM messages)" in sql]
    assert len(counts) == 1 and "idx_messages_uid" not in _plan(rival, counts[0])
    assert [sql for sql in picked if sql not in counts and "INDEXED BY idx_messages_timestamp" not in sql] == []


def test_a_file_without_the_time_index_opens_without_building_it_and_vacuum_builds_it(db, rival):
    for n, sid in enumerate(["a", "b", "c"]):
        db.create_session(sid, "cli")
        db.append_message(sid, "user", f"m{n}", timestamp=1000.0 - n)  # the last started, the least recent
    db.close()
    rival.execute("DROP INDEX idx_messages_timestamp")  # as an earlier release left the file

    def has_index() -> bool:
        return bool(rival.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'idx_messages_timestamp'")
                    .fetchone()[0])

    with SessionDB(db.db_path, read_only=True) as reader:
        assert reader.message_count() == 3
        assert [r["id"] for r in reader.list_sessions_rich(order_by_last_active=True)] == ["a", "b", "c"]
    with SessionDB(db.db_path) as writer:
        assert not has_index()  # the open did not take the write lock to read every message
        assert writer.message_count() == 3
        assert [r["id"] for r in writer.list_sessions_rich(order_by_last_active=True)] == ["a", "b", "c"]
        writer.vacuum()
        assert has_index() and rival.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert "idx_messages_timestamp" in _plan(rival, "SELECT COUNT(*) FROM messages")
        assert [r["id"] for r in writer.list_sessions_rich(order_by_last_active=True)] == ["a", "b", "c"]
