"""Export and import of sessions in a versioned, JSON-ready format.

Owns: `export_session`, `export_session_lineage`, `iter_export` (streams one session at a
time), and the import: `import_stream` (any iterable, read once, one transaction), `validate`
(a whole input checked in memory), and `ImportReport`; the export document's
format and version, and checking one document for import: the rows it becomes, or each problem
worded field by field.
Does not own: recovery, backups and restores of whole files (hermes_state_recovery), deleting
sessions, or the write paths agents use (hermes_state_sessions, hermes_state_messages).

An export carries every column as it is stored (JSON columns stay JSON text), every message
generation (the compression archive included) in row order, and the per-model usage rows.
Row ids are local to a file and are not exported; `message_uid` is a message's identity.

Transaction contract: `export_session` runs under the caller's lock (a snapshot read
transaction for a consistent session); `iter_export` takes the facade's read context factory
and opens one short read per page. `import_stream` takes the write context factory and opens
the one write transaction itself. `validate` touches no database.
"""
from __future__ import annotations

import functools
import json
import math
import sqlite3
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, cast

import hermes_state_sessions as sessions
from hermes_state_common import (COUNTERS, DICTIONARY, INT_MAX, INT_MIN, SESSION_OWNED, SESSION_ROW_SQL, Column, Table,
                                 derived_uid, encode_json, is_finite, is_uid, logger, recount_sql, replace_surrogates,
                                 session_dicts, shown)
from hermes_state_lineage import compression_chain_ids
from hermes_state_errors import ImportConflictError, ImportValidationError

# --- the export document: its format and version, and checking one document for import (pure) -----

EXPORT_FORMAT = "hermes-state-export"
EXPORT_VERSION = 1

_SESSIONS, _MESSAGES, _USAGE = DICTIONARY["sessions"], DICTIONARY["messages"], DICTIONARY["session_model_usage"]
SESSION_COLUMNS = _SESSIONS.column_names
MESSAGE_COLUMNS = tuple(c for c in _MESSAGES.column_names if c not in ("id", "session_id"))
USAGE_COLUMNS = tuple(c for c in _USAGE.column_names if c != "session_id")
# Counters an import derives from the rows it writes, whatever the input says.
DERIVED = frozenset(c.column for c in COUNTERS)
# The keys of this library's document that are not session columns.
_DOCUMENT_KEYS = frozenset({"format", "version", "session", "messages", "model_usage"})
_FLAGS = ("active", "compacted", "observed")


@dataclass
class Checked:
    """One document as an import writes it: the session row, its message and usage rows, or its problems.

    `session_id` is the id the document names when it is a string (for the report), even when
    the document has problems. Rows hold every column of their table, in the table's order.
    """

    index: int
    session_id: str | None = None
    session: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[Any, ...]] = field(default_factory=list)
    usage: list[tuple[Any, ...]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ignored: set[str] = field(default_factory=set)  # "table.column" names this schema lacks


def _stored_json(column: Column, value: Any, name: str, problems: list[str]) -> Any:
    if isinstance(value, str):
        if column.rule == "json_text":  # a serialised document: text must already be JSON
            try:
                json.loads(value)
            except (ValueError, RecursionError):
                problems.append(f"{name} must be valid JSON")
                return None
        return replace_surrogates(value)  # JSON text as it was stored
    try:
        return encode_json(value, name)
    except (ValueError, TypeError, RecursionError) as exc:
        problems.append(str(exc))
        return None


def _stored_number(kind: str, value: Any, name: str, problems: list[str]) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return value
        problems.append(f"{name} is outside SQLite's 64-bit integers")
        return None
    if isinstance(value, float) and kind == "REAL":
        if math.isfinite(value):  # NaN would read back NULL, and Infinity is not JSON
            return value
        problems.append(f"{name} must be a finite number")
        return None
    problems.append(f"{name} must be {'an integer' if kind == 'INTEGER' else 'a number'}")
    return None


def _stored(column: Column, value: Any, name: str, problems: list[str]) -> Any:
    """Return `value` as the import stores it in `column`; note a problem (and return None) when it cannot be."""
    if value is None:
        return None
    if column.json or column.rule == "json_text":
        return _stored_json(column, value, name, problems)
    if column.type != "TEXT":
        return _stored_number(column.type, value, name, problems)
    if type(value) is str:
        return value if value.isascii() else replace_surrogates(value)  # as every write stores them
    problems.append(f"{name} must be a string")
    return None


def _columns(table: Table, names: tuple[str, ...]) -> tuple[tuple[str, Column], ...]:
    return tuple((name, table.column(name)) for name in names)


# Each table's imported columns with their declarations, looked up once.
_SESSION_SPEC, _MESSAGE_SPEC = _columns(_SESSIONS, SESSION_COLUMNS), _columns(_MESSAGES, MESSAGE_COLUMNS)
_USAGE_SPEC = _columns(_USAGE, USAGE_COLUMNS)


def _row(given: dict[str, Any], spec: tuple[tuple[str, Column], ...], prefix: str, problems: list[str],
         required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return every column of `spec` as stored: the given value checked, or the column's default.

    A `required` column must be a non-empty string.
    """
    row = {}
    for name, column in spec:
        if name in required:
            value = given.get(name)
            if isinstance(value, str) and value:
                row[name] = replace_surrogates(value)
            else:
                problems.append(f"{prefix}{name} must be a non-empty string")
                row[name] = None
        elif name in given:
            row[name] = _stored(column, given[name], prefix + name, problems)
        else:
            row[name] = column.default
    return row


def _unknown(checked: Checked, table: str, given: dict[str, Any], known: tuple[str, ...],
             skip: frozenset[str] = frozenset()) -> None:
    extra = given.keys() - set(known) - skip
    checked.ignored.update(f"{table}.{c}" for c in extra)


def _session_object(document: dict[str, Any]) -> Any:
    """Return a document's session columns: `session`, or the top level (hermes-agent's own export).

    A document with `session` is read from it alone: the top-level copy this library's export
    writes is there for hermes-agent's readers. A top-level document without `source` or
    `started_at` gets "import" and the time of the import, as hermes-agent's import does.
    """
    if "session" in document:
        return document["session"]
    top = {k: v for k, v in document.items() if k not in _DOCUMENT_KEYS}
    top.setdefault("source", "import")
    top.setdefault("started_at", time.time())
    return top


def _check_header(document: Any, problems: list[str]) -> bool:
    if not isinstance(document, dict):
        problems.append(f"the document must be an object, not {type(document).__name__}")
        return False
    if document.get("format", EXPORT_FORMAT) != EXPORT_FORMAT:
        problems.append(f"format {document.get('format')!r} is not {EXPORT_FORMAT!r}")
    version = document.get("version", EXPORT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= EXPORT_VERSION:
        problems.append(f"export version {version!r} is not one this library reads (1..{EXPORT_VERSION}); "
                        "upgrade hermes-state to import it")
        return False
    return True


def _check_session(given: dict[str, Any], checked: Checked) -> None:
    problems = checked.problems
    sid = given.get("id")
    if isinstance(sid, str) and sid:
        checked.session_id = sid
    elif sid is None:
        problems.append("session id is required")
    else:
        problems.append("session id must be a non-empty string")
    _unknown(checked, "sessions", given, SESSION_COLUMNS)
    started: Any = given.get("started_at")
    rest = {k: v for k, v in given.items() if k not in ("id", "started_at")}
    session = _row(rest, _SESSION_SPEC, "", problems, required=("source",))
    session["id"] = checked.session_id
    if is_finite(started):
        session["started_at"] = float(started)
    else:
        problems.append("started_at must be a finite number of epoch seconds")
    if session["parent_session_id"] == "":
        problems.append("parent_session_id must be a non-empty string or null")
    checked.session = session


def _check_messages(messages: list[Any], checked: Checked, started_at: Any) -> None:
    problems, sid = checked.problems, checked.session_id
    live: set[str] = set()
    default_ts = started_at if is_finite(started_at) else time.time()
    for n, given in enumerate(messages):
        where = f"messages[{n}]"
        if not isinstance(given, dict):
            problems.append(f"{where} must be an object, not {type(given).__name__}")
            continue
        _unknown(checked, "messages", given, MESSAGE_COLUMNS, frozenset({"id", "session_id"}))
        if "session_id" in given and given["session_id"] != sid:
            problems.append(f"{where}.session_id {given['session_id']!r} is not the session it is filed under")
        row = _row(given, _MESSAGE_SPEC, where + ".", problems, required=("role",))
        if row["timestamp"] is None:
            row["timestamp"] = default_ts  # written without one: when the session started
        elif not is_finite(row["timestamp"]):
            problems.append(f"{where}.timestamp must be a finite number of epoch seconds")
        for flag in _FLAGS:
            if row[flag] not in (0, 1, None):  # NULL is kept: older programs wrote it, and it reads as "not live"
                problems.append(f"{where}.{flag} must be 0, 1 or null")
        uid = row["message_uid"]
        if uid is None:
            row["message_uid"] = uuid.uuid4().hex  # hand-written input: issue one, as a fresh insert would
        elif not is_uid(uid):
            problems.append(f"{where}.message_uid must be 32 lowercase hex digits")
        elif row["active"] == 1:
            # Archived generations legitimately repeat a uid (a message kept by two compressions);
            # the live generation names each message once.
            if uid in live:
                problems.append(f"{where}.message_uid {uid} appears twice among the live messages")
            live.add(uid)
        checked.messages.append(tuple(row.values()))


def _check_usage(usage: list[Any], checked: Checked) -> None:
    problems = checked.problems
    pairs: set[tuple[Any, Any]] = set()
    for n, given in enumerate(usage):
        where = f"model_usage[{n}]"
        if not isinstance(given, dict):
            problems.append(f"{where} must be an object, not {type(given).__name__}")
            continue
        _unknown(checked, "session_model_usage", given, USAGE_COLUMNS, frozenset({"session_id"}))
        row = _row(given, _USAGE_SPEC, where + ".", problems, required=("model",))
        pair = (row["model"], row["task"])
        if pair in pairs:
            problems.append(f"{where} repeats the (model, task) pair {pair!r}")
        pairs.add(pair)
        checked.usage.append(tuple(row.values()))


def check_document(index: int, document: Any) -> Checked:
    """Check one export document; return its rows, or (in `problems`) everything wrong with it.

    Linear in the document's size; touches no database. Counters in the input are kept in the
    session row as given; the writer recounts them from the rows it writes.
    """
    checked = Checked(index)
    if not _check_header(document, checked.problems):
        return checked
    given = _session_object(document)
    if not isinstance(given, dict):
        checked.problems.append(f"session must be an object, not {type(given).__name__}")
        return checked
    _check_session(given, checked)
    messages, usage = document.get("messages", []), document.get("model_usage", [])
    for name, value in (("messages", messages), ("model_usage", usage)):
        if not isinstance(value, list):
            checked.problems.append(f"{name} must be a list")
    if isinstance(messages, list):
        _check_messages(messages, checked, checked.session.get("started_at"))
    if isinstance(usage, list):
        _check_usage(usage, checked)
    return checked


ON_CONFLICT = ("skip", "replace", "error")
PAGE_SESSIONS = 100  # sessions whose ids one read of iter_export fetches

# What a replacing import rewrites: the session-owned rows an export carries (children first).
_REPLACED = tuple((t.name, condition) for t in SESSION_OWNED if t.export for condition in t.owned_by("(?)"))


# --- export -------------------------------------------------------------------------------------

def _rows(conn: sqlite3.Connection, sql: str, args: tuple, drop: tuple[str, ...]) -> list[dict[str, Any]]:
    cur = conn.execute(sql, args)
    names = [d[0] for d in cur.description]
    return [{k: v for k, v in zip(names, row) if k not in drop} for row in cur]


def export_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return one session as an export document, or None when it does not exist.

    The session's columns are at the document's top level (hermes-agent's shape) and under
    `session` as well (this library's earlier readers). Run it inside one read transaction so
    the session and its rows come from one snapshot.
    """
    return _document(conn, session_id.encode("utf-8", "surrogatepass"))


def _document(conn: sqlite3.Connection, key: bytes) -> dict[str, Any] | None:
    # `key` is the id's stored bytes, compared as TEXT (the CAST keeps them as they are), so a
    # session whose id another program stored as text that is not UTF-8 is found too; its columns
    # come out decoded as listings show them, id included, and its prompt as either program stored it.
    found = session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.id = CAST(? AS TEXT)",
                                       (key,)))
    if not found:
        return None
    messages = _rows(conn, "SELECT * FROM messages WHERE session_id = CAST(? AS TEXT) ORDER BY id", (key,),
                     ("session_id",))
    for message in messages:
        row_id = message.pop("id")
        if message.get("message_uid") is None:  # written by an older program: the uid its conversation shows
            message["message_uid"] = derived_uid(key, row_id)
    usage = _rows(conn, "SELECT * FROM session_model_usage WHERE session_id = CAST(? AS TEXT) ORDER BY model, task",
                  (key,), ("session_id",))
    return {**found[0], "format": EXPORT_FORMAT, "version": EXPORT_VERSION, "session": dict(found[0]),
            "messages": messages, "model_usage": usage}


def iter_export(read: Callable[..., AbstractContextManager[sqlite3.Connection]], source: str | None = None,
                page: int = PAGE_SESSIONS) -> Iterator[dict[str, Any]]:
    """Yield an export document per session (by id), reading one page of ids at a time.

    Memory stays flat: at most one page of ids and one session are held. Each session is one
    consistent snapshot; sessions written while the export runs may or may not be included,
    and one deleted meanwhile is left out. A session whose stored id is not UTF-8 is exported
    under the id as listings show it (U+FFFD for each bad byte), with a warning naming it.
    """
    after = b""
    while True:
        with read() as conn:
            # The ids' stored bytes: decoded, a bad byte would turn an id into one no row has (the
            # session left out), and into a page boundary that sorts before the id itself.
            keys = [r[0] for r in conn.execute(
                "SELECT CAST(id AS BLOB) FROM sessions WHERE id > CAST(? AS TEXT)"
                + ("" if source is None else " AND source = ?")
                + " ORDER BY id LIMIT ?", (after, page) if source is None else (after, source, page))]
        for key in keys:
            with read(snapshot=True) as conn:
                document = _document(conn, key)
            if document is None:  # deleted meanwhile
                continue
            if document["id"].encode("utf-8", "surrogatepass") != key:
                logger.warning("session %r: its stored id is not UTF-8; exported as %r", key, document["id"])
            yield document
        if len(keys) < page:
            return
        after = keys[-1]


# --- import -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImportReport:
    """What `import_sessions` did: session ids per outcome, how many, message rows written, and any problems.

    `errors` lists every problem found, each as {"index", "session_id" (when known), "error"};
    when it is not empty, `ok` is False and nothing was written (every id list is empty). Each
    `*_count` counts its outcome's sessions; an import asked for `max_ids` lists only the first
    that many ids of each outcome, in input order, so the counts can be larger than the lists.
    """

    imported: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    # Sessions whose parent link was cut: the parent was in neither the input nor the file, or
    # the link would have closed a ring of parents (each ring is cut once, at its first session
    # in input order).
    detached_parents: tuple[str, ...] = ()
    messages: int = 0
    # "table.column" names the input carried that this schema lacks (an older layout's extra
    # columns, say); their values were not imported.
    ignored_columns: tuple[str, ...] = ()
    errors: tuple[dict[str, Any], ...] = ()
    imported_count: int = 0
    replaced_count: int = 0
    skipped_count: int = 0
    detached_count: int = 0

    def __post_init__(self) -> None:
        # A report built from id lists alone counts them: a count is never below its list.
        for name in ("imported", "replaced", "skipped", "detached"):
            ids = getattr(self, "detached_parents" if name == "detached" else name)
            if getattr(self, f"{name}_count") < len(ids):
                object.__setattr__(self, f"{name}_count", len(ids))

    @property
    def ok(self) -> bool:
        """True when the input had no problem (and so was imported)."""
        return not self.errors

    @property
    def problems(self) -> list[str]:
        """Each error as one line of text: which document, which session, what is wrong."""
        return [f"document {e['index']}" + (f" (session {e['session_id']!r})" if "session_id" in e else "")
                + f": {e['error']}" for e in self.errors]

    def __getitem__(self, key: str) -> Any:
        """Read the report as hermes-agent's import result: ok, imported, skipped, detached (counts), ids, errors."""
        written = self.imported + self.replaced
        upstream = {"ok": self.ok, "imported": self.imported_count + self.replaced_count,
                    "skipped": self.skipped_count, "detached": self.detached_count, "imported_ids": list(written),
                    "skipped_ids": list(self.skipped), "errors": [dict(e) for e in self.errors]}
        if key not in upstream:
            raise KeyError(key)
        return upstream[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Return `self[key]`, or `default` for a key hermes-agent's result does not have."""
        try:
            return self[key]
        except KeyError:
            return default


class _Stopped(Exception):
    """Raised inside the write transaction at the first problem, so that it rolls back."""


@dataclass
class _Ids:
    """One outcome's session ids: every one, or only the first `kept`, and how many there were."""

    kept: int | None = None
    ids: list[str] = field(default_factory=list)
    count: int = 0

    def append(self, session_id: str) -> None:
        """Count a session; keep its id while fewer than `kept` are kept."""
        self.count += 1
        if self.kept is None or len(self.ids) < self.kept:
            self.ids.append(session_id)

    def extend(self, session_ids: Iterable[str]) -> None:
        """Count each session of `session_ids` (read once)."""
        for session_id in session_ids:
            self.append(session_id)


@dataclass
class _Import:
    """The running state of one import: outcomes so far and every problem found.

    With `max_ids`, each outcome keeps only its first ids and a count, so that a large import's
    memory does not grow with the number of sessions.
    """

    on_conflict: str
    max_ids: int | None = None
    imported: _Ids = field(init=False)
    replaced: _Ids = field(init=False)
    skipped: _Ids = field(init=False)
    detached: _Ids = field(init=False)
    messages: int = 0
    pending: list[tuple[Any, ...]] = field(default_factory=list)  # message rows not written yet
    ignored: set[str] = field(default_factory=set)
    errors: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.imported, self.replaced, self.skipped, self.detached = (_Ids(self.max_ids) for _ in range(4))

    def fail(self, index: int, session_id: str | None, problems: Iterable[str]) -> None:
        """Note problems of document `index`."""
        for problem in problems:
            entry: dict[str, Any] = {"index": index}
            if session_id is not None:
                entry["session_id"] = session_id
            entry["error"] = problem
            self.errors.append(entry)

    def report(self) -> ImportReport:
        """Return the report; with errors, nothing was written and no id is listed."""
        if self.errors:
            return ImportReport(errors=tuple(self.errors))
        return ImportReport(tuple(self.imported.ids), tuple(self.replaced.ids), tuple(self.skipped.ids),
                            tuple(self.detached.ids), self.messages, tuple(sorted(self.ignored)),
                            imported_count=self.imported.count, replaced_count=self.replaced.count,
                            skipped_count=self.skipped.count, detached_count=self.detached.count)


@dataclass
class _Plan:
    """A whole input checked in memory by `validate`: one Checked per document, in input order."""

    checked: list[Checked] = field(default_factory=list)

    @property
    def sessions(self) -> list[dict[str, Any]]:
        """The session rows, in input order."""
        return [c.session for c in self.checked]


def check_on_conflict(on_conflict: Any) -> str:
    """Return `on_conflict` when it is one of ON_CONFLICT, else raise ValueError."""
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {shown(on_conflict)}")
    return on_conflict


def _numbered(data: Any, state: _Import) -> Iterator[tuple[int, Any]]:
    """Yield (index, document) from `data`, read once; a ValueError from the input ends it as a problem."""
    if isinstance(data, dict):
        yield 0, data
        return
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ImportValidationError(["the input must be an export document or an iterable of them"])
    source = iter(data)
    index = 0
    while True:
        try:
            document = next(source)
        except StopIteration:
            return
        except ValueError as exc:  # a reader that parses a file as it goes: the rest cannot be read
            state.fail(index, None, [f"the input could not be read: {exc}"])
            return
        yield index, document
        index += 1


# The import's own bookkeeping, in the connection's temporary database (never in the file):
# one row per document, so the input is never held in memory, and the last steps are SQL.
_SCRATCH = "temp.hermes_import"
_SCRATCH_SQL = (f"DROP TABLE IF EXISTS {_SCRATCH}",
                f"CREATE TABLE {_SCRATCH} (id TEXT PRIMARY KEY, idx INTEGER NOT NULL, parent TEXT, title TEXT, "
                "written INTEGER NOT NULL)",
                f"CREATE INDEX {_SCRATCH}_title ON hermes_import (title)")
_RECOUNT_SQL = recount_sql() + f" WHERE id IN (SELECT id FROM {_SCRATCH} WHERE written)"
_ROW_COLUMNS = tuple(c for c in SESSION_COLUMNS if c not in DERIVED)
_INSERT_SESSION = f"INSERT INTO sessions ({', '.join(_ROW_COLUMNS)}) VALUES ({', '.join('?' * len(_ROW_COLUMNS))})"
_UPDATE_SESSION = f"UPDATE sessions SET {', '.join(f'{c} = ?' for c in _ROW_COLUMNS if c != 'id')} WHERE id = ?"
_MESSAGE_ROW = f"({', '.join('?' * (len(MESSAGE_COLUMNS) + 1))})"
# Messages go in several rows per INSERT: the full-text indexes flush their pending terms at the
# end of every statement, so one statement per row would write one index segment per message.
# A few fixed batch sizes keep the prepared statements few (each size is one cached statement).
_MESSAGE_BATCHES = (64, 16, 4, 1)


@functools.lru_cache(maxsize=None)
def _insert_messages(rows: int) -> str:
    return f"INSERT INTO messages (session_id, {', '.join(MESSAGE_COLUMNS)}) VALUES " + ", ".join([_MESSAGE_ROW] * rows)


def _write_messages(conn: sqlite3.Connection, pending: list[tuple[Any, ...]], final: bool = False) -> None:
    # Rows wait here (each with its session id first) across sessions, so that sessions of one
    # message still go in batches: only full batches are written until the end (`final`).
    start = 0
    for size in _MESSAGE_BATCHES if final else _MESSAGE_BATCHES[:1]:
        while len(pending) - start >= size:
            conn.execute(_insert_messages(size), [v for row in pending[start:start + size] for v in row])
            start += size
    del pending[:start]


_INSERT_USAGE = (f"INSERT INTO session_model_usage (session_id, {', '.join(USAGE_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * (len(USAGE_COLUMNS) + 1))})")
# Titles are set last, so titles swapped between replaced sessions never meet on the unique index.
_TITLE_REPEATED = (f"SELECT t.idx, t.id, t.title FROM {_SCRATCH} t WHERE t.title IS NOT NULL AND EXISTS "
                   f"(SELECT 1 FROM {_SCRATCH} u WHERE u.title = t.title AND u.idx < t.idx) ORDER BY t.idx")
_TITLE_TAKEN = (f"SELECT t.idx, t.id, t.title, s.id FROM {_SCRATCH} t JOIN sessions s ON s.title = t.title "
                "WHERE t.written ORDER BY t.idx")
_PARENT_MISSING = (f"SELECT id FROM {_SCRATCH} t WHERE written AND parent IS NOT NULL "
                   "AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = t.parent) ORDER BY idx")
_SET_PARENTS_AND_TITLES = (
    f"UPDATE sessions SET title = t.title, parent_session_id = CASE WHEN EXISTS "
    f"(SELECT 1 FROM sessions p WHERE p.id = t.parent) THEN t.parent END FROM {_SCRATCH} t "
    "WHERE t.written AND sessions.id = t.id AND (t.title IS NOT NULL OR t.parent IS NOT NULL)")
# Imported sessions no walk from a root reaches: each is on a ring of parents or below one.
WALK_AT_MOST = 1000  # imported sessions with parents walked up directly, without narrowing first
_UNROOTED = (
    "WITH RECURSIVE reach(id) AS (SELECT id FROM sessions WHERE parent_session_id IS NULL "
    "OR NOT EXISTS (SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id) "
    "UNION SELECT s.id FROM sessions s JOIN reach r ON s.parent_session_id = r.id) "
    f"SELECT t.id FROM {_SCRATCH} t WHERE t.written AND t.parent IS NOT NULL "
    "AND t.id NOT IN (SELECT id FROM reach) ORDER BY t.idx")


def _write_one(conn: sqlite3.Connection, checked: Checked, state: _Import) -> None:
    sid, session = cast(str, checked.session_id), checked.session  # a checked document without problems has one
    exists = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    if exists and state.on_conflict == "error":
        raise ImportConflictError(f"session {sid!r} already exists (document {checked.index}); nothing was "
                                  "imported. Import with on_conflict='skip' or 'replace' to go on.")
    written = not exists or state.on_conflict == "replace"
    if not conn.execute(f"INSERT OR IGNORE INTO {_SCRATCH} VALUES (?, ?, ?, ?, ?)",
                        (sid, checked.index, session["parent_session_id"], session["title"], written)).rowcount:
        state.fail(checked.index, sid, ["the session appears more than once in the input"])
        raise _Stopped
    state.ignored |= checked.ignored
    if not written:
        state.skipped.append(sid)
        return
    # Parent and title are set once every document is in (see _finish).
    row = dict(session, parent_session_id=None, title=None)
    _file_imported_prompt(conn, row)
    if exists:
        for table, owned in _REPLACED:
            conn.execute(f"DELETE FROM {table} WHERE {owned}", (sid,))
        before = conn.execute("SELECT system_prompt_hash FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
        conn.execute(_UPDATE_SESSION, (*(row[c] for c in _ROW_COLUMNS if c != "id"), sid))
        sessions.forget_prompts(conn, [before])
        state.replaced.append(sid)
    else:
        conn.execute(_INSERT_SESSION, tuple(row[c] for c in _ROW_COLUMNS))
        state.imported.append(sid)
    state.pending.extend((sid, *row) for row in checked.messages)
    _write_messages(conn, state.pending)
    conn.executemany(_INSERT_USAGE, ((sid, *u) for u in checked.usage))
    state.messages += len(checked.messages)


def _file_imported_prompt(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    # A document carries the prompt as text (an export reads it through its hash): it is filed
    # under its hash as any prompt written here is. A hash without its text names a prompt only
    # when this file already holds it; otherwise it is dropped rather than left dangling.
    if row.get("system_prompt") is not None:
        sessions.file_prompt(conn, row)
    elif row.get("system_prompt_hash") is not None and conn.execute(
            "SELECT 1 FROM system_prompts WHERE hash = ?", (row["system_prompt_hash"],)).fetchone() is None:
        row["system_prompt_hash"] = None


def _parent(conn: sqlite3.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def _break_rings(conn: sqlite3.Connection, candidates: list[str], state: _Import) -> None:
    # In input order, a session whose parents lead back to itself loses its parent. Linear: a
    # walk stops at a session an earlier walk settled (it reaches a root, or only sits below a
    # ring), and cutting a link never makes a settled session unsettled.
    settled: set[str] = set()
    for sid in candidates:
        if sid in settled:
            continue
        path, on_path = [sid], {sid}
        node = _parent(conn, sid)
        while node is not None and node not in settled and node not in on_path:
            path.append(node)
            on_path.add(node)
            node = _parent(conn, node)
        if node == sid:
            conn.execute("UPDATE sessions SET parent_session_id = NULL WHERE id = ?", (sid,))
            state.detached.append(sid)
            settled.update(path)
        elif node is None or node in settled:
            settled.update(path)
        else:  # a ring above that does not pass through sid: only the way up to it is settled
            settled.update(path[:path.index(node)])


def _finish(conn: sqlite3.Connection, state: _Import) -> None:
    for index, sid, title in conn.execute(_TITLE_REPEATED).fetchall():
        state.fail(index, sid, [f"title {title!r} is used by an earlier session of the input"])
    for index, sid, title, holder in conn.execute(_TITLE_TAKEN).fetchall():
        state.fail(index, sid, [f"title {title!r} is already in use by session {holder!r}"])
    if state.errors:
        raise _Stopped
    _write_messages(conn, state.pending, final=True)
    conn.execute(_RECOUNT_SQL)  # the counters the write path keeps, from the rows written
    state.detached.extend(r[0] for r in conn.execute(_PARENT_MISSING))
    conn.execute(_SET_PARENTS_AND_TITLES)
    # A few sessions with parents are walked up one by one; many are first narrowed down by one
    # walk down from every root of the file, which costs the file's size rather than the input's.
    linked = [r[0] for r in conn.execute(f"SELECT id FROM {_SCRATCH} WHERE written AND parent IS NOT NULL "
                                         f"ORDER BY idx LIMIT {WALK_AT_MOST + 1}")]
    if len(linked) > WALK_AT_MOST:
        linked = [r[0] for r in conn.execute(_UNROOTED)]
    _break_rings(conn, linked, state)
    conn.execute(f"DROP TABLE {_SCRATCH}")


def write_checked(conn: sqlite3.Connection, checked: Iterable[Checked], state: _Import) -> None:
    """Write checked documents inside the caller's write transaction; raise _Stopped at the first problem.

    Nothing is committed here: on _Stopped (or any error) the caller's transaction must roll back.
    """
    for statement in _SCRATCH_SQL:
        conn.execute(statement)
    for document in checked:
        if document.problems:
            state.fail(document.index, document.session_id, document.problems)
            raise _Stopped
        _write_one(conn, document, state)
    if state.errors:  # the input could not be read to its end
        raise _Stopped
    _finish(conn, state)


def import_stream(write: Callable[[], AbstractContextManager[sqlite3.Connection]], data: Any,
                  on_conflict: str = "skip", strict: bool = False, max_ids: int | None = None) -> ImportReport:
    """Import export documents from any iterable, read once, in one write transaction; see `ImportReport`.

    Opens the transaction itself (`write()` gives it). Each document is checked and then
    written at once, so memory holds one document at a time. At the first problem the
    transaction rolls back, letting go of the write lock, and the rest of the input is still
    checked document by document, so the report names every malformed document; nothing is
    written. With `strict`, a report with problems is raised as ImportValidationError instead.
    `on_conflict` decides what happens to a session id the file already has: "skip" leaves it,
    "replace" rewrites its row, messages and usage in place (its children and ledger rows stay
    attached), "error" raises ImportConflictError. Ids and uids are kept; parents are restored
    whatever the input order; a parent found in neither the input nor the file becomes NULL, and
    a ring of parents is cut at its first session. Message counters are recomputed. With
    `max_ids`, the report lists at most that many ids per outcome (it still counts them all).
    """
    check_on_conflict(on_conflict)
    if max_ids is not None and (not isinstance(max_ids, int) or isinstance(max_ids, bool) or max_ids < 0):
        raise ValueError(f"max_ids must be None or a count of ids (0 or more), not {shown(max_ids)}")
    state = _Import(on_conflict, max_ids)
    documents = _numbered(data, state)
    try:
        with write() as conn:
            write_checked(conn, (check_document(index, document) for index, document in documents), state)
    except _Stopped:
        for index, document in documents:  # without the lock: the rest, one document at a time
            checked = check_document(index, document)
            state.fail(index, checked.session_id, checked.problems)
    report = state.report()
    if strict and not report.ok:
        raise ImportValidationError(report.problems, errors=report.errors)
    return report


def validate(data: Any) -> _Plan:
    """Check a whole input in memory without touching any database; raise ImportValidationError listing every problem.

    Besides each document, it checks what documents say about each other: repeated session ids
    and repeated titles. Rings of parents are not problems: the import cuts them.
    """
    state = _Import("skip")
    plan = _Plan()
    ids: set[str] = set()
    titles: set[str] = set()
    for index, document in _numbered(data, state):
        checked = check_document(index, document)
        problems = list(checked.problems)
        sid, title = checked.session_id, checked.session.get("title")
        if sid is not None and sid in ids:
            problems.append("the session appears more than once in the input")
        if isinstance(title, str) and title in titles:
            problems.append(f"title {title!r} is used by an earlier session of the input")
        ids.add(sid) if sid is not None else None
        titles.add(title) if isinstance(title, str) else None
        state.fail(index, sid, problems)
        plan.checked.append(checked)
    if state.errors:
        raise ImportValidationError(state.report().problems, errors=tuple(state.errors))
    return plan


def export_session_lineage(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return a compression chain as one document (hermes-agent's lineage export), or None when unknown.

    The newest part's columns, `lineage_session_ids` (oldest first), `segments` (each part's
    id, start, end, end reason and message count) and `messages`: every part's rows in chain
    order, each with its `session_id`. Run it in one read snapshot.
    """
    ids = compression_chain_ids(conn, session_id)
    if not ids:
        return None
    documents = [export_session(conn, sid) for sid in ids]
    parts = [d for d in documents if d is not None]
    tip = dict(parts[-1]["session"])
    tip.update(lineage_session_ids=[d["session"]["id"] for d in parts],
               segments=[{k: d["session"][k] for k in ("id", "started_at", "ended_at", "end_reason", "message_count")}
                         for d in parts],
               messages=[{"session_id": d["session"]["id"], **m} for d in parts for m in d["messages"]])
    return tip
