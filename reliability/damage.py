"""Long damaged-file run: many copies of a real database with random bytes overwritten or cut off.

    python reliability/damage.py [--copies 1000] [--seed 1] [--timeout 600]

Builds a small real database, then opens and reads each damaged copy writable and read-only
(sessions, transcripts, conversations, searches) and salvages it with `recover`, all in a child
process with a timeout. Prints how many copies read fine and how many raised each typed error,
what recover salvaged, and the slowest copy of each step; any raw (untyped) error is printed with
its traceback, and a hang shows as the timeout, naming the copy that was running. Exit status 1
on either.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import stress_workers as workers  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hermes-damage-") as tmp:
        os.environ["HERMES_HOME"] = tmp
        sample = Path(tmp) / "sample.db"
        workers.build_sample(str(sample))
        t0 = time.monotonic()
        try:
            out = subprocess.run([sys.executable, str(HERE / "stress_workers.py"), "damaged", str(sample),
                                  str(args.copies), str(args.seed), tmp],
                                 capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as exc:
            started = (exc.stderr or b"").decode(errors="replace").split()
            running = started[-1] if started else "none"
            print(f"HANG: the probe did not finish {args.copies} copies in {args.timeout:.0f} s; copy {running} "
                  f"(seed {args.seed}) was running")
            return 1
        if out.returncode != 0:
            print(out.stderr[-5000:])
            return 1
        report = json.loads(out.stdout)
        print(f"{args.copies} damaged copies of a {sample.stat().st_size / 1e3:.0f} kB database in "
              f"{time.monotonic() - t0:.0f} s: {report['outcomes']}")
        sv = report["salvaged"]
        print(f"recover salvaged {sv['files']} files, {sv['messages']} of {sv['of']} messages in them; "
              f"{len(report['short'])} copies read in full but lost messages in salvage")
        for step, (copy, seconds) in report["slowest"].items():
            print(f"slowest {step}: {seconds:.3f} s (copy {copy})")
        for line in report["short"][:10]:
            print("  ", line)
        for failure in report["raw"]:
            print(failure)
    return 1 if report["raw"] else 0


if __name__ == "__main__":
    sys.exit(main())
