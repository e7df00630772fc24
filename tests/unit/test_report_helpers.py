"""The report's choices for large campaigns: which dots a chart draws, which values a long knob's table shows."""

from __future__ import annotations

from fleet.report import KNOB_VALUES, TOP, KnobValue, dots_shown, knob_rows


def test_few_values_are_all_drawn() -> None:
    assert dots_shown([3.0, 1.0, 2.0], 3, maximize=False) == [0, 1, 2]
    assert dots_shown([], 5, maximize=False) == []


def test_many_values_give_an_even_subset_with_every_improvement_and_the_worst() -> None:
    values = [float(100 - i % 50) for i in range(1000)]  # improves at 0..49, worst (100) at 0, 50, 100, ...
    values[777] = 500.0  # the worst, off the even grid
    values[901] = 0.5  # a late improvement, off the grid too

    shown = dots_shown(values, 10, maximize=False)

    assert shown == sorted(set(shown))
    assert {0, 999} <= set(shown)  # the even grid spans the whole series
    assert set(range(50)) <= set(shown) and {777, 901} <= set(shown)
    assert len(shown) <= 10 + 50 + 2
    # Every value that beat all before it is drawn: the step line's corners all have their dot.
    best = values[0]
    for index, value in enumerate(values):
        if value < best:
            best = value
            assert index in shown
    assert dots_shown(values, 10, maximize=False) == shown  # deterministic


def test_the_worst_is_drawn_for_a_maximised_objective_too() -> None:
    values = [10.0] * 500
    values[250] = -3.0
    shown = dots_shown(values, 4, maximize=True)
    assert 250 in shown and 0 in shown and len(shown) == 5


def entries(count: int, measured: int) -> list[KnobValue]:
    """``count`` values, the first ``measured`` with median ``100 - value`` (value 99 is the best for a minimum)."""
    return [(v, 1, float(100 - v), float(100 - v)) if v < measured else (v, 0, None, None) for v in range(count)]


def test_a_knob_of_few_values_shows_them_all_in_order() -> None:
    values = entries(KNOB_VALUES, KNOB_VALUES)
    assert knob_rows(values, maximize=False) == (values, [], 0)


def test_a_knob_of_many_values_shows_the_best_and_the_worst_medians() -> None:
    head, tail, hidden = knob_rows(entries(1000, 100), maximize=False)

    assert [v for v, *_ in head] == list(range(99, 99 - TOP, -1))  # lowest medians first
    assert [v for v, *_ in tail] == list(range(TOP - 1, -1, -1))  # the worst last
    assert hidden == 1000 - 2 * TOP  # the unmeasured values are among those not shown

    head, tail, hidden = knob_rows(entries(1000, 100), maximize=True)
    assert [v for v, *_ in head] == list(range(TOP))
    assert [v for v, *_ in tail][-1] == 99


def test_a_long_knob_with_few_measured_values_shows_each_once() -> None:
    head, tail, hidden = knob_rows(entries(1000, TOP + 3), maximize=False)
    assert len(head) == TOP and len(tail) == 3 and hidden == 1000 - TOP - 3
    assert not {v for v, *_ in head} & {v for v, *_ in tail}
