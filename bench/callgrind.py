"""Instructions per appended message, counted by valgrind's callgrind: a figure machine load cannot move.

    python bench/callgrind.py [-n 768] [--base 256] [--systems hermes-state,floor,hermes-agent]

Each system appends the corpus's first `--base` messages in one child process and its first `-n`
messages in another, both under `valgrind --tool=callgrind`; the difference of the two totals over
`n - base` is what one append costs, with interpreter start-up, imports, generating the corpus, opening the
store and creating the sessions subtracted (both children do them alike for the whole corpus). The defaults
are multiples of the library's batch (256 rows), so the window holds whole batches. Systems:

- hermes-state: `SessionDB.append_message`, one call per message.
- floor: the same rows through plain SQL on the same schema and triggers, one BEGIN IMMEDIATE
  transaction per message (bench/append.py's `raw_append`): every message committed on its own
  and findable by search when the call returns, each indexed by the triggers as it is written.
- batched floor: the same durability through the library's own statements written by hand
  (`raw_append_batched`): each row queued for a batch that every 256th row (the library's BATCH_ROWS) indexes.
- hermes-agent: its `hermes_state.SessionDB.append_message`, in the venv of bench/run.py (or
  `--agent-python`), through bench/peer_driver.py, which imports nothing of hermes-state.

With HERMES_BENCH_PREPARED set to a store file (no sessions in it), the hermes-state children append
into a copy of it instead of a new store: one hermes-agent has opened, say, so its triggers fire too.

`--lever NAME=VALUE` (repeatable) measures a setting other than the library's own, in every
system of this repository (hermes-agent keeps its own): `batch` (rows per batch), `merge_every` and
`merge_pages` (the writer's bounded merge: every so many writes, so many pages), `cache_kib` (each
connection's page cache), `checkpoint_in_background` (0: the checkpoint inside the write), and the FTS5
options stored in each index's config, `automerge`, `crisismerge`, `usermerge`, `pgsz`, which the
library writes into every index of the new file (the floors' files are made by the library too).

PYTHONHASHSEED is fixed, so two runs of the same code give the same counts to within a few
hundred instructions per message (uuid4 values and timestamps still vary).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SYSTEMS = ("hermes-state", "batched floor", "floor", "hermes-agent")
FTS_OPTIONS = ("automerge", "crisismerge", "usermerge", "pgsz")
MODULE_LEVERS = {"batch": ("hermes_state_messages", "BATCH_ROWS"),  # the floor reads hermes_state_messages'
                 "merge_every": ("hermes_state_fts", "MERGE_EVERY_N_WRITES"),
                 "merge_pages": ("hermes_state_fts", "MERGE_PAGES"),
                 "cache_kib": ("hermes_state_schema", "CACHE_SIZE_KIB"),  # each connection's page cache
                 "checkpoint_in_background": ("hermes_state", "SessionDB.checkpoint_in_background")}


def parse_lever(text: str) -> tuple[str, int]:
    """Return (name, value) of one `NAME=VALUE` lever, or raise ValueError."""
    name, _, value = text.partition("=")
    if name not in (*FTS_OPTIONS, *MODULE_LEVERS):
        raise ValueError(f"unknown lever {name!r}; one of {', '.join((*MODULE_LEVERS, *FTS_OPTIONS))}")
    return name, int(value)


def set_levers(levers: dict[str, int]) -> None:
    """Set the library constants the levers name, read at call time: a new file gets the FTS5 options."""
    import importlib  # noqa: PLC0415
    import hermes_state_fts as fts  # noqa: PLC0415
    for name, value in levers.items():
        if name in MODULE_LEVERS:
            module, constant = MODULE_LEVERS[name]
            owner, _, attribute = constant.rpartition(".")  # "Class.attribute" names a class attribute
            target = importlib.import_module(module)
            setattr(getattr(target, owner) if owner else target, attribute, value)
            if name == "batch":
                setattr(importlib.import_module("hermes_state_messages"), constant, value)
    options = dict(fts.FTS_OPTIONS)
    options.update((name, value) for name, value in levers.items() if name in FTS_OPTIONS)
    fts.FTS_OPTIONS = tuple(options.items())


def child(system: str, n: int, of: int, seed: int, directory: Path, levers: dict[str, int]) -> None:
    """Append the first `n` messages of an `of`-message corpus through `system` into a new store in `directory`.

    Both children generate the same corpus and create all its sessions, so only the appends differ.
    """
    sys.path.insert(0, str(BENCH))
    import corpus  # noqa: PLC0415
    sessions = list(corpus.sessions(n_messages=of, seed=seed))
    left = n
    for k, (sid, source, msgs) in enumerate(sessions):
        sessions[k] = (sid, source, msgs[:left])
        left -= len(sessions[k][2])
    os.environ["HERMES_HOME"] = str(directory)
    if system == "hermes-agent":
        import peer_driver  # noqa: PLC0415  (imports only the corpus and the peer's own package)
        store = peer_driver.HermesAgent(str(directory / "state.db"))
        for sid, source, _ in sessions:
            store.create(sid, source)
        for sid, _, msgs in sessions:
            for m in msgs:
                store.append(sid, m)
        store.close()
        return
    sys.path.insert(0, str(BENCH.parent))
    import append  # noqa: PLC0415
    from hermes_state import SessionDB  # noqa: PLC0415
    set_levers(levers)
    if system in ("floor", "batched floor"):
        raw = append.raw_copy(directory, "raw.db", sessions)
        write = append.raw_append if system == "floor" else append.raw_append_batched
        for sid, _, msgs in sessions:
            last_uids: dict = {}
            for m in msgs:
                write(raw, sid, m, last_uids)
        if system == "batched floor":
            raw.execute("BEGIN IMMEDIATE")
            append.fts.index_batch(raw)  # what the library does when it closes
            raw.execute("COMMIT")
        raw.close()
        return
    prepared = os.environ.get("HERMES_BENCH_PREPARED")
    if prepared:  # a store other programs have opened (their triggers in it), copied before the appends
        import shutil  # noqa: PLC0415
        shutil.copyfile(prepared, directory / "library.db")
    lib = SessionDB(directory / "library.db")
    for sid, source, _ in sessions:
        lib.create_session(sid, source)
    for sid, _, msgs in sessions:
        for m in msgs:
            lib.append_message(sid, **m)
    lib.close()


def agent_python(explicit: str | None) -> Path:
    """Return the interpreter that has hermes-agent: the one given, else bench/run.py's peer venv."""
    if explicit:
        return Path(explicit)
    import run  # noqa: PLC0415  (creates the venv on first use, as bench/run.py does)
    return run.peer_python("hermes-agent", run.PEERS["hermes-agent"])


def count(python: Path, system: str, n: int, of: int, seed: int, levers: list[str]) -> int:
    """Return the instructions a child appending `n` messages executes in all (callgrind's total)."""
    with tempfile.TemporaryDirectory(prefix="hermes-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(os.environ, PYTHONHASHSEED="0", HERMES_HOME=tmp)
        if system == "hermes-agent":
            env["PYTHONPATH"] = ""
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", str(python),
                        str(Path(__file__).resolve()), "--child", system, "-n", str(n), "--of", str(of), "--seed", str(seed),
                        "--dir", tmp, *(f"--lever={lever}" for lever in levers)], check=True, env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in callgrind's output for {system}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=768, help="messages of the larger child (default 768)")
    parser.add_argument("--base", type=int, default=256, help="messages of the smaller child (default 256)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ", ".join(SYSTEMS))
    parser.add_argument("--agent-python", help="a Python that has hermes-agent 0.19.0 installed")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME=VALUE",
                        help="measure another setting: " + ", ".join((*MODULE_LEVERS, *FTS_OPTIONS)))
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--of", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        levers = dict(parse_lever(text) for text in args.lever)
    except ValueError as exc:
        parser.error(str(exc))
    if args.child:
        child(args.child, args.n, args.of, args.seed, args.dir, levers)
        return 0
    if args.n <= args.base:
        parser.error("-n must be larger than --base")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := [s for s in systems if s not in SYSTEMS]:
        parser.error(f"unknown systems {unknown}")
    per_message = {}
    for system in systems:
        python = agent_python(args.agent_python) if system == "hermes-agent" else Path(sys.executable)
        small, large = (count(python, system, args.base, args.n, args.seed, args.lever),
                        count(python, system, args.n, args.n, args.seed, args.lever))
        per_message[system] = (large - small) / (args.n - args.base)
    if args.json:
        print(json.dumps({"n": args.n, "base": args.base, "seed": args.seed, "levers": levers,
                          "instructions_per_message": per_message}))
        return 0
    print(f"instructions per appended message (messages {args.base + 1}-{args.n} of the corpus, callgrind)"
          + "".join(f", {name}={value}" for name, value in levers.items()))
    for system, value in per_message.items():
        line = f"{system:14s} {value / 1e6:8.3f} M"
        if system != "hermes-state" and "hermes-state" in per_message:
            line += f"   hermes-state / {system}: {per_message['hermes-state'] / value:.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
