"""Open cost of an existing database (< 50 ms for 1 GB; independent of rows).

    python bench/open.py PATH [--runs 7]

PATH is an existing, current hermes-state database (for example the one `bench/search.py --db`
builds). Opens it writable and read-only `--runs` times each and prints the median and the worst
time of the constructor. A current file is detected from the catalogue alone, so the figure should
not grow with the file.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hermes_state import SessionDB  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    size_mb = os.path.getsize(args.path) / 1e6
    for read_only in (False, True):
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            db = SessionDB(args.path, read_only=read_only)
            times.append((time.perf_counter() - t0) * 1000)
            db.close()
        kind = "read-only" if read_only else "writable"
        print(f"{kind:<9} open of {size_mb:,.0f} MB: median {statistics.median(times):.1f} ms, "
              f"worst {max(times):.1f} ms")


if __name__ == "__main__":
    main()
