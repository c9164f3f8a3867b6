"""Datasette plugin: browse hermes-state databases in a web page, read-only.

Owns: the Datasette hooks that make a hermes-state file pleasant to browse (internal ledgers and
the FTS indexes hidden, Datasette's table search pointed at the word index, menu links) and three
pages under `/-/hermes/<database>`: the sessions (newest activity first), one session's
conversation with its lineage, and a search through the library's own `search_messages`.
Does not own: starting the server (`hermes-state serve` in hermes_state_cli) or any query the
library already answers: conversations, lineage and search go through a read-only `SessionDB`.

Transaction contract: nothing here writes. Pages open a read-only `SessionDB` per request (on a
worker thread, since the library is synchronous) or run one SELECT on Datasette's own read-only
connection. Every stored text is rendered through Jinja's autoescaping: messages are untrusted.
Datasette finds this module through its plugin entry point; `import hermes_state` never imports it.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import weakref
from typing import Any
from urllib.parse import quote, unquote, urlencode

from datasette import hookimpl
from datasette.utils.asgi import NotFound, Response
from datasette.views.base import DatasetteError
from markupsafe import Markup, escape

from hermes_state import SessionDB, StoreUnavailableError

PREFIX = "/-/hermes"
SESSIONS_PER_PAGE = 50
HITS_PER_PAGE = 20
# Tables a person browsing sessions wants; every other table of a hermes-state file (FTS indexes
# and their shadow tables, the CJK queue, schema bookkeeping, gateway and worker ledgers) is hidden.
VISIBLE_TABLES = ("sessions", "messages", "session_model_usage")
# What marks a database as a hermes-state store rather than any SQLite file Datasette serves.
MARKER_TABLES = {"sessions", "messages", "schema_version"}

# Names of the hermes-state databases and their hidden tables, per Datasette instance, found at
# startup (get_metadata is synchronous and called often, so it must only read this).
_STORES: "weakref.WeakKeyDictionary[Any, dict[str, list[str]]]" = weakref.WeakKeyDictionary()


# --- hooks ---------------------------------------------------------------------------------------

@hookimpl
def startup(datasette):
    """Find the hermes-state databases among those Datasette serves."""
    async def inner() -> None:
        stores: dict[str, list[str]] = {}
        for name, database in datasette.databases.items():
            if database.is_memory:
                continue
            tables = await database.table_names()
            if MARKER_TABLES <= set(tables):
                stores[name] = [t for t in tables if t not in VISIBLE_TABLES]
        _STORES[datasette] = stores
    return inner


@hookimpl
def get_metadata(datasette, key, database, table):
    """Hide internal tables and configure full-text search on `messages`."""
    # Datasette only detects an FTS table declared content="messages" or content=[messages];
    # this schema writes content='messages', so the search table is named here.
    return {"databases": {
        name: {"tables": {
            "messages": {"fts_table": "messages_fts", "fts_pk": "id"},
            "sessions": {"label_column": "title"},
            **{t: {"hidden": True} for t in hidden},
        }} for name, hidden in _STORES.get(datasette, {}).items()}}


@hookimpl
def register_routes():
    """Add the sessions, conversation and search pages."""
    return [
        (rf"^{PREFIX}/?$", index_page),
        (rf"^{PREFIX}/(?P<database>[^/]+)/?$", sessions_page),
        (rf"^{PREFIX}/(?P<database>[^/]+)/session/(?P<session_id>[^/]+)$", session_page),
        (rf"^{PREFIX}/(?P<database>[^/]+)/search$", search_page),
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


# --- pages ---------------------------------------------------------------------------------------

async def index_page(datasette, request):
    """List the hermes-state databases; go straight to the sessions when there is one."""
    stores = list(_STORES.get(datasette, {}))
    if len(stores) == 1:
        return Response.redirect(datasette.urls.path(f"{PREFIX}/{quote(stores[0], safe='')}"))
    return await _render(datasette, request, INDEX_HTML, {"stores": stores, "prefix": PREFIX})


_SESSIONS_SQL = """
SELECT s.id, s.title, s.source, s.model, s.message_count, s.input_tokens, s.output_tokens,
       s.estimated_cost_usd, s.actual_cost_usd, s.started_at, s.ended_at, s.end_reason, s.archived,
       COALESCE(s.last_activity_at, s.started_at) AS last_activity,
       (SELECT SUBSTR(m.content, 1, 80) FROM messages m
         WHERE m.session_id = s.id AND m.active = 1 AND m.role = 'user' AND m.content IS NOT NULL
         ORDER BY m.timestamp, m.id LIMIT 1) AS preview
  FROM sessions s
 ORDER BY last_activity DESC, s.id
 LIMIT :limit OFFSET :offset"""


async def sessions_page(datasette, request):
    """Show the sessions, newest activity first, a page at a time."""
    name, database = await _store(datasette, request)
    page = _page_number(request)
    # One listing query on Datasette's read-only connection: the library lists by start time,
    # while a browser wants the sessions that moved last on top.
    result = await database.execute(_SESSIONS_SQL, {"limit": SESSIONS_PER_PAGE + 1,
                                                    "offset": (page - 1) * SESSIONS_PER_PAGE})
    rows = [dict(r) for r in result.rows]
    sessions = [dict(r, link=_session_url(name, r["id"]), cost=_cost(r), tokens=_tokens(r),
                     last=_fmt_time(r["last_activity"]), label=r["title"] or _one_line(r["preview"]) or r["id"])
                for r in rows[:SESSIONS_PER_PAGE]]
    return await _render(datasette, request, SESSIONS_HTML, {
        "database": name, "sessions": sessions, "page": page,
        "search_url": f"{PREFIX}/{quote(name, safe='')}/search",
        **_pager(request, page, len(rows) > SESSIONS_PER_PAGE)})


async def session_page(datasette, request):
    """Show one session's conversation, its details and its lineage."""
    name, database = await _store(datasette, request)
    session_id = unquote(request.url_vars["session_id"])
    view = await _off_loop(_read_session, database.path, session_id)
    if view is None:
        raise NotFound(f"Session not found: {session_id}")
    session = view["session"]
    link = {sid: _session_url(name, sid) for sid in view["ids"]}
    return await _render(datasette, request, SESSION_HTML, {
        "database": name, "session": session, "link": link, "chain": view["chain"],
        "parent": view["parent"], "children": view["children"], "messages": view["messages"],
        "details": _details(session),
        "sessions_url": f"{PREFIX}/{quote(name, safe='')}"})


async def search_page(datasette, request):
    """Search messages with the library's search (same routing, CJK and substring recall)."""
    name, database = await _store(datasette, request)
    query = request.args.get("q", "").strip()
    page = _page_number(request)
    hits: list[dict[str, Any]] = []
    more = False
    if query:
        found, titles = await _off_loop(_search, database.path, query, HITS_PER_PAGE + 1,
                                        (page - 1) * HITS_PER_PAGE)
        more = len(found) > HITS_PER_PAGE
        hits = [dict(h, snippet=_marked(h["snippet"]), when=_fmt_time(h["timestamp"]),
                     link=_session_url(name, h["session_id"]) + f"#m{h['id']}",
                     session_label=titles.get(h["session_id"]) or h["session_id"])
                for h in found[:HITS_PER_PAGE]]
    return await _render(datasette, request, SEARCH_HTML, {
        "database": name, "q": query, "hits": hits, "page": page,
        "sessions_url": f"{PREFIX}/{quote(name, safe='')}", **_pager(request, page, more)})


# --- reads (worker thread, read-only handle) -------------------------------------------------

def _read_session(path: str, session_id: str) -> dict[str, Any] | None:
    with SessionDB(path, read_only=True) as db:
        session = db.get_session(session_id)
        if session is None:
            return None
        # The whole compression chain this session belongs to: ancestors of its live tip.
        tip = db.get_compression_successor(session_id) or session_id
        chain = db.get_compression_ancestors(tip) + [tip]
        children = [row for row in db.get_descendants(session_id)
                    if row["parent_session_id"] == session_id and row["id"] not in chain]
        messages = [_message_view(m) for m in db.get_messages(session_id)]
    here = chain.index(session_id) if session_id in chain else len(chain)
    parent = session["parent_session_id"]
    parent = parent if parent and parent not in chain else None  # a branch, not a compression parent
    return {"session": session, "messages": messages, "children": children, "parent": parent,
            "chain": [(sid, "earlier" if i < here else "continued in") for i, sid in enumerate(chain)]
            if len(chain) > 1 else [],
            "ids": set(chain) | {c["id"] for c in children} | ({parent} if parent else set())}


def _search(path: str, query: str, limit: int, offset: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    with SessionDB(path, read_only=True) as db:
        hits = db.search_messages(query, limit=limit, offset=offset)
        titles = {}
        for sid in {h["session_id"] for h in hits}:
            row = db.get_session(sid)
            titles[sid] = row["title"] if row else None
    return hits, titles


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
    calls = row.get("tool_calls") if isinstance(row.get("tool_calls"), list) else []
    reasoning = next((row[k] for k in ("reasoning", "reasoning_content") if isinstance(row.get(k), str)
                      and row[k].strip()), None)
    return {"id": row["id"], "role": row["role"], "content": _text(row.get("content")),
            "when": _fmt_time(row.get("timestamp")), "tool_name": row.get("tool_name"),
            "reasoning": reasoning, "calls": [_call_view(c) for c in calls]}


def _call_view(call: Any) -> dict[str, str]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return {"name": "call", "arguments": _text(call)}
    arguments = function.get("arguments")
    try:  # show JSON arguments indented; anything else exactly as stored
        arguments = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        arguments = _text(arguments)
    return {"name": str(function.get("name") or "call"), "arguments": arguments}


async def _off_loop(read, *args):
    """Run a blocking library read on a worker thread; an unavailable store is a 503 page."""
    try:
        return await asyncio.to_thread(read, *args)
    except StoreUnavailableError as exc:
        raise DatasetteError(f"{exc}. {exc.guidance}", title="Store unavailable", status=exc.http_status) from exc


# --- helpers ---------------------------------------------------------------------------------

async def _store(datasette, request):
    name = unquote(request.url_vars["database"])
    if name not in _STORES.get(datasette, {}):
        raise NotFound(f"No hermes-state database named {name}")
    # The pages show table contents, so they need what Datasette's own table pages need.
    await datasette.ensure_permissions(request.actor, [("view-database", name), "view-instance"])
    return name, datasette.get_database(name)


async def _render(datasette, request, source: str, context: dict[str, Any]) -> Response:
    templates = _TEMPLATES.setdefault(datasette, {})
    if source not in templates:
        templates[source] = datasette.jinja_env.from_string(source)
    return Response.html(await datasette.render_template(templates[source], context, request=request))


_TEMPLATES: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _session_url(database: str, session_id: str) -> str:
    return f"{PREFIX}/{quote(database, safe='')}/session/{quote(session_id, safe='')}"


def _page_number(request) -> int:
    try:
        return max(1, int(request.args.get("page", "1")))
    except ValueError:
        return 1


def _pager(request, page: int, more: bool) -> dict[str, str | None]:
    def url(n: int) -> str:
        args = [(k, v) for k in request.args.keys() if k != "page" for v in request.args.getlist(k)]
        return "?" + urlencode([*args, ("page", n)])
    return {"prev_url": url(page - 1) if page > 1 else None, "next_url": url(page + 1) if more else None}


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


_MARK = re.compile(r">>>(.*?)<<<", re.S)


def _marked(snippet: str | None) -> Markup:
    """Escape a search snippet and turn its >>>match<<< marks into <mark> elements."""
    out, last = Markup(""), 0
    for match in _MARK.finditer(snippet or ""):
        out += escape(snippet[last:match.start()]) + Markup("<mark>%s</mark>") % match.group(1)
        last = match.end()
    return out + escape((snippet or "")[last:])


# --- templates (Datasette's Jinja environment: autoescaped, extending its base page) -----------

_STYLE = """<style>
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
mark { background: #fde68a; }
</style>"""

INDEX_HTML = """{% extends "base.html" %}
{% block title %}hermes-state databases{% endblock %}
{% block content %}<h1>hermes-state databases</h1>
{% if stores %}<ul>{% for name in stores %}<li><a href="{{ urls.path(prefix ~ '/' ~ (name|urlencode)) }}">{{ name }}</a></li>
{% endfor %}</ul>{% else %}<p>None of the served databases is a hermes-state store.</p>{% endif %}
{% endblock %}"""

SESSIONS_HTML = """{% extends "base.html" %}
{% block title %}Sessions: {{ database }}{% endblock %}
{% block extra_head %}""" + _STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<h1>Sessions</h1>
<form action="{{ urls.path(search_url) }}" method="get"><input type="search" name="q" placeholder="Search messages">
<input type="submit" value="Search"></form>
<table class="rows-and-columns hs-sessions"><thead><tr><th>Session</th><th>Source</th><th>Model</th>
<th>Messages</th><th>Tokens in / out</th><th>Cost</th><th>Last activity</th><th>Ended</th></tr></thead><tbody>
{% for s in sessions %}<tr><td><a href="{{ urls.path(s.link) }}">{{ s.label }}</a></td><td>{{ s.source }}</td>
<td>{{ s.model or "" }}</td><td>{{ s.message_count or 0 }}</td><td>{{ s.tokens }}</td><td>{{ s.cost }}</td>
<td class="hs-time">{{ s.last }}</td><td>{{ s.end_reason or "" }}{% if s.archived %} (archived){% endif %}</td></tr>
{% else %}<tr><td colspan="8">No sessions{% if page > 1 %} on this page{% endif %}.</td></tr>{% endfor %}
</tbody></table>
<p class="hs-pager">{% if prev_url %}<a href="{{ prev_url }}">&larr; newer</a>{% endif %}
Page {{ page }} {% if next_url %}<a href="{{ next_url }}">older &rarr;</a>{% endif %}</p>
{% endblock %}"""

SESSION_HTML = """{% extends "base.html" %}
{% block title %}{{ session.title or session.id }}{% endblock %}
{% block extra_head %}""" + _STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<p><a href="{{ urls.path(sessions_url) }}">&larr; all sessions</a></p>
<h1>{{ session.title or session.id }}</h1>
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
<span class="hs-when">{{ m.when }}</span>
{% if m.reasoning %}<details class="hs-reasoning"><summary>reasoning</summary><pre>{{ m.reasoning }}</pre></details>{% endif %}
{% if m.role == "tool" %}<details class="hs-tool-result"><summary>result of {{ m.tool_name or "tool" }}
({{ m.content|length }} characters)</summary><pre>{{ m.content }}</pre></details>
{% elif m.role == "system" %}<details><summary>system prompt</summary><pre>{{ m.content }}</pre></details>
{% elif m.content %}<div class="hs-text">{{ m.content }}</div>{% endif %}
{% for c in m.calls %}<details class="hs-tool-call"><summary>calls {{ c.name }}</summary><pre>{{ c.arguments }}</pre></details>
{% endfor %}</div>{% else %}<p>No messages.</p>{% endfor %}
{% endblock %}"""

SEARCH_HTML = """{% extends "base.html" %}
{% block title %}Search: {{ q }}{% endblock %}
{% block extra_head %}""" + _STYLE + """{% endblock %}
{% block crumbs %}{{ crumbs.nav(request=request, database=database) }}{% endblock %}
{% block content %}<p><a href="{{ urls.path(sessions_url) }}">&larr; all sessions</a></p>
<h1>Search messages</h1>
<form method="get"><input type="search" name="q" value="{{ q }}" autofocus> <input type="submit" value="Search"></form>
{% if q %}{% for h in hits %}<div class="hs-msg {{ h.role }} hs-hit"><span class="hs-role">{{ h.role }}</span>
{% if h.tool_name %}<span class="hs-when">{{ h.tool_name }}</span>{% endif %}<span class="hs-when">{{ h.when }}</span>
in <a href="{{ urls.path(h.link) }}">{{ h.session_label }}</a> <span class="hs-when">{{ h.source }}</span>
<div class="hs-text">{{ h.snippet }}</div></div>
{% else %}<p>No messages match.</p>{% endfor %}
<p class="hs-pager">{% if prev_url %}<a href="{{ prev_url }}">&larr; better matches</a>{% endif %}
Page {{ page }} {% if next_url %}<a href="{{ next_url }}">more &rarr;</a>{% endif %}</p>{% endif %}
{% endblock %}"""
