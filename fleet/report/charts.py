"""A small SVG chart library: scales with nice ticks, lines, dots and marks, drawn as inline SVG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.report.text import DOTS, esc, fmt
from fleet.states import TrialState

# The marks of trials that measured nothing, on a chart's x axis.
_MARK_COLOR: dict[str, str] = {TrialState.ERRORED: "#8a8a8a", TrialState.INVALID: "#c4c4c4"}


class Scale:
    """A linear or logarithmic map from data to pixels, with nice ticks."""

    def __init__(self, lo: float, hi: float, r0: float, r1: float, *, log: bool = False, integer: bool = False):
        self.log, self.integer = log, integer
        if log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi - lo < 1e-12:
            pad = abs(lo) * 0.05 or (0.5 if integer or log else 1.0)
            lo, hi = lo - pad, hi + pad
        self.lo, self.hi, self.r0, self.r1 = lo, hi, r0, r1

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        return self.r0 + (v - self.lo) / (self.hi - self.lo) * (self.r1 - self.r0)

    def ticks(self, count: int = 6) -> list[float]:
        if self.log:
            return _log_ticks(10**self.lo, 10**self.hi)
        step = nice_step(self.hi - self.lo, count)
        if self.integer:
            step = max(1.0, math.ceil(step))
        first = math.ceil(self.lo / step - 1e-9) * step
        ticks = []
        value = first
        while value <= self.hi + step * 1e-9:
            ticks.append(round(value, 12))
            value += step
        return ticks

    def step(self, count: int = 6) -> float:
        ticks = self.ticks(count)
        return ticks[1] - ticks[0] if len(ticks) > 1 else 1.0


def nice_step(span: float, count: int = 6) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten that cuts ``span`` into about ``count`` parts."""
    raw = max(span, 1e-12) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 2.5, 5, 10):
        if raw <= multiple * magnitude * (1 + 1e-9):
            return multiple * magnitude
    return 10 * magnitude


def nice_range(lo: float, hi: float, count: int = 6) -> tuple[float, float]:
    """``lo`` and ``hi`` widened to the nearest multiples of a nice step."""
    if hi - lo < 1e-12:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, count)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


_LOG_MULTIPLES = ((1,), (1, 3), (1, 2, 5), (1, 2, 3, 5, 7), tuple(range(1, 10)))


def log_range(lo: float, hi: float) -> tuple[float, float]:
    """``lo`` and ``hi`` (both positive) widened to the ticks around them, with at least 4 ticks in all."""
    first, last = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    for multiples in _LOG_MULTIPLES:
        candidates = [m * 10.0**e for e in range(first, last + 1) for m in multiples]
        below = max(x for x in candidates if x <= lo * (1 + 1e-9))
        above = min(x for x in candidates if x >= hi * (1 - 1e-9))
        if sum(1 for x in candidates if below <= x <= above) >= 4:
            return below, above
    return lo, hi


def _log_ticks(lo: float, hi: float) -> list[float]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for multiples in _LOG_MULTIPLES:
        ticks = [
            m * 10.0**e
            for e in range(first, last + 1)
            for m in multiples
            if lo * (1 - 1e-9) <= m * 10.0**e <= hi * (1 + 1e-9)
        ]
        if len(ticks) >= 4 or multiples == tuple(range(1, 10)):
            if len(ticks) > 10:
                ticks = [t for t in ticks if _mantissa(t) in (1, 2, 5)] or ticks
            return ticks
    return []


def _mantissa(value: float) -> int:
    return round(value / 10 ** math.floor(math.log10(value) + 1e-9))


def tick_label(value: float, step: float | None = None, log: bool = False) -> str:
    """A tick's label: as many decimals as the step needs, thousands separated."""
    if log or step is None:
        return fmt(value)
    if abs(value) < step * 1e-6:
        return "0"
    if abs(value) >= 1e9 or step < 1e-6:
        return f"{value:.3g}"
    decimals = 0
    while decimals < 8 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6 * 10**decimals:
        decimals += 1
    return f"{value:,.{decimals}f}"


@dataclass
class Line:
    """One series of a convergence chart: best-so-far steps and the measurements behind them."""

    label: str
    color: str
    steps: list[tuple[float, float]]  # (x, best so far), at each x where it improved
    end: float  # the x of the series' last finished trial; the line runs on to it
    dots: list[tuple[float, float]] = field(default_factory=list)
    width: float = 2.0
    dash: str = ""
    opacity: float = 1.0  # below 1: an envelope drawn under the other lines


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _text_width(text: str, size: float = 12) -> float:
    return len(text) * size * 0.6


def chart(
    lines: Sequence[Line],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_note: str = "",
    x_integer: bool,
    x_min: float,
    x_max: float,
    reference: tuple[str, float] | None = None,
    marks: Sequence[tuple[float, str]] = (),
    best: tuple[float, float] | None = None,
    css_class: str = "chart",
    width: int = 560,
    height: int = 330,
) -> str:
    """A line chart of best-so-far steps as inline SVG, with axes, ticks, labels and its legend on top."""
    values = [y for line in lines for _, y in line.steps + line.dots]
    if reference is not None:
        values.append(reference[1])
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    log = lo > 0 and hi / lo >= 30
    lo, hi = log_range(lo, hi) if log else nice_range(lo, hi)

    rows = _legend_rows(_legend(lines, reference, marks, best), width)
    legend_height = 20 * len(rows) + 8

    y_ticks = _y_ticks(lo, hi, log)
    margin_left = max(52.0, max((_text_width(s, 11) for _, s in y_ticks), default=0) + 34)
    top, bottom, right = 28 + legend_height, height - 46, width - 18
    height_total = height + legend_height
    bottom += legend_height
    plot = _Plot(
        Scale(x_min, x_max, margin_left, right, integer=x_integer),
        Scale(lo, hi, bottom, top, log=log),
        margin_left,
        right,
        top,
        bottom,
    )

    out = [
        f'<svg class="{esc(css_class)}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height_total}" '
        f'width="{width}" height="{height_total}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        f'<text class="chart-title" x="{width / 2:.1f}" y="18" text-anchor="middle">{esc(title)}</text>',
    ]
    out += _legend_svg(rows)
    y_title = f"{y_label}{', log scale' if log else ''}" + (f" ({y_note})" if y_note else "")
    out += _y_axis_svg(plot, y_ticks, y_title)
    out += _x_axis_svg(plot, x_label, height_total)
    if reference is not None:
        ry = plot.y(reference[1])
        out.append(
            f'<line class="baseline" x1="{margin_left:.1f}" y1="{ry:.1f}" x2="{right:.1f}" y2="{ry:.1f}" '
            'stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
    out += _marks_svg(plot, marks)
    out += _series_svg(plot, lines)
    if best is not None:
        out.append(
            f'<circle class="best" cx="{plot.x(best[0]):.1f}" cy="{plot.y(best[1]):.1f}" r="6" fill="none" '
            'stroke="#222" stroke-width="1.5"/>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _y_ticks(lo: float, hi: float, log: bool) -> list[tuple[float, str]]:
    """The y axis's ticks, each with its label."""
    probe = Scale(lo, hi, 0, 1, log=log)
    ticks = probe.ticks(6)
    step = None if log else probe.step(6)
    return [(t, tick_label(t, step, log)) for t in ticks]


# A legend item: its label, color, dash, line width, kind ("line", "tick" or "ring") and opacity.
_Item = tuple[str, str, str, float, str, float]


@dataclass(frozen=True)
class _Plot:
    """Where a chart's plot lies in its SVG: its two scales and its edges."""

    x: Scale
    y: Scale
    left: float
    right: float
    top: float
    bottom: float


def _legend(
    lines: Sequence[Line],
    reference: tuple[str, float] | None,
    marks: Sequence[tuple[float, str]],
    best: tuple[float, float] | None,
) -> list[_Item]:
    """The legend's items: the lines, the reference, each state of the marks, the best found."""
    legend: list[_Item] = [
        (_clip(line.label), line.color, line.dash, line.width, "line", line.opacity) for line in lines
    ]
    if reference is not None:
        legend.append((reference[0], "#555", "6 4", 1.5, "line", 1.0))
    states = sorted({state for _, state in marks})
    for state in states:
        legend.append((f"{state} trial", _MARK_COLOR.get(state, "#999"), "", 1.5, "tick", 1.0))
    if best is not None:
        legend.append(("best found", "#222", "", 1.5, "ring", 1.0))
    return legend


def _legend_rows(legend: Sequence[_Item], width: int) -> list[list[tuple[float, _Item]]]:
    """The legend's items placed in rows above the plot (each with its x), so that it never covers a line."""
    rows: list[list[tuple[float, _Item]]] = [[]]
    cursor, left_edge, right_edge = 0.0, 12.0, width - 12.0
    for item in legend:
        item_width = 30 + _text_width(item[0]) + 18
        if rows[-1] and left_edge + cursor + item_width > right_edge:
            rows.append([])
            cursor = 0.0
        rows[-1].append((left_edge + cursor, item))
        cursor += item_width
    return rows


def _legend_svg(rows: Sequence[Sequence[tuple[float, _Item]]]) -> list[str]:
    out = []
    for index, row in enumerate(rows):
        y = 28 + 20 * index + 10
        for x, (label, color, dash, line_width, kind, opacity) in row:
            if kind == "line":
                dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
                out.append(
                    f'<line x1="{x:.1f}" y1="{y}" x2="{x + 24:.1f}" y2="{y}" stroke="{color}" '
                    f'stroke-width="{min(line_width + 0.5, 7)}" stroke-opacity="{opacity}"{dash_attr}/>'
                )
            elif kind == "tick":
                out.append(
                    f'<line x1="{x + 12:.1f}" y1="{y - 6}" x2="{x + 12:.1f}" y2="{y + 6}" stroke="{color}" '
                    'stroke-width="2"/>'
                )
            else:
                out.append(
                    f'<circle cx="{x + 12:.1f}" cy="{y}" r="5" fill="none" stroke="{color}" stroke-width="1.5"/>'
                )
            out.append(f'<text class="legend" x="{x + 30:.1f}" y="{y + 4}">{esc(label)}</text>')
    return out


def _y_axis_svg(plot: _Plot, ticks: Sequence[tuple[float, str]], title: str) -> list[str]:
    """The grid and the y axis, its ticks labelled, its title along it."""
    left, right, top, bottom = plot.left, plot.right, plot.top, plot.bottom
    out = ['<g class="axis y-axis">']
    for tick, label in ticks:
        ty = plot.y(tick)
        out.append(f'<line class="grid" x1="{left:.1f}" y1="{ty:.1f}" x2="{right:.1f}" y2="{ty:.1f}"/>')
        out.append(f'<line x1="{left - 5:.1f}" y1="{ty:.1f}" x2="{left:.1f}" y2="{ty:.1f}"/>')
        out.append(f'<text x="{left - 8:.1f}" y="{ty + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    out.append(f'<line x1="{left:.1f}" y1="{top}" x2="{left:.1f}" y2="{bottom}"/>')
    middle = (top + bottom) / 2
    out.append(
        f'<text class="axis-label" transform="translate(14 {middle:.1f}) rotate(-90)" '
        f'text-anchor="middle">{esc(title)}</text>'
    )
    out.append("</g>")
    return out


def _x_axis_svg(plot: _Plot, label: str, height_total: float) -> list[str]:
    left, right, bottom = plot.left, plot.right, plot.bottom
    x_ticks = plot.x.ticks(7)
    x_step = plot.x.step(7)
    out = ['<g class="axis x-axis">']
    out.append(f'<line x1="{left:.1f}" y1="{bottom}" x2="{right:.1f}" y2="{bottom}"/>')
    for tick in x_ticks:
        x = plot.x(tick)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 19}" text-anchor="middle">{esc(tick_label(tick, x_step))}</text>')
    out.append(
        f'<text class="axis-label" x="{(left + right) / 2:.1f}" y="{height_total - 8}" '
        f'text-anchor="middle">{esc(label)}</text>'
    )
    out.append("</g>")
    return out


def _marks_svg(plot: _Plot, marks: Sequence[tuple[float, str]]) -> list[str]:
    """Failed trials: ticks on the x axis; past a few thousand, one per pixel and state (more look the same)."""
    out = []
    drawn: set[tuple[str, str]] = set()
    for x_value, state in marks:
        at = f"{plot.x(x_value):.1f}"
        if len(marks) > DOTS and (at, state) in drawn:
            continue
        drawn.add((at, state))
        out.append(
            f'<line class="mark mark-{esc(state)}" x1="{at}" y1="{plot.bottom - 9}" x2="{at}" y2="{plot.bottom - 1}" '
            f'stroke="{_MARK_COLOR.get(state, "#999")}" stroke-width="2"/>'
        )
    return out


def _series_svg(plot: _Plot, lines: Sequence[Line]) -> list[str]:
    """The measurements as dots, then the best-so-far lines on top."""
    x_scale, y_scale = plot.x, plot.y
    out = []
    for line in lines:
        if not line.dots:
            continue
        out.append(f'<g class="dots" fill="{line.color}" fill-opacity="0.35">')
        for x_value, y_value in line.dots:
            out.append(f'<circle cx="{x_scale(x_value):.1f}" cy="{y_scale(y_value):.1f}" r="2.6"/>')
        out.append("</g>")
    for line in sorted(lines, key=lambda line: line.opacity == 1.0):  # envelopes first, under the rest
        if not line.steps:
            continue
        x0, y0 = line.steps[0]
        path = [f"M{x_scale(x0):.1f},{y_scale(y0):.1f}"]
        for x_value, y_value in line.steps[1:]:
            path.append(f"H{x_scale(x_value):.1f}V{y_scale(y_value):.1f}")
        path.append(f"H{x_scale(max(line.end, line.steps[-1][0])):.1f}")
        dash_attr = f' stroke-dasharray="{line.dash}"' if line.dash else ""
        out.append(
            f'<path class="series" data-series="{esc(line.label)}" d="{"".join(path)}" fill="none" '
            f'stroke="{line.color}" stroke-width="{line.width}" stroke-opacity="{line.opacity}" '
            f'stroke-linejoin="round"{dash_attr}/>'
        )
    return out
