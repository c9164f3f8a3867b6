"""Start-up time, side by side with sqlite-utils: `import hermes_state` and `hermes-state sessions list`.

    python bench/startup.py [--python PY] [--other-python PY] [--runs 10]
    python bench/startup.py --installs [--runs 10]

`--python` runs hermes-state (default: this interpreter), `--other-python` sqlite-utils (default:
the same one). One interpreter holding both (a venv with `pip install . sqlite-utils`, not an
editable install, whose import hook adds its own start-up cost) compares the packages alone.

Each round runs every command once, in alternating order, so a busy machine slows both sides
alike; the figures are medians over the rounds (bytecode cached: one warm-up round first). The
floor is a bare `python -c pass` of each interpreter, measured in the same rounds. The store is a
fresh 2,000-message file (100 sessions of 20 messages) in a temporary HERMES_HOME, which
`sqlite-utils rows state.db sessions --limit 20` reads too. The two commands run as a user types
them: the `hermes-state` and `sqlite-utils` scripts installed beside each interpreter (else
`python -m`), from that scratch directory, so no checkout on the way is imported instead.
`--installs` compares the README's editable install (`pip install -e .`) with a regular one
(`pip install .`), each made fresh in its own venv from this checkout: the same three commands,
goal at most 1.1x the regular install.
Goals: each ratio at most 0.75. It also prints the machine's load average, which the figures
depend on, and where each interpreter imports the two packages from (an editable install or a
checkout on the way shows up there).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _store(home: Path) -> Path:
    from hermes_state import SessionDB
    path = home / "state.db"
    with SessionDB(path) as db:
        for s in range(100):
            db.create_session(f"bench_{s:03d}", "cli", "openai/gpt-5", title=f"Session {s}")
            for m in range(20):
                db.append_message(f"bench_{s:03d}", "user" if m % 2 else "assistant", f"message {m} about docker")
    return path


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    # From the scratch directory: `python -c`/`-m` put the working directory first on sys.path, and
    # a checkout there would be imported instead of the installed package being measured.
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed: {done.stderr.decode(errors='replace')}")
    return elapsed


def _program(python: str, script: str, module: str) -> list[str]:
    """Return the command as a user types it: the installed script beside `python`, else `python -m module`."""
    installed = Path(python).parent / script
    return [str(installed)] if installed.is_file() else [python, "-m", module]


def _origin(python: str, package: str, env: dict[str, str], cwd: Path) -> str:
    """Return the file `python` imports `package` from, run as the timed commands run."""
    done = subprocess.run([python, "-c", f"import {package}; print({package}.__file__)"], env=env, cwd=cwd,
                          capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def _venv(where: Path, *spec: str) -> str:
    """Make a venv at `where` with `pip install <spec>`; return its Python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = str(where / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *spec], check=True, cwd=where)
    return python


def compare_installs(runs: int) -> None:
    """Time the three start-up commands in an editable and in a regular install of this checkout."""
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        pythons = {"editable": _venv(home / "editable", "-e", str(ROOT)), "regular": _venv(home / "regular", str(ROOT))}
        db = _store(home)
        env = {**os.environ, "HERMES_HOME": str(home), "COLUMNS": "100"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python writes bytecode; a run without it compiles every time
        env.pop("PYTHONPATH", None)
        commands = {f"{what} ({way})": argv for way, python in pythons.items() for what, argv in (
            ("python -c pass", [python, "-c", "pass"]),
            ("import hermes_state", [python, "-c", "import hermes_state"]),
            ("hermes-state sessions list", [*_program(python, "hermes-state", "hermes_state_cli"), "sessions", "list"]))}
        for argv in commands.values():
            _time(argv, env, home)
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for round_ in range(runs):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                times[name].append(_time(commands[name], env, home))
        print(f"store: {db}")
    median = {name: statistics.median(t) for name, t in times.items()}
    if hasattr(os, "getloadavg"):
        print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for name, value in median.items():
        print(f"{name:<40} {value:7.1f} ms  (min {min(times[name]):.1f})")
    for what in ("python -c pass", "import hermes_state", "hermes-state sessions list"):
        ratio = median[f"{what} (editable)"] / median[f"{what} (regular)"]
        print(f"{what}: editable / regular {ratio:.2f}  (goal <= 1.1: {'met' if ratio <= 1.1 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="a Python where hermes-state is installed")
    parser.add_argument("--other-python", help="a Python where sqlite-utils is installed (default: --python)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--installs", action="store_true", help="compare an editable with a regular install instead")
    args = parser.parse_args()
    if args.installs:
        compare_installs(args.runs)
        return
    ours = args.python
    other = Path(args.other_python or args.python)
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        db = _store(home)
        env = {**os.environ, "HERMES_HOME": str(home), "COLUMNS": "100"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands = {
            "python (ours)": [ours, "-c", "pass"],
            "python (other)": [str(other), "-c", "pass"],
            "import hermes_state": [ours, "-c", "import hermes_state"],
            "import sqlite_utils": [str(other), "-c", "import sqlite_utils"],
            "hermes-state sessions list": [*_program(ours, "hermes-state", "hermes_state_cli"), "sessions", "list"],
            "sqlite-utils rows --limit 20": [*_program(str(other), "sqlite-utils", "sqlite_utils"), "rows", str(db),
                                             "sessions", "--limit", "20"],
        }
        for argv in commands.values():  # warm-up: bytecode written, files in the page cache
            _time(argv, env, home)
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for round_ in range(args.runs):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                times[name].append(_time(commands[name], env, home))
        where = {package: _origin(python, package, env, home) for python, package in
                 ((ours, "hermes_state"), (str(other), "sqlite_utils"))}
    median = {name: statistics.median(t) for name, t in times.items()}
    for package, origin in where.items():
        print(f"{package} imported from {origin}")
    if hasattr(os, "getloadavg"):
        print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    for name, value in median.items():
        print(f"{name:<30} {value:7.1f} ms  (min {min(times[name]):.1f})")
    print()
    for ours_name, theirs in (("import hermes_state", "import sqlite_utils"),
                              ("hermes-state sessions list", "sqlite-utils rows --limit 20")):
        ratio = median[ours_name] / median[theirs]
        above = (median[ours_name] - median["python (ours)"]) / (median[theirs] - median["python (other)"])
        fastest = min(times[ours_name]) / min(times[theirs])
        print(f"{ours_name} / {theirs}: {ratio:.2f}  (goal <= 0.75: {'met' if ratio <= 0.75 else 'NOT met'}); "
              f"above each interpreter's floor: {above:.2f}; fastest runs: {fastest:.2f}")


if __name__ == "__main__":
    main()
