"""Append throughput: SessionDB.append_message against the raw-SQL floor (target ratio <= 1.25).

    python bench/append.py [-n 20000] [--seed 1]

Both sides get the same corpus rows (bench/corpus.py: ~25% user, ~35% assistant, some with
tool calls, ~40% long tool results) on the same schema: the raw side's file is created by opening
a second SessionDB, so its tables, indexes and triggers are identical. The raw side then writes
with a plain sqlite3 connection (given the per-connection TEMP trigger that feeds the CJK index,
as every library handle has), one BEGIN IMMEDIATE transaction per message holding the INSERT and
the counter UPDATE, and does in Python the work that makes the rows identical (JSON, uids,
pairing). The two sides alternate session by session so machine noise hits both alike; only the appends
are timed. Prints both rates and the ratio (library time / raw time). For attribution it also
times a third file: the floor plus the library's PASSIVE checkpoint after every 50th commit, the one cost of append_message that is policy rather than statements.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import corpus  # noqa: E402

import hermes_state_fts as fts  # noqa: E402
import hermes_state_messages as message_rows  # noqa: E402
from hermes_state import SessionDB  # noqa: E402

_RAW_INSERT = ("INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, timestamp, "
               "observed, active, compacted, message_uid, tool_call_uids, tool_call_uid) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, 0, 1, 0, ?, ?, ?)")
_RAW_COUNT = ("UPDATE sessions SET message_count = message_count + 1, tool_call_count = tool_call_count + ?, "
              "last_activity_at = ? WHERE id = ?")


def _raw_row(sid: str, m: dict, last_uids: dict) -> tuple[tuple, tuple]:
    """The message row's values (as _RAW_INSERT takes them) and the counter update's, uids issued as the library does."""
    calls = m.get("tool_calls")
    ts = time.time()
    call_uids = None
    call_uid = None
    if calls and m["role"] == "assistant":
        issued = {c["id"]: uuid.uuid4().hex for c in calls}
        last_uids.clear()
        last_uids.update(issued)
        call_uids = json.dumps(issued)
    elif m["role"] == "tool":
        call_uid = last_uids.get(m.get("tool_call_id"))
    row = (sid, m["role"], m.get("content"), m.get("tool_call_id"),
           json.dumps(calls, ensure_ascii=False) if calls is not None else None,
           m.get("tool_name"), ts, uuid.uuid4().hex, call_uids, call_uid)
    return row, (len(calls) if calls and m["role"] == "assistant" else 0, ts, sid)


def raw_append(conn: sqlite3.Connection, sid: str, m: dict, last_uids: dict) -> None:
    """The floor: the same row written with plain SQL, one transaction per message."""
    row, count = _raw_row(sid, m, last_uids)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(_RAW_INSERT, row)
    conn.execute(_RAW_COUNT, count)
    conn.execute("COMMIT")


_RAW_QUEUE = (f"INSERT INTO {fts.PENDING}(id) SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence "
              "WHERE name = 'messages'), 0), COALESCE((SELECT MAX(id) FROM messages), 0)) + 1")
_RAW_QUEUED_INSERT = _RAW_INSERT.replace("(session_id,", "(id, session_id,").replace("VALUES (?,", "VALUES (?, ?,")


def raw_append_batched(conn: sqlite3.Connection, sid: str, m: dict, last_uids: dict) -> None:
    """The floor of the library's own write path: the row queued for a batch, which every BATCH_ROWS-th row indexes.

    Same durability as `raw_append` (one transaction per message; a search finds a queued row by
    scanning the queue), the statements the library's batch runs, written by hand.
    """
    row, count = _raw_row(sid, m, last_uids)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(_RAW_COUNT, count)
    row_id = conn.execute(_RAW_QUEUE).lastrowid
    conn.execute(_RAW_QUEUED_INSERT, (row_id, *row))
    if conn.execute(f"SELECT COUNT(*) >= ? FROM {fts.PENDING}", (message_rows.BATCH_ROWS,)).fetchone()[0]:
        fts.index_batch(conn)
    conn.execute("COMMIT")


def raw_copy(tmp: Path, name: str, sessions: list) -> sqlite3.Connection:
    """A file with the library's exact schema (made by a SessionDB), then a plain connection to it."""
    SessionDB(tmp / name).close()
    conn = sqlite3.connect(tmp / name, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    fts.install_write_triggers(conn)  # the per-connection TEMP trigger every library handle has
    for sid, source, _ in sessions:
        conn.execute("INSERT INTO sessions (id, source, started_at) VALUES (?, ?, ?)", (sid, source, time.time()))
    return conn


def run(n: int, seed: int) -> dict:
    sessions = list(corpus.sessions(n_messages=n, seed=seed))
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ.setdefault("HERMES_HOME", tmp_dir)
        lib = SessionDB(tmp / "library.db")
        for sid, source, _ in sessions:
            lib.create_session(sid, source)
        raw = raw_copy(tmp, "raw.db", sessions)
        ckpt = raw_copy(tmp, "raw_checkpointed.db", sessions)
        lib_s = raw_s = ckpt_s = 0.0
        count = 0
        for sid, _, msgs in sessions:
            t0 = time.perf_counter()
            for m in msgs:
                lib.append_message(sid, **m)
            t1 = time.perf_counter()
            last_uids: dict = {}
            for m in msgs:
                raw_append(raw, sid, m, last_uids)
            t2 = time.perf_counter()
            last_uids = {}
            for i, m in enumerate(msgs, count + 1):
                raw_append(ckpt, sid, m, last_uids)
                if i % SessionDB._CHECKPOINT_EVERY_N_WRITES == 0:
                    ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            t3 = time.perf_counter()
            lib_s, raw_s, ckpt_s = lib_s + t1 - t0, raw_s + t2 - t1, ckpt_s + t3 - t2
            count += len(msgs)
        shape = "SELECT COUNT(*), SUM(LENGTH(content)), SUM(LENGTH(tool_calls)) FROM messages"
        lib_rows = lib._writer.conn.execute(shape).fetchone()
        assert lib_rows == raw.execute(shape).fetchone() == ckpt.execute(shape).fetchone(), "sides differ"
        lib.close()
        raw.close()
        ckpt.close()
    return {"n": count, "library_per_s": count / lib_s, "raw_per_s": count / raw_s, "ratio": lib_s / raw_s,
            "checkpointed_per_s": count / ckpt_s, "ratio_checkpointed": lib_s / ckpt_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20000, help="messages to append on each side")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    r = run(args.n, args.seed)
    print(f"messages appended (each side): {r['n']}")
    print(f"append_message:  {r['library_per_s']:9.0f} msg/s")
    print(f"raw SQL floor:   {r['raw_per_s']:9.0f} msg/s")
    print(f"ratio (library time / raw time): {r['ratio']:.3f}  (target <= 1.25)")
    print(f"for attribution: raw SQL + PASSIVE checkpoint every {SessionDB._CHECKPOINT_EVERY_N_WRITES} "
          f"commits: {r['checkpointed_per_s']:.0f} msg/s; ratio to it {r['ratio_checkpointed']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
