"""Moving in while another process writes: how long the open blocks, and what the writer waits meanwhile.

    python bench/heavy.py --scale 1 --dir DIR            # builds DIR/scale1-seed31/agent/state.db once
    python bench/move_in.py --agent-file DIR/scale1-seed31/agent/state.db [--seconds 30]

Copies hermes-agent's file into a scratch directory beside it and opens the copy with `SessionDB`,
as a user moving in does. As soon as the constructor returns, a second process opens the same file
and appends one message every 50 ms for `--seconds`, timing each append. Meanwhile this process
times each write transaction of its background thread (emptying the old index's tables, then
rebuilding the indexes) by wrapping the two functions that do one unit of that work. Prints one
JSON line: the constructor's time, when the old tables were gone and the indexes complete (both
from the open's start), the transactions' holds and the appends' waits (p50, p99, max, in ms), and
the slow appends with when they happened.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

APPENDER = r"""
import json, sys, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
db.create_session("bench-appender", source="cli")
waits, end = [], time.time() + float(sys.argv[2])
while time.time() < end:
    started = time.perf_counter()
    db.append_message("bench-appender", role="user", content="tick")
    waits.append((time.time(), time.perf_counter() - started))
    time.sleep(0.05)
db.close()
print(json.dumps(waits))
"""


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank), 0 when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))] if ordered else 0.0


def summary(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of durations in seconds, in ms."""
    return {k: round(v * 1e3, 1) for k, v in
            (("p50_ms", quantile(values, 0.5)), ("p99_ms", quantile(values, 0.99)), ("max_ms", max(values, default=0)))}


def retired_left(path: Path) -> int:
    """How many of the old index's moved-aside tables are still in the file."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name GLOB 'hermes_retired_fts_*'").fetchone()[0]
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent-file", type=Path, required=True, help="hermes-agent's state.db (left unchanged)")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the second process appends")
    args = ap.parse_args()
    scratch = args.agent_file.parent.parent / "move-in"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    path = scratch / "state.db"
    shutil.copyfile(args.agent_file, path)
    os.environ["HERMES_HOME"] = str(scratch)

    import hermes_state_fts as fts
    import hermes_state_upgrade as upgrade
    from hermes_state import SessionDB

    holds: dict[str, list[float]] = {"clearing": [], "rebuild": []}

    def timed(kind: str, work):  # noqa: ANN001, ANN202 - wraps one unit of background work
        def run(*a, **k):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return work(*a, **k)
            finally:
                holds[kind].append(time.perf_counter() - started)
        return run
    upgrade.clear_retired_step = timed("clearing", upgrade.clear_retired_step)
    fts.advance = timed("rebuild", fts.advance)

    t0 = time.perf_counter()
    db = SessionDB(path)
    opened = time.perf_counter() - t0
    wall0 = time.time() - opened
    appender = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(args.seconds)], stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    cleared = None
    while cleared is None and appender.poll() is None:
        if not retired_left(path):
            cleared = time.perf_counter() - t0
        time.sleep(0.5)
    waits = json.loads(appender.communicate()[0])
    db.wait_for_fts_rebuild()
    indexed = time.perf_counter() - t0
    db.close()
    print(json.dumps({
        "constructor_s": round(opened, 2), "old_tables_gone_s": cleared and round(cleared, 1),
        "indexes_complete_s": round(indexed, 1),
        "clearing_transactions": len(holds["clearing"]), "clearing_hold": summary(holds["clearing"]),
        "rebuild_transactions": len(holds["rebuild"]), "rebuild_hold": summary(holds["rebuild"]),
        "appends": len(waits), "append_wait": summary([w for _, w in waits]),
        "slow_appends": [(round(at - wall0, 1), round(w * 1e3)) for at, w in waits if w > 0.2]}))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
