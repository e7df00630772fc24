"""``fleet bench pipeline``: whether builds and evaluations overlap as well as they could.

Each case is a campaign of a command workload that sleeps: every build sleeps B seconds (``sleep``), every
run sleeps R (a shell's ``sleep``, then one line with the objective), over ``builds`` build-time values times
``runs`` run-time values, on a ``fleet worker`` with ``build_slots`` build and ``eval_slots`` evaluation
processes. Sleeps cost no CPU, so a 2-core machine holds many slots. The campaign is driven by a real
``fleet tune`` process and every trial is sent at once (a grid is static), as a user's run is.

Its makespan, from the first trial's start to the last trial's end (both read from the database), is set
against a lower bound that no schedule beats: the larger of the total build time over the build slots,
and the first build plus the total evaluation time over the evaluation slots (goal: at most 1.1 of it).

Beside it, in the same run, the same campaign in the MITuna order (every build, then every evaluation): a
second campaign on a second target whose worker has only build processes, so that its evaluations wait in
their queue; once every trial is compiled, an evaluation-only worker is started. Its makespan is the build
phase (first trial's start to the last artifact built) plus the evaluation phase (the evaluation worker's
registration, when it starts taking work, or the first run's end less R if that is earlier, to the last
trial's end): the seconds the worker takes to start between the phases are not counted, so the MITuna figure
is the best that order can do.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from fleet.bench.dispatch import _wait
from fleet.bench.scale import Servers
from fleet.states import TrialState

GOAL = 1.1


@dataclass(frozen=True)
class Case:
    """One campaign's shape: B and R in seconds, how many builds and runs of each, and the slots."""

    build_s: float
    run_s: float
    builds: int
    runs: int
    build_slots: int
    eval_slots: int

    @property
    def trials(self) -> int:
        return self.builds * self.runs

    @property
    def bound_s(self) -> float:
        """No schedule ends sooner: builds share the build slots; evaluations start after the first build."""
        return max(
            self.builds * self.build_s / self.build_slots,
            self.build_s + self.trials * self.run_s / self.eval_slots,
        )

    @property
    def mituna_ideal_s(self) -> float:
        """Every build, then every evaluation, each phase perfectly packed: what the MITuna order can reach."""
        return self.builds * self.build_s / self.build_slots + self.trials * self.run_s / self.eval_slots

    def label(self) -> str:
        return (
            f"B={self.build_s:g}s R={self.run_s:g}s {self.builds}x{self.runs} "
            f"slots {self.build_slots}b/{self.eval_slots}e"
        )


# Builds slower than runs, runs slower than builds, balanced, and more slots than cores; bounds of 12-20 s
# keep the default run near six minutes, and make a 50 ms cost per trial show as a few per cent.
CASES = (
    Case(build_s=2.0, run_s=0.25, builds=12, runs=2, build_slots=2, eval_slots=2),
    Case(build_s=1.0, run_s=0.5, builds=6, runs=6, build_slots=1, eval_slots=2),
    Case(build_s=1.0, run_s=0.25, builds=12, runs=4, build_slots=1, eval_slots=1),
    Case(build_s=2.0, run_s=0.5, builds=16, runs=3, build_slots=2, eval_slots=4),
    Case(build_s=4.0, run_s=1.0, builds=4, runs=4, build_slots=1, eval_slots=1),
)

QUICK_CASES = (Case(build_s=0.5, run_s=0.25, builds=3, runs=2, build_slots=1, eval_slots=1),)

# The run sleeps, then prints the objective. A shell starts in about a millisecond of CPU against Python's
# 30; the script is a constant and R comes in as an argument, never spliced into it.
RUN_SCRIPT = 'sleep "$1"; echo "t=$1"'


def pipeline_spec(name: str, target: str, case: Case) -> dict[str, Any]:
    """A campaign of ``case``: its own problem (nothing reused), sleeping builds and runs."""
    return {
        "name": name,
        "target": target,
        "problems": [{"kind": "sleep", "params": {"campaign": name, "build_s": case.build_s, "run_s": case.run_s}}],
        "space": {
            "knobs": {
                "b": {"values": list(range(case.builds)), "build": True},
                "r": {"values": list(range(case.runs)), "build": False},
            }
        },
        "strategy": {"name": "grid"},
        "workload": {
            "kind": "command",
            "build": ["sleep", "{build_s}"],
            "run": ["sh", "-c", RUN_SCRIPT, "sh", "{run_s}"],
            "objective": {"regex": "t=(\\S+)"},
            "repeats": 1,
            "warmup": 0,
        },
    }


class Bench(Servers):
    """The servers of one run; workers and drivers come and go with each case."""

    def worker(self, target: str, role: str, case: Case) -> subprocess.Popen[bytes]:
        """A ``fleet worker`` of ``role`` with the case's slots, once every process of it has registered."""
        proc = self.start(
            "worker",
            "--target",
            target,
            "--role",
            role,
            "--eval-procs",
            str(case.eval_slots),
            "--build-procs",
            str(case.build_slots),
            "--loglevel",
            "WARNING",
        )
        roles = ("build", "eval") if role == "all" else (role,)
        _wait(
            lambda: (
                all(self.store.workers(target=target, role=r, within=30) for r in roles)
                and ("eval" not in roles or self.store.eval_slots(target, 30) >= case.eval_slots)
            ),
            120,
            f"the {role} workers of {target}",
        )
        return proc

    def tune(self, name: str, target: str, case: Case) -> subprocess.Popen[bytes]:
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(pipeline_spec(name, target, case)))
        return self.start("tune", str(path), "--no-local", "--json")

    def times(self, name: str) -> dict[str, datetime]:
        """The campaign's first trial start, last artifact built, first and last trial end, from the database."""
        from sqlalchemy import func, select

        from fleet.store._models import Artifact, Trial

        cid = self.store.campaign(name).id
        keys = select(Trial.build_key).where(Trial.campaign_id == cid)
        with self.store.engine.connect() as connection:
            start, first_end, end = connection.execute(
                select(func.min(Trial.started_at), func.min(Trial.finished_at), func.max(Trial.finished_at)).where(
                    Trial.campaign_id == cid
                )
            ).one()
            built = connection.execute(select(func.max(Artifact.built_at)).where(Artifact.build_key.in_(keys))).one()[0]
        if start is None or first_end is None or end is None or built is None:
            raise RuntimeError(f"campaign {name} has no trial that ran and ended, or no artifact built")
        return {"start": start, "first_end": first_end, "end": end, "last_built": built}


def _wait_done(bench: Bench, driver: subprocess.Popen[bytes], name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while driver.poll() is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"campaign {name} did not end in {timeout:.0f} s")
        time.sleep(0.2)
    counts = bench.store.trial_counts(bench.store.campaign(name).id)
    if driver.returncode or set(counts) != {TrialState.EVALUATED}:
        raise RuntimeError(f"campaign {name} ended with {driver.returncode}, trials {counts}:\n{bench.log_tail()}")


def pipelined(bench: Bench, case: Case) -> float:
    """Makespan of the campaign as the fleet runs it: builds and evaluations at once."""
    tag = uuid.uuid4().hex[:6]
    target, name = f"cpu-pipe{tag}", f"pipeline-{tag}"
    worker = bench.worker(target, "all", case)
    try:
        _wait_done(bench, bench.tune(name, target, case), name, 30 + 3 * case.mituna_ideal_s)
    finally:
        bench.finish([worker])
    at = bench.times(name)
    return (at["end"] - at["start"]).total_seconds()


def mituna_order(bench: Bench, case: Case) -> dict[str, float]:
    """Makespan of the same campaign with every build first, then every evaluation (see the module's text)."""
    tag = uuid.uuid4().hex[:6]
    target, name = f"cpu-tuna{tag}", f"mituna-{tag}"
    procs = [bench.worker(target, "build", case)]
    try:
        driver = bench.tune(name, target, case)
        _wait(lambda: bench.exists(name), 60, f"campaign {name}")
        cid = bench.store.campaign(name).id
        _wait(
            lambda: bench.store.trial_counts(cid).get(TrialState.COMPILED) == case.trials,
            30 + 3 * case.mituna_ideal_s,
            "every build",
        )
        procs.append(bench.worker(target, "eval", case))
        _wait_done(bench, driver, name, 30 + 3 * case.mituna_ideal_s)
    finally:
        bench.finish(procs)
    at = bench.times(name)
    evaluators = bench.store.workers(target=target, role="eval")
    # A Celery worker may take its first task a moment before it registers: the first run's end less R is
    # then earlier, and no evaluation started before it could have ended by then.
    released = min([w.started_at for w in evaluators] + [at["first_end"] - timedelta(seconds=case.run_s)])
    build_phase = (at["last_built"] - at["start"]).total_seconds()
    eval_phase = (at["end"] - released).total_seconds()
    return {"build_phase_s": build_phase, "eval_phase_s": eval_phase, "makespan_s": build_phase + eval_phase}


def run(cases: Sequence[Case] = CASES, on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every case, each as the fleet runs it and in the MITuna order, on private servers unless URLs are set."""
    say = on_step or (lambda _: None)
    rows = []
    with ExitStack() as stack:
        bench = Bench(stack, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-pipeline-"))))
        for number, case in enumerate(cases, 1):
            say(f"case {number}/{len(cases)}: {case.label()}, bound {case.bound_s:.1f} s")
            fleet_s = pipelined(bench, case)
            say(f"  fleet {fleet_s:.1f} s ({fleet_s / case.bound_s:.3f} of the bound)")
            tuna = mituna_order(bench, case)
            say(
                f"  MITuna order {tuna['makespan_s']:.1f} s ({tuna['makespan_s'] / case.bound_s:.3f}): builds "
                f"{tuna['build_phase_s']:.1f} s, then evaluations {tuna['eval_phase_s']:.1f} s"
            )
            rows.append(
                {
                    "case": case.label(),
                    **asdict(case),
                    "trials": case.trials,
                    "bound_s": round(case.bound_s, 2),
                    "fleet_s": round(fleet_s, 2),
                    "fleet_over_bound": round(fleet_s / case.bound_s, 3),
                    "mituna_s": round(tuna["makespan_s"], 2),
                    "mituna_over_bound": round(tuna["makespan_s"] / case.bound_s, 3),
                    "mituna_build_phase_s": round(tuna["build_phase_s"], 2),
                    "mituna_eval_phase_s": round(tuna["eval_phase_s"], 2),
                    "mituna_ideal_s": round(case.mituna_ideal_s, 2),
                    # The MITuna order runs builds and evaluations each back to back: what each took beyond its
                    # sleep is the fleet's cost per task (claim, record, messages, the command's start).
                    "build_overhead_s": round(tuna["build_phase_s"] * case.build_slots / case.builds - case.build_s, 3),
                    "eval_overhead_s": round(tuna["eval_phase_s"] * case.eval_slots / case.trials - case.run_s, 3),
                }
            )
    return {
        "cases": rows,
        "goal": f"fleet_over_bound <= {GOAL}",
        "met": all(row["fleet_over_bound"] <= GOAL for row in rows),
        "worst_fleet_over_bound": max(row["fleet_over_bound"] for row in rows),
    }
