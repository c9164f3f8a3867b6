"""The import's report: every outcome counted, and with `max_ids` only its first ids kept (flat memory)."""
from __future__ import annotations

import tracemalloc

import pytest

from hermes_state import EXPORT_FORMAT, EXPORT_VERSION, ImportReport, SessionDB


def doc(sid: str, **session) -> dict:
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
            "session": {"id": sid, "source": "cli", "started_at": 1.0, **session},
            "messages": [{"role": "user", "content": f"hello from {sid}", "timestamp": 2.0}], "model_usage": []}


def test_without_max_ids_every_id_is_listed_and_counted(db):
    report = db.import_sessions(doc(f"s{n}") for n in range(7))
    assert report.imported == tuple(f"s{n}" for n in range(7)) and report.imported_count == 7
    assert report["imported"] == 7 and report["imported_ids"] == list(report.imported)


def test_max_ids_keeps_the_first_ids_of_each_outcome_and_counts_them_all(db, rival):
    db.import_sessions([doc("old1"), doc("old2"), doc("old3")])
    documents = [doc("old1"), doc("new1"), doc("old2"), doc("new2", parent_session_id="gone"), doc("new3"),
                 doc("old3"), doc("new4", parent_session_id="gone")]
    report = db.import_sessions(documents, max_ids=2)
    assert report.ok and report.messages == 4
    assert report.imported == ("new1", "new2") and report.imported_count == 4
    assert report.skipped == ("old1", "old2") and report.skipped_count == 3
    assert report.detached_parents == ("new2", "new4") and report.detached_count == 2
    assert report["imported"] == 4 and report["skipped"] == 3 and report["detached"] == 2
    assert rival.execute("SELECT count(*) FROM sessions").fetchone()[0] == 7  # every session written

    again = db.import_sessions(documents[:3], on_conflict="replace", max_ids=1)
    assert again.replaced == ("old1",) and again.replaced_count == 3 and again["imported"] == 3
    assert db.import_sessions([doc("x")], max_ids=0).imported == ()


def test_with_max_ids_a_bad_document_midway_still_writes_nothing_and_names_every_problem(db, rival):
    documents = [doc(f"s{n}") for n in range(5)]
    documents[2]["session"]["user_id"] = {"not": "text"}
    documents[4]["messages"][0]["role"] = ""
    report = db.import_sessions(iter(documents), max_ids=1)
    assert not report.ok and [e["index"] for e in report.errors] == [2, 4]
    assert report.imported == () and report.imported_count == 0 and report["imported"] == 0
    assert rival.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


@pytest.mark.parametrize("bad", [-1, 2.5, "20", True])
def test_max_ids_must_be_a_count(db, bad):
    with pytest.raises(ValueError, match="max_ids"):
        db.import_sessions([doc("a")], max_ids=bad)
    assert db.get_session("a") is None


def test_a_report_built_from_id_lists_counts_them():
    report = ImportReport(imported=("a", "b"), skipped=("c",), detached_parents=("a",))
    assert (report.imported_count, report.replaced_count, report.skipped_count, report.detached_count) == (2, 0, 1, 1)
    assert report["imported"] == 2 and report["detached"] == 1


def test_with_max_ids_the_import_holds_no_python_object_per_session(tmp_path):
    # Long ids make what an id list would hold stand out: ~130 bytes a session, 52 KB for 400 more.
    def documents(n: int):
        return (doc(f"{n:04d}-{k:06d}-" + "x" * 60) for k in range(n))

    def peak(n: int, max_ids: int | None) -> int:
        with SessionDB(tmp_path / f"{n}-{max_ids}.db") as db:
            db.import_sessions(documents(3), max_ids=max_ids)  # statements and caches made once
            tracemalloc.start()
            assert db.import_sessions(documents(n), max_ids=max_ids).imported_count == n
            top = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return top

    assert peak(500, 5) - peak(100, 5) < 16_000
    assert peak(500, None) - peak(100, None) > 35_000  # the same measure sees a list of every id
