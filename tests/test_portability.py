"""Export and import: the document format, validation before any write, conflicts, parents, round trips."""
from __future__ import annotations

import json
import sqlite3
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state_portability as portability
from hermes_state import (EXPORT_FORMAT, EXPORT_VERSION, ImportConflictError, ImportValidationError, SessionDB,
                          TitleConflictError)


def tables(path: Path) -> tuple:
    """Every row of the three session tables, read from a second connection."""
    conn = sqlite3.connect(path)
    try:
        return tuple([tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY rowid")]
                     for t in ("sessions", "messages", "session_model_usage"))
    finally:
        conn.close()


def populate(db: SessionDB) -> None:
    """A parent with a compression archive and a tool call, a rotation child, a plain session."""
    db.create_session("p", "cli", model="m", title="Parent", model_config={"t": 0.2})
    db.append_message("p", "user", "東京で検索")
    db.append_message("p", "assistant", "", tool_calls=[{"id": "c1", "type": "function",
                                                         "function": {"name": "ls", "arguments": "{}"}}],
                      reasoning="思考", reasoning_details=[{"type": "summary", "text": "x"}])
    db.append_message("p", "tool", "a.txt", tool_call_id="c1", tool_name="ls")
    db.compress_in_place("p", [{"role": "user", "content": "summary"}])
    db.update_token_counts("p", 10, 5, model="m", estimated_cost_usd=0.5)
    db.rotate_session("p", "c", [{"role": "user", "content": "kept"}])
    db.append_message("c", "assistant", "reply")
    db.create_session("z", "telegram", user_id="42")


def test_export_session_carries_every_column_and_generation(db):
    populate(db)
    doc = db.export_session("p")
    assert doc["format"] == EXPORT_FORMAT and doc["version"] == EXPORT_VERSION
    cols = {r[1] for r in sqlite3.connect(db.db_path).execute("PRAGMA table_info(sessions)")}
    assert set(doc["session"]) == cols
    assert [(m["content"], m["active"], m["compacted"]) for m in doc["messages"]] == [
        ("東京で検索", 0, 1), ("", 0, 1), ("a.txt", 0, 1), ("summary", 1, 0)]
    assert "id" not in doc["messages"][0] and "session_id" not in doc["messages"][0]
    assert doc["messages"][1]["tool_calls"].startswith("[")  # JSON columns stay JSON text, as stored
    assert doc["model_usage"][0]["model"] == "m" and doc["model_usage"][0]["input_tokens"] == 10
    json.dumps(doc)  # ready for a file as it is
    assert {k: doc[k] for k in cols} == doc["session"]  # hermes-agent reads the columns at the top level
    assert db.export_session("nope") is None


def test_export_all_filters_by_source_and_iter_export_streams(db):
    populate(db)
    assert [d["session"]["id"] for d in db.export_all()] == ["c", "p", "z"]
    assert [d["session"]["id"] for d in db.export_all(source="telegram")] == ["z"]
    stream = db.iter_export()
    assert next(stream)["session"]["id"] == "c"  # a generator: one session at a time


def test_round_trip_into_a_fresh_file_is_identical_whatever_the_order(db, tmp_path):
    populate(db)
    exported = db.export_all()
    with SessionDB(tmp_path / "other.db") as other:
        report = other.import_sessions(list(reversed(exported)))  # children before their parents
        assert sorted(report.imported) == ["c", "p", "z"] and report.messages == 6
        assert other.export_all() == exported
        assert other.search_messages("東京", include_inactive=True)[0]["session_id"] == "p"  # indexed
    conn = sqlite3.connect(tmp_path / "other.db")
    assert dict(conn.execute("SELECT id, parent_session_id FROM sessions")) == {"p": None, "c": "p", "z": None}
    conn.close()


def test_counters_are_recomputed_from_the_rows(db, tmp_path):
    populate(db)
    doc = db.export_session("p")
    doc["session"]["message_count"], doc["session"]["tool_call_count"] = 999, 999
    with SessionDB(tmp_path / "other.db") as other:
        other.import_sessions(doc)
        row = other.get_session("p")
    assert (row["message_count"], row["tool_call_count"]) == (1, 0)  # one active row, no active call


def test_missing_parent_becomes_null_and_is_reported(db, tmp_path):
    populate(db)
    child = db.export_session("c")
    with SessionDB(tmp_path / "other.db") as other:
        report = other.import_sessions([child])
        assert report.detached_parents == ("c",)
        assert other.get_session("c")["parent_session_id"] is None


def test_a_parent_already_in_the_file_is_kept(db, tmp_path):
    populate(db)
    with SessionDB(tmp_path / "other.db") as other:
        other.import_sessions(db.export_session("p"))
        report = other.import_sessions(db.export_session("c"))
        assert report.detached_parents == () and other.get_session("c")["parent_session_id"] == "p"


def test_on_conflict_skip_replace_error(db, rival):
    populate(db)
    doc = db.export_session("z")
    doc["session"]["display_name"] = "changed"
    doc["messages"] = [{"role": "user", "content": "new", "timestamp": 5.0}]
    before = tables(db.db_path)
    assert db.import_sessions(doc).skipped == ("z",)
    assert tables(db.db_path) == before
    with pytest.raises(ImportConflictError):
        db.import_sessions(doc, on_conflict="error")
    assert tables(db.db_path) == before
    report = db.import_sessions(doc, on_conflict="replace")
    assert report.replaced == ("z",)
    row = rival.execute("SELECT display_name, message_count FROM sessions WHERE id = 'z'").fetchone()
    assert tuple(row) == ("changed", 1)
    uid = rival.execute("SELECT message_uid FROM messages WHERE session_id = 'z'").fetchone()[0]
    assert len(uid) == 32  # a hand-written message gets a uid, as a fresh insert would
    with pytest.raises(ValueError):
        db.import_sessions(doc, on_conflict="merge")


def test_replace_keeps_children_attached(db, rival):
    populate(db)
    doc = db.export_session("p")
    db.import_sessions(doc, on_conflict="replace")
    assert rival.execute("SELECT parent_session_id FROM sessions WHERE id = 'c'").fetchone()[0] == "p"
    assert db.export_session("p") == doc


def good_doc(sid: str = "s", **session) -> dict:
    return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
            "session": {"id": sid, "source": "cli", "started_at": 1.0, **session},
            "messages": [{"role": "user", "content": "hi", "timestamp": 2.0}], "model_usage": []}


def broken(mutate) -> list:
    docs = [good_doc("a"), good_doc("b")]
    mutate(docs)
    return docs


# What is wrong, and the problem the report names (the document is always the first, index 0).
MALFORMED = {
    "missing id": (lambda d: d[0]["session"].pop("id"), "session id is required"),
    "empty id": (lambda d: d[0]["session"].update(id=""), "session id must be a non-empty string"),
    "id of wrong type": (lambda d: d[0]["session"].update(id=7), "session id must be a non-empty string"),
    "missing source": (lambda d: d[0]["session"].pop("source"), "source must be a non-empty string"),
    "started_at text": (lambda d: d[0]["session"].update(started_at="yesterday"),
                        "started_at must be a finite number of epoch seconds"),
    "column of wrong type": (lambda d: d[0]["session"].update(input_tokens=[1]), "input_tokens must be an integer"),
    "text where a number belongs": (lambda d: d[0]["session"].update(input_tokens="12"),
                                    "input_tokens must be an integer"),
    "number where text belongs": (lambda d: d[0]["messages"][0].update(content=5),
                                  "messages[0].content must be a string"),
    "float where an integer belongs": (lambda d: d[0]["messages"][0].update(token_count=1.5),
                                       "messages[0].token_count must be an integer"),
    "message without role": (lambda d: d[0]["messages"][0].pop("role"), "messages[0].role must be a non-empty string"),
    "message timestamp NaN": (lambda d: d[0]["messages"][0].update(timestamp=float("nan")),
                              "messages[0].timestamp must be a finite number"),
    "bad uid": (lambda d: d[0]["messages"][0].update(message_uid="XYZ"),
                "messages[0].message_uid must be 32 lowercase hex digits"),
    "active not a flag": (lambda d: d[0]["messages"][0].update(active=7), "messages[0].active must be 0, 1 or null"),
    "message filed under another session": (lambda d: d[0]["messages"][0].update(session_id="b"),
                                            "messages[0].session_id 'b' is not the session it is filed under"),
    "messages not a list": (lambda d: d[0].update(messages={"role": "user"}), "messages must be a list"),
    "model_config not JSON": (lambda d: d[0]["session"].update(model_config="{oops"), "model_config must be valid JSON"),
    "usage without model": (lambda d: d[0].update(model_usage=[{"input_tokens": 3}]),
                            "model_usage[0].model must be a non-empty string"),
    "one uid twice among live rows": (lambda d: d[0]["messages"].extend(
        [dict(d[0]["messages"][0], message_uid="ab" * 16), dict(d[0]["messages"][0], message_uid="ab" * 16)]),
        f"messages[2].message_uid {'ab' * 16} appears twice among the live messages"),
    "newer export version": (lambda d: d[0].update(version=EXPORT_VERSION + 1), "export version 2 is not one"),
    "another format": (lambda d: d[0].update(format="something-else"), "format 'something-else' is not"),
    "not an object": (lambda d: d.insert(0, "hello"), "the document must be an object, not str"),
}


@pytest.mark.parametrize("mutate,problem", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_is_reported_and_writes_nothing(db, mutate, problem):
    populate(db)
    before = tables(db.db_path)
    report = db.import_sessions(broken(mutate))
    assert not report.ok and report["ok"] is False and report["imported"] == 0
    assert report.errors[0]["index"] == 0 and report.errors[0]["error"].startswith(problem), report.errors
    assert report.imported == report.skipped == () and report.messages == 0
    assert tables(db.db_path) == before
    assert db.in_transaction is False


@pytest.mark.parametrize("mutate,problem", list(MALFORMED.values())[:3], ids=list(MALFORMED)[:3])
def test_strict_raises_what_the_report_would_list(db, mutate, problem):
    with pytest.raises(ImportValidationError) as info:
        db.import_sessions(broken(mutate), strict=True)
    assert isinstance(info.value, ValueError) and problem in info.value.problems[0]
    assert info.value.errors[0]["error"] == problem and "nothing was imported" in str(info.value)
    assert db.get_session("b") is None


def test_the_report_names_the_session_when_the_document_names_one(db):
    report = db.import_sessions(broken(lambda d: (d[0]["session"].pop("id"), d[1]["messages"][0].pop("role"))))
    assert report["errors"] == [{"index": 0, "error": "session id is required"},
                                {"index": 1, "session_id": "b", "error": "messages[0].role must be a non-empty string"}]
    assert report.problems[1] == "document 1 (session 'b'): messages[0].role must be a non-empty string"


def test_every_malformed_document_is_listed_not_only_the_first(db, rival):
    docs = [good_doc(f"s{n}") for n in range(6)]
    docs[1]["session"]["started_at"] = None
    docs[4]["messages"][0]["role"] = ""
    docs[4]["session"]["user_id"] = {"not": "text"}
    report = db.import_sessions(iter(docs))
    assert [(e["index"], e["error"]) for e in report.errors] == [
        (1, "started_at must be a finite number of epoch seconds"),
        (4, "user_id must be a string"), (4, "messages[0].role must be a non-empty string")]
    assert rival.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


def test_what_documents_say_about_each_other_is_checked_too(db, rival):
    report = db.import_sessions([good_doc("a", title="T"), good_doc("b", title="T"), good_doc("a")])
    assert [(e["index"], e["error"]) for e in report.errors] == [(2, "the session appears more than once in the input")]
    report = db.import_sessions([good_doc("a", title="T"), good_doc("b", title="T")])
    assert report.errors == ({"index": 1, "session_id": "b", "error": "title 'T' is used by an earlier session of "
                                                                       "the input"},)
    assert rival.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


def test_a_title_taken_in_the_file_is_reported_and_nothing_written(db):
    populate(db)
    before = tables(db.db_path)
    report = db.import_sessions([good_doc("a"), good_doc("b", title="Parent")])
    assert report.errors == ({"index": 1, "session_id": "b", "error": "title 'Parent' is already in use by session 'p'"},)
    assert tables(db.db_path) == before
    with pytest.raises(ImportValidationError, match="already in use"):
        db.import_sessions([good_doc("b", title="Parent")], strict=True)


def test_titles_swapped_between_replaced_sessions_import(db):
    db.import_sessions([good_doc("a", title="First"), good_doc("b", title="Second")])
    report = db.import_sessions([good_doc("a", title="Second"), good_doc("b", title="First")], on_conflict="replace")
    assert report.ok and report.replaced == ("a", "b")
    assert (db.get_session("a")["title"], db.get_session("b")["title"]) == ("Second", "First")


@pytest.fixture(params=["walked up", "narrowed from the roots first"])
def ring_search(request, monkeypatch):
    """Both ways the import looks for rings: walking up from each session, or from the roots down first."""
    if request.param != "walked up":
        monkeypatch.setattr(portability, "WALK_AT_MOST", 0)


def test_a_self_parent_and_a_ring_of_parents_are_cut_not_refused(db, rival, ring_search):
    report = db.import_sessions([good_doc("me", parent_session_id="me")])
    assert report.ok and report.detached_parents == ("me",) and report["detached"] == 1
    # Three in a ring, one hanging below it: the ring is cut once, at its first session in input order.
    docs = [good_doc("below", parent_session_id="r2"), good_doc("r1", parent_session_id="r3"),
            good_doc("r2", parent_session_id="r1"), good_doc("r3", parent_session_id="r2")]
    report = db.import_sessions(docs)
    assert report.detached_parents == ("r1",)
    parents = dict(rival.execute("SELECT id, parent_session_id FROM sessions WHERE id != 'me'").fetchall())
    assert parents == {"below": "r2", "r1": None, "r2": "r1", "r3": "r2"}


def test_a_ring_through_the_files_sessions_is_cut_and_a_ring_of_the_file_alone_left(db, rival, ring_search):
    db.import_sessions([good_doc("f1", parent_session_id="f2"), good_doc("f2")])
    rival.execute("UPDATE sessions SET parent_session_id = 'f1' WHERE id = 'f2'")  # bad data already in the file
    report = db.import_sessions([good_doc("under", parent_session_id="f1")])
    assert report.ok and report.detached_parents == ()  # the ring is not the import's: only hung below
    db.import_sessions([good_doc("a"), good_doc("b", parent_session_id="a")])
    report = db.import_sessions([good_doc("a", parent_session_id="b")], on_conflict="replace")
    assert report.detached_parents == ("a",)
    assert dict(rival.execute("SELECT id, parent_session_id FROM sessions WHERE id IN ('a', 'b')").fetchall()) == {
        "a": None, "b": "a"}


def test_an_empty_input_imports_nothing_and_is_ok(db):
    report = db.import_sessions(iter([]))
    assert report.ok and report.imported == () and report["imported"] == 0


def test_a_missing_parent_and_a_ring_both_count_as_detached(db, ring_search):
    report = db.import_sessions([good_doc("x", parent_session_id="y"), good_doc("y", parent_session_id="x"),
                                 good_doc("z", parent_session_id="gone")])
    assert sorted(report.detached_parents) == ["x", "z"] and report["detached"] == 2


def test_an_unreadable_input_ends_the_import_as_a_problem(db, rival):
    def documents():
        yield good_doc("a")
        raise ValueError("line 2: Expecting ',' delimiter")

    report = db.import_sessions(documents())
    assert report.errors == ({"index": 1, "error": "the input could not be read: line 2: Expecting ',' delimiter"},)
    assert rival.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


def test_an_input_that_is_no_iterable_of_documents_raises(db):
    for wrong in ("a string", b"bytes", 42, None):
        with pytest.raises(ImportValidationError, match="iterable of them"):
            db.import_sessions(wrong)


def test_on_conflict_error_midway_rolls_back_what_came_before(db, rival):
    db.import_sessions(good_doc("old"))
    with pytest.raises(ImportConflictError, match="'old' already exists"):
        db.import_sessions(iter([good_doc("new"), good_doc("old")]), on_conflict="error")
    assert [r[0] for r in rival.execute("SELECT id FROM sessions")] == ["old"]


def test_any_iterable_is_read_once_as_it_goes(db, rival):
    pulled = []

    def documents():
        for n in range(4):
            pulled.append(n)
            yield good_doc(f"g{n}")

    stream = documents()
    report = db.import_sessions(stream)
    assert report.imported == ("g0", "g1", "g2", "g3") and pulled == [0, 1, 2, 3]
    assert next(stream, None) is None  # consumed, never rewound
    assert rival.execute("SELECT count(*) FROM messages").fetchone()[0] == 4


def test_import_memory_stays_flat_in_the_number_of_documents(tmp_path):
    def documents(n):
        for s in range(n):
            doc = good_doc(f"s{s:04d}")
            doc["messages"] = [{"role": "user", "content": f"{s} " + "x" * 4000, "timestamp": 2.0}] * 10
            yield doc

    peaks = []
    for n, name in ((5, "small.db"), (60, "large.db")):
        with SessionDB(tmp_path / name) as db:
            tracemalloc.start()
            assert db.import_sessions(documents(n)).messages == n * 10
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    # One document is ~40 KB and 60 of them 2.4 MB; the import holds one document at a time.
    assert peaks[1] < peaks[0] * 2


@pytest.mark.parametrize("count", [0, 1, 3, 4, 17, 64, 85, 150])
def test_every_message_is_written_once_in_input_order_whatever_the_count(db, rival, count):
    doc = good_doc("many")
    doc["messages"] = [{"role": "user", "content": f"line {n} walrus", "timestamp": 2.0 + n} for n in range(count)]
    assert db.import_sessions(doc).messages == count
    rows = rival.execute("SELECT content FROM messages WHERE session_id = 'many' ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [f"line {n} walrus" for n in range(count)]
    assert len(db.search_messages("walrus", limit=200)) == count  # every row indexed
    assert db.get_session("many")["message_count"] == count
    assert set(db.check_integrity()["fts"].values()) == {"ok"}


def test_messages_of_many_small_sessions_go_in_input_order_with_each_sessions_counters(db, rival):
    # Rows wait across sessions for a full batch: each still lands in its own session, in order.
    sizes = [1] * 70 + [3, 0, 65, 2] + [1] * 9
    docs = []
    for k, size in enumerate(sizes):
        doc = good_doc(f"s{k:03d}")
        doc["messages"] = [{"role": "assistant", "content": f"s{k} m{n} heron", "timestamp": 2.0 + n,
                            "tool_calls": '[{"id": "c", "type": "function", "function": {"name": "ls"}}]'}
                           for n in range(size)]
        docs.append(doc)
    db.import_sessions(good_doc("s071"))  # replaced below: its old row goes, the new ones come
    report = db.import_sessions(iter(docs), on_conflict="replace")
    assert report.messages == sum(sizes) and report.replaced == ("s071",)
    rows = rival.execute("SELECT session_id, content FROM messages ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [(f"s{k:03d}", f"s{k} m{n} heron") for k, size in enumerate(sizes)
                                        for n in range(size)]
    counts = {r[0]: (r[1], r[2]) for r in rival.execute("SELECT id, message_count, tool_call_count FROM sessions")}
    assert counts == {f"s{k:03d}": (size, size) for k, size in enumerate(sizes)}
    assert len(db.search_messages("heron", limit=500)) == sum(sizes)


def test_hand_written_rows_get_what_a_fresh_write_would_give(db, rival):
    doc = {"id": "hand", "source": "cli", "started_at": 50.0, "model_config": '{"t": 1}',
           "messages": [{"role": "user", "content": "bad \udc80 half"}, {"role": "assistant", "content": "ok"}]}
    assert db.import_sessions([doc]).ok
    rows = rival.execute("SELECT content, timestamp, length(message_uid) FROM messages ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("bad \ufffd half", 50.0, 32), ("ok", 50.0, 32)]
    assert db.get_session("hand")["model_config"] == '{"t": 1}'


def test_columns_this_schema_lacks_are_ignored_and_reported(db):
    doc = good_doc("a", legacy_sync_cursor=2)
    report = db.import_sessions(doc)
    assert report.ignored_columns == ("sessions.legacy_sync_cursor",)
    assert db.get_session("a")["source"] == "cli"


def test_iter_export_memory_stays_flat(tmp_path):
    with SessionDB(tmp_path / "big.db") as db:
        for s in range(60):
            db.create_session(f"s{s:03d}", "cli")
            db.replace_messages(f"s{s:03d}", [{"role": "user", "content": "x" * 2000}] * 20)
        tracemalloc.start()
        peak_small = None
        for n, _ in enumerate(db.iter_export()):
            if n == 5:
                peak_small = tracemalloc.get_traced_memory()[1]
        peak_all = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # One session is ~40 KB; the whole file ~2.4 MB. Streaming never holds more than a page of ids
    # and one session, so the peak after 60 sessions is that of the first few.
    assert peak_all < peak_small * 2


# --- round-trip property -------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["東京の天気", "검색 테스트", "项目进度", "tool output\nline 2", ""])
CALL = st.builds(lambda i, name: {"id": f"call_{i}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps({"q": name})}},
                 st.integers(0, 99), st.sampled_from(["ls", "grep", "検索"]))
MESSAGE = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, TEXT),
    st.builds(lambda c, r, calls: {"role": "assistant", "content": c, "reasoning": r, "reasoning_content": r,
                                   "tool_calls": calls or None}, TEXT, TEXT | st.none(), st.lists(CALL, max_size=2)),
    st.builds(lambda c, i: {"role": "tool", "content": c, "tool_call_id": f"call_{i}", "tool_name": "ls"},
              TEXT, st.integers(0, 99)),
)
SESSION = st.fixed_dictionaries({
    "messages": st.lists(MESSAGE, max_size=6),
    "kept": st.lists(MESSAGE, max_size=3),
    "compressions": st.integers(0, 2),
    "title": st.none() | TEXT.filter(lambda t: 0 < len(t.strip()) <= 100),
    "parent": st.none() | st.integers(0, 4),
    "tokens": st.integers(0, 10**6),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(SESSION, min_size=1, max_size=4))
def test_property_export_import_export_is_identical(specs):
    with tempfile.TemporaryDirectory() as tmp:
        with SessionDB(Path(tmp) / "a.db") as db:
            titles = set()
            for n, spec in enumerate(specs):
                sid = f"sess-{n}"
                parent = f"sess-{spec['parent']}" if spec["parent"] is not None and spec["parent"] < n else None
                title = spec["title"].strip() if spec["title"] and spec["title"].strip() not in titles else None
                titles.add(title)
                db.create_session(sid, "cli", parent_session_id=parent, title=title)
                for m in spec["messages"]:
                    db.append_message(sid, **m)
                for _ in range(spec["compressions"]):  # twice: a kept message is in two archives
                    kept = db.get_messages(sid)[:2] if _ else spec["kept"]
                    db.compress_in_place(sid, kept)
                db.update_token_counts(sid, spec["tokens"], 1, model="m")
            exported = db.export_all()
        with SessionDB(Path(tmp) / "b.db") as other:
            report = other.import_sessions(list(reversed(exported)))
            assert len(report.imported) == len(specs)
            assert other.export_all() == exported
            for doc in exported:
                assert other.get_session(doc["session"]["id"])["message_count"] == doc["session"]["message_count"]


CORRUPTIONS = [("id", None), ("source", ""), ("started_at", "noon"), ("user_id", 5), ("model_config", "{x"),
               ("input_tokens", 1.5), ("message role", None), ("message timestamp", float("inf"))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.none() | st.sampled_from(CORRUPTIONS)), min_size=1, max_size=6))
def test_property_an_import_is_all_or_nothing_and_names_each_bad_document(specs):
    docs, bad = [], []
    for index, (messages, corruption) in enumerate(specs):
        doc = good_doc(f"p{index}")
        doc["messages"] = [{"role": "user", "content": f"m{k}", "timestamp": 2.0} for k in range(messages)] or \
            [{"role": "user", "content": "only", "timestamp": 2.0}]
        if corruption is not None:
            name, value = corruption
            target = doc["messages"][0] if name.startswith("message ") else doc["session"]
            target[name.removeprefix("message ")] = value
            bad.append(index)
        docs.append(doc)
    with tempfile.TemporaryDirectory() as tmp:
        with SessionDB(Path(tmp) / "p.db") as db:
            report = db.import_sessions(iter(docs))
            written = len(db.list_sessions(limit=100))
        assert sorted({e["index"] for e in report.errors}) == bad
        assert report.ok is (not bad) and written == (0 if bad else len(docs))


def test_a_row_without_uid_is_exported_with_the_uid_its_conversation_shows(db, rival, tmp_path):
    db.create_session("s", "cli")
    db.append_message("s", "user", "written by an older program")
    rival.execute("UPDATE messages SET message_uid = NULL")
    shown = db.get_messages_as_conversation("s")[0]["message_uid"]
    doc = db.export_session("s")
    assert doc["messages"][0]["message_uid"] == shown
    with SessionDB(tmp_path / "other.db") as other:
        other.import_sessions(doc)
        assert other.export_session("s") == doc


def test_a_message_kept_by_two_compressions_round_trips(db, tmp_path):
    db.create_session("s", "cli")
    db.append_message("s", "user", "protected")
    db.compress_in_place("s", db.get_messages("s"))
    db.compress_in_place("s", db.get_messages("s"))
    doc = db.export_session("s")
    uids = [m["message_uid"] for m in doc["messages"]]
    assert len(uids) == 3 and len(set(uids)) == 1  # two archived copies and the live one
    with SessionDB(tmp_path / "other.db") as other:
        other.import_sessions(doc)
        assert other.export_session("s") == doc


def test_hermes_agents_own_export_documents_import(db, rival):
    # hermes-agent writes a session's columns at the document's top level, its messages with
    # their local row ids, and columns this schema may not have.
    upstream = [{"id": "ha1", "source": "telegram", "title": "From hermes-agent", "started_at": 1700000000.0,
                 "ended_at": 1700000100.0, "end_reason": "done", "message_count": 7, "compression_fallback_streak": 2,
                 "messages": [{"id": 41, "session_id": "ha1", "role": "user", "content": "hi", "timestamp": 1700000001.0},
                              {"id": 42, "session_id": "ha1", "role": "assistant", "content": "hello",
                               "timestamp": 1700000002.0}]},
                {"id": "ha2", "parent_session_id": "ha1", "messages": []}]
    report = db.import_sessions(upstream)
    # compression_fallback_streak is one of hermes-agent's session columns, which this schema keeps too.
    assert report.imported == ("ha1", "ha2") and report.ignored_columns == ()
    assert (report["ok"], report["imported"], report["skipped"], report["detached"]) == (True, 2, 0, 0)
    row = rival.execute("SELECT source, title, message_count, parent_session_id FROM sessions WHERE id = 'ha1'").fetchone()
    assert tuple(row) == ("telegram", "From hermes-agent", 2, None)
    ha2 = rival.execute("SELECT source, parent_session_id, started_at FROM sessions WHERE id = 'ha2'").fetchone()
    assert ha2[0] == "import" and ha2[1] == "ha1" and ha2[2] > 1700000000.0
    assert [m["content"] for m in db.get_messages("ha1")] == ["hi", "hello"]
    again = db.import_sessions(db.export_session("ha1"))                # our document, both shapes in one
    assert again["skipped_ids"] == ["ha1"] and again.get("nonsense") is None


# A session id another program stored as TEXT that is not UTF-8 ("bad", 0xFF), as listings show it.
BAD_ID_HEX, BAD_ID_SHOWN = "626164FF", "bad\ufffd"


def plant_bad_id_session(raw: sqlite3.Connection, hex_id: str = BAD_ID_HEX) -> None:
    """Write a session with two messages (one without a uid) and a usage row under that id, as another program can."""
    sid = f"CAST(x'{hex_id}' AS TEXT)"
    raw.execute(f"INSERT INTO sessions (id, source, started_at) VALUES ({sid}, 'cli', 1)")
    raw.execute(f"INSERT INTO messages (session_id, role, content, timestamp) VALUES ({sid}, 'user', 'first words', 2)")
    raw.execute(f"INSERT INTO messages (session_id, role, content, timestamp, message_uid) "
                f"VALUES ({sid}, 'assistant', 'an answer', 3, lower(hex(randomblob(16))))")
    raw.execute(f"INSERT INTO session_model_usage (session_id, model, task, input_tokens) VALUES ({sid}, 'm', '', 7)")


def test_a_session_whose_id_is_not_utf8_is_exported_under_the_id_listings_show(db, raw_conn, tmp_path, caplog,
                                                                                  monkeypatch):
    db.create_session("a_good", "cli")
    db.append_message("a_good", "user", "plain")
    db.create_session("z_good", "cli")
    plant_bad_id_session(raw_conn())
    listed = sorted(s["id"] for s in db.list_sessions())
    assert listed == ["a_good", BAD_ID_SHOWN, "z_good"]
    monkeypatch.setattr(portability.iter_export, "__defaults__", (None, 1))  # one id a page: paging past it too
    docs = db.export_all()
    assert [d["id"] for d in docs] == ["a_good", BAD_ID_SHOWN, "z_good"]
    assert [d["id"] for d in db.iter_export(source="cli")] == ["a_good", BAD_ID_SHOWN, "z_good"]
    bad = docs[1]
    assert [m["content"] for m in bad["messages"]] == ["first words", "an answer"]
    assert all(m["message_uid"] for m in bad["messages"]) and bad["model_usage"][0]["input_tokens"] == 7
    assert [r.getMessage() for r in caplog.records if "not UTF-8" in r.getMessage()] == [
        f"session b'bad\\xff': its stored id is not UTF-8; exported as {BAD_ID_SHOWN!r}"] * 2
    # Imported, the id is the text the export carried: found by it, and exported alike again.
    with SessionDB(tmp_path / "other.db") as other:
        report = other.import_sessions(docs)
        assert report.ok and report.imported_count == 3 and report.messages == 3
        assert other.get_session(BAD_ID_SHOWN)["message_count"] == 2
        assert [m["content"] for m in other.get_messages(BAD_ID_SHOWN)] == ["first words", "an answer"]
        again = other.export_all()
        assert [d["id"] for d in again] == [d["id"] for d in docs]
        assert again[1]["messages"] == bad["messages"] and again[1]["model_usage"] == bad["model_usage"]


def test_two_stored_ids_that_read_alike_export_alike_and_the_import_refuses_both(db, raw_conn, tmp_path):
    plant_bad_id_session(raw_conn(), "626164FF")
    plant_bad_id_session(raw_conn(), "626164FE")
    docs = db.export_all()
    assert [d["id"] for d in docs] == [BAD_ID_SHOWN, BAD_ID_SHOWN]  # neither left out
    with SessionDB(tmp_path / "other.db") as other:
        report = other.import_sessions(docs)
        assert [(e["index"], e["error"]) for e in report.errors] == [(1, "the session appears more than once in the input")]
        assert other.session_count() == 0


def test_cli_export_and_import_keep_a_session_whose_id_is_not_utf8(db, raw_conn, tmp_path, capsys, caplog):
    from hermes_state_cli import main
    db.create_session("good", "cli")
    db.append_message("good", "user", "plain")
    plant_bad_id_session(raw_conn())
    db.close()
    target = tmp_path / "all.jsonl"
    assert main(["--db", str(db.db_path), "sessions", "export", "-o", str(target)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    # The warning goes to stderr when nothing else handles the library's logger (here pytest does).
    assert any("stored id is not UTF-8" in r.getMessage() for r in caplog.records)
    assert sorted(json.loads(line)["id"] for line in target.read_text().splitlines()) == [BAD_ID_SHOWN, "good"]
    SessionDB(tmp_path / "other.db").close()
    assert main(["--db", str(tmp_path / "other.db"), "sessions", "import", str(target)]) == 0
    capsys.readouterr()
    with SessionDB(tmp_path / "other.db") as other:
        assert sorted(s["id"] for s in other.list_sessions()) == [BAD_ID_SHOWN, "good"]
        assert other.message_count() == 3
