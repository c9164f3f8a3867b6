"""Datasette plugin: browse hermes-state databases in a web page, read-only.

Owns: the Datasette hooks that make a hermes-state file pleasant to browse (internal ledgers,
views and FTS indexes hidden, Datasette's table search pointed at the word index, times shown
as dates, links from the home page and the menu) and three pages under `/-/hermes/<database>`,
each also as `.json`: the sessions (newest activity first, with filters, ids shortened as git
shortens commits), one session's conversation with its lineage (reached by a unique prefix of its
id too), and a search of titles and, through the library's own `search_messages`, of message
text; and the error pages under that prefix, which lead back to those pages.
Does not own: starting the server (`hermes-state serve` in hermes_state_cli) or any query the
library already answers: conversations, lineage and search go through a read-only `SessionDB`.

Transaction contract: nothing here writes. Pages open a read-only `SessionDB` per request (on a
worker thread, since the library is synchronous) or run one SELECT on Datasette's own read-only
connection. The pages across profiles read every profile at once, each waiting briefly for a lock
another program holds, and go on without a profile that has not answered by a deadline.
Every stored text is rendered through Jinja's autoescaping: messages are untrusted.
Datasette finds this module through its plugin entry point; `import hermes_state` never imports it.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import quote, unquote, urlencode

from datasette import hookimpl
from datasette.database import Database
from datasette.utils.asgi import NotFound, Response
from datasette.version import __version__ as datasette_version
from datasette.views.base import DatasetteError
from markupsafe import Markup, escape

import hermes_state_render as render
from hermes_state_auth import ACTOR_SCOPE_KEY
from hermes_state_chart import usage_chart
from hermes_state import HermesStateError, SessionDB, StateDbBusyError, StateDbCorruptError, StoreUnavailableError
from hermes_state_common import ROLES
from hermes_state_errors import is_sqlite_lock_error
from hermes_state_home import DEFAULT_PROFILE, profile_homes
from hermes_state_listings import PREVIEW_CHARS

PREFIX = "/-/hermes"
SESSIONS_PER_PAGE = 50
HITS_PER_PAGE = 20
# Tables a person browsing sessions wants; every other table of a hermes-state file (FTS indexes
# and their shadow tables, the CJK queue, schema bookkeeping, gateway and worker ledgers) is hidden.
VISIBLE_TABLES = ("sessions", "messages", "session_model_usage")
# What marks a database as a hermes-state store rather than any SQLite file Datasette serves.
MARKER_TABLES = {"sessions", "messages", "schema_version"}
# Columns holding epoch seconds, shown as local dates on Datasette's table pages (JSON keeps the number).
TIME_COLUMNS = {"started_at", "ended_at", "last_activity_at", "compression_failure_cooldown_until", "timestamp",
                "updated_at"}

# Names of the hermes-state databases and their hidden tables, per Datasette instance, found at
# startup (get_metadata is synchronous and called often, so it must only read this).
_STORES: "weakref.WeakKeyDictionary[Any, dict[str, list[str]]]" = weakref.WeakKeyDictionary()
# The internal views of each store (the search indexes' sources), refused to every actor.
_VIEWS: "weakref.WeakKeyDictionary[Any, dict[str, set[str]]]" = weakref.WeakKeyDictionary()
# The name of Datasette's plugin configuration; `profiles_root` in it serves every profile of that root.
PLUGIN = "hermes-state"
# The pages across every profile served, under PREFIX (a profile named so is reached through Datasette's own pages).
EVERY_PROFILE = "all"
# The longest a page across profiles (or the check of a profile not served yet) waits for any one
# profile's read. A profile still reading then is listed as busy and the page goes on without it;
# its read ends on its own thread, bounded by ProfileGlance's lock wait.
PROFILE_DEADLINE_S = 5.0
# The fewest characters of an id the session list shows (as git shows a commit): more when a
# shorter prefix would name another session too. The whole id is in the link's tooltip.
SHORT_ID = 7
# The ids an ambiguous prefix's page lists.
SHOWN_CANDIDATES = 20


class ProfileGlance(SessionDB):
    """A read-only handle for the pages across profiles: it waits this long only for another program's lock."""

    # Per lock it meets (the open, then each read): a store another program keeps locked (a
    # rollback-journal store in an exclusive transaction) is reported busy after this, where a
    # plain read-only handle waits its 5 s patience, and a page across profiles waits for it.
    read_busy_timeout_s = 0.5


@dataclass
class Fleet:
    """The profiles of one root that a Datasette instance serves, each as a database named after its profile."""

    root: Path
    names: list[str] = field(default_factory=list)  # every profile found at the last look, "default" first
    problems: dict[str, str] = field(default_factory=dict)  # profile -> why its store is not served, what to do
    busy: set[str] = field(default_factory=set)  # the profiles among `problems` that are only locked right now
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while adding stores, never while reading one
    # The check of each profile not served yet that is running: requests arriving meanwhile share it.
    checks: dict[str, "asyncio.Future[tuple[str, bool] | None]"] = field(default_factory=dict)


_FLEETS: "weakref.WeakKeyDictionary[Any, Fleet]" = weakref.WeakKeyDictionary()


# --- hooks ---------------------------------------------------------------------------------------

@hookimpl
def startup(datasette):
    """Find the hermes-state databases among those Datasette serves."""
    async def inner() -> None:
        stores: dict[str, list[str]] = {}
        views: dict[str, set[str]] = {}
        for name, database in datasette.databases.items():
            if database.is_memory:
                continue
            tables = await database.table_names()
            if MARKER_TABLES <= set(tables):
                stores[name] = [t for t in tables if t not in VISIBLE_TABLES]
                views[name] = set(await database.view_names())
        _STORES[datasette] = stores
        _VIEWS[datasette] = views
        await refresh_profiles(datasette)
    return inner


@hookimpl
def get_metadata(datasette, key, database, table):
    """Hide internal tables and configure full-text search on `messages`."""
    # Datasette ties an FTS table to the table its content= names; the word index reads a view of
    # messages (the rows indexed so far), so the search table is named here.
    stores = _STORES.get(datasette, {})
    metadata: dict[str, Any] = {"databases": {
        name: {"tables": {
            "messages": {"fts_table": "messages_fts", "fts_pk": "id"},
            "sessions": {"label_column": "title"},
            **{t: {"hidden": True} for t in hidden},
        }} for name, hidden in stores.items()}}
    if stores:  # the home page says where the conversations are
        links = Markup(", ").join(Markup('<a href="%s">%s</a>') % (datasette.urls.path(_store_url(name)), name)
                                  for name in stores)
        metadata["description_html"] = str(Markup("Browse the sessions and search the messages: %s") % links)
    return metadata


@hookimpl
def actor_from_request(datasette, request):
    """Return the user `serve` checked the password of, as actor `basic:<name>` (None without a login)."""
    return request.scope.get(ACTOR_SCOPE_KEY)


@hookimpl
def permission_allowed(datasette, actor, action, resource):
    """Refuse the internal views of a hermes-state store (they only feed the search indexes)."""
    if action == "view-table" and isinstance(resource, tuple) and len(resource) == 2:
        database, table = resource
        if table in _VIEWS.get(datasette, {}).get(database, ()):
            return False
    return None


@hookimpl
def render_cell(value, column, table, database, datasette):
    """Show epoch-second columns of a store's tables as local dates (the number stays in the title)."""
    if column in TIME_COLUMNS and database in _STORES.get(datasette, {}) and isinstance(value, (int, float)) \
            and not isinstance(value, bool):
        return Markup('<span title="%s">%s</span>') % (value, render.clock_time(value))
    return None


@hookimpl
def register_routes():
    """Add the sessions, conversation and search pages."""
    # Each page also answers as JSON with a `.json` suffix, like Datasette's own pages.
    json_suffix = r"(?P<format>\.json)?"
    return [
        (rf"^{PREFIX}{json_suffix}/?$", index_page),
        (rf"^{PREFIX}/{EVERY_PROFILE}{json_suffix}/?$", all_sessions_page),
        (rf"^{PREFIX}/{EVERY_PROFILE}/search{json_suffix}$", all_search_page),
        (rf"^{PREFIX}/(?P<database>[^/]+?){json_suffix}/?$", sessions_page),
        (rf"^{PREFIX}/(?P<database>[^/]+)/session/(?P<session_id>[^/]+?){json_suffix}$", session_page),
        (rf"^{PREFIX}/(?P<database>[^/]+)/search{json_suffix}$", search_page),
    ]


@hookimpl
def menu_links(datasette, actor):
    """Link every hermes-state database's sessions page from Datasette's menu."""
    return [{"href": datasette.urls.path(f"{PREFIX}/{quote(name, safe='')}"), "label": f"Sessions: {name}"}
            for name in _STORES.get(datasette, {})]


@hookimpl
def database_actions(datasette, actor, database):
    """Link the sessions and search pages from a hermes-state database's page."""
    if database not in _STORES.get(datasette, {}):
        return []
    base = f"{PREFIX}/{quote(database, safe='')}"
    return [{"href": datasette.urls.path(base), "label": "Browse sessions"},
            {"href": datasette.urls.path(base + "/search"), "label": "Search messages"}]


@hookimpl
def handle_exception(datasette, request, exception):
    """Show a plugin page's 404, 400 and 503 with links back to the sessions, the search and the profiles."""
    path = request.path.split("?")[0]
    if not (path == PREFIX or path.startswith(PREFIX + "/")) or path.endswith(".json"):
        return None
    if isinstance(exception, NotFound):
        status, title, message = 404, "Not found", str(exception.args[0] if exception.args else exception)
    elif isinstance(exception, DatasetteError) and exception.status != 403:
        status, title, message = exception.status, exception.title or f"Error {exception.status}", exception.message
    else:  # a refusal (or a failure of the plugin) keeps Datasette's own page
        return None

    async def inner() -> Response:
        sentence, *steps = str(message).split("\n")  # a damaged store's steps follow its sentence, one a line
        response = await _render(datasette, request, ERROR_HTML, {"title": title, "error": sentence, "advice": steps,
                                                                  "status": status, "back": _way_back(datasette, path)})
        response.status = status
        return response
    return inner


def _way_back(datasette, path: str) -> list[tuple[str, str]]:
    """Return the links an error page under PREFIX offers: the database's sessions and search when it is served."""
    links: list[tuple[str, str]] = []
    rest = path[len(PREFIX):].strip("/").split("/")[0]
    name = unquote(rest) if rest else ""
    if name == EVERY_PROFILE and profiles_root(datasette) is not None:
        links += [(_store_url(EVERY_PROFILE), "Sessions of every profile"),
                  (_store_url(EVERY_PROFILE) + "/search", "Search every profile")]
    elif name in _STORES.get(datasette, {}):
        links += [(_store_url(name), f"Sessions of {name}"), (_store_url(name) + "/search", f"Search {name}")]
    links.append((PREFIX, "Every profile" if profiles_root(datasette) is not None else "hermes-state databases"))
    return links


# --- every profile of a root ---------------------------------------------------------------------

def profiles_root(datasette) -> Path | None:
    """Return the root whose profiles this Datasette serves (plugin setting `profiles_root`), or None."""
    config = datasette.plugin_config(PLUGIN) or {}
    root = config.get("profiles_root") if isinstance(config, dict) else None
    return Path(root).expanduser() if root else None


async def refresh_profiles(datasette, only: str | None = None) -> Fleet | None:
    """Serve each profile of the root not served yet whose store opens; note why the others do not.

    Cheap while nothing changed: one listing of the profiles directory, plus a read-only open
    of each profile not served yet (only of `only` when given), each waited for at most
    PROFILE_DEADLINE_S. Returns None when this Datasette serves no profiles root.
    """
    root = profiles_root(datasette)
    if root is None:
        return None
    fleet = _FLEETS.get(datasette)
    if fleet is None:
        fleet = _FLEETS.setdefault(datasette, Fleet(root))
    stores = _STORES.setdefault(datasette, {})
    _VIEWS.setdefault(datasette, {})
    homes = await asyncio.to_thread(profile_homes, root)
    fleet.names = [name for name, _ in homes]
    paths = {name: home / "state.db" for name, home in homes if name not in stores and only in (None, name)}
    # The checks run on worker threads, all at once and outside the lock: a locked store is
    # waited for by the requests that need it, each for a bounded time, never one after another.
    checks = {name: _checking(fleet, name, path) for name, path in paths.items()}
    late = await _within_deadline(list(checks.values()))
    async with fleet.lock:  # two requests never add the same profile twice
        for name, check in checks.items():
            if name in stores:  # another request added it meanwhile
                continue
            problem = (_late_sentence(), True) if check in late else check.result()
            if problem is None:
                problem = await _add_store(datasette, name, paths[name])
            if problem is None:
                fleet.problems.pop(name, None)
                fleet.busy.discard(name)
            else:
                fleet.problems[name] = problem[0]
                (fleet.busy.add if problem[1] else fleet.busy.discard)(name)
        for gone in set(fleet.problems) - set(fleet.names):  # its directory was removed
            del fleet.problems[gone]
            fleet.busy.discard(gone)
    return fleet


# Why a profile is not shown: the sentence, and whether its store is only locked right now (busy).
Problem = tuple[str, bool]


def _checking(fleet: Fleet, name: str, path: Path) -> "asyncio.Future[Problem | None]":
    """Return the running check of `name`'s store, starting one when none runs on this loop."""
    check = fleet.checks.get(name)
    if check is None or check.done() or check.get_loop() is not asyncio.get_running_loop():
        check = asyncio.ensure_future(asyncio.to_thread(_check_store, path, name))
        fleet.checks[name] = check

        def forget(done: "asyncio.Future[Problem | None]") -> None:
            if fleet.checks.get(name) is done:
                del fleet.checks[name]
        check.add_done_callback(forget)
    return check


async def _within_deadline(reads: Sequence["asyncio.Future[Any]"]) -> set["asyncio.Future[Any]"]:
    """Wait for `reads` up to PROFILE_DEADLINE_S; return those still running (left to end on their own)."""
    if not reads:
        return set()
    _, late = await asyncio.wait(reads, timeout=PROFILE_DEADLINE_S)
    for read in late:  # its outcome, whenever it comes, is nobody's: fetch it so asyncio does not warn
        read.add_done_callback(lambda done: done.cancelled() or done.exception())
    return late


def _late_sentence() -> str:
    return (f"busy: its store did not answer within {PROFILE_DEADLINE_S:g} s (another program may hold it "
            "locked, or it is very large). Retry shortly.")


def _is_busy(exc: BaseException) -> bool:
    return isinstance(exc, StateDbBusyError) or is_sqlite_lock_error(exc)


def _busy_sentence(exc: BaseException) -> str:
    return f"busy: another program holds its store locked ({exc}). Retry shortly."


def _failure(exc: BaseException, profile: str | None = None) -> Problem:
    """Say why a profile's read failed, and whether only because its store is locked.

    A damaged store's sentence is followed, one a line, by the steps that can work on it.
    """
    if _is_busy(exc):
        return _busy_sentence(exc), True
    return "\n".join([problem_sentence(exc), *damaged_steps(exc, profile)]), False


def damaged_steps(exc: BaseException, profile: str | None = None) -> list[str]:
    """Return what can be done about the damaged store `exc` names (none for any other failure).

    The commands select the store as a user would: `-p NAME` for a named profile, plain for
    the default one, `--db PATH` for a file served on its own.
    """
    path = getattr(exc, "path", None)
    if not isinstance(exc, StateDbCorruptError) or path is None:
        return []
    from hermes_state_recovery import damaged_store_advice
    command = ("hermes-state" if profile == DEFAULT_PROFILE else f"hermes-state -p {profile}" if profile
               else f"hermes-state --db {path}")
    return damaged_store_advice(path, command)


def _check_store(path: Path, profile: str | None = None) -> Problem | None:
    try:
        ProfileGlance(path, read_only=True).close()
    except (HermesStateError, sqlite3.Error, OSError) as exc:
        return _failure(exc, profile)
    return None


async def _briefly(database: Database, read: Callable[[sqlite3.Connection], Any]) -> Any:
    """Run `read` on Datasette's read-only connection to `database`, waiting for a lock no longer than a ProfileGlance."""
    def run(conn: sqlite3.Connection) -> Any:
        # Datasette's connections wait 5 s for a lock, on its few SQL threads: a locked store
        # would hold one of them, and the page, that long.
        was = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute(f"PRAGMA busy_timeout = {int(ProfileGlance.read_busy_timeout_s * 1000)}")
        try:
            return read(conn)
        finally:
            conn.execute(f"PRAGMA busy_timeout = {int(was)}")
    return await database.execute_fn(run)


def _schema_names(conn: sqlite3.Connection) -> tuple[list[str], set[str]]:
    rows = conn.execute("SELECT type, name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
    return [r[1] for r in rows if r[0] == "table"], {r[1] for r in rows if r[0] == "view"}


async def _add_store(datasette, name: str, path: Path) -> Problem | None:
    # Datasette opens the file with mode=ro, as for a file named on its command line.
    database = datasette.add_database(Database(datasette, path=str(path), is_mutable=True), name=name)
    try:
        tables, view_names = await _briefly(database, _schema_names)
    except sqlite3.Error as exc:  # damaged, or locked, between the check and now
        datasette.remove_database(database.name)
        return _failure(exc)
    _STORES[datasette][database.name] = [t for t in tables if t not in VISIBLE_TABLES]
    _VIEWS[datasette][database.name] = view_names
    return None


def problem_sentence(exc: BaseException) -> str:
    """Say what is wrong with a store and what to do about it, from the library's typed error."""
    guidance = getattr(exc, "guidance", None)
    # A damaged file's message already names `hermes-state recover`; the unavailable ones carry their advice.
    return f"{exc}. {guidance}" if guidance else str(exc)


def _served(datasette, fleet: Fleet) -> list[str]:
    stores = _STORES.get(datasette, {})
    return [name for name in fleet.names if name in stores]


async def _visible(datasette, request, names: list[str]) -> list[str]:
    await datasette.ensure_permissions(request.actor, ["view-instance"])
    return [name for name in names
            if await datasette.permission_allowed(request.actor, "view-database", name, default=True)]


async def _each_profile(datasette, names: list[str], read: Callable[..., Any], *args: Any
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `read(path, *args)` for each profile at once; return {profile: result} and the profiles that failed.

    A profile whose read has not ended within PROFILE_DEADLINE_S is among those that failed, as busy.
    """
    paths = [datasette.get_database(name).path for name in names]
    reads = [asyncio.ensure_future(asyncio.to_thread(read, path, *args)) for path in paths]
    late = await _within_deadline(reads)
    results, errors = {}, []
    for name, done in zip(names, reads):
        outcome = None if done in late else done.exception()
        if done in late:
            errors.append(_error_entry(name, (_late_sentence(), True)))
        elif isinstance(outcome, (HermesStateError, sqlite3.Error, OSError)):
            errors.append(_error_entry(name, _failure(outcome, name)))
        elif outcome is not None:
            raise outcome
        else:
            results[name] = done.result()
    return results, errors


def _error_entry(name: str, problem: Problem) -> dict[str, Any]:
    sentence, *steps = problem[0].split("\n")
    return {"profile": name, "error": sentence, "advice": steps, "busy": problem[1]}


def _fleet_errors(fleet: Fleet, more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [_error_entry(name, (text, name in fleet.busy)) for name, text in fleet.problems.items()] + more
    return sorted(found, key=lambda e: (e["profile"] != "default", e["profile"]))


# --- pages ---------------------------------------------------------------------------------------

async def index_page(datasette, request):
    """List the hermes-state databases (every profile, with its counts); go straight to the sessions when there is one."""
    fleet = await refresh_profiles(datasette)
    if fleet is not None:
        return await _profiles_index(datasette, request, fleet)
    stores = list(_STORES.get(datasette, {}))
    if _wants_json(request):
        return _json({"databases": [{"name": name, "url": _store_url(name)} for name in stores]})
    if len(stores) == 1:
        return Response.redirect(datasette.urls.path(f"{PREFIX}/{quote(stores[0], safe='')}"))
    return await _render(datasette, request, INDEX_HTML, {"stores": stores, "prefix": PREFIX})


def _profile_summary(path: str) -> dict[str, Any]:
    with ProfileGlance(path, read_only=True) as db:
        latest = db.list_sessions(limit=1, order="activity", include_archived=True)
        return {"sessions": db.session_count(include_archived=True), "messages": db.message_count(),
                "last_activity": latest[0]["last_active"] if latest else None, "size_bytes": os.path.getsize(path)}


async def _profiles_index(datasette, request, fleet: Fleet):
    names = await _visible(datasette, request, _served(datasette, fleet))
    summaries, failed = await _each_profile(datasette, names, _profile_summary)
    profiles = [{"profile": name, "url": _store_url(name), **summaries[name]} for name in names if name in summaries]
    errors = _fleet_errors(fleet, failed)
    if _wants_json(request):
        return _json({"root": str(fleet.root), "profiles": profiles, "errors": errors,
                      "sessions_url": _store_url(EVERY_PROFILE), "search_url": _store_url(EVERY_PROFILE) + "/search"})
    shown = [dict(p, last=_fmt_time(p["last_activity"]), size=_size(p["size_bytes"])) for p in profiles]
    return await _render(datasette, request, PROFILES_HTML, {
        "profiles": shown, "errors": errors, "all_url": _store_url(EVERY_PROFILE),
        "search_url": _store_url(EVERY_PROFILE) + "/search"})


async def _as_database(page, datasette, request):
    # Without a profiles root, /-/hermes/all is the pages of a database named "all" (all.db).
    request.scope.setdefault("url_route", {}).setdefault("kwargs", {})["database"] = EVERY_PROFILE
    return await page(datasette, request)


def _profile_listing(path: str, filters: dict[str, Any], limit: int, usage: bool, names: bool) -> dict[str, Any]:
    # One open per profile: its sessions (each with its short id), its usage per day and the filter choices it offers.
    with ProfileGlance(path, read_only=True) as db:
        rows = db.list_sessions(limit=limit, order="activity", **filters)
        return {"sessions": _with_short_ids(db, rows) if names else rows,
                "usage": db.usage(by="model", period="day", sources=filters["source"], models=filters["model"],
                                  since=filters["since"], include_archived=filters["include_archived"])
                if usage else [],
                "choices": db.stored_names() if names else {}}


async def all_sessions_page(datasette, request):
    """Show the sessions of every profile, newest activity first, with the one-profile filters and a chart by profile."""
    fleet = await refresh_profiles(datasette)
    if fleet is None:
        return await _as_database(sessions_page, datasette, request)
    page = _page_number(request)
    filters = _session_filters(request)
    names = await _visible(datasette, request, _served(datasette, fleet))
    want_usage = page == 1 or _wants_json(request)
    # Each profile gives its first page * N + 1 rows; the page is cut from the merged order.
    listed, failed = await _each_profile(datasette, names, _profile_listing, filters,
                                         page * SESSIONS_PER_PAGE + 1, want_usage, not _wants_json(request))
    merged = sorted(((name, row) for name, found in listed.items() for row in found["sessions"]),
                    key=lambda item: (item[1]["last_active"] or 0, item[0], item[1]["id"]), reverse=True)
    found = merged[(page - 1) * SESSIONS_PER_PAGE:page * SESSIONS_PER_PAGE + 1]
    sessions = [dict(_listed(r), profile=name, link=_session_url(name, r["id"])) for name, r in found[:SESSIONS_PER_PAGE]]
    usage = _usage_by_profile({name: found["usage"] for name, found in listed.items()})
    pager = _pager(request, page, len(found) > SESSIONS_PER_PAGE)
    errors = _fleet_errors(fleet, failed)
    if _wants_json(request):
        return _json({"profiles": list(listed), "page": page, "filters": _shown_filters(request),
                      "sessions": [{k: v for k, v in r.items() if k not in _SHOWN_ONLY} for r in sessions],
                      "errors": errors, "usage_per_day": usage, **pager})
    return await _render(datasette, request, SESSIONS_HTML, {
        "database": None, "everywhere": True, "sessions": sessions, "page": page, "errors": errors,
        "choices": _choices_across(found["choices"] for found in listed.values()), "args": _shown_filters(request),
        "search_url": _store_url(EVERY_PROFILE) + "/search",
        "chart": usage_chart(usage, by="profile") if page == 1 else "", **pager})


def _choices_across(per_profile: Iterable[dict[str, list[str]]]) -> dict[str, list[str]]:
    """Return the filter choices of every profile listed: the sources and models any of them holds."""
    choices: dict[str, set[str]] = {"source": set(), "model": set()}
    for found in per_profile:
        for column in choices:
            choices[column].update(found.get(column, ()))
    return {k: sorted(v) for k, v in choices.items()}


def _usage_by_profile(per_profile: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    # Each profile's usage per day and model, added up per day: the chart stacks profiles.
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, found in per_profile.items():
        for r in found:
            row = rows.setdefault((r["period"], name), {"period": r["period"], "profile": name, "session_count": 0,
                                                        "input_tokens": 0, "output_tokens": 0, "cost_usd": None})
            for key in ("session_count", "input_tokens", "output_tokens"):
                row[key] += r[key] or 0
            if r["cost_usd"] is not None:
                row["cost_usd"] = (row["cost_usd"] or 0.0) + r["cost_usd"]
    return [rows[key] for key in sorted(rows)]


async def all_search_page(datasette, request):
    """Search the messages and titles of every profile with the library's search, each hit with its profile."""
    fleet = await refresh_profiles(datasette)
    if fleet is None:
        return await _as_database(search_page, datasette, request)
    query, role, reasoning = _search_args(request)
    page = _page_number(request)
    names = await _visible(datasette, request, _served(datasette, fleet))
    found: list[dict[str, Any]] = []
    titled: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    if query:
        hits, failed = await _each_profile(datasette, names, _search, query, [role] if role else None, reasoning,
                                           page * HITS_PER_PAGE + 1, 0, ProfileGlance, not _wants_json(request))
        # Relevance ranks of two files do not compare: the hits take turns, each profile's best first.
        turns = sorted(((i, names.index(name), dict(h, profile=name)) for name, found_here in hits.items()
                        for i, h in enumerate(found_here)), key=lambda t: (t[0], t[1]))
        found = [h for _, _, h in turns][(page - 1) * HITS_PER_PAGE:page * HITS_PER_PAGE + 1]
        if page == 1:
            titled = await _titled_across(datasette, list(hits), query)
    more = len(found) > HITS_PER_PAGE
    found = found[:HITS_PER_PAGE]
    pager = _pager(request, page, more)
    errors = _fleet_errors(fleet, failed)
    if _wants_json(request):
        return _json({"profiles": names, "q": query, "role": role or None, "reasoning": reasoning, "page": page,
                      "sessions": titled, "hits": found, "errors": errors, **pager})
    return await _render(datasette, request, SEARCH_HTML, {
        "database": None, "everywhere": True, "q": query, "hits": _hit_views(found), "errors": errors,
        "titled": [dict(r, link=_session_url(r["profile"], r["id"]), last=_fmt_time(r["last_activity"]))
                   for r in titled],
        "page": page, "role": role, "roles": ROLES, "reasoning": reasoning,
        "sessions_url": _store_url(EVERY_PROFILE), **pager})


async def _titled_across(datasette, names: list[str], query: str) -> list[dict[str, Any]]:
    """Return the sessions of the profiles named whose title holds `query`, newest activity first, with their profile."""
    # On Datasette's connections, all at once, each waiting for a lock no longer than a ProfileGlance.
    found = await asyncio.gather(*(_titled(datasette.get_database(name), query, briefly=True) for name in names),
                                 return_exceptions=True)
    titled: list[dict[str, Any]] = []
    for name, rows in zip(names, found):
        if isinstance(rows, sqlite3.Error):  # damaged or locked since its hits: those hits stand
            continue
        if isinstance(rows, BaseException):
            raise rows
        titled += [dict(r, profile=name) for r in rows]
    return sorted(titled, key=lambda r: (r["last_activity"] or 0, r["profile"], r["id"]), reverse=True)[:HITS_PER_PAGE]


_CHOICES_SQL = "SELECT DISTINCT {column} FROM sessions WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 200"


async def sessions_page(datasette, request):
    """Show the sessions, newest activity first, a page at a time, filtered by source, model, time, archive."""
    name, database = await _store(datasette, request)
    page = _page_number(request)
    filters = _session_filters(request)
    found = await _off_loop(_list_sessions, database.path, filters, SESSIONS_PER_PAGE + 1,
                            (page - 1) * SESSIONS_PER_PAGE)
    sessions = [dict(_listed(r), link=_session_url(name, r["id"])) for r in found[:SESSIONS_PER_PAGE]]
    pager = _pager(request, page, len(found) > SESSIONS_PER_PAGE)
    if _wants_json(request):
        return _json({"database": name, "page": page, "filters": _shown_filters(request),
                      "sessions": [{k: v for k, v in r.items() if k not in _SHOWN_ONLY}
                                   for r in sessions], "usage_per_day": await _off_loop(_usage_per_day, database.path,
                                                                                       filters), **pager})
    # The filter choices: one SELECT each on Datasette's read-only connection.
    choices = {column: [r[0] for r in (await database.execute(_CHOICES_SQL.format(column=column))).rows]
               for column in ("source", "model")}
    usage = await _off_loop(_usage_per_day, database.path, filters) if page == 1 else []
    return await _render(datasette, request, SESSIONS_HTML, {
        "database": name, "sessions": sessions, "page": page, "choices": choices, "args": _shown_filters(request),
        "search_url": f"{PREFIX}/{quote(name, safe='')}/search", "chart": usage_chart(usage), **pager})


# What a listing row carries for the HTML page only; its JSON form leaves these out.
_SHOWN_ONLY = ("link", "cost", "tokens", "last", "label", "untitled", "short_id", "model_html")


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """Return a listing row with what the session list shows of it: cost, tokens, time, its label."""
    return dict(row, cost=_cost(row), tokens=_tokens(row), last=_fmt_time(row["last_active"]),
                label=row["title"] or preview_label(row["preview"]) or row.get("short_id") or row["id"],
                untitled=not row["title"], model_html=_breakable(row["model"]))


def _breakable(name: str | None) -> Markup:
    """Escape a model name, letting a narrow column break it after a "/" (provider/model), and a long name at its hyphens."""
    parts = (name or "").split("/")
    pieces = [part + "/" for part in parts[:-1]] + parts[-1:]
    # "gpt-5-mini" stays whole; "claude-sonnet-4.6" may break where the browser breaks a hyphen.
    return Markup("<wbr>").join(Markup('<span class="hs-nw">%s</span>') % piece if len(piece) <= LONG_NAME
                                else escape(piece) for piece in pieces if piece)


LONG_NAME = 12  # characters of a model name's part kept on one line


def preview_label(preview: str | None) -> str:
    """Return a listing preview on one line, ending in an ellipsis when the library cut it."""
    text = _one_line(preview)
    # The listing reads PREVIEW_CHARS characters of the first user message: as many means it went on.
    return text + "\u2026" if text and len(preview or "") >= PREVIEW_CHARS else text


def short_id(db: SessionDB, session_id: str) -> str:
    """Return the shortest prefix of `session_id` (SHORT_ID characters at least) that names only it, as git abbreviates."""
    # Usually one read: the ids sharing its first SHORT_ID characters, and the longest prefix it
    # shares with any of them (an id that is all of its prefix wins that prefix, so one more).
    others = db.session_ids_with_prefix(session_id[:SHORT_ID], limit=SHARING_READ)
    if len(others) < SHARING_READ:
        shared = max((len(os.path.commonprefix([session_id, other])) for other in others if other != session_id),
                     default=0)
        return session_id[:min(len(session_id), max(SHORT_ID, shared + 1))]
    # Too many share it: a prefix that names it stays one when longer, so the shortest is found by halving.
    low, high = min(SHORT_ID, len(session_id)), len(session_id)
    while low < high:
        middle = (low + high) // 2
        if db.resolve_session_id(session_id[:middle]) == session_id:
            high = middle
        else:
            low = middle + 1
    return session_id[:low]


SHARING_READ = 200  # ids read at most to find a short id in one read


def _with_short_ids(db: SessionDB, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r, short_id=short_id(db, r["id"])) for r in rows]


def _shown_filters(request) -> dict[str, str]:
    return {k: request.args.get(k, "").strip() for k in ("source", "model", "since", "archived")}


def _session_filters(request) -> dict[str, Any]:
    """Return the library's listing filters from the query string; a bad `since` is a 400 page."""
    shown = _shown_filters(request)
    since = None
    if shown["since"]:
        try:
            since = render.parse_when(shown["since"])
        except ValueError as exc:
            raise DatasetteError(str(exc), title="Bad filter", status=400) from None
    return {"source": shown["source"] or None, "model": shown["model"] or None, "since": since,
            "include_archived": shown["archived"] not in ("", "0")}


def _usage_per_day(path: str, filters: dict[str, Any]) -> list[dict[str, Any]]:
    # The session list's filters, applied to the sessions' start: usage per day and model.
    with SessionDB(path, read_only=True) as db:
        return db.usage(by="model", period="day", sources=filters["source"], models=filters["model"],
                        since=filters["since"], include_archived=filters["include_archived"])


def _list_sessions(path: str, filters: dict[str, Any], limit: int, offset: int) -> list[dict[str, Any]]:
    with SessionDB(path, read_only=True) as db:
        return _with_short_ids(db, db.list_sessions(limit=limit, offset=offset, order="activity", **filters))


async def session_page(datasette, request):
    """Show one session's conversation, its details and its lineage."""
    name, database = await _store(datasette, request)
    session_id = unquote(request.url_vars["session_id"])
    view = await _off_loop(_read_session, database.path, session_id)
    if view is None:
        return await _by_prefix(datasette, request, name, database, session_id)
    session = view["session"]
    if _wants_json(request):
        return _json({"database": name, "session": session, "messages": view["raw_messages"],
                      "chain": [sid for sid, _ in view["chain"]] or [session_id], "parent": view["parent"],
                      "children": [c["id"] for c in view["children"]]})
    link = {sid: _session_url(name, sid) for sid in view["ids"]}
    return await _render(datasette, request, SESSION_HTML, {
        "database": name, "session": session, "link": link, "chain": view["chain"],
        "parent": view["parent"], "children": view["children"], "messages": view["messages"],
        "details": _details(session),
        "sessions_url": f"{PREFIX}/{quote(name, safe='')}"})


async def _by_prefix(datasette, request, name: str, database, prefix: str) -> Response:
    """Send a unique prefix of a session id to its session (as the command line takes one); list an ambiguous one's."""
    found = await _off_loop(_ids_starting, database.path, prefix)
    if len(found) == 1:
        suffix = ".json" if _wants_json(request) else ""
        query = f"?{request.query_string}" if request.query_string else ""
        return Response.redirect(datasette.urls.path(_session_url(name, found[0]) + suffix + query))
    if not found:
        raise NotFound(f"No session's id is or starts with {prefix!r}")
    more = len(found) > SHOWN_CANDIDATES
    found = found[:SHOWN_CANDIDATES]
    if _wants_json(request):
        return Response.json({"ok": False, "error": f"{prefix!r} starts more than one session id", "status": 300,
                              "candidates": found, "more": more}, status=300)
    response = await _render(datasette, request, AMBIGUOUS_HTML, {
        "database": name, "prefix": prefix, "more": more, "sessions_url": _store_url(name),
        "candidates": [{"id": sid, "link": _session_url(name, sid)} for sid in found]})
    response.status = 300  # Multiple Choices: the page lists them
    return response


def _ids_starting(path: str, prefix: str) -> list[str]:
    with SessionDB(path, read_only=True) as db:
        try:
            return db.session_ids_with_prefix(prefix, limit=SHOWN_CANDIDATES + 1)
        except ValueError:  # a text no id can start with (a NUL, say)
            return []


async def search_page(datasette, request):
    """Search messages with the library's search (same routing, CJK and substring recall)."""
    name, database = await _store(datasette, request)
    query, role, reasoning = _search_args(request)
    page = _page_number(request)
    found: list[dict[str, Any]] = []
    titled: list[dict[str, Any]] = []
    if query:
        found = await _off_loop(_search, database.path, query, [role] if role else None, reasoning,
                                HITS_PER_PAGE + 1, (page - 1) * HITS_PER_PAGE, SessionDB, not _wants_json(request))
        if page == 1:  # sessions whose title holds the words, above the messages that do
            titled = await _titled(database, query)
    more = len(found) > HITS_PER_PAGE
    found = found[:HITS_PER_PAGE]
    pager = _pager(request, page, more)
    if _wants_json(request):
        return _json({"database": name, "q": query, "role": role or None, "reasoning": reasoning, "page": page,
                      "sessions": titled, "hits": found, **pager})
    hits = _hit_views([dict(h, profile=name) for h in found])
    titled = [dict(r, link=_session_url(name, r["id"]), last=_fmt_time(r["last_activity"])) for r in titled]
    return await _render(datasette, request, SEARCH_HTML, {
        "database": name, "q": query, "hits": hits, "titled": titled, "page": page, "role": role,
        "roles": ROLES, "reasoning": reasoning, "sessions_url": f"{PREFIX}/{quote(name, safe='')}", **pager})


def _search_args(request) -> tuple[str, str, bool]:
    """Return the query, the role (a 400 page for an unknown one) and whether reasoning is searched."""
    query = request.args.get("q", "").strip()
    role = request.args.get("role", "").strip()
    if role and role not in ROLES:
        raise DatasetteError(f"role must be one of {', '.join(ROLES)}, not {role!r}", title="Bad filter", status=400)
    return query, role, request.args.get("reasoning", "") not in ("", "0")


async def _titled(database, query: str, briefly: bool = False) -> list[dict[str, Any]]:
    """Return the sessions whose title holds `query` (one SELECT on Datasette's read-only connection).

    `briefly`: wait for another program's lock no longer than a ProfileGlance (the pages across profiles).
    """
    params = {"pattern": "%" + re.sub(r"([\\%_])", r"\\\1", query) + "%", "limit": HITS_PER_PAGE}
    if briefly:
        return await _briefly(database, lambda conn: _titles(conn, params))
    return await database.execute_fn(lambda conn: _titles(conn, params))


def _titles(conn: sqlite3.Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    # An older file (hermes-agent's) has no last_activity_at: its sessions sort by their start.
    columns = {r[1] for r in conn.execute("PRAGMA table_info(sessions)")}
    activity = "COALESCE(last_activity_at, started_at)" if "last_activity_at" in columns else "started_at"
    cursor = conn.execute(_TITLES_SQL.format(activity=activity), params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor]


def _hit_views(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # An untitled session is named as the session list names it: its first user message, else its short id.
    return [dict(h, snippet=_marked(plain_snippet(h["snippet"]) if h["role"] in ("user", "assistant") else h["snippet"]),
                 when=_fmt_time(h["timestamp"]), link=_session_url(h["profile"], h["session_id"]) + f"#m{h['id']}",
                 untitled=not h.get("title"),
                 session_label=h.get("title") or h.get("session_preview") or h.get("session_short_id")
                 or h["session_id"]) for h in found]


# Titles are short and few: a LIKE over the sessions table (case-insensitive for ASCII) finds them.
_TITLES_SQL = r"""
SELECT id, title, source, {activity} AS last_activity FROM sessions
 WHERE title LIKE :pattern ESCAPE '\'
 ORDER BY last_activity DESC, id LIMIT :limit"""


# --- reads (worker thread, read-only handle) -------------------------------------------------

def _read_session(path: str, session_id: str) -> dict[str, Any] | None:
    with SessionDB(path, read_only=True) as db:
        session = db.get_session(session_id)
        if session is None:
            return None
        chain = db.get_compression_lineage(session_id)  # the whole compression chain, read in one snapshot
        children = [row for row in db.get_descendants(session_id)
                    if row["parent_session_id"] == session_id and row["id"] not in chain]
        raw = db.get_messages(session_id)
        messages = [_message_view(m) for m in raw]
    here = chain.index(session_id) if session_id in chain else len(chain)
    parent = session["parent_session_id"]
    parent = parent if parent and parent not in chain else None  # a branch, not a compression parent
    return {"session": session, "messages": messages, "raw_messages": raw, "children": children, "parent": parent,
            "chain": [(sid, "earlier" if i < here else "continued in") for i, sid in enumerate(chain)]
            if len(chain) > 1 else [],
            "ids": set(chain) | {c["id"] for c in children} | ({parent} if parent else set())}


def _search(path: str, query: str, roles: list[str] | None, reasoning: bool, limit: int,
            offset: int, handle: type[SessionDB] = SessionDB, labels: bool = False) -> list[dict[str, Any]]:
    """Return the library's hits; with `labels`, an untitled session's hits carry what the session list shows for it."""
    with handle(path, read_only=True) as db:  # each hit carries its session's title
        hits = list(db.search_messages(query, role_filter=roles, include_reasoning=reasoning, limit=limit,
                                       offset=offset))
        if labels:
            untitled = {h["session_id"] for h in hits if not h.get("title")}
            shown = {sid: (_first_user_label(db, sid), short_id(db, sid)) for sid in untitled}
            hits = [dict(h, session_preview=shown[h["session_id"]][0], session_short_id=shown[h["session_id"]][1])
                    if h["session_id"] in shown else h for h in hits]
        return hits


# The rows read for an untitled session's label: its first user message is among the first few.
_FIRST_ROWS = 10


def _first_user_label(db: SessionDB, session_id: str) -> str:
    """Return the session's first user message as the session list shows it: one line, cut with an ellipsis."""
    for row in db.get_messages(session_id, limit=_FIRST_ROWS):
        if row["role"] == "user" and isinstance(row.get("content"), str):
            text = _one_line(row["content"][:2 * PREVIEW_CHARS])
            return text[:PREVIEW_CHARS].rstrip() + "\u2026" if len(text) > PREVIEW_CHARS else text
    return ""


def _details(session: dict[str, Any]) -> list[tuple[str, Any]]:
    ended = _fmt_time(session["ended_at"])
    if ended and session["end_reason"]:
        ended += f" ({session['end_reason']})"
    rows = [("id", session["id"]), ("source", session["source"]), ("model", session["model"]),
            ("user", session["user_id"]), ("started", _fmt_time(session["started_at"])), ("ended", ended),
            ("messages", session["message_count"]), ("tool calls", session["tool_call_count"]),
            ("tokens in / out", _tokens(session)), ("cost", _cost(session)),
            ("directory", session.get("cwd")), ("git branch", session.get("git_branch"))]
    return [(label, value) for label, value in rows if value not in (None, "")]


def _message_view(row: dict[str, Any]) -> dict[str, Any]:
    stored = row.get("tool_calls")
    calls = stored if isinstance(stored, list) else []
    reasoning = next((row[k] for k in ("reasoning", "reasoning_content") if isinstance(row.get(k), str)
                      and row[k].strip()), None)
    content = _text(row.get("content"))
    return {"id": row["id"], "role": row["role"], "content": content,
            "html": markdown(content) if row["role"] in ("user", "assistant") and isinstance(row.get("content"), str)
            else None,
            "when": _fmt_time(row.get("timestamp")), "tool_name": row.get("tool_name"),
            "reasoning": reasoning, "calls": [_call_view(c) for c in calls]}


def _call_view(call: Any) -> dict[str, str]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return {"name": "call", "arguments": _text(call)}
    stored = function.get("arguments")
    try:  # show JSON arguments indented; anything else exactly as stored
        arguments = json.dumps(json.loads(stored), indent=2, ensure_ascii=False) if isinstance(stored, str) \
            else _text(stored)
    except ValueError:
        arguments = _text(stored)
    return {"name": str(function.get("name") or "call"), "arguments": arguments}


async def _off_loop(read, *args):
    """Run a blocking library read on a worker thread; an unavailable store is a 503 page."""
    try:
        return await asyncio.to_thread(read, *args)
    except (StoreUnavailableError, StateDbCorruptError) as exc:
        raise DatasetteError("\n".join([problem_sentence(exc), *damaged_steps(exc)]), title="Store unavailable",
                             status=StoreUnavailableError.http_status) from exc


# --- helpers ---------------------------------------------------------------------------------

async def _store(datasette, request):
    name = unquote(request.url_vars["database"])
    if name not in _STORES.get(datasette, {}):
        # A profile made, or a store set right, since the last look (no other profile is checked).
        fleet = await refresh_profiles(datasette, only=name)
        if fleet is not None and name in fleet.problems:
            raise DatasetteError(fleet.problems[name], title=f"Profile {name}: store unavailable",
                                 status=StoreUnavailableError.http_status)
    if name not in _STORES.get(datasette, {}):
        raise NotFound(f"No hermes-state database named {name}")
    # The pages show table contents, so they need what Datasette's own table pages need.
    await datasette.ensure_permissions(request.actor, [("view-database", name), "view-instance"])
    return name, datasette.get_database(name)


async def _render(datasette, request, source: str, context: dict[str, Any]) -> Response:
    templates = _TEMPLATES.setdefault(datasette, {})
    if source not in templates:
        templates[source] = datasette.jinja_env.from_string(source)
    # Datasette's own views add its version for the footer; a plugin page has to say it too.
    context = {"datasette_version": datasette_version, **context}
    return Response.html(await datasette.render_template(templates[source], context, request=request))


def _wants_json(request) -> bool:
    return bool(request.url_vars.get("format"))


def _json(data: dict[str, Any]) -> Response:
    return Response.json(data, default=str)


_TEMPLATES: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _store_url(database: str) -> str:
    return f"{PREFIX}/{quote(database, safe='')}"


def _session_url(database: str, session_id: str) -> str:
    return f"{PREFIX}/{quote(database, safe='')}/session/{quote(session_id, safe='')}"


# The last page any listing can have: its offset must fit SQLite's integer.
MAX_PAGE = (2**63 - 1) // max(SESSIONS_PER_PAGE, HITS_PER_PAGE)


def _page_number(request) -> int:
    """Return the page asked for (1 when none is); a page that is not a whole number from 1 to MAX_PAGE is a 400 page."""
    text = request.args.get("page", "").strip() or "1"
    page = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else 0
    if not 1 <= page <= MAX_PAGE:
        raise DatasetteError(f"page must be a whole number from 1 to {MAX_PAGE}, not {text[:40]!r}",
                             title="Bad page", status=400)
    return page


def _pager(request, page: int, more: bool) -> dict[str, str | None]:
    def url(n: int) -> str:
        args = [(k, v) for k in request.args.keys() if k != "page" for v in request.args.getlist(k)]
        return "?" + urlencode([*args, ("page", n)])
    return {"prev_url": url(page - 1) if page > 1 else None, "next_url": url(page + 1) if more else None}


def _size(size_bytes: int) -> str:
    if size_bytes < 1024:
        return f"{size_bytes:,} bytes"
    value, unit = size_bytes / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:,.1f} {unit}"


def _fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else ""


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _tokens(row: dict[str, Any]) -> str:
    tokens_in, tokens_out = row.get("input_tokens") or 0, row.get("output_tokens") or 0
    return f"{tokens_in:,} / {tokens_out:,}" if tokens_in or tokens_out else ""


def _cost(row: dict[str, Any]) -> str:
    cost = row.get("actual_cost_usd") if row.get("actual_cost_usd") is not None else row.get("estimated_cost_usd")
    return f"${cost:,.4f}" if isinstance(cost, (int, float)) else ""


_MARKDOWN: list[Any] = []  # the parser, made on first use (None when markdown-it-py is not installed)


def markdown(text: str) -> Markup | None:
    """Return a message's Markdown as HTML (code, lists, links; any HTML in it escaped), or None without markdown-it-py."""
    if not _MARKDOWN:
        try:
            from markdown_it import MarkdownIt
        except ImportError:  # the page shows the text as it is
            _MARKDOWN.append(None)
        else:
            # CommonMark with raw HTML off: a stored <script> is text. Links keep markdown-it's own
            # check, which refuses javascript:, vbscript:, file: and data: (but images) URLs.
            _MARKDOWN.append(MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough"))
    parser = _MARKDOWN[0]
    return None if parser is None else Markup(parser.render(text))


_MARK = re.compile(r">>>(.*?)<<<", re.S)
# The match marks, while a snippet goes through the Markdown parser: characters no message's Markdown uses.
_OPEN, _CLOSE = "\ue000", "\ue001"


def plain_snippet(snippet: str | None) -> str:
    """Return a search snippet of Markdown as the words a reader sees (no **, `, # or link syntax), its marks kept."""
    text = snippet or ""
    if not _MARKDOWN:
        markdown("")  # makes the parser
    parser = _MARKDOWN[0]
    if parser is None or not text:
        return text
    protected = text.replace(_OPEN, "").replace(_CLOSE, "").replace(">>>", _OPEN).replace("<<<", _CLOSE)
    words: list[str] = []
    for token in parser.parse(protected):
        if token.type in ("fence", "code_block"):
            words.append(token.content)
        for child in token.children or ():
            if child.type in ("text", "code_inline", "html_inline", "image"):
                words.append(child.content)
            elif child.type in ("softbreak", "hardbreak"):
                words.append(" ")
        if token.type.endswith("_close") and token.block:
            words.append(" ")
    return _one_line("".join(words)).replace(_OPEN, ">>>").replace(_CLOSE, "<<<")


def _marked(snippet: str | None) -> Markup:
    """Escape a search snippet and turn its >>>match<<< marks into <mark> elements."""
    text = snippet or ""
    out, last = Markup(""), 0
    for match in _MARK.finditer(text):
        out += escape(text[last:match.start()]) + Markup("<mark>%s</mark>") % match.group(1)
        last = match.end()
    return out + escape(text[last:])


# --- templates (Datasette's Jinja environment: autoescaped, extending its base page) -----------

STYLE = """<style>
.hs-meta th { text-align: left; padding: 0.1em 1em 0.1em 0; font-weight: normal; color: #555; }
.hs-meta td { border: none; padding: 0.1em 0; }
.hs-lineage { list-style: decimal; padding-left: 2em; } .hs-children { list-style: disc; padding-left: 2em; }
.hs-msg { border-left: 4px solid #ccc; margin: 0.8em 0; padding: 0.2em 0.8em; }
.hs-msg.user { border-color: #3b82f6; } .hs-msg.assistant { border-color: #10b981; }
.hs-msg.tool { border-color: #f59e0b; } .hs-msg.system { border-color: #6b7280; }
.hs-role { font-weight: bold; text-transform: uppercase; font-size: 0.8em; color: #444; }
.hs-when { color: #777; font-size: 0.8em; margin-left: 0.5em; }
.hs-text, .hs-msg pre { white-space: pre-wrap; word-break: break-word; font-family: inherit; margin: 0.3em 0; }
.hs-msg pre { font-family: monospace; font-size: 0.9em; background: #f6f6f6; padding: 0.4em; }
.hs-msg details summary { cursor: pointer; color: #555; }
.hs-lineage li.current { font-weight: bold; } .hs-sessions td.hs-time { white-space: nowrap; }
.hs-sessions td.hs-id, .hs-id { font-family: monospace; font-size: 0.85em; white-space: nowrap; }
.hs-sessions { width: 100%; } .hs-sessions td.hs-title { min-width: 12em; overflow-wrap: anywhere; }
.hs-sessions th { white-space: normal; vertical-align: bottom; padding-right: 0.5em; }
.hs-sessions td.hs-num { white-space: nowrap; text-align: right; } .hs-nw { white-space: nowrap; }
.hs-sessions td.hs-time { white-space: normal; }
.hs-untitled { color: #777; font-style: italic; } .hs-untitled-mark { color: #999; font-size: 0.85em; }
.hs-anchor { color: #bbb; text-decoration: none; margin-left: 0.5em; } .hs-anchor:hover { color: #555; }
.hs-md p, .hs-md ul, .hs-md ol { margin: 0.3em 0; } .hs-md pre { white-space: pre; overflow-x: auto; }
.hs-md ul, .hs-md ol { padding-left: 2em; } .hs-md ul { list-style: disc; } .hs-md ol { list-style: decimal; }
.hs-md ul ul { list-style: circle; } .hs-md li { display: list-item; }
.hs-md code { background: #f3f3f3; padding: 0 0.2em; }
.hs-chart-box { margin: 0.5em 0 0.3em; } .hs-chart { display: block; } .hs-axis { font-size: 11px; fill: #555; }
.hs-bar:hover, .hs-day:hover { opacity: 0.8; } .hs-day:hover { fill: #f3f4f6; }
.hs-order { color: #555; font-size: 0.9em; margin: 0.2em 0 0.6em; } .hs-way-back { margin: 1em 0; }
.hs-legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; font-size: 0.85em; }
.hs-swatch { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; vertical-align: middle; }
.hs-filters { margin: 0.5em 0; } .hs-filters label { margin-right: 0.8em; }
.hs-errors { border-left: 4px solid #ef4444; padding: 0.2em 0.8em; margin: 0.8em 0; background: #fef2f2; }
mark { background: #fde68a; }
</style>"""

# The profiles an aggregate page could not read, each with what to do about it.
ERRORS = """{% if errors %}<div class="hs-errors"><p>Not shown, each for its own reason:</p><ul>
{% for e in errors %}<li{% if e.busy %} class="hs-busy"{% endif %}><a class="hs-profile" href="{{ urls.path('""" + PREFIX + """/' ~ (e.profile|urlencode)) }}">{{ e.profile }}</a>: {{ e.error }}{% if e.advice %}<ul class="hs-advice">{% for step in e.advice %}<li>{{ step }}</li>{% endfor %}</ul>{% endif %}</li>
{% endfor %}</ul></div>{% endif %}"""

PROFILES_HTML = """{% extends "base.html" %}
{% block title %}hermes-state profiles{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block content %}<h1>Profiles</h1>
<p><a href="{{ urls.path(all_url) }}">Sessions of every profile</a></p>
<form action="{{ urls.path(search_url) }}" method="get"><input type="search" name="q" placeholder="Search every profile">
<input type="submit" value="Search"></form>
<table class="rows-and-columns hs-profiles"><thead><tr><th>Profile</th><th>Sessions</th><th>Messages</th>
<th>Last activity</th><th>File size</th></tr></thead><tbody>
{% for p in profiles %}<tr><td><a href="{{ urls.path(p.url) }}">{{ p.profile }}</a></td><td>{{ "{:,}".format(p.sessions) }}</td>
<td>{{ "{:,}".format(p.messages) }}</td><td class="hs-time">{{ p.last }}</td><td>{{ p.size }}</td></tr>
{% else %}<tr><td colspan="5">No profile can be read.</td></tr>{% endfor %}</tbody></table>
""" + ERRORS + """
{% endblock %}"""

INDEX_HTML = """{% extends "base.html" %}
{% block title %}hermes-state databases{% endblock %}
{% block content %}<h1>hermes-state databases</h1>
{% if stores %}<ul>{% for name in stores %}<li><a href="{{ urls.path(prefix ~ '/' ~ (name|urlencode)) }}">{{ name }}</a></li>
{% endfor %}</ul>{% else %}<p>None of the served databases is a hermes-state store.</p>{% endif %}
{% endblock %}"""

SESSIONS_HTML = """{% extends "base.html" %}
{% block title %}Sessions: {{ database or "every profile" }}{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<h1>Sessions{% if everywhere %} of every profile{% endif %}</h1>
""" + ERRORS + """
<form action="{{ urls.path(search_url) }}" method="get"><input type="search" name="q" placeholder="Search titles and messages">
<input type="submit" value="Search"></form>
<form method="get" class="hs-filters"><label>source <select name="source"><option value="">any</option>
{% for c in choices.source %}<option{% if c == args.source %} selected{% endif %}>{{ c }}</option>{% endfor %}</select></label>
<label>model <select name="model"><option value="">any</option>
{% for c in choices.model %}<option{% if c == args.model %} selected{% endif %}>{{ c }}</option>{% endfor %}</select></label>
<label>active since <input name="since" value="{{ args.since }}" placeholder="7d, 12h, 2026-11-01" size="14"></label>
<label><input type="checkbox" name="archived" value="1"{% if args.archived not in ("", "0") %} checked{% endif %}> archived too</label>
<input type="submit" value="Filter"></form>
{% if chart %}<h2>Usage per day</h2><div class="hs-usage">{{ chart }}</div>{% endif %}
<table class="rows-and-columns hs-sessions"><thead><tr>{% if everywhere %}<th>Profile</th>{% endif %}<th>Session</th><th>ID</th><th>Source</th><th>Model</th>
<th>Messages</th><th>Tokens in / out</th><th>Cost</th><th>Last activity</th><th>Ended</th></tr></thead><tbody>
{% for s in sessions %}<tr>{% if everywhere %}<td class="hs-profile">{{ s.profile }}</td>{% endif %}<td class="hs-title">{% if s.untitled %}<span class="hs-untitled-mark">(untitled)</span> {% endif %}<a href="{{ urls.path(s.link) }}"{% if s.untitled %} class="hs-untitled"{% endif %}>{{ s.label }}</a></td><td class="hs-id" data-id="{{ s.id }}"><a href="{{ urls.path(s.link) }}" title="{{ s.id }}">{{ s.short_id }}</a></td>
<td>{{ s.source }}</td><td>{{ s.model_html }}</td><td class="hs-num">{{ s.message_count or 0 }}</td><td class="hs-num">{{ s.tokens }}</td><td class="hs-num">{{ s.cost }}</td>
<td class="hs-time">{% for part in s.last.split(" ") %}<span class="hs-nw">{{ part }}</span> {% endfor %}</td><td>{{ s.end_reason or "" }}{% if s.archived %} (archived){% endif %}</td></tr>
{% else %}<tr><td colspan="{{ 10 if everywhere else 9 }}">No sessions{% if page > 1 %} on this page{% endif %}.</td></tr>{% endfor %}
</tbody></table>
{% if prev_url or next_url %}<p class="hs-pager">{% if prev_url %}<a href="{{ prev_url }}">&larr; newer</a>{% endif %}
Page {{ page }} {% if next_url %}<a href="{{ next_url }}">older &rarr;</a>{% endif %}</p>{% endif %}
{% endblock %}"""

SESSION_HTML = """{% extends "base.html" %}
{% block title %}{{ session.title or "(untitled) " ~ session.id }}{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<p><a href="{{ urls.path(sessions_url) }}">&larr; all sessions</a></p>
<h1>{% if session.title %}{{ session.title }}{% else %}<span class="hs-untitled">(untitled)</span> <span class="hs-id">{{ session.id }}</span>{% endif %}</h1>
<table class="hs-meta">{% for label, value in details %}<tr><th>{{ label }}</th><td>{{ value }}</td></tr>
{% endfor %}</table>
{% if chain %}<h2>Compression chain</h2><ol class="hs-lineage">{% for sid, relation in chain %}
{% if sid == session.id %}<li class="current">{{ sid }} (this session)</li>
{% else %}<li><a href="{{ urls.path(link[sid]) }}">{{ sid }}</a> ({{ relation }})</li>{% endif %}{% endfor %}</ol>{% endif %}
{% if parent %}<p class="hs-parent">Parent session: <a href="{{ urls.path(link[parent]) }}">{{ parent }}</a></p>{% endif %}
{% if children %}<h2>Child sessions</h2><ul class="hs-children">{% for c in children %}
<li><a href="{{ urls.path(link[c.id]) }}">{{ c.title or c.id }}</a>{% if c.end_reason %} ({{ c.end_reason }}){% endif %}</li>
{% endfor %}</ul>{% endif %}
<h2>Conversation</h2>
{% for m in messages %}<div class="hs-msg {{ m.role }}" id="m{{ m.id }}"><span class="hs-role">{{ m.role }}</span>
<span class="hs-when">{{ m.when }}</span><a class="hs-anchor" href="#m{{ m.id }}" title="link to this message">#</a>
{% if m.reasoning %}<details class="hs-reasoning"><summary>reasoning</summary><pre>{{ m.reasoning }}</pre></details>{% endif %}
{% if m.role == "tool" %}<details class="hs-tool-result"><summary>result of {{ m.tool_name or "tool" }}
({{ m.content|length }} characters)</summary><pre>{{ m.content }}</pre></details>
{% elif m.role == "system" %}<details><summary>system prompt</summary><pre>{{ m.content }}</pre></details>
{% elif m.html %}<div class="hs-md">{{ m.html }}</div>
{% elif m.content %}<div class="hs-text">{{ m.content }}</div>{% endif %}
{% for c in m.calls %}<details class="hs-tool-call"><summary>calls {{ c.name }}</summary><pre>{{ c.arguments }}</pre></details>
{% endfor %}</div>{% else %}<p>No messages.</p>{% endfor %}
{% endblock %}"""

SEARCH_HTML = """{% extends "base.html" %}
{% block title %}Search: {{ q }}{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<p><a href="{{ urls.path(sessions_url) }}">&larr; all sessions</a></p>
<h1>Search{% if everywhere %} every profile{% endif %}</h1>
""" + ERRORS + """
<form method="get"><input type="search" name="q" value="{{ q }}" autofocus>
<label>role <select name="role"><option value="">any</option>
{% for r in roles %}<option{% if r == role %} selected{% endif %}>{{ r }}</option>{% endfor %}</select></label>
<label><input type="checkbox" name="reasoning" value="1"{% if reasoning %} checked{% endif %}> reasoning too</label>
<input type="submit" value="Search"></form>
{% if titled %}<h2>Sessions titled</h2><p class="hs-order">Newest activity first.</p><ul class="hs-titled">{% for t in titled %}
<li><a href="{{ urls.path(t.link) }}">{{ t.title }}</a> <span class="hs-when">{% if everywhere %}{{ t.profile }} · {% endif %}{{ t.source }} · {{ t.last }}</span></li>
{% endfor %}</ul>{% endif %}
{% if q %}{% if titled %}<h2>Messages</h2>{% endif %}{% if hits %}<p class="hs-order">{% if everywhere %}Each profile's best match first, the profiles taking turns (relevance in two files does not compare).{% else %}Best match first.{% endif %}</p>{% endif %}{% for h in hits %}<div class="hs-msg {{ h.role }} hs-hit"><span class="hs-role">{{ h.role }}</span>
{% if h.tool_name %}<span class="hs-when">{{ h.tool_name }}</span>{% endif %}<span class="hs-when">{{ h.when }}</span>
in {% if everywhere %}<span class="hs-profile">{{ h.profile }}</span>: {% endif %}{% if h.untitled %}<span class="hs-untitled-mark">(untitled)</span> {% endif %}<a href="{{ urls.path(h.link) }}"{% if h.untitled %} class="hs-untitled"{% endif %}>{{ h.session_label }}</a> <span class="hs-when">{{ h.source }}</span>
<div class="hs-text">{{ h.snippet }}</div></div>
{% else %}<p>No messages match.</p>{% endfor %}
{% if prev_url or next_url %}<p class="hs-pager">{% if prev_url %}<a href="{{ prev_url }}">&larr; better matches</a>{% endif %}
Page {{ page }} {% if next_url %}<a href="{{ next_url }}">more &rarr;</a>{% endif %}</p>{% endif %}{% endif %}
{% endblock %}"""

ERROR_HTML = """{% extends "base.html" %}
{% block title %}{{ title }}{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block content %}<h1>{{ title }}</h1>
<div class="hs-errors hs-error">{{ error }}{% if advice %}<p>What can be done:</p><ul class="hs-advice">{% for step in advice %}<li>{{ step }}</li>{% endfor %}</ul>{% endif %}</div>
<ul class="hs-way-back">{% for url, label in back %}<li><a href="{{ urls.path(url) }}">{{ label }}</a></li>{% endfor %}</ul>
{% endblock %}"""

AMBIGUOUS_HTML = """{% extends "base.html" %}
{% block title %}Which session? {{ prefix }}{% endblock %}
{% block extra_head %}""" + STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<p><a href="{{ urls.path(sessions_url) }}">&larr; all sessions</a></p>
<h1>Which session?</h1>
<p>More than one session id starts with <span class="hs-id">{{ prefix }}</span>: give more of it, or pick one.</p>
<ul class="hs-candidates">{% for c in candidates %}<li><a class="hs-id" href="{{ urls.path(c.link) }}">{{ c.id }}</a></li>
{% endfor %}</ul>{% if more %}<p>And more.</p>{% endif %}
{% endblock %}"""
