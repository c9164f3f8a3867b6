"""Resident memory of one process holding a handle on each of many profiles, each having searched.

    <python> bench/heavy_memory.py {hermes-state|hermes-agent} PROFILES_DIR QUERIES_JSON

Runs in the system's own venv (bench/heavy.py starts it). PROFILES_DIR holds one directory per
profile, each with a state.db; one SessionDB is opened on each, and each runs every query of
QUERIES_JSON once and lists its newest 20 sessions. Prints one JSON line: the process's resident
size (VmRSS) and peak (VmHWM) in KB before the first open and after the last handle's work, with
every handle still open.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def status() -> dict[str, int]:
    """The process's VmRSS and VmHWM, in KB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1])
    return out


def main() -> None:
    system, root, queries = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    if system == "hermes-agent":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path = [p for p in sys.path if p not in ("", os.getcwd(), here)]
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from hermes_state import SessionDB  # noqa: PLC0415  (the system's own module)

    before = status()
    handles = []
    for profile in sorted(p for p in root.iterdir() if (p / "state.db").exists()):
        os.environ["HERMES_HOME"] = str(profile)
        db = SessionDB(db_path=profile / "state.db")
        for q in queries:
            db.search_messages(q, limit=20)
        db.list_sessions_rich(limit=20)
        handles.append(db)
    after = status()
    print(json.dumps({"handles": len(handles), "before": before, "after": after}), file=replies, flush=True)
    for db in handles:
        db.close()


if __name__ == "__main__":
    main()
