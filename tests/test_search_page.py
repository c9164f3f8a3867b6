"""A page of search results: snippets equal to FTS5's own, and how far back selective filters make the ranking reach."""
from __future__ import annotations

import json
import sqlite3
import threading

import pytest
from conftest import assert_documented_window

import hermes_state_fts as fts
import hermes_state_highlight as highlight
from hermes_state_query import _sanitize_fts5_query

ROWS = [
    "the quick brown fox jumps over the lazy dog " * 6,
    "Déjà vu: the deja setting was reset, DEJA again",
    "chat send failed; the chat-send handler retried chat send twice",
    "昨日iPhone16を買った and the iPhone16 case too",
    "kubernetes pods restarting: kubectl get pods shows kubernetes-dashboard",
    "short",
    "prefix matches: configuration, configured, config, reconfigure",
]
CALLS = [None, '{"function": {"name": "lookup", "arguments": "{\\"q\\": \\"deja\\"}"}}', None, None,
         '[{"function": {"name": "kubectl"}}]', None, None]
QUERIES = ["fox", "deja", '"chat send"', "iPhone16", "kubernetes pods", "config*", "fox OR short",
           "lookup", "kubectl", "dog NOT cat", "zebraquux"]


@pytest.fixture
def conn(db):
    for i, (text, calls) in enumerate(zip(ROWS, CALLS)):
        db.create_session(f"s{i}", "cli")
        if calls:
            db.append_message(f"s{i}", "assistant", text, tool_calls=[{"id": "c", "type": "function",
                                                                        "function": {"name": "lookup",
                                                                                     "arguments": calls}}])
        else:
            db.append_message(f"s{i}", "user", text)
    with db.transaction() as txn:  # index the queued rows now, as the handle's next batch would
        fts.index_batch(txn.conn)
    c = sqlite3.connect(db.db_path)
    yield c
    c.close()


@pytest.mark.parametrize("query", QUERIES)
def test_a_copy_of_the_rows_gives_the_index_s_own_snippets(conn, query):
    expected = dict(conn.execute(f"SELECT rowid, snippet({fts.WORD}, -1, '>>>', '<<<', '...', 16) "
                                 f"FROM {fts.WORD} WHERE {fts.WORD} MATCH ?", (query,)))
    rows = conn.execute(f"SELECT rowid, content, tool_name, tool_calls FROM {fts.WORD}").fetchall()
    assert highlight.fts_snippets(rows, query, 3) == expected
    assert (query == "zebraquux") == (not expected)


def test_a_refused_expression_gives_no_snippet_and_leaves_nothing_behind(conn):
    rows = conn.execute(f"SELECT rowid, content, tool_name, tool_calls FROM {fts.WORD}").fetchall()
    assert highlight.fts_snippets(rows, '"unbalanced', 3) == {}
    scratch = highlight.scratch_conn()
    assert not scratch.in_transaction
    assert scratch.execute("SELECT COUNT(*) FROM hits3").fetchone()[0] == 0
    assert highlight.fts_snippets(rows, "fox", 3)  # still usable afterwards


def test_each_thread_has_its_own_copy(conn):
    rows = conn.execute(f"SELECT rowid, content, tool_name, tool_calls FROM {fts.WORD}").fetchall()
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(highlight.fts_snippets(rows, "deja", 3))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4 and all(s == seen[0] and s for s in seen)


def test_search_snippets_equal_the_index_s_own(db, conn):
    for query in QUERIES:
        expected = dict(conn.execute(f"SELECT rowid, snippet({fts.WORD}, -1, '>>>', '<<<', '...', 16) "
                                     f"FROM {fts.WORD} WHERE {fts.WORD} MATCH ?", (_sanitize_fts5_query(query),)))
        assert expected or query == "zebraquux"
        for hit in db.search_messages(query):
            if hit["id"] in expected:
                assert hit["snippet"] == expected[hit["id"]], query


def test_reasoning_snippets_equal_the_index_s_own(db, index_queue):
    db.create_session("r", "cli")
    row = db.append_message("r", "assistant", "done", reasoning="first I think about the walrus, then about tea")
    index_queue(db)
    with sqlite3.connect(db.db_path) as c:
        expected = c.execute(f"SELECT snippet({fts.REASONING}, -1, '>>>', '<<<', '...', 16) FROM {fts.REASONING} "
                             f"WHERE {fts.REASONING} MATCH 'walrus'").fetchone()[0]
    hits = db.search_messages("walrus", include_reasoning=True)
    assert [(h["id"], h["snippet"]) for h in hits] == [(row, expected)]



def test_a_long_row_gets_a_window_and_a_short_one_the_index_s_own_snippet(db, index_queue):
    db.create_session("s", "cli")
    filler = "alpha beta gamma delta " * 100  # 2,300 characters
    short = db.append_message("s", "tool", filler + "the walrus sings " + filler[:1000], tool_call_id="c")
    long = db.append_message("s", "tool", filler + "the walrus sings " + filler, tool_call_id="d")  # 4,617
    index_queue(db)
    with sqlite3.connect(db.db_path) as c:
        expected = c.execute(f"SELECT snippet({fts.WORD}, -1, '>>>', '<<<', '...', 16) FROM {fts.WORD} "
                             f"WHERE {fts.WORD} MATCH 'walrus' AND rowid = ?", (short,)).fetchone()[0]
    snippets = {h["id"]: h["snippet"] for h in db.search_messages("walrus")}
    assert snippets[short] == expected
    assert snippets[long] != expected  # the index's snippet() would cut 16 tokens; the window is wider
    assert ">>>walrus<<<" in snippets[long] and snippets[long].startswith("...") and snippets[long].endswith("...")
    assert len(snippets[long]) < 300

# --- the ranking window and selective filters ----------------------------------------------------

@pytest.fixture
def old_discord_rows(db, monkeypatch, index_queue):
    """Six discord rows under 40 newer cli rows (indexed), with a ranking window of 3 and a filtered pool of 4."""
    import hermes_state_search as search
    monkeypatch.setattr(search, "RANK_WINDOW", 3)
    monkeypatch.setattr(search, "FILTERED_POOL", 4)
    db.create_session("d", "discord")
    db.create_session("c", "cli")
    old = [db.append_message("d", "user", f"common term {'pad ' * i}") for i in range(6)]
    for i in range(40):
        db.append_message("c", "user", f"common term {'pad ' * (i % 5)}")
    index_queue(db)
    return old


def test_a_selective_filter_reaches_back_past_the_window(db, old_discord_rows):
    hits = db.search_messages("common", source_filter=["discord"])
    assert sorted(h["id"] for h in hits) == old_discord_rows
    assert [h["id"] for h in hits][0] == old_discord_rows[0]  # bm25: the shortest row ranks first
    assert len(db.search_messages("common", source_filter=["discord"], limit=2)) == 2


def test_filtered_pages_within_the_pool_are_disjoint(db, old_discord_rows):
    pages = [db.search_messages("common", source_filter=["discord"], limit=2, offset=o) for o in (0, 2)]
    got = [h["id"] for page in pages for h in page]
    assert len(got) == len(set(got)) == 4 and set(got) <= set(old_discord_rows)


# --- one session's in-word hits: read row by row or through the substring index, the same rows ---

@pytest.mark.parametrize("query", ["docker", "ockerfil", "compose", "docker NOT compose", "ocker ompos"])
def test_a_session_s_rows_are_found_alike_by_reading_them_or_by_the_substring_index(db, monkeypatch, query):
    import hermes_state_search as search
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    texts = ["docker compose up", "the dockerfile builds", "redockerize compose", "plain words", "DOCKERFILE caps"]
    for i in range(30):
        db.append_message("s" if i % 3 else "t", "tool" if i % 4 == 0 else "user", texts[i % 5])
    answers = []
    for rows in (0, 10 ** 9):  # never read row by row; always
        monkeypatch.setattr(search, "DIRECT_SCAN_ROWS", rows)
        answers.append([(h["id"], h["snippet"]) for h in db.search_messages(query, session_id="s", limit=50)])
    assert answers[0] == answers[1] and answers[0]


# --- ranking the index alone, then dropping archived rows: the joined ranking's rows, in its order ---

@pytest.mark.parametrize("spare", [0, 1, 3, 50])
def test_archived_rows_among_the_best_leave_the_ranking_of_the_live_ones_unchanged(db, monkeypatch, spare, index_queue):
    import hermes_state_search as search
    monkeypatch.setattr(search, "SPARE_RANKED", spare)
    db.create_session("s", "cli")
    ids = [db.append_message("s", "user", "common term " + "pad " * (i % 9)) for i in range(40)]
    index_queue(db)
    with sqlite3.connect(db.db_path) as c:
        c.execute("UPDATE messages SET active = 0 WHERE id IN (SELECT value FROM json_each(?))",
                  (json.dumps([i for i in ids if (i % 9) < 3 or i % 4 == 0]),))  # most of the shortest rows
        expected = [r[0] for r in c.execute(
            f"SELECT f.rowid FROM {fts.WORD} f JOIN messages m ON m.id = f.rowid WHERE {fts.WORD} MATCH 'common' "
            f"AND m.active = 1 ORDER BY bm25({fts.WORD}), f.rowid DESC LIMIT 7")]
    assert [h["id"] for h in db.search_messages("common", limit=7)] == expected
    assert len(db.search_messages("common", limit=7, include_inactive=True)) == 7


@pytest.mark.parametrize("window, pool", [(3, 4), (10, 4), (10, 30), (100, 4)])
@pytest.mark.parametrize("filters", [{}, {"source_filter": ["discord"]}, {"source_filter": ["cli"]},
                                     {"role_filter": ["assistant"]}])
def test_the_ranked_rows_are_the_best_of_the_documented_window(db, monkeypatch, window, pool, filters, index_queue):
    # The window: the newest `window` matches, reaching back to hold the newest max(need, pool)
    # rows passing the filters; its passing rows in bm25 order, newest first among equals.
    import hermes_state_search as search
    monkeypatch.setattr(search, "RANK_WINDOW", window)
    monkeypatch.setattr(search, "FILTERED_POOL", pool)
    db.create_session("d", "discord")
    db.create_session("c", "cli")
    for i in range(60):
        db.append_message("d" if i % 7 == 0 else "c", "assistant" if i % 5 == 0 else "user",
                          "common term " + "pad " * ((i * 7) % 11))
    index_queue(db)
    assert_documented_window(db, "common", "common", filters, window, pool)
