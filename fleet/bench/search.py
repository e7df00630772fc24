"""``fleet bench search``: how good each search strategy is, on recorded tuning spaces.

Scores follow the methodology of Willemsen, van Nieuwpoort and van Werkhoven, "A methodology for comparing
optimization algorithms for auto-tuning", FGCS 2024 (doi:10.1016/j.future.2024.05.021), as its software
package (AutoTuningAssociation/autotuning_methodology: ``baseline.py`` ``RandomSearchCalculatedBaseline`` and
``get_standardised_curves``, ``searchspace_statistics.py`` ``objective_performance_at_cutoff_point`` and
``total_time_mean_per_feval``) implements it:

- the baseline B(t) is random search without replacement, *calculated*: the expected best time after the
  number of draws that time t buys;
- the score at time t is (B(t) - F(t)) / (B(t) - optimum), F(t) the best time the strategy found by t: 0 is
  as good as random search, 1 is the optimum, below 0 is worse than random search;
- it is averaged over equidistant time points up to the cutoff, the time random search is expected to reach
  optimum + 5% of (median - optimum) (the package's ``cutoff_percentile`` 0.95), then over repeats.

Where we differ, on purpose: the package takes the expected *rank* of the best of M draws,
round(M (N + 1) / (M + 1)), and looks its value up; we take the expected *value* exactly, from the order
statistics (see :func:`expected_best`), with the invalid configurations among the draws (they cost time and
find nothing). So the time per draw is the mean simulated cost of one recorded configuration, valid or not (the
package's ``total_time_mean_per_feval`` adds the invalid fraction times the mean invalid cost to the mean valid
cost instead), and that cost is the simulator's: recorded compile + benchmark time plus a fixed overhead
(:data:`fleet.replay.OVERHEAD_S`). With N evaluation slots random search draws N times as fast, (N - 1) / 2
draws behind (see :func:`baseline`); with one slot that is the methodology's own baseline. Before a
strategy (or random search, in the rare case that all its draws are invalid) has found a valid configuration,
its best counts as the mean valid time: what one blind draw is expected to give.

Alongside, per strategy: the median number of evaluations and of simulated seconds to reach within 5% of the
optimum (a time <= 1.05 x optimum; a run that ends before counts as never, and a median of never prints as
"not reached"), next to what random search is expected to need for the same. Runs end at the scoring cutoff
unless ``--horizon`` says to go on (see :data:`HORIZON`).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from fleet.errors import SpecError
from fleet.replay import OVERHEAD_S, Evaluation, RecordedSpace, load_recorded, recorded_files, resolve_space, simulate
from fleet.search import STRATEGIES, make_searcher

CUTOFF = 0.05
"""Score up to the time random search is expected to reach optimum + CUTOFF x (median - optimum)."""

NEAR = 0.05
""""Within 5% of the optimum": a time <= (1 + NEAR) x optimum."""

POINTS = 100
"""Equidistant time points the score is averaged over."""

HORIZON = 0.0
"""Each run goes on until the scoring cutoff, or HORIZON times the time random search is expected to need to get
within 5% of the optimum if that is later (a run that is past the cutoff and within 5% of the optimum stops). 0 by
default: model-based searchers cost more per proposal the more runs they have seen, and thousands of runs each
would take a full benchmark from minutes to hours."""


# -- the calculated baseline --------------------------------------------------------------------------------


def expected_best(valid: Sequence[float], total: int, draws: float, fallback: float | None = None) -> float:
    """The expected best valid time among ``draws`` draws without replacement from ``total`` configurations.

    Sort the valid times v_1 <= ... <= v_V and rank the ``total - V`` invalid configurations after them. The
    best valid time drawn is v_i exactly when rank i is drawn and ranks 1 .. i-1 are not: C(N - i, D - 1) of
    the C(N, D) equally likely sets of D draws. So

        E[best] = sum_i v_i C(N - i, D - 1) / C(N, D)  +  P(no valid) x fallback,
        P(no valid) = C(N - V, D) / C(N, D),

    computed with p_1 = D / N and p_{i+1} = p_i (N - i - D + 1) / (N - i). With no invalid configurations
    (N = V) it is the plain expected minimum of D draws from the valid times. A fractional ``draws`` (a time
    between two draws) interpolates linearly between its neighbours.

    Parameters
    ----------
    valid:
        The valid times, sorted ascending.
    total:
        Configurations to draw from, valid or not (>= len(valid)).
    draws:
        How many draws, clamped to [1, total].
    fallback:
        What counts as the best when no valid configuration was drawn; default the mean valid time.
    """
    if fallback is None:
        fallback = statistics.fmean(valid)
    draws = min(max(draws, 1.0), float(total))
    low = math.floor(draws)
    if draws > low:
        weight = draws - low
        return (1 - weight) * _expected_best(valid, total, low, fallback) + weight * _expected_best(
            valid, total, low + 1, fallback
        )
    return _expected_best(valid, total, low, fallback)


def _expected_best(valid: Sequence[float], total: int, draws: int, fallback: float) -> float:
    n, d, count = total, draws, len(valid)
    p = d / n
    mass = expected = 0.0
    for i in range(1, count + 1):
        expected += valid[i - 1] * p
        mass += p
        # p_i only shrinks with i: once it is negligible, so is the rest of the sum.
        if p < 1e-18 or i == n:
            break
        p *= (n - i - d + 1) / (n - i)
    none = _no_valid(n, count, d)
    # The sum of the p_i plus P(no valid) is 1; renormalising absorbs the rounding and the tail left out.
    return (expected + none * fallback) / (mass + none) if mass + none > 0 else fallback


def _no_valid(total: int, valid: int, draws: int) -> float:
    """C(total - valid, draws) / C(total, draws)."""
    if draws > total - valid:
        return 0.0
    return math.exp(
        math.lgamma(total - valid + 1)
        - math.lgamma(total - valid - draws + 1)
        - math.lgamma(total + 1)
        + math.lgamma(total - draws + 1)
    )


def expected_draws_to_reach(good: int, total: int) -> float:
    """Expected draws without replacement from ``total`` until the first of ``good`` marked ones: (N+1)/(m+1)."""
    return (total + 1) / (good + 1)


@dataclass(frozen=True)
class Baseline:
    """Random search, calculated, on one recorded space with a number of slots.

    Parameters
    ----------
    optimum, median, mean:
        Of the valid times.
    target:
        optimum + CUTOFF x (median - optimum).
    draw_s:
        Mean simulated cost of one random draw (valid or not).
    slots:
        Evaluation slots; random search draws ``slots`` times as fast.
    draws_to_cutoff:
        The fewest draws whose expected best reaches ``target``.
    budget_s:
        The time those draws take: where scoring stops.
    times, best:
        The equidistant time points and B(t) at each.
    near:
        (1 + NEAR) x optimum.
    random_evals_to_near, random_time_to_near_s:
        What random search is expected to need to get within 5% of the optimum.
    horizon_s:
        How long each run goes on: the later of ``budget_s`` and ``horizon`` x ``random_time_to_near_s``.
    """

    optimum: float
    median: float
    mean: float
    target: float
    draw_s: float
    slots: int
    draws_to_cutoff: int
    budget_s: float
    times: tuple[float, ...]
    best: tuple[float, ...]
    near: float
    random_evals_to_near: float
    random_time_to_near_s: float
    horizon_s: float


def baseline(
    recorded: RecordedSpace,
    slots: int = 1,
    *,
    horizon: float = HORIZON,
    overhead_s: float = OVERHEAD_S,
    points: int = POINTS,
) -> Baseline:
    """The calculated random-search baseline of ``recorded``; see the module docstring.

    Parameters
    ----------
    recorded:
        The space.
    slots:
        Evaluation slots.
    horizon:
        Runs go on until this many times the time random search is expected to need to get within 5% of the
        optimum, if that is later than the scoring cutoff.
    overhead_s:
        The simulator's per-evaluation overhead, part of each draw's cost.
    points:
        Time points to score at.
    """
    valid, total = recorded.valid_times, recorded.size
    optimum, median, mean = valid[0], recorded.median, recorded.mean
    target = optimum + CUTOFF * (median - optimum)
    # The expected best only falls as draws grow: bisect for the first draw count that reaches the target.
    low, high = 1, total
    while low < high:
        middle = (low + high) // 2
        if expected_best(valid, total, middle, mean) <= target:
            high = middle
        else:
            low = middle + 1
    draw_s = recorded.mean_cost_s(overhead_s)
    # With one slot, t buys t / draw_s draws, as in the methodology. N slots draw N times as fast, but a run
    # that started N at once has about N/2 of them unfinished at any time, where one slot has 1/2: they count
    # (N - 1) / 2 draws behind, or random search itself would score below 0 on many slots.
    lag = (slots - 1) / 2
    budget_s = (low + lag) * draw_s / slots
    times = tuple(budget_s * j / points for j in range(1, points + 1))
    best = tuple(expected_best(valid, total, slots * t / draw_s - lag, mean) for t in times)
    near = (1 + NEAR) * optimum
    random_evals = expected_draws_to_reach(sum(1 for v in valid if v <= near), total)
    random_time = (random_evals + lag) * draw_s / slots
    return Baseline(
        optimum=optimum,
        median=median,
        mean=mean,
        target=target,
        draw_s=draw_s,
        slots=slots,
        draws_to_cutoff=low,
        budget_s=budget_s,
        times=times,
        best=best,
        near=near,
        random_evals_to_near=random_evals,
        random_time_to_near_s=random_time,
        horizon_s=max(budget_s, horizon * random_time),
    )


# -- scoring ---------------------------------------------------------------------------------------------------


def score(trace: Sequence[Evaluation], base: Baseline) -> float:
    """The methodology's score of one run: the mean over the time points of (B(t) - F(t)) / (B(t) - optimum).

    Parameters
    ----------
    trace:
        The run's evaluations in finishing order (as :func:`fleet.replay.simulate` returns them).
    base:
        The baseline of the same space and slots.
    """
    found, index, total, counted = base.mean, 0, 0.0, 0
    for t, b in zip(base.times, base.best, strict=True):
        while index < len(trace) and trace[index].clock_s <= t:
            value = trace[index].time_ms
            if value is not None and value < found:
                found = value
            index += 1
        if b > base.optimum:  # a baseline already at the optimum leaves nothing to score against
            total += (b - found) / (b - base.optimum)
            counted += 1
    return total / counted if counted else 0.0


def reach(trace: Sequence[Evaluation], threshold: float) -> tuple[int, float] | None:
    """(evaluations, simulated seconds) until the first time <= ``threshold``, or None if never."""
    for index, evaluation in enumerate(trace, 1):
        if evaluation.time_ms is not None and evaluation.time_ms <= threshold:
            return index, evaluation.clock_s
    return None


def _median(values: Iterable[float]) -> float | None:
    # A run that never got there counts as infinitely long; a median that is infinite is "not reached".
    middle = statistics.median(values)
    return None if math.isinf(middle) else middle


# -- running ---------------------------------------------------------------------------------------------------


def default_strategies(recorded: RecordedSpace) -> list[str]:
    """Every registered strategy but grid that can be built with no options."""
    names = []
    for name in STRATEGIES:
        if name == "grid":
            continue
        try:
            make_searcher(name, recorded.space)
        except Exception:  # it needs options that a benchmark cannot guess
            continue
        names.append(name)
    return names


@dataclass(frozen=True)
class Outcome:
    """One run of one strategy on one space, scored.

    Parameters
    ----------
    reached:
        (evaluations, simulated seconds) to get within 5% of the optimum, or None.
    trace:
        Its evaluations as JSON lines, when asked for.
    error:
        What the strategy raised, if it failed.
    """

    space: str
    strategy: str
    repeat: int
    score: float | None
    reached: tuple[int, float] | None
    evals: int
    trace: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Variant:
    """A strategy with options, under a label of its own (``auto init=20``).

    Parameters
    ----------
    label:
        What the report calls it.
    strategy:
        A key of :data:`fleet.search.STRATEGIES`.
    options:
        The strategy's options.
    """

    label: str
    strategy: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, strategy: str, **options: Any) -> Variant:
        label = " ".join([strategy, *(f"{k}={v}" for k, v in options.items())])
        return cls(label, strategy, tuple(options.items()))


def run_once(
    path: Path,
    strategy: str | Variant,
    repeat: int,
    base: Baseline,
    with_trace: bool = False,
    history: Mapping[str, Any] | None = None,
) -> Outcome:
    """Run ``strategy`` with seed ``repeat`` on the recorded space at ``path`` and score it.

    Parameters
    ----------
    path:
        The recorded space (loaded once per process).
    strategy:
        A key of :data:`fleet.search.STRATEGIES`, or a :class:`Variant` of one.
    repeat:
        The run's number, also its seed.
    base:
        The space's baseline, with the slots and horizon to use.
    with_trace:
        Return every evaluation as JSON lines.
    history:
        What a variant whose ``history`` option is True gets instead: the space's transferred configurations
        (see :mod:`fleet.bench.transfer`); None for none (the variant then runs without history).
    """
    recorded = load_recorded(path)
    variant = strategy if isinstance(strategy, Variant) else Variant(strategy, strategy)
    strategy = variant.label
    reached = False

    def enough(evaluation: Evaluation) -> bool:
        # Past the scoring cutoff, a run only goes on to find out when it gets within 5% of the optimum.
        nonlocal reached
        reached = reached or (evaluation.time_ms is not None and evaluation.time_ms <= base.near)
        return reached and evaluation.clock_s >= base.budget_s

    try:
        options = dict(variant.options)
        if options.get("history") is True:
            options["history"] = history
        searcher = make_searcher(variant.strategy, recorded.space, seed=repeat, options=options)
        trace = simulate(recorded, searcher, slots=base.slots, horizon_s=base.horizon_s, stop=enough)
    except Exception as error:  # one broken strategy must not sink the others' results
        return Outcome(recorded.name, strategy, repeat, None, None, 0, error=f"{type(error).__name__}: {error}")
    lines = ""
    if with_trace:
        lines = "".join(
            json.dumps(
                {
                    "space": recorded.name,
                    "strategy": strategy,
                    "repeat": repeat,
                    "config": e.config,
                    "time_ms": e.time_ms,
                    "clock_s": e.clock_s,
                }
            )
            + "\n"
            for e in trace
        )
    return Outcome(recorded.name, strategy, repeat, score(trace, base), reach(trace, base.near), len(trace), lines)


def summarize(outcomes: Sequence[Outcome], base: Baseline) -> dict[str, Any]:
    """One row of the report: a strategy's outcomes on one space over its repeats.

    Parameters
    ----------
    outcomes:
        Every repeat of one strategy on one space.
    base:
        That space's baseline.
    """
    first = outcomes[0]
    row: dict[str, Any] = {
        "space": first.space,
        "strategy": first.strategy,
        "score": None,
        "evals_to_5pct": None,
        "time_to_5pct_s": None,
    }
    errors = [o.error for o in outcomes if o.error]
    if errors:
        return {**row, "error": errors[0], "repeats": len(outcomes)}
    scores = [o.score for o in outcomes if o.score is not None]
    reached = [o.reached for o in outcomes]
    return {
        **row,
        "score": statistics.fmean(scores),
        "evals_to_5pct": _median(r[0] if r else math.inf for r in reached),
        "time_to_5pct_s": _median(r[1] if r else math.inf for r in reached),
        "score_std": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "score_sem": statistics.stdev(scores) / math.sqrt(len(scores)) if len(scores) > 1 else 0.0,
        "reached_5pct": sum(1 for r in reached if r) / len(reached),
        "random_evals_to_5pct": base.random_evals_to_near,
        "random_time_to_5pct_s": base.random_time_to_near_s,
        "budget_s": base.budget_s,
        "horizon_s": base.horizon_s,
        "evals": statistics.median(o.evals for o in outcomes),
        "repeats": len(outcomes),
        "slots": base.slots,
    }


def run(
    spaces: Sequence[Path],
    strategies: Sequence[str | Variant] | None = None,
    *,
    repeats: int = 10,
    slots: int = 1,
    horizon: float = HORIZON,
    jobs: int = 1,
    trace: IO[str] | None = None,
    progress: bool = True,
    histories: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Baseline]]:
    """Score ``strategies`` (default: :func:`default_strategies`) on each recorded space.

    Parameters
    ----------
    spaces:
        Recorded space files.
    strategies:
        Strategy names or :class:`Variant` s; None for the default set of each space.
    repeats:
        Runs per strategy and space, seeded 0 .. repeats-1.
    slots:
        Evaluation slots.
    horizon:
        See :func:`baseline`.
    jobs:
        Processes to run in; 1 runs in this one (and sees strategies registered at run time, as tests do).
    trace:
        Where to write every evaluation as a JSON line, if anywhere.
    progress:
        Show a progress bar on stderr.
    histories:
        Per space name, the history that variants with ``history=True`` get (see :func:`run_once`).
    """
    from tqdm import tqdm

    plans: list[tuple[Path, str, Variant, int]] = []
    bases: dict[str, Baseline] = {}
    for path in spaces:
        recorded = load_recorded(path)
        bases[recorded.name] = baseline(recorded, slots, horizon=horizon)
        names = list(strategies) if strategies else default_strategies(recorded)
        variants = [n if isinstance(n, Variant) else Variant(n, n) for n in names]
        plans += [(path, recorded.name, variant, repeat) for variant in variants for repeat in range(repeats)]
    outcomes: dict[tuple[str, str, int], Outcome] = {}

    def done(outcome: Outcome, bar: Any) -> None:
        outcomes[outcome.space, outcome.strategy, outcome.repeat] = outcome
        if trace is not None and outcome.trace:
            trace.write(outcome.trace)
        bar.set_postfix_str(f"{outcome.space} {outcome.strategy}", refresh=False)
        bar.update()

    known = dict(histories or {})
    jobs = max(1, min(jobs, len(plans)))
    with tqdm(total=len(plans), desc="bench search", unit="run", file=sys.stderr, disable=not progress) as bar:
        if jobs == 1:
            for path, name, variant, repeat in plans:
                done(run_once(path, variant, repeat, bases[name], trace is not None, known.get(name)), bar)
        else:
            # Spawned, not forked: the parent may hold threads (tqdm's monitor) whose locks a fork would copy.
            # The slowest runs (model-based searchers on the spaces with the longest horizon) go first, so that
            # the pool does not end waiting on one of them.
            context = multiprocessing.get_context("spawn")
            ordered = sorted(plans, key=lambda plan: -bases[plan[1]].draws_to_cutoff)
            with ProcessPoolExecutor(jobs, mp_context=context) as pool:
                futures = [
                    pool.submit(run_once, path, variant, repeat, bases[name], trace is not None, known.get(name))
                    for path, name, variant, repeat in ordered
                ]
                for future in as_completed(futures):
                    done(future.result(), bar)
    rows = []
    for key in dict.fromkeys((name, variant.label) for _, name, variant, _ in plans):
        mine = [outcomes[(*key, repeat)] for repeat in range(repeats)]
        rows.append(summarize(mine, bases[key[0]]))
    return rows, bases


def averages(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy, the mean score over the spaces where it ran without error (``space`` is "average")."""
    by_strategy: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_strategy.setdefault(row["strategy"], []).append(row)
    result = []
    for name, mine in by_strategy.items():
        scored = [r for r in mine if r["score"] is not None]
        result.append(
            {
                "space": "average",
                "strategy": name,
                "score": statistics.fmean(r["score"] for r in scored) if scored else None,
                "evals_to_5pct": None,
                "time_to_5pct_s": None,
                "reached_5pct": statistics.fmean(r["reached_5pct"] for r in scored) if scored else None,
                "spaces": len(scored),
                "errors": len(mine) - len(scored),
            }
        )
    return result


# -- leave one space out ---------------------------------------------------------------------------------------

CV_REPEATS = 20
"""Repeats per strategy and space in ``--cv``."""

CANDIDATES: tuple[Variant, ...] = (Variant.of("auto", init=10), Variant.of("auto", init=20))
"""What ``auto`` tunes, as ``--cv`` chooses among: the size of its first design."""


def choose(scores: Mapping[str, Mapping[str, float]], held_out: str) -> str:
    """The candidate with the best mean score over every space but ``held_out``; a tie goes to the first.

    Parameters
    ----------
    scores:
        Candidate label -> space -> mean score.
    held_out:
        The space left out.
    """
    best, best_mean = "", -math.inf
    for label, by_space in scores.items():
        others = [value for space, value in by_space.items() if space != held_out]
        mean = statistics.fmean(others) if others else -math.inf
        if mean > best_mean:
            best, best_mean = label, mean
    return best


def cross_validate(
    rows: Sequence[dict[str, Any]], candidates: Sequence[str], compared: Sequence[str]
) -> list[dict[str, Any]]:
    """Leave one space out: for each space, the candidate chosen on the others (:func:`choose`) and its score on
    the one left out, beside each compared strategy's score there; then the mean and the worst over the spaces.

    Parameters
    ----------
    rows:
        :func:`summarize` rows of every candidate and compared strategy on every space.
    candidates:
        Labels of the candidates.
    compared:
        Labels of the strategies to show beside (random search first).
    """
    by_key = {(row["space"], row["strategy"]): row for row in rows}
    spaces = list(dict.fromkeys(row["space"] for row in rows))
    scores: dict[str, dict[str, float]] = {}
    for label in candidates:
        scores[label] = {}
        for space in spaces:
            value = by_key[space, label]["score"]
            if value is None:
                raise SpecError(f"{label} failed on {space}: {by_key[space, label].get('error')}")
            scores[label][space] = value
    result = []
    for space in spaces:
        chosen = choose(scores, space)
        held = by_key[space, chosen]
        row = {"space": space, "chosen": chosen, "score": held["score"], "score_sem": held["score_sem"]}
        row["repeats"] = held["repeats"]
        row["compared"] = {
            name: {"score": by_key[space, name]["score"], "score_sem": by_key[space, name].get("score_sem")}
            for name in compared
        }
        result.append(row)
    summary: dict[str, Any] = {"space": "mean", "spaces": len(result)}
    summary["score"] = statistics.fmean(r["score"] for r in result)
    summary["worst"] = min(r["score"] for r in result)
    summary["compared"] = {}
    for name in compared:
        values = [r["compared"][name]["score"] for r in result]
        known = [v for v in values if v is not None]
        summary["compared"][name] = {
            "score": statistics.fmean(known) if known else None,
            "worst": min(known) if known else None,
        }
    summary["in_sample"] = {label: statistics.fmean(scores[label].values()) for label in candidates}
    return [*result, summary]


def _cv_table(result: Sequence[dict[str, Any]], compared: Sequence[str]) -> list[str]:
    rows, summary = result[:-1], result[-1]
    width = max(len("space"), *(len(r["space"]) for r in rows))
    chosen_width = max(len("chosen"), *(len(r["chosen"]) for r in rows))

    def cell(value: float | None, sem: float | None) -> str:
        if value is None:
            return f"{'failed':>15}"
        return f"{value:>7.3f} ± {sem:.3f}" if sem is not None else f"{value:>15.3f}"

    lines = [
        f"  {'space':<{width}}  {'chosen on the others':<{chosen_width}}  {'auto held out':>15}"
        + "".join(f"  {name:>15}" for name in compared)
    ]
    for r in rows:
        lines.append(
            f"  {r['space']:<{width}}  {r['chosen']:<{chosen_width}}  {cell(r['score'], r['score_sem'])}"
            + "".join(f"  {cell(r['compared'][n]['score'], r['compared'][n]['score_sem'])}" for n in compared)
        )
    for what in ("score", "worst"):
        shown = "mean" if what == "score" else "worst"
        values = [summary["compared"][n][what] for n in compared]
        lines.append(
            f"  {shown:<{width}}  {'':<{chosen_width}}  {summary[what]:>7.3f}        "
            + "".join(f"  {v:>7.3f}        " if v is not None else f"  {'-':>15}" for v in values)
        )
    return lines


# -- the command -----------------------------------------------------------------------------------------------


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "not reached"
    return f"{value:.0f}{unit}" if value >= 100 else f"{value:.1f}{unit}"


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    width = max([len("strategy"), *(len(r["strategy"]) for r in rows)])
    lines = [
        f"  {'strategy':<{width}}  {'score':>7}  {'± se':>6}  {'evals to 5%':>11}  {'time to 5%':>11}  {'reached':>7}"
    ]
    for r in rows:
        if r["score"] is None:
            lines.append(f"  {r['strategy']:<{width}}  failed: {r.get('error', '')}")
            continue
        lines.append(
            f"  {r['strategy']:<{width}}  {r['score']:>7.3f}  {r['score_sem']:>6.3f}  "
            f"{_number(r['evals_to_5pct']):>11}  {_number(r['time_to_5pct_s'], ' s'):>11}  {r['reached_5pct']:>7.0%}"
        )
    return lines


def _average_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    width = max([len("strategy"), *(len(r["strategy"]) for r in rows)])
    lines = [f"  {'strategy':<{width}}  {'score':>7}  {'reached 5%':>10}  {'spaces':>6}"]
    for r in rows:
        shown = f"{r['score']:>7.3f}  {r['reached_5pct']:>10.0%}" if r["score"] is not None else f"{'-':>7}  {'-':>10}"
        lines.append(f"  {r['strategy']:<{width}}  {shown}  {r['spaces']:>6}")
    return lines


def _spaces(values: Sequence[str]) -> list[Path]:
    paths: list[Path] = []
    for value in values:
        if value == "all":
            found = recorded_files()
            if not found:
                raise SpecError("no recorded spaces (*.json.gz) found; set FLEET_TUNING_SPACES to their folder")
            paths += found
        else:
            paths.append(resolve_space(value, here_first=True))
    return list(dict.fromkeys(paths))


@click.command("search")
@click.option(
    "--space",
    "spaces",
    multiple=True,
    help="A recorded space: a path, a file name in the tuning-spaces folder, or 'all' (default with --cv). Repeatable.",
)
@click.option(
    "--strategy", "strategies", multiple=True, help="A strategy to score (default: all but grid). Repeatable."
)
@click.option(
    "--repeats", type=click.IntRange(1), help=f"Runs per strategy and space (default 10; {CV_REPEATS} with --cv)."
)
@click.option(
    "--cv",
    is_flag=True,
    help="Leave one space out: choose what auto tunes on the other spaces, score it on the one left out; "
    "random search (and each --strategy) beside it, from the same run.",
)
@click.option("--slots", type=click.IntRange(1), default=1, show_default=True, help="Evaluations in flight at once.")
@click.option(
    "--horizon",
    type=click.FloatRange(0),
    default=HORIZON,
    show_default=True,
    help="Run on to this many times random search's expected time to within 5% of the optimum.",
)
@click.option(
    "--history",
    "history",
    metavar="DIR_OR_DB",
    help="A folder of recorded spaces: score auto with history (each space's history is the other spaces of its "
    "kernel there, never itself nor its GPU) beside auto without history and random search, same seeds; or a "
    "database URL: its Kernel Tuner imports of the same kernel on other GPUs (told apart by device name).",
)
@click.option("--jobs", type=click.IntRange(1), help="Processes to run in (default: one per CPU).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {strategy, score, evals_to_5pct, ...}.")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write every evaluation of every repeat to this file as JSON lines.",
)
def search_command(
    spaces: tuple[str, ...],
    strategies: tuple[str, ...],
    repeats: int | None,
    cv: bool,
    slots: int,
    horizon: float,
    history: str | None,
    jobs: int | None,
    as_json: bool,
    trace_path: Path | None,
) -> None:
    """Score search strategies on recorded tuning spaces, as the auto-tuning methodology does.

    Each strategy runs in-process on a simulated clock: each evaluation costs its recorded compile and benchmark
    time. Score: (B(t) - F(t)) / (B(t) - optimum), averaged over time up to when random search is expected to
    reach optimum + 5% of (median - optimum), F the best the strategy found by t and B random search's
    expected best. 0 is as good as random search, 1 is the optimum.
    """
    if not spaces and not cv and history is None:
        raise SpecError("bench search needs --space (a recorded space, or 'all')")
    paths = _spaces(spaces or ("all",))
    for name in strategies:
        if name not in STRATEGIES:
            raise SpecError(f"unknown strategy {name!r} (known: {', '.join(sorted(STRATEGIES))})")
    jobs = jobs or os.cpu_count() or 1
    if history is not None:
        _history_command(paths, history, repeats or CV_REPEATS, slots, horizon, jobs, as_json, trace_path)
        return
    if cv:
        if len(paths) < 2:
            raise SpecError("--cv leaves one space out: it needs at least two spaces")
        _cross_validate_command(paths, strategies, repeats or CV_REPEATS, slots, horizon, jobs, as_json, trace_path)
        return
    repeats = repeats or 10
    with trace_path.open("w") if trace_path else contextlib.nullcontext() as trace:
        rows, bases = run(
            paths, list(strategies) or None, repeats=repeats, slots=slots, horizon=horizon, jobs=jobs, trace=trace
        )
    means = averages(rows) if len(paths) > 1 else []
    if as_json:
        click.echo(json.dumps(rows + means, indent=1))
        return
    by_space: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_space.setdefault(row["space"], []).append(row)
    for name, mine in by_space.items():
        base = bases[name]
        click.echo(
            f"{name}: optimum {base.optimum:.4g} ms, median {base.median:.4g} ms; scored over {base.budget_s:.0f} s "
            f"(random search: {base.draws_to_cutoff} draws to {base.target:.4g} ms); {repeats} repeats, "
            f"{slots} slot{'s' if slots > 1 else ''}"
        )
        for line in _table(mine):
            click.echo(line)
        click.echo(
            f"  random search (calculated): {base.random_evals_to_near:.0f} evaluations, "
            f"{base.random_time_to_near_s:.0f} s to within 5% of the optimum\n"
        )
    if means:
        click.echo(f"average over {len(by_space)} spaces")
        for line in _average_table(means):
            click.echo(line)


def _cross_validate_command(
    paths: Sequence[Path],
    strategies: Sequence[str],
    repeats: int,
    slots: int,
    horizon: float,
    jobs: int,
    as_json: bool,
    trace_path: Path | None,
) -> None:
    compared = list(dict.fromkeys(["random", *strategies]))
    variants = [*CANDIDATES, *(Variant(name, name) for name in compared)]
    started = time.monotonic()
    with trace_path.open("w") if trace_path else contextlib.nullcontext() as trace:
        rows, _ = run(paths, variants, repeats=repeats, slots=slots, horizon=horizon, jobs=jobs, trace=trace)
    result = cross_validate(rows, [c.label for c in CANDIDATES], compared)
    result[-1].update(repeats=repeats, slots=slots, wall_s=round(time.monotonic() - started, 1))
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    summary = result[-1]
    click.echo(
        f"leave one space out: {summary['spaces']} spaces, {repeats} repeats, {slots} slot{'s' if slots > 1 else ''}; "
        f"auto chosen among {', '.join(c.label for c in CANDIDATES)} by its mean score on the other spaces"
    )
    for line in _cv_table(result, compared):
        click.echo(line)
    in_sample = ", ".join(f"{label} {value:.3f}" for label, value in summary["in_sample"].items())
    click.echo(f"in sample (every space, for reference): {in_sample}")
    click.echo(f"took {summary['wall_s']:.0f} s with {jobs} process{'es' if jobs > 1 else ''}")


def _history_command(
    paths: Sequence[Path],
    history: str,
    repeats: int,
    slots: int,
    horizon: float,
    jobs: int,
    as_json: bool,
    trace_path: Path | None,
) -> None:
    from fleet.bench.transfer import RANDOM, WITH, WITHOUT, compare, histories, table

    started = time.monotonic()
    known = histories(paths, history)
    variants = [Variant(WITH, "auto", (("history", True),)), Variant(WITHOUT, "auto"), Variant(RANDOM, "random")]
    with trace_path.open("w") if trace_path else contextlib.nullcontext() as trace:
        rows, _ = run(
            paths, variants, repeats=repeats, slots=slots, horizon=horizon, jobs=jobs, trace=trace, histories=known
        )
    result = compare(rows, known)
    result[-1].update(repeats=repeats, slots=slots, wall_s=round(time.monotonic() - started, 1))
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    summary = result[-1]
    click.echo(
        f"auto with history, leave one space out: {summary['spaces']} spaces ({summary['with_related']} with a "
        f"related space), {repeats} repeats, {slots} slot{'s' if slots > 1 else ''}"
    )
    for line in table(result):
        click.echo(line)
    below = ", ".join(summary["below_auto"]) or "none"
    click.echo(f"below auto without history by more than its standard error: {below}")
    click.echo(f"took {summary['wall_s']:.0f} s with {jobs} process{'es' if jobs > 1 else ''}")
