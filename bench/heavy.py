"""Side by side with hermes-agent on a store shaped like a heavy user's: one command, one table.

    python bench/heavy.py --scale 0.125 --agent-python /path/to/hermes-agent/venv/bin/python
    python bench/heavy.py --scale 1      # the full profile (bench/heavy_corpus.py): about 155,000 messages
    python bench/heavy.py --scale 1 --small-prompts --only prune   # the same store, cron prompts of a few KB

Builds (once per scale and seed, kept in --dir) hermes-agent's file from bench/heavy_corpus.py:
hermes-agent creates its schema through its own SessionDB, then every session and message goes
in by plain SQL INSERTs on that file, so hermes-agent's own triggers index them (its API would
take hours at this size; the rows are the same). hermes-state's file is made as a user moving
in makes it: a copy of hermes-agent's file, opened by `SessionDB` (the constructor and the
background index build are timed). Then both files are opened by bench/heavy_driver.py, each in
its own venv, and every operation runs on both in turns: one untimed call, then --repeats timed
calls; the table gives the p50 (and p95 for searches) by CPU time and by the wall clock, and
recall on the planted needles. The run is saved to bench/results/<date>-heavy.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import heavy_corpus as hc  # noqa: E402

DEFAULT_AGENT = Path(os.environ.get("HERMES_AGENT_PYTHON") or ROOT / "bench" / ".venvs" / "hermes-agent" / "bin" / "python")
# The goals: every operation at or ahead of hermes-agent (a search within INSTANT_MS of it), and these.
INSTANT_MS = 5.0      # a quoted phrase: no slower than max(hermes-agent, this)
COMMON_P95_MS = 50.0  # the common word's p95, at either size, in bm25 order
GIANT_RATIO = 0.6     # the whole giant conversation, against hermes-agent's time
LAST_PAGE_MS = 15.0   # the last 100 messages of the giant session


def load() -> str:
    """The 1, 5 and 15 minute load averages, as text."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def build_agent_file(path: Path, profile: hc.Profile, agent_python: Path) -> dict:
    """Write hermes-agent's file: its schema from its own SessionDB, the rows by plain SQL (its triggers index them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for f in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        f.unlink(missing_ok=True)
    driver(agent_python, "hermes-agent", path, {}).close()
    unplanted = {"common word", *hc.common_phrases(profile)}  # in most rows, or not planted: no recall
    truth: dict[str, list[int]] = {k: [] for k in hc.queries(profile) if k not in unplanted}
    terms = {k: (q.strip('"').lower()) for k, q in hc.queries(profile).items() if k in truth}
    sources: dict[int, str] = {}
    text_bytes = prompt_bytes = n_messages = n_sessions = 0
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    pending = 0
    for s in hc.sessions(profile):
        calls = sum(len(m.get("tool_calls") or ()) for m in s.messages)
        conn.execute("INSERT INTO sessions (id, source, model, system_prompt, started_at, ended_at, end_reason, "
                     "message_count, tool_call_count) VALUES (?, ?, 'gpt-test', ?, ?, ?, ?, ?, ?)",
                     (s.id, s.source, s.system_prompt, s.started_at, s.ended_at,
                      None if s.ended_at is None else "completed", len(s.messages), calls))
        n_sessions += 1
        for m in s.messages:
            tool_calls = json.dumps(m["tool_calls"]) if m.get("tool_calls") else None
            cur = conn.execute("INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, tool_name, "
                               "timestamp) VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (s.id, m["role"], m.get("content"), m.get("tool_call_id"), tool_calls,
                                m.get("tool_name"), m["timestamp"]))
            text = "\n".join(x for x in (m.get("content"), tool_calls, m.get("tool_name")) if x).lower()
            rowid = int(cur.lastrowid or 0)
            for kind, term in terms.items():
                if term in text:
                    truth[kind].append(rowid)
                    sources[rowid] = s.source
            n_messages += 1
            pending += 1
            if pending >= 2000:
                conn.execute("COMMIT")
                conn.execute("BEGIN")
                pending = 0
        text_b, prompt_b = hc.raw_text_bytes(s)
        text_bytes += text_b
        prompt_bytes += prompt_b
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {"messages": n_messages, "sessions": n_sessions, "text_bytes": text_bytes, "prompt_bytes": prompt_bytes,
            "build_s": time.perf_counter() - t0, "bytes": file_bytes(path),
            "truth": truth, "truth_filtered": {k: [i for i in v if sources[i] == hc.NEEDLE_SOURCE]
                                               for k, v in truth.items()}}


def file_bytes(path: Path) -> int:
    """The database file and its WAL, in bytes."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))


MOVE_IN = r"""
import json, os, sys, time, threading
from pathlib import Path
path = Path(sys.argv[1])
from hermes_state import SessionDB
first = []
t0 = time.perf_counter()
db = SessionDB(path)
opened = time.perf_counter() - t0
st = db.fts_rebuild_status()
t1 = time.perf_counter()
listed = len(db.list_sessions_rich(limit=50))  # a read while the file is moved in
list_s = time.perf_counter() - t1
while db.upgrading and not db.wait_for_fts_rebuild(0.25):
    pass
upgraded = time.perf_counter() - t0  # the copy and the upgrade are done: writes go through
t1 = time.perf_counter()
hits = db.search_messages(sys.argv[2], limit=20)  # a search while the indexes are rebuilt
during = {"rebuilding": db.fts_rebuild_status()["in_progress"], "hits": len(hits), "complete": hits.complete,
          "s": time.perf_counter() - t1}
while db.fts_rebuild_status()["in_progress"] and not db.wait_for_fts_rebuild(0.25):
    pass
done = time.perf_counter() - t0  # every message indexed: searches are complete
db.wait_for_fts_rebuild()
settled = time.perf_counter() - t0  # the background work ended (segments merged, old pages freed)
after = db.fts_rebuild_status()
db.close()
print(json.dumps({"open_s": opened, "status_at_open": st, "first_listing_s": list_s, "listed": listed,
                  "upgraded_s": upgraded, "search_while_rebuilding": during, "indexed_s": done,
                  "settled_s": settled, "status": after}))
"""


def move_in(agent_file: Path, ours: Path) -> dict:
    """Copy hermes-agent's file and open it with hermes-state, as a user moving in does; time each part."""
    ours.parent.mkdir(parents=True, exist_ok=True)
    for p in ours.parent.iterdir():
        if p.is_file():
            p.unlink()
    t0 = time.perf_counter()
    shutil.copyfile(agent_file, ours)
    copy_s = time.perf_counter() - t0
    env = dict(os.environ, PYTHONPATH=str(ROOT), HERMES_HOME=str(ours.parent))
    out = subprocess.run([sys.executable, "-c", MOVE_IN, str(ours), hc.RARE], env=env, check=True,
                         capture_output=True, text=True, cwd=ours.parent)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(copy_s=copy_s, bytes=file_bytes(ours))
    return result


class Driver:
    """A running bench/heavy_driver.py: send a command, get its JSON answer."""

    def __init__(self, python: Path, system: str, path: Path, queries: dict):
        env = dict(os.environ, HERMES_HOME=str(path.parent), HEAVY_QUERIES=json.dumps(queries),
                   PYTHONPATH=str(ROOT) if system == "hermes-state" else "")
        self.system = system
        self.proc = subprocess.Popen([str(python), str(BENCH / "heavy_driver.py"), system, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=path.parent)
        self.ready = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"{self.system}'s driver ended (see its stderr above)")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.read()

    def close(self) -> None:
        self.ask(op="close")
        self.proc.wait()


def driver(python: Path, system: str, path: Path, queries: dict) -> Driver:
    """Start a driver for `system` on `path`."""
    return Driver(python, system, path, queries)


def p(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def recall(found: list[int], truth: list[int]) -> float | None:
    """Share of the planted rows found (None when nothing was planted)."""
    return None if not truth else len(set(found) & set(truth)) / len(truth)


def memory_test(agent_file: Path, ours: Path, base: Path, handles: int, queries: dict, agent_python: Path) -> dict:
    """Open `handles` copies of each system's file in one process, search each; return the resident sizes."""
    out = {}
    for python, system, source in ((agent_python, "hermes-agent", agent_file),
                                   (Path(sys.executable), "hermes-state", ours)):
        root = base / "memory" / system
        for k in range(handles):
            target = root / f"profile{k:02d}" / "state.db"
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
        env = dict(os.environ, PYTHONPATH=str(ROOT) if system == "hermes-state" else "")
        picked = [q for k, q in queries.items() if k in ("common word", "rare word", "phrase", "2-char CJK",
                                                          "substring in tool output")]
        done = subprocess.run([str(python), str(BENCH / "heavy_memory.py"), system, str(root), json.dumps(picked)],
                              env=env, check=True, capture_output=True, text=True, cwd=root)
        out[system] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def run(args: argparse.Namespace) -> dict:
    profile = hc.Profile(scale=args.scale, seed=args.seed, small_prompts=args.small_prompts)
    base = Path(args.dir) / f"scale{args.scale:g}-seed{args.seed}{'-small-prompts' if args.small_prompts else ''}"
    agent_file, ours = base / "agent" / "state.db", base / "ours" / "state.db"
    meta_path = base / "build.json"
    if args.rebuild or not meta_path.exists():
        print(f"building hermes-agent's file at scale {args.scale:g} ... (load {load()})", file=sys.stderr)
        meta = build_agent_file(agent_file, profile, args.agent_python)
        meta_path.write_text(json.dumps(meta))
        meta.pop("move_in", None)
    meta = json.loads(meta_path.read_text())
    if args.rebuild or args.move_in or "move_in" not in meta:
        print(f"moving in (copy + open) ... (load {load()})", file=sys.stderr)
        meta["move_in"] = move_in(agent_file, ours)
        meta_path.write_text(json.dumps(meta))
    queries = hc.queries(profile)
    systems = [driver(args.agent_python, "hermes-agent", agent_file, queries),
               driver(Path(sys.executable), "hermes-state", ours, queries)]
    names = [n for n in systems[0].ready["ops"] if n in systems[1].ready["ops"]]
    if args.only:
        names = [n for n in names if any(o in n for o in args.only)]
    results: dict = {s.system: {} for s in systems}
    load_before = load()
    for name in names:
        for s in (systems if hash(name) % 2 else systems[::-1]):
            results[s.system][name] = s.ask(op="time", name=name, repeats=args.repeats)
    load_after = load()
    rec: dict = {s.system: {} for s in systems}
    for kind in queries:
        if kind not in meta["truth"]:  # the common word and the phrases of common words: nothing planted
            continue
        for filtered in (False, True):
            truth = meta["truth_filtered" if filtered else "truth"][kind]
            for s in systems:
                ids = s.ask(op="hits", kind=kind, filtered=filtered)["ids"]
                rec[s.system][f"search: {kind}" + (" + source" if filtered else "")] = recall(ids, truth)
    for s in systems:
        s.close()
    peaks = {}
    if not args.only or any("giant" in o for o in args.only):
        for python, system, path in ((args.agent_python, "hermes-agent", agent_file),
                                     (Path(sys.executable), "hermes-state", ours)):
            d = driver(python, system, path, queries)
            peaks[system] = d.ask(op="peak", name="giant: whole conversation")
            d.close()
    memory = memory_test(agent_file, ours, base, args.memory, queries, args.agent_python) if args.memory else {}
    return {"profile": vars(profile) | {"scale": args.scale}, "memory": memory, "meta": {k: v for k, v in meta.items()
                                                                        if not k.startswith("truth")},
            "results": results, "recall": rec, "peaks": peaks, "load": [load_before, load_after],
            "repeats": args.repeats}


def goal_met(name: str, agent_ms: float, ours_ms: float, ours_p95_ms: float) -> bool:
    """Whether an operation meets its goal, from the wall p50 of both programs (and hermes-state's p95)."""
    if "phrase" in name:
        return ours_ms <= max(agent_ms, INSTANT_MS)
    if name.startswith("search: common word"):
        return ours_p95_ms <= COMMON_P95_MS
    if "substring" in name:
        return True  # hermes-agent finds none of these: recall decides
    if name == "giant: whole conversation":
        return ours_ms <= GIANT_RATIO * agent_ms
    if name == "giant: last 100 messages":
        return ours_ms <= LAST_PAGE_MS
    return ours_ms <= max(agent_ms, agent_ms + INSTANT_MS if name.startswith("search") else agent_ms)


def report(run_: dict) -> str:
    m = run_["meta"]
    lines = [f"store: {m['sessions']:,} sessions, {m['messages']:,} messages, message text "
             f"{m['text_bytes'] / 1e6:,.0f} MB, cron prompts {m['prompt_bytes'] / 1e6:,.0f} MB; "
             f"hermes-agent's file {m['bytes'] / 1e6:,.0f} MB (built in {m['build_s']:.0f} s)"]
    mi = m.get("move_in", {})
    if mi:
        lines.append(f"moving in: copy {mi['copy_s']:.1f} s, constructor blocks {mi['open_s']:.2f} s, "
                     f"a listing of 50 right after it {mi.get('first_listing_s', 0.0):.2f} s, "
                     f"copied and upgraded (writes wait until then) {mi.get('upgraded_s', mi['open_s']):.1f} s, "
                     + (f"a rare word searched then {w['s'] * 1000:.0f} ms, {w['hits']} hits, complete {w['complete']} "
                        f"(rebuild under way: {w['rebuilding']}), "
                        if (w := mi.get('search_while_rebuilding')) else "")
                     + "indexes done "
                     f"{mi['indexed_s']:.1f} s after the open began, background work ended at "
                     f"{mi.get('settled_s', mi['indexed_s']):.1f} s; file after {mi['bytes'] / 1e6:,.0f} MB "
                     f"({mi['bytes'] / (m['text_bytes'] + m['prompt_bytes']):.2f}x all text, "
                     f"{mi['bytes'] / m['text_bytes']:.2f}x the message text)")
    lines.append(f"load average before / after the timed part: {run_['load'][0]}  ->  {run_['load'][1]}; "
                 f"p50 of {run_['repeats']} repeats")
    lines.append("")
    lines.append("| operation | hermes-agent CPU / wall p50 ms | hermes-state CPU / wall p50 ms | hermes-state p95 wall "
                 "| ratio (wall p50) | result (agent / state) | recall (agent / state) | goal |")
    lines.append("|---|---|---|---|---|---|---|---|")
    ra, rs = run_["results"]["hermes-agent"], run_["results"]["hermes-state"]
    for name in rs:
        a, s = ra[name], rs[name]
        aw, sw = statistics.median(a["wall"]), statistics.median(s["wall"])
        ac, sc = statistics.median(a["cpu"]), statistics.median(s["cpu"])
        p95 = p(s["wall"], 0.95)
        ra_, rs_ = run_["recall"]["hermes-agent"].get(name), run_["recall"]["hermes-state"].get(name)
        rec = "" if rs_ is None else f"{'-' if ra_ is None else f'{ra_:.2f}'} / {rs_:.2f}"
        ok = goal_met(name, aw, sw, p95) and (rs_ is None or rs_ == 1.0)
        lines.append(f"| {name} | {ac:.2f} / {aw:.2f} | {sc:.2f} / {sw:.2f} | {p95:.2f} | {sw / aw:.2f} | "
                     f"{a['result']} / {s['result']} | {rec} | {'met' if ok else '**missed**'} |")
    for system, pk in run_.get("peaks", {}).items():
        lines.append(f"\n{system}: giant conversation peak RSS {pk['after'] / 1024:.1f} MB "
                     f"(+{(pk['after'] - pk['before']) / 1024:.1f} MB over the open handle), {pk['s'] * 1000:.0f} ms")
    for system, mem in run_.get("memory", {}).items():
        lines.append(f"\n{system}: {mem['handles']} handles, each having searched and listed: RSS "
                     f"{mem['after']['VmRSS'] / 1024:.1f} MB (peak {mem['after']['VmHWM'] / 1024:.1f} MB; "
                     f"{mem['before']['VmRSS'] / 1024:.1f} MB before the first open)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.125, help="1 is the full profile (default 1/8)")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--dir", default="/tmp/heavy-bench", help="where the files are built and kept")
    ap.add_argument("--agent-python", type=Path, default=DEFAULT_AGENT)
    ap.add_argument("--small-prompts", action="store_true",
                    help="cron prompts of 2-5.3 KB instead of 177-275 KB (a store of its own, beside the other)")
    ap.add_argument("--rebuild", action="store_true", help="build both files again")
    ap.add_argument("--move-in", action="store_true", help="copy and open hermes-agent's file again")
    ap.add_argument("--only", action="append", help="time only operations whose name holds this (repeatable)")
    ap.add_argument("--memory", type=int, default=0, metavar="N",
                    help="also open N copies of each file in one process and report its resident size")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the tables of a saved run file again and exit")
    args = ap.parse_args()
    if args.report:
        for saved in json.loads(args.report.read_text()):
            print(f"{saved['machine']['when']} scale {saved['profile']['scale']:g} ({saved['machine']['commit']})")
            print(report(saved) + "\n")
        return
    r = run(args)
    text = report(r)
    print(text)
    if not args.no_save:
        out = BENCH / "results" / f"{datetime.date.today().isoformat()}-heavy.json"
        runs = json.loads(out.read_text()) if out.exists() else []
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        runs.append(r | {"machine": {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                                     "cpus": os.cpu_count(), "commit": commit,
                                     "when": datetime.datetime.now(datetime.timezone.utc).isoformat()},
                         "table": text})
        out.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
