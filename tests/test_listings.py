"""Conversation listings: a compressed conversation is listed once, as its live tip, in its root's slot;
children stay out of the way; the preview, order and filters behave as documented."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import hermes_state_listings as listings
from hermes_state import SessionDB, SessionFilterError


def ids(rows) -> list[str]:
    return [r["id"] for r in rows]


@pytest.fixture
def chain(db, rival):
    """root (started first) -> mid -> tip, continued by compression; plus a newer standalone session."""
    db.create_session("root", "cli", cwd="/work/a", system_prompt="you are terse")
    db.append_message("root", "user", "fix the build")
    db.rotate_session("root", "mid", [{"role": "user", "content": "summary one"}])
    db.rotate_session("mid", "tip", [{"role": "user", "content": "summary two"}], cwd="/work/b")
    db.create_session("solo", "cli")
    db.append_message("solo", "user", "standalone")
    rival.execute("UPDATE sessions SET started_at = started_at - 1000 WHERE id IN ('root', 'mid', 'tip')")
    rival.execute("UPDATE sessions SET ended_at = ended_at - 1000 WHERE id IN ('root', 'mid')")
    rival.execute("UPDATE messages SET timestamp = timestamp - 1000 WHERE session_id IN ('root', 'mid', 'tip')")
    return db


def test_a_compressed_conversation_is_listed_once_as_its_tip(chain, rival):
    rows = chain.list_sessions_rich()
    assert ids(rows) == ["solo", "tip"]
    tip = rows[1]
    root_start = rival.execute("SELECT started_at FROM sessions WHERE id = 'root'").fetchone()[0]
    assert tip["_lineage_root_id"] == "root" and tip["started_at"] == root_start
    assert tip["preview"] == "summary two" and tip["cwd"] == "/work/b" and tip["ended_at"] is None
    raw = chain.list_sessions_rich(project_compression_tips=False)
    assert ids(raw) == ["solo", "root"] and "_lineage_root_id" not in raw[1]
    assert chain.get_compression_tip("root") == "tip" and chain.get_compression_tip("nope") == "nope"


def test_latest_activity_order_sees_a_tip_beyond_the_page(chain, rival):
    rival.execute("UPDATE messages SET timestamp = timestamp + 5000 WHERE session_id = 'tip'")
    assert ids(chain.list_sessions_rich(limit=1)) == ["solo"]
    top = chain.list_sessions_rich(limit=1, order_by_last_active=True)
    assert ids(top) == ["tip"] and top[0]["_lineage_root_id"] == "root"
    assert ids(chain.list_sessions_rich(limit=1, offset=1, order_by_last_active=True)) == ["solo"]


def test_children_are_hidden_except_branches(db, rival):
    db.create_session("parent", "cli")
    db.create_session("sub", "tool", parent_session_id="parent")
    db.create_session("delegate", "tool", parent_session_id="parent", model_config={"_delegate_from": "parent"})
    db.create_session("fork", "cli", parent_session_id="parent", model_config={"_branched_from": "parent"})
    db.create_session("legacy_parent", "cli")
    db.end_session("legacy_parent", "branched")
    db.create_session("legacy_fork", "cli", parent_session_id="legacy_parent")
    assert set(ids(db.list_sessions_rich())) == {"parent", "fork", "legacy_parent", "legacy_fork"}
    rival.execute("UPDATE sessions SET parent_session_id = NULL WHERE id = 'delegate'")
    assert "delegate" not in ids(db.list_sessions_rich())          # the marker keeps it hidden
    assert len(db.list_sessions_rich(include_children=True)) == 6
    assert len(db.search_sessions()) == 6                          # the plain listing hides nothing


def test_preview_is_sixty_characters_of_one_line(db):
    db.create_session("s", "cli")
    db.append_message("s", "system", "not a user message")
    db.append_message("s", "user", "\r\n  first\r\nsecond " + "x" * 100)
    preview = db.list_sessions_rich()[0]["preview"]
    assert preview == ("first  second " + "x" * 100)[:60] + "..."
    db.create_session("t", "cli")
    db.append_message("t", "user", "short one")
    assert db.list_sessions_rich(limit=1)[0]["preview"] == "short one"


def test_compact_rows_carry_every_column_but_the_system_prompt(chain, rival):
    columns = {r[1] for r in rival.execute("PRAGMA table_info(sessions)")}
    for order in (False, True):
        rows = chain.list_sessions_rich(compact_rows=True, order_by_last_active=order)
        for row in rows:
            assert set(row) >= columns - {"system_prompt"} and "system_prompt" not in row
    assert chain.list_sessions_rich(project_compression_tips=False)[1]["system_prompt"] == "you are terse"


def test_filters(db):
    for sid, source, cwd in (("a", "cli", "/repo"), ("b", "cli", "/repo/sub"), ("c", "tool", "/repo-wt"),
                             ("d", "cron", None)):
        db.create_session(sid, source, cwd=cwd)
    db.set_session_title("a", "Docker 100% build")
    db.archive_session("b")
    assert ids(db.list_sessions_rich(cwd_prefix="/repo/")) == ["a"]
    assert ids(db.list_sessions_rich(cwd_prefix="/repo", include_archived=True)) == ["b", "a"]
    assert ids(db.list_sessions_rich(archived_only=True)) == ["b"]
    assert ids(db.list_sessions_rich(exclude_sources=["tool", "cron"])) == ["a"]
    assert ids(db.list_sessions_rich(search_query="100%")) == ["a"]
    assert ids(db.list_sessions_rich(search_query="zzz", id_query="c")) == ["c"]
    for bad in ({"limit": -1}, {"exclude_sources": [3]}, {"source": ""}, {"min_message_count": "2"}):
        with pytest.raises(ValueError):
            db.list_sessions_rich(**bad)


def test_every_session_filter_checks_its_values_alike(db):
    # Listings, counts, search and prune select sessions through one builder: a value one of them
    # refuses, each refuses, with the same typed error naming the caller's parameter.
    db.create_session("a", "cli", model="m")
    db.append_message("a", "user", "needle")
    db.end_session("a", "done")
    refused = [
        # an empty name matches nothing any session can hold
        ("source", lambda: db.list_sessions(source="")), ("model", lambda: db.count_sessions(model=[""])),
        ("source_filter", lambda: db.search_messages("needle", source_filter=[""])),
        ("source", lambda: db.session_count(source="")), ("source", lambda: db.prune_sessions(None, source="")),
        # a bare string where several names belong is not the list of its characters
        ("exclude_sources", lambda: db.session_count(exclude_sources="cli")),
        ("exclude_sources", lambda: db.list_sessions_rich(exclude_sources="cli")),
        ("exclude_sources", lambda: db.search_messages("needle", exclude_sources="cli")),
        ("source_filter", lambda: db.search_messages("needle", source_filter="cli")),
        ("role_filter", lambda: db.search_messages("needle", role_filter="user")),
        # a switch is True or False, not a truthy value
        ("include_archived", lambda: db.session_count_by_source(include_archived=1)),
        ("include_archived", lambda: db.list_sessions(include_archived="yes")),
        ("archived", lambda: db.prune_sessions(None, archived=1)),
        # a time is a finite number
        ("since", lambda: db.list_sessions(since="yesterday")),
        ("until", lambda: db.search_messages("needle", until=float("nan"))),
    ]
    for name, call in refused:
        with pytest.raises(SessionFilterError, match=name):
            call()
    assert issubclass(SessionFilterError, ValueError)
    assert db.get_session("a") is not None  # nothing was pruned on the way


def test_an_empty_list_of_names_lets_nothing_through_where_names_are_asked_for(db):
    # "Any of these sources" with none given selects nothing, in a listing and in a search alike
    # (the command line passes [] when a typed name matches no stored one); hermes-agent's own
    # parameters (`sources`, and search's `role_filter`) keep its rule, that [] filters nothing.
    db.create_session("a", "cli", model="m")
    db.append_message("a", "user", "needle")
    assert db.list_sessions(source=[]) == [] and db.count_sessions(model=[]) == 0
    assert db.search_messages("needle", source_filter=[]) == []
    assert len(db.search_messages("needle", role_filter=[])) == 1  # hermes-agent's rule for roles: no filter
    assert db.search_messages("needle", model_filter=[]) == []
    assert len(db.search_messages("needle", exclude_sources=[])) == 1
    assert db.session_count(sources=[]) == 1 and ids(db.list_sessions_rich(sources=[])) == ["a"]


def test_search_by_id_ranks_exact_then_prefix_then_substring(chain):
    for sid in ("abc", "abc_2", "x_abc"):
        chain.create_session(sid, "cli")
    assert ids(chain.search_sessions_by_id("ABC")) == ["abc", "abc_2", "x_abc"]
    assert ids(chain.search_sessions_by_id("abc", limit=2)) == ["abc", "abc_2"]
    found = chain.search_sessions_by_id("roo")
    assert ids(found) == ["tip"] and found[0]["_lineage_root_id"] == "root"
    assert chain.search_sessions_by_id("mid") == []                # a middle part is not listed
    assert ids(chain.search_sessions_by_id("a_c")) == []           # "_" is literal


def test_cron_runs_are_one_jobs_by_true_prefix(db, rival):
    for sid, source in (("cron_alpha_1", "cron"), ("cron_alpha_2", "cron"), ("cron_xalpha_1", "cron"),
                        ("cron_alpha2_1", "cron"), ("cron_alpha_9", "cli"), ("cron_a%_1", "cron")):
        db.create_session(sid, source)
        db.append_message(sid, "user", f"run {sid}")
    rival.execute("UPDATE sessions SET started_at = started_at + 100 WHERE id = 'cron_alpha_1'")
    runs = db.list_cron_job_runs("alpha")
    assert ids(runs) == ["cron_alpha_1", "cron_alpha_2"]
    assert runs[0]["preview"] == "run cron_alpha_1" and runs[1]["last_active"] >= runs[1]["started_at"]
    assert ids(db.list_cron_job_runs("alpha", limit=1, offset=1)) == ["cron_alpha_2"]
    assert ids(db.list_cron_job_runs("a%")) == ["cron_a%_1"]


def test_resolve_session_id_by_exact_id_or_unique_prefix(db):
    for sid in ("20260315_092437_c9a6aa", "20260315_092437_c9a6bb", "20260315X092437_zz", "Upper_1"):
        db.create_session(sid, "cli")
    assert db.resolve_session_id("20260315_092437_c9a6aa") == "20260315_092437_c9a6aa"
    assert db.resolve_session_id("20260315_092437_c9a6b") == "20260315_092437_c9a6bb"
    assert db.resolve_session_id("20260315_092437_c9a6") is None        # ambiguous
    assert db.resolve_session_id("20260315_") is None                   # "_" is literal: two, not three
    assert db.resolve_session_id("20260315X") == "20260315X092437_zz"
    assert db.resolve_session_id("upper") is None                       # ids are case-sensitive
    assert db.resolve_session_id("") is None and db.resolve_session_id(None) is None


def test_compression_lineage_is_the_whole_chain_and_survives_a_cycle(chain, rival):
    assert chain.get_compression_lineage("mid") == ["root", "mid", "tip"]
    assert chain.get_compression_lineage("solo") == ["solo"] and chain.get_compression_lineage("nope") == []
    document = chain.export_session_lineage("root")
    assert document["id"] == "tip" and document["lineage_session_ids"] == ["root", "mid", "tip"]
    assert [s["id"] for s in document["segments"]] == ["root", "mid", "tip"]
    assert {m["session_id"] for m in document["messages"]} == {"root", "mid", "tip"}
    assert chain.export_session_lineage("nope") is None
    rival.execute("UPDATE sessions SET parent_session_id = 'tip' WHERE id = 'root'")   # bad data: a ring
    assert sorted(chain.get_compression_lineage("root")) == ["mid", "root", "tip"]


def _expected_activity_order(rival) -> list[str]:
    """The latest-activity order worked out by hand from the raw rows: the model the listing must match."""
    started = dict(rival.execute("SELECT id, started_at FROM sessions").fetchall())
    latest = dict(rival.execute("SELECT session_id, MAX(timestamp) FROM messages GROUP BY session_id").fetchall())
    child = dict(rival.execute("SELECT parent_session_id, id FROM sessions WHERE parent_session_id IS NOT NULL"))
    reason = dict(rival.execute("SELECT id, end_reason FROM sessions").fetchall())
    listed = [sid for sid in started if rival.execute(
        "SELECT parent_session_id IS NULL FROM sessions WHERE id = ?", (sid,)).fetchone()[0]]

    def activity(root: str) -> float:
        part, seen, best = root, set(), float("-inf")
        while part is not None and part not in seen:
            seen.add(part)
            best = max(best, latest.get(part, started[part]))
            part = child.get(part) if reason[part] == "compression" else None
        return best

    return sorted(listed, key=lambda sid: (activity(sid), started[sid], sid), reverse=True)


@pytest.mark.parametrize("seed", range(6))
def test_latest_activity_order_matches_the_rows(db, rival, seed):
    import random
    rng = random.Random(seed)
    for n in range(30):
        db.create_session(f"s{n:02d}", rng.choice(["cli", "cron"]))
        for _ in range(rng.randrange(3)):
            db.append_message(f"s{n:02d}", "user", "hello")
        if rng.random() < 0.3:  # continued by compression, sometimes twice
            tip = f"s{n:02d}"
            for k in range(rng.randrange(1, 3)):
                nxt = f"s{n:02d}c{k}"
                db.rotate_session(tip, nxt, [{"role": "user", "content": "summary"}])
                tip = nxt
    for sid, in rival.execute("SELECT id FROM sessions").fetchall():  # spread the times out, with ties
        rival.execute("UPDATE sessions SET started_at = ? WHERE id = ?", (rng.randrange(1000, 1010), sid))
    for mid, in rival.execute("SELECT id FROM messages").fetchall():
        rival.execute("UPDATE messages SET timestamp = ? WHERE id = ?", (rng.randrange(1000, 1040), mid))
    rival.execute("UPDATE sessions SET ended_at = (SELECT c.started_at FROM sessions c "
                  "WHERE c.parent_session_id = sessions.id) WHERE end_reason = 'compression'")
    expected = _expected_activity_order(rival)
    rows = db.list_sessions_rich(limit=100, order_by_last_active=True, project_compression_tips=True)
    assert [r.get("_lineage_root_id", r["id"]) for r in rows] == expected
    page = db.list_sessions_rich(limit=5, offset=3, order_by_last_active=True)
    assert [r.get("_lineage_root_id", r["id"]) for r in page] == expected[3:8]


def test_latest_activity_order_survives_a_ring_of_compressions(chain, rival):
    # Bad data: tip is closed by compression and continued by root, so the chain has no end.
    rival.execute("UPDATE sessions SET end_reason = 'compression', "
                  "ended_at = (SELECT started_at FROM sessions WHERE id = 'root') WHERE id = 'tip'")
    rival.execute("UPDATE sessions SET parent_session_id = 'tip' WHERE id = 'root'")
    rival.execute("UPDATE messages SET timestamp = timestamp + 5000 WHERE session_id = 'mid'")
    rows = chain.list_sessions_rich(limit=10, include_children=True, order_by_last_active=True)
    firsts = [r.get("_lineage_root_id", r["id"]) for r in rows]
    assert set(firsts[:3]) == {"root", "mid", "tip"} and firsts[3:] == ["solo"]


def _session_scans(db, rival, call) -> list[str]:
    """Return the plan lines of the call's reads that scan the sessions table (under any alias)."""
    with db.tracer() as statements:
        call()
    scans = []
    for sql in dict.fromkeys(statements):
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")):
            continue
        for line in (r[3] for r in rival.execute("EXPLAIN QUERY PLAN " + sql)):
            name = re.match(r"SCAN (\w+)", line)
            if name and (name[1] == "sessions" or re.search(rf"\bsessions {name[1]}\b", sql)):
                scans.append(line)
    return scans


def test_counts_listings_and_prune_read_sessions_through_their_indexes(db, rival):
    # A cron run's row holds its whole prompt: a scan that read rows would walk every prompt.
    for n in range(80):
        db.create_session(f"cron_{n:02d}", "cron", system_prompt="p" * 20_000)
        db.append_message(f"cron_{n:02d}", "user", "run")
        db.end_session(f"cron_{n:02d}", "cron_complete")
    db.create_session("root", "cli")
    db.rotate_session("root", "next", [{"role": "user", "content": "summary"}])
    db.create_session("helper", "tool", parent_session_id="next", model_config={"_delegate_from": "next"})
    calls = [db.session_count,
             lambda: db.list_sessions_rich(limit=50, compact_rows=True, order_by_last_active=True),
             lambda: db.list_prune_candidates(older_than_days=0)]
    for call in calls:
        scans = _session_scans(db, rival, call)
        assert scans and all("COVERING INDEX" in p for p in scans), scans
    assert len(db.list_prune_candidates(older_than_days=0)) == 80


# A store of a few sessions whose starts and message times tie often, some with no message; a
# start written as text by another program sorts after every number, as SQLite orders values.
_stores = st.lists(st.tuples(st.sampled_from(["cli", "cron"]), st.sampled_from([1.0, 2.0, 3.0, "2026-01-01"]),
                             st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0]), max_size=4)),
                   max_size=9)


@settings(max_examples=60, deadline=None)
@given(store=_stores, source=st.sampled_from([None, "cli"]), limit=st.integers(0, 5), offset=st.integers(0, 4),
       step=st.sampled_from([1, 2, 256]), most=st.sampled_from([2, 16_384]))
# A session with no message that started at the very time of the page's last activity belongs on it.
@example(store=[("cli", 1.0, [2.0]), ("cli", 2.0, []), ("cli", 1.0, [0.5])], source=None, limit=1, offset=0,
         step=1, most=16_384)
def test_the_activity_page_from_the_newest_messages_is_the_page_of_the_pass_over_the_sessions(
        store, source, limit, offset, step, most):
    with tempfile.TemporaryDirectory() as home, SessionDB(Path(home) / "state.db") as db:
        for n, (src, _, stamps) in enumerate(store):
            db.create_session(f"s{n}", src)
            for stamp in stamps:
                db.append_message(f"s{n}", "user", "m", timestamp=stamp)
        with db.transaction() as txn:  # starts that tie with each other and with message times, one a text
            txn.conn.executemany("UPDATE sessions SET started_at = ? WHERE id = ?",
                                 [(start, f"s{n}") for n, (_, start, _) in enumerate(store)])

        def page() -> list[str]:
            return ids(db.list_sessions_rich(source=source, limit=limit, offset=offset, order_by_last_active=True))

        saved = listings.WALK_ROWS, listings.WALK_MOST, listings.TIMESTAMP_INDEX
        try:
            listings.WALK_ROWS, listings.WALK_MOST = step, most
            walked = page()
            listings.TIMESTAMP_INDEX = "no_such_index"  # the pass over every session
            assert walked == page()
        finally:
            listings.WALK_ROWS, listings.WALK_MOST, listings.TIMESTAMP_INDEX = saved
