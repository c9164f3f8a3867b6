"""SessionDB lifecycle: guard at construction, profile binding, close, shared handles, async."""
from __future__ import annotations

import asyncio
import os

import pytest

from hermes_state import AsyncSessionDB, HermesStateError, SessionDB
from hermes_state_home import hermes_home_override


def test_guard_refuses_default_home_under_pytest_before_creating_anything(tmp_path, monkeypatch):
    fake_home = tmp_path / "home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.delenv("HERMES_STATE_DB_GUARD_BYPASS", raising=False)
    with hermes_home_override(None):  # lift the test's temporary home
        with pytest.raises(RuntimeError) as info:
            SessionDB()
        with pytest.raises(RuntimeError):
            SessionDB(fake_home / ".hermes" / "profiles" / "coder" / "state.db")
    message = str(info.value)
    assert str(fake_home / ".hermes" / "state.db") in message
    assert "HERMES_STATE_DB_GUARD_BYPASS=1" in message and "live_system_guard_bypass" in message
    assert list(fake_home.iterdir()) == []  # no directory, no file


def test_guard_env_bypass_allows_the_open(tmp_path, monkeypatch):
    fake_home = tmp_path / "home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.setenv("HERMES_STATE_DB_GUARD_BYPASS", "1")
    with hermes_home_override(None), SessionDB() as db:
        db.create_session("s", "cli")
    assert (fake_home / ".hermes" / "state.db").exists()


@pytest.mark.live_system_guard_bypass
def test_guard_marker_bypass_allows_the_open(tmp_path, monkeypatch):
    fake_home = tmp_path / "home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    with hermes_home_override(None), SessionDB() as db:
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
    assert second._closed
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
