"""Run a list of operations through hermes-agent's own SessionDB, for tests/test_coexistence.py.

    <hermes-agent venv>/bin/python tests/hermes_agent_driver.py DB_PATH < ops.json > results.json

Runs inside hermes-agent's virtual environment and imports nothing of hermes-state (whose
module has the same name): only the published package, through the methods its API names.
Reads one JSON list of operations, each a list `[name, *args]`, runs them in order on one
SessionDB and prints one JSON list of their results. Any exception ends the run with its
traceback on stderr and exit status 1: the tests treat every raw error of the agent as a failure;
only the `try` operation turns an exception into an answer (the names of its classes).

The generic operations (`call`, `try`, `age`, `query`) also run in hermes-state's own process
(tests/test_dropin.py imports `run`), so both programs see exactly the same steps: an argument
`{"$": n}` is the n-th operation's full result, `{"dir": name}` a directory beside the database,
and `call`'s projection picks what is compared (see `project`).
"""
from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any


def main() -> None:
    path = Path(sys.argv[1]).absolute()
    os.environ["HERMES_HOME"] = str(path.parent)  # never the user's real home
    sys.path = [p for p in sys.path if p not in ("", os.getcwd(), os.path.dirname(os.path.abspath(__file__)))]
    from hermes_state import SessionDB  # hermes-agent's module, from its own venv

    ops = json.load(sys.stdin)
    db = SessionDB(db_path=path)
    try:
        results = run(db, path, ops)
    finally:
        db.close()
    json.dump(results, sys.stdout, ensure_ascii=False)


def run(db: Any, path: Path, ops: list) -> list:
    """Run `ops` on `db` (whose file is `path`) and return their results, JSON-ready."""
    full: list = []  # each operation's whole result, for {"$": n} references
    shown: list = []
    for name, *args in ops:
        args = _resolve(args, full, path)
        if name in GENERIC:
            result, answer = GENERIC[name](db, path, *args)
        else:
            result = answer = OPS[name](db, *args)
        full.append(result)
        shown.append(json.loads(json.dumps(answer, default=repr)))
    return shown


def _resolve(value: Any, full: list, path: Path) -> Any:
    if isinstance(value, dict) and set(value) == {"$"}:
        return full[value["$"]]
    if isinstance(value, dict) and set(value) == {"dir"}:
        folder = path.parent / value["dir"]
        folder.mkdir(exist_ok=True)
        return folder
    if isinstance(value, list):
        return [_resolve(v, full, path) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, full, path) for k, v in value.items()}
    return value


def project(value: Any, spec: Any) -> Any:
    """Return the part of `value` a test compares: "ids" (rows -> their ids), a key list, or {key: spec}."""
    if spec is None:
        return value
    if spec == "ids":
        return [row["id"] for row in value]
    if isinstance(spec, list):
        if isinstance(value, list):
            return [{k: row.get(k) for k in spec} for row in value]
        return None if value is None else {k: value.get(k) for k in spec}
    if isinstance(spec, dict):
        return {k: project(value[k], sub) for k, sub in spec.items()}
    raise ValueError(f"unknown projection {spec!r}")


def _call(db: Any, path: Path, method: str, args: list, kwargs: dict | None = None, spec: Any = None) -> tuple:
    result = getattr(db, method)(*args, **(kwargs or {}))
    return result, project(result, spec)


def _try(db: Any, path: Path, method: str, args: list, kwargs: dict | None = None, spec: Any = None) -> tuple:
    try:
        return _call(db, path, method, args, kwargs, spec)
    except Exception as exc:  # the answer is which kind of error it was
        raised = {"raised": [cls.__name__ for cls in type(exc).__mro__]}
        return raised, raised


def _age(db: Any, path: Path, session_id: str, seconds: float) -> tuple:
    # Backdate a session's start, as a long-running install's rows are: a raw write beside the handle.
    with closing(sqlite3.connect(str(path), timeout=10)) as conn:
        conn.execute("UPDATE sessions SET started_at = ? WHERE id = ?", (time.time() - seconds, session_id))
        conn.commit()
    return None, None


def _query(db: Any, path: Path, sql: str, params: list | None = None) -> tuple:
    with closing(sqlite3.connect(str(path), timeout=10)) as conn:
        rows = [list(r) for r in conn.execute(sql, params or [])]
    return rows, rows


def _execute(db: Any, path: Path, sql: str, params: list | None = None) -> tuple:
    # A raw write beside the handle, committed (e.g. planting an expired lease row).
    with closing(sqlite3.connect(str(path), timeout=10)) as conn:
        count = conn.execute(sql, params or []).rowcount
        conn.commit()
    return count, count


GENERIC = {"call": _call, "try": _try, "age": _age, "query": _query, "execute": _execute}


def _create(db, sid: str, source: str = "cli") -> str:
    return db.create_session(sid, source)


def _append(db, sid: str, role: str, content: str | None, extra: dict | None = None) -> int:
    return db.append_message(sid, role, content=content, **(extra or {}))


def _appends(db, sid: str, count: int, prefix: str, pause_s: float = 0.0) -> int:
    for n in range(count):
        db.append_message(sid, "user", content=f"{prefix} {n}")
        if pause_s:
            time.sleep(pause_s)
    return count


def _messages(db, sid: str) -> list:
    return [[m["role"], m["content"]] for m in db.get_messages(sid)]


def _session(db, sid: str) -> dict | None:
    row = db.get_session(sid)
    keys = ("id", "source", "title", "message_count", "tool_call_count", "input_tokens", "output_tokens")
    return None if row is None else {k: row.get(k) for k in keys}


def _search(db, query: str) -> list:
    return sorted({hit["session_id"] for hit in db.search_messages(query, limit=100)})


def _sessions(db) -> list:
    return sorted(row["id"] for row in db.search_sessions(limit=1000))


def _tokens(db, sid: str, model: str, input_tokens: int, output_tokens: int) -> None:
    db.update_token_counts(sid, input_tokens=input_tokens, output_tokens=output_tokens, model=model,
                           billing_provider="openrouter")


def _title(db, sid: str, title: str) -> bool:
    return db.set_session_title(sid, title)


def _end(db, sid: str, reason: str) -> None:
    db.end_session(sid, reason)


def _create_child(db, sid: str, parent: str, source: str = "cli") -> str:
    return db.create_session(sid, source, parent_session_id=parent)


def _create_for(db, sid: str, source: str, user_id: str) -> str:
    return db.create_session(sid, source, user_id=user_id)


def _bind_topic(db, chat_id: str, thread_id: str, user_id: str, sid: str) -> str | None:
    # A refusal is an answer here (the tests compare it), not a failure of the run.
    try:
        db.bind_telegram_topic(chat_id=chat_id, thread_id=thread_id, user_id=user_id,
                               session_key=f"key-{thread_id}", session_id=sid)
    except ValueError as exc:
        return str(exc)
    return None


def _topic(db, chat_id: str, thread_id: str) -> dict | None:
    return db.get_telegram_topic_binding(chat_id=chat_id, thread_id=thread_id)


def _unlinked(db, chat_id: str, user_id: str) -> list:
    return [s["id"] for s in db.list_unlinked_telegram_sessions_for_user(chat_id=chat_id, user_id=user_id)]


OPS = {"create_for": _create_for, "create_child": _create_child, "bind_topic": _bind_topic, "topic": _topic, "unlinked": _unlinked,
       "create": _create, "append": _append, "appends": _appends, "messages": _messages, "session": _session,
       "search": _search, "sessions": _sessions, "tokens": _tokens, "title": _title, "end": _end}

if __name__ == "__main__":
    main()
