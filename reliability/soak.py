"""Long soak: W writer processes appending and R reader processes searching on one file, for W = 1, 2, 4, 8.

    python reliability/soak.py [--seconds 10] [--readers 2] [--writers 1 2 4 8]

For each W it prints appends/s (all writers together), the worst single append_message latency,
errors that reached a caller (must be 0), acknowledged messages missing afterwards (must be 0),
and the file check (integrity_check, every full-text index's integrity-check, counters = rows).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stress_workers as workers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    print(f"{'W':>3} {'R':>3} {'appends':>8} {'appends/s':>10} {'worst ms':>9} {'reads':>7} {'errors':>7} "
          f"{'missing':>8}  file check")
    failed = False
    for w in args.writers:
        with tempfile.TemporaryDirectory(prefix="hermes-soak-") as tmp:
            os.environ["HERMES_HOME"] = tmp
            path = str(Path(tmp) / "state.db")
            run = workers.run_soak(path, w, args.readers, args.seconds)
            acked = [a for r in run["writers"] for a in r["acked"]]
            errors = sum(len(r["errors"]) for r in run["writers"] + run["readers"])
            missing = workers.missing_acknowledged(path, acked)
            check = workers.check_file(path)
            healthy = check == {"integrity": [], "fts": [], "counters_off": []}
            worst = max(r["worst_s"] for r in run["writers"]) * 1000
            reads = sum(r["reads"] for r in run["readers"])
            print(f"{w:>3} {args.readers:>3} {len(acked):>8} {len(acked) / args.seconds:>10.0f} {worst:>9.1f} "
                  f"{reads:>7} {errors:>7} {len(missing):>8}  {'ok' if healthy else check}", flush=True)
            for r in run["writers"] + run["readers"]:
                for e in r["errors"][:3]:
                    print("   ", e)
            failed |= bool(errors or missing or not healthy or any(run["exitcodes"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
