"""Project fixtures: every test runs in a temporary HERMES_HOME (the plugin's `hermes_home`).

`db` is an open SessionDB in it; `rival` is a second, independent connection to the same file
that can hold locks and checks what really persisted; `conn` is a bare migrated connection
for module-level functions. Shared helpers: `raw_conn` (a factory of bare connections, closed
at teardown), `plant_lock` (writes a compression lock row as another process would) and
`fake_home` (a fake user home with no HERMES_HOME, for tests of the default locations).

Plain helpers several test modules share (imported with `from conftest import ...`; no test module
imports from another): `run` / `run_in_terminal` (the CLI as a user runs it), `refused` (a ledger
call that raises and changes nothing), `locks_held` (this process's POSIX locks on a file),
`assert_documented_window` (a search's ranked page against the ranking window docs/search.md
describes), and the web pages' `private_store`, `get`, `content`, `digest`, `chromium`, `browse`
and `serving`.
"""
from __future__ import annotations

# Load the project's pytest plugin by name, so a checkout that is not pip-installed still has
# `hermes_home`; when the package is installed, its entry point registers the same name and
# pytest loads the plugin once.
pytest_plugins = ["hermes_state_pytest"]

import asyncio
import hashlib
import html as htmllib
import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest
from hypothesis import settings

# CI must not turn red on an example nobody has seen before: there the property tests replay a
# fixed sequence of examples. Local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

from hermes_state import SessionDB
from hermes_state_home import hermes_home_override


@pytest.fixture(autouse=True)
def _isolated_home(hermes_home):
    """Point every test at a temporary home (R-GUARD)."""
    yield hermes_home


@pytest.fixture
def db(hermes_home):
    handle = SessionDB()
    yield handle
    handle.close()


@pytest.fixture
def raw_conn(hermes_home) -> Iterator[Callable[..., sqlite3.Connection]]:
    """Return a factory of bare autocommit connections (foreign keys on); all are closed at teardown.

    `raw_conn()` opens the `db` fixture's file; `raw_conn(path)` any other. They have no TEMP
    triggers or SQL functions of the library: they write as another program would.
    """
    opened: list[sqlite3.Connection] = []

    def open_conn(path: str | os.PathLike | None = None, *, timeout: float = 5.0) -> sqlite3.Connection:
        c = sqlite3.connect(path or hermes_home / "state.db", isolation_level=None, timeout=timeout,
                            check_same_thread=False)
        c.execute("PRAGMA foreign_keys = ON")
        opened.append(c)
        return c

    yield open_conn
    for c in opened:
        try:
            if c.in_transaction:
                c.execute("ROLLBACK")
        except sqlite3.ProgrammingError:  # the test closed it already
            continue
        c.close()


@pytest.fixture
def rival(db):
    conn = sqlite3.connect(db.db_path, isolation_level=None, timeout=0.1, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


@pytest.fixture
def conn(db, raw_conn):
    """A bare connection to a migrated database, for module functions (caller owns transactions)."""
    return raw_conn(db.db_path)


@pytest.fixture
def index_queue() -> Callable[[SessionDB], None]:
    """Return `index(handle)`: index the rows `handle` queued now, as its next batch (or its close) would.

    A search never does it (a read writes nothing): it scans the queued rows instead.
    """
    import hermes_state_fts as fts

    def index(handle: SessionDB) -> None:
        with handle.transaction() as txn:
            fts.index_batch(txn.conn)
    return index


@pytest.fixture
def plant_lock(db, raw_conn) -> Callable[..., None]:
    """Return `plant(session_id, holder, expires_in_s=300.0)`: write a compression lock row directly.

    The row is written through a raw connection, as another process holding (or having left)
    the lock would; a negative `expires_in_s` plants an expired lock.
    """
    planter = raw_conn(db.db_path)

    def plant(session_id: str, holder: str, expires_in_s: float = 300.0) -> None:
        now = time.time()
        planter.execute("INSERT OR REPLACE INTO compression_locks (session_id, holder, acquired_at, expires_at) "
                        "VALUES (?, ?, ?, ?)", (session_id, holder, now, now + expires_in_s))

    return plant


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Give the test a fake user home, with no HERMES_HOME or guard bypass from the outer environment."""
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.setenv("USERPROFILE", str(user))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    monkeypatch.delenv("HERMES_STATE_DB_GUARD_BYPASS", raising=False)
    # The autouse `hermes_home` holds a context override for every test; lift it here.
    with hermes_home_override(None):
        yield user


@pytest.fixture
def fts_levels() -> Callable[[sqlite3.Connection, str], tuple[int, int]]:
    """Read an FTS5 index's (levels, segments) from its structure record, as plain rows (the index is never opened)."""
    def read(conn: sqlite3.Connection, table: str) -> tuple[int, int]:
        from hermes_state_fts import decode_structure  # the library's reader of the record, not a copy of it
        structure = decode_structure(conn.execute(f"SELECT block FROM {table}_data WHERE id = 10").fetchone()[0])
        return len(structure.levels), structure.segments
    return read


# --- the command as a user runs it ------------------------------------------------------------

def run(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run `hermes-state` as a user types it, on the home `home`; return the finished process."""
    env = {**os.environ, "HERMES_HOME": str(home), "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", *argv], capture_output=True, text=True,
                          env=env, input=stdin, timeout=120)


def run_in_terminal(home: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    """Run the command with stdout and stderr on a pseudo-terminal; return everything it printed."""
    leader, follower = pty.openpty()
    env = {**os.environ, "HERMES_HOME": str(home), "TERM": "xterm", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", *argv], stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


# --- the gateway's ledgers: a refused call changes nothing --------------------------------------

LEDGER_TABLES = ("runtime_epoch", "session_admissions", "worker_executions", "worker_receipts", "sessions",
                 "messages", "gateway_routing", "async_delegations")


def snapshot(rival: sqlite3.Connection) -> dict[str, list[tuple]]:
    """Every ledger row (and the outbox once it exists), as read by a second connection."""
    tables: list[str] = list(LEDGER_TABLES)
    if rival.execute("SELECT 1 FROM sqlite_master WHERE name = 'delivery_obligations'").fetchone():
        tables.append("delivery_obligations")
    return {t: [tuple(r) for r in rival.execute(f"SELECT * FROM {t} ORDER BY rowid")] for t in tables}


def refused(rival: sqlite3.Connection, error: type[BaseException], call: Callable[..., Any], *args: Any,
            **kwargs: Any) -> BaseException:
    """Assert the call raises `error` and changes nothing a second connection can see."""
    before = snapshot(rival)
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    assert snapshot(rival) == before
    return info.value


# --- this process's file locks ---------------------------------------------------------------

def locks_held(path: Path) -> set[tuple[str, str, str]]:
    """This process's POSIX locks on `path` and its -shm: (file, kind, byte range)."""
    inodes = {os.stat(p).st_ino: name for p, name in ((path, "db"), (Path(f"{path}-shm"), "shm")) if p.exists()}
    held = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 8 or fields[1] != "POSIX":
            continue
        if int(fields[4]) == os.getpid() and int(fields[5].split(":")[2]) in inodes:
            held.add((inodes[int(fields[5].split(":")[2])], fields[3], f"{fields[6]}-{fields[7]}"))
    return held


# --- the web pages: Datasette's client, `hermes-state serve` and a real browser ----------------

@pytest.fixture
def private_store(hermes_home) -> Path:
    """A home whose store holds one session with the words "private words"."""
    with SessionDB() as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "private words")
    return hermes_home


def get(path: Path, *urls: str, extra: Sequence[Path] = ()) -> list:
    """Fetch `urls` through Datasette's own client on `path` (and `extra` databases); return the responses."""
    from datasette.app import Datasette

    async def run():
        ds = Datasette([str(path), *map(str, extra)])
        await ds.invoke_startup()
        return [await ds.client.get(url) for url in urls]
    return asyncio.run(run())


def digest(path: Path) -> dict[str, str | None]:
    """Hash the database file and its WAL; a read-only browser may create empty side files, never change them."""
    out = {}
    for name in (path, Path(f"{path}-wal")):
        data = name.read_bytes() if name.exists() else b""
        out[name.name] = hashlib.sha256(data).hexdigest() if data else None
    return out


def content(response) -> str:
    """The page's content section, once the response is a 200."""
    assert response.status_code == 200, response.text[:500]
    section = re.search(r'<section class="content">(.*)</section>', response.text, re.S)
    assert section is not None, response.text[:500]
    return section.group(1)


def chromium() -> str:
    """The headless browser's path; skip without one (fail when CI requires it)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    reason = "Chromium is not installed (apt-get install chromium): the pages were not checked in a real browser"
    # CI installs Chromium and sets this, so there a browser test that did not run is a failure.
    if os.environ.get("HERMES_STATE_REQUIRE_BROWSER"):
        pytest.fail(reason + "; HERMES_STATE_REQUIRE_BROWSER is set, so it must run")
    pytest.skip(reason)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, server: subprocess.Popen, log: Path, timeout_s: float = 20.0) -> None:
    """Return once `server` listens on `port`; fail with its log if it exits or never listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"hermes-state serve exited with {server.returncode}: {log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"hermes-state serve did not listen on port {port} within {timeout_s} s: {log.read_text()}")


def stop(process: subprocess.Popen) -> None:
    """End `process` and its process group (Chromium's helpers too)."""
    # Each child runs in its own process group, so this ends Chromium's helpers too.
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def browse(browser: str, profile: Path, url: str, *flags: str) -> str:
    """Load `url` in headless Chromium with `flags`; return what it printed."""
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
            *flags, url]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop(process)
        pytest.fail(f"Chromium did not finish loading {url} within 60 s")
    finally:
        stop(process)
    assert process.returncode == 0, f"Chromium failed on {url} with exit code {process.returncode}"
    return out.decode("utf-8")


@contextmanager
def serving(path: Path, log: Path) -> Iterator[int]:
    """Run `hermes-state serve` on `path` at a free port (its output in `log`); yield the port, then stop it."""
    port = free_port()
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "serve", "--db", str(path),
                                   "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_for_port(port, server, log)
        yield port
    finally:
        stop(server)


# --- the web pages laid out in Chromium, and what the session list shows -------------------------

def listed_ids(html: str) -> list[str]:
    """Return the whole ids of the sessions a session list shows, in its order."""
    return re.findall(r'<td class="hs-id" data-id="([^"]+)"', html)


# The window widths the pages are checked at: a small laptop's and a wide screen's.
WIDTHS = (900, 1400)
# Read in the page once it is laid out: whether it scrolls sideways, the session list's columns and
# the lines each title takes, the Markdown lists' markers, the chart's box and its labels' boxes.
MEASURE = """(function () {
  const box = (e) => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width}; };
  const out = {};
  const se = document.scrollingElement;
  out.scrollWidth = se.scrollWidth; out.clientWidth = se.clientWidth;
  const table = document.querySelector("table.hs-sessions");
  if (table) {
    out.columns = Array.from(table.tHead.rows[0].cells).map((c) => [c.textContent.trim(), Math.round(box(c).width)]);
    out.titles = Array.from(table.querySelectorAll("td.hs-title")).map((td) => {
      const range = document.createRange(); range.selectNodeContents(td);
      const tops = Array.from(range.getClientRects()).map((q) => q.top).sort((a, b) => a - b);
      return [td.textContent.trim(), tops.filter((top, i) => i === 0 || top - tops[i - 1] > 8).length];
    });
  }
  out.lists = Array.from(document.querySelectorAll(".hs-md li")).map((li) => getComputedStyle(li).listStyleType);
  const svg = document.querySelector("svg.hs-chart");
  if (svg) {
    out.chart = box(svg); out.content = box(document.querySelector("section.content"));
    out.dates = Array.from(svg.querySelectorAll(".hs-xdate")).map((t) => [t.textContent, box(t)]);
    out.ticks = Array.from(svg.querySelectorAll(".hs-ytick")).map((t) => [t.textContent, box(t)]);
    out.grid = svg.querySelectorAll(".hs-grid").length;
  }
  const pre = document.createElement("pre"); pre.id = "hs-measure"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""


def measured(browser: str, profile: Path, port: int, path: str, width: int) -> dict[str, Any]:
    """Lay out the served page `path` in Chromium at `width` px; return what MEASURE reads of it.

    The page is fetched from the server and loaded from a file with MEASURE added at its end
    (its stylesheets still from the server): the page itself runs no script.
    """
    served = urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read().decode("utf-8")
    page = served.replace("<head>", f'<head><base href="http://127.0.0.1:{port}{path}">', 1)
    page = page.replace("</body>", f"<script>{MEASURE}</script></body>", 1)
    local = profile.parent / f"measure-{width}.html"
    local.write_text(page, encoding="utf-8")
    dom = browse(browser, profile, local.as_uri(), "--dump-dom", f"--window-size={width},900")
    found = re.search(r'<pre id="hs-measure">(.*?)</pre>', dom, re.S)
    assert found, f"the measuring script did not run on {path}"
    return json.loads(htmllib.unescape(found.group(1)))


# A gateway's session id: long, and never wrapped.
LONG_ID = "telegram:-1001234567890:thread:98765:user:4242424242:20261206T163722"


def assert_documented_window(db: SessionDB, query: str, match: str, filters: dict[str, Any], window: int,
                             pool: int) -> None:
    """Check `query`'s pages against the documented window of the word index's matches of `match`.

    The window: the newest `window` matches, reaching back to hold the newest max(need, pool)
    rows passing the filters; its passing rows in bm25 order, newest first among equals.
    """
    import hermes_state_fts as fts
    sql = (f"SELECT f.rowid, bm25({fts.WORD}) FROM {fts.WORD} f JOIN messages m ON m.id = f.rowid "
           f"JOIN sessions s ON s.id = m.session_id WHERE {fts.WORD} MATCH ? AND m.active = 1 "
           "AND s.source IN (SELECT value FROM json_each(?)) AND m.role IN (SELECT value FROM json_each(?)) "
           "ORDER BY f.rowid DESC")
    with sqlite3.connect(db.db_path) as c:
        matches = [r[0] for r in c.execute(f"SELECT rowid FROM {fts.WORD} WHERE {fts.WORD} MATCH ? "
                                           "ORDER BY rowid DESC", (match,))]
        passing = c.execute(sql, (match, json.dumps(filters.get("source_filter", ["discord", "cli"])),
                                  json.dumps(filters.get("role_filter", ["user", "assistant"])))).fetchall()
    for limit, offset in ((2, 0), (5, 0), (5, 5), (20, 0)):
        need = limit + offset
        floor = matches[window - 1] if len(matches) >= window else 0
        pooled = passing[max(need, pool) - 1][0] if len(passing) >= max(need, pool) else 0
        ranked = sorted((r for r in passing if r[0] >= min(floor, pooled)), key=lambda r: (r[1], -r[0]))
        got = [h["id"] for h in db.search_messages(query, limit=limit, offset=offset, **filters)]
        assert got == [r[0] for r in ranked[offset:need]], (limit, offset)
