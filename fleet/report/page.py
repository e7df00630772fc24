"""The page: its sections (convergence, knob effects, best configurations, states, every trial, errors,
the campaign) and the page that holds them, with its style and its one script (page.css, page.js)."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import operator
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any

from fleet.clock import utcnow
from fleet.collector import collector_paused
from fleet.fronts import Front, Preference, campaign_fronts, objective_values
from fleet.labels import short_labels
from fleet.objective import Objective
from fleet.report.charts import Line, Scale, _clip, chart, log_range, nice_range, tick_label
from fleet.report.data import (
    _MEASURED,
    _OBJECTIVE,
    Data,
    Row,
    _identity,
    _measured_objective,
    collect,
    microseconds,
)
from fleet.report.text import DASH, DOTS, KNOB_VALUES, PALETTE, TIMES, TOP, config_text, esc, fmt, value_text
from fleet.spec.workloads import load_workload_spec
from fleet.states import FAILED, TRIAL_STATES, TrialState

if TYPE_CHECKING:
    from fleet.glance import Glance
    from fleet.store import Campaign, Problem, Store

_STATE = operator.attrgetter("state")
_T = operator.attrgetter("t")
_SERIES = operator.attrgetter("series")
_FAILED = frozenset(FAILED)

# -- the page's sections ---------------------------------------------------------------------------------


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds <= 180:
        return 1.0, "s"
    if seconds <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _baseline_for(data: Data, rows: Sequence[Row], config: Mapping[str, Any]) -> Row | None:
    """The valid baseline run with the same run-time knob values as ``config``: a like-for-like speedup; else
    (a baseline that pins a run-time knob to another value) the first valid baseline run, which is still the one
    the user asked to be compared with."""
    run_knobs = [name for name, knob in data.knobs.items() if not knob["build"]]
    wanted = [_identity(config.get(n)) for n in run_knobs]
    measured = [row for row in rows if row.baseline and row.measured]
    for row in measured:
        if [_identity(row.config.get(n)) for n in run_knobs] == wanted:
            return row
    return measured[0] if measured else None


def no_baseline_note(rows: Sequence[Row]) -> str:
    """Why a problem has no speedup: no baseline in its spec, or none of its baseline runs measured (and how each
    ended); empty when a baseline was measured."""
    baselines = [r for r in rows if r.baseline]
    if any(r.measured for r in baselines):
        return ""
    if not baselines:
        text = 'No speedup: the spec names no "baseline" configuration to compare with.'
    else:
        ended = "; ".join(
            f"trial {r.trial_id} {r.state}" + (f" ({_clip(r.reason, 120)})" if r.reason else "") for r in baselines[:3]
        )
        text = f"No speedup: the baseline has no valid measurement: {ended}."
    return f'<p class="no-baseline">{esc(text)}</p>'


def speedup(data: Data, best: Row | None, baseline: Row | None) -> float | None:
    if best is None or baseline is None or not best.objective or not baseline.objective:
        return None
    ratio = best.objective / baseline.objective
    return ratio if data.maximize else 1 / ratio


def _series_order(label: str) -> tuple[int, float, str]:
    """The strategy's series first, then chains by number (chain 2 before chain 10), then by name."""
    if not label.startswith("chain "):
        return (0, 0.0, label)
    try:
        return (1, float(label[6:]), label)
    except ValueError:
        return (2, 0.0, label)


def convergence(
    data: Data, rows: Sequence[Row], searched: Sequence[Row], best_row: Row | None, problem_key: str
) -> str:
    """Both convergence charts for one problem's trials (``rows``; ``searched``, those finished that are not
    baselines, and ``best_row``, their best), or a line saying there is nothing to plot yet."""
    if best_row is None:
        return '<p class="empty">No valid measurement yet: nothing to plot.</p>'
    # Both x axes are the campaign's: the trials it had finished, and the time it had run, when each trial ended (0
    # for one without a time). Each is a column taken in C: a Python expression per trial costs more than the rest.
    times = list(map(_T, searched))
    if None in times:
        times = [t or 0.0 for t in times]
    span = max(times)
    scale, unit = _time_unit(span)
    numbers = range(1, len(times) + 1)
    times = list(map(operator.truediv, times, repeat(scale)))
    failed = list(map(_FAILED.__contains__, map(_STATE, searched)))
    states = list(compress(map(_STATE, searched), failed))
    marks_n = list(zip(compress(numbers, failed), states, strict=True))
    marks_t = list(zip(compress(times, failed), states, strict=True))
    by_trial, by_time, caption = _convergence_lines(data, numbers, times, searched)
    found = list(map(operator.is_, searched, repeat(best_row))).index(True)
    best_value = float(_measured_objective(best_row))
    reference = _reference(data, rows, best_row)
    direction = "higher is better" if data.maximize else "lower is better"
    y_label = f"best {data.objective_name} so far"
    n_trials = len(searched)
    trials_chart = chart(
        by_trial,
        title=f"Best {data.objective_name} so far, by trial",
        x_label="trials finished",
        y_label=y_label,
        y_note=direction,
        x_integer=True,
        x_min=0,
        x_max=max(n_trials, 1),
        reference=reference,
        marks=marks_n,
        best=(numbers[found], best_value),
        css_class="chart chart-trials",
    )
    time_chart = chart(
        by_time,
        title=f"Best {data.objective_name} so far, by wall time",
        x_label=f"time since the first trial started ({unit})",
        y_label=y_label,
        y_note=direction,
        x_integer=False,
        x_min=0.0,
        x_max=span / scale if span > 0 else 1.0,
        reference=reference,
        marks=marks_t,
        best=(times[found], best_value),
        css_class="chart chart-time",
    )
    return f'<div class="charts" id="convergence-{esc(problem_key)}">{trials_chart}\n{time_chart}</div>{caption}'


def _convergence_lines(
    data: Data, numbers: Sequence[int], times: Sequence[float], rows: Sequence[Row]
) -> tuple[list[Line], list[Line], str]:
    """A line per series of ``rows`` (their trial numbers and times beside them), by trial and by time, with its
    measurements as dots (past ``DOTS`` of them, some: see :func:`dots_shown`), and the caption that says so, or "";
    with several series, a wide pale line of the best of them all last."""
    measured = list(map(_MEASURED, rows))
    series = list(map(_SERIES, rows))
    labels = sorted(set(compress(series, measured)), key=_series_order)
    several = len(labels) > 1
    groups: list[tuple[str, Sequence[int], Sequence[float], Sequence[Row]]] = [(labels[0], numbers, times, rows)]
    if several:
        groups = [(label, *_members(label, series, numbers, times, rows)) for label in labels]
        every = "best of all chains" if all(label.startswith("chain ") for label in labels) else "best of all series"
        groups.append((every, numbers, times, rows))
    measurements = sum(measured)
    by_trial: list[Line] = []
    by_time: list[Line] = []
    drawn = 0
    for index, (label, group_numbers, group_times, group_rows) in enumerate(groups):
        everything = several and index == len(groups) - 1
        color = "#1f2328" if everything else PALETTE[index % len(PALETTE)]
        dash = "" if everything or index < len(PALETTE) else "5 3"
        width, opacity = (7.0, 0.18) if everything else (2.0, 1.0)
        line_n = Line(label, color, [], group_numbers[-1], width=width, dash=dash, opacity=opacity)
        line_t = Line(label, color, [], group_times[-1], width=width, dash=dash, opacity=opacity)
        shown = list(map(_MEASURED, group_rows))
        xs_n = list(compress(group_numbers, shown))
        xs_t = list(compress(group_times, shown))
        values = list(map(float, compress(map(_OBJECTIVE, group_rows), shown)))
        corners = _improvements(values, data.maximize)
        line_n.steps = [(xs_n[i], values[i]) for i in corners]
        line_t.steps = [(xs_t[i], values[i]) for i in corners]
        if not everything:
            # Past a few thousand, more dots only blot the chart and swell the page (11 MB for 100,000 trials).
            share = max(2, DOTS * len(values) // measurements) if measurements > DOTS else len(values)
            keep = dots_shown(values, share, data.maximize, corners)
            line_n.dots = [(xs_n[i], values[i]) for i in keep]
            line_t.dots = [(xs_t[i], values[i]) for i in keep]
            drawn += len(keep)
        by_trial.append(line_n)
        by_time.append(line_t)
    if measurements <= DOTS:
        return by_trial, by_time, ""
    caption = (
        f'<p class="hint dots">{drawn:,} of {measurements:,} trials drawn as dots: evenly spaced ones, each that '
        "improved its series' best so far and the worst; the lines and the axes take every trial.</p>"
    )
    return by_trial, by_time, caption


def _members(
    label: str, series: Sequence[str], numbers: Sequence[int], times: Sequence[float], rows: Sequence[Row]
) -> tuple[list[int], list[float], list[Row]]:
    """The trial numbers, times and rows of the series ``label``, of every trial's ``series``."""
    member = list(map(label.__eq__, series))
    return list(compress(numbers, member)), list(compress(times, member)), list(compress(rows, member))


def _improvements(values: Sequence[float], maximize: bool) -> list[int]:
    """The indices of the ``values`` that beat every value before them (the first does): the best so far's
    corners."""
    if not values:
        return []
    corners = [0]
    best = values[0]
    # A plain loop: accumulate() with min or max calls the builtin per value, five times as slow.
    if maximize:
        for index, value in enumerate(values):
            if value > best:
                best = value
                corners.append(index)
    else:
        for index, value in enumerate(values):
            if value < best:
                best = value
                corners.append(index)
    return corners


def _reference(data: Data, rows: Sequence[Row], best_row: Row) -> tuple[str, float] | None:
    """The baseline's line on the charts, (label, objective): that of the best's run-time knob values (see
    :func:`_baseline_for`); None without a measured baseline."""
    baseline = _baseline_for(data, rows, best_row.config)
    if baseline is None or baseline.objective is None:
        return None
    run_knobs = [n for n, k in data.knobs.items() if not k["build"]]
    shown = ", ".join(f"{n}={value_text(baseline.config.get(n))}" for n in run_knobs)
    return ("baseline" + (f" ({shown})" if shown else ""), float(baseline.objective))


def dots_shown(values: Sequence[float], keep: int, maximize: bool, corners: Iterable[int] | None = None) -> list[int]:
    """The indices, in order, of about ``keep`` of ``values`` to draw as dots: evenly spaced ones, the first and
    the last among them, each that beats all before it (the corners of the best-so-far line, as
    :func:`_improvements` gives them, which ``corners`` may be; higher is better where ``maximize``) and the worst
    (so the y axis spans the same range as with every dot)."""
    if len(values) <= keep:
        return list(range(len(values)))
    last = len(values) - 1
    chosen = {round(i * last / (keep - 1)) for i in range(keep)} if keep > 1 else {0}
    chosen.update(_improvements(values, maximize) if corners is None else corners)
    chosen.add(values.index((min if maximize else max)(values)))  # the first of the worst
    return sorted(chosen)


KnobValue = tuple[Any, int, float | None, float | None]  # value, valid count, median, best


@dataclass
class KnobEffect:
    name: str
    build: bool
    values: list[KnobValue]
    spread: float
    ratio: float | None


def _grouped(values: Sequence[Any], objectives: Sequence[float]) -> dict[tuple[type, Any], list[float]]:
    """``objectives`` grouped by their ``values`` in one pass over them, keyed by (type, value) as _identity keys a
    value."""
    kinds = set(map(type, values))
    if len(kinds) == 1:  # most knobs: the values themselves are the keys, no tuple made per trial
        (kind,) = kinds
        plain: defaultdict[Any, list[float]] = defaultdict(list)
        for value, objective in zip(values, objectives, strict=True):
            plain[value].append(objective)
        return {(kind, value): found for value, found in plain.items()}
    grouped: defaultdict[tuple[type, Any], list[float]] = defaultdict(list)
    for key, objective in zip(zip(map(type, values), values, strict=True), objectives, strict=True):
        grouped[key].append(objective)
    return grouped


def knob_effects(data: Data, rows: Sequence[Row]) -> list[KnobEffect]:
    """Per knob, per value: count, median and best over valid measurements; ordered by spread of medians."""
    searched = [r for r in rows if not r.baseline]
    valid = [r for r in searched if r.measured]
    valid_objectives = list(map(float, map(_OBJECTIVE, valid)))
    overall = statistics.median(valid_objectives) if valid else 0.0
    pick = max if data.maximize else min
    effects = []
    searched_configs = [r.config for r in searched]
    valid_configs = [r.config for r in valid]
    for name, knob in data.knobs.items():
        by_value = _grouped([c.get(name) for c in valid_configs], valid_objectives)
        tried: set[tuple[type, Any]] | None = None  # the values the trials used, when one had no valid measurement
        entries = []
        for value in knob["values"]:
            objectives = by_value.get(_identity(value), [])
            if not objectives:
                if tried is None:
                    used = [c.get(name) for c in searched_configs]
                    tried = set(zip(map(type, used), used, strict=True))
                if _identity(value) not in tried:
                    continue
            median = statistics.median(objectives) if objectives else None
            entries.append((value, len(objectives), median, pick(objectives) if objectives else None))
        medians = [m for _, _, m, _ in entries if m is not None]
        spread = (max(medians) - min(medians)) / (abs(overall) or 1.0) if len(medians) > 1 else 0.0
        ratio = max(medians) / min(medians) if len(medians) > 1 and min(medians) > 0 else None
        effects.append(KnobEffect(name, knob["build"], entries, spread, ratio))
    # By the ratio of the extreme medians when every knob has one (positive objectives), else by their spread.
    if all(e.ratio is not None for e in effects if sum(m is not None for _, _, m, _ in e.values) > 1):
        effects.sort(key=lambda e: (-(e.ratio or 1.0), e.name))
    else:
        effects.sort(key=lambda e: (-e.spread, e.name))
    return effects


_EFFECT_HEAD = (
    '<table class="effect"><colgroup><col class="c-value"><col class="c-n"><col class="c-num"><col class="c-num">'
    '<col class="c-bar"></colgroup><thead><tr><th>value</th><th class="num">valid</th><th class="num">median</th>'
    '<th class="num">best</th><th class="barcell"></th></tr>'
)


def _share(data: Data, numbers: Sequence[float]) -> Callable[[float | None], float]:
    """How good a value is as a share of the best of ``numbers``, in [0, 1]: longer bars are better.

    For a minimised objective (times) that is best / value, the speed relative to the best. With numbers
    that are not all positive, bars fall back to the value itself, scaled by the largest.
    """
    if numbers and min(numbers) > 0:
        best = (max if data.maximize else min)(numbers)
        if data.maximize:
            return lambda v: 0.0 if v is None else min(1.0, v / best)
        return lambda v: 0.0 if v is None else min(1.0, best / v)
    top = max((abs(x) for x in numbers), default=1.0) or 1.0
    return lambda v: 0.0 if v is None else max(0.0, min(1.0, v / top))


def knob_section(data: Data, rows: Sequence[Row], best: Row | None, problem_key: str) -> str:
    effects = knob_effects(data, rows)
    if not any(count for effect in effects for _, count, _, _ in effect.values):
        return '<p class="empty">No valid measurement yet: no knob effects to show.</p>'
    direction = "higher is better" if data.maximize else "lower is better"
    cards = []
    for rank, effect in enumerate(effects, start=1):
        share_median = _share(data, [m for _, _, m, _ in effect.values if m is not None])
        share_best = _share(data, [b for _, _, _, b in effect.values if b is not None])
        medians = [m for _, _, m, _ in effect.values if m is not None]
        best_median = (max if data.maximize else min)(medians) if medians else None
        several = len(set(medians)) > 1
        head, tail, hidden = knob_rows(effect.values, data.maximize)
        body = []
        for index, (value, count, median, best_value) in enumerate([*head, *tail]):
            if hidden and index == len(head):
                body.append(f'<tr class="more"><td colspan="5">\u2026 {hidden:,} values between these</td></tr>')
            in_best = best is not None and _identity(best.config.get(effect.name)) == _identity(value)
            classes = []
            if median is not None and median == best_median and several:
                classes.append("top")
            bar = ""
            if median is not None:
                width, best_x = share_median(median) * 100, share_best(best_value) * 100
                bar = (
                    f'<div class="bar" title="median {esc(fmt(median))}, best {esc(fmt(best_value))}">'
                    f'<div class="fill" style="width:{width:.1f}%"></div>'
                    f'<div class="tick" style="left:{best_x:.1f}%"></div></div>'
                )
            star = ' <span class="star" title="the best configuration uses this value">★</span>' if in_best else ""
            body.append(
                f'<tr class="{" ".join(classes)}"><td class="value"><span class="v" title="{esc(value_text(value))}">'
                f"{esc(value_text(value))}</span>{star}</td>"
                f'<td class="num">{count}</td><td class="num">{esc(fmt(median))}</td>'
                f'<td class="num">{esc(fmt(best_value))}</td><td class="barcell">{bar}</td></tr>'
            )
        if effect.ratio is not None and effect.ratio < 1.005:
            spread = "the values' medians are the same"
        elif effect.ratio is not None:
            spread = f"medians differ up to {effect.ratio:.2f}{TIMES}"
        elif len(medians) > 1:
            spread = f"spread of medians {effect.spread * 100:.0f}% of the overall median"
        else:
            spread = "one value measured"
        kind = "build-time" if effect.build else "run-time"
        cards.append(
            f'<div class="knob card" id="knob-{esc(problem_key)}-{esc(effect.name)}" data-knob="{esc(effect.name)}">'
            f'<h4><span class="rank">{rank}</span> {esc(effect.name)} <span class="badge">{kind}</span></h4>'
            f'<p class="spread">{esc(spread)}</p>'
            + (
                f'<p class="hint more">{len(effect.values):,} values: the {len(head)} with the best medians and the '
                f"{len(tail)} with the worst; {hidden:,} not shown.</p>"
                if hidden
                else ""
            )
            + f"{_EFFECT_HEAD}"
            f"</thead><tbody>{''.join(body)}</tbody></table></div>"
        )
    return (
        f'<p class="hint">Median and best {esc(data.objective_name)} ({direction}) over valid measurements for each '
        "value of each knob, the knobs that matter most first (by how far apart their values' medians are). "
        "Bars compare the values' medians: the best median is a full bar, a value half as good a half bar; "
        '<span class="legend-tick"></span> compares their bests the same way. '
        "★ marks the values of the best configuration.</p>"
        f'<div class="knobs">{"".join(cards)}</div>'
    )


def knob_rows(values: Sequence[KnobValue], maximize: bool) -> tuple[list[KnobValue], list[KnobValue], int]:
    """A knob's table: every value in order, or, past ``KNOB_VALUES``, the ``TOP`` best and the ``TOP`` worst
    measured values by median, best first, and how many values lie between (unmeasured ones too)."""
    if len(values) <= KNOB_VALUES:
        return list(values), [], 0
    measured = [(median, v) for v in values if (median := v[2]) is not None]
    ranked = [v for _, v in sorted(measured, key=lambda m: m[0], reverse=maximize)]
    head, tail = ranked[:TOP], ranked[max(TOP, len(ranked) - TOP) :]
    return head, tail, len(values) - len(head) - len(tail)


def best_table(data: Data, rows: Sequence[Row], ranked: Sequence[Row]) -> str:
    """The ``ranked`` rows of ``rows`` (see :func:`fleet.report.data._ranked`), with their speedups and details."""
    if not ranked:
        return '<p class="empty">No valid measurement yet.</p>'
    knob_names = list(data.knobs)
    hidden = {data.objective_name, str((data.campaign.workload or {}).get("objective", {}).get("json", ""))}
    hidden |= set(knob_names)
    several_series = len({r.series for r in rows if not r.baseline}) > 1
    if several_series:
        hidden.add("chain")
    metric_names = sorted(
        {
            k
            for r in ranked
            for k, v in data.detail(r).metrics.items()
            if k not in hidden and isinstance(v, int | float) and not isinstance(v, bool)
        }
    )[:8]
    head = ["#", *knob_names, data.objective_name, "speedup"]
    if several_series:
        head.append("series")
    head += [*metric_names, "samples", "trial id", "ran on"]
    baselines = [r for r in rows if r.baseline]  # searched once per row below
    out = ['<table class="best"><thead><tr>']
    numeric = {data.objective_name, "speedup", "samples", "#", *metric_names}
    for name in head:
        out.append(f'<th class="{"num" if name in numeric else ""}">{esc(name)}</th>')
    out.append("</tr></thead><tbody>")
    for rank, row in enumerate(ranked, start=1):
        baseline = _baseline_for(data, baselines, row.config)
        gain = speedup(data, row, baseline)
        cells = [f'<td class="num">{rank}</td>']
        cells += [f"<td>{esc(value_text(row.config.get(n, DASH)))}</td>" for n in knob_names]
        cells.append(f'<td class="num objective">{esc(fmt(row.objective))}</td>')
        cells.append(f'<td class="num">{esc(f"{gain:.2f}{TIMES}") if gain is not None else DASH}</td>')
        if several_series:
            cells.append(f"<td>{esc(row.series)}</td>")
        detail = data.detail(row)
        cells += [f'<td class="num">{esc(fmt(detail.metrics.get(n)))}</td>' for n in metric_names]
        samples = ", ".join(fmt(s) for s in detail.samples)
        cells.append(f'<td class="num" title="{esc(samples)}">{len(detail.samples)}</td>')
        reused = f' <span class="muted">(measured in {row.reused_from})</span>' if row.reused_from else ""
        cells.append(f"<td>{row.trial_id}{reused}</td>")
        where = " · ".join(esc(x) for x in (row.node, row.gpu, row.worker) if x)
        cells.append(f"<td>{where or DASH}</td>")
        out.append(f'<tr class="{"first" if rank == 1 else ""}">{"".join(cells)}</tr>')
    out.append("</tbody></table>")
    return "".join(out)


# -- several objectives: the Pareto front ----------------------------------------------------------------------


def _axis(numbers: Sequence[float], r0: float, r1: float) -> Scale:
    """A nice scale over ``numbers`` from pixel ``r0`` to ``r1``, logarithmic where they span 30 times or more."""
    lo, hi = min(numbers), max(numbers)
    log = lo > 0 and hi / lo >= 30
    lo, hi = log_range(lo, hi) if log else nice_range(lo, hi)
    return Scale(lo, hi, r0, r1, log=log)


def front_chart(found: Front, objectives: Sequence[Objective], width: int = 560, height: int = 360) -> str:
    """The first two objectives of every valid trial as dots, the front's points joined by a line, the chosen one
    ringed: inline SVG."""
    first, second = objectives[0], objectives[1]

    def pair(result: Any) -> tuple[float, float] | None:
        shown = objective_values(result, objectives)
        x, y = shown.get(first.name), shown.get(second.name)
        return (x, y) if isinstance(x, int | float) and isinstance(y, int | float) else None

    measured = [p for p in map(pair, found.measured) if p is not None]
    front = [p for p in map(pair, found.points) if p is not None]
    if not measured:
        return ""
    stride = max(1, math.ceil(len(measured) / DOTS))  # past DOTS measurements, an even subset (the front is whole)
    left, top, right, bottom = 70.0, 34.0, width - 18.0, height - 46.0
    x_scale = _axis([x for x, _ in measured], left, right)
    y_scale = _axis([y for _, y in measured], bottom, top)

    def goal(o: Objective, scale: Scale) -> str:
        return f"{o.name} ({'higher' if o.maximize else 'lower'} is better{', log scale' if scale.log else ''})"

    title = f"Pareto front: {first.name} against {second.name}"
    out = [
        f'<svg class="front-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{esc(title)}"><title>{esc(title)}</title>',
        f'<text class="chart-title" x="{width / 2:.1f}" y="18" text-anchor="middle">{esc(title)}</text>',
        '<g class="axis">',
    ]
    for tick in y_scale.ticks(6):
        y = y_scale(tick)
        out.append(f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        label = tick_label(tick, None if y_scale.log else y_scale.step(6), y_scale.log)
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(label)}</text>')
    for tick in x_scale.ticks(7):
        x = x_scale(tick)
        label = tick_label(tick, None if x_scale.log else x_scale.step(7), x_scale.log)
        out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 19}" text-anchor="middle">{esc(label)}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>')
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>')
    out.append(
        f'<text class="axis-label" x="{(left + right) / 2:.1f}" y="{height - 8}" text-anchor="middle">'
        f"{esc(goal(first, x_scale))}</text>"
        f'<text class="axis-label" transform="translate(14 {(top + bottom) / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle">{esc(goal(second, y_scale))}</text></g>'
    )
    out.append(f'<g class="dots" fill="{PALETTE[0]}" fill-opacity="0.35">')
    for x, y in measured[::stride]:
        out.append(f'<circle cx="{x_scale(x):.1f}" cy="{y_scale(y):.1f}" r="2.6"/>')
    out.append("</g>")
    # The front joined in the order of the first objective: each step trades one objective for the other.
    path = " ".join(f"{x_scale(x):.1f},{y_scale(y):.1f}" for x, y in sorted(front))
    out.append(f'<polyline class="front" points="{path}" fill="none" stroke="{PALETTE[1]}" stroke-width="2"/>')
    out.append(f'<g class="front-points" fill="{PALETTE[1]}">')
    for x, y in front:
        out.append(f'<circle cx="{x_scale(x):.1f}" cy="{y_scale(y):.1f}" r="4"/>')
    out.append("</g>")
    chosen = pair(found.chosen) if found.chosen is not None else None
    if chosen is not None:
        out.append(
            f'<circle class="chosen" cx="{x_scale(chosen[0]):.1f}" cy="{y_scale(chosen[1]):.1f}" r="8" fill="none" '
            'stroke="#222" stroke-width="1.5"/>'
        )
    out.append("</svg>")
    return "".join(out)


def front_section(found: Front, objectives: Sequence[Objective], preference: Preference, knobs: Sequence[str]) -> str:
    """One problem's front: its chart, and a table of its points with every objective, the chosen one first."""
    if not found.points:
        return '<p class="empty">No valid measurement yet.</p>'
    names = [o.name for o in objectives]
    more = f" (the chart shows the first two of {len(names)})" if len(names) > 2 else ""
    parts = [
        f'<p class="front-note">{len(found.points)} of {len(found.measured)} valid configurations are on the front: '
        f"none of the others beats one of them in every objective{esc(more)}. Ringed and first in the table: the "
        f"{esc(preference.describe(objectives))} (fleet best --prefer chooses another).</p>",
        front_chart(found, objectives),
        '<table class="best front"><thead><tr>',
        *(f'<th class="num">{esc(o.name)} ({"max" if o.maximize else "min"})</th>' for o in objectives),
        *(f"<th>{esc(k)}</th>" for k in knobs),
        "<th>trial id</th></tr></thead><tbody>",
    ]
    ordered = sorted(found.points, key=lambda p: p is not found.chosen)  # the chosen first, then in the front's order
    for point in ordered:
        shown = objective_values(point, objectives)
        cells = [f'<td class="num objective">{esc(fmt(shown.get(n)))}</td>' for n in names]
        cells += [f"<td>{esc(value_text(point.config.get(k, DASH)))}</td>" for k in knobs]
        cells.append(f"<td>{point.trial_id}</td>")
        parts.append(f'<tr class="{"first" if point is found.chosen else ""}">{"".join(cells)}</tr>')
    parts.append("</tbody></table>")
    return "".join(parts)


def baseline_table(data: Data, rows: Sequence[Row]) -> str:
    baselines = [r for r in rows if r.baseline]
    if not baselines:
        return no_baseline_note(rows)
    knob_names = list(data.knobs)
    out = [
        no_baseline_note(rows),
        '<h4 class="baseline">Baseline</h4>',
        '<table class="baseline"><thead><tr>',
        *(f"<th>{esc(n)}</th>" for n in knob_names),
        f'<th>state</th><th class="num">{esc(data.objective_name)}</th><th class="num">samples</th><th>trial id</th>',
        "</tr></thead><tbody>",
    ]
    for row in baselines:
        cells = [f"<td>{esc(value_text(row.config.get(n, DASH)))}</td>" for n in knob_names]
        objective = fmt(row.objective) if row.measured else DASH
        cells.append(f'<td><span class="state state-{esc(row.state)}">{esc(row.state)}</span></td>')
        cells.append(f'<td class="num">{esc(objective)}</td><td class="num">{len(data.detail(row).samples)}</td>')
        cells.append(f"<td>{row.trial_id}</td>")
        out.append(f"<tr>{''.join(cells)}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def history_note(data: Data, trials: Sequence[tuple[int, int, dict[str, Any], float | None]]) -> str:
    """One line on the trials proposed from history (what related problems found best), if any."""
    if not trials:
        return ""
    sources = sorted({name for _, _, said, _ in trials for name in said.get("sources") or []})
    measured = [(objective, trial_id) for trial_id, _, _, objective in trials if objective is not None]
    text = f"{len(trials)} trial{'s' if len(trials) != 1 else ''} proposed from history"
    if measured:
        objective, trial_id = (max if data.maximize else min)(measured)
        text += f"; the best of them: {fmt(objective)} {data.objective_name} (trial {trial_id})"
    if sources:
        shown = "; ".join(sources[:5]) + (f"; and {len(sources) - 5} more" if len(sources) > 5 else "")
        text += f". From: {shown}"
    return f'<p class="history">{esc(text)}.</p>'


def _glance(data: Data, rows: Sequence[Row], searched: Sequence[Row], best: Row | None) -> str:
    """The headline of one problem: its best (``best``, that of ``searched``, its finished trials that are not
    baselines; else the best baseline), the speedup, when it was found."""
    best = best or data.best_of(rows)
    finished = [r for r in rows if r.finished]
    valid = [r for r in rows if r.measured]
    if best is None:
        states = ", ".join(f"{n} {s}" for s, n in _counts(rows).items()) or "no trials"
        return f'<p class="empty glance">No measurements yet ({esc(states)}).</p>'
    baseline = _baseline_for(data, rows, best.config)
    gain = speedup(data, best, baseline)
    found = next((i for i, r in enumerate(searched, start=1) if r is best), None)
    parts = [
        '<div class="glance">',
        f'<div class="big"><span class="label">best {esc(data.objective_name)}</span>'
        f'<span class="value">{esc(fmt(best.objective))}</span></div>',
    ]
    if gain is not None:
        parts.append(
            f'<div class="big"><span class="label">speedup over the baseline</span>'
            f'<span class="value">{gain:.2f}{TIMES}</span></div>'
        )
    parts.append(
        f'<div class="big"><span class="label">valid / finished trials</span>'
        f'<span class="value">{len(valid)} / {len(finished)}</span></div>'
    )
    if found is not None:
        trials = f"{found} trial{'s' if found != 1 else ''}"
        parts.append(
            f'<div class="big"><span class="label">found after</span>'
            f'<span class="value">{trials}</span><span class="sub">and {esc(_duration(best.t))}</span></div>'
        )
    parts.append("</div>")
    parts.append(f'<p class="bestconfig">best configuration: <code>{esc(config_text(best.config))}</code>')
    if baseline is not None:
        parts.append(
            f"<br>baseline: <code>{esc(config_text(baseline.config))}</code> → "
            f"{esc(fmt(baseline.objective))} {esc(data.objective_name)}"
        )
    parts.append("</p>")
    return "".join(parts)


def _counts(rows: Iterable[Row]) -> dict[str, int]:
    counts = Counter(map(_STATE, rows))  # in the order first seen, as a dict counts them
    order: dict[str, int] = {s: i for i, s in enumerate(TRIAL_STATES)}
    return dict(sorted(counts.items(), key=lambda kv: order.get(kv[0], 99)))


def states_section(data: Data) -> str:
    counts = _counts(data.rows)
    if not counts:
        return '<p class="empty">No trials yet.</p>'
    cells = "".join(
        f'<div class="count state-{esc(state)}"><span class="n">{n}</span><span class="label">{esc(state)}</span></div>'
        for state, n in counts.items()
    )
    reused = sum(1 for r in data.rows if r.reused_from)
    note = f'<p class="hint">{reused} trials reused a measurement made before.</p>' if reused else ""
    return f'<div class="counts">{cells}</div>{note}'


ALL_TRIALS = 20_000
"""Rows of the table of every trial, at most: past it the page says so, and ``fleet trials --csv`` has them all."""


def _sort_key(value: Any) -> str:
    """A cell's ``data-v``: what the table's script sorts by (a number as a number, else the text)."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return repr(float(value)) if math.isfinite(value) else ""
    return str(value)


_MISSING = object()
"""A knob a trial's configuration lacks: its cell shows a dash and sorts as empty."""


class _CellCache:
    """The table's cells, ``<td data-v="sort key">text</td>``, each written once per value."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], str] = {}
        self.knobs: dict[tuple[type, Any], str] = {}

    def __call__(self, value: str, text: str) -> str:
        """A cell of text, sorted by ``value``."""
        found = self.cells.get((value, text))
        if found is None:
            found = self.cells[value, text] = f'<td data-v="{esc(_sort_key(value))}">{esc(text)}</td>'
        return found

    def knob(self, value: Any) -> str:
        """A knob's value as a cell (a dash for a trial without it)."""
        if isinstance(value, float) and value == 0:  # 0.0 and -0.0: one key, written apart
            return self._knob(value)
        try:
            key = (type(value), value)
            found = self.knobs.get(key)
        except TypeError:  # a list or an object: not a key, written each time
            return self._knob(value)
        if found is None:
            found = self.knobs[key] = self._knob(value)
        return found

    @staticmethod
    def _knob(value: Any) -> str:
        if value is _MISSING:
            return f'<td data-v="">{esc(DASH)}</td>'
        if value.__class__ is int:  # digits (and its float's exponent): nothing to escape
            return f'<td data-v="{_sort_key(value)}">{int.__repr__(value)}</td>'
        return f'<td data-v="{esc(_sort_key(value))}">{esc(value_text(value))}</td>'


def all_trials_section(data: Data) -> str:
    """Every trial in one table, which the page's script sorts (click a heading) and filters (type in the box).

    Without the script (a viewer that runs none) it is the same table, in trial order.
    """
    if not data.rows:
        return '<p class="empty">No trials yet.</p>'
    problems = short_labels((p.id, p) for p in data.problems)  # n=1024, not the problem's id
    knob_names = list(data.knobs)
    several = len(data.problems) > 1
    head = ["trial", *(["problem"] if several else []), "state", data.objective_name, *knob_names]
    head += ["reason", "ran on"]
    numeric = {"trial", data.objective_name}
    numeric |= {n for n in knob_names if all(isinstance(v, int | float) for v in data.knobs[n]["values"])}
    out = [
        '<div class="filter"><label>Filter <input type="search" id="trial-filter" '
        'placeholder="state, value, reason, worker"></label> <span id="trial-count"></span></div>',
        '<table class="all" id="all-trials"><thead><tr>',
    ]
    for index, name in enumerate(head):
        kind = "num" if name in numeric else ""
        out.append(f'<th class="{kind} sort" data-col="{index}" data-kind="{kind or "text"}">{esc(name)}</th>')
    out.append("</tr></thead><tbody>")
    # Most cells repeat (a knob's few values, a state, a reason, a worker): each is written once and reused, where
    # escaping every cell of 20,000 rows anew took a third of a second.
    cell = _CellCache()
    starts: dict[str, str] = {}  # a state's <tr>
    places: dict[tuple[str | None, str | None, str | None], str] = {}  # a place's cell
    plain: dict[int | str, str] = {}  # the cell of a knob's value that is an int or a string (most are)
    no_reason = cell("", "")
    isfinite, evaluated = math.isfinite, str(TrialState.EVALUATED)
    # The parts of every row go in one list, joined once: a join and an f-string per row cost a fifth of the table.
    append = out.append
    for row in data.rows[:ALL_TRIALS]:
        state = row.state
        if (start := starts.get(state)) is None:
            start = starts[state] = f'<tr class="state-{esc(state)}">'
        append(start)
        # The trial's id and objective are numbers: their text needs no escaping. An id's sort key is its float's
        # repr, which is the id and ".0" where a float holds the id exactly (below 2^53).
        trial_id = row.trial_id
        key = f"{trial_id}.0" if trial_id < 2**53 else repr(float(trial_id))
        append(f'<td data-v="{key}">{trial_id}{" (baseline)" if row.baseline else ""}</td>')
        if several:
            label = problems.get(row.problem_id, str(row.problem_id))
            append(cell(label, label))
        append(cell(state, state))
        objective = row.objective if state == evaluated else None
        # Most objectives are finite floats, whose sort key is their repr (as _sort_key writes it, without its checks).
        key = repr(objective) if objective.__class__ is float and isfinite(objective) else _sort_key(objective)
        append(f'<td data-v="{key}">{fmt(objective)}</td>')
        config = row.config
        for name in knob_names:
            value = config.get(name, _MISSING)
            if value.__class__ is int or value.__class__ is str:  # never equal to one another, nor to a bool
                if (found := plain.get(value)) is None:
                    found = plain[value] = cell.knob(value)
                append(found)
            else:
                append(cell.knob(value))
        if row.reason:
            reason = _clip(row.reason.splitlines()[0], 100)
            append(cell(reason, reason))
        else:
            append(no_reason)
        place = (row.node, row.gpu, row.worker)
        if (found := places.get(place)) is None:
            where = " · ".join(x for x in place if x)
            found = places[place] = cell(where, where or DASH)
        append(found)
        append("</tr>")
    out.append("</tbody></table>")
    if len(data.rows) > ALL_TRIALS:
        out.append(
            f'<p class="hint">The first {ALL_TRIALS} of {len(data.rows)} trials; '
            f"<code>fleet trials {esc(data.campaign.name)} --csv</code> writes them all.</p>"
        )
    return "".join(out)


# The page's only script, allowed by its hash: the page runs nothing else, whatever a knob's value holds.
STYLE = resources.files(__package__).joinpath("page.css").read_text()
SCRIPT = resources.files(__package__).joinpath("page.js").read_text()
SCRIPT_HASH = "sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()


def errors_section(data: Data) -> str:
    groups = data.errors
    if not groups:
        return '<p class="empty">No errored or invalid trials.</p>'
    out = [
        '<table class="errors"><thead><tr><th class="num">trials</th><th>state</th><th>reason</th>'
        "<th>example</th></tr></thead><tbody>"
    ]
    for (state, reason), members in groups:
        example = members[0]
        detail = data.detail(example)
        numbers = sorted(r.trial_id for r in members)
        ids = ", ".join(str(n) for n in numbers[:8]) + (" \u2026" if len(numbers) > 8 else "")
        output = []
        for label, text in (
            ("stdout", detail.stdout_tail),
            ("stderr", detail.stderr_tail),
            ("build log", detail.build_log),
        ):
            if text:
                output.append(f'<div class="out-label">{label}</div><pre>{esc(text[-3000:])}</pre>')
        details = (
            f"<details><summary>trial {example.trial_id}: <code>{esc(config_text(example.config))}</code></summary>"
            f"{''.join(output) or '<p class=muted>no output recorded</p>'}</details>"
        )
        out.append(
            f'<tr><td class="num">{len(members)}</td><td><span class="state state-{esc(state)}">{esc(state)}</span>'
            f'</td><td class="reason">{esc(reason)}<div class="muted">trials {esc(ids)}</div></td>'
            f"<td>{details}</td></tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _kv_table(items: Mapping[str, Any], first: Sequence[str] = (), css_class: str = "kv") -> str:
    """A two-column table of ``items``: the keys in ``first`` in that order, then the others sorted."""
    keys = [k for k in first if k in items] + sorted(k for k in items if k not in first)
    rows = []
    for key, value in ((k, items[k]) for k in keys):
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        rows.append(f"<tr><th>{esc(key)}</th><td><code>{esc(text)}</code></td></tr>")
    return f'<table class="{css_class}"><tbody>{"".join(rows)}</tbody></table>'


_WORKLOAD_ORDER = (
    "kind",
    "build",
    "artifacts",
    "run",
    "objective",
    "warmup",
    "repeats",
    "build_timeout",
    "run_timeout",
)


_PROVENANCE_ORDER = ("toolchain", "device", "fleet", "python", "celery", "host", "platform", "argv")


def _values_text(values: Sequence[Any]) -> str:
    """A knob's values in a line: every one, or past ``KNOB_VALUES`` the first few, the last and how many."""
    if len(values) <= KNOB_VALUES:
        return ", ".join(value_text(v) for v in values)
    first = ", ".join(value_text(v) for v in values[:TOP])
    return f"{first}, \u2026, {value_text(values[-1])} ({len(values):,} values)"


def campaign_section(data: Data) -> str:
    c = data.campaign
    strategy = dict(c.strategy or {})
    space_rows = "".join(
        f"<tr><th>{esc(name)}</th><td>{'build-time' if knob['build'] else 'run-time'}</td>"
        f"<td>{esc(_values_text(knob['values']))}</td></tr>"
        for name, knob in data.knobs.items()
    )
    constraints = (c.space or {}).get("constraints") or []
    constraint_list = "".join(f"<li><code>{esc(x)}</code></li>" for x in constraints)
    workload = dict(c.workload or {})
    workload.pop("bundle", None)
    provenance = dict(c.provenance or {})
    # What the workers built and measured with, as their measurements recorded it (not where it was submitted).
    for fact, values in (
        ("toolchain", set(map(operator.attrgetter("toolchain"), data.rows))),
        ("device", set(map(operator.attrgetter("device"), data.rows))),
    ):
        found = sorted({str(value) for value in values if value})
        if found:
            provenance[fact] = "; ".join(found)
    # Counted by place first: a few places, not a string per measurement.
    places = Counter(
        (row.node, row.gpu, row.worker)
        for row in data.rows
        if row.measured or (row.objective is not None and row.state == TrialState.INVALID)
    )
    workers: dict[str, int] = {}
    for place, count in places.items():
        where = " · ".join(x for x in place if x) or "?"
        workers[where] = workers.get(where, 0) + count
    worker_rows = "".join(
        f'<tr><th>{esc(w)}</th><td class="num">{n}</td></tr>' for w, n in sorted(workers.items(), key=lambda kv: -kv[1])
    )
    return (
        '<div class="grid2">'
        f'<div class="card"><h3>Strategy</h3>{_kv_table(strategy, ("name", "budget", "seed", "options"))}'
        f"<h3>Space</h3><table class='kv'><tbody>{space_rows}</tbody></table>"
        + (f"<p>constraints:</p><ul>{constraint_list}</ul>" if constraint_list else "")
        + f"<h3>Workload</h3>{_kv_table(workload, _WORKLOAD_ORDER)}</div>"
        f'<div class="card"><h3>Provenance</h3>{_kv_table(provenance, _PROVENANCE_ORDER)}'
        + (
            f"<h3>Where it ran</h3><table class='kv'><thead><tr><th>node · gpu · worker</th>"
            f"<th class='num'>measurements</th></tr></thead><tbody>{worker_rows}</tbody></table>"
            if worker_rows
            else ""
        )
        + "</div></div>"
    )


def _problem_title(problem: Problem) -> str:
    params = config_text(problem.params or {})
    return f"{problem.kind} {params}".strip()


def render(store: Store | Glance, campaign: Campaign | str | int) -> str:
    """The report of ``campaign`` (a campaign, or its name or id) as one self-contained HTML page, read through
    the store or a :class:`fleet.glance.Glance` (a campaign of one objective: several need the store's fronts)."""
    found = store.campaign(campaign) if isinstance(campaign, str | int) else campaign
    with collector_paused():
        return _page(store, found)


def _page(store: Any, campaign: Any) -> str:
    """The page of ``campaign`` (a store's campaign or a glance's row), read through ``store`` (or a glance)."""
    from fleet.glance import Glance

    if isinstance(store, Glance):
        data = collect(store, campaign)
    else:
        from fleet.report.stored import StoredReads

        data = collect(StoredReads(store), campaign)
    c = campaign
    strategy = (c.strategy or {}).get("name", "?")
    finished = [r.finished_us for r in data.rows if r.finished_us is not None]
    elapsed = (max(finished) - microseconds(data.t0)) / 1_000_000 if finished and data.t0 else None
    meta = (
        f"target <b>{esc(c.target)}</b> · strategy <b>{esc(strategy)}</b> · status <b>{esc(c.status)}</b> · "
        f"created {esc(c.created_at.isoformat(sep=' ', timespec='seconds'))} UTC"
        + (f" · trials ran {esc(_duration(elapsed))}" if elapsed is not None else "")
    )
    body = [
        f"<header><h1>Fleet report: {esc(c.name)}</h1><div class='meta'>{meta}</div></header>",
    ]
    if not any(r.objective is not None for r in data.rows):
        body.append(
            '<p class="empty nomeasure">This campaign has no measurements yet'
            + (f" ({len(data.rows)} trials, none measured)." if data.rows else " (no trials).")
            + "</p>"
        )
    objectives = load_workload_spec(c.workload).objectives
    preference = Preference(objectives[0].name)
    fronts = {f.problem_id: f for f in campaign_fronts(store, c, objectives, preference)} if len(objectives) > 1 else {}
    for index, problem in enumerate(data.problems):
        key, problem_id = str(problem.id), problem.id
        rows = data.problem_rows[problem_id]
        searched = [r for r in rows if r.finished and not r.baseline]
        best = data.best_of(searched)  # only a finished trial is measured: the best of the trials not baselines
        title = _problem_title(problem)
        heading = f"Problem: {title}"  # its kind and parameters name it; its id would say nothing
        front = ""
        if problem_id in fronts:
            shown = front_section(fronts[problem_id], objectives, preference, list(data.knobs))
            front = f'<h3 class="front">Pareto front</h3>{shown}'
        body.append(
            f'<section class="problem" id="problem-{esc(key)}" data-index="{index}"><h2>{esc(heading)}</h2>'
            f"{_glance(data, rows, searched, best)}"
            f"{history_note(data, [h for h in data.history if h[1] == problem_id])}{front}"
            f'<h3 class="convergence">Convergence</h3>{convergence(data, rows, searched, best, key)}'
            f'<h3 class="best">Best configurations</h3>{best_table(data, rows, data.ranked[problem_id])}'
            f"{baseline_table(data, rows)}"
            f'<h3 class="knobs">Effect of each knob</h3>{knob_section(data, rows, best, key)}'
            "</section>"
        )
    body.append(f'<section id="trials"><h2>Trials by state</h2>{states_section(data)}</section>')
    body.append(f'<section id="every-trial"><h2>Every trial</h2>{all_trials_section(data)}</section>')
    body.append(f'<section id="errors"><h2>Errors by reason</h2>{errors_section(data)}</section>')
    body.append(f'<section id="campaign"><h2>Campaign</h2>{campaign_section(data)}</section>')
    generated = utcnow().isoformat(sep=" ", timespec="seconds")
    body.append(f"<footer>Generated by <code>fleet report</code> at {esc(generated)} UTC.</footer>")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        f"img-src data:; script-src '{SCRIPT_HASH}'\">"
        f"<title>Fleet report: {esc(c.name)}</title><style>{STYLE}</style></head>"
        f"<body><main>{''.join(body)}</main><script>{SCRIPT}</script></body></html>\n"
    )
