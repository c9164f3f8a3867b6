"""The command line's browsing and health commands, and how every command opens and prints.

Owns: opening the database the way a command needs (read-only to browse; never creating a
file: only `init` and `demo` create one), printing a result as a human table or as `--json`,
`--nl` (JSON Lines), `--csv` or `--tsv`, progress for long work, and the commands `sessions
list|show|search|rename|stats`, `fts`, `init` and `doctor`.
Does not own: argument parsing and exit codes (hermes_state_cli), rendering (hermes_state_render).
Every command goes through `SessionDB`; no SQL here.
"""
from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import hermes_state_render as render
from hermes_state_errors import HermesStateError
from hermes_state_home import display_hermes_home, get_hermes_home
from hermes_state_lockowners import open_in_this_process

# --- opening and printing -----------------------------------------------------------------------

def db_path(args: argparse.Namespace) -> Path:
    """Return the database file a command works on; HERMES_HOME naming a file (not a directory) is an error."""
    if args.db:
        return Path(args.db).expanduser()
    home = get_hermes_home()
    if home.is_file():
        raise HermesStateError(f"HERMES_HOME is {home}, a file: it names the directory that holds state.db "
                               f"(to open that file, use --db {home})")
    return home / "state.db"


def command_line(args: argparse.Namespace) -> str:
    """Return the command that selects the store the user chose: `hermes-state --db PATH`, `hermes-state -p NAME` or `hermes-state`.

    Advice printed with it runs on the same store when pasted back.
    """
    import shlex
    if getattr(args, "db", None):
        return f"hermes-state --db {shlex.quote(str(args.db))}"
    if getattr(args, "profile", None):
        return f"hermes-state -p {shlex.quote(str(args.profile))}"
    return "hermes-state"


def existing_db(args: argparse.Namespace) -> Path:
    """Return the database path, or raise HermesStateError when there is no database file there."""
    path = db_path(args)
    if path.is_dir():
        raise HermesStateError(f"{path} is a directory, not a database file")
    if not path.exists():
        raise HermesStateError(f"{path} does not exist yet (`{command_line(args)} init` creates it)")
    if path.stat().st_size == 0:
        raise HermesStateError(f"{path} is empty (0 bytes), not a database yet (`{command_line(args)} init` creates one)")
    if _looks_like_export(path):
        raise HermesStateError(f"{path} is an export (JSON), not a database: load it into a store with "
                               f"`hermes-state sessions import {path}`")
    return path


def file_kind(path: Path) -> str | None:
    """Say what a file's first bytes show: "sqlite" (SQLite's header), "export" (JSON text), or None (neither, or unreadable).

    A file this process has open is a database in use and is not read with a plain descriptor;
    anything but a regular file (a pipe from `<(gunzip -c ...)`) is not read at all: what was read
    would be gone for the command that reads it next.
    """
    if not path.is_file():
        return None
    if _looks_like_export(path):
        return "export"
    if open_in_this_process(path):
        return "sqlite"
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    return "sqlite" if head == b"SQLite format 3\0" else None


def _looks_like_export(path: Path) -> bool:
    # A database starts with SQLite's header; an export with JSON (a BOM and blanks may come first).
    # A file this process already has open is a database in use, and is never opened with a plain
    # descriptor (closing it would drop the process's locks on it).
    if open_in_this_process(path):
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    return not head.startswith(b"SQLite format 3\0") and head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[")


def open_db(args: argparse.Namespace, *, write: bool = False):
    """Open an existing database: read-only unless the command must write."""
    from hermes_state import SessionDB  # after the profile is applied
    return SessionDB(existing_db(args), read_only=not write)


def check_new_file(target: Path, what: str) -> None:
    """Refuse a target file whose directory does not exist (nothing creates directories on the way)."""
    parent = target.expanduser().absolute().parent
    if not parent.is_dir():
        raise HermesStateError(f"{parent} does not exist: create the directory first, or write the {what} elsewhere")


@contextmanager
def written_atomically(target: str | None) -> Iterator[TextIO]:
    """Yield a text stream for `target` (stdout when None) that replaces it only once the body succeeds.

    The text goes to a new private file (0600) beside `target`; at the end it is renamed onto
    `target`, so a failure leaves an existing file as it was and a symlink planted at
    `target` is replaced, never followed. The caller opens the database before entering.
    """
    if target is None or target == "-":
        yield sys.stdout
        return
    path = Path(target).expanduser()
    check_new_file(path, "file")
    if path.is_dir():
        raise HermesStateError(f"{path} is a directory; give a file name")
    import tempfile  # here, not at start-up: only the commands that write a file need it
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)  # O_EXCL, 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


# --- output ---------------------------------------------------------------------------------------

def page(text: str) -> None:
    """Print `text` through a pager on a terminal, as git does: $PAGER, else `less` with LESS=FRX (it quits when it fits)."""
    if not sys.stdout.isatty():
        print(text)
        return
    import subprocess
    pager = os.environ.get("PAGER") or "less"
    if pager.strip() in ("", "cat"):
        print(text)
        return
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX"), "LV": os.environ.get("LV", "-c")}
    sys.stdout.flush()
    try:  # PAGER is a command line of the user's own, run by the shell as git runs it
        process = subprocess.Popen(pager, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        print(text)
        return
    try:
        assert process.stdin is not None
        process.stdin.write((text + "\n").encode(sys.stdout.encoding or "utf-8", "backslashreplace"))
        process.stdin.close()
    except BrokenPipeError:  # the reader quit the pager early
        pass
    process.wait()


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str], *,
         rows: list[dict[str, Any]] | None = None, columns: list[str] | None = None, paged: bool = False) -> None:
    """Print `data` as JSON / JSON Lines / CSV / TSV when asked, else its human form.

    Machine forms give epoch times as ISO 8601 with their offset, unless `--epoch` keeps the stored numbers.
    """
    tsv = getattr(args, "tsv", False)
    if (args.json or args.nl or args.csv or tsv) and not getattr(args, "epoch", False):
        data = render.iso_times(data)
        rows = None if rows is None else render.iso_times(rows)
    if args.json:
        print(render.as_json(data))
    elif args.nl:
        for line in render.as_json_lines(rows if rows is not None else [data]):
            print(line)
    elif args.csv or tsv:
        text = render.as_csv(rows if rows is not None else [data], columns, delimiter="\t" if tsv else ",",
                             headers=not getattr(args, "no_headers", False))
        if text:
            print(text)
    else:
        text = human(data)
        if text and paged:
            page(text)
        elif text:
            print(text)


def term_width() -> int | None:
    """Return the terminal's width (COLUMNS when set), or None when output is not a terminal: cut nothing."""
    if not sys.stdout.isatty():
        return None
    return max(40, shutil.get_terminal_size().columns)


COLOR_MODES = ("auto", "always", "never")
_COLOR = ["auto"]  # what --color said, for the whole command


def set_color(mode: str) -> None:
    """Set the --color mode: auto (a terminal, unless NO_COLOR; FORCE_COLOR forces it), always or never."""
    if mode not in COLOR_MODES:
        raise ValueError(f"--color takes {', '.join(COLOR_MODES)}, not {mode!r}")
    _COLOR[0] = mode


def use_color() -> bool:
    """Say whether to colour the output: --color always/never, else NO_COLOR (off), FORCE_COLOR (on), a terminal."""
    if _COLOR[0] != "auto":
        return _COLOR[0] == "always"
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    return sys.stdout.isatty()


def parse_when(text: str) -> float:
    """Return epoch seconds for "7d", "12h", "30m", an ISO date or date-time, or epoch seconds."""
    try:
        return render.parse_when(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# The largest count or offset a command takes; `-n 0` asks for everything, which is this many.
MAX_COUNT = 1_000_000_000


def non_negative(text: str) -> int:
    """Parse a count that must be between 0 and MAX_COUNT."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT:,}, not {value:,} (-n 0 means all)")
    return value


def limit_of(args: argparse.Namespace) -> int:
    """Return the `-n` a command was given, 0 meaning all."""
    return args.limit or MAX_COUNT


def age(text: str) -> float:
    """Parse an age in days: a number of days, or 7d, 12h, 30m, 2w, as `--since` takes them."""
    try:
        return render.parse_age_days(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- sessions: list, show, search, rename, stats ------------------------------------------------

_LIST_COLUMNS = ["id", "title", "source", "model", "messages", "active"]
# What `sessions list -c` takes besides a stored column: the table's own names and every column at once.
_LIST_ALIASES = {"messages": "message_count", "active": "last_active"}
# The columns a narrow terminal leaves out first, the least wanted first; id and title stay.
_LIST_OPTIONAL = ["active", "model", "source", "messages"]


def list_column_names() -> list[str]:
    """Return the names `sessions list -c` takes: the table's, every stored column, and `all`."""
    from hermes_state_common import SESSIONS
    stored = [c for c in SESSIONS.column_names if c not in _LIST_COLUMNS]
    return [*_LIST_COLUMNS, *stored, "preview", "last_active", "all"]


def list_column(text: str) -> str:
    """Parse one `sessions list -c` name; an unknown one is a usage error naming the choices."""
    names = list_column_names()
    if text not in names:
        raise argparse.ArgumentTypeError(f"no column {text!r}; choose from: {', '.join(names)}")
    return text

SHOWN_CANDIDATES = 10  # ids an ambiguous prefix's error names


def session_id_of(db: Any, text: str) -> str:
    """Return the session whose id is `text`, or the only one whose id starts with it (as git takes a short hash).

    An unknown id raises SessionNotFoundError; a prefix of several ids raises
    AmbiguousSessionIdError naming them.
    """
    from hermes_state_errors import AmbiguousSessionIdError, SessionNotFoundError
    found = db.resolve_session_id(text)
    if found is not None:
        return found
    candidates = db.session_ids_with_prefix(text, limit=SHOWN_CANDIDATES + 1) if text else []
    if len(candidates) > 1:
        more = " and more" if len(candidates) > SHOWN_CANDIDATES else ""
        raise AmbiguousSessionIdError(f"{text!r} starts more than one session id: "
                                      f"{', '.join(candidates[:SHOWN_CANDIDATES])}{more}; give more of it",
                                      candidates[:SHOWN_CANDIDATES])
    raise SessionNotFoundError(f"session {text!r} not found")


def name_filters(db: Any, sources: list[str] | None, model: str | None) -> dict[str, list[str]]:
    """Return the stored names a command line's sources and model stand for: any case; a model also without its provider."""
    from hermes_state_listings import matching_names
    known = db.stored_names() if sources or model else {}
    found: dict[str, list[str]] = {}
    if sources:
        found["sources"] = sorted({name for typed in sources for name in matching_names(typed, known["source"])})
    if model:
        found["models"] = matching_names(model, known["model"], provider=True)
    return found


def _range(offset: int, shown: int, total: int) -> str:
    # "4 sessions", "session 21 of 21", "1-20 of 44 sessions (--offset 20 for more)".
    if offset == 0 and shown == total:
        return render.plural(total, "session")
    where = f"session {offset + 1:,}" if shown == 1 else f"{offset + 1:,}-{offset + shown:,}"
    more = f" (--offset {offset + shown} for more)" if offset + shown < total else ""
    return f"{where} of {total:,}" + ("" if shown == 1 else " sessions") + more


def cmd_list(args: argparse.Namespace) -> int:
    """List sessions, most recently active first."""
    with open_db(args) as db:
        names = name_filters(db, [args.source] if args.source else None, args.model)
        filters: dict[str, Any] = dict(source=names.get("sources"), include_archived=args.archived,
                                       model=names.get("models"), since=args.since, until=args.until)
        rows = db.list_sessions(limit=limit_of(args), offset=args.offset, order="activity", **filters)
        total = db.count_sessions(**filters)
    chosen = list(dict.fromkeys(getattr(args, "column", None) or []))
    every = "all" in chosen
    columns = (list(rows[0]) if rows else []) if every else chosen or _LIST_COLUMNS
    tty = sys.stdout.isatty()
    said: list[str] = []  # the count, when it goes to stderr (after the rows, as a terminal shows it)

    def human(_: Any) -> str:
        # The count and "no sessions" are for people: piped, stdout carries the rows alone.
        if not rows:
            if tty:
                return "no sessions"
            said.append("no sessions")
            return ""
        shown = [dict({c: render.clock_time(v) if c.endswith("_at") and isinstance(v, (int, float)) else v
                       for c, v in r.items()}, title=render.session_label(r["title"], r["preview"]),
                      messages=r["message_count"], active=render.relative_time(r["last_active"])) for r in rows]
        table = render.table(shown, columns, numeric={"messages", "message_count", "tool_call_count"},
                             max_width=term_width(), keep={"id"}, color=use_color(),
                             optional=[] if chosen else _LIST_OPTIONAL, show_headers=not args.no_headers)
        footer = _range(args.offset, len(rows), total)
        if tty and not args.no_headers:
            return f"{table}\n{footer}"
        said.append(footer)
        return table
    machine = rows
    if (chosen and not every) or args.csv or getattr(args, "tsv", False):
        # The table's columns by default; the stored values, times as the machine forms give them.
        machine = [{c: r.get(_LIST_ALIASES.get(c, c)) for c in columns}
                   for r in (rows if args.epoch else render.iso_times(rows))]
    emit(args, machine, human, rows=machine, columns=columns)
    if said:
        sys.stdout.flush()
        print(said[0], file=sys.stderr)
    return 0


def _call_text(call: Any) -> str:
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    name = fn.get("name") or (call.get("name") if isinstance(call, dict) else None) or "?"
    return f"{name}({fn.get('arguments', '')})"


def _message_line(m: dict[str, Any], width: int | None, color: bool = False) -> str:
    role = m["role"]
    text = render.content_text(m.get("content"))
    if role == "tool" and m.get("tool_name"):
        text = f"[{m['tool_name']}] {text}"
    if not text and m.get("tool_calls"):
        text = "→ " + ", ".join(_call_text(c) for c in m["tool_calls"]) if isinstance(m["tool_calls"], list) \
            else f"→ {m['tool_calls']}"
    elif not text and (m.get("reasoning") or m.get("reasoning_content")):
        text = "(reasoning only)"
    head = f"{render.clock_time(m.get('timestamp'))[11:]}  {role:<10} "
    body = render.truncate(render.safe(text), None if width is None else max(width - render.width(head), 10))
    return head.replace(role, render.paint(role, role, color), 1) + body


def _markdown(label: str, session: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """Render a session like `llm logs`: a heading per message, tool calls and reasoning spelled out."""
    out = [f"# {render.safe(label)}", ""]
    for key in ("id", "source", "model", "user_id", "started_at", "ended_at", "end_reason", "parent_session_id"):
        value = session.get(key)
        if value is not None:
            out.append(f"- {key}: {render.clock_time(value) if key.endswith('_at') else render.safe(value)}")
    for m in messages:
        out += _markdown_message(m)
    return "\n".join(out).strip() + "\n"


def _markdown_message(m: dict[str, Any]) -> list[str]:
    # One message's heading (role, tool, time, tokens), then its reasoning, text and tool calls.
    extra = [render.clock_time(m.get("timestamp"))]
    if m.get("token_count") is not None:
        extra.append(f"{m['token_count']} tokens")
    name = f" `{render.safe(m['tool_name'])}`" if m.get("tool_name") else ""
    out = ["", f"## {m['role']}{name} · {' · '.join(extra)}", ""]
    reasoning = m.get("reasoning") or m.get("reasoning_content")
    if reasoning:
        out += ["### reasoning", ""] + [f"> {line}" for line in render.safe(reasoning, keep_newlines=True)
                                        .splitlines()] + [""]
    if m.get("content"):
        fence = "```" if m["role"] == "tool" else ""
        text = render.safe(render.content_text(m["content"]), keep_newlines=True)
        out += [fence, text, fence] if fence else [text]
    if m.get("tool_calls"):
        out += ["", "### tool calls", ""]
        for call in m["tool_calls"] if isinstance(m["tool_calls"], list) else [m["tool_calls"]]:
            out.append(f"- `{render.safe(_call_text(call))}`")
    return out


def _summary(label: str, s: dict[str, Any], ancestors: list[str], successor: str | None) -> list[str]:
    # The lines `sessions show` prints above the transcript: who, when, how much, and the chain.
    cost = render.money(s.get("actual_cost_usd") or s.get("estimated_cost_usd"))
    lines = [render.safe(label) + f"  ({render.safe(s['id'])})",
             " · ".join(p for p in (f"source {render.safe(s['source'])}",
                                    s["model"] and f"model {render.safe(s['model'])}",
                                    s["user_id"] and f"user {render.safe(s['user_id'])}") if p),
             f"started {render.clock_time(s['started_at'])} · "
             + (f"ended {render.clock_time(s['ended_at'])} ({render.safe(s['end_reason'])})"
                if s["ended_at"] else "open")
             + f" · {_plural(s['message_count'] or 0, 'message')} · {_plural(s['tool_call_count'] or 0, 'tool call')}",
             f"tokens in {render.number(s['input_tokens'] or 0)} / out {render.number(s['output_tokens'] or 0)}"
             + (f" · cost {cost}" if cost else "")]
    if ancestors:
        lines.append("continues " + " → ".join(map(render.safe, ancestors)))
    if successor and successor != s["id"]:
        lines.append(f"continued in {render.safe(successor)}")
    return lines


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def cmd_show(args: argparse.Namespace) -> int:
    """Show one session and its live transcript."""
    from hermes_state import SessionNotFoundError
    with open_db(args) as db:
        args.session_id = session_id_of(db, args.session_id)
        session = db.get_session(args.session_id)
        if session is None:
            raise SessionNotFoundError(f"session {args.session_id!r} not found")
        chain = db.get_compression_lineage(args.session_id)  # read in one snapshot, oldest first
        messages = db.get_messages(args.session_id)
    here = chain.index(args.session_id) if args.session_id in chain else len(chain)
    ancestors, successor = chain[:here], (chain[-1] if chain[here + 1:] else None)
    # An untitled session is named by its first user message, as in `sessions list`.
    first = next((render.content_text(m.get("content")) for m in messages if m["role"] == "user"), None)
    label = render.session_label(session["title"], render.truncate(" ".join(first.split()), 63) if first else None)
    hidden = max(len(messages) - args.tail, 0) if args.tail else 0  # --tail 0 means all
    messages = messages[hidden:]
    data = {"session": session, "messages": messages}

    def human(_: Any) -> str:
        if args.full:
            return _markdown(label, session, messages)
        lines = _summary(label, session, ancestors, successor)
        width = term_width()
        earlier = [f"({_plural(hidden, 'earlier message')} not shown; --tail 0 shows them all)"] if hidden else []
        color = use_color()
        lines[0] = render.paint(lines[0], "header", color)
        return "\n".join(lines + [""] + earlier + [_message_line(m, width, color) for m in messages])
    emit(args, data, human, paged=not getattr(args, "no_pager", False))
    return 0


def query_text(words: list[str]) -> str:
    """Join the words of a command line into one query.

    The shell takes the quotes off `-"a phrase"`, which arrives as the one word `-a phrase`:
    such a word is the phrase to leave out again.
    """
    return " ".join(f'-"{w[1:]}"' if w.startswith("-") and len(w.split()) > 1 and '"' not in w else w
                    for w in words)


def cmd_search(args: argparse.Namespace) -> int:
    """Search every message's text (words, CJK, substrings)."""
    with open_db(args) as db:
        names = name_filters(db, args.source, args.model)
        filters: dict[str, Any] = dict(source_filter=names.get("sources"), role_filter=args.role,
                                       model_filter=names.get("models"))
        query = query_text(args.query)
        hits = db.search_messages(query, limit=limit_of(args), offset=args.offset, include_reasoning=args.reasoning,
                                  since=args.since, until=args.until, **filters)
        if args.reasoning:
            for h in hits:
                h["in_reasoning"] = not _matches_text(db, query, h, filters)
        # Nothing in the text: say so when the reasoning would match, which is searched only when asked.
        in_reasoning = not hits and not args.reasoning and not args.offset and bool(db.search_messages(
            query, limit=1, include_reasoning=True, since=args.since, until=args.until,
            fields=["id"], **filters))
    color = use_color()
    nothing = ("no match in the messages' text; the models' reasoning matches: add --reasoning to search it too"
               if in_reasoning else "no match")
    if in_reasoning and (args.json or args.nl or args.csv):
        print(f"hermes-state: {nothing}", file=sys.stderr)  # the machine output stays an empty list

    def human(_: Any) -> str:
        if not hits:
            return nothing
        width = term_width()
        lines = []
        for h in hits:
            # The id comes first and whole, so it can be copied into `sessions show`.
            sid = render.safe(h["session_id"])
            role = render.safe(h["role"])
            rest = f"  {render.safe(render.session_label(h.get('title')))}  {role}  " \
                   f"{render.relative_time(h['timestamp'])}" + ("  (in reasoning)" if h.get("in_reasoning") else "")
            rest = render.truncate(rest, None if width is None else max(width - render.width(sid), 10))
            if color:  # the role is painted only where it was not cut
                rest = rest.replace(f"  {role}  ", f"  {render.paint(role, h['role'], True)}  ", 1)
            lines += [render.paint(sid, "id", color) + rest, "  " + render.highlight(h["snippet"], color=color)]
        return "\n".join(lines)
    machine = [_plain_hit(h) for h in hits]
    rows = [{k: v for k, v in h.items() if k != "context"} for h in machine] if args.csv or getattr(args, "tsv", False) else machine
    emit(args, machine, human, rows=rows)
    return 0


def _matches_text(db: Any, query: str, hit: dict[str, Any], filters: dict[str, Any]) -> bool:
    """Say whether a hit of a search with the reasoning also matches without it (in the text, tool calls or tool name)."""
    when = hit.get("timestamp")
    if not isinstance(when, (int, float)):
        return True  # no time to narrow the look to: not said to be in the reasoning
    # The same search, narrowed to the hit's session and moment: a handful of messages at most.
    again = db.search_messages(query, session_id=hit["session_id"], since=when, until=when + 0.001, limit=100,
                               fields=["id"], **filters)
    return any(h["id"] == hit["id"] for h in again)


def _plain_hit(hit: dict[str, Any]) -> dict[str, Any]:
    # For machines: the snippet's text without markers, and where the matches are in it.
    text, matches = render.unmarked(hit.get("snippet") or "")
    return dict(hit, snippet=text, matches=matches)


def cmd_rename(args: argparse.Namespace) -> int:
    """Set (or clear, with "") a session's title."""
    from hermes_state import SessionNotFoundError
    with open_db(args, write=True) as db:
        args.session_id = session_id_of(db, args.session_id)
        # set_session_title answers True/False (as hermes-agent's does); the stored title is read back.
        if db.set_session_title(args.session_id, args.title) is False:
            raise SessionNotFoundError(f"session {args.session_id!r} not found")
        title = db.get_session_title(args.session_id)
    emit(args, {"id": args.session_id, "title": title},
         lambda d: f"{render.safe(d['id'])}: {render.safe(d['title']) if d['title'] else '(title cleared)'}")
    return 0


_USAGE_HEADERS = {"session_count": "sessions", "input_tokens": "input", "output_tokens": "output", "cost_usd": "cost"}
_USAGE_NUMBERS = set(_USAGE_HEADERS)


def _usage_row(r: dict[str, Any], by: str) -> dict[str, Any]:
    # One row as people read it: numbers grouped, cost in dollars, an unnamed group named.
    return dict(r, **{by: r[by] if r[by] is not None else f"(no {by})"}, session_count=render.number(r["session_count"]),
                input_tokens=render.number(r["input_tokens"]), output_tokens=render.number(r["output_tokens"]),
                cost_usd=render.money(r["cost_usd"]))


def _total(rows: list[dict[str, Any]], by: str) -> dict[str, Any]:
    return {by: "total", **{k: sum(r[k] or 0 for r in rows) for k in ("session_count", "input_tokens",
                                                                        "output_tokens", "cost_usd")}}


BAR_WIDTH, MIN_BAR_WIDTH = 30, 5  # the longest bar; below the shortest room left, no bars at all


def _bars(rows: list[dict[str, Any]], width: int) -> list[str]:
    # A bar per row, as long as its cost (its tokens when nothing is priced) against the largest.
    key = "cost_usd" if any(r["cost_usd"] for r in rows) else "tokens"
    values = [(r["cost_usd"] or 0) if key == "cost_usd" else r["input_tokens"] + r["output_tokens"] for r in rows]
    top = max(values, default=0) or 1
    return ["█" * max(round(v / top * width), 1 if v else 0) for v in values]


def cmd_stats(args: argparse.Namespace) -> int:
    """Show sessions, tokens and cost per model (or source), overall or per day, week or month, and the largest sessions."""
    by = args.group
    with open_db(args) as db:
        names = name_filters(db, args.source, None)
        filters: dict[str, Any] = dict(sources=names.get("sources"), since=args.since, until=args.until)
        rows = db.usage(by=by, period=args.by, **filters)
        top = db.largest_sessions(**filters) if args.by is None else []
    for r in rows:
        if args.by is None:
            del r["period"]
    data: dict[str, Any] = {f"by_{by}": rows} if args.by else {f"by_{by}": rows, "top_sessions": top}

    def human(_: Any) -> str:
        width = term_width()
        columns = ([] if args.by is None else ["period"]) + [by, *_USAGE_HEADERS]
        shown = [_usage_row(r, by) for r in rows]
        if args.by is None:
            shown.append(_usage_row(_total(rows, by), by))
        elif width is not None and rows:  # a bar per row, on a terminal only, in the room the table leaves
            bare = render.table(shown, columns, numeric=_USAGE_NUMBERS, headers=_USAGE_HEADERS, max_width=width,
                                keep={by, "period"})
            room = min(BAR_WIDTH, width - max(map(render.width, bare.splitlines())) - 2)
            if room >= MIN_BAR_WIDTH:
                for r, bar in zip(shown, _bars(rows, room)):
                    r["bar"] = bar
                columns.append("bar")
        table = render.table(shown, columns, numeric=_USAGE_NUMBERS, headers={**_USAGE_HEADERS, "bar": ""},
                             max_width=width, keep={by, "period"}, color=use_color()) if rows else "no sessions"
        if args.by is not None:
            return table
        largest = render.table([dict(r, title=render.session_label(r["title"]), total_tokens=render.number(
                                    r["total_tokens"])) for r in top],
                               ["id", "title", "model", "total_tokens"], numeric={"total_tokens"},
                               headers={"total_tokens": "tokens"}, max_width=width, keep={"id"}, color=use_color())
        return f"{table}\n\n{render.paint('largest sessions', 'header', use_color())}\n{largest}"
    emit(args, data, human, rows=rows)
    return 0


# --- writes and maintenance ---------------------------------------------------------------------

def cmd_fts(args: argparse.Namespace) -> int:
    """Show the full-text index status, or rebuild it (progress on stderr)."""
    with open_db(args, write=args.action == "rebuild") as db:
        if args.action == "status":
            data = db.fts_rebuild_status()
        else:
            data = with_progress("rebuilding the search index", db.rebuild_fts, _rebuilt_of_total(db), unit="rows")
    emit(args, data, lambda d: "\n".join(render.plain(d, indent="")))
    return 0


def _rebuilt_of_total(db: Any) -> Callable[[], tuple[int, int | None]]:
    # Until the rebuild has begun, the status still says the old index is whole: count from 0.
    begun = False

    def poll() -> tuple[int, int | None]:
        nonlocal begun
        status = db.fts_rebuild_status()
        begun = begun or bool(status["in_progress"])
        return (int(status["indexed"]) if begun else 0), int(status["total"])
    return poll


def growing_file(target: Path, total: int | None) -> Callable[[], tuple[int, int | None]]:
    """Return a poll of how far a copy being written under `target`'s temporary name has got (bytes of `total`)."""
    def poll() -> tuple[int, int | None]:
        sizes = [p.stat().st_size for p in target.parent.glob(f"{target.name}.partial-*") if p.is_file()]
        done = max(sizes) if sizes else (target.stat().st_size if target.exists() else 0)
        return (min(done, total) if total else done), total  # a copy that rebuilds indexes may outgrow its source
    return poll


def files_growing(total: int | None, *patterns: Path) -> Callable[[], tuple[int, int | None]]:
    """Return a poll of the bytes files matching `patterns` (globs) gained since the poll was made, of `total`.

    For work that writes through SQLite into a file one can watch: a database's WAL (restore,
    vacuum, an upgrade) or a copy appearing beside it. A WAL the work reuses shows growth only
    past its old size: the line is a hint of how far the work has got, never more than `total`.
    """
    def sizes() -> dict[Path, int]:
        found = {}
        for pattern in patterns:
            for path in pattern.parent.glob(pattern.name):
                try:
                    found[path] = path.stat().st_size
                except OSError:  # gone between the listing and the look
                    pass
        return found
    before = sizes()
    most = 0  # a WAL folded back into the file shrinks again: the line never goes backwards

    def poll() -> tuple[int, int | None]:
        nonlocal most
        most = max(most, sum(max(size - before.get(path, 0), 0) for path, size in sizes().items()))
        return (min(most, total) if total else most), total
    return poll


def with_progress(label: str, work: Callable[[], Any], poll: Callable[[], tuple[int, int | None]],
                  unit: str = "") -> Any:
    """Run `work` while a progress line (on a terminal) shows what `poll` reports."""
    progress = render.Progress(label, unit=unit)
    if not progress.enabled:
        return work()
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
    worker = threading.Thread(target=run, daemon=True)

    def show() -> None:
        try:
            progress.update(*poll())
        except (HermesStateError, OSError):  # the thing polled is not there yet, or gone already
            pass
    show()  # a first line at once (nothing done yet), so that short work is seen too
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
        show()
    if failure:
        raise failure[0]
    progress.done()
    return result[0]


def cmd_init(args: argparse.Namespace) -> int:
    """Create the database (or bring an older one up to date)."""
    from hermes_state import SessionDB
    path = db_path(args)
    existed = path.is_file() and path.stat().st_size > 0
    with SessionDB(path, force=getattr(args, "force", False)) as db:
        data = {"path": str(path), "created": not existed, "schema_version": db.schema_version,
                "mode_changes": db.mode_changes}
    emit(args, data, lambda d: f"{'created' if d['created'] else 'ready'}: {display_hermes_home(d['path'])} "
                               f"(schema v{d['schema_version']})" + "".join(f"\nchanged {c}" for c in d["mode_changes"]))
    return 0


def _loose_modes(path: Path) -> list[tuple[Path, int]]:
    """Return the database's files (itself, -wal, -shm) that others can read, with their modes."""
    found = []
    for file in (Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")):
        try:
            mode = stat.S_IMODE(os.stat(file).st_mode)
        except FileNotFoundError:
            continue
        if os.name == "posix" and mode & 0o077:
            found.append((file, mode))
    return found


def _check(name: str, ok: bool, detail: str, *, warn: bool = False) -> dict[str, Any]:
    # `warn`: true of the environment rather than of the file; said, but no reason to exit 1.
    return {"check": name, "ok": ok, "detail": detail, **({"warn": True} if warn else {})}


def _label(check: dict[str, Any]) -> str:
    return "BAD " if not check["ok"] else "warn" if check.get("warn") else "ok  "


def _sqlite_check() -> dict[str, Any]:
    # Whether the SQLite this Python links has the WAL-reset bug, and what to do about it.
    from hermes_state_common import WAL_RESET_BUG
    import sqlite3
    return _check("sqlite", True, f"{sqlite3.sqlite_version} has the WAL-reset bug; remedy: a Python linking SQLite "
                  "3.51.3 or newer, or 3.50.7 or 3.44.6 (docs/reliability.md)" if WAL_RESET_BUG else
                  f"{sqlite3.sqlite_version}", warn=WAL_RESET_BUG)


def _space_check(path: Path) -> dict[str, Any]:
    # How much of the file is free pages (a move-in and deletes leave them), and what gives it back.
    from hermes_state_recovery import collect_state_db_stats
    stats = collect_state_db_stats(path)
    if stats["page_size"] is None or stats["page_count"] is None or stats["freelist_count"] is None:
        return _check("space", True, "cannot be read")
    size, free = stats["page_count"] * stats["page_size"], stats["freelist_count"] * stats["page_size"]
    much = free >= 2**20 and free * 4 >= size
    return _check("space", True, f"{size / 2**20:.1f} MB, {free / 2**20:.1f} MB of it free" + (
        " (`hermes-state vacuum` gives it back; writers wait while it runs)" if much else ""), warn=much)


def _copies_check(path: Path) -> dict[str, Any]:
    # The copies an upgrade wrote beside the store, and when the policy lets a writable open remove each.
    from hermes_state import SessionDB
    from hermes_state_catalogue import UPGRADE_COPIES_KEPT, copies_to_remove, copy_taken_at
    from hermes_state_common import DAY_S
    from hermes_state_recovery import copies_beside
    copies = sorted(copies_beside(path), key=lambda c: copy_taken_at(c) or c.stat().st_mtime, reverse=True)
    keep = SessionDB.upgrade_copy_keep_days
    policy = ("kept until you remove them" if keep is None else
              f"the newest {UPGRADE_COPIES_KEPT} are kept {keep:g} days after their upgrade, then a writable open "
              "removes them (SessionDB's upgrade_copy_keep_days; None keeps them)")
    if not copies:
        return _check("upgrade copies", True, f"none; {policy}")
    total = sum(c.stat().st_size for c in copies)
    due = set(copies_to_remove(path, keep))

    def fate(copy: Path) -> str:
        taken = copy_taken_at(copy)
        if copy in due:
            return "removed at the next writable open"
        if keep is None or taken is None:
            return "kept"
        return "kept until " + time.strftime("%Y-%m-%d", time.gmtime(taken + keep * DAY_S))
    listed = "; ".join(f"{c.name} ({c.stat().st_size / 2**20:.1f} MB, {fate(c)})" for c in copies)
    return _check("upgrade copies", True, f"{len(copies)} ({total / 2**20:.1f} MB): {listed}; {policy}")


def _replication_check(path: Path) -> dict[str, Any]:
    # Whether Litestream replicates this file, from what it leaves beside the file and in /proc.
    from hermes_state_replicas import litestream_status
    status = litestream_status(path)
    if not status["pids"] and status["folder"] is None:
        return _check("replication", True, "none seen (docs/scaling.md: a copy off this machine with Litestream)")
    if not status["pids"]:
        return _check("replication", True, f"Litestream replicated this file before ({status['folder'].name} is "
                      "here), but no Litestream process has it open now: the replica is not keeping up", warn=True)
    waiting, after = status["frames_waiting"], status["written_after_s"]
    where = ("it has taken no change set yet" if status["txid"] is None else
             f"its copy of the log is at transaction {status['txid']}, " + (
                 "every change written so far" if waiting == 0 else
                 f"{waiting} log pages behind" if waiting is not None else
                 f"the log was written {after} s after it"))
    return _check("replication", True, f"Litestream (PID {', '.join(map(str, status['pids']))}) is replicating it; "
                  f"{where} (what reached the replica: `litestream sync -wait`); meanwhile `vacuum` leaves "
                  "the log for Litestream to truncate")


def _schema_check(path: Path) -> tuple[dict[str, Any], int | None]:
    # The schema's version as a read-only open sees it (None: this library cannot read the file).
    from hermes_state import SCHEMA_VERSION, SessionDB, StateDbIncompatibleError
    try:
        with SessionDB(path, read_only=True) as db:
            version = db.schema_version
    except StateDbIncompatibleError as exc:
        return _check("schema", False, f"{exc} (`hermes-state migrate` upgrades it, keeping a copy)"), None
    return _check("schema", version == SCHEMA_VERSION, f"version {version}" + (
        "" if version == SCHEMA_VERSION else f", this library writes {SCHEMA_VERSION}")), version


def _integrity_checks(path: Path, full: bool, command: str = "hermes-state") -> list[dict[str, Any]]:
    # SQLite's own check, each full-text index's check and whether a rebuild is still pending.
    from hermes_state import SessionDB

    class Checking(SessionDB):
        upgrade_copy_keep_days = None  # doctor reports the copies past the policy; it never removes one
    with Checking(path) as db:
        report = db.check_integrity(full=full)
        status = db.fts_rebuild_status()
    checks = [_check("integrity", not report["problems"], "ok" if not report["problems"] else
                     "; ".join(report["problems"][:3]) + f" (`{command} recover {path} {path}.recovered` salvages it; "
                     f"`{command} restore {path}.recovered` then puts it in place)")]
    for table, result in sorted(report["fts"].items()):  # the same order on every run
        checks.append(_check(f"fts {table}", result == "ok", result if result == "ok" else
                             f"{result} (`hermes-state fts rebuild` rebuilds it)"))
    checks.append(_check("fts rebuild", not status["pending"], "none pending" if not status["pending"] else
                         f"{status['pending']} rows not indexed yet (`hermes-state fts rebuild` finishes it)"))
    return checks


def _doctor_lines(report: dict[str, Any]) -> str:
    # One row per check, names in one column as wide as the longest; on a terminal a long detail
    # wraps at word boundaries under its own column, never mid-word by the terminal.
    checks = report["checks"]
    name_width = max(len(c["check"]) for c in checks)
    width = term_width()
    indent = 5 + name_width + 1
    lines = []
    for c in checks:
        detail = render.safe(c["detail"])
        if width is not None and width - indent >= 20:
            detail = ("\n" + " " * indent).join(textwrap.wrap(detail, width - indent, break_long_words=False,
                                                             break_on_hyphens=False))
        lines.append(f"{_label(c)} {c['check']:<{name_width}} {detail}")
    return "\n".join(lines)


def _damaged_checks(path: Path, exc: BaseException) -> list[dict[str, Any]]:
    # What can be learnt of a file the library cannot open, without writing to it: its size, its
    # header, what `recover` could read, the copies beside it and whether a replica exists.
    from hermes_state_recovery import copies_beside, unreadable_reason
    size = path.stat().st_size
    kind = file_kind(path)
    checks = [_check("file", True, f"{size:,} bytes"),
              _check("header", kind == "sqlite", "SQLite's header" if kind == "sqlite" else
                     "a JSON export, not a database" if kind == "export" else "no SQLite header"),
              _check("open", False, f"the library cannot read it ({exc.__cause__ or exc})")]
    why = unreadable_reason(path)
    checks.append(_check("salvage", why is None, "`recover` can read its tables" if why is None
                         else f"nothing `recover` can read: {why}"))
    copies = copies_beside(path)
    checks.append(_check("copies", True, ", ".join(c.name for c in copies) if copies else "none beside it"))
    return checks + [_replication_check(path), _sqlite_check()]


def _doctor_damaged(args: argparse.Namespace, path: Path, exc: BaseException) -> int:
    """Report what doctor can check of a file it cannot open, and the steps that can work; exit 1."""
    from hermes_state_recovery import damaged_store_advice
    checks = _damaged_checks(path, exc)
    advice = damaged_store_advice(path, command_line(args))

    def human(report: dict[str, Any]) -> str:
        width = term_width()  # on a terminal each step wraps at word boundaries, under its own start
        steps = ["\n".join(textwrap.wrap(render.safe(line), width - 2, initial_indent="  ", subsequent_indent="    ",
                                         break_long_words=False, break_on_hyphens=False))
                 if width is not None else f"  {render.safe(line)}" for line in advice]
        return "\n".join([_doctor_lines(report), "what can be done:"] + steps)
    emit(args, {"ok": False, "path": str(path), "checks": checks, "advice": advice}, human, rows=checks)
    return 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the database: schema, integrity, FTS indexes, WAL size, file modes, lock holders, replication."""
    from hermes_state import SCHEMA_VERSION
    from hermes_state_lockowners import write_lock_holders
    from hermes_state import StateDbCorruptError
    path = existing_db(args)
    before = _loose_modes(path)  # before any open: a writable open makes the files private itself
    try:
        schema_check, version = _schema_check(path)
        checks = [schema_check] + (_integrity_checks(path, args.full, command_line(args)) if version == SCHEMA_VERSION else [])
    except StateDbCorruptError as exc:
        return _doctor_damaged(args, path, exc)
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    checks.append(_check("wal", size < 256 * 2**20, f"{size / 2**20:.1f} MB" + (
        "" if size < 256 * 2**20 else " (a long reader may block checkpoints)")))
    # The integrity checks' writable open makes the files private: a problem it mended is reported
    # as mended (ok), and only one still there now as a fault.
    still = _loose_modes(path)
    fixed = [f"{file.name} {mode:o} -> 600" for file, mode in before if file not in dict(still)]
    checks.append(_check("file modes", not still, "; ".join(
        f"{file.name} is readable by others (mode {mode:o}): run `chmod 600 {file}`" for file, mode in still)
        or (f"fixed: {', '.join(fixed)}" if fixed else "0600")))
    checks.append(_check("lock holders", True, "; ".join(write_lock_holders(path)) or "none"))
    checks.append(_space_check(path))
    checks.append(_copies_check(path))
    checks.append(_replication_check(path))
    checks.append(_sqlite_check())
    healthy = all(c["ok"] for c in checks)
    emit(args, {"ok": healthy, "path": str(path), "checks": checks}, _doctor_lines, rows=checks)
    return 0 if healthy else 1
