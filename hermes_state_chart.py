"""The usage chart of the web page: cost (or tokens) per day, stacked by model, as an SVG drawn on the server.

Owns: `usage_chart(rows)`, from the rows of `SessionDB.usage(period="day")`: a bar per day, one
colour per model (or per profile, `by="profile"`, for rows the web page adds up across profiles)
with a legend, a value axis with round ticks and gridlines, dates under the axis, and a tooltip
per bar and per day (a day without sessions says so). The SVG takes the width of the page: its
horizontal positions are percentages, so its text keeps its size at any width. The page needs
no script, no chart library and no network to show it.
Does not own: the numbers (hermes_state_listings) or the page (hermes_state_web).

Every text in the SVG (model names come from the store) goes through markupsafe's escaping.
"""
from __future__ import annotations

import math
from datetime import date, timedelta
from typing import Any, Callable

from markupsafe import Markup

PLOT_TOP, PLOT_HEIGHT, HEIGHT = 10, 170, 204  # px: the bars' area, and the whole SVG with the dates under it
LEFT = 72  # px left of the plot for the value labels (the box's padding; the SVG draws into it)
MIN_SLOTS = 30  # a short history is a row of bars at the left, not a few slabs across the page
BAR_FILL = 0.7  # of a day's slot
MAX_DATE_LABELS = 10  # dates under the axis, at most: each is readable at 900 px
PALETTE = ("#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899", "#84cc16", "#6b7280")
# Days between two dated ticks, the smallest that keeps the dates at most MAX_DATE_LABELS.
DATE_STEPS = (1, 2, 3, 7, 14, 28, 56, 91, 182, 364)


def _days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def _cost(v: float, decimals: int = 4) -> str:
    return f"${v:,.{decimals}f}"


def _tokens(v: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= size:
            return f"{v / size:,.2f}".rstrip("0").rstrip(".") + suffix
    return f"{v:,.0f}"


def _measure(rows: list[dict[str, Any]]) -> tuple[Callable[[dict[str, Any]], float], Callable[[float], str], str]:
    # What a bar's height stands for: the cost when any session is priced, else tokens in and out.
    if any(r["cost_usd"] for r in rows):
        return (lambda r: float(r["cost_usd"] or 0)), _cost, "Cost"
    return (lambda r: float(r["input_tokens"] + r["output_tokens"])), (lambda v: f"{v:,.0f} tokens"), "Tokens"


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """Return round values from 0 up to at least `top` (steps of 1, 2, 2.5 or 5 times a power of ten), at most `most` + 1."""
    if top <= 0:
        return [0.0, 1.0]
    rough = top / most
    power = 10.0 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def _tick_label(value: float, step: float, what: str) -> str:
    if what == "Tokens":
        return _tokens(value)
    # As many decimals as the step needs, at least the cents.
    decimals = max(2, -math.floor(math.log10(step)) + (1 if round(step / 10.0 ** math.floor(math.log10(step)), 6)
                                                      == 2.5 else 0))
    return _cost(value, decimals)


def _sessions(n: int) -> str:
    return f"{n:,} session" if n == 1 else f"{n:,} sessions"


def _short_day(day: str) -> str:
    d = date.fromisoformat(day)
    return f"{d:%b} {d.day}"


def _axes(ticks: list[float], what: str, by: str, first: str, last: str) -> list[Markup]:
    bottom = PLOT_TOP + PLOT_HEIGHT
    out = [Markup('<svg class="hs-chart" xmlns="http://www.w3.org/2000/svg" role="img" width="100%%" height="%d" '
                  'style="overflow: visible"><title>%s per day, by %s, %s to %s</title>')
           % (HEIGHT, what, by, first, last)]
    for value in ticks:
        y = bottom - PLOT_HEIGHT * value / ticks[-1]
        out.append(Markup('<line class="hs-grid" x1="0" x2="100%%" y1="%.1f" y2="%.1f" stroke="%s"/>')
                   % (y, y, "#999" if value == 0 else "#e5e7eb"))
        out.append(Markup('<text class="hs-axis hs-ytick" x="-6" y="%.1f" text-anchor="end" '
                          'dominant-baseline="middle">%s</text>') % (y, _tick_label(value, ticks[1], what)))
    return out


def _stack(x: float, bar: float, day: str, rows: list[dict[str, Any]], scale: float, colour: dict[Any, str],
           amount: Callable[[dict[str, Any]], float], unit: Callable[[float], str], by: str) -> list[Markup]:
    # One day's bar: its models (or profiles) stacked from the axis up, in the legend's order.
    y, out = float(PLOT_TOP + PLOT_HEIGHT), []
    for r in (r for r in rows if amount(r)):
        height = amount(r) * scale
        y -= height
        out.append(Markup('<rect class="hs-bar" x="%.3f%%" y="%.1f" width="%.3f%%" height="%.1f" fill="%s" '
                          'data-day="%s" data-%s="%s"><title>%s · %s: %s, %s</title></rect>')
                   % (x, y, bar, height, colour[r[by]], day, by, r[by] or "", day, r[by] or f"(no {by})",
                      unit(amount(r)), _sessions(r["session_count"])))
    return out


def _day(x: float, slot: float, day: str, rows: list[dict[str, Any]], amount: Callable[[dict[str, Any]], float],
         unit: Callable[[float], str]) -> Markup:
    # The whole height of a day's slot answers a hover, so a day without sessions says so too.
    count = sum(r["session_count"] or 0 for r in rows)
    said = f"{unit(sum(amount(r) for r in rows))} in all, {_sessions(count)}" if count else "no sessions"
    return (Markup('<rect class="hs-day" x="%.3f%%" y="%d" width="%.3f%%" height="%d" fill="transparent" '
                   'data-day="%s"><title>%s: %s</title></rect>') % (x, PLOT_TOP, slot, PLOT_HEIGHT, day, day, said))


def _dates(days: list[str], slot: float) -> list[Markup]:
    # A tick and a date every few days (every day when they fit), counted from the first day.
    slots = max(len(days), MIN_SLOTS)
    every = next((s for s in DATE_STEPS if math.ceil(slots / s) <= MAX_DATE_LABELS), DATE_STEPS[-1])
    bottom, out = PLOT_TOP + PLOT_HEIGHT, []
    for i in range(0, len(days), every):
        centre = (i + 0.5) * slot
        out.append(Markup('<line class="hs-xtick" x1="%.3f%%" x2="%.3f%%" y1="%d" y2="%d" stroke="#999"/>')
                   % (centre, centre, bottom, bottom + 4))
        out.append(Markup('<text class="hs-axis hs-xdate" x="%.3f%%" y="%d" text-anchor="middle" data-day="%s">%s</text>')
                   % (centre, bottom + 17, days[i], _short_day(days[i])))
    return out


def _models(rows: list[dict[str, Any]], amount: Callable[[dict[str, Any]], float], by: str) -> list[Any]:
    # The legend's order: the largest total first, a session without a model last.
    totals: dict[Any, float] = {}
    for r in rows:
        totals[r[by]] = totals.get(r[by], 0.0) + amount(r)
    return sorted(totals, key=lambda m: (-totals[m], m is None, m or ""))


def usage_chart(rows: list[dict[str, Any]], by: str = "model") -> Markup:
    """Draw usage per day as stacked bars, one colour per `by` (model or profile), in SVG; '' for no rows.

    A bar's height is the cost when any row is priced, else tokens in and out.
    """
    if by not in ("model", "profile"):
        raise ValueError(f"by must be model or profile, not {by!r}")
    if not rows:
        return Markup("")
    amount, unit, what = _measure(rows)
    models = _models(rows, amount, by)
    colour = {m: PALETTE[min(i, len(PALETTE) - 1)] for i, m in enumerate(models)}
    days = _days(rows[0]["period"], rows[-1]["period"])
    per_day: dict[str, list[dict[str, Any]]] = {d: [] for d in days}
    for r in sorted(rows, key=lambda r: models.index(r[by])):
        per_day[r["period"]].append(r)
    ticks = nice_ticks(max(sum(amount(r) for r in day) for day in per_day.values()))
    slot = 100.0 / max(len(days), MIN_SLOTS)  # percent of the plot's width
    bar, scale = slot * BAR_FILL, PLOT_HEIGHT / ticks[-1]
    parts = _axes(ticks, what, by, days[0], days[-1])
    for i, day in enumerate(days):
        parts.append(_day(i * slot, slot, day, per_day[day], amount, unit))
        parts += _stack(i * slot + (slot - bar) / 2, bar, day, per_day[day], scale, colour, amount, unit, by)
    parts += _dates(days, slot)
    legend = Markup("").join(Markup('<li><span class="hs-swatch" style="background:%s"></span>%s</li>')
                             % (colour[m], m or f"(no {by})") for m in models)
    return (Markup('<div class="hs-chart-box" style="padding-left: %dpx">') % LEFT
            + Markup("").join([*parts, Markup("</svg></div>")]) + Markup('<ul class="hs-legend">%s</ul>') % legend)
