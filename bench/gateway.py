"""Gateway ledgers against raw-SQL floors, and the cost of the marker index on appends.

    python bench/gateway.py [-n 2000] [--history 20000]

1. One admission's life (admit, start, finish: three write transactions) through SessionDB against
   the same statements (compare-and-set reads included) in three BEGIN IMMEDIATE transactions on a
   plain connection, with the library's PASSIVE checkpoint after every 50th commit.
2. next_admission on a session with `--history` finished admissions, against the raw head query.
3. The exception-path ownership check (persist_failed_turn_input finding the marker) on a session
   whose history is `--history` messages long, against a raw BEGIN IMMEDIATE + marker lookup +
   COMMIT; also the same call on a 100-message session, to show the cost does not grow with history.
4. append_message with a marker in display_metadata, with and without the marker index (dropped on
   a copy), to price the index.
Everything runs in one process on files in one temporary directory; ratios are library / floor.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HERMES_STATE_DB_GUARD_BYPASS", "1")

from hermes_state import SessionDB  # noqa: E402
from hermes_state_common import INPUT_MARKER_SQL, LIVE_ADMISSION_SQL  # noqa: E402


def timed(fn, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


def raw_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


class Committer:
    """COMMIT, plus the library's PASSIVE checkpoint after every 50th commit (its policy, not a statement)."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn, self.commits = conn, 0

    def __call__(self) -> None:
        self.conn.execute("COMMIT")
        self.commits += 1
        if self.commits % 50 == 0:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def admissions(tmp: Path, n: int, history: int) -> None:
    db = SessionDB(tmp / "lib.db")
    SessionDB(tmp / "raw.db").close()  # identical schema for the floor
    raw = raw_conn(tmp / "raw.db")
    db.create_session("s", "bench")
    raw.execute("INSERT INTO sessions (id, source, started_at) VALUES ('s', 'bench', 0)")
    epoch = db.claim_runtime()
    commit = Committer(raw)

    def lib(i: int) -> None:
        a = db.admit_input("s", {"i": i})
        db.start_admission(a, epoch)
        db.finish_admission(a, "completed", epoch)

    def floor(i: int) -> None:
        # The same statements the library runs, compare-and-set reads included.
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("SELECT 1 FROM sessions WHERE id = 's'").fetchone()
        a = raw.execute("INSERT INTO session_admissions (session_id, payload_json, state, created_at) "
                        "VALUES ('s', ?, 'queued', ?)", (f'{{"i": {i}}}', time.time())).lastrowid
        commit()
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("SELECT * FROM session_admissions WHERE id = ?", (a,)).fetchall()
        raw.execute("SELECT epoch FROM runtime_epoch WHERE id = 1").fetchone()
        raw.execute(f"SELECT * FROM session_admissions WHERE session_id = 's' AND {LIVE_ADMISSION_SQL} "
                    "ORDER BY id LIMIT 1").fetchall()
        raw.execute("UPDATE session_admissions SET state = 'started', epoch = 1, started_at = ? "
                    "WHERE id = ? AND state = 'queued'", (time.time(), a))
        commit()
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("SELECT * FROM session_admissions WHERE id = ?", (a,)).fetchall()
        raw.execute("SELECT epoch FROM runtime_epoch WHERE id = 1").fetchone()
        raw.execute("UPDATE session_admissions SET state = 'completed', finished_at = ? WHERE id = ? AND state = ?",
                    (time.time(), a, "started"))
        commit()

    t_lib, t_raw = timed(lib, n), timed(floor, n)
    print(f"admission life (3 txns): library {t_lib * 1e3:.3f} ms, floor {t_raw * 1e3:.3f} ms, "
          f"ratio {t_lib / t_raw:.2f}")
    for i in range(history - n):
        lib(i)
    db.admit_input("s", "head")
    head_sql = f"SELECT * FROM session_admissions WHERE session_id = 's' AND {LIVE_ADMISSION_SQL} ORDER BY id LIMIT 1"
    t_lib = timed(lambda i: db.next_admission("s"), n)
    t_raw = timed(lambda i: raw.execute(head_sql).fetchall(), n)
    print(f"next_admission behind {history} finished: library {t_lib * 1e6:.1f} us, "
          f"raw {t_raw * 1e6:.1f} us (raw file has {n} finished), ratio {t_lib / t_raw:.2f}")
    db.close()
    raw.close()


def ownership(tmp: Path, n: int, history: int) -> None:
    db = SessionDB(tmp / "own.db")
    for sid, size in (("long", history), ("short", 100)):
        db.create_session(sid, "bench")
        for i in range(size):
            db.append_message(sid, "user", f"question {i} " + "x" * 300,
                              display_metadata={"input_marker": f"{sid}-{i}"})
            db.append_message(sid, "assistant", "answer " + "y" * 1500)
    db.close()
    db = SessionDB(tmp / "own.db")
    raw = raw_conn(tmp / "own.db")
    lookup = (f"SELECT session_id, id FROM messages WHERE display_metadata IS NOT NULL AND {INPUT_MARKER_SQL} = ? "
              "AND session_id = ? AND role = 'user' LIMIT 1")

    def floor(i: int) -> None:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute(lookup, ("long-5", "long")).fetchall()
        raw.execute("COMMIT")

    t_long = timed(lambda i: db.persist_failed_turn_input("long", "question 5", "long-5"), n)
    t_short = timed(lambda i: db.persist_failed_turn_input("short", "question 5", "short-5"), n)
    t_raw = timed(floor, n)
    print(f"ownership check, marker found: {history}-turn session {t_long * 1e3:.3f} ms, 100-turn session "
          f"{t_short * 1e3:.3f} ms (long/short {t_long / t_short:.2f}); floor {t_raw * 1e3:.3f} ms, "
          f"ratio {t_long / t_raw:.2f}")
    db.close()
    raw.close()


def marker_index_cost(tmp: Path, n: int) -> None:
    a, b = SessionDB(tmp / "with.db"), SessionDB(tmp / "without.db")
    # Dropped after b opened: opening again would recreate the declared index.
    conn = sqlite3.connect(tmp / "without.db", isolation_level=None)
    conn.execute("DROP INDEX idx_messages_input_marker")
    conn.close()
    for db in (a, b):
        db.create_session("s", "bench")
    times = {id(a): 0.0, id(b): 0.0}
    for round_ in range(4):  # alternate so machine noise hits both alike
        for db in ((a, b) if round_ % 2 == 0 else (b, a)):
            times[id(db)] += timed(lambda i: db.append_message(
                "s", "user", "hello " * 20, display_metadata={"input_marker": f"m-{round_}-{i}"}), n // 4)
    print(f"append with a marker: with index {times[id(a)] / 4 * 1e3:.3f} ms, without {times[id(b)] / 4 * 1e3:.3f} ms, "
          f"ratio {times[id(a)] / times[id(b)]:.3f}")
    a.close()
    b.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--history", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        admissions(Path(tmp), args.n, args.history)
        ownership(Path(tmp), args.n, args.history)
        marker_index_cost(Path(tmp), args.n)


if __name__ == "__main__":
    main()
