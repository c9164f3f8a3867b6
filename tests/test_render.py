"""hermes_state_render: text made safe for a terminal, display widths, tables, times and machine formats."""
from __future__ import annotations

import csv
import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import hermes_state_render as render


@pytest.fixture(autouse=True)
def _unicode_output():
    render.use_ascii(False)
    yield
    render.use_ascii(False)


def test_safe_escapes_controls_and_bidi_overrides():
    assert render.safe("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\nc\\u202ed"
    assert render.safe("line\n\ttab", keep_newlines=True) == "line\n\ttab"
    assert render.safe(None) == "" and render.safe(42) == "42"
    render.use_ascii(True)
    assert render.safe("東京") == "\\u6771\\u4eac"


def test_width_counts_terminal_columns():
    assert render.width("abc") == 3
    assert render.width("東京") == 4
    assert render.width("e\u0301") == 1  # a combining accent takes no column


@given(st.text(alphabet="ab東京\u0301", max_size=20), st.integers(1, 12))
def test_truncate_never_exceeds_the_columns_and_marks_a_cut(text, columns):
    cut = render.truncate(text, columns)
    assert render.width(cut) <= max(columns, render.width(render.ELLIPSIS))
    assert cut == text or cut.endswith(render.ELLIPSIS)
    assert render.truncate(text, None) == text


def test_table_aligns_numbers_right_and_cuts_the_widest_column_but_never_a_kept_one():
    rows = [{"id": "session-with-a-long-id", "title": "a title that is much too long to fit", "n": 5},
            {"id": "s2", "title": "short", "n": 12345}]
    out = render.table(rows, ["id", "title", "n"], numeric={"n"}, max_width=40, keep={"id"})
    lines = out.splitlines()
    assert all(render.width(line) <= 40 for line in lines)
    assert "session-with-a-long-id" in lines[1] and "…" in lines[1]
    assert lines[1].endswith("    5") and lines[2].endswith("12345")
    assert render.table(rows, ["title"], max_width=None).splitlines()[1] == rows[0]["title"]


def test_times_and_ages_parse_the_forms_the_cli_accepts():
    assert render.parse_age_days("7d") == 7 and render.parse_age_days("12h") == 0.5
    assert render.parse_age_days("2w") == 14 and render.parse_age_days("3") == 3
    assert render.parse_when("1h", now=10_000.0) == 6_400.0
    assert render.parse_when("1700000000") == 1_700_000_000.0
    for bad in ("soon", "nan", "inf"):
        with pytest.raises(ValueError):
            render.parse_when(bad)
    with pytest.raises(ValueError):
        render.parse_age_days("7 years")
    assert render.relative_time(100.0, now=130.0) == "30 s ago"
    assert render.relative_time(0, now=5) == "-"
    assert render.relative_time(1_000_000.0, now=1_000_000.0 + 86400 * 1.5) == "yesterday"


def test_labels_money_and_numbers_for_people():
    assert render.session_label("Title") == "Title"
    assert render.session_label(None, "first words") == "(untitled) first words"
    assert render.money(None) == "" and render.money(0.00421) == "$0.0042" and render.money(12.5) == "$12.50"
    assert render.number(1234567) == "1,234,567" and render.number(None) == ""
    assert render.content_text([{"type": "text", "text": "hi"}, {"type": "image_url"}]) == "hi [image_url]"
    assert render.highlight(">>>hit<<<", color=False) == ">>>hit<<<"
    assert "\x1b[" in render.highlight(">>>hit<<<", color=True)


def test_plain_reads_a_report_as_lines_not_reprs():
    lines = render.plain({"ok": True, "tables": {"sessions": 3}, "lost": [], "names": ["a", "b"]})
    assert lines == ["  ok: yes", "  tables:", "    sessions: 3", "  lost: none", "  names: a, b"]


def test_machine_formats_round_trip():
    rows = [{"id": "a", "meta": {"k": [1, 2]}, "n": None}]
    assert json.loads(render.as_json(rows)) == rows
    assert [json.loads(line) for line in render.as_json_lines(rows)] == rows
    parsed = list(csv.reader(io.StringIO(render.as_csv(rows))))
    assert parsed == [["id", "meta", "n"], ["a", '{"k": [1, 2]}', ""]]


def test_progress_is_silent_off_a_terminal():
    stream = io.StringIO()
    progress = render.Progress("copying", stream)
    progress.update(5, 10)
    progress.done()
    assert stream.getvalue() == ""
