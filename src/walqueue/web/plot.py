"""The overview's plot, drawn on the server as SVG text: puts, acks (and expiries where counted)
per second over the last hour. Pure: the rates and the time of drawing in, text out; only
numbers and fixed labels reach the text, so nothing in it needs escaping.
"""

from __future__ import annotations

import math

from .samples import HISTORY_SECONDS, Rate

WIDTH = 720
HEIGHT = 200
LEFT = 56     # room for the y labels
BOTTOM = 24   # room for the x labels
TOP = 12
RIGHT = 12
SERIES = (("puts", "#1f6fb2", "puts/s"), ("acks", "#2e8b57", "acks/s"), ("expiries", "#c0392b", "expiries/s"))


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is >= value (1 for 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return 10.0 * power


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.3g}"


def svg(rates: list[Rate], now: float) -> str:
    """The plot of `rates` over the hour before `now`."""
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - TOP - BOTTOM
    start = now - HISTORY_SECONDS
    shown = [rate for rate in rates if rate.at >= start]
    series = [(name, colour, label) for name, colour, label in SERIES
              if name != "expiries" or any(rate.expiries is not None for rate in shown)]
    top = nice_ceiling(max((getattr(rate, name) or 0.0 for rate in shown for name, _, _ in series),
                           default=0.0))

    def x(at: float) -> float:
        return LEFT + (at - start) / HISTORY_SECONDS * plot_width

    def y(value: float) -> float:
        return TOP + plot_height - value / top * plot_height

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="'
             f'{", ".join(label for _, _, label in series)}, last hour" font-family="sans-serif" '
             f'font-size="11">',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" '
             f'fill="#fafafa" stroke="#ccc"/>']
    for fraction in (0.0, 0.5, 1.0):
        value = top * fraction
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_width}" y1="{y(value):.1f}" '
                     f'y2="{y(value):.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f'{_number(value)}/s</text>')
    for minutes in (60, 45, 30, 15, 0):
        at = now - minutes * 60
        label = "now" if minutes == 0 else f"-{minutes} min"
        parts.append(f'<text x="{x(at):.1f}" y="{HEIGHT - 6}" text-anchor="middle">{label}</text>')
    for name, colour, _ in series:
        points = " ".join(f"{x(rate.at):.1f},{y(getattr(rate, name) or 0.0):.1f}" for rate in shown)
        if points:
            parts.append(f'<polyline class="series-{name}" fill="none" stroke="{colour}" '
                         f'stroke-width="1.5" points="{points}"/>')
    for index, (_, colour, label) in enumerate(series):
        left = LEFT + 8 + index * 90
        parts.append(f'<rect x="{left}" y="{TOP + 6}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{left + 14}" y="{TOP + 15}">{label}</text>')
    if not shown:
        parts.append(f'<text x="{LEFT + plot_width / 2}" y="{TOP + plot_height / 2}" '
                     f'text-anchor="middle" fill="#888">no samples yet: one every 10 s</text>')
    parts.append("</svg>")
    return "".join(parts)
