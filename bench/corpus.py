"""A deterministic, synthetic corpus of agent transcripts for the benchmarks and long runs.

    from corpus import sessions, sample_queries
    for session_id, source, messages in sessions(n_messages=100_000, seed=1):
        ...  # each message: a dict with role, content and, where they apply, tool_calls/tool_name/tool_call_id

The mix resembles what an agent's database holds: about a quarter short user turns, a third
assistant turns (about half of them calling a tool), and the rest long tool results (logs,
listings, code-like text). About one user or assistant turn in twelve is CJK text. Words come
from a fixed vocabulary drawn with Zipf-like weights, so a few words are everywhere and most are
rare, as in real text. The same seed always yields the same corpus, on every machine.
"""
from __future__ import annotations

import json
import random
from typing import Iterator

_PARTS = ("an", "bo", "cy", "da", "el", "fu", "gi", "ho", "ix", "ju", "ke", "lo", "mi", "nu", "or", "pa",
          "qui", "ra", "se", "tu", "ur", "vi", "wo", "xa", "yo", "ze", "str", "ing", "ment", "ode", "sql",
          "net", "log", "dev", "ops", "git", "cfg", "run")
# Han, kana and hangul characters the generator draws CJK turns from.
CJK_CHARS = ("検索日本語全文会話記録圧縮世代設定保存領域項目東京大阪天気予報"
             "服务端修改项目数据库错误日志配置文件网络请求用户消息工具调用结果旅游桂林漓江"
             "한국어검색결과대화기록")
TOOLS = ("terminal", "read_file", "write_file", "web_search", "browser", "memory", "cronjob")
SOURCES = ("cli", "cli", "telegram", "discord", "cron", "tui")
VOCABULARY_SIZE = 20_000


def vocabulary(seed: int = 1) -> list[str]:
    """Return the corpus's words, most frequent first (the same list `sessions` draws from)."""
    rng = random.Random(f"vocabulary-{seed}")
    seen: dict[str, None] = {}
    while len(seen) < VOCABULARY_SIZE:
        seen.setdefault("".join(rng.choice(_PARTS) for _ in range(rng.randint(1, 4))), None)
    return list(seen)


class _Writer:
    """Draws words, prose and CJK runs from one random stream."""

    def __init__(self, rng: random.Random, seed: int):
        self.rng = rng
        self.words = vocabulary(seed)
        total = 0.0
        self.cum: list[float] = []
        for rank in range(len(self.words)):
            total += 1.0 / (rank + 1)  # Zipf weights: rank r is drawn ~1/r as often as the first
            self.cum.append(total)

    def prose(self, n_chars: int) -> str:
        out: list[str] = []
        size = 0
        while size < n_chars:
            batch = self.rng.choices(self.words, cum_weights=self.cum, k=16)
            out.extend(batch)
            size += sum(len(w) + 1 for w in batch)
        return " ".join(out)[:max(n_chars, 1)].rstrip()

    def cjk(self, n_chars: int) -> str:
        return "".join(self.rng.choices(CJK_CHARS, k=n_chars))


def sessions(n_messages: int, seed: int = 1, per_session: int = 60) -> Iterator[tuple[str, str, list[dict]]]:
    """Yield (session_id, source, messages) until exactly `n_messages` messages have been produced.

    Session ids are `bench_<seed>_<k>` with k counted from 1 in seven digits. A tool result always
    follows the assistant turn that called it, inside the same session.
    """
    rng = random.Random(seed)
    w = _Writer(rng, seed)
    made = k = 0
    while made < n_messages:
        k += 1
        sid = f"bench_{seed}_{k:07d}"
        source = rng.choice(SOURCES)
        want = min(per_session, n_messages - made)
        msgs: list[dict] = []
        while len(msgs) < want:
            cjk = rng.random() < 0.08
            msgs.append({"role": "user", "content": w.cjk(rng.randint(8, 60)) if cjk else w.prose(rng.randint(40, 400))})
            if len(msgs) == want:
                break
            if len(msgs) + 2 <= want and rng.random() < 0.55:
                call_id = f"call_{k}_{len(msgs)}"
                tool = rng.choice(TOOLS)
                arguments = json.dumps({"query": w.prose(30), "path": f"/srv/{w.prose(6).split()[0]}.py"})
                msgs.append({"role": "assistant", "content": w.prose(rng.randint(0, 200)) or None,
                             "tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": tool, "arguments": arguments}}]})
                msgs.append({"role": "tool", "tool_call_id": call_id, "tool_name": tool,
                             "content": w.prose(rng.randint(500, 4000))})
            else:
                msgs.append({"role": "assistant",
                             "content": w.cjk(rng.randint(20, 200)) if cjk else w.prose(rng.randint(200, 1500))})
        made += len(msgs)
        yield sid, source, msgs


def raw_text_bytes(message: dict) -> int:
    """Return the UTF-8 bytes of a message's text: content, tool calls (as JSON) and tool name."""
    calls = json.dumps(message["tool_calls"], ensure_ascii=False) if message.get("tool_calls") else ""
    return sum(len(s.encode()) for s in (message.get("content") or "", calls, message.get("tool_name") or ""))


def sample_queries(seed: int = 1, n: int = 50) -> list[str]:
    """Return `n` search terms cycling through three kinds: a common word, a rare word plus a common one, 2 CJK characters."""
    rng = random.Random(f"queries-{seed}")
    words = vocabulary(seed)
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(words[rng.randint(0, 50)])
        elif i % 3 == 1:
            out.append(f"{words[rng.randint(500, 5000)]} {words[rng.randint(0, 200)]}")
        else:
            a = rng.randrange(len(CJK_CHARS) - 1)
            out.append(CJK_CHARS[a:a + 2])
    return out
