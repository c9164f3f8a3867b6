"""The Datasette plugin and `hermes-state serve`: pages through Datasette's client, then a real browser."""
from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import datasette.version
import pytest
from datasette.app import Datasette

import hermes_state_cli
import hermes_state_web
from hermes_state import SessionDB
from conftest import browse, chromium, content, digest, get, serving

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
    ids = [re.findall(r'/-/hermes/state/session/([\w]+)"', content(p)) for p in pages]
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
        return re.findall(r'<td class="hs-id">([^<]+)</td>', content(response))
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

@pytest.mark.slow
def test_pages_render_in_headless_chromium(store, tmp_path):
    browser = chromium()
    before = digest(store)
    log = tmp_path / "serve.log"
    with serving(store, log) as port:
        base, profile = f"http://127.0.0.1:{port}/-/hermes/state", tmp_path / "chromium-profile"
        dom = browse(browser, profile, f"{base}/session/s_build", "--dump-dom")
        body = re.search(r"<body[^>]*>", dom).group(0)
        assert "data-pwned" not in body  # the stored <script> never ran
        assert "&lt;script&gt;document.body.setAttribute" in dom
        assert "The disk is full; prune old images." in dom and "calls run_shell" in dom
        dom = browse(browser, profile, f"{base}/search?q=%E6%9D%B1%E4%BA%AC", "--dump-dom")
        assert "<mark>東京</mark>" in dom and "東京旅行の計画 &lt;b&gt;bold&lt;/b&gt;" in dom
        dom = browse(browser, profile, f"{base}?source=telegram&since=30d", "--dump-dom")
        assert re.findall(r'<td class="hs-id">([^<]+)</td>', dom) == ["s_tokyo"] and "<option selected=" in dom
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
