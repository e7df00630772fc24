"""``fleet bench metaschedule``: the same ``ms.tune_tir`` task with MetaSchedule's ``LocalRunner`` and with Fleet's
``FleetRunner``, on this machine, in one run.

Both tune a float32 matmul (1024^3 by default) with the same builder
(:class:`~fleet.tvm.metaschedule.InProcessBuilder`), cost model, seed, number of trials, evaluator config and time
limit per candidate (``LocalRunner``'s); each measures with one process (``LocalRunner``'s one pool process, one
evaluation worker of an embedded fleet). Reported for each: candidates measured per second of the runner's time
(from a batch's ``run`` to its last result), the whole tuning's seconds, and the best schedule's GFLOPS, as its
runner measured it and measured again here, side by side, so the two bests are compared under the same load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import click


def _timed(inner: Any, spans: list[float], errors: list[str], log: Callable[[str], None]) -> Any:
    """``inner`` wrapped in a runner that adds each batch's time, from ``run`` to its last result, to ``spans``, and
    each failed candidate's error (its first line) to ``errors``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture

    @derived_object
    class TimedFuture(PyRunnerFuture):
        def __init__(self, future: Any, batch: dict[str, Any]) -> None:
            super().__init__()
            self.future, self.batch = future, batch

        def done(self) -> bool:
            return bool(self.future.done())

        def result(self) -> Any:
            result = self.future.result()
            if result.error_msg:
                errors.append(str(result.error_msg).strip().splitlines()[0][:300])
            self.batch["left"] -= 1
            if self.batch["left"] == 0:
                spans.append(time.monotonic() - self.batch["started"])
                log(f"  batch of {self.batch['size']} measured in {spans[-1]:.1f} s")
            return result

    @derived_object
    class TimedRunner(PyRunner):
        def __init__(self) -> None:
            super().__init__()

        def run(self, runner_inputs: list[Any]) -> list[Any]:
            batch = {"started": time.monotonic(), "left": len(runner_inputs), "size": len(runner_inputs)}
            return [TimedFuture(f, batch) for f in inner.run(runner_inputs)]

    return TimedRunner()


def _tune_with(
    name: str, runner: Any, mod: Any, target: Any, trials: int, per_iter: int, log: Callable[[str], None]
) -> dict[str, Any]:
    import tvm.s_tir.meta_schedule as ms

    from fleet.tvm.metaschedule import tune

    spans: list[float] = []
    errors: list[str] = []
    log(f"{name}: ms.tune_tir, {trials} trials ...")
    tuned = tune(
        mod,
        target,
        trials=trials,
        per_iter=per_iter,
        runner=_timed(runner, spans, errors, log),
        database=ms.database.MemoryDatabase(),
        cost_model="random",
        seed=0,
    )
    records = tuned.database.get_all_tuning_records()
    measured = sum(1 for r in records if r.run_secs and all(float(s) < 1e9 for s in r.run_secs))
    return {
        "runner": name,
        "candidates": len(records),
        "measured": measured,
        "failures": errors,
        "runner_seconds": sum(spans),
        "candidates_per_second": len(records) / sum(spans) if spans else 0.0,
        "tune_seconds": tuned.seconds,
        "best_seconds": tuned.best_seconds,
        "schedule": tuned.schedule,
        "records": records,
    }


def _candidates(records: list[Any], target: Any, failed: bool = False) -> tuple[list[Any], list[str]]:
    """The measured candidates of a tuning (``failed``: those that failed instead), built again as ``RunnerInput``s
    (and the folders to remove after)."""
    import tvm
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    from fleet.tvm.metaschedule import InProcessBuilder

    builder = InProcessBuilder()
    inputs, folders = [], []
    for record in records:
        if (not record.run_secs or any(float(s) >= 1e9 for s in record.run_secs)) != failed:
            continue  # a failed one (past the time limit) would only measure the limit
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        [built] = builder.build([BuilderInput(sch.mod, target)])
        if built.error_msg is None:
            inputs.append(RunnerInput(built.artifact_path, "cpu", record.args_info))
            folders.append(os.path.dirname(built.artifact_path))
    return inputs, folders


def _replay(name: str, runner: Any, inputs: list[Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Measure ``inputs`` with ``runner``: candidates per second, and each candidate's mean seconds."""
    log(f"{name}: the same {len(inputs)} candidates ...")
    started = time.monotonic()
    results = [future.result() for future in runner.run(inputs)]
    seconds = time.monotonic() - started
    means = [statistics.mean(float(s) for s in r.run_secs) if r.error_msg is None else None for r in results]
    errors = [str(r.error_msg).strip().splitlines()[0][:300] for r in results if r.error_msg]
    return {
        "runner": name,
        "candidates": len(inputs),
        "measured": sum(m is not None for m in means),
        "failures": errors,
        "runner_seconds": seconds,
        "candidates_per_second": len(inputs) / seconds if seconds else 0.0,
        "means": means,
    }


def _remeasure(schedule: Any, target: Any, shape: tuple[int, int, int]) -> float:
    """Seconds of a schedule's module measured here (5 repeats of at least 100 ms, the median)."""
    import numpy as np
    import tvm

    m, n, k = shape
    built = tvm.compile(schedule.mod, target=target).jit()
    dev = tvm.cpu(0)
    rng = np.random.default_rng(0)
    a = tvm.runtime.tensor(rng.standard_normal((m, k)).astype("float32"), dev)
    b = tvm.runtime.tensor(rng.standard_normal((k, n)).astype("float32"), dev)
    c = tvm.runtime.empty((m, n), "float32", dev)
    timer = built.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=100)
    return statistics.median(float(s) for s in timer(a, b, c).results)


def run(size: int, trials: int, per_iter: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Tune with LocalRunner, then with FleetRunner on an embedded fleet of one evaluation worker."""
    import tvm
    from tvm.s_tir.meta_schedule.runner import LocalRunner

    from fleet.tvm.metaschedule import tvm_target
    from fleet.tvm.operators import DENSE, check_problem, define, flops
    from fleet.workers.gpus import cpu_target

    p = check_problem(DENSE, {"m": size, "n": size, "k": size})
    mod = tvm.IRModule({"main": define(DENSE, p)})
    fleet_target = cpu_target()
    target = tvm_target(fleet_target)
    local_runner = LocalRunner()
    rows = [_tune_with("LocalRunner", local_runner, mod, target, trials, per_iter, log)]
    log(json.dumps({k: v for k, v in rows[0].items() if k not in ("schedule", "records")}))
    # MetaSchedule's search is not the same from one tuning to the next, seed or not (its sampling runs on threads),
    # and one slow candidate drawn more weighs seconds: both runners also measure the same candidates, LocalRunner's.
    inputs, folders = _candidates(rows[0]["records"], target)
    same, crossed, more = _on_a_fleet(fleet_target, local_runner, rows, inputs, (mod, target, trials, per_iter), log)
    folders += more
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    pairs = [(a, b) for a, b in zip(same[0].pop("means"), same[1].pop("means"), strict=True) if a and b]
    total = flops(DENSE, p)
    for row in rows:
        log(f"{row['runner']}: measuring its best schedule again here ...")
        row.pop("records")
        schedule = row.pop("schedule")
        row["best_gflops"] = total / row["best_seconds"] / 1e9 if row["best_seconds"] else None
        row["best_gflops_here"] = total / _remeasure(schedule, target, (size,) * 3) / 1e9 if schedule else None
    local, fleet = rows
    return {
        "task": f"matmul {size}^3 float32, ms.tune_tir, {trials} trials, {per_iter} a batch, cost model random",
        "target": fleet_target,
        "measuring_processes": 1,
        "local": local,
        "fleet": fleet,
        "fleet_over_local_candidates_per_second": (
            fleet["candidates_per_second"] / local["candidates_per_second"] if local["candidates_per_second"] else None
        ),
        "same_candidates": _same_candidates(same, pairs, total),
        "failed_candidates": crossed,
        "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()[0]},
    }


def _on_a_fleet(
    fleet_target: str,
    local_runner: Any,
    rows: list[dict[str, Any]],
    inputs: list[Any],
    tuning: tuple[Any, Any, int, int],
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """FleetRunner's side, on an embedded fleet of its own: its tuning (appended to ``rows``), both runners'
    replays of LocalRunner's candidates, and each runner's failed candidates measured by the other.

    ``tuning`` is (module, TVM target, trials, per batch), as :func:`_tune_with` takes them. Returns the two
    replays, the crossed measurements, and the folders the failed candidates were written to.
    """
    from fleet.local import LocalFleet
    from fleet.settings import Settings
    from fleet.store import Store
    from fleet.tvm.metaschedule import FleetRunner

    mod, target, trials, per_iter = tuning
    folders: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-ms-") as home:
        # An embedded fleet of its own: SQLite and a private broker under a scratch home, one evaluation worker.
        os.environ["FLEET_HOME"] = home
        for name in ("FLEET_DATABASE_URL", "FLEET_BROKER_URL"):
            os.environ.pop(name, None)
        settings = Settings.from_env(os.environ)
        from fleet.tasks import app, configure

        configure(app, settings)
        store = Store(settings.database_url)
        store.upgrade()
        with LocalFleet(settings, fleet_target, eval_procs=1, build_procs=1):
            # LocalRunner's settings: its evaluator config (the default, both), and its time limit per candidate.
            runner = FleetRunner(fleet_target, store=store, timeout_sec=local_runner.timeout_sec)
            rows.append(_tune_with("FleetRunner", runner, mod, target, trials, per_iter, log))
            log(json.dumps({k: v for k, v in rows[1].items() if k not in ("schedule", "records")}))
            same = [_replay("LocalRunner", local_runner, inputs, log), _replay("FleetRunner", runner, inputs, log)]
            # A candidate that failed in one tuning, measured by the other runner: a slow draw fails in both, a
            # runner's own fault in one only.
            crossed = {}
            others = {"local": ("FleetRunner", runner, rows[0]), "fleet": ("LocalRunner", local_runner, rows[1])}
            for failed_in, (other_name, other, row) in others.items():
                failed, more = _candidates(row["records"], target, failed=True)
                folders += more
                if failed:
                    crossed[f"failed_by_{failed_in}_measured_by_{other_name}"] = _replay(other_name, other, failed, log)
            runner.close()
        store.close()
    return same, crossed, folders


def _same_candidates(same: list[dict[str, Any]], pairs: list[tuple[float, float]], total: float) -> dict[str, Any]:
    """The figures of both runners' replays of the same candidates (``pairs``: each one's seconds, both finite)."""
    return {
        "local": same[0],
        "fleet": same[1],
        "fleet_over_local_candidates_per_second": (
            same[1]["candidates_per_second"] / same[0]["candidates_per_second"]
            if same[0]["candidates_per_second"]
            else None
        ),
        # Each candidate as the two measured it: the median of Fleet's seconds over LocalRunner's, and the best.
        "median_fleet_over_local_seconds": statistics.median(b / a for a, b in pairs) if pairs else None,
        "best_gflops": {
            "local": total / min(a for a, _ in pairs) / 1e9 if pairs else None,
            "fleet": total / min(b for _, b in pairs) / 1e9 if pairs else None,
        },
    }


def _echo_failures(errors: list[str]) -> None:
    """Failed candidates, counted by their error (a trial's number left out)."""
    for error, count in Counter(re.sub(r"trial \d+", "trial N", e) for e in errors).most_common():
        click.echo(f"    {count} failed: {error}")


@click.command("metaschedule")
@click.option("--size", type=click.IntRange(16), default=1024, show_default=True, help="Matmul size (m = n = k).")
@click.option("--trials", type=click.IntRange(1), default=64, show_default=True, help="Candidates per runner.")
@click.option("--per-iter", type=click.IntRange(1), default=64, show_default=True, help="Candidates per batch.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def metaschedule_bench_command(size: int, trials: int, per_iter: int, as_json: bool) -> None:
    """MetaSchedule's LocalRunner against Fleet's FleetRunner on the same tune_tir task: candidates measured per
    second and the best schedule's GFLOPS, one measuring process each."""
    from fleet.tvm import check_tvm

    check_tvm()
    quiet = as_json
    result = run(size, trials, per_iter, lambda line: None if quiet else click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(result["task"])
    for row in (result["local"], result["fleet"]):
        best = row["best_gflops"] or 0.0
        here = row["best_gflops_here"] or 0.0
        click.echo(
            f"  {row['runner']:<12} {row['candidates_per_second']:6.2f} candidates/s ({row['candidates']} in "
            f"{row['runner_seconds']:.1f} s of runner time, {row['tune_seconds']:.1f} s in all); best {best:.1f} "
            f"GFLOPS ({here:.1f} measured again here)"
        )
        _echo_failures(row["failures"])
    ratio = result["fleet_over_local_candidates_per_second"]
    click.echo(f"  Fleet / Local candidates per second: {ratio:.2f}" if ratio else "  no candidates measured")
    same = result["same_candidates"]
    click.echo(f"the same {same['local']['candidates']} candidates (LocalRunner's tuning's), measured by each:")
    for row in (same["local"], same["fleet"]):
        click.echo(
            f"  {row['runner']:<12} {row['candidates_per_second']:6.2f} candidates/s ({row['measured']} measured in "
            f"{row['runner_seconds']:.1f} s); best {same['best_gflops'][row['runner'][:5].lower()] or 0.0:.1f} GFLOPS"
        )
    ratio = same["fleet_over_local_candidates_per_second"]
    median = same["median_fleet_over_local_seconds"]
    click.echo(
        f"  Fleet / Local candidates per second: {ratio:.2f}; a candidate's seconds, Fleet / Local: {median:.2f}"
    )
    for name, row in result["failed_candidates"].items():
        failed_in, other = name.removeprefix("failed_by_").split("_measured_by_")
        click.echo(
            f"the candidates that failed in {failed_in}'s tuning, measured by {other}: {row['measured']} of "
            f"{row['candidates']} measured"
        )
        _echo_failures(row["failures"])
    sys.stdout.flush()
