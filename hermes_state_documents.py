"""The export document: its format marker and version, and checking one document for import.

Owns: `EXPORT_FORMAT`, `EXPORT_VERSION`, and `check_document`, which turns one document (this
library's shape, with `session`, or hermes-agent's, with the columns at the top level) into the
rows an import writes, or into the list of what is wrong with it. Each problem is worded for the
person who wrote the input: the field, then what it must be (`messages[0].role must be a
non-empty string`).
Does not own: anything that compares documents with each other or with a database (duplicate
ids, titles, parents), nor writing; both are hermes_state_portability's.

Transaction contract: none; pure functions of the document. They never raise on bad data.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hermes_state_common import COUNTERS, DICTIONARY, Column, Table
from hermes_state_common import INT_MAX, INT_MIN, encode_json, is_finite, is_uid, replace_surrogates

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
