"""Model-based search with Optuna's samplers (TPE by default), through its ask-and-tell interface.

Optuna is optional (``pip install fleet-tune[search]``) and imported only when this strategy is built.
"""

from __future__ import annotations

import importlib.util
import math
import random
import warnings
from typing import Any

from fleet.errors import SpecError
from fleet.extras import install_line
from fleet.search.points import Grid, History, Point, Technique, TechniqueSearcher
from fleet.space import Space

SAMPLERS = {"tpe": None, "random": None, "qmc": "scipy", "cmaes": "cmaes", "gp": "torch"}
"""Optuna's samplers by name, with the package each needs besides Optuna."""


def load_optuna() -> Any:
    """The optuna module, or a :class:`SpecError` that says how to install it."""
    try:
        import optuna
    except ImportError:
        raise SpecError(f"strategy 'optuna' needs Optuna, which is not installed: {install_line('optuna')}") from None
    return optuna


class OptunaSearch(TechniqueSearcher):
    """Ask Optuna's sampler for configurations and tell it the runs; in memory, never a database.

    Each knob is a parameter: the index of its value, as an integer for a numeric knob (so the sampler sees
    the order of its values) and as a category otherwise. A sample that the space rules out, or that was
    measured already, is told to Optuna as failed, and a new configuration one knob away from it (else a random
    one) is measured in its place and added to the study when it comes back. A failed run is told as the worst
    objective seen so far.

    N evaluation slots: N asked trials pending at once. The TPE sampler is built with ``constant_liar``, so
    trials in flight count as poor results and the N pending samples spread out instead of piling up.

    Parameters
    ----------
    sampler:
        ``tpe`` (default), ``random``, or, with the package each needs, ``qmc`` (scipy), ``cmaes`` (cmaes) or
        ``gp`` (torch).
    startup:
        Random samples before the model takes over (TPE's and GP's ``n_startup_trials``); Optuna's default
        when None.
    """

    name = "optuna"

    def __init__(
        self,
        space: Space | None = None,
        *,
        sampler: str = "tpe",
        startup: int | None = None,
        budget: int | None = None,
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(space, budget=budget, maximize=maximize, seed=seed)
        load_optuna()
        if sampler not in SAMPLERS:
            raise SpecError(f"strategy 'optuna': unknown sampler {sampler!r} (known: {', '.join(SAMPLERS)})")
        needs = SAMPLERS[sampler]
        if needs is not None and importlib.util.find_spec(needs) is None:
            raise SpecError(f"strategy 'optuna': sampler {sampler!r} needs {needs} (pip install {needs})")
        if startup is not None and (isinstance(startup, bool) or not isinstance(startup, int) or startup < 1):
            raise SpecError(f"strategy 'optuna': startup must be a positive integer, not {startup!r}")
        self.sampler, self.startup = sampler, startup

    def technique(self, grid: Grid, history: History) -> Technique:
        return Modelling(grid, history, random.Random(self.seed), sampler=self.sampler, startup=self.startup)


def make_sampler(name: str, seed: int, startup: int | None) -> Any:
    """An Optuna sampler by name, seeded."""
    optuna = load_optuna()
    samplers = optuna.samplers
    with warnings.catch_warnings():
        # Some of these options are "experimental" in some Optuna versions; the warning says nothing useful here.
        warnings.simplefilter("ignore")
        if name == "tpe":
            options = {} if startup is None else {"n_startup_trials": startup}
            return samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True, **options)
        if name == "gp":
            return samplers.GPSampler(seed=seed, **({} if startup is None else {"n_startup_trials": startup}))
        if name == "cmaes":
            return samplers.CmaEsSampler(seed=seed)
        if name == "qmc":
            return samplers.QMCSampler(seed=seed)
        return samplers.RandomSampler(seed=seed)


class Modelling(Technique):
    """Optuna's sampler as a technique (see :class:`OptunaSearch`)."""

    def __init__(
        self,
        grid: Grid,
        history: History,
        rng: random.Random,
        *,
        sampler: str = "tpe",
        startup: int | None = None,
        memory: int | None = None,
    ) -> None:
        super().__init__(grid, history, rng)
        optuna = load_optuna()
        self.optuna = optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sampler, self.startup, self.memory = sampler, startup, memory
        self.study = self._new_study()
        self.distributions: dict[str, Any] = {}
        for knob, name, values in zip(range(len(grid.sizes)), grid.names, grid.space.knobs, strict=True):
            size = grid.sizes[knob]
            if size < 2:
                continue
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values.values)
            distributions = optuna.distributions
            self.distributions[name] = (
                distributions.IntDistribution(0, size - 1)
                if numeric
                else distributions.CategoricalDistribution(list(range(size)))
            )
        self.trials: dict[Point, Any] = {}
        self.told: list[tuple[float, Point]] = []  # what the study has learnt, to start a smaller one from

    def _new_study(self) -> Any:
        # Optuna wants a 32-bit seed; draw it from our generator so the study follows the searcher's seed.
        seed = self.rng.randrange(2**31)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.optuna.create_study(
                direction="minimize", sampler=make_sampler(self.sampler, seed, self.startup)
            )

    def _forget(self) -> None:
        """Past ``memory`` trials, start a new study from the best half of them: TPE's cost per proposal grows
        with its trials, and the best ones are what its "good" density is made of."""
        if self.memory is None or len(self.told) < self.memory:
            return
        kept = sorted(self.told)[: self.memory // 2]
        self.study, self.told = self._new_study(), []
        for value, point in kept:
            self._add(point, value)
        # Trials asked of the old study and still out come back as another technique's would.
        self.trials.clear()

    def _add(self, point: Point, value: float) -> None:
        self.study.add_trial(
            self.optuna.trial.create_trial(params=self._params(point), distributions=self.distributions, value=value)
        )
        self.told.append((value, point))

    def _point(self, params: dict[str, int]) -> Point:
        return tuple(int(params.get(name, 0)) for name in self.grid.names)

    def _params(self, point: Point) -> dict[str, int]:
        return {name: point[i] for i, name in enumerate(self.grid.names) if name in self.distributions}

    def propose(self) -> Point | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self.study.ask(self.distributions)
            point = self._point(trial.params)
            if point not in self.history.seen and self.grid.is_valid(point):
                self.trials[point] = trial
                return point
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        # The model wants a configuration measured already (or one the space rules out): take a new one next to
        # it; the model hears of it as of another technique's, when its run comes back.
        return self.unseen_move(point) or self.random_point()

    def _value(self, value: float) -> float | None:
        if math.isfinite(value):
            return value
        return self.history.worst()

    def observe(self, point: Point, value: float) -> None:
        told = self._value(value)
        trial = self.trials.pop(point, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if trial is not None:
                if told is None:
                    self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
                else:
                    self.study.tell(trial, told)
                    self.told.append((told, point))
            elif told is not None:
                # Found by another technique (in ``auto``): the model learns from it all the same.
                self._add(point, told)
            self._forget()
