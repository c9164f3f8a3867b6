"""Child processes and checks shared by the reliability tests (tests/test_reliability_*.py) and the long runs here.

Each worker is a top-level function, so `multiprocessing` with the spawn start method can run
it; the writers a parent kills run as scripts (`python reliability/stress_workers.py <role> ...`)
and print one line per acknowledged write, so the parent knows exactly what was acknowledged.
`check_file` is the one health check every scenario ends with: SQLite's integrity_check, every
full-text index's own integrity-check, and each session's counters equal to its live rows.
"""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import hermes_state_fts as fts  # noqa: E402
from hermes_state import HermesStateError, SessionDB, classify_persistence_error  # noqa: E402

WORDS = ("deploy", "kernel", "invoice", "東京都", "検索", "garden", "latency", "retry", "볼륨", "backup")


def marker(writer: int, i: int) -> str:
    """Return the unique, searchable token carried by writer `writer`'s `i`-th message."""
    return f"w{writer}m{i:07d}"


def check_file(path: str | os.PathLike) -> dict:
    """Check a database file from a fresh connection; return {integrity, fts, counters_off} (all empty when healthy)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        fts_errors = []
        for table in fts.FTS_TABLES:
            try:
                conn.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
            except sqlite3.Error as exc:
                fts_errors.append(f"{table}: {exc}")
        counters_off = conn.execute(
            "SELECT s.id, s.message_count, (SELECT COUNT(*) FROM messages m "
            "WHERE m.session_id = s.id AND m.active = 1) AS live FROM sessions s WHERE s.message_count != live").fetchall()
    finally:
        conn.close()
    return {"integrity": [] if integrity == ["ok"] else integrity, "fts": fts_errors, "counters_off": counters_off}


# --- soak: writers and readers on one file -----------------------------------------------------

def soak_writer(path: str, writer: int, duration_s: float, start, results) -> None:
    """Append for `duration_s`, a new session every 40 messages; report acknowledged rows, worst latency, errors."""
    acked: list[tuple[int, str, str]] = []
    errors: list[str] = []
    worst_s = 0.0
    rng = random.Random(writer)
    with SessionDB(path) as db:
        start.wait()
        stop = time.monotonic() + duration_s
        i = 0
        sid = None
        while time.monotonic() < stop:
            if i % 40 == 0:
                sid = f"soak-{writer}-{i // 40}"
                db.create_session(sid, "soak")
            content = f"{marker(writer, i)} {rng.choice(WORDS)} " + "x" * rng.randint(0, 2000)
            t0 = time.perf_counter()
            try:
                row_id = db.append_message(sid, rng.choice(("user", "assistant")), content)
            except HermesStateError as exc:  # any error reaching the caller is a finding
                errors.append(f"{type(exc).__name__}: {exc} ({classify_persistence_error(exc)})")
                continue
            worst_s = max(worst_s, time.perf_counter() - t0)
            acked.append((row_id, sid, content))
            i += 1
    results.put({"writer": writer, "acked": acked, "worst_s": worst_s, "errors": errors})


def soak_reader(path: str, reader: int, duration_s: float, start, results) -> None:
    """Search, list and read transcripts for `duration_s`; report how many reads ran and any error."""
    errors: list[str] = []
    reads = 0
    rng = random.Random(1000 + reader)
    with SessionDB(path) as db:
        start.wait()
        stop = time.monotonic() + duration_s
        while time.monotonic() < stop:
            try:
                db.search_messages(rng.choice(WORDS), limit=10)
                listed = db.list_sessions(source="soak", limit=5)
                if listed:
                    db.get_messages(listed[0]["id"])
                reads += 1
            except HermesStateError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    results.put({"reader": reader, "reads": reads, "errors": errors})


def run_soak(path: str, writers: int, readers: int, duration_s: float) -> dict:
    """Run the soak on `path` (created here); return per-writer results, reader results and the file check."""
    import multiprocessing  # noqa: PLC0415
    SessionDB(path).close()
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=soak_writer, args=(path, k, duration_s, start, results)) for k in range(writers)]
    procs += [ctx.Process(target=soak_reader, args=(path, k, duration_s, start, results)) for k in range(readers)]
    for p in procs:
        p.start()
    time.sleep(0.2)
    start.set()
    reports = [results.get(timeout=duration_s + 120) for _ in procs]  # drain before join: queues hold data
    for p in procs:
        p.join(30)
    return {"exitcodes": [p.exitcode for p in procs],
            "writers": sorted((r for r in reports if "writer" in r), key=lambda r: r["writer"]),
            "readers": [r for r in reports if "reader" in r]}


def missing_acknowledged(path: str, acked: list[tuple[int, str, str]]) -> list[int]:
    """Return the row ids of acknowledged messages not stored verbatim in `path` (active or archived)."""
    conn = sqlite3.connect(path)
    try:
        stored = dict(((r[0], (r[1], r[2])) for r in conn.execute("SELECT id, session_id, content FROM messages")))
    finally:
        conn.close()
    return [row_id for row_id, sid, content in acked if stored.get(row_id) != (sid, content)]


# --- crash: a writer printing one line per acknowledged append -----------------------------------

def crash_writer(path: str, run: int) -> None:
    """Append forever, compressing every 25 messages; print `<row id> <marker>` after each acknowledged append."""
    with SessionDB(path) as db:
        sid = f"crash-{run}"
        db.create_session(sid, "cli")
        i = 0
        while True:
            content = f"{marker(run, i)} " + "y" * (i * 37 % 3000)
            row_id = db.append_message(sid, "user", content)
            print(row_id, marker(run, i), flush=True)
            i += 1
            if i % 25 == 0:  # a multi-statement transaction for the kill to land in
                kept = [{"role": "user", "content": f"summary of the first {i} messages"}]
                db.compress_in_place(sid, kept)


def steady_writer(path: str, duration_s: float) -> None:
    """Append for `duration_s` to three sessions, compressing each every 30 messages; print `<row id> <marker>` per ack."""
    rng = random.Random(7)
    with SessionDB(path) as db:
        sids = [f"steady-{k}" for k in range(3)]
        for sid in sids:
            db.ensure_session(sid, "cli")
        stop = time.monotonic() + duration_s
        i = 0
        while time.monotonic() < stop:
            sid = sids[i % 3]
            row_id = db.append_message(sid, rng.choice(("user", "assistant")),
                                       f"{marker(9, i)} {rng.choice(WORDS)} " + "r" * rng.randint(0, 1500))
            print(row_id, marker(9, i), flush=True)
            i += 1
            if i % 30 == 0:
                db.compress_in_place(sid, [{"role": "user", "content": f"summary after {i} messages"}])


# --- disk full: a writer under RLIMIT_FSIZE ----------------------------------------------------------

def disk_full_writer(path: str, headroom_bytes: int) -> None:
    """Append until the file-size limit stops a write; then lift the limit and append once more. Print JSON."""
    report: dict = {"acked": []}
    with SessionDB(path) as db:
        db.create_session("full", "cli")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write(2) instead of dying
        used = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (used + headroom_bytes, hard))
        i = 0
        while True:
            content = f"{marker(0, i)} " + "z" * 30_000
            try:
                row_id = db.append_message("full", "user", content)
            except Exception as exc:  # noqa: BLE001  (the test judges whatever arrives)
                report.update(error_type=type(exc).__name__, typed=isinstance(exc, HermesStateError),
                              classified=classify_persistence_error(exc), failed_marker=marker(0, i),
                              in_transaction=db.in_transaction, message=str(exc))
                break
            report["acked"].append([row_id, marker(0, i)])
            i += 1
            if i > 1000:
                report["error_type"] = None  # the limit never bit
                break
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space returns
        report["after_row_id"] = db.append_message("full", "user", "written once space returned")
        report["after_found"] = len(db.search_messages("returned"))
    print(json.dumps(report), flush=True)


# --- damaged files: open and read copies, report anything but a typed error ------------------------

def build_sample(path: str) -> None:
    """Write a small real database: sessions with prose, CJK, tool calls, a title and a compression."""
    with SessionDB(path) as db:
        for k in range(6):
            sid = f"sample-{k}"
            db.create_session(sid, "cli" if k % 2 else "telegram", model="m")
            db.set_session_title(sid, f"title {k}")
            for i in range(40):
                db.append_message(sid, "user", f"{marker(k, i)} {WORDS[i % len(WORDS)]} " + "text " * (i * 7 % 90))
                db.append_message(sid, "assistant", None, tool_calls=[{"id": f"c{i}", "type": "function",
                                  "function": {"name": "terminal", "arguments": "{}"}}])
                db.append_message(sid, "tool", "ok " * 50, tool_call_id=f"c{i}", tool_name="terminal")
            if k == 0:
                db.compress_in_place(sid, [{"role": "user", "content": "summary"}])


def damage(src: bytes, rng: random.Random) -> bytes:
    """Return `src` with random damage: overwritten byte runs, a truncation, or both."""
    data = bytearray(src)
    kind = rng.choice(("overwrite", "overwrite", "truncate", "both", "header"))
    if kind in ("overwrite", "both"):
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(data))
            run = rng.randint(1, 64)
            data[at:at + run] = rng.randbytes(min(run, len(data) - at))
    if kind == "header":
        at = rng.randrange(100)
        data[at:at + 4] = rng.randbytes(4)
    if kind in ("truncate", "both"):
        del data[rng.randrange(len(data)):]
    return bytes(data)


def probe_damaged(path: str) -> str:
    """Open `path` writable, then read-only, and read everything; return "ok", a typed error's name, or "RAW: ..."."""
    import traceback  # noqa: PLC0415
    outcome = "ok"
    for read_only in (False, True):
        try:
            with SessionDB(path, read_only=read_only) as db:
                for s in db.list_sessions(limit=100, include_archived=True):
                    db.get_session(s["id"])
                    db.get_messages(s["id"], include_inactive=True)
                    db.get_messages_as_conversation(s["id"])
                for word in WORDS[:4] + ("w1m0000003", "tex"):
                    db.search_messages(word)
                db.fts_rebuild_status()
        except HermesStateError as exc:
            outcome = type(exc).__name__
        except Exception:  # noqa: BLE001  (anything else is the finding)
            return "RAW: " + traceback.format_exc()
    return outcome


def salvage(path: str, target: str) -> tuple[str, int]:
    """Run `recover` on a damaged file; return (outcome, messages salvaged). The target must pass the health check."""
    import traceback  # noqa: PLC0415
    from hermes_state import recover  # noqa: PLC0415
    try:
        recover(path, target)
    except HermesStateError as exc:
        return type(exc).__name__, 0
    except Exception:  # noqa: BLE001
        return "RAW: " + traceback.format_exc(), 0
    check = check_file(target)
    if check != {"integrity": [], "fts": [], "counters_off": []}:
        return f"RAW: the recovered file is unhealthy: {check}", 0
    with SessionDB(target, read_only=True) as db:
        sessions = db.list_sessions(limit=1000, include_archived=True)
        return "salvaged", sum(len(db.get_messages(s["id"], include_inactive=True)) for s in sessions)


def probe_many(sample: str, copies: int, seed: int, workdir: str) -> dict:
    """Damage `copies` copies of `sample`, probe and salvage each; return counts per outcome and the findings.

    `raw` lists raw (untyped) errors and unhealthy salvaged files; `short` lists copies that the
    library read in full but whose salvage kept fewer messages than the sample holds; `slowest`
    names the copy whose probe and the copy whose recover took longest. Each copy's number goes
    to stderr before it starts, so a parent that times out knows which copy was running.
    """
    src = Path(sample).read_bytes()
    conn = sqlite3.connect(sample)
    total = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    conn.close()
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    salvaged: dict[str, int] = {"files": 0, "messages": 0, "of": 0}
    raw: list[str] = []
    short: list[str] = []
    slowest = {"probe": [None, 0.0], "recover": [None, 0.0]}  # [copy, seconds]
    for n in range(copies):
        copy = Path(workdir) / f"damaged-{n}.db"
        target = Path(workdir) / f"salvaged-{n}.db"
        copy.write_bytes(damage(src, rng))
        print(f"copy {n}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        result = probe_damaged(str(copy))
        t1 = time.perf_counter()
        rescue, messages = salvage(str(copy), str(target))
        for step, seconds in (("probe", t1 - t0), ("recover", time.perf_counter() - t1)):
            if seconds > slowest[step][1]:
                slowest[step] = [n, round(seconds, 3)]
        if rescue == "salvaged":
            salvaged["files"] += 1
            salvaged["messages"] += messages
            salvaged["of"] += total
            if result == "ok" and messages != total:
                short.append(f"copy {n}: read in full, but salvage kept {messages} of {total} messages")
        elif rescue.startswith("RAW"):
            raw.append(f"copy {n} (recover): {rescue}")
        if result.startswith("RAW"):
            raw.append(f"copy {n}: {result}")
            result = "RAW"
        outcomes[result] = outcomes.get(result, 0) + 1
        for p in (copy, target):
            for q in (p, Path(f"{p}-wal"), Path(f"{p}-shm")):
                q.unlink(missing_ok=True)
    return {"outcomes": outcomes, "salvaged": salvaged, "raw": raw, "short": short, "slowest": slowest}


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "crash":
        crash_writer(args[0], int(args[1]))
    elif role == "steady":
        steady_writer(args[0], float(args[1]))
    elif role == "disk-full":
        disk_full_writer(args[0], int(args[1]))
    elif role == "damaged":
        print(json.dumps(probe_many(args[0], int(args[1]), int(args[2]), args[3])), flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")
