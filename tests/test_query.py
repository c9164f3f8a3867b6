"""The query language: any text parses, the sanitizer's output is what MATCH accepts, plans are OR groups."""
from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state_query as query
from hermes_state import SessionDB
from hermes_state_query import Group, Term, _sanitize_fts5_query


@pytest.mark.parametrize("text,expected", [
    ("hello AND", "hello"), ("OR hello", "hello"), ("a AND NOT b", "a NOT b"), ("NOT", '"NOT"'),
    ("AND OR", '"AND" "OR"'), ("a AND b", "a b"), ("b NOT c a", "b a NOT c"), ("a OR b NOT c d", "a OR b d NOT c"),
    ("🎉", ""), ("AND 🎉", ""), ("東\u200b京", "東京"), ("\ufeffword", "word"), ("東\u200d京", "東京"),
    ("chat-send", '"chat-send"'), ("my-app.config.ts", '"my-app.config.ts"'), ("under_score", '"under_score"'),
    ('say "hello world', "say hello world"), ('"exact phrase" rest', '"exact phrase" rest'),
    ("deploy*", "deploy*"), ('"foo bar"*', '"foo bar"*'), ("#123", "123"), ("50%", "50"),
    ("NEAR(a b, 3)", '"NEAR(a" b 3'), ("col:term", '"col term"'), ("^start", "start"), ("((x))", "x"),
    ("error:timeout", '"error timeout"'), ('"a : b" c:', '"a b" c'), ("TODO: fix", "TODO fix"),
    ("", ""), ("   ", ""), ("***", ""), ('""', ""), ("東京", "東京"), ("a\x00b", "a b"),
])
def test_sanitizer_examples(text, expected):
    assert _sanitize_fts5_query(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("docker -rust", "docker NOT rust"), ('docker -"rust lang" x', 'docker x NOT "rust lang"'),
    ("NOT docker deploy", "deploy NOT docker"), ("-docker deploy", "deploy NOT docker"),
    ("a OR -b c", "a OR c NOT b"), ("chat-send -x-y", '"chat-send" NOT "x-y"'), ("--x", "x"),
    ("a - b", "a b"), ('a-"b c"', 'a "b c"'), ("-docker", ""), ("NOT docker", ""), ("a OR NOT b", "a"),
])
def test_a_minus_or_a_leading_not_excludes(text, expected):
    assert _sanitize_fts5_query(text) == expected


def test_exclusions_alone_make_a_group_of_their_own():
    assert query.plan_query("-docker").groups == (Group((), (Term("docker"),)),)
    assert query.plan_query('NOT "a b"').groups == (Group((), (Term("a b", quoted=True),)),)
    assert query.plan_query("x OR -y").groups == (Group((Term("x"),)), Group((), (Term("y"),)))
    assert query.plan_query("🎉 -🎊").groups == (Group((Term("🎉"),), (Term("🎊"),)),)


def test_sanitizer_caps_length_and_terms():
    out = _sanitize_fts5_query("a-b " * 2000)
    assert len(out) <= query.MAX_QUERY_CHARS and out.count('"a-b"') == query.MAX_QUERY_TERMS
    assert _sanitize_fts5_query(None) == "" and _sanitize_fts5_query(42) == ""


def test_the_sanitizer_answers_by_the_names_callers_know():
    assert SessionDB._sanitize_fts5_query("b NOT c a") == "b a NOT c"  # a static method: no handle needed


def test_a_plan_is_an_or_of_groups_with_their_exclusions():
    plan = query.plan_query("docker compose NOT swarm OR 東京 NOT 大阪")
    assert plan.groups == (Group((Term("docker"), Term("compose")), (Term("swarm"),)),
                           Group((Term("東京"),), (Term("大阪"),)))
    assert plan.needles == ["docker", "compose", "東京"] and not plan.like_only


def test_symbols_only_give_a_like_plan_and_nothing_gives_none():
    plan = query.plan_query("🎉 OR %%")
    assert plan.like_only and plan.needles == ["🎉", "%%"]
    for nothing in ("", "   ", '""', "\u200b", None, 42):
        assert query.plan_query(nothing) is None


def test_terms_know_whether_they_hold_cjk():
    assert [(t.cjk, t.cjk_letters) for t in (Term("東京"), Term("東京 大阪"), Term("iPhone16を"), Term("docker"))] \
        == [(True, True), (True, True), (True, False), (False, False)]
    assert Term("東京") == Term("東京") and Term("a", prefix=True) != Term("a")


def test_each_index_gets_its_own_writing_of_the_terms():
    terms = (Term("東京都"), Term("chat-send"), Term("deploy", prefix=True))
    assert query.word_expression(terms, (Term("x"),)) == '東京都 "chat-send" deploy* NOT x'
    assert query.cjk_expression(terms) == '"東京 京都" "chat-send" deploy*'
    assert query.cjk_expression((Term("東"),)) == '"東"*'  # a lone character is a prefix of its bigrams
    assert query.trigram_expression(("abcd", "bcd")) == '"abc" AND "bcd"'
    assert query.trigram_expression(('a"bc',)) == '"a""b" AND """bc"'


@pytest.fixture(scope="module")
def match_conn():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE w USING fts5(content, tool_name, tool_calls)")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='trigram', detail='none')")
    conn.execute("CREATE VIRTUAL TABLE c USING fts5(terms)")
    conn.execute("INSERT INTO w VALUES ('alpha beta', 'terminal', NULL)")
    conn.execute("INSERT INTO t VALUES ('alpha beta 東京都')")
    conn.execute("INSERT INTO c VALUES ('東京 京都 都')")
    yield conn
    conn.close()


_NASTY = st.text(alphabet=st.sampled_from(list('ab 東京구글"*^:()-+.,/_@#%\'\\\x00AND OR NOT NEAR{}[]🎉\u200b\u200d')),
                 max_size=40)
_ANY = st.one_of(st.text(max_size=60), _NASTY)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_ANY)
def test_any_input_gives_an_expression_match_accepts_and_sanitizing_is_idempotent(match_conn, text):
    clean = _sanitize_fts5_query(text)
    assert _sanitize_fts5_query(clean) == clean
    assert len(clean) <= query.MAX_QUERY_CHARS
    plan = query.plan_query(text)
    if plan is None:
        assert clean == ""
        return
    if plan.like_only:
        assert clean == "" and all(g.terms or g.excluded for g in plan.groups)
        return
    for group in plan.groups:
        assert group.terms or group.excluded
        if not group.terms:  # exclusions alone: answered by a scan, never by MATCH
            continue
        cjk = tuple(t for t in group.terms if t.cjk)
        word = query.word_expression(group.terms, group.excluded)
        match_conn.execute("SELECT rowid FROM w WHERE w MATCH ?", (word,)).fetchall()
        match_conn.execute("SELECT rowid FROM c WHERE c MATCH ?", (word,)).fetchall()
        if all(len(t.text) >= 3 for t in group.terms):  # what the substring index is asked for
            match_conn.execute("SELECT rowid FROM t WHERE t MATCH ?",
                               (query.trigram_expression(tuple(t.text for t in group.terms)),)).fetchall()
        match_conn.execute("SELECT rowid FROM c WHERE c MATCH ?",
                           (query.cjk_expression(group.terms, group.excluded),)).fetchall()
        if cjk:
            match_conn.execute("SELECT rowid FROM c WHERE c MATCH ?", (query.cjk_expression(cjk),)).fetchall()
