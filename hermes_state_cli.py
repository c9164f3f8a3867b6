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
import unicodedata
from pathlib import Path
from typing import Any, Callable

from hermes_state_errors import HermesStateError
from hermes_state_home import _apply_profile_override, display_hermes_home, hermes_home_override


def _open(args: argparse.Namespace, read_only: bool = False):
    from hermes_state import SessionDB  # imported after the profile override is applied
    return SessionDB(args.db, read_only=read_only) if args.db else SessionDB(read_only=read_only)


def _fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _width(text: str) -> int:
    # CJK characters take two terminal columns; padding by len() would skew the table.
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c)) if r.get(c) is not None else "" for c in columns] for r in rows]
    widths = [max([_width(c)] + [_width(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(_pad(c, w) for c, w in zip(columns, widths))]
    lines += ["  ".join(_pad(v, w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str]) -> None:
    print(json.dumps(data, ensure_ascii=False, indent=2, default=str) if args.json else human(data))


# --- demo ------------------------------------------------------------------------------------

def _fill_demo(db) -> None:
    db.create_session("demo_docker", "cli", "anthropic/claude-sonnet-4.6", user_id="basic:alice")
    db.set_session_title("demo_docker", "Fix Docker Build")
    db.append_message("demo_docker", "user", "The docker build fails at `pip install` in src/main.py's image")
    db.append_message("demo_docker", "assistant", "Let me look at the Dockerfile.",
                      tool_calls=[{"id": "call_1", "type": "function",
                                   "function": {"name": "read_file", "arguments": '{"path": "Dockerfile"}'}}])
    db.append_message("demo_docker", "tool", "FROM python:3.11-slim\nRUN pip install -r requirements.txt",
                      tool_call_id="call_1", tool_name="read_file")
    db.append_message("demo_docker", "assistant", "The base image lacks gcc; add build-essential before pip install.",
                      reasoning="The wheel needs compiling, so a compiler is missing.")
    kept = db.get_messages_as_conversation("demo_docker")[-2:]
    db.rotate_session("demo_docker", "demo_docker_2", kept, title=db.get_next_title_in_lineage("Fix Docker Build"))
    db.append_message("demo_docker_2", "user", "That worked, thanks! Now the image is 1.2 GB, can we shrink it?")
    db.create_session("demo_tokyo", "telegram", "openai/gpt-5", user_id="tg:1001")
    db.set_session_title("demo_tokyo", "東京旅行の計画")
    db.append_message("demo_tokyo", "user", "来週東京に行きます。おすすめの観光地は？")
    db.append_message("demo_tokyo", "assistant", "浅草寺と上野公園がおすすめです。東京タワーも人気があります。")
    db.create_session("demo_cron", "cron", "openai/gpt-5-mini")
    db.append_message("demo_cron", "user", "Summarise today's error logs (50% disk alert on alice@example.com's host)")


def cmd_demo(args: argparse.Namespace) -> int:
    """Fill a throw-away HERMES_HOME with sample sessions and show what the library holds."""
    from hermes_state import SessionDB
    with tempfile.TemporaryDirectory(prefix="hermes-demo-") as home, hermes_home_override(home):
        with SessionDB() as db:
            _fill_demo(db)
            print(f"demo database: {display_hermes_home(Path(home) / 'state.db')} (schema v{db.schema_version})\n")
            print("== sessions, newest first")
            print(_sessions_table(db.list_sessions()))
            print("\n== lineage of", repr(db.resolve_session_by_title("Fix Docker Build")))
            for row in db.get_lineage("demo_docker_2"):
                print(f"  {row['id']:<15} {row['title']!r:<24} ended: {row['end_reason'] or '-'}")
            print("\n== conversation of demo_docker_2, with its compression ancestors")
            for message in db.get_messages_as_conversation("demo_docker_2", include_ancestors=True):
                text = (message.get("content") or "").replace("\n", " ")
                calls = " +tool_calls" if message.get("tool_calls") else ""
                print(f"  {message['role']:<9} {text[:70]}{calls}")
            for query in ("docker image", "東京", "alice@example.com", "50%"):
                print(f"\n== search {query!r}")
                for hit in db.search_messages(query, limit=3):
                    print(f"  {hit['session_id']:<15} {hit['role']:<9} {hit['snippet']}")
    return 0


def _sessions_table(rows: list[dict[str, Any]]) -> str:
    return _table([dict(r, started=_fmt_time(r["started_at"]), msgs=r["message_count"]) for r in rows],
                  ["id", "source", "title", "msgs", "started", "preview"])


# --- sessions commands ---------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace) -> int:
    """List sessions, newest first."""
    with _open(args, read_only=True) as db:
        rows = db.list_sessions(source=args.source, limit=args.limit, include_archived=args.archived)
    _emit(args, rows, _sessions_table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """Show one session and its conversation."""
    with _open(args, read_only=True) as db:
        session = db.get_session(args.session_id)
        if session is None:
            raise KeyError(f"session {args.session_id!r} not found")
        data = {"session": session, "messages": db.get_messages_as_conversation(args.session_id)}

    def human(d: dict[str, Any]) -> str:
        s = d["session"]
        lines = [f"{s['id']}  source={s['source']}  model={s['model']}  title={s['title']!r}",
                 f"started {_fmt_time(s['started_at'])}  ended {_fmt_time(s['ended_at'])} ({s['end_reason'] or '-'})"]
        lines += [f"  {m['role']:<9} {(m.get('content') or '')[:100]}" for m in d["messages"]]
        return "\n".join(lines)
    _emit(args, data, human)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """Search every message's text."""
    with _open(args, read_only=True) as db:
        hits = db.search_messages(args.query, source_filter=args.source, limit=args.limit)
    _emit(args, hits, lambda rows: _table(rows, ["session_id", "role", "snippet"]) if rows else "no match")
    return 0


def cmd_rename(args: argparse.Namespace) -> int:
    """Set a session's title."""
    with _open(args) as db:
        title = db.set_session_title(args.session_id, args.title)
    _emit(args, {"id": args.session_id, "title": title}, lambda d: f"{d['id']}: {d['title']!r}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """Show token usage per model and the largest sessions."""
    with _open(args, read_only=True) as db:
        data = {"by_model": db.usage_by_model(), "top_sessions": db.top_sessions_by_tokens()}
    _emit(args, data, lambda d: _table(d["by_model"], ["model", "session_count", "input_tokens", "output_tokens",
                                                       "estimated_cost_usd"]) + "\n\n" +
          _table(d["top_sessions"], ["id", "title", "model", "total_tokens"]))
    return 0


def cmd_fts(args: argparse.Namespace) -> int:
    """Show or run the full-text index rebuild."""
    with _open(args, read_only=args.action == "status") as db:
        data = db.rebuild_fts() if args.action == "rebuild" else db.fts_rebuild_status()
    _emit(args, data, lambda d: "  ".join(f"{k}={v}" for k, v in d.items()))
    return 0


# --- entry point -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of every command."""
    parser = argparse.ArgumentParser(prog="hermes-state", description="Inspect and maintain a hermes-state database.")
    parser.add_argument("--db", help="database file (default: <HERMES_HOME>/state.db)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="fill a throw-away home with samples and show them").set_defaults(func=cmd_demo)
    sessions = sub.add_parser("sessions", help="list, show, search, rename sessions; usage stats")
    ssub = sessions.add_subparsers(dest="action", required=True)
    p = ssub.add_parser("list", help="sessions, newest first")
    p.add_argument("--source")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--archived", action="store_true", help="include archived sessions")
    p.set_defaults(func=cmd_list)
    p = ssub.add_parser("show", help="one session and its conversation")
    p.add_argument("session_id")
    p.set_defaults(func=cmd_show)
    p = ssub.add_parser("search", help="full-text search")
    p.add_argument("query")
    p.add_argument("--source", action="append")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=cmd_search)
    p = ssub.add_parser("rename", help="set a session's title")
    p.add_argument("session_id")
    p.add_argument("title")
    p.set_defaults(func=cmd_rename)
    ssub.add_parser("stats", help="usage per model, largest sessions").set_defaults(func=cmd_stats)
    p = sub.add_parser("fts", help="full-text index status or rebuild")
    p.add_argument("action", choices=["status", "rebuild"])
    p.set_defaults(func=cmd_fts)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    full = ["hermes-state", *(sys.argv[1:] if argv is None else argv)]
    try:
        _apply_profile_override(full)  # before anything resolves the home
    except (HermesStateError, ValueError) as exc:
        print(f"hermes-state: {exc}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(full[1:])
    try:
        return args.func(args)
    except (HermesStateError, ValueError, KeyError, OSError) as exc:
        print(f"hermes-state: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
