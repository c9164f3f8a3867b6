"""Helpers of hermes_state_common: LIKE escaping, surrogate stripping, JSON columns, SQL splitting."""
from __future__ import annotations

import pytest

import hermes_state_common as common


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
