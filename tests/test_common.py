"""hermes_state_common: the data dictionary and its rules, LIKE escaping, surrogates, JSON columns, SQL splitting."""
from __future__ import annotations

import json
import sqlite3
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_common as common
import hermes_state_schema as schema


def test_helpers():
    assert common.escape_like("50%_a\\b") == "50\\%\\_a\\\\b"
    assert common.strip_surrogates("a\ud800b\udfffc") == "abc"
    assert common.strip_surrogates("東京\x00") == "東京\x00"
    assert common.encode_json({"a": "東"}, "f") == '{"a": "東"}'
    with pytest.raises(ValueError, match="tool_calls"):
        common.encode_json({"a": object()}, "tool_calls")
    assert common.decode_json('[1, 2]') == [1, 2]
    assert common.decode_json("not json") == "not json"
    assert common.split_sql("CREATE TABLE a (x);\nINSERT INTO a VALUES (';');") == [
        "CREATE TABLE a (x);", "INSERT INTO a VALUES (';');"]
    assert "CREATE TABLE IF NOT EXISTS sessions" in common.SCHEMA_SQL
    assert common.SCHEMA_VERSION == 31


# --- the data dictionary ---------------------------------------------------------------------------

def test_schema_sql_is_generated_from_the_dictionary():
    for table in common.DICTIONARY.values():
        assert (table.sql in common.SCHEMA_SQL) == table.at_open, table.name
    assert common.DELIVERY_OBLIGATIONS_SQL == common.DICTIONARY["delivery_obligations"].sql
    usage = common.DICTIONARY["session_model_usage"]
    assert usage.column("task").declaration == "TEXT NOT NULL DEFAULT ''"
    assert common.DICTIONARY["async_delegations"].column("delivery_state").declaration == "TEXT NOT NULL DEFAULT 'pending'"
    assert common.TABLE_COLUMNS["messages"] == common.MESSAGES.column_names
    assert common.JSON_MESSAGE_FIELDS == tuple(c.name for c in common.MESSAGES.columns if c.json)


def test_session_owned_tables_come_children_first():
    owned = [t.name for t in common.SESSION_OWNED]
    assert {"messages", "session_model_usage", "worker_receipts", "gateway_routing"} <= set(owned)
    assert "sessions" not in owned and "runtime_epoch" not in owned
    for index, table in enumerate(common.SESSION_OWNED):
        for later in common.SESSION_OWNED[index + 1:]:
            assert not later.references(table.name), f"{later.name} references {table.name}, deleted before it"


def test_one_rule_per_column_kind():
    observed, pinned = common.MESSAGES.column("observed"), common.SESSIONS.column("pinned")
    for flag in (observed, pinned):
        assert (flag.check(True), flag.check(0)) == (1, 0)
        for bad in ("yes", 2, 0.5):
            with pytest.raises(ValueError, match=flag.name):
                flag.check(bad)
    assert common.MESSAGES.column("platform_message_id").check(12345) == "12345"
    assert common.MESSAGES.column("timestamp").check(-1) == -1.0  # any finite time
    with pytest.raises(ValueError, match="started_at"):
        common.SESSIONS.column("started_at").check(-1)  # session times are not negative
    with pytest.raises(ValueError, match="32 lowercase hex"):
        common.MESSAGES.column("message_uid").check("ABC")
    assert common.SESSIONS.column("model_config").check("not json") == "not json"
    assert common.MESSAGES.column("tool_calls").check("not json") == '"not json"'
    assert common.SESSIONS.column("id").rule is None and common.MESSAGES.column("active").rule is None


def test_check_stored_takes_what_an_export_carries():
    tokens, cost = common.SESSIONS.column("input_tokens"), common.SESSIONS.column("estimated_cost_usd")
    assert common.check_stored(tokens, True) == 1 and common.check_stored(cost, 1.5) == 1.5
    assert common.check_stored(common.MESSAGES.column("tool_calls"), [{"id": "a"}]) == '[{"id": "a"}]'
    for column, bad, message in ((tokens, 1.5, "an integer"), (tokens, 2**63, "64-bit"),
                                 (cost, float("nan"), "finite"), (cost, float("inf"), "finite"), (common.SESSIONS.column("title"), 3, "string")):
        with pytest.raises(ValueError, match=message):
            common.check_stored(column, bad)


def test_table_exists_and_uids():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE present (x)")
    assert common.table_exists(conn, "present") and not common.table_exists(conn, "absent")
    assert common.is_uid("0" * 32) and not common.is_uid("0" * 31) and not common.is_uid(None)


def test_new_uids_are_uuid4_hex_and_distinct():
    uids = [common.new_uid() for _ in range(2000)]
    assert len(set(uids)) == len(uids)
    for uid in uids:
        assert common.is_uid(uid)
        parsed = uuid.UUID(hex=uid)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex == uid
    # The random bits vary: every hex position but the version digit takes several values.
    varying = [len({u[i] for u in uids}) for i in range(32)]
    assert varying[12] == 1 and all(n > 1 for i, n in enumerate(varying) if i != 12)


_ROW = st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.sampled_from([0, 1]),
                 st.one_of(st.none(), st.just("not json"), st.just('{"id": 1}'),
                           st.lists(st.fixed_dictionaries({"id": st.text(max_size=2)}), max_size=3).map(json.dumps)))


@settings(max_examples=60, deadline=None)
@given(st.lists(_ROW, max_size=12))
def test_counters_recount_in_sql_what_each_written_row_adds(rows):
    # The SQL recount (upgrade, import, recover) and the per-row amounts (the write path) are two
    # forms of one declared rule: over any rows they agree.
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("BEGIN")
    schema.build_file(conn)
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'cli', 1)")
    conn.executemany("INSERT INTO messages (session_id, role, active, tool_calls, timestamp) VALUES ('s', ?, ?, ?, 1)",
                     rows)
    conn.execute(common.recount_sql())
    expected = [0] * len(common.COUNTERS)
    for role, active, calls in rows:
        if active:
            amounts = common.counter_amounts(role, common.decode_json(calls))
            expected = [a + b for a, b in zip(expected, amounts)]
    columns = ", ".join(c.column for c in common.COUNTERS)
    assert list(conn.execute(f"SELECT {columns} FROM sessions").fetchone()) == expected


def test_the_helpers_under_the_dictionary_are_importable_from_it():
    for name in ("escape_like", "split_sql", "row_dicts", "object_exists", "table_exists", "strip_surrogates",
                 "check_scalar", "shown", "logger", "INT_MIN", "INT_MAX", "WRITE_PATIENCE_S",
                 "TRANSCRIPT_WRITE_PATIENCE_S", "ACTIVITY_WRITE_PATIENCE_S", "WRITE_RETRY_MIN_S", "WRITE_RETRY_MAX_S",
                 "WRITE_RETRY_SLOW_MIN_S", "WRITE_RETRY_SLOW_MAX_S", "WRITE_RETRY_FAST_WINDOW_S",
                 "CHECKPOINT_EVERY_N_WRITES", "READ_BUSY_TIMEOUT_S", "SQLITE_BUSY_TIMEOUT_S", "PAGE_SIZE", "DAY_S"):
        assert hasattr(common, name), name
    assert common.logger.name == "hermes_state"
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a, b)")
    conn.execute("INSERT INTO t VALUES (1, 'x')")
    assert common.table_exists(conn, "t") and not common.table_exists(conn, "u")
    assert common.row_dicts(conn.execute("SELECT * FROM t")) == [{"a": 1, "b": "x"}]


def test_derived_uid_is_the_version_5_uuid_of_the_rows_place():
    import random
    import uuid
    namespace = uuid.UUID("5b0c3f52-2d7e-4f8a-9a35-7c1e0e6f4a21")
    rng = random.Random(5)
    for _ in range(2000):
        sid = "".join(rng.choice("abcXYZ09_-/東京é ") for _ in range(rng.randint(0, 24)))
        row = rng.randint(-3, 10**13)
        want = uuid.uuid5(namespace, f"{sid}/{row}").hex
        assert common.derived_uid(sid, row) == want == common.derived_uid(sid.encode(), row)
