"""The public write contract of SessionDB, method by method (sessions and messages).

For every write method: a good call leaves no transaction open and its effect is visible from a
second connection; a bad call raises a typed error and leaves both tables exactly as they were;
a read-only handle refuses the call with ReadOnlyError before any SQL.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from typing import Any, Callable

import pytest

from hermes_state import ReadOnlyError, SessionDB, SessionNotFoundError, TitleConflictError
from hermes_state_maintenance import DeletePlan


def seed(db: SessionDB) -> dict[str, Any]:
    """Two sessions, one idle for a long time, with a few messages; returns the row ids."""
    db.create_session("s", "cli", model="m", title="Taken")
    db.create_session("old", "cli", started_at=time.time() - 90 * 86400)
    ids = [db.append_message("s", "user", "one"), db.append_message("s", "user", "two"),
           db.append_message("s", "assistant", "three")]
    db.end_session("old", "user_exit")
    return {"ids": ids}


def snapshot(rival: sqlite3.Connection) -> tuple:
    return (
        [tuple(r) for r in rival.execute("SELECT * FROM sessions ORDER BY id")],
        [tuple(r) for r in rival.execute("SELECT * FROM messages ORDER BY id")],
        [tuple(r) for r in rival.execute("SELECT * FROM session_model_usage ORDER BY session_id, model")],
        [tuple(r) for r in rival.execute("SELECT * FROM compression_locks ORDER BY session_id")],
    )


def scalar(rival: sqlite3.Connection, sql: str, *args: Any) -> Any:
    return rival.execute(sql, args).fetchone()[0]


Good = Callable[[SessionDB, dict], Any]
Check = Callable[[sqlite3.Connection], bool]

# (method, good call, what the rival sees afterwards, bad call, the error the bad call raises)
CASES: list[tuple[str, Good, Check, Good, type[Exception]]] = [
    ("ensure_session",
     lambda db, s: db.ensure_session("new", "cli"),
     lambda r: scalar(r, "SELECT COUNT(*) FROM sessions WHERE id = 'new'") == 1,
     lambda db, s: db.ensure_session("new", "cli", bogus=1), ValueError),
    ("end_session",
     lambda db, s: db.end_session("s", "done"),
     lambda r: scalar(r, "SELECT end_reason FROM sessions WHERE id = 's'") == "done",
     lambda db, s: db.end_session("nope", "done"), SessionNotFoundError),
    ("reopen_session",
     lambda db, s: db.reopen_session("old"),
     lambda r: scalar(r, "SELECT ended_at FROM sessions WHERE id = 'old'") is None,
     lambda db, s: db.reopen_session("nope"), SessionNotFoundError),
    ("update_session",
     lambda db, s: db.update_session("s", cwd="/srv", title="Fresh"),
     lambda r: tuple(r.execute("SELECT cwd, title FROM sessions WHERE id = 's'").fetchone()) == ("/srv", "Fresh"),
     lambda db, s: db.update_session("old", cwd="/srv", title="Taken"), TitleConflictError),
    ("update_token_counts",
     lambda db, s: db.update_token_counts("s", 10, 5, model="m2"),
     lambda r: scalar(r, "SELECT input_tokens FROM session_model_usage WHERE model = 'm2'") == 10
     and scalar(r, "SELECT model FROM sessions WHERE id = 's'") == "m",
     lambda db, s: db.update_token_counts("s", -10), ValueError),
    ("archive_session",
     lambda db, s: db.archive_session("s"),
     lambda r: scalar(r, "SELECT archived FROM sessions WHERE id = 's'") == 1,
     lambda db, s: db.archive_session("nope"), SessionNotFoundError),
    ("unarchive_session",
     lambda db, s: (db.archive_session("s"), db.unarchive_session("s")),
     lambda r: scalar(r, "SELECT archived FROM sessions WHERE id = 's'") == 0,
     lambda db, s: db.unarchive_session("nope"), SessionNotFoundError),
    ("pin_session",
     lambda db, s: db.pin_session("s"),
     lambda r: scalar(r, "SELECT pinned FROM sessions WHERE id = 's'") == 1,
     lambda db, s: db.pin_session("nope"), SessionNotFoundError),
    ("auto_archive",
     lambda db, s: db.auto_archive(30),
     lambda r: scalar(r, "SELECT auto_archived FROM sessions WHERE id = 'old'") == 1,
     lambda db, s: db.auto_archive("thirty"), ValueError),
    ("append_message",
     lambda db, s: db.append_message("s", "user", "four"),
     lambda r: scalar(r, "SELECT message_count FROM sessions WHERE id = 's'") == 4,
     lambda db, s: db.append_message("s", "assistant", "x", tool_calls=[{"id": object()}]), ValueError),
    ("merge_messages",
     lambda db, s: db.merge_messages("s", s["ids"][:2]),
     lambda r: scalar(r, "SELECT COUNT(*) FROM messages WHERE session_id = 's'") == 2,
     lambda db, s: db.merge_messages("s", s["ids"]), ValueError),
    ("replace_messages",
     lambda db, s: db.replace_messages("s", [{"role": "user", "content": "only"}]),
     lambda r: scalar(r, "SELECT group_concat(content) FROM messages WHERE session_id = 's'") == "only",
     lambda db, s: db.replace_messages("s", [{"role": "user", "content": "ok"}, {"role": ""}]), ValueError),
    ("clear_messages",
     lambda db, s: db.clear_messages("s"),
     lambda r: scalar(r, "SELECT COUNT(*) FROM messages") == 0,
     lambda db, s: db.clear_messages("nope"), SessionNotFoundError),
    # The other features' writes follow the same contract.
    ("create_session",
     lambda db, s: db.create_session("fresh", "cli", "m", user_id="basic:alice"),
     lambda r: scalar(r, "SELECT user_id FROM sessions WHERE id = 'fresh'") == "basic:alice",
     lambda db, s: db.create_session("s", "cli", colour="red"), ValueError),
    ("set_session_title",
     lambda db, s: db.set_session_title("old", "  Renamed  "),
     lambda r: scalar(r, "SELECT title FROM sessions WHERE id = 'old'") == "Renamed",
     lambda db, s: db.set_session_title("old", "Taken"), TitleConflictError),
    ("compress_in_place",
     lambda db, s: db.compress_in_place("s", db.get_messages_as_conversation("s")[-1:]),
     lambda r: scalar(r, "SELECT COUNT(*) FROM messages WHERE session_id = 's' AND active = 1") == 1
     and scalar(r, "SELECT COUNT(*) FROM messages WHERE session_id = 's' AND compacted = 1") == 3,
     lambda db, s: db.compress_in_place("s", [{"role": "user", "content": "ok"}, "not a dict"]), ValueError),
    ("rotate_session",
     lambda db, s: db.rotate_session("s", "child", db.get_messages_as_conversation("s")[-1:]),
     lambda r: scalar(r, "SELECT end_reason FROM sessions WHERE id = 's'") == "compression"
     and scalar(r, "SELECT COUNT(*) FROM messages WHERE session_id = 'child'") == 1,
     lambda db, s: db.rotate_session("s", "old", []), ValueError),
    ("acquire_compression_lock",
     lambda db, s: db.acquire_compression_lock("s"),
     lambda r: "pid=" in scalar(r, "SELECT holder FROM compression_locks WHERE session_id = 's'"),
     lambda db, s: db.acquire_compression_lock("nope"), SessionNotFoundError),
    ("release_compression_lock",
     lambda db, s: db.release_compression_lock("s", db.acquire_compression_lock("s")),
     lambda r: scalar(r, "SELECT COUNT(*) FROM compression_locks") == 0,
     lambda db, s: db.acquire_compression_lock("nope"), SessionNotFoundError),
]
IDS = [c[0] for c in CASES]

# Two good calls above begin with a write of their own (archive, acquire), which a read-only handle
# refuses before the method under test runs. For the read-only check the writable handle makes that
# first step (a real archive, a real lock) and the read-only handle calls the method alone, with
# arguments that are valid: the read-only check is the only reason it can fail.
READ_ONLY_CALLS: dict[str, tuple[Good, Good]] = {
    "unarchive_session": (lambda db, s: db.archive_session("s"),
                          lambda db, s: db.unarchive_session("s")),
    "release_compression_lock": (lambda db, s: s.update(holder=db.acquire_compression_lock("s")),
                                 lambda db, s: db.release_compression_lock("s", s["holder"])),
}


@pytest.mark.parametrize("method, good, check, bad, error", CASES, ids=IDS)
def test_good_write_commits_and_is_visible_elsewhere(db, rival, method, good, check, bad, error):
    state = seed(db)
    good(db, state)
    assert db.in_transaction is False
    assert check(rival)


@pytest.mark.parametrize("method, good, check, bad, error", CASES, ids=IDS)
def test_bad_write_raises_typed_error_and_writes_nothing(db, rival, method, good, check, bad, error):
    state = seed(db)
    before = snapshot(rival)
    with pytest.raises(error):
        bad(db, state)
    assert db.in_transaction is False
    assert snapshot(rival) == before
    good(db, state)  # the handle is still usable
    assert check(rival)


def file_bytes(db: SessionDB) -> dict[str, bytes | None]:
    """The database file and its WAL, byte for byte (None for a file that does not exist)."""
    paths = [str(db.db_path), f"{db.db_path}-wal"]
    return {p: open(p, "rb").read() if os.path.exists(p) else None for p in paths}


@pytest.mark.parametrize("method, good, check, bad, error", CASES, ids=IDS)
def test_read_only_handle_refuses_every_write(db, rival, method, good, check, bad, error):
    state = seed(db)
    prepare, call = READ_ONLY_CALLS.get(method, (None, good))
    if prepare is not None:
        prepare(db, state)
    before, before_bytes = snapshot(rival), file_bytes(db)
    reader = SessionDB(db.db_path, read_only=True)
    try:
        with pytest.raises(ReadOnlyError):
            call(reader, state)
        assert reader.in_transaction is False
    finally:
        reader.close()
    assert snapshot(rival) == before
    assert file_bytes(db) == before_bytes
    call(db, state)  # the very same call is valid on a writable handle
    assert check(rival)


def test_reads_work_on_a_read_only_handle(db):
    seed(db)
    with SessionDB(db.db_path, read_only=True) as reader:
        assert [m["content"] for m in reader.get_messages("s")] == ["one", "two", "three"]
        assert [m["role"] for m in reader.get_messages_as_conversation("s", include_ancestors=True)] == \
            ["user", "user", "assistant"]
        assert reader.get_session("s")["message_count"] == 3


def test_every_public_method_of_this_feature_exists_with_its_spec_signature():
    import inspect
    spec = {
        # Positional up to api_content in hermes-agent's order (its callers pass them so); the rest by keyword.
        "append_message": ["self", "session_id", "role", "content", "tool_name", "tool_calls", "tool_call_id",
                           "token_count", "finish_reason", "reasoning", "reasoning_content", "reasoning_details",
                           "codex_reasoning_items", "codex_message_items", "platform_message_id", "observed",
                           "effect_disposition", "timestamp", "api_content", "display_kind", "display_metadata",
                           # the round trip of a conversation dict: append_message(sid, **msg)
                           "name", "message_uid",
                           # hermes-agent 0.20.1's compression owner and turn lease
                           "compression_lock_holder", "turn_lease_holder", "turn_lease_ttl_seconds", "runtime_keys"],
        "update_token_counts": ["self", "session_id", "input_tokens", "output_tokens", "cache_read_tokens",
                                "cache_write_tokens", "reasoning_tokens", "estimated_cost_usd", "api_call_count",
                                "model", "absolute", "actual_cost_usd", "billing_provider", "billing_base_url",
                                "billing_mode", "cost_status", "cost_source", "pricing_version"],
        "get_messages_as_conversation": ["self", "session_id", "include_ancestors", "with_row_ids",
                                         "include_inactive", "repair_alternation", "include_row_ids"],
        "get_messages": ["self", "session_id", "include_inactive", "limit", "offset", "include_compacted", "latest",
                         "after_id"],
        "merge_messages": ["self", "session_id", "row_ids"],
        "pin_session": ["self", "session_id", "pinned"],
        "auto_archive": ["self", "idle_days"],
    }
    for name, params in spec.items():
        shown = inspect.signature(getattr(SessionDB, name)).parameters.values()
        # Positional parameters in order; keyword-only ones are named, so their order is no contract.
        positional = [p.name for p in shown if p.kind is not p.KEYWORD_ONLY]
        assert positional == [p for p in params if p in positional], name
        assert {p.name for p in shown} == set(params), name
    assert list(inspect.signature(SessionDB.to_provider_messages).parameters) == ["conversation", "provider",
                                                                                  "base_url", "model"]


# --- the method table --------------------------------------------------------------------------------

def _table() -> dict:
    import hermes_state_methods as table
    return table.entries(SessionDB)


def test_the_table_covers_the_plain_delegations():
    names = set(_table())
    assert {"get_session", "get_delegation", "list_sessions", "search_messages", "append_message",
            "mark_delivered", "export_session", "update_session", "set_session_title", "get_resume_conversations"} <= names
    assert len(names) > 50
    # Methods that reshape arguments or compose several steps stay explicit; a write whose only
    # second step comes after COMMIT (removing transcript files) is a table line taking `txn`.
    assert not {"iter_export", "restore", "persist_failed_turn_input", "delete_session"} & names
    assert {"delete_sessions", "prune_sessions", "delete_empty_sessions", "delete_session_if_empty"} <= names


def test_every_table_method_shows_the_module_functions_signature_and_docstring():
    import inspect
    import pydoc
    import rlcompleter
    from hermes_state import AsyncSessionDB
    from hermes_state_methods import MODULE_ONLY
    completer = rlcompleter.Completer({"SessionDB": SessionDB})
    for name, entry in _table().items():
        method = getattr(SessionDB, name)
        module_params = list(inspect.signature(entry.function).parameters.values())
        assert module_params[0].name == ("txn" if entry.txn else "conn"), name
        shown = list(inspect.signature(method).parameters.values())
        expected = [p for p in module_params[1:] if p.name not in MODULE_ONLY and p.name != entry.pack]
        assert shown[0].name == "self" and shown[1:len(expected) + 1] == expected, name
        if entry.pack:  # the dict parameter is offered as keywords
            assert shown[-1].kind is inspect.Parameter.VAR_KEYWORD and shown[-1].name == entry.pack, name
        else:
            assert len(shown) == len(expected) + 1, name
        assert inspect.signature(method).return_annotation == inspect.signature(entry.function).return_annotation
        assert method.__doc__ == entry.function.__doc__ and method.__doc__, name
        assert method.__name__ == name and method.__qualname__ == f"SessionDB.{name}"
        page = pydoc.render_doc(method, renderer=pydoc.plaintext)
        # Python 3.13's pydoc wraps a long signature over several lines; compare without layout.
        assert re.search(rf"\b{name}\(\s*self\b", page), name
        assert method.__doc__.splitlines()[0] in page, name
        assert f"SessionDB.{name}(" in [completer.complete(f"SessionDB.{name}", i) for i in range(3)], name
        twin = getattr(AsyncSessionDB, name)
        assert inspect.iscoroutinefunction(twin) and inspect.signature(twin) == inspect.signature(method), name
        assert twin.__doc__ == method.__doc__


def test_the_module_only_clock_is_not_part_of_the_public_method(db):
    db.create_session("s", "cli")
    with pytest.raises(TypeError, match="now"):
        db.end_session("s", "done", now=1.0)
    assert db.get_session("s")["ended_at"] is None


def test_every_read_by_key_answers_as_for_an_unknown_key_when_the_key_cannot_be_stored(db):
    import inspect
    import hermes_state_methods as table
    db.create_session("s", "cli")
    checked = 0
    for name, entry in _table().items():
        if entry.kind not in ("read", "snapshot") or entry.unknown is table.ASK:
            continue
        if not entry.public:
            continue
        required = [p for p in entry.public[1:] if p.default is inspect.Parameter.empty
                    and p.kind is not inspect.Parameter.VAR_KEYWORD]
        args = ["id\ud800"] + ["x"] * len(required)
        method = getattr(db, name)
        if isinstance(entry.unknown, type):
            with pytest.raises(entry.unknown):
                method(*args)
        else:
            assert method(*args) == entry.unknown, name
            if not required:  # by keyword too
                assert method(**{entry.public[0].name: "id\udfff"}) == entry.unknown, name
        checked += 1
    assert checked > 20
    assert db.get_delegation("\ud800") is None and db.get_session("\ud800") is None
    assert db.get_route("telegram", "chat\ud800") is None and db.list_admissions("s\ud800") == []


def test_a_read_by_id_must_declare_its_unknown_answer():
    import hermes_state_routing as routing
    import hermes_state_methods as table
    with pytest.raises(TypeError, match="unknown id"):
        table.Entry("read", routing.get_delegation)
    with pytest.raises(TypeError, match="conn"):
        table.Entry("read", len)


# What each read answered for an unknown key when the table still wrote the answer beside each
# line, written out by hand: a Lookup, which reads it from the return annotation, must agree.
DECLARED_UNKNOWN: dict[str, Any] = {
    **dict.fromkeys([
        "get_session", "get_session_title", "get_session_by_title", "resolve_session_by_title",
        "get_compression_successor", "resolve_session_id", "get_compression_lock_holder",
        "get_compression_failure_cooldown", "next_admission", "get_admission", "get_execution",
        "find_latest_gateway_session_for_peer", "find_session_by_origin", "get_delivery", "get_route",
        "get_delegation", "export_session", "export_session_lineage", "get_telegram_topic_binding",
        "get_telegram_topic_binding_by_session", "get_meta", "get_handoff_state"], None),
    **{name: [] for name in [
        "get_messages", "get_ancestor_display_prefix", "get_lineage", "get_descendants",
        "get_compression_ancestors", "get_compression_lineage", "list_cron_job_runs", "list_admissions",
        "list_executions", "list_receipts", "list_gateway_sessions", "list_owed", "list_routes",
        "list_delegations", "list_telegram_topic_bindings_for_chat", "list_unlinked_telegram_sessions_for_user",
        "list_recent_user_messages"]},
    "message_count": 0, "get_compression_fallback_streak": 0,
    "is_telegram_session_linked_to_topic": False, "is_telegram_topic_mode_enabled": False,
    "has_archived_messages": False, "has_platform_message_id": False,
    "get_resume_conversations": ([], []),
    # hermes-agent 0.20.1: transcript, turn leases and compression
    "find_live_compression_child": None, "get_active_message_watermark": 0, "get_compression_ineffective_count": 0,
}
# hermes-agent 0.20.1's session-row reads.
DECLARED_UNKNOWN.update(dict.fromkeys(["get_session_activity", "get_session_title_source", "get_session_rich_row"], None))
# Reads by id whose answer for an unknown key is a value no return type implies (an Entry's `unknown=`).
ENTRY_UNKNOWN = {"get_messages_around": {"window": [], "messages_before": 0, "messages_after": 0},
                 "get_anchored_view": {"window": [], "messages_before": 0, "messages_after": 0,
                                       "bookend_start": [], "bookend_end": []},
                 # hermes-agent 0.20.1: transcript, turn leases and compression
                 "get_compression_failure_cooldown_row": {"session_exists": False, "cooldown_until": None,
                                                          "error": None}}
ENTRY_UNKNOWN["get_session_model_config_value"] = None  # hermes-agent 0.20.1: the caller's default, else None
# The reads the module function answers in full (listings, counts and searches over filters): no
# answer of their own, so text SQLite cannot store goes to the function as it is.
ANSWERS_ITSELF = {"distinct_session_cwds", "session_count", "get_next_title_in_lineage", "list_sessions",
                  "count_sessions", "usage_by_model", "top_sessions_by_tokens", "list_sessions_rich",
                  "search_sessions", "search_sessions_by_id", "search_messages",
                  "get_runtime", "backup", "list_prune_candidates", "count_empty_sessions",
                  "list_pending_handoffs", "load_gateway_routing_entries",
                  "session_ids_with_prefix", "usage", "largest_sessions", "stored_names"}
# hermes-agent 0.20.1: gateway hygiene, counts, statistics, deletion, size guards.
DECLARED_UNKNOWN.update({"get_dominant_session_model_route": None, "get_session_delete_targets": [],
                         "assert_export_safe": 0, "assert_resume_safe": 0, "get_resume_message_count": 0})
ANSWERS_ITSELF |= {"session_count_by_source", "session_count_ge", "session_lifecycle_statuses", "usage_totals",
                   "logical_size_bytes", "count_open_prune_matches", "list_meta_prefix"}
# hermes-agent 0.20.1: messages, reactions and lookups.
DECLARED_UNKNOWN.update({"get_message_role": None, "latest_message_row_id": None, "latest_user_message_row_id": None,
                         "get_message_reactions": []})
ENTRY_UNKNOWN["get_first_assistant_text"] = ""
ENTRY_UNKNOWN["get_session_delete_plan"] = DeletePlan([], [])  # what delete_session would remove
ANSWERS_ITSELF |= {"find_pr_url_messages", "list_skill_scaffolded_sessions"}
# hermes-agent 0.20.1: gateway orphans and never-active keyed sessions (reports over every row).
ANSWERS_ITSELF |= {"find_orphaned_gateway_sessions", "list_never_active_keyed_sessions"}


def test_each_lookup_answers_an_unknown_key_as_the_table_declared_it():
    import hermes_state_methods as table
    found = _table()
    for name, answer in DECLARED_UNKNOWN.items():
        entry = found[name]
        assert isinstance(entry, table.Lookup), name
        # 0 == False in Python: the types must match too (repr tells 0 from False, inside a tuple also).
        assert entry.unknown == answer and repr(entry.unknown) == repr(answer), name
    for name in ANSWERS_ITSELF:
        assert found[name].kind in ("read", "snapshot") and found[name].unknown is table.ASK, name
    for name, answer in ENTRY_UNKNOWN.items():
        assert not isinstance(found[name], table.Lookup) and found[name].unknown == answer, name
    # Every other read is one of the lists: a new read is placed in one on purpose.
    reads = {name for name, entry in found.items() if entry.kind in ("read", "snapshot")}
    assert reads == DECLARED_UNKNOWN.keys() | ANSWERS_ITSELF | ENTRY_UNKNOWN.keys()


def test_a_lookups_answer_is_the_empty_value_of_its_return_type():
    from typing import Optional, Union
    import hermes_state_methods as table
    assert [table.empty_answer(hint) for hint in (dict[str, Any] | None, Optional[int], Union[None, str], list,
                                                  list[str], int, bool, tuple[list[str], int], tuple[bool])] == [
        None, None, None, [], [], 0, False, ([], 0), (False,)]
    for hint in (str, dict[str, Any], tuple[int, ...], tuple[list[str], str], None, type(None), float):
        assert table.empty_answer(hint) is table.ASK, hint


def test_a_lookup_is_refused_for_a_write_or_a_return_type_with_no_empty_value(db):
    import hermes_state_routing as routing
    import hermes_state_titles as titles
    import hermes_state_methods as table
    with pytest.raises(TypeError, match="empty value"):
        table.Lookup("read", titles.get_next_title_in_lineage)  # -> str: "" would be a title
    with pytest.raises(TypeError, match="empty value"):
        table.Lookup("write", routing.set_route)  # type: ignore[arg-type]
    assert table.Lookup("read", routing.get_delegation).unknown is None
    db.create_session("s", "cli")
    first = db.get_messages("s\ud800")
    first.append({"role": "user"})  # the caller may change what it got: the next answer is fresh
    assert first is not db.get_messages("s\ud800") and db.get_messages("s\ud800") == []


def test_ensure_session_takes_create_sessions_arguments_and_stores_each(db, rival):
    import inspect
    from hermes_state import AsyncSessionDB
    assert inspect.signature(SessionDB.ensure_session) == inspect.signature(SessionDB.create_session)
    assert inspect.signature(AsyncSessionDB.ensure_session) == inspect.signature(SessionDB.create_session)
    db.create_session("p", "cli")
    assert db.ensure_session("c", "cli", "m", model_config={"k": 1}, system_prompt="sp", user_id="basic:bo",
                             parent_session_id="p", title="T") == "c"
    row = rival.execute("SELECT source, model, model_config, system_prompt, user_id, parent_session_id, title "
                        "FROM sessions WHERE id = 'c'").fetchone()
    assert tuple(row) == ("cli", "m", '{"k": 1}', "sp", "basic:bo", "p", "T")
    with pytest.raises(TypeError, match="positional"):
        db.ensure_session("d", "cli", "m", {"k": 1})  # the named columns are keywords only, as in create_session
    with pytest.raises(ValueError, match="unknown session column"):
        db.ensure_session("d", "cli", colour="red")
    assert rival.execute("SELECT COUNT(*) FROM sessions WHERE id = 'd'").fetchone()[0] == 0


def test_keywords_are_packed_for_a_packing_entry(db, rival):
    import inspect
    db.create_session("s", "cli")
    assert list(inspect.signature(SessionDB.update_session).parameters) == ["self", "session_id", "columns"]
    db.update_session(session_id="s", cwd="/x", title="T")
    assert tuple(rival.execute("SELECT cwd, title FROM sessions").fetchone()) == ("/x", "T")


def test_the_packed_parameter_is_the_one_the_module_function_annotates_keywords():
    import inspect
    import hermes_state_common as common
    from hermes_state_common import Keywords
    from hermes_state_methods import Entry, keywords_parameter
    packed = {name: entry.pack for name, entry in _table().items() if entry.pack}
    assert packed == {"update_session": "columns", "rotate_session": "child_columns", "list_prune_candidates": "filters",
                      "archive_sessions": "filters", "prune_sessions": "filters",
                      "count_open_prune_matches": "filters"}
    for name, parameter in packed.items():
        shown = list(inspect.signature(getattr(SessionDB, name)).parameters.values())
        assert shown[-1].name == parameter and shown[-1].kind is inspect.Parameter.VAR_KEYWORD, name

    def two(conn, a: Keywords, b: common.Keywords | None = None) -> None:
        """Two marked parameters."""
    params = list(inspect.signature(two).parameters.values())
    assert keywords_parameter(params[:2]) == "a" and keywords_parameter([params[0], params[2]]) == "b"
    assert keywords_parameter(params[:1]) is None
    with pytest.raises(TypeError, match="only one parameter"):
        Entry("write", two)

    def plain(conn, a: dict[str, int]) -> None:
        """A dict that is not marked stays a dict parameter."""
    assert Entry("write", plain).pack is None
    assert Entry("write", plain, pack="a").pack == "a"  # an explicit pack still wins


def test_a_write_taking_txn_leaves_its_files_until_the_outermost_commit(db, tmp_path):
    sessions_dir = tmp_path / "sessions"
    sessions_dir.mkdir()
    for sid in ("a", "b"):
        db.create_session(sid, "cli")
        (sessions_dir / f"{sid}.json").write_text("{}")
    with pytest.raises(RuntimeError):
        with db.transaction():
            assert db.delete_sessions(["a"], sessions_dir=sessions_dir) == 1
            assert (sessions_dir / "a.json").exists()  # not before COMMIT
            raise RuntimeError("the enclosing transaction fails")
    assert db.get_session("a") is not None and (sessions_dir / "a.json").exists()  # rolled back, file kept
    with db.transaction():
        assert db.delete_session_if_empty("b", sessions_dir=sessions_dir) is True
        assert (sessions_dir / "b.json").exists()
    assert db.get_session("b") is None and not (sessions_dir / "b.json").exists()
    import hermes_state_maintenance as maintenance
    import hermes_state_methods as table
    with pytest.raises(TypeError, match="txn"):  # only a write may take the Transaction
        table.Entry("read", maintenance.delete_sessions_and_transcripts)


# --- hermes-agent's own names -----------------------------------------------------------------------
# hermes-agent's code and tests use some names with a leading underscore on SessionDB; they are kept
# beside the public names as a contract, and this suite reaches none of them. The timing knobs' names
# are declared in the public mapping SessionDB.HERMES_AGENT_ALIASES, tested here through it.
# `_conn`, `_contains_cjk` and `_OPTIMIZE_EVERY_N_WRITES` are exercised by hermes-agent's own tests
# in the conformance ratchet (tests/upstream_passing.txt); here their public twins are tested.

def test_each_timing_knob_has_hermes_agents_name_on_the_class_and_on_one_handle(db, monkeypatch):
    import hermes_state_handle as handle
    aliases = SessionDB.HERMES_AGENT_ALIASES
    assert len(aliases) == 13 and sorted(aliases.values()) == sorted(handle.KNOBS)
    with pytest.raises(TypeError):  # a read-only declaration, not a registry to change at run time
        aliases["_X"] = "x"  # type: ignore[index]
    assert SessionDB.fts_rebuild_in_background is True and SessionDB.write_patience_s == 20.0
    other = SessionDB(db.db_path)
    try:
        for agents, public in aliases.items():
            default = getattr(SessionDB, public)
            assert agents.startswith("_") and agents in vars(handle.Handle) and public in vars(handle.Handle), agents
            assert getattr(SessionDB, agents) == default, agents
            first, second = (False, True) if isinstance(default, bool) else (7, 3)
            with monkeypatch.context() as patch:
                patch.setattr(SessionDB, agents, first)  # the class, by hermes-agent's name
                assert getattr(SessionDB, public) == first and getattr(db, public) == first, public
                setattr(db, public, second)  # one handle, by the public name: the other keeps the class's
                assert getattr(db, agents) == second and getattr(other, agents) == first == getattr(other, public)
            delattr(db, agents)
            assert getattr(SessionDB, public) == default == getattr(db, public), public
    finally:
        other.close()


def test_the_peeking_connection_reads_rows_by_column_name(db):
    from hermes_state_writer import RowConnection  # what hermes-agent's `_conn` hands out
    db.create_session("s", "cli", model="m")
    with db.transaction() as txn:
        row = RowConnection(txn.conn).execute("SELECT model FROM sessions WHERE id = 's'").fetchone()
    assert row["model"] == row[0] == "m"


# --- start-up: what `import hermes_state` loads, and what a first read loads ----------------------------
# Asserted by what is in sys.modules of a fresh interpreter, never by timing (bench/startup.py times it).

# Modules a program that only imports the library never needs: the ledgers, recovery, export and
# import, search, maintenance, the transcript writes, the full-text machinery, the upgrade, asyncio.
NOT_AT_IMPORT = ["hermes_state_gateway", "hermes_state_routing",
                 "hermes_state_recovery", "hermes_state_portability", "hermes_state_search",
                 "hermes_state_maintenance", "hermes_state_messages", "hermes_state_compression",
                 "hermes_state_fts", "hermes_state_upgrade", "hermes_state_schema", "asyncio", "uuid"]


def _fresh(code: str, home: Any) -> Any:
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(),
                          env={**os.environ, "HERMES_HOME": str(home)})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_library_loads_none_of_the_modules_a_method_needs_only_when_called(tmp_path):
    code = ("import json, sys, inspect, hermes_state as h\n"
            "at_import = sorted(sys.modules)\n"
            "listed = 'search_messages' in dir(h.SessionDB) and 'recover' in dir(h) and 'ImportReport' in dir(h)\n"
            "still = sorted(sys.modules)\n"
            "sig = str(inspect.signature(h.SessionDB.search_messages))\n"
            "after_read = sorted(sys.modules)\n"
            "print(json.dumps([at_import, listed, still == at_import, sig, after_read]))")
    at_import, listed, unchanged, signature, after_read = _fresh(code, tmp_path)
    assert not set(NOT_AT_IMPORT) & set(at_import), sorted(set(NOT_AT_IMPORT) & set(at_import))
    assert listed and unchanged  # dir() lists the lazy names without loading them
    assert "hermes_state_search" in after_read and signature.startswith("(self, query")  # the first read loads it
    import inspect
    import hermes_state_search as search
    assert signature == str(inspect.signature(SessionDB.search_messages))
    assert list(inspect.signature(search.search_messages).parameters)[1:] == \
        list(inspect.signature(SessionDB.search_messages).parameters)[1:]


def test_opening_a_store_and_listing_its_sessions_loads_no_ledger_export_search_or_write_module(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
    code = ("import json, sys, hermes_state as h\n"
            "with h.SessionDB() as db: rows = db.list_sessions()\n"
            "print(json.dumps([[r['id'] for r in rows], sorted(sys.modules)]))")
    ids, loaded = _fresh(code, tmp_path)
    assert ids == ["s"]
    unneeded = {"hermes_state_gateway", "hermes_state_routing", "hermes_state_portability", "hermes_state_search",
                "hermes_state_maintenance", "hermes_state_compression", "hermes_state_messages", "asyncio"}
    assert not unneeded & set(loaded), sorted(unneeded & set(loaded))


def test_a_read_only_open_and_a_rich_listing_load_no_recovery_repair_ledger_export_search_or_upkeep(tmp_path):
    with SessionDB(tmp_path / "state.db") as db:
        db.create_session("s", "cli")
    code = ("import json, sys, hermes_state as h\n"
            "with h.SessionDB(read_only=True) as db: rows = db.list_sessions_rich()\n"
            "print(json.dumps([[r['id'] for r in rows], sorted(sys.modules)]))")
    ids, loaded = _fresh(code, tmp_path)
    assert ids == ["s"]
    # The repair runs only on a writable open; recovery only where an upgrade copies, migrates or
    # gives space back; the rest only when their methods are called.
    unneeded = {"hermes_state_recovery", "hermes_state_repair", "hermes_state_gateway", "hermes_state_routing",
                "hermes_state_telegram", "hermes_state_portability", "hermes_state_search",
                "hermes_state_maintenance", "hermes_state_compression", "hermes_state_messages",
                "hermes_state_conversation", "hermes_state_lockowners", "asyncio"}
    assert not unneeded & set(loaded), sorted(unneeded & set(loaded))


def _table_lines() -> dict[str, tuple[str, str]]:
    """Return {method: (alias, function name)} for each `name = Entry/Lookup(kind, alias.function)` line of the facade."""
    import ast
    import hermes_state
    tree = ast.parse(open(hermes_state.__file__, encoding="utf-8").read())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SessionDB").body
    lines = {}
    for node in body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) in ("Entry", "Lookup"):
            named = node.value.args[1]
            assert isinstance(named, ast.Attribute) and isinstance(named.value, ast.Name), ast.unparse(node)
            lines[node.targets[0].id] = (named.value.id, named.attr)  # type: ignore[attr-defined]
    return lines


def _module_imports() -> dict[str, list[str]]:
    """Return {alias: [module, ...]} for every `import hermes_state_x as alias` statement of the facade."""
    import ast
    import hermes_state
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(open(hermes_state.__file__, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.asname or alias.name, []).append(alias.name)
    return found


def test_each_table_line_names_the_module_function_the_method_runs():
    # What a reader and a checker follow: the line's text `alias.function`, the alias bound by one
    # plain import statement in the facade. The method built from it runs exactly that function.
    import importlib
    import inspect
    lines, imports = _table_lines(), _module_imports()
    assert len(lines) > 150
    for method, (alias, function) in lines.items():
        assert len(imports[alias]) == 1, (alias, imports[alias])  # the module is declared once
        module = importlib.import_module(imports[alias][0])
        target = getattr(module, function)
        built = getattr(SessionDB, method)
        assert built.entry.function is target and inspect.unwrap(built) is target, method
        assert inspect.getsourcefile(inspect.unwrap(built)) == inspect.getsourcefile(module), method


def test_the_facade_declares_each_lazily_loaded_module_once():
    # One list serves the checker and the loader: one import statement per module, and no module
    # named again as text (a second list for the loader, or a name-to-module table).
    import ast
    import hermes_state
    tree = ast.parse(open(hermes_state.__file__, encoding="utf-8").read())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
                if alias.name.startswith("hermes_state_")]
    assert len(imported) == len(set(imported)) and "hermes_state_recovery" in imported, imported
    as_text = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and re.fullmatch(r"hermes_state_[a-z]+", node.value)]
    assert not as_text, as_text


def test_deferred_imports_defer_only_the_blocks_own_imports_and_leave_no_hook():
    import builtins
    import threading
    from hermes_state_methods import Later, deferred_imports
    before, namespace, elsewhere = builtins.__import__, {}, []

    def other_thread() -> None:  # a real import: this thread is not in the block
        try:
            exec("import hermes_state_no_such_module", {})
        except ModuleNotFoundError as exc:
            elsewhere.append(exc.name)
    with deferred_imports(namespace) as lazy:
        exec("import hermes_state_no_such_module as later_one\n"
             "from hermes_state_no_such_module import some_name", namespace)
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert builtins.__import__ is before and elsewhere == ["hermes_state_no_such_module"]
    assert isinstance(namespace["later_one"], Later) and namespace["later_one"].alias == "later_one"
    assert "some_name" not in namespace and lazy == {"some_name": ("hermes_state_no_such_module", "some_name")}
    with pytest.raises(ModuleNotFoundError):  # the first use imports it, for real
        namespace["later_one"].load()


def test_repr_names_the_file_and_the_mode(tmp_path):
    path = tmp_path / "state.db"
    db = SessionDB(path)
    assert repr(db) == f"<SessionDB {str(path)!r} writable>"
    with SessionDB(path, read_only=True) as reader:
        assert repr(reader) == f"<SessionDB {str(path)!r} read-only>"
        from hermes_state import AsyncSessionDB
        assert repr(AsyncSessionDB(reader)) == f"<AsyncSessionDB of <SessionDB {str(path)!r} read-only>>"
    db.close()
    assert repr(db) == f"<SessionDB {str(path)!r} closed>"


def test_help_maps_the_api_by_task_and_names_every_public_method():
    import inspect
    doc = inspect.getdoc(SessionDB) or ""
    tasks = ["Sessions:", "Messages and the conversation:", "Search:", "Listings and usage:", "Compression:",
             "Portability and whole-file safety:", "Maintenance:", "Gateway ledgers", "hermes-agent's names:"]
    assert [doc.index(task) for task in tasks] == sorted(doc.index(task) for task in tasks)  # in this order
    named = set(re.findall(r"[A-Za-z_]+", doc))
    public = {name for name in dir(SessionDB) if not name.startswith("_")}
    knobs = set(SessionDB.HERMES_AGENT_ALIASES.values()) | {"checkpoint_in_background", "upgrade_in_background_bytes",
                                                          "finish_after_close", "upgrade_copy_keep_days"}
    missing = sorted(public - named - knobs - {"TITLE_SOURCE_DERIVED", "TITLE_SOURCE_LLM", "TITLE_SOURCE_USER"})
    assert not missing, missing  # a new method gets its place in the map
    init = inspect.getdoc(SessionDB.__init__) or ""
    for part in ("db_path:", "read_only:", "backup_before_upgrade:", "force:", "What an open does", "Errors:",
                 "ReadOnlyError", "ForeignDatabaseError"):
        assert part in init, part


def test_dir_of_the_module_lists_the_api_not_the_imports():
    import hermes_state
    listed = dir(hermes_state)
    assert set(hermes_state.__all__) <= set(listed)
    assert {"recover", "ImportReport", "MAX_FTS5_QUERY_CHARS", "workspace_key", "__version__"} <= set(listed)
    imports = {"os", "sys", "re", "json", "time", "random", "logging", "logger", "threading", "Any", "Dict",
               "Optional", "deque", "Path", "sqlite3", "asyncio", "sessions", "common", "Entry", "Handle"}
    assert not imports & set(listed), sorted(imports & set(listed))
    assert not [name for name in listed if name.startswith("_") and name != "__version__"]
    # The imports stay attributes: hermes-agent's callers patch hermes_state.time.time and the like.
    import json
    import random
    import time as time_module
    assert hermes_state.time is time_module and hermes_state.json is json and hermes_state.random is random
    assert hermes_state.logger.name == "hermes_state" and hermes_state.sys.platform
    assert "DEFAULT_DB_PATH" in listed and hermes_state.DEFAULT_DB_PATH.name == "state.db"


def test_lazily_exported_names_are_the_modules_own_objects():
    import hermes_state
    import hermes_state_portability as portability
    import hermes_state_recovery as recovery
    import hermes_state_schema as schema
    from hermes_state import FTS_SQL, ImportReport, recover  # noqa: F401 - the from-import itself is under test
    assert ImportReport is portability.ImportReport and recover is recovery.recover
    assert hermes_state.apply_wal_with_fallback is schema.apply_wal_with_fallback
    assert set(hermes_state.__all__) <= set(dir(hermes_state))
    with pytest.raises(AttributeError):
        hermes_state.no_such_name  # noqa: B018


def test_methods_built_at_first_read_are_one_object_whichever_thread_reads_first(tmp_path):
    # A fresh interpreter: every method is still unbuilt there, and 8 threads race to read them all
    # (== : a classmethod read gives a new bound method each time, equal to the last).
    code = ("import json, threading, hermes_state as h\n"
            "names = [n for n in dir(h.SessionDB) if not n.startswith('__')]\n"
            "seen = []\n"
            "barrier = threading.Barrier(8)\n"
            "def read():\n"
            "    barrier.wait()\n"
            "    seen.append([getattr(h.SessionDB, n) for n in names] + [getattr(h.AsyncSessionDB, n, None) for n in names])\n"
            "threads = [threading.Thread(target=read) for _ in range(8)]\n"
            "[t.start() for t in threads]; [t.join() for t in threads]\n"
            "final = [getattr(h.SessionDB, n) for n in names] + [getattr(h.AsyncSessionDB, n, None) for n in names]\n"
            "print(json.dumps([len(names), all(all(a == b for a, b in zip(s, final)) for s in seen),"
            " type(vars(h.SessionDB)['append_message']).__name__]))")
    count, same, kind = _fresh(code, tmp_path)
    assert count > 100 and same
    assert kind == "function"  # once read, the class holds a plain function: no per-call indirection
