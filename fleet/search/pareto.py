"""Several objectives: Pareto dominance, NSGA-II's non-dominated sorting and crowding distance, the front of a set
of runs, and the exact hypervolume of a front in two dimensions.

Plain functions over *loss vectors*: one number per objective, every one minimised (a larger-is-better objective
is negated), ``inf`` where a run gave no valid value. Deb, Pratap, Agarwal and Meyarivan, "A fast and elitist
multiobjective genetic algorithm: NSGA-II", IEEE TEC 6(2), 2002, define the sorting and the crowding distance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.objective import Objective as Objective  # its home: the searchers import it from here too

Loss = tuple[float, ...]


def loss_vector(values: Mapping[str, Any], objectives: Sequence[Objective]) -> Loss:
    """The loss vector of one run's objective values: each negated where larger is better, inf where missing.

    Parameters
    ----------
    values:
        The run's value of each objective, by name.
    objectives:
        The campaign's objectives, in order.
    """
    losses = []
    for objective in objectives:
        value = values.get(objective.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            losses.append(math.inf)
        else:
            losses.append(-float(value) if objective.maximize else float(value))
    return tuple(losses)


def dominates(a: Loss, b: Loss) -> bool:
    """Whether ``a`` is no worse than ``b`` in every objective and better in one."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


def finite(loss: Loss) -> bool:
    return all(math.isfinite(x) for x in loss)


def non_dominated_sort(losses: Sequence[Loss]) -> list[list[int]]:
    """NSGA-II's fast non-dominated sort: the indices of ``losses`` by front, the first front first.

    The first front is every point no other dominates; the second, those only the first's dominate; and so on.
    Equal points share a front. O(M N^2) for N points of M objectives: for a population, not a whole campaign
    (:func:`front` is for those).
    """
    count = len(losses)
    dominated: list[list[int]] = [[] for _ in range(count)]  # the points each one dominates
    beaten = [0] * count  # how many points dominate each one
    for i in range(count):
        for j in range(i + 1, count):
            if dominates(losses[i], losses[j]):
                dominated[i].append(j)
                beaten[j] += 1
            elif dominates(losses[j], losses[i]):
                dominated[j].append(i)
                beaten[i] += 1
    fronts = [[i for i in range(count) if beaten[i] == 0]]
    while True:
        following = []
        for i in fronts[-1]:
            for j in dominated[i]:
                beaten[j] -= 1
                if beaten[j] == 0:
                    following.append(j)
        if not following:
            return fronts if fronts[0] else []
        fronts.append(sorted(following))


def crowding_distance(losses: Sequence[Loss]) -> list[float]:
    """NSGA-II's crowding distance of each point of one front: per objective, the gap between its two neighbours
    in that objective over the front's range, summed; inf for the ends of each objective's range, which keeps
    them (a front of one or two points is all ends)."""
    count = len(losses)
    if count == 0:
        return []
    distance = [0.0] * count
    for m in range(len(losses[0])):
        order = sorted(range(count), key=lambda i: (losses[i][m], i))
        low, high = losses[order[0]][m], losses[order[-1]][m]
        distance[order[0]] = distance[order[-1]] = math.inf
        if high == low:
            continue
        for position in range(1, count - 1):
            gap = losses[order[position + 1]][m] - losses[order[position - 1]][m]
            distance[order[position]] += gap / (high - low)
    return distance


def front(losses: Sequence[Loss]) -> list[int]:
    """The indices of the non-dominated points among ``losses`` (points with an inf left out), in the order of the
    first objective; of equal points, the first. O(N log N + N F) for a front of F points: fit for every run of a
    campaign."""
    order = sorted((i for i, loss in enumerate(losses) if finite(loss)), key=lambda i: (losses[i], i))
    kept: list[int] = []
    for i in order:
        # Sorted lexicographically, no later point dominates an earlier one: only the kept ones can dominate i.
        if not any(losses[k] == losses[i] or dominates(losses[k], losses[i]) for k in kept):
            kept.append(i)
    return kept


def hypervolume_2d(losses: Sequence[Loss], reference: Loss) -> float:
    """The area that the points of ``losses`` dominate and ``reference`` bounds, exactly: the hypervolume of their
    front in two dimensions. Points no better than the reference in both objectives add nothing.

    Parameters
    ----------
    losses:
        Points of two objectives, both minimised.
    reference:
        The corner that bounds the area (a nadir point, usually a little beyond the worst values).
    """
    rx, ry = reference
    inside = sorted((x, y) for x, y in losses if x < rx and y < ry)
    area, lowest = 0.0, ry
    for x, y in inside:  # by x ascending: each point that lowers y adds the strip from x to the reference
        if y < lowest:
            area += (rx - x) * (lowest - y)
            lowest = y
    return area
