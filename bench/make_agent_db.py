"""Write a state.db the way hermes-agent 0.19.0 does, through its public SessionDB API.

Run it with a Python that has hermes-agent installed (NOT this package, whose module has the
same name), e.g.

    python3 -m venv /tmp/agent && /tmp/agent/bin/pip install hermes-agent==0.19.0
    /tmp/agent/bin/python bench/make_agent_db.py /tmp/old/state.db 20000

It makes sessions of 40 messages each (user, assistant with a tool call, tool result,
assistant with reasoning), some CJK text, titles and token counts, and ends most sessions.
The result is the schema and data an existing user brings to hermes-state.
"""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path


def main() -> None:
    path = Path(sys.argv[1]).absolute()
    n_messages = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ["HERMES_HOME"] = str(path.parent)  # never the user's real home
    sys.path = [p for p in sys.path if p not in ("", os.getcwd())]  # never import this repository's module
    from hermes_state import SessionDB  # hermes-agent's, from its own venv

    rng = random.Random(7)
    words = ("docker build cache layer python import error retry socket timeout config yaml "
             "東京 検索 项目 구글 テスト 部署 日本語の文章 数据库").split()
    db = SessionDB(db_path=path)
    written, s = 0, 0
    while written < n_messages:
        sid = f"agent-{s:05d}"
        db.create_session(sid, source=rng.choice(["cli", "telegram", "discord"]), model="gpt-test")
        if s % 3 == 0:
            db.set_session_title(sid, f"Session {s}")
        for turn in range(10):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(8, 40)))
            db.append_message(sid, "user", f"turn {turn}: {text}")
            call = {"id": f"call_{s}_{turn}", "type": "function",
                    "function": {"name": "terminal", "arguments": json.dumps({"cmd": "ls -la " + text[:30]})}}
            db.append_message(sid, "assistant", "", tool_calls=[call])
            db.append_message(sid, "tool", ("output line " + text + "\n") * rng.randint(2, 12),
                              tool_call_id=call["id"], tool_name="terminal")
            db.append_message(sid, "assistant", "done: " + text, reasoning="thinking about " + text[:60])
            written += 4
            if written >= n_messages:
                break
        db.update_token_counts(sid, input_tokens=1000 + s, output_tokens=200 + s, model="gpt-test")
        if s % 5:
            db.end_session(sid, "user_exit")
        s += 1
    db.close()
    print(f"{path}: {written} messages in {s} sessions, {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
