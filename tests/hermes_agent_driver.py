"""Run a list of operations through hermes-agent's own SessionDB, for tests/test_coexistence.py.

    <hermes-agent venv>/bin/python tests/hermes_agent_driver.py DB_PATH < ops.json > results.json

Runs inside hermes-agent's virtual environment and imports nothing of hermes-state (whose
module has the same name): only the published package, through the methods its API names.
Reads one JSON list of operations, each a list `[name, *args]`, runs them in order on one
SessionDB and prints one JSON list of their results. Any exception ends the run with its
traceback on stderr and exit status 1: the tests treat every raw error of the agent as a failure.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    path = Path(sys.argv[1]).absolute()
    os.environ["HERMES_HOME"] = str(path.parent)  # never the user's real home
    sys.path = [p for p in sys.path if p not in ("", os.getcwd(), os.path.dirname(os.path.abspath(__file__)))]
    from hermes_state import SessionDB  # hermes-agent's module, from its own venv

    ops = json.load(sys.stdin)
    db = SessionDB(db_path=path)
    results: list = []
    try:
        for name, *args in ops:
            results.append(OPS[name](db, *args))
    finally:
        db.close()
    json.dump(results, sys.stdout, ensure_ascii=False)


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


OPS = {"create_for": _create_for, "bind_topic": _bind_topic, "topic": _topic, "unlinked": _unlinked,
       "create": _create, "append": _append, "appends": _appends, "messages": _messages, "session": _session,
       "search": _search, "sessions": _sessions, "tokens": _tokens, "title": _title, "end": _end}

if __name__ == "__main__":
    main()
