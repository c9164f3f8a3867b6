"""Terminal rendering for the command line: safe text, aligned tables, times, highlights, progress.

Owns: making untrusted stored text safe to print (control characters escaped, so a message
can neither break a table nor drive the terminal), display width (wide CJK characters count
two columns, combining marks none), tables that fit the terminal (truncated with `…`, numbers
right-aligned), relative times, match highlighting, machine formats (JSON, JSON Lines, CSV, TSV)
and progress lines on stderr.
Does not own: what a command shows (hermes_state_cli) or any database access.
Imports nothing of ours; runs no SQL.
"""
from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
import unicodedata
from datetime import datetime, timedelta
from typing import Any, Iterable, TextIO

ELLIPSIS = "…"
# C0 and C1 controls, DEL, and the bidirectional overrides that can reorder what a terminal shows.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_BOLD_ON, _BOLD_OFF = "\x1b[1;33m", "\x1b[0m"
# Colours of the terminal output: matches, table headers, and each role where a message is shown.
STYLES = {"header": "\x1b[1m", "user": "\x1b[34m", "assistant": "\x1b[32m", "tool": "\x1b[35m",
          "system": "\x1b[2m", "developer": "\x1b[2m", "id": "\x1b[36m"}


def paint(text: str, style: str, color: bool) -> str:
    """Return `text` in the colour of `style` when `color`, else as it is."""
    code = STYLES.get(style)
    return f"{code}{text}{_BOLD_OFF}" if color and code and text else text
_ASCII_ONLY = False


def content_text(content: Any) -> str:
    """Return a message's content as text: a multimodal list shows its text parts and a [type] mark per other part."""
    if isinstance(content, list):
        return " ".join(p["text"] if isinstance(p.get("text"), str) else f"[{p.get('type', 'part')}]"
                        for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def safe(text: Any, *, keep_newlines: bool = False) -> str:
    """Return `text` printable as is: control characters become visible escapes (`\\n`, `\\x1b`)."""
    if text is None:
        return ""
    text = str(text)

    def escape(match: re.Match[str]) -> str:
        ch = match.group()
        if keep_newlines and ch in "\n\t":
            return ch
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x100
                                                           else f"\\u{ord(ch):04x}")
    text = _CONTROL.sub(escape, text)
    # Escaped here rather than by the stream, so a table measures the text it really prints.
    return text.encode("ascii", "backslashreplace").decode("ascii") if _ASCII_ONLY else text


def char_width(ch: str) -> int:
    """Return the terminal columns one character takes: 2 for wide CJK, 0 for combining marks."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def width(text: str) -> int:
    """Return the display width of `text` in terminal columns."""
    if text.isascii():
        return len(text)
    return sum(char_width(ch) for ch in text)


def use_ascii(ascii_only: bool) -> None:
    """Write for an output that takes ASCII only (LC_ALL=POSIX): `safe` escapes the rest, cuts end "..."."""
    global ELLIPSIS, _ASCII_ONLY
    ELLIPSIS, _ASCII_ONLY = ("...", True) if ascii_only else ("…", False)


def truncate(text: str, columns: int | None) -> str:
    """Return `text` cut to at most `columns` display columns, ending with `…` when cut (None: never cut)."""
    if columns is None or width(text) <= columns:
        return text
    out, used = [], 0
    for ch in text:
        w = char_width(ch)
        if used + w > columns - width(ELLIPSIS):
            break
        out.append(ch)
        used += w
    return "".join(out) + ELLIPSIS


def _pad(text: str, columns: int, right: bool) -> str:
    gap = " " * max(columns - width(text), 0)
    return gap + text if right else text + gap


def table(rows: list[dict[str, Any]], columns: list[str], *, numeric: Iterable[str] = (),
          max_width: int | None = 80, headers: dict[str, str] | None = None, keep: Iterable[str] = (),
          color: bool = False, optional: Iterable[str] = (), show_headers: bool = True) -> str:
    """Return an aligned table of `rows` that fits `max_width` columns; the widest columns are cut first.

    Columns in `keep` (ids, keys: text someone copies into the next command) and numbers are never
    cut; `max_width=None` cuts nothing at all. Columns in `optional`, the least wanted first, are
    left out one by one while the others would be cut below READABLE columns. A table whose kept
    columns alone are wider than `max_width` runs past it rather than cutting them.
    """
    numeric, kept = set(numeric), set(keep) | set(numeric)
    titles = [(headers or {}).get(c, c) for c in columns]
    cells = [[safe(r.get(c)) for c in columns] for r in rows]
    widths = [max([width(t) if show_headers else 0] + [width(row[i]) for row in cells]) for i, t in enumerate(titles)]
    shown = list(range(len(columns)))
    if max_width is not None:
        for name in [c for c in optional if c in columns]:
            fitted = _fitted(widths, shown, columns, kept, max_width)
            if all(fitted[i] >= min(widths[i], READABLE) for i in shown if columns[i] not in optional):
                break
            shown.remove(columns.index(name))
        widths = _fitted(widths, shown, columns, kept, max_width)
    lines = ["  ".join(_pad(truncate(line[i], widths[i]), widths[i], columns[i] in numeric) for i in shown).rstrip()
             for line in ([titles] if show_headers else []) + cells]
    if not show_headers:
        return "\n".join(lines)
    return "\n".join([paint(lines[0], "header", color), *lines[1:]])


READABLE = 20  # the display columns a cut title keeps before a table leaves out its optional columns


def _fitted(widths: list[int], shown: list[int], columns: list[str], kept: set[str], max_width: int) -> list[int]:
    # The widths once the shown columns are fitted into `max_width` (a left-out column's is left as it is).
    part = [widths[i] for i in shown]
    _fit(part, [k for k, i in enumerate(shown) if columns[i] not in kept], max_width - 2 * (len(shown) - 1))
    fitted = list(widths)
    for k, i in enumerate(shown):
        fitted[i] = part[k]
    return fitted


def _fit(widths: list[int], cuttable: list[int], budget: int) -> None:
    # Narrow the widest cuttable column by one until the row fits, none is wider than 4, or none may be cut.
    while sum(widths) > budget and cuttable and max(widths[i] for i in cuttable) > 4:
        widths[max(cuttable, key=lambda i: widths[i])] -= 1


def relative_time(ts: float | None, now: float | None = None) -> str:
    """Return `ts` for people: "3 min ago", "yesterday", or a date for anything older than a week."""
    if not ts:
        return "-"
    delta = (time.time() if now is None else now) - ts
    if delta < 0:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))
    for limit, unit, size in ((60, "s", 1), (3600, "min", 60), (86400, "h", 3600)):
        if delta < limit:
            return f"{int(delta // size)} {unit} ago"
    if delta < 2 * 86400:
        return "yesterday"
    if delta < 7 * 86400:
        return f"{int(delta // 86400)} days ago"
    return time.strftime("%Y-%m-%d", time.localtime(ts))


_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "mo": 30 * 86400, "y": 365 * 86400}


def parse_age_days(text: str) -> float:
    """Return an age in days from "7d", "12h", "30m", "2w", "3mo", "1y" or a bare number of days; ValueError otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(mo|[smhdwy])?", text.strip().lower())
    if not match:
        raise ValueError(f"not an age: {text!r} (use 7d, 12h, 2w, 3mo, 1y or a number of days)")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "d"] / 86400


_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*(mo|[smhdwy])")


def parse_when(text: str, now: float | None = None) -> float:
    """Return epoch seconds for an age ago (7d, 12h, 3mo, 1y), today or yesterday (local midnight), an ISO date or epoch seconds."""
    now = time.time() if now is None else now
    word = text.strip().lower()
    if word in ("today", "yesterday"):
        midnight = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
        return (midnight - timedelta(days=1 if word == "yesterday" else 0)).timestamp()
    match = _AGO.fullmatch(word)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds == seconds and abs(seconds) != float("inf"):  # NaN and infinities are not times
            return seconds
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 7d, 12h, 3mo, 1y, today, yesterday, 2026-11-30 or "
                         "epoch seconds)") from None


def clock_time(ts: float | None) -> str:
    """Return `ts` as a local date and time, or "-"."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def session_label(title: str | None, preview: str | None = None) -> str:
    """Return how a session is named to people: its title, else "(untitled)" and its first user message."""
    if title:
        return title
    return f"(untitled) {preview}" if preview else "(untitled)"


def plain(value: Any, indent: str = "  ") -> list[str]:
    """Return a report (dicts, lists, scalars) as indented "key: value" lines, never Python reprs."""
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict) and item or _nested_list(item):
                lines += [f"{indent}{safe(key)}:"] + plain(item, indent + "  ")
            else:
                lines.append(f"{indent}{safe(key)}: {_scalar(item)}")
        return lines
    if _nested_list(value):
        lines = []
        for item in value:
            inner = plain(item, indent + "  ")
            lines += [f"{indent}- {inner[0].strip()}"] + inner[1:] if inner else [f"{indent}-"]
        return lines
    return [f"{indent}{_scalar(value)}"]


def _nested_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value)


def _scalar(value: Any) -> str:
    # Flat lists read as "a, b, c"; an empty one as "none"; booleans as yes/no.
    if isinstance(value, (list, tuple)):
        return ", ".join(_scalar(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    return safe(value)


def highlight(snippet: str, *, color: bool) -> str:
    """Return a search snippet made safe, its `>>>match<<<` markers turned bold on a terminal."""
    text = safe(snippet)
    if not color:
        return text
    return text.replace(">>>", _BOLD_ON).replace("<<<", _BOLD_OFF)


def unmarked(snippet: str) -> tuple[str, list[list[int]]]:
    """Return a snippet without its `>>>`/`<<<` markers, and the [start, end) offsets of each match in that text."""
    text, matches, at = [], [], 0
    for i, piece in enumerate(re.split(">>>|<<<", snippet)):
        if i % 2 and piece:
            matches.append([at, at + len(piece)])
        text.append(piece)
        at += len(piece)
    return "".join(text), matches


TIME_KEYS = frozenset({"timestamp", "last_active", "session_started", "first_seen", "last_seen"})


def iso_times(value: Any) -> Any:
    """Return `value` with every epoch time (keys ending in `_at` or `_until`, `timestamp`, ...) as ISO 8601 with its offset."""
    if isinstance(value, dict):
        return {k: (iso_time(v) if (k in TIME_KEYS or k.endswith(("_at", "_until"))) and isinstance(v, (int, float))
                    and not isinstance(v, bool) else iso_times(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [iso_times(v) for v in value]
    return value


def iso_time(ts: float) -> str:
    """Return epoch seconds as local ISO 8601 with the UTC offset (2026-12-01T10:01:56.250000+01:00)."""
    try:
        return datetime.fromtimestamp(ts).astimezone().isoformat()
    except (OverflowError, OSError, ValueError):  # far outside what the platform's clock can show
        return str(ts)


def money(value: Any) -> str:
    """Return a cost rounded for people ("$0.0042"), or "" when unknown."""
    if value is None:
        return ""
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def plural(count: int, noun: str) -> str:
    """Return a count with its noun as said: "1 message", "2 messages", "1,000 messages"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def number(value: Any) -> str:
    """Return an integer with thousands separators, or "" when unknown."""
    return "" if value is None else f"{value:,}"


# --- machine formats ----------------------------------------------------------------------------

def as_json(data: Any) -> str:
    """Return `data` as indented JSON (non-ASCII kept)."""
    return json.dumps(data, ensure_ascii=False, indent=2, default=str)


def as_json_lines(rows: Iterable[Any]) -> Iterable[str]:
    """Yield one compact JSON document per row."""
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, default=str)


def as_csv(rows: list[dict[str, Any]], columns: list[str] | None = None, *, delimiter: str = ",",
           headers: bool = True) -> str:
    """Return `rows` as CSV (TSV with `delimiter="\\t"`), with a header line unless not `headers`; nested values as JSON."""
    columns = columns or (list(rows[0]) if rows else [])
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    if headers:
        writer.writerow(columns)
    for row in rows:
        writer.writerow([json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
                         for v in (row.get(c) for c in columns)])
    return out.getvalue().rstrip("\n")


# --- progress ----------------------------------------------------------------------------------

class Progress:
    """Progress of long work on stderr, redrawn in place, with the total and the rate; silent when stderr is not a terminal.

    `unit="bytes"` shows amounts in MB; another unit ("rows") follows the total and the rate.
    """

    def __init__(self, label: str, stream: TextIO | None = None, unit: str = "", started: float | None = None):
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.unit = unit
        self._last = 0.0
        self.started = time.monotonic() if started is None else started  # the rate counts from here

    def _amount(self, value: float, unit: bool = True) -> str:
        if self.unit == "bytes":
            return f"{value / 1e6:,.1f} MB"
        return f"{value:,.0f}" + (f" {self.unit}" if unit and self.unit else "")

    def update(self, done: int, total: int | None = None) -> None:
        """Show `done` (of `total`) and the rate so far, at most ten times a second."""
        if not self.enabled or time.monotonic() - self._last < 0.1:
            return
        self._last = time.monotonic()
        share = f" ({100 * done / total:.0f}%)" if total else ""
        of = f" of {self._amount(total)}" if total else ""
        elapsed = self._last - self.started
        rate = f", {self._amount(done / elapsed)}/s" if elapsed > 0.5 and done else ""
        self.stream.write(f"\r{self.label}: {self._amount(done, unit=not total)}{of}{share}{rate}\x1b[K")
        self.stream.flush()

    def done(self, message: str = "") -> None:
        """End the progress line (with a last message)."""
        if self.enabled:
            took = time.monotonic() - self.started
            self.stream.write(f"\r{self.label}: {message or 'done'} in {took:.1f} s\x1b[K\n")
            self.stream.flush()
