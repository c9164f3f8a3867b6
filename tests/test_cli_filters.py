"""Filters, times and machine output on the command line, as sqlite-utils and `llm logs` users expect them."""
from __future__ import annotations

import csv
import io
import json
import os
import time
from datetime import datetime, timedelta

import pytest

import hermes_state_render as render
from hermes_state import SessionDB
from hermes_state_cli import main

DAY = 86400.0


@pytest.fixture
def store(hermes_home):
    now = time.time()
    with SessionDB() as db:
        db.create_session("old", "CLI", "openai/gpt-5", input_tokens=100, output_tokens=10, estimated_cost_usd=0.5)
        db.create_session("new", "cli", "openrouter/openai/gpt-5", input_tokens=300, output_tokens=30,
                          estimated_cost_usd=1.5)
        db.create_session("tg", "telegram", "anthropic/claude-sonnet-4.6", input_tokens=50, output_tokens=5)
        db.create_session("mini", "cli", "openai/gpt-5-mini")
        for sid in ("old", "new", "tg", "mini"):
            db.append_message(sid, "user", f"docker question in {sid}")
    # Backdate one session and its message by 40 days, as if written then.
    import sqlite3
    conn = sqlite3.connect(hermes_home / "state.db")
    with conn:
        conn.execute("UPDATE sessions SET started_at = ?, last_activity_at = ? WHERE id = 'old'",
                     (now - 40 * DAY, now - 40 * DAY))
        conn.execute("UPDATE messages SET timestamp = ? WHERE session_id = 'old'", (now - 40 * DAY,))
    conn.close()
    return hermes_home


def _json(capsys, *argv: str):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_search_filters_by_time_model_and_source(store, capsys):
    sessions = lambda *a: sorted({h["session_id"] for h in _json(capsys, "sessions", "search", "docker", *a)})
    assert sessions() == ["mini", "new", "old", "tg"]
    assert sessions("--since", "30d") == ["mini", "new", "tg"]
    assert sessions("--until", "30d") == ["old"]
    assert sessions("--since", "today") == ["mini", "new", "tg"]
    assert sessions("--model", "gpt-5") == ["new", "old"]           # the whole name after any provider prefix
    assert sessions("--model", "OPENAI/GPT-5") == ["old"]
    assert sessions("--model", "gpt") == []                          # not a piece of a name
    assert sessions("--source", "CLI") == ["mini", "new", "old"]     # any case: both spellings
    assert sessions("--source", "telegram", "--source", "cli") == ["mini", "new", "old", "tg"]


def test_list_matches_source_and_model_the_same_way(store, capsys):
    assert sorted(r["id"] for r in _json(capsys, "sessions", "list", "--source", "Cli", "--model", "gpt-5")) \
        == ["new", "old"]
    assert [r["id"] for r in _json(capsys, "sessions", "list", "--since", "1y", "--until", "3mo")] == []


def test_when_takes_today_yesterday_months_and_years():
    now = datetime(2026, 3, 15, 14, 30).timestamp()
    assert render.parse_when("today", now) == datetime(2026, 3, 15).timestamp()
    assert render.parse_when("yesterday", now) == datetime(2026, 3, 14).timestamp()
    assert render.parse_when("3mo", now) == now - 90 * DAY and render.parse_when("1y", now) == now - 365 * DAY
    assert render.parse_age_days("1y") == 365 and render.parse_age_days("3mo") == 90
    with pytest.raises(ValueError, match="yesterday"):
        render.parse_when("last tuesday", now)


def test_stats_filters_and_json_without_duplicate_names(store, capsys):
    data = _json(capsys, "sessions", "stats", "--source", "cli")
    assert {r["model"]: r["session_count"] for r in data["by_model"]} == {"openai/gpt-5": 1,
                                                                         "openrouter/openai/gpt-5": 1,
                                                                         "openai/gpt-5-mini": 1}
    assert set(data["by_model"][0]) == {"model", "session_count", "input_tokens", "output_tokens", "cost_usd"}
    assert [r["id"] for r in data["top_sessions"]][:2] == ["new", "old"]
    recent = _json(capsys, "sessions", "stats", "--since", "30d")
    assert sum(r["input_tokens"] for r in recent["by_model"]) == 350
    assert "old" not in [r["id"] for r in recent["top_sessions"]]


def test_stats_per_period_by_model_or_source(store, capsys):
    days = _json(capsys, "sessions", "stats", "--by", "day")["by_model"]
    today = datetime.now().strftime("%Y-%m-%d")
    old_day = (datetime.now() - timedelta(days=40)).strftime("%Y-%m-%d")
    assert {(r["period"], r["model"]) for r in days} >= {(today, "openrouter/openai/gpt-5"), (old_day, "openai/gpt-5")}
    assert [r["period"] for r in days] == sorted(r["period"] for r in days)
    months = _json(capsys, "sessions", "stats", "--by", "month", "--group", "source")["by_source"]
    assert sum(r["session_count"] for r in months) == 4 and {r["source"] for r in months} == {"CLI", "cli", "telegram"}
    weeks = _json(capsys, "sessions", "stats", "--by", "week")["by_model"]
    assert all(datetime.strptime(r["period"], "%Y-%m-%d").weekday() == 0 for r in weeks)  # weeks start on Monday
    assert main(["sessions", "stats", "--by", "day"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:2] == ["period", "model"] and "█" not in out  # bars on a terminal only


def test_machine_times_are_iso_with_an_offset_unless_epoch_is_asked(store, capsys):
    row = next(r for r in _json(capsys, "sessions", "list") if r["id"] == "new")
    started = datetime.fromisoformat(row["started_at"])
    assert started.utcoffset() is not None and abs(started.timestamp() - time.time()) < 600
    raw = next(r for r in _json(capsys, "sessions", "list", "--epoch") if r["id"] == "new")
    assert isinstance(raw["started_at"], float) and abs(raw["started_at"] - started.timestamp()) < 1e-3
    hit = _json(capsys, "sessions", "search", "docker", "-n", "1")[0]
    assert datetime.fromisoformat(hit["timestamp"]).utcoffset() is not None
    assert main(["sessions", "list", "--csv", "-c", "id", "-c", "started_at"]) == 0
    first = next(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert datetime.fromisoformat(first["started_at"]).utcoffset() is not None


def test_search_json_gives_the_snippet_without_markers_and_the_offsets(store, capsys):
    hit = _json(capsys, "sessions", "search", "docker question", "-n", "1")[0]
    assert ">>>" not in hit["snippet"] and "<<<" not in hit["snippet"]
    assert [hit["snippet"][a:b].lower() for a, b in hit["matches"]] == ["docker", "question"]
    assert render.unmarked("a >>>b<<< c >>>dd<<<") == ("a b c dd", [[2, 3], [6, 8]])


def test_fts_status_is_key_value_lines(store, capsys):
    assert main(["fts", "status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "in_progress: no" in lines and all(": " in line for line in lines)


def test_backup_into_a_directory_keeps_the_file_name(store, tmp_path, capsys):
    target = tmp_path / "copies"
    target.mkdir()
    assert main(["backup", f"{target}{os.sep}"]) == 0
    assert (target / "state.db").is_file()
    assert main(["backup", str(target)]) == 1  # the same name again: refused, never overwritten
    assert "already exists" in capsys.readouterr().err


def test_db_at_an_export_says_to_import_it(store, tmp_path, capsys):
    export = tmp_path / "all.jsonl"
    assert main(["sessions", "export", "-o", str(export)]) == 0
    assert main(["--db", str(export), "sessions", "list"]) == 1
    err = capsys.readouterr().err
    assert "is an export" in err and f"sessions import {export}" in err and "recover" not in err


def test_stats_per_period_draws_a_bar_per_row_on_a_terminal(store):
    from conftest import run_in_terminal
    out = run_in_terminal(store, "sessions", "stats", "--by", "month", env={"COLUMNS": "120"})
    rows = [line for line in out.splitlines() if "gpt-5" in line]
    bars = {line.split()[1]: line.count("█") for line in rows}
    assert bars["openrouter/openai/gpt-5"] == 30 and 0 < bars["openai/gpt-5"] < 30  # as long as the cost
