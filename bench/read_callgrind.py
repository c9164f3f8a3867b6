"""Instructions per call of a heavy store's reads, both programs, counted by valgrind's callgrind.

    python bench/read_callgrind.py DIR [--op prune --op giant] [--agent-python PATH]

DIR is a store bench/heavy.py built (`--dir`'s `scale*-seed*` folder: `agent/state.db` and
`ours/state.db`). Each program opens its own file and makes the call once, then in a second
process three times, both under `valgrind --tool=callgrind`; half the difference of the two
totals is one call, with start-up, imports and the open subtracted. The machine's load moves
wall and CPU times several percent from run to run; this count moves by far less.
Ops: `prune` (list_prune_candidates(older_than_days=90)) and `giant` (the giant session's
get_messages_as_conversation).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CHILD = r"""
import os, sys
from pathlib import Path
if sys.argv[1] == "hermes-agent":  # its own package, not this checkout
    sys.path = [p for p in sys.path if p not in ("", os.getcwd())]
from hermes_state import SessionDB
db = SessionDB(db_path=Path(sys.argv[2]))
call = {"prune": lambda: db.list_prune_candidates(older_than_days=90),
        "giant": lambda: db.get_messages_as_conversation("giant_session")}[sys.argv[3]]
for _ in range(int(sys.argv[4])):
    call()
db.close()
"""


def total(python: Path, system: str, path: Path, op: str, calls: int, checkout: Path = ROOT) -> int:
    """Return the instructions a child making `calls` calls ran, start-up included."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, HERMES_HOME=str(path.parent), PYTHONHASHSEED="0",
                   PYTHONPATH=str(checkout) if system == "hermes-state" else "")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(python), "-c", CHILD,
                        system, str(path), op, str(calls)], env=env, check=True, capture_output=True, cwd=tmp)
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no total")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--op", action="append", choices=["prune", "giant"])
    ap.add_argument("--agent-python", type=Path,
                    default=Path(os.environ.get("HERMES_AGENT_PYTHON") or ROOT / "bench/.venvs/hermes-agent/bin/python"))
    ap.add_argument("--checkout", type=Path, default=ROOT,
                    help="the hermes-state checkout whose code is counted (another commit's worktree, to compare)")
    args = ap.parse_args()
    for op in args.op or ["prune", "giant"]:
        per_call = {}
        for system, python, path in (("hermes-agent", args.agent_python, args.dir / "agent" / "state.db"),
                                     ("hermes-state", Path(sys.executable), args.dir / "ours" / "state.db")):
            counts = [total(python, system, path, op, calls, args.checkout) for calls in (3, 1)]
            per_call[system] = (counts[0] - counts[1]) / 2
        a, s = per_call["hermes-agent"], per_call["hermes-state"]
        print(f"{op}: hermes-agent {a / 1e6:,.1f} M instructions a call, hermes-state {s / 1e6:,.1f} M ({s / a:.3f}x)")


if __name__ == "__main__":
    main()
