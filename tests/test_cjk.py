"""The CJK transform: which text is CJK, its index text, a query term's text, and the SQL function."""
from __future__ import annotations

import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from hermes_state_cjk import cjk_index_text, cjk_query_text, cjk_terms, has_cjk, register_functions


def test_has_cjk_tells_cjk_letters_from_punctuation_and_latin():
    assert has_cjk("東京") and has_cjk("ひらがな") and has_cjk("한국어") and has_cjk("abc 漢 def")
    assert not has_cjk("tokyo") and not has_cjk("") and not has_cjk(None)
    assert not has_cjk("、。「」・")  # CJK punctuation separates words; it is no letter
    assert not has_cjk("café ñ Ω")


def test_index_text_re_emits_each_run_as_bigrams_and_its_last_character():
    assert cjk_index_text("iPhone16を買った") == "iPhone16 を買 買っ った た"
    assert cjk_index_text("東") == "東"
    assert cjk_index_text("東京 and 大阪") == "東京 京 and 大阪 阪"
    assert cjk_index_text("plain words") == "plain words"


def test_query_text_leaves_the_end_of_a_term_open():
    # A final run keeps only its bigrams (the document may go on); a final lone character is a prefix.
    assert cjk_query_text("東京") == ("東京", False)
    assert cjk_query_text("東") == ("東", True)
    assert cjk_query_text("東京都") == ("東京 京都", False)
    assert cjk_query_text("東京 x") == ("東京 京 x", False)


@given(st.text(alphabet="東京都大阪ab ", min_size=1, max_size=12), st.integers(0, 12), st.integers(0, 12))
def test_a_substring_s_query_terms_are_tokens_of_the_text_s_index(text, start, length):
    # The substring promise, token by token: every CJK term the query needs is a token of the
    # index text (the last one, when it is a prefix, starts one).
    needle = text[start:start + length].strip()
    if not has_cjk(needle):
        return
    tokens = cjk_index_text(text).split()
    query, prefix = cjk_query_text(needle)
    terms = [t for t in query.split() if has_cjk(t)]
    for term in terms[:-1] if prefix else terms:
        assert term in tokens, (text, needle, query)
    if prefix:
        assert any(t.startswith(terms[-1]) for t in tokens)


def test_cjk_terms_joins_content_and_tool_calls_and_is_none_without_cjk():
    assert cjk_terms("hello") is None
    assert cjk_terms(None, None) is None
    assert cjk_terms("東京", '{"q": "大阪"}') == '東京 京\n{"q": " 大阪 阪 "}'
    assert cjk_terms(12345, ["東"]) == "12345\n[' 東 ']"  # what is not text is indexed as its str()


def test_the_sql_function_is_registered_and_never_raises():
    conn = sqlite3.connect(":memory:")
    register_functions(conn)
    assert conn.execute("SELECT hermes_cjk_terms('東京', NULL)").fetchone()[0] == "東京 京"
    assert conn.execute("SELECT hermes_cjk_terms('plain', 'text')").fetchone()[0] is None
    assert conn.execute("SELECT hermes_cjk_terms(x'e69db1', 3)").fetchone()[0] is None  # bytes: no text
    conn.close()
