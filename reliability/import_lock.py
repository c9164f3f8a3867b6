"""A large import beside a live transcript writer: how long the import runs, and how long appends wait.

    python reliability/import_lock.py [--sessions 100000] [--messages 1]

Builds an export of N sessions linked into one parent chain (the shape that made validation
quadratic), each with M messages, then imports it in one process while a second process appends
a message every 20 ms to a live session of the same file. Prints how long validation and the
whole import took, and the worst append wait next to the transcript write patience: the worst
wait must stay below it, and every append must succeed. Exit status 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hermes_state import SessionDB  # noqa: E402
import hermes_state_portability as portability  # noqa: E402

# The second process: appends until told to stop (stdin closes), then prints its waits as JSON.
APPENDER = """
import json, sys, threading, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
waits, errors = [], []
print("ready", flush=True)
while not stop.is_set():
    t = time.perf_counter()
    try:
        db.append_message("live", "user", "written during the import")
    except Exception as exc:
        errors.append(repr(exc))
    waits.append(time.perf_counter() - t)
    time.sleep(0.02)
db.close()
print(json.dumps({"waits": waits, "errors": errors}))
"""


def _chain(n: int, messages: int) -> list[dict]:
    return [{"format": portability.EXPORT_FORMAT, "version": portability.EXPORT_VERSION,
             "session": {"id": f"s{i:07d}", "source": "import", "started_at": 1_700_000_000.0 + i,
                         "parent_session_id": f"s{i - 1:07d}" if i else None},
             "messages": [{"role": "user", "content": f"message {k} of session {i}", "timestamp": 1.0 + k}
                          for k in range(messages)],
             "model_usage": []} for i in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-import-") as tmp:
        os.environ["HERMES_HOME"] = tmp
        path = str(Path(tmp) / "state.db")
        db = SessionDB(path)
        db.create_session("live", "cli")
        data = _chain(args.sessions, args.messages)
        t = time.perf_counter()
        portability.validate(data)
        validate_s = time.perf_counter() - t
        appender = subprocess.Popen([sys.executable, "-c", APPENDER, path], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=os.environ)
        assert appender.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        t = time.perf_counter()
        report = db.import_sessions(data)
        import_s = time.perf_counter() - t
        time.sleep(0.2)
        out, _ = appender.communicate("", timeout=120)
        result = json.loads(out.strip().splitlines()[-1])
        patience = SessionDB._TRANSCRIPT_WRITE_PATIENCE_S
        db.close()
    worst = max(result["waits"], default=0.0)
    print(f"sessions {args.sessions:,} x {args.messages} message(s): validation {validate_s:.2f} s, "
          f"import (validation included) {import_s:.2f} s, {len(report.imported):,} imported")
    print(f"concurrent appends: {len(result['waits'])}, errors {len(result['errors'])}, worst wait {worst:.2f} s "
          f"(patience {patience:.0f} s)")
    for error in result["errors"][:3]:
        print("  error:", error)
    return 0 if not result["errors"] and worst < patience else 1


if __name__ == "__main__":
    sys.exit(main())
