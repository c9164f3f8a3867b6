"""Highlighting in text windows: case-insensitive on the original text, accents folded like unicode61."""
from __future__ import annotations

from hermes_state_highlight import first_match, text_snippet


def test_text_snippet_highlights_when_lowercasing_changes_the_length():
    assert text_snippet("İİİ docker 東京", ["DOCKER"]) == "İİİ >>>docker<<< 東京"
    assert text_snippet("İstanbul ve İzmir", ["izmir", "İSTANBUL"]) == ">>>İstanbul<<< ve >>>İzmir<<<"
    assert text_snippet("東京都の東京", ["東京", "東京都"]) == ">>>東京都<<<の>>>東京<<<"
    assert text_snippet("a.b a+b", ["a+b"]) == "a.b >>>a+b<<<"


def test_accents_fold_both_ways_as_the_word_index_does():
    assert text_snippet('{"q": "Déjà vu"}', ["deja"]) == '{"q": ">>>Déjà<<< vu"}'
    assert text_snippet("plain deja vu", ["DÉJÀ"]) == "plain >>>deja<<< vu"
    assert first_match("x" * 50 + " Ñandú", ["nandu"]) == 51
    assert first_match("ascii only", ["déjà"]) == -1 and first_match("東京 deja", ["déjà"]) == 3
