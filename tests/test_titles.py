"""Titles: what a stored title may hold, uniqueness, takeover along a compression chain, lookups.

Writes go through the facade; what persisted is read back from `rival`, a second connection.
"""
from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_state import SessionDB, TitleConflictError


def stored_title(rival: sqlite3.Connection, session_id: str) -> str | None:
    return rival.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()["title"]


# --- cleaning --------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, clean", [
    ("Plain title", "Plain title"),
    ("  padded  ", "padded"),
    ("many   inner \t\n spaces", "many inner spaces"),
    ("nul\x00bell\x07esc\x1b", "nulbellesc"),
    ("del\x7fchar", "delchar"),
    ("zero\u200bwidth\u200djoiner\u2060", "zerowidthjoiner"),
    ("bidi\u202eoverride\u2066isolate\u2069", "bidioverrideisolate"),
    ("\ufeffbom first", "bom first"),
    ("C1\x85control", "C1 control"),  # U+0085 is whitespace in Python: it becomes the separator
    ("東京旅行の計画 🎉", "東京旅行の計画 🎉"),
    ("Résumé — PR #438 'auth'", "Résumé — PR #438 'auth'"),
    ("lone \ud835 surrogate", "lone \ufffd surrogate"),
])
def test_sanitize_title_cleans_invisible_and_spacing(raw, clean):
    assert SessionDB.sanitize_title(raw) == clean


@pytest.mark.parametrize("raw", [None, "", "   ", "\t\n", "\x00\x01\u200b\ufeff"])
def test_nothing_visible_left_is_no_title(raw):
    assert SessionDB.sanitize_title(raw) is None


def test_the_limit_counts_the_cleaned_title():
    assert SessionDB.sanitize_title("a" * 100) == "a" * 100
    assert SessionDB.sanitize_title("  " + "a" * 100 + "\u200b\u200b ") == "a" * 100
    with pytest.raises(ValueError, match="too long"):
        SessionDB.sanitize_title("a" * 101)
    with pytest.raises(ValueError):
        SessionDB.sanitize_title(42)


@given(st.text(max_size=150))
def test_sanitize_title_is_idempotent_and_storable(raw):
    try:
        once = SessionDB.sanitize_title(raw)
    except ValueError:
        return
    assert SessionDB.sanitize_title(once) == once
    if once is not None:
        once.encode("utf-8")  # no lone surrogate survives
        assert once == once.strip() and "  " not in once and len(once) <= 100


def test_set_session_title_stores_the_cleaned_title(db, rival):
    db.create_session("s", "cli")
    assert db.set_session_title("s", "  hello\x00  world\u202e ") is True
    assert stored_title(rival, "s") == "hello world"


# --- uniqueness and takeover ----------------------------------------------------------------------

def test_a_title_held_by_an_unrelated_session_is_refused(db, rival):
    db.create_session("a", "cli", title="Shared")
    db.create_session("b", "cli")
    with pytest.raises(TitleConflictError, match="already in use") as info:
        db.set_session_title("b", "Shared")
    assert isinstance(info.value, ValueError)
    assert (stored_title(rival, "a"), stored_title(rival, "b")) == ("Shared", None)


def test_the_live_tip_takes_the_base_title_from_its_compression_ancestors(db, rival):
    db.create_session("root", "cli", title="deep-dive")
    db.rotate_session("root", "mid", [], title="deep-dive #2")
    db.rotate_session("mid", "tip", [])
    assert db.set_session_title("tip", "deep-dive") is True
    assert (stored_title(rival, "root"), stored_title(rival, "mid"), stored_title(rival, "tip")) == \
        (None, "deep-dive #2", "deep-dive")


def test_a_child_that_is_not_a_compression_continuation_cannot_take_the_title(db, rival):
    db.create_session("parent", "cli", title="shared")
    db.create_session("branch", "cli", parent_session_id="parent")  # parent still live: a branch
    db.end_session("parent", "user_exit")
    with pytest.raises(TitleConflictError):
        db.set_session_title("branch", "shared")
    assert stored_title(rival, "parent") == "shared"


def test_a_continuation_cannot_take_a_title_from_its_own_descendant(db, rival):
    db.create_session("a", "cli")
    db.rotate_session("a", "b", [], title="later name")
    with pytest.raises(TitleConflictError):
        db.set_session_title("a", "later name")


# --- generated titles and lookups -----------------------------------------------------------------

def test_a_generated_title_only_fills_an_empty_one(db, rival):
    db.create_session("s", "cli")
    assert db.set_auto_title_if_empty("s", "Generated") is True
    assert db.set_auto_title_if_empty("s", "Another") is False
    assert stored_title(rival, "s") == "Generated"
    db.create_session("t", "cli")
    assert db.set_auto_title_if_empty("t", "Generated") is False  # taken: never fails the turn
    assert db.set_auto_title_if_empty("t", "   ") is False
    assert db.set_auto_title_if_empty("ghost", "Anything") is False
    assert stored_title(rival, "t") is None


def test_get_session_by_title_matches_the_cleaned_title_exactly(db):
    db.create_session("s", "cli", title="refactoring auth")
    assert db.get_session_by_title("refactoring auth")["id"] == "s"
    assert db.get_session_by_title("  refactoring\tauth ")["id"] == "s"
    assert db.get_session_by_title("refactoring") is None
    assert db.get_session_by_title("x" * 500) is None
    assert db.get_session_by_title("bad \ud800") is None
