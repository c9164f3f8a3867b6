"""Session rows: create, read, update, end/reopen, token counters and billing route, archive flags.

Owns: the `sessions` table's rows and the rules on them: which columns a caller may set and
with which verb, the first end wins, token counters and the per-model usage rows, the archive
flags and the idle sweep, the workspace columns and session counts, and the one builder of
session filters (`session_filters`, with `filter_name`, `filter_names` and the other checks every
caller selecting sessions uses, raising SessionFilterError);
hermes-agent's columns of the row too: the handoff lifecycle (`handoff_state`, `handoff_platform`,
`handoff_error`: a request makes it `pending`, the platform that takes it over claims it, and it
ends `completed` or `failed`) and the gateway peer (session_key, chat_id, chat_type, thread_id,
display_name, origin_json, expiry_finalized) with the lookups a gateway makes after a restart (the
latest recoverable session of a peer, the current session of each key, the live session of a
chat), the per-chat hygiene failure streak, and adopting an orphaned gateway session.
Also the SQL fragments other writers reuse so each rule is written once: `ARCHIVE_LIFT_SQL`
(writing to a session lifts an archive only the idle sweep made); `COUNTER_RESET_SQL` is the dictionary's.
Does not own: message rows (hermes_state_messages), lineage walks (hermes_state_lineage), the
gateway's routing entries and delivery ledgers (hermes_state_routing, hermes_state_gateway).

Transaction contract: write functions run inside the caller's write transaction (the facade
opens it) and never open or commit one themselves; every check that can fail runs before the
first statement that changes anything. Read functions run under the caller's lock.
"""
from __future__ import annotations

import inspect
import json
import sqlite3
import threading
import time
from contextlib import AbstractContextManager
from enum import Enum
from typing import Any, Callable, Iterable, cast

import hermes_state_lineage as lineage
from hermes_state_common import (ARCHIVED_SQL, COUNTER_RESET_SQL, DAY_S, MARKED_SESSION_SQL, Keywords,
                                 INT_MAX, SESSION_COLUMN_NAMES, SESSION_ROW_SQL, SESSIONS, TABLE_COLUMNS, check_count,
                                 check_id, check_number, encode_json, is_finite, logger, prompt_hash, replace_surrogates,
                                 row_dicts, session_dicts, shown)
from hermes_state_errors import (AdoptionRefusedError, HermesStateError, SessionClosedByCompressionError,
                                 SessionFilterError, SessionNotFoundError)
from hermes_state_fork import tell_child
from hermes_state_lineage import compression_ancestor_ids
from hermes_state_titles import check_title_free, normalize_title, sanitize_title, title_holder

# Writing to a session resumes it: an archive only the idle sweep made is lifted, never a
# deliberate one. An assignment list for UPDATE sessions SET ...
ARCHIVE_LIFT_SQL = "archived = CASE WHEN auto_archived = 1 THEN 0 ELSE archived END, auto_archived = 0"
# COUNTER_RESET_SQL (the live generation is empty again) comes from the data dictionary, which
# defines the counters; it stays importable from here.

# Columns the library maintains itself (the dictionary gives them no caller rule); callers may
# not set them through **columns.
_MANAGED_SESSION_COLUMNS = frozenset(c.name for c in SESSIONS.columns if c.rule is None)
# Columns update_session refuses, each with the verb that owns it. create_session still takes
# them, so an import can write a row exactly as it was exported.
_VERB_SESSION_COLUMNS = {
    "user_id": "nothing: it is set when the session is created and never changed afterwards",
    "ended_at": "end_session (the first end wins) or reopen_session",
    "end_reason": "end_session (the first end wins) or reopen_session",
    "archived": "archive_session or unarchive_session",
    "auto_archived": "auto_archive, or unarchive_session to clear it",
    "pinned": "pin_session",
    # The creation time also stamps the compression edge (child started_at = parent ended_at).
    "started_at": "nothing: it is the creation time, and a rotation child's start marks its compression edge",
}


# Each settable column's value is checked by its declared rule (times and costs are finite
# non-negative numbers, since text there would break sorting and the idle sweep; counters
# non-negative 64-bit integers; flags 0/1).
_CHECK = {c.name: c.check for c in SESSIONS.columns if c.rule is not None}


def _session_values(columns: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(columns) - SESSION_COLUMN_NAMES)
    if unknown:
        raise ValueError(f"unknown session column(s): {', '.join(unknown)}")
    managed = sorted(set(columns) & _MANAGED_SESSION_COLUMNS)
    if managed:
        raise ValueError(f"session column(s) maintained by the library cannot be set: {', '.join(managed)}")
    out = {name: None if value is None else _CHECK[name](value) for name, value in columns.items()}
    if out.get("parent_session_id") is not None:
        check_id("parent_session_id", out["parent_session_id"])
    return out


# --- system prompts, as both programs read them -------------------------------------------------
# This library writes a prompt to sessions.system_prompt (what hermes-agent 0.19 reads) and files
# it under its hash as well (what hermes-agent 0.20 reads first: a stale hash would hide a newer
# prompt from it). Reads take the column, else the prompt the hash names (PROMPT_SQL).

def file_prompt(conn: sqlite3.Connection, values: dict[str, Any]) -> None:
    """When `values` sets system_prompt, set system_prompt_hash with it, filing the text in system_prompts.

    A prompt set to None clears the hash as well. The row is filed before the hash that names it
    is written (a file hermes-agent 0.20 made declares that reference).
    """
    if "system_prompt" not in values:
        return
    text = values["system_prompt"]
    if text is None:
        values["system_prompt_hash"] = None
        return
    key = prompt_hash(text)
    conn.execute("INSERT OR IGNORE INTO system_prompts (hash, prompt) VALUES (?, ?)", (key, text))
    values["system_prompt_hash"] = key


def forget_prompts(conn: sqlite3.Connection, hashes: Iterable[str | None]) -> int:
    """Remove the filed prompts among `hashes` that no session names any more; return how many went."""
    keys = sorted({h for h in hashes if isinstance(h, str)})
    if not keys:
        return 0
    return conn.execute("DELETE FROM system_prompts WHERE hash IN (SELECT value FROM json_each(?)) AND NOT EXISTS "
                        "(SELECT 1 FROM sessions s WHERE s.system_prompt_hash = system_prompts.hash)",
                        (json.dumps(keys),)).rowcount


def _prompt_hash_of(conn: sqlite3.Connection, session_id: str) -> str | None:
    row = conn.execute("SELECT system_prompt_hash FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else row[0]


def session_exists(conn: sqlite3.Connection, session_id: str) -> bool:
    """Return True when a session row with this id exists."""
    return conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None


def require_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Raise SessionNotFoundError unless the session exists."""
    if not session_exists(conn, session_id):
        raise SessionNotFoundError(f"session {session_id!r} not found")


def _updated_or_missing(cur: sqlite3.Cursor, session_id: str) -> None:
    # Folding the existence check into the UPDATE's rowcount saves a SELECT; a miss wrote nothing.
    if cur.rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


# --- session records ----------------------------------------------------------------------------

def create_session(conn: sqlite3.Connection, session_id: str, source: str, columns: dict[str, Any]) -> str:
    """Insert the session row, or fill the empty columns of an existing one; return the id.

    Idempotent, and the first write wins: on an existing id only columns still NULL take the
    given values (a gateway's bare row gains the agent's model and prompt later), while
    source and every column already set stay. user_id is never filled in afterwards: it
    names the principal the row was created for. An unknown column raises ValueError.
    """
    check_id("session_id", session_id)
    check_id("source", source)
    values = _session_values({k: v for k, v in columns.items() if v is not None})
    if session_exists(conn, session_id):
        _fill_empty_columns(conn, session_id, values)
        return session_id
    return _insert(conn, session_id, source, values)


def insert_session(conn: sqlite3.Connection, session_id: str, source: str, columns: dict[str, Any]) -> str:
    """Insert a new session row; raise ValueError for an id that exists already or an unknown column."""
    check_id("session_id", session_id)
    check_id("source", source)
    values = _session_values({k: v for k, v in columns.items() if v is not None})
    if session_exists(conn, session_id):
        raise ValueError(f"session {session_id!r} already exists")
    return _insert(conn, session_id, source, values)


def _insert(conn: sqlite3.Connection, session_id: str, source: str, values: dict[str, Any]) -> str:
    values.setdefault("started_at", time.time())
    if "title" in values:
        values["title"] = sanitize_title(values["title"])
        check_title_free(conn, values["title"], session_id)
    parent = values.get("parent_session_id")
    if parent is not None:
        require_session(conn, parent)
    file_prompt(conn, values)
    names = ["id", "source", *values]
    conn.execute(f"INSERT INTO sessions ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                 [session_id, source, *values.values()])
    return session_id


# Never filled in on a repeated create: fixed when the row was made, or kept by their own verb.
_FIXED_AT_CREATION = frozenset({"user_id", "started_at"}) | _VERB_SESSION_COLUMNS.keys()


def _fill_empty_columns(conn: sqlite3.Connection, session_id: str, values: dict[str, Any]) -> None:
    fill = {name: value for name, value in values.items() if name not in _FIXED_AT_CREATION}
    if fill.get("parent_session_id") == session_id:
        fill.pop("parent_session_id")
    if "title" in fill:
        fill["title"] = sanitize_title(fill["title"])
        if fill["title"] is None or title_holder(conn, fill["title"], session_id) is not None:
            fill.pop("title")  # a taken name is not worth failing the create over
    if fill.get("parent_session_id") is not None:
        require_session(conn, fill["parent_session_id"])
        if any(row["id"] == session_id for row in lineage.get_lineage(conn, fill["parent_session_id"])):
            raise ValueError(f"parent_session_id {fill['parent_session_id']!r} descends from {session_id!r}: "
                             "the link would make a cycle")
    if "system_prompt" in fill:
        # The prompt is set when either program stored one: hermes-agent 0.20 leaves the column NULL.
        if _prompt_hash_of(conn, session_id) is not None:
            fill.pop("system_prompt")
        elif conn.execute("SELECT system_prompt IS NULL FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]:
            file_prompt(conn, fill)
    if fill:
        conn.execute(f"UPDATE sessions SET {', '.join(f'{n} = COALESCE({n}, ?)' for n in fill)} WHERE id = ?",
                     [*fill.values(), session_id])


def ensure_session(conn: sqlite3.Connection, session_id: str, source: str, columns: dict[str, Any]) -> str:
    """Create the session unless it exists; an existing row is left exactly as it is.

    The columns are validated either way, so a bad name or value raises even when nothing is written.
    """
    _session_values({k: v for k, v in columns.items() if v is not None})
    if isinstance(session_id, str) and session_id and session_exists(conn, session_id):
        return session_id
    return create_session(conn, session_id, source, columns)


def get_session(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the session row as a dict, or None when it does not exist."""
    rows = session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.id = ?", (session_id,)))
    return rows[0] if rows else None


def end_session(conn: sqlite3.Connection, session_id: str, end_reason: str, *, now: float | None = None) -> None:
    """Mark the session ended; the first end wins and a later call changes nothing.

    Any reason is accepted, 'compression' too: a compression chain is built by ending the
    session so and creating its continuation with parent_session_id (rotate_session does
    both in one transaction). `reopen_session` clears the end, so a later end applies again.
    """
    check_id("end_reason", end_reason)
    _close(conn, session_id, end_reason, now)


def close_for_compression(conn: sqlite3.Connection, session_id: str, *, now: float) -> None:
    """End the session with end_reason 'compression' at `now` (rotate_session's step; nothing else calls it)."""
    _close(conn, session_id, lineage.COMPRESSION_END_REASON, now)


def _close(conn: sqlite3.Connection, session_id: str, end_reason: str, now: float | None) -> None:
    cur = conn.execute("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
                       (time.time() if now is None else now, replace_surrogates(end_reason), session_id))
    if cur.rowcount == 0:
        require_session(conn, session_id)


# An end a later session reset may take over: the agent closed its handle without the user
# ending the conversation, so the reset is the real end.
PROMOTABLE_END_REASON = "agent_close"


def promote_to_session_reset(conn: sqlite3.Connection, session_id: str, reason: str = "session_reset", *,
                             now: float | None = None) -> bool:
    """End a live session, or one only the agent's close ended, with `reason`; False for any other or unknown one."""
    check_id("reason", reason)
    return conn.execute("UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ? "
                        "AND (ended_at IS NULL OR end_reason = ?)",
                        (time.time() if now is None else now, replace_surrogates(reason), session_id,
                         PROMOTABLE_END_REASON)).rowcount > 0


def reopen_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear ended_at/end_reason, and an archive that only the idle sweep made.

    A session compression closed and continued elsewhere is refused with
    SessionClosedByCompressionError naming its live continuation: reopening it would fork the
    conversation. One closed so with no continuation (written by another program) reopens.
    """
    cur = conn.execute(
        f"UPDATE sessions SET ended_at = NULL, end_reason = NULL, {ARCHIVE_LIFT_SQL} "
        f"WHERE id = ? AND end_reason IS NOT '{lineage.COMPRESSION_END_REASON}'", (session_id,))
    if cur.rowcount:
        return
    require_session(conn, session_id)
    tip = lineage.live_continuation(conn, session_id)
    if tip is not None:
        raise SessionClosedByCompressionError(session_id, tip)
    conn.execute(f"UPDATE sessions SET ended_at = NULL, end_reason = NULL, {ARCHIVE_LIFT_SQL} WHERE id = ?",
                 (session_id,))


def update_session(conn: sqlite3.Connection, session_id: str, columns: Keywords) -> None:
    """Set the given columns (None clears one); unknown or library-kept columns raise ValueError.

    Columns another verb owns (user_id, started_at, ended_at, end_reason, archived, auto_archived, pinned)
    raise ValueError naming that verb: going around it would break its rule.
    """
    owned = sorted(set(columns) & _VERB_SESSION_COLUMNS.keys())
    if owned:
        raise ValueError("update_session cannot set " + "; ".join(
            f"{name} (use {_VERB_SESSION_COLUMNS[name]})" for name in owned))
    values = _session_values(columns)
    if "title" in values:
        values["title"] = normalize_title(values["title"])
    if "source" in values:
        check_id("source", values["source"])  # never cleared or blank: listings group by it
    if values.get("parent_session_id") == session_id:
        raise ValueError("a session cannot be its own parent")
    if not values:
        require_session(conn, session_id)
        return
    if values.get("title") is not None:
        check_title_free(conn, values["title"], session_id)
    if values.get("parent_session_id") is not None:
        require_session(conn, values["parent_session_id"])
    _update(conn, session_id, values)


_TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens",
                  "api_call_count")


_ROUTE_COLUMNS = ("billing_provider", "billing_base_url", "billing_mode")
_COST_LABELS = ("cost_status", "cost_source", "pricing_version")


def update_token_counts(conn: sqlite3.Connection, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                        cache_read_tokens: int = 0, cache_write_tokens: int = 0, reasoning_tokens: int = 0, *,
                        estimated_cost_usd: float | None = None, actual_cost_usd: float | None = None,
                        api_call_count: int = 0, model: str | None = None, billing_provider: str | None = None,
                        billing_base_url: str | None = None, billing_mode: str | None = None,
                        cost_status: str | None = None, cost_source: str | None = None,
                        pricing_version: str | None = None, absolute: bool = False,
                        now: float | None = None) -> None:
    """Add to (or, with `absolute`, set) the token counters, keep the billing route, record per-model usage.

    The session's route (model and billing provider, base URL and mode) is the one its
    first accounted call (api_call_count > 0) used: that call replaces the route the session
    was created with as a whole, so a fallback that answered first is what is billed. After
    it, and for calls that account nothing, a route field is only filled while empty, and
    only from a call on the session's own model (metadata about another route is ignored).
    update_session_model and update_session_billing_route change the route on purpose.
    Each incremental call also adds to the usage row of the model and route it used (the
    given model, else the session's); `absolute` sets the summary and records no usage row,
    since usage rows are sums of calls and a total would count them twice.
    """
    counts = _checked_counts((input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
                              api_call_count), estimated_cost_usd, actual_cost_usd)
    route = _checked_route(model, (billing_provider, billing_base_url, billing_mode))
    labels = _given(_COST_LABELS, (cost_status, cost_source, pricing_version))
    row = conn.execute("SELECT model, api_call_count FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    if not absolute:
        _check_sums_fit(conn, session_id, counts)
    sets = [f"{name} = ?" if absolute else f"{name} = COALESCE({name}, 0) + ?" for name in counts]
    params = list(counts.values())
    first_accounted = not absolute and counts["api_call_count"] > 0 and not (row[1] or 0) > 0
    route_sets, route_params = _route_sets(route, row[0], first_accounted)
    sets += route_sets + [f"{n} = ?" for n in labels]
    params += route_params + list(labels.values())
    conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", [*params, session_id])
    if absolute or not any(counts.values()):
        return
    usage_model = route["model"] or conn.execute("SELECT model FROM sessions WHERE id = ?",
                                                 (session_id,)).fetchone()[0]
    if usage_model is not None:
        _add_usage(conn, session_id, usage_model, route, counts, time.time() if now is None else now)


# --- the token queue: deltas a turn files cheaply, applied together later -------------------------

# The keyword arguments a queued delta may carry: update_token_counts' own, less the injected clock.
_DELTA_PARAMS = inspect.Signature([p for name, p in inspect.signature(update_token_counts).parameters.items()
                                   if name not in ("conn", "now")])


class TokenQueue:
    """A handle's queued token/cost deltas, applied in one write transaction by `drain`.

    Each delta is checked when it is queued (a mistake raises there, not later in a log); it
    keeps the time it was queued, so its usage row says when the call was made. Fork-safe: a
    forked child starts with an empty queue and a new lock, so the parent's deltas are applied
    once, by the parent (the child's copy of the lock may have been held when it was copied).
    """

    # Queued deltas past this many are applied by the queueing call itself (bounding what a
    # crash could lose and what the queue holds while nobody flushes).
    BATCH = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[str, dict[str, Any], float]] = []
        tell_child(self)

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, session_id: str, kwargs: dict[str, Any], *, now: float | None = None) -> int:
        """Check and queue one delta (update_token_counts' arguments); return how many wait now."""
        bound = _DELTA_PARAMS.bind(check_id("session_id", session_id), **kwargs).arguments
        bound.pop("session_id")
        _checked_counts(tuple(bound.get(n, 0) for n in _TOKEN_COLUMNS), bound.get("estimated_cost_usd"),
                        bound.get("actual_cost_usd"))
        _checked_route(bound.get("model"), tuple(bound.get(n) for n in _ROUTE_COLUMNS))
        _given(_COST_LABELS, tuple(bound.get(n) for n in _COST_LABELS))
        with self._lock:
            self._pending.append((session_id, bound, time.time() if now is None else now))
            return len(self._pending)

    def drain(self, write: Callable[[], AbstractContextManager[sqlite3.Connection]]) -> bool:
        """Apply every queued delta in one write transaction; return False (keeping them queued) if the store refused.

        A delta the store rejects (its session was deleted meanwhile) is logged and dropped
        alone, inside a savepoint, so it never costs the others.
        """
        with self._lock:
            taken, self._pending = self._pending, []
        if not taken:
            return True
        try:
            with write() as conn:
                for session_id, kwargs, queued_at in taken:
                    conn.execute("SAVEPOINT hermes_token_delta")
                    try:
                        update_token_counts(conn, session_id, **kwargs, now=queued_at)
                    except (HermesStateError, ValueError) as exc:
                        conn.execute("ROLLBACK TO hermes_token_delta")
                        logger.warning("queued token counts for session %r dropped: %s", session_id, exc)
                    conn.execute("RELEASE hermes_token_delta")
        except HermesStateError as exc:
            with self._lock:  # first again, in their order, ahead of any queued meanwhile
                self._pending[:0] = taken
            logger.warning("queued token counts not applied yet (%d waiting): %s", len(taken), exc)
            return False
        return True

    def after_fork_in_child(self, parent: int) -> None:
        """Start the child's copy empty: the parent applies its own deltas."""
        self._lock = threading.Lock()
        self._pending = []


# The model an auxiliary call is filed under when the caller does not name one.
UNKNOWN_AUX_MODEL = "unknown"


def record_auxiliary_usage(conn: sqlite3.Connection, session_id: str, task: str, *, model: str | None = None,
                           billing_provider: str | None = None, billing_base_url: str | None = None,
                           input_tokens: int = 0, output_tokens: int = 0, cache_read_tokens: int = 0,
                           cache_write_tokens: int = 0, reasoning_tokens: int = 0,
                           estimated_cost_usd: float | None = None, api_call_count: int = 1,
                           now: float | None = None) -> None:
    """Add auxiliary calls (a title, a summary: `task`) to the session's usage rows; the session's totals stay.

    The row is keyed by task, model ("unknown" when not given) and billing route; the call
    counts `api_call_count` API calls there (one by default; several when a caller files a
    batch of calls in one record).
    """
    check_id("task", task)
    counts = _checked_counts((input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens,
                              api_call_count), estimated_cost_usd, None)
    route = _checked_route(model, (billing_provider, billing_base_url, None))
    require_session(conn, session_id)
    _check_sums_fit(conn, session_id, counts)
    _add_usage(conn, session_id, route["model"] or UNKNOWN_AUX_MODEL, route, counts,
               time.time() if now is None else now, task)


def get_dominant_session_model_route(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return the main-loop route (model and billing) that served most of the session's API calls, or None.

    Read from the per-route usage rows, not the session row (whose model and billing columns may
    come from different route changes); auxiliary calls do not count; of equal counts, the one
    used last wins.
    """
    row = conn.execute(
        "SELECT model, billing_provider, billing_base_url, billing_mode, api_call_count FROM session_model_usage "
        "WHERE session_id = ? AND task = '' AND api_call_count > 0 "
        "ORDER BY api_call_count DESC, last_seen DESC, rowid DESC LIMIT 1", (session_id,)).fetchone()
    if row is None:
        return None
    return dict(zip(("model", "billing_provider", "billing_base_url", "billing_mode", "api_call_count"), row))


def _checked_counts(tokens: tuple[Any, ...], estimated_cost_usd: Any, actual_cost_usd: Any) -> dict[str, Any]:
    # The token counters (all of them, zeros included) and the costs that were given.
    counts: dict[str, Any] = {name: check_count(name, value) for name, value in zip(_TOKEN_COLUMNS, tokens)}
    for name, cost in (("estimated_cost_usd", estimated_cost_usd), ("actual_cost_usd", actual_cost_usd)):
        if cost is not None:
            counts[name] = check_number(name, cost)
    return counts


def _given(names: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    # The columns given a value, each checked by its declared rule.
    return {n: _CHECK[n](v) for n, v in zip(names, values) if v is not None}


def _checked_route(model: Any, billing: tuple[Any, ...]) -> dict[str, Any]:
    # The call's model and billing provider, base URL and mode (None where not given).
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ValueError("model must be a non-empty string or None")
    return {"model": replace_surrogates(model),
            **{n: _CHECK[n](v) if v is not None else None for n, v in zip(_ROUTE_COLUMNS, billing)}}


def _route_sets(route: dict[str, Any], session_model: str | None, first_accounted: bool) -> tuple[list[str], list[Any]]:
    # How a call's route changes the session's: see update_token_counts.
    if first_accounted and (route["model"] is not None or route["billing_provider"] is not None):
        # The first accounted call: its route replaces the requested one, all fields together.
        return (["model = COALESCE(?, model)", *(f"{n} = ?" for n in _ROUTE_COLUMNS)],
                [route["model"], *(route[n] for n in _ROUTE_COLUMNS)])
    sets, params = ["model = COALESCE(model, ?)"], [route["model"]]
    if route["model"] is None or session_model is None or route["model"] == session_model:
        sets += [f"{n} = COALESCE({n}, ?)" for n in _ROUTE_COLUMNS]
        params += [route[n] for n in _ROUTE_COLUMNS]
    return sets, params


def _add_usage(conn: sqlite3.Connection, session_id: str, model: str, route: dict[str, Any],
               counts: dict[str, Any], now: float, task: str = "") -> None:
    names = [n for n in counts if n in TABLE_COLUMNS["session_model_usage"]]
    conn.execute(
        f"INSERT INTO session_model_usage (session_id, model, {', '.join(_ROUTE_COLUMNS)}, task, "
        f"{', '.join(names)}, updated_at, first_seen, last_seen) "
        f"VALUES (?, ?, ?, ?, ?, ?, {', '.join('?' * len(names))}, ?, ?, ?) "
        # The real system's key: usage per model and billing route ('' for a part not known).
        f"ON CONFLICT (session_id, model, billing_provider, billing_base_url, billing_mode, task) DO UPDATE SET "
        f"{', '.join(f'{n} = COALESCE({n}, 0) + excluded.{n}' for n in names)}, updated_at = excluded.updated_at, "
        "last_seen = excluded.last_seen",
        [session_id, model, *(route[n] or "" for n in _ROUTE_COLUMNS), task, *(counts[n] for n in names), now, now, now])


def _check_sums_fit(conn: sqlite3.Connection, session_id: str, counts: dict[str, Any]) -> None:
    # SQLite turns an integer sum past 2**63-1 into a float without a word; refuse it instead,
    # before anything is written. Checked for the session row and its per-model usage rows.
    integers = [name for name in counts if not name.endswith("_cost_usd")]
    peak = ", ".join(f"MAX(COALESCE({n}, 0))" for n in integers)
    rows = [conn.execute(f"SELECT {peak} FROM sessions WHERE id = ?", (session_id,)).fetchone(),
            conn.execute(f"SELECT {peak} FROM session_model_usage WHERE session_id = ?", (session_id,)).fetchone()]
    for row in rows:
        for name, current in zip(integers, row or ()):
            if isinstance(current, int) and current + counts[name] > INT_MAX:
                raise ValueError(f"{name} would pass SQLite's 64-bit integer range ({current} + {counts[name]})")


def reset_counters(conn: sqlite3.Connection, session_id: str, *, resumed_at: float | None = None) -> None:
    """Zero the session's counters (its live generation is about to be rewritten).

    With `resumed_at` the write also counts as activity: last_activity_at moves forward and
    an archive only the idle sweep made is lifted. Raises SessionNotFoundError for an unknown id.
    """
    resume = "" if resumed_at is None else f", last_activity_at = MAX(COALESCE(last_activity_at, 0), ?), {ARCHIVE_LIFT_SQL}"
    params = (session_id,) if resumed_at is None else (resumed_at, session_id)
    _updated_or_missing(conn.execute(f"UPDATE sessions SET {COUNTER_RESET_SQL}{resume} WHERE id = ?", params),
                        session_id)


def lift_auto_archive(conn: sqlite3.Connection, session_id: str) -> None:
    """Lift an archive only the idle sweep made on the session (continuing it resumes it)."""
    conn.execute(f"UPDATE sessions SET {ARCHIVE_LIFT_SQL} WHERE id = ?", (session_id,))


def archive_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Archive the session deliberately (the idle sweep's resume rule never clears this)."""
    _updated_or_missing(conn.execute("UPDATE sessions SET archived = 1, auto_archived = 0 WHERE id = ?",
                                     (session_id,)), session_id)


def unarchive_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear the session's archive, whoever made it."""
    _updated_or_missing(conn.execute("UPDATE sessions SET archived = 0, auto_archived = 0 WHERE id = ?",
                                     (session_id,)), session_id)


def pin_session(conn: sqlite3.Connection, session_id: str, pinned: bool = True) -> None:
    """Pin (or unpin) a session; pinned sessions are never auto-archived."""
    _updated_or_missing(conn.execute("UPDATE sessions SET pinned = ? WHERE id = ?",
                                     (1 if pinned else 0, session_id)), session_id)


def auto_archive(conn: sqlite3.Connection, idle_days: float, *, now: float | None = None) -> int:
    """Archive (archived=1, auto_archived=1) unpinned sessions idle over `idle_days`; return how many."""
    check_number("idle_days", idle_days)
    cutoff = (time.time() if now is None else now) - idle_days * DAY_S
    return conn.execute(
        "UPDATE sessions SET archived = 1, auto_archived = 1 WHERE COALESCE(archived, 0) = 0 "
        "AND COALESCE(pinned, 0) = 0 AND COALESCE(last_activity_at, started_at) < ?", (cutoff,)).rowcount


# --- prompt, model, billing route, workspace -------------------------------------------------

def update_system_prompt(conn: sqlite3.Connection, session_id: str, system_prompt: str | None) -> None:
    """Store the system prompt the session's turns are built with (None clears it)."""
    _set_columns(conn, session_id, {"system_prompt": system_prompt})


def update_session_meta(conn: sqlite3.Connection, session_id: str, model_config_json: str | None,
                        model: str | None = None) -> None:
    """Store the session's model config (JSON text, or None to clear it) and, when given, its model."""
    if model_config_json is not None and not isinstance(model_config_json, str):
        raise ValueError(f"model_config_json must be JSON text (a str) or None, not {type(model_config_json).__name__}")
    columns: dict[str, Any] = {"model_config": model_config_json}
    if model is not None:
        if not isinstance(model, str) or not model.strip():
            raise ValueError("model must be a non-empty string or None")
        columns["model"] = model
    _set_columns(conn, session_id, columns)


def update_session_model(conn: sqlite3.Connection, session_id: str, model: str, provider: str | None = None) -> None:
    """Switch the session's model (token updates never change it); the stored prompt is rebuilt next turn.

    The model (and `provider`, when given) is also merged into `model_config` as `model`/`provider`,
    so a resume pairs the model with the provider serving it; a browser runtime lock is dropped (a
    deliberate switch replaces it). The system prompt is cleared: it names the model.
    """
    if not isinstance(model, str) or not model.strip():
        raise ValueError("model must be a non-empty string")
    if provider is not None and not isinstance(provider, str):
        raise ValueError(f"provider must be a string or None, not {type(provider).__name__}")
    config = _model_config_of(conn, session_id)
    config.pop(RUNTIME_LOCK_KEY, None)
    config["model"] = model
    if provider:
        config["provider"] = provider
    _set_columns(conn, session_id, {"model": model, "system_prompt": None,
                                    "model_config": _model_config_text(config)})


def update_session_billing_route(conn: sqlite3.Connection, session_id: str, *, provider: str | None,
                                 base_url: str | None, billing_mode: str | None = None) -> None:
    """Switch the billing route: provider and base URL are set, billing_mode only when given.

    The stored system prompt is cleared too: it names the model and provider, so the next
    turn must build it again.
    """
    values = {"billing_provider": provider, "billing_base_url": base_url, "system_prompt": None}
    if billing_mode is not None:
        values["billing_mode"] = billing_mode
    _set_columns(conn, session_id, values)


def update_session_cwd(conn: sqlite3.Connection, session_id: str, cwd: str, git_branch: str | None = None,
                       git_repo_root: str | None = None, replace_git_meta: bool = False) -> int | None:
    """Record the session's working directory and claim a new git-metadata generation; return it.

    A branch or repo root is written only when non-empty (a probe that found nothing must not
    erase what an earlier probe found), except that a move to another directory clears them,
    and `replace_git_meta` writes them as given (empty clears). A late git probe publishes with
    `publish_session_git_metadata` and the returned generation. No `cwd` (None or ''): nothing
    is written and None returned.
    """
    if cwd is None or cwd == "":
        return None
    check_id("cwd", cwd)
    row = conn.execute("SELECT cwd, git_metadata_generation FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    generation = (row[1] or 0) + 1
    moved = row[0] != cwd
    values: dict[str, Any] = {"cwd": cwd}
    for name, value in (("git_branch", git_branch), ("git_repo_root", git_repo_root)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")
        if value or replace_git_meta or moved:
            values[name] = value or None
    _set_columns(conn, session_id, values)
    conn.execute("UPDATE sessions SET git_metadata_generation = ? WHERE id = ?", (generation, session_id))
    return generation


def publish_session_git_metadata(conn: sqlite3.Connection, session_id: str, cwd: str, generation: int,
                                 git_branch: str | None = None, git_repo_root: str | None = None) -> bool:
    """Write a git probe's branch/root only while `cwd` and `generation` are still the session's; True when written.

    Empty values are not written; nothing to write, a newer claim or an unknown session answer False.
    """
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise ValueError(f"generation must be an int (update_session_cwd's answer), not {type(generation).__name__}")
    values = {}
    for name, value in (("git_branch", git_branch), ("git_repo_root", git_repo_root)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")
        if value:
            values[name] = replace_surrogates(value)
    if not values or not isinstance(cwd, str):
        return False
    return conn.execute(f"UPDATE sessions SET {', '.join(f'{n} = ?' for n in values)} WHERE id = ? AND cwd = ? "
                        "AND git_metadata_generation = ?",
                        [*values.values(), session_id, replace_surrogates(cwd), generation]).rowcount > 0


def _set_columns(conn: sqlite3.Connection, session_id: str, columns: dict[str, Any]) -> None:
    _update(conn, session_id, _session_values(columns))


def _update(conn: sqlite3.Connection, session_id: str, values: dict[str, Any]) -> None:
    # Checked values into the row; a prompt replaced leaves its filed text once no session names it.
    before = _prompt_hash_of(conn, session_id) if "system_prompt" in values else None
    file_prompt(conn, values)
    _updated_or_missing(conn.execute(f"UPDATE sessions SET {', '.join(f'{n} = ?' for n in values)} WHERE id = ?",
                                     [*values.values(), session_id]), session_id)
    if before is not None and before != values.get("system_prompt_hash"):
        forget_prompts(conn, [before])


def distinct_session_cwds(conn: sqlite3.Connection, include_archived: bool = False) -> list[dict[str, Any]]:
    """Return each working directory sessions ran in, with how many: [{"cwd", "sessions"}], most used first."""
    archived = "" if include_archived else " AND COALESCE(archived, 0) = 0"
    return row_dicts(conn.execute(
        "SELECT cwd, COUNT(*) AS sessions FROM sessions WHERE cwd IS NOT NULL AND cwd != ''" + archived
        + " GROUP BY cwd ORDER BY sessions DESC, cwd"))


def backfill_repo_roots(conn: sqlite3.Connection, cwd_to_root: dict[str, str]) -> int:
    """Fill git_repo_root from a {cwd: repo root} map where it is still empty; return how many rows changed."""
    if not isinstance(cwd_to_root, dict):
        raise ValueError("cwd_to_root must be a dict of {cwd: repo root}")
    changed = 0
    for cwd, root in cwd_to_root.items():
        if isinstance(cwd, str) and isinstance(root, str) and root:
            changed += conn.execute(
                "UPDATE sessions SET git_repo_root = ? WHERE cwd = ? AND (git_repo_root IS NULL OR git_repo_root = '')",
                (replace_surrogates(root), replace_surrogates(cwd))).rowcount
    return changed


def set_session_archived(conn: sqlite3.Connection, session_id: str, archived: bool) -> bool:
    """Archive (deliberately) or unarchive the session; return False for an unknown session."""
    flag = 1 if archived else 0
    return conn.execute("UPDATE sessions SET archived = ?, auto_archived = 0 WHERE id = ?",
                        (flag, session_id)).rowcount == 1


def cwd_under_sql(column: str = "cwd") -> str:
    """Return the SQL condition "`column` is a directory or inside it"; bind it `cwd_under_values(prefix)`."""
    # A range on the text instead of LIKE: no wildcard escaping, case kept as the file system
    # keeps it, and '0' is the character after '/'.
    return f"({column} = ? OR ({column} >= ? AND {column} < ?))"


def cwd_under_values(prefix: str) -> list[str]:
    """Return the values `cwd_under_sql` binds for `prefix` ("/repo" takes "/repo/x", never "/repo-2")."""
    prefix = prefix.rstrip("/") or "/"
    inside = prefix if prefix.endswith("/") else prefix + "/"
    return [prefix, inside, inside[:-1] + "0"]


# --- filters selecting sessions -------------------------------------------------------------------
# The one builder of session filters (`session_filters`) and the checks of every filter value:
# listings, counts, search, prune and usage all select sessions through these, so a value is
# accepted or refused (SessionFilterError, a ValueError naming the caller's parameter) alike.

def _checked(check: Callable[..., Any], name: str, value: Any) -> Any:
    try:
        return check(name, value)
    except ValueError as exc:
        raise SessionFilterError(str(exc)) from None


def filter_name(name: str, value: Any) -> str:
    """Return `value` when it is a non-empty string SQLite can store, else raise SessionFilterError naming `name`."""
    return _checked(check_id, name, value)


def filter_names(name: str, value: Any) -> list[str] | None:
    """Return several names (a list, tuple or set of non-empty strings) checked, or None when not given.

    A bare string is refused (SessionFilterError), not taken as the list of its characters.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise SessionFilterError(f"{name} must be a list of names or None, not {shown(value)}")
    return [filter_name(name, v) for v in value]


def filter_name_or_names(name: str, value: Any) -> list[str] | None:
    """Return one name (a string) or several (a list of them) as a checked list, or None when not given."""
    return [filter_name(name, value)] if isinstance(value, str) else filter_names(name, value)


def filter_flag(name: str, value: Any) -> bool:
    """Return `value` when it is True or False, else raise SessionFilterError naming `name`."""
    if not isinstance(value, bool):
        raise SessionFilterError(f"{name} must be True or False, not {shown(value)}")
    return value


def filter_number(name: str, value: Any) -> float:
    """Return `value` (a time, a cost) as a float when finite and >= 0, else raise SessionFilterError naming `name`."""
    return _checked(check_number, name, value)


def filter_count(name: str, value: Any) -> int:
    """Return `value` when it is an integer from 0 to 2**63 - 1, else raise SessionFilterError naming `name`."""
    return _checked(check_count, name, value)


def session_filters(alias: str = "", *, source: Any = None, sources: Any = None, exclude_sources: Any = None,
                    models: Any = None, cwd_prefix: Any = None, min_message_count: Any = 0,
                    include_archived: bool = False, archived_only: bool = False, time_sql: str = "",
                    since: Any = None, until: Any = None) -> tuple[list[str], list[Any]]:
    """Return (SQL conditions, params) selecting sessions by source, model, directory, size, archive state and time.

    `alias` prefixes each column ("s." when the query names the table s). `source` is one name;
    `sources` and `models` several, any of which matches (an empty list: none passes);
    `exclude_sources` several left out; an empty `cwd_prefix` filters nothing. `since`/`until`
    bound `time_sql` (the caller's time: start, last activity) to [since, until). Every value
    is checked before any SQL is built (SessionFilterError naming the parameter otherwise).
    """
    where: list[str] = []
    params: list[Any] = []
    if source is not None:
        where.append(f"{alias}source = ?")
        params.append(filter_name("source", source))
    for column, name, value in (("source", "sources", sources), ("model", "models", models)):
        chosen = filter_names(name, value)
        if chosen is not None:
            where.append(f"{alias}{column} IN ({', '.join('?' * len(chosen))})" if chosen else "0")
            params += chosen
    excluded = filter_names("exclude_sources", exclude_sources)
    if excluded:
        where.append(f"{alias}source NOT IN ({', '.join('?' * len(excluded))})")
        params += excluded
    if cwd_prefix not in (None, ""):
        where.append(cwd_under_sql(f"{alias}cwd"))
        params += cwd_under_values(filter_name("cwd_prefix", cwd_prefix))
    if min_message_count is not None and filter_count("min_message_count", min_message_count):
        where.append(f"COALESCE({alias}message_count, 0) >= ?")
        params.append(min_message_count)
    for op, name, value in ((">=", "since", since), ("<", "until", until)):
        if value is not None:
            where.append(f"{time_sql} {op} ?")
            params.append(filter_number(name, value))
    # Through idx_sessions_archived: the archive state is read from no session's row.
    archived = f"{alias}id IN (SELECT id FROM sessions WHERE {ARCHIVED_SQL})"
    if filter_flag("archived_only", archived_only):
        where.append(f"{archived} AND COALESCE({alias}archived, 0) = 1")
    elif not filter_flag("include_archived", include_archived):
        where.append(f"NOT {archived}")
    return where, params


def source_list(sources: Any) -> list[str] | None:
    """Return `sources` (several sources, any of which matches) checked; None or [] means no such filter."""
    return filter_names("sources", sources) or None


def session_count(conn: sqlite3.Connection, source: str | None = None, sources: list[str] | None = None,
                  cwd_prefix: str | None = None, min_message_count: int = 0, include_archived: bool = False,
                  archived_only: bool = False, exclude_children: bool = False,
                  exclude_sources: list[str] | None = None) -> int:
    """Return how many sessions match: archived ones only when asked, children left out when asked.

    `sources` counts sessions of any of those sources; `source`, when given too, wins.
    """
    several = source_list(sources)
    where, params = session_filters(source=source, exclude_sources=exclude_sources, cwd_prefix=cwd_prefix,
                                    min_message_count=min_message_count, include_archived=include_archived,
                                    archived_only=archived_only)
    if several is not None and source is None:
        where.append(f"source IN ({', '.join('?' * len(several))})")
        params += several
    if exclude_children:
        where.append("parent_session_id IS NULL")
    if where == session_filters()[0]:
        # Only the archived ones left out (the default): SQLite counts a whole b-tree by its pages
        # and the archived through their own small index, where the condition would be checked
        # on each of tens of thousands of index entries.
        sql = f"SELECT (SELECT COUNT(*) FROM sessions) - (SELECT COUNT(*) FROM sessions WHERE {ARCHIVED_SQL})"
    else:
        sql = "SELECT COUNT(*) FROM sessions" + (" WHERE " + " AND ".join(where) if where else "")
    return conn.execute(sql, params).fetchone()[0]


# --- hermes-agent 0.20.1: pin, hide, read, stale archive, activity labels, model_config helpers ---
# Each keeps its state in the column hermes-agent 0.20 uses, with its meaning, so both programs
# read what the other wrote. Pin, hide and read flip a whole compression chain: whichever part a
# caller holds, the conversation is one.

def _flip_chain(conn: sqlite3.Connection, session_id: Any, assignment: str, value: Any) -> bool:
    # True when the session exists (its chain's rows are set, changed or not), as hermes-agent answers.
    if not isinstance(session_id, str):
        return False
    chain = lineage.compression_chain_ids(conn, session_id)
    if not chain:
        return False
    conn.execute(f"UPDATE sessions SET {assignment} WHERE id IN (SELECT value FROM json_each(?))",
                 (value, json.dumps(chain)))
    return True


def set_session_pinned(conn: sqlite3.Connection, session_id: str, pinned: bool) -> bool:
    """Pin or unpin the session's whole compression chain (pinned ones are never idle-archived); False when unknown."""
    return _flip_chain(conn, session_id, "pinned = ?", _CHECK["pinned"](pinned))


def set_session_hidden(conn: sqlite3.Connection, session_id: str, hidden: bool) -> bool:
    """Hide or show the session's whole compression chain in the default rich listing; False when unknown."""
    return _flip_chain(conn, session_id, "hidden = ?", _CHECK["hidden"](hidden))


def set_session_read(conn: sqlite3.Connection, session_id: str, read: bool = True, *, now: float | None = None) -> bool:
    """Mark the session's whole compression chain read now (or, `read=False`, unread); False when unknown.

    `last_read_at` is a watermark: activity after it makes the conversation unread again. 0
    means marked unread; NULL (never tracked) counts as read.
    """
    mark = time.time() if now is None else now
    return _flip_chain(conn, session_id, "last_read_at = ?", mark if _CHECK["hidden"](read) else 0.0)


def session_unread(session_row: dict[str, Any]) -> bool:
    """Tell whether a row's `last_active` (else `started_at`) is after its `last_read_at` mark (None: read)."""
    mark = session_row.get("last_read_at")
    if mark is None:
        return False  # never tracked: read
    active = session_row.get("last_active")
    if active is None:
        active = session_row.get("started_at")
    if active is None:
        return False
    return float(active) > float(mark)


class ActivityProvenance(str, Enum):
    """Where a session's activity stamp came from (`sessions.last_activity_provenance`)."""

    UNKNOWN = "unknown"
    AGENT_COMPRESSION = "agent.compression"
    AGENT_COMPRESSION_TIMEOUT = "agent.compression_timeout"
    AGENT_COMPRESSION_COOLDOWN = "agent.compression_cooldown"


# A label is one line a status bar shows: longer ones are cut to this many characters, "…" last.
ACTIVITY_DESCRIPTION_CHARS = 120
_PROVENANCES = frozenset(p.value for p in ActivityProvenance)


def _activity_label(description: Any) -> str:
    if description is None:
        return ""
    if not isinstance(description, str):
        raise ValueError(f"description must be a string or None, not {type(description).__name__}")
    text = cast(str, replace_surrogates(description.strip()))
    if len(text) > ACTIVITY_DESCRIPTION_CHARS:
        text = text[:ACTIVITY_DESCRIPTION_CHARS - 1] + "…"
    return text


def touch_session_activity(conn: sqlite3.Connection, session_id: str, ts: float | None = None, *,
                           description: str | None = None, provenance: ActivityProvenance | str | None = None,
                           now: float | None = None) -> None:
    """Stamp mid-turn activity at `ts` (now) with its labels; never moves the stamp back, unknown sessions no-op.

    The labels are written with the stamp only when it advances: `description` stripped and cut
    to 120 characters, `provenance` one of ActivityProvenance's values (anything else is "unknown").
    """
    stamp = check_number("ts", time.time() if now is None else now) if ts is None else _CHECK["last_activity_at"](ts)
    label = _activity_label(description)
    origin = provenance.value if isinstance(provenance, ActivityProvenance) else provenance
    origin = origin if origin in _PROVENANCES else ActivityProvenance.UNKNOWN.value
    if not isinstance(session_id, str) or not session_id:
        return
    conn.execute("UPDATE sessions SET last_activity_at = ?, last_activity_description = ?, "
                 "last_activity_provenance = ? WHERE id = ? AND (last_activity_at IS NULL OR last_activity_at < ?)",
                 (stamp, label, origin, session_id, stamp))


def get_session_activity(conn: sqlite3.Connection, session_id: str, *,
                         now: float | None = None) -> dict[str, Any] | None:
    """Return the session's activity stamp and labels (with seconds since, and hermes-agent's alias keys), or None."""
    row = conn.execute("SELECT last_activity_at, last_activity_description, last_activity_provenance FROM sessions "
                       "WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        return None
    at, label = row[0], row[1] or ""
    origin = row[2] if row[2] in _PROVENANCES else ActivityProvenance.UNKNOWN.value
    since = None if at is None else round((time.time() if now is None else now) - at, 1)
    return {"last_activity_at": at, "last_activity_description": label, "last_activity_provenance": origin,
            "seconds_since_activity": since, "last_activity_ts": at, "last_activity_desc": label,
            "description": label, "provenance": origin}


def clear_session_activity_labels(conn: sqlite3.Connection, session_id: str) -> None:
    """Clear the activity labels once a turn ends, keeping `last_activity_at`; unknown sessions no-op."""
    conn.execute("UPDATE sessions SET last_activity_description = '', last_activity_provenance = ? WHERE id = ? "
                 "AND (COALESCE(last_activity_description, '') != '' OR COALESCE(last_activity_provenance, ?) != ?)",
                 (ActivityProvenance.UNKNOWN.value, session_id, ActivityProvenance.UNKNOWN.value,
                  ActivityProvenance.UNKNOWN.value))


# model_config keys hermes-agent 0.20 gives a meaning: the browser/API client's runtime lock, the
# per-session approval bypass, the gateway's runtime route.
RUNTIME_LOCK_KEY = "browser_model_lock"
YOLO_KEY = "yolo_mode"
GATEWAY_RUNTIME_KEY = "gateway_runtime"
_ROUTE_KEYS = ("provider", "base_url", "api_mode")


def _parsed_config(value: Any) -> dict[str, Any]:
    # A row's model_config as a dict: parsed from its JSON text, {} for anything else.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


def _model_config_of(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    row = conn.execute("SELECT model_config FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    return _parsed_config(row[0])


def _model_config_text(config: dict[str, Any]) -> str | None:
    return cast(str, encode_json(config, "model_config")) if config else None


def patch_session_model_config(conn: sqlite3.Connection, session_id: str, patch: dict[str, Any]) -> None:
    """Merge `patch` into the session's model_config (a None value removes the key); non-object text is replaced."""
    if patch is None:
        patch = {}
    if not isinstance(patch, dict):
        raise ValueError(f"patch must be a dict, not {type(patch).__name__}")
    config = _model_config_of(conn, session_id)
    if not patch:
        return
    for key, value in patch.items():
        if value is None:
            config.pop(str(key), None)
        else:
            config[str(key)] = value
    _set_columns(conn, session_id, {"model_config": _model_config_text(config)})


def get_session_model_config_value(conn: sqlite3.Connection, session_id: str, key: str, default: Any = None) -> Any:
    """Return one key of the session's model_config; `default` when absent, unparsable or the session unknown."""
    row = conn.execute("SELECT model_config FROM sessions WHERE id = ?", (session_id,)).fetchone()
    config = _parsed_config(None if row is None else row[0])
    return config[key] if isinstance(key, str) and key in config else default


def set_session_yolo(conn: sqlite3.Connection, session_id: str, enabled: bool) -> None:
    """Store the session's approval bypass (`yolo_mode` in model_config); an unknown session is a no-op."""
    flag = bool(_CHECK["pinned"](enabled))
    if session_exists(conn, session_id):
        patch_session_model_config(conn, session_id, {YOLO_KEY: flag})


def update_session_runtime_lock(conn: sqlite3.Connection, session_id: str, *, model: str | None = None,
                                provider: str | None = None, model_options: dict[str, Any] | None = None,
                                route_source: str | None = None, confirmed: bool = False,
                                now: float | None = None) -> None:
    """Store a browser/API client's runtime lock in model_config (other keys kept); set the model when given.

    The system prompt is cleared, since it names the model and provider.
    """
    for name, value in (("model", model), ("provider", provider), ("route_source", route_source)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None, not {type(value).__name__}")
    if model_options is not None and not isinstance(model_options, dict):
        raise ValueError(f"model_options must be a dict or None, not {type(model_options).__name__}")
    config = _model_config_of(conn, session_id)
    config[RUNTIME_LOCK_KEY] = {"provider": provider or "", "model": model or "", "model_options": model_options or {},
                                "route_source": route_source or "", "confirmed": bool(confirmed),
                                "updated_at": time.time() if now is None else now}
    values: dict[str, Any] = {"model_config": _model_config_text(config), "system_prompt": None}
    if model:
        values["model"] = model
    _set_columns(conn, session_id, values)


def session_yolo_enabled(session_meta: dict[str, Any] | None) -> bool:
    """Tell whether a session row has the approval bypass (`yolo_mode`) on; False on anything unreadable."""
    if not isinstance(session_meta, dict):
        return False
    return bool(_parsed_config(session_meta.get("model_config")).get(YOLO_KEY))


def session_gateway_runtime(session_meta: dict[str, Any] | None) -> dict[str, Any]:
    """Return a session row's runtime route: gateway_runtime, else the route keys, else the billing provider."""
    if not isinstance(session_meta, dict):
        return {}
    config = _parsed_config(session_meta.get("model_config"))
    nested = config.get(GATEWAY_RUNTIME_KEY)
    if isinstance(nested, dict) and nested.get("provider") is not None:
        return {k: v for k, v in nested.items() if v is not None}
    route = {k: config[k] for k in _ROUTE_KEYS if config.get(k)}
    if route:
        return route
    billed = session_meta.get("billing_provider")
    return {"provider": billed} if billed else {}


def archive_stale_sessions(conn: sqlite3.Connection, idle_days: float | None, *, exclude_pinned: bool = True,
                           now: float | None = None) -> int:
    """Idle-archive each conversation untouched for `idle_days` (its whole chain); return how many conversations.

    Touched is the latest of its activity stamp and newest message, else its start; only live
    tips and standalone sessions are candidates, pinned ones left out unless `exclude_pinned`
    is False. As `auto_archive`, the archive is the idle sweep's: resuming lifts it. No or a
    negative `idle_days` archives nothing.
    """
    if idle_days is None:
        return 0
    if not is_finite(idle_days):
        raise ValueError(f"idle_days must be a finite number of days, not {shown(idle_days)}")
    if idle_days < 0:
        return 0
    cutoff = (time.time() if now is None else now) - idle_days * DAY_S
    pinned = " AND COALESCE(s.pinned, 0) = 0" if exclude_pinned else ""
    stale = [sid for (sid,) in conn.execute(
        f"SELECT s.id FROM sessions s WHERE COALESCE(s.archived, 0) = 0{pinned} "
        f"AND s.end_reason IS NOT '{lineage.COMPRESSION_END_REASON}' "
        "AND MAX(COALESCE(s.last_activity_at, 0), COALESCE((SELECT MAX(m.timestamp) FROM messages m "
        "WHERE m.session_id = s.id), s.started_at)) < ?", (cutoff,))]
    for sid in stale:
        chain = json.dumps(lineage.compression_chain_ids(conn, sid))
        conn.execute("UPDATE sessions SET archived = 1, auto_archived = 1 WHERE COALESCE(archived, 0) = 0 "
                     "AND id IN (SELECT value FROM json_each(?))", (chain,))
    return len(stale)


# --- handoffs: moving a live conversation to another platform, in three columns of the row --------

PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"
# The states in which a handoff is still under way: a new request waits until it ends.
_OPEN_STATES = (PENDING, RUNNING)


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    return replace_surrogates(value) or ""


def request_handoff(conn: sqlite3.Connection, session_id: str, platform: str) -> bool:
    """Ask for the session to move to `platform`; False when it is unknown or a handoff is still under way."""
    check_id("session_id", session_id)
    check_id("platform", platform)
    return conn.execute(
        "UPDATE sessions SET handoff_state = ?, handoff_platform = ?, handoff_error = NULL "
        "WHERE id = ? AND (handoff_state IS NULL OR handoff_state NOT IN (?, ?))",
        (PENDING, platform, session_id, *_OPEN_STATES)).rowcount > 0


def claim_handoff(conn: sqlite3.Connection, session_id: str) -> bool:
    """Take a pending handoff over (it becomes running); False when none is pending."""
    check_id("session_id", session_id)
    return conn.execute("UPDATE sessions SET handoff_state = ? WHERE id = ? AND handoff_state = ?",
                        (RUNNING, session_id, PENDING)).rowcount > 0


def _record_end(conn: sqlite3.Connection, session_id: str, state: str, error: str | None) -> None:
    check_id("session_id", session_id)
    if conn.execute("UPDATE sessions SET handoff_state = ?, handoff_error = ? WHERE id = ?",
                    (state, error, session_id)).rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


def complete_handoff(conn: sqlite3.Connection, session_id: str) -> None:
    """Record the handoff as completed (its error cleared); an unknown session raises SessionNotFoundError."""
    _record_end(conn, session_id, COMPLETED, None)


def fail_handoff(conn: sqlite3.Connection, session_id: str, error: str) -> None:
    """Record the handoff as failed with `error`; an unknown session raises SessionNotFoundError."""
    _record_end(conn, session_id, FAILED, _check_text("error", error))


def get_handoff_state(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """Return {"state", "platform", "error"} of the session's handoff (all None before any), or None when unknown."""
    row = conn.execute("SELECT handoff_state, handoff_platform, handoff_error FROM sessions WHERE id = ?",
                       (session_id,)).fetchone()
    return None if row is None else {"state": row[0], "platform": row[1], "error": row[2]}


def list_pending_handoffs(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Return the full rows of the sessions whose handoff is pending, oldest session first."""
    return session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.handoff_state = ? "
                                  "ORDER BY s.started_at, s.id",
                                  (PENDING,)))


# --- the gateway peer: the messaging peer a session talks to, and finding a peer's session again ---

# Ends the process made on its own behalf (the agent released its handle, the terminal UI's
# reaper closed what looked orphaned), not a decision to start over: the peer's next message
# still belongs to that conversation, so a lookup after a restart may recover the row.
RECOVERABLE_END_REASONS = ("agent_close", "ws_orphan_reap")
_RECOVERABLE_SQL = f"(s.ended_at IS NULL OR s.end_reason IN ({', '.join(repr(r) for r in RECOVERABLE_END_REASONS)}))"
_HAS_MESSAGES_SQL = "EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)"
# A row is a gateway session when it carries a session key; newest first, the rowid breaking ties.
_KEYED_SQL = "s.session_key IS NOT NULL AND s.session_key != ''"
_NEWEST = "s.started_at DESC, s.rowid DESC"


def _text(name: str, value: Any) -> Any:
    # The column's own rule: text, or a platform's numeric id stored as its digits.
    return None if value is None else SESSIONS.column(name).check(value)


def _platform(value: Any) -> str:
    # Platform names are compared without case: "Telegram" and "telegram" are one source.
    return check_id("platform", value).lower()


def record_gateway_session_peer(conn: sqlite3.Connection, session_id: str, *, source: str, user_id: str | None = None,
                                session_key: str | None = None, chat_id: str | None = None,
                                chat_type: str | None = None, thread_id: str | None = None,
                                display_name: str | None = None, origin_json: Any = None,
                                include_compression_ancestors: bool = False) -> None:
    """Record where a gateway session's peer is: source, session key, chat, chat type and thread.

    The route columns are set together as given (None clears one: a chat without a thread);
    display_name and origin_json (JSON text, or a value encoded as JSON) are kept when None.
    user_id is never changed: it was decided when the row was created. A session key is
    required; an unknown session raises SessionNotFoundError. With
    `include_compression_ancestors` the sessions compression closed before it get the same
    peer, so the whole conversation stays on one route when a resume moves it.
    """
    if include_compression_ancestors not in (True, False):
        raise ValueError(f"include_compression_ancestors must be True or False, not {include_compression_ancestors!r}")
    check_id("session_id", session_id)
    route = {"source": check_id("source", source), "session_key": check_id("session_key", session_key),
             "chat_id": _text("chat_id", chat_id), "chat_type": _text("chat_type", chat_type),
             "thread_id": _text("thread_id", thread_id)}
    _text("user_id", user_id)  # checked like every argument, though never written
    kept = {"display_name": _text("display_name", display_name), "origin_json": _text("origin_json", origin_json)}
    assignments = [f"{name} = ?" for name in route] + [f"{name} = COALESCE(?, {name})" for name in kept]
    cur = conn.execute(f"UPDATE sessions SET {', '.join(assignments)} WHERE id = ?",
                       [*route.values(), *kept.values(), session_id])
    if cur.rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")
    if include_compression_ancestors:
        conn.execute(f"UPDATE sessions SET {', '.join(assignments)} WHERE id IN (SELECT value FROM json_each(?))",
                     [*route.values(), *kept.values(), json.dumps(compression_ancestor_ids(conn, session_id))])


def set_expiry_finalized(conn: sqlite3.Connection, session_id: str, finalized: bool = True) -> None:
    """Mark (or unmark) the session's expiry as handled, so the gateway's expiry pass skips it."""
    flag = SESSIONS.column("expiry_finalized").check(finalized)
    if conn.execute("UPDATE sessions SET expiry_finalized = ? WHERE id = ?", (flag, session_id)).rowcount == 0:
        raise SessionNotFoundError(f"session {session_id!r} not found")


def find_latest_gateway_session_for_peer(conn: sqlite3.Connection, *, source: str, user_id: str | None = None,
                                         session_key: str | None = None, chat_id: str | None = None,
                                         chat_type: str | None = None,
                                         thread_id: str | None = None) -> dict[str, Any] | None:
    """Return the newest recoverable session row of a peer, or None.

    Recoverable: it has messages and is live, or was ended only by the process's own cleanup
    (RECOVERABLE_END_REASONS). The session key is matched first. A row under another key still
    matches when source, user, chat, chat type and thread all do (the key's format changed
    since it was written); that needs user_id, chat_id and chat_type. No session key: None.
    """
    check_id("source", source)
    peer = {name: _text(name, value) for name, value in (("user_id", user_id), ("chat_id", chat_id),
                                                          ("chat_type", chat_type), ("thread_id", thread_id))}
    if _text("session_key", session_key) in (None, ""):
        return None
    where = f"s.source = ? AND {_RECOVERABLE_SQL} AND {_HAS_MESSAGES_SQL}"
    rows = session_dicts(conn.execute(f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.session_key = ? AND {where} "
                                  f"ORDER BY {_NEWEST} LIMIT 1", (session_key, source)))
    if rows or any(peer[name] is None for name in ("user_id", "chat_id", "chat_type")):
        return rows[0] if rows else None
    rows = session_dicts(conn.execute(
        f"SELECT {SESSION_ROW_SQL} FROM sessions s WHERE s.user_id = ? AND s.chat_id = ? AND s.chat_type = ? "
        f"AND s.thread_id IS ? AND {where} ORDER BY {_NEWEST} LIMIT 1", (*peer.values(), source)))
    return rows[0] if rows else None


def list_gateway_sessions(conn: sqlite3.Connection, *, platform: str | None = None,
                          active_only: bool = True) -> list[dict[str, Any]]:
    """Return the current session of each session key (its newest row), most recently active first.

    Rows without a session key are not gateway sessions and never appear. With `active_only`,
    a key whose newest row has ended is left out (an older live row does not stand in for it).
    Each row carries `last_active`: its latest message's time, else its start.
    """
    where, params = [_KEYED_SQL], []
    if platform is not None:
        where.append("lower(s.source) = ?")
        params.append(_platform(platform))
    if active_only:
        where.append("s.ended_at IS NULL")
    # Newest per key: no row of the same key started later (idx_sessions_key answers this).
    where.append("NOT EXISTS (SELECT 1 FROM sessions n WHERE n.session_key = s.session_key AND "
                 "(n.started_at > s.started_at OR (n.started_at = s.started_at AND n.rowid > s.rowid)))")
    return session_dicts(conn.execute(
        f"SELECT {SESSION_ROW_SQL}, "
        "COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id), s.started_at) "
        f"AS last_active FROM sessions s WHERE {' AND '.join(where)} ORDER BY last_active DESC, s.id", params))


def find_session_by_origin(conn: sqlite3.Connection, *, platform: str, chat_id: str, thread_id: str | None = None,
                           user_id: str | None = None) -> str | None:
    """Return the id of the live gateway session of a chat (and thread, when given), or None.

    Among several live sessions of the chat, the newest of `user_id` wins. Without a match for
    the user, a lone candidate is the answer; several are ambiguous (None), so a message never
    lands in another user's conversation. Without `user_id`, the newest answers when the
    candidates belong to at most one user.
    """
    params: list[Any] = [_platform(platform), check_id("chat_id", _text("chat_id", chat_id))]
    thread = "" if thread_id is None else " AND s.thread_id = ?"
    params += [] if thread_id is None else [_text("thread_id", thread_id)]
    user = _text("user_id", user_id)
    candidates = conn.execute(
        f"SELECT s.id, s.user_id FROM sessions s WHERE lower(s.source) = ? AND s.chat_id = ?{thread} "
        f"AND {_KEYED_SQL} AND s.ended_at IS NULL ORDER BY {_NEWEST}", params).fetchall()
    if user is not None:
        exact = [sid for sid, owner in candidates if owner == user]
        if exact or len(candidates) != 1:
            return exact[0] if exact else None
    elif len({owner for _, owner in candidates if owner is not None}) > 1:
        return None
    return candidates[0][0] if candidates else None


# --- the gateway's session-hygiene failure streak, per chat (table gateway_hygiene_state) ---------

def increment_hygiene_failure_streak(conn: sqlite3.Connection, session_key: str) -> int:
    """Count one more failed hygiene pass for the chat `session_key`; return its streak now (1 after a reset)."""
    key = check_id("session_key", session_key)
    # Read back in the same write transaction (no RETURNING: SQLite before 3.35 lacks it).
    conn.execute("INSERT INTO gateway_hygiene_state (session_key, failure_streak) VALUES (?, 1) "
                 "ON CONFLICT(session_key) DO UPDATE SET failure_streak = failure_streak + 1", (key,))
    return conn.execute("SELECT failure_streak FROM gateway_hygiene_state WHERE session_key = ?", (key,)).fetchone()[0]


def reset_hygiene_failure_streak(conn: sqlite3.Connection, session_key: str) -> None:
    """Forget the chat's failed hygiene passes (nothing to do for a chat without any)."""
    conn.execute("DELETE FROM gateway_hygiene_state WHERE session_key = ?", (check_id("session_key", session_key),))


# --- orphaned gateway sessions: rows that kept their messages but lost their routing identity -----

ORPHAN_GAP_S = 900.0  # how soon after a keyed row fell quiet an unkeyed one may continue it
ADOPTED_END_REASON = "superseded_by_repair"
# The routing identity an adoption copies; a column the orphan already has is kept.
_PEER_COLUMNS = ("user_id", "session_key", "chat_id", "chat_type", "thread_id", "display_name", "origin_json")
# Unkeyed by design, not by damage: tool rows, delegates and branches never carry a session key.
_ORPHAN_SQL = (f"s.session_key IS NULL AND s.source != 'tool' AND NOT COALESCE({MARKED_SESSION_SQL}, 0) "
               f"AND {_HAS_MESSAGES_SQL}")
_ORPHAN_COLUMNS = ("s.id, s.source, s.user_id, s.parent_session_id, s.started_at, "
                   "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id), "
                   "(SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id)")
# When a keyed row fell quiet: its latest message, recorded activity or start, whichever is latest.
_QUIET_SQL = ("MAX(s.started_at, COALESCE((SELECT MAX(m.timestamp) FROM messages m WHERE m.session_id = s.id), "
              "s.started_at), COALESCE(s.last_activity_at, s.started_at))")


def _gap(max_gap_s: Any) -> float:
    return ORPHAN_GAP_S if max_gap_s is None else check_number("max_gap_s", max_gap_s)


def _verdict(conn: sqlite3.Connection, row: tuple[Any, ...], gap: float) -> dict[str, Any]:
    # One orphan's report: which keyed row it continues, by which evidence, or why none can be named.
    orphan_id, source, user_id, parent_id, started_at, count, last_active = row
    found = {"orphan_id": orphan_id, "source": source, "message_count": count, "started_at": started_at,
             "last_active": last_active, "donor_id": None, "session_key": None, "evidence": "",
             "adoptable": False, "reason": ""}
    if parent_id is not None:
        # A recorded parent is a fact: no time window, and no guessing past it when it does not fit.
        parent = conn.execute(f"SELECT s.id, s.session_key FROM sessions s WHERE s.id = ? AND s.source = ? AND {_KEYED_SQL}",
                              (parent_id, source)).fetchone()
        if parent is None:
            return {**found, "reason": "parent session carries no gateway identity of this source"}
        return {**found, "donor_id": parent[0], "session_key": parent[1], "evidence": "lineage", "adoptable": True}
    donors = conn.execute(
        f"SELECT s.id, s.session_key FROM sessions s WHERE s.source = ? AND {_KEYED_SQL} AND s.id != ? "
        f"AND (s.user_id IS NULL OR ? IS NULL OR s.user_id = ?) AND {_QUIET_SQL} >= ? AND {_QUIET_SQL} < ? LIMIT 2",
        (source, orphan_id, user_id, user_id, started_at - gap, last_active)).fetchall()
    if len(donors) > 1:
        return {**found, "reason": "ambiguous: more than one keyed predecessor matches this window"}
    if not donors:
        shown_gap = int(gap) if gap.is_integer() else gap
        return {**found, "reason": f"no keyed predecessor fell quiet within {shown_gap}s of this session's start"}
    return {**found, "donor_id": donors[0][0], "session_key": donors[0][1], "evidence": "contiguity", "adoptable": True}


def find_orphaned_gateway_sessions(conn: sqlite3.Connection, *, max_gap_s: float | None = None) -> list[dict[str, Any]]:
    """Report unkeyed sessions with messages, each with the keyed row it continues when exactly one can be named.

    Evidence is `lineage` (its parent is a keyed row of the same source) or `contiguity` (exactly
    one keyed row of the same source and a compatible user fell quiet within `max_gap_s`, 900 by
    default, of its start, before its last message). Otherwise `adoptable` is False with a reason.
    Tool rows, delegates and branches are unkeyed by design and never reported.
    """
    gap = _gap(max_gap_s)
    rows = conn.execute(f"SELECT {_ORPHAN_COLUMNS} FROM sessions s WHERE {_ORPHAN_SQL} "
                        "ORDER BY s.started_at, s.rowid DESC").fetchall()
    return [_verdict(conn, row, gap) for row in rows]


def adopt_orphaned_gateway_session(conn: sqlite3.Connection, orphan_id: str, donor_id: str, *,
                                   max_gap_s: float | None = None, now: float | None = None) -> bool:
    """Give the orphan the donor's routing identity (keeping columns it has) and end the donor; return whether it applied.

    The pair is judged again inside the write transaction: False when either row has changed
    shape since (the orphan got a key or went, the donor lost its key or went, their sources
    differ), so a concurrent repair makes this a no-op. AdoptionRefusedError when the evidence
    (as find_orphaned_gateway_sessions reports it with `max_gap_s`) does not name this donor
    alone: adopting a guess could splice one person's conversation into another's chat.
    """
    check_id("orphan_id", orphan_id)
    check_id("donor_id", donor_id)
    gap = _gap(max_gap_s)
    row = conn.execute(f"SELECT {_ORPHAN_COLUMNS} FROM sessions s WHERE s.id = ? AND {_ORPHAN_SQL}",
                       (orphan_id,)).fetchone()
    donor = conn.execute(f"SELECT s.source, {', '.join('s.' + c for c in _PEER_COLUMNS)} FROM sessions s "
                         f"WHERE s.id = ? AND {_KEYED_SQL}", (donor_id,)).fetchone()
    if row is None or donor is None or donor[0] != row[1] or orphan_id == donor_id:
        return False
    verdict = _verdict(conn, row, gap)
    if not verdict["adoptable"] or verdict["donor_id"] != donor_id:
        why = verdict["reason"] or f"the evidence names {verdict['donor_id']!r}, not this donor"
        raise AdoptionRefusedError(f"session {orphan_id!r} is not adopted by {donor_id!r}: {why}")
    kept = ", ".join(f"{c} = COALESCE({c}, ?)" for c in _PEER_COLUMNS)
    conn.execute(f"UPDATE sessions SET {kept}, parent_session_id = COALESCE(parent_session_id, ?) WHERE id = ?",
                 (*donor[1:], donor_id, orphan_id))
    conn.execute("UPDATE sessions SET ended_at = COALESCE(ended_at, ?), end_reason = ? WHERE id = ?",
                 (time.time() if now is None else now, ADOPTED_END_REASON, donor_id))
    return True
