"""The Datasette plugin and `hermes-state serve`: pages through Datasette's client, then a real browser."""
from __future__ import annotations

import asyncio
from contextlib import contextmanager
import hashlib
import html as htmllib
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import datasette.version
import pytest
from datasette.app import Datasette

import hermes_state_cli
import hermes_state_web
from hermes_state import SessionDB
from conftest import LONG_ID, WIDTHS, browse, chromium, content, digest, free_port, get, listed_ids, measured, serving, stop, wait_for_port

# Runs if stored text were ever emitted as markup; the browser test looks for its trace.
SCRIPT = "<script>document.body.setAttribute('data-pwned', 'yes')</script>"
TOOL_OUTPUT = "npm ERR! code ENOSPC\nnpm ERR! no space left on device\n" + SCRIPT


def _fill(db: SessionDB) -> None:
    """Sessions with a compression chain, a branch, tool calls, reasoning, CJK and a hostile tool output."""
    db.create_session("s_build", "cli", "anthropic/claude-sonnet-4.6", user_id="basic:alice")
    db.set_session_title("s_build", "Fix Docker Build")
    db.append_message("s_build", "user", "The docker build fails with no space left")
    db.append_message("s_build", "assistant", "Let me run the build.",
                      tool_calls=[{"id": "call_1", "type": "function",
                                   "function": {"name": "run_shell", "arguments": '{"cmd": "npm ci"}'}}])
    db.append_message("s_build", "tool", TOOL_OUTPUT, tool_call_id="call_1", tool_name="run_shell")
    db.append_message("s_build", "assistant", "The disk is full; prune old images.",
                      reasoning="ENOSPC means the device has no space left.")
    db.update_token_counts("s_build", input_tokens=1200, output_tokens=340, estimated_cost_usd=0.0123)
    kept = db.get_messages_as_conversation("s_build")[-1:]
    db.rotate_session("s_build", "s_build_2", kept, title="Fix Docker Build #2")
    db.create_session("s_branch", "cli", parent_session_id="s_build_2")
    db.append_message("s_branch", "user", "Try another approach")
    db.create_session("s_tokyo", "telegram", "openai/gpt-5")
    db.set_session_title("s_tokyo", "東京旅行の計画 <b>bold</b>")
    db.append_message("s_tokyo", "user", "来週東京に行きます。おすすめの観光地は？")
    db.append_message("s_tokyo", "assistant", "浅草寺と上野公園がおすすめです。")
    db.append_message("s_build_2", "user", "Pruned. What next?")  # the oldest but one start, the latest activity


@pytest.fixture
def store(db) -> Path:
    _fill(db)
    path = db.db_path
    db.close()  # browsing happens while no writer is open, so the file's bytes are a fixed reference
    return path


# --- through Datasette's client ----------------------------------------------------------------

def test_plugin_is_registered_through_the_entry_point(store):
    (plugins,) = get(store, "/-/plugins.json")
    ours = [p for p in plugins.json() if "register_routes" in p["hooks"] and p["name"] == "hermes-state"]
    assert ours and {"get_metadata", "startup"} <= set(ours[0]["hooks"])


def test_internal_tables_are_hidden_and_visible_tables_stay(store):
    async def run():
        ds = Datasette([str(store)])
        await ds.invoke_startup()
        database = ds.get_database("state")
        return set(await database.table_names()), set(await database.hidden_table_names())
    tables, hidden = asyncio.run(run())
    assert tables - hidden == {"sessions", "messages", "session_model_usage"}
    assert {"messages_fts", "messages_fts_trigram_data", "messages_fts_cjk_pending", "schema_version",
            "state_meta", "runtime_epoch", "compression_locks"} <= hidden


def test_table_search_on_messages_uses_the_word_index(store):
    (found, everything) = get(store, "/state/messages.json?_search=docker&_shape=array&_size=max",
                               "/state/messages.json?_shape=array&_size=max")
    with sqlite3.connect(store) as conn:
        expected = {r[0] for r in conn.execute(
            "SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'docker'")}
    assert expected and {row["id"] for row in found.json()} == expected
    assert len(everything.json()) > len(expected)  # the filter really filters


def test_sessions_page_lists_newest_activity_first(store):
    (page,) = get(store, "/-/hermes/state")
    html = content(page)
    order = [html.index(label) for label in ("Fix Docker Build #2", "東京旅行の計画", "Try another approach",
                                             "Fix Docker Build<")]
    assert order == sorted(order), order  # by start time it would be s_tokyo, s_branch, s_build_2, s_build
    assert "1,200 / 340" in html and "$0.0123" in html and "telegram" in html and "openai/gpt-5" in html
    assert 'href="/-/hermes/state/session/s_tokyo"' in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html


def test_sessions_page_pages(store, monkeypatch):
    monkeypatch.setattr(hermes_state_web, "SESSIONS_PER_PAGE", 2)
    pages = get(store, "/-/hermes/state", "/-/hermes/state?page=2", "/-/hermes/state?page=3")
    ids = [listed_ids(content(p)) for p in pages]
    assert [len(i) for i in ids] == [2, 2, 0]
    assert sorted(ids[0] + ids[1]) == ["s_branch", "s_build", "s_build_2", "s_tokyo"]
    assert "page=2" in content(pages[0]) and "page=1" in content(pages[1]) and "page=4" not in content(pages[1])


def test_conversation_page_folds_tools_and_reasoning_and_links_the_lineage(store):
    first, second = get(store, "/-/hermes/state/session/s_build", "/-/hermes/state/session/s_build_2")
    html = content(first)
    assert 'class="hs-msg user"' in html and 'class="hs-msg tool"' in html
    assert re.search(r'<details class="hs-tool-call"><summary>calls run_shell</summary><pre>\{\s+&#34;cmd&#34;', html)
    assert re.search(r'<details class="hs-tool-result"><summary>result of run_shell', html)
    assert re.search(r'<details class="hs-reasoning"><summary>reasoning</summary><pre>ENOSPC means', html)
    assert 'href="/-/hermes/state/session/s_build_2">s_build_2</a> (continued in)' in html
    assert "1,200 / 340" in html and "basic:alice" in html
    html = content(second)
    assert 'href="/-/hermes/state/session/s_build">s_build</a> (earlier)' in html
    assert 'href="/-/hermes/state/session/s_branch"' in html  # a branch child, not the compression chain
    (branch, tokyo) = get(store, "/-/hermes/state/session/s_branch", "/-/hermes/state/session/s_tokyo")
    assert 'Parent session: <a href="/-/hermes/state/session/s_build_2">' in content(branch)
    assert "来週東京に行きます。おすすめの観光地は？" in content(tokyo)


def test_stored_markup_is_rendered_as_text(store):
    (page,) = get(store, "/-/hermes/state/session/s_build")
    assert "<script>" not in content(page)
    assert "&lt;script&gt;document.body.setAttribute(&#39;data-pwned&#39;, &#39;yes&#39;)&lt;/script&gt;" in page.text


def test_search_finds_cjk_and_tool_output_with_paging(store, monkeypatch):
    cjk, tool, script, empty = get(store, "/-/hermes/state/search?q=東京", "/-/hermes/state/search?q=ENOSPC",
                                    "/-/hermes/state/search?q=script", "/-/hermes/state/search?q=zebra")
    assert "<mark>東京</mark>" in content(cjk) and "/-/hermes/state/session/s_tokyo#m" in content(cjk)
    html = content(tool)
    assert "<mark>ENOSPC</mark>" in html and 'class="hs-msg tool hs-hit"' in html
    assert "<script>" not in content(script) and "&lt;<mark>script</mark>&gt;" in content(script)  # snippets are escaped too
    assert "No messages match." in content(empty)
    monkeypatch.setattr(hermes_state_web, "HITS_PER_PAGE", 1)
    pages = get(store, *(f"/-/hermes/state/search?q=space&page={n}" for n in (1, 2, 3)))
    hits = [re.findall(r'session/(\w+)#m(\d+)', content(p)) for p in pages]
    assert [len(h) for h in hits] == [1, 1, 0]  # the user's message and the tool output, one per page
    assert hits[0] != hits[1]
    assert "q=space&amp;page=2" in content(pages[0]) and "page=3" not in content(pages[1])


def test_pages_see_writes_made_while_serving(db):
    # Datasette opens the file with mode=ro, never immutable: another process keeps writing to it.
    db.create_session("s_first", "cli")

    async def run():
        ds = Datasette([str(db.db_path)])
        await ds.invoke_startup()
        before = await ds.client.get("/-/hermes/state")
        db.create_session("s_later", "cli")
        db.append_message("s_later", "user", "written while serving")
        return before, await ds.client.get("/-/hermes/state"), await ds.client.get("/-/hermes/state/search?q=serving")
    before, after, search = asyncio.run(run())
    assert "s_first" in content(before) and "s_later" not in content(before)
    assert "written while serving" in content(after) and "session/s_later#m" in content(search)


def test_session_ids_with_reserved_characters_link_to_their_page(db):
    db.create_session("tg:1001/thread 7?x#y", "telegram")
    db.append_message("tg:1001/thread 7?x#y", "user", "odd id")
    (listing,) = get(db.db_path, "/-/hermes/state")
    link = re.search(r'href="(/-/hermes/state/session/[^"]+)"', content(listing)).group(1)
    assert link == "/-/hermes/state/session/tg%3A1001%2Fthread%207%3Fx%23y"
    (page,) = get(db.db_path, link)
    assert "odd id" in content(page)


@pytest.mark.parametrize("hex_text", ["E69DB1E4BAAC207265706F727420FF", "7265706F727420EDA08020E69DB1E4BAAC"],
                         ids=["stray_byte", "lone_surrogate"])
def test_search_page_reads_a_message_that_is_not_utf8(db, raw_conn, hex_text):
    # Another program stored it as TEXT; the page scans it (queued for the CJK index) with our SQL function.
    db.create_session("s_odd", "cli")
    db.append_message("s_odd", "user", "a report about 東京 in plain text")
    db.close()
    raw_conn().execute("INSERT INTO messages (session_id, role, content, timestamp) "
                       f"VALUES ('s_odd', 'user', CAST(x'{hex_text}' AS TEXT), 5)")
    word, cjk, listing = get(db.db_path, "/-/hermes/state/search?q=report", "/-/hermes/state/search?q=東京",
                             "/-/hermes/state/session/s_odd")
    for page in (word, cjk):
        assert len(re.findall(r"session/s_odd#m\d+", content(page))) == 2
    assert "\ufffd" in content(word) and "\ufffd" in content(listing)


def test_unknown_session_and_database_are_404(store):
    session, database = get(store, "/-/hermes/state/session/nope", "/-/hermes/other")
    assert session.status_code == 404 and database.status_code == 404


def test_a_store_the_library_cannot_read_is_a_503_page(store):
    with sqlite3.connect(store) as conn:
        # a newer layout that changed a column this library reads: read-only handles refuse it
        conn.execute("UPDATE schema_version SET version = 99")
        conn.execute("ALTER TABLE sessions DROP COLUMN pinned")
    session, search = get(store, "/-/hermes/state/session/s_build", "/-/hermes/state/search?q=docker")
    assert session.status_code == search.status_code == 503
    assert "schema version 99" in session.text and "Upgrade hermes-state" in session.text


def test_other_databases_are_left_alone(store, tmp_path):
    plain = tmp_path / "plain.db"
    with sqlite3.connect(plain) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("CREATE TABLE state_meta (k TEXT)")
    (listing, hermes, index) = get(store, "/plain.json", "/-/hermes/plain", "/-/hermes", extra=[plain])
    assert {t["name"]: t["hidden"] for t in listing.json()["tables"]} == {"notes": False, "state_meta": False}
    assert hermes.status_code == 404
    assert index.status_code == 302 and index.headers["location"] == "/-/hermes/state"


def test_importing_the_library_never_imports_datasette():
    code = "import sys, hermes_state, hermes_state_cli; sys.exit('datasette' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_serve_refuses_a_missing_database(tmp_path, capsys):
    missing = tmp_path / "none" / "state.db"
    assert hermes_state_cli.main(["serve", "--db", str(missing)]) == 1
    assert "does not exist" in capsys.readouterr().err and not missing.parent.exists()


def test_browsing_every_page_never_writes(store):
    before = digest(store)
    responses = get(store, "/", "/state", "/state/messages", "/state/sessions", "/state/messages?_search=docker",
                     "/-/hermes/state", "/-/hermes/state/session/s_build", "/-/hermes/state/session/s_tokyo",
                     "/-/hermes/state/search?q=東京", "/-/hermes/state/search?q=ENOSPC",
                     "/-/hermes/state/search?q=no+space+left")
    assert [r.status_code for r in responses] == [200] * len(responses)
    assert digest(store) == before


def test_sessions_page_has_an_id_column_and_filters(db):
    _fill(db)
    db.create_session("s_old", "cron", "openai/gpt-5-mini")
    db.archive_session("s_old")
    path = db.db_path
    db.close()
    every, telegram, model, future, archived, bad = get(
        path, "/-/hermes/state", "/-/hermes/state?source=telegram", "/-/hermes/state?model=openai%2Fgpt-5",
        "/-/hermes/state?since=2999-01-01", "/-/hermes/state?archived=1", "/-/hermes/state?since=soon")

    def listed(response):
        return listed_ids(content(response))
    assert sorted(listed(every)) == ["s_branch", "s_build", "s_build_2", "s_tokyo"]  # archived left out
    assert listed(telegram) == ["s_tokyo"] and listed(model) == ["s_tokyo"] and listed(future) == []
    assert "s_old" in listed(archived) and "(archived)" in content(archived)
    assert '<option selected>telegram</option>' in content(telegram) and "<option>cron</option>" in content(every)
    assert bad.status_code == 400 and "not a time" in bad.text


def test_search_finds_titles_and_takes_role_and_reasoning(store):
    titled, tool_only, user_only, plain, reasoning, bad = get(
        store, "/-/hermes/state/search?q=Docker+Build", "/-/hermes/state/search?q=space&role=tool",
        "/-/hermes/state/search?q=space&role=user", "/-/hermes/state/search?q=means",
        "/-/hermes/state/search?q=means&reasoning=1", "/-/hermes/state/search?q=x&role=robot")
    html = content(titled)
    assert '<ul class="hs-titled">' in html and 'href="/-/hermes/state/session/s_build">Fix Docker Build</a>' in html
    assert 'href="/-/hermes/state/session/s_build_2">Fix Docker Build #2</a>' in html
    assert re.findall(r'class="hs-msg (\w+) hs-hit"', content(tool_only)) == ["tool"]
    assert re.findall(r'class="hs-msg (\w+) hs-hit"', content(user_only)) == ["user"]
    assert "No messages match." in content(plain)
    assert "<mark>means</mark>" in content(reasoning) and 'name="reasoning" value="1" checked' in content(reasoning)
    assert bad.status_code == 400


def test_every_plugin_page_has_a_json_form(store):
    listing, session, search, missing = get(store, "/-/hermes/state.json", "/-/hermes/state/session/s_build.json",
                                             "/-/hermes/state/search.json?q=%E6%9D%B1%E4%BA%AC",
                                             "/-/hermes/state/session/nope.json")
    assert listing.headers["content-type"].startswith("application/json")
    assert [r["id"] for r in listing.json()["sessions"]][0] == "s_build_2"
    assert {"started_at", "message_count", "preview"} <= set(listing.json()["sessions"][0])
    data = session.json()
    assert data["session"]["title"] == "Fix Docker Build" and data["chain"] == ["s_build", "s_build_2"]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert data["messages"][2]["content"] == TOOL_OUTPUT  # the stored text, exactly
    hits = search.json()["hits"]
    assert hits and {h["session_id"] for h in hits} == {"s_tokyo"} and ">>>東京<<<" in hits[0]["snippet"]
    assert missing.status_code == 404


def test_home_page_links_the_sessions_and_hides_internal_views(store):
    home, view, footer = get(store, "/", "/state/messages_fts_trigram_source", "/-/hermes/state")
    html = content(home)
    assert 'href="/-/hermes/state"' in html
    assert "messages_fts_trigram_source" not in html and "view" not in re.sub(r"<[^>]+>", "", html)
    assert view.status_code == 403
    assert f'title="Datasette v{datasette.version.__version__}"' in footer.text


def test_table_pages_show_times_as_dates_and_json_keeps_the_numbers(store):
    page, data = get(store, "/state/sessions", "/state/sessions.json?_shape=array")
    html = content(page)
    started = data.json()[0]["started_at"]
    assert isinstance(started, float)
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) in html
    assert not re.search(r">\s*1\d{9}\.\d+\s*<", html)  # no raw epoch seconds shown as cell text


# --- in a real browser -------------------------------------------------------------------------

PLAN = "Plan the migration of the billing service"


def _add_layout_sessions(path: Path) -> None:
    """A session with a long id and an untitled preview cut short, and one with Markdown lists."""
    with SessionDB(path) as db:
        db.create_session(LONG_ID, "api", "openai/gpt-5")
        db.append_message(LONG_ID, "user", "Please send the quarterly report to alice@example.com and copy "
                                           "bob@example.com too")
        db.create_session("s_plan", "cli", "anthropic/claude-sonnet-4.6")
        db.set_session_title("s_plan", PLAN)
        db.append_message("s_plan", "assistant", "Steps, **carefully**:\n\n1. back up the database\n2. switch the writers\n\n"
                                                  "- keep the old one\n- watch the logs")


@pytest.mark.slow
def test_pages_render_in_headless_chromium(store, tmp_path):
    browser = chromium()
    _add_layout_sessions(store)
    before = digest(store)
    log = tmp_path / "serve.log"
    with serving(store, log) as port:
        base, profile = f"http://127.0.0.1:{port}/-/hermes/state", tmp_path / "chromium-profile"
        for width in WIDTHS:
            listing = measured(browser, profile, port, "/-/hermes/state", width)
            assert listing["scrollWidth"] <= listing["clientWidth"], (width, listing)  # no sideways scrolling
            columns = dict(listing["columns"])
            assert columns["ID"] <= 100 and columns["Session"] >= (190 if width < 1000 else 450), (width, columns)
            lines = dict(listing["titles"])
            assert lines[PLAN] == (2 if width < 1000 else 1), (width, lines)
            conversation = measured(browser, profile, port, "/-/hermes/state/session/s_plan", width)
            assert conversation["lists"] == ["decimal", "decimal", "disc", "disc"], conversation
            assert conversation["scrollWidth"] <= conversation["clientWidth"]
        dom = browse(browser, profile, base, "--dump-dom")
        assert f'<a href="/-/hermes/state/session/{quote(LONG_ID, safe="")}" title="{LONG_ID}">telegra</a>' in dom
        assert 'class="hs-untitled">Please send the quarterly report to alice@example.com and copy\u2026</a>' in dom
        # Search: its order said, an untitled session named as in the list, Markdown shown as words.
        dom = browse(browser, profile, f"{base}/search?q=quarterly", "--dump-dom")
        assert "Best match first." in dom and f">{LONG_ID}<" not in dom
        assert '<span class="hs-untitled-mark">(untitled)</span> <a href="/-/hermes/state/session/' \
               f'{quote(LONG_ID, safe="")}#m' in dom and "and copy\u2026</a>" in dom
        dom = browse(browser, profile, f"{base}/search?q=carefully", "--dump-dom")
        assert "Steps, <mark>carefully</mark>: back up the database" in dom and "**" not in dom
        dom = browse(browser, profile, f"{base}/search?q=zebra", "--dump-dom")
        assert "No messages match." in dom and "Page 1" not in dom
        # A unique prefix opens its session; an ambiguous one lists its sessions.
        dom = browse(browser, profile, f"{base}/session/s_tok", "--dump-dom")
        assert "浅草寺と上野公園がおすすめです。" in dom
        dom = browse(browser, profile, f"{base}/session/s_bu", "--dump-dom")
        assert "Which session?" in dom and re.findall(r'<a class="hs-id" href="[^"]+">(\w+)</a>', dom) == \
            ["s_build", "s_build_2"]
        # Error pages lead back.
        for broken in (f"{base}/session/nope", f"{base}?since=soon"):
            dom = browse(browser, profile, broken, "--dump-dom")
            assert '<a href="/-/hermes/state">Sessions of state</a>' in dom, broken
            assert '<a href="/-/hermes/state/search">Search state</a>' in dom
        dom = browse(browser, profile, f"{base}/session/s_build", "--dump-dom")
        body = re.search(r"<body[^>]*>", dom).group(0)
        assert "data-pwned" not in body  # the stored <script> never ran
        assert "&lt;script&gt;document.body.setAttribute" in dom
        assert "The disk is full; prune old images." in dom and "calls run_shell" in dom
        dom = browse(browser, profile, f"{base}/search?q=%E6%9D%B1%E4%BA%AC", "--dump-dom")
        assert "<mark>東京</mark>" in dom and "東京旅行の計画 &lt;b&gt;bold&lt;/b&gt;" in dom
        dom = browse(browser, profile, f"{base}?source=telegram&since=30d", "--dump-dom")
        assert listed_ids(dom) == ["s_tokyo"] and "<option selected=" in dom
        dom = browse(browser, profile, f"{base}/search?q=Docker+Build&role=tool&reasoning=1", "--dump-dom")
        assert 'href="/-/hermes/state/session/s_build">Fix Docker Build</a>' in dom and 'checked=""' in dom
        dom = browse(browser, profile, f"http://127.0.0.1:{port}/", "--dump-dom")
        assert 'href="/-/hermes/state"' in dom and "messages_fts_trigram_source" not in dom
        shot = tmp_path / "session.png"
        browse(browser, profile, f"{base}/session/s_build", f"--screenshot={shot}", "--window-size=1100,900",
                "--hide-scrollbars")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        assert "Serving" in log.read_text() and "127.0.0.1" in log.read_text()
    assert digest(store) == before


@pytest.mark.slow
def test_without_chromium_the_browser_test_skips_unless_ci_requires_it(tmp_path):
    # Run the browser test alone with a PATH on which no Chromium can be found.
    ROOT = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HERMES_STATE_REQUIRE_BROWSER", "PYTEST_ADDOPTS")}
    env["PATH"] = str(tmp_path)
    argv = [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "-m", "slow",  # it is in the marked set
            f"{ROOT / 'tests' / 'test_web.py'}::test_pages_render_in_headless_chromium"]
    skipped = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    assert "Chromium is not installed" in skipped.stdout
    required = subprocess.run(argv, capture_output=True, text=True, env={**env, "HERMES_STATE_REQUIRE_BROWSER": "1"},
                              cwd=ROOT, timeout=120)
    assert required.returncode == 1 and "1 failed" in required.stdout, required.stdout[-2000:]


@pytest.mark.parametrize("page", ["99999999999999999999", "0", "-1", "two", "1e3", "٣", str(2**63)])
def test_a_page_number_out_of_range_or_not_a_number_is_a_clean_400(store, page, caplog):
    listing, search, last = get(store, f"/-/hermes/state?page={page}", f"/-/hermes/state/search?q=space&page={page}",
                                 "/-/hermes/state?page=2")
    for response in (listing, search):
        assert response.status_code == 400 and "page must be a whole number" in response.text
    assert last.status_code == 200
    assert not [r for r in caplog.records if r.exc_info]  # no traceback in the log


# --- the session list's ids, prefixes, search and error pages ----------------------------------

def test_the_session_list_shows_short_unique_ids_with_the_whole_id_a_hover_or_click_away(db):
    for sid in ("20261206_163722_a1b2c3", "20261206_163722_a1ffff", "20261207_090000_0000aa", "short"):
        db.create_session(sid, "cli")
        db.append_message(sid, "user", "x" * 70 if sid == "short" else "a short first message")
    path = db.db_path
    db.close()
    (listing,) = get(path, "/-/hermes/state")
    cells = dict(re.findall(r'<td class="hs-id" data-id="([^"]+)"><a href="[^"]+" title="[^"]+">([^<]+)</a>',
                            content(listing)))
    # As git abbreviates: 7 characters at least, more until only this session's id starts so.
    assert cells == {"20261206_163722_a1b2c3": "20261206_163722_a1b", "20261206_163722_a1ffff": "20261206_163722_a1f",
                     "20261207_090000_0000aa": "20261207", "short": "short"}
    assert 'title="20261206_163722_a1b2c3">20261206_163722_a1b</a>' in content(listing)
    with SessionDB(path, read_only=True) as reader:  # when too many ids share a start, halving finds the same
        quick = {sid: hermes_state_web.short_id(reader, sid) for sid in cells}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hermes_state_web, "SHARING_READ", 1)
            assert {sid: hermes_state_web.short_id(reader, sid) for sid in cells} == quick == cells
    # A preview the listing cut ends in an ellipsis; one it did not stays as it is.
    assert "x" * 63 + "\u2026</a>" in content(listing) and "a short first message</a>" in content(listing)
    (data,) = get(path, "/-/hermes/state.json")
    assert {"short_id", "model_html"}.isdisjoint(data.json()["sessions"][0])  # the JSON keeps the stored row


def test_a_unique_id_prefix_opens_its_session_and_an_ambiguous_one_says_so(store):
    unique, as_json, ambiguous, ambiguous_json, none = get(
        store, "/-/hermes/state/session/s_tok", "/-/hermes/state/session/s_tok.json", "/-/hermes/state/session/s_bu",
        "/-/hermes/state/session/s_bu.json", "/-/hermes/state/session/zz")
    assert unique.status_code == 302 and unique.headers["location"] == "/-/hermes/state/session/s_tokyo"
    assert as_json.headers["location"] == "/-/hermes/state/session/s_tokyo.json"
    assert ambiguous.status_code == 300 and "Which session?" in ambiguous.text
    assert re.findall(r'<a class="hs-id" href="/-/hermes/state/session/(\w+)">', ambiguous.text) == ["s_build",
                                                                                                    "s_build_2"]
    assert ambiguous_json.status_code == 300 and ambiguous_json.json()["candidates"] == ["s_build", "s_build_2"]
    assert none.status_code == 404


def test_error_pages_lead_back_to_the_sessions_and_the_search(store):
    missing, bad_filter, bad_role, unknown_db, missing_json = get(
        store, "/-/hermes/state/session/nope", "/-/hermes/state?since=soon", "/-/hermes/state/search?q=x&role=robot",
        "/-/hermes/other", "/-/hermes/state/session/nope.json")
    for response, status in ((missing, 404), (bad_filter, 400), (bad_role, 400)):
        assert response.status_code == status
        assert '<a href="/-/hermes/state">Sessions of state</a>' in response.text
        assert '<a href="/-/hermes/state/search">Search state</a>' in response.text
    assert "not a time" in bad_filter.text and "role must be one of" in bad_role.text
    assert unknown_db.status_code == 404 and '<a href="/-/hermes">hermes-state databases</a>' in unknown_db.text
    assert missing_json.status_code == 404 and missing_json.json()["ok"] is False  # JSON stays JSON
    with sqlite3.connect(store) as conn:  # a newer layout this library refuses: the 503 leads back too
        conn.execute("UPDATE schema_version SET version = 99")
        conn.execute("ALTER TABLE sessions DROP COLUMN pinned")
    (unavailable,) = get(store, "/-/hermes/state/session/s_build")
    assert unavailable.status_code == 503 and "schema version 99" in unavailable.text
    assert '<a href="/-/hermes/state/search">Search state</a>' in unavailable.text


def test_search_states_its_order_names_untitled_sessions_and_shows_markdown_as_words(db):
    db.create_session("s_untitled_long_id_0001", "cli")
    db.append_message("s_untitled_long_id_0001", "user", "How do I **prune** `docker` images? See [the docs](https://x.y)")
    db.create_session("s_titled", "cli")
    db.set_session_title("s_titled", "Pruning")
    db.append_message("s_titled", "assistant", "1. run `docker image prune`\n2. check the disk")
    path = db.db_path
    db.close()
    found, nothing, data = get(path, "/-/hermes/state/search?q=docker", "/-/hermes/state/search?q=zebra",
                               "/-/hermes/state/search.json?q=docker")
    html = content(found)
    assert "Best match first." in html and "Page 1" not in html
    assert '<span class="hs-untitled-mark">(untitled)</span> <a href="/-/hermes/state/session/' \
           's_untitled_long_id_0001#m' in html
    # named as the session list names it: its first user message, as stored
    assert 'class="hs-untitled">How do I **prune** `docker` images? See [the docs](https://x.y)</a>' in html
    assert ">s_untitled_long_id_0001<" not in html
    snippets = re.findall(r'<div class="hs-text">(.*?)</div>', html)
    assert "How do I prune <mark>docker</mark> images? See the docs" in snippets
    assert "run <mark>docker</mark> image prune check the disk" in snippets
    assert "No messages match." in content(nothing) and "Page 1" not in content(nothing)
    assert "Best match first." not in content(nothing)
    hits = data.json()["hits"]
    assert any("**prune**" in h["snippet"] for h in hits)  # the JSON keeps the library's snippet
    assert all("session_preview" not in h for h in hits)
