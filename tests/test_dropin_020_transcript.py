"""hermes-agent 0.20.1's transcript, turn-lease and compression names, differentially against the real 0.20.1.

Each scenario runs the same operations (tests/hermes_agent_driver.py's `run`) through 0.20.1 in
its own venv and through this library, each on a fresh file, and compares what a caller sees.
An error is compared by what a caller's `except` clause catches: its class name and whether it is
a RuntimeError (0.20.1 derives these errors from RuntimeError; this library's also derive from its
HermesStateError). Where this library answers differently on purpose (docs/api.md, "Turn leases and
compression hand-offs"), the scenario stays on inputs both agree on and a test below checks the
library's answer alone. Select with `pytest -m hermes_agent`.
"""
from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import hermes_state_compression as compression
import hermes_state_messages as message_rows
from agent_releases import AGENT_020, attempt, call, ours
from hermes_state import (CompressionSessionBusyError, CompressionSessionClosedError, SessionDB,
                          SessionTurnLeaseLostError)
from hermes_state_errors import (HermesStateError, SessionClosedByCompressionError, SessionCompressionInProgressError,
                                 SessionNotFoundError)

pytestmark = pytest.mark.hermes_agent


def caught(answer: Any) -> Any:
    """An error answer as the names of its classes; any other answer as it is."""
    if isinstance(answer, dict) and set(answer) == {"raised"}:
        return answer["raised"]
    return answer


def assert_same(theirs: list, mine: list, ops: list, *, unequal: frozenset[int] = frozenset()) -> None:
    """Equal answers, op by op; an error is equal when the class 0.20.1 raised is among this library's error's classes.

    That is what a caller's `except` clause written for 0.20.1 sees. The ops in `unequal` only
    have to succeed in both (their results differ in kind).
    """
    assert len(theirs) == len(mine) == len(ops)
    for n, (a, b, op) in enumerate(zip(theirs, mine, ops)):
        where = f"operation {n} {op[:2]}: hermes-agent {a!r} != hermes-state {b!r}"
        if n in unequal:
            assert "raised" not in str(a) and "raised" not in str(b), where
        elif isinstance(a, dict) and set(a) == {"raised"}:
            assert isinstance(b, dict) and set(b) == {"raised"} and a["raised"][0] in b["raised"], where
        else:
            assert a == b, where


LEASES = ["query", "SELECT conversation_id, holder FROM session_turn_leases ORDER BY conversation_id"]


def plant_lease(conversation: str, holder: str, expires_at: float) -> list:
    return ["execute", "INSERT OR REPLACE INTO session_turn_leases (conversation_id, holder, acquired_at, expires_at) "
            "VALUES (?, ?, 1.0, ?)", [conversation, holder, expires_at]]


def test_turn_leases_answer_as_hermes_agent(tmp_path):
    ops = [
        ["create", "s1"],
        call("try_acquire_session_turn_lease", "s1", "A"), call("try_acquire_session_turn_lease", "s1", "A"),
        call("try_acquire_session_turn_lease", "s1", "B"),  # the other holder is refused
        call("refresh_session_turn_lease", "s1", "A", ttl_seconds=10), call("refresh_session_turn_lease", "s1", "B"),
        call("release_session_turn_lease", "s1", "B"), LEASES,  # not B's: stays
        call("release_session_turn_lease", "s1", "A"), call("release_session_turn_lease", "s1", "A"), LEASES,
        call("try_acquire_session_turn_lease", "nope", "A"), LEASES,  # no session row needed
        call("try_acquire_session_turn_lease", "", "A"), call("try_acquire_session_turn_lease", None, "A"),
        # an expired lease is taken over; its old holder can no longer refresh it
        plant_lease("s1", "OLD", 2.0), call("try_acquire_session_turn_lease", "s1", "B"),
        call("refresh_session_turn_lease", "s1", "OLD"), LEASES,
        # B's own expired lease, not taken over, is still B's
        ["execute", "UPDATE session_turn_leases SET expires_at = 3.0 WHERE conversation_id = 's1'"],
        call("refresh_session_turn_lease", "s1", "B"),
        ["query", "SELECT holder, expires_at > 1000 FROM session_turn_leases WHERE conversation_id = 's1'"],
        # a compression child's lease is its lineage root's
        ["create", "s2"], ["create_child", "c2", "s2"], ["end", "s2", "compression"],
        ["execute", "UPDATE sessions SET ended_at = (SELECT started_at FROM sessions WHERE id = 'c2') WHERE id = 's2'"],
        call("try_acquire_session_turn_lease", "c2", "C"), call("try_acquire_session_turn_lease", "s2", "D"), LEASES,
        ["create", "s3"],
        call("acquire_session_turn_lease", "s3", "W", wait_seconds=0),
        call("acquire_session_turn_lease", "s3", "X", wait_seconds=0), LEASES,
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[3] is False and mine[1] is True  # the second holder gets False, not an error


def test_transcript_writes_under_a_turn_lease_answer_as_hermes_agent(tmp_path):
    contents = ["role", "content"]
    ops = [
        ["create", "s1"],
        attempt("append_message", "s1", "user", "a", turn_lease_holder="T"),  # no lease: lost
        call("try_acquire_session_turn_lease", "s1", "T"),
        call("append_message", "s1", "user", "b", turn_lease_holder="T"),
        attempt("append_message", "s1", "user", "c", turn_lease_holder="U"),  # another holder's lease
        call("append_message", "s1", "user", "d"),  # no holder named: no lease check
        call("append_message", "s1", "user", "e", turn_lease_holder=""),
        ["execute", "UPDATE session_turn_leases SET expires_at = 1.0"],
        call("append_message", "s1", "user", "f", turn_lease_holder="T"),  # own expired lease: renewed
        ["query", "SELECT holder, expires_at > 1000 FROM session_turn_leases"],
        call("append_messages_batch", "s1", [{"role": "user", "content": "g"}, {"role": "assistant", "content": "h"}],
             turn_lease_holder="T"),
        attempt("append_messages_batch", "s1", [{"role": "user", "content": "x"}], turn_lease_holder="U"),
        call("append_messages_batch", "s1", []),
        call("get_messages", "s1", spec=contents), call("get_session", "s1", spec=["message_count"]),
        attempt("append_message", "nope", "user", "x", turn_lease_holder="T"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert caught(mine[1])[0] == "SessionTurnLeaseLostError"


def test_compression_bookkeeping_answers_as_hermes_agent(tmp_path):
    row = "get_compression_failure_cooldown_row"
    ops = [
        ["create", "s1"],
        call("get_compression_ineffective_count", "nope"), call("get_compression_ineffective_count", "s1"),
        call("set_compression_ineffective_count", "s1", 3), call("get_compression_ineffective_count", "s1"),
        call("set_compression_ineffective_count", "s1", 0), call("get_compression_ineffective_count", "s1"),
        call(row, "nope"), call(row, "s1"),
        call("record_compression_failure_cooldown", "s1", 5.0, "boom"), call(row, "s1"),  # expired, still stored
        call("clear_compression_failure_cooldown", "s1"), call(row, "s1"),
        call("restore_compression_failure_cooldown_row", "s1",
             {"session_exists": True, "cooldown_until": 5.0, "error": "boom"}), call(row, "s1"),
        call("restore_compression_failure_cooldown_row", "s1",
             {"session_exists": True, "cooldown_until": None, "error": "e"}), call(row, "s1"),
        attempt("restore_compression_failure_cooldown_row", "s1",
                {"session_exists": False, "cooldown_until": None, "error": None}),
        attempt("restore_compression_failure_cooldown_row", "nope",
                {"session_exists": True, "cooldown_until": 1.0, "error": None}),
        call("restore_compression_failure_cooldown_row", "nope",
             {"session_exists": False, "cooldown_until": None, "error": None}),
        call("get_active_message_watermark", "nope"), call("get_active_message_watermark", "s1"),
        ["append", "s1", "user", "hi"], ["append", "s1", "assistant", "yo"],
        call("get_active_message_watermark", "s1"),
        call("rewind_to_message", "s1", 1, spec=["rewound_count"]), call("get_active_message_watermark", "s1"),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert caught(mine[18])[0] == "RuntimeError"


def _history() -> list:
    # m0..m5 compacted away, "sum" + "after" live, u2/a2 rewound.
    return [["create", "s1"], *[["append", "s1", "user" if i % 2 == 0 else "assistant", f"m{i}"] for i in range(6)],
            call("archive_and_compact", "s1", [{"role": "user", "content": "sum"}]),
            ["append", "s1", "assistant", "after"], ["append", "s1", "user", "u2"], ["append", "s1", "assistant", "a2"],
            call("rewind_to_message", "s1", 9, spec=["rewound_count"])]


def test_get_messages_new_keywords_answer_as_hermes_agent(tmp_path):
    rows = ["id", "content", "active", "compacted"]
    reads = [dict(include_compacted=True), dict(include_compacted=True, include_inactive=True),
             dict(include_compacted=True, latest=True, limit=2), dict(include_compacted=True, latest=True, limit=2, offset=1),
             dict(include_compacted=True, latest=True), dict(include_compacted=True, latest=True, offset=2),
             dict(latest=True, limit=1), dict(after_id=3), dict(after_id=7, limit=1), dict(after_id=-1)]
    refused = [dict(after_id=3, include_compacted=True), dict(after_id=3, latest=True), dict(after_id=3, offset=1)]
    ops = [*_history(),
           *[call("get_messages", "s1", spec=rows, **kw) for kw in reads],
           *[attempt("get_messages", "s1", **kw) for kw in refused],
           call("get_messages", "nope", latest=True, limit=3),
           call("get_messages_as_conversation", "s1", include_row_ids=True, spec=["role", "content", "_row_id"]),
           call("get_messages_as_conversation", "s1", include_row_ids=True, include_inactive=True,
                spec=["content", "_row_id"]),
           call("get_messages_as_conversation", "s1", spec=["content", "_row_id"])]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert [caught(a)[0] for a in mine[len(_history()) + len(reads):][:3]] == ["ValueError"] * 3


def test_replace_messages_modes_answer_as_hermes_agent(tmp_path):
    rows = ["content", "active", "compacted"]
    ops = [["create", "r2"], *[["append", "r2", "user", f"x{i}"] for i in range(3)],
           call("archive_and_compact", "r2", [{"role": "user", "content": "rs"}]), ["append", "r2", "assistant", "y"],
           call("replace_messages", "r2", [{"role": "user", "content": "n1"}], active_only=True),
           call("get_messages", "r2", include_inactive=True, spec=rows), call("get_session", "r2", spec=["message_count"]),
           call("replace_messages", "r2", [{"role": "user", "content": "n2"}, {"role": "assistant", "content": "n3"}],
                archive_dropped=True),
           call("get_messages", "r2", include_inactive=True, spec=rows), call("get_session", "r2", spec=["message_count"]),
           call("get_messages", "r2", spec=rows)]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops, unequal=frozenset({6, 9}))  # 0.20.1 returns None, this library the count
    assert mine[10] == [{"content": "x0", "active": 0, "compacted": 1}, {"content": "x1", "active": 0, "compacted": 1},
                        {"content": "x2", "active": 0, "compacted": 1}, {"content": "n1", "active": 0, "compacted": 0},
                        {"content": "n2", "active": 1, "compacted": 0}, {"content": "n3", "active": 1, "compacted": 0}]


def test_archive_and_compact_new_keywords_answer_as_hermes_agent(tmp_path):
    rows = ["content", "active", "compacted"]
    ops = [["create", "s1"], *[["append", "s1", "user", f"m{i}"] for i in range(3)],
           call("get_active_message_watermark", "s1"), ["append", "s1", "user", "late"],
           call("archive_and_compact", "s1", [{"role": "user", "content": "sum"}], watermark=3,
                model_config_patch={"a": 1, "b": None}),
           call("get_messages", "s1", include_inactive=True, spec=rows),
           call("get_session", "s1", spec=["message_count", "model_config"]),
           call("archive_and_compact", "s1", [{"role": "user", "content": "sum2"}],
                model_config_patch={"a": None, "c": [1]}),
           call("get_session", "s1", spec=["message_count", "model_config"]),
           call("try_acquire_compression_lock", "s1", "C"),
           attempt("archive_and_compact", "s1", [{"role": "user", "content": "x"}], lock_holder="D"),
           call("archive_and_compact", "s1", [{"role": "user", "content": "sum3"}], lock_holder="C"),
           call("append_message", "s1", "assistant", "owner writes", compression_lock_holder="C"),
           call("release_compression_lock", "s1", "C"),
           attempt("archive_and_compact", "s1", [{"role": "user", "content": "x"}], lock_holder="C"),
           call("get_messages", "s1", spec=rows)]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops, unequal=frozenset({15}))  # release: 0.20.1 None, this library True
    assert caught(mine[12])[0] == "SessionCompressionInProgressError"


def test_compression_children_answer_as_hermes_agent(tmp_path):
    rows = ["content", "active"]
    child = ["parent_session_id", "source", "model", "system_prompt", "cwd", "message_count", "end_reason"]
    handoff = [{"role": "user", "content": "sum"}]
    ops = [["create", "p1"], *[["append", "p1", "user", f"m{i}"] for i in range(3)],
           call("find_live_compression_child", "p1"), call("find_live_compression_child", "nope"),
           attempt("publish_compression_child", parent_session_id="p1", child_session_id="c1", source="cli",
                   messages=handoff),  # no lease
           call("try_acquire_compression_lock", "p1", "H"),
           call("publish_compression_child", parent_session_id="p1", child_session_id="c1", source="cli",
                messages=handoff, compression_lock_holder="H", model="m2", system_prompt="SP", cwd="/w"),
           call("get_session", "p1", spec=["end_reason", "message_count"]), call("get_session", "c1", spec=child),
           call("get_messages", "c1", spec=rows), call("find_live_compression_child", "p1", spec=["id"]),
           call("reopen_orphaned_compression_session", "p1"),  # it has a continuation
           attempt("publish_compression_child", parent_session_id="p1", child_session_id="c2", source="cli",
                   messages=handoff, require_compression_lease=False),  # already closed
           attempt("append_message", "p1", "user", "late"),
           attempt("append_messages_batch", "p1", [{"role": "user", "content": "late"}]),
           # a parent closed without any child is an orphan to reopen, once
           ["create", "o1"], ["append", "o1", "user", "x"], ["end", "o1", "compression"],
           call("find_live_compression_child", "o1"), call("reopen_orphaned_compression_session", "o1"),
           call("get_session", "o1", spec=["end_reason"]), call("reopen_orphaned_compression_session", "o1"),
           call("reopen_orphaned_compression_session", "nope"),
           ["create", "o2"], ["end", "o2", "user_exit"], call("reopen_orphaned_compression_session", "o2"),
           ["create", "o3"], ["end", "o3", "compression"], call("try_acquire_compression_lock", "o3", "Z"),
           call("reopen_orphaned_compression_session", "o3"),  # a live compression lease owns it
           # rows appended while the summary was written follow the handoff; the caller's own flush does not
           ["create", "w1"], *[["append", "w1", "user", f"w{i}"] for i in range(3)]]
    watermark = len(ops)
    ops += [call("get_active_message_watermark", "w1"), ["append", "w1", "user", "late1"],
            call("get_active_message_watermark", "w1"), ["append", "w1", "user", "flush"],
            call("try_acquire_compression_lock", "w1", "H"),
            call("publish_compression_child", parent_session_id="w1", child_session_id="wc", source="cli",
                 messages=[{"role": "user", "content": "S"}], compression_lock_holder="H",
                 watermark={"$": watermark}, watermark_ceiling={"$": watermark + 2}),
            call("get_messages", "wc", spec=rows), call("get_session", "w1", spec=["end_reason"])]
    theirs, mine = both(tmp_path, ops)
    # publishing from a closed parent: 0.20.1 raises a plain RuntimeError, this library its closed-session error
    assert_same(theirs, mine, ops)
    assert caught(mine[14])[0] == "SessionClosedByCompressionError"
    assert caught(mine[6])[0] == "CompressionSessionBusyError"
    assert mine[-2] == [{"content": "S", "active": 1}, {"content": "late1", "active": 1}]


# --- this library's own answers: races, the shared file, waits, bad input ------------------------------

def test_two_holders_racing_for_one_turn_lease_one_wins(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as first, SessionDB(path) as second:
        for round_ in range(10):
            conversation = f"s{round_}"
            start, answers = threading.Barrier(2), {}

            def race(db: SessionDB, holder: str, conversation: str = conversation,
                     start: threading.Barrier = start, answers: dict = answers) -> None:
                start.wait()
                answers[holder] = db.try_acquire_session_turn_lease(conversation, holder)
            threads = [threading.Thread(target=race, args=(first, "A")), threading.Thread(target=race, args=(second, "B"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(answers.values()) == [False, True], answers
            winner = next(h for h, won in answers.items() if won)
            loser = "B" if winner == "A" else "A"
            with closing(sqlite3.connect(path)) as raw:
                assert raw.execute("SELECT holder FROM session_turn_leases WHERE conversation_id = ?",
                                   (conversation,)).fetchall() == [(winner,)]
            with pytest.raises(SessionTurnLeaseLostError):  # the loser's transcript write is refused
                compression_check(first if loser == "A" else second, conversation, loser)


def compression_check(db: SessionDB, conversation: str, holder: str) -> None:
    # The loser's write to a conversation it does not hold is refused (the session need not exist yet).
    with db.transaction() as txn:
        message_rows.check_turn_lease(txn.conn, conversation, holder)


def test_a_lease_one_program_holds_is_refused_to_the_other(tmp_path):
    AGENT_020.require()
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
    assert AGENT_020.run(path, ["call", "try_acquire_session_turn_lease", ["s1", "agent"], {}, None]) == [True]
    with SessionDB(path) as db:
        assert db.try_acquire_session_turn_lease("s1", "library") is False
        with pytest.raises(SessionTurnLeaseLostError):
            db.append_message("s1", "user", "x", turn_lease_holder="library")
    assert AGENT_020.run(path, ["call", "release_session_turn_lease", ["s1", "agent"], {}, None],
                         ["call", "try_acquire_session_turn_lease", ["s1", "other"], {}, None]) == [None, True]
    with SessionDB(path) as db:
        with closing(sqlite3.connect(path)) as raw:
            raw.execute("UPDATE session_turn_leases SET expires_at = 5.0")  # the agent's lease ran out
            raw.commit()
        assert db.try_acquire_session_turn_lease("s1", "library") is True
    assert AGENT_020.run(path, ["call", "try_acquire_session_turn_lease", ["s1", "agent"], {}, None]) == [False]


def test_acquire_waits_between_tries_and_stops_when_told():
    ticks, answers, slept, notices = [0.0], iter([False, False, False, True]), [], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        ticks[0] += seconds
    assert compression.acquire_session_turn_lease(lambda: next(answers), wait_seconds=10, poll_interval_seconds=2,
                                                  wait_notice_interval_seconds=3, on_wait=notices.append,
                                                  clock=lambda: ticks[0], sleep=sleep) is True
    assert slept == [2, 2, 2] and notices == [0.0, 4.0]
    ticks[0], slept[:] = 0.0, []
    assert compression.acquire_session_turn_lease(lambda: False, wait_seconds=5, poll_interval_seconds=2,
                                                  clock=lambda: ticks[0], sleep=sleep) is False
    assert slept == [2, 2, 1]
    tries = []
    assert compression.acquire_session_turn_lease(lambda: tries.append(1) or True, should_abort=lambda: True,
                                                  clock=lambda: 0.0, sleep=sleep) is False
    assert tries == []  # told to stop before the first try: nothing was taken


def test_an_owners_own_compression_lock_lets_its_writes_through(db):
    db.compression_wait_s = 0
    db.create_session("s1", "cli")
    assert db.try_acquire_compression_lock("s1", "C")
    with pytest.raises(SessionCompressionInProgressError):
        db.append_message("s1", "user", "not the owner")
    with pytest.raises(SessionCompressionInProgressError):
        db.append_messages_batch("s1", [{"role": "user", "content": "x"}], compression_lock_holder="D")
    db.append_message("s1", "user", "owner", compression_lock_holder="C")
    assert db.append_messages_batch("s1", [{"role": "user", "content": "owner 2"}], "C") == 1
    assert [m["content"] for m in db.get_messages("s1")] == ["owner", "owner 2"]


def test_callers_except_clauses_for_0201_errors_catch_the_librarys_errors():
    assert issubclass(SessionCompressionInProgressError, CompressionSessionBusyError)
    assert issubclass(SessionClosedByCompressionError, CompressionSessionClosedError)
    for cls in (CompressionSessionBusyError, CompressionSessionClosedError, SessionTurnLeaseLostError):
        assert issubclass(cls, RuntimeError) and issubclass(cls, HermesStateError)


@pytest.mark.parametrize("call_, error", [
    (lambda db: db.try_acquire_session_turn_lease("s1", ""), ValueError),
    (lambda db: db.try_acquire_session_turn_lease("s1", None), ValueError),
    (lambda db: db.try_acquire_session_turn_lease("s1", 5), ValueError),
    (lambda db: db.try_acquire_session_turn_lease(5, "A"), ValueError),
    (lambda db: db.try_acquire_session_turn_lease("s1", "A", ttl_seconds=0), ValueError),
    (lambda db: db.try_acquire_session_turn_lease("s1", "A", ttl_seconds="x"), ValueError),
    (lambda db: db.refresh_session_turn_lease("s1", None), ValueError),
    (lambda db: db.release_session_turn_lease("s1", 5), ValueError),
    (lambda db: db.append_message("s1", "user", "x", turn_lease_holder="T", turn_lease_ttl_seconds=-1), ValueError),
    (lambda db: db.set_compression_ineffective_count("s1", -1), ValueError),
    (lambda db: db.set_compression_ineffective_count("s1", "x"), ValueError),
    (lambda db: db.set_compression_ineffective_count("s1", None), ValueError),
    (lambda db: db.set_compression_ineffective_count("nope", 1), SessionNotFoundError),
    (lambda db: db.restore_compression_failure_cooldown_row(
        "s1", {"session_exists": True, "cooldown_until": "x", "error": 5}), ValueError),
    (lambda db: db.restore_compression_failure_cooldown_row("s1", None), ValueError),
    (lambda db: db.restore_compression_failure_cooldown_row("s1", {"exists": True}), ValueError),
    (lambda db: db.get_messages("s1", after_id="3"), ValueError),
    (lambda db: db.get_messages("s1", latest=True, limit=-1), ValueError),
    (lambda db: db.archive_and_compact("s1", [], model_config_patch=["a"]), ValueError),
    (lambda db: db.archive_and_compact("nope", [{"role": "user", "content": "x"}]), SessionNotFoundError),
    (lambda db: db.append_messages_batch("s1", [{"role": "user", "content": "x"}], chunk_rows=0), ValueError),
    (lambda db: db.append_messages_batch("s1", [{"role": "user", "content": "x"}, {"content": "no role"}]), ValueError),
    (lambda db: db.append_messages_batch("nope", [{"role": "user", "content": "x"}]), SessionNotFoundError),
    (lambda db: db.publish_compression_child(parent_session_id="s1", child_session_id="c", source="cli", messages=[],
                                             require_compression_lease=False), ValueError),
    (lambda db: db.publish_compression_child(parent_session_id="nope", child_session_id="c", source="cli",
                                             messages=[{"role": "user", "content": "x"}],
                                             require_compression_lease=False), SessionNotFoundError),
])
def test_bad_input_is_a_typed_error_and_writes_nothing(db, call_, error):
    db.create_session("s1", "cli")
    db.append_message("s1", "user", "kept")
    db.record_compression_failure_cooldown("s1", 7.0, "e")
    before = db.export_session("s1")
    with closing(sqlite3.connect(db.db_path)) as raw:
        leases = raw.execute("SELECT * FROM session_turn_leases").fetchall()
    with pytest.raises(error):
        call_(db)
    assert db.export_session("s1") == before
    assert db.get_session("c") is None
    with closing(sqlite3.connect(db.db_path)) as raw:
        assert raw.execute("SELECT * FROM session_turn_leases").fetchall() == leases


def both(tmp_path: Path, ops: list) -> tuple[list, list]:
    """Return (hermes-agent 0.20.1's answers, hermes-state's answers) to `ops`, each on a fresh file."""
    return AGENT_020.both(tmp_path, ops)
