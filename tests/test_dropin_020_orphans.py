"""hermes-agent 0.20.1's gateway repairs, run on both programs: orphaned sessions, never-active keyed
sessions, kanban workers' cli rows. Where the answers differ on purpose, the library's rule is tested."""
from __future__ import annotations

import time

import pytest

from agent_releases import AGENT_020, attempt, call
from hermes_state import SessionDB

pytestmark = pytest.mark.hermes_agent

T = 1_000_000.0
COLS = ("source, user_id, session_key, chat_id, chat_type, thread_id, display_name, parent_session_id, "
        "end_reason, ended_at IS NOT NULL")


def row(sid: str, source: str = "telegram", *, user: str | None = None, parent: str | None = None,
        started: float = T, msgs: tuple[float, ...] = (), **columns) -> list:
    """The operations making one session row with these columns and messages at these times."""
    ops = [call("create_session", sid, source, user_id=user, parent_session_id=parent)]
    for ts in msgs:
        ops.append(call("append_message", sid, "user", "hi"))
        ops.append(["execute", "UPDATE messages SET timestamp = ? WHERE id = (SELECT MAX(id) FROM messages "
                    "WHERE session_id = ?)", [ts, sid]])
    # After the messages: this library records activity when one is appended, 0.20.1 does not.
    values = {"started_at": started, "last_activity_at": None,
              **{("session_key" if k == "key" else k): v for k, v in columns.items()}}
    ops.append(["execute", f"UPDATE sessions SET {', '.join(k + ' = ?' for k in values)} WHERE id = ?",
                [*values.values(), sid]])
    return ops


def scene() -> list:
    """Orphans of every kind the report distinguishes, with the keyed rows they may continue."""
    return [
        *row("K1", key="k1", user="u1", chat_id="1", chat_type="dm", display_name="Al", msgs=(T + 1,)),
        *row("O1", parent="K1", started=T + 5000, msgs=(T + 5001, T + 5002)),           # lineage
        *row("K2", key="k2", user="u2", chat_id="2", chat_type="group", thread_id="t", started=T + 10000,
             msgs=(T + 10001,)),
        *row("O2", user="u2", started=T + 10500, msgs=(T + 10600,)),                   # contiguity
        *row("K3", "discord", key="k3", user="u3", started=T + 20000, msgs=(T + 20001,)),
        *row("K4", "discord", key="k4", user="u3", started=T + 20002, msgs=(T + 20003,)),
        *row("O3", "discord", user="u3", started=T + 20100, msgs=(T + 20101,)),       # ambiguous
        *row("K5", "slack", key="k5", started=T + 30000, msgs=(T + 30001,)),
        *row("O5", "slack", started=T + 40000, msgs=(T + 40001,)),                    # too far for 900 s
        *row("K6", "signal", key="k6", user="a", started=T + 50000, msgs=(T + 50001,)),
        *row("O6", "signal", user="b", started=T + 50100, msgs=(T + 50101,)),         # another user
        *row("O7", "signal", started=T + 50200),                                       # no messages
        *row("O8", "tool", started=T + 60000, msgs=(T + 60001,)),                     # unkeyed by design
        *row("O9", started=T + 61000, msgs=(T + 61001,), model_config='{"_delegate_from": "K1"}'),
        *row("O10", started=T + 62000, msgs=(T + 62001,), model_config='{"_branched_from": "K1"}'),
        *row("O11", "discord", parent="K1", started=T + 63000, msgs=(T + 63001,)),   # parent of another source
        *row("D1", "d1", key="kd1", started=T + 70000, last_activity_at=T + 75000, msgs=(T + 70001,)),
        *row("P1", "d1", started=T + 75100, msgs=(T + 75200,)),                       # quiet = recorded activity
        *row("D2", "d2", key="kd2", started=T + 80000, msgs=(T + 81000,)),
        *row("P2", "d2", started=T + 80100, msgs=(T + 81000,)),                       # donor not older: none
    ]


def test_the_orphan_report_is_the_agents(tmp_path):
    ops = [*scene(), call("find_orphaned_gateway_sessions"), call("find_orphaned_gateway_sessions", max_gap_s=1e9)]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert ours[-2:] == theirs[-2:]
    verdicts = {r["orphan_id"]: (r["donor_id"], r["evidence"], r["adoptable"]) for r in ours[-2]}
    assert verdicts["O1"] == ("K1", "lineage", True) and verdicts["O2"] == ("K2", "contiguity", True)
    assert verdicts["O3"][2] is False and verdicts["O5"][2] is False and verdicts["O6"][2] is False
    assert {"O7", "O8", "O9", "O10"}.isdisjoint(verdicts)
    assert {r["orphan_id"]: r["adoptable"] for r in ours[-1]}["O5"] is True


def test_adopting_copies_the_route_keeps_the_orphans_columns_and_retires_the_donor(tmp_path):
    ops = [*scene(), ["execute", "UPDATE sessions SET chat_type = 'mine' WHERE id = 'O2'", []],
           call("adopt_orphaned_gateway_session", "O2", "K2"),
           call("adopt_orphaned_gateway_session", "O2", "K2"),      # healed already: a no-op
           call("adopt_orphaned_gateway_session", "O1", "K1"),
           call("adopt_orphaned_gateway_session", "O5", "K1"),      # sources differ: no such pair
           call("adopt_orphaned_gateway_session", "nope", "K1"),
           ["query", f"SELECT id, {COLS} FROM sessions WHERE id IN ('O1', 'K1', 'O2', 'K2', 'O5') ORDER BY id", []]]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert ours[-6:] == theirs[-6:]
    assert ours[-6:-1] == [True, False, True, False, False]
    assert ["O2", "telegram", "u2", "k2", "2", "mine", "t", None, "K2", None, 0] in ours[-1]
    assert ["K2", "telegram", "u2", "k2", "2", "group", "t", None, None, "superseded_by_repair", 1] in ours[-1]


def test_adopting_a_pair_the_evidence_does_not_name_is_refused_here(tmp_path):
    # 0.20.1 adopts these (True): an ambiguous window, a donor quiet too long, another user's chat.
    # Each could splice one person's conversation into another's chat, so the library refuses.
    ops = [*scene(), attempt("adopt_orphaned_gateway_session", "O3", "K3"),
           attempt("adopt_orphaned_gateway_session", "O5", "K5"),
           attempt("adopt_orphaned_gateway_session", "O6", "K6"),
           ["query", "SELECT COUNT(*) FROM sessions WHERE session_key IS NOT NULL AND end_reason IS NULL", []]]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert theirs[-4:-1] == [True, True, True]
    for answer in ours[-4:-1]:
        assert "AdoptionRefusedError" in answer["raised"] and "ValueError" in answer["raised"]
    assert ours[-1] == [[8]]   # the refusals changed nothing
    with SessionDB(tmp_path / "ours" / "state.db") as db:   # a window as wide as the caller's report adopts
        assert db.adopt_orphaned_gateway_session("O5", "K5", max_gap_s=1e9) is True


def never_active_scene() -> list:
    now = time.time()
    old = now - 10 * 86400
    return [*row("N1", key="n1", chat_id="c", chat_type="dm", user="u", started=old),
            *row("N2", key="n2", started=old, title="t"), *row("N3", key="n3", started=old, input_tokens=1),
            *row("N4", key="n4", started=old, api_call_count=1), *row("N5", key="n5", started=old, tool_call_count=1),
            *row("N6", key="n6", started=old, last_activity_at=old), *row("N7", key="n7", started=old, pinned=1),
            *row("N8", key="n8", started=old, archived=1), *row("N9", key="n9", started=now - 86400),
            *row("N10", started=old), *row("N11", key="n11", started=old, ended_at=now),
            *row("N12", key="n12", started=old, msgs=(old,)),
            *row("N13", key="n13", started=old - 1, reasoning_tokens=1)]


def test_never_active_keyed_sessions_are_listed_and_pruned_with_their_routes(tmp_path):
    ops = [*never_active_scene(),
           call("list_never_active_keyed_sessions", older_than_days=5,
                spec=["id", "session_key", "source", "chat_id", "chat_type", "user_id"]),
           call("save_gateway_routing_entry", "n1", '{"session_id": "N1"}'),
           call("save_gateway_routing_entry", "x", '{"session_id": "N2"}'),
           call("save_gateway_routing_entry", "y", '{"other": "N13"}'),
           call("prune_never_active_keyed_sessions", older_than_days=5),
           ["query", "SELECT id FROM sessions ORDER BY id", []],
           call("load_gateway_routing_entries")]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert ours[-7:] == theirs[-7:]
    assert [r["id"] for r in ours[-7]] == ["N13", "N1"]
    assert ours[-3] == [2, 1] and ["N1"] not in ours[-2] and set(ours[-1]) == {"x", "y"}


def test_pruning_never_active_sessions_removes_their_transcripts(tmp_path):
    sessions_dir = tmp_path / "sessions"
    sessions_dir.mkdir()
    for name in ("N1.json", "N1.jsonl", "K1.json"):
        (sessions_dir / name).write_text("{}")
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("N1", "telegram")
        db.create_session("K1", "telegram")
        with db.transaction() as txn:
            txn.conn.execute("UPDATE sessions SET session_key = id, started_at = 1 WHERE id IN ('N1', 'K1')")
        db.append_message("K1", "user", "hi")
        assert db.prune_never_active_keyed_sessions(older_than_days=1, sessions_dir=sessions_dir) == (1, 0)
    assert sorted(p.name for p in sessions_dir.iterdir()) == ["K1.json"]


def test_kanban_worker_rows_are_retagged_once_per_root(tmp_path):
    root = "/srv/board/ws"
    ops = [*row("R1", "cli", cwd=root), *row("R2", "cli", cwd=root + "/a/b"), *row("R3", "cli", cwd=root + "x"),
           *row("R4", "telegram", cwd=root + "/a"), *row("R5", "CLI", cwd=root + "/c"),
           call("retag_kanban_worker_sessions", root + "/"),
           *row("R6", "cli", cwd=root + "/z"),
           call("retag_kanban_worker_sessions", root),
           ["query", "SELECT id, source FROM sessions ORDER BY id", []],
           ["query", "SELECT key, value FROM state_meta WHERE key LIKE 'kanban%'", []]]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert ours[-6] == theirs[-6] and ours[-3:] == theirs[-3:]
    assert ours[-6] == 2 and ours[-3] == 0
    assert ours[-1] == [["kanban_worker_source_retagged:" + root, "1"]]


@pytest.mark.parametrize("method, kwargs", [
    ("find_orphaned_gateway_sessions", {"max_gap_s": -1}), ("find_orphaned_gateway_sessions", {"max_gap_s": "x"}),
    ("list_never_active_keyed_sessions", {"older_than_days": float("nan")}),
    ("prune_never_active_keyed_sessions", {"older_than_days": -1}),
])
def test_bad_windows_are_refused_with_value_error(db, method, kwargs):
    with pytest.raises(ValueError):
        getattr(db, method)(**kwargs)


@pytest.mark.parametrize("args", [(None, "K1"), ("O1", 5), ("", "K1")])
def test_bad_adoption_ids_are_refused_with_value_error(db, args):
    with pytest.raises(ValueError):
        db.adopt_orphaned_gateway_session(*args)
    with pytest.raises(ValueError):
        db.retag_kanban_worker_sessions(args[1] if args[0] == "O1" else args[0])


def test_append_message_takes_its_arguments_positionally_as_the_agent_does(tmp_path):
    # hermes-agent 0.19.0 and 0.20.1 name every argument up to api_content positionally, in this order.
    args = ["s", "assistant", "text", "lookup", [{"id": "c1", "type": "function"}], "c0", 7, "stop", "why",
            "why, in full", [{"type": "summary"}], [{"id": "r1"}], [{"id": "m1"}], "pm-1", False, None,
            1_700_000_000.0, "text as sent"]
    ops = [call("create_session", "s", "cli"), call("append_message", *args),
           ["query", "SELECT role, content, tool_name, tool_call_id, token_count, finish_reason, reasoning, "
            "reasoning_content, platform_message_id, timestamp FROM messages", []]]
    theirs, ours = AGENT_020.both(tmp_path, ops)
    assert ours[-1] == theirs[-1] == [["assistant", "text", "lookup", "c0", 7, "stop", "why", "why, in full", "pm-1",
                                       1_700_000_000.0]]
    with SessionDB(tmp_path / "ours" / "state.db") as db:
        assert db.get_messages("s")[0]["api_content"] == "text as sent"
        # The newer names stay keyword-only after them.
        with pytest.raises(TypeError):
            db.append_message(*args, "note")
