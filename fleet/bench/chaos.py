"""``fleet bench chaos``: a campaign through a fleet under fire, every trial recorded once with its right value.

On a private PostgreSQL and Redis started for the run (never the environment's: they are restarted), a
``fleet worker`` with two build and two evaluation processes runs a campaign of ``trials`` configurations of
a cheap command workload, driven by ``fleet tune``. While it runs, at points spread over its progress:

- **pool kills**: SIGKILL of one pool process of a Celery worker, of the build and the evaluation workers
  in turn, preferably one running a build or a measurement; the Celery worker starts another pool process;
- **worker kills**: SIGKILL of a whole Celery worker (its main process and its pool), build and evaluation
  in turn; ``fleet worker`` starts it again;
- **node kills**: SIGKILL of ``fleet worker`` itself and of every Celery worker it runs, as a node that
  loses power; the bench starts ``fleet worker`` again, as the node's service manager would;
- **Redis restarts**: SIGKILL of redis-server (up to a second of its append-only file lost), started again;
- **PostgreSQL restarts**: SIGKILL of the postmaster and its backends (an immediate stop: crash recovery
  at the next start), started again;
- **driver kills**: SIGKILL of ``fleet tune``, then ``fleet resume``.

The workload's right answer is known from the configuration: the build writes its build-time knob ``b``
into the artifact, the run reads it back and prints ``b * 1000 + r``, so a value measured with another
trial's artifact, or recorded against another trial, is caught.

Stale messages. A Celery worker killed with SIGKILL leaves the message of its task unacknowledged in Redis,
where kombu would deliver it again only after the visibility timeout (``FLEET_VISIBILITY_TIMEOUT``, an
hour). Nothing waits for it: the trial's lease in the database runs out (``FLEET_LEASE_SECONDS``), and the
reaper of any live worker or of the driver (every ``FLEET_HEARTBEAT_SECONDS``) gives the trial back and sends
a new message; a waiting trial whose message was lost (a Redis crash) is sent again after
``FLEET_REQUEUE_SECONDS``. The old message is left to its hour; when it comes, its claim is refused. The
bench shows that too: after the campaign it delivers the messages still unacknowledged at once (kombu's own
restore, with a visibility timeout of 0) and checks that no trial changed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet.bench.dispatch import _wait
from fleet.services import PostgresServer, RedisServer, _child_pids
from fleet.states import FINISHED, TrialState

# Each setting is chosen so that a fault costs seconds, not the production defaults' minutes; the
# mechanisms are the production ones. The visibility timeout keeps its hour on purpose: the lease, not the
# broker, brings back a dead worker's work.
SETTINGS: dict[str, str] = {
    "FLEET_LEASE_SECONDS": "10",
    "FLEET_HEARTBEAT_SECONDS": "2",
    "FLEET_REQUEUE_SECONDS": "20",
    "FLEET_DRIVER_LEASE_SECONDS": "10",
    "FLEET_DB_OUTAGE_SECONDS": "60",
    "FLEET_MAX_ATTEMPTS": "3",
    "FLEET_VISIBILITY_TIMEOUT": "3600",
}
RUNS_PER_BUILD = 10  # run-time values of each artifact: builds are a tenth of the trials
BUILD_PROCS = 2
EVAL_PROCS = 2
BUSY_WAIT_SECONDS = 15.0  # how long a kill waits for its victim to be mid-task: more than a lease


@dataclass(frozen=True)
class Faults:
    """How many faults of each kind to inject."""

    # The help of each is what `fleet bench chaos --help` says of its option.
    pool_kills: int = field(default=12, metadata={"help": "SIGKILLs of a pool process."})
    worker_kills: int = field(default=8, metadata={"help": "SIGKILLs of a whole Celery worker."})
    node_kills: int = field(default=2, metadata={"help": "SIGKILLs of fleet worker with its workers."})
    redis_restarts: int = field(default=2, metadata={"help": "Redis crashes."})
    postgres_restarts: int = field(default=2, metadata={"help": "PostgreSQL crashes (immediate stops)."})
    driver_kills: int = field(default=1, metadata={"help": "SIGKILLs of the driver, each then resumed."})
    skewed_nodes: int = field(
        default=1,
        metadata={"help": "Nodes whose clock runs two minutes ahead joining the fleet (leases: the database's clock)."},
    )

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


@dataclass
class Injected:
    """The faults injected so far, and how many processes the kills took."""

    pool_kills: int = 0
    worker_kills: int = 0
    node_kills: int = 0
    processes_killed: int = 0
    redis_restarts: int = 0
    postgres_restarts: int = 0
    driver_kills: int = 0
    skewed_nodes: int = 0
    kills_mid_build: int = 0  # pool and worker kills that hit a build in progress
    kills_mid_measurement: int = 0  # ... a measurement in progress
    log: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(getattr(self, kind) for kind in asdict(Faults()))


def expected(config: dict[str, Any]) -> float:
    """The right objective of a configuration: what the workload's run prints."""
    return float(int(config["b"]) * 1000 + int(config["r"]))


def campaign_spec(
    name: str, target: str, trials: int, seconds: float, build_seconds: float | None = None
) -> dict[str, Any]:
    """A grid of ``trials`` configurations whose runs sleep ``seconds`` and builds ``build_seconds`` (by default
    ``seconds`` too); each run prints ``b * 1000 + r``."""
    # -I -S: no site packages to import, so a build or a run costs a few milliseconds of CPU.
    build = "import sys, time; time.sleep(float(sys.argv[2])); open('b.txt', 'w').write(sys.argv[1])"
    run = (
        "import sys, time; time.sleep(float(sys.argv[2])); "
        "print('score', int(open('b.txt').read()) * 1000 + int(sys.argv[1]))"
    )
    python = [sys.executable, "-I", "-S", "-c"]
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "chaos", "params": {"run": name}}],
        "space": {
            "knobs": {
                "b": {"values": list(range(math.ceil(trials / RUNS_PER_BUILD))), "build": True},
                "r": {"values": list(range(RUNS_PER_BUILD)), "build": False},
            }
        },
        "strategy": {"name": "grid", "budget": trials},
        "workload": {
            "kind": "command",
            "build": [*python, build, "{b}", f"{seconds if build_seconds is None else build_seconds:g}"],
            "artifacts": ["b.txt"],
            "run": [*python, run, "{r}", f"{seconds:g}"],
            "objective": {"name": "score", "regex": r"score (\d+)"},
            "repeats": 1,
        },
    }


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _start_time(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (0 if it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def _kill(pid: int, group: bool = False) -> bool:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


class Chaos:
    """The servers, the worker node, the driver and the faults of one run."""

    def __init__(self, workdir: Path, trials: int, seconds: float, window: int, say: Callable[[str], None]) -> None:
        self.workdir, self.trials, self.window, self.say = workdir, trials, window, say
        self.redis = RedisServer(workdir / "redis")
        self.postgres = PostgresServer(workdir / "pg")
        self.target = f"cpu-chaos{uuid.uuid4().hex[:6]}"
        self.name = f"chaos-{self.target[9:]}"
        self.injected = Injected()
        self.started = time.monotonic()
        self.launcher: subprocess.Popen[bytes] | None = None
        self.ahead: list[subprocess.Popen[bytes]] = []  # nodes whose clock runs ahead
        self.driver: subprocess.Popen[bytes] | None = None
        self.drivers = 0
        self.counts: dict[str, int] = {}
        self.campaign_id: int | None = None
        self.spec_path = workdir / "chaos.json"
        self.spec_path.write_text(json.dumps(campaign_spec(self.name, self.target, trials, seconds)))
        self.env: dict[str, str] = {}
        self.store: Any = None

    # -- processes ---------------------------------------------------------------------------------

    def start_servers(self) -> None:
        self.redis.start()
        self.postgres.start()
        from fleet.store import Store

        # The environment's FLEET_* settings are left out: this run's servers and settings only.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | SETTINGS
        self.env |= {
            "FLEET_DATABASE_URL": self.postgres.url,
            "FLEET_BROKER_URL": self.redis.url,
            "FLEET_HOME": str(self.workdir / "home"),
            "FLEET_LOG_DIR": str(self.workdir / "logs"),
            "PYTHONUNBUFFERED": "1",
        }
        self.store = Store(self.postgres.url)
        self.store.upgrade()

    def _spawn(
        self, args: list[str], log: str, stdout: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (self.workdir / log).open("ab") as err, (stdout or self.workdir / log).open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "fleet.cli", *args],
                env={**self.env, **(env or {})},
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def start_node(self) -> None:
        """``fleet worker`` with two build and two evaluation processes (three Celery workers)."""
        self.launcher = self._spawn(
            [
                "worker",
                "--target",
                self.target,
                "--build-procs",
                str(BUILD_PROCS),
                "--eval-procs",
                str(EVAL_PROCS),
                "--stop-timeout",
                "20",
            ],
            "worker.log",
        )

    def join_skewed_node(self) -> str:
        """A second node joins, its clock two minutes ahead: by its own clock every live lease has expired."""
        name = f"ahead{len(self.ahead) + 1}"
        args = ["worker", "--target", self.target, "--build-procs", "1", "--eval-procs", "1", "--stop-timeout", "20"]
        skew = {"FLEET_TEST_CLOCK_SKEW": "120", "FLEET_NODE_NAME": name}
        self.ahead.append(self._spawn(args, f"{name}.log", env=skew))
        self.injected.skewed_nodes += 1
        return f"node {name} joined, its clock 120 s ahead"

    def start_driver(self, *args: str) -> None:
        self.drivers += 1
        self.driver = self._spawn(
            [*args, "--json", "--window", str(self.window)], "driver.log", self.workdir / f"driver-{self.drivers}.json"
        )

    def celery_workers(self) -> list[tuple[int, str]]:
        """The Celery workers' main processes under ``fleet worker`` now, with their names."""
        if self.launcher is None:
            return []
        found = []
        for pid in _child_pids(self.launcher.pid):
            argv = _cmdline(pid)
            if argv[1:4] == ["-m", "fleet.tasks", "worker"] and "-n" in argv:
                found.append((pid, argv[argv.index("-n") + 1]))
        return found

    def _busy(self, pid: int) -> bool:
        """Whether pool process ``pid`` runs a build or a measurement (the workload's command is its child)."""
        return bool(_child_pids(pid))

    def _celery_workers_up(self, role: str, timeout: float = 60) -> list[tuple[int, str]]:
        """The Celery workers of ``role`` (``build`` or ``eval``) whose pool is up, waiting for one if none is."""
        deadline = time.monotonic() + timeout
        while True:
            mains = [(pid, name) for pid, name in self.celery_workers() if name.startswith(role) and _child_pids(pid)]
            if mains or time.monotonic() > deadline:
                return mains
            time.sleep(0.1)

    # -- faults -----------------------------------------------------------------------------------

    def _mid_task(self, role: str, busy: bool) -> str:
        if busy:
            if role == "build":
                self.injected.kills_mid_build += 1
            else:
                self.injected.kills_mid_measurement += 1
        return {"build": " mid-build", "eval": " mid-measurement"}[role] if busy else " (idle)"

    def kill_pool(self, rng: random.Random) -> str:
        # Build and evaluation workers in turn; a kill mid-task is the one that matters: give one time to
        # start (a fault just before may have left the workers waiting out a lease).
        role = ("eval", "build")[self.injected.pool_kills % 2]
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            pools = [(pid, name) for main, name in self._celery_workers_up(role) for pid in _child_pids(main)]
            busy = [(pid, name) for pid, name in pools if self._busy(pid)]
            if busy or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not pools:
            raise RuntimeError(f"no pool process of a {role} worker to kill")
        pid, name = rng.choice(busy or pools)
        _kill(pid)
        self.injected.pool_kills += 1
        self.injected.processes_killed += 1
        return f"SIGKILL pool process {pid} of {name}" + self._mid_task(role, bool(busy))

    def kill_worker(self) -> str:
        role = ("eval", "build")[self.injected.worker_kills % 2]
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
        while True:
            mains = self._celery_workers_up(role)
            busy = [(pid, name) for pid, name in mains if any(self._busy(p) for p in _child_pids(pid))]
            if busy or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not mains:
            raise RuntimeError(f"no {role} worker to kill")
        # The longest-running one: a worker killed again soon after its restart would be restarted with
        # the launcher's growing back-off, which is not what this measures.
        pid, name = min(busy or mains, key=lambda main: _start_time(main[0]))
        processes = 1 + len(_child_pids(pid))
        _kill(pid, group=True)
        self.injected.worker_kills += 1
        self.injected.processes_killed += processes
        return f"SIGKILL Celery worker {name} (pid {pid}, {processes} processes)" + self._mid_task(role, bool(busy))

    def kill_node(self) -> str:
        assert self.launcher is not None
        mains = self.celery_workers()
        processes = 1 + sum(1 + len(_child_pids(pid)) for pid, _ in mains)
        # The launcher first, so it cannot start a worker again; its workers go the same instant.
        _kill(self.launcher.pid, group=True)
        for pid, _ in mains:
            _kill(pid, group=True)
        self.launcher.wait()
        self.injected.node_kills += 1
        self.injected.processes_killed += processes
        self.start_node()
        return f"SIGKILL fleet worker and its {len(mains)} Celery workers ({processes} processes); started again"

    def restart_redis(self) -> str:
        self.redis.kill()
        time.sleep(1)
        self.redis.start()
        self.injected.redis_restarts += 1
        return "SIGKILL redis-server, started again after 1 s"

    def restart_postgres(self) -> str:
        self.postgres.kill()
        time.sleep(1)
        self.postgres.start()
        self.injected.postgres_restarts += 1
        return "SIGKILL PostgreSQL (immediate stop), started again after 1 s"

    def kill_driver(self) -> str:
        assert self.driver is not None
        _kill(self.driver.pid, group=True)
        self.driver.wait()
        self.injected.driver_kills += 1
        self.start_driver("resume", self.name)
        return f"SIGKILL fleet tune, then fleet resume {self.name}"

    def inject(self, kind: str, rng: random.Random) -> str:
        actions: dict[str, Callable[[], str]] = {
            "pool_kills": lambda: self.kill_pool(rng),
            "worker_kills": self.kill_worker,
            "node_kills": self.kill_node,
            "redis_restarts": self.restart_redis,
            "postgres_restarts": self.restart_postgres,
            "driver_kills": self.kill_driver,
            "skewed_nodes": self.join_skewed_node,
        }
        return actions[kind]()

    # -- watching ---------------------------------------------------------------------------------

    def poll(self) -> None:
        """Read the campaign's trial counts; a database that is down just now leaves the last ones."""
        from fleet.errors import FleetError

        try:
            if self.campaign_id is None:
                self.campaign_id = self.store.campaign(self.name).id
            self.counts = self.store.trial_counts(self.campaign_id)
        except FleetError:
            pass

    @property
    def finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in FINISHED)

    def progress_line(self) -> str:
        elapsed = time.monotonic() - self.started
        waiting = sum(n for state, n in self.counts.items() if state not in FINISHED)
        return (
            f"{elapsed:5.0f} s  {self.finished}/{self.trials} finished ({self.finished / max(elapsed, 1e-9):.1f}/s), "
            f"{waiting} in flight, faults {self.injected.total}"
        )

    def stop(self) -> None:
        for proc in (self.driver, self.launcher, *self.ahead):
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        mains = self.celery_workers()
        for proc in (self.driver, self.launcher, *self.ahead):
            if proc is None:
                continue
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                _kill(proc.pid, group=True)
                proc.wait()
        for pid, _ in mains:  # stragglers of a launcher that had to be killed
            _kill(pid, group=True)
        if self.store is not None:
            self.store.close()
        self.postgres.stop()
        self.redis.stop()


def schedule(faults: Faults, first: float = 0.05, last: float = 0.85) -> list[tuple[float, str]]:
    """(share of the trials finished, kind) of every fault, each kind spread evenly over [first, last]."""
    points = []
    for offset, (kind, count) in enumerate(asdict(faults).items()):
        for index in range(count):
            # Kinds of the same count are offset a little, so two restarts never come back to back.
            at = first + (last - first) * (index + 0.5) / count + 0.011 * offset
            points.append((min(at, last), kind))
    return sorted(points)


def _unacknowledged(redis_url: str) -> int:
    """Messages delivered to a Celery worker and not acknowledged: those of killed workers, once all is idle."""
    from kombu import Connection

    with Connection(redis_url) as connection:
        channel: Any = connection.default_channel
        return int(channel.client.hlen(channel.unacked_key))


def replay_stale(redis_url: str) -> None:
    """Deliver the messages left unacknowledged by killed workers now, as kombu would after the visibility timeout."""
    from kombu import Connection

    with Connection(redis_url, transport_options={"visibility_timeout": 0}) as connection:
        channel: Any = connection.default_channel
        # start=0, num=None: all of them; interval=1: on this very call.
        channel.qos.restore_visible(start=0, num=None, interval=1)


def deliver_stale(
    chaos: Chaos, planned: list[dict[str, Any]], before: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Deliver the stale messages of a finished campaign; the counts after, and what the messages changed."""
    left = _unacknowledged(chaos.redis.url)
    chaos.say(f"delivering the {left} messages killed workers left unacknowledged, as after the visibility timeout")
    replay_stale(chaos.redis.url)
    with contextlib.suppress(RuntimeError):
        _wait(lambda: _queued(chaos.redis.url, chaos.target) == 0, 60, "the stale messages to be taken")
    queued = _queued(chaos.redis.url, chaos.target)
    time.sleep(2 * float(SETTINGS["FLEET_HEARTBEAT_SECONDS"]))  # a reaper's round after them
    after = tally(chaos.store, chaos.campaign_id, planned)
    changed = sum(after["snapshot"].get(i) != s for i, s in before["snapshot"].items())
    changed += len(set(after["snapshot"]) - set(before["snapshot"]))
    return after, {
        "left_unacknowledged": left,
        "still_queued_after_delivery": queued,
        "trials_changed_by_their_delivery": changed,
    }


def _queued(redis_url: str, target: str) -> int:
    """Messages in the target's queues or unacknowledged."""
    from kombu import Connection

    with Connection(redis_url) as connection:
        channel: Any = connection.default_channel
        client = channel.client
        lists = [key for key in client.keys(f"*{target}*") if client.type(key) in (b"list", "list")]
        return sum(int(client.llen(key)) for key in lists) + int(client.hlen(channel.unacked_key))


def tally(store: Any, campaign_id: int | None, planned: list[dict[str, Any]], ended: bool = True) -> dict[str, Any]:
    """Every count the bench reports, read from the database.

    A configuration never written is lost when the campaign ``ended``, and stuck when its time ran out first.
    """
    from sqlalchemy import func, select

    from fleet.store import Measurement, Trial

    rows: list[Any] = []
    measurements: dict[int, tuple[int, float | None]] = {}
    if campaign_id is not None:
        with store.session() as session:
            rows = list(
                session.execute(
                    select(Trial.id, Trial.config, Trial.state, Trial.attempts, Trial.reason).where(
                        Trial.campaign_id == campaign_id
                    )
                ).all()
            )
            found = session.execute(
                select(Measurement.trial_id, func.count(), func.max(Measurement.objective))
                .join(Trial, Trial.id == Measurement.trial_id)
                .where(Trial.campaign_id == campaign_id)
                .group_by(Measurement.trial_id)
            ).all()
            measurements = {trial_id: (count, objective) for trial_id, count, objective in found}

    def key(config: dict[str, Any]) -> tuple[int, int]:
        return int(config["b"]), int(config["r"])

    wanted = {key(c) for c in planned}
    by_config = Counter(key(row.config) for row in rows)
    lost, wrong, stuck, recorded = [], [], [], 0
    duplicated = sum(n - 1 for n in by_config.values() if n > 1) + sum(c not in wanted for c in by_config)
    errors: Counter[str] = Counter()
    for row in rows:
        count, objective = measurements.get(row.id, (0, None))
        duplicated += max(0, count - 1)
        if row.state not in FINISHED:
            stuck.append(row.id)
        elif row.state != TrialState.EVALUATED:
            # Every run of this workload succeeds: a trial without its value is one the faults cost.
            wrong.append(row.id)
            errors[str(row.reason)[:200]] += 1
        elif count == 0:
            lost.append(row.id)
        else:
            recorded += 1
            if objective != expected(row.config):
                wrong.append(row.id)
    never_written = len(wanted - set(by_config))
    return {
        "trials_planned": len(planned),
        "recorded": recorded,
        "lost": never_written * ended + len(lost),
        "duplicated": duplicated,
        "stuck": never_written * (not ended) + len(stuck),
        "wrong_valued": len(wrong),
        "measured_again": sum(row.attempts > 1 for row in rows),
        "examples": {"lost": lost[:10], "stuck": stuck[:10], "wrong_valued": wrong[:10]},
        "errors": dict(errors.most_common(5)),
        "states": dict(Counter(row.state for row in rows)),
        "snapshot": {row.id: (row.state, row.attempts, measurements.get(row.id)) for row in rows},
    }


def planned_configs(spec_path: Path, trials: int) -> list[dict[str, Any]]:
    """The configurations the campaign's grid proposes, in order."""
    from fleet.driving.campaign import load_spec

    return [dict(c) for c in itertools.islice(iter(load_spec(spec_path).space), trials)]


def run(
    trials: int = 1000,
    faults: Faults | None = None,
    *,
    seconds: float = 0.05,
    window: int = 8,
    timeout: float = 780.0,
    seed: int = 0,
    keep: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The whole run; the result's ``ok`` is False when anything was lost, duplicated, stuck or wrong.

    Parameters
    ----------
    trials:
        Configurations of the campaign.
    faults:
        How many faults of each kind (default :class:`Faults`).
    seconds:
        How long each build and each measurement sleeps: what keeps the workers busy between faults.
    window:
        The driver's trials in flight.
    timeout:
        Seconds the campaign may take before its unfinished trials count as stuck.
    keep:
        Keep the working directory (logs, the servers' data) even when the run passes.
    """
    faults = faults or Faults()
    say = say or (lambda _: None)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="fleet-chaos-"))
    chaos = Chaos(workdir, trials, seconds, window, say)
    wall = time.monotonic()
    result: dict[str, Any] = {}
    try:
        _start_fleet(chaos)
        planned = planned_configs(chaos.spec_path, trials)
        say(
            f"{trials} trials on {BUILD_PROCS} build and {EVAL_PROCS} evaluation processes, "
            f"{faults.total} faults; work directory {workdir}"
        )
        chaos.started = time.monotonic()
        chaos.start_driver("tune", str(chaos.spec_path))
        _drive_with_faults(chaos, faults, trials, chaos.started + timeout, rng, say)
        campaign_s = time.monotonic() - chaos.started
        driver_status = _end_driver(chaos)
        chaos.poll()
        say(chaos.progress_line())
        counts, stale = _outcome(chaos, planned, driver_status)
        del counts["snapshot"]
        result = counts | {
            "faults": {k: v for k, v in asdict(chaos.injected).items() if k != "log"},
            "faults_not_injected": _not_injected(faults, chaos.injected),
            "stale_messages": stale,
            "driver_exit_status": driver_status,
            "settings": _settings(window, seconds, timeout, seed),
            "campaign_s": round(campaign_s, 1),
        }
    finally:
        chaos.stop()
        result["wall_s"] = round(time.monotonic() - wall, 1)
    result["ok"] = _passed(result)
    result["fault_log"] = chaos.injected.log
    if keep or not result["ok"]:
        result["work_directory"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _start_fleet(chaos: Chaos) -> None:
    """The servers, then the node, and wait for its Celery workers."""
    chaos.start_servers()
    chaos.start_node()
    workers = EVAL_PROCS + 1  # one Celery worker per evaluation process, one for the builds
    _wait(lambda: len(chaos.store.workers(target=chaos.target, within=30)) >= workers, 120, "the Celery workers")


def _outcome(
    chaos: Chaos, planned: list[dict[str, Any]], driver_status: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The campaign's tally, and what its stale messages did: left unacknowledged, and once delivered."""
    counts = tally(chaos.store, chaos.campaign_id, planned, ended=driver_status is not None)
    stale: dict[str, Any] = {"left_unacknowledged": _unacknowledged(chaos.redis.url)}
    if driver_status is not None:  # with trials still running, a change would prove nothing
        counts, stale = deliver_stale(chaos, planned, counts)
    return counts, stale


def _not_injected(faults: Faults, injected: Injected) -> dict[str, int]:
    """How many faults of each kind short of ``faults`` were injected, of the kinds that fell short."""
    return {
        kind: count - getattr(injected, kind)
        for kind, count in asdict(faults).items()
        if getattr(injected, kind) < count
    }


def _settings(window: int, seconds: float, timeout: float, seed: int) -> dict[str, Any]:
    """The settings of the run, as its result reports them."""
    return SETTINGS | {
        "build_procs": BUILD_PROCS,
        "eval_procs": EVAL_PROCS,
        "window": window,
        "measure_s": seconds,
        "runs_per_build": RUNS_PER_BUILD,
        "timeout_s": timeout,
        "seed": seed,
    }


def _drive_with_faults(
    chaos: Chaos, faults: Faults, trials: int, deadline: float, rng: random.Random, say: Callable[[str], None]
) -> None:
    """Watch the campaign until its driver exits or ``deadline`` (on the monotonic clock) passes: a progress line
    every 5 s, and the faults injected one at a time, each once its share of the trials has finished."""
    last_line = 0.0
    pending = schedule(faults)
    last_fault = 0.0

    def driving() -> bool:
        assert chaos.driver is not None
        return chaos.driver.poll() is None and time.monotonic() < deadline

    while driving():
        chaos.poll()
        now = time.monotonic()
        if now - last_line >= 5:
            last_line = now
            say(chaos.progress_line())
        # One fault at a time, a second apart at least, each once its share of the trials has finished.
        if pending and chaos.finished >= pending[0][0] * trials and now - last_fault >= 1:
            _, kind = pending.pop(0)
            try:
                done = chaos.inject(kind, rng)
            except Exception as error:  # a fault that could not be injected: reported, and the run fails
                done = f"{kind} failed: {error}"
            last_fault = time.monotonic()
            line = f"{last_fault - chaos.started:5.0f} s  fault {chaos.injected.total}/{faults.total}: {done}"
            chaos.injected.log.append(line.strip())
            say(line)
        time.sleep(0.2)


def _end_driver(chaos: Chaos) -> int | None:
    """The driver's exit status; None when it ran out of time, and was killed: what is unfinished now is stuck."""
    assert chaos.driver is not None
    driver_status = chaos.driver.poll()
    if driver_status is None:
        _kill(chaos.driver.pid, group=True)
        chaos.driver.wait()
    return driver_status


def _passed(result: dict[str, Any]) -> bool:
    """Whether the run passed: nothing lost, duplicated, stuck or wrong, every fault injected, no stale message
    that changed a trial, and the driver's exit clean."""
    failed = [k for k in ("lost", "duplicated", "stuck", "wrong_valued") if result.get(k)]
    failed += ["faults_not_injected"] if result.get("faults_not_injected") else []
    failed += ["stale_messages"] if result.get("stale_messages", {}).get("trials_changed_by_their_delivery") else []
    return not failed and result.get("driver_exit_status") == 0
