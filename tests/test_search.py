"""search_messages (R-SEARCH-1..4): what people type is found, nothing raises; the parser is in test_query."""
from __future__ import annotations

import logging
import re
import sqlite3
import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import hermes_state_fts as fts
import hermes_state_search as search
from hermes_state import SessionDB

FIELDS = {"id", "session_id", "role", "timestamp", "tool_name", "snippet", "context", "source", "model",
          "session_started", "title"}

# (query, text of the message it must find). Every example of issue #4.
EXAMPLES = [
    ("東京", "明日は東京へ行きます"),
    ("项目", "这个项目的进度怎么样"),
    ("구글", "구글에서 검색해 보세요"),
    ("検索", "全文検索の設定"),
    ("東", "東へ"),                                   # one CJK character
    ("iPhone16", "昨日iPhone16を買った"),              # Latin glued to CJK
    ("iPhone16を", "昨日iPhone16を買った"),
    ("#123", "see issue #123 for details"),
    ("src/main.py", "the traceback points at src/main.py line 40"),
    ("alice@example.com", "mail alice@example.com about it"),
    ("50%", "the upload is at 50% now"),
    ("don't", "I don't think so"),
    ("chat-send", "the chat-send handler failed"),
    ("Jean-Luc", "Jean-Luc Picard approved"),
    ("my-app.config.ts", "edit my-app.config.ts first"),
    ("snake_case_name", "rename snake_case_name please"),
]


@pytest.fixture
def corpus(db):
    """A handle with one session holding every example and some filler; returns {text: id}."""
    db.create_session("s", "cli", model="m-1")
    db.create_session("t", "telegram", model="m-2")
    ids = {}
    for index, (_, text) in enumerate(EXAMPLES):
        ids[text] = db.append_message("s" if index % 2 else "t", "user" if index % 3 else "assistant", text)
        db.append_message("s" if index % 2 else "t", "tool", f"filler output {index}", tool_name="terminal")
    return ids


@pytest.mark.parametrize("query,text", EXAMPLES, ids=[q for q, _ in EXAMPLES])
def test_every_example_from_the_issue_is_found(db, corpus, query, text):
    hits = db.search_messages(query)
    assert corpus[text] in [h["id"] for h in hits]
    hit = next(h for h in hits if h["id"] == corpus[text])
    assert ">>>" in hit["snippet"] and "<<<" in hit["snippet"]


def test_examples_are_found_in_tool_output_too(db):
    db.create_session("s", "cli")
    rows = {q: db.append_message("s", "tool", f"log: {text}", tool_name="terminal") for q, text in EXAMPLES}
    for query, _ in EXAMPLES:
        assert rows[query] in [h["id"] for h in db.search_messages(query)], query


def test_or_of_short_cjk_terms(db, corpus):
    hits = {h["id"] for h in db.search_messages("東京 OR 项目 OR 구글")}
    assert {corpus["明日は東京へ行きます"], corpus["这个项目的进度怎么样"], corpus["구글에서 검색해 보세요"]} <= hits
    mixed = {h["id"] for h in db.search_messages("東京 OR chat-send")}
    assert {corpus["明日は東京へ行きます"], corpus["the chat-send handler failed"]} <= mixed


def _ids(db, query, **filters):
    return {h["id"] for h in db.search_messages(query, limit=100, **filters)}


@pytest.fixture
def mixed(db, index_queue):
    """Messages mixing CJK with Latin, Thai and tool names, indexed; returns {name: id}."""
    db.create_session("s", "cli")
    rows = {"dockerfile": db.append_message("s", "user", "東京 dockerfile build"),
            "thai": db.append_message("s", "user", "東京 ภาษาไทย"),
            "thai_only": db.append_message("s", "user", "ภาษาไทย only"),
            "tool": db.append_message("s", "tool", "検索結果", tool_name="web_search"),
            "docker": db.append_message("s", "user", "docker only"),
            "osaka": db.append_message("s", "user", "docker in 大阪"),
            "tokyo": db.append_message("s", "assistant", "docker in 東京"),
            "glued": db.append_message("s", "assistant", "docker東京")}
    index_queue(db)
    return rows


@pytest.mark.parametrize("query,names", [
    ("東京 dockerf", {"dockerfile"}),             # a Latin prefix, as "dockerf" alone finds it
    ("東京 ockerfil", {"dockerfile"}),            # a Latin substring (trigram for a Latin-only query)
    ("ockerfil 東京", {"dockerfile"}),
    ("東京 ไทย", {"thai"}),                       # Thai inside an unsegmented unicode61 token
    ("web_search 検索", {"tool"}),                # the Latin term is the tool name
    ("東京 OR ไทย", {"dockerfile", "thai", "thai_only", "tokyo", "glued"}),
    # whole words first, then "docker" inside "dockerfile" (a piece seen anywhere is found)
    ("docker OR ไทย", {"docker", "osaka", "tokyo", "glued", "thai", "thai_only", "dockerfile"}),
    ("東京 docker", {"tokyo", "glued"}),           # exact words found: no substring fallback, like "docker"
])
def test_mixed_and_or_queries_fall_back_like_latin_ones(db, mixed, query, names):
    assert _ids(db, query) == {mixed[n] for n in names}


def test_a_mixed_query_finds_substrings_older_than_the_like_scan(db, mixed, monkeypatch):
    monkeypatch.setattr(search, "LIKE_SCAN_ROWS", 2)  # the LIKE scan sees the newest 2 rows only
    for i in range(5):
        db.append_message("s", "user", f"filler {i}")
    assert _ids(db, "東京 ockerfil") == {mixed["dockerfile"]}
    assert _ids(db, "web_search 検索", role_filter=["tool"]) == {mixed["tool"]}
    assert _ids(db, "web_search 検索", role_filter=["user"]) == set()
    (hit,) = db.search_messages("東京 ockerfil")
    assert hit["snippet"] == ">>>東京<<< d>>>ockerfil<<<e build"


def test_not_with_a_cjk_term_keeps_rows_without_cjk(db, mixed):
    assert _ids(db, "docker NOT 東京") == {mixed["docker"], mixed["osaka"]}
    assert _ids(db, "docker NOT 大阪 NOT 東京") == {mixed["docker"]}
    assert _ids(db, "ไทย NOT 東京") == {mixed["thai_only"]}
    assert _ids(db, "docker NOT 東京 OR 検索") == {mixed["docker"], mixed["osaka"], mixed["tool"]}
    assert _ids(db, "東京 NOT build") == {mixed["thai"], mixed["tokyo"], mixed["glued"]}  # Latin NOT: a word


def test_not_excludes_the_one_term_after_it_on_every_route(db):
    db.create_session("s", "cli")
    both = db.append_message("s", "user", "alpha beta gamma")
    no_gamma = db.append_message("s", "user", "alpha beta")
    for text in ("beta gamma", "alpha gamma", "alpha only"):
        db.append_message("s", "user", text)
    # FTS5 alone reads "alpha NOT gamma beta" as "alpha NOT (gamma beta)": the last two would match.
    assert _ids(db, "alpha NOT gamma beta") == {no_gamma}
    assert _ids(db, "lph NOT amm eta") == {no_gamma}            # trigram
    assert _ids(db, "al NOT ga be") == {no_gamma}               # LIKE
    assert _ids(db, "alpha beta") == {both, no_gamma}


def test_operator_words_alone_are_searched_as_words(db):
    db.create_session("s", "cli")
    row = db.append_message("s", "user", "salt and pepper, not or")
    for query in ("AND", "OR", "NOT", "OR NOT", '"AND"'):
        assert _ids(db, query) == {row}, query


def test_symbol_only_queries_use_the_like_scan(db):
    db.create_session("s", "cli")
    party = db.append_message("s", "user", "release done 🎉")
    family = db.append_message("s", "user", "family 👨\u200d👩\u200d👧")
    db.append_message("s", "user", "nothing here")
    assert _ids(db, "🎉") == {party}
    assert _ids(db, "🎉 OR 👨\u200d👩\u200d👧") == {party, family}
    assert _ids(db, "🎉 NOT 🎉") == set()
    (hit,) = db.search_messages("🎉")
    assert hit["snippet"] == "release done >>>🎉<<<"
    assert db.search_messages("\u200b") == [] and db.search_messages(" \ufeff ") == []


def test_zero_width_characters_in_a_query_are_ignored(db):
    db.create_session("s", "cli")
    tokyo = db.append_message("s", "user", "東京タワー")
    word = db.append_message("s", "user", "kubernetes cluster")
    assert _ids(db, "東\u200b京") == {tokyo}
    assert _ids(db, "東京\u200dタワー") == {tokyo}
    assert _ids(db, "kuber\u200bnetes") == {word}
    assert _ids(db, "\ufeffkubernetes") == {word}


def test_cjk_phrases_match_substrings_not_scattered_characters(db):
    db.create_session("s", "cli")
    together = db.append_message("s", "user", "東京都庁")
    db.append_message("s", "user", "京都と東の都")  # every character, never "東京都" in a row
    assert [h["id"] for h in db.search_messages("東京都")] == [together]
    assert [h["id"] for h in db.search_messages("都東京")] == []
    assert [h["id"] for h in db.search_messages("都庁")] == [together]


def test_a_hit_carries_every_field_with_context(db):
    db.create_session("s", "cli", model="gpt-x")
    first = db.append_message("s", "user", "x" * 300)
    hit_id = db.append_message("s", "assistant", "the answer mentions kubernetes")
    last = db.append_message("s", "tool", "tool says hi", tool_name="terminal")
    (hit,) = db.search_messages("kubernetes")
    assert set(hit) == FIELDS
    session = db.get_session("s")
    assert (hit["id"], hit["session_id"], hit["role"], hit["tool_name"]) == (hit_id, "s", "assistant", None)
    assert (hit["source"], hit["model"], hit["session_started"]) == ("cli", "gpt-x", session["started_at"])
    assert hit["snippet"] == "the answer mentions >>>kubernetes<<<"
    assert hit["context"] == [{"id": first, "role": "user", "content": "x" * 200},
                              {"id": hit_id, "role": "assistant", "content": "the answer mentions kubernetes"},
                              {"id": last, "role": "tool", "content": "tool says hi"}]
    (edge,) = db.search_messages("hi")
    assert [c["id"] for c in edge["context"]] == [hit_id, last]  # the last message has no next one


def test_context_rows_come_from_one_query_for_all_hits(db):
    db.create_session("s", "cli")
    for i in range(15):
        db.append_message("s", "user", f"needle number {i}")
        db.append_message("s", "assistant", f"reply {i}")
    counts = {}
    db.search_messages("needle")  # a connection's first FTS5 use reads the index's config once
    for limit in (1, 15):
        with db.tracer() as traced:
            hits = db.search_messages("needle", limit=limit)
        assert len(hits) == limit and all(len(h["context"]) in (2, 3) for h in hits)
        counts[limit] = len([s for s in traced if not s.startswith("--")])  # "--": inside FTS5 itself
    assert counts[1] == counts[15]  # the statement count does not grow with the hits


def test_best_match_first(db):
    db.create_session("s", "cli")
    weak = db.append_message("s", "user", "docker and many other words that dilute the single mention here")
    strong = db.append_message("s", "user", "docker docker docker")
    assert [h["id"] for h in db.search_messages("docker")] == [strong, weak]


def test_archived_generations_only_when_asked(db, rival):
    db.create_session("s", "cli")
    old = db.append_message("s", "user", "archived 会話 row")
    live = db.append_message("s", "user", "live 会話 row")
    rival.execute("UPDATE messages SET active = 0 WHERE id = ?", (old,))
    for query in ("row", "会話", "rchiv", "ive r"):
        assert old not in [h["id"] for h in db.search_messages(query)], query
    assert {h["id"] for h in db.search_messages("会話", include_inactive=True)} == {old, live}
    assert [h["id"] for h in db.search_messages("archived", include_inactive=True)] == [old]


@pytest.mark.parametrize("query", ["deploy", "配置", "eploymen", "pl"], ids=["word", "cjk", "trigram", "like"])
def test_filters_combine_with_every_route(db, query):
    db.create_session("c", "cli")
    db.create_session("t", "telegram")
    db.create_session("d", "discord")
    rows = {}
    for sid in ("c", "t", "d"):
        for role in ("user", "assistant"):
            rows[sid, role] = db.append_message(sid, role, f"deployment 配置 {sid} {role}")

    def found(**filters):
        return {key for key, value in rows.items() if value in {h["id"] for h in db.search_messages(query, **filters)}}

    assert found() == set(rows)
    assert found(source_filter=["cli"]) == {("c", "user"), ("c", "assistant")}
    assert found(exclude_sources=["telegram", "discord"]) == {("c", "user"), ("c", "assistant")}
    assert found(role_filter=["user"]) == {("c", "user"), ("t", "user"), ("d", "user")}
    assert found(session_id="t") == {("t", "user"), ("t", "assistant")}
    assert found(session_id="t", role_filter=["assistant"], source_filter=["telegram"]) == {("t", "assistant")}
    assert found(session_id="nope") == set()


def test_pagination_is_disjoint_and_complete(db, monkeypatch):
    monkeypatch.setattr(search, "RANK_WINDOW", 3)  # force the ranking window to grow
    db.create_session("s", "cli")
    db.create_session("t", "discord")
    want = {db.append_message("s" if i % 5 else "t", "user", f"common term {'pad ' * (i % 7)}") for i in range(40)}
    pages = [db.search_messages("common", limit=7, offset=o) for o in range(0, 42, 7)]
    got = [h["id"] for page in pages for h in page]
    assert len(got) == len(set(got)) == 40 and set(got) == want
    assert len(db.search_messages("common", source_filter=["discord"], limit=50)) == 8
    assert db.search_messages("common", limit=0) == []


@pytest.fixture
def words_and_pieces(db, index_queue):
    """Rows with `docker` as a word and rows with it only inside a longer word, in both sessions (indexed)."""
    db.create_session("s", "cli")
    db.create_session("t", "discord")
    rows = {}
    for i in range(12):
        text = ["docker compose up", "the dockerfile builds", "docker 東京 again", "redockerize compose",
                "plain words only"][i % 5]
        rows[db.append_message("s" if i % 3 else "t", "tool" if i % 4 == 0 else "user", text)] = text
    index_queue(db)
    return rows


def test_the_in_word_pass_runs_only_when_the_page_has_room_for_its_rows(db, words_and_pieces):
    whole = [i for i, text in words_and_pieces.items() if "docker " in text]
    inside = sorted((i for i, text in words_and_pieces.items() if "docker" in text and i not in whole), reverse=True)
    with db.tracer() as full_page:
        assert {h["id"] for h in db.search_messages("docker", limit=len(whole))} == set(whole)
    assert not any("messages_fts_trigram MATCH" in sql for sql in full_page)  # whole words filled the page
    with db.tracer() as room:
        hits = [h["id"] for h in db.search_messages("docker", limit=len(whole) + 2)]
    assert any("messages_fts_trigram MATCH" in sql for sql in room)
    assert set(hits[:len(whole)]) == set(whole) and hits[len(whole):] == inside[:2]  # newest in-word rows next


@pytest.mark.parametrize("query,filters", [("docker", {}), ("docker compose", {}), ("docker OR compose", {}),
                                           ("docker", {"role_filter": ["user"]}), ("docker", {"source_filter": ["cli"]}),
                                           ("ocker", {}), ("docker NOT 東京", {})])
def test_every_page_is_the_same_slice_of_the_whole_answer(db, words_and_pieces, query, filters):
    everything = [h["id"] for h in db.search_messages(query, limit=100, **filters)]
    assert everything
    for limit in (1, 2, 3, 5):
        for offset in range(0, len(everything) + 1):
            page = [h["id"] for h in db.search_messages(query, limit=limit, offset=offset, **filters)]
            assert page == everything[offset:offset + limit], (limit, offset)


@pytest.mark.parametrize("bad", [{"limit": -1}, {"offset": -5}, {"limit": "10"}, {"limit": True},
                                 {"role_filter": 3}, {"source_filter": [1]}, {"session_id": 7}])
def test_bad_paging_or_filters_raise_value_error(db, bad):
    with pytest.raises(ValueError):
        db.search_messages("x", **bad)


def test_search_while_a_rebuild_runs_finds_rows_not_indexed_yet(tmp_path, monkeypatch):
    monkeypatch.setattr(SessionDB, "fts_rebuild_in_background", False)
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        rows = [db.append_message("s", "user", f"rebuild{i} 再構築") for i in range(10)]
        with db.transaction() as txn:
            fts.start_rebuild(txn.conn)
            fts.rebuild_step(txn.conn, 4)
        assert db.fts_rebuild_status()["pending"] == 6
        for i in (1, 8):
            assert [h["id"] for h in db.search_messages(f"rebuild{i}")] == [rows[i]]
        assert {h["id"] for h in db.search_messages("再構築", limit=50)} == set(rows)


def test_a_read_only_handle_on_a_database_without_fts_degrades_and_says_so(tmp_path, caplog):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        latin = db.append_message("s", "user", "hello there")
        cjk = db.append_message("s", "user", "東京タワー")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP VIEW messages_fts_trigram_source")
    for name in fts.FTS_TABLES:
        conn.execute(f"DROP TABLE {name}")
    conn.close()
    search.warned.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_state"), SessionDB(path, read_only=True) as ro:
        assert [h["id"] for h in ro.search_messages("hello")] == [latin]
        assert [h["id"] for h in ro.search_messages("東京")] == [cjk]
        assert ro.search_messages("東京")[0]["snippet"] == ">>>東京<<<タワー"
        assert ro.fts_rebuild_status()["pending"] == 2
    assert "CJK index is missing" in caplog.text


def test_cjk_falls_back_to_trigram_when_the_cjk_index_is_missing(tmp_path, caplog):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        row = db.append_message("s", "user", "東京タワー")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE messages_fts_cjk")
    conn.close()
    search.warned.clear()
    with caplog.at_level(logging.WARNING, logger="hermes_state"), SessionDB(path, read_only=True) as ro:
        (hit,) = ro.search_messages("東京タ")
        assert hit["id"] == row and hit["snippet"] == ">>>東京タ<<<ワー"  # trigram's own snippet
        assert [h["id"] for h in ro.search_messages("東京")] == [row]  # 2 characters: bounded LIKE
    assert "trigram" in caplog.text


# --- any input, on a real handle ---------------------------------------------------------------------

_NASTY = st.text(alphabet=st.sampled_from(list('ab 東京구글"*^:()-+.,/_@#%\'\\\x00AND OR NOT NEAR{}[]🎉\u200b\u200d')),
                 max_size=40)
_ANY = st.one_of(st.text(max_size=60), _NASTY)


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory):
    handle = SessionDB(tmp_path_factory.mktemp("fuzz") / "state.db")
    handle.create_session("s", "cli")
    handle.append_message("s", "user", "alpha beta 東京都 chat-send x")
    yield handle
    handle.close()


@settings(max_examples=300, deadline=None)
@given(query=_ANY, role=st.sampled_from([None, ["user"]]), inactive=st.booleans())
def test_search_never_raises_on_any_text(shared_db, query, role, inactive):
    for hit in shared_db.search_messages(query, role_filter=role, include_inactive=inactive):
        assert set(hit) == FIELDS


# --- R-SEARCH-4: a random word inserted is found ---------------------------------------------------

_LATIN = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=3, max_size=10)
_CJK_TEXT = st.text(alphabet=st.sampled_from(list("東京都検索日本語全文会話記录项目数据库구글검색결과")), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(word=_LATIN, before=st.lists(_LATIN, max_size=4), after=st.lists(_LATIN, max_size=4),
       role=st.sampled_from(["user", "assistant", "tool"]))
def test_a_random_latin_word_is_found(shared_db, word, before, after, role):
    row = shared_db.append_message("s", role, " ".join([*before, word.upper(), *after]))
    assert row in [h["id"] for h in shared_db.search_messages(word, session_id="s", limit=1000)]


@settings(max_examples=80, deadline=None)
@given(text=_CJK_TEXT, data=st.data(), latin=st.sampled_from(["", "abc", "v2 "]),
       role=st.sampled_from(["user", "tool"]))
def test_a_random_cjk_substring_is_found(shared_db, text, data, latin, role):
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, min(len(text), start + 4)))
    assume(text[start:end].strip())
    row = shared_db.append_message("s", role, f"前置き{latin}{text}。")
    hits = shared_db.search_messages(text[start:end], session_id="s", limit=1000)
    assert row in [h["id"] for h in hits]


# --- reasoning, tool-call snippets, titles ---------------------------------------------------------

def test_reasoning_is_searched_when_asked(db, rival):
    db.create_session("s", "cli")
    db.set_session_title("s", "Weather bot")
    plain = db.append_message("s", "user", "what about the zanzibar forecast")
    thought = db.append_message("s", "assistant", "Sunny.", reasoning_content="Check the zanzibar config first.",
                                reasoning="Raw: gather monsoon data")
    cjk = db.append_message("s", "assistant", "晴れ", reasoning_content="東京の天気を調べる")
    assert [h["id"] for h in db.search_messages("zanzibar")] == [plain]  # reasoning stays out by default
    assert db.search_messages("monsoon") == [] and db.search_messages("東京") == []
    hits = {h["id"]: h for h in db.search_messages("zanzibar", include_reasoning=True)}
    assert set(hits) == {plain, thought}
    assert ">>>zanzibar<<<" in hits[thought]["snippet"] and "config" in hits[thought]["snippet"]
    assert [h["id"] for h in db.search_messages("monsoon", include_reasoning=True)] == [thought]
    (hit,) = db.search_messages("東京", include_reasoning=True)
    assert hit["id"] == cjk and ">>>東京<<<" in hit["snippet"] and hit["title"] == "Weather bot"
    # Rewrites reach the index: the old reasoning is gone, the new one is found.
    db.replace_messages("s", [{"role": "assistant", "content": "x", "reasoning_content": "a typhoon plan"}])
    assert db.search_messages("zanzibar", include_reasoning=True) == []
    assert len(db.search_messages("typhoon", include_reasoning=True)) == 1
    rival.execute(f"INSERT INTO {fts.REASONING}({fts.REASONING}) VALUES ('integrity-check')")


def test_an_index_without_reasoning_is_rebuilt_and_finds_old_reasoning(tmp_path):
    path = tmp_path / "old.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        row = db.append_message("s", "assistant", "ok", reasoning="the quasar hypothesis")
    raw = sqlite3.connect(path, isolation_level=None)
    for kind, name in (("TRIGGER", "messages_fts_reasoning_update"), ("TABLE", fts.REASONING),
                       ("VIEW", "messages_fts_reasoning_source")):
        raw.execute(f"DROP {kind} {name}")
    raw.close()
    with SessionDB(path) as db:  # an older layout: the declared objects differ, so they are rebuilt
        db.rebuild_fts()
        assert [h["id"] for h in db.search_messages("quasar", include_reasoning=True)] == [row]


@pytest.mark.parametrize("indexed", [False, True])
def test_a_hit_inside_tool_calls_shows_the_match_in_its_snippet(db, index_queue, indexed):
    db.create_session("s", "cli")
    args = '{"query": "Déjà vu", "path": "/srv/' + "filler/" * 3000 + 'zebrafish.txt"}'
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": args}}
    db.append_message("s", "assistant", "検索します", tool_calls=[call])  # CJK content: two indexes find it
    if indexed:  # else the row waits in the queue: found by a scan that folds accents as the index does
        index_queue(db)
    for query, match in (("deja", "Déjà"), ("DÉJÀ", "Déjà"), ("zebrafish", "zebrafish"), ("ebrafis", "ebrafis")):
        (hit,) = db.search_messages(query)
        assert f">>>{match}<<<" in hit["snippet"], (query, hit["snippet"])


def test_every_hit_carries_its_session_title(db):
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "Fix Docker Build")
    db.append_message("a", "user", "docker compose fails")
    db.append_message("b", "user", "docker again")
    assert {h["session_id"]: h["title"] for h in db.search_messages("docker")} == {"a": "Fix Docker Build", "b": None}


def test_a_cjk_term_with_other_characters_is_matched_literally(db):
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.append_message("a", "user", "达成100%完成率")
    db.append_message("b", "user", "达成100完成率是目标")
    assert [h["session_id"] for h in db.search_messages("100%完成")] == ["a"]
    assert sorted(h["session_id"] for h in db.search_messages("完成率")) == ["a", "b"]   # letters only: both


def test_a_word_found_nowhere_is_answered_by_the_substring_index_alone(db, words_and_pieces):
    with db.tracer() as absent:
        hits = db.search_messages("qwzxvyk")
    assert list(hits) == [] and hits.complete
    assert any("messages_fts_trigram MATCH" in sql for sql in absent)
    # No LIKE scan over the newest rows: the index's empty answer covers every row.
    assert not any(sql.startswith("SELECT m.id FROM messages m") for sql in absent)


def test_a_trigram_no_row_holds_ends_the_probing(db, index_queue):
    # No row holds "cdq", so none holds the piece: the trigrams after it are never probed, and the
    # index's question is that one trigram.
    db.create_session("s", "cli")
    db.append_message("s", "user", "abc bcd cde qqz qzz and more")
    inside = db.append_message("s", "tool", "xxabcdzzqyy")
    index_queue(db)
    with db.tracer() as trace:
        hits = db.search_messages("bcdqqzz")
    assert list(hits) == [] and hits.complete
    probes = [sql.split("MATCH ")[1].split(" LIMIT")[0] for sql in trace
              if sql.startswith("SELECT COUNT(*) FROM (SELECT 1 FROM messages_fts_trigram")]
    assert probes == ["""'"bcd"'""", """'"cdq"'"""]
    (asked,) = [sql for sql in trace if sql.startswith("SELECT t.rowid FROM messages_fts_trigram t")]
    assert '"cdq"' in asked and '"qzz"' not in asked
    assert [h["id"] for h in db.search_messages("bcdzzq")] == [inside]  # every trigram held: found


@pytest.mark.parametrize("rare_below", [4, 1])
def test_the_substring_index_is_asked_for_its_rare_trigrams_only(db, index_queue, monkeypatch, rare_below):
    # With rare_below=4, "abc" (in 7 rows) is left out of the index's question and the three
    # trigrams found in 3 rows find the candidates; with 1, none is rare and all four are asked.
    monkeypatch.setattr(search, "RARE_TRIGRAM_ROWS", rare_below)
    db.create_session("s", "cli")
    for i in range(4):
        db.append_message("s", "user", f"abc filler {i}")
    inside = [db.append_message("s", "tool", "xxabcqzwxx"), db.append_message("s", "user", "see abcqzwy here")]
    db.append_message("s", "user", "abc bcq cqz qzw apart")  # every trigram, never the term
    index_queue(db)
    with db.tracer() as trace:
        hits = [h["id"] for h in db.search_messages("abcqzw")]
    assert hits == sorted(inside, reverse=True)
    (asked,) = [sql for sql in trace if sql.startswith("SELECT t.rowid FROM messages_fts_trigram t")]
    assert '"bcq" AND "cqz" AND "qzw"' in asked and ('"abc"' in asked) == (rare_below == 1)


def test_a_refused_substring_query_still_falls_back_to_the_scan(db, words_and_pieces, monkeypatch):
    monkeypatch.setattr(search, "trigram_expression", lambda texts: "AND AND")  # FTS5 refuses it
    with db.tracer() as trace:
        hits = [h["id"] for h in db.search_messages("ockeriz")]
    assert hits == sorted((i for i, text in words_and_pieces.items() if "ockeriz" in text), reverse=True)
    assert any(sql.startswith("SELECT m.id FROM messages m") for sql in trace)
    # The scan's empty answer is still an answer after the refusal.
    assert list(db.search_messages("qwzxvyk")) == []


def _payload(seed: int) -> str:
    """A base64 image payload of about 0.7 MB, as a vision tool returns it."""
    import base64
    import random
    return "data:image/png;base64," + base64.b64encode(random.Random(seed).randbytes(520_000)).decode()


def test_a_base64_payload_is_no_substring_candidate_but_its_words_are_found(db, index_queue):
    payload = _payload(3)
    assert all(g in payload.lower() for g in search.PAYLOAD_TRIGRAMS)  # the precondition the lookup relies on
    piece = next(payload[i:i + 7] for i in range(1000, 10_000) if payload[i:i + 7].isalpha())
    db.create_session("s", "cli")
    shot = db.append_message("s", "tool", payload, tool_name="vision")
    prose = db.append_message("s", "assistant", f"the checksum was x{piece}y yesterday")
    worded = db.append_message("s", "tool", "screenshot taken " + payload, tool_name="vision")
    index_queue(db)
    assert piece.lower() in payload.lower() and shot < prose < worded
    assert [h["id"] for h in db.search_messages(piece)] == [prose]  # not the two rows holding the payload
    assert [h["id"] for h in db.search_messages("screenshot")] == [worded]


IN_WORD_TEXTS = ["the kube-proxy-7f3 pod restarted", "see xkube-proxy-7f3abc in the log", "kube proxy 7f3 apart",
                 "an orange submarine protocol draft", "blood-orange submarine protocols", "orange, submarine protocol",
                 "snake_case_name stays", "unsnake_case_names here", "proxy-7f3 only", "Kube-Proxy-7F3B upper"]


@pytest.mark.parametrize("piece", ["kube-proxy-7f3", "orange submarine protocol", "snake_case_name", "-proxy-7f3",
                                   "e-proxy-7", "range submarine prot", "proxy 7f3 apart"])
def test_a_piece_holding_whole_words_finds_every_row_holding_it(db, index_queue, piece):
    db.create_session("s", "cli")
    db.create_session("t", "cli")
    ids = {db.append_message("s" if i % 2 else "t", "user", text): text for i, text in enumerate(IN_WORD_TEXTS)}
    for i in range(600):  # a range wider than one session's direct read
        db.append_message("t", "tool", f"filler {i}", tool_name="terminal")
    index_queue(db)
    def words(text: str) -> str:
        return " " + " ".join(re.findall("[a-z0-9]+", text.lower())) + " "
    quoted = " " in piece or piece.startswith("-")  # a bare leading - excludes
    # Typed bare: the rows holding it as a substring, and those holding its words in a row (the
    # word index's phrase). Quoted: its words in a row only, as whole words.
    truth = {i for i, text in ids.items()
             if words(piece) in words(text) or (not quoted and piece.lower() in text.lower())}
    query = f'"{piece}"' if quoted else piece
    with db.tracer() as trace:
        assert {h["id"] for h in db.search_messages(query, limit=50)} == truth
    if search.in_word_phrase(piece) is not None:  # candidates from the word index, not the trigrams
        assert not any("messages_fts_trigram MATCH" in sql for sql in trace)
