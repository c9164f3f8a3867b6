"""pytest plugin of hermes-state: temporary-home fixtures and the live-system guard marker.

Registered through the `pytest11` entry point, so it loads in every pytest run of every project in
the environment. For that reason nothing here is autouse: a project opts in by requesting a fixture.

Provides:
- marker `live_system_guard_bypass`: the marked test (setup, call and teardown) may open production
  databases; it switches the guard off in-process for that item only.
- fixture `hermes_home`: a fresh directory used as HERMES_HOME (env and context override) with
  `HERMES_TEST_ISOLATION=1` set, so the guard is armed even in child processes.
- fixture `session_db`: an open `SessionDB` in that home, closed after the test.

Transaction contract: none of its own; `session_db` is the ordinary facade.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from hermes_state_home import hermes_home_override, live_system_guard_bypass

MARKER = "live_system_guard_bypass"


def pytest_configure(config: pytest.Config) -> None:
    """Register the guard-bypass marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}: let this test open production Hermes databases in-process (use sparingly).",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run items carrying the marker with the guard bypassed, from setup through teardown."""
    if item.get_closest_marker(MARKER) is None:
        yield
        return
    with live_system_guard_bypass():
        yield


@pytest.fixture
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point HERMES_HOME (env and context override) at a fresh temporary directory."""
    home = tmp_path / "hermes_home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("HERMES_TEST_ISOLATION", "1")
    with hermes_home_override(home):
        yield home


@pytest.fixture
def session_db(hermes_home: Path) -> Iterator[Any]:
    """Open a SessionDB in the temporary home and close it after the test."""
    from hermes_state import SessionDB  # lazily: the plugin must load even where the facade can't

    db = SessionDB()
    try:
        yield db
    finally:
        db.close()
