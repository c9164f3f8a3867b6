"""Maintenance: deleting and pruning sessions, the empty-session sweeps, bulk archiving,
state_meta's key/value calls and the auto-prune marker.

Owns: which sessions a deletion takes (a compression chain is one conversation and goes whole;
a delegate subagent goes with the session that spawned it; other children stay, detached), as
a plan computed before anything is deleted (`plan_delete`, which a dry run shows and the delete
carries out),
the refusal while work for a session is still owed (admissions not finished, executions
running or unknown, replies not yet delivered, delegations still open), removing every row
that names a session, the filters prune_sessions/list_prune_candidates/archive_sessions share,
and removing a session's transcript files; and hermes-agent's two start-up sweeps on that
planner: an empty TUI ghost session (ended without a message or a title, started over a day ago)
is deleted, and a compression continuation whose process died before its first API call (open,
with rows, no accounted call, started over a week ago) is ended as 'orphaned_compression'.
Does not own: the ledgers' own rules (hermes_state_gateway, hermes_state_routing), the
compression edge (hermes_state_lineage), VACUUM (hermes_state_recovery).

Transaction contract: every function runs inside the caller's transaction (a write
transaction for those that change rows) and never commits. `remove_transcripts` touches
files only, and the caller runs it after COMMIT, so a rolled-back delete keeps its files; the
`*_and_transcripts` calls (the facade's) take the open Transaction and leave it to after COMMIT.
"""
from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable

from hermes_state_common import (DAY_S, DELEGATE_LIKE_SQL, LIVE_ADMISSION_SQL, SESSION_OWNED, Keywords,
                                 check_id, check_number, contains_sql, is_finite, logger, prefix_range, table_exists, shown)
from hermes_state_errors import HermesStateError, SessionBusyError
from hermes_state_gateway import LIVE_EXECUTION_STATES
from hermes_state_lineage import COMPRESSION_END_REASON, WALK_CAP, compression_links, forward_chain
from hermes_state_routing import DELEGATION_OPEN_STATES, DELIVERY_OWED_STATES
from hermes_state_sessions import (archive_stale_sessions, cwd_under_sql, cwd_under_values, filter_count, filter_flag,
                                   filter_name, filter_number, forget_prompts, session_filters)
from hermes_state_writer import Transaction

AUTO_PRUNE_KEY = "last_auto_prune"  # state_meta: when the last automatic prune ran (epoch seconds)
VACUUM_KEY = "last_vacuum"  # state_meta: when the last automatic prune's VACUUM ran (epoch seconds)

# Rows that belong to a session, children before parents so every foreign key holds at each
# step, as (table, the expression naming the row's session): the data dictionary's declaration.
# The FTS triggers remove the messages' index rows with them.
SESSION_ROWS: tuple[tuple[str, str], ...] = tuple((t.name, t.owner) for t in SESSION_OWNED if t.owner is not None)

# Work still owed for a session: while any such row exists the session is not deleted. Only
# rows in a terminal state are removed with it.
def _state_in(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(f"'{state}'" for state in states) + ")"


OWED_WORK: tuple[tuple[str, str, str, str], ...] = (
    ("session_admissions", "session_id", LIVE_ADMISSION_SQL, "admission(s) queued, started or unknown"),
    ("worker_executions", "session_id", _state_in(LIVE_EXECUTION_STATES), "execution(s) running or unknown"),
    ("delivery_obligations", "session_id", _state_in(DELIVERY_OWED_STATES), "repl(ies) not yet delivered"),
    ("async_delegations", "origin_session", _state_in(DELEGATION_OPEN_STATES), "delegation(s) still open"),
)

_DELEGATE_MARK = "$._delegate_from"
_LOOKUPS_MAX = 64  # sessions read by id; more are read in one pass over an index
# A ledger's rows read in a pass cost about a quarter of a lookup by session (a probe of its
# index, the id list parsed and sorted once per ledger).
_SCAN_PER_LOOKUP = 4


# --- filters -------------------------------------------------------------------------------------

def _like(name: str, value: Any) -> str:
    return filter_name(name, value)  # matched with instr (contains_sql): no LIKE pattern, no length limit


def _under(name: str, value: Any) -> tuple[str, ...]:
    return tuple(cwd_under_values(filter_name(name, value)))  # the directory itself, or anything below it


_TOKENS = "(COALESCE(s.input_tokens, 0) + COALESCE(s.output_tokens, 0))"
_COST = "COALESCE(s.actual_cost_usd, s.estimated_cost_usd)"
# name -> (SQL condition, check turning the argument into the bound value, or a tuple of
# them when the condition has several ?). Text
# matches (`*_like`) are case-insensitive substrings (ASCII letters, as SQLite's LIKE).
FILTERS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "started_after": ("s.started_at >= ?", filter_number),
    "started_before": ("s.started_at < ?", filter_number),
    "title_like": (contains_sql("s.title"), _like),
    "model_like": (contains_sql("s.model"), _like),
    "branch_like": (contains_sql("s.git_branch"), _like),
    "end_reason": ("s.end_reason = ?", filter_name),
    "provider": ("LOWER(s.billing_provider) = LOWER(?)", filter_name),
    "user_id": ("s.user_id = ?", filter_name),
    "chat_id": ("s.chat_id = ?", filter_name),
    "chat_type": ("s.chat_type = ?", filter_name),
    "cwd_prefix": (cwd_under_sql("s.cwd"), _under),
    "archived": ("COALESCE(s.archived, 0) = ?", lambda name, value: int(filter_flag(name, value))),
    "min_messages": ("COALESCE(s.message_count, 0) >= ?", filter_count),
    "max_messages": ("COALESCE(s.message_count, 0) <= ?", filter_count),
    "min_tokens": (f"{_TOKENS} >= ?", filter_count),
    "max_tokens": (f"{_TOKENS} <= ?", filter_count),
    "min_cost": (f"{_COST} >= ?", filter_number),
    "max_cost": (f"{_COST} <= ?", filter_number),
    "min_tool_calls": ("COALESCE(s.tool_call_count, 0) >= ?", filter_count),
    "max_tool_calls": ("COALESCE(s.tool_call_count, 0) <= ?", filter_count),
}


@dataclass(frozen=True)
class Selection:
    """A WHERE clause over `sessions s` and its parameters."""
    where: str
    params: tuple[Any, ...]


def select_sessions(older_than_days: Any = None, source: Any = None, filters: dict[str, Any] | None = None, *,
                    now: float | None = None) -> Selection:
    """Build the selection of ended sessions matching the prune filters; bad values raise ValueError.

    `older_than_days` None puts no bound on age. An unknown filter name raises TypeError, as
    an unknown keyword argument would.
    """
    filters = dict(filters or {})
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise TypeError(f"unknown filter(s) {', '.join(unknown)}; known: {', '.join(sorted(FILTERS))}")
    where: list[str] = ["s.ended_at IS NOT NULL"]
    params: list[Any] = []
    if older_than_days is not None:
        days = filter_number("older_than_days", older_than_days)
        where.append("s.started_at < ?")
        params.append((time.time() if now is None else now) - days * DAY_S)
    own, own_params = session_filters("s.", source=source, include_archived=True)  # the archived filter is below
    where += own
    params += own_params
    for name, value in filters.items():
        if value is None:
            continue
        condition, check = FILTERS[name]
        bound = check(name, value)
        where.append(condition)
        params.extend(bound if isinstance(bound, tuple) else (bound,))
    return Selection(" AND ".join(where), tuple(params))


# --- what a deletion takes ----------------------------------------------------------------------

def _ids_json(ids: Iterable[str]) -> str:
    return json.dumps(list(ids))


def conversation(session_id: str, links: dict[str, str], back: dict[str, str]) -> list[str]:
    """Return the compression chain the session belongs to, oldest first (cycle-safe, bounded)."""
    root, seen = session_id, {session_id}
    while root in back and back[root] not in seen and len(seen) < WALK_CAP:
        root = back[root]
        seen.add(root)
    return forward_chain(root, links)


def _delegate_index(conn: sqlite3.Connection) -> dict[str, set[str]]:
    """Return {spawning session: delegate sessions} from the delegate marker and parent links."""
    spawned: dict[str, set[str]] = {}
    rows = conn.execute(
        f"SELECT id, parent_session_id, json_extract(model_config, '{_DELEGATE_MARK}') FROM sessions "
        f"WHERE {DELEGATE_LIKE_SQL} AND json_valid(model_config) "
        f"AND json_extract(model_config, '{_DELEGATE_MARK}') IS NOT NULL")
    for sid, parent, origin in rows:
        for owner in {parent, origin} - {None, sid}:
            spawned.setdefault(str(owner), set()).add(sid)
    return spawned


def with_delegates(ids: list[str], spawned: dict[str, set[str]]) -> list[str]:
    """Return `ids` followed by every delegate they spawned, directly or through each other."""
    out, seen, frontier = list(ids), set(ids), list(ids)
    while frontier and len(out) < WALK_CAP:
        found = [d for sid in frontier for d in sorted(spawned.get(sid, ())) if d not in seen]
        found = list(dict.fromkeys(found))
        seen.update(found)
        out.extend(found)
        frontier = found
    return out


def owed_work(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, str]:
    """Return {session: what is still owed for it} for those of `ids` that may not be deleted yet."""
    ids = list(ids)
    ids_json: str | None = None
    owed: dict[str, list[str]] = {}
    for table, column, live, what in OWED_WORK:
        if not table_exists(conn, table):
            continue
        if len(ids) > _LOOKUPS_MAX:
            # A ledger no bigger than a few rows per session asked about is read whole for its
            # live rows: that costs less than looking each session up (a prune lists thousands).
            # Rowids are handed out from 1 up: the largest is at least the row count, read from one leaf.
            (top,) = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()
            if top is None:
                continue  # an empty ledger owes nothing
            if top <= len(ids) * _SCAN_PER_LOOKUP:
                rows = conn.execute(f"SELECT {column}, COUNT(*) FROM {table} WHERE {live} GROUP BY {column}").fetchall()
                wanted = set(ids) if rows else set()
                for sid, n in rows:
                    if sid in wanted:
                        owed.setdefault(sid, []).append(f"{n} {what}")
                continue
        ids_json = _ids_json(ids) if ids_json is None else ids_json
        for sid, n in conn.execute(f"SELECT {column}, COUNT(*) FROM {table} WHERE {live} AND {column} IN "
                                   f"(SELECT value FROM json_each(?)) GROUP BY {column}", (ids_json,)):
            owed.setdefault(sid, []).append(f"{n} {what}")
    return {sid: ", ".join(parts) for sid, parts in owed.items()}


def _busy_error(owed: dict[str, str], verb: str) -> SessionBusyError:
    listed = "; ".join(f"{sid!r}: {what}" for sid, what in sorted(owed.items())[:5])
    more = f" (and {len(owed) - 5} more)" if len(owed) > 5 else ""
    return SessionBusyError(f"cannot {verb}: work is still owed for {listed}{more}; finish, deliver or "
                            "resolve it first (nothing was deleted)")


def delete_rows(conn: sqlite3.Connection, ids: list[str]) -> None:
    """Delete the sessions and every row that belongs to them; other children are detached."""
    ids_json = _ids_json(ids)
    # A named parameter: the same list is read several times by one statement.
    members = "(SELECT value FROM json_each(:ids))"
    for table in SESSION_OWNED:  # the tables created on first use (the outbox) may be absent
        if table.at_open or table_exists(conn, table.name):
            for owned in table.owned_by(members):
                conn.execute(f"DELETE FROM {table.name} WHERE {owned}", {"ids": ids_json})
    # A child that is not part of what goes (a branch, a plain child) outlives its parent as a
    # root session: the link goes, the child stays.
    conn.execute(f"UPDATE sessions SET parent_session_id = NULL WHERE parent_session_id IN {members} "
                 f"AND id NOT IN {members}", {"ids": ids_json})
    # The prompts they named, filed once for every session that shares them, go with the last of those.
    prompts = [r[0] for r in conn.execute(f"SELECT DISTINCT system_prompt_hash FROM sessions WHERE id IN {members} "
                                          "AND system_prompt_hash IS NOT NULL", {"ids": ids_json})]
    conn.execute(f"DELETE FROM sessions WHERE id IN {members}", {"ids": ids_json})
    forget_prompts(conn, prompts)


@dataclass(frozen=True)
class Plan:
    """What a sweep takes: whole conversations, and the ones left because work is owed."""
    groups: list[list[str]]
    owed: dict[str, str]

    @property
    def ids(self) -> list[str]:
        return [sid for group in self.groups for sid in group]


def plan_sweep(conn: sqlite3.Connection, selection: Selection, *, delegates: bool = True,
               deleting: bool = True, selected: set[str] | None = None) -> Plan:
    """Group the selected sessions into whole conversations; keep only those fully selected and owing nothing.

    A compression chain is taken only when every session in it is selected (so, with an age
    bound, the newest of them is past it); delegates spawned by a taken conversation go with
    it, and must be ended too. When `deleting`, a conversation with owed work is left whole
    (see `Plan.owed`). `selected` is the selection's ids when the caller has read them already.
    """
    if selected is None:
        selected = {r[0] for r in conn.execute(f"SELECT s.id FROM sessions s WHERE {selection.where}",
                                               selection.params)}
    if not selected:
        return Plan([], {})
    spawned = _delegate_index(conn) if delegates else {}
    groups = _whole_conversations(compression_links(conn), selected, spawned, delegates)
    if delegates:
        groups = _without_live_delegates(conn, groups, selected)
    return _without_owed_work(conn, groups) if deleting else Plan(groups, {})


def _whole_conversations(links: dict[str, str], selected: set[str], spawned: dict[str, set[str]],
                         delegates: bool) -> list[list[str]]:
    # The compression chains whose every session is selected, each with its delegates when asked.
    back = {child: parent for parent, child in links.items()}
    groups: list[list[str]] = []
    seen: set[str] = set()
    # Spawners first, so a selected delegate joins the conversation that spawned it.
    spawned_ids = {d for found in spawned.values() for d in found}
    # Most sessions (every cron run) have no compression link and no delegate: each is a whole
    # conversation of its own, with no walk to make.
    linked = links.keys() | back.keys() | spawned.keys() | spawned_ids
    if not linked:
        return [[sid] for sid in sorted(selected)]
    order = sorted(selected, key=lambda s: (s in spawned_ids, s)) if spawned_ids else sorted(selected)
    for sid in order:
        if sid not in linked:
            groups.append([sid])
            continue
        if sid in seen:
            continue
        chain = conversation(sid, links, back)
        seen.update(chain)
        if all(member in selected for member in chain):
            group = [m for m in (with_delegates(chain, spawned) if delegates else chain) if m in chain or m not in seen]
            seen.update(group)
            groups.append(group)
    return groups


def _without_live_delegates(conn: sqlite3.Connection, groups: list[list[str]], selected: set[str]) -> list[list[str]]:
    # A delegate that came along unselected must have ended: a running one keeps its conversation.
    extra = [sid for group in groups for sid in group if sid not in selected]
    if not extra:
        return groups
    live = {r[0] for r in conn.execute("SELECT id FROM sessions WHERE ended_at IS NULL AND id IN "
                                       "(SELECT value FROM json_each(?))", (_ids_json(extra),))}
    return [g for g in groups if not live.intersection(g)]


def _without_owed_work(conn: sqlite3.Connection, groups: list[list[str]]) -> Plan:
    owed = owed_work(conn, [sid for group in groups for sid in group])
    if not owed:
        return Plan(groups, {})
    kept = [g for g in groups if not owed.keys() & set(g)]
    for group in groups:
        if owed.keys() & set(group):
            logger.info("left conversation %s: work is still owed (%s)", group[0],
                        "; ".join(owed[s] for s in group if s in owed))
    return Plan(kept, owed)




# What a prune candidate shows, every column in idx_sessions_ended: read without a row. The
# columns are in the order _as_candidates unpacks them.
_CANDIDATE_SQL = ("SELECT s.id, s.source, s.model, s.title, s.started_at, s.ended_at, s.end_reason, s.message_count, "
                  "COALESCE(s.archived, 0), s.parent_session_id FROM sessions s")


# The same without the two columns almost no candidate sets (archived, a parent), for a selection
# where none does: each column read costs the sqlite3 module a call into SQLite per row (on
# Python 3.11 releasing and taking back the GIL too), and a prune lists thousands.
_UNMARKED_CANDIDATE_SQL = ("SELECT s.id, s.source, s.model, s.title, s.started_at, s.ended_at, s.end_reason, "
                           "s.message_count FROM sessions s")
_MARKED = "(COALESCE(s.archived, 0) != 0 OR s.parent_session_id IS NOT NULL)"


def _candidate_rows(conn: sqlite3.Connection, root_of: dict[str, str]) -> list[dict[str, Any]]:
    # Every session of a plan has ended. For many, `+id` keeps SQLite off the id index: one pass
    # over idx_sessions_ended reads no row, where a lookup per id reads each row past its prompt.
    by = "s.ended_at IS NOT NULL AND +s.id" if len(root_of) > _LOOKUPS_MAX else "s.id"
    return _as_candidates(conn.execute(f"{_CANDIDATE_SQL} WHERE {by} IN (SELECT value FROM json_each(?)) "
                                       "ORDER BY s.started_at, s.id", (_ids_json(root_of),)), root_of)


def _as_unmarked_candidates(rows: Iterable[tuple[Any, ...]], root_of: dict[str, str]) -> list[dict[str, Any]]:
    # Rows of _UNMARKED_CANDIDATE_SQL: as _as_candidates makes them, archived 0 and no parent.
    return [{"id": sid, "source": source, "model": model, "title": title, "started_at": started_at,
             "ended_at": ended_at, "end_reason": end_reason, "message_count": message_count, "archived": 0,
             "parent_session_id": None, "conversation_id": root_of[sid]}
            for sid, source, model, title, started_at, ended_at, end_reason, message_count in rows
            if sid in root_of]


def _as_candidates(rows: Iterable[tuple[Any, ...]], root_of: dict[str, str]) -> list[dict[str, Any]]:
    # Rows of _CANDIDATE_SQL, those of the plan only, each with the conversation it belongs to.
    # One dict display per row, half the time of dict(zip(...)), in a comprehension: a prune can
    # list thousands.
    return [{"id": sid, "source": source, "model": model, "title": title, "started_at": started_at,
             "ended_at": ended_at, "end_reason": end_reason, "message_count": message_count, "archived": archived,
             "parent_session_id": parent, "conversation_id": root_of[sid]}
            for sid, source, model, title, started_at, ended_at, end_reason, message_count, archived, parent in rows
            if sid in root_of]


# --- the calls -----------------------------------------------------------------------------------

def list_prune_candidates(conn: sqlite3.Connection, older_than_days: Any = None, source: Any = None,
                          filters: Keywords | None = None, *, now: float | None = None) -> list[dict[str, Any]]:
    """Return the sessions prune_sessions with the same arguments would delete, oldest first."""
    selection = select_sessions(older_than_days, source, filters, now=now)
    # The selection's own rows, in the order shown: most candidates are among them, so they are
    # read once, not found again by id; without the archived and parent columns when no row sets
    # them (one pass over the index, stopped at the first that does).
    unmarked = conn.execute(f"SELECT 1 FROM sessions s WHERE {selection.where} AND {_MARKED} LIMIT 1",
                            selection.params).fetchone() is None
    rows = conn.execute(f"{_UNMARKED_CANDIDATE_SQL if unmarked else _CANDIDATE_SQL} WHERE {selection.where} "
                        "ORDER BY s.started_at, s.id", selection.params).fetchall()
    selected = {row[0] for row in rows}
    plan = plan_sweep(conn, selection, selected=selected)
    root_of = {sid: group[0] for group in plan.groups for sid in group}
    if not root_of.keys() <= selected:
        return _candidate_rows(conn, root_of)  # a delegate that came along unselected: read them all by id
    return _as_unmarked_candidates(rows, root_of) if unmarked else _as_candidates(rows, root_of)


def prune_sessions(conn: sqlite3.Connection, older_than_days: Any = 90, source: Any = None,
                   filters: dict[str, Any] | None = None, *, now: float | None = None) -> list[str]:
    """Delete the ended conversations matching the filters; return the ids deleted.

    A conversation owing work is left (and logged) rather than failing the whole prune.
    """
    plan = plan_sweep(conn, select_sessions(older_than_days, source, filters, now=now))
    if plan.ids:
        delete_rows(conn, plan.ids)
    return plan.ids


def archive_sessions(conn: sqlite3.Connection, older_than_days: Any = None, source: Any = None,
                     filters: Keywords | None = None, *, now: float | None = None) -> int:
    """Archive the ended, unarchived conversations matching the filters; return how many sessions."""
    selection = select_sessions(older_than_days, source, filters, now=now)
    selection = Selection(selection.where + " AND COALESCE(s.archived, 0) = 0", selection.params)
    ids = plan_sweep(conn, selection, delegates=False, deleting=False).ids
    conn.execute("UPDATE sessions SET archived = 1, auto_archived = 0 WHERE id IN (SELECT value FROM json_each(?))",
                 (_ids_json(ids),))
    return len(ids)


def _explicit(conn: sqlite3.Connection, session_ids: list[str]) -> tuple[list[str], tuple[str, str] | None]:
    """Return what deleting these sessions takes (their whole conversations and their delegates),
    and the first (asked session, live tip) where that would take a live conversation through an earlier part."""
    links = compression_links(conn)
    back = {child: parent for parent, child in links.items()}
    spawned = _delegate_index(conn)
    asked = set(session_ids)
    out: list[str] = []
    live_tip: tuple[str, str] | None = None
    for sid in session_ids:
        if sid in out:
            continue
        chain = conversation(sid, links, back)
        tip = chain[-1]
        if live_tip is None and tip not in asked and tip != sid and conn.execute(
                "SELECT 1 FROM sessions WHERE id = ? AND ended_at IS NULL", (tip,)).fetchone():
            live_tip = (sid, tip)
        out.extend(s for s in with_delegates(chain, spawned) if s not in out)
    return out, live_tip


@dataclass(frozen=True)
class DeletePlan:
    """What deleting some sessions removes, computed before anything is deleted, or why the delete is refused."""
    asked: list[str]  # the ids asked for (non-empty strings, each once), known or not
    ids: list[str]  # every session that goes: each conversation oldest first, then the delegates it spawned
    live_tip: tuple[str, str] | None = None  # (an asked session, the live session its conversation continues in)
    owed: dict[str, str] = field(default_factory=dict)  # {session: the work still owed for it}

    def refusal(self) -> SessionBusyError | None:
        """Return the error the delete raises instead of deleting anything, or None when it may go ahead."""
        if self.live_tip is not None:
            sid, tip = self.live_tip
            return SessionBusyError(
                f"session {sid!r} is an earlier part of a conversation that continues in live session {tip!r}; "
                f"deleting it would delete that live session too. Delete the conversation by its current "
                f"id {tip!r}, or end {tip!r} first (nothing was deleted)")
        if self.owed:
            return _busy_error(self.owed, "delete " + (repr(self.asked[0]) if len(self.asked) == 1
                                                       else f"{len(self.asked)} sessions"))
        return None


NO_DELETE = DeletePlan([], [])  # the plan for an id no session can have


def plan_delete(conn: sqlite3.Connection, session_ids: Iterable[Any]) -> DeletePlan:
    """Return what deleting the listed sessions would remove (and whether it is refused), changing nothing.

    Entries that are not non-empty strings, repeats and unknown ids are left out of the plan.
    """
    wanted = list(dict.fromkeys(s for s in session_ids if isinstance(s, str) and s))
    if not wanted:
        return DeletePlan([], [])
    known = {r[0] for r in conn.execute("SELECT id FROM sessions WHERE id IN (SELECT value FROM json_each(?))",
                                        (_ids_json(wanted),))}
    ids, live_tip = _explicit(conn, [s for s in wanted if s in known])
    # Owed work is looked for only when nothing refuses the delete before it.
    owed = owed_work(conn, ids) if ids and live_tip is None else {}
    return DeletePlan(wanted, ids, live_tip, owed)


def run_delete(conn: sqlite3.Connection, plan: DeletePlan) -> list[str]:
    """Carry out a plan made in this transaction: raise its refusal, or delete its sessions; return the ids deleted."""
    refusal = plan.refusal()
    if refusal is not None:
        raise refusal
    if plan.ids:
        delete_rows(conn, plan.ids)
    return plan.ids


def id_list(session_ids: Any) -> list[Any]:
    """Return a bulk call's ids as a list; a lone string or a non-iterable raises ValueError."""
    if isinstance(session_ids, (str, bytes)) or not isinstance(session_ids, Iterable):
        raise ValueError(f"session_ids must be a list of session ids, not {type(session_ids).__name__}")
    return list(session_ids)


def delete_sessions(conn: sqlite3.Connection, session_ids: Iterable[Any]) -> list[str]:
    """Delete the listed sessions with their conversations and delegates; return the ids deleted.

    Entries that are not non-empty strings, repeats and unknown ids are skipped. Raises
    SessionBusyError, deleting nothing, while work is owed for any session it would take or
    when it would take a live conversation through one of its earlier parts.
    """
    return run_delete(conn, plan_delete(conn, session_ids))


def get_session_delete_plan(conn: sqlite3.Connection, session_id: str) -> DeletePlan:
    """Return what delete_session(session_id) would remove, or why it would refuse; no ids for an unknown one."""
    check_id("session_id", session_id)
    return plan_delete(conn, [session_id])


def get_session_delete_targets(conn: sqlite3.Connection, session_id: str) -> list[str]:
    """Return what delete_session would remove: the session, then the rest of its conversation and its delegates.

    The whole compression chain goes with any of its sessions (unlike hermes-agent 0.20.1,
    which detaches the other parts); [] for an unknown id.
    """
    taken = get_session_delete_plan(conn, session_id).ids
    return [session_id, *(sid for sid in taken if sid != session_id)] if taken else []


def delete_session_expecting(conn: sqlite3.Connection, session_id: str, expected_delete_ids: Any) -> list[str]:
    """Delete the session as delete_sessions does, only if it takes exactly `expected_delete_ids`; return the ids deleted.

    The targets are planned again here, inside the deleting transaction: a delegate that appeared
    since the caller read them makes this delete nothing ([]), as does an unknown id.
    """
    expected = id_list(expected_delete_ids)
    for sid in expected:
        check_id("expected_delete_ids", sid)
    plan = get_session_delete_plan(conn, session_id)
    if not plan.ids or set(plan.ids) != set(expected):
        return []
    return run_delete(conn, plan)


def count_open_prune_matches(conn: sqlite3.Connection, older_than_days: float | None = None, source: str | None = None,
                             filters: Keywords | None = None, *, now: float | None = None) -> int:
    """Return how many sessions match the prune filters but are left by a prune because they are still open."""
    selection = select_sessions(older_than_days, source, filters, now=now)
    # The same filters with the one safety condition turned round: open instead of ended.
    where = selection.where.replace("s.ended_at IS NOT NULL", "s.ended_at IS NULL", 1)
    return conn.execute(f"SELECT COUNT(*) FROM sessions s WHERE {where}", selection.params).fetchone()[0]


def _empty_selection() -> Selection:
    return Selection("s.ended_at IS NOT NULL AND COALESCE(s.archived, 0) = 0 AND COALESCE(s.message_count, 0) = 0 "
                     "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id) "
                     "AND NOT EXISTS (SELECT 1 FROM sessions d WHERE d.parent_session_id = s.id "
                     f"AND json_valid(d.model_config) AND json_extract(d.model_config, '{_DELEGATE_MARK}') IS NOT NULL)",
                     ())


def count_empty_sessions(conn: sqlite3.Connection) -> int:
    """Return how many sessions delete_empty_sessions would delete now."""
    return len(plan_sweep(conn, _empty_selection(), delegates=False).ids)


def delete_empty_sessions(conn: sqlite3.Connection) -> list[str]:
    """Delete ended, unarchived sessions without a single message (whole conversations only); return their ids.

    A session that spawned delegates is not empty; plain children are detached.
    """
    plan = plan_sweep(conn, _empty_selection(), delegates=False)
    if plan.ids:
        delete_rows(conn, plan.ids)
    return plan.ids


def delete_session_if_empty(conn: sqlite3.Connection, session_id: Any) -> bool:
    """Delete the session only if it never gained resumable content; return whether it did.

    Empty means: no message rows, no title, no child sessions, no compression ancestor and no
    owed work. An unknown id gives False.
    """
    if not isinstance(session_id, str) or not session_id:
        return False
    row = conn.execute(
        "SELECT 1 FROM sessions s WHERE s.id = ? AND s.title IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id) "
        "AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent_session_id = s.id)", (session_id,)).fetchone()
    if row is None or session_id in compression_links(conn).values() or owed_work(conn, [session_id]):
        return False
    delete_rows(conn, [session_id])
    return True


# --- transcript files ----------------------------------------------------------------------------

_DUMP_SUFFIX = re.compile(r"[^_/\\]*\.json")


def _safe_name(session_id: str) -> bool:
    return session_id not in (".", "..") and not any(c in session_id for c in "/\\\x00")


def remove_transcripts(sessions_dir: Any, session_ids: Iterable[str]) -> int:
    """Remove `<id>.json`, `<id>.jsonl` and `request_dump_<id>_<n>.json` of each session; return how many files.

    Ids that would name a path outside `sessions_dir` are skipped; a file that cannot be removed
    is logged and skipped. Run it after the deleting transaction committed.
    """
    if sessions_dir is None or not Path(sessions_dir).is_dir():
        return 0
    ids = [sid for sid in session_ids if _safe_name(sid)]
    wanted = {f"{sid}.json" for sid in ids} | {f"{sid}.jsonl" for sid in ids}
    prefixes = tuple(f"request_dump_{sid}_" for sid in ids)
    removed = 0
    for path in Path(sessions_dir).iterdir():
        if path.name not in wanted and not _is_dump(path.name, prefixes):
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove transcript file %s: %s", path, exc)
    return removed


def _is_dump(name: str, prefixes: tuple[str, ...]) -> bool:
    # request_dump_<id>_<n>.json of one of the sessions, and not of another id that merely starts alike.
    return name.startswith(prefixes) and any(
        name.startswith(p) and _DUMP_SUFFIX.fullmatch(name[len(p):]) for p in prefixes)


# --- the public deleting calls: rows in the caller's transaction, files after its COMMIT ----------

def _files_after_commit(txn: Transaction, sessions_dir: Any, removed: list[str]) -> None:
    # Deferred to the outermost COMMIT: a rolled-back delete (an enclosing transaction too) keeps its files.
    if removed:
        txn.after_commit(lambda: remove_transcripts(sessions_dir, removed))


def delete_sessions_and_transcripts(txn: Transaction, session_ids: list[str],
                                    sessions_dir: str | os.PathLike | None = None) -> int:
    """Delete the listed sessions (conversations and delegates with them) in one transaction; return how many went."""
    removed = delete_sessions(txn.conn, id_list(session_ids))
    _files_after_commit(txn, sessions_dir, removed)
    return len(removed)


def delete_session_and_transcripts(txn: Transaction, session_id: str, sessions_dir: str | os.PathLike | None = None,
                                   expected_delete_ids: list[str] | None = None) -> bool:
    """Delete the session with its conversation and delegates (if given, only when exactly `expected_delete_ids`)."""
    if expected_delete_ids is None:
        removed = delete_sessions(txn.conn, [check_id("session_id", session_id)])
    else:
        removed = delete_session_expecting(txn.conn, session_id, expected_delete_ids)
    _files_after_commit(txn, sessions_dir, removed)
    return bool(removed)


def prune_sessions_and_transcripts(txn: Transaction, older_than_days: float | None = 90, source: str | None = None,
                                   sessions_dir: str | os.PathLike | None = None,
                                   filters: Keywords | None = None) -> int:
    """Delete ended conversations started more than `older_than_days` ago (and matching `filters`); return how many sessions."""
    removed = prune_sessions(txn.conn, older_than_days, source, filters)
    _files_after_commit(txn, sessions_dir, removed)
    return len(removed)


def delete_empty_sessions_and_transcripts(txn: Transaction, sessions_dir: str | os.PathLike | None = None) -> int:
    """Delete ended, unarchived sessions that never got a message; return how many."""
    removed = delete_empty_sessions(txn.conn)
    _files_after_commit(txn, sessions_dir, removed)
    return len(removed)


def delete_session_if_empty_and_transcripts(txn: Transaction, session_id: str,
                                            sessions_dir: str | os.PathLike | None = None) -> bool:
    """Delete the session only if it has no messages, title or children; return whether it went."""
    removed = delete_session_if_empty(txn.conn, session_id)
    _files_after_commit(txn, sessions_dir, [session_id] if removed else [])
    return removed


# --- never-active keyed sessions: opened for a chat, then never used ------------------------------

# Keyed and still open, without one sign of a turn: no message, token, tool or API call, activity
# or title. The ended-only prune never reaches such a row; pinned and archived rows stay by intent.
_NEVER_ACTIVE_SQL = ("s.session_key IS NOT NULL AND s.ended_at IS NULL AND s.started_at < ? "
                     "AND COALESCE(s.message_count, 0) = 0 AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id) "
                     "AND COALESCE(s.input_tokens, 0) = 0 AND COALESCE(s.output_tokens, 0) = 0 "
                     "AND COALESCE(s.tool_call_count, 0) = 0 AND COALESCE(s.api_call_count, 0) = 0 "
                     "AND s.last_activity_at IS NULL AND s.title IS NULL "
                     "AND COALESCE(s.pinned, 0) = 0 AND COALESCE(s.archived, 0) = 0")


def list_never_active_keyed_sessions(conn: sqlite3.Connection, *, older_than_days: float,
                                     now: float | None = None) -> list[dict[str, Any]]:
    """Return open keyed sessions started more than `older_than_days` ago that never had a turn, oldest first."""
    cutoff = (time.time() if now is None else now) - check_number("older_than_days", older_than_days) * DAY_S
    cur = conn.execute("SELECT s.id, s.session_key, s.source, s.chat_id, s.chat_type, s.user_id, s.started_at "
                       f"FROM sessions s WHERE {_NEVER_ACTIVE_SQL} ORDER BY s.started_at, s.rowid DESC", (cutoff,))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def prune_never_active_keyed_sessions_and_transcripts(txn: Transaction, *, older_than_days: float,
                                                      sessions_dir: str | os.PathLike | None = None,
                                                      now: float | None = None) -> tuple[int, int]:
    """Delete never-active keyed sessions and the routing entries naming them; return (sessions, routing entries).

    The entries go first, in the same transaction, so the gateway never resumes a session that
    is gone. The sessions go through the delete planner (its refusals and cascades hold), and
    their transcript files after COMMIT.
    """
    ids = [row["id"] for row in list_never_active_keyed_sessions(txn.conn, older_than_days=older_than_days, now=now)]
    if not ids:
        return 0, 0
    routes = 0 if not table_exists(txn.conn, "gateway_routing") else txn.conn.execute(
        "DELETE FROM gateway_routing WHERE json_valid(entry_json) AND json_extract(entry_json, '$.session_id') "
        "IN (SELECT value FROM json_each(?))", (_ids_json(ids),)).rowcount
    removed = delete_sessions(txn.conn, ids)
    _files_after_commit(txn, sessions_dir, removed)
    return len(removed), routes


# --- kanban workers' sessions, recorded as cli before workers tagged themselves -------------------

KANBAN_RETAG_KEY = "kanban_worker_source_retagged:"  # state_meta, + the workspaces root: done once per root


def retag_kanban_worker_sessions(conn: sqlite3.Connection, workspaces_root: str) -> int:
    """Move `cli` sessions whose cwd is `workspaces_root` or under it to source `kanban`, once per root; return how many."""
    root = _under("workspaces_root", workspaces_root)[0]
    key = KANBAN_RETAG_KEY + root
    if get_meta(conn, key) is not None:
        return 0
    moved = conn.execute(f"UPDATE sessions SET source = 'kanban' WHERE source = 'cli' AND {cwd_under_sql()}",
                         cwd_under_values(root)).rowcount
    set_meta(conn, key, "1")
    return moved


# --- state_meta and automatic maintenance ---------------------------------------------------------

def get_meta(conn: sqlite3.Connection, key: Any) -> str | None:
    """Return the state_meta value stored under `key`, or None."""
    row = conn.execute("SELECT value FROM state_meta WHERE key = ?", (check_id("key", key),)).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def set_meta(conn: sqlite3.Connection | sqlite3.Cursor, key: Any, value: Any) -> None:
    """Store `value` (text, or a number stored as its text) under `key`, replacing what was there (`conn` may be a cursor)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"value must be a string or a finite number, not {type(value).__name__}")
    conn.execute("INSERT INTO state_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (check_id("key", key), str(value)))


def list_meta_prefix(conn: sqlite3.Connection, prefix: str) -> list[tuple[str, str | None]]:
    """Return [(key, value), ...] of the state_meta keys starting with `prefix` (matched literally, case kept), by key."""
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, not {type(prefix).__name__}")
    if not prefix:
        return []  # no namespace named: hermes-agent answers nothing rather than every key
    low, high = prefix_range(check_id("prefix", prefix))
    rows = conn.execute("SELECT key, value FROM state_meta WHERE key >= ?" + ("" if high is None else " AND key < ?")
                        + " ORDER BY key", (low,) if high is None else (low, high))
    return [(key, None if value is None else str(value)) for key, value in rows]


def claim_auto_prune(conn: sqlite3.Connection, min_interval_hours: Any, *, now: float | None = None) -> bool:
    """Record that an automatic prune runs now, unless one ran within `min_interval_hours`; return whether to run.

    A marker that is not a number, or lies in the future (the clock stepped back), counts as
    no earlier run. Call it in the transaction that prunes, so a failed prune leaves no marker.
    """
    interval_s = check_number("min_interval_hours", min_interval_hours) * 3600.0
    return _claim_marker(conn, AUTO_PRUNE_KEY, interval_s, time.time() if now is None else now)


def _claim_marker(conn: sqlite3.Connection, key: str, interval_s: float, now: float) -> bool:
    # The state_meta marker of a periodic job: set it to `now` and say the job runs, unless it
    # ran within `interval_s`. A marker that is not a number, or lies in the future (the clock
    # stepped back), counts as no earlier run.
    try:
        last = float(get_meta(conn, key) or "nan")
    except ValueError:
        last = math.nan
    if math.isfinite(last) and last <= now and now - last < interval_s:
        return False
    set_meta(conn, key, repr(now))
    return True


def vacuum_due(conn: sqlite3.Connection, min_vacuum_interval_days: float, *, now: float | None = None) -> bool:
    """Return whether the last automatic VACUUM (state_meta `last_vacuum`) is at least `min_vacuum_interval_days` old."""
    now = time.time() if now is None else now
    try:
        last = float(get_meta(conn, VACUUM_KEY) or "nan")
    except ValueError:
        last = math.nan
    # No marker, an unreadable one or one in the future (the clock stepped back): due.
    return not (math.isfinite(last) and last <= now and now - last < min_vacuum_interval_days * DAY_S)


def auto_prune_and_vacuum(write: Callable[[], ContextManager[sqlite3.Connection]], vacuum: Callable[[], Any] | None,
                          retention_days: Any, min_interval_hours: Any, sessions_dir: Any = None,
                          min_vacuum_interval_days: Any = 30) -> dict[str, Any]:
    """Prune conversations ended and older than `retention_days` at most once per interval, then VACUUM if any went.

    `write()` opens one write transaction; the marker and the prune share it. The VACUUM has
    its own, longer throttle: at most once per `min_vacuum_interval_days` (0: whenever
    something went), recorded once it ran. Returns {"skipped", "pruned", "vacuumed"}, plus
    "error" when the store refused (the error is logged, never raised: this runs unattended).
    Bad arguments raise ValueError.
    """
    select_sessions(retention_days)  # bad arguments are the caller's error, raised before any write
    check_number("min_interval_hours", min_interval_hours)
    vacuum_days = check_number("min_vacuum_interval_days", min_vacuum_interval_days)
    result: dict[str, Any] = {"skipped": True, "pruned": 0, "vacuumed": False}
    try:
        with write() as conn:
            if not claim_auto_prune(conn, min_interval_hours):
                return result
            removed = prune_sessions(conn, retention_days)
            vacuuming = bool(removed) and vacuum is not None and vacuum_due(conn, vacuum_days)
        result.update(skipped=False, pruned=len(removed))
        remove_transcripts(sessions_dir, removed)
        if vacuuming and vacuum is not None:
            vacuum()
            result["vacuumed"] = True
            with write() as conn:  # only once it ran: a VACUUM that failed is due again next time
                set_meta(conn, VACUUM_KEY, repr(time.time()))
    except HermesStateError as exc:
        logger.warning("automatic prune stopped: %s", exc)
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


# --- hermes-agent 0.20.1: bare tool-call markers left as assistant text ---------------------------
# Some agent versions saved a tool-calling assistant turn's text as just "[tool_name]". Such a
# marker reads as if the model had said it; the rows keep their tool calls, only the text goes.
_TOOL_CALL_MARKER = re.compile(r"\[[A-Za-z_][A-Za-z0-9_.\-]*\]")
_MARKER_CANDIDATES_SQL = ("SELECT id, content FROM messages WHERE role = 'assistant' AND tool_calls IS NOT NULL "
                          "AND content LIKE '%[%]%' ORDER BY id")


def stale_tool_call_marker_ids(conn: sqlite3.Connection) -> list[int]:
    """Return the ids of tool-calling assistant rows (any generation) whose whole text is a "[tool]" marker."""
    return [i for i, text in conn.execute(_MARKER_CANDIDATES_SQL)
            if isinstance(text, str) and _TOOL_CALL_MARKER.fullmatch(text.strip())]


def purge_stale_tool_call_markers(read: Callable[[], ContextManager[sqlite3.Connection]],
                                  write: Callable[[], ContextManager[sqlite3.Connection]],
                                  backup: Callable[[Path], Path] | None, db_path: Path,
                                  dry_run: Any = False) -> dict[str, Any]:
    """Empty the text of rows holding only a tool-call marker, after a copy of the file (`backup`); report them.

    Returns {"dry_run", "rows_affected", "row_ids", "backup_path"}. A dry run or a store with
    nothing to change writes nothing and copies nothing. Only `content` changes.
    """
    if not isinstance(dry_run, bool):
        raise ValueError(f"dry_run must be True or False, not {shown(dry_run)}")
    with read() as conn:
        ids = stale_tool_call_marker_ids(conn)
    copy = None
    if ids and not dry_run:
        if backup is not None:
            stamp = time.strftime("%Y%m%d_%H%M%S")
            target = db_path.with_name(f"{db_path.name}.pre-clean-markers-backup-{stamp}")
            n = 1
            while target.exists():
                target, n = target.with_name(f"{db_path.name}.pre-clean-markers-backup-{stamp}-{n}"), n + 1
            copy = str(backup(target))
        with write() as conn:  # what is a marker now, after the copy
            ids = stale_tool_call_marker_ids(conn)
            conn.executemany("UPDATE messages SET content = '' WHERE id = ?", [(i,) for i in ids])
    return {"dry_run": dry_run, "rows_affected": len(ids), "row_ids": ids, "backup_path": copy}


# hermes-agent 0.20's marker of the last idle-archive sweep (epoch seconds), in state_meta.
AUTO_ARCHIVE_KEY = "last_auto_archive"


def auto_archive_stale(write: Callable[[], ContextManager[sqlite3.Connection]], idle_days: Any,
                       min_interval_hours: Any, exclude_pinned: bool = True) -> dict[str, Any]:
    """Idle-archive stale conversations at most once per interval; return {"skipped", "archived"} (+ "error").

    The marker and the sweep share one write transaction. A store that refuses is logged and
    answered with "error", never raised (this runs unattended); bad arguments raise ValueError.
    """
    if idle_days is not None and not is_finite(idle_days):
        raise ValueError(f"idle_days must be a finite number of days, not {shown(idle_days)}")
    interval_s = check_number("min_interval_hours", min_interval_hours) * 3600.0
    result: dict[str, Any] = {"skipped": True, "archived": 0}
    try:
        with write() as conn:
            now = time.time()
            if not _claim_marker(conn, AUTO_ARCHIVE_KEY, interval_s, now):
                return result
            result.update(skipped=False, archived=archive_stale_sessions(conn, idle_days, exclude_pinned=exclude_pinned,
                                                                         now=now))
    except HermesStateError as exc:
        logger.warning("automatic archive stopped: %s", exc)
        result.update(skipped=False, error=f"{type(exc).__name__}: {exc}")
    return result


# --- hermes-agent's two start-up sweeps, on the planner above -------------------------------------

GHOST_SOURCE = "tui"
GHOST_MIN_AGE_S = DAY_S
ORPHANED_COMPRESSION_REASON = "orphaned_compression"
ORPHANED_COMPRESSION_MIN_AGE_S = 7 * DAY_S


def prune_empty_ghost_sessions(conn: sqlite3.Connection, *, now: float | None = None) -> list[str]:
    """Delete TUI sessions ended without a message or title, started over a day ago; return their ids."""
    selection = Selection(
        "s.source = ? AND s.ended_at IS NOT NULL AND s.title IS NULL AND COALESCE(s.archived, 0) = 0 "
        "AND s.started_at < ? AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)",
        (GHOST_SOURCE, (time.time() if now is None else now) - GHOST_MIN_AGE_S))
    plan = plan_sweep(conn, selection, delegates=False)
    if plan.ids:
        delete_rows(conn, plan.ids)
    return plan.ids


def prune_empty_ghost_sessions_and_transcripts(txn: Transaction, sessions_dir: str | os.PathLike | None = None) -> int:
    """Delete the empty TUI ghost sessions (their transcript files after COMMIT); return how many."""
    removed = prune_empty_ghost_sessions(txn.conn)
    if removed:
        txn.after_commit(lambda: remove_transcripts(sessions_dir, removed))
    return len(removed)


def finalize_orphaned_compression_sessions(conn: sqlite3.Connection, *, now: float | None = None) -> int:
    """End, as 'orphaned_compression', week-old compression continuations that never made an API call; return how many."""
    now = time.time() if now is None else now
    return conn.execute(
        "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE ended_at IS NULL AND COALESCE(api_call_count, 0) = 0 "
        "AND started_at < ? AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = sessions.id) "
        "AND EXISTS (SELECT 1 FROM sessions p WHERE p.id = sessions.parent_session_id AND p.end_reason = ?)",
        (now, ORPHANED_COMPRESSION_REASON, now - ORPHANED_COMPRESSION_MIN_AGE_S, COMPRESSION_END_REASON)).rowcount
