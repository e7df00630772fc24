"""History transfer: what was best for related problems, ranked for this one.

A *source* is what was measured of one related problem on one target (another GPU, another problem size, another
toolchain): its best runs, with where they came from. :func:`transfer` ranks configurations of *this* space by
how good each was relative to its own source's best (``best / objective`` for times, ``objective / best`` for
rates, so a slow GPU's milliseconds compare with a fast one's), averaged over the sources. Where a source's knobs
differ from this space's, only the common knobs transfer: the others are filled with the values the full sources
prefer, else the first values the space accepts. A configuration this space rules out is left out.

Plain Python, as every strategy: the driver (or ``fleet bench search --history``) fetches the sources and hands
the result to the strategy as JSON (:func:`to_options`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.errors import SpecError
from fleet.space import Config, Space, Value

TOP = 10
"""Best runs of each source that count: the issue's measurement found 10 per source enough to close most of the gap."""

LEADERS = 3
"""Best configurations of each source that are tried first: their union is how many first trials history gets,
fewer when the sources agree on their best."""

MOST_FIRST = 12
"""Most configurations measured first from history, however much the sources disagree."""

MOST_TRANSFERRED = 200
"""Most configurations transferred: the first ones and the ``transfer`` technique's, which takes few more."""

SHARED = 0.5
"""A source transfers when the knobs it shares with this space are at least this fraction of this space's knobs and
of its own: an older version of a kernel (6 of 10 knobs) does, another kernel with a block size or two does not."""

COMPLETIONS = 256
"""Combinations of the missing knobs' values tried when completing a partial configuration."""


@dataclass(frozen=True)
class Source:
    """The best runs of one related problem on one target.

    Parameters
    ----------
    name:
        Provenance in a few words: problem, target, toolchain (what a transferred trial says it came from).
    runs:
        (configuration, objective) of valid runs, in any order; only the :data:`TOP` best count.
    maximize:
        Whether a larger objective was better there.
    """

    name: str
    runs: tuple[tuple[Config, float], ...]
    maximize: bool = False

    def best_runs(self, top: int = TOP) -> list[tuple[Config, float]]:
        """The ``top`` best distinct configurations, best first, with their objectives."""
        ordered = sorted((r for r in self.runs if math.isfinite(r[1])), key=lambda r: -r[1] if self.maximize else r[1])
        seen: set[tuple[tuple[str, Any], ...]] = set()
        best: list[tuple[Config, float]] = []
        for config, objective in ordered:
            key = tuple(sorted(config.items()))
            if key not in seen:
                seen.add(key)
                best.append((config, objective))
            if len(best) == top:
                break
        return best

    def qualities(self, top: int = TOP) -> list[tuple[Config, float]]:
        """Each best configuration's quality relative to the source's best, in (0, 1]: ``best / objective`` for
        times, ``objective / best`` for rates; by rank (1, then down to 1/top) when objectives are not all > 0."""
        best = self.best_runs(top)
        if not best:
            return []
        if all(objective > 0 for _, objective in best):
            first = best[0][1]
            return [(c, (o / first) if self.maximize else (first / o)) for c, o in best]
        return [(c, 1 - rank / len(best)) for rank, (c, _) in enumerate(best)]


@dataclass(frozen=True)
class Transferred:
    """A configuration of this space proposed from history.

    Parameters
    ----------
    config:
        The configuration, whole and valid here.
    score:
        Its quality averaged over every source (0 where a source did not rank it): 1 when every source had it best.
    sources:
        The sources that ranked it among their best (their names).
    lead:
        Its best rank in any of them (0: some source's best).
    """

    config: Config
    score: float
    sources: tuple[str, ...] = field(default=())
    lead: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "score": round(self.score, 6),
            "sources": list(self.sources),
            "lead": self.lead,
        }


def _key(config: Mapping[str, Value], names: Iterable[str]) -> tuple[Value, ...]:
    return tuple(config[name] for name in names)


def _complete(space: Space, partial: Mapping[str, Value], preferred: Mapping[str, list[Value]]) -> Config | None:
    """``partial`` with this space's other knobs filled: each knob's preferred values first, then its own order;
    the first combination the space accepts, or None."""
    missing = [k for k in space.knobs if k.name not in partial]
    choices = [
        list(dict.fromkeys([*(v for v in preferred.get(k.name, []) if v in k.values), *k.values])) for k in missing
    ]
    for values in itertools.islice(itertools.product(*choices), COMPLETIONS):
        config = {**partial, **dict(zip([k.name for k in missing], values, strict=True))}
        config = {name: config[name] for name in space.names}
        if space.is_valid(config):
            return config
    return None


def transfer(space: Space, sources: Sequence[Source], *, top: int = TOP) -> list[Transferred]:
    """The configurations of ``space`` that related sources found best, best first.

    Each source's :data:`TOP` best runs count, each with its quality relative to that source's best. A source
    that shares too few knobs with ``space`` (:data:`SHARED`) is ignored; one that lacks some of its knobs
    transfers the common knobs (partial transfer), completed as the module docstring says. A candidate's score
    is the mean over the sources of its quality there (the best quality among that source's runs that agree with
    it on their common knobs; 0 when none does). Ties go to the candidate first seen in the sources' order of
    best runs.

    Parameters
    ----------
    space:
        This campaign's space.
    sources:
        The related sources.
    top:
        Best runs per source that count.
    """
    order = tuple(space.names)  # a property that builds a list: taken once
    names = set(order)
    # Per source: its common knobs and its qualities. Sources are grouped by their common knobs, so that each
    # candidate is projected once per group, not once per source (a fleet may hold hundreds of sources).
    projected: list[tuple[Source, tuple[str, ...], list[tuple[Config, float]]]] = []
    groups: dict[tuple[str, ...], dict[tuple[Value, ...], dict[int, tuple[float, int]]]] = {}
    for source in sources:
        qualities = source.qualities(top)
        if not qualities:
            continue
        common = tuple(n for n in order if all(n in c for c, _ in qualities))
        theirs = {n for c, _ in qualities for n in c}
        if not common or len(common) < SHARED * len(order) or len(common) < SHARED * len(theirs):
            continue  # another kernel that happens to share a knob name or two: not related
        index = len(projected)
        projected.append((source, common, qualities))
        group = groups.setdefault(common, {})
        for rank, (config, quality) in enumerate(qualities):
            # Best first: the first run of a projection is its best, with its rank.
            group.setdefault(_key(config, common), {}).setdefault(index, (quality, rank))
    if not projected:
        return []
    # The values full sources prefer, best first, to complete what partial ones leave open.
    preferred: dict[str, list[Value]] = {}
    votes: dict[str, dict[Value, float]] = {}
    for _, common, qualities in projected:
        if set(common) == names:
            for config, quality in qualities:
                for name in order:
                    votes.setdefault(name, {})[config[name]] = votes.get(name, {}).get(config[name], 0.0) + quality
    for name, counted in votes.items():
        preferred[name] = sorted(counted, key=lambda v: -counted[v])
    # Candidates in round-robin order of the sources' best runs, so that ties favour every source's leaders.
    allowed = {knob.name: set(knob.values) for knob in space.knobs}
    candidates: dict[tuple[Value, ...], Config] = {}
    for rank in range(top):
        for _, common, qualities in projected:
            if rank >= len(qualities):
                continue
            partial = {n: qualities[rank][0][n] for n in common}
            if not all(v in allowed[n] for n, v in partial.items()):
                continue
            key = _key(partial, order) if len(common) == len(names) else None
            if key is not None and key in candidates:
                continue
            candidate = dict(partial) if key is not None else _complete(space, partial, preferred)
            if candidate is None or not space.is_valid(candidate):
                continue  # invalid here: simply not a candidate
            candidates.setdefault(_key(candidate, order), candidate)
    result = []
    for config in candidates.values():
        total, named, lead = 0.0, [], top
        for common, group in groups.items():
            for index, (quality, rank) in group.get(_key(config, common), {}).items():
                total += quality
                named.append((index, projected[index][0].name))
                lead = min(lead, rank)
        result.append(Transferred(config, total / len(projected), tuple(n for _, n in sorted(named)), lead))
    # sorted() is stable: ties keep the order the candidates were first seen in.
    return sorted(result, key=lambda t: -t.score)[:MOST_TRANSFERRED]


def first_count(transferred: Sequence[Transferred], leaders: int = LEADERS) -> int:
    """How many transferred configurations to measure before anything else: as many as the sources' leaders
    (each source's ``leaders`` best) make together, so ``leaders`` when every source ranks the same ones first and
    ``leaders`` per source when none agree, at most :data:`MOST_FIRST`.

    Parameters
    ----------
    transferred:
        :func:`transfer`'s result.
    leaders:
        Best configurations per source that count.
    """
    if not transferred:
        return 0
    return max(1, min(sum(1 for item in transferred if item.lead < leaders), MOST_FIRST))


def to_options(transferred: Sequence[Transferred], first: int | None = None) -> dict[str, Any]:
    """The JSON form ``auto`` takes as its ``history`` option: ``{"configs": [...], "first": N}``."""
    return {"configs": [t.to_dict() for t in transferred], "first": first}


def from_options(value: Any, where: str = "strategy 'auto'") -> tuple[list[Transferred], int | None]:
    """Read ``auto``'s ``history`` option back (see :func:`to_options`); SpecError when it is malformed."""
    if value is None:
        return [], None
    if not isinstance(value, Mapping) or not isinstance(value.get("configs", []), list):
        raise SpecError(f'{where}: history must be {{"configs": [{{"config": ..., "score": ...}}], "first": N}}')
    first = value.get("first")
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
        raise SpecError(f"{where}: history 'first' must be an integer >= 0")
    items = []
    for entry in value.get("configs", []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("config"), Mapping):
            raise SpecError(f"{where}: each history entry needs a 'config' object")
        score = entry.get("score", 0.0)
        sources = entry.get("sources", [])
        if isinstance(score, bool) or not isinstance(score, int | float) or not isinstance(sources, list):
            raise SpecError(f"{where}: a history entry's 'score' is a number and its 'sources' a list")
        lead = entry.get("lead", 0)
        lead = lead if isinstance(lead, int) and not isinstance(lead, bool) else 0
        items.append(Transferred(dict(entry["config"]), float(score), tuple(str(s) for s in sources), lead))
    return items, first


def check_history(value: Any) -> bool | dict[str, Any]:
    """A spec's ``history`` field, checked: true, false, or ``{"from": [...] | "all", "targets": [...], "tags":
    [...]}``; ``from`` names the campaigns history may draw on (fleet.trust), none when absent."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, Mapping):
        shape = '{"from": [...], "targets": [...], "tags": [...]}'
        raise SpecError(f"'history' is true, false or {shape}, not {value!r}")
    unknown = set(value) - {"from", "targets", "tags"}
    if unknown:
        raise SpecError(f"'history' has an unknown field {sorted(unknown)[0]!r} (known: from, targets, tags)")
    checked: dict[str, Any] = {}
    if "from" in value:
        from fleet.trust import parse_history_from

        parse_history_from(value["from"])
        checked["from"] = value["from"]
    for name in ("targets", "tags"):
        if name in value:
            items = value[name]
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                raise SpecError(f"'history' {name!r} must be a list of names")
            checked[name] = list(items)
    return checked
