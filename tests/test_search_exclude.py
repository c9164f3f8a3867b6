"""Leaving terms out: `a -b` finds exactly the hits of `a` that do not hold `b`, indexed or not."""
from __future__ import annotations

import random
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state_fts as fts
from hermes_state import SessionDB

# Words that are pieces of one another (rust / rusty / trust), a hyphenated word, CJK runs
# that overlap (東京 / 京都), and a word of two letters, which only the scan serves as a piece.
VOCABULARY = ["docker", "rust", "rusty", "trust", "chat-send", "send", "image", "go", "東京", "京都", "東京都",
              "build", "deploy"]
TERMS = VOCABULARY + ["ocker", "ust", "chat", "京"]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 5)))


def _index_queue(db: SessionDB) -> None:
    with db.transaction() as txn:  # what the handle's next batch, or its close, does
        fts.index_batch(txn.conn)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two stores of the same texts: one fully indexed, one whose newest rows wait to be indexed."""
    rng = random.Random(32)
    texts = [_text(rng) for _ in range(90)]
    root = tmp_path_factory.mktemp("exclude")
    indexed = SessionDB(root / "indexed.db")
    indexed.create_session("s", "cli")
    for text in texts:
        indexed.append_message("s", rng.choice(["user", "assistant", "tool"]), text)
    _index_queue(indexed)
    waiting = SessionDB(root / "waiting.db")
    waiting.create_session("s", "cli")
    for text in texts[:60]:
        waiting.append_message("s", "user", text)
    _index_queue(waiting)
    for text in texts[60:80]:  # queued by this handle, not indexed until it searches or closes
        waiting.append_message("s", "assistant", text)
    shell = sqlite3.connect(root / "waiting.db")  # another program: its CJK rows wait in the CJK queue
    with shell:
        for text in texts[80:]:
            shell.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('s', 'user', ?, ?)",
                          (text + " 東京", time.time()))
    shell.close()
    reader = SessionDB(root / "waiting.db", read_only=True)  # reads the queued rows by scanning them
    yield {"indexed": indexed, "waiting": reader}
    reader.close()
    waiting.close()
    indexed.close()


def _hits(db: SessionDB, query: str) -> set[int]:
    return {h["id"] for h in db.search_messages(query, limit=1000)}


def _contents(db: SessionDB, ids) -> dict[int, str]:
    with sqlite3.connect(db.db_path) as conn:
        return {i: c for i, c in conn.execute("SELECT id, content FROM messages WHERE id IN (SELECT value FROM "
                                              "json_each(?))", (str(list(ids)),))}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(store=st.sampled_from(["indexed", "waiting"]), a=st.sampled_from(TERMS), b=st.sampled_from(TERMS),
       phrase=st.booleans())
def test_a_minus_b_is_the_hits_of_a_without_b(stores, store, a, b, phrase):
    db = stores[store]
    excluded = f'-"{b}"' if phrase else f"-{b}"
    left = _hits(db, f"{a} {excluded}")
    of_a = _hits(db, a)
    assert left <= of_a
    text = _contents(db, of_a)
    assert all(b.lower() not in text[i].lower() for i in left)           # no hit holds b
    assert {i for i in of_a if b.lower() not in text[i].lower()} == left  # and none of a's others is lost


def test_queued_rows_are_there_to_be_left_out(stores):
    # The property above must see rows of both queues, or it would only test the indexes.
    reader = stores["waiting"]
    with sqlite3.connect(reader.db_path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM hermes_fts_pending").fetchone()[0] > 0
        assert conn.execute("SELECT COUNT(*) FROM hermes_fts_cjk_pending").fetchone()[0] > 0


@pytest.mark.parametrize("query", ["NOT docker", "-docker", '-"chat-send"'])
def test_exclusions_alone_give_the_newest_messages_without_them(stores, query):
    db = stores["indexed"]
    hits = db.search_messages(query, limit=1000)
    word = query.split()[-1].strip('-"')
    with sqlite3.connect(db.db_path) as conn:
        expected = [i for i, c in conn.execute("SELECT id, content FROM messages ORDER BY id DESC") if word not in c]
    assert [h["id"] for h in hits] == expected


def test_a_leading_not_excludes_within_the_other_terms(stores):
    db = stores["indexed"]
    assert _hits(db, "NOT docker image") == _hits(db, "image -docker") != set()


def test_a_hyphenated_word_is_one_term(db):
    db.create_session("s", "cli")
    row = db.append_message("s", "user", "run the chat-send command")
    db.append_message("s", "user", "run the chat command, then send")
    assert [h["id"] for h in db.search_messages("chat-send")] == [row]
    assert [h["id"] for h in db.search_messages("command -chat-send")] != [row]
