"""Export and import of sessions in a versioned, JSON-ready format.

Owns: the export document (`EXPORT_FORMAT`, `EXPORT_VERSION`), `export_session`, `export_session_lineage`, `iter_export`
(streams one session at a time), and `import_sessions` with its validation and `ImportReport`.
Does not own: recovery, backups and restores of whole files (hermes_state_recovery), deleting
sessions, or the write paths agents use (hermes_state_sessions, hermes_state_messages).

An export carries every column as it is stored (JSON columns stay JSON text), every message
generation (the compression archive included) in row order, and the per-model usage rows.
Row ids are local to a file and are not exported; `message_uid` is a message's identity.

Transaction contract: `export_session` runs under the caller's lock (a snapshot read
transaction for a consistent session). `validate` touches no database and needs no lock, in
linear time; `import_validated` (and `import_sessions`, which validates first) runs inside the
caller's one write transaction, checks what depends on the file, then writes.
`iter_export` takes the facade's read context factory and opens one short read per page.
"""
from __future__ import annotations

import sqlite3
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from hermes_state_common import (COUNTERS, DICTIONARY, SESSION_OWNED, Column, Table, check_stored, is_finite, is_uid,
                                 recount_sql, shown)
from hermes_state_conversation import derived_uid
from hermes_state_lineage import compression_chain_ids
from hermes_state_errors import ImportConflictError, ImportValidationError, TitleConflictError

EXPORT_FORMAT = "hermes-state-export"
EXPORT_VERSION = 1
ON_CONFLICT = ("skip", "replace", "error")
PAGE_SESSIONS = 100  # sessions whose ids one read of iter_export fetches

_SESSIONS, _MESSAGES, _USAGE = DICTIONARY["sessions"], DICTIONARY["messages"], DICTIONARY["session_model_usage"]
_SESSION_COLUMNS = _SESSIONS.column_names
_MESSAGE_COLUMNS = tuple(c for c in _MESSAGES.column_names if c not in ("id", "session_id"))
_USAGE_COLUMNS = tuple(c for c in _USAGE.column_names if c != "session_id")
# Counters the import derives from the rows it writes, whatever the input says.
_COUNTERS = frozenset(c.column for c in COUNTERS)
# What a replacing import rewrites: the session-owned rows an export carries (children first).
_REPLACED = tuple((t.name, condition) for t in SESSION_OWNED if t.export for condition in t.owned_by("(?)"))
_RECOUNT_SQL = recount_sql() + " WHERE id = ?"


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
    found = _rows(conn, "SELECT * FROM sessions WHERE id = ?", (session_id,), ())
    if not found:
        return None
    messages = _rows(conn, "SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,), ("session_id",))
    for message in messages:
        row_id = message.pop("id")
        if message.get("message_uid") is None:  # written by an older program: the uid its conversation shows
            message["message_uid"] = derived_uid(session_id, row_id)
    usage = _rows(conn, "SELECT * FROM session_model_usage WHERE session_id = ? ORDER BY model, task",
                  (session_id,), ("session_id",))
    return {**found[0], "format": EXPORT_FORMAT, "version": EXPORT_VERSION, "session": dict(found[0]),
            "messages": messages, "model_usage": usage}


def iter_export(read: Callable[..., AbstractContextManager[sqlite3.Connection]], source: str | None = None,
                page: int = PAGE_SESSIONS) -> Iterator[dict[str, Any]]:
    """Yield an export document per session (by id), reading one page of ids at a time.

    Memory stays flat: at most one page of ids and one session are held. Each session is one
    consistent snapshot; sessions written while the export runs may or may not be included,
    and one deleted meanwhile is left out.
    """
    after = ""
    while True:
        with read() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM sessions WHERE id > ?" + ("" if source is None else " AND source = ?")
                + " ORDER BY id LIMIT ?", (after, page) if source is None else (after, source, page))]
        for session_id in ids:
            with read(snapshot=True) as conn:
                document = export_session(conn, session_id)
            if document is not None:  # deleted meanwhile
                yield document
        if len(ids) < page:
            return
        after = ids[-1]


# --- import: validation -------------------------------------------------------------------------

@dataclass(frozen=True)
class ImportReport:
    """What `import_sessions` did: session ids per outcome and how many message rows it wrote."""

    imported: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    detached_parents: tuple[str, ...] = ()  # sessions whose parent was in neither the input nor the file
    messages: int = 0
    # "table.column" names the input carried that this schema lacks (an older layout's extra
    # columns, say); their values were not imported.
    ignored_columns: tuple[str, ...] = ()

    def __getitem__(self, key: str) -> Any:
        """Read the report as hermes-agent's import result: ok, imported, skipped, detached (counts) and ids."""
        written = self.imported + self.replaced
        upstream = {"ok": True, "imported": len(written), "skipped": len(self.skipped),
                    "detached": len(self.detached_parents), "imported_ids": list(written),
                    "skipped_ids": list(self.skipped), "errors": []}
        if key not in upstream:
            raise KeyError(key)
        return upstream[key]

    def get(self, key: str, default: Any = None) -> Any:
        """Return `self[key]`, or `default` for a key hermes-agent's result does not have."""
        try:
            return self[key]
        except KeyError:
            return default


@dataclass
class _Plan:
    sessions: list[dict[str, Any]] = field(default_factory=list)
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    usage: list[list[dict[str, Any]]] = field(default_factory=list)
    ignored: set[str] = field(default_factory=set)


def _documents(data: Any) -> list[Any]:
    if isinstance(data, dict):
        return [data]
    if isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
        raise ImportValidationError(["the input must be an export document or a list of them"])
    return list(data)


def _value(where: str, column: Column, value: Any, problems: list[str]) -> Any:
    """Check that `value` fits its column and SQLite stores it faithfully; return it (JSON encoded if needed)."""
    try:
        return check_stored(column, value)
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
        return None


def _columns(where: str, given: Any, known: tuple[str, ...], table: Table, problems: list[str]) -> dict[str, Any]:
    if not isinstance(given, dict):
        problems.append(f"{where} must be an object, not {type(given).__name__}")
        return {}
    columns = {c: table.column(c) for c in known}
    return {c: _value(where, columns[c], given[c], problems) if c in given else columns[c].default for c in known}


def _text_required(where: str, row: dict[str, Any], name: str, problems: list[str]) -> None:
    if not isinstance(row.get(name), str) or not row[name]:
        problems.append(f"{where}: {name} must be a non-empty string")


def _number_required(where: str, row: dict[str, Any], name: str, problems: list[str]) -> None:
    value = row.get(name)
    if not is_finite(value):
        problems.append(f"{where}: {name} must be a finite number of epoch seconds")


def _check_message(where: str, session_id: Any, given: Any, problems: list[str]) -> dict[str, Any]:
    row = _columns(where, given, _MESSAGE_COLUMNS, _MESSAGES, problems)
    if not row:
        return row
    if given.get("session_id", session_id) != session_id:
        problems.append(f"{where}: session_id {given['session_id']!r} is not the session it is filed under")
    _text_required(where, row, "role", problems)
    _number_required(where, row, "timestamp", problems)
    for flag in ("active", "compacted", "observed"):
        if row[flag] not in (0, 1, None):  # NULL is kept: older programs wrote it, and it reads as "not live"
            problems.append(f"{where}: {flag} must be 0, 1 or null")
    uid = row["message_uid"]
    if uid is None:
        row["message_uid"] = uuid.uuid4().hex  # hand-written input: issue one, as a fresh insert would
    elif not is_uid(uid):
        problems.append(f"{where}: message_uid must be 32 lowercase hex digits")
    return row


def _note_unknown(plan: _Plan, table: str, given: Any, known: tuple[str, ...], ignored: frozenset[str]) -> None:
    if isinstance(given, dict):
        plan.ignored.update(f"{table}.{c}" for c in set(given) - set(known) - ignored)


_DOCUMENT_KEYS = frozenset({"format", "version", "session", "messages", "model_usage"})


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


def _check_document(index: int, document: Any, plan: _Plan, problems: list[str]) -> None:
    where = f"document {index}"
    if not isinstance(document, dict):
        problems.append(f"{where} must be an object, not {type(document).__name__}")
        return
    if document.get("format", EXPORT_FORMAT) != EXPORT_FORMAT:
        problems.append(f"{where}: format {document.get('format')!r} is not {EXPORT_FORMAT!r}")
    version = document.get("version", EXPORT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= EXPORT_VERSION:
        problems.append(f"{where}: export version {version!r} is not one this library reads "
                        f"(1..{EXPORT_VERSION}); upgrade hermes-state to import it")
        return
    given = _session_object(document)
    _note_unknown(plan, "sessions", given, _SESSION_COLUMNS, frozenset())
    session = _columns(f"{where} session", given, _SESSION_COLUMNS, _SESSIONS, problems)
    if not session:
        return
    sid = session["id"]
    where = f"session {sid!r}" if isinstance(sid, str) and sid else where
    _text_required(where, session, "id", problems)
    _text_required(where, session, "source", problems)
    _number_required(where, session, "started_at", problems)
    parent = session["parent_session_id"]
    if parent is not None and (not isinstance(parent, str) or not parent):
        problems.append(f"{where}: parent_session_id must be a non-empty string or null")
    title = session["title"]
    if title is not None and not isinstance(title, str):
        problems.append(f"{where}: title must be a string or null")
    messages = document.get("messages", [])
    usage = document.get("model_usage", [])
    if not isinstance(messages, list) or not isinstance(usage, list):
        problems.append(f"{where}: messages and model_usage must be lists")
        return
    plan.sessions.append(session)
    plan.messages.append([_check_message(f"{where} message {n}", sid, m, problems) for n, m in enumerate(messages)])
    for m in messages:
        _note_unknown(plan, "messages", m, _MESSAGE_COLUMNS, frozenset({"id", "session_id"}))
    usage_rows = []
    for n, given in enumerate(usage):
        _note_unknown(plan, "session_model_usage", given, _USAGE_COLUMNS, frozenset({"session_id"}))
        row = _columns(f"{where} model_usage {n}", given, _USAGE_COLUMNS, _USAGE, problems)
        if row:
            _text_required(f"{where} model_usage {n}", row, "model", problems)
            usage_rows.append(row)
    plan.usage.append(usage_rows)


def _check_graph(plan: _Plan, problems: list[str]) -> None:
    ids = [s["id"] for s in plan.sessions]
    seen: set[str] = set()
    for sid in ids:
        if sid in seen:
            problems.append(f"session {sid!r} appears more than once in the input")
        seen.add(sid)
    parents = {s["id"]: s["parent_session_id"] for s in plan.sessions}
    cycle = find_cycle(parents, parents.get, parents)  # a parent outside the input ends the walk
    if cycle is not None:
        problems.append(f"session {cycle!r} is its own ancestor through parent_session_id")
    titles: dict[str, str] = {}
    for session in plan.sessions:
        title = session["title"]
        if title is not None and title in titles:
            problems.append(f"sessions {titles[title]!r} and {session['id']!r} carry the same title {title!r}")
        elif title is not None:
            titles[title] = session["id"]
    for session, usage in zip(plan.sessions, plan.usage):
        keys = [(u["model"], u["task"]) for u in usage]
        if len(keys) != len(set(keys)):
            problems.append(f"session {session['id']!r}: model_usage repeats a (model, task) pair")
    for session, messages in zip(plan.sessions, plan.messages):
        # Archived generations legitimately repeat a uid (a message kept by two compressions);
        # the live generation names each message once.
        live = [m.get("message_uid") for m in messages if m.get("active") == 1]
        if len(live) != len(set(live)):
            problems.append(f"session {session['id']!r}: a message_uid appears twice among the live rows")


def find_cycle(starts: Iterable[str], parent_of: Callable[[str], str | None], mine: Any) -> str | None:
    """Return a session of `mine` that is its own ancestor when following `parent_of` from `starts`, else None.

    Linear: each session is looked at once however long the chains are (a walk stops where an
    earlier one ended). `parent_of` gives a session's parent id or None; a cycle made only of
    sessions outside `mine` (bad data already in a file) is not reported.
    """
    done: set[str] = set()
    for start in starts:
        path: dict[str, None] = {}  # the current walk, in order
        node: str | None = start
        while node is not None and node not in done and node not in path:
            path[node] = None
            node = parent_of(node)
        if node is not None and node in path:
            ring = list(path)[list(path).index(node):]
            found = next((n for n in ring if n in mine), None)
            if found is not None:
                return found
        done.update(path)
    return None


def validate(data: Any) -> _Plan:
    """Check a whole input without touching any database; raise ImportValidationError listing every problem."""
    problems: list[str] = []
    plan = _Plan()
    for index, document in enumerate(_documents(data)):
        _check_document(index, document, plan, problems)
    if not problems:
        _check_graph(plan, problems)
    if problems:
        raise ImportValidationError(problems)
    return plan


# --- import: writing ----------------------------------------------------------------------------

def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                 tuple(row.values()))


def import_sessions(conn: sqlite3.Connection, data: Any, on_conflict: str = "skip") -> ImportReport:
    """Import export documents; validate everything first, then write in the caller's transaction.

    `on_conflict` decides what happens to a session id the file already has: "skip" leaves it,
    "replace" rewrites its row, messages and usage in place (its children and ledger rows stay
    attached), "error" raises ImportConflictError. Ids and uids are kept; parents are restored
    whatever the input order, and a parent found in neither the input nor the file becomes NULL.
    Message counters are recomputed from the rows written.
    """
    check_on_conflict(on_conflict)
    return import_validated(conn, validate(data), on_conflict)


def check_on_conflict(on_conflict: Any) -> str:
    """Return `on_conflict` when it is one of ON_CONFLICT, else raise ValueError."""
    if not isinstance(on_conflict, str) or on_conflict not in ON_CONFLICT:
        raise ValueError(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {shown(on_conflict)}")
    return on_conflict


def _file_parent(conn: sqlite3.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT parent_session_id FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def import_validated(conn: sqlite3.Connection, plan: _Plan, on_conflict: str = "skip") -> ImportReport:
    """Write a plan `validate` returned, inside the caller's write transaction; see `import_sessions`.

    Validation needs no lock, so the caller validates first and takes the write lock only for
    this part: a large input never keeps other writers waiting while it is being checked.
    """
    existing = {sid for sid in (s["id"] for s in plan.sessions)
                if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone()}
    if existing and on_conflict == "error":
        raise ImportConflictError(f"{len(existing)} session(s) already exist: {', '.join(sorted(existing)[:5])}")
    todo = [i for i, s in enumerate(plan.sessions) if on_conflict == "replace" or s["id"] not in existing]
    written = {plan.sessions[i]["id"] for i in todo}
    for i in todo:
        session = plan.sessions[i]
        if session["title"] is not None:
            row = conn.execute("SELECT id FROM sessions WHERE title = ?", (session["title"],)).fetchone()
            if row is not None and row[0] not in written:
                raise TitleConflictError(f"title {session['title']!r} of imported session {session['id']!r} "
                                         f"is already used by session {row[0]!r}")
    known = {s["id"] for s in plan.sessions} | existing
    # With the file's rows in the picture, a replaced parent link can close a ring through
    # sessions the input does not carry (A in the file under B, and the input puts B under A).
    planned = {plan.sessions[i]["id"]: plan.sessions[i]["parent_session_id"] for i in todo}
    ring = find_cycle(planned, lambda sid: planned[sid] if sid in planned else _file_parent(conn, sid), planned)
    if ring is not None:
        raise ImportValidationError([f"session {ring!r} would become its own ancestor through parent_session_id "
                                     "together with sessions already in the file"])
    detached, count = [], 0
    # First pass without parents and titles, so neither the input order nor titles swapped
    # between replaced sessions can trip a constraint; the second pass sets both.
    for i in todo:
        row = {k: v for k, v in plan.sessions[i].items() if k not in _COUNTERS}
        row.update(parent_session_id=None, title=None)
        if row["id"] in existing:
            for table, owned in _REPLACED:
                conn.execute(f"DELETE FROM {table} WHERE {owned}", (row["id"],))
            conn.execute(f"UPDATE sessions SET {', '.join(f'{k} = ?' for k in row if k != 'id')} WHERE id = ?",
                         (*(v for k, v in row.items() if k != "id"), row["id"]))
        else:
            _insert(conn, "sessions", row)
    for i in todo:
        session = plan.sessions[i]
        parent = session["parent_session_id"]
        if parent is not None and parent not in known and not conn.execute(
                "SELECT 1 FROM sessions WHERE id = ?", (parent,)).fetchone():
            parent = None
            detached.append(session["id"])
        conn.execute("UPDATE sessions SET parent_session_id = ?, title = ? WHERE id = ?",
                     (parent, session["title"], session["id"]))
        for message in plan.messages[i]:
            _insert(conn, "messages", {"session_id": session["id"], **message})
            count += 1
        for usage in plan.usage[i]:
            _insert(conn, "session_model_usage", {"session_id": session["id"], **usage})
        conn.execute(_RECOUNT_SQL, (session["id"],))  # the meaning the write path keeps
    return ImportReport(
        imported=tuple(plan.sessions[i]["id"] for i in todo if plan.sessions[i]["id"] not in existing),
        replaced=tuple(plan.sessions[i]["id"] for i in todo if plan.sessions[i]["id"] in existing),
        skipped=tuple(s["id"] for s in plan.sessions if s["id"] in existing and on_conflict == "skip"),
        detached_parents=tuple(detached), messages=count, ignored_columns=tuple(sorted(plan.ignored)))


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
