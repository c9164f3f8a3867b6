"""Regression tests for defects found by a hostile review: each failed before its fix."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

import hermes_state_fts as fts
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_lockowners as lockowners
from hermes_state import (HermesStateError, SessionClosedByCompressionError, SessionDB, SessionNotFoundError,
                          StateDbCorruptError,
                          StoreUnavailableError, list_sessions_across_profiles)


# --- hangs and unreadable data ------------------------------------------------------------------------

def test_a_hit_in_a_huge_row_gets_a_bounded_snippet(db):
    db.create_session("s", "cli")
    huge = "lorem ipsum dolor sit amet " * 200_000 + " NeedleWord tail " + "x " * 1000  # ~5 MB
    big = db.append_message("s", "tool", huge, tool_call_id="c", tool_name="shell")
    small = db.append_message("s", "user", "a small NeedleWord message")
    found = []
    # A liveness guard, not a speed target: FTS5's snippet() over this row took minutes
    # (its cost grows with the square of the row); a window around the match takes milliseconds.
    search = threading.Thread(target=lambda: found.extend(db.search_messages("needleword")), daemon=True)
    search.start()
    search.join(60.0)
    assert not search.is_alive(), "the search did not finish"
    hits = {h["id"]: h for h in found}
    assert set(hits) == {big, small}
    assert ">>>NeedleWord<<<" in hits[big]["snippet"] and len(hits[big]["snippet"]) < 200
    assert hits[big]["snippet"].startswith("...") and hits[big]["snippet"].endswith("...")
    assert hits[small]["snippet"] == "a small >>>NeedleWord<<< message"


def test_a_long_read_does_not_hold_the_write_path(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "something to find")
    with db.transaction() as txn:  # index the queued row now, as the handle's next batch would
        fts.index_batch(txn.conn)
    reading, appended = threading.Event(), threading.Event()

    def slow_statement(sql: str) -> None:
        # Runs inside the search's read; a write that needs the same lock would wait forever.
        if threading.current_thread().name == "slow-reader" and sql.lstrip().upper().startswith("SELECT"):
            reading.set()
            appended.wait(60.0)

    results = []
    with db.tracer(slow_statement):
        t = threading.Thread(target=lambda: results.append(db.search_messages("something")), name="slow-reader")
        t.start()
        assert reading.wait(10.0)
        db.append_message("s", "assistant", "written while a read is in progress")
        read_still_open = t.is_alive()  # the read ends only once the append is done, so the append did not wait for it
        appended.set()
        t.join(10.0)
    assert read_still_open
    assert results and results[0][0]["snippet"] == ">>>something<<< to find"


def _plant_invalid_utf8(raw: sqlite3.Connection) -> None:
    raw.execute("INSERT INTO messages (session_id, role, content, timestamp) "
                "VALUES ('s', 'user', CAST(X'6F6B20C32820626164' AS TEXT), 5)")
    raw.execute("UPDATE sessions SET title = CAST(X'54C328' AS TEXT) WHERE id = 's'")


def test_text_that_is_not_utf8_reads_with_replacement_characters(db, raw_conn):
    db.create_session("s", "cli")
    db.append_message("s", "user", "fine text")
    _plant_invalid_utf8(raw_conn())
    assert [m["content"] for m in db.get_messages("s")] == ["fine text", "ok \ufffd( bad"]
    assert db.get_messages_as_conversation("s")[1]["content"] == "ok \ufffd( bad"
    (row,) = db.list_sessions()
    assert row["title"] == "T\ufffd(" and row["preview"] == "ok \ufffd( bad"  # the earliest user message
    for by_activity in (False, True):
        (rich,) = db.list_sessions_rich(order_by_last_active=by_activity)
        assert (rich["title"], rich["preview"]) == ("T\ufffd(", "ok \ufffd( bad")
    (hit,) = db.search_messages("bad")
    assert "\ufffd" in hit["snippet"] and ">>>bad<<<" in hit["snippet"]


def test_a_conversation_read_falls_back_to_replacement_characters_in_an_ancestor(db, raw_conn):
    # The conversation is read with the strict decoder first; a bad byte anywhere in the chain
    # makes it read again leniently, and the connection is left lenient for every later read.
    db.create_session("s", "cli")
    _plant_invalid_utf8(raw_conn())
    db.append_message("s", "assistant", "answer")
    db.rotate_session("s", "next", [{"role": "user", "content": "summary"}])
    whole = db.get_messages_as_conversation("next", include_ancestors=True)
    assert [m["content"] for m in whole] == ["ok \ufffd( bad", "answer", "summary"]
    assert db.get_messages("s")[0]["content"] == "ok \ufffd( bad"
    assert db.get_messages_as_conversation("next") == [whole[-1]]


def test_cli_shows_text_that_is_not_utf8_without_a_traceback(db, raw_conn):
    db.create_session("s", "cli")
    _plant_invalid_utf8(raw_conn())
    db.close()
    out = subprocess.run([sys.executable, "-m", "hermes_state_cli", "--db", str(db.db_path), "sessions", "show", "s"],
                         capture_output=True, text=True, env={**os.environ, "HERMES_STATE_DB_GUARD_BYPASS": "1"},
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "\ufffd" in out.stdout


# Message text another program stored as TEXT that is not UTF-8, each holding "report" and CJK:
# CJK with a stray byte, an encoded lone surrogate, a CJK character cut off at the end.
NOT_UTF8_TEXT = {"stray_byte": "E69DB1E4BAAC207265706F727420FF",
                 "lone_surrogate": "7265706F727420EDA08020E69DB1E4BAAC",
                 "cut_off": "E69DB1E4BAAC207265706F727420E69D"}


def plant_not_utf8(raw: sqlite3.Connection, session_id: str, hex_text: str) -> int:
    """Append a message whose content is `hex_text`'s bytes as TEXT, as another program can; return its id."""
    return raw.execute("INSERT INTO messages (session_id, role, content, timestamp) "
                       f"VALUES (?, 'user', CAST(x'{hex_text}' AS TEXT), 5)", (session_id,)).lastrowid


@pytest.mark.parametrize("hex_text", NOT_UTF8_TEXT.values(), ids=NOT_UTF8_TEXT.keys())
def test_a_message_that_is_not_utf8_leaves_every_search_working(db, raw_conn, hex_text):
    db.create_session("s", "cli")
    good = db.append_message("s", "user", "a report about 東京 in plain text")
    bad = plant_not_utf8(raw_conn(), "s", hex_text)  # queued for the CJK index, which needs our function

    def found(query: str) -> set[int]:
        return {h["id"] for h in db.search_messages(query)}
    for _ in range(2):  # while the row waits in the CJK queue, then once this handle's batch indexed it
        assert found("report") == found("東京") == found("東") == found("repo*") == {good, bad}
        assert found("plain") == {good} and found('"about 東京"') == {good}
        with db.transaction() as txn:  # the batch a handle's writes run
            fts.index_batch(txn.conn)
        assert db.fts_rebuild_status()["cjk_pending"] == 0
    (hit,) = [h for h in db.search_messages("report") if h["id"] == bad]
    assert "\ufffd" in hit["snippet"] and ">>>report<<<" in hit["snippet"]
    db.rebuild_fts()  # the rebuild indexes the row like any other
    assert found("report") == found("東京") == {good, bad}


def test_cli_search_reads_a_message_that_is_not_utf8(db, raw_conn, capsys):
    from hermes_state_cli import main
    db.create_session("s", "cli")
    bad = plant_not_utf8(raw_conn(), "s", NOT_UTF8_TEXT["lone_surrogate"])
    db.close()
    for query in ("report", "東京"):
        assert main(["--db", str(db.db_path), "--json", "sessions", "search", query]) == 0
        out, err = capsys.readouterr()
        assert [h["id"] for h in json.loads(out)] == [bad] and err == ""


@pytest.mark.parametrize("where", ["directory", "empty"])
def test_a_path_sqlite_cannot_open_is_a_typed_error(tmp_path, monkeypatch, where):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = work / "a_directory" if where == "directory" else ""
    if where == "directory":
        path.mkdir()
    with pytest.raises(StoreUnavailableError, match="cannot be opened"):
        SessionDB(path)
    assert sorted(p.name for p in work.iterdir()) == (["a_directory"] if where == "directory" else [])


def _damage_fts(db: SessionDB, where: str) -> None:
    db.create_session("s", "cli")
    for i in range(300):
        db.append_message("s", "user", f"word{i} " * 40)
    db.close()
    raw = sqlite3.connect(db.db_path)
    # A fixed pattern, not random bytes: some random bytes decode as a huge size and make
    # SQLite fail for memory instead of reporting the damage.
    raw.execute(f"UPDATE messages_fts_data SET block = CAST(replace(hex(zeroblob(length(block))), '00', 'A5') "
                f"AS BLOB) WHERE {where}")
    raw.commit()
    raw.close()


def test_damaged_fts_pages_are_typed_errors_and_rebuild_fts_repairs_them(db):
    _damage_fts(db, "id > 10")  # index pages; the structure record is intact
    with SessionDB(db.db_path) as again:
        with pytest.raises(StateDbCorruptError):
            again.search_messages("word7")
        again.rebuild_fts()
        hits = again.search_messages("word7")
        assert hits[0]["snippet"].startswith(">>>word7<<< >>>word7<<<")  # the whole word ranks first
        assert len(hits) == 11  # then word70 ... word79, which hold it as a piece


def test_a_damaged_fts_structure_is_a_typed_error_for_every_call(db):
    _damage_fts(db, "id <= 10")
    with SessionDB(db.db_path) as again:
        for call in (lambda: again.search_messages("word7"), lambda: again.append_message("s", "user", "more"),
                     again.rebuild_fts):
            with pytest.raises(StateDbCorruptError, match="doctor` says what can be saved"):
                call()
        assert [m["content"] for m in again.get_messages("s")][:1] == ["word0 " * 40]  # rows still readable


# --- public API that corrupts state -----------------------------------------------------------------

def test_ending_by_compression_then_creating_the_child_builds_the_chain(db):
    # The design document's lineage: end the session with "compression", then create its
    # continuation with parent_session_id. The two steps together are one compression edge.
    db.create_session("s", "cli")
    db.append_message("s", "user", "first half")
    db.end_session("s", "compression")
    db.end_session("s", "user_exit")  # the first end wins
    assert db.get_session("s")["end_reason"] == "compression"
    db.create_session("t", "cli", parent_session_id="s")
    assert db.get_compression_successor("s") == "t"
    assert db.get_compression_ancestors("t") == ["s"]
    with pytest.raises(SessionClosedByCompressionError):
        db.reopen_session("s")  # its conversation lives on in "t"
    assert [m["content"] for m in db.get_messages_as_conversation("t", include_ancestors=True)] == ["first half"]


def test_a_compression_end_without_a_continuation_can_be_reopened_and_ended_again(db):
    db.create_session("s", "cli")
    db.end_session("s", "compression")
    db.reopen_session("s")
    db.end_session("s", "user_exit")
    assert db.get_session("s")["end_reason"] == "user_exit"


def test_replace_messages_refuses_one_uid_twice(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "one")
    msg = db.get_messages_as_conversation("s")[0]
    with pytest.raises(ValueError, match="same message_uid"):
        db.replace_messages("s", [msg, dict(msg, content="again")])
    assert [m["content"] for m in db.get_messages("s")] == ["one"]
    db.compress_in_place("s", db.get_messages_as_conversation("s"))  # still compressible


def test_kept_conversation_dicts_keep_the_stored_fields(db):
    db.create_session("s", "cli")
    db.append_message("s", "user", "hello", timestamp=1000.0, platform_message_id="p1", observed=True,
                      display_kind="voice", display_metadata={"lang": "en"}, effect_disposition="kept")
    db.append_message("s", "assistant", "hi", token_count=7, finish_reason="stop", timestamp=1001.0)
    kept = db.get_messages_as_conversation("s")
    kept[1] = dict(kept[1], finish_reason="length")  # the caller's value wins
    db.compress_in_place("s", kept)
    live = db.get_messages("s")
    assert [(m["timestamp"], m["platform_message_id"], m["observed"], m["display_kind"], m["display_metadata"],
             m["effect_disposition"]) for m in live[:1]] == [(1000.0, "p1", 1, "voice", {"lang": "en"}, "kept")]
    assert (live[1]["token_count"], live[1]["finish_reason"], live[1]["timestamp"]) == (7, "length", 1001.0)
    db.rotate_session("s", "t", db.get_messages_as_conversation("s"))
    assert [m["timestamp"] for m in db.get_messages("t")] == [1000.0, 1001.0]


def test_rows_without_a_uid_replay_once_across_a_compression_seam(db, raw_conn):
    db.create_session("p", "cli")
    raw = raw_conn()
    for i, text in enumerate(["old one", "old two"]):
        raw.execute("INSERT INTO messages (session_id, role, content, timestamp) VALUES ('p', 'user', ?, ?)",
                    (text, 10 + i))
    raw.close()
    conv = db.get_messages_as_conversation("p")
    assert [m["content"] for m in conv] == ["old one", "old two"]
    assert conv[0]["message_uid"] != conv[1]["message_uid"]
    assert conv == db.get_messages_as_conversation("p")  # the derived uids are stable
    db.rotate_session("p", "c", conv[1:])
    db.append_message("c", "assistant", "new")
    replay = db.get_messages_as_conversation("c", include_ancestors=True)
    assert [m["content"] for m in replay] == ["old one", "old two", "new"]


@pytest.mark.parametrize("columns", [{"started_at": "yesterday"}, {"input_tokens": -5},
                                     {"estimated_cost_usd": float("nan")}, {"message_count": 3}])
def test_create_session_refuses_values_that_break_sorting_and_sweeps(db, columns):
    with pytest.raises(ValueError):
        db.create_session("s", "cli", **columns)
    assert db.get_session("s") is None


def test_token_sums_past_64_bits_raise_instead_of_becoming_floats(db):
    db.create_session("s", "cli", model="m")
    db.update_token_counts("s", input_tokens=2**63 - 10)
    with pytest.raises(ValueError, match="64-bit"):
        db.update_token_counts("s", input_tokens=11)
    row = db.get_session("s")
    assert row["input_tokens"] == 2**63 - 10 and isinstance(row["input_tokens"], int)
    assert db.usage_by_model()[0]["input_tokens"] == 2**63 - 10


def test_cross_profile_offset_pages_the_merged_listing(hermes_home):
    for n, name in enumerate(["alpha", "beta"]):
        home = hermes_home / "profiles" / name
        home.mkdir(parents=True)
        with SessionDB(home / "state.db") as db:
            for i in range(3):
                db.create_session(f"{name}{i}", "cli", started_at=float(10 * i + n))
    every = list_sessions_across_profiles(hermes_home, limit=100)["sessions"]
    assert [r["id"] for r in every] == ["beta2", "alpha2", "beta1", "alpha1", "beta0", "alpha0"]
    pages = [list_sessions_across_profiles(hermes_home, limit=2, offset=o)["sessions"] for o in (0, 2, 4, 6)]
    assert [[r["id"] for r in page] for page in pages] == [["beta2", "alpha2"], ["beta1", "alpha1"],
                                                            ["beta0", "alpha0"], []]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="zombies are read from /proc (Linux)")
def test_a_zombie_lock_holder_counts_as_gone(db, plant_lock):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # exited but not reaped: a zombie
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.02)
    try:
        holder = f"pid={child.pid} host={os.uname().nodename} pidns={lockowners.own_pidns()} token=x"
        assert lockowners.holder_is_gone(holder)
        db.create_session("s", "cli")
        plant_lock("s", holder)
        assert db.acquire_compression_lock("s") is not None  # reclaimed at once, not after the TTL
    finally:
        child.wait()


def test_deeply_nested_json_is_a_value_error_and_reads_back_as_text(db, raw_conn):
    db.create_session("s", "cli")
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        db.append_message("s", "assistant", "x", tool_calls=deep)
    assert db.get_messages("s") == []
    nested_text = "[" * 100_000 + "]" * 100_000
    raw = raw_conn()
    raw.execute("INSERT INTO messages (session_id, role, content, tool_calls, timestamp) "
                "VALUES ('s', 'assistant', 'x', ?, 1)", (nested_text,))
    raw.close()
    assert db.get_messages("s")[0]["tool_calls"] == nested_text
    assert db.get_messages_as_conversation("s")[0]["tool_calls"] == nested_text


def test_lone_surrogates_in_ids_sources_and_filters(db):
    bad = "id\ud800"
    with pytest.raises(ValueError, match="session_id"):
        db.create_session(bad, "cli")
    with pytest.raises(ValueError, match="source"):
        db.create_session("s", "cli\udfff")
    with pytest.raises(ValueError, match="session_id"):
        db.append_message(bad, "user", "x")
    for name in ("source_filter", "exclude_sources", "role_filter"):
        with pytest.raises(ValueError, match=name):
            db.search_messages("x", **{name: [bad]})
    with pytest.raises(ValueError, match="session_id"):
        db.search_messages("x", session_id=bad)
    assert db.get_session(bad) is None and db.get_messages(bad) == [] and db.get_lineage(bad) == []
    assert db.get_messages_as_conversation(bad) == [] and db.get_compression_successor(bad) is None
    assert db.list_sessions() == []


def test_an_upgraded_old_layout_back_fills_tool_call_count(tmp_path):
    path = tmp_path / "old.db"
    raw = sqlite3.connect(path)
    raw.executescript("""
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
                               content TEXT, tool_calls TEXT, timestamp REAL NOT NULL);
        INSERT INTO sessions VALUES ('s', 'cli', 1);
        INSERT INTO messages (session_id, role, content, tool_calls, timestamp) VALUES
            ('s', 'user', 'q', NULL, 1),
            ('s', 'assistant', '', '[{"id": "a"}, {"id": "b"}]', 2),
            ('s', 'tool', 'r', NULL, 3),
            ('s', 'assistant', '', '[{"id": "c"}]', 4),
            ('s', 'assistant', '', 'not json', 5);
    """)
    raw.close()
    with SessionDB(path) as db:
        row = db.get_session("s")
        assert (row["message_count"], row["tool_call_count"]) == (5, 3)


# --- properties: hostile input never leaves a raw error or a half-written state -----------------------

_hostile = st.text(alphabet=st.characters(blacklist_categories=()), max_size=12)


@settings(max_examples=60, deadline=None)
@given(session_id=_hostile, source=_hostile, title=st.one_of(st.none(), _hostile),
       filt=st.lists(_hostile, max_size=2), column=st.sampled_from(
           ["started_at", "ended_at", "input_tokens", "estimated_cost_usd", "pinned", "model", "cwd"]),
       value=st.one_of(st.none(), _hostile, st.integers(), st.floats(), st.booleans()))
def test_hostile_ids_sources_columns_and_filters_raise_only_typed_errors(tmp_path_factory, session_id, source,
                                                                          title, filt, column, value):
    path = tmp_path_factory.mktemp("h") / "state.db"
    with SessionDB(path) as db:
        try:
            db.create_session(session_id, source, title=title, **{column: value})
        except (ValueError, HermesStateError):
            created = []
            assert db.list_sessions(limit=1000) == []  # nothing half-written
        else:
            created = [session_id]
            assert db.get_session(session_id)["source"] == source
        for call in (lambda: db.get_session(session_id), lambda: db.get_messages(session_id),
                     lambda: db.search_messages("x", source_filter=filt, session_id=session_id or None),
                     lambda: db.update_session(session_id, **{column: value}),
                     lambda: db.end_session(session_id, source)):
            try:
                call()
            except (ValueError, HermesStateError, SessionNotFoundError):
                pass
        # the hostile calls after it neither added nor lost a session, and left the file sound
        assert [row["id"] for row in db.list_sessions(limit=1000)] == created
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check.close()


def test_damaged_file_copy_never_gives_a_raw_sqlite_error(db, tmp_path):
    db.create_session("s", "cli")
    for i in range(50):
        db.append_message("s", "user", f"message {i} " * 50)
    db.close()
    raw = sqlite3.connect(f"file:{db.db_path}?mode=ro", uri=True)
    (root,) = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()
    (page_size,) = raw.execute("PRAGMA page_size").fetchone()
    raw.close()
    data = bytearray(db.db_path.read_bytes())
    data[page_size * (root - 1):page_size * root] = b"\xff" * page_size  # the messages table's root page
    copy = tmp_path / "copy.db"
    copy.write_bytes(bytes(data))
    with SessionDB(copy) as damaged:
        assert damaged.get_session("s")["id"] == "s"  # the undamaged tables still answer
        for read in (lambda: damaged.get_messages("s"), lambda: damaged.search_messages("message")):
            with pytest.raises(StateDbCorruptError, match="left untouched.*doctor` says what can be saved"):
                read()
    assert copy.read_bytes() == bytes(data)  # left untouched, as the error says


# --- values nested past Python's recursion limit ------------------------------------------------------

def _nested(depth: int = 100_000) -> tuple[list, dict]:
    deep_list: list = []
    deep_dict: dict = {}
    for _ in range(depth):
        deep_list, deep_dict = [deep_list], {"a": deep_dict}
    return deep_list, deep_dict


def test_receipt_functions_refuse_a_deeply_nested_payload_with_a_value_error(db):
    import hermes_state_gateway as gateway
    deep, _ = _nested()
    with pytest.raises(ValueError, match="nested too deeply"):
        gateway.receipt_digest(deep)
    with pytest.raises(ValueError):
        db.record_receipt(1, 1, deep, "00")


def test_validators_quote_a_deeply_nested_value_without_crashing(db):
    deep, _ = _nested()
    # The message names the argument and shows the start of the value.
    with pytest.raises(ValueError, match=r"obligation_id must be a non-negative integer, not \[\[\["):
        db.get_delivery(deep)
    with pytest.raises(ValueError, match="older_than_days"):
        db.prune_sessions(deep)


def test_no_public_method_lets_a_recursion_error_through(db):
    # Every argument of every public method, in turn, gets a value nested 100,000 deep (a list
    # and a dict); whatever the method says about it, it is never a raw RecursionError.
    import inspect
    deep_values = _nested()
    db.create_session("a", "cli")
    skip = {"close", "restore", "backup", "vacuum", "shared", "release"}
    leaked = []
    for name, method in inspect.getmembers(db, inspect.ismethod):
        if name.startswith("_") or name in skip:
            continue
        params = [p for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        required = {p.name: "a" for p in params if p.default is inspect.Parameter.empty}
        for param in params:
            for deep in deep_values:
                try:
                    result = method(**{**required, param.name: deep})
                    if inspect.isgenerator(result):
                        list(result)
                except RecursionError:
                    leaked.append(f"{name}({param.name})")
                except Exception:  # noqa: BLE001 - any other answer is the method's own business here
                    pass
    assert leaked == []


def test_cli_import_of_a_deeply_nested_line_is_one_line_of_error(db, tmp_path):
    db.close()
    source = tmp_path / "deep.jsonl"
    source.write_text('{"session": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    out = subprocess.run([sys.executable, "-m", "hermes_state_cli", "--db", str(db.db_path), "sessions", "import",
                          str(source)], capture_output=True, text=True,
                         env={**os.environ, "HERMES_STATE_DB_GUARD_BYPASS": "1"}, timeout=60)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "nested too deeply" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# --- import: the write API's checks, linear validation, no lock while checking ------------------------

def _document(sid: str, parent: str | None = None, **session) -> dict:
    return {"format": "hermes-state-export", "version": 1,
            "session": {"id": sid, "source": "cli", "started_at": 1.0, "parent_session_id": parent, **session},
            "messages": [], "model_usage": []}


def _real_columns(table: str) -> list[str]:
    from hermes_state_common import TABLES
    skip = {"id", "session_id"}
    return [c for name, cols, _ in TABLES if name == table for c, decl in cols if decl.startswith("REAL")
            and c not in skip]


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_import_refuses_non_finite_numbers_in_every_real_column(db, bad):
    from hermes_state import ImportValidationError
    cases = [_document("s", **{c: bad}) for c in _real_columns("sessions")]
    for column in _real_columns("messages"):
        doc = _document("s")
        doc["messages"] = [{"role": "user", "content": "x", "timestamp": 1.0, column: bad}]
        cases.append(doc)
    for column in _real_columns("session_model_usage"):
        doc = _document("s")
        doc["model_usage"] = [{"model": "m", column: bad}]
        cases.append(doc)
    assert len(cases) > 5
    for doc in cases:
        report = db.import_sessions(doc)
        assert not report.ok and "must be a finite number" in report.errors[0]["error"], report.errors
        with pytest.raises(ImportValidationError):
            db.import_sessions(doc, strict=True)
    assert db.get_session("s") is None


def test_import_cuts_a_parent_ring_closed_by_rows_in_the_file(db, rival):
    db.create_session("a", "cli")
    db.create_session("b", "cli", parent_session_id="a")
    report = db.import_sessions(_document("a", parent="b"), on_conflict="replace")
    assert report.ok and report.detached_parents == ("a",)
    parents = dict(rival.execute("SELECT id, parent_session_id FROM sessions").fetchall())
    assert parents == {"a": None, "b": "a"}
    # A longer ring through several file rows, and one inside the input alone.
    db.create_session("c", "cli", parent_session_id="b")
    assert db.import_sessions(_document("a", parent="c"), on_conflict="replace").detached_parents == ("a",)
    report = db.import_sessions([_document("x", parent="y"), _document("y", parent="x")])
    assert report.imported == ("x", "y") and report.detached_parents == ("x",)
    assert db.get_session("y")["parent_session_id"] == "x"
    report = db.import_sessions(_document("c", parent="a"), on_conflict="replace")  # no ring: kept
    assert report.replaced == ("c",) and report.detached_parents == ()
    assert db.get_session("c")["parent_session_id"] == "a"


@pytest.mark.slow
def test_import_validation_of_a_long_parent_chain_is_linear():
    import hermes_state_portability as portability
    n = 30_000  # walking up every chain once per session would take about 15 minutes here
    chain = [_document(f"s{i:05d}", parent=f"s{i - 1:05d}" if i else None) for i in range(n)]
    plans = []
    worker = threading.Thread(target=lambda: plans.append(portability.validate(chain)), daemon=True)
    worker.start()
    worker.join(60.0)  # a liveness guard, not a speed target
    assert not worker.is_alive(), "validation did not finish"
    assert len(plans[0].sessions) == n


def test_a_bad_document_lets_go_of_the_write_lock_while_the_rest_is_checked(db, rival):
    # After the bad document, another process writes a transcript row at once: it gives up on
    # the first lock conflict, so it fails if the import still holds the lock.
    db.create_session("live", "cli")
    writer = ("import sys; from hermes_state import SessionDB; d = SessionDB(sys.argv[1]); "
              "d.transcript_write_patience_s = 0; d.append_message('live', 'user', 'during the import'); "
              "d.close()")
    outcomes = []

    def documents():
        yield from (_document(f"i{n}") for n in range(20))
        yield {"format": "hermes-state-export", "version": 1, "session": {"source": "cli", "started_at": 1.0}}  # no id
        outcomes.append(subprocess.run([sys.executable, "-c", writer, str(db.db_path)], capture_output=True,
                                       text=True, env={**os.environ, "HERMES_STATE_DB_GUARD_BYPASS": "1"},
                                       timeout=60))
        yield from (_document(f"j{n}") for n in range(5))
        yield _document("late", started_at="noon")

    report = db.import_sessions(documents())
    assert outcomes and outcomes[0].returncode == 0, outcomes[0].stderr[-500:]
    assert [(e["index"], e["error"]) for e in report.errors] == [
        (20, "session id is required"), (26, "started_at must be a finite number of epoch seconds")]
    assert [r[0] for r in rival.execute("SELECT id FROM sessions")] == ["live"]  # nothing imported
    assert [m["content"] for m in db.get_messages("live")] == ["during the import"]


# --- whose file is it, and its mode -------------------------------------------------------------------

def _other_programs_db(path) -> bytes:
    made = sqlite3.connect(path)
    made.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    made.execute("INSERT INTO invoices (total) VALUES (12.5)")
    made.commit()
    made.close()
    os.chmod(path, 0o644)
    return path.read_bytes()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", *args], capture_output=True, text=True,
                          env={**os.environ, "HERMES_STATE_DB_GUARD_BYPASS": "1"}, timeout=60)


def test_another_programs_database_is_refused_untouched_unless_forced(tmp_path):
    from hermes_state import ForeignDatabaseError, StateDbIncompatibleError
    other = tmp_path / "other.db"
    before = _other_programs_db(other)
    with pytest.raises(ForeignDatabaseError, match=str(other)) as info:
        SessionDB(other)
    assert isinstance(info.value, StateDbIncompatibleError)
    out = _cli("--db", str(other), "init")
    assert out.returncode == 1 and str(other) in out.stderr and "Traceback" not in out.stderr
    assert other.read_bytes() == before and os.stat(other).st_mode & 0o777 == 0o644
    assert not (tmp_path / "other.db-wal").exists()
    forced = _cli("--db", str(other), "init", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "0644 -> 0600" in forced.stdout  # the mode change is said, not silent
    with SessionDB(other) as db:  # now it holds the store's tables, and the other program's rows
        db.create_session("s", "cli")
    assert sqlite3.connect(other).execute("SELECT total FROM invoices").fetchall() == [(12.5,)]


def test_a_new_file_is_private_and_tightening_an_existing_one_is_said(tmp_path, caplog):
    fresh = tmp_path / "fresh.db"
    SessionDB(fresh).close()
    assert os.stat(fresh).st_mode & 0o777 == 0o600
    os.chmod(fresh, 0o644)
    with caplog.at_level("WARNING", logger="hermes_state"):
        with SessionDB(fresh) as db:
            assert db.mode_changes and "0644 -> 0600" in db.mode_changes[0]
    assert any("0644 -> 0600" in r.getMessage() for r in caplog.records)
    os.chmod(fresh, 0o644)
    migrated = _cli("--db", str(fresh), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "0644 -> 0600" in migrated.stdout and os.stat(fresh).st_mode & 0o777 == 0o600


def test_a_symlinked_store_is_private_through_the_link(tmp_path):
    disk = tmp_path / "other-disk"
    disk.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    link = home / "state.db"
    link.symlink_to(disk / "state.db")  # the store kept on another disk; the target does not exist yet
    old_umask = os.umask(0o022)
    try:
        with SessionDB(link) as db:
            db.create_session("s", "cli")
            db.append_message("s", "user", "private")
            modes = {p.name: os.stat(p).st_mode & 0o777 for p in disk.iterdir()}
    finally:
        os.umask(old_umask)
    assert link.is_symlink() and modes["state.db"] == 0o600
    assert {"state.db-wal", "state.db-shm"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, modes


# --- a killed upgrade's half-written copy ---------------------------------------------------------------

def test_an_open_removes_half_written_copies_a_killed_process_left(tmp_path):
    # The pre-upgrade copy is written with SQLite into a `.partial-<pid>-<hex>` name; a SIGKILL
    # mid-copy leaves it and its journal. The next open removes them, but never a copy whose
    # writer is still running, nor another name.
    path = tmp_path / "state.db"
    SessionDB(path).close()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid, live_pid = int(gone.stdout), child.pid
    try:
        left = [tmp_path / f"state.db.pre-v31-20260101T000000Z.bak.partial-{dead_pid}-0123abcd",
                tmp_path / f"state.db.pre-v31-20260101T000000Z.bak.partial-{dead_pid}-0123abcd-journal"]
        kept = [tmp_path / f"state.db.pre-v31-20260101T000000Z.bak.partial-{live_pid}-89abcdef",
                tmp_path / f"other.db.partial-{dead_pid}-0123abcd", tmp_path / "state.db.pre-v31-x.bak"]
        for p in left + kept:
            p.write_bytes(b"half a copy")
        with SessionDB(path) as db:
            db.create_session("s", "cli")
        assert [p for p in left if p.exists()] == []
        assert all(p.exists() for p in kept)
    finally:
        child.kill()
        child.wait()


def test_a_copy_killed_mid_write_is_cleaned_at_the_next_open(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "x" * 100_000)
    # A child starts writing a backup through the library, and is killed while the copy is open.
    code = ("import os, signal, sqlite3, sys; import hermes_state_recovery as r; "
            "real = sqlite3.connect\n"
            "def stop(*a, **k):\n    c = real(*a, **k)\n    if '.partial-' in str(a[0]):\n"
            "        c.execute('CREATE TABLE t (x)'); c.execute('BEGIN'); c.execute('INSERT INTO t VALUES (1)')\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n    return c\n"
            "from hermes_state import SessionDB\n"
            "db = SessionDB(sys.argv[1])\n"
            "r.sqlite3.connect = stop\n"
            "db.backup(sys.argv[1] + '.pre-v31-20260101T000000Z.bak')")
    subprocess.run([sys.executable, "-c", code, str(path)], env={**os.environ, "HERMES_STATE_DB_GUARD_BYPASS": "1"},
                   timeout=60)
    leftovers = sorted(p.name for p in tmp_path.iterdir() if ".partial-" in p.name)
    assert leftovers and any(n.endswith("-journal") for n in leftovers), leftovers
    SessionDB(path).close()
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


# --- text far longer than any LIKE pattern SQLite accepts (50,000 bytes) -------------------------

@pytest.mark.parametrize("long", ["_" * 25_001, "東" * 16_700, "%" * 60_000])
def test_long_text_in_id_and_title_lookups_answers_without_a_raw_sqlite_error(db, long):
    db.create_session("a_b", "cli", title="東京 trip")
    db.create_session("a" + long, "cli", title="plain")  # one session that does match (by its id)
    assert db.resolve_session_id(long) is None
    assert db.resolve_session_id("a" + long[:30_000]) == "a" + long
    assert [s["id"] for s in db.search_sessions_by_id(long)] == ["a" + long]
    assert [s["id"] for s in db.list_sessions_rich(search_query=long)] == ["a" + long]
    assert db.list_prune_candidates(older_than_days=0, title_like=long) == []
    assert db.list_prune_candidates(older_than_days=0, model_like=long + long) == []
    db.create_session("Zq-9", "cli")
    assert db.resolve_session_id("Zq") == "Zq-9" and db.resolve_session_id("zq") is None  # prefixes stay exact-case
    assert [s["id"] for s in db.list_sessions_rich(search_query="A_B")] == ["a_b"]  # substrings fold ASCII case
