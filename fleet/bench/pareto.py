"""``fleet bench pareto``: how well a search of several objectives finds their Pareto front, against random search.

On each recorded space, two objectives every recorded configuration holds (:data:`fleet.replay.OBJECTIVES`: the
kernel's time and its compile time, both in ms, both minimised), each strategy runs on the simulated clock of
:func:`fleet.replay.simulate`, and the hypervolume of the front it has found is taken at equidistant moments up to
the horizon: the time :data:`DRAWS` evaluations of a configuration drawn at random are expected to take.

- The hypervolume is the area the found front dominates up to a reference point a little beyond the nadir of the
  whole recorded front (:data:`MARGIN` of its range past its worst value in each objective), divided by the area
  the whole recorded front dominates: 1 is every recorded trade-off found.
- A strategy's *ratio* on a space is the area under its hypervolume-over-time curve over random search's (mean
  over the repeats of each, random search run with the same seeds): above 1 is ahead of random search.
- With ``--cv``, what nsga2 tunes (its population, :data:`CANDIDATES`) is chosen on every space but one by the
  geometric mean ratio there, and scored on the one left out, as ``fleet bench search --cv`` does for ``auto``.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fleet.bench.search import Variant, _spaces, choose
from fleet.errors import SpecError
from fleet.replay import OBJECTIVES, RecordedSpace, load_recorded, recorded_objectives, simulate
from fleet.search import make_searcher
from fleet.search.pareto import Loss, front, hypervolume_2d, loss_vector

DRAWS = 250
"""The horizon: the expected time of this many evaluations of configurations drawn at random."""

MARGIN = 0.1
"""The reference point lies this share of the recorded front's range beyond its worst value in each objective."""

POINTS = 100
"""Equidistant moments at which the hypervolume is taken."""

REPEATS = 10
"""Runs per strategy and space, seeded 0 .. REPEATS-1."""

CANDIDATES: tuple[Variant, ...] = tuple(Variant.of("nsga2", population=size) for size in (6, 10, 20, 40))
"""What ``--cv`` chooses nsga2's population among."""


@dataclass(frozen=True)
class Frame:
    """What a space's runs are scored against.

    Parameters
    ----------
    reference:
        The hypervolume's reference point.
    whole:
        The hypervolume of every recorded configuration: what a run's is divided by.
    times:
        The moments of the simulated clock at which a run's hypervolume is taken.
    """

    reference: Loss
    whole: float
    times: tuple[float, ...]


def losses_of(recorded: RecordedSpace) -> dict[tuple[Any, ...], Loss]:
    """The loss vector of every valid recorded configuration, by key."""
    return {
        key: loss_vector(recorded_objectives(record), OBJECTIVES)
        for key, record in recorded.records.items()
        if record.valid
    }


def frame(recorded: RecordedSpace, draws: int = DRAWS, points: int = POINTS) -> Frame:
    """The scoring frame of ``recorded``: reference point, whole hypervolume and moments (see the module docstring).

    Parameters
    ----------
    recorded:
        The space.
    draws:
        Random evaluations whose expected time is the horizon.
    points:
        Moments to score at.
    """
    losses = list(losses_of(recorded).values())
    best = [losses[i] for i in front(losses)]
    reference = []
    for m in range(len(OBJECTIVES)):
        low, high = min(p[m] for p in best), max(p[m] for p in best)
        # A front of one point has no range: its margin is a share of its value.
        reference.append(high + (MARGIN * (high - low) or MARGIN * abs(high) or 1.0))
    horizon = draws * recorded.mean_cost_s()
    times = tuple(horizon * j / points for j in range(1, points + 1))
    return Frame(tuple(reference), hypervolume_2d(best, tuple(reference)), times)


def curve(recorded: RecordedSpace, strategy: Variant, seed: int, scored: Frame) -> list[float]:
    """The hypervolume of what ``strategy`` found (a share of the whole recorded front's) at each moment.

    Parameters
    ----------
    recorded:
        The space.
    strategy:
        The strategy and its options.
    seed:
        Its seed.
    scored:
        The space's frame.
    """
    searcher = make_searcher(
        strategy.strategy, recorded.space, seed=seed, options=dict(strategy.options), objectives=OBJECTIVES
    )
    trace = simulate(recorded, searcher, horizon_s=scored.times[-1])
    losses = losses_of(recorded)
    found: list[Loss] = []
    values, index = [], 0
    for moment in scored.times:
        while index < len(trace) and trace[index].clock_s <= moment:
            loss = losses.get(recorded.key(trace[index].config))
            if loss is not None:
                found.append(loss)
                found = [found[i] for i in front(found)]
            index += 1
        values.append(hypervolume_2d(found, scored.reference) / scored.whole)
    return values


def _run(path: Path, strategy: Variant, seed: int) -> tuple[str, str, int, list[float] | str]:
    recorded = load_recorded(path)
    try:
        return recorded.name, strategy.label, seed, curve(recorded, strategy, seed, frame(recorded))
    except Exception as error:  # one broken strategy must not sink the others' results
        return recorded.name, strategy.label, seed, f"{type(error).__name__}: {error}"


def run(
    spaces: Sequence[Path], strategies: Sequence[Variant], *, repeats: int = REPEATS, jobs: int = 1
) -> list[dict[str, Any]]:
    """Per space and strategy (random search always among them): the mean hypervolume curve's area, its ratio to
    random search's, and the final hypervolume.

    Parameters
    ----------
    spaces:
        Recorded space files.
    strategies:
        What to score besides random search.
    repeats:
        Runs of each, seeded 0 .. repeats-1.
    jobs:
        Processes to run in.
    """
    variants = list(dict.fromkeys([Variant("random", "random"), *strategies]))
    plans = [(path, variant, seed) for path in spaces for variant in variants for seed in range(repeats)]
    if jobs > 1:
        context = multiprocessing.get_context("spawn")  # as fleet bench search: no fork of a threaded parent
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            results = list(pool.map(_run, *zip(*plans, strict=True)))
    else:
        results = [_run(*plan) for plan in plans]
    curves: dict[tuple[str, str], list[list[float] | str]] = {}
    for name, label, _, values in results:
        curves.setdefault((name, label), []).append(values)
    rows = []
    for (name, label), mine in curves.items():
        errors = [c for c in mine if isinstance(c, str)]
        areas = [statistics.fmean(c) for c in mine if not isinstance(c, str)]
        finals = [c[-1] for c in mine if not isinstance(c, str)]
        row: dict[str, Any] = {"space": name, "strategy": label, "repeats": len(mine)}
        if errors:
            row["error"] = errors[0]
        else:
            row |= {"area": statistics.fmean(areas), "final": statistics.fmean(finals)}
            row["area_sem"] = statistics.stdev(areas) / math.sqrt(len(areas)) if len(areas) > 1 else 0.0
        rows.append(row)
    for row in rows:
        random_row = next(r for r in rows if r["space"] == row["space"] and r["strategy"] == "random")
        if "area" in row and "area" in random_row:
            row["ratio"] = row["area"] / random_row["area"]
    return rows


def cross_validate(rows: Sequence[dict[str, Any]], candidates: Sequence[str]) -> list[dict[str, Any]]:
    """Leave one space out: for each space, the candidate with the best geometric mean ratio on the others (one
    space far ahead must not outweigh the rest), and its ratio on the one left out; then their geometric mean and
    the worst.

    Parameters
    ----------
    rows:
        :func:`run` rows of every candidate on every space.
    candidates:
        Labels of the candidates.
    """
    by_key = {(row["space"], row["strategy"]): row for row in rows}
    spaces = list(dict.fromkeys(row["space"] for row in rows))
    ratios: dict[str, dict[str, float]] = {}
    for label in candidates:
        ratios[label] = {}
        for space in spaces:
            row = by_key[space, label]
            if "ratio" not in row:
                raise SpecError(f"{label} failed on {space}: {row.get('error')}")
            ratios[label][space] = math.log(row["ratio"])
    result = []
    for space in spaces:
        chosen = choose(ratios, space)
        held, random_row = by_key[space, chosen], by_key[space, "random"]
        result.append(
            {
                "space": space,
                "chosen": chosen,
                "ratio": held["ratio"],
                "final": held["final"],
                "random_final": random_row["final"],
            }
        )
    summary = {
        "space": "mean",
        "ratio": statistics.geometric_mean(r["ratio"] for r in result),
        "worst": min(r["ratio"] for r in result),
        "in_sample": {label: math.exp(statistics.fmean(ratios[label].values())) for label in candidates},
    }
    return [*result, summary]


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    width = max(len("space"), *(len(r["space"]) for r in rows))
    label = max(len("strategy"), *(len(r["strategy"]) for r in rows))
    lines = [f"  {'space':<{width}}  {'strategy':<{label}}  {'ratio':>6}  {'area':>6}  {'± se':>6}  {'final hv':>8}"]
    for r in rows:
        if "error" in r:
            lines.append(f"  {r['space']:<{width}}  {r['strategy']:<{label}}  failed: {r['error']}")
            continue
        lines.append(
            f"  {r['space']:<{width}}  {r['strategy']:<{label}}  {r['ratio']:>6.3f}  {r['area']:>6.3f}  "
            f"{r['area_sem']:>6.3f}  {r['final']:>8.3f}"
        )
    return lines


def _cv_table(result: Sequence[dict[str, Any]]) -> list[str]:
    rows, summary = result[:-1], result[-1]
    width = max(len("space"), *(len(r["space"]) for r in rows))
    chosen = max(len("chosen on the others"), *(len(r["chosen"]) for r in rows))
    lines = [f"  {'space':<{width}}  {'chosen on the others':<{chosen}}  {'ratio':>6}  {'final hv':>8}  {'random':>6}"]
    for r in rows:
        lines.append(
            f"  {r['space']:<{width}}  {r['chosen']:<{chosen}}  {r['ratio']:>6.3f}  {r['final']:>8.3f}  "
            f"{r['random_final']:>6.3f}"
        )
    lines.append(f"  {'geometric mean':<{width}}  {'':<{chosen}}  {summary['ratio']:>6.3f}")
    lines.append(f"  {'worst':<{width}}  {'':<{chosen}}  {summary['worst']:>6.3f}")
    return lines


@click.command("pareto")
@click.option(
    "--space",
    "spaces",
    multiple=True,
    help="A recorded space: a path, a file name in the tuning-spaces folder, or 'all' (the default). Repeatable.",
)
@click.option(
    "--strategy", "strategies", multiple=True, help="A strategy to score beside random search (default: nsga2)."
)
@click.option("--repeats", type=click.IntRange(1), default=REPEATS, show_default=True, help="Runs per space.")
@click.option("--cv", is_flag=True, help="Leave one space out: choose nsga2's population on the others.")
@click.option("--jobs", type=click.IntRange(1), default=1, show_default=True, help="Processes to run in.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def pareto_command(
    spaces: tuple[str, ...], strategies: tuple[str, ...], repeats: int, cv: bool, jobs: int, as_json: bool
) -> None:
    """Score searches of a Pareto front (time and compile time) by hypervolume over tuning time, against random
    search, on recorded tuning spaces: a ratio above 1 is ahead of random search."""
    paths = _spaces(spaces or ("all",))
    if cv:
        if len(paths) < 2:
            raise SpecError("--cv leaves one space out: it needs at least two spaces")
        rows = run(paths, CANDIDATES, repeats=repeats, jobs=jobs)
        result = cross_validate(rows, [c.label for c in CANDIDATES])
        if as_json:
            click.echo(json.dumps(result, indent=1))
            return
        click.echo(
            f"leave one space out: {len(paths)} spaces, {repeats} repeats; hypervolume over time as a ratio to random "
            f"search's; nsga2's population chosen among {', '.join(c.label for c in CANDIDATES)} on the other spaces"
        )
        for line in _cv_table(result):
            click.echo(line)
        in_sample = ", ".join(f"{label} {value:.3f}" for label, value in result[-1]["in_sample"].items())
        click.echo(f"in sample (every space, for reference): {in_sample}")
        return
    variants = [Variant(name, name) for name in strategies or ("nsga2",)]
    rows = run(paths, variants, repeats=repeats, jobs=jobs)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"hypervolume over time (time and compile time), {repeats} repeats, as a ratio to random search's")
    for line in _table(rows):
        click.echo(line)
    if len(paths) > 1:
        for variant in variants:
            mine = [r["ratio"] for r in rows if r["strategy"] == variant.label and "ratio" in r]
            if mine:
                mean = statistics.geometric_mean(mine)
                click.echo(f"{variant.label}: geometric mean ratio {mean:.3f}, worst {min(mine):.3f}")
