"""Recorded tuning spaces: replay a campaign on measurements taken earlier, without the hardware.

A recorded space is a Kernel Tuner cache file (JSON, usually gzip'd): ``tune_params_keys``, ``tune_params``
(knob -> values) and ``cache``, a map from the comma-joined values of a configuration to its record, whose
``time`` is in ms (lower is better) or an error string ("CompilationFailedConfig", "RuntimeFailedConfig", ...)
for a configuration that could not run; ``compile_time`` and ``benchmark_time`` are in ms too. Every
configuration that passed the space's restrictions is in the cache; one that did not is absent.

:func:`load_recorded` turns such a file into a :class:`RecordedSpace`: a Fleet :class:`~fleet.space.Space`
whose knobs are the tune_params (all build-time) and whose validity predicate accepts exactly the recorded
configurations, plus an O(1) :meth:`RecordedSpace.lookup`. A recorded configuration with an error string is
*in* the space: a strategy may propose it, and its run comes back invalid, as it did on the real GPU.

:func:`simulate` runs any searcher against a recorded space in-process, on a simulated clock with N
evaluation slots, feeding runs back exactly as the campaign driver does.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleet.errors import SpecError
from fleet.objective import Objective
from fleet.search.base import Run, Searcher
from fleet.search.feed import Feed
from fleet.space import Config, Knob, Space, Value, check_value

OVERHEAD_S = 0.01
"""Simulated seconds each evaluation costs on top of its recorded compile and benchmark time: the fleet's own
per-trial work (claim, record, send the next one), about what ``fleet bench dispatch`` measures per trial."""

SUFFIX = ".json.gz"

Key = tuple[Value, ...]


def tuning_spaces_dir() -> Path:
    """Where recorded spaces are looked up: ``FLEET_TUNING_SPACES``, else the two that ship in the repository's
    ``examples/tuning-spaces``; a development checkout with the whole development set beside the repository
    (``../shared/tuning-spaces``, which ``fleet bench search`` reads) uses that instead. The tests set
    ``FLEET_TUNING_SPACES`` to their own samples."""
    configured = os.environ.get("FLEET_TUNING_SPACES")
    if configured:
        return Path(configured).expanduser()
    root = Path(__file__).resolve().parents[1]
    development = root.parent / "shared" / "tuning-spaces"
    return development if development.is_dir() else root / "examples" / "tuning-spaces"


def recorded_files(directory: Path | None = None) -> list[Path]:
    """Every recorded space (``*.json.gz``) in ``directory`` (default :func:`tuning_spaces_dir`), by name."""
    directory = directory or tuning_spaces_dir()
    return sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []


def resolve_space(name: str | Path, *, here_first: bool = False) -> Path:
    """The file of recorded space ``name``.

    Parameters
    ----------
    name:
        An absolute path, or a file name (``.json.gz`` may be left out) in :func:`tuning_spaces_dir`.
    here_first:
        Try ``name`` relative to the working directory first (the command line does; workers do not, since
        they run elsewhere).
    """
    path = Path(name).expanduser()
    candidates = [path] if path.is_absolute() else []
    if not path.is_absolute():
        if here_first:
            candidates.append(path)
        directory = tuning_spaces_dir()
        candidates += [directory / path, directory / f"{path}{SUFFIX}"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    known = ", ".join(p.name for p in recorded_files()) or "none"
    raise SpecError(
        f"recorded space {str(name)!r} not found (looked in {tuning_spaces_dir()}, set FLEET_TUNING_SPACES to "
        f"change that; known: {known})"
    )


@dataclass(frozen=True)
class Record:
    """One recorded configuration.

    Parameters
    ----------
    time_ms:
        The recorded time in ms, or None when the configuration could not run (``error`` says why).
    compile_s:
        Recorded compile time in seconds.
    benchmark_s:
        Recorded benchmark time (all repeats) in seconds.
    error:
        The recorded error string, such as "RuntimeFailedConfig".
    samples:
        The recorded repeats in ms.
    """

    time_ms: float | None
    compile_s: float
    benchmark_s: float
    error: str | None = None
    samples: tuple[float, ...] = ()

    @property
    def valid(self) -> bool:
        return self.time_ms is not None

    def cost_s(self, overhead_s: float = OVERHEAD_S) -> float:
        """Simulated seconds to evaluate this configuration: an invalid one still costs its compile time."""
        if self.time_ms is None:
            return self.compile_s + overhead_s
        return self.compile_s + self.benchmark_s + overhead_s


@dataclass(frozen=True, eq=False)
class RecordedSpace:
    """A recorded tuning space; see the module docstring.

    Parameters
    ----------
    name:
        The file's name without ``.json.gz``.
    space:
        Knobs from ``tune_params``, all build-time; valid exactly when recorded.
    records:
        Record by key, the knob values in ``space.names`` order.
    """

    name: str
    space: Space
    records: dict[Key, Record]
    device: str = ""
    kernel: str = ""
    valid_times: tuple[float, ...] = field(default=(), repr=False)

    @property
    def names(self) -> list[str]:
        return self.space.names

    @property
    def size(self) -> int:
        """Recorded configurations: those that pass the space's restrictions, valid or not."""
        return len(self.records)

    @property
    def valid_count(self) -> int:
        return len(self.valid_times)

    @property
    def optimum(self) -> float:
        return self.valid_times[0]

    @property
    def median(self) -> float:
        return statistics.median(self.valid_times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.valid_times)

    def key(self, config: Mapping[str, Any]) -> Key:
        return tuple(config[name] for name in self.names)

    def lookup(self, config: Mapping[str, Any]) -> Record | None:
        """The record of ``config``, or None when it is not in the recorded space (its restrictions exclude it)."""
        try:
            return self.records.get(self.key(config))
        except (KeyError, TypeError):  # a missing knob, or an unhashable value
            return None

    def contains(self, config: Mapping[str, Any]) -> bool:
        return self.lookup(config) is not None

    def config(self, key: Key) -> Config:
        return dict(zip(self.names, key, strict=True))

    @property
    def best(self) -> Config:
        """A configuration with the optimum time."""
        return next(self.config(k) for k, r in self.records.items() if r.time_ms == self.optimum)

    def mean_cost_s(self, overhead_s: float = OVERHEAD_S) -> float:
        """The mean cost of evaluating one recorded configuration drawn uniformly, valid or not."""
        return math.fsum(r.cost_s(overhead_s) for r in self.records.values()) / len(self.records)

    def to_dict(self) -> dict[str, Any]:
        """The space's JSON form for a campaign spec (its predicate does not travel; the workload answers a
        configuration outside the recorded ones as invalid)."""
        return self.space.to_dict()


def _ms(value: Any) -> float:
    return float(value) / 1000 if isinstance(value, int | float) and math.isfinite(value) else 0.0


def _record(raw: Any) -> Record:
    if not isinstance(raw, Mapping):
        return Record(None, 0.0, 0.0, "no record")
    time = raw.get("time")
    compile_s, benchmark_s = _ms(raw.get("compile_time")), _ms(raw.get("benchmark_time"))
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        error = time if isinstance(time, str) else f"no valid time ({time!r})"
        return Record(None, compile_s, benchmark_s, error)
    times = raw.get("times")
    samples = tuple(float(t) for t in times if isinstance(t, int | float)) if isinstance(times, list) else ()
    return Record(float(time), compile_s, benchmark_s, None, samples)


def load_recorded(path: str | Path) -> RecordedSpace:
    """Read a Kernel Tuner cache file (gzip'd or not) into a :class:`RecordedSpace`; cached per file.

    Parameters
    ----------
    path:
        The file; see :func:`resolve_space` to find one by name.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as error:
        raise SpecError(f"recorded space {path}: {error.strerror}") from None
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int, size: int) -> RecordedSpace:
    # mtime and size are part of the cache key only, so that a rewritten file is read again.
    try:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, ValueError) as error:
        raise SpecError(f"recorded space {path}: not a Kernel Tuner cache file: {error}") from None
    where = f"recorded space {path}"
    if not isinstance(data, dict) or not isinstance(data.get("cache"), dict):
        raise SpecError(f"{where}: no 'cache' object")
    params = data.get("tune_params")
    names = data.get("tune_params_keys") or (list(params) if isinstance(params, dict) else None)
    if not isinstance(params, dict) or not isinstance(names, list) or set(names) != set(params):
        raise SpecError(f"{where}: 'tune_params_keys' and 'tune_params' must name the same knobs")
    knobs = []
    for name in names:
        values = params[name]
        if not isinstance(values, list):
            raise SpecError(f"{where}: tune_params {name!r} is not a list")
        knobs.append(Knob(name, tuple(check_value(f"{where} knob {name!r}", v) for v in values)))
    # Kernel Tuner keys a configuration by ",".join(str(value)); map each piece back to the knob's value.
    by_text = [{str(v): v for v in knob.values} for knob in knobs]
    records: dict[Key, Record] = {}
    for text, raw in data["cache"].items():
        pieces = text.split(",")
        try:
            key = tuple(values[piece] for values, piece in zip(by_text, pieces, strict=True))
        except (KeyError, ValueError):
            raise SpecError(f"{where}: cache key {text!r} is not a configuration of its tune_params") from None
        records[key] = _record(raw)
    valid = tuple(sorted(r.time_ms for r in records.values() if r.time_ms is not None))
    if not valid:
        raise SpecError(f"{where}: no configuration has a valid time")
    recorded = set(records)
    space = Space(tuple(knobs), predicate=lambda config: tuple(config[n] for n in names) in recorded)
    name = Path(path).name.removesuffix(SUFFIX).removesuffix(".json")
    device, kernel = data.get("device_name", ""), data.get("kernel_name", "")
    return RecordedSpace(name, space, records, str(device), str(kernel), valid)


# -- the simulator ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """One simulated evaluation.

    Parameters
    ----------
    config:
        The configuration evaluated.
    time_ms:
        Its recorded time, or None when it is invalid.
    clock_s:
        The simulated clock when it finished.
    cost_s:
        Simulated seconds it took (compile + benchmark + overhead).
    reason:
        Why it is invalid.
    """

    config: Config
    time_ms: float | None
    clock_s: float
    cost_s: float
    reason: str | None = None


NOT_RECORDED = "not in the recorded space: the space's restrictions exclude it"


def run_of(config: Config, record: Record | None, overhead_s: float = OVERHEAD_S) -> Run:
    """The run a searcher gets back for ``config``, as the ``replay`` workload reports it."""
    if record is None:
        return Run(config, None, False, {"simulated_s": overhead_s}, NOT_RECORDED)
    metrics = {
        "compile_s": record.compile_s,
        "benchmark_s": record.benchmark_s,
        "simulated_s": record.cost_s(overhead_s),
    }
    if record.time_ms is None:
        return Run(config, None, False, metrics, f"recorded as {record.error}")
    return Run(config, record.time_ms, True, metrics, objectives=recorded_objectives(record))


OBJECTIVES = (Objective("time"), Objective("compile_time"))
"""Two figures every recorded configuration holds, both in ms and lower is better: a Pareto search's objectives
(``fleet bench pareto``). A searcher of one objective sees the time only."""


def recorded_objectives(record: Record) -> dict[str, float]:
    """The values of :data:`OBJECTIVES` of a valid record."""
    return {"time": float(record.time_ms or 0.0), "compile_time": record.compile_s * 1000}


@dataclass
class _Flight:
    config: Config
    run: Run
    cost_s: float
    asked: int = 1


def simulate(
    recorded: RecordedSpace,
    searcher: Searcher,
    *,
    slots: int = 1,
    horizon_s: float | None = None,
    max_evals: int | None = None,
    stop: Callable[[Evaluation], bool] | None = None,
    overhead_s: float = OVERHEAD_S,
) -> list[Evaluation]:
    """Run ``searcher`` on ``recorded`` with a simulated clock; return every evaluation in finishing order.

    The generator is driven by the campaign driver's own ``_Feed``: the driver asks for configurations while
    fewer than ``slots`` are in flight, a ``WAIT`` stops the asking until a run comes back, and runs go back
    one per ``send``. Each evaluation takes its recorded compile + benchmark seconds plus ``overhead_s`` on
    the clock (an invalid one its compile seconds plus ``overhead_s``; one outside the recorded space only
    ``overhead_s``). As on the fleet, a configuration proposed again is not measured again: its run goes
    back at once (or when its evaluation in flight ends), at no cost.

    Parameters
    ----------
    recorded:
        The space to replay.
    searcher:
        Any searcher, e.g. from :func:`fleet.search.make_searcher` over ``recorded.space``.
    slots:
        Evaluation slots: most evaluations in flight at once.
    horizon_s:
        Stop when an evaluation finishes at or after this simulated time; None for no limit.
    max_evals:
        Stop after this many evaluations; None for no limit.
    stop:
        Called with each evaluation as it finishes; True stops the run there.
    overhead_s:
        Simulated seconds each evaluation costs besides its recorded ones.
    """
    feed = Feed(searcher.generate())
    slots = max(1, slots)
    in_flight: dict[Key, _Flight] = {}
    finished: dict[Key, Run] = {}
    heap: list[tuple[float, int, Key]] = []
    trace: list[Evaluation] = []
    clock, started, proposals, stopped = 0.0, 0, 0, False
    # A searcher that only proposes what it was answered already never moves the clock: bound it.
    most_proposals = 10 * recorded.space.size + 1000
    while True:
        while len(in_flight) < slots and proposals < most_proposals:
            proposed = feed.ask()
            if proposed is None:
                break
            proposals += 1
            config = recorded.space.check(proposed)
            key = recorded.key(config)
            if key in in_flight:
                in_flight[key].asked += 1
            elif key in finished:
                feed.inbox.append(finished[key])
            else:
                record = recorded.records.get(key)
                cost = record.cost_s(overhead_s) if record is not None else overhead_s
                started += 1
                heapq.heappush(heap, (clock + cost, started, key))
                in_flight[key] = _Flight(config, run_of(config, record, overhead_s), cost)
        if not heap:
            break
        clock = heap[0][0]
        # Everything that finishes at the same moment comes back together, as one poll of the driver collects it.
        while heap and heap[0][0] == clock:
            _, _, key = heapq.heappop(heap)
            flight = in_flight.pop(key)
            finished[key] = flight.run
            evaluation = Evaluation(flight.config, flight.run.objective, clock, flight.cost_s, flight.run.reason)
            trace.append(evaluation)
            feed.inbox.extend([flight.run] * flight.asked)
            stopped = stopped or (stop is not None and stop(evaluation))
        if stopped or (horizon_s is not None and clock >= horizon_s) or (max_evals and len(trace) >= max_evals):
            break
    return trace
