"""Import from a file: peak memory at two input sizes, and the rate against appending the same messages.

    python bench/import_stream.py [-n 3000] [--scale 4] [--per-session 60]

For each of two inputs (n corpus messages, then n × scale), in one run:

1. append: the corpus through `SessionDB.append_message` into a fresh file, one call per message,
   timed. That is the rate an import must beat: one transaction per message, each message
   searchable once the call returns.
2. The file is exported to JSON Lines with `iter_export` (untimed): the import's input.
3. stream: a fresh child process runs `hermes-state sessions import FILE` (the command's
   streaming path) into an empty database and reports its time and its peak resident size
   (`VmHWM`, the kernel's high-water mark of the process).
4. list: another child reads the whole file into a list of documents first, then imports the
   list: what holding the input costs (the command read files this way before it streamed).
5. floor: a child that imports the library and opens an empty database, for the memory any
   program pays before it does anything.

Memory is reported over the floor and as the growth from the small input to the large one;
rates as messages per second and as the import's rate ÷ the append rate of the same run, beside
the load average before and after each input (on a shared machine only the ratios compare). The
run is saved to bench/results/<date>-import.json. Timings come from inside each child (the
interpreter's start is not counted).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import corpus  # noqa: E402
import record  # noqa: E402
from memory import vm_kb  # noqa: E402

CHILDREN = ("floor", "stream", "list")


def child(kind: str, export: str, target: str) -> dict:
    """Run one import (or the floor) in this child process; return its time and peak RSS."""
    from hermes_state import SessionDB  # noqa: PLC0415  (the import is part of the floor)
    SessionDB(target).close()  # an empty database to import into, untimed
    t0 = time.perf_counter()
    out: dict = {}
    if kind == "stream":
        from hermes_state_cli import main  # noqa: PLC0415
        with open(os.devnull, "w") as quiet:
            saved, sys.stdout = sys.stdout, quiet  # the report is not what is measured
            try:
                code = main(["--db", target, "sessions", "import", export])
            finally:
                sys.stdout = saved
        if code != 0:
            raise SystemExit(f"the import failed with exit code {code}")
    elif kind == "list":
        with open(export, encoding="utf-8") as lines:
            documents = [json.loads(line) for line in lines if line.strip()]
        with SessionDB(target) as db:
            if not db.import_sessions(documents).ok:
                raise SystemExit("the import reported problems")
    out["seconds"] = round(time.perf_counter() - t0, 3)
    hwm = vm_kb("VmHWM")
    out["peak_rss_mb"] = None if hwm is None else round(hwm / 1024, 1)
    if kind != "floor":
        conn = sqlite3.connect(target)
        out["messages"] = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        conn.close()
    return out


def run_child(kind: str, export: Path, workdir: Path) -> dict:
    """Run `kind` in a fresh interpreter; return its report."""
    target = workdir / f"{kind}.db"
    env = dict(os.environ, HERMES_HOME=str(workdir))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "child", kind, str(export), str(target)],
                          capture_output=True, text=True, env=env, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} child failed: {done.stderr[-800:]}")
    for p in (target, Path(f"{target}-wal"), Path(f"{target}-shm")):
        p.unlink(missing_ok=True)
    return json.loads(done.stdout)


def measure(n: int, per_session: int, seed: int, workdir: Path) -> dict:
    """Append n messages, export them, and import the export three ways; return the figures."""
    from hermes_state import SessionDB  # noqa: PLC0415
    source = workdir / "source.db"
    sessions = messages = 0
    with SessionDB(source) as db:
        started = time.perf_counter()
        for sid, src, msgs in corpus.sessions(n_messages=n, seed=seed, per_session=per_session):
            db.create_session(sid, src)
            for m in msgs:
                db.append_message(sid, **m)
            sessions += 1
            messages += len(msgs)
        append_s = time.perf_counter() - started
        export = workdir / "export.jsonl"
        with open(export, "w", encoding="utf-8") as out:
            for document in db.iter_export():
                out.write(json.dumps(document, ensure_ascii=False) + "\n")
    result = {"messages": messages, "sessions": sessions, "export_mb": round(export.stat().st_size / 1e6, 1),
              "append_msg_s": round(messages / append_s), "load_before": _load()}
    for kind in CHILDREN:
        result[kind] = run_child(kind, export, workdir)
        if kind != "floor":
            assert result[kind]["messages"] == messages, (kind, result[kind]["messages"], messages)
            result[kind]["msg_s"] = round(messages / result[kind]["seconds"])
            result[kind]["rate_vs_append"] = round(result[kind]["msg_s"] / result["append_msg_s"], 2)
    result["load_after"] = _load()
    for p in (source, Path(f"{source}-wal"), Path(f"{source}-shm"), export):
        p.unlink(missing_ok=True)
    return result


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages: the machine may be shared, and this says how busy it was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def table(sizes: list[dict]) -> str:
    """Render the run as a Markdown table."""
    lines = ["| input | export MB | floor MB | stream: peak MB (over floor) | list: peak MB (over floor) | "
             "append msg/s | stream msg/s (÷ append) | list msg/s (÷ append) | load average (1, 5, 15 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sizes:
        floor = r["floor"]["peak_rss_mb"]
        lines.append(
            f"| {r['messages']:,} messages, {r['sessions']:,} sessions | {r['export_mb']} | {floor} | "
            f"{r['stream']['peak_rss_mb']} (+{r['stream']['peak_rss_mb'] - floor:.1f}) | "
            f"{r['list']['peak_rss_mb']} (+{r['list']['peak_rss_mb'] - floor:.1f}) | {r['append_msg_s']:,} | "
            f"{r['stream']['msg_s']:,} ({r['stream']['rate_vs_append']}) | "
            f"{r['list']['msg_s']:,} ({r['list']['rate_vs_append']}) | {r['load_before']} → {r['load_after']} |")
    small, large = sizes[0], sizes[-1]
    for kind in ("stream", "list"):
        grow = (large[kind]["peak_rss_mb"] - large["floor"]["peak_rss_mb"]) - \
            (small[kind]["peak_rss_mb"] - small["floor"]["peak_rss_mb"])
        lines.append(f"\n{kind}: {large['export_mb'] / small['export_mb']:.1f}× the input adds {grow:+.1f} MB "
                     "over the floor")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="messages of the small input")
    parser.add_argument("--scale", type=int, default=4, help="the large input is this many times the small one")
    parser.add_argument("--per-session", type=int, default=60, help="messages per session (1: many small sessions)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat()
    sizes = []
    for n in (args.n, args.n * args.scale):
        with tempfile.TemporaryDirectory(prefix="hermes-import-") as tmp:
            os.environ["HERMES_HOME"] = tmp
            sizes.append(measure(n, args.per_session, args.seed, Path(tmp)))
    print(table(sizes))
    saved = record.save_run({"bench": "import_stream", "started_utc": started, "argv": sys.argv[1:],
                             "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                             "machine": f"{platform.machine()} {os.cpu_count()} cpu, {platform.platform()}",
                             "sizes": sizes}, "import")
    print(f"\nsaved to {saved}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], sys.argv[4])))
        sys.exit(0)
    sys.exit(main())
