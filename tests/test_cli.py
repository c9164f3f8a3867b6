"""The hermes-state command line: demo, sessions commands, --json, exit codes, one-line errors."""
from __future__ import annotations

import json

from hermes_state import SessionDB
from hermes_state_cli import main


def test_demo_shows_listing_lineage_conversation_and_search(capsys, hermes_home):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Fix Docker Build #2" in out and "ended: compression" in out
    assert ">>>東京<<<" in out and ">>>alice@example.com<<<" in out
    assert not (hermes_home / "state.db").exists()  # the demo used a throw-away home


def test_sessions_commands(capsys, hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli", "m", input_tokens=10, output_tokens=5)
        db.append_message("s1", "user", "deploy the kanban board")
        db.create_session("s2", "telegram")
    assert main(["--json", "sessions", "list"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == ["s2", "s1"] and rows[1]["preview"] == "deploy the kanban board"
    assert main(["sessions", "list", "--source", "cli"]) == 0
    out = capsys.readouterr().out
    assert "s1" in out and "s2" not in out
    assert main(["sessions", "rename", "s1", "Kanban deploy"]) == 0
    capsys.readouterr()
    assert main(["--json", "sessions", "show", "s1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["session"]["title"] == "Kanban deploy" and shown["messages"][0]["content"].startswith("deploy")
    assert main(["--json", "sessions", "search", "kanban"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["session_id"] == "s1"
    assert main(["--json", "sessions", "stats"]) == 0
    assert json.loads(capsys.readouterr().out)["top_sessions"][0]["id"] == "s1"
    assert main(["--json", "fts", "status"]) == 0
    assert "pending" in json.loads(capsys.readouterr().out)


def test_errors_are_one_line_with_exit_codes(capsys, hermes_home):
    SessionDB().close()
    assert main(["sessions", "show", "missing"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err and "Traceback" not in err
    assert main(["--profile", "nope", "sessions", "list"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["--db", str(hermes_home / "absent.db"), "sessions", "list"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (hermes_home / "absent.db").exists()


def test_show_prints_a_multimodal_message_as_its_text_and_part_marks(capsys, hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", [{"type": "text", "text": "look at this"},
                                         {"type": "image_url", "image_url": {"url": "https://x/y.png"}}])
    assert main(["sessions", "show", "s1"]) == 0
    assert "look at this [image_url]" in capsys.readouterr().out
    assert main(["sessions", "show", "s1", "--full"]) == 0
    assert "look at this [image_url]" in capsys.readouterr().out


def test_search_shows_titles_and_reaches_reasoning_when_asked(capsys, hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Night shift")
        db.append_message("s1", "assistant", "ok", reasoning_content="consider the pelican route")
    assert main(["sessions", "search", "pelican"]) == 0
    assert capsys.readouterr().out.strip() == ("no match in the messages' text; the models' reasoning matches: "
                                               "add --reasoning to search it too")
    assert main(["sessions", "search", "pelican", "--reasoning"]) == 0
    out = capsys.readouterr().out
    assert "s1  Night shift  assistant" in out and "pelican" in out


def test_a_phrase_whose_quotes_reach_the_command_is_whole_words(capsys, hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli")
        ids = [db.append_message("s1", "user", text) for text in ("the docker image", "xdocker imagery", "image docker")]
    def found(*words):
        assert main(["--json", "sessions", "search", *words]) == 0
        return sorted(h["id"] for h in json.loads(capsys.readouterr().out))
    assert found('"docker image"') == [ids[0]]           # the quotes kept from the shell: whole words
    assert found("docker image") == sorted(ids)          # two words, each anywhere (pieces too)
    assert found("docker", "image") == sorted(ids)


def test_a_hit_found_only_in_the_reasoning_says_so(capsys, hermes_home):
    with SessionDB() as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "assistant", "take the pelican ferry", reasoning_content="pelican or heron?")
        db.append_message("s1", "assistant", "ok", reasoning_content="consider the pelican route")
        db.append_message("s1", "user", "no birds here", reasoning_content=None)
    assert main(["--json", "sessions", "search", "pelican", "--reasoning"]) == 0
    hits = json.loads(capsys.readouterr().out)
    # The first reply matches in its text (and its reasoning); the second only in its reasoning.
    assert [h["in_reasoning"] for h in sorted(hits, key=lambda h: h["id"])] == [False, True]
    assert main(["sessions", "search", "pelican", "--reasoning"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("s1")]
    assert sorted(line.endswith("(in reasoning)") for line in lines) == [False, True]
    assert main(["--json", "sessions", "search", "pelican"]) == 0  # without --reasoning: no such field
    assert all("in_reasoning" not in h for h in json.loads(capsys.readouterr().out))
    assert main(["--json", "sessions", "search", "heron"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and "add --reasoning" in captured.err
    assert main(["sessions", "search", "birdless"]) == 0
    assert capsys.readouterr().out.strip() == "no match"
