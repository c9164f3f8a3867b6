"""Session ids on the command line: a unique prefix is enough, as git takes a short hash."""
from __future__ import annotations

import json

import pytest

from hermes_state import SessionDB
from hermes_state_errors import AmbiguousSessionIdError
from hermes_state_cli import main


@pytest.fixture
def store(hermes_home):
    with SessionDB() as db:
        for sid, title in (("demo_tokyo", "Tokyo"), ("demo_docker", "Docker"), ("demo_docker_2", None)):
            db.create_session(sid, "cli", title=title)
            db.append_message(sid, "user", f"hello from {sid}")
    return hermes_home


@pytest.mark.parametrize("argv", [["sessions", "show", "demo_t"], ["sessions", "show", "demo_t", "--json"],
                                  ["sessions", "export", "demo_t"], ["sessions", "rename", "demo_t", "Trip"],
                                  ["sessions", "delete", "demo_t", "--dry-run"]])
def test_a_unique_prefix_names_the_session(store, capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "demo_tokyo" in out and "demo_docker" not in out


def test_an_exact_id_wins_over_the_ids_it_starts(store, capsys):
    assert main(["sessions", "show", "demo_docker", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["session"]["id"] == "demo_docker"


def test_an_ambiguous_prefix_lists_the_candidates_and_exits_2(store, capsys):
    for argv in (["sessions", "show", "demo_d"], ["sessions", "delete", "demo"], ["sessions", "export", "demo_"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "demo_docker, demo_docker_2" in err
    with SessionDB() as db:
        assert db.get_session("demo_docker") is not None and db.get_session("demo_tokyo") is not None


def test_an_unknown_id_is_not_found(store, capsys):
    assert main(["sessions", "show", "nope"]) == 1
    assert capsys.readouterr().err == "hermes-state: session 'nope' not found\n"


def test_prefixes_are_case_sensitive_and_literal(store):
    with SessionDB() as db:
        assert db.session_ids_with_prefix("demo_d") == ["demo_docker", "demo_docker_2"]
        assert db.session_ids_with_prefix("DEMO") == [] and db.session_ids_with_prefix("demo%") == []
        assert db.session_ids_with_prefix("demo", limit=1) == ["demo_docker"]
        with pytest.raises(ValueError):
            db.session_ids_with_prefix("")
    assert issubclass(AmbiguousSessionIdError, ValueError)
