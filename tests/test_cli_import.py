"""`hermes-state sessions import`: the file is read as a stream of documents, and a bad one imports nothing."""
from __future__ import annotations

import io
import json
import sqlite3
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_cli as cli
from hermes_state import SessionDB
from hermes_state_cli import iter_documents, main


def documents_of(text: str | bytes, name: str = "export.jsonl") -> list:
    raw = text.encode() if isinstance(text, str) else text
    return list(iter_documents(io.BytesIO(raw), name))


@pytest.fixture
def tiny_reads(monkeypatch):
    """Read 7 bytes at a time, so documents, numbers and UTF-8 characters straddle the reads."""
    monkeypatch.setattr(cli, "READ_BYTES", 7)


@pytest.mark.parametrize("text", [
    '{"id": "a"}\n{"id": "b"}\n',                      # JSON Lines, as `sessions export` writes
    '{"id": "a"}{"id": "b"}',                          # documents one after another
    '[{"id": "a"}, {"id": "b"}]',                      # one list
    '\ufeff[\n  {\n    "id": "a"\n  },\n  {"id": "b"}\n]\n',  # pretty-printed, with a byte order mark
    '\n\n{"id": "a"}\r\n\r\n{"id": "b"}',
])
def test_every_shape_of_export_gives_its_documents_in_order(text, tiny_reads):
    assert documents_of(text) == [{"id": "a"}, {"id": "b"}]


def test_one_document_an_empty_list_and_an_empty_file(tiny_reads):
    assert documents_of('{"id": "東京", "n": 12345678901234}') == [{"id": "東京", "n": 12345678901234}]
    assert documents_of("[]") == [] and documents_of("  \n") == [] and documents_of("") == []
    assert documents_of("[1, 2.5e3]") == [1, 2.5e3]  # not documents: the import says so, the reader does not


@pytest.mark.parametrize("text,problem", [
    ('{"id": "a"}\n{"id": "b",\n "x": }\n', "export.jsonl is neither JSON nor JSON Lines: Expecting value at line 3"),
    ('[{"id": "a"} {"id": "b"}]', "expected ',' or ']' after document, found '{'"),
    ('[{"id": "a"},', "export.jsonl ends inside a list of documents"),
    ('{"id": "a"', "export.jsonl is neither JSON nor JSON Lines"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_text_that_is_not_json_is_named_where_it_goes_wrong(text, problem, tiny_reads):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("(", r"\(")):
        documents_of(text)


def test_bytes_that_are_not_utf8_name_their_offset(tiny_reads):
    stream = iter_documents(io.BytesIO(b'{"id": "a"}\n{"id": "\xff"}'), "photo.jpg")
    assert next(stream) == {"id": "a"}  # what came before is read first
    with pytest.raises(ValueError, match=r"photo.jpg is not UTF-8 text \(byte 0xff at offset 20\)"):
        next(stream)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@settings(max_examples=150, deadline=None)
@given(docs=st.lists(st.dictionaries(st.text(max_size=5), JSON, max_size=4), max_size=5),
       layout=st.sampled_from(["lines", "list", "pretty"]), read=st.integers(1, 40))
def test_any_documents_written_any_way_read_back_equal(docs, layout, read):
    text = {"lines": "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs),
            "list": json.dumps(docs, ensure_ascii=False), "pretty": json.dumps(docs, indent=3)}[layout]
    original = cli.READ_BYTES
    cli.READ_BYTES = read  # not monkeypatch: hypothesis runs this many times in one test
    try:
        assert documents_of(text) == docs
    finally:
        cli.READ_BYTES = original


def test_reading_holds_one_document_not_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "READ_BYTES", 1 << 16)

    def peak(n: int) -> int:
        path = tmp_path / f"{n}.jsonl"
        path.write_text("".join(json.dumps({"id": f"s{i}", "text": "x" * 40_000}) + "\n" for i in range(n)))
        tracemalloc.start()
        with open(path, "rb") as source:
            for _ in iter_documents(source, path.name):
                pass
        top = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return top
    # 120 documents are 4.8 MB; the reader holds a few reads of text and the document being decoded.
    assert peak(120) < peak(30) * 1.5 < 2_000_000


# --- the command ----------------------------------------------------------------------------------

def export_lines(*docs: dict) -> str:
    return "".join(json.dumps(d) + "\n" for d in docs)


def doc(sid: str, **session) -> dict:
    return {"id": sid, "source": "cli", "started_at": 1.0, **session,
            "messages": [{"role": "user", "content": f"hello from {sid}", "timestamp": 2.0}]}


def session_ids(path) -> list:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY id")]
    finally:
        conn.close()


def test_a_bad_document_anywhere_fails_the_command_and_imports_nothing(hermes_home, tmp_path, capsys):
    SessionDB().close()
    path = tmp_path / "mixed.jsonl"
    path.write_text(export_lines(doc("a"), doc("b", user_id={"not": "text"}), doc("c"), {"source": "cli"}))
    assert main(["sessions", "import", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing was imported" in err
    assert "document 1 (session 'b'): user_id must be a string" in err and "document 3: session id is required" in err
    assert session_ids(hermes_home / "state.db") == []


def test_a_file_cut_short_imports_nothing(hermes_home, tmp_path, capsys):
    SessionDB().close()
    path = tmp_path / "cut.jsonl"
    path.write_text(export_lines(doc("a"), doc("b"))[:-20])
    assert main(["sessions", "import", str(path)]) == 1
    err = capsys.readouterr().err
    assert "document 1: the input could not be read" in err and "line 2" in err
    assert session_ids(hermes_home / "state.db") == []


def test_a_json_list_and_stdin_import_alike(hermes_home, tmp_path, capsys, monkeypatch):
    SessionDB().close()
    path = tmp_path / "list.json"
    path.write_text(json.dumps([doc("a"), doc("b", parent_session_id="a")], indent=2))
    assert main(["--json", "sessions", "import", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["imported"] == ["a", "b"] and report["errors"] == [] and report["messages"] == 2
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(export_lines(doc("a"), doc("c")).encode())))
    assert main(["--json", "sessions", "import", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["imported"] == ["c"] and report["skipped"] == ["a"]
    assert session_ids(hermes_home / "state.db") == ["a", "b", "c"]


def test_a_missing_file_fails_before_the_database_is_touched(hermes_home, tmp_path, capsys):
    assert main(["sessions", "import", str(tmp_path / "nope.jsonl")]) == 1
    assert "nope.jsonl" in capsys.readouterr().err
    assert not (hermes_home / "state.db").exists()


def test_the_report_names_the_first_sessions_and_counts_them_all(hermes_home, tmp_path, capsys):
    SessionDB().close()
    path = tmp_path / "many.jsonl"
    path.write_text(export_lines(*(doc(f"s{n:02d}") for n in range(cli.REPORT_IDS + 25))))
    assert main(["--json", "sessions", "import", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["imported"] == [f"s{n:02d}" for n in range(cli.REPORT_IDS)]
    assert report["imported_count"] == cli.REPORT_IDS + 25 and report["messages"] == cli.REPORT_IDS + 25
    assert len(session_ids(hermes_home / "state.db")) == cli.REPORT_IDS + 25
    assert main(["sessions", "import", str(path)]) == 0  # again: every one skipped, in plain lines
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.endswith(f": 0 imported, 0 replaced, {cli.REPORT_IDS + 25} skipped (already there); "
                          "0 messages written")  # the counts come first
    assert "  skipped: s00, s01, " in out and f"s{cli.REPORT_IDS:02d}" not in out
    assert f"s{cli.REPORT_IDS - 1:02d} … and 25 more\n" in out


def test_the_reader_asks_for_small_reads_so_none_gets_a_mapping_of_its_own(tmp_path):
    # A str of four-byte characters takes four bytes each: a read stays under the C allocator's
    # 128 KB threshold for mapping a block by itself, whose freeing would move the threshold.
    assert cli.READ_BYTES * 4 < 128 * 1024
    asked = []

    class Recorded(io.BytesIO):
        def read(self, size=-1):
            asked.append(size)
            return super().read(size)

    docs = [{"id": f"s{n}", "text": "東京 😀 " * 300} for n in range(400)]
    raw = export_lines(*docs).encode()
    assert len(raw) > 40 * cli.READ_BYTES
    assert list(iter_documents(Recorded(raw), "big.jsonl")) == docs
    assert max(asked) == cli.READ_BYTES
    huge = {"id": "h", "text": "x" * (5 * cli.READ_BYTES)}  # one document longer than a read is still read whole
    asked.clear()
    assert list(iter_documents(Recorded(export_lines(huge).encode()), "huge.jsonl")) == [huge]
    assert max(asked) > cli.READ_BYTES


def test_a_conflict_names_the_flag_the_user_typed(hermes_home, tmp_path, capsys):
    SessionDB().close()
    path = tmp_path / "one.jsonl"
    path.write_text(export_lines(doc("a")))
    assert main(["sessions", "import", str(path)]) == 0
    assert main(["sessions", "import", str(path), "--on-conflict", "error"]) == 1
    err = capsys.readouterr().err
    assert "--on-conflict skip or --on-conflict replace" in err and "on_conflict=" not in err


def test_import_into_a_new_db_file_creates_the_store(hermes_home, tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    path.write_text(export_lines(doc("a"), doc("b")))
    target = tmp_path / "new.db"
    assert main(["--db", str(target), "sessions", "import", str(path)]) == 0
    assert "2 imported" in capsys.readouterr().out and session_ids(target) == ["a", "b"]
    assert not (hermes_home / "state.db").exists()  # a profile's store is still never created by an import
    assert main(["sessions", "import", str(path)]) == 1
    assert "does not exist yet" in capsys.readouterr().err and not (hermes_home / "state.db").exists()


def test_a_failed_import_into_a_new_db_file_leaves_no_file(hermes_home, tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"no id": true}\n')
    target = tmp_path / "new.db"
    assert main(["--db", str(target), "sessions", "import", str(path)]) == 1
    assert "nothing was imported" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir() if p != hermes_home) == ["bad.jsonl"]


def test_an_import_of_a_file_that_is_no_export_says_what_it_is(hermes_home, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with SessionDB():
        pass
    (tmp_path / "adir").mkdir()
    with SessionDB(tmp_path / "other.db") as db:
        db.create_session("o", "cli")
    for argv, says in ((["sessions", "import", "adir"], "hermes-state: adir is a directory; give an export file"),
                       (["sessions", "import", "nope.jsonl"], "hermes-state: nope.jsonl does not exist"),
                       (["sessions", "import", "other.db"], "hermes-state: other.db is a SQLite database, not an "
                        "export: `hermes-state --db other.db sessions export` writes one")):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(says) and err.count("\n") == 1 and "Errno" not in err, err
    with SessionDB(read_only=True) as db:
        assert db.list_sessions() == []


def test_an_import_from_a_pipe_loses_none_of_its_bytes(hermes_home, tmp_path):
    # `sessions import <(gunzip -c all.jsonl.gz)` names a pipe: nothing may read it before the import.
    import os
    import subprocess
    import sys
    with SessionDB() as db:
        db.create_session("piped", "cli")
        db.append_message("piped", "user", "through a pipe")
        document = db.export_session("piped")
        db.delete_session("piped")
    fifo = tmp_path / "export.fifo"
    os.mkfifo(fifo)
    importing = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "sessions", "import", str(fifo)],
                                 env={**os.environ, "HERMES_HOME": str(hermes_home)}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        with open(fifo, "w") as pipe:
            pipe.write(json.dumps(document) + "\n")
        out, err = importing.communicate(timeout=60)
    finally:
        importing.kill()  # (a no-op once it has ended)
    assert importing.returncode == 0, err
    with SessionDB(read_only=True) as db:
        assert [m["content"] for m in db.get_messages("piped")] == ["through a pipe"]
