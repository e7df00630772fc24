"""``fleet bench partition``: a seeded, random nemesis over a bed of nodes, the way Jepsen tests databases (issue 39).

A bed (fleet/ops/nodes.py) of a database node, worker nodes running ``fleet worker`` and two head nodes running
``fleet driver``; one campaign of many short trials (the chaos bench's, whose every value is known from its
configuration) handed to the drivers with ``fleet submit``. A schedule drawn from a seed, one event at a time, each
held a while, healed, then a pause:

- ``cut-postgres``, ``cut-redis``, ``cut-both``: a worker node cut from PostgreSQL, from Redis, or from both;
- ``cut-head``: the head node whose driver holds the campaign cut from everything, held until the other driver has
  taken the campaign over (and a while more), then healed: two drivers that both believe they drive;
- ``split``: the bridge split in two halves, every node of one cut from every node of the other;
- ``slow``: a node's outgoing link slowed to a trickle (a ``tc`` token bucket);
- ``crash``: a node's PID namespace killed (every process at once), then the node booted again and its ``fleet
  worker`` or ``fleet driver`` started again, as its service manager would;
- ``clock-jump``: a node's wall clock stepped two minutes ahead or behind for its Fleet processes (a library they
  preload, fleet/ops/clockjump.c), then set right: leases run on the database's clock, so no live lease may be
  taken and no two drivers may overlap;
- ``disk-full``: a worker node's Fleet home (its artifact cache and its workloads' scratch, a filesystem of its
  own) filled by a file written until ENOSPC, then emptied: the trials that meet it go back to their queue as
  the node's fault (:mod:`fleet.workers.health`), or are errored after as many node faults as the settings allow.

Events are spread over the campaign's progress (each starts once its share of the trials is measured), so that work
is left after every heal. After each heal the bench waits for work to resume: the first measurement recorded after
the heal by a node the event touched (any node, when it touched no worker node). After the last, the checker
(:func:`fleet.bench.partition.check`) runs over the database, read from the machine through PostgreSQL's unix socket.

A clock jump reaches only the node's Fleet processes, not its kernel: Linux's time namespaces offset the monotonic
and boot clocks, never the wall clock; the preloaded library does what a faking library such as libfaketime
would, which Python 3.11 cannot run with while the monotonic clock stays true (its sleeps fail).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.bench.chaos import campaign_spec, planned_configs
from fleet.bench.partition import Cut, LeaseWatch, check, now, wait_done
from fleet.ops.nodes import DATABASE_ADDRESS, POSTGRES_PORT, REDIS_PORT, Bed, BedError, Node, check_host
from fleet.states import CampaignStatus

if TYPE_CHECKING:
    from fleet.store import Campaign

KINDS = ("cut-postgres", "cut-redis", "cut-both", "cut-head", "split", "slow", "crash", "clock-jump", "disk-full")
# Short leases, so that an event costs seconds; the mechanisms are the production ones.
SETTINGS = {
    "FLEET_LEASE_SECONDS": "4",
    "FLEET_HEARTBEAT_SECONDS": "1",
    "FLEET_REQUEUE_SECONDS": "8",
    "FLEET_DRIVER_LEASE_SECONDS": "4",
    "FLEET_DB_OUTAGE_SECONDS": "120",
    "FLEET_MAX_ATTEMPTS": "5",
}
LEASE = float(SETTINGS["FLEET_LEASE_SECONDS"])
DRIVER_LEASE = float(SETTINGS["FLEET_DRIVER_LEASE_SECONDS"])
HEADS = 2
SHARED_HOSTNAME = "gpu-image"  # every node's host name, so that a measurement named by host name is caught
SLOW_RATE = "256kbit"
CLOCK_JUMP = 120.0  # seconds a clock-jump moves a node's wall clock, ahead or behind: far more than any lease
GAP_SECONDS = (1.0, 3.0)
RESUME_WAIT = LEASE + 30  # how long after a heal the bench waits for work to resume before going on
LAST_EVENT_AT = 0.75  # the share of the trials measured when the last event may begin


@dataclass
class Event:
    """One event of the schedule: what is planned, then what happened (times in seconds from the campaign's start)."""

    index: int
    kind: str
    node: str  # the node it strikes ("" for cut-head until struck: the head driving then)
    hold: float
    gap: float
    side: list[str] = field(default_factory=list)  # split: the half without the database
    clock_s: float = 0.0  # clock-jump: how far the node's wall clock jumps (negative: behind)
    started: float | None = None
    healed: float | None = None
    resumed_s: float | None = None  # heal to the first measurement by an affected node (database clock)
    ended_first: bool = False  # the campaign ended before an affected node measured again
    detail: str = ""

    @property
    def target(self) -> str:
        if self.kind == "clock-jump":
            return f"{self.node} {self.clock_s:+g} s"
        return "+".join(self.side) if self.kind == "split" else self.node or "driving head"


def plan(seed: int, events: int, workers: list[str], heads: list[str], hold: float) -> list[Event]:
    """The schedule drawn from ``seed``: every kind as evenly as ``events`` allows, in a random order.

    Parameters
    ----------
    hold:
        The longest an event is held; each is held between half of it and all of it.
    """
    rng = random.Random(seed)
    kinds = list(KINDS) * (events // len(KINDS)) + rng.sample(KINDS, events % len(KINDS))
    rng.shuffle(kinds)
    schedule = []
    for index, kind in enumerate(kinds):
        event = Event(index + 1, kind, "", round(rng.uniform(hold / 2, hold), 1), round(rng.uniform(*GAP_SECONDS), 1))
        if kind in ("crash", "clock-jump"):
            event.node = rng.choice(workers + heads)
        elif kind != "cut-head":
            event.node = rng.choice(workers)
        if kind == "clock-jump":
            event.clock_s = rng.choice((-CLOCK_JUMP, CLOCK_JUMP))
        if kind == "split":
            everyone = rng.sample(["db", *workers, *heads], len(workers) + len(heads) + 1)
            half = everyone[: len(everyone) // 2]
            event.side = sorted(half if "db" not in half else everyone[len(half) :])
            event.node = ""
        schedule.append(event)
    return schedule


class Nemesis:
    """The bed's Fleet (workers, drivers, the campaign) and the events struck at it."""

    def __init__(self, bed: Bed, workdir: Path, trials: int, seconds: float) -> None:
        from fleet.store import Store

        self.bed, self.workdir = bed, workdir
        nodes = [n.name for n in bed.workers]
        if len(nodes) < HEADS + 1:
            raise BedError(f"a partition bench needs {HEADS + 1} nodes at least, one of them a worker node")
        self.workers, self.heads = nodes[:-HEADS], nodes[-HEADS:]
        self.name = f"partition{uuid.uuid4().hex[:6]}"
        self.target = f"cpu-{self.name}"
        self.store = Store(bed.database_url)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.spec_path = bed[self.heads[0]].home / f"{self.name}.json"
        self.spec_path.write_text(json.dumps(campaign_spec(self.name, self.target, trials, seconds)))
        self.planned = planned_configs(self.spec_path, trials)
        self.campaign_id: int | None = None
        self.cuts: list[Cut] = []

    # -- Fleet's processes on the nodes --------------------------------------------------------------------

    def spawn(self, node: Node, *args: str) -> None:
        """``fleet ARGS`` on ``node``, as its service manager would start it; its output in the work folder."""
        env = self.bed.node_env(node, SETTINGS)
        log = self.workdir / f"{args[0]}-{node.name}.log"
        self.procs.append(self.bed.spawn(node, [sys.executable, "-m", "fleet.cli", *args], log=log, env=env))

    def start_service(self, name: str) -> None:
        """The node's worker (a worker node) or driver (a head node)."""
        node = self.bed[name]
        if name in self.heads:
            self.spawn(node, "driver")
        else:
            self.spawn(node, "worker", "--target", self.target, "--build-procs", "1", "--eval-procs", "1")

    def start(self) -> None:
        """Drivers and workers up, then the campaign submitted from the first head node."""
        for name in [*self.heads, *self.workers]:
            self.start_service(name)
        _wait(
            lambda: set(self.workers) <= {w.name.rpartition("@")[2] for w in self.store.workers(within=5)},
            120,
            "the worker nodes to register",
        )
        head = self.bed[self.heads[0]]
        env = self.bed.node_env(head, SETTINGS)
        argv = [sys.executable, "-m", "fleet.cli", "submit", f"/home/fleetbed/{self.spec_path.name}"]
        done = self.bed.run(head, argv, env=env, timeout=120)
        if done.returncode != 0:
            raise BedError(f"fleet submit failed: {done.stderr.strip()[-500:]}")
        self.campaign_id = self._campaign_id()

    def _campaign_id(self) -> int:
        from sqlalchemy import select

        from fleet.store import Campaign

        with self.store.session() as session:
            found = session.scalar(select(Campaign.id).where(Campaign.name == self.name))
        if found is None:
            raise BedError(f"campaign {self.name} not found after fleet submit")
        return int(found)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.store.close()

    # -- what the database says ----------------------------------------------------------------------------

    def measured(self) -> int:
        from sqlalchemy import func, select

        from fleet.store import Measurement, Trial

        with self.store.session() as session:
            count = (
                select(func.count()).select_from(Measurement).join(Trial).where(Trial.campaign_id == self.campaign_id)
            )
            return int(session.scalar(count) or 0)

    def first_since(self, nodes: list[str], instant: datetime) -> datetime | None:
        """The first measurement of the campaign recorded by one of ``nodes`` after ``instant`` (database clock)."""
        from sqlalchemy import func, select

        from fleet.store import Measurement, Trial

        with self.store.session() as session:
            first = (
                select(func.min(Measurement.created_at))
                .join(Trial)
                .where(Trial.campaign_id == self.campaign_id, Measurement.created_at > instant)
                .where(Measurement.node.in_(nodes))
            )
            return session.scalar(first)

    def node_faults(self) -> int:
        """How many times, in all, the campaign's trials went back to their queue for a node's fault."""
        from sqlalchemy import func, select

        from fleet.store import Trial

        with self.store.session() as session:
            total = select(func.sum(Trial.node_faults)).where(Trial.campaign_id == self.campaign_id)
            return int(session.scalar(total) or 0)

    def campaign(self) -> Campaign:
        """The campaign's row as it is now."""
        assert self.campaign_id is not None, "start() submits the campaign"
        return self.store.campaign(self.campaign_id)

    def ended(self) -> bool:
        from fleet.states import ENDED

        return self.campaign().status in ENDED

    def registered(self, node: str, since: datetime) -> bool:
        """Whether a worker or driver of ``node`` started after ``since`` beats its heart."""
        return any(
            w.name.rpartition("@")[2].partition(":")[0] == node and w.started_at > since
            for w in self.store.workers(within=5)
        )

    def holder(self) -> str:
        """The head node whose driver holds the campaign now ("" when none does)."""
        driver = self.campaign().driver or ""
        node = driver.partition("@")[2].partition(":")[0]
        return node if node in self.heads else ""

    # -- the events ----------------------------------------------------------------------------------------

    def strike(self, event: Event) -> None:
        """Make the event, and hold it."""
        bed = self.bed
        database = [(DATABASE_ADDRESS, POSTGRES_PORT), (DATABASE_ADDRESS, REDIS_PORT)]
        begun = time.monotonic()
        if event.kind == "cut-head":
            _wait(lambda: self.holder() != "", DRIVER_LEASE + 20, "a driver to hold the campaign")
            event.node = self.holder()
            bed.cut(bed[event.node])
            try:
                _wait(lambda: self.holder() not in ("", event.node), DRIVER_LEASE + 20, "a takeover")
                event.detail = f"taken over by {self.holder()} after {time.monotonic() - begun:.1f} s"
            except BedError:  # reported, and the heal goes on: the run's counts say what it cost
                event.detail = f"not taken over in {DRIVER_LEASE + 20:g} s"
        elif event.kind == "split":
            other = [n for n in bed.nodes if n not in event.side]
            for names, across in ((event.side, other), (other, event.side)):
                for name in names:
                    bed.cut(bed[name], [(bed[peer].address, None) for peer in across])
            event.detail = f"apart from {'+'.join(other)}"
        elif event.kind == "slow":
            bed.slow(bed[event.node], SLOW_RATE)
        elif event.kind == "crash":
            bed.crash(bed[event.node])
        elif event.kind == "clock-jump":
            bed.jump(bed[event.node], event.clock_s)
        elif event.kind == "disk-full":
            event.detail = f"{bed.fill(bed[event.node]) >> 20} MiB written until ENOSPC"
        else:
            ports = {"cut-postgres": [database[0]], "cut-redis": [database[1]], "cut-both": database}[event.kind]
            bed.cut(bed[event.node], ports)
        time.sleep(max(0.0, event.hold - (time.monotonic() - begun)))

    def heal(self, event: Event) -> None:
        """Heal every node (links, clock, disk); a crashed node is booted again and its service started, waited for
        until registered."""
        if event.kind == "crash":
            booted = now(self.store)
            begun = time.monotonic()
            self.bed.start(self.bed[event.node])
            self.start_service(event.node)
            _wait(lambda: self.registered(event.node, booted), 120, f"{event.node}'s service to register")
            event.detail = f"booted and registered in {time.monotonic() - begun:.1f} s"
        else:
            for node in self.bed.nodes.values():
                self.bed.heal(node)

    def cut_from_database(self, event: Event) -> list[str]:
        """The nodes the event cut from PostgreSQL: none of their results may be recorded once their leases ran out."""
        if event.kind in ("cut-postgres", "cut-both", "cut-head"):
            return [event.node]
        return list(event.side) if event.kind == "split" else []

    def affected(self, event: Event) -> list[str]:
        """The worker nodes whose measurements show work resumed after the event (all, when it touched none)."""
        touched = event.side if event.kind == "split" else [event.node]
        return [n for n in touched if n in self.workers] or list(self.workers)

    def run_event(self, event: Event, began: float) -> None:
        """Strike, hold, heal, and wait for work to resume."""
        start, faults = now(self.store), self.node_faults()
        event.started = round(time.monotonic() - began, 1)
        self.strike(event)
        self.heal(event)
        healed = now(self.store)
        event.healed = round(time.monotonic() - began, 1)
        self.cuts += [Cut(node, start, healed) for node in self.cut_from_database(event)]
        self.wait_resumed(event, healed)
        if event.kind == "disk-full":
            event.detail += f"; given back as the node's fault: {self.node_faults() - faults}"

    def wait_resumed(self, event: Event, healed: datetime) -> None:
        """Wait for the first measurement by a node the event touched since ``healed``, or the campaign's end."""
        nodes = self.affected(event)
        deadline = time.monotonic() + RESUME_WAIT
        while time.monotonic() < deadline:
            first = self.first_since(nodes, healed)
            if first is not None:
                event.resumed_s = round((first - healed).total_seconds(), 1)
                return
            if self.ended():  # the other nodes measured what was left: nothing to resume
                event.ended_first = True
                return
            time.sleep(0.2)


def run(
    nodes: int = 3,
    trials: int = 2000,
    events: int = 45,
    *,
    seed: int = 0,
    seconds: float = 0.8,
    hold: float = 2 * LEASE + 2,
    timeout: float = 3600.0,
    bed: Bed | None = None,
    keep: bool = False,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The whole run; the result's ``ok`` is False when any count of the checker is not 0 or an event was not made.

    Parameters
    ----------
    nodes:
        Worker nodes; two head nodes and the database node come beside them.
    seconds:
        How long each build and each measurement sleeps.
    hold:
        The longest an event is held (each is held between half of it and all of it).
    timeout:
        Seconds the campaign may take before its unfinished trials count as stuck.
    bed:
        A bed that is up already (its last two nodes are the heads); default: one made for the run and removed after.
    """
    say = say or (lambda _: None)
    check_host()
    workdir = Path(tempfile.mkdtemp(prefix="fleet-partition-", dir="/var/tmp"))
    wall = time.monotonic()
    own = bed is None
    if bed is None:
        bed = Bed.create(nodes + HEADS, hostname=SHARED_HOSTNAME).up()
    result: dict[str, Any] = {}
    nemesis: Nemesis | None = None
    watch: LeaseWatch | None = None
    try:
        nemesis = fleet = Nemesis(bed, workdir, trials, seconds)
        schedule = plan(seed, events, nemesis.workers, nemesis.heads, hold)
        say(f"{trials} trials on worker nodes {', '.join(nemesis.workers)}; drivers on {', '.join(nemesis.heads)}")
        say(f"schedule (seed {seed}):")
        for event in schedule:
            say(f"  {event.index:>3} {event.kind:<13} {event.target:<22} hold {event.hold:4.1f} s, then {event.gap} s")
        nemesis.start()
        assert nemesis.campaign_id is not None
        watch = LeaseWatch(nemesis.store, nemesis.campaign_id).start()
        began = time.monotonic()
        _wait(lambda: fleet.measured() > 0, 120, "the first measurement")
        _strike_all(nemesis, schedule, trials, began, say)
        status = wait_done(nemesis.store, nemesis.campaign_id, timeout - (time.monotonic() - began))
        campaign_s = time.monotonic() - began
        watch.stop()
        counts = check(
            nemesis.store, nemesis.campaign_id, nemesis.planned, nodes=nemesis.workers, cuts=nemesis.cuts,
            watch=watch, lease_seconds=LEASE, driver_lease_seconds=DRIVER_LEASE,
        )  # fmt: skip
        result = _result(counts, schedule, status, campaign_s) | {
            "settings": SETTINGS
            | {"workers": nemesis.workers, "heads": nemesis.heads, "measure_s": seconds, "hold_s": hold, "seed": seed},
        }
    finally:
        if watch is not None:
            watch.stop()
        if nemesis is not None:
            nemesis.stop()
        if own:
            bed.down()
        result["wall_s"] = round(time.monotonic() - wall, 1)
    if keep or not result.get("ok"):
        result["work_directory"] = str(workdir)
    else:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _strike_all(nemesis: Nemesis, schedule: list[Event], trials: int, began: float, say: Callable[[str], None]) -> None:
    """Each event of the schedule in turn, once its share of the ``trials`` is measured; none once it has ended."""
    for event in schedule:
        share = LAST_EVENT_AT * (event.index - 1) / max(1, len(schedule) - 1)
        while nemesis.measured() < share * trials and not nemesis.ended():
            time.sleep(0.2)
        if nemesis.ended():
            say(f"the campaign ended before event {event.index}")
            return
        nemesis.run_event(event, began)
        resumed = f"resumed {event.resumed_s} s after the heal"
        if event.resumed_s is None:
            resumed = "the campaign ended first" if event.ended_first else "not resumed"
        say(
            f"{event.started:6.1f} s  event {event.index}/{len(schedule)}: {event.kind} {event.target} "
            f"{event.detail} healed at {event.healed:.1f} s, {resumed}; {nemesis.measured()}/{trials} measured"
        )
        time.sleep(event.gap)


def _result(counts: dict[str, Any], schedule: list[Event], status: str, campaign_s: float) -> dict[str, Any]:
    """The checker's counts, the events and the resume times, and whether the run passed and met its goals."""
    made = [e for e in schedule if e.healed is not None]
    resumes = [e.resumed_s for e in made if e.resumed_s is not None]
    counts = {k: v for k, v in counts.items() if k != "snapshot"}
    kinds = {kind: sum(e.kind == kind for e in made) for kind in KINDS}
    result = counts | {
        "status": status,
        "events_planned": len(schedule),
        "events_made": len(made),
        "events_by_kind": kinds,
        "events": [asdict(e) | {"target": e.target} for e in schedule],
        "not_resumed": [e.index for e in made if e.resumed_s is None and not e.ended_first],
        "resume_s": {
            "max": max(resumes, default=None),
            "median": statistics.median(resumes) if resumes else None,
            "goal": LEASE + 5,
        },
        "campaign_s": round(campaign_s, 1),
    }
    result["ok"] = bool(counts["ok"]) and len(made) == len(schedule) and status == CampaignStatus.DONE
    result["goals_met"] = (
        result["ok"]
        and not result["not_resumed"]
        and all(r <= LEASE + 5 for r in resumes)
        and counts["recorded"] == counts["trials_planned"]
    )
    return result


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise BedError(f"timed out after {timeout:g} s waiting for {what}")


COUNTS = (
    "trials_planned", "recorded", "lost", "duplicated", "stuck", "wrong_valued", "misattributed",
    "recorded_while_cut", "overlapping_driver_leases",
)  # fmt: skip


def print_result(result: dict[str, Any]) -> None:
    """The events as a table, then every count of the checker and the resume times."""
    click.echo(f"{'#':>3}  {'event':<13} {'node(s)':<22} {'start':>7} {'healed':>7} {'resumed':>8}  detail")
    for event in result["events"]:
        start = "-" if event["started"] is None else f"{event['started']:.1f}"
        healed = "-" if event["healed"] is None else f"{event['healed']:.1f}"
        resumed = "-" if event["resumed_s"] is None else f"{event['resumed_s']:.1f}"
        click.echo(
            f"{event['index']:>3}  {event['kind']:<13} {event['target']:<22} {start:>7} {healed:>7} {resumed:>8}  "
            f"{event['detail']}"
        )
    for key in COUNTS:
        click.echo(f"{key:<26} {result[key]}")
    click.echo(f"{'measured_by':<26} {result['measured_by']}")
    click.echo(f"{'driver_turns':<26} {len(result['driver_turns'])}: {', '.join(result['driver_turns'])}")
    click.echo(f"{'events':<26} {result['events_made']} of {result['events_planned']}: {result['events_by_kind']}")
    resume = result["resume_s"]
    click.echo(
        f"{'resume after heal':<26} max {resume['max']} s, median {resume['median']} s (goal: {resume['goal']:g} s "
        f"at most); not resumed: {result['not_resumed'] or 'none'}"
    )
    click.echo(f"{'campaign':<26} {result['status']} in {result['campaign_s']} s (wall {result['wall_s']} s)")
    click.echo("goals met" if result["goals_met"] else "goals NOT met")


@click.command("partition")
@click.option("--nodes", type=click.IntRange(1), default=3, show_default=True, help="Worker nodes (beside 2 heads).")
@click.option("--trials", type=click.IntRange(20), default=2000, show_default=True, help="Trials of the campaign.")
@click.option("--events", type=click.IntRange(1), default=45, show_default=True, help="Events of the schedule.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the schedule.")
@click.option(
    "--seconds",
    type=click.FloatRange(0),
    default=0.8,
    show_default=True,
    help="How long each build and run sleeps: long enough for the campaign to outlast the events.",
)
@click.option(
    "--hold", type=click.FloatRange(1), default=2 * LEASE + 2, show_default=True, help="Longest an event is held."
)
@click.option(
    "--timeout", type=click.FloatRange(60), default=3600.0, show_default=True, help="Seconds before trials count stuck."
)
@click.option("--keep", is_flag=True, help="Keep the work directory (logs) even when the run passes.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), help="Write the figures as JSON here too.")
def partition_command(
    nodes: int, trials: int, events: int, seed: int, seconds: float, hold: float, timeout: float, keep: bool,
    as_json: bool, output: Path | None,
) -> None:  # fmt: skip
    """A campaign across a bed of nodes under a seeded, random nemesis: partitions, a slow link, crashes, clock
    jumps, full disks.

    A database node, worker nodes and two head nodes running `fleet driver`, each in its own namespaces
    (scripts/nodes); the campaign is submitted with `fleet submit`. Events drawn from --seed, one at a time, each
    held then healed: a worker node cut from PostgreSQL, from Redis, from both; the driving head node cut from
    everything while the other driver takes over; the bridge split in two halves; a slow link; a node crashed
    and started again; a node's wall clock jumped two minutes; a worker node's Fleet home filled. Prints the
    schedule, each event's start, heal and the seconds from the heal to work resuming, and every count of the
    checker; exits 1 unless lost, duplicated, stuck, wrong-valued, misattributed, recorded while cut and
    overlapping driver leases are all 0 and every event was made. Goal: work resumes within one lease plus 5 s of
    each heal. Needs root, namespaces, loop devices and a C compiler.
    """
    try:
        result = run(
            nodes, trials, events, seed=seed, seconds=seconds, hold=hold, timeout=timeout, keep=keep,
            say=lambda line: click.echo(line, err=True),
        )  # fmt: skip
    except BedError as error:
        click.echo(str(error), err=True)
        sys.exit(1)
    if output is not None:
        output.write_text(json.dumps(result, indent=2, default=str))
    if as_json:
        click.echo(json.dumps(result, default=str))
    else:
        print_result(result)
    if not result["ok"]:
        raise click.ClickException(f"the partition run failed; logs kept in {result.get('work_directory')}")
