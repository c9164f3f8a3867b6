"""A deterministic store shaped like a heavy user's: cron runs, big tool output, a giant session.

    from heavy_corpus import Profile, sessions, NEEDLES
    for s in sessions(Profile(scale=1.0)):   # s.id, s.source, s.started_at, s.system_prompt, s.messages
        ...

At scale 1 it has the shape of the stores in hermes-agent's public bug reports (the numbers
are the ones measured in the field): 12,000 sessions of which 9,000 are cron runs (each
re-stores its job's prompt of 177-275 KB as the session's system prompt; 2-5.3 KB with
`small_prompts`), about 155,000
messages of which about 57% are tool output (most under a kilobyte, a long tail to 40 KB),
base64 image payloads of 0.5-1.7 MB drawn from a handful of distinct ones (so most are exact
duplicates), and one session of about 33,000 messages. The scale multiplies the counts; the
sizes of single messages do not change.

Needles are planted in fixed places (the oldest and the newest sessions, the giant session,
every role), so a search has known answers: NEEDLES maps each query kind to its query and the
ids of the messages that must be found, computed while generating.
"""
from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Iterator

import corpus

DAY = 86_400.0
START = 1_778_800_000.0  # the first session starts in May 2026; the store spans 200 days to December 2026
SPAN_DAYS = 200
OTHER_SOURCES = ("cli", "cli", "telegram", "discord", "tui")
TOOLS = ("terminal", "read_file", "web_search", "browser", "patch", "memory")


@dataclass(frozen=True)
class Profile:
    """The store's counts at scale 1, multiplied by `scale`."""

    scale: float = 1.0
    seed: int = 31
    sessions: int = 12_000
    cron_share: float = 0.75
    messages: int = 155_015
    giant: int = 33_002
    blobs: int = 38
    distinct_blobs: int = 6
    # Cron prompts cut to 2-5.3 KB: the same store otherwise, with session rows as small as an
    # interactive user's, so reading a session's row costs nothing extra in either program.
    small_prompts: bool = False

    def count(self, n: int, least: int = 1) -> int:
        """Return `n` at this scale, at least `least`."""
        return max(least, round(n * self.scale))


@dataclass
class Session:
    """One generated session: its row's columns and its messages in order."""

    id: str
    source: str
    started_at: float
    ended_at: float | None
    system_prompt: str | None
    messages: list[dict] = field(default_factory=list)


# Each planted term, the query that finds it, and where it is planted. The absent word is planted nowhere.
PHRASE = "orange submarine protocol"
RARE = "zephyrquill"
HYPHENATED = "kube-proxy-7f3"
PIECE = "xq9vbt"            # only ever inside a longer token of tool output
CJK2 = "桂林"
CJK_LONG = "漓江游船码头"
ABSENT = "qwzxvyk"
COMMON = None               # the corpus's most frequent word, filled in by sessions()
NEEDLE_SOURCE = "telegram"  # the source filter the filtered kinds use


def _blob(rng: random.Random, size: int) -> str:
    raw = rng.randbytes(size * 3 // 4)
    return "data:image/png;base64," + base64.b64encode(raw).decode()


class _Maker:
    """Draws every text of the store from one random stream."""

    def __init__(self, profile: Profile):
        self.p = profile
        self.rng = random.Random(profile.seed)
        self.w = corpus._Writer(self.rng, profile.seed)
        brng = random.Random(profile.seed + 1)
        self.blobs = [_blob(brng, brng.randint(500_000, 1_700_000)) for _ in range(profile.distinct_blobs)]
        self.cron_jobs = [self.w.prose(self.rng.randint(177_000, 275_000)) for _ in range(12)]
        if profile.small_prompts:  # cut after drawing them, so every other text is the one of the full store
            self.cron_jobs = [job[:2_000 + 300 * k] for k, job in enumerate(self.cron_jobs)]

    def text(self) -> str:
        """A user or assistant turn: about 0.5 KB on average, some CJK."""
        if self.rng.random() < 0.05:
            return self.w.cjk(self.rng.randint(10, 120))
        return self.w.prose(int(self.rng.lognormvariate(5.6, 0.8)) + 5)

    def tool_output(self) -> str:
        """A tool result: mostly under a kilobyte, a long tail to 40 KB."""
        size = min(40_000, int(self.rng.lognormvariate(7.1, 1.5)) + 20)
        return self.w.prose(size)

    def call(self, tool: str, k: int) -> dict:
        args = json.dumps({"cmd": self.w.prose(self.rng.randint(10, 80)), "path": f"/srv/{self.w.prose(8).split()[0]}"})
        return {"id": f"call_{k}", "type": "function", "function": {"name": tool, "arguments": args}}


def _turn(mk: _Maker, counter: list[int], rounds: int, cron: bool) -> list[dict]:
    """One user turn, `rounds` assistant steps each calling 1-5 tools, and the final answer."""
    rng = mk.rng
    out: list[dict] = [{"role": "user", "content": mk.text()}]
    for _ in range(rounds):
        calls = []
        for _ in range(rng.choice((3, 4, 5) if cron else (1, 2, 3, 3, 4))):
            counter[0] += 1
            calls.append(mk.call(rng.choice(TOOLS), counter[0]))
        out.append({"role": "assistant", "content": mk.w.prose(rng.randint(0, 120)) or None, "tool_calls": calls})
        for c in calls:
            out.append({"role": "tool", "tool_call_id": c["id"], "tool_name": c["function"]["name"],
                        "content": mk.tool_output()})
    out.append({"role": "assistant", "content": mk.text()})
    return out


def _session_messages(mk: _Maker, counter: list[int], want: int, cron: bool) -> list[dict]:
    msgs: list[dict] = []
    while len(msgs) < want:
        msgs.extend(_turn(mk, counter, 1 if cron else mk.rng.randint(1, 3), cron))
    return msgs[:want]  # a cut after an assistant's calls leaves results missing, as an interrupted turn does


def _plant(messages: list[dict], rng: random.Random, where: str, term: str, inside_word: bool = False) -> int:
    """Put `term` into one message of the role `where` (the first such from a random start); return its index."""
    candidates = [i for i, m in enumerate(messages) if m["role"] == where and isinstance(m.get("content"), str)
                  and not m["content"].startswith("data:")]
    if not candidates:
        candidates = [i for i, m in enumerate(messages) if isinstance(m.get("content"), str)
                      and not m["content"].startswith("data:")]
    i = rng.choice(candidates)
    text = messages[i]["content"]
    cut = rng.randint(0, len(text))
    piece = f"sha256:{rng.randbytes(3).hex()}{term}{rng.randbytes(3).hex()}" if inside_word else term
    messages[i]["content"] = f"{text[:cut]} {piece} {text[cut:]}"
    return i


def sessions(profile: Profile) -> Iterator[Session]:
    """Yield the store's sessions, oldest first; the same profile always yields the same store."""
    mk = _Maker(profile)
    rng = mk.rng
    n_sessions = profile.count(profile.sessions, 20)
    n_cron = round(n_sessions * profile.cron_share)
    giant = profile.count(profile.giant, 1000)
    rest = max(n_sessions * 4, profile.count(profile.messages, 2000) - giant)
    n_other = n_sessions - n_cron - 1
    cron_len = 7  # a cron run: the trigger, one step of calls, their results, the answer
    other_len = max(8, (rest - n_cron * cron_len) // max(1, n_other))
    kinds = [True] * n_cron + [False] * n_other
    random.Random(profile.seed + 2).shuffle(kinds)
    giant_at = n_sessions // 3
    kinds.insert(giant_at, False)
    blob_every = max(1, n_sessions // profile.count(profile.blobs))
    # needles: which sessions get which terms (oldest, newest and spread between), by session index
    spread = random.Random(profile.seed + 3)
    plan: dict[int, list[tuple[str, str, bool]]] = {}

    def plant(at: int, role: str, term: str, inside: bool = False) -> None:
        plan.setdefault(at, []).append((role, term, inside))

    ends = [0, 1, n_sessions - 2, n_sessions - 1]
    for term, n, inside in ((PHRASE, 12, False), (RARE, 25, False), (HYPHENATED, 15, False), (PIECE, 10, True),
                            (CJK2, 20, False), (CJK_LONG, 8, False)):
        picks = ends + [spread.randrange(n_sessions) for _ in range(n - len(ends))] + [giant_at]
        for k, at in enumerate(picks):
            plant(at, "tool" if inside else ("user", "assistant", "tool")[k % 3], term, inside)
    for word in PHRASE.split():  # the phrase's words also appear apart, so only the phrase picks the right rows
        for _ in range(30):
            plant(spread.randrange(n_sessions), "assistant", word)
    counter = [0]
    blob_due = 0
    for k, cron in enumerate(kinds):
        started = START + SPAN_DAYS * DAY * k / n_sessions + rng.random() * 600
        if k == giant_at:
            sid, source, want, prompt = "giant_session", "cli", giant, None
        elif cron:
            job = rng.randrange(len(mk.cron_jobs))
            sid, source, want, prompt = f"cron_job{job:02d}_{k:06d}", "cron", cron_len, mk.cron_jobs[job]
        else:
            sid, source, want = f"s{k:06d}", rng.choice(OTHER_SOURCES), max(2, int(other_len * rng.uniform(0.3, 1.7)))
            prompt = None
        msgs = _session_messages(mk, counter, want, cron)
        blob_due += k % blob_every == 0
        if blob_due and not cron:
            i = next((j for j, m in enumerate(msgs) if m["role"] == "tool"), None)
            if i is not None:
                msgs[i]["content"] = mk.blobs[rng.randrange(len(mk.blobs))]
                blob_due -= 1
        for role, term, inside in plan.get(k, ()):
            _plant(msgs, rng, role, term, inside)
        step = (2.0 if k != giant_at else SPAN_DAYS * DAY / 3 / giant)
        for j, m in enumerate(msgs):
            m["timestamp"] = started + j * step
        ended = None if k == n_sessions - 1 else msgs[-1]["timestamp"] + 1
        yield Session(sid, NEEDLE_SOURCE if k in (1, n_sessions - 2) else source, started, ended, prompt, msgs)


def common_word(profile: Profile) -> str:
    """Return the corpus's most frequent word (a common-word query)."""
    return corpus.vocabulary(profile.seed)[0]


def common_phrases(profile: Profile) -> dict[str, str]:
    """Return quoted phrases of the corpus's own words, by kind name (their hits are not planted)."""
    w = corpus.vocabulary(profile.seed)
    # The words are drawn independently, so a pair of the two most frequent ones is in many rows,
    # four of them in a few; a pair of rarer words is rare as a phrase but found inside longer
    # words (the corpus's words share their parts), which the substring pass must check row by row.
    return {"phrase of the two commonest words": f'"{w[0]} {w[1]}"',
            "phrase of four common words": f'"{w[3]} {w[1]} {w[0]} {w[2]}"',
            "rare phrase of two mid-frequency words": f'"{w[200]} {w[300]}"'}


def queries(profile: Profile) -> dict[str, str]:
    """Return each search kind's query, by kind name."""
    return {"absent word": ABSENT, "rare word": RARE, "common word": common_word(profile),
            "phrase": f'"{PHRASE}"', "hyphenated term": HYPHENATED, "2-char CJK": CJK2,
            "longer CJK": CJK_LONG, "substring in tool output": PIECE, **common_phrases(profile)}


def raw_text_bytes(s: Session) -> tuple[int, int]:
    """Return the UTF-8 bytes of the session's message text (content, tool calls, tool names) and of its prompt."""
    total = 0
    for m in s.messages:
        total += corpus.raw_text_bytes(m)
    return total, len((s.system_prompt or "").encode())
