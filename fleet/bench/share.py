"""``fleet bench share``: how campaigns on one target share it, how fast a driver is replaced, how fast a cancel bites.

One target with two evaluation slots (a ``fleet worker`` with two evaluation processes), ``fleet driver``
processes, and campaigns of a command workload whose measurement sleeps a fixed time:

- **share**: two campaigns submitted together, with equal priorities and then with weights 3:1; each one's
  share of the evaluations that finished in the first half of the run (goals: 50% and 75%, ± 10%).
- **joining**: a campaign of cheap trials (the ``noop`` workload, several to a message) joins one of equal
  priority that has had the slots to itself; the newcomer's share of the evaluations in each half of the
  time both ran (goal for the second: 50% ± 10%; the first half includes its start behind the other's
  queue). A driver that sized its window from how fast its own trials came back kept the lead it had.
- **takeover**: the driver of a running campaign is SIGKILLed; seconds until the other driver holds it
  (goal: the lease plus 10 s at most).
- **cancel**: a running campaign is cancelled; seconds until the last trial of it started (goal: none later
  than 5 s after the cancel), and until its running measurements were killed (the workers' lease renewal
  fails, every 5 s at most; goal: 10 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fleet.bench.dispatch import _stop, _wait
from fleet.bench.servers import private_servers
from fleet.states import CampaignStatus, TrialState

LEASE_SECONDS = 10


def _spec(name: str, target: str, trials: int, seconds: float) -> dict[str, Any]:
    """A campaign of ``trials`` measurements that each sleep ``seconds``."""
    program = f"import time; time.sleep({seconds}); print('{{\"t\": {seconds}}}')  # {name}"
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "sleep", "params": {"campaign": name}}],  # measured afresh: none reused
        "space": {"knobs": {"i": {"values": list(range(trials)), "build": False}}},
        "strategy": {"name": "grid"},
        "workload": {"kind": "command", "run": [sys.executable, "-c", program, "{i}"], "objective": {"json": "t"}},
    }


def cheap_spec(name: str, target: str, trials: int) -> dict[str, Any]:
    """A campaign of ``trials`` ``noop`` trials over one build: each takes a millisecond or two of a slot."""
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "noop", "params": {"campaign": name}}],
        "space": {"knobs": {"i": {"values": list(range(trials)), "build": False}}},
        "strategy": {"name": "grid"},
        "workload": {"kind": "noop"},
    }


class Bench:
    """The servers, the worker and the drivers of one run."""

    def __init__(self, stack: ExitStack, workdir: Path) -> None:
        env = dict(os.environ)
        private_servers(stack, workdir, env)
        env |= {
            "FLEET_HOME": str(workdir / "home"),
            "FLEET_DRIVER_LEASE_SECONDS": str(LEASE_SECONDS),
            "FLEET_HEARTBEAT_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        os.environ.update(env)
        from fleet.settings import reset_settings

        reset_settings()
        from fleet.store import Store

        self.env, self.workdir = env, workdir
        self.store = Store(env["FLEET_DATABASE_URL"])
        self.store.upgrade()
        self.target = f"cpu-share{uuid.uuid4().hex[:6]}"
        self.procs: list[subprocess.Popen[bytes]] = []
        stack.callback(self.close)

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        with (self.workdir / "fleet.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet.cli", *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def start_worker(self) -> None:
        self.start("worker", "--target", self.target, "--eval-procs", "2", "--build-procs", "1")
        _wait(lambda: self.store.eval_slots(self.target, 30) >= 2, 120, "two evaluation slots")

    def start_driver(self, name: str) -> subprocess.Popen[bytes]:
        proc = self.start("driver", "--name", name)
        _wait(lambda: any(w.name == name for w in self.store.workers(role="driver", within=30)), 60, name)
        return proc

    def submit(self, name: str, trials: int, seconds: float | None, priority: float = 1.0) -> int:
        """Submit a campaign of ``trials`` that sleep ``seconds`` each, or of cheap ones when it is None."""
        from fleet import api
        from fleet.spec import parse_spec

        raw = cheap_spec(name, self.target, trials) if seconds is None else _spec(name, self.target, trials, seconds)
        return api.submit(parse_spec(raw, self.workdir), self.store, priority=priority).id

    def wait_done(self, *ids: int, timeout: float = 600) -> None:
        _wait(
            lambda: all(self.store.campaign(i).status == CampaignStatus.DONE for i in ids),
            timeout,
            "the campaigns to end",
        )

    def close(self) -> None:
        _stop(self.procs)
        self.store.close()


def first_half_shares(store: Any, ids: tuple[int, ...]) -> list[float]:
    """Each campaign's share of the evaluations that finished in the first half of their joint run."""
    trials = [t for i in ids for t in store.trials(i, [TrialState.EVALUATED])]
    start = min(t.started_at for t in trials)
    middle = start + (max(t.finished_at for t in trials) - start) / 2
    early = [t for t in trials if t.finished_at <= middle]
    return [sum(t.campaign_id == i for t in early) / len(early) for i in ids]


def joined_shares(store: Any, first: int, second: int) -> dict[str, float]:
    """How ``second``, submitted while ``first`` ran, shared the slots with it until either ended.

    Its first trials wait behind what ``first`` has queued, and so does its first full window once they say
    its trials are cheap: two queues' worth of seconds before it gets its share. So: the seconds until its
    first trial finished, and its share of the evaluations in each half of the time both were submitted.
    """
    finished = {i: sorted(t.finished_at for t in store.trials(i, [TrialState.EVALUATED])) for i in (first, second)}
    start, end = store.campaign(second).created_at, min(times[-1] for times in finished.values())
    middle = start + (end - start) / 2

    def share(since: Any, until: Any) -> float:
        within = {i: sum(since < at <= until for at in times) for i, times in finished.items()}
        return within[second] / (sum(within.values()) or 1)

    return {
        "first_result_s": (finished[second][0] - start).total_seconds(),
        "share_first_half": share(start, middle),
        "share_second_half": share(middle, end),
    }


def joining(bench: Bench, trials: int) -> dict[str, float]:
    """A campaign of cheap trials joins one of equal priority that ran alone until a quarter of it finished."""
    tag = uuid.uuid4().hex[:4]
    first = bench.submit(f"alone-{tag}", trials, None)
    _wait(lambda: bench.store.trial_counts(first).get(TrialState.EVALUATED, 0) >= trials // 4, 300, "the first quarter")
    second = bench.submit(f"joining-{tag}", trials // 2, None)
    bench.wait_done(first, second)
    return joined_shares(bench.store, first, second)


def share(bench: Bench, weights: tuple[float, float], trials: int, seconds: float) -> list[float]:
    tag = uuid.uuid4().hex[:4]
    ids = tuple(bench.submit(f"share-{w:g}-{n}-{tag}", trials, seconds, priority=w) for n, w in enumerate(weights))
    bench.wait_done(*ids)
    return first_half_shares(bench.store, ids)


def takeover(bench: Bench, drivers: dict[str, subprocess.Popen[bytes]], seconds: float) -> float:
    """Seconds from a SIGKILL of the driver of a running campaign until the other driver holds it."""
    cid = bench.submit(f"takeover-{uuid.uuid4().hex[:4]}", 40, seconds)
    # Either driver may take it: the first to look.
    _wait(lambda: bench.store.campaign(cid).driver in drivers, 60, "a driver to take the campaign")
    holder = str(bench.store.campaign(cid).driver)  # one of drivers: waited for above
    _wait(lambda: bench.store.trial_counts(cid).get(TrialState.EVALUATED, 0) >= 4, 120, "trials to finish")
    os.killpg(drivers[holder].pid, signal.SIGKILL)
    killed = time.monotonic()
    other = next(name for name in drivers if name != holder)
    _wait(lambda: bench.store.campaign(cid).driver == other, LEASE_SECONDS + 60, f"{other} to take over")
    took = time.monotonic() - killed
    bench.wait_done(cid)
    return took


def cancel(bench: Bench, seconds: float) -> dict[str, float]:
    """Seconds from a cancel until the last trial of it started, and until its running measurements were killed."""
    from fleet.store import utcnow

    name = f"cancel-{uuid.uuid4().hex[:4]}"
    cid = bench.submit(name, 40, seconds)
    _wait(lambda: bench.store.trial_counts(cid).get(TrialState.EVALUATING, 0) >= 2, 120, "two measurements to run")
    at = utcnow()
    bench.store.cancel_campaign(cid)
    started = time.monotonic()
    _wait(lambda: not _measuring(name), 60, "the measurements to be killed")
    stopped = time.monotonic() - started
    time.sleep(5)  # a trial that starts late shows up here
    last = max(t.started_at for t in bench.store.trials(cid) if t.started_at is not None)
    return {"last_start_s": max(0.0, (last - at).total_seconds()), "stopped_s": stopped}


def _measuring(name: str) -> bool:
    """Whether a measurement of campaign ``name`` runs on this machine (its program names the campaign)."""
    for entry in Path("/proc").iterdir():
        try:
            if name.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def run(
    trials: int = 40, seconds: float = 0.25, cheap: int = 8000, on_step: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """All four measurements, on the URLs in the environment or on private servers started for the run.

    Parameters
    ----------
    trials, seconds:
        Trials per campaign and each one's measurement, for the shares by priority, the takeover and the cancel.
    cheap:
        Trials of the campaign that the cheap one joins.
    """
    say = on_step or (lambda _: None)
    with ExitStack() as stack:
        bench = Bench(stack, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-share-"))))
        bench.start_worker()
        first = bench.start_driver("driver-a")
        say(f"equal priorities: two campaigns of {trials} trials of {seconds} s on 2 evaluation slots")
        equal = share(bench, (1, 1), trials, seconds)
        say(f"  first half: {equal[0]:.0%} / {equal[1]:.0%}")
        say("weights 3:1")
        weighted = share(bench, (3, 1), trials, seconds)
        say(f"  first half: {weighted[0]:.0%} / {weighted[1]:.0%}")
        say(f"cheap trials: a campaign of {cheap // 2} joins one of {cheap} a quarter done, equal priorities")
        joined = joining(bench, cheap)
        say(
            f"  its first trial back after {joined['first_result_s']:.1f} s; its share "
            f"{joined['share_first_half']:.0%}, then {joined['share_second_half']:.0%}"
        )
        second = bench.start_driver("driver-b")
        say(f"driver takeover after SIGKILL (lease {LEASE_SECONDS} s)")
        took = takeover(bench, {"driver-a": first, "driver-b": second}, seconds)
        say(f"  {took:.1f} s")
        say("cancel of a campaign whose measurements take 30 s")
        cancelled = cancel(bench, 30.0)
        last, stopped = cancelled["last_start_s"], cancelled["stopped_s"]
        say(f"  last trial started {last:.1f} s after; its measurements were killed after {stopped:.1f} s")
    return {
        "slots": 2,
        "trials_per_campaign": trials,
        "measure_s": seconds,
        "equal_share_first_half": round(equal[0], 3),
        "weighted_3_1_share_first_half": round(weighted[0], 3),
        "cheap_trials": cheap,
        "cheap_joining_first_result_s": round(joined["first_result_s"], 2),
        "cheap_joining_share_first_half": round(joined["share_first_half"], 3),
        "cheap_joining_share_second_half": round(joined["share_second_half"], 3),
        "lease_s": LEASE_SECONDS,
        "takeover_s": round(took, 2),
        "cancel_last_start_s": round(cancelled["last_start_s"], 2),
        "cancel_stopped_s": round(cancelled["stopped_s"], 2),
        "goals": {
            "equal_share": "0.5 ± 0.1",
            "weighted_share": "0.75 ± 0.1",
            "cheap_joining_share_second_half": "0.5 ± 0.1",
            "takeover_s": f"<= {LEASE_SECONDS + 10}",
            "cancel_last_start_s": "< 5",
        },
    }
