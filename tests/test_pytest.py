"""hermes_state_pytest, the plugin other projects load: the temporary home, the open handle, the guard marker."""
from __future__ import annotations

import os

import pytest

import hermes_state_pytest as plugin
from hermes_state_home import get_hermes_home, guard_bypassed


def test_hermes_home_points_the_environment_and_the_library_at_a_fresh_directory(hermes_home, tmp_path):
    assert hermes_home.is_dir() and list(hermes_home.iterdir()) == []
    assert hermes_home.is_relative_to(tmp_path)
    assert os.environ["HERMES_HOME"] == str(hermes_home) and os.environ["HERMES_TEST_ISOLATION"] == "1"
    assert get_hermes_home() == hermes_home


def test_session_db_is_an_open_handle_in_that_home(session_db, hermes_home):
    session_db.create_session("s", "cli")
    assert session_db.get_session("s")["source"] == "cli"
    assert (hermes_home / "state.db").exists()


def test_the_guard_is_on_for_an_unmarked_test():
    assert not guard_bypassed() or os.environ.get("HERMES_STATE_DB_GUARD_BYPASS") == "1"


@pytest.mark.live_system_guard_bypass
def test_the_marker_bypasses_the_guard_for_its_test_only():
    assert guard_bypassed()


def test_the_marker_is_registered(pytestconfig):
    assert any(line.startswith(f"{plugin.MARKER}:") for line in pytestconfig.getini("markers"))
