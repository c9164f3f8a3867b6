"""Quoted phrases and filtered searches: a source filter keeps exactly the unfiltered hits of that source."""
from __future__ import annotations

import pytest

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
