"""The `hermes-state` command: parse the command line, run one command, report how it went.

Owns: the declaration of every command (`COMMANDS`: one `Command` each, with its words, handler,
options, help, examples and the global flags it takes; the parser, `--help` and the completion
scripts are made from it), global flags accepted anywhere (`--db`, `--profile/-p`, `--json`,
`--nl`, `--csv`, `--tsv`, `--debug`, `--version`), refusing flags a command would ignore, the handlers of
the commands that move data
(`sessions export|import|delete|prune`, `recover`, `backup`, `restore`), `demo`, and the exit
codes: 0 ok, 1 the operation failed, 2 the command line is wrong. Errors are one line on
stderr without a traceback (unless `--debug`); a closed pipe (`| head`) ends quietly.
Does not own: the handlers of the browsing and health commands, or how output is printed
(hermes_state_commands), `serve` (hermes_state_serve), `passwd` (hermes_state_auth).
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import importlib
import io
import json
import os
import re
import sqlite3
import sys
import traceback
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import hermes_state_commands as commands
import hermes_state_render as render
from hermes_state_commands import age, emit, existing_db, non_negative, open_db, parse_when, written_atomically
from hermes_state_common import ROLES
from hermes_state_errors import (AmbiguousSessionIdError, HermesStateError, ProfileNotFoundError, SessionNotFoundError,
                                 StateDbCorruptError)
from hermes_state_home import _apply_profile_override, display_hermes_home, hermes_home_override, profile_home
from hermes_state_writer import note_wal_reset_bug

# Global flags, accepted before or after the command (as sqlite-utils and `llm logs` users type them).
_FLAGS = {"--json": "json", "--nl": "nl", "--csv": "csv", "--tsv": "tsv", "--epoch": "epoch", "--debug": "debug",
          "--version": "version"}
_VALUED = {"--db": "db", "--profile": "profile", "-p": "profile", "--color": "color"}
_FORMATS = ("json", "nl", "csv", "tsv")


class UsageError(Exception):
    """The command line itself is wrong (exit code 2)."""


def split_globals(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Take the global flags out of `argv` wherever they stand (up to `--`); return (flags, the rest)."""
    found: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if token == "--":
            rest += argv[i:]
            break
        if token in _FLAGS:
            found[_FLAGS[token]] = True
        elif eq and name in _VALUED:
            found[_VALUED[name]] = inline
        elif token in _VALUED:
            if i + 1 >= len(argv):
                raise UsageError(f"{token} needs a value")
            found[_VALUED[token]] = argv[i + 1]
            i += 1
        else:
            rest.append(token)
        i += 1
    if found.get("db") is not None and found.get("profile") is not None:
        raise UsageError("give --profile or --db, not both")
    if sum(bool(found.get(f)) for f in _FORMATS) > 1:
        raise UsageError("give one of --json, --nl, --csv, --tsv")
    return found, rest


def apply_profile(name: str, *, create: bool = False) -> Path:
    """Point HERMES_HOME at profile `name` of the current root (HERMES_HOME's root when it is set).

    A named profile must exist, unless `create` (for `init`), which makes its directory (0700).
    """
    target = profile_home(name)  # validates the name (ValueError)
    home = os.environ.get("HERMES_HOME")
    if home:
        root = Path(home).expanduser()
        if root.parent.name == "profiles":  # HERMES_HOME is itself a profile: its root is two up
            root = root.parent.parent
        target = root if name == "default" else root / "profiles" / name
    if create and not target.is_dir():
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
    if name != "default" and not target.is_dir():
        raise ProfileNotFoundError(f"profile {name!r} does not exist (no directory {target})")
    os.environ["HERMES_HOME"] = str(target)
    return target


def _plain(value: Any) -> Any:
    # A report may be a dataclass or an object with attributes; machines get plain JSON.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
        return value
    return {k: v for k, v in vars(value).items() if not k.startswith("_")}


# --- moving data: export, import, delete, prune, recover, backup, restore ------------------------

def _exported(db: Any, session_id: str) -> dict[str, Any]:
    document = db.export_session(commands.session_id_of(db, session_id))
    if document is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    return document


def cmd_export(args: argparse.Namespace) -> int:
    """Export sessions (every column, every generation) as JSON Lines: one session per line."""
    progress = render.Progress("exporting")
    count = 0
    # The database opens first, so a wrong --db leaves an existing export as it was; the file
    # is written privately beside FILE and takes its name only once complete.
    with open_db(args) as db, written_atomically(args.output) as out:
        stream: Iterable[dict[str, Any]] = ([_exported(db, sid) for sid in args.session_ids]
                                            if args.session_ids else db.iter_export(source=args.source))
        if args.json:
            print(render.as_json(list(stream)), file=out)
            return 0
        for count, item in enumerate(stream, 1):
            out.write(json.dumps(item, ensure_ascii=False, default=str) + "\n")
            progress.update(count)
    progress.done(render.plural(count, "session"))
    return 0


_JSON_SPACE = " \t\n\r"
# Reads stay below the C allocator's threshold (128 KB) for giving a block its own mapping, even
# as a str of four-byte characters (one emoji makes the whole str so). Freeing such a mapping
# raises that threshold, and the reads then come from the heap, which grew about 0.8 KB per
# imported session in a long import (measured with 256 KB reads) although the import held nothing.
READ_BYTES = 1 << 14
REPORT_IDS = 20  # session ids an import's report names per outcome (each outcome is counted in full)


class _JsonStream:
    """The text of an export file, read 16 KB at a time, with the JSON values in it decoded one by one."""

    def __init__(self, source: BinaryIO, name: str) -> None:
        self.source, self.name = source, name
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.decoder = json.JSONDecoder()
        self.text, self.pos, self.eof = "", 0, False
        self.bytes_read, self.lines_before = 0, 0  # what was read so far, and the newlines dropped from `text`

    def fill(self) -> bool:
        """Read more (at least as much as is still unparsed, so a long document costs linear time); False at the end."""
        if self.eof:
            return False
        chunk = self.source.read(max(READ_BYTES, len(self.text) - self.pos))
        try:
            more = self.utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            offset = self.bytes_read + exc.start
            raise ValueError(f"{self.name} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {offset}): "
                             "an export is JSON Lines") from None
        self.bytes_read += len(chunk)
        self.eof = not chunk
        self.lines_before += self.text.count("\n", 0, self.pos)
        self.text = self.text[self.pos:] + more
        self.pos = 0
        return True

    def peek(self) -> str:
        """Skip whitespace; return the next character, or "" at the end of the input."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _JSON_SPACE:
                self.pos += 1
            if self.pos < len(self.text) or not self.fill():
                return self.text[self.pos:self.pos + 1]

    def value(self) -> Any:
        """Decode the JSON value that starts here, reading more until it is whole."""
        while True:
            try:
                value, end = self.decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if self.fill():
                    continue
                raise ValueError(f"{self.name} is neither JSON nor JSON Lines: {exc.msg} at line "
                                 f"{self.lines_before + exc.lineno} column {exc.colno}") from None
            except RecursionError:  # Python's decoder gives up past about a thousand levels
                raise ValueError(f"{self.name} holds a value nested too deeply to import") from None
            if end == len(self.text) and self.fill():
                continue  # a number or word at the end of what was read may go on
            self.pos = end
            return value


def iter_documents(source: BinaryIO, name: str, stream: _JsonStream | None = None) -> Iterator[Any]:
    """Yield the documents of an export file one at a time: JSON Lines, one JSON document, or one JSON list.

    Memory holds one document (and a few reads of text) whatever the file's size. Text that is not
    UTF-8 or not JSON raises ValueError naming `name` and the place, when the reader gets there.
    `stream` (a reader of `source` made by the caller) lets the caller see how far it has read.
    """
    stream = stream or _JsonStream(source, name)
    if stream.peek() == "\ufeff":  # a byte order mark some editors write
        stream.pos += 1
    while (head := stream.peek()) != "":
        if head != "[":
            yield stream.value()
            continue
        stream.pos += 1  # a list of documents: one element at a time
        if stream.peek() == "]":
            stream.pos += 1
            continue
        while True:
            if stream.peek() == "":
                raise ValueError(f"{name} ends inside a list of documents")
            yield stream.value()
            after = stream.peek()
            stream.pos += 1
            if after == "]":
                break
            if after != ",":
                raise ValueError(f"{name} is neither JSON nor JSON Lines: expected ',' or ']' after document, "
                                 f"found {after!r}" if after else f"{name} ends inside a list of documents")


@contextlib.contextmanager
def _import_target(args: argparse.Namespace) -> Iterator[Any]:
    """Open the store to import into; `--db NEW.db` makes it, as `sqlite-utils insert` does, and a failed import takes it away again.

    A profile's store is never created by an import (`init` does that).
    """
    from hermes_state import SessionDB
    path = commands.db_path(args)
    if not (args.db and not path.exists()):
        with open_db(args, write=True) as db:
            yield db
        return
    commands.check_new_file(path, "database")
    try:
        with SessionDB(path) as db:
            yield db
    except BaseException:
        for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            leftover.unlink(missing_ok=True)
        raise


def _ids(ids: Iterable[str], count: int) -> str:
    shown = list(ids)
    if not count:
        return "none"
    more = count - len(shown)
    return ", ".join(map(render.safe, shown)) + (f" … and {more:,} more" if more > 0 else "")


def _import_lines(report: Any, source: str) -> str:
    """The import report for people: the counts first, then the sessions of each outcome."""
    counts = (f"{report.imported_count:,} imported, {report.replaced_count:,} replaced, "
              f"{report.skipped_count:,} skipped (already there); {render.plural(report.messages, 'message')} "
              "written")
    lines = [f"imported from {render.safe(source)}: {counts}"]
    for name in ("imported", "replaced", "skipped"):
        lines.append(f"  {name}: {_ids(getattr(report, name), getattr(report, name + '_count'))}")
    if report.detached_count:
        lines.append(f"  parent link cut (parent not there): {_ids(report.detached_parents, report.detached_count)}")
    if report.ignored_columns:
        lines.append(f"  columns this schema lacks, not imported: {', '.join(report.ignored_columns)}")
    return "\n".join(lines)


def cmd_import(args: argparse.Namespace) -> int:
    """Import sessions from an export (JSON Lines, or one JSON document or list), streamed; a bad input writes nothing."""
    from hermes_state_errors import ImportConflictError
    if args.file != "-":
        given = Path(args.file)
        if given.is_dir():
            raise HermesStateError(f"{args.file} is a directory; give an export file (or '-' for stdin)")
        if not given.exists():
            raise HermesStateError(f"{args.file} does not exist")
        if commands.file_kind(given) == "sqlite":
            raise HermesStateError(f"{args.file} is a SQLite database, not an export: "
                                   f"`hermes-state --db {args.file} sessions export` writes one")
    with (contextlib.nullcontext(sys.stdin.buffer) if args.file == "-" else open(args.file, "rb")) as source, \
            _import_target(args) as db:
        # strict: a problem anywhere is this command's error (exit 1), and nothing is imported. The
        # report names the first few sessions of each outcome and counts them all: memory stays flat.
        total = None if args.file == "-" else Path(args.file).stat().st_size
        progress = render.Progress("importing", unit="bytes")
        stream = _JsonStream(source, args.file)

        def documents() -> Iterator[Any]:
            for document in iter_documents(source, args.file, stream):
                progress.update(stream.bytes_read, total)
                yield document
        try:
            report = db.import_sessions(documents(), on_conflict=args.on_conflict, strict=True, max_ids=REPORT_IDS)
        except ImportConflictError as exc:  # the library names its argument; the user typed a flag
            raise ImportConflictError(re.sub(r"on_conflict='(\w+)'", r"--on-conflict \1",
                                             str(exc).replace("' or '", "' or on_conflict='"))) from None
        progress.done(render.plural(report.imported_count + report.replaced_count, "session"))
    emit(args, _plain(report), lambda _: _import_lines(report, args.file))
    return 0


def _described(row: dict[str, Any]) -> str:
    count = row.get("message_count") or 0
    return (f"{render.safe(row['id'])}  {render.safe(render.session_label(row.get('title'), row.get('preview')))}"
            f"  ({count:,} message{'' if count == 1 else 's'})")


def _removal(args: argparse.Namespace, rows: list[dict[str, Any]], what: str) -> None:
    """Print what a delete or prune removed, or (--dry-run) would remove."""
    shown = [{"id": r["id"], "title": r.get("title"), "message_count": r.get("message_count")} for r in rows]
    verb = "would delete" if args.dry_run else "deleted"
    head = f"{verb} {len(rows):,} {what}{'' if len(rows) == 1 else 's'}"
    data = {"deleted": 0 if args.dry_run else len(rows), "dry_run": args.dry_run, "sessions": shown}
    emit(args, data, lambda d: "\n".join([head + (":" if rows else "")] + [f"  {_described(r)}" for r in rows]
                                         + (["nothing was changed"] if args.dry_run else [])), rows=shown)


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete a session's whole conversation (every compression part) and its delegates; --dry-run lists them."""
    from hermes_state import SessionBusyError, SessionNotFoundError
    with open_db(args, write=not args.dry_run) as db:
        args.session_id = commands.session_id_of(db, args.session_id)
        plan = db.get_session_delete_plan(args.session_id)  # what the delete itself computes, then carries out
        if not plan.ids:
            raise SessionNotFoundError(f"session {args.session_id!r} not found")
        rows = [r for r in map(db.get_session, plan.ids) if r is not None]
        if args.dry_run:
            if plan.live_tip is not None:
                raise SessionBusyError(f"session {args.session_id!r} is an earlier part of a conversation that "
                                       f"continues in live session {plan.live_tip[1]!r}: delete it by that id, or "
                                       "end it first (a dry run; nothing was changed)")
            refusal = plan.refusal()
            if refusal is not None:  # work still owed: what the deletion itself would answer
                raise refusal
        else:
            # Reported from what is really gone afterwards: the delete plans again in its own transaction.
            around = rows + [r for sid in plan.ids for r in db.get_descendants(sid)]
            db.delete_session(args.session_id)
            rows = list({r["id"]: r for r in around if db.get_session(r["id"]) is None}.values())
    _removal(args, rows, "session")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """Delete ended conversations older than an age (30d, 12h, or days); --dry-run lists what would go."""
    with open_db(args, write=not args.dry_run) as db:
        rows = db.list_prune_candidates(args.older_than, source=args.source)
        if not args.dry_run:
            db.prune_sessions(args.older_than, source=args.source)
            # What went is what was a candidate and is not there now (a conversation owing work stays).
            rows = [r for r in rows if db.get_session(r["id"]) is None]
    _removal(args, rows, "ended session")
    return 0


def _recover_lines(report: Any, source: Path, target: str, restore: str = "") -> str:
    """The recover report for people: the tables copied whole on one line, then only what went wrong.

    `restore`: the command that puts the copy in place, said on the first line.
    """
    whole = [f"{render.safe(name)} {t.copied:,}" for name, t in report.tables.items()
             if not (t.lost or t.lost is None or t.rejected or t.error)]
    lines = [f"recovered {render.safe(source)} into {render.safe(target)}"
             + (f" (`{render.safe(restore)}` puts it in place)" if restore else ""),
             f"  copied whole: {', '.join(whole) if whole else 'no table'}"]
    for name, t in report.tables.items():
        if t.lost or t.lost is None or t.rejected or t.error:
            counted = "an unknown number" if t.source_rows is None else f"{t.source_rows:,}"
            lines.append(f"  {render.safe(name)}: {t.copied:,} of {counted} rows copied")
    if report.placeholder_sessions:
        lines.append("  sessions made again for their surviving messages: "
                     + ", ".join(map(render.safe, report.placeholder_sessions)))
    if report.detached_parents:
        lines.append("  parent link cut (the parent was lost): " + ", ".join(map(render.safe, report.detached_parents)))
    for name, columns in report.dropped_columns.items():
        lines.append(f"  {render.safe(name)}: columns this schema lacks, not copied: {', '.join(columns)}")
    lines.append(f"  integrity: {render.safe(report.integrity)}")
    lines += ["  losses:", *(f"    - {render.safe(loss)}" for loss in report.losses)] if report.losses \
        else ["  losses: none"]
    lines.append(f"  complete: {'yes' if report.complete else 'no'}")
    return "\n".join(lines)


def cmd_recover(args: argparse.Namespace) -> int:
    """Copy what is readable of a (damaged) database into a new file; the source is never written."""
    import hermes_state_recovery as recovery
    source = Path(args.source)
    if not source.is_file():
        raise HermesStateError(f"{source} does not exist or is not a file")
    commands.check_new_file(Path(args.target), "recover")
    target = Path(args.target).expanduser().absolute()
    report = commands.with_progress("recovering", lambda: recovery.recover(source, target),
                                    commands.growing_file(target, source.stat().st_size), unit="bytes")
    restore = f"{commands.command_line(args)} restore {target}"
    emit(args, _plain(report), lambda _: _recover_lines(report, source, args.target, restore))
    if not report.complete:  # `recover a b && mv b a` must not go on after a loss
        print(f"hermes-state: the recovered copy is not complete: {len(report.losses)} {'loss' if len(report.losses) == 1 else 'losses'}, listed above",
              file=sys.stderr)
        return 1
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    """Write a consistent copy of the live database (safe while writers run); into DIR/ it keeps the file's name, as cp does."""
    target = Path(args.target).expanduser()
    if target.is_dir() or args.target.endswith(("/", os.sep)):
        target = target / commands.db_path(args).name
    commands.check_new_file(target, "backup")
    with open_db(args) as db:
        whole = target.expanduser().absolute()
        result = commands.with_progress("backing up", lambda: db.backup(target),
                                        commands.growing_file(whole, db.db_path.stat().st_size), unit="bytes")
    emit(args, {"target": str(result)}, lambda d: f"backed up to {render.safe(d['target'])}")
    return 0


def _moved_aside(path: Path, source: Path) -> Path:
    """Rename a damaged store beside itself, once `source` has proved it can take its place; return the new name."""
    import hermes_state_recovery as recovery
    recovery.check_restorable(source)
    return recovery.move_aside(path)


def _damaged(path: Path) -> bool:
    """Say whether the store cannot be opened, or fails SQLite's quick check (a read of every page)."""
    from hermes_state import SessionDB
    try:
        with SessionDB(path, read_only=True) as db:
            return bool(db.check_integrity()["problems"])
    except StateDbCorruptError:
        return True


def cmd_restore(args: argparse.Namespace) -> int:
    """Replace the database with a validated backup (atomically)."""
    from hermes_state import SessionDB
    path = commands.db_path(args)
    source = Path(args.source)
    if not source.is_file():
        raise HermesStateError(f"{args.source} does not exist or is not a file")
    if path.exists() and source.resolve() == path.resolve():
        raise HermesStateError(f"{args.source} is the database itself; restore from a backup copy of it")
    if commands.file_kind(source) == "export":
        raise HermesStateError(f"{args.source} is an export (JSON), not a database: "
                               f"`{commands.command_line(args)} sessions import {args.source}` loads its sessions")
    # A damaged store (one that does not open, or fails SQLite's quick check) is kept: renamed
    # beside itself, never written over, and only once the source has proved it can take its place.
    moved = _moved_aside(path, source) if path.is_file() and path.stat().st_size and _damaged(path) else None
    with SessionDB(path) as db:
        total = source.stat().st_size  # the pages it copies go through the live file's WAL
        commands.with_progress("restoring", lambda: db.restore(source),
                               commands.files_growing(total, Path(f"{db.db_path}-wal")), unit="bytes")
    data = {"restored": str(path), "source": args.source, **({} if moved is None else {"damaged_moved_to": str(moved)})}
    emit(args, data, lambda d: f"restored {render.safe(d['restored'])} from {render.safe(d['source'])}" + (
        f"; the damaged file it replaced is now {render.safe(d['damaged_moved_to'])}" if moved is not None else ""))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade an existing older database now, writing a consistent copy of it first (unless --no-backup)."""
    from hermes_state import SessionDB
    path = existing_db(args)

    class UpgradeNow(SessionDB):
        upgrade_in_background_bytes = None  # this command is the upgrade: inside the open, however large the file

    def upgrade() -> dict[str, Any]:
        with UpgradeNow(path, backup_before_upgrade=not args.no_backup) as db:
            return {"path": str(path), "schema_version": db.schema_version,
                    "backup": str(db.upgrade_backup) if db.upgrade_backup else None, "mode_changes": db.mode_changes}
    # The copy written first (under a temporary name, then its own), then the upgrade's writes to the WAL.
    size = path.stat().st_size
    watched = [Path(f"{path}-wal")] + ([] if args.no_backup else [path.with_name(f"{path.name}.pre-v*.bak*")])
    data = commands.with_progress("upgrading", upgrade,
                                  commands.files_growing(size * len(watched), *watched), unit="bytes")
    emit(args, data, lambda d: f"{display_hermes_home(d['path'])} is at schema v{d['schema_version']}"
                               + (f"; the file before the upgrade is {d['backup']}" if d["backup"] else "")
                               + "".join(f"\nchanged {c}" for c in d["mode_changes"]))
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    """Give free pages back to the file system (writers wait while it runs)."""
    from hermes_state_recovery import collect_state_db_stats
    with open_db(args, write=True) as db:
        before = db.db_path.stat().st_size
        free = collect_state_db_stats(db.db_path).get("freelist_count")
        # SQLite rewrites into a hidden temporary file, then copies the result back through the WAL:
        # the line moves during the copy back.
        result = commands.with_progress("vacuuming", db.vacuum,
                                        commands.files_growing(before, Path(f"{db.db_path}-wal")), unit="bytes")
        after = db.db_path.stat().st_size
    data = {"bytes_before": before, "bytes_after": after, **(result or {}), "free_pages_before": free}
    emit(args, data, vacuum_summary)
    return 0


def vacuum_summary(d: dict[str, Any]) -> str:
    """What vacuum did, for people: the bytes given back, or why there were none (and why a file grew)."""
    sizes = f"{render.number(d['bytes_before'])} -> {render.number(d['bytes_after'])} bytes"
    change = d["bytes_before"] - d["bytes_after"]
    if change > 0:
        return f"{sizes}: {render.number(change)} bytes given back"
    pages = d.get("free_pages_before")
    none = "no free pages to give back" if pages == 0 else "nothing to give back"
    if change == 0:
        return f"{sizes}: {none}"
    return (f"{sizes}: grew by {render.number(-change)} bytes, with {none}: the first vacuum of a file adds "
            "the page map that lets later deletes give space back without one, and builds any index the "
            "file still lacked")


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the completion script of a shell: commands, options and the store's session ids (a Tab loads nothing heavy)."""
    import hermes_state_complete
    sys.stdout.write(hermes_state_complete.script(args.shell, completion_words()))
    return 0


# --- demo ----------------------------------------------------------------------------

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
    db.update_token_counts("demo_docker", 5200, 830, estimated_cost_usd=0.0281, api_call_count=2)
    kept = db.get_messages_as_conversation("demo_docker")[-2:]
    db.rotate_session("demo_docker", "demo_docker_2", kept, title=db.get_next_title_in_lineage("Fix Docker Build"))
    db.append_message("demo_docker_2", "user", "That worked, thanks! Now the image is 1.2 GB, can we shrink it?")
    db.create_session("demo_tokyo", "telegram", "openai/gpt-5", user_id="tg:1001")
    db.set_session_title("demo_tokyo", "東京旅行の計画")
    db.append_message("demo_tokyo", "user", "来週東京に行きます。おすすめの観光地は？")
    db.append_message("demo_tokyo", "assistant", "浅草寺と上野公園がおすすめです。東京タワーも人気があります。")
    db.update_token_counts("demo_tokyo", 900, 240, estimated_cost_usd=0.0031, api_call_count=1)
    db.create_session("demo_cron", "cron", "openai/gpt-5-mini")
    db.append_message("demo_cron", "user", "Summarise today's error logs (50% disk alert on alice@example.com's host)")


def _demo_home(args: argparse.Namespace) -> str:
    # `demo --keep` keeps its samples where the user's HERMES_HOME (as set when the command
    # started) points, so that the next commands see them; never in a home that holds a store.
    given = args.hermes_home if args.keep else None
    if not given:
        import tempfile  # here: only the demo makes a directory
        return tempfile.mkdtemp(prefix="hermes-demo-")
    home = Path(given).expanduser()
    if (home / "state.db").exists():
        raise HermesStateError(f"HERMES_HOME is {home}, which holds a store already: demo --keep fills only a "
                               "new home (unset HERMES_HOME for a throw-away one)")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(home)


def cmd_demo(args: argparse.Namespace) -> int:
    """Fill a throw-away HERMES_HOME with sample sessions and show what the library holds."""
    from hermes_state import SessionDB
    home = _demo_home(args)
    try:
        with hermes_home_override(home), SessionDB() as db:
            _fill_demo(db)
            print(f"demo database: {display_hermes_home(Path(home) / 'state.db')} (schema v{db.schema_version})\n")
            print("== sessions, most recently active first")
            rows = db.list_sessions(order="activity")
            print(render.table([dict(r, title=render.session_label(r["title"], r["preview"]),
                                     messages=r["message_count"]) for r in rows],
                               ["id", "title", "source", "model", "messages"], numeric={"messages"},
                               max_width=commands.term_width(), keep={"id"}))
            print("\n== lineage of", repr(db.resolve_session_by_title("Fix Docker Build")))
            for row in db.get_lineage("demo_docker_2"):
                print(f"  {row['id']:<15} {row['title']!r:<24} ended: {row['end_reason'] or '-'}")
            print("\n== conversation of demo_docker_2, with its compression ancestors")
            for message in db.get_messages_as_conversation("demo_docker_2", include_ancestors=True):
                text = render.safe(render.content_text(message.get("content")))
                calls = " +tool_calls" if message.get("tool_calls") else ""
                print(f"  {message['role']:<9} {render.truncate(text, 66)}{calls}")
            for query in ("docker image", "東京", "alice@example.com", "50%"):
                print(f"\n== search {query!r}")
                for hit in db.search_messages(query, limit=3):
                    print(f"  {hit['session_id']:<15} {hit['role']:<9} {render.safe(hit['snippet'])}")
        if args.keep:
            print(f"\nkept: explore it with  HERMES_HOME={home} hermes-state sessions list")
    finally:
        if not args.keep:
            import shutil
            shutil.rmtree(home, ignore_errors=True)
    return 0


# --- the commands, each declared once ------------------------------------------------------------

_GLOBALS_HELP = """global options (before or after the command):
  --db PATH            database file (default: <HERMES_HOME>/state.db)
  --profile, -p NAME   a named profile of the current root (HERMES_HOME's, else ~/.hermes)
  --json | --nl | --csv | --tsv
                       machine output: JSON, JSON Lines, CSV, tab-separated (where a command
                       has rows); times in ISO 8601 with their offset
  --epoch              machine output keeps times as stored: epoch seconds
  --color WHEN         auto (a terminal; NO_COLOR turns it off, FORCE_COLOR on), always or never
  --debug              show the traceback of a failure
  --version            print the version and exit"""

QUERY_SYNTAX = """query syntax:
  docker image          both words, anywhere in a message (pieces of words too: ocker)
  "docker image"        the phrase, as whole words ("docker" alone: not dockerfile)
  docker OR podman      either
  docker -rust          docker, and not rust (NOT rust is the same); -"a phrase" leaves out a phrase
  -rust                 the newest messages without rust
  deploy*               words starting with deploy
  chat-send  src/a.py   a term with - . / @ inside is one term
  東京                  CJK of any length
A query starting with - needs no --. The shell removes quotes: give a phrase as '"docker image"'."""


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument of a command: what `add_argument` is given."""
    flags: tuple[str, ...]
    settings: dict[str, Any]


def arg(*flags: str, **settings: Any) -> Arg:
    """Declare an argument as `argparse.ArgumentParser.add_argument(*flags, **settings)` takes it."""
    return Arg(flags, settings)


@dataclasses.dataclass(frozen=True)
class OneOf:
    """Options of which one command line gives one at most."""
    args: tuple[Arg, ...]


class Loaded:
    """A function of a module imported only when it is called, or when its command's help is built.

    serve and passwd load the web server's and the password file's modules (a third of the
    start-up of any other command): their handlers and option types name them this way.
    """

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.__name__ = name  # what argparse names in "invalid <type> value"

    def resolve(self) -> Callable[..., Any]:
        """Import the module; return the function."""
        return getattr(importlib.import_module(self.module), self.__name__)

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)


def _since_until(what: str) -> tuple[Arg, Arg]:
    when = "7d, 12h, 3mo, 1y, today, yesterday, 2026-11-01 or epoch seconds"
    return (arg("--since", type=parse_when, metavar="WHEN",
                help=f"{what} at or after WHEN ({when}; default: from the first)"),
            arg("--until", type=parse_when, metavar="WHEN", help=f"{what} before WHEN (default: up to now)"))


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of `hermes-state`, declared once: its words, handler, options, help and examples.

    The parser, `--help`, the global flags it takes and the shell completion are all made from these.
    """
    name: str  # the words that run it: "doctor", "sessions list"
    handler: Callable[[argparse.Namespace], int]
    help: str  # one line, in the command list
    options: tuple[Arg | OneOf, ...] = ()
    examples: tuple[str, ...] = ()  # two or three, shown by its --help
    formats: tuple[str, ...] = ("json",)  # the machine outputs it gives; any other is refused
    home: str = "store"  # "store": --db or --profile; "profile": --profile alone; "none": a throw-away home
    syntax: str = ""  # more help between the options and the examples
    words_last: bool = False  # a word starting with - is a word of its text, not an option

    @property
    def words(self) -> list[str]:
        """The command's words: ["sessions", "list"], ["doctor"]."""
        return self.name.split()

    @property
    def action(self) -> str:
        """The last word: the name `args.name` carries."""
        return self.words[-1]

    def refused(self, found: dict[str, Any]) -> str | None:
        """Return why the given global flags do not apply to this command, or None when they do."""
        if self.home == "none" and (found.get("db") or found.get("profile")):
            return f"{self.action} works in a throw-away home: --db and --profile do not apply"
        if self.home == "profile" and found.get("db"):
            return (f"{self.action} writes the password file of the Hermes home, not a database: "
                    "--db does not apply")
        for fmt in _FORMATS:
            if found.get(fmt) and fmt not in self.formats:
                return f"--{fmt} does not apply to {self.action}" + (
                    f" (it takes {', '.join('--' + f for f in self.formats)})" if self.formats else "")
        return None

    def add_to(self, sub: Any) -> argparse.ArgumentParser:
        """Add this command's parser, with every option, to the subparsers `sub`."""
        handler = self.handler.resolve() if isinstance(self.handler, Loaded) else self.handler
        parser = sub.add_parser(self.action, help=self.help, description=handler.__doc__,
                                epilog=_epilog(self), formatter_class=_Help)
        parser.set_defaults(func=self.handler, name=self.action, command_spec=self)
        for option in self.options:
            target = parser.add_mutually_exclusive_group() if isinstance(option, OneOf) else parser
            for one in option.args if isinstance(option, OneOf) else (option,):
                target.add_argument(*one.flags, **one.settings)
        return parser


_ID = arg("session_id", help="the session's id, or a unique prefix of it")
_OFFSET = (arg("--offset", type=non_negative, default=0, help="skip this many first (for the next page)"),)
_MODEL = arg("--model", help="only sessions of this model (openai/gpt-5, or gpt-5 after any provider; default: every model)")
_SOURCES = arg("--source", action="append", help="only these sources (repeatable; any case; default: every source)")
_SOURCE = arg("--source", help="only sessions from this source (default: every source)")
_DOCTOR_HELP = "check schema, integrity, indexes, WAL, file modes, locks, replication"

# Every command, in the order `hermes-state` and `hermes-state sessions` list them.
COMMANDS: tuple[Command, ...] = (
    Command("sessions list", commands.cmd_list, "sessions, most recently active first", (
        arg("-n", "--limit", type=non_negative, default=20, help="how many sessions to show; 0 shows all"),
        *_OFFSET,
        arg("--source", help="only sessions from this source (cli, telegram, cron, ...; any case; default: every source)"),
        _MODEL, *_since_until("active"),
        arg("--archived", action="store_true", help="include archived sessions"),
        arg("-c", "--column", action="append", type=commands.list_column, choices=commands.list_column_names(),
            metavar="COLUMN",
            help="show this column (repeatable, in this order; any stored column, e.g. started_at, "
            "input_tokens; 'all' for every one; default: id, title, source, model, messages, active; "
            "applies to --csv, --tsv, --json and --nl too)"),
        arg("--no-headers", action="store_true", help="leave out the header line (table, --csv, --tsv); piped, "
            "the 'N of M sessions' line goes to stderr in any case")),
        ("sessions list --source telegram --since 7d", "sessions list --model gpt-5 --tsv -c id -c input_tokens",
         "sessions list -n 0 --no-headers -c id | xargs -n1 hermes-state sessions show"),
        formats=_FORMATS),
    Command("sessions show", commands.cmd_show, "one session and its transcript", (
        _ID,
        arg("--tail", type=non_negative, metavar="N", help="only the last N messages (0: all; default: all)"),
        arg("--full", action="store_true", help="every message whole, with tool calls and reasoning (Markdown)"),
        arg("--no-pager", action="store_true", help="print straight to the terminal, without $PAGER (less)")),
        ("sessions show demo_t                  # a unique prefix of the id is enough",
         "sessions show demo_docker --tail 10", "sessions show demo_docker --full > docker.md")),
    Command("sessions search", commands.cmd_search, "full-text search (words, CJK, substrings)", (
        arg("query", nargs="+", help="what to look for (see the query syntax below)"),
        arg("-n", "--limit", type=non_negative, default=20, help="how many hits to show; 0 shows all"),
        *_OFFSET, _SOURCES,
        arg("--role", action="append", choices=ROLES, help="only these roles (repeatable; default: every role)"),
        _MODEL, *_since_until("messages written"),
        arg("--reasoning", action="store_true", help="search the models' reasoning too")),
        ("sessions search docker image", "sessions search docker -rust --role user",
         "sessions search 東京 --source telegram --since 30d"),
        formats=_FORMATS, syntax=QUERY_SYNTAX, words_last=True),
    Command("sessions export", cmd_export, "sessions as JSON Lines (one per line)", (
        arg("session_ids", nargs="*", metavar="SESSION_ID", help="these sessions (ids or unique prefixes); "
            "none: every session"),
        _SOURCE,
        arg("-o", "--output", metavar="FILE", help="write to FILE (replaced only once complete; default: stdout)")),
        ("sessions export -o all.jsonl", "sessions export demo_docker demo_tokyo",
         "sessions export --source cli | gzip > cli.jsonl.gz"),
        formats=("json", "nl")),
    Command("sessions import", cmd_import, "sessions from an export file ('-' for stdin)", (
        arg("file", help="an export: JSON Lines, one JSON document or a list ('-': stdin)"),
        arg("--on-conflict", choices=["skip", "replace", "error"], default="skip",
            help="what to do with a session that is already there")),
        ("sessions import all.jsonl", "sessions import all.jsonl --on-conflict replace",
         "gunzip -c cli.jsonl.gz | hermes-state sessions import -")),
    Command("sessions rename", commands.cmd_rename, "set a session's title ('' clears it)", (
        _ID, arg("title", help="the new title; '' clears it")),
        ('sessions rename demo_docker "Docker build, fixed"', 'sessions rename demo_docker ""')),
    Command("sessions delete", cmd_delete, "delete a session and its messages", (
        _ID, arg("--dry-run", action="store_true", help="say what would be deleted; change nothing")),
        ("sessions delete demo_docker_2 --dry-run", "sessions delete demo_docker_2")),
    Command("sessions prune", cmd_prune, "delete ended sessions older than an age", (
        arg("--older-than", type=age, required=True, metavar="AGE", help="30d, 12h, 2w, or a number of days"),
        _SOURCE, arg("--dry-run", action="store_true", help="list what would be deleted; change nothing")),
        ("sessions prune --older-than 90d --dry-run", "sessions prune --older-than 30d --source cron")),
    Command("sessions stats", commands.cmd_stats, "usage and cost per model, largest sessions", (
        arg("--by", choices=["day", "week", "month"], help="one row per period (of the sessions' start) "
            "and model or source, with a bar on a terminal (default: totals per model)"),
        arg("--group", choices=["model", "source"], default="model", help="what the rows are per"),
        _SOURCES, *_since_until("sessions started")),
        ("sessions stats", "sessions stats --by day --since 30d", "sessions stats --by month --group source --json"),
        formats=_FORMATS),
    Command("recover", cmd_recover, "copy what is readable of a damaged database into a new file", (
        arg("source", help="the damaged database (never written)"),
        arg("target", help="the new file to write (must not exist)")),
        ("recover state.db rescued.db && mv rescued.db state.db   # only when nothing was lost",
         "recover state.db rescued.db --json")),
    Command("backup", cmd_backup, "a consistent copy of the live database", (
        arg("target", help="the copy's file name (must not exist)"),),
        ("backup ~/backups/state-$(date +%F).db", "backup ~/backups/          # keeps the name: state.db",
         "--profile coder backup coder.db")),
    Command("restore", cmd_restore, "replace the database with a validated backup", (
        arg("source", help="a backup made by `backup` (or any valid copy)"),),
        ("restore ~/backups/state-2026-11-30.db", "--profile coder restore coder.db")),
    Command("doctor", commands.cmd_doctor, _DOCTOR_HELP, (
        arg("--full", action="store_true", help="the full integrity check (slower) instead of the quick one"),),
        ("doctor", "doctor --full --json"), formats=_FORMATS),
    Command("fts", commands.cmd_fts, "full-text index status or rebuild", (
        arg("action", choices=["status", "rebuild"], help="status: how far indexing is; rebuild: index "
            "everything again (progress on stderr)"),),
        ("fts status", "fts rebuild")),
    Command("init", commands.cmd_init, "create the database, or bring an older one up to date", (
        arg("--force", action="store_true", help="add the store's tables even to another program's database"),),
        ("init", "--profile coder init", "--db other.db init --force")),
    Command("migrate", cmd_migrate, "upgrade an existing older database, copying it first", (
        arg("--no-backup", action="store_true", help="do not write the copy first"),),
        ("migrate", "migrate --no-backup")),
    Command("vacuum", cmd_vacuum, "give free pages back to the file system", (),
            ("vacuum", "--db /path/to/state.db vacuum")),
    Command("demo", cmd_demo, "fill a throw-away home with samples and show them", (
        arg("--keep", action="store_true", help="keep the demo home to explore it afterwards"),),
        ("demo", "demo --keep"), formats=(), home="none"),
    Command("completion", cmd_completion, "print a shell completion script (bash, zsh, fish)", (
        arg("shell", choices=["bash", "zsh", "fish"], help="the shell to complete in"),),
        ('eval "$(hermes-state completion bash)"        # in ~/.bashrc',
         'eval "$(hermes-state completion zsh)"         # in ~/.zshrc',
         "hermes-state completion fish > ~/.config/fish/completions/hermes-state.fish"),
        formats=(), home="none"),
    Command("serve", Loaded("hermes_state_serve", "cmd_serve"), "browse sessions in a web page (Datasette), read-only", (
        arg("--port", type=Loaded("hermes_state_serve", "port_number"), default=8001,
            help="port to listen on; 0 picks a free one"),
        arg("--host", default="127.0.0.1", help="address to listen on (any other than loopback lets other "
            "machines connect, and needs a user made by `passwd`)"),
        arg("--allow-host", action="append", type=Loaded("hermes_state_serve", "host_name"), metavar="NAME",
            help="answer only requests for this host name (repeatable; default: the --host address, "
            "this machine's names for 0.0.0.0, and localhost)"),
        OneOf((arg("--password-file", metavar="PATH", help="check HTTP basic logins against this file "
                   "(default: <HERMES_HOME root>/web-passwords off loopback; none on loopback)"),
               arg("--no-auth", action="store_true", help="serve beyond loopback without a password "
                   "(anyone who can connect reads every conversation)"))),
        arg("--all-profiles", action="store_true", help="serve the default profile and every named "
            "one of the root, each under its own name")),
        ("serve --port 0", "serve --all-profiles",
         "serve --host 0.0.0.0 --allow-host box.lan   # after `hermes-state passwd NAME`"),
        formats=()),
    Command("passwd", Loaded("hermes_state_auth", "cmd_passwd"), "set a password for serve's HTTP basic login", (
        arg("user", metavar="NAME", help="the user's name (1-64 letters, digits, . _ @ -)"),
        arg("--delete", action="store_true", help="remove the user instead"),
        arg("--password-file", metavar="PATH",
            help="the file to write (default: <HERMES_HOME root>/web-passwords, mode 0600)")),
        ("passwd alice", "passwd alice --delete", "passwd alice --password-file /srv/hermes/web-passwords"),
        formats=(), home="profile"),
)
# Two or three examples per command, by its last word (what --help shows under "examples:").
EXAMPLES = {c.action: list(c.examples) for c in COMMANDS}
_GROUPS = {"sessions": "Work with the sessions of the store."}  # the commands of two words, by their first


class _Help(argparse.RawDescriptionHelpFormatter):
    """Help as written (examples keep their lines), with each option's default after its text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        shown = default is not None and default is not False and default != argparse.SUPPRESS
        if action.option_strings and shown and "default" not in text:
            text += f" (default: {default})"
        return text


def _did_you_mean(typed: str, known: Iterable[str]) -> str:
    """Return " (did you mean X?)" for the known word closest to a mistyped one, or "" when none is close."""
    import difflib
    close = difflib.get_close_matches(typed, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line: what is wrong, the nearest right word, and where --help is."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        """Raise UsageError instead of printing the usage lines and exiting."""
        choice = re.match(r"argument (\S+): invalid choice: '?(.*?)'? \(choose from (.*)\)$", message)
        if choice:
            name, typed = choice.group(1), choice.group(2)
            known = [c.strip().strip("'") for c in choice.group(3).split(",")]
            what = ("command" if name in ("COMMAND", "ACTION") else
                    f"value of {name}" if name.startswith("-") else name)
            message = f"unknown {what} {typed!r}{_did_you_mean(typed, known)}"
        raise UsageError(f"{message}; `{self.prog} --help` says more")


def _unrecognized(args: argparse.Namespace, extras: list[str]) -> UsageError:
    """The usage error for words a command does not take, with the nearest option it does take."""
    command: Command | None = getattr(args, "command_spec", None)
    if command is None:
        return UsageError(f"unrecognized arguments: {' '.join(extras)}; `hermes-state --help` says more")
    options = command.add_to(_Parser().add_subparsers())._option_string_actions  # argparse's own table
    typed = extras[0].split("=", 1)[0]
    hint = _did_you_mean(typed, [o for o in options if o.startswith("--")]) if typed.startswith("-") else ""
    return UsageError(f"{command.name} does not take {extras[0]}{hint}; `hermes-state {command.name} --help` "
                      "says what it takes")


def _epilog(command: Command) -> str:
    examples = "\n".join(f"  hermes-state {line}" if not line.startswith(("gunzip", "eval", "hermes-state"))
                         else f"  {line}"
                         for line in command.examples)
    return "\n\n".join(part for part in (command.syntax, f"examples:\n{examples}" if examples else "",
                                         _GLOBALS_HELP) if part)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the argument parser of every command (global flags are taken out before it runs).

    With `only` naming a command (its first word), the others are listed but not built.
    """
    parser = _Parser(prog="hermes-state", description="Browse, search and maintain a hermes-state "
                                     "database.", epilog=_GLOBALS_HELP, formatter_class=_Help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, Any] = {}
    for command in COMMANDS:
        first = command.words[0]
        if len(command.words) == 1:
            if only in (None, first):
                command.add_to(sub)
            else:
                sub.add_parser(first, help=command.help)
            continue
        if first not in groups:
            actions = [c.action for c in COMMANDS if c.words[0] == first]
            group = sub.add_parser(first, help=", ".join(actions), description=_GROUPS[first],
                                   formatter_class=_Help, epilog=_GLOBALS_HELP)
            group.set_defaults(name=first, group_parser=group)
            groups[first] = group.add_subparsers(dest="action", metavar="ACTION") if only in (None, first) else None
        if groups[first] is not None:
            command.add_to(groups[first])
    return parser


def _check_flags(args: argparse.Namespace, found: dict[str, Any]) -> None:
    problem = args.command_spec.refused(found)
    if getattr(args, "no_headers", False) and (found.get("json") or found.get("nl")):
        problem = "--no-headers applies to the table, --csv and --tsv; JSON has no header line"
    if problem:
        raise UsageError(problem)


def completion_words(parser: argparse.ArgumentParser | None = None) -> dict[str, Any]:
    """Return what the completion scripts offer, read from the full parser: each command's words, flags and choices.

    Keys: "globals" (flags of every command), "valued" (global flags taking a value), "commands"
    ({first word: its actions, [] for a command of one word}), "flags" ({command: its options}),
    "choices" ({command, or "command --option": the values offered}) and "ids" (the commands whose
    argument is a session id).
    """
    parser = parser or build_parser()
    words: dict[str, Any] = {"globals": sorted({*_FLAGS, *_VALUED, "--help"}), "valued": sorted(_VALUED),
                             "commands": {}, "flags": {}, "choices": {"--color": list(commands.COLOR_MODES)}, "ids": []}

    def subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]  # argparse's own table
        return dict(found[0].choices) if found else {}

    def read(key: str, p: argparse.ArgumentParser) -> None:
        words["flags"][key] = [s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")]
        for a in p._actions:
            if a.choices is not None and not isinstance(a, argparse._SubParsersAction):
                words["choices"][f"{key} {a.option_strings[-1]}" if a.option_strings else key] = list(a.choices)
            if not a.option_strings and a.dest in ("session_id", "session_ids"):
                words["ids"].append(key)

    for name, p in subcommands(parser).items():
        actions = subcommands(p)
        words["commands"][name] = list(actions)
        if not actions:
            read(name, p)
        for action, q in actions.items():
            read(f"{name} {action}", q)
    return words


def _fit_output() -> None:
    # In an ASCII locale (LC_ALL=POSIX) a stored "東京" or a cut "…" would end the command with
    # UnicodeEncodeError: such characters are written as escapes instead, and cut text ends "...".
    ascii_only = False
    for stream in (sys.stdout, sys.stderr):
        try:
            "…東".encode(getattr(stream, "encoding", None) or "ascii")
        except (UnicodeEncodeError, LookupError):
            ascii_only = ascii_only or stream is sys.stdout
            if isinstance(stream, io.TextIOWrapper):
                stream.reconfigure(errors="backslashreplace")
    render.use_ascii(ascii_only)


def words_last(parser: argparse.ArgumentParser, tail: list[str]) -> list[str]:
    """Put a command's options first and its words after `--`, so that `-rust` is a word, not an option.

    A token is an option when it is one of `parser`'s option strings (`--limit=5`, `-n5` too),
    or starts with `--`; any other token starting with `-` is a word of the query.
    """
    options: list[str] = []
    words: list[str] = []
    known = parser._option_string_actions  # argparse's own table of option strings
    i = 0
    while i < len(tail):
        token = tail[i]
        name = token.split("=", 1)[0]
        action = known.get(name) or (known.get(token[:2]) if token[2:].isdigit() else None)
        if token == "--":
            words += tail[i + 1:]
            break
        if action is not None:
            options.append(token)
            if action.nargs != 0 and token in known and i + 1 < len(tail):
                options.append(tail[i + 1])  # the option's value, whatever it looks like
                i += 1
        elif token.startswith("--"):
            options.append(token)  # argparse says what is wrong with it
        else:
            words.append(token)
        i += 1
    return options + ["--", *words]


def parse_command(words: list[str]) -> argparse.Namespace:
    """Parse a command line without its global flags (a query starting with - included); exit 2 when it is wrong."""
    # Only the command given is built in full (the first word not an option; none: all, for --help).
    parser = build_parser(only=next((w for w in words if not w.startswith("-")), None))
    for command in COMMANDS:
        size = len(command.words)
        if command.words_last and words[:size] == command.words:
            options = command.add_to(_Parser().add_subparsers())
            words = words[:size] + words_last(options, words[size:])
    args, extras = parser.parse_known_args(words)
    if extras:
        raise _unrecognized(args, extras)
    return args


def _parse(argv: list[str]) -> argparse.Namespace | None:
    # The parsed command with the global options set on it, its profile applied; None for --version.
    hermes_home = os.environ.get("HERMES_HOME")  # as the user set it, before a profile is applied
    found, rest = split_globals(argv)
    if found.get("version"):
        import hermes_state
        print(f"hermes-state {hermes_state.__version__}")
        return None
    commands.set_color(found.get("color") or "auto")
    args = parse_command(rest)
    if args.command is None or (args.command == "sessions" and args.action is None):
        # A bare `hermes-state` (or `hermes-state sessions`) lists what there is to run.
        (build_parser() if args.command is None else args.group_parser).print_help()
        raise SystemExit(2)
    if found.get("profile") is not None:
        apply_profile(found["profile"], create=args.name == "init")
    elif found.get("db") is None:
        _apply_profile_override(["hermes-state"])  # the active profile, unless HERMES_HOME chose one
    for key in ("db", "profile", "json", "nl", "csv", "tsv", "epoch", "debug"):
        setattr(args, key, found.get(key))
    args.hermes_home = hermes_home
    _check_flags(args, found)
    return args


def _run(args: argparse.Namespace, debug: bool) -> int:
    try:
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except AmbiguousSessionIdError as exc:  # the command line named no one session: a usage error
        print(f"hermes-state: {render.safe(exc)}", file=sys.stderr)
        return 2
    except StateDbCorruptError as exc:
        if debug:
            traceback.print_exc()
        print(f"hermes-state: {render.safe(exc)}", file=sys.stderr)
        for line in _damaged_store_advice(args, exc):
            if args.name == "recover" and line.startswith("nothing in it can be salvaged"):
                continue  # the error has just said so
            print(f"  {render.safe(line)}", file=sys.stderr)
        return 1
    except (HermesStateError, ValueError, KeyError, OSError, sqlite3.Error, RecursionError) as exc:
        if debug:
            traceback.print_exc()
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError quotes its text
        print(f"hermes-state: {render.safe(message)}", file=sys.stderr)
        return 1


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # a symlink and its target alike
    except OSError:
        return a.absolute() == b.absolute()


def _damaged_store_advice(args: argparse.Namespace, exc: StateDbCorruptError) -> list[str]:
    """Return the steps that can work on the damaged file `exc` names, when it is the store the command chose."""
    damaged = getattr(exc, "path", None)
    try:
        chosen = commands.db_path(args)
    except HermesStateError:
        return []
    if damaged is None or not _same_file(Path(damaged), chosen.expanduser()):
        return []
    import hermes_state_recovery as recovery
    return recovery.damaged_store_advice(damaged, commands.command_line(args))


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    # An ASCII locale decodes a typed "東京" into surrogate escapes; the bytes themselves are UTF-8.
    argv = [os.fsencode(a).decode("utf-8", "surrogateescape") for a in sys.argv[1:]] if argv is None else list(argv)
    _fit_output()
    note_wal_reset_bug(said_elsewhere=True)  # `doctor` reports it; every other command stays quiet about it
    try:
        args = _parse(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    except (UsageError, ValueError, ProfileNotFoundError) as exc:
        print(f"hermes-state: {exc}", file=sys.stderr)
        return 2
    return 0 if args is None else _run(args, "--debug" in argv)


if __name__ == "__main__":
    sys.exit(main())
