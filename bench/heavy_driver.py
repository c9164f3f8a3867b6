"""Time one store's operations on commands from bench/heavy.py, in hermes-state's or hermes-agent's venv.

    <python> bench/heavy_driver.py {hermes-state|hermes-agent} DB_PATH

Imports `hermes_state` from the interpreter's own environment: hermes-state's checkout (the
parent puts it on PYTHONPATH) or hermes-agent's published package. Only public SessionDB
calls, the same names on both. Reads one JSON command per line and answers one JSON line:

    {"op": "time", "name": NAME, "repeats": R}   one untimed call, then R timed -> {"cpu": [ms], "wall": [ms], "result": ...}
    {"op": "hits", "name": NAME}                 the ids a search returns with limit 200 -> {"ids": [...]}
    {"op": "peak", "name": NAME}                 one call; the process's peak RSS before and after -> {"before": KB, "after": KB}
    {"op": "close"}
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

QUERIES = json.loads(os.environ.get("HEAVY_QUERIES", "{}"))
FILTER = os.environ.get("HEAVY_SOURCE", "telegram")
GIANT = "giant_session"


def peak_kb() -> int:
    """Return the process's peak resident size (VmHWM) in KB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def operations(db, giant_len: int) -> dict:
    """Return every timed operation by name, each a call without arguments."""
    ops = {}
    for kind, q in QUERIES.items():
        ops[f"search: {kind}"] = lambda q=q: db.search_messages(q, limit=20)
        ops[f"search: {kind} + source"] = lambda q=q: db.search_messages(q, source_filter=[FILTER], limit=20)
    ops["message_count()"] = db.message_count
    ops["session_count()"] = db.session_count
    ops["newest 50 by start"] = lambda: db.list_sessions_rich(limit=50, compact_rows=True)
    ops["newest 50 by last activity"] = lambda: db.list_sessions_rich(limit=50, compact_rows=True,
                                                                      order_by_last_active=True)
    ops["prune candidates (90 days)"] = lambda: db.list_prune_candidates(older_than_days=90)
    ops["giant: last 100 messages"] = lambda: db.get_messages(GIANT, limit=100, offset=max(0, giant_len - 100))
    ops["giant: whole conversation"] = lambda: db.get_messages_as_conversation(GIANT)
    return ops


def summary(result) -> object:
    """A small, comparable account of a call's result."""
    if isinstance(result, (int, float)):
        return result
    if isinstance(result, list):
        return len(result)
    return None


def main() -> None:
    system, path = sys.argv[1], Path(sys.argv[2]).absolute()
    if system == "hermes-agent":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path = [p for p in sys.path if p not in ("", os.getcwd(), here)]
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the store prints goes to stderr
    from hermes_state import SessionDB  # noqa: PLC0415  (the system's own module)

    t0 = time.perf_counter()
    db = SessionDB(db_path=path)
    opened = time.perf_counter() - t0
    giant_len = db.message_count(session_id=GIANT)
    ops = operations(db, giant_len)
    print(json.dumps({"ready": True, "open_s": opened, "ops": list(ops)}), file=replies, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "time":
            fn = ops[cmd["name"]]
            result = summary(fn())
            cpu, wall = [], []
            for _ in range(cmd["repeats"]):
                c, w = time.process_time(), time.perf_counter()
                fn()
                wall.append((time.perf_counter() - w) * 1000)
                cpu.append((time.process_time() - c) * 1000)
            reply: dict = {"cpu": cpu, "wall": wall, "result": result}
        elif cmd["op"] == "hits":
            q = QUERIES[cmd["kind"]]
            kw = {"source_filter": [FILTER]} if cmd.get("filtered") else {}
            reply = {"ids": [h["id"] for h in db.search_messages(q, limit=200, **kw)]}
        elif cmd["op"] == "peak":
            before = peak_kb()
            t = time.perf_counter()
            result = summary(ops[cmd["name"]]())
            reply = {"before": before, "after": peak_kb(), "s": time.perf_counter() - t, "result": result}
        elif cmd["op"] == "close":
            db.close()
            print(json.dumps({"ok": True}), file=replies, flush=True)
            return
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        print(json.dumps(reply), file=replies, flush=True)


if __name__ == "__main__":
    main()
