"""The `hermes-state` command line.

Owns: argument parsing, human tables and `--json` output, exit codes (0 ok, 1 failure,
2 usage), one-line errors without a traceback. Every command goes through `SessionDB`;
this module holds no SQL and opens no transaction itself.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from hermes_state_errors import HermesStateError
from hermes_state_home import _apply_profile_override, display_hermes_home, hermes_home_override


def _open(args: argparse.Namespace, read_only: bool = False):
    from hermes_state import SessionDB  # imported after the profile override is applied
    return SessionDB(args.db, read_only=read_only) if args.db else SessionDB(read_only=read_only)


def _fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "") if r.get(c) is not None else "") for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=str) if args.json else human(data))


# --- demo ------------------------------------------------------------------------------------

def _fill_demo(db) -> None:
    db.create_session("demo_docker", "cli", "anthropic/claude-sonnet-4.6", user_id="basic:alice")
    db.create_session("demo_tokyo", "telegram", "openai/gpt-5", user_id="tg:1001")
    db.create_session("demo_cron", "cron", "openai/gpt-5-mini")


def cmd_demo(args: argparse.Namespace) -> int:
    """Fill a throw-away HERMES_HOME with sample sessions and show what the library holds."""
    from hermes_state import SessionDB
    with tempfile.TemporaryDirectory(prefix="hermes-demo-") as home, hermes_home_override(home):
        with SessionDB() as db:
            _fill_demo(db)
            rows = [db.get_session(sid) for sid in ("demo_docker", "demo_tokyo", "demo_cron")]
            print(f"demo database: {display_hermes_home(Path(home) / 'state.db')} "
                  f"(schema v{db.schema_version})\n")
            print(_table([dict(r, started=_fmt_time(r["started_at"])) for r in rows],
                         ["id", "source", "model", "user_id", "started"]))
    return 0


# --- entry point -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of every command."""
    parser = argparse.ArgumentParser(prog="hermes-state", description="Inspect and maintain a hermes-state database.")
    parser.add_argument("--db", help="database file (default: <HERMES_HOME>/state.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="fill a throw-away home with samples and show them").set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _apply_profile_override(argv)
    except (HermesStateError, ValueError) as exc:
        print(f"hermes-state: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (HermesStateError, ValueError, KeyError, OSError) as exc:
        print(f"hermes-state: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
