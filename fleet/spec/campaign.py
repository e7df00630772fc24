"""A campaign spec: what to tune, where, over what and how, validated whole before anything is written.

A spec file is JSON (see ``docs/spec.md`` and ``fleet/spec/schema.json``); :func:`load_spec` reads one,
:func:`parse_spec` takes its parsed form, and :class:`CampaignSpec` can be built by hand in Python.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.bundle import Refused, pack, read_files, read_inside
from fleet.errors import SpecError, did_you_mean, shown
from fleet.limits import (
    KIND_LENGTH,
    NAME_LENGTH,
    PATH_LENGTH,
    SOURCES_BYTES,
    SPEC_BYTES,
    TAG_LENGTH,
    check_json,
    check_label,
)
from fleet.search import Searcher, make_searcher
from fleet.search.history import check_history
from fleet.search.pareto import Objective
from fleet.space import Config, Space, check_text, check_value
from fleet.space_files import load_space_file, verdicts
from fleet.spec.workloads import load_workload_spec
from fleet.targets import check_target, cpu_target

# "$schema" lets an editor find fleet/spec/schema.json; the loader ignores it.
_SPEC_KEYS = {
    "$schema", "name", "target", "problems", "space", "strategy", "workload", "baseline", "options", "priority",
    "history",
}  # fmt: skip


@dataclass(frozen=True)
class ProblemSpec:
    kind: str
    params: dict[str, Any]
    tags: tuple[str, ...] = ()


@dataclass
class CampaignSpec:
    """A campaign, validated: problems, target, space, strategy, budget and workload.

    Parameters
    ----------
    name:
        Unique name; running the same spec again under the same name resumes the campaign.
    problems:
        What to tune.
    target:
        Where results are valid; names the queues.
    space:
        The knobs.
    strategy:
        ``{"name": ..., "budget": ..., "seed": ..., "options": {...}}``.
    workload:
        The workload definition, with source files already bundled (``bundle``: a digest).
    files:
        The bundle's bytes by digest, stored with the campaign.
    baseline:
        A configuration measured alongside, for the speedup; its values may lie outside the space.
    priority:
        A weight: campaigns driven at once on one target share its evaluation slots in proportion to it.
    """

    name: str
    problems: list[ProblemSpec]
    target: str
    space: Space
    workload: dict[str, Any]
    strategy: dict[str, Any] = field(default_factory=lambda: {"name": "grid"})
    files: dict[str, bytes] = field(default_factory=dict)
    baseline: Config | None = None
    options: dict[str, Any] = field(default_factory=dict)
    priority: float = 1.0
    searcher_factory: Callable[[Space], Searcher] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # Everything is checked here, before anything is written: a spec that fails halfway through writing
        # (a name too long for its column, a constraint that never ends) would leave a campaign behind.
        if not self.name:
            raise SpecError("the campaign needs a name")
        check_label("the campaign's name", self.name, NAME_LENGTH)
        check_target(self.target)
        if not isinstance(self.problems, list) or not self.problems:
            raise SpecError("the campaign has no problems")
        for index, problem in enumerate(self.problems):
            _check_problem(index, problem)
        if not isinstance(self.space, Space):
            raise SpecError(f"the space must be a fleet.space.Space, not {type(self.space).__name__}")
        check_priority(self.priority)
        if not isinstance(self.strategy, Mapping):
            raise SpecError(f"the strategy must be an object, not {shown(self.strategy)}")
        if not isinstance(self.strategy.get("options", {}), Mapping):
            raise SpecError(f"strategy 'options' must be an object, not {shown(self.strategy['options'])}")
        if not isinstance(self.options, Mapping):
            raise SpecError(f"'options' must be an object, not {shown(self.options)}")
        if "history" in self.options:  # the spec's "history" field (see fleet.driving.history)
            self.options["history"] = check_history(self.options["history"])
        check_json("the spec", self._stored())
        _check_own_files(self.workload, self.files)
        workload = load_workload_spec(self.workload)
        for problem in self.problems:
            workload.check(self.space.names, problem.params)
        strategy = self.strategy
        budget = strategy.get("budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise SpecError("strategy 'budget' must be a positive integer")
        seed = strategy.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise SpecError("strategy 'seed' must be an integer")
        if chains_on_fleet(strategy):
            if len(workload.objectives) > 1:
                raise SpecError("annealing on the fleet optimises one objective: the workload names several")
            _check_chain_options(strategy, self.space)
        else:
            new_searcher(strategy, self.space, factory=self.searcher_factory, objectives=workload.objectives)
        if self.baseline is not None:
            if not isinstance(self.baseline, Mapping):
                raise SpecError("'baseline' must be an object of knob values")
            # A knob it names that is none first: a mistyped one ('blocks') also leaves the knob meant missing.
            for key, value in self.baseline.items():
                if key not in self.space.names:
                    raise SpecError(f"baseline names {key!r}, which is not a knob{did_you_mean(key, self.space.names)}")
                check_value(f"baseline {key!r}", value)
            missing = [n for n in self.space.names if n not in self.baseline and n not in self.space.run_knobs]
            if missing:
                raise SpecError(f"baseline lacks knob {missing[0]!r}")
        self.space.check_constraints()
        self.space.check_not_empty()

    def _stored(self) -> dict[str, Any]:
        """What the store keeps of the spec besides problems and names: it must all be JSON it can hold."""
        return {
            "space": self.space.to_dict(),
            "strategy": self.strategy,
            "workload": self.workload,
            "baseline": self.baseline,
            "options": self.options,
        }

    @property
    def maximize(self) -> bool:
        return load_workload_spec(self.workload).maximize


def chains_on_fleet(strategy: Mapping[str, Any]) -> bool:
    """Whether a strategy runs as annealing chains on the fleet (see :mod:`fleet.driving.chains`)."""
    options = strategy.get("options")
    return strategy.get("name") == "anneal" and isinstance(options, Mapping) and bool(options.get("on_fleet"))


def check_priority(priority: Any) -> float:
    """``priority`` if it is a finite weight above 0, else SpecError (NaN and infinity would break the shares)."""
    if isinstance(priority, bool) or not isinstance(priority, int | float) or not 0 < priority < math.inf:
        raise SpecError(f"'priority' is a weight above 0, such as 1 or 3, not {shown(priority)}")
    return priority


def _check_problem(index: int, problem: Any) -> None:
    if not isinstance(problem, ProblemSpec):
        raise SpecError(f"problem {index}: must be a fleet.spec.ProblemSpec, not {type(problem).__name__}")
    check_label(f"problem {index}: the kind", problem.kind, KIND_LENGTH)
    if not isinstance(problem.params, Mapping):
        raise SpecError(f"problem {index}: 'params' must be an object")
    for key, value in problem.params.items():
        if not isinstance(key, str):
            raise SpecError(f"problem {index}: parameter {shown(key)} must be named by a string")
        check_text(f"problem {index} parameter", key)
        check_value(f"problem {index} parameter {shown(key)}", value)
    if not isinstance(problem.tags, tuple | list):
        raise SpecError(f"problem {index}: 'tags' must be a list of strings")
    for tag in problem.tags:
        check_label(f"problem {index}: a tag", tag, TAG_LENGTH)


def _check_chain_options(strategy: Mapping[str, Any], space: Space) -> None:
    options = strategy.get("options") or {}
    unknown = set(options) - {"on_fleet", "chains", "temperature", "cooling"}
    if unknown:
        raise SpecError(f"annealing on the fleet has no option {sorted(unknown)[0]!r}")
    for name, low in (("chains", 1), ("temperature", 0), ("cooling", 0)):
        value = options.get(name, 1)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < low:
            raise SpecError(f"annealing option {name!r} must be a number >= {low}")
    if space.predicate is not None:
        raise SpecError("annealing on the fleet needs constraints as expressions: META_is_config_valid runs only here")


def _problems(raw: Any) -> list[ProblemSpec]:
    if not isinstance(raw, list) or not raw:
        raise SpecError('\'problems\' must be a non-empty list of {"kind": ..., "params": {...}}')
    problems = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("kind"), str) or not entry["kind"]:
            raise SpecError(f"problem {index}: needs a 'kind'")
        params = entry.get("params", {})
        if not isinstance(params, Mapping):
            raise SpecError(f"problem {index}: 'params' must be an object")
        tags = entry.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise SpecError(f"problem {index}: 'tags' must be a list of strings")
        problems.append(ProblemSpec(entry["kind"], dict(params), tuple(tags)))
    return problems


def default_strategy(space: Space, budget: Any) -> str:
    """The strategy of a spec that names none: ``grid`` when the whole space fits the budget, else ``auto``.

    Parameters
    ----------
    space:
        The spec's space; its size before constraints is what a grid would walk at most.
    budget:
        The strategy's budget, None for none (a grid of the whole space).
    """
    if budget is None or not isinstance(budget, int) or isinstance(budget, bool) or space.size <= budget:
        return "grid"
    return "auto"


def parse_spec(data: Any, base: Path, *, name: str | None = None, target: str | None = None) -> CampaignSpec:
    """A :class:`CampaignSpec` from the JSON form of a spec file; ``base`` is where its sources are."""
    if not isinstance(data, Mapping):
        raise SpecError("a spec is a JSON object")
    unknown = set(data) - _SPEC_KEYS
    if unknown:
        first = sorted(unknown)[0]
        raise SpecError(f"the spec has an unknown field {shown(first)}{did_you_mean(first, _SPEC_KEYS)}")
    workload = data.get("workload")
    if not isinstance(workload, Mapping):
        raise SpecError("the spec needs a 'workload' object")
    workload = dict(workload)
    files: dict[str, bytes] = {}
    sources = workload.pop("sources", None)
    if sources is not None:
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise SpecError("workload 'sources' must be a list of file names")
        for source in sources:
            check_label("workload source", source, PATH_LENGTH)
        try:
            bundle = pack(read_files(base, sources, limit=SOURCES_BYTES))
        except Refused as refused:
            raise SpecError(refused.said("workload source", "the spec's directory")) from None
        workload["bundle"] = digest_bytes(bundle)
        files[workload["bundle"]] = bundle
    strategy = data.get("strategy", {})
    if not isinstance(strategy, Mapping):
        raise SpecError('\'strategy\' must be an object such as {"name": "random", "budget": 50}')
    extra = set(strategy) - {"name", "budget", "seed", "options"}
    if extra:
        first = sorted(extra)[0]
        known = ("name", "budget", "seed", "options")
        raise SpecError(f"strategy has an unknown field {shown(first)}{did_you_mean(first, known)}")
    options = data.get("options", {})
    if not isinstance(options, Mapping):
        raise SpecError("'options' must be an object")
    options = dict(options)
    if "history" in data:
        options["history"] = data["history"]
    space, factory = _space(data.get("space"), base, options)
    return CampaignSpec(
        name=name or data.get("name") or "",
        problems=_problems(data.get("problems")),
        target=target or data.get("target") or cpu_target(),
        space=space,
        strategy={"name": default_strategy(space, strategy.get("budget")), **strategy},
        workload=workload,
        files=files,
        baseline=data.get("baseline"),
        options=options,
        priority=data.get("priority", 1.0),
        searcher_factory=factory,
    )


def _space(raw: Any, base: Path, options: dict[str, Any]) -> tuple[Space, Callable[[Space], Searcher] | None]:
    """The spec's space: inline, or a space file (recorded in ``options`` so a resumed driver reloads it)."""
    if isinstance(raw, str):
        raw = {"file": raw}
    if not (isinstance(raw, Mapping) and "file" in raw):
        return Space.from_dict(raw), None
    extra = set(raw) - {"file", "base"}
    if extra or not isinstance(raw["file"], str) or not isinstance(raw.get("base", {}), Mapping):
        raise SpecError('a space file is named as "space": "grid.py" or {"file": "grid.py", "base": {...}}')
    path = base / check_label("space file", raw["file"], PATH_LENGTH)
    try:
        read_inside(base, raw["file"], limit=SPEC_BYTES)  # what runs is what the spec's folder holds
    except Refused as refused:
        raise SpecError(refused.said("space file", "the spec's directory")) from None
    path = path.resolve()
    try:
        loaded = load_space_file(path, raw.get("base"))
    except (ValueError, RecursionError):
        # What json.loads raises for a number of more than 4300 digits or a hostile nesting.
        raise SpecError(
            f"space file {shown(str(path))}: a number has too many digits, or it is nested too deeply"
        ) from None
    options["space_file"] = {
        "path": str(path),
        "digest": loaded.digest,
        "base": dict(raw.get("base", {})),
        # What a driver reads instead of running the file: the predicate's verdicts, and whether the file's own
        # searcher must drive (then only the submitter's process can).
        **verdicts(loaded.space),
        "searcher": loaded.searcher is not None,
    }
    return loaded.space, loaded.searcher


def new_searcher(
    strategy: Mapping[str, Any],
    space: Space,
    *,
    maximize: bool = False,
    index: int = 0,
    factory: Callable[[Space], Searcher] | None = None,
    objectives: Sequence[Objective] = (),
) -> Searcher:
    """The searcher of one problem: the space file's own, or the strategy's (seeded per problem); with several
    ``objectives``, one that searches their Pareto front (see :func:`fleet.search.make_searcher`)."""
    if factory is not None:
        return factory(space)
    return make_searcher(
        strategy.get("name", "grid"),
        space,
        budget=strategy.get("budget"),
        maximize=maximize,
        seed=int(strategy.get("seed", 0)) + index,
        options=strategy.get("options"),
        objectives=objectives,
    )


def load_spec(
    path: str | Path, *, name: str | None = None, target: str | None = None, budget: int | None = None
) -> CampaignSpec:
    """Read and validate a JSON spec file.

    Parameters
    ----------
    path:
        The spec file; its ``sources`` are relative to its directory.
    name, target, budget:
        Override the spec's own.
    """
    path = Path(path)
    where = str(path) if str(path).isprintable() else shown(str(path))
    try:
        with path.open("rb") as file:
            raw = file.read(SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(missing_spec(path, where)) from None
    except OSError as error:
        raise SpecError(f"{where}: {error.strerror}") from None
    if len(raw) > SPEC_BYTES:
        raise SpecError(f"{where}: a spec file is at most {SPEC_BYTES >> 20} MiB")
    try:
        # utf-8-sig: a byte order mark, which some editors write, is no part of the JSON.
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as error:
        raise SpecError(f"{where}: not UTF-8 text (byte {error.start}); a spec file is JSON") from None
    except json.JSONDecodeError as error:
        raise SpecError(f"{where}: not valid JSON: {error.msg} at line {error.lineno}") from None
    except ValueError:
        # The only other ValueError of json.loads: Python reads no integer of more than 4300 digits.
        raise SpecError(f"{where}: a number has too many digits") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply") from None
    if isinstance(data, dict) and "KernelSpecification" in data and "ConfigurationSpace" in data:
        # A T1 input file (Kernel Tuner's, benchmark_hub's): a campaign over its kernel (fleet.interop.t1).
        from fleet.interop.t1 import t1_campaign

        try:
            fields = t1_campaign(path, data, name=name, target=target, budget=budget)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
        strategy = fields["strategy"]
        strategy["name"] = strategy["name"] or default_strategy(fields["space"], strategy.get("budget"))
        problems = [ProblemSpec(kind, params) for kind, params in fields.pop("problems")]
        return CampaignSpec(problems=problems, **fields)
    if budget is not None and isinstance(data, dict):
        given = data.get("strategy")
        data["strategy"] = {**(given if isinstance(given, dict) else {}), "budget": budget}
    try:
        return parse_spec(
            data,
            path.parent,
            name=name or (data.get("name") if isinstance(data, dict) else None) or path.stem,
            target=target,
        )
    except SpecError as error:
        raise SpecError(f"{where}: {error}") from None


def missing_spec(path: Path, where: str) -> str:
    """The line for a spec file that is not there: a relative path says the folder it was looked for in, and the
    file of that path in Fleet's own clone, the usual meaning of ``examples/...`` run from another folder."""
    if path.is_absolute():
        return f"{where}: No such file or directory"
    line = f"{where}: No such file or directory in {Path.cwd()}"
    clone = Path(__file__).resolve().parents[2]  # fleet/spec/campaign.py of a clone (an editable install)
    if (clone / path).is_file():
        line += f"; Fleet's clone has {clone / path}"
    return line


def _check_own_files(workload: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
    """Refuse a workload whose ``bundle`` names stored sources the spec does not bring itself: a digest is no secret
    (a campaign's workload shows it), and naming another campaign's would hand its files to this one's build."""
    digest = workload.get("bundle") if isinstance(workload, Mapping) else None
    if digest is None:
        return
    data = files.get(digest) if isinstance(digest, str) else None
    if data is None or digest_bytes(data) != digest:
        raise SpecError(
            f"workload 'bundle' {shown(digest, 16)} is not the digest of sources this spec brings: name them in "
            "'sources', and Fleet bundles them"
        )


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
