"""hermes-agent 0.20.1's message names, differentially: reactions, lookups by role, /skill sessions, search keywords.

Each scenario is one list of operations (tests/hermes_agent_driver.py's `run`), run by the real
hermes-agent 0.20.1 in its own venv on a fresh file and by hermes-state on another; the
projected answers (times left out) must be equal. Where this library answers bad input with a
typed error on purpose (docs/api.md, "Messages, reactions and lookups"), the scenario says so
beside the operation. The shared-file checks at the end have each program read what the other wrote.
"""
from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import hermes_agent_driver as driver
from agent_releases import AGENT_020, attempt, call, ours, ref
from hermes_state import SessionDB, describe_skill_invocation

pytestmark = pytest.mark.hermes_agent

CALL = [{"id": "c1", "type": "function", "function": {"name": "memory", "arguments": "{}"}}]
REACTION = ["emoji", "author", "seen"]  # "at" is each program's clock
SKILL = ('[IMPORTANT: The user has invoked the "work" skill, indicating they want you to follow its instructions. '
         'The full skill content is loaded below.]\n\n')
ASKED = "The user has provided the following instruction alongside the skill invocation: "


@pytest.fixture(autouse=True)
def need_agent():
    AGENT_020.require()


def assert_same(theirs: list, mine: list, ops: list, differ: dict[int, Any] | None = None) -> None:
    """Each answer equal, except those in `differ`: {operation: this library's answer} (a typed refusal)."""
    differ = differ or {}
    for n, (a, b, op) in enumerate(zip(theirs, mine, ops)):
        if n in differ:
            assert b == differ[n], f"operation {n} {op[:3]}: hermes-state {b!r}, expected {differ[n]!r}"
        else:
            assert a == b, f"operation {n} {op[:3]}: hermes-agent {a!r} != hermes-state {b!r}"
    assert len(theirs) == len(mine) == len(ops)


def refused(*classes: str) -> dict[str, list[str]]:
    return {"raised": [*classes, "Exception", "BaseException", "object"]}


def refusals(ops: list, *refused_ops: list) -> dict[int, Any]:
    """Return {index: ValueError} for operations this library refuses on purpose."""
    return {ops.index(op): VALUE_ERROR for op in refused_ops}


VALUE_ERROR = refused("ValueError")
FILTER_ERROR = refused("SessionFilterError", "HermesStateError", "ValueError")  # a session filter's typed refusal


def test_reactions_toggle_replace_and_are_announced_once_as_in_hermes_agent(tmp_path):
    ops = [
        ["create", "s1"], ["create", "s2"],
        ["append", "s1", "user", "hello"], ["append", "s1", "assistant", "hi there"],   # 2, 3
        ["append", "s2", "user", "elsewhere"],                                           # 4
        call("set_message_reaction", "s1", ref(2), "👍", spec=REACTION),
        call("get_message_reactions", "s1", ref(2), spec=REACTION),
        call("set_message_reaction", "s1", ref(2), "👍", spec=REACTION),                # the same again: cleared
        call("set_message_reaction", "s1", ref(2), "❤️", spec=REACTION),
        call("set_message_reaction", "s1", ref(2), "😂", author="assistant", spec=REACTION),
        call("set_message_reaction", "s1", ref(2), "🎉", spec=REACTION),                # replaces, goes last
        call("set_message_reaction", "s1", ref(3), "👀", author="bob", spec=REACTION),
        call("set_message_reaction", "s2", ref(2), "👍"),                               # not s2's row: None
        call("set_message_reaction", "s1", 999, "👍"), call("set_message_reaction", "nope", ref(2), "👍"),
        call("get_message_reactions", "s2", ref(2)), call("get_message_reactions", "s1", 999),
        call("take_unseen_reactions", "s1"), call("take_unseen_reactions", "s1"),
        call("take_unseen_reactions", "s1", author="assistant"), call("take_unseen_reactions", "s1", author="bob"),
        call("get_message_reactions", "s1", ref(2), spec=REACTION),
        call("set_message_reaction", "s1", ref(2), None, spec=REACTION),
        call("set_message_reaction", "s1", ref(2), "", author="assistant", spec=REACTION),
        call("get_message_reactions", "s1", ref(2)), call("take_unseen_reactions", "nope"),
        ["query", "SELECT id, display_metadata IS NULL FROM messages ORDER BY id"],
    ]
    # Bad input: hermes-agent stores any value; here a typed refusal, nothing written.
    bad = [attempt("set_message_reaction", "s1", ref(2), 5),
           attempt("set_message_reaction", "s1", ref(2), "x", author=None),
           attempt("set_message_reaction", "s1", "1", "x"),
           ["query", "SELECT id, display_metadata IS NULL FROM messages ORDER BY id"]]
    theirs, mine = both(tmp_path, ops + bad)
    # hermes-agent wrote the bad values on row 1; here the row is as it was.
    assert_same(theirs, mine, ops + bad, differ={**refusals(ops + bad, *bad[:3]), len(ops) + 3: mine[len(ops) - 1]})
    assert theirs[-1][0] == [1, 0]
    assert mine[10] == [{"emoji": "😂", "author": "assistant", "seen": None},
                        {"emoji": "🎉", "author": "user", "seen": None}]
    assert mine[17] == [{"row_id": 1, "role": "user", "emoji": "🎉", "text": "hello"}] and mine[18] == []
    assert mine[len(ops) - 1] == [[1, 1], [2, 0], [3, 1]] == mine[-1]


def test_malformed_metadata_from_another_program_holds_no_reactions_as_in_hermes_agent(tmp_path):
    raw = "UPDATE messages SET display_metadata = ? WHERE id = ?"
    ops = [
        ["create", "s1"], ["append", "s1", "user", "a"], ["append", "s1", "assistant", "b"],
        ["execute", raw, ["not json", 1]], ["execute", raw, ['{"reactions": "x", "k": 1}', 2]],
        call("get_message_reactions", "s1", 1), call("get_message_reactions", "s1", 2),
        call("set_message_reaction", "s1", 1, "👍", spec=REACTION),
        call("set_message_reaction", "s1", 2, "👍", spec=REACTION),
        ["query", "SELECT json_extract(display_metadata, '$.k') FROM messages ORDER BY id"],
        ["execute", raw, ['{"reactions": [1, {"emoji": "q"}, {"author": "user", "emoji": "r"}]}', 1]],
        call("get_message_reactions", "s1", 1, spec=REACTION), call("take_unseen_reactions", "s1"),
        call("set_message_reaction", "s1", 1, "F", spec=REACTION),
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[9] == [[None], [1]]  # the other keys of an object stay


def _lookups_transcript() -> list:
    return [
        ["create", "s1"],
        ["append", "s1", "user", "first question"],                         # 1
        ["append", "s1", "assistant", None, {"tool_calls": CALL}],          # 2: a tool call, no text
        ["append", "s1", "tool", "result", {"tool_call_id": "c1", "tool_name": "memory"}],
        ["append", "s1", "assistant", "   "],                               # 4: blank
        ["append", "s1", "assistant", "the answer"],                        # 5
        ["append", "s1", "user", "   "],                                    # 6: blank
        ["append", "s1", "user", "second question"],                        # 7
    ]


def test_lookups_by_role_answer_as_hermes_agent(tmp_path):
    ops = _lookups_transcript() + [
        call("get_message_role", "s1", 1), call("get_message_role", "s1", 3), call("get_message_role", "s1", 99),
        call("get_message_role", "s2", 1), call("latest_user_message_row_id", "s1"),
        call("latest_user_message_row_id", "nope"),
        *[call("latest_message_row_id", "s1", role=role, offset=offset, require_text=text)
          for role in ("user", "assistant", "tool", "system") for offset in (0, 1, 2, 5) for text in (True, False)],
        call("latest_message_row_id", "s1", offset=-1), call("get_first_assistant_text", "s1"),
        call("get_first_assistant_text", "nope"),
        ["execute", "UPDATE messages SET active = 0 WHERE id = 7"],
        call("get_message_role", "s1", 7), call("latest_user_message_row_id", "s1"),
        call("set_message_reaction", "s1", 7, "👍", spec=REACTION), call("take_unseen_reactions", "s1"),
        attempt("latest_message_row_id", "s1", offset="1"),
    ]
    theirs, mine = both(tmp_path, ops)
    last = len(ops) - 1
    assert_same(theirs, mine, ops, differ={last: VALUE_ERROR})  # hermes-agent: TypeError from a comparison
    assert theirs[last]["raised"][0] == "TypeError"
    first = len(_lookups_transcript())
    assert mine[first + 4] == 7 and mine[first + 6:first + 8] == [7, 7]  # the latest user row with text
    assert mine[first + 8:first + 10] == [1, 6]  # the blank row 6 skipped only with require_text


def test_first_assistant_text_and_pull_request_candidates_as_in_hermes_agent(tmp_path):
    ops = [
        ["create", "a"], ["create", "b"],
        ["append", "b", "assistant", None], ["append", "b", "assistant", "", {"tool_calls": CALL}],
        ["append", "b", "assistant", "second"],
        ["append", "b", "tool", "https://github.com/o/r/pull/1", {"tool_call_id": "c1"}],
        ["append", "a", "tool", "created /PULL/ 2", {"tool_call_id": "c1"}],
        ["append", "a", "user", "see https://github.com/o/r/pull/3"],
        ["append", "b", "tool", "nothing here", {"tool_call_id": "c1"}],
        ["append", "b", "tool", "https://github.com/o/r/pull/4", {"tool_call_id": "c1"}],
        ["execute", "UPDATE messages SET active = 0 WHERE id = 8"],
        call("get_first_assistant_text", "b"), call("get_first_assistant_text", "a"),
        call("find_pr_url_messages", ["b", "a", "nope"]), call("find_pr_url_messages", []),
        call("find_pr_url_messages", ("a",)),
        attempt("find_pr_url_messages", None),
        attempt("find_pr_url_messages", "a"),  # hermes-agent: a string is its characters
    ]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops, differ={16: VALUE_ERROR, 17: VALUE_ERROR})
    assert theirs[16]["raised"][0] == "TypeError" and isinstance(theirs[17], list)
    assert mine[11] == "" and [h["content"][-1] for h in mine[13]] == ["1", "2", "4"]


def test_display_kind_is_stamped_on_the_latest_matching_row_as_in_hermes_agent(tmp_path):
    stamp = "set_latest_matching_message_display_kind"
    rows = "SELECT id, display_kind, display_metadata FROM messages ORDER BY id"
    ops = [
        ["create", "s1"], ["append", "s1", "user", "hello"], ["append", "s1", "assistant", "hi"],
        ["append", "s1", "user", "hello"], ["append", "s1", "user", "other"], ["append", "s1", "user", "hello"],
        ["execute", "UPDATE messages SET active = 0 WHERE id = 5"],
        call(stamp, "s1", role="user", content="hello", display_kind="cron", display_metadata={"job": "j"}),
        ["query", rows],
        call(stamp, "s1", role="user", content="hello", display_kind="k2"), ["query", rows],
        call(stamp, "s1", role="user", content="missing", display_kind="k"),
        call(stamp, "nope", role="user", content="hello", display_kind="k"),
        call(stamp, "s1", role="assistant", content="hi", display_kind=""),
        call(stamp, "s1", role="user", content=None, display_kind="k"),
        call("set_message_reaction", "s1", 2, "👍", spec=REACTION),
        call(stamp, "s1", role="assistant", content="hi", display_kind="y", display_metadata={}), ["query", rows],
        attempt(stamp, "s1", "user", "hello", "k"),          # keyword-only, as there
        attempt(stamp, "s1", role="assistant", content="hi", display_kind=5),  # hermes-agent stores '5'
        ["query", rows],
    ]
    theirs, mine = both(tmp_path, ops)
    # The last row: hermes-agent stored display_kind '5' on row 2 where this library refused.
    assert_same(theirs[:-1], mine[:-1], ops[:-1], differ={19: VALUE_ERROR})
    assert theirs[-1][1] == [2, "5", None] and mine[-1][1] == [2, "y", None] and theirs[-1][2:] == mine[-1][2:]
    assert mine[8][2] == [3, "cron", '{"job": "j"}'] and mine[18]["raised"][0] == "TypeError"


def test_stale_tool_call_markers_are_emptied_as_in_hermes_agent(tmp_path):
    markers = ["[memory]", "[memory] ", "\t[Memory]\n", "[web_search]", "[mcp__x-y.z]", "[_x]", "[x-]",
               "[memory, terminal]", "[memory][terminal]", "[]", "[memory] text", "[a b]", "[1]", "[9a]",
               "[é]", "[a:b]", "[[memory]]", "(memory)"]
    ops: list = [["create", "s1"]]
    for text in markers:
        ops.append(["append", "s1", "assistant", text, {"tool_calls": CALL}])
    ops += [["append", "s1", "assistant", "[memory]"], ["append", "s1", "user", "[memory]"],
            ["append", "s1", "assistant", "[memory]", {"tool_calls": CALL}],
            ["execute", "UPDATE messages SET active = 0 WHERE id = 21"]]
    report = ["dry_run", "rows_affected", "row_ids"]  # backup_path names the time of the copy
    ops += [call("purge_stale_tool_call_markers", dry_run=True, spec=report),
            call("purge_stale_tool_call_markers", spec=report),
            ["query", "SELECT id, content, tool_calls IS NOT NULL FROM messages ORDER BY id"],
            call("purge_stale_tool_call_markers"), call("purge_stale_tool_call_markers", dry_run=True)]
    theirs, mine = both(tmp_path, ops)
    assert_same(theirs, mine, ops)
    assert mine[-5]["row_ids"] == [1, 2, 3, 4, 5, 6, 7, 21]
    copies = list((tmp_path / "ours").glob("state.db.pre-clean-markers-backup-*"))
    assert len(copies) == 1  # one copy, before the change; none when nothing changes
    with closing(sqlite3.connect(copies[0])) as conn:
        assert conn.execute("SELECT content FROM messages WHERE id = 1").fetchone() == ("[memory]",)


def test_skill_scaffolded_sessions_and_their_description_as_in_hermes_agent(tmp_path):
    ops: list = []
    for n, (sid, first, title) in enumerate([
            ("a", SKILL + "BODY\n\n" + ASKED + "fix the title leak", "Title A"),
            ("b", SKILL + "no title", None), ("c", "plain", "Title C"),
            ("d", SKILL.lower() + "lower", "Title D"), ("e", "  " + SKILL, "Title E"),
            ("f", "[IMPORTANT: The user has invoked the x", "Title F")]):
        ops += [["create", sid], ["append", sid, "user", first], ["append", sid, "user", SKILL + "later"]]
        if title:
            ops.append(["title", sid, title])
        ops.append(["execute", "UPDATE sessions SET started_at = ? WHERE id = ?", [1000 + n, sid]])
    ops += [["create", "g"], ["append", "g", "user", "plain first"], ["append", "g", "user", SKILL + "second"],
            ["title", "g", "Title G"],
            call("list_skill_scaffolded_sessions"), call("list_skill_scaffolded_sessions", 2),
            call("list_skill_scaffolded_sessions", 0),
            attempt("list_skill_scaffolded_sessions", None)]
    theirs, mine = both(tmp_path, ops)
    last = len(ops) - 1
    assert_same(theirs, mine, ops, differ={last: VALUE_ERROR})
    assert [r["id"] for r in mine[last - 3]] == ["f", "d", "a"]


@pytest.mark.parametrize("content", [
    SKILL + "BODY\n\n" + ASKED + "line1\nline2", SKILL + "BODY\n\n" + ASKED + "  spaced  ", SKILL + "BODY",
    SKILL + "BODY\n\n" + ASKED + "first\n\n" + ASKED + "second", SKILL + "BODY\n\n" + ASKED + "a\x1eb",
    SKILL + "\x1e" + ASKED + "hidden", '[IMPORTANT: The user has invoked the "" skill]',
    '[IMPORTANT: The user has invoked the "   " skill]', '[IMPORTANT: The user has invoked the "//work" skill]',
    '[IMPORTANT: The user has invoked the " / work" skill]', '[IMPORTANT: The user has invoked the "work',
    '[important: The user has invoked the "work" skill]', "  " + SKILL, "hello", "", None, 5,
])
def test_describe_skill_invocation_reads_as_in_hermes_agent(tmp_path, content):
    script = ("import json, sys, hermes_state; c = json.load(sys.stdin); "
              "print(json.dumps([hermes_state.describe_skill_invocation(c), "
              "hermes_state.describe_skill_invocation(c, ' ')]))")
    import json
    import subprocess
    assert AGENT_020.python is not None
    proc = subprocess.run([str(AGENT_020.python), "-c", script], input=json.dumps(content), capture_output=True,
                          text=True, timeout=120, env=AGENT_020.env(tmp_path / "state.db"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [describe_skill_invocation(content), describe_skill_invocation(content, " ")]


def _search_store() -> list:
    call_banana = [{"id": "c1", "type": "function",
                    "function": {"name": "deploy_tool", "arguments": '{"target": "banana"}'}}]
    return [
        ["create", "s1"], ["create_for", "s2", "telegram", "u1"],
        ["append", "s1", "user", "banana bread recipe", {"timestamp": 100}],
        ["append", "s1", "assistant", "banana banana banana", {"timestamp": 200}],
        ["append", "s2", "user", "old banana", {"timestamp": 50}],
        ["append", "s2", "assistant", None, {"tool_calls": call_banana, "timestamp": 300}],
        ["append", "s2", "tool", "tool said banana", {"tool_call_id": "c1", "tool_name": "banana_tool",
                                                     "timestamp": 400}],
        ["append", "s2", "assistant", "apple", {"timestamp": 500}],
    ]


def test_search_sort_and_fields_answer_as_in_hermes_agent(tmp_path):
    ops = _search_store() + [
        call("search_messages", "banana", sort="newest", spec="ids"),
        call("search_messages", "banana", sort="oldest", spec="ids"),
        call("search_messages", "banana", sort="oldest", limit=2, offset=1, spec="ids"),
        call("search_messages", "banana", sort="newest", role_filter=["user"], spec="ids"),
        call("search_messages", "banana", sort="oldest", fields=["id", "role", "session_id", "tool_name"]),
        call("search_messages", "banana", sort="oldest", fields=[]),
        call("search_messages", "banana", sort="newest", fields=("source", "timestamp", "session_started"),
             spec=["source", "timestamp"]),
        attempt("search_messages", "banana", fields="content"), attempt("search_messages", "banana", fields=["content"]),
        attempt("search_messages", "banana", fields=["bogus", "content"]),
        attempt("search_messages", "banana", fields=[5]),
        call("search_messages", "banana", sort="relevance", fields=["session_id"], spec=None),
        attempt("search_messages", "banana", sort="bogus"),   # hermes-agent: relevance, silently
    ]
    theirs, mine = both(tmp_path, ops)
    n = len(_search_store())
    # The relevance order is each program's own ranking: compared as sets.
    both_ranked = n + 11
    theirs[both_ranked], mine[both_ranked] = sorted(map(str, theirs[both_ranked])), sorted(map(str, mine[both_ranked]))
    assert_same(theirs, mine, ops, differ={n + 12: VALUE_ERROR})
    assert mine[n] == [5, 4, 2, 1, 3] and mine[n + 1] == [3, 1, 2, 4, 5]
    assert isinstance(theirs[n + 12], list)


def test_a_kept_context_is_the_full_results_context(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        driver.run(db, path, _search_store())
        full = db.search_messages("banana", sort="oldest")
        kept = db.search_messages("banana", sort="oldest", fields=["context"])
        assert kept == [{"context": hit["context"]} for hit in full] and all(hit["context"] for hit in kept)
        assert all(hit == {"id": hit["id"]} for hit in db.search_messages("banana", fields=["id"]))


def test_session_searches_take_the_newer_filters_as_in_hermes_agent(tmp_path):
    ops: list = []
    for sid, source, cwd, root in [("abc1", "cli", "/repo/x", None), ("abc2", "telegram", "/repo/y", "/repo"),
                                   ("abd3", "cli", "/other", None), ("abc4", "discord", None, None),
                                   ("xyz", "cli", "/repo/", None), ("abc5", "cli", "/REPO/q", None),
                                   ("abc6", "cli", "/repo/sub/deep", "/other"), ("abc7", "cli", "/repo-2", None),
                                   ("abc8", "cli", "/elsewhere", "/repo/sub")]:
        ops += [["create", sid, source], ["age", sid, 1000 - len(ops)]]
        if cwd:  # written directly: update_session_cwd's answer differs between the releases (another group's)
            ops.append(["execute", "UPDATE sessions SET cwd = ?, git_repo_root = ? WHERE id = ?", [cwd, root, sid]])
    ids = "ids"
    ops += [call("search_sessions", workspace_key=key, spec=ids) for key in ("/repo", "/repo/x", "/repo/", "/other",
                                                                           "", None, "/", "/REPO")]
    ops += [call("search_sessions_by_id", "ab", spec=ids, **kw) for kw in (
        {}, {"source": "cli"}, {"sources": ["cli", "discord"]}, {"exclude_sources": ["cli"]},
        {"source": "cli", "sources": ["telegram"]}, {"source": "cli", "exclude_sources": ["cli"]}, {"sources": []},
        {"exclude_sources": []}, {"source": ""})]
    ops += [attempt("search_sessions", workspace_key=5), attempt("search_sessions_by_id", "ab", sources="cli")]
    theirs, mine = both(tmp_path, ops)
    last = len(ops) - 1
    assert_same(theirs, mine, ops, differ={last - 1: VALUE_ERROR, last: FILTER_ERROR})
    assert theirs[last - 1]["raised"][0] == "AttributeError" and theirs[last] == []
    repo = mine[ops.index(call("search_sessions", workspace_key="/repo", spec="ids"))]
    assert sorted(repo) == ["abc1", "abc2", "abc5", "xyz"]  # a directory by prefix, a root whole


def test_each_program_reads_the_others_reactions_on_one_file(tmp_path):
    path = tmp_path / "state.db"
    with SessionDB(path) as db:
        db.create_session("s1", "cli")
        first = db.append_message("s1", "user", "from the library")
        second = db.append_message("s1", "assistant", "a reply")
        db.set_message_reaction("s1", first, "👍")
    theirs = AGENT_020.run(path, call("get_message_reactions", "s1", first, spec=REACTION),
                           call("take_unseen_reactions", "s1"),
                           call("set_message_reaction", "s1", second, "🔥", author="assistant", spec=REACTION))
    assert theirs[0] == [{"emoji": "👍", "author": "user", "seen": None}]
    assert theirs[1] == [{"row_id": first, "role": "user", "emoji": "👍", "text": "from the library"}]
    with SessionDB(path) as db:
        assert db.take_unseen_reactions("s1") == []  # the agent announced it; it is not announced twice
        assert [r["emoji"] for r in db.get_message_reactions("s1", second)] == ["🔥"]
        assert db.take_unseen_reactions("s1", author="assistant")[0]["emoji"] == "🔥"
    assert AGENT_020.run(path, call("take_unseen_reactions", "s1", author="assistant")) == [[]]


def both(tmp_path: Path, ops: list) -> tuple[list, list]:
    """Return (hermes-agent 0.20.1's answers, hermes-state's answers) to `ops`, each on a fresh file."""
    return AGENT_020.both(tmp_path, ops)
