"""SQL parameters are bound the way every supported Python accepts.

Python 3.12 and 3.13 warn, and 3.14 refuses, when named placeholders (`:name`) are bound from a
sequence. The statements that read one value several times (deletion, search context) name it
and bind a dict; the replacing import binds plain `?`. These paths run here with that warning
turned into an error, so a named placeholder bound from a tuple fails on 3.12 and later.
"""
from __future__ import annotations

import warnings

import pytest


@pytest.fixture
def strict():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


def _two_sessions(db):
    db.create_session("a", "cli")
    db.create_session("b", "cli", parent_session_id="a")
    for sid in ("a", "b"):
        db.append_message(sid, "user", f"hello zebra from {sid}")
        db.append_message(sid, "assistant", "a reply")


def test_delete_binds_the_id_list_by_name(db, rival, strict):
    _two_sessions(db)
    assert db.delete_sessions(["a", "b"]) == 2
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_search_context_binds_the_hit_list_by_name(db, strict):
    _two_sessions(db)
    hits = db.search_messages("zebra")
    assert {h["session_id"] for h in hits} == {"a", "b"}
    for hit in hits:
        assert [c["role"] for c in hit["context"]] == ["user", "assistant"]


def test_replacing_import_binds_each_session_once(db, rival, strict):
    _two_sessions(db)
    document = db.export_all()
    db.append_message("a", "user", "written after the export")
    report = db.import_sessions(document, on_conflict="replace")
    assert sorted(report.replaced) == ["a", "b"]
    assert rival.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'a'").fetchone()[0] == 2
