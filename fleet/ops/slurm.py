"""Workers behind Slurm: the sbatch script that starts them, the GPUs a node was given, and scaling by queue depth.

A Slurm job of Fleet's runs ``fleet slurm node`` once on each of its nodes (one ``srun`` task per node), which
starts ``fleet worker`` on exactly the GPUs Slurm allocated there. Slurm sends SIGTERM to the job's steps a while
before the wall time (``--signal``): the worker's warm shutdown takes no new trial and lets the running one finish;
one that cannot finish in time is killed with its worker, and the database's lease gives it back to another. The
database's URLs reach the job as 0600 files named by ``FLEET_*_URL_FILE``: never on the command line, in the
script, or in the environment sbatch passes on (the script asks for ``--export=NONE``).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.errors import ConfigurationError, FleetError
from fleet.settings import SECRETS, Settings, child_env

if TYPE_CHECKING:
    from fleet.store import Store

# Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# A job array's size, with the most of its elements that may run at once: 8, 8%2.
_ARRAY = re.compile(r"([1-9][0-9]*)(?:%([1-9][0-9]*))?")
# Partition and account names; a comma separates several partitions.
_NAME = re.compile(r"[A-Za-z0-9_.\-]+(?:,[A-Za-z0-9_.\-]+)*")
# The variables Slurm sets with a node's allocated GPUs, the most specific first: what CUDA / ROCm will number
# the devices as (renumbered from 0 where cgroups confine the job), then Slurm's own indices.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
# Job states that hold or will hold nodes: scaling counts them as capacity, and against --max. COMPLETING (its
# processes being killed after the job ended) and the finished ones no longer count.
PENDING_STATES = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
LIVE_STATES = PENDING_STATES | {"CONFIGURING", "RUNNING", "RESIZING", "SIGNALING", "STOPPED", "SUSPENDED"}
DEFAULT_DRAIN = 300


class SlurmError(FleetError):
    """A Slurm command that failed, or a value Slurm would not take."""


def parse_time(text: str) -> int:
    """Seconds of a Slurm ``--time`` (``90``, ``4:00:00``, ``1-12``); :class:`SlurmError` when it is none."""
    match = _TIME.fullmatch(text.strip())
    if not match:
        raise SlurmError(f"--time {text!r}: expected minutes, HH:MM:SS or D-HH:MM:SS, as sbatch takes it")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # HH:MM:SS
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:  # MM:SS
        seconds = int(first) * 60 + int(second)
    else:  # minutes
        seconds = int(first) * 60
    if seconds <= 0:
        raise SlurmError(f"--time {text!r}: a job needs some time")
    return seconds


def sbatch_quote(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line: sbatch reads double quotes and backslash escapes there,
    and an unescaped ``#`` ends the line's arguments, even within quotes."""
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise SlurmError(f"{value!r}: a control character cannot be written on an #SBATCH line")
    return '"' + re.sub(r'(["\\#])', r"\\\1", value) + '"'


@dataclass(frozen=True)
class SlurmJob:
    """What one Slurm job of workers asks for.

    Parameters
    ----------
    target:
        The target the workers serve (``sm_90``); the job is named ``fleet-<target>``, which scaling counts by.
    nodes, gpus_per_node:
        Nodes of the job, and GPUs asked for on each (one evaluation worker each).
    time:
        Wall time, as sbatch takes it.
    drain:
        Seconds before the wall time at which Slurm sends SIGTERM and the workers drain; by default 300 s, or a
        quarter of a short wall time.
    extra:
        Further sbatch options, written as ``#SBATCH`` lines as given.
    array:
        ``N`` or ``N%M``: a job array of N such jobs (elements), at most M of them running at once; one sbatch,
        one id, each element its own job (``ID_0`` ... in squeue) that scaling counts and cancels one by one.
    """

    target: str
    nodes: int = 1
    gpus_per_node: int = 1
    time: str = "4:00:00"
    partition: str | None = None
    account: str | None = None
    drain: int | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    array: str | None = None

    @property
    def name(self) -> str:
        return f"fleet-{self.target}"

    @property
    def slots(self) -> int:
        """Evaluation workers the job runs: one per allocated GPU."""
        return self.nodes * self.gpus_per_node

    def drain_seconds(self) -> int:
        wall = parse_time(self.time)
        drain = self.drain if self.drain is not None else min(DEFAULT_DRAIN, max(1, wall // 4))
        if drain >= wall:
            raise SlurmError(f"--drain {drain}: the workers would drain before they start, with a --time of {wall} s")
        if drain > 65535:  # sbatch's --signal takes no more
            raise SlurmError(f"--drain {drain}: Slurm sends its warning at most 65535 s ahead")
        return drain

    def _array(self) -> tuple[int, str] | None:
        """The array's size and the most elements running at once (``%M``, or ""), or None for a single job."""
        if self.array is None:
            return None
        match = _ARRAY.fullmatch(self.array.strip())
        if not match:
            raise SlurmError(f"--array {self.array!r}: expected a count of jobs, N, or N%M to run at most M at once")
        return int(match.group(1)), f"%{match.group(2)}" if match.group(2) else ""

    def elements(self) -> int:
        """Jobs one submission makes: the array's size, or 1."""
        array = self._array()
        return 1 if array is None else array[0]

    def array_directive(self) -> str | None:
        """sbatch's ``--array`` value (``0-7%2``), or None for a single job."""
        array = self._array()
        return None if array is None else f"0-{array[0] - 1}{array[1]}"

    def check(self) -> None:
        """One clear line for each value sbatch would refuse, or that has no place in an #SBATCH line."""
        from fleet.targets import check_target

        check_target(self.target)
        self.drain_seconds()
        self.elements()
        for option, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _NAME.fullmatch(value):
                raise SlurmError(f"{option} {value!r}: not a Slurm {option[2:]} name")
        for flag in self.extra:
            if not flag.startswith("-"):
                raise SlurmError(f"{flag!r}: an extra sbatch option after -- starts with '-' (--qos=high)")
            sbatch_quote(flag)  # refuses a control character

    def stop_timeout(self) -> int:
        """Seconds the workers' warm shutdown may wait for the running measurement: the warning less a margin for
        Celery to leave the broker before Slurm kills the job."""
        drain = self.drain_seconds()
        return max(1, drain - min(30, drain // 4))


def secret_files(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """``FLEET_*_URL_FILE`` variables naming 0600 files with the fleet's URLs, written to ``folder`` where the URLs
    were given as plain variables; a job on another node reads them there (a shared home, as on every cluster)."""
    files = child_env({name: env[name] for name in SECRETS if env.get(name)}, folder)
    for name in SECRETS:
        given = env.get(f"{name}_FILE")
        if name not in env and given:
            files[f"{name}_FILE"] = str(Path(given).absolute())
        if f"{name}_FILE" not in files:
            raise ConfigurationError(
                f"fleet slurm needs the fleet's {name} (or {name}_FILE): Slurm's workers cannot reach an embedded one"
            )
    return files


def shared_services(settings: Settings) -> str | None:
    """Refuse, in one line (:class:`SlurmError`), a database or broker that the job's nodes cannot share: a SQLite
    file (one machine's, its locks unreliable over NFS), kombu's filesystem transport or an embedded broker. A
    warning, or None, for one they reach only when they are this machine (a loopback address, a unix socket):
    that holds for a Slurm on one host, so it is not refused."""
    from urllib.parse import urlsplit

    from sqlalchemy.engine import make_url

    if settings.embedded_database or settings.database_url.startswith("sqlite"):
        where = (
            "no FLEET_DATABASE_URL (or FLEET_DATABASE_URL_FILE) is set, so the database is this machine's SQLite file"
            if settings.embedded_database
            else f"FLEET_DATABASE_URL is a SQLite file ({make_url(settings.database_url).database})"
        )
        raise SlurmError(
            f"{where}: Slurm's nodes cannot share it; give the fleet's PostgreSQL "
            "(postgresql://USER:PASSWORD@HOST:PORT/DATABASE)"
        )
    broker = settings.broker_url
    if settings.embedded_broker or broker.startswith("filesystem://"):
        where = (
            "no FLEET_BROKER_URL (or FLEET_BROKER_URL_FILE) is set, so the broker is this machine's own"
            if settings.embedded_broker
            else "FLEET_BROKER_URL is kombu's filesystem transport"
        )
        raise SlurmError(f"{where}: Slurm's nodes cannot share it; give the fleet's Redis (redis://HOST:PORT/DB)")
    database_host = make_url(settings.database_url).host
    broker_host = None if broker.startswith("redis+socket://") else urlsplit(broker).hostname
    local = ("localhost", "127.0.0.1", "::1", None)
    said = [
        f"{name} names {host or 'a unix socket'}"
        for name, host in (("FLEET_DATABASE_URL", database_host), ("FLEET_BROKER_URL", broker_host))
        if host in local or (host or "").startswith("127.")
    ]
    if not said:
        return None
    them = "them" if len(said) > 1 else "it"
    return f"warning: {' and '.join(said)}: only jobs that run on this machine reach {them}"


def forwarded(env: Mapping[str, str]) -> dict[str, str]:
    """What the job's environment keeps of the submitter's: PATH and Fleet's settings, never a secret or the name
    of this node."""
    names = {*SECRETS, *(f"{name}_FILE" for name in SECRETS), "FLEET_NODE_NAME"}
    kept = {name: value for name, value in env.items() if name.startswith("FLEET_") and name not in names}
    if env.get("PATH"):
        kept["PATH"] = env["PATH"]
    return dict(sorted(kept.items()))


def script(job: SlurmJob, *, env: Mapping[str, str], output: Path, python: str = sys.executable) -> str:
    """The sbatch script that runs ``job``: readable, editable by hand, every value quoted.

    Parameters
    ----------
    env:
        The job's environment: what :func:`forwarded` keeps, and the secrets' ``_FILE`` variables.
    output:
        The folder of the jobs' logs (``fleet-<target>-<job id>.out``).
    python:
        The interpreter with Fleet installed, on the nodes' shared file system.
    """
    job.check()
    drain = job.drain_seconds()
    array = job.array_directive()
    log = "%x-%A_%a.out" if array else "%x-%j.out"  # an array's elements by the array's id and their index
    directives = [
        f"--job-name={sbatch_quote(job.name)}",
        *([f"--array={array}"] if array else []),
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={job.gpus_per_node}",
        f"--time={sbatch_quote(job.time)}",
        f"--signal=TERM@{drain}",
        "--export=NONE",
        f"--output={sbatch_quote(str(output / log))}",
    ]
    if job.partition:
        directives.append(f"--partition={sbatch_quote(job.partition)}")
    if job.account:
        directives.append(f"--account={sbatch_quote(job.account)}")
    directives += [sbatch_quote(flag) for flag in job.extra]
    node = [python, "-m", "fleet.cli", "slurm", "node", "--target", job.target]
    node += ["--stop-timeout", str(job.stop_timeout())]
    each = f"{job.nodes} node(s) x {job.gpus_per_node} GPU(s)"
    if array:
        each = f"a job array of {job.elements()} jobs ({array}), each of {each}"
    lines = [
        "#!/bin/bash",
        f"# Fleet workers for target {job.target}: {each}, written by",
        "# `fleet slurm submit`; edit it freely and submit it with sbatch.",
        "# Each node runs `fleet slurm node`, which starts `fleet worker` on the GPUs Slurm allocated there.",
        f"# {drain} s before the wall time Slurm sends SIGTERM: the workers take no new trial, finish the running",
        "# one (or hand it back) and exit. The fleet's URLs are read from 0600 files, never from this script.",
        *(f"#SBATCH {directive}" for directive in directives),
        "set -euo pipefail",
        *(f"export {name}={shlex.quote(value)}" for name, value in env.items()),
        # --export=NONE above keeps the submitter's environment out of the job; srun passes the script's on.
        "srun --export=ALL --ntasks-per-node=1 --kill-on-bad-exit=0 " + shlex.join(node),
        "",
    ]
    return "\n".join(lines)


def allocated_gpus(env: Mapping[str, str]) -> str:
    """The GPU indices Slurm allocated to this node's task (``0,1``); :class:`SlurmError` when it gave none."""
    for name in GPU_VARIABLES:
        value = env.get(name, "").strip()
        if value and value != "NoDevFiles":
            indices = [part.strip() for part in value.split(",")]
            if not all(part.isdigit() for part in indices):
                raise SlurmError(f"{name}={value!r}: expected GPU indices (0,1); ask Slurm for GPUs by index")
            return ",".join(indices)
    raise SlurmError(
        "Slurm allocated no GPU to this task (none of " + ", ".join(GPU_VARIABLES) + " is set): "
        "ask for them with --gpus-per-node"
    )


def node_name(env: Mapping[str, str]) -> str:
    """The name this node's workers register under: Slurm's node and the job, so that each job's workers are its
    own (two jobs may share a node, each with its own GPUs) and `fleet slurm scale` can tell them apart."""
    node = env.get("SLURMD_NODENAME") or os.uname().nodename
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"  # as squeue and scancel name the element
    if not job:
        raise SlurmError("fleet slurm node runs inside a Slurm job (srun in the script `fleet slurm submit` writes)")
    return f"{node}.slurm-{job}"


def worker_argv(target: str, env: Mapping[str, str], stop_timeout: float, python: str = sys.executable) -> list[str]:
    """The ``fleet worker`` command of this node: its allocated GPUs, its cores, the drain's time limit."""
    argv = [python, "-m", "fleet.cli", "worker", "--target", target, "--stop-timeout", str(stop_timeout)]
    if not target.startswith("cpu"):
        argv += ["--gpus", allocated_gpus(env)]
    cores = env.get("SLURM_CPUS_ON_NODE", "")
    if cores.isdigit() and int(cores) > 0:
        argv += ["--build-procs", cores]
    return argv


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env=env, check=False)
    except FileNotFoundError:
        raise SlurmError(
            f"{argv[0]} not found: run this on a Slurm login node (or put Slurm's commands on PATH)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within 60 s: is slurmctld up?") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
        raise SlurmError(f"{argv[0]} failed: {last}")
    return done.stdout


def submit(text: str, folder: Path, job: SlurmJob, env: Mapping[str, str]) -> str:
    """Write the script to ``folder`` and submit it; its job id. sbatch gets no secret in its own environment."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.sbatch"
    path.write_text(text)
    clean = {name: value for name, value in env.items() if name not in SECRETS}
    return _run(["sbatch", "--parsable", str(path)], env=clean).strip().split(";")[0]


@dataclass(frozen=True)
class SlurmJobState:
    """One live job (or one element of a job array) of a target's workers, as squeue shows it.

    ``draining``: its workers take no new trial and will exit: the warning before its wall time came (its time
    left is within the drain), or ``fleet slurm scale`` signalled it. It still holds its nodes and counts against
    ``--max``, and as capacity until it is gone: a replacement for it is submitted then, not before.
    """

    id: str
    state: str
    draining: bool = False

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES


def seconds_left(text: str) -> int | None:
    """Seconds of squeue's time left (``%L``: ``[D-][[H:]M:]S``), or None for ``UNLIMITED``, ``NOT_SET``, ..."""
    days, _, rest = text.strip().rpartition("-")
    parts = rest.split(":")
    if not (days.isdigit() or not days) or not all(part.isdigit() for part in parts) or len(parts) > 3:
        return None
    seconds = sum(int(part) * 60**power for power, part in enumerate(reversed(parts)))
    return seconds + int(days or 0) * 86400


def _job_order(state: SlurmJobState) -> tuple[int, int]:
    # 12 before 13; an array's elements (12_0, 12_1) in order after their array's id.
    first, _, element = state.id.partition("_")
    return (int(first) if first.isdigit() else 0, int(element) if element.isdigit() else -1)


def jobs(job: SlurmJob, signalled: frozenset[str] = frozenset()) -> list[SlurmJobState]:
    """This account's live jobs of ``job``'s target (by their name ``fleet-<target>``), oldest first, an array's
    elements one by one (a pending array is one line of squeue's otherwise, and would count as one job).

    Those in ``signalled`` (sent SIGTERM by ``fleet slurm scale``), and those whose time left is within
    ``job``'s drain, are draining."""
    import getpass

    argv = ["squeue", "--noheader", "--array", f"--name={job.name}", f"--user={getpass.getuser()}", "--format=%i|%T|%L"]
    drain = job.drain_seconds()
    found = []
    for line in _run(argv).splitlines():
        ident, state, left = [*line.strip().split("|"), "", ""][:3]
        if not ident or state not in LIVE_STATES:
            continue
        remaining = seconds_left(left)
        leaving = state not in PENDING_STATES and remaining is not None and remaining <= drain
        found.append(SlurmJobState(ident, state, ident in signalled or leaving))
    return sorted(found, key=_job_order)


def cancel(state: SlurmJobState) -> None:
    """Cancel a job: a pending one outright; a running one with SIGTERM to its steps, so its workers drain."""
    if state.pending:
        _run(["scancel", state.id])
    else:
        _run(["scancel", "--signal=TERM", state.id])


def demand(store: Store, target: str, settings: Settings) -> tuple[int, bool]:
    """Messages in ``target``'s build and evaluation queues (waiting or taken), and whether a campaign on it runs."""
    from fleet.ops.queues import queue_health
    from fleet.states import CampaignStatus

    queues = queue_health(None, settings=settings, inspect_timeout=0.2)
    messages = sum(q.waiting + (q.unacked or 0) for q in queues if q.name in (f"build.{target}", f"eval.{target}"))
    running = any(c.target == target and c.status == CampaignStatus.RUNNING for c in store.campaigns())
    return messages, running


def wanted(messages: int, running: bool, slots: int, low: int, high: int) -> int:
    """Jobs that ``messages`` queued call for, between ``low`` and ``high``: one evaluation worker per message,
    and at least one job while a campaign runs on the target (its driver sends work only as it goes)."""
    need = math.ceil(messages / max(1, slots))
    if running:
        need = max(need, 1)
    return max(low, min(high, need))


@dataclass
class Scaler:
    """``fleet slurm scale``: submits jobs when a target's queues grow, cancels them when they empty.

    Every live job counts as capacity and against ``high``: a pending one will serve, a draining one (past its
    wall time's warning, or cancelled here) holds its nodes until its running trial ends. Jobs are added at once;
    they are taken away only after the demand stayed below them for ``cooldown`` seconds, so that a campaign's
    pause between batches does not cancel the workers it is about to need. That moment, and the jobs signalled
    here, are kept in ``state_file`` across cron passes.
    """

    job: SlurmJob
    low: int
    high: int
    cooldown: float
    state_file: Path
    submit_job: Callable[[], str]  # submits one job and returns its id

    def _state(self) -> dict[str, object]:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def _low_since(self) -> float | None:
        since = self._state().get("low_since")
        return float(since) if isinstance(since, int | float) else None

    def _signalled(self) -> frozenset[str]:
        ids = self._state().get("signalled")
        return frozenset(str(i) for i in ids) if isinstance(ids, list) else frozenset()

    def _save(self, low_since: float | None, signalled: set[str] | frozenset[str]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"low_since": low_since, "signalled": sorted(signalled)}))

    def step(self, messages: int, running: bool, now: float | None = None) -> str:
        """One pass: compare the jobs there are with those wanted, submit or cancel; a line saying what it did."""
        now = time.time() if now is None else now
        live = jobs(self.job, self._signalled())
        signalled = {j.id for j in live if j.id in self._signalled()}  # forget the jobs that are gone
        want = wanted(messages, running, self.job.slots, self.low, self.high)
        pending, draining = sum(j.pending for j in live), sum(j.draining for j in live)
        head = f"{self.job.target}: {messages} queued, campaign {'running' if running else 'none'}, {len(live)} jobs"
        if pending or draining:
            head += f" ({pending} pending, {draining} draining)"
        # The jobs beyond those wanted; the draining ones are leaving anyway, and are counted first.
        extra = max(0, len(live) - want)
        if want > len(live):
            self._save(None, signalled)
            ids = [self.submit_job() for _ in range(want - len(live))]
            return f"{head}: submitted {', '.join(ids)}"
        if extra <= draining:
            self._save(None, signalled)
            return f"{head}: steady"
        since = self._low_since()
        if since is None:
            self._save(now, signalled)
            return f"{head}: {want} wanted; cancelling after {self.cooldown:g} s"
        if now - since < self.cooldown:
            return f"{head}: {want} wanted; cancelling in {self.cooldown - (now - since):.0f} s"
        # Pending first, then the newest running: an older job's workers have warm caches.
        serving = [j for j in live if not j.draining]
        chosen = sorted(serving, key=lambda j: (not j.pending, -serving.index(j)))[: extra - draining]
        for each in chosen:
            cancel(each)
        self._save(None, signalled | {j.id for j in chosen if not j.pending})
        return f"{head}: cancelled {', '.join(j.id for j in chosen)}"
