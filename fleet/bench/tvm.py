"""``fleet bench tvm``: a tuned TVM matmul and conv2d against their untuned default schedules and NumPy.

The tuning runs in this process, with the same measure function the ``tvm_measure`` task uses (no Celery, no
database): a searcher proposes configurations of the operator's space, each is built, checked against NumPy and
timed, and the best valid one is kept. NumPy is measured in a child process with the same number of threads as
TVM's thread pool (and, for reference, with one), so neither thread pool competes with the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from fleet.errors import SpecError

ALEXNET = Path(__file__).resolve().parents[2].parent / "shared" / "miopen" / "alexnet.txt"


def tune_local(
    kind: str,
    p: Mapping[str, Any],
    target: str,
    *,
    budget: int,
    strategy: str = "auto",
    seed: int = 0,
    on_step: Callable[[int, float | None, float | None], None] | None = None,
) -> tuple[dict[str, Any] | None, Any, int]:
    """Tune one problem here with ``budget`` measurements; return (best config, its timing, measurements made).

    ``on_step`` hears after each measurement: how many were made, this one's GFLOPS (None when its output was
    wrong) and the best so far.
    """
    from fleet.search import Run, make_searcher
    from fleet.tvm.measure import measure
    from fleet.tvm.spaces import space_for, starting_points

    space = space_for(kind, p, target)
    # auto measures the shape's starting points first and searches on from them; another strategy runs as it is.
    options = {"seed_configs": starting_points(kind, p, target)} if strategy == "auto" else None
    proposals = make_searcher(strategy, space, budget=budget, maximize=True, seed=seed, options=options).generate()
    best: tuple[dict[str, Any] | None, Any] = (None, None)
    made = 0
    run: Run | None = None
    started = False
    while made < budget:
        try:
            config = proposals.send(run) if started else next(proposals)
        except StopIteration:
            break
        started = True
        if not isinstance(config, dict):
            break  # WAIT with every run already delivered: the searcher has nothing more to propose
        timing = measure(kind, p, config, target, repeats=3, min_repeat_ms=50)
        made += 1
        run = Run(config, timing.gflops if timing.correct else None, timing.correct, {"gflops": timing.gflops})
        if timing.correct and (best[1] is None or timing.gflops > best[1].gflops):
            best = (config, timing)
        if on_step is not None:
            on_step(made, timing.gflops if timing.correct else None, best[1].gflops if best[1] else None)
    return best[0], best[1], made


def alexnet_conv(batch: int) -> tuple[str, dict[str, Any]]:
    """The 3x3 conv2d layer of AlexNet (192 -> 384 channels, 13x13) from MIOpenDriver's alexnet.txt, at ``batch``."""
    from fleet.miopen.driver import parse_line, problems
    from fleet.tvm.operators import conv2d_from_miopen

    if not ALEXNET.is_file():
        raise SpecError(f"{ALEXNET} is missing: the conv2d benchmark reads its layer from there")
    for line in ALEXNET.read_text().splitlines():
        if " -c 192 " in f" {line} " and " -k 384 " in f" {line} " and "-F 1" in line:
            problem = next(q for q in problems(parse_line(line)) if q.get("direction") == "F")
            return conv2d_from_miopen({**problem, "batchsize": batch})
    raise SpecError(f"{ALEXNET} has no 192 -> 384 channel conv line")


OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
"""Variables some machines set for old OpenBLAS builds: with ``OPENBLAS_CORETYPE=Haswell`` NumPy runs AVX2 kernels on
an AVX-512 CPU, 2 to 5 times slower. The benchmark's NumPy runs without them, with the kernel OpenBLAS picks."""


def numpy_child() -> None:
    """In a fresh process (its own OpenBLAS threads, no TVM thread pool beside it): GFLOPS of the NumPy baseline
    of the problem given as JSON on stdin, and the BLAS kernel threadpoolctl reports, printed as JSON."""
    request = json.loads(sys.stdin.read())
    from fleet.tvm.measure import numpy_seconds
    from fleet.tvm.operators import flops, random_inputs, reference

    kind, p = request["kind"], request["params"]
    inputs = random_inputs(kind, p)
    seconds = numpy_seconds(lambda: reference(kind, p, inputs), repeats=5, min_seconds=1.0)
    print(json.dumps({"gflops": flops(kind, p) / seconds / 1e9, "blas": blas_kernel()}))


def blas_kernel() -> dict[str, Any]:
    """The BLAS library NumPy loaded and the kernel it chose, as threadpoolctl reports them."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {"kernel": "unknown (threadpoolctl is not installed)"}
    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            return {
                "library": pool.get("internal_api"),
                "version": pool.get("version"),
                "kernel": pool.get("architecture"),
                "threads": pool.get("num_threads"),
            }
    return {"kernel": "unknown (no BLAS loaded)"}


def numpy_run(kind: str, p: Mapping[str, Any], threads: int) -> dict[str, Any]:
    """NumPy on the problem with ``threads`` OpenBLAS threads, in a child process without the OpenBLAS overrides:
    its GFLOPS and the kernel OpenBLAS chose."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    for name in OPENBLAS_OVERRIDES:
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", "from fleet.bench.tvm import numpy_child; numpy_child()"],
        input=json.dumps({"kind": kind, "params": dict(p)}),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SpecError(f"the NumPy baseline failed: {done.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(done.stdout))


def numpy_gflops(kind: str, p: Mapping[str, Any], threads: int) -> float:
    """GFLOPS of NumPy on the problem with ``threads`` OpenBLAS threads (see :func:`numpy_run`)."""
    return float(numpy_run(kind, p, threads)["gflops"])


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _fma_unit(fields: dict[str, str]) -> tuple[int, int, str]:
    """FP32 lanes of one FMA pipe, the vector width the FMA loop uses (bytes), and what the unit is."""
    flags = set(fields.get("flags", "").split())
    amd = fields.get("vendor_id") == "AuthenticAMD"
    if "avx512f" in flags and not amd:
        return 16, 64, "AVX-512 (512-bit FMA pipes)"
    if "avx512f" in flags:
        return 8, 64, "AVX-512 on 256-bit FMA pipes (AMD)"
    if "avx2" in flags and "fma" in flags:
        return 8, 32, "AVX2 + FMA"
    return 4, 16, "SSE"


# Independent chains of vector multiply-adds, enough to keep two FMA pipes of 4 to 5 cycles' latency busy; no
# -ffast-math, so the compiler fuses each multiply and add (-ffp-contract=fast) and can do nothing else with them.
# Timed by the process's CPU clock: the rate of a core while it runs the loop, not lowered by the time a shared
# machine's other processes take from it.
FMA_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float vec __attribute__((vector_size(VBYTES)));
#define CHAINS 12
int main(int argc, char **argv) {
    long iterations = atol(argv[1]);
    vec acc[CHAINS], m, a;
    for (int i = 0; i < VBYTES / 4; i++) { m[i] = 0.9999999f; a[i] = 1e-7f; }
    for (int j = 0; j < CHAINS; j++) for (int i = 0; i < VBYTES / 4; i++) acc[j][i] = (float)j;
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    for (long n = 0; n < iterations; n++) {
#pragma GCC unroll 12
        for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * m + a;
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    float sum = 0;
    for (int j = 0; j < CHAINS; j++) for (int i = 0; i < VBYTES / 4; i++) sum += acc[j][i];
    double flops = 2.0 * CHAINS * (VBYTES / 4) * (double)iterations;
    printf("%.6f %g\n", flops / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9) / 1e9, sum);
    return 0;
}
"""


def measured_fma_gflops(cores: int, vector_bytes: int, seconds: float = 0.5, rounds: int = 3) -> float | None:
    """FP32 GFLOPS of :data:`FMA_LOOP` run on ``cores`` processes at once (the best of ``rounds``), built with the
    machine's C compiler; None where there is none or it cannot build the loop."""
    import shutil
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="fleet-fma-") as folder:
        source, binary = Path(folder) / "fma.c", Path(folder) / "fma"
        source.write_text(FMA_LOOP)
        build = [compiler, "-O2", "-march=native", "-ffp-contract=fast", f"-DVBYTES={vector_bytes}"]
        done = subprocess.run([*build, str(source), "-o", str(binary)], capture_output=True, check=False)
        if done.returncode != 0:
            return None

        def run(iterations: int, copies: int) -> float:
            procs = [
                subprocess.Popen([str(binary), str(iterations)], stdout=subprocess.PIPE, text=True)
                for _ in range(copies)
            ]
            return sum(float(proc.communicate()[0].split()[0]) for proc in procs)

        # Sized from one short run so that each round takes about ``seconds``.
        one = run(1_000_000, 1)
        per_iteration = 2 * 12 * (vector_bytes // 4)
        iterations = max(1_000_000, int(one * 1e9 * seconds / per_iteration))
        return max(run(iterations, cores) for _ in range(rounds))


def peak_gflops(cores: int | None = None, measure: bool = True) -> dict[str, Any]:
    """The CPU's peak FP32 rate on ``cores`` cores, and how it was derived.

    FLOPs per cycle = 2 (a fused multiply-add) x 2 FMA pipes x the FP32 lanes of a pipe: 16 with AVX-512 on an
    Intel core, 8 with AVX2 or with AVX-512 on AMD Zen 4 (which runs a 512-bit operation on its two 256-bit
    pipes in two halves), 4 with SSE only. The clock a guest sees in /proc/cpuinfo (``cpu MHz``) is its nominal
    one, not the boost the cores run at, so the peak is measured (``measure``): a loop of independent FMAs on
    every core at once, built with the machine's C compiler; the clock it implies is given beside it. Without a
    compiler, the nominal clock's figure, said so.
    """
    fields = _cpuinfo()
    if not fields:
        return {"gflops": None, "how": "no /proc/cpuinfo"}
    lanes, vector_bytes, unit = _fma_unit(fields)
    mhz = float(fields.get("cpu MHz", "0") or 0)
    cores = cores or os.cpu_count() or 1
    per_cycle = 2 * 2 * lanes
    nominal = cores * mhz / 1e3 * per_cycle
    pipes = f"{per_cycle} FP32 FLOPs/cycle ({unit}: 2 FMA pipes x {lanes} lanes x 2)"
    found = measured_fma_gflops(cores, vector_bytes) if measure else None
    if found is None:
        how = f"{cores} cores x {mhz / 1e3:.3f} GHz (cpu MHz, the nominal clock: boost not counted) x {pipes}"
        return {"gflops": nominal, "how": how, "nominal_gflops": nominal, "measured": False}
    ghz = found / cores / per_cycle
    cores_word = "core" if cores == 1 else "cores"
    how = (
        f"measured: independent {vector_bytes * 8}-bit FMAs on {cores} {cores_word} at once = {cores} x {ghz:.2f} GHz "
        f"x {pipes}; at the nominal {mhz / 1e3:.3f} GHz (cpu MHz) it would be {nominal:.0f}"
    )
    return {"gflops": found, "how": how, "nominal_gflops": nominal, "measured": True}


ROUNDS = 3
"""Rounds of the final comparison: the tuned schedule and NumPy measured one after the other, each round."""


def _row(name: str, kind: str, p: Mapping[str, Any], target: str, budget: int, threads: int, log: Any) -> dict:
    import statistics

    from fleet.tvm.measure import measure
    from fleet.tvm.operators import describe

    log(f"{name}: {describe(kind, p)}: the default schedule ...")
    default = measure(kind, p, None, target, repeats=2, min_repeat_ms=50)
    log(f"{name}: tuning in-process with {budget} measurements ...")
    config, tuned, made = tune_local(
        kind,
        p,
        target,
        budget=budget,
        on_step=lambda n, g, b: log(f"  {n}/{budget} {g or 0:7.1f} GFLOPS, best {b or 0:.1f}"),
    )
    # The machine is shared and its load moves within minutes: the best schedule and NumPy are measured side by
    # side, round after round, and each round's ratio compares two figures taken under the same load.
    rounds = []
    kernels: list[dict[str, Any]] = []
    for round_ in range(ROUNDS):
        log(f"{name}: round {round_ + 1}/{ROUNDS}: the tuned schedule, then NumPy with {threads} threads ...")
        again = measure(kind, p, config, target, repeats=5, min_repeat_ms=100).gflops if config else 0.0
        baseline = numpy_run(kind, p, threads)
        kernels.append(baseline.get("blas", {}))
        rounds.append((again, float(baseline["gflops"])))
        log(f"  tuned {rounds[-1][0]:.1f} GFLOPS, NumPy {rounds[-1][1]:.1f} GFLOPS")
    numpy_single = numpy_gflops(kind, p, 1) if threads > 1 else rounds[0][1]
    tuned_gflops = statistics.median(t for t, _ in rounds)
    return {
        "operator": describe(kind, p),
        "default_gflops": default.gflops,
        "tuned_gflops": tuned_gflops,
        "tuned_gflops_in_search": tuned.gflops if tuned else 0.0,
        "numpy_gflops": statistics.median(n for _, n in rounds),
        "numpy_1thread_gflops": numpy_single,
        "rounds": [{"tuned_gflops": t, "numpy_gflops": n} for t, n in rounds],
        "tuned_over_numpy": statistics.median(t / n for t, n in rounds),
        "numpy_blas": kernels[0] if kernels else {},
        "tuned_over_default": tuned_gflops / default.gflops,
        "measurements": made,
        "config": config,
    }


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``lscpu``'s), to quote beside the figures."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def run(budget: int, conv_budget: int, batch: int, threads: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Both benchmarks; the matmul's figures at the top level, the conv2d's under ``conv2d``."""
    # Both thread pools read these when they start: TVM's on its first parallel run, OpenBLAS on import.
    os.environ["TVM_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    from fleet.tvm.operators import DENSE, check_problem
    from fleet.workers.gpus import cpu_target

    target = cpu_target()
    p = check_problem(DENSE, {"m": 1024, "n": 1024, "k": 1024})
    load_before = os.getloadavg()[0]
    matmul = _row("matmul", DENSE, p, target, budget, threads, log)
    kind, conv = alexnet_conv(batch)
    convolution = _row("conv2d", kind, conv, target, conv_budget, threads, log)
    peak = peak_gflops(threads)
    return {
        **{k: v for k, v in matmul.items() if k != "operator"},
        "peak_gflops": peak["gflops"],
        "peak_how": peak["how"],
        "tuned_fraction_of_peak": matmul["tuned_gflops"] / peak["gflops"] if peak["gflops"] else None,
        "numpy_fraction_of_peak": matmul["numpy_gflops"] / peak["gflops"] if peak["gflops"] else None,
        "numpy_env": f"{' and '.join(OPENBLAS_OVERRIDES)} unset",
        "threads": threads,
        "target": target,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_average": [load_before, os.getloadavg()[0]]},
        "tuning": "in-process (no Celery), same measure function as the tvm_measure task",
        "conv2d": convolution,
    }


@click.command("tvm")
@click.option("--budget", type=click.IntRange(1), default=64, show_default=True, help="Matmul measurements.")
@click.option("--conv-budget", type=click.IntRange(1), default=48, show_default=True, help="Conv2d measurements.")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True, help="Batch of the AlexNet conv2d.")
@click.option("--threads", type=click.IntRange(1), help="Threads for TVM and NumPy (default: every core).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def tvm_bench_command(budget: int, conv_budget: int, batch: int, threads: int | None, as_json: bool) -> None:
    """A 1024^3 float32 matmul and an AlexNet conv2d, tuned with TVM, against the default schedule and NumPy.

    Tuning runs in this process (no Celery) with the measure function of the tvm_measure task. NumPy uses
    OpenBLAS (the matmul) and im2col + a matrix product (the conv2d), with the same threads as TVM.
    """
    from fleet.tvm import check_tvm

    check_tvm()
    threads = threads or os.cpu_count() or 1
    quiet = as_json
    result = run(budget, conv_budget, batch, threads, lambda line: None if quiet else click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(result))
        return
    machine = result["machine"]
    click.echo(f"tuning in-process (no Celery) on {result['target']}, {threads} threads for TVM and NumPy")
    click.echo(f"{machine['cpu']}, {machine['cores']} cores, load average {machine['load_average'][0]:.1f} at the")
    click.echo(f"start and {machine['load_average'][1]:.1f} at the end")
    for name, row in (("matmul 1024^3", result), (f"conv2d {result['conv2d']['operator']}", result["conv2d"])):
        click.echo(f"\n{name}: {row['measurements']} measurements")
        click.echo(f"  default  {row['default_gflops']:>8.1f} GFLOPS")
        click.echo(f"  tuned    {row['tuned_gflops']:>8.1f} GFLOPS  ({row['tuned_over_default']:.1f}x the default)")
        baseline = "NumPy (OpenBLAS)" if row is result else "im2col + NumPy matmul"
        kernel = row.get("numpy_blas", {}).get("kernel", "unknown")
        click.echo(f"  numpy    {row['numpy_gflops']:>8.1f} GFLOPS  {baseline}, {threads} threads, kernel {kernel}")
        if threads > 1:
            click.echo(f"  numpy    {row['numpy_1thread_gflops']:>8.1f} GFLOPS  the same, 1 thread (for reference)")
        pairs = ", ".join(f"{r['tuned_gflops']:.0f}/{r['numpy_gflops']:.0f}" for r in row["rounds"])
        click.echo(f"  tuned / numpy  {row['tuned_over_numpy']:.2f}  (median of {len(row['rounds'])} rounds: {pairs})")
    if result["peak_gflops"]:
        click.echo(f"\npeak FP32 {result['peak_gflops']:.0f} GFLOPS: {result['peak_how']}")
        click.echo(
            f"matmul: tuned {result['tuned_fraction_of_peak']:.0%} of peak, "
            f"NumPy {result['numpy_fraction_of_peak']:.0%} ({result['numpy_env']})"
        )
    sys.stdout.flush()
