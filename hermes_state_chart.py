"""The usage chart of the web page: cost (or tokens) per day, stacked by model, as an SVG drawn on the server.

Owns: `usage_chart(rows)`, from the rows of `SessionDB.usage(period="day")`: a bar per day (days
without sessions left blank), one colour per model (or per profile, `by="profile"`, for rows the
web page adds up across profiles) with a legend, a tooltip per bar. The page
needs no script, no chart library and no network to show it.
Does not own: the numbers (hermes_state_listings) or the page (hermes_state_web).

Every text in the SVG (model names come from the store) goes through markupsafe's escaping.
"""
from __future__ import annotations

from datetime import date, timedelta
from typing import Any, Callable

from markupsafe import Markup

WIDTH, HEIGHT, LEFT, BOTTOM, HEADROOM = 760, 180, 70, 24, 14
MAX_BAR = 40  # a bar's widest: a week of history is a row of bars, not one slab across the chart
PALETTE = ("#3b82f6", "#10b981", "#f59e0b", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899", "#84cc16", "#6b7280")


def _days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def _measure(rows: list[dict[str, Any]]) -> tuple[Callable[[dict[str, Any]], float], Callable[[float], str], str]:
    # What a bar's height stands for: the cost when any session is priced, else tokens in and out.
    if any(r["cost_usd"] for r in rows):
        return (lambda r: float(r["cost_usd"] or 0)), (lambda v: f"${v:,.4f}"), "Cost"
    return (lambda r: float(r["input_tokens"] + r["output_tokens"])), (lambda v: f"{v:,.0f} tokens"), "Tokens"


def _frame(top: str, what: str, by: str) -> list[Markup]:
    plot_h = HEIGHT - BOTTOM
    return [Markup('<svg class="hs-chart" xmlns="http://www.w3.org/2000/svg" role="img" width="%d" height="%d" '
                   'viewBox="0 0 %d %d"><title>%s per day, by %s</title>') % (WIDTH, HEIGHT, WIDTH, HEIGHT, what, by),
            Markup('<text x="%d" y="12" text-anchor="end" class="hs-axis">%s</text>') % (LEFT - 6, top),
            Markup('<text x="%d" y="%d" text-anchor="end" class="hs-axis">0</text>') % (LEFT - 6, plot_h),
            Markup('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>') % (LEFT, plot_h, WIDTH, plot_h)]


def _stack(x: float, bar: float, day: str, rows: list[dict[str, Any]], scale: float, colour: dict[Any, str],
           amount: Callable[[dict[str, Any]], float], unit: Callable[[float], str], by: str) -> list[Markup]:
    # One day's bar: its models (or profiles) stacked from the axis up, in the legend's order.
    y, out = float(HEIGHT - BOTTOM), []
    for r in (r for r in rows if amount(r)):
        height = amount(r) * scale
        y -= height
        out.append(Markup('<rect class="hs-bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" '
                          'data-day="%s" data-%s="%s"><title>%s · %s: %s, %s sessions</title></rect>')
                   % (x, y, bar, height, colour[r[by]], day, by, r[by] or "", day, r[by] or f"(no {by})",
                      unit(amount(r)), r["session_count"]))
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
    top = max(sum(amount(r) for r in day) for day in per_day.values()) or 1.0
    step = (WIDTH - LEFT) / len(days)
    bar, scale = min(max(step * 0.8, 1.0), MAX_BAR), (HEIGHT - BOTTOM - HEADROOM) / top
    parts = _frame(unit(top), what, by)
    for i, day in enumerate(days):
        parts += _stack(LEFT + i * step, bar, day, per_day[day], scale, colour, amount, unit, by)
    for i in sorted({0, len(days) - 1}):  # the first and last day under the axis
        parts.append(Markup('<text x="%.1f" y="%d" text-anchor="%s" class="hs-axis">%s</text>')
                     % (LEFT + i * step + (bar if i else 0), HEIGHT - 8, "end" if i else "start", days[i]))
    legend = Markup("").join(Markup('<li><span class="hs-swatch" style="background:%s"></span>%s</li>')
                             % (colour[m], m or f"(no {by})") for m in models)
    return Markup("").join([*parts, Markup("</svg>")]) + Markup('<ul class="hs-legend">%s</ul>') % legend
