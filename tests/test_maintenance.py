"""Deleting, pruning and sweeping: a conversation goes whole or not at all, owed work blocks it,
transcript files follow only what was really deleted, and the automatic prune runs once per interval."""
from __future__ import annotations

import json
import multiprocessing
import sqlite3
import time

import pytest

import hermes_state_maintenance as maintenance
from hermes_state import SessionBusyError, SessionDB
from conftest import refused

DAY_S = 86400.0


def age(rival: sqlite3.Connection, days: float, *session_ids: str) -> None:
    """Move sessions back in time by `days`, keeping each compression edge (ended == child's start) intact."""
    for sid in session_ids:
        rival.execute("UPDATE sessions SET started_at = started_at - ?, ended_at = ended_at - ? WHERE id = ?",
                      (days * DAY_S, days * DAY_S, sid))


def ids(rival: sqlite3.Connection) -> set[str]:
    return {r[0] for r in rival.execute("SELECT id FROM sessions")}


def chain(db: SessionDB, root: str = "docker", length: int = 2) -> list[str]:
    """A conversation continued by compression: root -> root_2 -> ...; the last one is live."""
    db.create_session(root, "cli")
    db.append_message(root, "user", "fix the docker build")
    members = [root]
    for n in range(2, length + 1):
        child = f"{root}_{n}"
        db.rotate_session(members[-1], child, [{"role": "user", "content": f"summary {n}"}])
        members.append(child)
    return members


def dangling_parents(rival: sqlite3.Connection) -> list[tuple]:
    return rival.execute("SELECT id, parent_session_id FROM sessions s WHERE parent_session_id IS NOT NULL "
                         "AND NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = s.parent_session_id)").fetchall()


# --- a compression chain is one conversation ---------------------------------------------------------

def test_prune_never_takes_the_first_half_of_a_live_conversation(db, rival):
    members = chain(db, length=3)
    age(rival, 100, *members)
    assert db.list_prune_candidates(older_than_days=0) == []
    assert db.prune_sessions(0) == 0                         # the tip is still open
    assert ids(rival) == set(members)
    db.end_session(members[-1], "user_exit")
    age(rival, -99.9, members[-1])                           # the newest part is recent again
    assert db.prune_sessions(30) == 0
    assert ids(rival) == set(members)
    age(rival, 99.9, members[-1])
    candidates = db.list_prune_candidates(older_than_days=30)
    assert [r["id"] for r in candidates] == members
    assert {r["conversation_id"] for r in candidates} == {members[0]}
    assert db.prune_sessions(30) == 3
    assert ids(rival) == set()


def test_prune_filters_apply_to_every_part_of_a_conversation(db, rival):
    members = chain(db)
    db.end_session(members[-1], "user_exit")
    age(rival, 10, *members)
    rival.execute("UPDATE sessions SET message_count = 50 WHERE id = ?", (members[0],))
    assert db.prune_sessions(older_than_days=None, max_messages=5) == 0     # one part does not match
    assert db.prune_sessions(older_than_days=None, max_messages=50) == 2


def test_delete_through_an_earlier_part_of_a_live_conversation_is_refused(db, rival):
    members = chain(db)
    error = refused(rival, SessionBusyError, db.delete_session, members[0])
    assert members[-1] in str(error)
    assert db.delete_session(members[-1]) is True               # by the id listings show: all of it
    assert ids(rival) == set()
    assert rival.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_deleting_an_ended_conversation_by_any_part_takes_it_whole(db, rival):
    members = chain(db, length=3)
    db.end_session(members[-1], "user_exit")
    db.create_session("branch", "cli", parent_session_id=members[1])
    assert db.delete_session(members[1]) is True
    assert ids(rival) == {"branch"}
    assert dangling_parents(rival) == []
    assert rival.execute("SELECT parent_session_id FROM sessions WHERE id = 'branch'").fetchone()[0] is None


def test_delegates_go_with_the_session_that_spawned_them_and_branches_stay(db, rival):
    db.create_session("parent", "cli")
    db.create_session("delegate", "tool", parent_session_id="parent", model_config={"_delegate_from": "parent"})
    db.create_session("nested", "tool", model_config={"_delegate_from": "delegate"})
    db.create_session("branch", "cli", parent_session_id="parent", model_config={"_branched_from": "parent"})
    db.append_message("delegate", "user", "scan the repo")
    assert db.delete_session("parent") is True
    assert ids(rival) == {"branch"}
    assert dangling_parents(rival) == []


def test_prune_leaves_a_conversation_whose_delegate_is_still_running(db, rival):
    db.create_session("parent", "cli")
    db.create_session("delegate", "tool", parent_session_id="parent", model_config={"_delegate_from": "parent"})
    db.end_session("parent", "user_exit")
    age(rival, 50, "parent", "delegate")
    assert db.prune_sessions(30) == 0
    db.end_session("delegate", "done")
    assert db.prune_sessions(30) == 2
    assert ids(rival) == set()


# --- owed work blocks deletion; only terminal ledger rows are cleaned up -----------------------------

def test_replies_still_owed_block_delete_until_delivered_or_abandoned(db, rival):
    db.create_session("s", "telegram")
    owed = db.owe_delivery("s", {"text": "your build is green"})
    refused(rival, SessionBusyError, db.delete_session, "s")                 # pending
    db.begin_delivery(owed)
    refused(rival, SessionBusyError, db.delete_session, "s")                 # attempting: a send in flight
    db.mark_failed(owed, "timeout")
    refused(rival, SessionBusyError, db.delete_session, "s")                 # failed: still owed
    db.mark_delivered(db.begin_delivery(owed) and owed)
    assert db.delete_session("s") is True
    assert rival.execute("SELECT COUNT(*) FROM delivery_obligations").fetchone()[0] == 0


def test_open_delegations_block_delete_and_prune(db, rival):
    db.create_session("s", "cli")
    db.end_session("s", "done")
    age(rival, 40, "s")
    db.record_delegation("d1", "s")
    refused(rival, SessionBusyError, db.delete_session, "s")                 # pending
    assert db.prune_sessions(30) == 0 and db.list_prune_candidates(older_than_days=30) == []
    db.update_delegation("d1", state="running")
    refused(rival, SessionBusyError, db.delete_session, "s")
    assert db.delete_empty_sessions() == 0 and db.count_empty_sessions() == 0
    db.update_delegation("d1", state="completed")
    assert db.prune_sessions(30) == 1
    assert rival.execute("SELECT COUNT(*) FROM async_delegations").fetchone()[0] == 0


@pytest.mark.parametrize("ledgers", ["small", "large"])
def test_owed_work_of_many_sessions_is_found_however_the_ledgers_are_read(db, rival, ledgers):
    # A prune asks about thousands of sessions at once: a small ledger is read whole for its live
    # rows, a large one (its rowids run past a few per session asked about) looked up by session.
    # Either way the answer is the same.
    asked = [f"s{n:03d}" for n in range(100)]
    for sid in asked + ["outside"]:
        db.create_session(sid, "telegram")
    epoch = db.claim_runtime()
    db.owe_delivery("s007", "owed")
    db.owe_delivery("s007", "owed again")
    sent = db.owe_delivery("s050", "sent")
    db.mark_delivered(db.begin_delivery(sent) and sent)
    db.owe_delivery("outside", "owed, but not asked about")
    db.record_delegation("d1", "s099")
    db.record_delegation("d2", "s042")
    db.update_delegation("d2", state="completed")
    db.admit_input("s007", "queued")
    finished = db.admit_input("s013", "done")
    db.start_admission(finished, epoch)
    db.finish_admission(finished, "completed", epoch)
    db.start_execution("s020", "worker", epoch)
    db.finish_execution(db.start_execution("s021", "cron", epoch), "failed", epoch)
    if ledgers == "large":  # as if each ledger had held thousands of rows before these
        for table in ("session_admissions", "worker_executions", "delivery_obligations", "async_delegations"):
            rival.execute(f"UPDATE {table} SET rowid = rowid + 100000")
    assert maintenance.owed_work(rival, asked) == {
        "s007": "1 admission(s) queued, started or unknown, 2 repl(ies) not yet delivered",
        "s020": "1 execution(s) running or unknown",
        "s099": "1 delegation(s) still open",
    }
    assert maintenance.owed_work(rival, asked[:3]) == {}  # a few sessions: looked up either way


def test_bulk_delete_is_all_or_nothing(db, rival):
    for sid in ("a", "b", "c"):
        db.create_session(sid, "cli")
    db.owe_delivery("b", "still owed")
    error = refused(rival, SessionBusyError, db.delete_sessions, ["a", "b", "c"])
    assert "'b'" in str(error)
    assert db.delete_sessions(["a", "c", "a", None, "", "ghost"]) == 2
    assert ids(rival) == {"b"}
    with pytest.raises(ValueError):
        db.delete_sessions("b")                                             # a string is not a list of ids


def test_delete_session_if_empty_keeps_anything_with_content_or_owed_work(db, rival):
    chain(db)
    db.create_session("owes", "cli")
    db.owe_delivery("owes", "hello?")
    db.create_session("blank", "cli")
    assert db.delete_session_if_empty("docker_2") is False                   # a continuation
    assert db.delete_session_if_empty("owes") is False
    assert db.delete_session_if_empty("blank") is True
    assert db.delete_session_if_empty(None) is False
    assert ids(rival) == {"docker", "docker_2", "owes"}


def test_empty_sweep_takes_only_conversations_with_no_message_anywhere(db, rival):
    db.create_session("root", "cli")
    db.rotate_session("root", "root_2", [])                 # compressed to nothing, then continued
    db.append_message("root_2", "user", "now it has content")
    db.end_session("root_2", "done")
    db.create_session("ghost", "cli")
    db.end_session("ghost", "done")
    db.create_session("spawner", "cli")
    db.create_session("worker", "tool", parent_session_id="spawner", model_config={"_delegate_from": "spawner"})
    db.end_session("spawner", "done")
    assert db.count_empty_sessions() == 1
    assert db.delete_empty_sessions() == 1
    assert ids(rival) == {"root", "root_2", "spawner", "worker"}


# --- filters --------------------------------------------------------------------------------------

def test_filters_are_checked_before_anything_is_deleted(db, rival):
    db.create_session("s", "cli", cwd="/repo")
    db.end_session("s", "done")
    with pytest.raises(TypeError):
        db.prune_sessions(older_than_days=None, bogus=1)
    for bad in ({"min_messages": "3"}, {"archived": "yes"}, {"started_after": float("nan")},
                {"title_like": ""}, {"max_cost": True}):
        refused(rival, ValueError, db.prune_sessions, None, **bad)
    for bad in (-1, "30", float("inf")):
        refused(rival, ValueError, db.prune_sessions, bad)



def test_a_dict_passed_as_filters_is_refused_not_dropped(db, rival):
    # The filters are keywords; a dict under the keyword's own name must not silently mean "no filter".
    for sid, source in (("mine", "cli"), ("theirs", "telegram")):
        db.create_session(sid, source)
        db.end_session(sid, "done")
    for call in (db.list_prune_candidates, db.archive_sessions, db.prune_sessions):
        with pytest.raises(TypeError, match="filters"):
            call(older_than_days=0, filters={"source": "cli"})
    assert ids(rival) == {"mine", "theirs"}
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE archived = 1").fetchone()[0] == 0

def test_text_filters_match_literally(db, rival):
    for sid, title, cwd in (("a", "100% done", "/repo"), ("b", "1000 done", "/repo/sub"), ("c", "x_y", "/repo-wt")):
        db.create_session(sid, "cli", cwd=cwd)
        db.set_session_title(sid, title)
        db.end_session(sid, "done")
    assert [r["id"] for r in db.list_prune_candidates(title_like="100%")] == ["a"]
    assert [r["id"] for r in db.list_prune_candidates(title_like="x_")] == ["c"]
    assert {r["id"] for r in db.list_prune_candidates(cwd_prefix="/repo/")} == {"a", "b"}
    assert {r["id"] for r in db.list_prune_candidates(cwd_prefix="/")} == {"a", "b", "c"}


def test_archive_sessions_archives_whole_ended_conversations(db, rival):
    members = chain(db)
    db.create_session("done", "cli")
    db.end_session("done", "x")
    assert db.archive_sessions() == 1                     # the chain's tip is live
    db.end_session(members[-1], "x")
    assert db.archive_sessions() == 2
    assert db.archive_sessions() == 0
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE archived = 1").fetchone()[0] == 3


# --- transcript files --------------------------------------------------------------------------------

def test_transcripts_go_only_with_sessions_really_deleted(db, rival, tmp_path):
    files = tmp_path / "sessions"
    files.mkdir()
    for name in ("a.json", "a.jsonl", "request_dump_a_3.json", "request_dump_a_b_1.json", "a_b.jsonl", "busy.jsonl"):
        (files / name).write_text("{}")
    for sid in ("a", "a_b", "busy"):
        db.create_session(sid, "cli")
    db.owe_delivery("busy", "owed")
    with pytest.raises(SessionBusyError):
        db.delete_sessions(["a", "busy"], sessions_dir=files)
    assert len(list(files.iterdir())) == 6                 # refused: every file stays
    assert db.delete_session("a", sessions_dir=files)
    assert sorted(p.name for p in files.iterdir()) == ["a_b.jsonl", "busy.jsonl", "request_dump_a_b_1.json"]


def test_transcript_removal_never_leaves_the_directory(tmp_path):
    files = tmp_path / "sessions"
    files.mkdir()
    (tmp_path / "secret.json").write_text("{}")
    (files / "x.json").write_text("{}")
    assert maintenance.remove_transcripts(files, ["../secret", "..", "x"]) == 1
    assert (tmp_path / "secret.json").exists()
    assert maintenance.remove_transcripts(None, ["x"]) == 0
    assert maintenance.remove_transcripts(tmp_path / "missing", ["x"]) == 0


# --- state_meta and the automatic prune --------------------------------------------------------------

def test_meta_values_are_text(db, rival):
    db.set_meta("k", 5)
    assert db.get_meta("k") == "5"
    for bad in (None, b"x", float("nan"), {"a": 1}):
        refused(rival, ValueError, db.set_meta, "k", bad)
    refused(rival, ValueError, db.set_meta, "", "v")


def old_ended(db, rival, *session_ids: str, days: float = 100) -> None:
    for sid in session_ids:
        db.create_session(sid, "cli")
        db.end_session(sid, "done")
    age(rival, days, *session_ids)


def test_auto_prune_runs_once_per_interval_and_a_future_marker_does_not_stop_it(db, rival):
    old_ended(db, rival, "old1")
    assert db.maybe_auto_prune_and_vacuum(retention_days=90) == {"skipped": False, "pruned": 1, "vacuumed": True}
    old_ended(db, rival, "old2")
    assert db.maybe_auto_prune_and_vacuum(retention_days=90)["skipped"] is True
    assert "old2" in ids(rival)
    db.set_meta(maintenance.AUTO_PRUNE_KEY, str(time.time() + 365 * DAY_S))   # the clock stepped back
    assert db.maybe_auto_prune_and_vacuum(retention_days=90, vacuum=False)["pruned"] == 1
    assert float(db.get_meta(maintenance.AUTO_PRUNE_KEY)) <= time.time()


def test_auto_prune_reports_a_locked_store_and_leaves_no_marker(db, rival):
    old_ended(db, rival, "old")
    db.write_patience_s = 0.3
    rival.execute("BEGIN IMMEDIATE")
    try:
        result = db.maybe_auto_prune_and_vacuum(retention_days=90)
    finally:
        rival.execute("ROLLBACK")
    assert result["skipped"] is True and result["pruned"] == 0 and "locked" in result["error"]
    assert db.get_meta(maintenance.AUTO_PRUNE_KEY) is None
    assert db.maybe_auto_prune_and_vacuum(retention_days=90)["pruned"] == 1
    with pytest.raises(ValueError):
        db.maybe_auto_prune_and_vacuum(retention_days=-5)


APPENDS = 150


def _append_while_pruning(path: str, ready, go) -> None:
    with SessionDB(path) as db:
        ready.set()
        go.wait(30)
        for i in range(APPENDS):
            db.append_message("live", "user", f"turn {i}")


@pytest.mark.slow
def test_auto_prune_racing_a_writer_in_another_process(tmp_path):
    path = str(tmp_path / "state.db")
    with SessionDB(path) as db:
        db.create_session("live", "cli")
        for k in range(40):
            db.create_session(f"old{k}", "cli")
            db.append_message(f"old{k}", "user", "x" * 2000)
            db.end_session(f"old{k}", "done")
        rival = sqlite3.connect(path, isolation_level=None)
        age(rival, 100, *[f"old{k}" for k in range(40)])
        rival.close()
        ctx = multiprocessing.get_context("spawn")
        ready, go = ctx.Event(), ctx.Event()
        writer = ctx.Process(target=_append_while_pruning, args=(path, ready, go))
        writer.start()
        assert ready.wait(60)
        go.set()
        result = db.maybe_auto_prune_and_vacuum(retention_days=90)
        writer.join(120)
    assert writer.exitcode == 0
    assert result == {"skipped": False, "pruned": 40, "vacuumed": True}
    check = sqlite3.connect(path)
    assert [r[0] for r in check.execute("SELECT id FROM sessions")] == ["live"]
    assert check.execute("SELECT COUNT(*) FROM messages WHERE session_id = 'live'").fetchone()[0] == APPENDS
    assert check.execute("SELECT message_count FROM sessions WHERE id = 'live'").fetchone()[0] == APPENDS
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert json.loads(json.dumps(result))                   # plain data, as a dashboard would serialise it
    check.close()


# --- the candidates list is what prune deletes ---------------------------------------------------------

def test_a_delegate_that_comes_along_young_is_listed_with_its_spawner_in_order(db, rival):
    db.create_session("old", "cli")
    db.create_session("young", "tool", parent_session_id="old", model_config={"_delegate_from": "old"})
    db.create_session("alone", "cli")
    for sid in ("young", "old", "alone"):
        db.end_session(sid, "done")
    age(rival, 40, "old")
    age(rival, 35, "alone")  # selected too; "young" is not (ended yesterday) but goes with "old"
    candidates = db.list_prune_candidates(older_than_days=30)
    assert [(c["id"], c["conversation_id"]) for c in candidates] == [("old", "old"), ("alone", "alone"),
                                                                    ("young", "old")]
    row = db.get_session("young")
    assert {k: candidates[2][k] for k in ("source", "started_at", "ended_at", "end_reason", "parent_session_id")} == {
        k: row[k] for k in ("source", "started_at", "ended_at", "end_reason", "parent_session_id")}
    assert db.prune_sessions(30) == 3 and ids(rival) == set()


def test_a_title_another_program_stored_as_bad_bytes_is_listed_with_a_replacement_character(db, rival):
    db.create_session("broken", "cli")
    db.create_session("fine", "cli", title="plain")
    for sid in ("broken", "fine"):
        db.end_session(sid, "done")
        age(rival, 40, sid)
    rival.execute("UPDATE sessions SET title = CAST(x'6f6bff21' AS TEXT) WHERE id = 'broken'")  # "ok", 0xFF, "!"
    candidates = db.list_prune_candidates(older_than_days=30)
    assert {c["id"]: c["title"] for c in candidates} == {"broken": "ok\ufffd!", "fine": "plain"}


def test_candidates_show_archived_and_parent_whether_or_not_any_of_them_has_one(db, rival):
    # A selection where no session is archived or anyone's child is read without those columns.
    for sid in ("a", "b"):
        db.create_session(sid, "cli")
        db.end_session(sid, "done")
        age(rival, 40, sid)

    def shown() -> list[tuple]:
        return [(c["id"], c["archived"], type(c["archived"]), c["parent_session_id"])
                for c in db.list_prune_candidates(older_than_days=30)]
    assert shown() == [("a", 0, int, None), ("b", 0, int, None)]
    rival.execute("UPDATE sessions SET archived = 1 WHERE id = 'b'")
    assert shown() == [("a", 0, int, None), ("b", 1, int, None)]
    rival.execute("UPDATE sessions SET archived = 0 WHERE id = 'b'")
    assert shown() == [("a", 0, int, None), ("b", 0, int, None)]


@pytest.mark.parametrize("seed", range(6))
def test_the_candidates_are_exactly_what_prune_deletes_with_every_column(tmp_path, seed):
    import random
    rng = random.Random(seed)
    with SessionDB(tmp_path / "state.db") as db:
        rival = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        made: list[str] = []
        for n in range(40):
            sid = f"s{n:02d}"
            kind = rng.random()
            if kind < 0.2 and made:  # a delegate of an earlier session
                spawner = rng.choice(made)
                db.create_session(sid, "tool", parent_session_id=spawner, model_config={"_delegate_from": spawner})
            elif kind < 0.35 and made:  # a compression continuation of an earlier, still live session
                live = [m for m in made if db.get_session(m)["ended_at"] is None]
                if not live:
                    continue
                db.rotate_session(rng.choice(live), sid, [{"role": "user", "content": "summary"}])
            else:
                db.create_session(sid, rng.choice(["cli", "cron", "telegram"]), title=f"t{n}" if n % 3 else None)
            made.append(sid)
            if rng.random() < 0.8:
                db.end_session(sid, "done")
            age(rival, rng.uniform(0, 60), sid)
        days = rng.choice([0, 20, 30, 45])
        candidates = db.list_prune_candidates(older_than_days=days)
        by_start = sorted(candidates, key=lambda c: (c["started_at"], c["id"]))
        assert candidates == by_start
        for c in candidates:
            row = db.get_session(c["id"])
            for key in ("source", "model", "title", "started_at", "ended_at", "end_reason", "message_count",
                        "parent_session_id"):
                assert c[key] == row[key], (c["id"], key)
        before = ids(rival)
        assert db.prune_sessions(days) == len(candidates)
        assert before - ids(rival) == {c["id"] for c in candidates}
        rival.close()
