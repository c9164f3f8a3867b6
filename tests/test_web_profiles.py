"""`hermes-state serve --all-profiles`: every profile of a root in one Datasette, each failing on its own."""
from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from datasette.app import Datasette

import hermes_state_cli
import hermes_state_web
from hermes_state import SessionDB, list_sessions_across_profiles
from hermes_state_home import hermes_home_override
from conftest import LONG_ID, WIDTHS, browse, chromium, content, digest, free_port, measured, stop, wait_for_port

GARBAGE = b"this is not a database, only bytes " * 200


def _profile(root: Path, name: str) -> Path:
    return root if name == "default" else root / "profiles" / name


def _store(root: Path, name: str, sessions: list[tuple[str, str, str, float, str]]) -> Path:
    """Make profile `name` with sessions (id, source, model, cost, a user message); return its state.db."""
    path = _profile(root, name) / "state.db"
    with SessionDB(path) as db:
        for sid, source, model, cost, text in sessions:
            db.create_session(sid, source, model)
            db.set_session_title(sid, f"{name} {sid}")
            db.append_message(sid, "user", text)
            db.update_token_counts(sid, input_tokens=100, output_tokens=10, estimated_cost_usd=cost)
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    """A root with two readable profiles (default, coder) and a damaged one (broken)."""
    base = tmp_path / "root"
    _store(base, "default", [("d_old", "cli", "m/one", 0.5, "docker build fails"),
                             ("d_new", "cli", "m/one", 0.25, "deploy the docker image")])
    _store(base, "coder", [("c_mid", "telegram", "m/two", 1.0, "docker compose up")])
    # The newest activity of all: d_old gets a message after every other session was written.
    with SessionDB(base / "state.db") as db:
        db.append_message("d_old", "assistant", "prune the images")
    (base / "profiles" / "broken").mkdir(parents=True)
    (base / "profiles" / "broken" / "state.db").write_bytes(GARBAGE)
    return base


def datasette_for(root: Path) -> Datasette:
    return Datasette([], metadata={"plugins": {"hermes-state": {"profiles_root": str(root)}}})


def get(root: Path, *urls: str) -> list:
    async def run():
        ds = datasette_for(root)
        await ds.invoke_startup()
        return [await ds.client.get(url) for url in urls]
    return asyncio.run(run())


def test_index_lists_each_profile_with_its_counts_and_the_damaged_one_under_errors(root):
    page, data = get(root, "/-/hermes", "/-/hermes.json")
    body = data.json()
    assert [p["profile"] for p in body["profiles"]] == ["default", "coder"]
    default, coder = body["profiles"]
    assert (default["sessions"], default["messages"], coder["sessions"], coder["messages"]) == (2, 3, 1, 1)
    assert default["size_bytes"] == (root / "state.db").stat().st_size > 0
    with SessionDB(root / "state.db", read_only=True) as db:
        newest = max(m["timestamp"] for m in db.get_messages("d_old"))
    assert default["last_activity"] == newest and default["url"] == "/-/hermes/default"
    (error,) = body["errors"]
    assert error["profile"] == "broken" and "not a usable SQLite database" in error["error"]
    # Nothing of it is readable: the steps offered are those that can work, for this profile.
    assert error["advice"][0].startswith("nothing in it can be salvaged") and "recover" not in " ".join(error["advice"])
    assert error["advice"][-1].endswith("then `hermes-state -p broken init`")
    html = content(page)
    assert 'href="/-/hermes/coder">coder</a>' in html and 'href="/-/hermes/all"' in html
    assert "broken" in html and "then `hermes-state -p broken init`</li>" in html


def test_each_profile_keeps_its_pages_under_its_own_name(root):
    listing, session, search, datasette_page = get(
        root, "/-/hermes/coder.json", "/-/hermes/coder/session/c_mid.json", "/-/hermes/default/search.json?q=docker",
        "/coder/sessions.json?_shape=array")
    assert [s["id"] for s in listing.json()["sessions"]] == ["c_mid"] and listing.json()["database"] == "coder"
    assert session.json()["session"]["title"] == "coder c_mid"
    assert {h["session_id"] for h in search.json()["hits"]} == {"d_old", "d_new"}
    assert [r["id"] for r in datasette_page.json()] == ["c_mid"]


def test_all_lists_sessions_of_every_profile_newest_activity_first(root):
    page, data = get(root, "/-/hermes/all", "/-/hermes/all.json")
    body = data.json()
    assert [(s["profile"], s["id"]) for s in body["sessions"]] == [("default", "d_old"), ("coder", "c_mid"),
                                                                   ("default", "d_new")]
    assert body["profiles"] == ["default", "coder"]
    assert [e["profile"] for e in body["errors"]] == ["broken"] and "-p broken init" in body["errors"][0]["advice"][-1]
    assert {"link", "label"}.isdisjoint(body["sessions"][0]) and "preview" in body["sessions"][0]
    html = content(page)
    assert re.findall(r'<td class="hs-profile">(\w+)</td>', html) == ["default", "coder", "default"]
    assert 'href="/-/hermes/coder/session/c_mid"' in html and "hermes-state -p broken init" in html


def test_all_takes_the_filters_of_one_profile_and_pages(root, monkeypatch):
    telegram, model, future, bad = get(root, "/-/hermes/all.json?source=telegram", "/-/hermes/all.json?model=m%2Fone",
                                       "/-/hermes/all.json?since=2999-01-01", "/-/hermes/all?since=soon")
    assert [s["id"] for s in telegram.json()["sessions"]] == ["c_mid"]
    assert [s["id"] for s in model.json()["sessions"]] == ["d_old", "d_new"]
    assert future.json()["sessions"] == [] and bad.status_code == 400
    monkeypatch.setattr(hermes_state_web, "SESSIONS_PER_PAGE", 2)
    first, second, third = get(root, *(f"/-/hermes/all.json?page={n}" for n in (1, 2, 3)))
    assert [s["id"] for s in first.json()["sessions"]] == ["d_old", "c_mid"] and first.json()["next_url"] == "?page=2"
    assert [s["id"] for s in second.json()["sessions"]] == ["d_new"] and second.json()["next_url"] is None
    assert third.json()["sessions"] == []


def test_search_across_profiles_goes_through_the_library(root):
    page, data, titles, cjk_free = get(root, "/-/hermes/all/search?q=docker", "/-/hermes/all/search.json?q=docker",
                                       "/-/hermes/all/search.json?q=coder", "/-/hermes/all/search.json?q=zebra")
    body = data.json()
    assert {(h["profile"], h["session_id"]) for h in body["hits"]} == {("default", "d_old"), ("default", "d_new"),
                                                                       ("coder", "c_mid")}
    assert body["hits"][0]["profile"] == "default" and body["hits"][1]["profile"] == "coder"  # each profile's best, in turn
    assert all(">>>docker<<<" in h["snippet"] for h in body["hits"])
    assert [e["profile"] for e in body["errors"]] == ["broken"]
    assert [(s["profile"], s["id"]) for s in titles.json()["sessions"]] == [("coder", "c_mid")]
    assert cjk_free.json()["hits"] == []
    html = content(page)
    assert 'href="/-/hermes/coder/session/c_mid#m' in html and "<mark>docker</mark>" in html


def test_search_across_profiles_pages(root, monkeypatch):
    monkeypatch.setattr(hermes_state_web, "HITS_PER_PAGE", 2)
    first, second = get(root, "/-/hermes/all/search.json?q=docker", "/-/hermes/all/search.json?q=docker&page=2")
    hits = [(h["profile"], h["session_id"]) for h in first.json()["hits"] + second.json()["hits"]]
    assert len(hits) == len(set(hits)) == 3 and first.json()["next_url"] and second.json()["next_url"] is None


def test_the_usage_chart_stacks_profiles(root):
    page, data = get(root, "/-/hermes/all", "/-/hermes/all.json")
    rows = data.json()["usage_per_day"]
    assert {r["profile"]: r["cost_usd"] for r in rows} == {"default": 0.75, "coder": 1.0}
    assert {r["profile"]: r["session_count"] for r in rows} == {"default": 2, "coder": 1}
    html = content(page)
    bars = re.findall(r'<rect class="hs-bar"[^>]*height="([\d.]+)"[^>]*data-profile="(\w+)"', html)
    assert {name for _, name in bars} == {"default", "coder"}
    heights = {name: float(h) for h, name in bars}
    assert heights["coder"] / heights["default"] == pytest.approx(1.0 / 0.75, rel=0.01)
    assert "Cost per day, by profile" in html


@pytest.mark.parametrize("damage, says", [
    ("garbage", "says what can be saved"),
    ("missing", "Start the profile's owner once"),
    ("empty", "Start the profile's owner once"),
    ("newer", "Upgrade hermes-state"),
])
def test_a_profile_that_cannot_be_read_fails_on_its_own(root, damage, says):
    store = root / "profiles" / "bad" / "state.db"
    store.parent.mkdir(parents=True)
    if damage == "garbage":
        store.write_bytes(GARBAGE)
    elif damage == "empty":
        store.write_bytes(b"")
    elif damage == "newer":
        _store(root, "bad", [("b1", "cli", "m", 0.0, "hidden")])
        with sqlite3.connect(store) as conn:
            conn.execute("UPDATE schema_version SET version = 99")
            conn.execute("ALTER TABLE sessions DROP COLUMN pinned")
    before = store.read_bytes() if store.exists() else None
    listing, session, search, listing_json, index, every, other = get(
        root, "/-/hermes/bad", "/-/hermes/bad/session/b1", "/-/hermes/bad/search?q=x", "/-/hermes/bad.json",
        "/-/hermes.json", "/-/hermes/all.json", "/-/hermes/coder.json")
    for response in (listing, session, search, listing_json):
        assert response.status_code == 503 and says in response.text.replace("&#39;", "'")
    assert listing_json.json()["status"] == 503 and says in listing_json.json()["error"]
    errors = {e["profile"]: e["error"] for e in index.json()["errors"]}
    assert says in errors["bad"] and set(errors) == {"bad", "broken"}
    assert {e["profile"] for e in every.json()["errors"]} == {"bad", "broken"}
    assert len(every.json()["sessions"]) == 3 and other.status_code == 200
    assert (store.read_bytes() if store.exists() else None) == before  # nothing written, nothing created


def test_a_busy_profile_fails_on_its_own_and_serves_once_free(root, monkeypatch):
    monkeypatch.setattr(SessionDB, "read_busy_timeout_s", 0.2)  # the 5 s default, shortened for the suite
    monkeypatch.setattr(hermes_state_web.ProfileGlance, "read_busy_timeout_s", 0.05)
    path = _store(root, "busy", [("b1", "cli", "m", 0.0, "busy docker")])
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("PRAGMA journal_mode=DELETE")  # an exclusive lock blocks readers only without WAL
    locker.execute("BEGIN EXCLUSIVE")

    async def run():
        ds = datasette_for(root)
        await ds.invoke_startup()
        while_busy = [await ds.client.get(u) for u in ("/-/hermes/busy", "/-/hermes.json", "/-/hermes/all.json",
                                                       "/-/hermes/all/search.json?q=docker")]
        locker.execute("ROLLBACK")
        return while_busy, [await ds.client.get(u) for u in ("/-/hermes/busy.json", "/-/hermes.json")]
    try:
        (page, index, every, search), (after, index_after) = asyncio.run(run())
    finally:
        locker.close()
    assert page.status_code == 503 and "Retry shortly" in page.text
    for response in (index, every, search):
        assert response.status_code == 200
        errors = {e["profile"]: e for e in response.json()["errors"]}
        assert set(errors) == {"busy", "broken"} and "Retry shortly" in errors["busy"]["error"]
        assert errors["busy"]["error"].startswith("busy: ") and errors["busy"]["busy"] is True
        assert errors["broken"]["busy"] is False and "says what can be saved" in errors["broken"]["error"]
    assert {h["profile"] for h in search.json()["hits"]} == {"default", "coder"}
    assert after.status_code == 200 and [s["id"] for s in after.json()["sessions"]] == ["b1"]
    assert "busy" in [p["profile"] for p in index_after.json()["profiles"]]


class Gate:
    """Holds up every read-only open of one store until released; counts the opens it held up."""

    GUARD_S = 60.0  # only against a hang: the gate opens by itself then, and the test fails

    def __init__(self, monkeypatch, path: Path) -> None:
        self.path, self.held, self.release, self.guarded = path.resolve(), 0, threading.Event(), False
        self.timer = threading.Timer(self.GUARD_S, self.open_by_guard)
        self.timer.start()
        real = SessionDB.__init__

        def held_up(db, db_path=None, **kw):
            if db_path is not None and Path(db_path).resolve() == self.path and not self.release.is_set():
                self.held += 1
                self.release.wait()
            real(db, db_path, **kw)
        monkeypatch.setattr(SessionDB, "__init__", held_up)

    def open_by_guard(self) -> None:
        self.guarded = True
        self.release.set()

    def open(self) -> None:
        self.timer.cancel()
        self.release.set()


@pytest.mark.slow
def test_a_profile_that_does_not_answer_holds_up_no_other_page_and_no_request(root, monkeypatch):
    # "stuck" stands for any store whose reads do not end (a lock another program keeps): its
    # opens wait on a gate. The pages across profiles wait for it at most PROFILE_DEADLINE_S,
    # list it as busy, and show every other profile; requests arriving together wait together.
    monkeypatch.setattr(hermes_state_web, "PROFILE_DEADLINE_S", 2.0)
    stuck = _store(root, "stuck", [("s1", "cli", "m", 0.0, "stuck docker")])
    pages = ("/-/hermes.json", "/-/hermes/all.json", "/-/hermes/all/search.json?q=docker")

    async def run():
        ds = datasette_for(root)
        gate = Gate(monkeypatch, stuck)
        try:
            # Not served yet: its check, started at startup, is still held while four requests come.
            await ds.invoke_startup()
            unserved = await asyncio.gather(*(ds.client.get(u) for u in (*pages, "/-/hermes/broken.json")))
            unserved_held, unserved_guarded = gate.held, gate.guarded
            gate.open()
            served = await ds.client.get("/-/hermes.json")
            # Served now: each page's read of it is held, and a page of a healthy profile comes too.
            gate = Gate(monkeypatch, stuck)
            held = await asyncio.gather(*(ds.client.get(u) for u in (*pages, "/-/hermes/default.json")))
            return unserved, unserved_held, unserved_guarded, served, held, gate.held, gate.guarded
        finally:
            gate.open()
    unserved, unserved_held, unserved_guarded, served, held, held_count, guarded = asyncio.run(run())
    assert not unserved_guarded and not guarded  # every answer came while the store was still held
    assert unserved_held == 1  # one check of the store, shared by the requests that needed it
    assert held_count == 3  # each page read it once, at the same time: none waited for another
    for index, every, search in (unserved[:3], held[:3]):
        for response in (index, every, search):
            errors = {e["profile"]: e for e in response.json()["errors"]}
            assert errors["stuck"]["busy"] is True and errors["stuck"]["error"].startswith("busy: ")
            assert "Retry shortly" in errors["stuck"]["error"] and errors["broken"]["busy"] is False
        assert [p["profile"] for p in index.json()["profiles"]] == ["default", "coder"]
        assert {s["profile"] for s in every.json()["sessions"]} == {"default", "coder"}
        assert {h["profile"] for h in search.json()["hits"]} == {"default", "coder"}
    broken = unserved[3]
    assert broken.status_code == 503 and "hermes-state -p broken init" in broken.json()["error"]
    assert "stuck" in [p["profile"] for p in served.json()["profiles"]]
    assert held[3].status_code == 200 and {s["id"] for s in held[3].json()["sessions"]} == {"d_old", "d_new"}


def test_a_profile_made_while_serving_appears_without_a_restart(root):
    async def run():
        ds = datasette_for(root)
        await ds.invoke_startup()
        before = await ds.client.get("/-/hermes.json")
        (root / "profiles" / "later").mkdir()  # its owner made the directory, not the database yet
        waiting = await ds.client.get("/-/hermes/later.json")
        _store(root, "later", [("l1", "cron", "m/three", 2.0, "made later with docker")])
        return (before, waiting, await ds.client.get("/-/hermes.json"), await ds.client.get("/-/hermes/later.json"),
                await ds.client.get("/-/hermes/all.json"), await ds.client.get("/-/hermes/all/search.json?q=later"))
    before, waiting, index, page, every, search = asyncio.run(run())
    assert "later" not in [p["profile"] for p in before.json()["profiles"]]
    assert waiting.status_code == 503 and "Start the profile's owner once" in waiting.json()["error"]
    assert [p["profile"] for p in index.json()["profiles"]] == ["default", "coder", "later"]
    assert [s["id"] for s in page.json()["sessions"]] == ["l1"]
    assert ("later", "l1") in [(s["profile"], s["id"]) for s in every.json()["sessions"]]
    assert [h["profile"] for h in search.json()["hits"]] == ["later"]
    assert "later" not in {e["profile"] for e in index.json()["errors"]}


def test_without_a_profiles_root_all_is_a_database_named_all(tmp_path):
    path = tmp_path / "all.db"
    with SessionDB(path) as db:
        db.create_session("a1", "cli")

    async def run():
        ds = Datasette([str(path)])
        await ds.invoke_startup()
        return await ds.client.get("/-/hermes/all.json"), await ds.client.get("/-/hermes.json")
    listing, index = asyncio.run(run())
    assert listing.json()["database"] == "all" and [s["id"] for s in listing.json()["sessions"]] == ["a1"]
    assert index.json() == {"databases": [{"name": "all", "url": "/-/hermes/all"}]}


def test_browsing_every_profile_never_writes(root):
    stores = [root / "state.db", root / "profiles" / "coder" / "state.db", root / "profiles" / "broken" / "state.db"]
    before = [digest(p) for p in stores]
    responses = get(root, "/-/hermes", "/-/hermes/all", "/-/hermes/all/search?q=docker", "/-/hermes/coder",
                    "/-/hermes/default/session/d_old", "/-/hermes/broken")
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 200, 503]
    assert [digest(p) for p in stores] == before


def test_the_library_lists_across_profiles_by_activity_when_asked(root):
    by_start = list_sessions_across_profiles(root)["sessions"]
    by_activity = list_sessions_across_profiles(root, order="activity")["sessions"]
    assert [s["id"] for s in by_start] == ["c_mid", "d_new", "d_old"]
    assert [s["id"] for s in by_activity] == ["d_old", "c_mid", "d_new"]


def test_serve_all_profiles_refuses_a_db_and_a_missing_root(tmp_path, capsys):
    assert hermes_state_cli.main(["serve", "--all-profiles", "--db", str(tmp_path / "x.db")]) == 1
    assert "takes no --db" in capsys.readouterr().err
    with hermes_home_override(tmp_path / "nowhere"):
        assert hermes_state_cli.main(["serve", "--all-profiles"]) == 1
    assert "there is no profile to serve" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


@pytest.mark.slow
def test_every_profile_renders_in_headless_chromium(root, tmp_path):
    browser = chromium()
    _store(root, "coder", [(LONG_ID, "api", "anthropic/claude-sonnet-4.6", 0.5, "a gateway's session")])
    log, port = tmp_path / "serve.log", free_port()
    env = {**os.environ, "HERMES_HOME": str(root)}
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "hermes_state_cli", "serve", "--all-profiles", "--port",
                                   str(port)], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for_port(port, server, log)
        base, profile = f"http://127.0.0.1:{port}/-/hermes", tmp_path / "chromium-profile"
        for width in WIDTHS:  # a long id leaves the titles their room, with a profile column too
            m = measured(browser, profile, port, "/-/hermes/all", width)
            assert m["scrollWidth"] <= m["clientWidth"], (width, m)
            assert dict(m["columns"])["ID"] <= 100, (width, m)
            assert [lines for title, lines in m["titles"] if LONG_ID not in title] == [1, 1, 1], (width, m)
        dom = browse(browser, profile, f"{base}/all", "--dump-dom")
        assert re.findall(r'<td class="hs-profile">(\w+)</td>', dom) == ["coder", "default", "coder", "default"]
        assert 'data-profile="coder"' in dom and "hermes-state -p broken init" in dom and ">broken</a>" in dom
        dom = browse(browser, profile, f"{base}/broken", "--dump-dom")
        assert "not a usable SQLite database" in dom and "hermes-state -p broken init" in dom
        dom = browse(browser, profile, base, "--dump-dom")
        assert 'href="/-/hermes/coder">coder</a>' in dom and 'href="/-/hermes/default">default</a>' in dom
        shot = tmp_path / "profiles.png"
        browse(browser, profile, f"{base}/all", f"--screenshot={shot}", "--window-size=1100,900", "--hide-scrollbars")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        assert "every profile of" in log.read_text()
    finally:
        stop(server)


def test_search_across_profiles_shows_markdown_as_words_and_names_untitled_sessions(root):
    with SessionDB(_profile(root, "coder") / "state.db") as db:
        db.create_session("c_untitled", "cli")
        db.append_message("c_untitled", "user", "Why does the **kubernetes** pod restart? `kubectl describe`")
    (page,) = get(root, "/-/hermes/all/search?q=kubernetes")
    html = content(page)
    assert "Each profile's best match first" in html
    assert "Why does the <mark>kubernetes</mark> pod restart? kubectl describe" in html
    assert '<span class="hs-untitled-mark">(untitled)</span> <a href="/-/hermes/coder/session/c_untitled#m' in html
    assert ">c_untitled<" not in html


def test_a_damaged_profiles_page_leads_back(root):
    page, bad = get(root, "/-/hermes/broken", "/-/hermes/all?since=soon")
    assert page.status_code == 503 and "<h1>Profile broken: store unavailable</h1>" in page.text
    assert "nothing in it can be salvaged" in page.text and "hermes-state -p broken init" in page.text
    assert "recover" not in page.text.replace("says what can be saved", "")
    assert '<a href="/-/hermes">Every profile</a>' in page.text
    assert bad.status_code == 400 and '<a href="/-/hermes/all">Sessions of every profile</a>' in bad.text
