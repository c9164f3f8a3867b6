"""hermes-agent 0.20.1's module functions for the file's health, journal and writability, differentially.

Each scenario is one probe script, run by the real hermes-agent 0.20.1 in its own venv and by
this library in a subprocess of its own (both modules are named `hermes_state`), each with a
fresh HERMES_HOME; the probes print JSON answers, projected where the two differ on purpose
(docs/api.md, "hermes-agent 0.20.1: the file's health, journal and writability"), and compared.
The unmarked tests hold this library's own answers where it differs.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agent_releases import AGENT_020, PENDING

ROOT = Path(__file__).resolve().parent.parent
differential = pytest.mark.hermes_agent


def _run(python: str, script: str, home: Path, prefix: list[str] | None = None) -> Any:
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HERMES_HOME=str(home), PYTHONPATH=str(ROOT) if python == sys.executable else "")
    command = [python, "-c", textwrap.dedent(script)]
    if prefix:  # a shell wrapper (capsh) takes the command as one string
        command = prefix + [" ".join(shlex.quote(part) for part in command)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=home)
    assert proc.returncode == 0, f"{python} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def both(tmp_path: Path, script: str, prefix: list[str] | None = None) -> tuple[Any, Any]:
    """Return (hermes-agent 0.20.1's answer, hermes-state's answer) to the probe `script`, each in a fresh home."""
    AGENT_020.require()
    return (_run(str(AGENT_020.python), script, tmp_path / "agent" / "home", prefix),
            _run(sys.executable, script, tmp_path / "ours" / "home", prefix))


@differential
def test_the_wal_reset_check_and_source_id_answer_as_hermes_agent(tmp_path):
    theirs, mine = both(tmp_path, """
        import json, sqlite3, hermes_state as h
        versions = [None, (3, 40, 1), (3, 51, 2), (3, 51, 3), (3, 50, 7), (3, 50, 6), (3, 44, 6), (3, 44, 5),
                    (3, 45, 0), (3, 6, 23), (3, 7, 0), (3, 52, 0), (3, 51), (3,), (), (3, 44, 6, 1), ("3", "51", "2")]
        out = {"vulnerable": [h.is_sqlite_wal_reset_vulnerable(v) for v in versions],
               "source_id": h.sqlite_source_id(), "linked": sqlite3.connect(":memory:").execute(
                   "SELECT sqlite_source_id()").fetchone()[0]}
        try:
            h.is_sqlite_wal_reset_vulnerable(("x",))
        except ValueError:
            out["bad"] = "ValueError"
        print(json.dumps(out))
    """)
    assert theirs == mine
    assert mine["source_id"] == mine["linked"] and mine["bad"] == "ValueError"
    assert mine["vulnerable"][1:5] == [True, True, False, False]


@differential
def test_the_configured_journal_mode_answers_as_hermes_agent(tmp_path):
    theirs, mine = both(tmp_path, """
        import json, os, pathlib, hermes_state as h
        config = pathlib.Path(os.environ["HERMES_HOME"]) / "config.yaml"
        out = [h.resolve_journal_mode()]
        for text in ["database:\\n  journal_mode: delete\\n", "database:\\n  journal_mode: DELETE\\n",
                     "database:\\n  journal_mode: ' delete '\\n", "database:\\n  journal_mode: wal\\n",
                     "database:\\n  journal_mode: truncate\\n", "database:\\n  journal_mode: 1\\n",
                     "database: 5\\n", ":::: [\\n"]:
            config.write_text(text)
            out.append(h.resolve_journal_mode())
        print(json.dumps(out))
    """)
    assert theirs == mine == ["wal", "delete", "delete", "delete", "wal", "wal", "wal", "wal", "wal"]


@differential
def test_the_configured_pragmas_apply_as_in_hermes_agent(tmp_path):
    theirs, mine = both(tmp_path, """
        import json, os, pathlib, sqlite3, hermes_state as h
        home = pathlib.Path(os.environ["HERMES_HOME"])
        conn = sqlite3.connect(home / "p.db")
        names = ["cache_size", "mmap_size", "temp_store", "wal_autocheckpoint", "journal_size_limit", "synchronous"]
        read = lambda: [conn.execute(f"PRAGMA {n}").fetchone()[0] for n in names]
        out = []
        for text in [None, "database:\\n  cache_size: -1000\\n  mmap_size: 65536\\n  temp_store: 2\\n"
                           "  wal_autocheckpoint: 500\\n  journal_size_limit: 123456\\n  synchronous: 0\\n",
                     "database:\\n  cache_size: '-3000'\\n  mmap_size: true\\n  wal_autocheckpoint: 1.5\\n"
                     "  journal_size_limit: x\\n", "database: [1, 2]\\n", ":::: [\\n"]:
            if text is not None:
                (home / "config.yaml").write_text(text)
            out.append([h.apply_database_pragmas(conn, db_label="p.db"), read()])
        try:
            h.apply_database_pragmas(conn, "p.db")
        except TypeError:
            out.append("TypeError")
        print(json.dumps(out))
    """)
    assert theirs == mine
    assert mine[1][1][:5] == [-1000, 65536, 2, 500, 123456] and mine[2][1][0] == -3000 and mine[-1] == "TypeError"


@differential
def test_disk_full_errors_are_told_as_hermes_agent_tells_them(tmp_path):
    theirs, mine = both(tmp_path, """
        import errno, json, sqlite3, hermes_state as h
        cases = [OSError(errno.ENOSPC, "x"), OSError(errno.EIO, "x"), OSError(errno.EDQUOT, "x"),
                 sqlite3.OperationalError("database or disk is full"), sqlite3.OperationalError("disk I/O error"),
                 "No space left on device", "ENOSPC", "enospc", "disk full", "DISK FULL", "x disk full y",
                 "Disk Is Full", "database or disk is full", "There is not enough space on the disk", None, "", 28,
                 ValueError("no space left on device"), RuntimeError("x"), "disk quota exceeded", "[Errno 28] x"]
        print(json.dumps([h.is_disk_full_error(c) for c in cases]))
    """)
    assert theirs == mine
    assert mine[:5] == [True, False, False, True, False]


def test_a_full_disk_is_told_by_sqlites_code_too():
    # This library classifies SQLite errors by their result code first (SQLITE_FULL is 13).
    import hermes_state
    exc = sqlite3.OperationalError("a message naming nothing")
    exc.sqlite_errorcode = 13  # type: ignore[attr-defined]
    assert hermes_state.is_disk_full_error(exc) is True
    exc.sqlite_errorcode = 10  # type: ignore[attr-defined]
    assert hermes_state.is_disk_full_error(exc) is False


ZEROED_FILES = """
    import json, os, pathlib, re, sqlite3, hermes_state as h
    home = pathlib.Path(os.environ["HERMES_HOME"])
    d = home / "z"
    d.mkdir()
    files = {"empty": b"", "zero100": b"\\0" * 100, "zero4096": b"\\0" * 4096, "zero50": b"\\0" * 50,
             "zerothen": b"\\0" * 100 + b"x" * 100, "xthenzero": b"x" + b"\\0" * 4095, "text": b"abc" * 100}
    out = {}
    for name, data in files.items():
        (d / name).write_bytes(data)
        out[name] = [h.is_zeroed_state_db(d / name), h.is_zeroed_state_db(d / name, force=True),
                     h.is_zeroed_state_db(d / name, probe_bytes=10)]
    real = d / "real.db"
    c = sqlite3.connect(real); c.execute("CREATE TABLE t (x)"); c.commit(); c.close()
    out["real"] = h.is_zeroed_state_db(real)
    out["missing"] = h.is_zeroed_state_db(d / "nope")
    out["folder"] = h.is_zeroed_state_db(d)
    db = home / "state.db"
    db.write_bytes(b"\\0" * 4096)
    (home / "state.db-wal").write_bytes(b"\\0" * 10)
    (home / "state.db-shm").write_bytes(b"\\0" * 10)
    moved = h.quarantine_zeroed_state_db(db)
    shape = lambda name: re.sub(r"\\d{8}-\\d{6}-\\d+", "STAMP", name)
    out["moved"] = shape(moved.name) if moved else None
    out["where"] = moved.parent == home if moved else None
    out["kept"] = moved.read_bytes() == b"\\0" * 4096 if moved else None
    out["home"] = sorted(shape(p.name) for p in home.iterdir() if p.name.startswith("state.db"))
    out["again"] = h.quarantine_zeroed_state_db(db)
    out["not zeroed"] = h.quarantine_zeroed_state_db(real)
    out["real still"] = real.exists()
    print(json.dumps(out))
"""


@differential
def test_zeroed_files_are_found_and_moved_aside_as_hermes_agent_does(tmp_path):
    theirs, mine = both(tmp_path, ZEROED_FILES)
    assert theirs == mine
    assert mine["zero50"] == [True, True, True] and mine["xthenzero"] == [False] * 3 and mine["empty"] == [False] * 3
    assert mine["moved"] == "state.db.zeroed-STAMP.bak" and mine["kept"] and mine["again"] is None
    assert mine["home"] == ["state.db.quarantine.lock", "state.db.zeroed-STAMP.bak", "state.db.zeroed-STAMP.bak-shm",
                            "state.db.zeroed-STAMP.bak-wal"]


def test_a_zeroed_file_this_process_has_open_is_not_read_unless_forced(tmp_path):
    # Reading its header would mean closing a descriptor on it, which drops this process's locks.
    import hermes_state
    path = tmp_path / "state.db"
    path.write_bytes(b"\0" * 4096)
    with open(path, "rb"):
        assert hermes_state.is_zeroed_state_db(path) is False
        assert hermes_state.quarantine_zeroed_state_db(path) is None and path.exists()
        assert hermes_state.is_zeroed_state_db(path, force=True) is True
    assert hermes_state.is_zeroed_state_db(path) is True


@differential
def test_holders_are_counted_as_hermes_agent_counts_them(tmp_path):
    theirs, mine = both(tmp_path, """
        import json, os, pathlib, sqlite3, subprocess, sys, hermes_state as h
        home = pathlib.Path(os.environ["HERMES_HOME"])
        db = home / "x.db"
        out = [h.count_db_holders(db)]
        c = sqlite3.connect(db); c.execute("CREATE TABLE t (x)"); c.commit()
        out.append(h.count_db_holders(db))
        c2 = sqlite3.connect(db); c2.execute("SELECT * FROM t").fetchall()
        out.append(h.count_db_holders(db))
        child = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                                  "c.execute('SELECT * FROM t').fetchall(); print('ok', flush=True); sys.stdin.read()",
                                  str(db)], stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        child.stdout.readline()
        out.append(h.count_db_holders(db))
        (home / "link.db").symlink_to(db)
        out.append(h.count_db_holders(home / "link.db"))
        child.stdin.close(); child.wait()
        c.close(); c2.close()
        out.append(h.count_db_holders(db))
        print(json.dumps(out))
    """)
    assert theirs == mine == [0, 1, 1, 2, 2, 0]


STATS = """
    import json, os, pathlib, sqlite3, hermes_state as h
    home = pathlib.Path(os.environ["HERMES_HOME"])
    plain = home / "plain.db"
    c = sqlite3.connect(plain); c.execute("CREATE TABLE t (x)"); c.commit(); c.close()
    shaped = home / "shaped.db"
    c = sqlite3.connect(shaped)
    c.executescript("CREATE TABLE sessions (id TEXT); CREATE TABLE messages (id INTEGER);"
                    "CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);"
                    "CREATE TABLE messages_fts (x); INSERT INTO sessions VALUES ('a'), ('b');"
                    "INSERT INTO messages VALUES (1), (2), (3);"
                    "INSERT INTO state_meta VALUES ('fts_storage_version', '1'), ('fts_rebuild_high_water', '9'),"
                    "('fts_rebuild_progress', '4');")
    c.commit(); c.close()
    done = home / "done.db"
    c = sqlite3.connect(done)
    c.executescript("CREATE TABLE state_meta (key TEXT PRIMARY KEY, value TEXT);"
                    "INSERT INTO state_meta VALUES ('fts_rebuild_high_water', '9'), ('fts_rebuild_progress', '9');")
    c.commit(); c.close()
    (home / "junk.db").write_bytes(b"hello" * 100)
    out = {name: h.collect_state_db_stats(home / name) for name in ("missing.db", "plain.db", "shaped.db", "done.db",
                                                                    "junk.db")}
    out["untouched"] = sorted(p.name for p in home.iterdir())
    print(json.dumps(out))
"""


@differential
def test_file_statistics_answer_as_hermes_agent(tmp_path):
    theirs, mine = both(tmp_path, STATS)
    assert theirs == mine
    assert mine["shaped.db"]["fts_rebuild_pending"] is True and mine["shaped.db"]["messages"] == 3
    assert mine["done.db"]["fts_rebuild_pending"] is False and mine["missing.db"]["page_count"] is None
    assert "missing.db" not in mine["untouched"]


def test_statistics_of_a_live_store_take_no_lock_and_change_nothing(tmp_path):
    import hermes_state
    path = tmp_path / "state.db"
    with hermes_state.SessionDB(path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "hello")
        with db.transaction():  # a writer holds the lock: the probe still reads
            stats = hermes_state.collect_state_db_stats(path)
        assert stats["sessions"] == 1 and stats["messages"] == 1 and stats["journal_mode"] == "wal"
        assert stats["fts_tables"]["messages_fts"] is True and stats["page_size"] == 8192
        db.append_message("s", "assistant", "still writable")
        assert db.message_count("s") == 2


PREFLIGHT = """
    import json, os, pathlib, sqlite3, hermes_state as h
    home = pathlib.Path(os.environ["HERMES_HOME"])
    out = {}
    def attempt(label, path, **kw):
        try:
            h.preflight_db_writability(path, **kw)
            out[label] = "ok"
        except sqlite3.OperationalError as exc:
            out[label] = ["OperationalError", str(path) in str(exc), "chmod" in str(exc),
                          kw.get("db_label", "state.db") in str(exc)]
    db = home / "state.db"
    attempt("missing", db)
    out["created"] = db.exists()
    c = sqlite3.connect(db); c.execute("CREATE TABLE t (x)"); c.commit(); c.close()
    (home / "state.db-wal").write_bytes(b"")
    os.chmod(db, 0o444); os.chmod(home / "state.db-wal", 0o400)
    attempt("read-only inside", db)
    out["modes"] = [oct(db.stat().st_mode & 0o777), oct((home / "state.db-wal").stat().st_mode & 0o777)]
    outside = home.parent / "outside"
    outside.mkdir()
    o = outside / "o.db"
    c = sqlite3.connect(o); c.execute("CREATE TABLE t (x)"); c.commit(); c.close()
    os.chmod(o, 0o444)
    attempt("read-only outside", o)
    attempt("read-only outside, labelled", o, db_label="kanban.db")
    os.chmod(o, 0o644)
    (outside / "o.db-shm").write_bytes(b"")
    os.chmod(outside / "o.db-shm", 0o444)
    attempt("shm outside", o)
    out["shm mode"] = oct((outside / "o.db-shm").stat().st_mode & 0o777)
    os.chmod(outside / "o.db-shm", 0o644)
    attempt("writable outside", o)
    folder = outside / "folder"
    folder.mkdir()
    os.chmod(folder, 0o555)
    attempt("read-only folder, no file yet", folder / "n.db")
    os.chmod(folder, 0o755)
    attempt("memory", pathlib.Path(":memory:"))
    print(json.dumps(out))
"""


def _unprivileged() -> list[str] | None:
    # root writes any file regardless of its mode: the checks are seen only without those powers.
    if os.geteuid() != 0:
        return None
    capsh = shutil.which("capsh")
    if capsh is None:
        pytest.skip("running as root without capsh: a read-only file cannot be shown to be unwritable")
    return [capsh, "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c"]


@differential
def test_writability_is_checked_and_repaired_as_hermes_agent_does(tmp_path):
    theirs, mine = both(tmp_path, PREFLIGHT, _unprivileged())
    assert theirs == mine
    assert mine["read-only inside"] == "ok" and mine["modes"] == ["0o644", "0o600"] and not mine["created"]
    assert mine["read-only outside"] == ["OperationalError", True, True, True]
    assert mine["read-only outside, labelled"][3] and mine["shm outside"][1] and mine["shm mode"] == "0o444"


def test_a_file_not_writable_is_a_typed_error_that_names_the_fix(tmp_path, monkeypatch):
    import hermes_state
    from hermes_state_errors import StateDbNotWritableError, StoreUnavailableError
    path = tmp_path / "outside" / "state.db"
    path.parent.mkdir()
    path.write_bytes(b"")
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: False)  # as an unprivileged user would see it
    with pytest.raises(StateDbNotWritableError) as caught:
        hermes_state.preflight_db_writability(path)
    assert isinstance(caught.value, sqlite3.OperationalError) and isinstance(caught.value, StoreUnavailableError)
    assert f"chmod u+rw '{path}'" in str(caught.value)


@differential
def test_wal_unsupported_is_an_operational_error_in_both(tmp_path):
    theirs, mine = both(tmp_path, """
        import json, sqlite3, inspect, hermes_state as h
        sig = inspect.signature(h.apply_wal_with_fallback)
        print(json.dumps([issubclass(h.WalUnsupportedError, sqlite3.OperationalError),
                          sig.parameters["require_wal"].kind.name, sig.parameters["require_wal"].default]))
    """)
    assert theirs == mine == [True, "KEYWORD_ONLY", False]


class _RefusingConnection:
    """A connection whose file system refuses WAL's shared memory, as NFS does."""

    def __init__(self) -> None:
        self.mode = "delete"

    def execute(self, sql: str) -> Any:
        if sql == "PRAGMA journal_mode=WAL":
            raise sqlite3.OperationalError("locking protocol")
        if sql.startswith("PRAGMA journal_mode="):
            self.mode = sql.split("=", 1)[1].lower()
        return self

    def fetchone(self) -> tuple[str]:
        return (self.mode,)


def test_requiring_wal_where_the_file_system_refuses_raises_and_changes_nothing():
    import hermes_state
    conn = _RefusingConnection()
    with pytest.raises(hermes_state.WalUnsupportedError, match="locking protocol"):
        hermes_state.apply_wal_with_fallback(conn, "nfs.db", require_wal=True)  # type: ignore[arg-type]
    assert conn.mode == "delete"
    assert hermes_state.apply_wal_with_fallback(conn, "nfs.db") == "delete"  # type: ignore[arg-type]


@differential
def test_the_mixins_hold_as_in_hermes_agent(tmp_path):
    probe = """
        import json, os, pathlib, hermes_state as h
        db = h.SessionDB(db_path=pathlib.Path(os.environ["HERMES_HOME"]) / "state.db")
        mixins = [h.SessionPortabilityMixin, h.SessionSchemaMixin, h.SessionSearchMixin]
        print(json.dumps({m.__name__: [issubclass(h.SessionDB, m), isinstance(db, m), isinstance(object(), m),
                                        sorted(n for n in dir(m) if not n.startswith("_"))] for m in mixins}))
        db.close()
    """
    theirs, mine = both(tmp_path, probe)
    for name, (sub, inst, other, names) in theirs.items():
        assert mine[name][:3] == [sub, inst, other] == [True, True, False], name
        # Each public name the agent's mixin holds is the mixin's here once SessionDB has it.
        assert set(names) - set(mine[name][3]) <= PENDING["SessionDB"], name
