"""Search strategies: plain Python, no database and no Celery."""

from __future__ import annotations

from fleet.search.anneal import Anneal
from fleet.search.auto import Auto
from fleet.search.base import WAIT, Proposals, Run, Searcher
from fleet.search.bisect import Bisect
from fleet.search.composer import Composer
from fleet.search.genetic import Genetic
from fleet.search.grid import CartesianProduct
from fleet.search.local import Local
from fleet.search.nsga2 import NSGA2
from fleet.search.optuna_search import OptunaSearch
from fleet.search.random_search import RandomSearch
from fleet.search.registry import STRATEGIES, make_searcher
from fleet.search.step import Step

STRATEGIES.update(
    {
        "grid": CartesianProduct,
        "random": RandomSearch,
        "step": Step,
        "bisect": Bisect,
        "composer": Composer,
        "anneal": Anneal,
        "local": Local,
        "genetic": Genetic,
        "optuna": OptunaSearch,
        "auto": Auto,
        "nsga2": NSGA2,
    }
)


__all__ = [
    "NSGA2",
    "STRATEGIES",
    "WAIT",
    "Anneal",
    "Auto",
    "Bisect",
    "CartesianProduct",
    "Composer",
    "Genetic",
    "Local",
    "OptunaSearch",
    "Proposals",
    "RandomSearch",
    "Run",
    "Searcher",
    "Step",
    "make_searcher",
]
