"""Long crash run: a writer SIGKILLed at random points, many times in a row on one file.

    python reliability/crash.py [--kills 200] [--seed 1]

Each round starts a writer (appending, compressing every 25 messages, printing each acknowledged
row id), kills it with SIGKILL after a random number of acknowledgements plus a random delay of
up to 10 ms, and checks the file: every message acknowledged so far (in this and all earlier
rounds) is present verbatim, integrity_check and every full-text index check pass, and each
session's counters equal its live rows. Prints a line every 20 rounds and a summary.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import stress_workers as workers  # noqa: E402
from hermes_state import SessionDB  # noqa: E402


def kill_round(path: Path, run: int, rng: random.Random) -> list[tuple[int, str]]:
    env = dict(os.environ, HERMES_HOME=str(path.parent))
    proc = subprocess.Popen([sys.executable, str(HERE / "stress_workers.py"), "crash", str(path), str(run)],
                            stdout=subprocess.PIPE, env=env, text=True)
    acked = []
    target = rng.randint(1, 120)
    try:
        while len(acked) < target:
            line = proc.stdout.readline()
            if not line:
                break
            row_id, mark = line.split()
            acked.append((int(row_id), mark))
        time.sleep(rng.random() * 0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    return acked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    failures = 0
    acked: list[tuple[int, str]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hermes-crash-") as tmp:
        path = Path(tmp) / "state.db"
        os.environ["HERMES_HOME"] = tmp
        SessionDB(path).close()
        for run in range(args.kills):
            acked += kill_round(path, run, rng)
            check = workers.check_file(path)
            conn = sqlite3.connect(path)
            stored = dict(conn.execute("SELECT id, content FROM messages"))
            conn.close()
            lost = [r for r, mark in acked if not (stored.get(r) or "").startswith(mark + " ")]
            if lost or check != {"integrity": [], "fts": [], "counters_off": []}:
                failures += 1
                print(f"round {run + 1}: lost {len(lost)} acknowledged, check {check}", flush=True)
            if (run + 1) % 20 == 0:
                print(f"{run + 1:4d} kills, {len(acked):6d} acknowledged messages, {failures} failed rounds, "
                      f"{time.monotonic() - t0:.0f} s", flush=True)
        size_mb = path.stat().st_size / 1e6
    print(f"\n{args.kills} SIGKILLs on one file ({size_mb:.1f} MB): {len(acked)} acknowledged messages, "
          f"{failures} rounds with a loss or an unhealthy file")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
