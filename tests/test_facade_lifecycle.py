"""SessionDB lifecycle: guard at construction, profile binding, close, shared handles, async."""
from __future__ import annotations

import asyncio

import pytest

from hermes_state import AsyncSessionDB, HermesStateError, SessionDB
from hermes_state_home import hermes_home_override


def test_guard_refuses_default_home_under_pytest_before_creating_anything(fake_home):
    with pytest.raises(RuntimeError) as info:
        SessionDB()
    with pytest.raises(RuntimeError):
        SessionDB(fake_home / ".hermes" / "profiles" / "coder" / "state.db")
    message = str(info.value)
    assert str(fake_home / ".hermes" / "state.db") in message
    assert "HERMES_STATE_DB_GUARD_BYPASS=1" in message and "live_system_guard_bypass" in message
    assert list(fake_home.iterdir()) == []  # no directory, no file


def test_guard_env_bypass_allows_the_open(fake_home, monkeypatch):
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "1")
    with SessionDB() as db:
        db.create_session("s", "cli")
    assert (fake_home / ".hermes" / "state.db").exists()


@pytest.mark.live_system_guard_bypass
def test_guard_marker_bypass_allows_the_open(fake_home):
    with SessionDB() as db:
        assert db.db_path == fake_home / ".hermes" / "state.db"


def test_profile_home_is_bound_at_construction(hermes_home, tmp_path, monkeypatch):
    db = SessionDB()
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "elsewhere"))
    with hermes_home_override(tmp_path / "elsewhere"):
        assert db.profile_home == hermes_home
        assert db.db_path == hermes_home / "state.db"
    db.close()


def test_close_is_idempotent_and_context_manager_closes(db):
    db.create_session("s", "cli")
    db.close()
    db.close()
    with pytest.raises(HermesStateError, match="closed"):
        db.get_session("s")
    with SessionDB() as again:
        assert again.get_session("s")["id"] == "s"
    with pytest.raises(HermesStateError):
        again.create_session("t", "cli")


def test_shared_handles_are_reference_counted(hermes_home):
    first = SessionDB.shared()
    second = SessionDB.shared(hermes_home / "state.db")
    assert first is second
    first.release()  # the retiring owner must not close the successor's handle
    second.create_session("still_open", "cli")
    second.release()
    assert second.closed
    third = SessionDB.shared()
    assert third is not first and third.get_session("still_open") is not None
    third.release()


def test_async_facade(db):
    async def run():
        adb = AsyncSessionDB(db)
        await adb.create_session("a1", "cli", "m")
        return await adb.get_session("a1")
    row = asyncio.run(run())
    assert row["id"] == "a1" and row["model"] == "m"
    assert AsyncSessionDB(db).db_path == db.db_path


def test_async_iter_export_streams_on_worker_threads(db):
    import inspect
    import threading
    for sid in ("a", "b", "c"):
        db.create_session(sid, "cli")
    assert inspect.isasyncgenfunction(AsyncSessionDB.iter_export)
    assert inspect.signature(AsyncSessionDB.iter_export) == inspect.signature(SessionDB.iter_export)
    ran_on: set[int] = set()

    async def run() -> tuple[int, list[str]]:
        adb = AsyncSessionDB(db)
        with db.tracer(lambda sql: ran_on.add(threading.get_ident())):
            ids = [doc["session"]["id"] async for doc in adb.iter_export()]
        return threading.get_ident(), ids
    loop_thread, ids = asyncio.run(run())
    assert ids == ["a", "b", "c"]
    assert ran_on and loop_thread not in ran_on  # no statement ran on the event loop's thread


def test_async_twins_cover_every_public_database_method(db):
    import inspect
    plain = {"close", "release", "shared", "to_provider_messages", "tracer", "transaction"}
    public = {n for cls in SessionDB.__mro__[:-1] for n, m in vars(cls).items()  # its base's methods too
              if not n.startswith("_") and callable(m)} - plain
    assert public <= set(vars(AsyncSessionDB))
    for name in public - {"iter_export"}:
        assert inspect.iscoroutinefunction(getattr(AsyncSessionDB, name)), name
    assert AsyncSessionDB(db).closed is False


def test_closing_a_shared_handle_gives_back_one_use(hermes_home):
    first = SessionDB.shared()
    with SessionDB.shared() as second:  # a successor that leaves through `with`
        assert second is first
    first.create_session("still_usable", "cli")  # the first owner's handle survived
    first.close()  # the last use: now it really closes
    assert first.closed
    with pytest.raises(HermesStateError, match="closed"):
        first.get_session("still_usable")


def test_shared_key_survives_a_chdir(hermes_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handle = SessionDB.shared("relative.db")
    monkeypatch.chdir(hermes_home)
    handle.release()
    assert handle.closed and handle.db_path == tmp_path / "relative.db"


def test_close_while_other_threads_use_the_handle_gives_typed_errors(db):
    import threading
    db.create_session("s", "cli")
    errors: list[BaseException] = []
    working = [threading.Event() for _ in range(4)]
    stop = threading.Event()  # set only if a worker is still going long after the close: the test then fails

    def worker(k: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                db.append_message("s", "user", f"{k}-{i}")
                db.get_session("s")
            except BaseException as exc:  # noqa: BLE001 - collected and checked below
                errors.append(exc)
                return
            working[k].set()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    assert all(started.wait(10) for started in working)  # every worker is mid-loop when the handle closes
    db.close()
    for t in threads:
        t.join(10)
    stop.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 4, "every worker's first call after the close should have failed"
    assert all(isinstance(e, HermesStateError) and "closed" in str(e) for e in errors), errors


def test_bad_argument_types_are_value_errors_not_sqlite_tracebacks(db, rival):
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.get_session(["s"])
    with pytest.raises(ValueError):
        db.get_messages({"s": 1})
    with pytest.raises(ValueError):
        db.end_session(["s"], "done")
    with pytest.raises(ValueError):
        db.create_session("s\ud800", "cli")
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    assert not db.in_transaction


def test_corrupt_pages_give_a_typed_error_at_open_or_at_read(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s", "cli")
        for i in range(300):
            db.append_message("s", "user", f"message {i} " + "x" * 400)
    data = bytearray(path.read_bytes())
    page = 4096
    for n in range(6, len(data) // page - 2):  # leave page 1 (the schema) readable
        data[n * page + 8: n * page + 200] = b"\x13" * 192
    path.write_bytes(bytes(data))
    from hermes_state import StateDbCorruptError
    with pytest.raises(StateDbCorruptError):
        with SessionDB(path) as db:
            db.get_messages("s")
            db.search_messages("message")


def test_every_read_and_write_maps_corruption_to_the_typed_error(tmp_path):
    import sqlite3
    from hermes_state_errors import typed_errors
    from hermes_state import StateDbCorruptError
    malformed = sqlite3.DatabaseError("database disk image is malformed")
    malformed.sqlite_errorcode = 11
    with pytest.raises(StateDbCorruptError) as info:
        with typed_errors(tmp_path / "x.db"):
            raise malformed
    assert info.value.__cause__ is malformed
    other = sqlite3.OperationalError("no such table: nope")
    with pytest.raises(sqlite3.OperationalError):  # unexpected SQLite errors propagate untouched
        with typed_errors(tmp_path / "x.db"):
            raise other


def test_memory_database_leaves_no_file(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with SessionDB(":memory:") as db:
        db.create_session("s", "cli")
        assert db.get_session("s")["id"] == "s"
    assert list(cwd.iterdir()) == []


def test_write_patience_counts_time_waiting_for_another_thread(db):
    import threading
    from hermes_state import SessionPersistenceError
    db.create_session("s", "cli")
    holding, release = threading.Event(), threading.Event()

    def long_writer() -> None:
        with db.transaction():
            holding.set()
            release.wait(30)  # held until the late write has given up

    t = threading.Thread(target=long_writer)
    t.start()
    assert holding.wait(10)
    db.write_patience_s = 0.05
    try:
        with pytest.raises(SessionPersistenceError):
            db.create_session("late", "cli")
        # bounded by the patience, not by the other thread's transaction, which is still open
        assert t.is_alive() and not release.is_set()
    finally:
        release.set()
        t.join(10)
    assert db.get_session("late") is None


def test_list_sessions_across_profiles_reports_each_failure(tmp_path):
    from hermes_state import list_sessions_across_profiles
    root = tmp_path / "root"
    with SessionDB(root / "state.db") as db:
        db.create_session("d1", "cli", started_at=1.0)
    with SessionDB(root / "profiles" / "coder" / "state.db") as db:
        db.create_session("c1", "cli", started_at=2.0)
    (root / "profiles" / "empty").mkdir()
    (root / "profiles" / "broken").mkdir()
    (root / "profiles" / "broken" / "state.db").write_bytes(b"not a database at all" * 100)
    result = list_sessions_across_profiles(root)
    assert [(s["id"], s["profile"]) for s in result["sessions"]] == [("c1", "coder"), ("d1", "default")]
    errors = {e["profile"]: e["error"] for e in result["errors"]}
    assert set(errors) == {"empty", "broken"}
    assert "StateDbUninitializedError" in errors["empty"] and "StateDbCorruptError" in errors["broken"]
    assert not (root / "profiles" / "empty" / "state.db").exists()  # read-only: nothing created
    assert list_sessions_across_profiles(root, limit=1)["sessions"][0]["id"] == "c1"
