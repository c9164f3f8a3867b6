"""Titles, lineage walks, listings and statistics (R-SESS-5..8), through the SessionDB facade.

State is checked from `rival`, a second connection. Messages are planted with raw SQL on
`rival` so these tests do not depend on the message-writing API.
"""
from __future__ import annotations

import sqlite3

import pytest

import hermes_state_titles as titles
from hermes_state import SessionDB, SessionNotFoundError, TitleConflictError


def add_message(rival: sqlite3.Connection, session_id: str, role: str, content: str | None, timestamp: float,
                active: int = 1) -> None:
    rival.execute("INSERT INTO messages (session_id, role, content, timestamp, active) VALUES (?, ?, ?, ?, ?)",
                  (session_id, role, content, timestamp, active))


def stored_title(rival: sqlite3.Connection, session_id: str) -> str | None:
    return rival.execute("SELECT title FROM sessions WHERE id = ?", (session_id,)).fetchone()["title"]


# --- titles ----------------------------------------------------------------------------------

def test_set_title_strips_and_persists(db, rival):
    db.create_session("s1", "cli")
    assert db.set_session_title("s1", "  Fix Docker Build \n") is True
    assert stored_title(rival, "s1") == "Fix Docker Build"
    assert db.get_session_title("s1") == "Fix Docker Build"


def test_title_conflict_is_typed_and_writes_nothing(db, rival):
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "Shared")
    db.set_session_title("b", "Mine")
    with pytest.raises(TitleConflictError) as info:
        db.set_session_title("b", " Shared ")
    assert isinstance(info.value, ValueError)
    assert stored_title(rival, "b") == "Mine"
    assert "already in use" in str(info.value)
    # Setting a session's own title again is not a conflict.
    assert db.set_session_title("a", "Shared") is True


def test_title_length_limit(db, rival):
    db.create_session("s", "cli")
    assert db.set_session_title("s", "x" * 100) is True
    with pytest.raises(ValueError, match="too long"):
        db.set_session_title("s", "y" * 101)
    assert stored_title(rival, "s") == "x" * 100
    # Surrounding blanks are stripped before the length is checked.
    assert db.set_session_title("s", "  " + "z" * 100 + "  ") is True
    assert stored_title(rival, "s") == "z" * 100


@pytest.mark.parametrize("cleared", [None, "", "   \t"])
def test_none_or_blank_clears_title(db, rival, cleared):
    db.create_session("s", "cli")
    db.set_session_title("s", "Something")
    assert db.set_session_title("s", cleared) is True
    assert stored_title(rival, "s") is None
    assert db.get_session_title("s") is None
    # A cleared title is free again and NULL titles never conflict with each other.
    db.create_session("t", "cli")
    db.set_session_title("t", "Something")
    db.set_session_title("t", None)
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE title IS NULL").fetchone()[0] == 2


def test_title_errors_for_unknown_session_and_bad_type(db, rival):
    # An unknown session is an answer, not an error: agent code renames sessions that may be gone.
    assert db.set_session_title("ghost", "T") is False
    with pytest.raises(ValueError, match="too long"):
        db.set_session_title("ghost", "T" * 101)
    db.create_session("s", "cli")
    with pytest.raises(ValueError):
        db.set_session_title("s", 42)
    assert db.get_session_title("ghost") is None
    assert rival.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1


def test_unique_index_race_becomes_title_conflict(conn, monkeypatch):
    # A writer that skipped the pre-check (it bypassed BEGIN IMMEDIATE) still hits the unique
    # index; the module turns that IntegrityError into TitleConflictError.
    conn.execute("INSERT INTO sessions (id, source, started_at, title) VALUES ('a', 'cli', 1, 'T')")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('b', 'cli', 2)")
    monkeypatch.setattr(titles, "title_holder", lambda *args: None)
    with pytest.raises(TitleConflictError):
        titles.set_session_title(conn, "b", "T")
    assert conn.execute("SELECT title FROM sessions WHERE id = 'b'").fetchone()[0] is None


def test_resolve_returns_newest_of_lineage(db):
    db.create_session("v1", "cli", started_at=100.0, title="Fix Docker Build")
    db.create_session("v2", "cli", started_at=200.0, title="Fix Docker Build #2")
    db.create_session("v3", "cli", started_at=300.0, title="Fix Docker Build #3")
    db.create_session("other", "cli", started_at=400.0, title="Fix Docker Build later")
    db.create_session("nested", "cli", started_at=500.0, title="Fix Docker Build #2 #2")
    db.create_session("prefix", "cli", started_at=600.0, title="Fix Docker")
    assert db.resolve_session_by_title("Fix Docker Build") == "v3"
    assert db.resolve_session_by_title("  Fix Docker Build ") == "v3"
    # An explicit number names that session's own lineage.
    assert db.resolve_session_by_title("Fix Docker Build #3") == "v3"
    assert db.resolve_session_by_title("Fix Docker Build #2") == "nested"
    assert db.resolve_session_by_title("Fix Docker") == "prefix"
    assert db.resolve_session_by_title("Nothing here") is None
    assert db.resolve_session_by_title("") is None


def test_resolve_follows_the_numbering_not_the_clock(db):
    # The clock stepped back between a session and its continuation: the number still says
    # which one came last.
    db.create_session("late", "cli", started_at=900.0, title="Plan")
    db.create_session("early", "cli", started_at=100.0, title="Plan #7")
    assert db.resolve_session_by_title("Plan") == "early"


def test_resolve_lands_on_the_live_continuation_of_a_compressed_session(db):
    db.create_session("a", "cli", title="Fix Docker Build")
    db.rotate_session("a", "b", [], title="Fix Docker Build #2")
    db.rotate_session("b", "c", [])  # an untitled continuation still continues "#2"
    assert db.resolve_session_by_title("Fix Docker Build") == "c"
    assert db.resolve_session_by_title("Fix Docker Build #2") == "c"


def test_resolve_ignores_a_clock_stepped_back_across_compression(db, rival):
    db.create_session("p", "cli", title="Fix Docker Build")
    db.rotate_session("p", "p2", [], title="Fix Docker Build #2")
    rival.execute("UPDATE sessions SET started_at = started_at - 3600 WHERE id = 'p2'")
    assert db.resolve_session_by_title("Fix Docker Build") == "p2"


def test_resolve_is_safe_with_like_metacharacters(db):
    db.create_session("pct", "cli", started_at=1.0, title="100% done")
    db.create_session("under", "cli", started_at=2.0, title="a_b")
    db.create_session("axb", "cli", started_at=3.0, title="axb #2")
    db.create_session("back", "cli", started_at=4.0, title="c\\d #2")
    assert db.resolve_session_by_title("100% done") == "pct"
    assert db.resolve_session_by_title("100%") is None
    assert db.resolve_session_by_title("a_b") == "under"
    assert db.resolve_session_by_title("c\\d") == "back"


def test_next_title_numbering_with_gaps(db):
    assert db.get_next_title_in_lineage("Fix Docker Build") == "Fix Docker Build"
    db.create_session("v1", "cli", title="Fix Docker Build")
    assert db.get_next_title_in_lineage("Fix Docker Build") == "Fix Docker Build #2"
    db.create_session("v2", "cli", title=db.get_next_title_in_lineage("Fix Docker Build"))
    assert db.get_session_title("v2") == "Fix Docker Build #2"
    assert db.get_next_title_in_lineage("Fix Docker Build") == "Fix Docker Build #3"
    # A numbered input counts as its base.
    assert db.get_next_title_in_lineage("Fix Docker Build #2") == "Fix Docker Build #3"
    # Gaps are not refilled: the next number follows the highest one.
    db.create_session("v9", "cli", title="Fix Docker Build #9")
    assert db.get_next_title_in_lineage(" Fix Docker Build ") == "Fix Docker Build #10"
    # Only a numbered variant, no base: still numbered after it.
    db.create_session("w5", "cli", title="Deploy #5")
    assert db.get_next_title_in_lineage("Deploy") == "Deploy #6"
    with pytest.raises(ValueError):
        db.get_next_title_in_lineage("   ")


def test_next_title_of_a_long_base_fits_the_limit_and_stays_free(db, rival):
    base = "word " * 19 + "tail"  # 99 characters; "base #2" would be 102
    db.create_session("v1", "cli", title=base)
    for n in range(2, 13):  # also crosses to two-digit numbers, which cut the base further
        suggestion = db.get_next_title_in_lineage(base)
        assert len(suggestion) <= 100 and suggestion.endswith(f" #{n}")
        assert suggestion == suggestion.strip() and "  " not in suggestion
        db.create_session(f"v{n}", "cli")
        assert db.set_session_title(f"v{n}", suggestion) is True  # accepted: free and short enough
    titles = [r[0] for r in rival.execute("SELECT title FROM sessions ORDER BY rowid")]
    assert titles[-1] == (base[:96].rstrip() + " #12") and len(set(titles)) == 12


# --- lineage walks ---------------------------------------------------------------------------

def test_lineage_and_descendants(db):
    db.create_session("root", "cli", started_at=1.0)
    db.create_session("a", "cli", started_at=2.0, parent_session_id="root")
    db.create_session("b", "cli", started_at=3.0, parent_session_id="root")
    db.create_session("a1", "cli", started_at=4.0, parent_session_id="a")
    db.create_session("b1", "cli", started_at=2.5, parent_session_id="b")
    assert [r["id"] for r in db.get_lineage("a1")] == ["root", "a", "a1"]
    assert [r["id"] for r in db.get_lineage("root")] == ["root"]
    lineage = db.get_lineage("b1")
    assert set(lineage[-1]) >= {"id", "title", "started_at", "parent_session_id", "source"}
    # Breadth-first: root's children by (started_at, id), then their children parent by parent
    # (b1 started before a1 but its parent b comes after a).
    assert [r["id"] for r in db.get_descendants("root")] == ["a", "b", "a1", "b1"]
    assert [r["id"] for r in db.get_descendants("a")] == ["a1"]
    assert db.get_descendants("a1") == []
    assert db.get_lineage("ghost") == []
    assert db.get_descendants("ghost") == []


def test_planted_parent_cycle_terminates(db, rival):
    db.create_session("A", "cli", started_at=1.0)
    db.create_session("B", "cli", started_at=2.0, parent_session_id="A")
    db.create_session("C", "cli", started_at=3.0, parent_session_id="B")
    rival.execute("UPDATE sessions SET parent_session_id = 'B' WHERE id = 'A'")  # A -> B -> A
    assert [r["id"] for r in db.get_lineage("A")] == ["B", "A"]
    assert [r["id"] for r in db.get_lineage("C")] == ["A", "B", "C"]
    assert [r["id"] for r in db.get_descendants("A")] == ["B", "C"]
    assert [r["id"] for r in db.get_descendants("B")] == ["A", "C"]
    # A session that is its own parent.
    rival.execute("UPDATE sessions SET parent_session_id = 'C' WHERE id = 'C'")
    assert [r["id"] for r in db.get_lineage("C")] == ["C"]
    assert db.get_descendants("C") == []


def test_fifty_deep_chain(db):
    db.create_session("n0", "cli", started_at=0.0)
    for i in range(1, 51):
        db.create_session(f"n{i}", "cli", started_at=float(i), parent_session_id=f"n{i - 1}")
    assert [r["id"] for r in db.get_lineage("n50")] == [f"n{i}" for i in range(51)]
    assert [r["id"] for r in db.get_descendants("n0")] == [f"n{i}" for i in range(1, 51)]
    assert [r["id"] for r in db.get_descendants("n25")] == [f"n{i}" for i in range(26, 51)]


# --- listings --------------------------------------------------------------------------------

def test_list_sessions_preview_and_last_active(db, rival):
    db.create_session("s", "cli", started_at=10.0)
    add_message(rival, "s", "system", "system prompt text", 11.0)
    add_message(rival, "s", "user", "line one\r\nline two\nline three\rline four " + "x" * 100, 12.0)
    add_message(rival, "s", "user", "second question", 13.0)
    add_message(rival, "s", "assistant", "answer", 14.0)
    [row] = db.list_sessions()
    expected = ("line one line two line three line four " + "x" * 100)[:63]
    assert row["preview"] == expected and len(row["preview"]) == 63
    assert row["last_active"] == 14.0
    # Every sessions column is there too.
    columns = {r["name"] for r in rival.execute("PRAGMA table_info(sessions)")}
    assert columns <= set(row) and row["id"] == "s" and row["started_at"] == 10.0


def test_preview_edge_cases(db, rival):
    db.create_session("empty", "cli", started_at=1.0)
    db.create_session("archived_gen", "cli", started_at=2.0)
    db.create_session("ties", "cli", started_at=3.0)
    db.create_session("wide", "cli", started_at=4.0)
    # Only an inactive (compression archive) user row: ignored for the preview, counts for activity.
    add_message(rival, "archived_gen", "user", "old generation", 5.0, active=0)
    add_message(rival, "archived_gen", "user", "kept context", 6.0)
    add_message(rival, "ties", "user", None, 7.0)
    add_message(rival, "ties", "user", "first by id", 8.0)
    add_message(rival, "ties", "user", "second by id", 8.0)
    add_message(rival, "wide", "user", "界" * 70 + "\n", 9.0)
    rows = {r["id"]: r for r in db.list_sessions()}
    assert rows["empty"]["preview"] == "" and rows["empty"]["last_active"] == 1.0
    assert rows["archived_gen"]["preview"] == "kept context"
    assert rows["ties"]["preview"] == "first by id"
    assert rows["wide"]["preview"] == "界" * 63
    # Short content is not padded; a lone newline becomes one space.
    db.create_session("short", "cli", started_at=5.0)
    add_message(rival, "short", "user", "hi\nthere", 10.0)
    assert db.list_sessions(limit=1)[0]["preview"] == "hi there"


def test_list_sessions_order_filters_and_paging(db, rival):
    db.create_session("old", "cli", started_at=1.0)
    db.create_session("tg", "telegram", started_at=2.0)
    db.create_session("tie_b", "cli", started_at=3.0)
    db.create_session("tie_a", "cli", started_at=3.0)
    db.create_session("pinned", "cli", started_at=0.5, pinned=1)
    db.create_session("hidden", "cli", started_at=9.0)
    rival.execute("UPDATE sessions SET archived = 1 WHERE id = 'hidden'")
    assert [r["id"] for r in db.list_sessions()] == ["tie_a", "tie_b", "tg", "old", "pinned"]
    assert [r["id"] for r in db.list_sessions(include_archived=True)][0] == "hidden"
    assert [r["id"] for r in db.list_sessions(source="telegram")] == ["tg"]
    assert db.list_sessions(source="discord") == []
    assert [r["id"] for r in db.list_sessions(limit=2, offset=1)] == ["tie_b", "tg"]
    assert db.list_sessions(limit=0) == []
    assert db.list_sessions(offset=10) == []


@pytest.mark.parametrize("kwargs", [{"limit": -1}, {"offset": -5}, {"limit": 2.5}, {"limit": "3"},
                                    {"limit": True}, {"source": 7}])
def test_list_sessions_rejects_bad_arguments(db, kwargs):
    with pytest.raises(ValueError):
        db.list_sessions(**kwargs)


def test_list_sessions_is_one_query(db, rival):
    for i in range(25):
        db.create_session(f"s{i:02}", "cli", started_at=float(i))
        add_message(rival, f"s{i:02}", "user", f"hello {i}", 100.0 + i)
        add_message(rival, f"s{i:02}", "assistant", "hi", 200.0 + i)
    with db.tracer() as statements:
        rows = db.list_sessions(limit=20)
    assert len(rows) == 20 and rows[0]["preview"] == "hello 24" and rows[0]["last_active"] == 224.0
    assert len([s for s in statements if s.lstrip().upper().startswith(("SELECT", "WITH"))]) == 1
    assert len(statements) == 1


def test_read_only_handle_lists_and_walks(db, rival):
    db.create_session("p", "cli", started_at=1.0, title="Topic")
    db.create_session("c", "cli", started_at=2.0, parent_session_id="p", title="Topic #2")
    with SessionDB(db.db_path, read_only=True) as ro:
        assert [r["id"] for r in ro.list_sessions()] == ["c", "p"]
        assert [r["id"] for r in ro.get_lineage("c")] == ["p", "c"]
        assert ro.resolve_session_by_title("Topic") == "c"
        assert ro.get_next_title_in_lineage("Topic") == "Topic #3"


# --- statistics ------------------------------------------------------------------------------

def test_usage_by_model(db):
    db.create_session("a1", "cli", model="alpha", input_tokens=100, output_tokens=10, estimated_cost_usd=0.5)
    db.create_session("a2", "cli", model="alpha", input_tokens=50, output_tokens=5, estimated_cost_usd=0.25)
    db.create_session("b1", "cli", model="beta", input_tokens=1000, output_tokens=100, estimated_cost_usd=2.0)
    db.create_session("c1", "cli", model="gamma", input_tokens=7, output_tokens=3)
    db.create_session("none", "cli", input_tokens=999)
    keys = ("model", "session_count", "input_tokens", "output_tokens", "estimated_cost_usd")
    usage = db.usage_by_model()
    assert [{k: r[k] for k in keys} for r in usage] == [
        {"model": "beta", "session_count": 1, "input_tokens": 1000, "output_tokens": 100,
         "estimated_cost_usd": 2.0},
        {"model": "alpha", "session_count": 2, "input_tokens": 150, "output_tokens": 15,
         "estimated_cost_usd": 0.75},
        {"model": "gamma", "session_count": 1, "input_tokens": 7, "output_tokens": 3,
         "estimated_cost_usd": None},
    ]
    # the seed's names for the same totals
    assert [(r["total_input"], r["total_output"], r["total_cost"]) for r in usage] == [
        (1000, 100, 2.0), (150, 15, 0.75), (7, 3, None)]


def test_top_sessions_by_tokens(db, rival):
    db.create_session("small", "cli", model="m", input_tokens=1, output_tokens=1, title="Small")
    db.create_session("big", "cli", model="m", input_tokens=500, output_tokens=500, estimated_cost_usd=1.5)
    db.create_session("mid", "cli", input_tokens=100, output_tokens=0)
    rival.execute("UPDATE sessions SET output_tokens = NULL WHERE id = 'mid'")
    top = db.top_sessions_by_tokens()
    assert [r["id"] for r in top] == ["big", "mid", "small"]
    assert top[0] == {"id": "big", "title": None, "model": "m", "total_tokens": 1000, "estimated_cost_usd": 1.5}
    assert top[1]["total_tokens"] == 100
    assert [r["id"] for r in db.top_sessions_by_tokens(limit=1)] == ["big"]
    with pytest.raises(ValueError):
        db.top_sessions_by_tokens(limit=-1)


def test_empty_database_statistics(db):
    assert db.usage_by_model() == []
    assert db.top_sessions_by_tokens() == []
    assert db.list_sessions() == []


@pytest.mark.parametrize("row, key", [
    ({"git_repo_root": "/www/app", "cwd": "/www/app/src", "git_branch": "feat"}, "/www/app"),
    ({"git_repo_root": "/www/app", "cwd": "/www/app/.worktrees/x"}, "/www/app"),
    ({"git_repo_root": "", "cwd": "/work/notes"}, "/work/notes"),
    ({"git_repo_root": None, "cwd": "/work/notes"}, "/work/notes"),
    ({"cwd": "   "}, None),
    ({}, None),
])
def test_workspace_key_is_the_repo_root_else_the_cwd(row, key):
    from hermes_state import workspace_key
    assert workspace_key(row) == key


def test_workspace_key_groups_branches_of_one_repository(db):
    from hermes_state import workspace_key
    db.create_session("a", "cli", git_repo_root="/r", git_branch="main", cwd="/r")
    db.create_session("b", "cli", git_repo_root="/r", git_branch="feature", cwd="/r/sub")
    assert {workspace_key(db.get_session(s)) for s in ("a", "b")} == {"/r"}
