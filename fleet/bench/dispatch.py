"""``fleet bench dispatch``: trials per second through the whole fleet, against a bare Celery chain.

Both run on the same Redis with two worker processes (one build, one evaluation, concurrency 1 each),
taking turns for a few rounds (see :func:`run`).
The fleet side runs a real campaign of the ``noop`` workload: every trial is written, claimed, built,
claimed again, evaluated and recorded in PostgreSQL, exactly as a real trial is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from fleet.bench.servers import private_servers
from fleet.states import CampaignStatus, TrialState

if TYPE_CHECKING:
    from fleet.search.base import Proposals
    from fleet.space import Config


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _proposals(configs: Iterable[Config]) -> Proposals:
    """The configurations in order, as a searcher's generator that takes the runs sent back and ignores them."""
    # Not ``yield from``: that would send the runs on to the iterable, which has no ``send``.
    for config in configs:  # noqa: UP028
        yield config


def _celery_worker(app: str, name: str, queue: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "worker",
                "-n",
                name,
                "-Q",
                queue,
                "-c",
                "1",
                "-P",
                "prefork",
                "-E",
                "--without-gossip",
                "--without-mingle",
                "-l",
                "WARNING",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    import signal

    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def celery_chain(trials: int, env: dict[str, str], workdir: Path) -> float:
    """Trials per second of the bare chain."""
    import redis

    counter = redis.Redis.from_url(env["FLEET_BENCH_REDIS"])
    counter.delete("fleet-bench:done")
    env = {**env, "FLEET_BENCH_REDIS": env["FLEET_BENCH_REDIS"]}
    procs = [
        _celery_worker(
            "fleet.bench.chain", f"bench-build-{uuid.uuid4().hex[:6]}@bench", "bench.build", env, workdir / "chain.log"
        ),
        _celery_worker(
            "fleet.bench.chain", f"bench-eval-{uuid.uuid4().hex[:6]}@bench", "bench.eval", env, workdir / "chain.log"
        ),
    ]
    try:
        from fleet.bench import chain

        chain.app.conf.broker_url = env["FLEET_BROKER_URL"]
        # Warm up: both workers answer before the clock starts.
        chain.build.delay(-1)
        _wait(lambda: int(counter.get("fleet-bench:done") or 0) >= 1, 60, "the chain's workers")
        counter.delete("fleet-bench:done")
        start = time.perf_counter()
        with chain.app.producer_or_acquire() as producer:
            for n in range(trials):
                chain.build.apply_async(args=[n], producer=producer)
        _wait(lambda: int(counter.get("fleet-bench:done") or 0) >= trials, 600, "the chain")
        return trials / (time.perf_counter() - start)
    finally:
        _stop(procs)


def fleet_campaign(trials: int, env: dict[str, str], workdir: Path) -> tuple[float, float]:
    """Trials per second of a noop campaign through the whole fleet, and the trials per message its driver sent."""
    from fleet.driving.campaign import CampaignSpec, Driver, ProblemSpec, submit
    from fleet.settings import reset_settings
    from fleet.space import Knob, Space
    from fleet.store import Store

    os.environ.update(env)
    reset_settings()
    from fleet.settings import get_settings
    from fleet.tasks import app, configure, send

    configure(app, get_settings())
    store = Store(env["FLEET_DATABASE_URL"])
    store.upgrade()
    target = f"cpu-bench{uuid.uuid4().hex[:6]}"
    log = workdir / "fleet-worker.log"
    with log.open("ab") as out:
        launcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleet.cli",
                "worker",
                "--target",
                target,
                "--eval-procs",
                "1",
                "--build-procs",
                "1",
                "--loglevel",
                "WARNING",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: len(store.workers(target=target, within=30)) >= 2, 60, "the fleet's workers")
        space = Space((Knob("i", tuple(range(trials + 1))),))
        spec = CampaignSpec(
            name=f"bench-{target}",
            problems=[ProblemSpec("noop", {})],
            target=target,
            space=space,
            strategy={"name": "grid"},
            workload={"kind": "noop"},
        )
        campaign = submit(store, spec)
        warm = Driver(store, campaign, send, window=1)
        warm.feeds[0].proposals = _proposals([{"i": trials}])
        warm.run()
        store.set_campaign_status(campaign.id, CampaignStatus.RUNNING)  # the warm-up ended it; the measured run goes on
        messages = []

        def dispatch(work: list[Any], batch: int) -> int:
            messages.append(-(-len(work) // batch))
            return send(work, batch)

        driver = Driver(store, campaign, dispatch, window=min(trials, 1024))
        driver.feeds[0].proposals = _proposals({"i": i} for i in range(trials))
        start = time.perf_counter()
        driver.run()
        elapsed = time.perf_counter() - start
        counts = store.trial_counts(campaign.id)
        if counts.get(TrialState.EVALUATED) != trials + 1:
            raise RuntimeError(f"the fleet did not evaluate every trial: {counts}")
        return trials / elapsed, trials / sum(messages)
    finally:
        _stop([launcher])
        store.close()


def run(
    trials: int = 2000, rounds: int = 5, on_round: Callable[[int, float, float], None] | None = None
) -> dict[str, float]:
    """Measure both, on the URLs in the environment or on private servers started for the run.

    The two sides take turns, ``rounds`` times (chain then fleet, then fleet then chain, ...), and the
    medians are reported, the ratio's over the rounds' own ratios: a shared machine's speed drifts within
    a minute, and two measurements taken back to back see the same machine.

    Parameters
    ----------
    trials:
        Trials per side and round.
    rounds:
        How many times each side is measured.
    on_round:
        Called after each round with its number, the fleet's and the chain's trials per second.
    """
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-")))
        env = dict(os.environ)
        private_servers(stack, workdir, env)
        env.setdefault("FLEET_BENCH_REDIS", env["FLEET_BROKER_URL"].replace("redis+socket", "unix"))
        env["FLEET_HOME"] = str(workdir / "home")
        env["PYTHONUNBUFFERED"] = "1"
        fleet_rates: list[float] = []
        chain_rates: list[float] = []
        per_message: list[float] = []
        for number in range(1, rounds + 1):
            if number % 2:
                chain_rates.append(celery_chain(trials, env, workdir))
                fleet_rate, batch = fleet_campaign(trials, env, workdir)
            else:
                fleet_rate, batch = fleet_campaign(trials, env, workdir)
                chain_rates.append(celery_chain(trials, env, workdir))
            fleet_rates.append(fleet_rate)
            per_message.append(batch)
            if on_round is not None:
                on_round(number, fleet_rates[-1], chain_rates[-1])
    return {
        "fleet_trials_per_s": round(median(fleet_rates), 1),
        "celery_trials_per_s": round(median(chain_rates), 1),
        "ratio": round(median(f / c for f, c in zip(fleet_rates, chain_rates, strict=True)), 3),
        # What the driver sent: each of its compile messages' evaluations go out in one message too.
        "fleet_trials_per_message": round(median(per_message), 1),
    }
