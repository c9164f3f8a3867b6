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
    assert conn.execute("SELECT hermes_cjk_terms(x'e69db1', 3)").fetchone()[0] == "東\n3"  # bytes: stored text
    conn.close()


# Text another program stored that is not UTF-8: an encoded lone surrogate, CJK with a stray byte,
# a stray byte alone, a cut-off CJK character.
NOT_UTF8 = ("EDA080", "E69DB1E4BAAC20FF", "6F6BFF", "E69D")


def _library_functions(conn: sqlite3.Connection) -> set[str]:
    return {name for (name,) in conn.execute("SELECT name FROM pragma_function_list WHERE name LIKE 'hermes%'")}


def test_every_sql_function_of_the_library_takes_stored_text_that_is_not_utf8(tmp_path):
    # Each function the library registers on its connections, called as the library's SQL calls it,
    # on such text: an answer, never the "user-defined function raised exception" that fails the
    # whole statement (and with it a search, a write's trigger or an index rebuild).
    import hermes_state_fts as fts
    import hermes_state_schema as schema
    from hermes_state import SessionDB
    from hermes_state_cjk import fold_sql, terms_sql, words_sql
    SessionDB(tmp_path / "state.db").close()
    conn = schema.connect(tmp_path / "state.db")
    register_functions(conn)
    fts.cached_state(conn)  # reads the catalogue into the connection: no SQL function of its own
    conn.create_function("hermes_derived_uid", 2, schema.derived_uid, deterministic=True)  # as the upgrade does
    conn.execute("CREATE TEMP TABLE t (a TEXT, b TEXT)")
    for raw in NOT_UTF8:
        conn.execute(f"INSERT INTO t VALUES (CAST(x'{raw}' AS TEXT), CAST(x'{raw}' AS TEXT))")
    calls = {"hermes_cjk_terms": terms_sql("a", "b"), "hermes_fold": fold_sql("a"),
             "hermes_derived_uid": "hermes_derived_uid(CAST(a AS BLOB), 7)",
             "hermes_words": words_sql(("a", "b")).replace("?", "'ok'", 1)}
    assert _library_functions(conn) == set(calls)  # a new function must be added here
    for name, call in calls.items():
        answers = [r[0] for r in conn.execute(f"SELECT {call} FROM t ORDER BY rowid")]
        assert len(answers) == len(NOT_UTF8), name
    terms = [r[0] for r in conn.execute(f"SELECT {terms_sql('a', 'b')} FROM t ORDER BY rowid")]
    assert terms[0] is None and terms[2] is None and terms[3] is None  # no CJK left once decoded
    assert terms[1] == "東京 京 \ufffd\n東京 京 \ufffd"  # the CJK is still indexed, the stray byte as U+FFFD
    assert [r[0] for r in conn.execute(f"SELECT {fold_sql('a')} FROM t ORDER BY rowid")] == [
        "\ufffd" * 3, "東京 \ufffd", "ok\ufffd", "\ufffd"]
    assert [r[0] for r in conn.execute(f"SELECT {calls['hermes_words']} FROM t ORDER BY rowid")] == [0, 0, 1, 0]
    conn.close()


def test_holds_words_reads_words_as_the_word_index_does():
    from hermes_state_cjk import holds_words
    assert holds_words("docker image", "pull the Docker-Image now") == 1      # any separator, any case
    assert holds_words("docker image", "dockerimage", "xdocker image") == 0   # whole words only
    assert holds_words("docker im*", None, "docker images") == 1             # the last word a prefix
    assert holds_words("deja vu", "Déjà vu".encode()) == 1                  # stored text arrives as bytes
    assert holds_words("a b", b"a \xff b") == 1 and holds_words("snake case", "snake_case") == 1
    assert holds_words("", "anything") == 0 and holds_words(None, "x") == 0  # nothing to look for


def test_holds_words_never_raises(caplog):
    from hermes_state_cjk import holds_words
    class Odd:
        def __str__(self):
            raise RuntimeError("unreadable")
    assert holds_words("x", Odd()) == 0
    assert "hermes_words failed" in caplog.text
