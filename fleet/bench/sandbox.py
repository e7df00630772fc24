"""``fleet bench sandbox``: what the sandbox costs a trial, measured beside ``FLEET_SANDBOX=none`` in one run.

Two figures, each from the runner that workers use (:func:`fleet.workers.runner.run`), the two modes taking
turns so that a machine that slows down slows both:

- start and teardown: the wall time of ``true``, sandboxed minus not (medians over ``--starts`` runs each);
- timing noise: a compiled program that does a fixed amount of work (about 10 ms, and about 1 s) and prints the
  time it measured itself, as a workload does; the median of what it reports, sandboxed over not. A sandbox
  that disturbed a measurement (its init, its namespaces, its limits) would show here.

Goals (issue 29): start and teardown under 15 ms; each median within 1% of the unsandboxed one.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click

SPIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    unsigned long n = strtoul(argv[1], NULL, 10), i;
    volatile double x = 1.0;
    double start = now();
    for (i = 0; i < n; i++) x = x * 1.0000001 + 1e-9;
    printf("{\"ms\": %.6f}\n", (now() - start) * 1e3);
    return 0;
}
"""
MODES = ("bwrap", "none")


def _run(argv: list[str], cwd: Path, mode: str) -> tuple[float, str]:
    """Wall seconds and output of ``argv`` run by the runner with ``FLEET_SANDBOX=mode``."""
    from fleet.workers import runner

    os.environ["FLEET_SANDBOX"] = mode
    start = time.perf_counter()
    done = runner.run(argv, cwd=cwd, timeout=60)
    seconds = time.perf_counter() - start
    if not done.ok:
        raise click.ClickException(f"{' '.join(argv)} in mode {mode}: {done.failure('it')}")
    return seconds, done.stdout


def measure(starts: int = 200, rounds: int = 5, spins: int = 20) -> dict[str, Any]:
    """Both figures, alternating the modes; see the module docstring."""
    from fleet.workers import sandbox

    if shutil.which("gcc") is None:
        raise click.ClickException("fleet bench sandbox needs gcc (apt-get install gcc)")
    reason = sandbox.probe()
    if reason is not None:
        raise click.ClickException(f"the sandbox cannot start on this machine: {reason}")
    saved = os.environ.get("FLEET_SANDBOX")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-sandbox-") as folder:
        scratch = Path(folder) / "scratch"
        scratch.mkdir()
        os.chmod(folder, 0o755)
        (scratch / "spin.c").write_text(SPIN)
        subprocess.run(["gcc", "-O2", "-o", str(scratch / "spin"), str(scratch / "spin.c")], check=True)
        try:
            walls: dict[str, list[float]] = {mode: [] for mode in MODES}
            for index in range(starts):
                for mode in MODES if index % 2 else reversed(MODES):
                    walls[mode].append(_run(["true"], scratch, mode)[0])
            # A fixed amount of work, timed by the program itself as a workload times its kernel: the iterations
            # that take about 10 ms and 1 s here, found unsandboxed first.
            probe = 10_000_000
            per_ms = probe / json.loads(_run(["./spin", str(probe)], scratch, "none")[1])["ms"]
            reported: dict[str, dict[str, list[float]]] = {"10ms": {m: [] for m in MODES}, "1s": {m: [] for m in MODES}}
            for label, ms, count in (("10ms", 10, spins), ("1s", 1000, rounds)):
                for index in range(count):
                    for mode in MODES if index % 2 else reversed(MODES):
                        out = _run(["./spin", str(int(per_ms * ms))], scratch, mode)[1]
                        reported[label][mode].append(json.loads(out)["ms"])
        finally:
            if saved is None:
                os.environ.pop("FLEET_SANDBOX", None)
            else:
                os.environ["FLEET_SANDBOX"] = saved
    start = {mode: statistics.median(walls[mode]) * 1e3 for mode in MODES}
    runs = {
        label: {
            **{f"{mode}_ms": statistics.median(values[mode]) for mode in MODES},
            "ratio": statistics.median(values["bwrap"]) / statistics.median(values["none"]),
        }
        for label, values in reported.items()
    }
    return {
        "start_teardown_ms": start["bwrap"] - start["none"],
        "true_ms": start,
        "runs": runs,
        "starts": starts,
        "goals": {"start_teardown_ms": 15.0, "ratio_within": 0.01},
        "met": start["bwrap"] - start["none"] < 15.0 and all(abs(r["ratio"] - 1) <= 0.01 for r in runs.values()),
    }


@click.command("sandbox")
@click.option("--starts", type=click.IntRange(10), default=200, show_default=True, help="Runs of `true` per mode.")
@click.option("--rounds", type=click.IntRange(1), default=5, show_default=True, help="1 s runs per mode.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def sandbox_bench_command(starts: int, rounds: int, as_json: bool) -> None:
    """What the workloads' sandbox costs a trial: start and teardown, and the noise it adds to a measured time.

    Beside FLEET_SANDBOX=none, in one run, the two taking turns. Goals: start and teardown under 15 ms; the
    median time a 10 ms and a 1 s run report within 1% of the unsandboxed one.
    """
    figures = measure(starts=starts, rounds=rounds)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    click.echo(
        f"start and teardown: {figures['start_teardown_ms']:.2f} ms "
        f"(true: {figures['true_ms']['bwrap']:.2f} ms sandboxed, {figures['true_ms']['none']:.2f} ms not; goal < 15)"
    )
    for label, run in figures["runs"].items():
        click.echo(
            f"{label} run: {run['bwrap_ms']:.3f} ms sandboxed, {run['none_ms']:.3f} ms not: "
            f"ratio {run['ratio']:.4f} (goal within 1%)"
        )
    click.echo("goals met" if figures["met"] else "goals NOT met")
