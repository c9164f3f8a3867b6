"""Quoted phrases and filtered searches: a source filter keeps exactly the unfiltered hits of that source."""
from __future__ import annotations

import json
import re
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import assert_documented_window

import hermes_state_fts as fts

# "str gitda" inside longer words: every cli row holds "gitda" after a word ending in something
# else: candidates of the substring pass that a source filter must leave out.
CLI_TEXT = "tool output xstr gitdax and more words " * 20
TELEGRAM_TEXT = ["a note: mystr gitdaq here", "plain str gitda phrase", "nothing to see, only gitda"]


@pytest.fixture
def store(db):
    db.create_session("c", "cli")
    db.create_session("t", "telegram")
    for i in range(40):
        db.append_message("c", "tool", CLI_TEXT, tool_call_id=f"c{i}")
        if i % 10 == 0:
            db.append_message("t", "user", TELEGRAM_TEXT[(i // 10) % 3])
    with db.transaction() as txn:
        fts.index_batch(txn.conn)
    return db


def test_filtered_hits_are_the_unfiltered_hits_of_that_source(store):
    # The substring pass (a phrase inside longer words), the word index and the trigram index,
    # each with its text check written after the session's conditions.
    for query in ('"str gitda"', "gitda", "str gitda", '"xstr gitdax"', "itda", "gitda -xstr", '"str gitda" OR note'):
        every = store.search_messages(query, limit=100)
        filtered = store.search_messages(query, source_filter=["telegram"], limit=100)
        assert [h["id"] for h in filtered] == [h["id"] for h in every if h["source"] == "telegram"], query


# --- a quoted phrase's window is read with its scores in one statement: the same ranked rows ---

@pytest.mark.parametrize("window, pool", [(3, 4), (10, 4), (10, 30), (100, 4)])
@pytest.mark.parametrize("filters", [{}, {"source_filter": ["discord"]}, {"role_filter": ["assistant"]}])
@pytest.mark.parametrize("archived", [False, True])
def test_a_phrase_ranks_the_best_live_rows_of_the_documented_window(db, monkeypatch, window, pool, filters, archived,
                                                                    index_queue):
    # As for a word: the newest `window` matches, reaching back to hold the newest max(need, pool)
    # rows passing the filters; those rows in bm25 order, newest first among equals.
    import hermes_state_search as search
    monkeypatch.setattr(search, "RANK_WINDOW", window)
    monkeypatch.setattr(search, "FILTERED_POOL", pool)
    db.create_session("d", "discord")
    db.create_session("c", "cli")
    ids = []
    for i in range(60):
        text = "common term " + "pad " * ((i * 7) % 11) if i % 3 else "term common, not the phrase"
        ids.append(db.append_message("d" if i % 7 == 0 else "c", "assistant" if i % 5 == 0 else "user", text))
    index_queue(db)
    if archived:  # most of the shortest and some of the newest rows
        with sqlite3.connect(db.db_path) as c:
            c.execute("UPDATE messages SET active = 0 WHERE id IN (SELECT value FROM json_each(?))",
                      (json.dumps([i for n, i in enumerate(ids) if (n * 7) % 11 < 3 or n > 50]),))
    assert_documented_window(db, '"common term"', '"common term"', filters, window, pool)


# --- a quoted term is whole words, as FTS5 matches a phrase; anything typed bare is also a piece of text ---

WORDS_TEXTS = ["docker image build", "the docker imagery", "dockerfile image", "docker, image", "Docker\nImage pulled",
               "xdocker image", "Déjà vu again", "deja-vu notes", "a docker_image name", "docker images listed",
               "chat send", "run chat-send now", "xchat-send"]


def _hits(db, query, **kw):
    return {h["id"] for h in db.search_messages(query, limit=100, **kw)}


@pytest.mark.parametrize("query, expected", [
    ('"docker image"', {0, 3, 4, 8}),             # words next to each other, any separator, any case
    ('"docker image"*', {0, 1, 3, 4, 8, 9}),      # ... the last word a prefix
    ('"docker"', {0, 1, 3, 4, 8, 9}),            # one word, whole: not dockerfile, not xdocker
    ('"deja vu"', {6, 7}),                        # accents folded as the word index folds them
    ('"docker image" -build', {3, 4, 8}),         # an exclusion is still a piece of text
    ('"chat-send"', {10, 11}),                    # quoted punctuation is a separator like any other
])
def test_a_quoted_term_matches_whole_words_queued_or_indexed(db, index_queue, query, expected):
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", text) for text in WORDS_TEXTS]
    want = {ids[i] for i in expected}
    assert _hits(db, query) == want  # the rows are still queued: scanned, and read as the index would
    index_queue(db)
    assert _hits(db, query) == want
    assert _hits(db, query, session_id="s") == want  # one session's narrow range, read row by row otherwise


def test_bare_pieces_are_still_found_inside_longer_words(db, index_queue):
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", text) for text in WORDS_TEXTS]
    index_queue(db)
    assert _hits(db, "docker") == {ids[i] for i in (0, 1, 2, 3, 4, 5, 8, 9)}
    # A word with inner punctuation, typed bare: its words in a row, and the piece inside longer words.
    assert _hits(db, "docker_image") == {ids[i] for i in (0, 3, 4, 8)}
    assert _hits(db, "ker_ima") == {ids[8]}
    assert _hits(db, "ocker imag") == {ids[i] for i in (0, 1, 2, 3, 4, 5, 8, 9)}


def test_a_quoted_term_beside_a_bare_piece_keeps_its_words_whole(db, index_queue):
    # The bare piece is found inside longer words ("imagery"); the quoted one only as words.
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", text) for text in
           ["run docker now, imagery", "run xdocker now, imagery", "docker ran an image", "nothing here"]]
    for queued in (True, False):
        if not queued:
            index_queue(db)
        assert _hits(db, '"docker" imag') == {ids[0], ids[2]}, queued
        assert _hits(db, '"run docker" imag') == {ids[0]}, queued


def test_a_quoted_cjk_term_is_still_any_substring(db, index_queue):
    # CJK has no spaces between words: its bigram index finds any run of letters.
    db.create_session("s", "cli")
    row = db.append_message("s", "user", "東京都庁に行った")
    index_queue(db)
    assert _hits(db, '"京都"') == {row}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.lists(st.sampled_from(["ab", "abc", "bc", "cab", "a_b", "Ab", "b"]), min_size=1, max_size=6)
                      .map(lambda ws: st_join(ws)), min_size=1, max_size=6),
       phrase=st.lists(st.sampled_from(["ab", "abc", "bc", "cab", "b"]), min_size=1, max_size=3))
def test_a_quoted_term_finds_the_rows_holding_its_words_in_a_row(tmp_path_factory, index_queue, texts, phrase):
    # The truth is computed from words: a row matches when the phrase's words appear next to each
    # other among its words (letters and digits; anything else separates). Queued and indexed alike.
    import hermes_state
    home = tmp_path_factory.mktemp("words")
    db = hermes_state.SessionDB(home / "state.db")
    try:
        db.create_session("s", "cli")
        ids = {db.append_message("s", "user", text): text for text in texts}
        def words(text):
            return " " + " ".join(re.findall(r"[a-z0-9]+", text.lower())) + " "
        want = {i for i, text in ids.items() if words(" ".join(phrase)) in words(text)}
        query = '"' + " ".join(phrase) + '"'
        assert _hits(db, query) == want
        index_queue(db)
        assert _hits(db, query) == want
    finally:
        db.close()


def st_join(words):
    seps = [" ", ", ", "-", "\n", "."]
    return "".join(w + seps[i % len(seps)] for i, w in enumerate(words)).strip()


def test_a_quoted_term_checked_on_the_text_reads_words_as_the_index_does(db, index_queue):
    # Beside a CJK term, the quoted term is checked on the rows the CJK index found (as text):
    # its words whole, with any separator, as the word index would have matched them.
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", text) for text in
           ["東京で chat send した", "東京で run chat-send now", "東京で xchat-sendy", "大阪で chat send"]]
    index_queue(db)
    assert _hits(db, '東京 "chat-send"') == {ids[0], ids[1]}


# --- a lone phrase is ordered as bm25 orders it, without bm25's count of the phrase -----------

LONE_WORDS = ["alpha", "beta", "gamma", "delta", "pad", "Alpha", "beta."]


def _bm25_order(path, phrase: str, sources: list[str]) -> list[int]:
    """Return every live match of `phrase` from `sources`, in bm25's order, newest first among equals."""
    with sqlite3.connect(path) as c:
        rows = c.execute(f"SELECT f.rowid, bm25({fts.WORD}) FROM {fts.WORD} f JOIN messages m ON m.id = f.rowid "
                         f"JOIN sessions s ON s.id = m.session_id WHERE {fts.WORD} MATCH ? AND m.active = 1 "
                         "AND s.source IN (SELECT value FROM json_each(?))", (phrase, json.dumps(sources))).fetchall()
    return [r[0] for r in sorted(rows, key=lambda r: (r[1], -r[0]))]


@pytest.fixture
def lone_phrase_spy(monkeypatch):
    """Return the list of expressions ordered without bm25's count so far (so a test sees the shortcut taken)."""
    import hermes_state_search as search
    taken: list[str] = []
    real = search.lone_phrase_order

    def spy(conn, table, expr):
        order = real(conn, table, expr)
        if order is not None:
            taken.append(expr)
        return order
    monkeypatch.setattr(search, "lone_phrase_order", spy)
    return taken


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.lists(st.sampled_from(LONE_WORDS), max_size=12), st.integers(0, 3),
                               st.integers(0, 2), st.sampled_from(["cli", "telegram"])), min_size=1, max_size=25),
       budget=st.sampled_from([0, 10 ** 6]), pool=st.sampled_from([2, 50]))
def test_a_lone_phrase_with_filters_is_ranked_in_bm25_order(tmp_path_factory, index_queue, monkeypatch, rows, budget,
                                                           pool):
    # The phrase occurs 0-3 times in the text and 0-2 times in a tool call's arguments, among
    # words of varying number: its count and the row's length both decide the order. With a
    # budget of 0 tokens the rows past the pool are scored by bm25 itself; either way the order
    # is bm25's (rank all matches: the corpus is smaller than any window).
    import hermes_state
    import hermes_state_search as search
    monkeypatch.setattr(search, "PHRASE_COUNT_TOKENS", budget)
    monkeypatch.setattr(search, "FILTERED_POOL", pool)
    db = hermes_state.SessionDB(tmp_path_factory.mktemp("lone") / "state.db")
    try:
        db.create_session("cli", "cli")
        db.create_session("telegram", "telegram")
        for words, in_text, in_call, source in rows:
            text = " ".join(words + ["alpha, Beta gamma"] * in_text)
            calls = [{"id": f"c{k}", "function": {"name": "shell", "arguments": "echo alpha beta gamma"}}
                     for k in range(in_call)]
            db.append_message(source, "assistant", text, tool_calls=calls or None)
        index_queue(db)
        for sources in (["telegram"], ["cli", "telegram"]):
            want = _bm25_order(db.db_path, '"alpha beta gamma"', sources)
            got = [h["id"] for h in db.search_messages('"alpha beta gamma"', source_filter=sources, limit=100)]
            assert got == want, sources
            page = db.search_messages('"alpha beta gamma"', source_filter=sources, limit=3, offset=3)
            assert [h["id"] for h in page] == want[3:6], sources
        # One session's rows: the same order (the session's own id range is walked).
        want = _bm25_order(db.db_path, '"alpha beta gamma"', ["cli"])
        assert [h["id"] for h in db.search_messages('"alpha beta gamma"', session_id="cli", limit=100)] == want
    finally:
        db.close()


def test_a_lone_phrase_with_a_filter_is_scored_without_bm25(db, index_queue, lone_phrase_spy):
    db.create_session("c", "cli")
    for i in range(8):
        db.append_message("c", "user", "alpha beta " * (i % 3 + 1) + "pad " * i)
    index_queue(db)
    got = [h["id"] for h in db.search_messages('"alpha beta"', source_filter=["cli"], limit=100)]
    assert got == _bm25_order(db.db_path, '"alpha beta"', ["cli"])
    assert lone_phrase_spy == ['"alpha beta"']


@pytest.mark.parametrize("query, kw", [
    ('"alpha beta alpha"', {}),                 # a repeated word: two occurrences may overlap
    ('"alpha beta"*', {}),                      # a prefix may match the phrase's own first word
    ('"alpha beta" OR gamma', {}),              # two branches: their scores are merged
    ('"alpha beta" gamma', {}),                 # two phrases: each weighs by its own rarity
    ('"alpha beta"', {"include_reasoning": True}),  # the reasoning index's scores are merged in
    ('"gamma café"', {}),                       # not ASCII: folded in ways only the index knows
])
def test_a_phrase_whose_order_its_count_may_change_is_ranked_by_bm25(db, index_queue, lone_phrase_spy, query, kw):
    db.create_session("c", "cli")
    for i in range(6):
        db.append_message("c", "user", "alpha beta alpha beta gamma café " + "pad " * i)
    index_queue(db)
    assert db.search_messages(query, source_filter=["cli"], **kw)
    assert lone_phrase_spy == []


def test_a_lone_phrase_beside_cjk_hits_is_ranked_by_bm25(db, index_queue, lone_phrase_spy):
    # The CJK index also holds "alpha beta" when it is glued to CJK text, and its scores are merged.
    db.create_session("c", "cli")
    db.append_message("c", "user", "alpha beta pad")
    db.append_message("c", "user", "東京alpha beta")
    index_queue(db)
    assert len(db.search_messages('"alpha beta"', source_filter=["cli"])) == 2
    assert lone_phrase_spy == []


def test_a_row_whose_text_no_longer_holds_the_phrase_is_ranked_by_bm25(db, index_queue, raw_conn):
    # A program that changed the text without updating the index (its triggers dropped) leaves
    # the index holding the phrase for a row whose text lacks it: bm25 still ranks that row.
    db.create_session("c", "cli")
    ids = [db.append_message("c", "user", "alpha beta " + "pad " * i) for i in range(4)]
    index_queue(db)
    rival = raw_conn()
    triggers = rival.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'"
                             ).fetchall()
    for name, _ in triggers:
        rival.execute(f'DROP TRIGGER "{name}"')
    rival.execute("UPDATE messages SET content = 'gone' WHERE id = ?", (ids[1],))
    for _, sql in triggers:
        rival.execute(sql)
    got = [h["id"] for h in db.search_messages('"alpha beta"', source_filter=["cli"], limit=10)]
    assert got == _bm25_order(db.db_path, '"alpha beta"', ["cli"])
    assert ids[1] in got


def test_a_row_whose_token_count_is_gone_is_reported_as_bm25_reports_it(db, index_queue, raw_conn):
    # FTS5 keeps each row's token count beside the index; without it bm25 finds the index corrupt,
    # and the lone-phrase order must not rank the row as if it held no tokens instead.
    from hermes_state_errors import StateDbCorruptError
    db.create_session("c", "cli")
    ids = [db.append_message("c", "user", "alpha beta " + "pad " * i) for i in range(4)]
    index_queue(db)
    raw_conn().execute(f"DELETE FROM {fts.WORD}_docsize WHERE id = ?", (ids[1],))
    with pytest.raises(StateDbCorruptError):
        db.search_messages('"alpha beta"', source_filter=["cli"])
