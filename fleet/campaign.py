"""Campaigns: what to tune, and the driver that keeps the fleet busy with it.

A :class:`CampaignSpec` is validated whole before anything is written. :func:`submit` writes it;
:class:`Driver` asks each problem's searcher for configurations, writes trials, sends them with a bounded
window, and feeds finished runs back. Everything it knows is in the database, so a driver that dies is
resumed by running it again: trials are found instead of created, and finished ones are replayed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import platform
import re
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.bundle import pack, read_files
from fleet.errors import SpecError
from fleet.search import WAIT, Proposals, Run, Searcher, make_searcher
from fleet.space import Config, Space, check_value, digest
from fleet.space_files import load_space_file
from fleet.store import Campaign, NewTrial, Requeue, Store, TrialResult
from fleet.workers.gpus import cpu_target
from fleet.workers.workloads import load_workload

TARGET = re.compile(r"^(sm_[0-9]{2,3}[a-z]?|gfx[0-9a-f]{3,5}(:[1-9][0-9]*)?|cpu-[A-Za-z0-9_]+)$")
_SPEC_KEYS = {"name", "target", "problems", "space", "strategy", "workload", "baseline", "options"}


def check_target(target: Any) -> str:
    """``target`` if it names a GPU architecture or a CPU, else :class:`SpecError`."""
    if not isinstance(target, str) or not TARGET.fullmatch(target):
        raise SpecError(
            f"unknown target {target!r}: expected sm_<compute capability> (sm_90), gfx<arch>:<compute units> "
            "(gfx90a:104) or cpu-<machine> (cpu-x86_64)"
        )
    return target


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
    searcher_factory: Callable[[Space], Searcher] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise SpecError("the campaign needs a name")
        check_target(self.target)
        if not self.problems:
            raise SpecError("the campaign has no problems")
        workload = load_workload(self.workload)
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
            _check_chain_options(strategy, self.space)
        else:
            new_searcher(strategy, self.space, factory=self.searcher_factory)
        if self.baseline is not None:
            if not isinstance(self.baseline, Mapping):
                raise SpecError("'baseline' must be an object of knob values")
            missing = [n for n in self.space.names if n not in self.baseline and n not in self.space.run_knobs]
            if missing:
                raise SpecError(f"baseline lacks knob {missing[0]!r}")
            for key, value in self.baseline.items():
                if key not in self.space.names:
                    raise SpecError(f"baseline names {key!r}, which is not a knob")
                check_value(f"baseline {key!r}", value)

    @property
    def maximize(self) -> bool:
        return load_workload(self.workload).maximize


def chains_on_fleet(strategy: Mapping[str, Any]) -> bool:
    """Whether a strategy runs as annealing chains on the fleet (see :mod:`fleet.chains`)."""
    return strategy.get("name") == "anneal" and bool((strategy.get("options") or {}).get("on_fleet"))


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
        for key, value in params.items():
            check_value(f"problem {index} parameter {key!r}", value)
        tags = entry.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise SpecError(f"problem {index}: 'tags' must be a list of strings")
        problems.append(ProblemSpec(entry["kind"], dict(params), tuple(tags)))
    return problems


def parse_spec(data: Any, base: Path, *, name: str | None = None, target: str | None = None) -> CampaignSpec:
    """A :class:`CampaignSpec` from the JSON form of a spec file; ``base`` is where its sources are."""
    if not isinstance(data, Mapping):
        raise SpecError("a spec is a JSON object")
    unknown = set(data) - _SPEC_KEYS
    if unknown:
        raise SpecError(f"the spec has an unknown field {sorted(unknown)[0]!r}")
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
            if Path(source).is_absolute() or ".." in Path(source).parts:
                raise SpecError(f"workload source {source!r} must be a path inside the spec's directory")
        try:
            bundle = pack(read_files(base, sources))
        except OSError as error:
            raise SpecError(f"workload source {error.filename}: {error.strerror}") from None
        workload["bundle"] = digest_bytes(bundle)
        files[workload["bundle"]] = bundle
    strategy = data.get("strategy", {"name": "grid"})
    if not isinstance(strategy, Mapping):
        raise SpecError('\'strategy\' must be an object such as {"name": "random", "budget": 50}')
    extra = set(strategy) - {"name", "budget", "seed", "options"}
    if extra:
        raise SpecError(f"strategy has an unknown field {sorted(extra)[0]!r}")
    options = data.get("options", {})
    if not isinstance(options, Mapping):
        raise SpecError("'options' must be an object")
    options = dict(options)
    space, factory = _space(data.get("space"), base, options)
    return CampaignSpec(
        name=name or data.get("name") or "",
        problems=_problems(data.get("problems")),
        target=target or data.get("target") or cpu_target(),
        space=space,
        strategy={"name": "grid", **strategy},
        workload=workload,
        files=files,
        baseline=data.get("baseline"),
        options=options,
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
    path = (base / raw["file"]).resolve()
    loaded = load_space_file(path, raw.get("base"))
    options["space_file"] = {"path": str(path), "digest": loaded.digest, "base": dict(raw.get("base", {}))}
    return loaded.space, loaded.searcher


def campaign_space(campaign: Campaign) -> tuple[Space, Callable[[Space], Searcher] | None]:
    """A stored campaign's space, with the predicate and searcher of its space file when it has one."""
    source = campaign.options.get("space_file")
    if not source:
        return Space.from_dict(campaign.space), None
    loaded = load_space_file(Path(source["path"]), source.get("base"))
    if loaded.digest != source["digest"]:
        raise SpecError(f"space file {source['path']} changed since campaign {campaign.name!r} started")
    return loaded.space, loaded.searcher


def new_searcher(
    strategy: Mapping[str, Any],
    space: Space,
    *,
    maximize: bool = False,
    index: int = 0,
    factory: Callable[[Space], Searcher] | None = None,
) -> Searcher:
    """The searcher of one problem: the space file's own, or the strategy's (seeded per problem)."""
    if factory is not None:
        return factory(space)
    return make_searcher(
        strategy.get("name", "grid"),
        space,
        budget=strategy.get("budget"),
        maximize=maximize,
        seed=int(strategy.get("seed", 0)) + index,
        options=strategy.get("options"),
    )


def load_spec(
    path: Path, *, name: str | None = None, target: str | None = None, budget: int | None = None
) -> CampaignSpec:
    """Read and validate a JSON spec file."""
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(f"{path}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SpecError(f"{path}: not valid JSON: {error.msg} at line {error.lineno}") from None
    if budget is not None and isinstance(data, dict):
        strategy = data.get("strategy") if isinstance(data.get("strategy"), dict) else {"name": "grid"}
        data["strategy"] = {**strategy, "budget": budget}
    try:
        return parse_spec(
            data,
            path.parent,
            name=name or (data.get("name") if isinstance(data, dict) else None) or path.stem,
            target=target,
        )
    except SpecError as error:
        raise SpecError(f"{path}: {error}") from None


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def provenance(toolchain: str) -> dict[str, Any]:
    """Where and with what a campaign was submitted."""
    import celery

    from fleet import __version__

    return {
        "toolchain": toolchain,
        "fleet": __version__,
        "python": platform.python_version(),
        "celery": celery.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "argv": sys.argv[1:],
    }


def submit(store: Store, spec: CampaignSpec) -> Campaign:
    """Write ``spec`` (problems, source bundle, campaign); resubmitting the same spec returns the campaign."""
    workload = load_workload(spec.workload)
    toolchain = workload.toolchain()
    problem_ids = [store.add_problem(p.kind, p.params, p.tags) for p in spec.problems]
    for data in spec.files.values():
        store.put_blob(data)
    return store.create_campaign(
        name=spec.name,
        target=spec.target,
        problem_ids=problem_ids,
        space=spec.space.to_dict(),
        strategy=spec.strategy,
        workload=spec.workload,
        options=spec.options,
        provenance=provenance(toolchain),
        baseline=spec.baseline,
    )


def trial_keys(campaign: Campaign, problem_id: int, config: Config, space: Space) -> tuple[str, str]:
    """The build key (what decides the artifact) and the measure key (what decides the measurement)."""
    toolchain = campaign.provenance.get("toolchain", "")
    build_workload = {
        k: v for k, v in campaign.workload.items() if k not in ("run", "repeats", "warmup", "run_timeout", "objective")
    }
    build_key = digest(["build", problem_id, campaign.target, space.build_part(config), toolchain, build_workload])
    measure_key = digest(["measure", problem_id, campaign.target, config, toolchain, campaign.workload])
    return build_key, measure_key


_EMPTY = object()


class _Feed:
    """One problem's searcher, driven through its generator protocol.

    Runs wait in an inbox and go in one per ``send``, so a proposal that a send returns is never lost.
    """

    def __init__(self, proposals: Proposals) -> None:
        self.proposals = proposals
        self.started = False
        self.done = False
        self.pending: Any = _EMPTY
        self.inbox: deque[Run] = deque()

    def ask(self) -> Config | None:
        """The next configuration, or None when the searcher waits for runs or has finished."""
        while not self.done:
            if self.pending is not _EMPTY and self.pending is not WAIT:
                config, self.pending = self.pending, _EMPTY
                return config
            if self.pending is WAIT and not self.inbox:
                return None
            try:
                if not self.started:
                    self.started = True
                    self.pending = next(self.proposals)
                else:
                    self.pending = self.proposals.send(self.inbox.popleft() if self.inbox else None)
            except StopIteration:
                self.done = True
        return None

    @property
    def blocked(self) -> bool:
        """Waiting for runs that have all been delivered already: this searcher can do no more."""
        return self.pending is WAIT and not self.inbox


def baseline_configs(space: Space, baseline: Mapping[str, Any]) -> list[Config]:
    """The baseline once for each combination of the run-time knobs it leaves open."""
    open_knobs = [k for k in space.knobs if k.name not in baseline]
    return [
        {
            name: ({**baseline, **dict(zip([k.name for k in open_knobs], values, strict=True))})[name]
            for name in space.names
        }
        for values in itertools.product(*(k.values for k in open_knobs))
    ]


@dataclass
class Summary:
    """What a campaign found for one problem."""

    problem_id: int
    best: TrialResult | None
    baseline: TrialResult | None
    counts: dict[str, int]

    maximize: bool = False

    @property
    def speedup(self) -> float | None:
        """How many times better the best is than the baseline (a ratio of GFLOPS, or of times inverted)."""
        if not (self.best and self.baseline and self.best.objective and self.baseline.objective):
            return None
        ratio = self.best.objective / self.baseline.objective
        return ratio if self.maximize else 1 / ratio


class Driver:
    """Runs a campaign to its end on whatever workers listen on its target's queues.

    Parameters
    ----------
    store:
        The database.
    campaign:
        The campaign to run (or resume).
    dispatch:
        Sends work to the broker (``fleet.tasks.send``); the driver itself knows no Celery.
    window:
        Most trials in flight at once; enough to keep every evaluation slot busy.
    on_progress:
        Called with (finished, total, best so far) after each poll.
    on_warning:
        Called with one line when something needs the user's attention (no worker listening).
    """

    @property
    def dynamic(self) -> bool:
        """Whether the searchers use past runs; static ones need no bounded window."""
        return any(searcher.is_dynamic for searcher in self.searchers)

    def __init__(
        self,
        store: Store,
        campaign: Campaign,
        dispatch: Callable[[Iterable[Requeue]], int],
        *,
        window: int = 8,
        on_progress: Callable[[int, int | None, TrialResult | None], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        poll_seconds: float = 0.05,
        max_attempts: int = 3,
        heartbeat_seconds: float = 5.0,
        requeue_seconds: float = 300.0,
    ) -> None:
        self.store = store
        self.campaign = campaign
        self.dispatch = dispatch
        self.window = max(1, window)
        self.on_progress = on_progress or (lambda *_: None)
        self.on_warning = on_warning or (lambda _: None)
        self.poll_seconds = poll_seconds
        self.max_attempts = max_attempts
        self.heartbeat_seconds = heartbeat_seconds
        self.requeue_seconds = requeue_seconds
        self.space, factory = campaign_space(campaign)
        self.maximize = load_workload(campaign.workload).maximize
        # A TVM trial is built and measured on the evaluation worker in one task (see fleet.tasks.tvm).
        self.first_task = "tvm_measure" if campaign.workload.get("kind") == "tvm" else "compile"
        self.problems = [p.id for p in store.campaign_problems(campaign.id)]
        self.searchers = [
            new_searcher(
                self._strategy(store, problem), self.space, maximize=self.maximize, index=index, factory=factory
            )
            for index, problem in enumerate(store.campaign_problems(campaign.id))
        ]
        self.feeds = [_Feed(searcher.generate()) for searcher in self.searchers]
        self.in_flight: dict[int, tuple[int, int]] = {}  # trial id -> (problem index, times the searcher asked)
        self.results: list[TrialResult] = []
        self.best: dict[int, TrialResult] = {}
        self.seq = 0
        self.unsent: list[Requeue] = []
        self.broker_warned = -1e9

    def _strategy(self, store: Store, problem: Any) -> dict[str, Any]:
        """The campaign's strategy; ``auto`` starts from the best configurations of similar problems."""
        strategy = self.campaign.strategy
        options = dict(strategy.get("options") or {})
        if strategy.get("name") != "auto" or "seed_configs" in options:
            return strategy
        known = store.known_good(problem.kind, self.campaign.target, exclude=problem.id)
        options["seed_configs"] = [c for c in known if set(c) == set(self.space.names) and self.space.is_valid(c)]
        return {**strategy, "options": options}

    def total(self) -> int | None:
        """How many trials the campaign will have, when that is cheap to know."""
        budget = self.campaign.strategy.get("budget")
        if self.space.size > 200_000:
            return None if budget is None else budget * len(self.problems)
        valid = sum(1 for _ in self.space)
        per_problem = valid if budget is None else min(budget, valid)
        baselines = len(baseline_configs(self.space, self.campaign.baseline)) if self.campaign.baseline else 0
        return (per_problem + baselines) * len(self.problems)

    def _submit(self, proposals: list[tuple[int, Config, bool]]) -> None:
        trials = []
        for index, config, baseline in proposals:
            problem_id = self.problems[index]
            build_key, measure_key = trial_keys(self.campaign, problem_id, config, self.space)
            self.seq += 1
            trials.append(NewTrial(problem_id, config, build_key, measure_key, self.seq, baseline))
        remeasure = bool(self.campaign.options.get("remeasure"))
        created = self.store.add_trials(self.campaign.id, self.campaign.target, trials, remeasure=remeasure)
        send = []
        for (index, _, baseline), (trial_id, state) in zip(proposals, created, strict=True):
            # A baseline that is also in the space is one trial; only the searcher's proposals go back to it.
            asked = 0 if baseline else 1
            if trial_id in self.in_flight:
                self.in_flight[trial_id] = (index, self.in_flight[trial_id][1] + asked)
                continue
            self.in_flight[trial_id] = (index, asked)
            if state in ("new", "compiled"):
                send.append(Requeue(trial_id, self.campaign.target, self.first_task if state == "new" else "evaluate"))
        self._send(send)

    def _send(self, work: list[Requeue]) -> None:
        """Send work, keeping what the broker refused for the next loop: the trials are safe in the database."""
        work = self.unsent + work
        self.unsent = []
        if not work:
            return
        try:
            self.dispatch(work)
        except Exception as error:  # kombu raises several kinds when the broker is away
            self.unsent = work
            now = time.monotonic()
            if now - self.broker_warned > 30:
                self.broker_warned = now
                self.on_warning(f"the broker does not answer ({error}); {len(work)} trials will be sent when it does")

    def submit_all(self) -> None:
        """Write and send every proposal a static strategy has, then leave: the workers need no driver."""
        self.window = 1 << 30
        self._submit_baselines()
        self._fill()

    def _submit_baselines(self) -> None:
        if self.campaign.baseline:
            configs = baseline_configs(self.space, self.campaign.baseline)
            self._submit([(index, config, True) for index in range(len(self.problems)) for config in configs])

    def _fill(self) -> None:
        proposals: list[tuple[int, Config, bool]] = []
        asking = True
        while asking and len(self.in_flight) + len(proposals) < self.window:
            asking = False
            for index, feed in enumerate(self.feeds):
                if len(self.in_flight) + len(proposals) >= self.window:
                    break
                config = feed.ask()
                if config is not None:
                    proposals.append((index, self.space.check(config), False))
                    asking = True
        if proposals:
            self._submit(proposals)

    def _collect(self) -> int:
        # The oldest in flight finish first; asking about all of a large window every poll costs too much.
        finished = self.store.results(sorted(self.in_flight)[:500])
        for result in finished:
            index, times = self.in_flight.pop(result.trial_id)
            self.results.append(result)
            run = Run(result.config, result.objective, result.valid, result.metrics, result.reason)
            self.feeds[index].inbox.extend([run] * times)
            current = self.best.get(result.problem_id)
            if (
                result.valid
                and result.objective is not None
                and (
                    current is None
                    or (result.objective > current.objective if self.maximize else result.objective < current.objective)  # type: ignore[operator]
                )
            ):
                self.best[result.problem_id] = result
        return len(finished)

    def _check_workers(self, started: float, warned: list[float]) -> None:
        live = self.store.workers(target=self.campaign.target, role="eval", within=3 * self.heartbeat_seconds + 5)
        if live:
            warned.clear()
            return
        now = time.monotonic()
        if now - started > 2 * self.heartbeat_seconds and (not warned or now - warned[-1] > 60):
            warned.append(now)
            self.on_warning(
                f"no worker is listening on eval.{self.campaign.target}: start one on a node of that target "
                f"with `fleet worker --target {self.campaign.target}`; trials wait in the queue until then"
            )

    def run(self) -> list[Summary]:
        """Drive the campaign to its end and return what it found per problem."""
        self._submit_baselines()
        total = self.total()
        started = time.monotonic()
        last_check = 0.0
        warned: list[float] = []
        idle = 0
        while True:
            self._fill()
            if not self.in_flight and not self.unsent and all(feed.done or feed.blocked for feed in self.feeds):
                break
            if self._collect():
                self.on_progress(len(self.results), total, self._overall_best())
                idle = 0
            else:
                idle += 1
            now = time.monotonic()
            if now - last_check > self.heartbeat_seconds:
                last_check = now
                self._check_workers(started, warned)
                self._send(
                    self.store.reap(self.max_attempts) + self.store.stale(self.requeue_seconds, self.campaign.id)
                )
            if idle:
                # Back off while nothing finishes: long measurements need no tight polling.
                time.sleep(min(0.5, self.poll_seconds * 2 ** min(idle - 1, 4)))
            elif len(self.in_flight) > 16:
                # A wide window has plenty queued: polling less often leaves the CPU to the workers.
                time.sleep(0.25)
        self.on_progress(len(self.results), len(self.results), self._overall_best())
        self.store.set_campaign_status(self.campaign.id, "done")
        return summarize(self.store, self.campaign)

    def _overall_best(self) -> TrialResult | None:
        bests = list(self.best.values())
        if not bests:
            return None
        return (max if self.maximize else min)(bests, key=lambda r: r.objective)  # type: ignore[arg-type,return-value]


def summarize(store: Store, campaign: Campaign) -> list[Summary]:
    """Per problem of ``campaign``: its best trial, its baseline trial, and trial counts by state."""
    maximize = load_workload(campaign.workload).maximize
    results = store.results(campaign_id=campaign.id)
    summaries = []
    for problem in store.campaign_problems(campaign.id):
        mine = [r for r in results if r.problem_id == problem.id]
        valid = [r for r in mine if r.valid and r.objective is not None]
        best = (max if maximize else min)(valid, key=lambda r: r.objective) if valid else None  # type: ignore[arg-type]
        # The baseline run with the same run-time knob values as the best: a like-for-like speedup.
        space = Space.from_dict(campaign.space)
        same_run = [
            r
            for r in mine
            if r.baseline
            and r.valid
            and best is not None
            and all(r.config.get(n) == best.config.get(n) for n in space.run_knobs)
        ]
        baseline = same_run[0] if same_run else None
        counts: dict[str, int] = {}
        for r in mine:
            counts[r.state] = counts.get(r.state, 0) + 1
        summaries.append(Summary(problem.id, best, baseline, counts, maximize))
    return summaries
