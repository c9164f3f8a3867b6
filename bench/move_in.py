"""Moving in while other processes write: what their appends and short commands wait, side by side.

    python bench/heavy.py --scale 1 --dir DIR            # builds DIR/scale1-seed31/agent/state.db once
    python bench/move_in.py --agent-file DIR/scale1-seed31/agent/state.db [--writers 6] [--steady-s 60]

Copies hermes-agent's file into a scratch directory beside it and opens the copy with `SessionDB`,
as a user moving in does (the open that starts the move-in is the clock's zero). Then, on the same
file, each in a process of its own:
- `--writers` writers append one message every `--interval-s` to a session of their own, timing
  each append; they start as soon as writes go through (the copy and the upgrade done);
- a short command opens and closes a writable handle every `--probe-s`, timing both;
- a lock holder takes the write lock for `--hold-s` seconds, `--holds` times, spread over the run,
  as a long transaction of another program would.
The run lasts until all background work of the move-in has ended, then as long again as
`--steady-s` with nothing left to do (our steady state). The same load then runs for `--steady-s`
on a copy of hermes-agent's file through hermes-agent's own `SessionDB`, in its own venv
(`--agent-python`): its steady state. Prints one JSON document: when each part of the move-in
ended, and per phase the appends' waits (p50, p99, max), their throughput, and the short
commands' open and close (p50, p99).
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
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_AGENT = Path(os.environ.get("HERMES_AGENT_PYTHON") or ROOT / "bench" / ".venvs" / "hermes-agent" / "bin" / "python")

# Each load process imports `hermes_state` from its interpreter: this checkout (PYTHONPATH) or
# hermes-agent's package in its venv. It runs until the stop file appears and prints its timings.
WRITER = r"""
import json, os, sys, time
path, name, interval, stop = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
from hermes_state import SessionDB
db = SessionDB(db_path=__import__("pathlib").Path(path))
db.create_session(name, source="cli")
out = []
while not os.path.exists(stop):
    started = time.time(); t = time.perf_counter()
    try:
        db.append_message(name, role="user", content=f"tick {len(out)} of {name}")
        out.append((started, time.perf_counter() - t, None))
    except Exception as exc:
        out.append((started, time.perf_counter() - t, type(exc).__name__))
    time.sleep(interval)
db.close()
print(json.dumps(out))
"""

PROBE = r"""
import json, os, sys, time
from pathlib import Path
path, every, stop = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
from hermes_state import SessionDB
out = []
while not os.path.exists(stop):
    started = time.time(); t = time.perf_counter()
    db = SessionDB(db_path=path)
    opened = time.perf_counter() - t
    db.close()
    out.append((started, opened, time.perf_counter() - t - opened))
    time.sleep(every)
print(json.dumps(out))
"""

HOLDER = r"""
import json, sqlite3, sys, time
path, hold, at = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
zero = time.time()
conn = sqlite3.connect(path, timeout=60, isolation_level=None)
out = []
for when in at:
    time.sleep(max(0.0, zero + when - time.time()))
    t = time.time()
    conn.execute("BEGIN IMMEDIATE")
    got = time.time()
    time.sleep(hold)
    conn.execute("COMMIT")
    out.append((t, got - t))
conn.close()
print(json.dumps(out))
"""


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank), 0 when empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def summary(values: list[float]) -> dict[str, float]:
    """Count, p50, p99 and max of durations in seconds, the last three in ms."""
    return {"n": len(values), **{k: round(v * 1e3, 1) for k, v in (
        ("p50_ms", quantile(values, 0.5)), ("p99_ms", quantile(values, 0.99)), ("max_ms", max(values, default=0)))}}


class Load:
    """The writers, the short-command probe and the lock holder, on one file, until stopped."""

    def __init__(self, python: Path, path: Path, args: argparse.Namespace, hold_at: list[float], pythonpath: str):
        self.stop = path.parent / "load.stop"
        self.stop.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=pythonpath, HERMES_HOME=str(path.parent))
        self.started = time.time()

        def spawn(code: str, *argv: object) -> subprocess.Popen:
            return subprocess.Popen([str(python), "-c", code, *map(str, argv)], stdout=subprocess.PIPE, text=True,
                                    env=env, cwd=path.parent)
        self.writers = [spawn(WRITER, path, f"bench-writer-{n}", args.interval_s, self.stop) for n in range(args.writers)]
        self.probe = spawn(PROBE, path, args.probe_s, self.stop)
        self.holder = spawn(HOLDER, path, args.hold_s, json.dumps(hold_at)) if hold_at else None

    def finish(self) -> dict:
        """Stop every process and return their timings."""
        self.stop.touch()
        appends = [a for w in self.writers for a in json.loads(w.communicate()[0] or "[]")]
        probes = json.loads(self.probe.communicate()[0] or "[]")
        holds = json.loads(self.holder.communicate()[0] or "[]") if self.holder else []
        self.stop.unlink(missing_ok=True)
        return {"appends": appends, "probes": probes, "holds": holds, "started": self.started, "ended": time.time()}


def phase(load: dict, start: float, end: float) -> dict:
    """The appends and short commands that began between `start` and `end` (wall clock)."""
    appends = [a for a in load["appends"] if start <= a[0] < end]
    probes = [p for p in load["probes"] if start <= p[0] < end]
    return {"seconds": round(end - start, 1), "append_wait": summary([a[1] for a in appends]),
            "slow_appends": [(round(a[0] - start, 1), round(a[1] * 1e3)) for a in appends if a[1] > 0.5],
            "appends_per_s": round(len(appends) / max(end - start, 1e-9), 1),
            "failed_appends": sum(1 for a in appends if a[2]),
            "open": summary([p[1] for p in probes]), "close": summary([p[2] for p in probes]),
            "open_close": summary([p[1] + p[2] for p in probes])}


def fresh_copy(agent_file: Path, name: str) -> tuple[Path, Path]:
    """Copy hermes-agent's file into an emptied scratch folder `name` beside its own; return (folder, copy)."""
    scratch = agent_file.parent.parent / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    path = scratch / "state.db"
    shutil.copyfile(agent_file, path)
    return scratch, path


def holds_over(seconds: float, holds: int) -> list[float]:
    """When each lock hold begins, seconds after the load starts: spread evenly over the run."""
    return [seconds * (k + 1) / (holds + 1) for k in range(holds)]


def ours(agent_file: Path, args: argparse.Namespace) -> dict:
    scratch, path = fresh_copy(agent_file, "move-in")
    os.environ["HERMES_HOME"] = str(scratch)
    sys.path.insert(0, str(ROOT))
    from hermes_state import SessionDB  # noqa: PLC0415 - this checkout, after HERMES_HOME is set
    import hermes_state_fts as fts  # noqa: PLC0415
    import hermes_state_upgrade as upgrade  # noqa: PLC0415

    holds: list[tuple[float, str, float]] = []  # (when, kind, seconds) of each unit of background work

    def timed(kind: str, work):  # noqa: ANN001, ANN202 - wraps one unit of background work
        def run(*a, **k):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return work(*a, **k)
            finally:
                holds.append((time.time(), kind, time.perf_counter() - started))
        return run
    fts.advance = timed("index", fts.advance)
    upgrade.clear_retired_step = timed("clearing", upgrade.clear_retired_step)
    upgrade.free_ahead = timed("freeing ahead", upgrade.free_ahead)

    zero = time.time()
    db = SessionDB(path)
    opened = time.time() - zero
    while db.upgrading:
        time.sleep(0.05)
    upgraded = time.time()
    # The holds land in the background work's window; its length is the last run's, roughly.
    load = Load(Path(sys.executable), path, args, holds_over(args.expect_s, args.holds), str(ROOT))
    status = db.fts_rebuild_status()
    while db.fts_rebuild_status()["in_progress"]:
        time.sleep(0.25)
    indexed = time.time()
    db.wait_for_fts_rebuild()
    settled = time.time()
    db.close()
    # Our steady state: the same load, with holds of its own, as the agent's run has.
    steady_holds = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(args.hold_s),
                                     json.dumps(holds_over(args.steady_s, args.holds))], stdout=subprocess.PIPE, text=True)
    time.sleep(args.steady_s)
    steady_holds.communicate()
    done = load.finish()
    size = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    # A message is indexed whole, in one statement: one of a megabyte holds the lock about a second,
    # so the count of such messages bounds how many index units of the window are that long.
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        large = dict(zip(("over_100kb", "over_500kb", "over_1mb"), conn.execute(
            "SELECT COUNT(*) FILTER (WHERE n > 100000), COUNT(*) FILTER (WHERE n > 500000), "
            "COUNT(*) FILTER (WHERE n > 1000000) FROM (SELECT COALESCE(length(content), 0) "
            "+ COALESCE(length(tool_calls), 0) AS n FROM messages)").fetchone()))
    shutil.rmtree(scratch, ignore_errors=True)
    return {"constructor_s": round(opened, 2), "upgraded_s": round(upgraded - zero, 1),
            "indexed_s": round(indexed - zero, 1), "settled_s": round(settled - zero, 1),
            "status_after_upgrade": status, "bytes_after": size, "large_messages": large,
            "window": phase(done, upgraded, settled), "steady": phase(done, settled, settled + args.steady_s),
            "background": {kind: summary([h for _, k, h in holds if k == kind]) for kind in {k for _, k, _ in holds}},
            "long_background": [(round(at - zero, 1), kind, round(h * 1e3)) for at, kind, h in holds if h > 0.3]}


def work_left(path: Path) -> list[str]:
    """What background work the file still has: its upgrade, index markers, moved-aside tables, a worker's lease."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "state_meta" not in names or not any(n.startswith("messages_fts_cjk") for n in names):
            return ["upgrade"]
        keys = {r[0] for r in conn.execute("SELECT key FROM state_meta WHERE key IN ('fts_rebuild_high_water', "
                                           "'fts_merge_after_rebuild', 'background_worker')")}
        return sorted(keys) + sorted(n for n in names if n.startswith(("hermes_retired_fts_", "hermes_old_")))
    finally:
        conn.close()


def short_commands_only(agent_file: Path, args: argparse.Namespace) -> dict:
    """Move in with nothing but short commands: one writable open and close a second, from the first."""
    scratch, path = fresh_copy(agent_file, "move-in-short")
    zero = time.time()
    load = Load(Path(sys.executable), path, argparse.Namespace(**{**vars(args), "writers": 0}), [], str(ROOT))
    seen: dict[str, float] = {}
    left = ["upgrade"]
    while left:
        time.sleep(1.0)
        try:
            left = work_left(path)
        except sqlite3.Error:
            continue  # the upgrade is changing the catalogue: look again
        for item in ("upgrade", "fts_rebuild_high_water", "fts_merge_after_rebuild"):
            before = {"upgrade": None, "fts_rebuild_high_water": "upgrade", "fts_merge_after_rebuild": "fts_rebuild_high_water"}
            if item not in left and item not in seen and (before[item] is None or before[item] in seen):
                seen[item] = round(time.time() - zero, 1)
    ended = time.time()
    done = load.finish()
    size = path.stat().st_size
    wal = Path(f"{path}-wal").stat().st_size if Path(f"{path}-wal").exists() else 0
    shutil.rmtree(scratch, ignore_errors=True)
    return {"wal_bytes_after": wal, "upgraded_s": seen.get("upgrade"), "indexed_s": seen.get("fts_rebuild_high_water"),
            "merged_s": seen.get("fts_merge_after_rebuild"), "settled_s": round(ended - zero, 1), "bytes_after": size,
            "short_commands": phase(done, zero, ended)}


def agent(agent_file: Path, args: argparse.Namespace) -> dict:
    scratch, path = fresh_copy(agent_file, "agent-steady")
    load = Load(args.agent_python, path, args, holds_over(args.steady_s, args.holds), "")
    time.sleep(args.steady_s)
    done = load.finish()
    shutil.rmtree(scratch, ignore_errors=True)
    return {"steady": phase(done, done["started"], done["ended"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent-file", type=Path, required=True, help="hermes-agent's state.db (left unchanged)")
    ap.add_argument("--agent-python", type=Path, default=DEFAULT_AGENT)
    ap.add_argument("--writers", type=int, default=6)
    ap.add_argument("--interval-s", type=float, default=0.1, help="each writer's pause between two appends")
    ap.add_argument("--probe-s", type=float, default=1.0, help="pause between two short commands")
    ap.add_argument("--holds", type=int, default=2)
    ap.add_argument("--hold-s", type=float, default=3.0)
    ap.add_argument("--steady-s", type=float, default=60.0, help="length of each steady-state run")
    ap.add_argument("--expect-s", type=float, default=200.0, help="about how long the background work lasts")
    ap.add_argument("--skip-agent", action="store_true")
    ap.add_argument("--short-commands-only", action="store_true",
                    help="no long-lived handle and no writers: time how long the work takes under short commands alone")
    args = ap.parse_args()
    if args.short_commands_only:
        print(json.dumps({"short commands only": short_commands_only(args.agent_file, args)}, indent=1))
        return
    result = {"ours": ours(args.agent_file, args)}
    if not args.skip_agent:
        result["hermes-agent"] = agent(args.agent_file, args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
