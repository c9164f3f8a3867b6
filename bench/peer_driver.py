"""Drive one peer session store through its public API, on commands from bench/run.py.

    <peer venv>/bin/python bench/peer_driver.py {hermes-agent|openai-agents} DB_PATH N SEED

Runs inside the peer's own virtual environment (bench/run.py creates it), so it imports nothing
of hermes-state: only the corpus generator beside it and the peer's published package. It
reads one JSON command per line on stdin and answers one JSON line on stdout:

    {"op": "setup"}                         create every corpus session (untimed)
    {"op": "append", "session": k}          append session k's messages, one call per message -> {"s": seconds}
                                            (then the session is finished: a store that keeps an object
                                            per conversation closes it, untimed)
    {"op": "search", "queries": [...]}      run each query once untimed, then once timed -> {"ms": [...], "hits": [...]}
    {"op": "close"}                         close the store -> {"bytes": database + WAL size}

The peer is a black box: only the calls its documentation names are used.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import corpus


class HermesAgent:
    """hermes-agent's `hermes_state.SessionDB`: create_session, append_message, search_messages."""

    searchable = True

    def __init__(self, path: str):
        from hermes_state import SessionDB  # noqa: PLC0415  (the peer's module, in its own venv)
        self.db = SessionDB(db_path=Path(path))

    def create(self, sid: str, source: str) -> None:
        self.db.create_session(sid, source)

    def append(self, sid: str, m: dict) -> None:
        self.db.append_message(sid, m["role"], content=m.get("content"), tool_calls=m.get("tool_calls"),
                               tool_name=m.get("tool_name"), tool_call_id=m.get("tool_call_id"))

    def search(self, query: str) -> int:
        return len(self.db.search_messages(query, limit=20))

    def finish(self, sid: str) -> None:
        """Nothing to do: one SessionDB serves every conversation."""

    def close(self) -> None:
        self.db.close()


class OpenAIAgents:
    """The OpenAI Agents SDK's `SQLiteSession`: add_items / get_items, one session object per conversation. No search."""

    searchable = False

    def __init__(self, path: str):
        from agents import SQLiteSession  # noqa: PLC0415
        self.cls, self.path, self.sessions = SQLiteSession, path, {}
        self.loop = asyncio.new_event_loop()

    def create(self, sid: str, source: str) -> None:
        self.sessions[sid] = self.cls(sid, self.path)

    @staticmethod
    def items(m: dict) -> list[dict]:
        """The corpus message as Responses-API input items (a tool call and its output are items of their own)."""
        if m["role"] == "tool":
            return [{"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}]
        out = [{"role": m["role"], "content": m["content"]}] if m.get("content") else []
        for call in m.get("tool_calls") or []:
            out.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"]})
        return out

    def append(self, sid: str, m: dict) -> None:
        self.loop.run_until_complete(self.sessions[sid].add_items(self.items(m)))

    def search(self, query: str) -> int:
        raise NotImplementedError("SQLiteSession has no search")

    def finish(self, sid: str) -> None:
        """Close the conversation's session object, as an agent does when a conversation ends."""
        self.sessions.pop(sid).close()

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.loop.close()


PEERS = {"hermes-agent": HermesAgent, "openai-agents": OpenAIAgents}


def main() -> None:
    peer, path, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # Replies go to the original stdout; anything the peer prints goes to stderr instead.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sessions = list(corpus.sessions(n_messages=n, seed=seed))
    store = PEERS[peer](path)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "setup":
            for sid, source, _ in sessions:
                store.create(sid, source)
            reply: dict = {"ok": True}
        elif op == "append":
            sid, _, msgs = sessions[cmd["session"]]
            t0 = time.perf_counter()
            for m in msgs:
                store.append(sid, m)
            reply = {"s": time.perf_counter() - t0}
            store.finish(sid)  # each session is appended in one go; keeping thousands open costs resources
        elif op == "search":
            if not store.searchable:
                reply = {"ms": None}
            else:
                for q in cmd["queries"]:  # warm-up pass, as for every other system
                    store.search(q)
                times, hits = [], []
                for q in cmd["queries"]:
                    t0 = time.perf_counter()
                    hits.append(store.search(q))
                    times.append((time.perf_counter() - t0) * 1000)
                reply = {"ms": times, "hits": hits}
        elif op == "close":
            store.close()
            reply = {"bytes": sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))}
        else:
            reply = {"error": f"unknown op {op!r}"}
        print(json.dumps(reply), file=replies, flush=True)
        if op == "close":
            return


if __name__ == "__main__":
    main()
