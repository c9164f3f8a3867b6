"""Run the side-by-side benchmark: hermes-state, its raw-SQL floor and two peer stores, one table.

    python bench/run.py [-n 5000] [--queries 60] [--seed 1] [--no-peers]

Every system gets the same corpus (bench/corpus.py) and the same queries, in one run:

- hermes-state: `SessionDB.append_message`, one call per message; `search_messages` (limit 20).
- the floor: the same rows written with plain SQL on the same schema and triggers, one
  transaction per message (bench/append.py), each row indexed by the triggers as it is written;
  and the batched floor: the same durability through the statements the library runs (each
  row queued, every 128th indexing the batch), by hand. Each search is the bare FTS5 MATCH of the
  index that serves it, fetching the newest 20 matching rows: no ranking, snippets or context.
- hermes-agent (PyPI) and openai-agents' `SQLiteSession` (PyPI), each in its own virtual
  environment under bench/.venvs (created on first use; their pinned dependencies clash),
  driven through their public API by bench/peer_driver.py. SQLiteSession has no search.

The systems take turns session by session (hermes-state, floor, each peer), so machine noise
hits all alike; only appends and searches are timed. Figures are reported as ratios to the
floor measured in the same run: append time / floor time, search p50 / floor p50, and database
size / raw text bytes. Then bench/memory.py measures the peak memory of `iter_export` and
`recover` on the file hermes-state built, against a child that only opens it (add
`--memory-db PATH` to measure a large existing file as well: minutes per GB). The run is
printed as tables and saved to bench/results/<date>.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import append  # noqa: E402
import corpus  # noqa: E402
import hermes_state_cjk as cjk  # noqa: E402
import hermes_state_fts as fts  # noqa: E402
from hermes_state_query import trigram_expression  # noqa: E402
import memory  # noqa: E402
import record  # noqa: E402
import search  # noqa: E402
from hermes_state import SessionDB  # noqa: E402

PEERS = {"hermes-agent": "hermes-agent==0.19.0", "openai-agents": "openai-agents==0.24.0"}
KINDS = ("common word", "rare + common word", "2-char CJK", "substring of a word")


def peer_python(name: str, spec: str) -> Path:
    """Return the interpreter of the peer's own venv, creating the venv and installing `spec` when needed."""
    venv = BENCH / ".venvs" / name
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    stamp = venv / "installed.txt"
    if not (stamp.exists() and stamp.read_text() == spec):
        print(f"creating {venv} with {spec} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", spec], check=True)
        stamp.write_text(spec)
    return python


class Peer:
    """A running peer_driver.py: send a command, get its JSON answer."""

    def __init__(self, name: str, python: Path, path: Path, n: int, seed: int, log):
        env = dict(os.environ, HERMES_HOME=str(path.parent), PYTHONPATH="")
        self.name = name
        self.proc = subprocess.Popen([str(python), str(BENCH / "peer_driver.py"), name, str(path), str(n), str(seed)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                                     cwd=path.parent)

    def ask(self, **command) -> dict:
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            raise RuntimeError(f"the {self.name} driver died")
        return json.loads(line)

    def close(self) -> int:
        size = self.ask(op="close")["bytes"]
        self.proc.wait(30)
        return size


def percentiles(times_ms: list[float]) -> dict:
    times = sorted(times_ms)
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    return {"p50_ms": round(statistics.median(times), 3), "p95_ms": round(p95, 3)}


def floor_match(kind: str, query: str) -> tuple[str, str]:
    """Return (index, MATCH expression): the bare FTS5 lookup that serves `query` of this kind."""
    if kind == "2-char CJK":
        return fts.CJK, '"' + cjk.cjk_query_text(query)[0] + '"'
    if kind.startswith("substring"):  # the trigram index has no positions: every trigram, unverified
        return fts.TRIGRAM, trigram_expression((query,))
    return fts.WORD, " ".join(f'"{w}"' for w in query.split())


def time_floor(path: Path, kinds: dict[str, list[str]]) -> dict[str, tuple[list[float], int]]:
    """Time each query as its bare MATCH plus the 20 rows it names; return (times, queries without hits) per kind."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out = {}
    for kind, qs in kinds.items():
        plans = [floor_match(kind, q) for q in qs]
        sql = ("SELECT id, session_id, role, content FROM messages WHERE id IN "
               "(SELECT rowid FROM {0} WHERE {0} MATCH ? ORDER BY rowid DESC LIMIT 20)")
        for index, expr in plans:
            conn.execute(sql.format(index), (expr,)).fetchall()
        times, empty = [], 0
        for index, expr in plans:
            t0 = time.perf_counter()
            empty += not conn.execute(sql.format(index), (expr,)).fetchall()
            times.append((time.perf_counter() - t0) * 1000)
        out[kind] = (times, empty)
    conn.close()
    return out


def time_library(path: Path, kinds: dict[str, list[str]]) -> dict[str, tuple[list[float], int]]:
    """Time `search_messages` per query, warm; return (times, queries without hits) per kind."""
    out = {}
    with SessionDB(path, read_only=True) as db:
        for kind, qs in kinds.items():
            for q in qs:
                db.search_messages(q)
            times, empty = [], 0
            for q in qs:
                t0 = time.perf_counter()
                empty += not db.search_messages(q)
                times.append((time.perf_counter() - t0) * 1000)
            out[kind] = (times, empty)
    return out


def file_bytes(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))


def run(n: int, seed: int, n_queries: int, with_peers: bool, agent_python: Path | None = None) -> dict:
    sessions = list(corpus.sessions(n_messages=n, seed=seed))
    raw_text = sum(corpus.raw_text_bytes(m) for _, _, msgs in sessions for m in msgs)
    kinds = {k: [q for q, _ in v] for k, v in search.queries(corpus, seed, n_queries).items() if k in KINDS}
    if missing := [k for k in KINDS if k not in kinds]:  # a kind renamed in search.py must not vanish quietly
        raise SystemExit(f"bench/search.py no longer generates the query kinds {missing}")
    pythons = {name: peer_python(name, spec) for name, spec in PEERS.items()} if with_peers else {}
    if agent_python is not None:  # hermes-agent from an existing venv, and no other peer
        pythons = {"hermes-agent": agent_python}
    with tempfile.TemporaryDirectory(prefix="hermes-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.environ["HERMES_HOME"] = tmp_dir
        log_path = Path(tempfile.gettempdir()) / f"hermes-bench-peers-{os.getpid()}.log"
        log = log_path.open("w")  # outside the temporary directory: it must survive a failed run
        peers = []
        for name, python in pythons.items():
            (tmp / name).mkdir()
            peers.append(Peer(name, python, tmp / name / "state.db", n, seed, log))
        lib = SessionDB(tmp / "library.db")
        for sid, source, _ in sessions:
            lib.create_session(sid, source)
        raw = append.raw_copy(tmp, "raw.db", sessions)
        batched = append.raw_copy(tmp, "raw_batched.db", sessions)
        for p in peers:
            p.ask(op="setup")
        seconds = {"hermes-state": 0.0, "raw SQL floor": 0.0, "batched SQL floor": 0.0, **{p.name: 0.0 for p in peers}}
        failed: dict[str, str] = {}
        for k, (sid, _, msgs) in enumerate(sessions):
            t0 = time.perf_counter()
            for m in msgs:
                lib.append_message(sid, **m)
            t1 = time.perf_counter()
            last_uids: dict = {}
            for m in msgs:
                append.raw_append(raw, sid, m, last_uids)
            t2 = time.perf_counter()
            last_uids = {}
            for m in msgs:
                append.raw_append_batched(batched, sid, m, last_uids)
            seconds["hermes-state"] += t1 - t0
            seconds["raw SQL floor"] += t2 - t1
            seconds["batched SQL floor"] += time.perf_counter() - t2
            for p in list(peers):
                try:
                    seconds[p.name] += p.ask(op="append", session=k)["s"]
                except RuntimeError as exc:  # report the others; the peer's row says what happened
                    print(f"{exc} at session {k} of {len(sessions)}; its stderr is in {log_path}", file=sys.stderr)
                    peers.remove(p)
                    failed[p.name] = f"died at session {k} of {len(sessions)}"
                    del seconds[p.name]
        raw.close()
        batched.execute("BEGIN IMMEDIATE")
        append.fts.index_batch(batched)  # what the library does when it closes (untimed, as its close)
        batched.execute("COMMIT")
        batched.close()
        lib.close()
        searches = {"hermes-state": time_library(tmp / "library.db", kinds),
                    "raw SQL floor": time_floor(tmp / "library.db", kinds)}
        sizes = {"hermes-state": file_bytes(tmp / "library.db"), "raw SQL floor": file_bytes(tmp / "raw.db"),
                 "batched SQL floor": file_bytes(tmp / "raw_batched.db")}
        memory_result = memory.measure(tmp / "library.db")
        for p in peers:
            flat = [q for qs in kinds.values() for q in qs]
            answer = p.ask(op="search", queries=flat)
            if answer["ms"] is not None:
                ms, hits = iter(answer["ms"]), iter(answer["hits"])
                searches[p.name] = {kind: ([next(ms) for _ in qs], sum(not next(hits) for _ in qs))
                                    for kind, qs in kinds.items()}
            sizes[p.name] = p.close()
        log.close()
    floor_s, floor_search = seconds["raw SQL floor"], searches["raw SQL floor"]
    floor_all = statistics.median([t for ts, _ in floor_search.values() for t in ts])
    systems = {}
    for name, s in seconds.items():
        row: dict = {"append_per_s": round(n / s, 1), "append_ratio_to_floor": round(s / floor_s, 3),
                     "db_bytes": sizes[name], "db_to_raw_text": round(sizes[name] / raw_text, 3)}
        if name in searches:
            all_ms = [t for ts, _ in searches[name].values() for t in ts]
            per_kind = {kind: dict(percentiles(ts), no_hits=empty) for kind, (ts, empty) in searches[name].items()}
            row["search"] = {"all": percentiles(all_ms), **per_kind}
            row["search_p50_ratio_to_floor"] = round(statistics.median(all_ms) / floor_all, 2)
        else:
            row["search"] = None
        systems[name] = row
    return {"n_messages": n, "seed": seed, "queries_per_kind": {k: len(v) for k, v in kinds.items()},
            "raw_text_bytes": raw_text, "systems": systems,
            "peers": {name: PEERS[name] for name in pythons},
            "failed_peers": failed, "memory": [memory_result]}


def machine() -> dict:
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version}


def table(result: dict) -> str:
    lines = [f"{result['n_messages']:,} messages, {sum(result['queries_per_kind'].values())} queries "
             f"({', '.join(result['queries_per_kind'])}); raw text {result['raw_text_bytes'] / 1e6:.1f} MB",
             "",
             "| system | append msg/s | append time ÷ floor | search p50 / p95 ms | search p50 ÷ floor "
             "| DB ÷ raw text |",
             "|---|---|---|---|---|---|"]
    for name, r in result["systems"].items():
        s = r["search"]
        search_cell = f"{s['all']['p50_ms']:.2f} / {s['all']['p95_ms']:.2f}" if s else "no search"
        ratio_cell = f"{r['search_p50_ratio_to_floor']:.2f}" if s else "-"
        lines.append(f"| {name} | {r['append_per_s']:,.0f} | {r['append_ratio_to_floor']:.2f} | {search_cell} | "
                     f"{ratio_cell} | {r['db_to_raw_text']:.2f} |")
    searched = [n for n, r in result["systems"].items() if r["search"]]
    lines += ["", "| search p50 / p95 ms by kind (queries without hits) | " + " | ".join(searched)
              + " | hermes-state target |", "|---|" + "---|" * (len(searched) + 1)]
    ours_search = result["systems"]["hermes-state"]["search"]
    for kind in result["queries_per_kind"]:
        cells = [f"{r['search'][kind]['p50_ms']:.2f} / {r['search'][kind]['p95_ms']:.2f} "
                 f"({r['search'][kind]['no_hits']} empty)" for r in result["systems"].values() if r["search"]]
        check = search.target_check(result["n_messages"], ours_search[kind]["p50_ms"], ours_search[kind]["p95_ms"])
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {check} |")
    for peer, why in result.get("failed_peers", {}).items():
        lines.append(f"\n{peer}: no figures, its driver {why}")
    ours, systems = result["systems"]["hermes-state"], result["systems"]
    if "batched SQL floor" in systems:
        lines.append(f"\nhermes-state append time / batched SQL floor's: "
                     f"{ours['append_ratio_to_floor'] / systems['batched SQL floor']['append_ratio_to_floor']:.2f}")
    for peer in (p for p in PEERS if p in systems):
        lines.append(f"\nhermes-state appends {ours['append_per_s'] / systems[peer]['append_per_s']:.2f}x as fast as {peer}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000, help="messages each system appends (default 5000)")
    parser.add_argument("--queries", type=int, default=60, help="corpus queries, split over three kinds (default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true",
                        help="hermes-state and its floor only (no venvs, no network)")
    parser.add_argument("--agent-python", type=Path, help="a Python with hermes-agent 0.19.0 installed: the only "
                        "peer then (no venvs are created)")
    parser.add_argument("--memory-db", type=Path, help="also measure export/recover memory on this existing "
                        "database (read only; minutes per GB)")
    args = parser.parse_args(argv)
    if args.memory_db and not args.memory_db.is_file():
        parser.error(f"{args.memory_db} does not exist")
    started = datetime.datetime.now(datetime.timezone.utc)
    result = run(args.n, args.seed, args.queries, not args.no_peers and args.agent_python is None, args.agent_python)
    if args.memory_db:
        result["memory"].append({"db": str(args.memory_db), **memory.measure(args.memory_db.resolve())})
    result.update(machine=machine(), started_utc=started.isoformat(timespec="seconds"))
    print(table(result))
    for measured in result["memory"]:
        print("\nmemory: " + memory.table(measured))
    print(f"\nsaved to {record.save_run(result).relative_to(BENCH.parent)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
