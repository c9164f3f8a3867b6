"""Search finds everything once seen: substrings of every role's text, tool output included."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_search as search
from hermes_state import SessionDB


@pytest.fixture
def planted(db, monkeypatch, index_queue):
    """Old sessions holding identifiers in every role, under newer filler the scan would stop at (all indexed)."""
    monkeypatch.setattr(search, "LIKE_SCAN_ROWS", 20)  # any scan limit must not matter for indexed pieces
    ids = {}
    db.create_session("old", "cli")
    ids["user"] = db.append_message("old", "user", "order QX7731-ZEBRA arrived damaged")
    ids["assistant"] = db.append_message("old", "assistant", "", tool_calls=[{"id": "c1", "type": "function", "function": {
        "name": "lookup_order", "arguments": '{"ref": "Kf93hzq-11"}'}}])
    ids["tool"] = db.append_message("old", "tool", "Traceback...\nE_SOCKET_4471: upstream refused\n" + "log " * 3000,
                                    tool_call_id="c1", tool_name="lookup_order")
    ids["cjk_tool"] = db.append_message("old", "tool", "結果: 検索インデックスの再構築が完了しました", tool_call_id="c1")
    db.create_session("new", "cli")
    for i in range(120):
        db.append_message("new", "user" if i % 2 else "tool", f"filler message number {i} about nothing", tool_call_id="x")
    index_queue(db)
    return ids


@pytest.mark.parametrize("piece,role", [("7731-ZEB", "user"), ("f93hzq", "assistant"), ("SOCKET_44", "tool"),
                                        ("pstrea", "tool"), ("インデックスの再", "cjk_tool")])
def test_a_piece_from_inside_a_word_is_found_in_every_role(db, planted, piece, role):
    hits = db.search_messages(piece)
    assert planted[role] in [h["id"] for h in hits]
    assert hits.complete is True
    hit = next(h for h in hits if h["id"] == planted[role])
    assert f">>>{piece}<<<".lower() in hit["snippet"].lower()


def test_a_piece_of_a_tool_name_is_found(db, planted):
    assert {planted["tool"], planted["cjk_tool"]} & {h["id"] for h in db.search_messages("kup_ord")} == {planted["tool"]}


def test_a_substring_is_found_right_after_the_append(db):
    db.create_session("s", "cli")
    row = db.append_message("s", "tool", "checksum 9f86d081884c7d65", tool_call_id="c")
    assert [h["id"] for h in db.search_messages("6d08188")] == [row]


def test_wildcard_characters_in_a_piece_match_literally(db):
    db.create_session("s", "cli")
    exact = db.append_message("s", "tool", "disk at 95%_full on /dev/sda1", tool_call_id="c")
    db.append_message("s", "tool", "disk at 95X-full elsewhere", tool_call_id="c")
    # No word matches "5%_fu" (words 5 and fu), so the substring index answers, literally.
    assert [h["id"] for h in db.search_messages("5%_fu")] == [exact]
    assert [h["id"] for h in db.search_messages("95%_f")] == [exact]
    # Quoted, the words must be whole: "95" and "full" are, "t" (of "at") is not.
    assert [h["id"] for h in db.search_messages('"95%_full"')] == [exact]
    assert db.search_messages('"t 95%_"') == []


def test_patterns_that_crash_sqlites_trigram_like_are_never_sent_to_it(tmp_path):
    # '구%*京}]' as a LIKE pattern on a detail=none trigram table crashes SQLite 3.40's FTS5.
    script = (
        "import sys; from hermes_state import SessionDB\n"
        "db = SessionDB(sys.argv[1]); db.create_session('s', 'cli')\n"
        "db.append_message('s', 'user', 'alpha beta 東京都 구글')\n"
        "for q in ['구%*京}]', '%O구%*京}]%', 'O구_x京', '東_京都%', '구글%%%京']:\n"
        "    db.search_messages(q)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "c.db")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_query_no_index_serves_says_when_its_scan_stopped_early(db, monkeypatch):
    monkeypatch.setattr(search, "LIKE_SCAN_ROWS", 10)
    db.create_session("s", "cli")
    old = db.append_message("s", "user", "old abqzcd mention")
    for i in range(30):
        db.append_message("s", "user", f"filler {i}")
    partial = db.search_messages("qz")  # two letters inside a word: no index can serve them
    assert partial.complete is False and partial == []
    db.append_message("s", "user", "new xxqzyy mention")
    assert db.search_messages("qz", limit=1).complete is True  # the newest hit fills the page: exact
    monkeypatch.setattr(search, "LIKE_SCAN_ROWS", 1000)
    full = db.search_messages("qz")
    assert full.complete is True and old in [h["id"] for h in full]


_WORDS = st.text(alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Lo")), min_size=4, max_size=12)


@settings(max_examples=40, deadline=None)
@given(words=st.lists(_WORDS, min_size=1, max_size=6), role=st.sampled_from(["user", "assistant", "tool"]),
       data=st.data())
def test_any_piece_of_inserted_text_is_found(tmp_path_factory, words, role, data):
    text = " ".join(words)
    start = data.draw(st.integers(0, len(text) - 3))
    piece = text[start:start + data.draw(st.integers(3, min(12, len(text) - start)))]
    if piece.strip() != piece or len(piece.strip()) < 3:
        return
    with SessionDB(tmp_path_factory.mktemp("p") / "state.db") as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "unrelated filler text")
        row = db.append_message("s", role, text, tool_call_id="c" if role == "tool" else None)
        found = db.search_messages(piece, limit=50)
        assert row in [h["id"] for h in found], (text, piece)
