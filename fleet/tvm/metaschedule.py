"""MetaSchedule on the fleet: its candidates measured by Fleet's evaluation workers, as Fleet's trials.

:class:`FleetRunner` is a MetaSchedule ``PyRunner``. Each batch of built candidates becomes trials of one campaign
(one per runner) on ``eval.<target>``:

- the candidate's module (``RunnerInput.artifact_path``, a tar) and its argument shapes are packed and stored as
  the trial's artifact, content-addressed (a candidate built twice is stored once); the tuning host is its
  builder, so the trial reaches ``compiled`` there and only its evaluation is sent;
- the evaluation is a ``resident`` ``command`` workload: on the worker, a child Python process started through
  the worker's sandboxed runner, and kept there between candidates (TVM imported once, as in ``LocalRunner``'s
  pool process), loads each module and times it with MetaSchedule's evaluator config (number, repeat,
  min_repeat_ms, cooldown), as ``LocalRunner`` does; a crash ends that child, not the worker, and the next
  candidate gets a fresh one;
- the results come back as ``RunnerResult`` futures; a worker that dies mid-measurement loses its lease and the
  trial is measured again by another (the reaper, in every worker's heartbeat and in this runner's wait), and it
  is recorded once: no candidate is lost, none is reported twice.

:class:`InProcessBuilder` builds candidates in the tuning process: MetaSchedule's ``LocalBuilder`` starts a fresh
process pool per batch whose every process imports ``tvm.s_tir.tensor_intrin`` (tens of seconds on a busy
machine). :func:`tune` runs ``ms.tune_tir`` with both and Fleet's database (:mod:`fleet.tvm.msdb`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.states import ArtifactState, CampaignStatus, TrialState
from fleet.tvm.available import require_tvm
from fleet.tvm.intrinsics import load_intrinsics
from fleet.tvm.msdb import _MEASURED_LOCK, MEASURED

if TYPE_CHECKING:
    from fleet.space import Config

KIND = "tvm.metaschedule"
"""The problem kind of a FleetRunner's candidates: one problem per runner."""

# The measuring child, a resident command (fleet.workers.runner.Resident): started once by an evaluation worker's
# process and kept, in the sandbox, so that TVM is imported once, as in LocalRunner's pool process. argv is number,
# repeat, min_repeat_ms, cooldown_ms, cache flush (0/1). Each line on stdin names the folder of a candidate
# (mod.tar, candidate.json); it answers with one JSON line: the mean seconds and each repeat's. The arguments are
# filled with random numbers as LocalRunner's are, by TVM's random_fill_for_measure: that needs the whole TVM library
# (1 s to import, once; TVM's runtime library alone has no random fill, and left the arguments as whatever memory
# they were given, not what LocalRunner measures with). A candidate that raises ends it, as a crash would: the
# worker says why and starts another for the next candidate. It reads its first candidate before it imports TVM
# (the worker sends it as soon as the child starts): a child whose worker was killed as it started, and whose
# sandbox bubblewrap could not tie to the worker in time (a parent-death signal armed a moment after the fork), ends
# at once at the end of its input, not after an import of seconds on a loaded node.
CHILD = """
import itertools, json, os, sys
first = sys.stdin.readline()
if not first:
    sys.exit(0)
import tvm
number, repeat, min_ms, cooldown_ms, flush = (int(a) for a in sys.argv[1:6])
fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)
for line in itertools.chain([first], sys.stdin):
    folder = json.loads(line)["dir"]
    with open(os.path.join(folder, "candidate.json")) as f:
        info = json.load(f)
    mod = tvm.runtime.load_module(os.path.join(folder, "mod.tar"))
    dev = tvm.runtime.device(info["device_type"], 0)
    args = []
    for _, dtype, shape in info["args_info"]:
        arg = tvm.runtime.empty(shape, dtype, dev)
        if fill is not None:
            fill(arg)
        args.append(arg)
    evaluator = mod.time_evaluator(
        mod.entry_name, dev, number=number, repeat=repeat, min_repeat_ms=min_ms,
        cooldown_interval_ms=cooldown_ms, f_preproc="cache_flush_cpu_non_first_arg" if flush else "",
    )
    dev.sync()
    costs = [float(c) for c in evaluator(*args).results]
    out = {"seconds": sum(costs) / len(costs), "repeats": len(costs)}
    out.update({"run_sec_%d" % i: c for i, c in enumerate(costs)})
    del evaluator, args, mod
    print(json.dumps(out), flush=True)
"""

POLL_MAX = 0.25
"""The longest a runner waits between two looks at its candidates' results (seconds)."""


def tvm_target(target: str, cores: int | None = None) -> Any:
    """The TVM target MetaSchedule tunes for on a Fleet target: a dict target (0.27 refuses "llvm -num-cores 2")
    with ``num-cores``, which MetaSchedule needs on a CPU (default: this machine's cores)."""
    from fleet.tvm.measure import tvm_target as fleet_tvm_target

    tvm = require_tvm()
    base = dict(fleet_tvm_target(target).export())
    if base.get("kind") == "llvm":
        base["num-cores"] = int(cores or os.cpu_count() or 1)
    return tvm.target.Target({k: v for k, v in base.items() if k in ("kind", "mcpu", "arch", "num-cores")})


def workload_definition(
    number: int, repeat: int, min_repeat_ms: int, cooldown_ms: int, flush: bool, timeout: float, python: str
) -> dict[str, Any]:
    """The ``command`` workload that measures a candidate on a worker: :data:`CHILD`, resident."""
    argv = [python, "-c", CHILD, str(number), str(repeat), str(min_repeat_ms), str(cooldown_ms), str(int(flush))]
    return {
        "kind": "command",
        "run": argv,
        "objective": {"name": "seconds", "json": "seconds", "goal": "min"},
        "repeats": 1,
        "warmup": 0,
        "run_timeout": timeout,
        "resident": True,
    }


def run_secs(metrics: dict[str, Any], objective: float | None) -> list[float]:
    """A measurement's per-repeat seconds, as the child printed them."""
    count = int(metrics.get("repeats") or 0)
    found = [float(metrics[f"run_sec_{i}"]) for i in range(count) if f"run_sec_{i}" in metrics]
    return found or ([float(objective)] if objective is not None else [])


@dataclass
class _Batch:
    """The trials of one ``run`` call and what came back for them."""

    trial_ids: list[int]
    results: dict[int, Any] = field(default_factory=dict)


class _Session:
    """A FleetRunner's campaign, and the sending and waiting of its trials (no TVM object in here)."""

    def __init__(
        self,
        target: str,
        store: Any,
        definition: dict[str, Any],
        name: str | None,
        poll_seconds: float,
        log: Callable[[str], None],
        team: str | None = None,
    ) -> None:
        from fleet.settings import get_settings

        self.target = target
        self._store = store
        self.definition = definition
        self.name = name or f"ms-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.poll_seconds = poll_seconds
        self.interval = poll_seconds  # longer while nothing comes back (see poll)
        self.settings = get_settings()
        self.owner = f"fleet-ms-runner@{socket.gethostname()}/{os.getpid()}"
        self.log = log
        self.team = team
        self.campaign: Any = None
        self.problem_id = 0
        self.seq = 0
        self.lock = threading.Lock()
        self.last_poll = 0.0
        self.last_reap = time.monotonic()
        self.pending: dict[int, list[_Batch]] = {}
        self.measured = 0

    @property
    def store(self) -> Any:
        if self._store is None:
            from fleet.store import connect

            self._store = connect()
        return self._store

    def start(self) -> None:
        from fleet.provenance import provenance

        if self.campaign is not None:
            return
        self.problem_id = self.store.add_problem(KIND, {"runner": self.name}, ["metaschedule"])
        self.campaign = self.store.create_campaign(
            name=self.name,
            target=self.target,
            problem_ids=[self.problem_id],
            space={"knobs": {"candidate": {"values": [""], "build": True}}, "constraints": [], "base": {}},
            strategy={"name": "metaschedule"},
            workload=self.definition,
            options={"remeasure": True},  # MetaSchedule asked for a measurement: it gets one, not a reused one
            provenance=provenance(),
            baseline=None,
            team=self.team,
        )

    def submit(self, candidates: list[bytes]) -> _Batch:
        """Store each packed candidate as a trial's artifact and send its evaluation; return the batch."""
        from fleet.keys import trial_keys
        from fleet.space import Space
        from fleet.store import NewTrial, Requeue
        from fleet.tasks import send

        self.start()
        space = Space.from_dict(self.campaign.space)
        news, datas = [], {}
        for data in candidates:
            config: Config = {"candidate": hashlib.sha256(data).hexdigest()}
            build_key, measure_key = trial_keys(self.campaign, self.problem_id, config, space)
            self.seq += 1
            news.append(NewTrial(self.problem_id, config, build_key, measure_key, self.seq))
            datas[build_key] = data
        created = self.store.add_trials(self.campaign.id, self.target, news, remeasure=True)
        batch = _Batch([trial_id for trial_id, _ in created])
        with self.lock:
            for trial_id in batch.trial_ids:
                self.pending.setdefault(trial_id, []).append(batch)
        for new, (trial_id, state) in zip(news, created, strict=True):
            if (
                state == TrialState.NEW and self._compile(trial_id, new.build_key, datas[new.build_key])
            ) or state == TrialState.COMPILED:
                # Sent as soon as it is stored: the workers measure the first candidates while the rest are stored.
                # One trial to a message: every evaluation slot of the target takes its share.
                send([Requeue(trial_id, self.target, "evaluate")])
        return batch

    def _compile(self, trial_id: int, build_key: str, data: bytes) -> bool:
        """Record the candidate as the trial's artifact, built here; True when its evaluation is to be sent."""
        s = self.settings
        start = self.store.start_compile(trial_id, self.owner, s.lease_seconds, s.max_attempts, {self.campaign.id: ""})
        if start.outcome == TrialState.COMPILED:
            return True
        if start.outcome != "claimed":
            return False  # not new any more: whoever holds it sends what follows
        artifact = start.artifact
        while True:
            if artifact is None:
                artifact = self.store.claim_build(start.work, self.owner, s.lease_seconds, s.max_attempts, "")
            if artifact.state == ArtifactState.BUILT:
                return bool(self.store.mark_compiled(trial_id, self.owner, ""))
            if artifact.state == ArtifactState.FAILED:
                self.store.record(
                    trial_id, self.owner, state=TrialState.ERRORED, reason=f"build failed: {artifact.reason}"
                )
                return False
            if artifact.worker == self.owner:
                # The same bytes are the same artifact: its digest is the blob's key.
                return bool(self.store.finish_build(build_key, self.owner, data=data, trial_id=trial_id, toolchain=""))
            time.sleep(0.05)  # another runner stores the same candidate right now
            artifact = None

    def poll(self, force: bool = False) -> None:
        """Collect the results of finished trials; give back work whose worker went away."""
        from fleet.tasks import send

        now = time.monotonic()
        if not force and now - self.last_poll < self.interval:
            return
        with self.lock:
            self.last_poll = now
            waiting = sorted(self.pending)
            if not waiting:
                return
            finished = self.store.results(waiting[:500])
            # While nothing comes back, look less often, up to POLL_MAX: a candidate measured for seconds is not
            # waited for with a query every 50 ms, on a database every runner shares and beside the measurement.
            self.interval = self.poll_seconds if finished else min(POLL_MAX, self.interval * 1.5)
            where = self._where([r.trial_id for r in finished if r.state == TrialState.EVALUATED])
            for result in finished:
                value = self._result(result, where.get(result.trial_id))
                for batch in self.pending.pop(result.trial_id, []):
                    batch.results[result.trial_id] = value
                self.measured += 1
            if now - self.last_reap > self.settings.heartbeat_seconds:
                # Workers reap too, in their heartbeats; a fleet whose only worker died has only this runner.
                self.last_reap = now
                stale = self.store.stale(self.settings.requeue_seconds, self.campaign.id)
                send(self.store.reap(self.settings.max_attempts) + stale)

    def _where(self, trial_ids: list[int]) -> dict[int, dict[str, Any]]:
        """Where each measured trial ran (worker, node, device, toolchain): the records' provenance."""
        if not trial_ids:
            return {}
        from sqlalchemy import select

        from fleet.store import Measurement

        query = select(
            Measurement.trial_id, Measurement.worker, Measurement.node, Measurement.device, Measurement.gpu
        ).where(Measurement.trial_id.in_(trial_ids))
        with self.store.session() as session:
            rows = session.execute(query).all()
        return {r.trial_id: {"worker": r.worker, "node": r.node, "device": r.device, "gpu": r.gpu} for r in rows}

    def _result(self, result: Any, where: dict[str, Any] | None) -> tuple[list[float] | None, str | None]:
        if result.state == TrialState.EVALUATED and result.objective is not None:
            secs = run_secs(result.metrics, result.objective)
            with _MEASURED_LOCK:
                MEASURED[tuple(secs)] = {
                    **(where or {}),
                    "trial": result.trial_id,
                    "campaign": self.name,
                    "target": self.target,
                }
            return secs, None
        return None, f"Fleet: trial {result.trial_id} {result.state}: {result.reason or 'no reason given'}"

    def wait(self, batch: _Batch, trial_id: int) -> tuple[list[float] | None, str | None]:
        while trial_id not in batch.results:
            self.poll()
            if trial_id not in batch.results:
                time.sleep(self.interval)
        return batch.results[trial_id]

    def close(self) -> None:
        if self.campaign is not None:
            self.store.set_campaign_status(self.campaign.id, CampaignStatus.DONE)


def pack_candidate(artifact_path: str, device_type: str, args_info: list[Any]) -> bytes:
    """A candidate as a Fleet bundle: its module's tar and the JSON the measuring child needs."""
    from fleet.bundle import pack

    info = {"device_type": device_type, "args_info": args_info}
    return pack({"mod.tar": Path(artifact_path).read_bytes(), "candidate.json": json.dumps(info).encode()})


def _runner_classes() -> tuple[type, type]:
    """FleetRunner and its future, defined once TVM is imported (``derived_object`` registers them with TVM)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    require_tvm()
    future = _future_class()
    _CLASSES = (_runner_class(future), future)
    return _CLASSES


def _future_class() -> type:
    """FleetRunnerFuture: one candidate's measurement, as MetaSchedule waits for it."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunnerFuture, RunnerResult

    @derived_object
    class FleetRunnerFuture(PyRunnerFuture):
        """One candidate's measurement: done once its trial is recorded."""

        def __init__(self, session: _Session, batch: _Batch, trial_id: int) -> None:
            super().__init__()
            self.session, self.batch, self.trial_id = session, batch, trial_id

        def done(self) -> bool:
            if self.trial_id not in self.batch.results:
                self.session.poll()
            return self.trial_id in self.batch.results

        def result(self) -> RunnerResult:
            secs, error = self.session.wait(self.batch, self.trial_id)
            return RunnerResult(secs, error)

    return FleetRunnerFuture


def _runner_class(future: type) -> type:
    """FleetRunner, whose runs are ``future``s."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner

    @derived_object
    class FleetRunner(PyRunner):
        """MetaSchedule's runner on the fleet; see :mod:`fleet.tvm.metaschedule`.

        Parameters
        ----------
        target:
            The Fleet target whose evaluation workers measure (default: this machine's CPU).
        store:
            Fleet's database (default: the environment's).
        evaluator_config, cooldown_sec:
            MetaSchedule's measurement settings, applied by the worker's child as ``LocalRunner`` applies them.
        timeout_sec:
            Longest a candidate's measurement may run on a worker.
        name:
            The campaign's name (default: a new one).
        python:
            The Python the workers start the measuring child with (default: this one).
        team:
            The team that owns the campaign (PostgreSQL; default: none, the operators').
        """

        def __init__(
            self,
            target: str | None = None,
            *,
            store: Any = None,
            evaluator_config: EvaluatorConfig | None = None,
            cooldown_sec: float = 0.0,
            timeout_sec: float = 60.0,
            name: str | None = None,
            python: str | None = None,
            poll_seconds: float = 0.05,
            log: Callable[[str], None] = lambda _: None,
            team: str | None = None,
        ) -> None:
            from fleet.targets import cpu_target

            super().__init__()
            config = EvaluatorConfig._normalized(evaluator_config)
            self.evaluator_config = config
            definition = workload_definition(
                config.number,
                config.repeat,
                config.min_repeat_ms,
                round(cooldown_sec * 1000),
                config.enable_cpu_cache_flush,
                timeout_sec,
                python or sys.executable,
            )
            self.session = _Session(target or cpu_target(), store, definition, name, poll_seconds, log, team)

        @property
        def campaign(self) -> Any:
            return self.session.campaign

        def run(self, runner_inputs: list[Any]) -> list[Any]:
            candidates = [
                pack_candidate(str(i.artifact_path), str(i.device_type), [a.as_json() for a in i.args_info])
                for i in runner_inputs
            ]
            batch = self.session.submit(candidates)
            return [future(self.session, batch, trial_id) for trial_id in batch.trial_ids]

        def close(self) -> None:
            """Mark the campaign done (its trials stay: they are the measurements)."""
            self.session.close()

    return FleetRunner


_CLASSES: tuple[type, type] | None = None


def _builder_class() -> type:
    global _BUILDER
    if _BUILDER is not None:
        return _BUILDER
    require_tvm()
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

    @derived_object
    class InProcessBuilder(PyBuilder):
        """Builds each candidate in this process, as ``LocalBuilder``'s default build and export do."""

        def build(self, build_inputs: list[Any]) -> list[Any]:
            import tvm
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
            from tvm.support.tar import tar

            results = []
            for item in build_inputs:
                try:
                    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(item.mod)
                    path = os.path.join(tempfile.mkdtemp(prefix="fleet-ms-"), "tvm_tmp_mod." + tar.output_format)
                    tvm.compile(mod, target=item.target).export_library(path, fcompile=tar)
                    results.append(BuilderResult(path, None))
                except Exception as error:  # a candidate that does not build is MetaSchedule's failed trial
                    results.append(BuilderResult(None, f"InProcessBuilder: {error}"))
            return results

    _BUILDER = InProcessBuilder
    return _BUILDER


_BUILDER: type | None = None


def __getattr__(name: str) -> Any:
    # The classes need TVM: they are made on first use, so importing this module needs no TVM.
    if name in ("FleetRunner", "FleetRunnerFuture"):
        return dict(zip(("FleetRunner", "FleetRunnerFuture"), _runner_classes(), strict=True))[name]
    if name == "InProcessBuilder":
        return _builder_class()
    raise AttributeError(name)


@dataclass
class Tuned:
    """What :func:`tune` did: records added to the database, seconds taken, and the best record's mean seconds
    (``bests``: each function of the module by its name; ``best_seconds`` and ``schedule``: a module of one)."""

    trials: int
    seconds: float
    best_seconds: float | None
    schedule: Any
    database: Any
    bests: dict[str, float | None] = field(default_factory=dict)


def tune(
    mod: Any,
    target: Any,
    *,
    trials: int,
    runner: Any,
    database: Any,
    work_dir: str | Path | None = None,
    builder: Any = None,
    per_iter: int = 64,
    cost_model: str | None = None,
    seed: int | None = 0,
) -> Tuned:
    """``ms.tune_tir`` of ``mod`` for the TVM ``target`` with ``runner`` and ``database``; return the best found.

    Each function of ``mod`` is a task of its own (a model's layers, say), its records kept under the module of that
    function alone, named ``main``: the workload a tuning of that operator alone has. MetaSchedule's task scheduler
    shares ``trials`` among them.

    Parameters
    ----------
    builder:
        Default: :class:`InProcessBuilder`.
    cost_model:
        MetaSchedule's: ``xgb`` (needs xgboost), ``random``; default ``xgb`` when xgboost is installed.
    """
    require_tvm()
    import tvm.s_tir.meta_schedule as ms

    if cost_model is None:
        try:
            import xgboost  # noqa: F401

            cost_model = "xgb"
        except ImportError:
            cost_model = "random"
    # MetaSchedule logs its progress tables to stdout at the level its logger has: warnings only, unless the
    # caller chose a level; everything still goes to the work directory's logs.
    # (MetaSchedule's logging config sets its logger to DEBUG after a tune: the level is set again before each.)
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    if ms_logger.level == logging.NOTSET or getattr(ms_logger, "fleet_quiet", False):
        ms_logger.setLevel(logging.WARNING)
        ms_logger.fleet_quiet = True  # type: ignore[attr-defined]  # our mark on TVM's logger
    load_intrinsics(target)
    before = len(database)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleet-ms-") as scratch:
        ms.tune_tir(
            mod,
            target,
            str(work_dir or scratch),
            max_trials_global=trials,
            num_trials_per_iter=min(per_iter, trials),
            builder=builder if builder is not None else _builder_class()(),
            runner=runner,
            database=database,
            cost_model=cost_model,
            seed=seed,
        )
    seconds = time.monotonic() - started
    tasks = _tasks(mod)
    bests = {}
    for name, one in tasks:
        record = database.query_tuning_record(one, target, workload_name="main")
        secs = [float(s) for s in record.run_secs] if record is not None and record.run_secs else []
        bests[name] = sum(secs) / len(secs) if secs else None
    if len(tasks) != 1:
        return Tuned(len(database) - before, seconds, None, None, database, bests)
    [(name, one)] = tasks
    schedule = database.query_schedule(one, target, workload_name="main")
    return Tuned(len(database) - before, seconds, bests[name], schedule, database, bests)


def _tasks(mod: Any) -> list[tuple[str, Any]]:
    """Each function of ``mod`` by its name, as the module of that function alone (named ``main``), as
    ``ms.tune_tir`` makes its tasks' workloads."""
    tvm = require_tvm()
    if not isinstance(mod, tvm.IRModule):
        return [("main", tvm.IRModule({"main": mod}))]
    return sorted(
        (gv.name_hint, tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))
        for gv, func in mod.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc)
    )
