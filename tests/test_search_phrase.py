"""Quoted phrases and filtered searches: a source filter keeps exactly the unfiltered hits of that source."""
from __future__ import annotations

import json
import sqlite3

import pytest
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
