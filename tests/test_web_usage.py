"""The web page's usage chart (an SVG drawn on the server) and messages that read like the conversation."""
from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import hermes_state_chart as chart
import hermes_state_web as web
from hermes_state import SessionDB
from conftest import WIDTHS, browse, chromium, content, digest, get, measured, serving

DAY = 86400.0
MARKDOWN = ("Run this:\n\n```sh\ndocker system prune\n```\n\n- first **bold** item\n- second\n\n"
            "See [the docs](https://docs.docker.com/) or [this](javascript:alert(1)).\n\n<img src=x onerror=alert(2)>")


@pytest.fixture
def usage_store(db) -> Path:
    now = time.time()
    for sid, model, cost, days_ago in (("a", "openai/gpt-5", 0.30, 2), ("b", "openai/gpt-5", 0.10, 0),
                                       ("c", "anthropic/claude-sonnet-4.6", 0.20, 0), ("d", None, None, 1)):
        db.create_session(sid, "cli" if sid != "c" else "telegram", model, input_tokens=1000, output_tokens=100,
                          estimated_cost_usd=cost)
        db.append_message(sid, "user", f"hello from {sid}")
    db.set_session_title("a", "Titled session")
    db.append_message("a", "assistant", MARKDOWN)
    db.append_message("a", "tool", "# not a heading\n**raw**", tool_call_id="t", tool_name="run")
    path = db.db_path
    db.close()
    conn = sqlite3.connect(path)
    with conn:
        for sid, days_ago in (("a", 2), ("d", 1)):
            conn.execute("UPDATE sessions SET started_at = ? WHERE id = ?", (now - days_ago * DAY, sid))
    conn.close()
    return path


def _bars(html: str) -> list[tuple[str, str, float]]:
    return [(day, model, float(height)) for height, day, model in
            re.findall(r'<rect class="hs-bar" [^>]*height="([\d.]+)" fill="#[0-9a-f]+" data-day="([^"]+)" '
                       r'data-model="([^"]*)"', html)]


def test_the_sessions_page_draws_usage_per_day_stacked_by_model(usage_store):
    html = content(get(usage_store, "/-/hermes/state")[0])
    bars = _bars(html)
    today = datetime.now().strftime("%Y-%m-%d")
    two_ago = (datetime.now() - timedelta(days=2)).strftime("%Y-%m-%d")
    assert {(d, m) for d, m, _ in bars} == {(two_ago, "openai/gpt-5"), (today, "openai/gpt-5"),
                                            (today, "anthropic/claude-sonnet-4.6")}  # "d" has no cost: no bar
    height = {(d, m): h for d, m, h in bars}
    assert height[(two_ago, "openai/gpt-5")] == pytest.approx(3 * height[(today, "openai/gpt-5")], abs=0.3)  # 0.30 and 0.10
    assert height[(today, "anthropic/claude-sonnet-4.6")] == pytest.approx(2 * height[(today, "openai/gpt-5")], abs=0.3)
    assert html.count("<svg") == 1 and "<script" not in html.split("<svg", 1)[1].split("</svg>")[0]
    assert "anthropic/claude-sonnet-4.6" in re.search(r'<ul class="hs-legend">(.*?)</ul>', html, re.S).group(1)


def test_the_chart_takes_the_session_lists_filters(usage_store):
    telegram, cli = (content(r) for r in get(usage_store, "/-/hermes/state?source=telegram",
                                               "/-/hermes/state?source=cli&model=openai/gpt-5"))
    assert {m for _, m, _ in _bars(telegram)} == {"anthropic/claude-sonnet-4.6"}
    assert {m for _, m, _ in _bars(cli)} == {"openai/gpt-5"}
    nothing = content(get(usage_store, "/-/hermes/state?source=cron")[0])
    assert "<svg" not in nothing
    data = get(usage_store, "/-/hermes/state.json?source=telegram")[0].json()
    assert [(r["model"], r["cost_usd"]) for r in data["usage_per_day"]] == [("anthropic/claude-sonnet-4.6", 0.2)]


def test_a_chart_of_tokens_when_nothing_is_priced():
    rows = [{"period": "2026-11-01", "model": "m", "session_count": 1, "input_tokens": 10, "output_tokens": 5,
             "cost_usd": None}, {"period": "2026-11-03", "model": "<b>x</b>", "session_count": 2,
                                 "input_tokens": 30, "output_tokens": 0, "cost_usd": None}]
    svg = str(chart.usage_chart(rows))
    assert "Tokens per day" in svg and "30 tokens" in svg and "&lt;b&gt;x&lt;/b&gt;" in svg and "<b>" not in svg
    assert [d for d, _, _ in _bars(svg)] == ["2026-11-01", "2026-11-03"]
    assert svg.count('class="hs-bar"') == 2  # three days wide, the empty day without a bar
    assert re.search(r'class="hs-day" [^>]*data-day="2026-11-02"><title>2026-11-02: no sessions</title>', svg)
    widths = [float(w) for w in re.findall(r'class="hs-bar" [^>]*width="([\d.]+)%"', svg)]
    # a few days are a row of bars at the left, not slabs across the chart
    assert widths == [pytest.approx(100 / chart.MIN_SLOTS * chart.BAR_FILL, abs=0.01)] * 2
    assert str(chart.usage_chart([])) == ""


def test_messages_render_markdown_with_html_escaped(usage_store):
    html = content(get(usage_store, "/-/hermes/state/session/a")[0])
    assert '<pre><code class="language-sh">docker system prune' in html
    assert "<li>first <strong>bold</strong> item</li>" in html
    assert '<a href="https://docs.docker.com/">the docs</a>' in html
    assert 'href="javascript' not in html and "<img src=x" not in html and "&lt;img src=x onerror" in html
    assert "<pre># not a heading\n**raw**</pre>" in html  # tool output stays as it is


def test_ids_do_not_wrap_untitled_sessions_look_untitled_and_messages_link_to_themselves(usage_store):
    listing, page = (content(r) for r in get(usage_store, "/-/hermes/state", "/-/hermes/state/session/b"))
    assert "white-space: nowrap" in web.STYLE and "break-all" not in web.STYLE
    assert '<span class="hs-untitled-mark">(untitled)</span> <a href="/-/hermes/state/session/b" ' \
           'class="hs-untitled">hello from b</a>' in listing
    assert '>Titled session</a>' in listing and 'class="hs-untitled">Titled' not in listing
    assert '<h1><span class="hs-untitled">(untitled)</span> <span class="hs-id">b</span></h1>' in page
    anchors = re.findall(r'<div class="hs-msg user" id="m(\d+)">.*?<a class="hs-anchor" href="#m(\d+)"', page, re.S)
    assert anchors and all(a == b for a, b in anchors)


@pytest.mark.slow
def test_the_chart_and_markdown_in_headless_chromium(usage_store, tmp_path):
    browser = chromium()
    with SessionDB(usage_store) as db:  # six weeks of history: the dates under the axis are spaced
        db.create_session("old", "cli", "openai/gpt-5", estimated_cost_usd=0.05)
    with sqlite3.connect(usage_store) as conn:
        conn.execute("UPDATE sessions SET started_at = ? WHERE id = 'old'", (time.time() - 45 * DAY,))
    conn.close()
    before = digest(usage_store)
    with serving(usage_store, tmp_path / "serve.log") as port:
        base, profile = f"http://127.0.0.1:{port}/-/hermes/state", tmp_path / "chromium-profile"
        for width in WIDTHS:
            m = measured(browser, profile, port, "/-/hermes/state", width)
            assert m["scrollWidth"] <= m["clientWidth"], (width, m)
            page, svg = m["content"], m["chart"]
            assert svg["width"] >= page["width"] - 100 and svg["right"] <= page["right"] + 1, (width, m)  # the page's width
            values = [label for label, _ in m["ticks"]]
            assert values[:3] == ["$0.00", "$0.10", "$0.20"] and len(values) >= 4 and m["grid"] == len(values), values
            assert all(box["left"] >= page["left"] for _, box in m["ticks"] + m["dates"]), m  # none cut off
            dates = [box for _, box in m["dates"]]
            assert len(dates) >= 5 and all(a["right"] + 8 <= b["left"] for a, b in zip(dates, dates[1:])), m["dates"]
        dom = browse(browser, profile, base, "--dump-dom")
        assert len(_bars(dom)) == 4 and '<svg class="hs-chart"' in dom
        dom = browse(browser, profile, f"{base}/session/a", "--dump-dom")
        assert "<strong>bold</strong>" in dom and 'href="javascript' not in dom
        assert re.search(r"<img[^>]*onerror", dom) is None
        shot = tmp_path / "usage.png"
        browse(browser, profile, base, f"--screenshot={shot}", "--window-size=1100,700", "--hide-scrollbars")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert digest(usage_store) == before


def test_the_chart_has_round_ticks_gridlines_dates_and_a_tooltip_for_every_day():
    rows = [{"period": f"2026-10-{day:02d}", "model": "m", "session_count": 1 if day != 20 else 3, "input_tokens": 0,
             "output_tokens": 0, "cost_usd": cost} for day, cost in ((1, 0.12), (20, 0.37), (31, 0.05))]
    svg = str(chart.usage_chart(rows))
    ticks = re.findall(r'class="hs-axis hs-ytick"[^>]*>([^<]+)</text>', svg)
    assert ticks == ["$0.00", "$0.10", "$0.20", "$0.30", "$0.40"]  # round steps up past the highest day
    assert svg.count('class="hs-grid"') == len(ticks) and 'x2="100%"' in svg  # a gridline per tick, the whole width
    # 31 days: a date every 7, from the first day
    assert re.findall(r'class="hs-axis hs-xdate"[^>]*>([^<]+)</text>', svg) == ["Oct 1", "Oct 8", "Oct 15",
                                                                               "Oct 22", "Oct 29"]
    days = re.findall(r'<rect class="hs-day" [^>]*data-day="([^"]+)"><title>([^<]+)</title>', svg)
    assert len(days) == 31 and ("2026-10-02", "2026-10-02: no sessions") in days
    assert ("2026-10-20", "2026-10-20: $0.3700 in all, 3 sessions") in days
    assert "2026-10-01 · m: $0.1200, 1 session</title>" in svg and "1 sessions" not in svg
    assert 'width="100%"' in svg and "viewBox" not in svg  # takes the page's width; its text keeps its size
    heights = {d: float(h) for h, d in re.findall(r'class="hs-bar" [^>]*height="([\d.]+)" [^>]*data-day="([^"]+)"',
                                                   svg)}
    assert heights["2026-10-20"] == pytest.approx(chart.PLOT_HEIGHT * 0.37 / 0.40, abs=0.1)  # read against the ticks


@pytest.mark.parametrize("top, ticks", [(0.37, [0, 0.1, 0.2, 0.3, 0.4]), (1.0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
                                        (1234567, [0, 250000, 500000, 750000, 1000000, 1250000]),
                                        (0.0123, [0, 0.0025, 0.005, 0.0075, 0.01, 0.0125])])
def test_nice_ticks(top, ticks):
    assert chart.nice_ticks(top) == pytest.approx(ticks)
