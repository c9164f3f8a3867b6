"""The value checks every API shares (in the data dictionary): surrogate handling, JSON columns and the column rules."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hermes_state_common as values


def test_surrogates_are_stripped_or_replaced_and_nothing_else_changes():
    assert values.strip_surrogates("a\ud800b") == "ab"
    assert values.replace_surrogates("a\udfffb") == "a\ufffdb"
    assert values.replace_surrogates("東京\x00") == "東京\x00"
    assert values.strip_surrogates(None) is None and values.replace_surrogates(None) is None
    assert values.has_surrogate("x\ud834") and not values.has_surrogate("𝄞 plain")


def test_encode_json_keeps_json_text_and_encodes_everything_else():
    assert values.encode_json('{"a": 1}', "f") == '{"a": 1}'      # already serialised
    assert json.loads(values.encode_json("plain words", "f")) == "plain words"
    assert values.encode_json("NaN", "f") == '"NaN"'             # not standard JSON text: a string
    assert values.encode_json(None, "f") is None
    with pytest.raises(ValueError, match="args"):
        values.encode_json({"x": {1, 2}}, "args")

    class Dumps:
        def model_dump(self, mode, exclude_none):
            return {"id": "c1", "mode": mode, "none_dropped": exclude_none}
    assert json.loads(values.encode_json([Dumps()], "tool_calls")) == [
        {"id": "c1", "mode": "json", "none_dropped": True}]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)))
def test_encoded_json_decodes_to_the_value(value):
    if value is None or isinstance(value, str):
        return  # None stores NULL; a str that is JSON text is stored as that text (see above)
    assert values.decode_json(values.encode_json(value, "f")) == json.loads(json.dumps(value))


def test_decode_json_gives_back_what_is_not_json():
    assert values.decode_json("[1, 2]") == [1, 2]
    assert values.decode_json("not json") == "not json"
    assert values.decode_json(7) == 7
    assert values.decode_json("[" * 100_000) == "[" * 100_000  # too deep for Python: the text itself


def _as_json_loads(text):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


@pytest.mark.parametrize("text", [" [1]", "[1] ", "\n{\"a\": 1}\n", "[1] x", '{"a": 1}{"b": 2}', "\ufeff[1]",
                                  "", "-", "12abc", "tru", "NaN", "1e999", '"a"', "[1, {\"b\": null}]"])
def test_decode_json_reads_a_column_exactly_as_json_loads_does(text):
    # Whitespace around the value is allowed, anything after it or a byte-order mark is not.
    assert repr(values.decode_json(text)) == repr(_as_json_loads(text))


@given(st.text(alphabet=' \t\n[]{}",:0123456789.eE+-truefalsnNI\\ab', max_size=24))
def test_decode_json_agrees_with_json_loads_on_any_text(text):
    assert repr(values.decode_json(text)) == repr(_as_json_loads(text))


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3", 2**63])
def test_check_count_refuses_what_is_not_a_64_bit_count(bad):
    with pytest.raises(ValueError, match="n"):
        values.check_count("n", bad)


def test_checks_accept_what_sqlite_stores_faithfully():
    assert values.check_count("n", 2**63 - 1) == 2**63 - 1
    assert values.check_number("x", 3) == 3.0 and isinstance(values.check_number("x", 3), float)
    for bad in (math.nan, math.inf, -0.5, "1", None, False):
        with pytest.raises(ValueError):
            values.check_number("x", bad)
    with pytest.raises(ValueError, match="positive"):
        values.check_number("x", 0, positive=True)
    assert values.check_id("k", "abc") == "abc" and values.check_id("k", None, optional=True) is None
    for bad in ("", None, 3, "a\ud800"):
        with pytest.raises(ValueError, match="k"):
            values.check_id("k", bad)
    assert values.check_scalar("v", 2**63 - 1) == 2**63 - 1 and values.check_scalar("v", True) is True
    for bad in (math.nan, 2**63, [1], b"x"):
        with pytest.raises(ValueError):
            values.check_scalar("v", bad)


def test_shown_never_raises_and_stays_short():
    class Hostile:
        def __repr__(self):
            raise RuntimeError("no")
    assert values.shown(Hostile()).startswith("<Hostile")
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    assert len(values.shown(deep)) < 100 and len(values.shown("x" * 10_000)) < 100


def test_the_column_rules_store_each_kind_as_declared():
    rules = values.COLUMN_RULES
    assert rules["text"]("c", "a\ud800") == "a\ufffd"
    assert rules["platform_id"]("c", 12345) == "12345"
    assert rules["flag"]("c", True) == 1 and rules["flag"]("c", 0) == 0
    assert rules["time"]("c", 5) == 5.0
    assert rules["json_text"]("c", "kept as given") == "kept as given"
    assert rules["uid"]("c", "0" * 32) == "0" * 32
    for rule, bad in (("text", 3), ("flag", 2), ("flag", "1"), ("time", math.inf), ("uid", "A" * 32),
                      ("count", -1), ("number", math.nan), ("json", {1, 2})):
        with pytest.raises(ValueError, match="c"):
            rules[rule]("c", bad)
    assert values.is_uid("0123456789abcdef" * 2) and not values.is_uid("0123456789ABCDEF" * 2)


def test_the_rules_a_write_runs_are_the_dictionarys_own_code():
    # The rules a write runs are the dictionary's own code, so a write never leaves it to check a value.
    for name in ("check_id", "check_count", "encode_json", "replace_surrogates", "has_surrogate"):
        assert getattr(values, name).__module__ == "hermes_state_common", name
    assert {rule.__module__ for rule in values.COLUMN_RULES.values()} == {"hermes_state_common"}
