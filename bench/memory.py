"""Peak memory of `iter_export` and `recover` beside the database size (it must stay flat: < 200 MB at 1 GB).

    python bench/memory.py --db PATH          # an existing, current hermes-state database (never written)
    python bench/memory.py [-n 50000]         # builds one of N corpus messages first (about 100 MB at 50,000)

Each operation runs in a fresh child process (a new interpreter) and reports its peak resident
set size: `VmHWM` from /proc/self/status, the kernel's high-water mark of the process since it
started, read when the operation is done. Where /proc does not exist the parent takes the child's
`ru_maxrss` from wait4 instead, which on Linux would also count the parent's own pages shared at
fork time before the child's exec (so it is not the first choice there):

- floor: import hermes_state, open the database read-only and read one session: what any program
  using the library pays before it does anything large.
- iter_export: `SessionDB.iter_export()` over every session, each document serialized to JSON and
  dropped, as an export to a file does. It also samples its resident size as it goes.
- recover: `recover()` of the file into a new one in a temporary directory (on a healthy file:
  every row copied, every index rebuilt), deleted afterwards.

Printed beside the database size: each peak, and its difference to the floor, which is what the
operation itself holds. Without --db, the database is built in a temporary directory from the
project's corpus (bench/corpus.py) through the library's public append path. The run is saved
to bench/results/<date>.json with the other benchmarks' runs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import record  # noqa: E402

OPERATIONS = ("floor", "iter_export", "recover")
LIMIT_MB = 200


def vm_kb(field: str) -> int | None:
    """Return a VmRSS/VmHWM line of this process's /proc status in kB (None where /proc is missing)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


def child(operation: str, path: str, workdir: str) -> dict:
    """Run one operation in this (child) process; return what it did."""
    from hermes_state import SessionDB, recover  # noqa: PLC0415  (the import is part of the floor)
    t0 = time.perf_counter()
    out: dict = {}
    if operation == "floor":
        with SessionDB(path, read_only=True) as db:
            first = db.list_sessions(limit=1)
            out["messages"] = len(db.get_messages(first[0]["id"])) if first else 0
    elif operation == "iter_export":
        sessions = messages = json_bytes = 0
        samples = []
        with SessionDB(path, read_only=True) as db:
            total = db.count_sessions(include_archived=True)
            every = max(total // 10, 1)
            for document in db.iter_export():
                json_bytes += len(json.dumps(document, ensure_ascii=False))
                sessions += 1
                messages += len(document["messages"])
                if sessions % every == 0:
                    samples.append([sessions, round((vm_kb("VmRSS") or 0) / 1024, 1)])
        out.update(sessions=sessions, messages=messages, json_mb=round(json_bytes / 1e6, 1), rss_samples_mb=samples)
    elif operation == "recover":
        target = Path(workdir) / "recovered.db"
        report = recover(path, target)
        out.update(messages=report.tables["messages"].copied if "messages" in report.tables else 0,
                   complete=report.complete, target_mb=round(target.stat().st_size / 1e6, 1))
        for p in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
            p.unlink(missing_ok=True)
    else:
        raise SystemExit(f"unknown operation {operation!r}")
    hwm = vm_kb("VmHWM")
    out.update(seconds=round(time.perf_counter() - t0, 2), vm_hwm_mb=None if hwm is None else round(hwm / 1024, 1))
    return out


def run_child(operation: str, path: Path, workdir: Path) -> dict:
    """Run `operation` in a child process; return its report plus its peak RSS as the kernel counted it."""
    env = dict(os.environ, HERMES_HOME=str(workdir))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "child", operation, str(path),
                             str(workdir)], stdout=subprocess.PIPE, env=env, text=True)
    output = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's rusage, not the maximum over all children
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"the {operation} child failed (exit status {proc.returncode})")
    report = json.loads(output)
    if report["vm_hwm_mb"] is None:  # ru_maxrss is in kilobytes on Linux, in bytes on macOS
        report["peak_rss_mb"] = round(usage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)
        report["peak_from"] = "ru_maxrss"
    else:
        report["peak_rss_mb"], report["peak_from"] = report["vm_hwm_mb"], "VmHWM"
    return report


def measure(path: Path, workdir: Path | None = None) -> dict:
    """Measure the floor, iter_export and recover on `path`; return the figures (the file is only read)."""
    with tempfile.TemporaryDirectory(prefix="hermes-memory-", dir=workdir) as tmp:
        ops = {op: run_child(op, path, Path(tmp)) for op in OPERATIONS}
    floor = ops["floor"]["peak_rss_mb"]
    for op in OPERATIONS[1:]:
        ops[op]["over_floor_mb"] = round(ops[op]["peak_rss_mb"] - floor, 1)
        ops[op]["ratio_to_floor"] = round(ops[op]["peak_rss_mb"] / floor, 2)
    return {"db_bytes": sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists()),
            "limit_mb": LIMIT_MB, "operations": ops}


def table(result: dict) -> str:
    """Render one measurement as a Markdown table."""
    ops = result["operations"]
    lines = [f"database {result['db_bytes'] / 1e6:,.0f} MB, {ops['iter_export']['sessions']:,} sessions, "
             f"{ops['iter_export']['messages']:,} messages",
             "",
             "| operation | peak RSS MB | over the floor MB | peak ÷ floor | seconds |",
             "|---|---|---|---|---|"]
    for op in OPERATIONS:
        r = ops[op]
        over = f"{r['over_floor_mb']:.1f}" if "over_floor_mb" in r else "-"
        ratio = f"{r['ratio_to_floor']:.2f}" if "ratio_to_floor" in r else "-"
        lines.append(f"| {op} | {r['peak_rss_mb']:.1f} | {over} | {ratio} | {r['seconds']:.1f} |")
    samples = ops["iter_export"]["rss_samples_mb"]
    if samples:
        lines.append("\niter_export resident MB as it goes (sessions done: MB): "
                     + ", ".join(f"{n:,}: {mb:.0f}" for n, mb in samples))
    worst = max(ops[op]["peak_rss_mb"] for op in OPERATIONS)
    lines.append(f"\nworst peak {worst:.1f} MB: {'within' if worst < LIMIT_MB else 'OVER'} the {LIMIT_MB} MB limit")
    return "\n".join(lines)


def build(path: Path, n: int, seed: int) -> None:
    """Append N corpus messages through `SessionDB.append_message`, then fold the WAL into the file."""
    import corpus  # noqa: PLC0415
    from hermes_state import SessionDB  # noqa: PLC0415
    t0 = time.perf_counter()
    count = 0
    with SessionDB(path) as db:
        for sid, source, msgs in corpus.sessions(n_messages=n, seed=seed):
            db.create_session(sid, source)
            for m in msgs:
                db.append_message(sid, **m)
            count += len(msgs)
            if count % 50_000 < len(msgs):
                print(f"  {count:,} messages, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"built {path} ({os.path.getsize(path) / 1e6:,.0f} MB) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, help="measure this existing database (never written)")
    parser.add_argument("-n", type=int, default=50_000, help="without --db: messages to build (default 50,000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="without --db: keep the built database at this path")
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="hermes-memory-") as tmp:
        os.environ["HERMES_HOME"] = tmp
        path = args.db
        if path is None:
            path = Path(tmp) / "state.db"
            build(path, args.n, args.seed)
        elif not path.is_file():
            parser.error(f"{path} does not exist")
        result = {"benchmark": "memory", "db": str(path) if args.db else f"built: {args.n} messages, seed {args.seed}",
                  **measure(path.resolve())}
        if args.keep and args.db is None:
            shutil.move(path, args.keep)
    from run import machine  # noqa: PLC0415
    result.update(machine=machine(), started_utc=started.isoformat(timespec="seconds"))
    print(table(result))
    print(f"\nsaved to {record.save_run(result).relative_to(BENCH.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        print(json.dumps(child(*sys.argv[2:5])), flush=True)
        sys.exit(0)
    sys.exit(main())
