"""``fleet bench scale``: whether Fleet's cost stays flat as a campaign grows, and with many campaigns at once.

On a private PostgreSQL and Redis, with one ``fleet worker`` (one build and one evaluation process, as
``fleet bench dispatch`` has), two phases of the ``noop`` workload (each build returns its configuration,
each evaluation measures 0: what is timed is the fleet itself):

- **one campaign** of ``trials`` trials (100,000 by default), driven by a real ``fleet tune`` process: ten
  build-time values times run-time values, so that almost every trial reuses an artifact;
- **20 campaigns at once** of ``concurrent_trials`` trials each (5,000 by default), submitted to the fleet
  and driven by one ``fleet driver`` process.

For each phase: trials per second over the first and the last ``window`` trials to finish (10,000 by default;
goal: the last at least 0.9 of the first) and over each tenth of the run, the driver process's peak resident
memory (goal: under 300 MB), the wall time of the read commands (``fleet status``, ``fleet status CAMPAIGN``,
``fleet best CAMPAIGN``, ``fleet trials CAMPAIGN --state errored`` and ``fleet report CAMPAIGN``) run as real
commands on the finished work (goal: under 1 s each; the same commands on a 100-trial campaign measured in the
same run are the baseline: most of their time is Python's start, and ``fleet status`` of that small database has
a goal of its own, under 0.3 s), and the database's bytes per trial. Beside the rates, the machine's own speed
over the last window over its speed over the first (:class:`SpeedProbe`), and the CPU milliseconds per trial of
each role (worker, driver, database, broker) and the idle cores over each window (:func:`cpu_use`). For the
campaigns run at once, also how evenly they went (:func:`campaign_ends`): campaigns that end early leave the
last window to the others. Trials finish when their evaluation is recorded (``finished_at`` in the database), so
the rates are those the workers saw, not the driver's view of them.
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC
from pathlib import Path
from typing import Any

import fleet
from fleet.bench.cpu import CpuMeter
from fleet.bench.dispatch import _stop, _wait
from fleet.bench.servers import private_servers
from fleet.states import FINISHED, CampaignStatus, TrialState

BUILDS = 10
"""Build-time values of every campaign: few builds, every other trial reuses an artifact."""

WARMUP_TRIALS = 100
"""Trials of the campaign that warms the workers up and gives the commands' baseline times."""

_EXITED = os.WEXITED | os.WNOHANG | os.WNOWAIT

PROBE_LOOP = 200_000
"""Iterations of the speed probe's loop: about 10 ms of one core."""

GOALS = {"last_over_first": ">= 0.9", "driver_peak_mb": "< 300", "command_s": "< 1", "small_status_s": "< 0.3"}
COMMAND_S = 1.0
"""Goal: each read command's seconds on a phase's finished work (100,000 trials by default)."""
SMALL_STATUS_S = 0.3
"""Goal: the seconds of ``fleet status`` of the small database the warm-up leaves (a read command's start)."""


def scale_spec(name: str, target: str, trials: int) -> dict[str, Any]:
    """A ``noop`` campaign of ``trials`` trials over ``BUILDS`` builds; its problem is its own, so none is reused."""
    per_build = -(-trials // BUILDS)
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "noop", "params": {"campaign": name}}],
        "space": {
            "knobs": {
                "b": {"values": list(range(BUILDS)), "build": True},
                "i": {"values": list(range(per_build)), "build": False},
            }
        },
        "strategy": {"name": "grid", "budget": trials},
        "workload": {"kind": "noop"},
    }


class SpeedProbe:
    """The machine's speed, sampled each second while a phase runs: the CPU time of a fixed loop of Python.

    A virtual machine's speed drifts (by 20-30% within a minute on the development VM), and a phase's last
    window comes minutes after its first: beside their rates, the probe says whether the machine itself ran
    slower or faster in one than in the other. It measures its own thread's CPU time, so the fleet's load on
    the cores does not count, only how much a core does in a second of it.
    """

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (when, seconds of CPU for the loop)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="speed-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            began = time.thread_time()
            total = 0
            for i in range(PROBE_LOOP):
                total += i * i
            self.samples.append((time.time(), time.thread_time() - began))

    def speed(self, start: float, end: float) -> float | None:
        """Loops per CPU second between ``start`` and ``end`` (seconds since the epoch): the median sample's."""
        seconds = [cpu for when, cpu in self.samples if start <= when <= end]
        return PROBE_LOOP / statistics.median(seconds) if seconds else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Servers:
    """A benchmark's PostgreSQL and Redis (private unless the environment names them), store and processes.

    The ``fleet`` commands it starts run each in its own session, and are stopped at the end.
    """

    def __init__(self, stack: ExitStack, workdir: Path) -> None:
        # The read commands are timed as they run after an install, which compiled Fleet's modules to bytecode: not
        # with Python compiling them at each start (an environment may say to write none, and a clone has none).
        compileall.compile_dir(Path(fleet.__file__).parent, quiet=2)
        env = dict(os.environ)
        self.servers = private_servers(stack, workdir, env)
        env |= {"FLEET_HOME": str(workdir / "home"), "PYTHONUNBUFFERED": "1"}
        os.environ.update(env)
        from fleet.settings import reset_settings

        reset_settings()
        from fleet.store import Store

        self.env, self.workdir = env, workdir
        self.store = Store(env["FLEET_DATABASE_URL"])
        self.store.upgrade()
        self.procs: list[subprocess.Popen[bytes]] = []
        stack.callback(self.close)

    def start(self, *args: str, python: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """A ``fleet`` command in its own session, its output appended to ``fleet.log``."""
        with (self.workdir / "fleet.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *python, "-m", "fleet.cli", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def finish(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """Stop ``procs`` (their whole process groups) before the run ends."""
        _stop(procs)
        self.procs = [p for p in self.procs if p not in procs]

    def exists(self, name: str) -> bool:
        from fleet.errors import NotFound

        try:
            self.store.campaign(name)
        except NotFound:
            return False
        return True

    def log_tail(self) -> str:
        """The end of the commands' output: why one failed, before the run's directory goes."""
        return (self.workdir / "fleet.log").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        _stop(self.procs)
        self.store.close()


class Bench(Servers):
    """The servers and the worker of one run, and the commands it times."""

    def __init__(self, stack: ExitStack, workdir: Path, say: Callable[[str], None]) -> None:
        super().__init__(stack, workdir)
        self.say = say
        self.target = f"cpu-scale{uuid.uuid4().hex[:6]}"
        self.probe = SpeedProbe()
        stack.callback(self.probe.close)
        self.cpu = CpuMeter(every=0.5).start()
        stack.callback(self.cpu.close)
        for role, pid in self.servers.items():
            self.cpu.watch(role, pid)

    def start_worker(self) -> None:
        worker = self.start(
            "worker", "--target", self.target, "--eval-procs", "1", "--build-procs", "1", "--loglevel", "WARNING"
        )
        self.cpu.watch("worker", worker.pid)
        _wait(lambda: len(self.store.workers(target=self.target, within=30)) >= 2, 120, "the fleet's workers")

    def write_spec(self, name: str, trials: int) -> Path:
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(scale_spec(name, self.target, trials)))
        return path

    def timed(self, *args: str) -> float:
        """Wall seconds of ``fleet ARGS`` as a user runs it: a new process, its output read whole."""
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args], env=self.env, capture_output=True, cwd=self.workdir
        )
        seconds = time.perf_counter() - start
        if done.returncode:
            raise RuntimeError(f"fleet {' '.join(args)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return round(seconds, 2)

    def commands(self, campaign: str) -> dict[str, float]:
        """Seconds of the read commands a user runs on the database and on a finished campaign."""
        return {
            "status": self.timed("status"),
            "status_campaign": self.timed("status", campaign),
            "best": self.timed("best", campaign),
            "trials_errored": self.timed("trials", campaign, "--state", TrialState.ERRORED),
            "report": self.timed("report", campaign, "-o", str(self.workdir / "report.html")),
        }

    def database_bytes(self) -> int:
        from sqlalchemy import text

        with self.store.engine.connect() as connection:
            return int(connection.execute(text("SELECT pg_database_size(current_database())")).scalar_one())

    def finish_times(self, campaign_ids: list[int]) -> dict[int, list[float]]:
        """When each trial of the campaigns was recorded, in seconds since the epoch, in order, by campaign."""
        from sqlalchemy import select

        from fleet.store._models import Trial

        query = (
            select(Trial.campaign_id, Trial.finished_at)
            .where(Trial.campaign_id.in_(campaign_ids), Trial.finished_at.is_not(None))
            .order_by(Trial.finished_at)
        )
        times: dict[int, list[float]] = {cid: [] for cid in campaign_ids}
        with self.store.engine.connect() as connection:
            for cid, moment in connection.execute(query):
                assert moment is not None  # the query skips trials not finished
                times[cid].append(moment.replace(tzinfo=UTC).timestamp())  # stored as naive UTC
        return times

    def counts(self, campaign_ids: list[int]) -> dict[str, int]:
        total: dict[str, int] = {}
        for cid in campaign_ids:
            for state, n in self.store.trial_counts(cid).items():
                total[state] = total.get(state, 0) + n
        return total

    def progress(self, what: str, campaign_ids: list[int], total: int, pid: int) -> Callable[[], None]:
        """A function that prints, at most every five seconds: trials done, the recent rate, the driver's memory."""
        last = {"at": time.monotonic(), "finished": 0}

        def tick() -> None:
            now = time.monotonic()
            if now - last["at"] < 5:
                return
            counts = self.counts(campaign_ids)
            done = sum(counts.get(state, 0) for state in FINISHED)
            rate = (done - last["finished"]) / (now - last["at"])
            last.update(at=now, finished=done)
            self.say(f"  {what}: {done:,}/{total:,} trials, {rate:.0f} trials/s lately, driver RSS {_rss_mb(pid)} MB")

        return tick


def _status_kb(pid: int, field: str) -> int | None:
    """A ``/proc/PID/status`` field in kB (VmRSS, VmHWM), or None once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mb(pid: int) -> str:
    kb = _status_kb(pid, "VmRSS")
    return "?" if kb is None else f"{kb / 1024:.0f}"


def _rate(times: list[float]) -> float:
    """Trials over the span between the first and the last of ``times``."""
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else float("inf")


def rates(finished: list[float], window: int) -> dict[str, Any]:
    """Trials per second over the first and the last ``window`` trials to finish, and over each tenth of them.

    Each rate is trials over the span between the first and the last of them, so the start (workers waking,
    the first builds) and the end of the run weigh on neither side more than on the other.
    """
    tenth = max(2, len(finished) // 10)
    first, last = _rate(finished[:window]), _rate(finished[-window:])
    return {
        "trials_per_s_first": round(first, 1),
        "trials_per_s_last": round(last, 1),
        "last_over_first": round(last / first, 3),
        "trials_per_s_by_tenth": [round(_rate(finished[n : n + tenth]), 1) for n in range(0, len(finished) - 1, tenth)],
        "trials_per_s_overall": round(_rate(finished), 1),
    }


def machine_speed(probe: SpeedProbe, finished: list[float], window: int) -> dict[str, float | None]:
    """The machine's speed over the last ``window`` trials to finish over its speed over the first.

    Not a correction to the trials' rate: the probe is one thread of Python, the fleet several processes
    that also wait on each other. It says whether the machine changed between the two windows, and how much.
    """
    first = probe.speed(finished[0], finished[:window][-1])
    last = probe.speed(finished[-window], finished[-1])
    return {"machine_speed_last_over_first": round(last / first, 3) if first and last else None}


def cpu_use(meter: CpuMeter, finished: list[float], window: int) -> dict[str, Any]:
    """CPU milliseconds per trial by role, and the idle cores, over the first and the last ``window`` trials.

    Beside the rates they say why a rate fell: the fleet's cost per trial grew (a role's milliseconds), or it
    waited (idle cores), or neither, and the machine itself was slower (:func:`machine_speed`).
    """
    first, last = finished[:window], finished[-window:]
    return {
        "first": meter.window(first[0], first[-1], len(first) - 1),
        "last": meter.window(last[0], last[-1], len(last) - 1),
    }


def campaign_ends(times: dict[int, list[float]], window: int) -> dict[str, Any]:
    """How evenly campaigns run at once went, from each one's finish times (in order): what the last window saw.

    Campaigns that end early leave the last ``window`` trials to fewer campaigns, each with its own window of
    trials in flight, and their last trials drain alone: the last window's rate then says as much about how
    evenly the campaigns went as about the fleet's cost. So beside it: when each campaign ended, how many were
    still running as the last window began, how far the slowest had got when the first ended, and the rate
    over the last ``window`` trials before the first ended (while every campaign ran) over the first window's.
    """
    finished = sorted(t for ts in times.values() for t in ts)
    ended = {cid: ts[-1] for cid, ts in times.items() if ts}
    first_end = min(ended.values())
    all_ran = [t for t in finished if t <= first_end]
    return {
        "campaign_end_s": sorted(round(end - finished[0], 1) for end in ended.values()),
        "campaigns_running_in_last_window": sum(1 for end in ended.values() if end > finished[-window]),
        "slowest_campaign_when_first_ended": round(
            min(sum(1 for t in ts if t <= first_end) / len(ts) for ts in times.values() if ts), 3
        ),
        # Only when the trials before the first end hold two windows, so that the two do not overlap.
        "last_over_first_while_all_ran": (
            round(_rate(all_ran[-window:]) / _rate(finished[:window]), 3) if len(all_ran) >= 2 * window else None
        ),
    }


def _wait_child(proc: subprocess.Popen[bytes], on_tick: Callable[[], None]) -> int:
    """Wait for ``proc`` through wait4, for its peak resident memory as the kernel counted it (kB)."""
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode:
                raise RuntimeError(f"the driver exited with {proc.returncode}")
            return int(usage.ru_maxrss)
        on_tick()
        time.sleep(0.2)


def one_campaign(bench: Bench, trials: int, window: int, profile: Path | None) -> dict[str, Any]:
    """A campaign of ``trials`` trials driven by ``fleet tune`` to its end."""
    name = f"scale-{trials}-{uuid.uuid4().hex[:4]}"
    spec = bench.write_spec(name, trials)
    before = bench.database_bytes()
    python = ("-m", "cProfile", "-o", str(profile)) if profile else ()
    driver = bench.start("tune", str(spec), "--no-local", "--json", python=python)
    bench.cpu.watch("driver", driver.pid)
    # waitid with WNOWAIT sees an early exit without reaping the driver: wait4 reads its memory at the end.
    _wait(lambda: bench.exists(name) or os.waitid(os.P_PID, driver.pid, _EXITED) is not None, 120, name)
    if not bench.exists(name):
        raise RuntimeError(f"fleet tune exited before it wrote campaign {name}:\n{bench.log_tail()}")
    cid = bench.store.campaign(name).id
    tick = bench.progress("one campaign", [cid], trials, driver.pid)
    try:
        peak_kb = _wait_child(driver, tick)
    except RuntimeError as error:
        raise RuntimeError(f"{error}:\n{bench.log_tail()}") from None
    counts = bench.store.trial_counts(cid)
    if counts.get(TrialState.EVALUATED) != trials:
        raise RuntimeError(f"campaign {name} did not evaluate every trial: {counts}")
    bench.say("  timing the read commands: fleet status, status, best, trials --state errored and report of it")
    return {"trials": trials, "driver": "fleet tune"} | figures(bench, [cid], window, peak_kb, before, name)


def many_campaigns(bench: Bench, campaigns: int, trials: int, window: int) -> dict[str, Any]:
    """``campaigns`` campaigns of ``trials`` trials submitted at once and driven by one ``fleet driver``."""
    from fleet import api
    from fleet.spec import parse_spec

    tag = uuid.uuid4().hex[:4]
    before = bench.database_bytes()
    names = [f"scale-{n:02d}-of-{campaigns}-{tag}" for n in range(campaigns)]
    ids = [
        api.submit(parse_spec(scale_spec(name, bench.target, trials), bench.workdir), bench.store).id for name in names
    ]
    driver = bench.start("driver", "--name", f"scale-driver-{tag}", "--max-campaigns", str(campaigns))
    bench.cpu.watch("driver", driver.pid)
    total = campaigns * trials

    def ended() -> bool:
        if driver.poll() is not None:
            raise RuntimeError(f"the driver exited with {driver.returncode}:\n{bench.log_tail()}")
        return all(bench.store.campaign(cid).status == CampaignStatus.DONE for cid in ids)

    tick = bench.progress(f"{campaigns} campaigns", ids, total, driver.pid)
    while not ended():
        tick()
        time.sleep(0.5)
    # The driver serves on after its campaigns end: its high-water mark is read while it still runs.
    peak_kb = _status_kb(driver.pid, "VmHWM") or 0
    os.killpg(driver.pid, signal.SIGTERM)
    driver.wait(60)
    counts = bench.counts(ids)
    if counts.get(TrialState.EVALUATED) != total:
        raise RuntimeError(f"the {campaigns} campaigns did not evaluate every trial: {counts}")
    bench.say("  timing the read commands: fleet status, and status, best, trials --state errored and report of one")
    shape = {"campaigns": campaigns, "trials_per_campaign": trials, "trials": total, "driver": "fleet driver"}
    return shape | figures(bench, ids, window, peak_kb, before, names[0], evenness=True)


def figures(
    bench: Bench,
    ids: list[int],
    window: int,
    peak_kb: int,
    before: int,
    campaign: str,
    evenness: bool = False,
) -> dict[str, Any]:
    """A finished phase's figures: rates, the driver's peak, the read commands' seconds (of the database, and of
    ``campaign``), the database's growth, and with ``evenness``, how evenly its campaigns went
    (:func:`campaign_ends`)."""
    trials = sum(bench.store.trial_counts(cid).get(TrialState.EVALUATED, 0) for cid in ids)
    after = bench.database_bytes()
    times = bench.finish_times(ids)
    finished = sorted(t for ts in times.values() for t in ts)
    return {
        **rates(finished, window),
        **machine_speed(bench.probe, finished, window),
        "cpu": cpu_use(bench.cpu, finished, window),
        **(campaign_ends(times, window) if evenness else {}),
        "driver_peak_mb": round(peak_kb / 1024, 1),
        "command_s": bench.commands(campaign),
        "database_bytes_per_trial": round((after - before) / trials),
        "database_bytes": after,
    }


def warm_up(bench: Bench) -> dict[str, float]:
    """A small campaign through the same path: workers answer, and the commands' times on it are the baseline
    (``fleet status`` then reads a small database: the warm-up's campaign alone)."""
    name = f"scale-warmup-{uuid.uuid4().hex[:4]}"
    driver = bench.start("tune", str(bench.write_spec(name, WARMUP_TRIALS)), "--no-local", "--json")
    _wait_child(driver, lambda: None)
    return bench.commands(name)


def run(
    trials: int = 100_000,
    campaigns: int = 20,
    concurrent_trials: int = 5_000,
    profile: Path | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Both phases, on the URLs in the environment or on private servers started for the run.

    Parameters
    ----------
    trials:
        Trials of the single campaign.
    campaigns, concurrent_trials:
        Campaigns run at once, and trials of each.
    profile:
        Run the single campaign's ``fleet tune`` under cProfile and write its statistics here.
    on_step:
        Called with one line at each step and every five seconds while a phase runs.
    """
    say = on_step or (lambda _: None)
    with ExitStack() as stack:
        bench = Bench(stack, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-scale-"))), say)
        say("starting a worker (one build and one evaluation process)")
        bench.start_worker()
        say(f"warm-up: a campaign of {WARMUP_TRIALS} trials; the commands' times on it are the baseline")
        baseline = warm_up(bench)
        say(f"  {baseline}")
        window = min(10_000, max(10, trials // 10))
        say(f"one campaign of {trials:,} trials, driven by fleet tune")
        single = one_campaign(bench, trials, window, profile)
        say(f"  {_line(single)}")
        many_window = min(10_000, max(10, campaigns * concurrent_trials // 10))
        say(f"{campaigns} campaigns of {concurrent_trials:,} trials at once, driven by one fleet driver")
        many = many_campaigns(bench, campaigns, concurrent_trials, many_window)
        say(f"  {_line(many)}")
    return {
        "workers": {"build": 1, "eval": 1},
        "cores": os.cpu_count(),
        "builds_per_campaign": BUILDS,
        "window_trials": {"one_campaign": window, "many_campaigns": many_window},
        "one_campaign": single,
        "many_campaigns": many,
        "command_s_baseline": {"trials": WARMUP_TRIALS, **baseline},
        "bench_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "goals": GOALS,
        "met": {
            "one_campaign": met(single),
            "many_campaigns": met(many),
            "small_status_s": baseline["status"] < SMALL_STATUS_S,
        },
    }


def met(phase: dict[str, Any]) -> dict[str, bool]:
    """Which goals a phase met."""
    return {
        "last_over_first": phase["last_over_first"] >= 0.9,
        "driver_peak_mb": phase["driver_peak_mb"] < 300,
        "command_s": all(seconds < COMMAND_S for seconds in phase["command_s"].values()),
    }


def _line(phase: dict[str, Any]) -> str:
    return (
        f"{phase['trials_per_s_first']} trials/s at the start, {phase['trials_per_s_last']} at the end "
        f"(ratio {phase['last_over_first']}); driver peak {phase['driver_peak_mb']} MB; "
        f"commands {phase['command_s']} s; {phase['database_bytes_per_trial']} bytes/trial" + _cpu_line(phase["cpu"])
    )


def _cpu_line(cpu: dict[str, Any]) -> str:
    if not (cpu["first"] and cpu["last"]):
        return ""
    first, last = cpu["first"], cpu["last"]
    return (
        f"; fleet CPU {first['fleet_cpu_ms_per_trial']} -> {last['fleet_cpu_ms_per_trial']} ms/trial, "
        f"idle cores {first['idle_cores']} -> {last['idle_cores']}"
    )
