"""What a worker does with one trial: claim it, build or measure it, record it. No Celery here.

Every function is safe to run twice for the same trial: the claim in the store decides who works on it,
and only the lease holder records.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from fleet.errors import NodeFault, SpecError, StoreUnavailable
from fleet.settings import Settings, node_name
from fleet.space import build_part
from fleet.states import MEASURED, ArtifactState, TrialState
from fleet.store import INLINE_BYTES, Requeue, Store, TrialWork
from fleet.workers import health
from fleet.workers.cache import ArtifactCache
from fleet.workers.gpus import Device, describe_device
from fleet.workers.observers import observed
from fleet.workers.runner import sandbox_env
from fleet.workers.workloads import Built, Job, Measured, Workload, load_workload

log = logging.getLogger("fleet.worker")
BUILD_POLL_SECONDS = 0.2
# An unhealthy worker checks its node again at most this often, and hands work back meanwhile.
HEALTH_SECONDS = 5.0
# Campaigns whose toolchain a compile claim brings along (see Store.start_compile): a bound on its parameter.
KNOWN_CAMPAIGNS = 64


class ToolchainError(SpecError):
    """The workload's toolchain command cannot run on this worker."""


# What identifies a compiler binary cheaply: the inode, size and modification time of the file its path leads to
# (``os.stat`` follows links).
Stamp = tuple[int, int, int]


def _compiler_path(workload: Workload) -> str | None:
    """The file the workload's toolchain command runs, found on the probe's PATH, or None when it has none (TVM's,
    a replay's) or it is not found (the probe then says so). Its links are followed by each :func:`_stamp`, so
    that a link turned to another compiler (``update-alternatives``) counts as a change."""
    argv = getattr(workload, "toolchain_argv", lambda: None)()
    if not argv:
        return None
    return argv[0] if "/" in argv[0] else shutil.which(argv[0], path=sandbox_env().get("PATH", os.defpath))


def _stamp(path: str | None) -> Stamp | None:
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)


@dataclass(frozen=True)
class Probe:
    """A toolchain command's answer on this worker, with the compiler binary it ran as it was then.

    Parameters
    ----------
    toolchain:
        The first line the command printed.
    path:
        The compiler binary (:func:`_compiler_path`), or None: then the answer holds for the process's life.
    stamp:
        Its :func:`_stamp` before the probe ran.
    """

    toolchain: str
    path: str | None
    stamp: Stamp | None

    def stale(self) -> bool:
        """Whether the compiler changed (upgraded in place, removed, installed) since it was probed."""
        return self.path is not None and _stamp(self.path) != self.stamp


@dataclass
class WorkerContext:
    """One worker process's identity and resources.

    Parameters
    ----------
    store:
        The database.
    name:
        The worker's name (Celery node name, e.g. ``eval-gpu0@node1``); measurements record it.
    settings:
        Lease length and attempt limit come from here.
    env:
        Extra environment for workload commands: this worker's GPU pinning.
    gpu:
        The GPU this worker measures on, as text, or None on a CPU worker.
    """

    store: Store
    name: str
    settings: Settings
    env: dict[str, str] = field(default_factory=dict)
    gpu: str | None = None
    node: str = field(default_factory=node_name)  # measurements record it: FLEET_NODE_NAME, else the host name
    _workloads: dict[int, Workload] = field(default_factory=dict, repr=False)
    # The toolchain found for each toolchain command (a workload's toolchain_key), with the stat of the compiler it
    # ran (see Probe), and for each campaign met; the toolchain command of each campaign met.
    _toolchains: dict[str, Probe] = field(default_factory=dict, repr=False)
    toolchains: dict[int, str] = field(default_factory=dict, repr=False)
    _toolchain_keys: dict[int, str] = field(default_factory=dict, repr=False)
    _lap: float = field(default_factory=time.monotonic, repr=False)
    # Why this worker's node is unhealthy (fleet.workers.health), when it was last checked, and the trials a
    # fault gave back, for the task to send.
    fault: str | None = None
    # The target this worker serves (the launcher's FLEET_WORKER_TARGET): a claimed trial of another is given back.
    target: str | None = field(default_factory=lambda: os.environ.get("FLEET_WORKER_TARGET") or None)
    _fault_checked: float = 0.0
    _fault_read: bool = False
    _given_back: list[Requeue] = field(default_factory=list, repr=False)

    def lap(self) -> float:
        """Seconds since the last lap (or since the process began): a slot's time on one trial, when each
        message starts a lap and each trial ends one. The laps tile the slot's time, so a trial's counts
        what its message and the previous trial's record cost too, not only its own claim and measurement."""
        now = time.monotonic()
        seconds, self._lap = now - self._lap, now
        return seconds

    @property
    def owner(self) -> str:
        # Processes of one Celery worker share its name; leases must tell them apart.
        return f"{self.name}/{os.getpid()}"

    @cached_property
    def cache(self) -> ArtifactCache:
        return ArtifactCache(self.settings.cache_dir / "artifacts")

    @cached_property
    def _scratch_path(self) -> Path:
        # A context belongs to one process (see fleet.tasks.lifecycle.context), so its pid is fixed.
        return self.settings.cache_dir / "scratch" / f"{self.node}-{os.getpid()}"

    @contextmanager
    def scratch(self) -> Iterator[Path]:
        """A private, empty directory for one build or run, emptied afterwards.

        One directory per process, reused: creating and removing a fresh one for every trial costs more
        than a no-op trial's whole bookkeeping on a slow filesystem.
        """
        path = self._scratch_path
        path.mkdir(parents=True, exist_ok=True)
        try:
            yield path
        finally:
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)

    def workload(self, campaign_id: int, definition: dict) -> Workload:
        """The campaign's workload, validated once per process."""
        if campaign_id not in self._workloads:
            self._workloads[campaign_id] = load_workload(definition)
        return self._workloads[campaign_id]

    def toolchain(self, campaign_id: int, definition: dict, tick: Callable[[], bool]) -> str | None:
        """The campaign's toolchain on this machine: its workload's toolchain command, run again only when the
        compiler it runs changed (see :meth:`fresh_toolchains`).

        The command may take a while (``nvcc --version`` on a cold disk; importing TVM takes seconds): the
        trial's lease is renewed with ``tick`` meanwhile. Returns None when the lease was lost all the same;
        raises :class:`ToolchainError` when the command cannot run here (the compiler is not installed).
        """
        known = self.toolchains.get(campaign_id)
        if known is not None:
            return known
        workload = self.workload(campaign_id, definition)
        key = workload.toolchain_key()
        held = True
        probe = self._toolchains.get(key)
        if probe is None or probe.stale():
            path = _compiler_path(workload)
            stamp = _stamp(path)  # before the probe: a compiler replaced meanwhile is probed again next time
            with ThreadPoolExecutor(1) as pool:
                found = pool.submit(workload.toolchain)
                while True:
                    try:
                        probe = Probe(found.result(timeout=self.tick_seconds), path, stamp)
                        break
                    except FutureTimeout:
                        held = tick() and held
                    except SpecError as error:
                        raise ToolchainError(f"{error} (on {self.node})") from None
            self._toolchains[key] = probe
        if len(self.toolchains) >= KNOWN_CAMPAIGNS:
            forgotten = next(iter(self.toolchains))
            del self.toolchains[forgotten], self._toolchain_keys[forgotten]
        self.toolchains[campaign_id] = probe.toolchain
        self._toolchain_keys[campaign_id] = key
        return probe.toolchain if held else None

    def fresh_toolchains(self) -> dict[int, str]:
        """The toolchain of each campaign met, for a compile claim (:meth:`Store.start_compile`), less those whose
        compiler changed on disk since it was probed: a compiler upgraded in place is probed again by the next
        build of its campaigns, and builds new artifacts, without a restart.

        One ``stat`` per compiler known (a few microseconds), no database round trip: the claim of a campaign
        left out creates no artifact, and :meth:`toolchain` probes again before the build is claimed.
        """
        for key, probe in list(self._toolchains.items()):
            if probe.stale():
                del self._toolchains[key]
                for campaign_id in [c for c, k in self._toolchain_keys.items() if k == key]:
                    del self.toolchains[campaign_id], self._toolchain_keys[campaign_id]
        return self.toolchains

    @cached_property
    def device(self) -> Device:
        """The device this worker measures on (its GPU, or the CPU), found once per process."""
        return describe_device(self.gpu)

    @property
    def tick_seconds(self) -> float:
        # Renew three times per lease, so one slow database round trip does not lose the work.
        return min(5.0, self.settings.lease_seconds / 3)

    def node_fault(self, trial_id: int, phase: str, fault: NodeFault | str, build_key: str | None = None) -> str:
        """Give the trial back to its queue for a fault of this node, and say the node is unhealthy."""
        self.fault, self._fault_checked = str(fault), time.monotonic()
        self.store.set_fault(self.name, self.fault)
        given = self.store.give_back(trial_id, self.owner, phase, build_key)
        failed = self.store.fail_faulted([r.trial_id for r in given], self.settings.max_node_faults, self.fault)
        given = [r for r in given if r.trial_id not in failed]
        log.warning(
            "this node is unhealthy: %s; trials %s go back to their queue", self.fault, [r.trial_id for r in given]
        )
        if failed:
            log.warning("trials %s errored: %d node faults each", sorted(failed), self.settings.max_node_faults)
        self._given_back += given
        return "node fault"

    def misrouted(self, work: TrialWork, phase: str) -> bool:
        """Whether ``work`` is for another target than this worker's: then it is given back, for its own queue.

        A message names its target, but anyone who can write to the broker can send one: a hand-made
        ``fleet.compile`` naming an ``sm_90`` trial must not be built and measured on a CPU worker.
        """
        if self.target is None or work.target == self.target:
            return False
        log.warning("trial %d is for %s, not this worker's %s: given back", work.trial_id, work.target, self.target)
        build_key = work.build_key if phase == "compile" else None
        self._given_back += self.store.give_back(work.trial_id, self.owner, phase, build_key, fault=False)
        return True

    def given_back(self) -> list[Requeue]:
        """The trials :meth:`node_fault` gave back since the last call: to send again."""
        given, self._given_back = self._given_back, []
        return given

    def healthy(self) -> bool:
        """Whether this worker may take work: its node has no fault, or a new check (every few seconds) passed."""
        if not self._fault_read:
            # A process the pool started in place of a lost one (fleet.tasks.lost) learns its node's fault here.
            self._fault_read = True
            self.fault = self.fault or self.store.worker_fault(self.name)
        if self.fault is None:
            return True
        if time.monotonic() - self._fault_checked < HEALTH_SECONDS:
            return False
        self._fault_checked = time.monotonic()
        if health.check(self.settings.cache_dir) is not None:
            return False
        self.fault = None
        self.store.set_fault(self.name, None)
        return True

    def ticker(self, trial_id: int, build_key: str | None = None) -> Callable[[], bool]:
        """Renews this worker's lease while a command runs; False once the lease is lost."""
        return lambda: self.store.renew(trial_id, self.owner, self.settings.lease_seconds, build_key)


def compile_trial(ctx: WorkerContext, trial_id: int, handed: list[int] | None = None) -> str:
    """Make sure ``trial_id``'s artifact exists, building it if nobody else is; return the outcome.

    ``compiled`` means send the evaluation next; ``skipped`` means this delivery was a duplicate.

    Parameters
    ----------
    handed:
        Given by a caller that sends the evaluations itself (the compile task). A trial whose artifact
        another worker is building is then handed to that build (``handed``: the builder sends its
        evaluation) instead of waiting for it in this build slot; and the trials handed to this worker's
        build, once it is built, are appended here. Without it, such a trial waits for the build.
    """
    s = ctx.settings
    toolchains = ctx.fresh_toolchains()
    start = ctx.store.start_compile(trial_id, ctx.owner, s.lease_seconds, s.max_attempts, toolchains)
    if start.outcome != "claimed":
        return start.outcome
    work, artifact = start.work, start.artifact
    assert work is not None
    if ctx.misrouted(work, "compile"):
        return "misrouted"
    try:
        tick = ctx.ticker(trial_id)
        toolchain = ctx.toolchain(work.campaign_id, work.workload, tick)
        if toolchain is None:
            return "lost"
        if artifact is None:  # the first trial of its campaign here: the claim could not name the toolchain
            artifact = ctx.store.claim_build(work, ctx.owner, s.lease_seconds, s.max_attempts, toolchain)
        return _until_built(ctx, trial_id, work, artifact, toolchain, tick, handed)
    except StoreUnavailable:
        raise  # not the trial's fault: its lease gives it back once the database answers again
    except NodeFault as fault:
        return ctx.node_fault(trial_id, "compile", fault, work.build_key)
    except OSError as error:  # the worker's own files: its scratch, its cache
        found = health.from_os_error(error, "the build")
        if found is None:
            ctx.store.record(trial_id, ctx.owner, state=TrialState.ERRORED, reason=f"compile failed: {error!r}")
            raise
        return ctx.node_fault(trial_id, "compile", found, work.build_key)
    except ToolchainError as error:
        # Its own reason, one line: the fix is to install the compiler on this node, not in the spec.
        ctx.store.record(trial_id, ctx.owner, state=TrialState.ERRORED, reason=str(error))
        return TrialState.ERRORED
    except Exception as error:
        ctx.store.record(trial_id, ctx.owner, state=TrialState.ERRORED, reason=f"compile failed: {error!r}")
        raise


def _until_built(
    ctx: WorkerContext,
    trial_id: int,
    work: TrialWork,
    artifact: Any,
    toolchain: str,
    tick: Callable[[], bool],
    handed: list[int] | None,
) -> str:
    """Build the trial's artifact, or wait for (or hand the trial to) the worker building it, until it is built or
    failed; the outcome, as :func:`compile_trial` returns it."""
    s = ctx.settings
    last_tick = time.monotonic()
    while True:
        if artifact.state == ArtifactState.FAILED:
            reason = f"build failed: {artifact.reason}"
            ctx.store.record(
                trial_id, ctx.owner, state=TrialState.ERRORED, reason=reason, stderr_tail=artifact.log_tail
            )
            return TrialState.ERRORED
        if artifact.state == ArtifactState.BUILT:
            compiled = ctx.store.mark_compiled(trial_id, ctx.owner, toolchain, seconds=ctx.lap())
            return TrialState.COMPILED if compiled else "lost"
        if artifact.worker == ctx.owner:
            if _build(ctx, work, toolchain, handed):
                return TrialState.COMPILED
        elif handed is not None:
            # Another worker is building the same key right now: its build ends this compile too, and this
            # build slot goes on to the next build instead of waiting (refused: that build has just ended).
            builder = artifact.worker
            if ctx.store.hand_to_builder(trial_id, ctx.owner, work.build_key, toolchain, builder, s.lease_seconds):
                # Still building: its end will find the trial. Ended already: it may have looked before
                # the trial was handed, so the trial is taken back, unless that build has ended it.
                artifact = ctx.store.claim_build(work, ctx.owner, s.lease_seconds, s.max_attempts, toolchain)
                if artifact.state == ArtifactState.BUILDING and artifact.worker == builder:
                    return "handed"
                if not ctx.store.take_back(trial_id, ctx.owner, builder, s.lease_seconds):
                    return "handed"
                continue
        else:
            # Wait for it, keeping our own claim.
            time.sleep(BUILD_POLL_SECONDS)
            if time.monotonic() - last_tick > ctx.tick_seconds:
                if not tick():
                    return "lost"
                last_tick = time.monotonic()
        artifact = ctx.store.claim_build(work, ctx.owner, s.lease_seconds, s.max_attempts, toolchain)


def _build(ctx: WorkerContext, work: TrialWork, toolchain: str, handed: list[int] | None) -> bool:
    """Build and record the artifact, and end the compiles handed to it; True when the trial is now ``compiled``."""
    workload = ctx.workload(work.campaign_id, work.workload)
    with ctx.scratch() as scratch:
        job = Job(
            config=build_part(work.space, work.config),
            problem=work.problem_params,
            scratch=scratch,
            fetch=lambda key: ctx.cache.get(key, ctx.store.get_blob),
            tick=ctx.ticker(work.trial_id, work.build_key),
            campaign=work.campaign_id,
            tick_seconds=ctx.tick_seconds,
            env=ctx.env,
        )
        try:
            built = workload.build(job)
        except (StoreUnavailable, NodeFault):
            raise  # not the build's: its lease, or the node's fault (see compile_trial), gives the trial back
        except Exception as error:
            if isinstance(error, OSError) and health.from_os_error(error, "the build") is not None:
                raise
            # The build's own failure, which another try would meet again: recorded as its artifact's, so that
            # every trial waiting on it ends now. Raised on, it left the artifact building until its lease ran
            # out, to be taken over and raised again, three times, until it was "lost" for its worker's death.
            log.exception("trial %d: the build raised", work.trial_id)
            built = Built(None, f"the build raised {error!r}", traceback.format_exc()[-4096:])
    if built.data is not None and len(built.data) > INLINE_BYTES:
        # The node's cache gets it now, so an evaluation here need not fetch it back; a small artifact
        # comes with the evaluation's claim instead.
        ctx.cache.put(hashlib.sha256(built.data).hexdigest(), built.data)
    ctx.store.finish_build(
        work.build_key,
        ctx.owner,
        data=built.data,
        reason=built.reason,
        log_tail=built.log_tail,
        seconds=built.seconds,
        trial_id=work.trial_id,
        toolchain=toolchain,
        handed=handed,  # a successful build compiles the trials handed to it, and names them here
        took=ctx.lap(),
    )
    if handed is not None and built.data is None:
        for trial_id in ctx.store.handed_trials(work.trial_id, work.build_key, ctx.owner):
            # They end as the trial that built it does.
            reason = f"build failed: {built.reason}"
            ctx.store.record(trial_id, ctx.owner, state=TrialState.ERRORED, reason=reason, stderr_tail=built.log_tail)
    return built.data is not None


def evaluate_trial(ctx: WorkerContext, trial_id: int) -> str:
    """Measure ``trial_id`` with its artifact and record the result; return the trial's new state."""
    s = ctx.settings
    device = ctx.device
    work = ctx.store.claim(trial_id, "evaluate", ctx.owner, s.lease_seconds, s.max_attempts, device.kind)
    if work is None:
        return "skipped"
    if ctx.misrouted(work, "evaluate"):
        return "misrouted"
    if work.reuse is not None:
        # Measured before with the same toolchain on the same kind of device: that measurement answers.
        state = TrialState.EVALUATED if work.reuse_valid else TrialState.INVALID
        recorded = ctx.store.record(trial_id, ctx.owner, state=state, source=work.reuse, seconds=ctx.lap())
        return state if recorded else "lost"
    try:
        workload = ctx.workload(work.campaign_id, work.workload)
        if work.artifact_digest is None:
            ctx.store.record(
                trial_id, ctx.owner, state=TrialState.ERRORED, reason="its artifact is missing", seconds=ctx.lap()
            )
            return TrialState.ERRORED
        data = work.artifact_data
        if data is None:
            data = ctx.cache.get(work.artifact_digest, ctx.store.get_blob)
        measured = _measured(ctx, work, workload, data)
    except StoreUnavailable:
        raise  # as in compile_trial
    except NodeFault as fault:
        return ctx.node_fault(trial_id, "evaluate", fault)
    except OSError as error:
        found = health.from_os_error(error, "the evaluation")
        if found is None:
            reason = f"evaluate failed: {error!r}"
            ctx.store.record(trial_id, ctx.owner, state=TrialState.ERRORED, reason=reason, seconds=ctx.lap())
            raise
        return ctx.node_fault(trial_id, "evaluate", found)
    except Exception as error:
        ctx.store.record(
            trial_id, ctx.owner, state=TrialState.ERRORED, reason=f"evaluate failed: {error!r}", seconds=ctx.lap()
        )
        raise
    recorded = ctx.store.record(
        trial_id,
        ctx.owner,
        state=measured.state,
        reason=measured.reason,
        measurement=_measurement(ctx, work, workload, measured),
        stdout_tail=measured.stdout_tail,
        stderr_tail=measured.stderr_tail,
        seconds=ctx.lap(),
    )
    return measured.state if recorded else "lost"


def _measured(ctx: WorkerContext, work: TrialWork, workload: Workload, data: bytes) -> Measured:
    """Run the workload's evaluation of ``work`` with its artifact's ``data``, in a scratch directory of its own,
    under the GPU's observer."""
    with ctx.scratch() as scratch:
        job = Job(
            config=work.config,
            problem=work.problem_params,
            scratch=scratch,
            fetch=lambda key: ctx.cache.get(key, ctx.store.get_blob),
            tick=ctx.ticker(work.trial_id),
            campaign=work.campaign_id,
            tick_seconds=ctx.tick_seconds,
            env=ctx.env,
        )
        # The GPU's clocks, power and energy while it ran become metrics (fleet.workers.observers).
        definition = workload.definition
        measured = observed(
            ctx.gpu,
            lambda: workload.evaluate(job, data),
            definition.get("objective"),
            clocks=definition.get("clocks"),
            values={**work.problem_params, **work.config},
        )
        return workload.with_observed(measured)  # several objectives: those the observer read


def _measurement(ctx: WorkerContext, work: TrialWork, workload: Workload, measured: Measured) -> dict[str, Any] | None:
    """The measurement a run records, as :meth:`Store.record` takes it; None for a run that measured nothing."""
    if measured.state not in MEASURED:  # an invalid run keeps its samples and metrics too
        return None
    device = ctx.device
    return {
        "objective_name": workload.objective_name,
        "maximize": workload.maximize,
        "objective": measured.objective,
        "valid": measured.state == TrialState.EVALUATED,
        "samples": measured.samples,
        "metrics": measured.metrics,
        "objectives": measured.objectives or None,
        "toolchain": work.toolchain,
        "node": ctx.node,
        "gpu": ctx.gpu,
        "device_kind": device.kind,
        "device": device.description,
        "worker": ctx.name,
    }
