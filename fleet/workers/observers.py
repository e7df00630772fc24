"""Device observers: what an NVIDIA GPU did while a trial was measured, as Kernel Tuner's observers record it.

An evaluation worker pinned to a GPU watches that GPU for the length of each evaluation: SM and memory clocks,
power and temperature, sampled in the background, and the energy drawn. The readings become metrics of the
measurement (shown by ``fleet trial`` and the report, readable by a strategy's predicates), and a workload's
objective may be one of them instead of what the program prints::

    "objective": {"name": "energy", "json": "gflops", "observer": "energy", "goal": "min"}

(the runs still print their JSON line, whose ``gflops`` stays a metric and whose ``valid`` still counts).

Two sources, chosen by ``FLEET_OBSERVE``: ``nvml`` (the ``nvidia-ml-py`` package, ``pip install
'fleet-tune[gpu]'``), ``nvidia-smi`` (the driver's tool, sampling with ``-lms``), ``auto`` (the default: NVML
when importable, else nvidia-smi when on PATH, else nothing) or ``off``. ``FLEET_OBSERVE_INTERVAL_MS`` sets the
sampling period (50 ms by default). ``FLEET_LOCK_CLOCKS=SM[,MEM]`` (MHz) locks the clocks for each evaluation
and resets them afterwards; off by default, and it needs the rights to change clocks (root, usually). A spec may
tune the clocks as knobs instead (the command workload's ``"clocks": {"sm": KNOB, "memory": KNOB}``): each
evaluation is then locked to its configuration's clocks, which take the place of ``FLEET_LOCK_CLOCKS``.

Metrics: ``sm_clock_mhz`` (median), ``sm_clock_min_mhz`` (a dip shows throttling), ``mem_clock_mhz``,
``power_w`` (time-weighted mean), ``power_max_w``, ``temperature_c`` (the highest), ``energy`` (joules over the
whole evaluation: every run of it, warm-ups and program start included), ``observed_seconds`` and
``observer_samples``. Readings a driver does not give are left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleet.errors import FleetError
from fleet.states import MEASURED, TrialState
from fleet.workers.workloads import Measured

__all__ = [
    "NvmlObserver",
    "Observer",
    "ObserverError",
    "Sample",
    "SmiObserver",
    "clock_locks",
    "device_observer",
    "observed",
    "parse_smi_line",
    "summarize",
]

log = logging.getLogger(__name__)

SMI_FIELDS = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")
DEFAULT_INTERVAL_MS = 50.0
Locks = tuple[int, int | None]
"""Clocks to lock: the SM clock and the memory clock (None: leave it) in MHz."""


class ObserverError(FleetError):
    """An observer that cannot do what the worker's settings ask (a bad setting, clocks it may not lock)."""


@dataclass(frozen=True)
class Sample:
    """One reading of the GPU; a field is None where the driver gave no value."""

    seconds: float  # on a clock of the observer's own; only differences count
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None


def summarize(samples: list[Sample], seconds: float, energy_j: float | None = None) -> dict[str, float]:
    """The metrics of one observation.

    Parameters
    ----------
    samples:
        The readings, in time order.
    seconds:
        How long the observation lasted.
    energy_j:
        The driver's own count of the energy drawn, when it keeps one; else the mean power times ``seconds``.
    """
    metrics: dict[str, float] = {"observed_seconds": seconds, "observer_samples": float(len(samples))}
    sm = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    if sm:
        metrics["sm_clock_mhz"] = statistics.median(sm)
        metrics["sm_clock_min_mhz"] = min(sm)
    mem = [s.mem_clock_mhz for s in samples if s.mem_clock_mhz is not None]
    if mem:
        metrics["mem_clock_mhz"] = statistics.median(mem)
    temperatures = [s.temperature_c for s in samples if s.temperature_c is not None]
    if temperatures:
        metrics["temperature_c"] = max(temperatures)
    power = [(s.seconds, s.power_w) for s in samples if s.power_w is not None]
    if power:
        metrics["power_max_w"] = max(w for _, w in power)
        span = power[-1][0] - power[0][0]
        if span > 0:  # trapezoids, so that uneven sampling does not tilt the mean
            area = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in itertools.pairwise(power))
            metrics["power_w"] = area / span
        else:
            metrics["power_w"] = statistics.fmean(w for _, w in power)
    if energy_j is not None:
        metrics["energy"] = energy_j
    elif "power_w" in metrics:
        metrics["energy"] = metrics["power_w"] * seconds
    return metrics


def _parse_locks(text: str | None) -> Locks | None:
    """``FLEET_LOCK_CLOCKS``: ``SM`` or ``SM,MEM`` in MHz, or None when unset."""
    if text is None or not text.strip():
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 2 or not all(p.isdecimal() and int(p) > 0 for p in parts):
        raise ObserverError(f"FLEET_LOCK_CLOCKS={text!r}: expected the SM clock in MHz, or SM,MEM such as 1980,2619")
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else None


def clock_locks(clocks: Mapping[str, str] | None, values: Mapping[str, Any]) -> Locks | None:
    """The clocks a configuration asks for: ``clocks`` maps ``sm`` (and ``memory``) to the knob or problem
    parameter that holds it, in MHz; None when the spec tunes no clock.

    Raises ObserverError for a value that is no whole number of MHz.
    """
    if not clocks:
        return None
    locks: list[int | None] = []
    for part in ("sm", "memory"):
        name = clocks.get(part)
        value = None if name is None else values.get(name)
        if name is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value != int(value)):
            raise ObserverError(f"clock {name}={value!r}: expected a whole number of MHz")
        if value is not None and value <= 0:
            raise ObserverError(f"clock {name}={value!r}: expected a positive number of MHz")
        locks.append(None if value is None else int(value))
    sm, memory = locks
    assert sm is not None  # the spec requires "sm"
    return sm, memory


class Observer(ABC):
    """Watches one GPU between :meth:`start` and :meth:`stop`.

    Parameters
    ----------
    index:
        The GPU's index as the driver numbers it (PCI bus order, as ``nvidia-smi`` does); not the index under
        ``CUDA_VISIBLE_DEVICES``.
    interval:
        Seconds between samples.
    lock:
        Clocks to lock during each observation: (SM MHz, memory MHz or None), or None to leave them alone.
    """

    name = ""

    def __init__(self, index: int, interval: float = DEFAULT_INTERVAL_MS / 1000, lock: Locks | None = None) -> None:
        self.index = index
        self.interval = interval
        self.lock = lock
        self._locked: Locks | None = None  # what start() locked, for stop() to reset
        self._started = 0.0

    def start(self, lock: Locks | None = None) -> None:
        """Lock the clocks if asked (``lock``, else the worker's own setting), then start sampling."""
        self._started = time.monotonic()
        self._locked = lock or self.lock
        try:
            if self._locked is not None:
                self._lock_clocks(*self._locked)
            self._start()
        except BaseException:
            self._unlock()
            raise

    def stop(self) -> dict[str, float]:
        """Stop sampling, give the clocks back, and return the observation's metrics."""
        seconds = time.monotonic() - self._started
        try:
            samples, energy = self._stop()
        finally:
            self._unlock()
        return summarize(samples, seconds, energy)

    def _unlock(self) -> None:
        locked, self._locked = self._locked, None
        if locked is None:
            return
        try:
            self._reset_clocks(memory=locked[1] is not None)
        except ObserverError as error:  # the next evaluation's lock sets them again; do not lose this result
            log.warning("%s", error)

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _stop(self) -> tuple[list[Sample], float | None]: ...

    @abstractmethod
    def _lock_clocks(self, sm: int, memory: int | None) -> None: ...

    @abstractmethod
    def _reset_clocks(self, memory: bool) -> None: ...


class NvmlObserver(Observer):
    """Samples through NVML in a thread of this process; energy from the driver's counter when it has one.

    Parameters
    ----------
    nvml:
        The ``pynvml`` module (``nvidia-ml-py``), or anything with its names; imported when not given.
    """

    name = "nvml"

    def __init__(
        self, index: int, interval: float = DEFAULT_INTERVAL_MS / 1000, lock: Locks | None = None, nvml: Any = None
    ) -> None:
        super().__init__(index, interval, lock)
        if nvml is None:
            import pynvml  # the gpu extra; device_observer checks that it imports

            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as error:
            raise ObserverError(f"NVML cannot open GPU {index}: {error}") from None
        self._samples: list[Sample] = []
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_start: float | None = None

    def _read(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(self.handle, *args)
        except self.nvml.NVMLError:  # not supported on this part or driver: leave the reading out
            return None

    def _sample(self) -> Sample:
        n = self.nvml
        power = self._read(n.nvmlDeviceGetPowerUsage)
        return Sample(
            seconds=time.monotonic(),
            sm_clock_mhz=self._read(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
            mem_clock_mhz=self._read(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_MEM),
            power_w=None if power is None else power / 1000.0,  # NVML counts milliwatts
            temperature_c=self._read(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
        )

    def _loop(self) -> None:
        while True:
            self._samples.append(self._sample())
            if self._done.wait(self.interval):
                return

    def _start(self) -> None:
        self._samples = []
        self._done.clear()
        self._energy_start = self._read(self.nvml.nvmlDeviceGetTotalEnergyConsumption)
        self._thread = threading.Thread(target=self._loop, name=f"fleet-nvml-{self.index}", daemon=True)
        self._thread.start()

    def _stop(self) -> tuple[list[Sample], float | None]:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._samples.append(self._sample())  # the state at the end, however short the evaluation
        end = self._read(self.nvml.nvmlDeviceGetTotalEnergyConsumption)
        energy = None if self._energy_start is None or end is None else (end - self._energy_start) / 1000.0
        return self._samples, energy

    def _lock_clocks(self, sm: int, memory: int | None) -> None:
        try:
            self.nvml.nvmlDeviceSetGpuLockedClocks(self.handle, sm, sm)
            if memory is not None:
                self.nvml.nvmlDeviceSetMemoryLockedClocks(self.handle, memory, memory)
        except self.nvml.NVMLError as error:
            raise ObserverError(f"cannot lock the clocks of GPU {self.index} at {sm},{memory}: {error}") from None

    def _reset_clocks(self, memory: bool) -> None:
        try:
            self.nvml.nvmlDeviceResetGpuLockedClocks(self.handle)
            if memory:
                self.nvml.nvmlDeviceResetMemoryLockedClocks(self.handle)
        except self.nvml.NVMLError as error:
            raise ObserverError(f"cannot reset the clocks of GPU {self.index}: {error}") from None


def parse_smi_line(line: str) -> Sample | None:
    """One line of ``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu
    --format=csv,noheader,nounits``, such as ``2025/01/31 12:00:00.125, 1980, 2619, 412.35, 47``; None when it
    does not parse. A reading the driver does not have (``[N/A]``, ``[Not Supported]``) is None."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != len(SMI_FIELDS):
        return None
    try:
        stamp = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    values = [number(f) for f in fields[1:]]
    return Sample(stamp, *values)


class SmiObserver(Observer):
    """Samples with ``nvidia-smi ... -lms N`` in a process of its own, for a node without ``nvidia-ml-py``."""

    name = "nvidia-smi"

    def __init__(
        self,
        index: int,
        interval: float = DEFAULT_INTERVAL_MS / 1000,
        lock: Locks | None = None,
        executable: str = "nvidia-smi",
    ) -> None:
        super().__init__(index, interval, lock)
        self.executable = executable
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    def argv(self) -> list[str]:
        """The sampling command."""
        return [
            self.executable,
            "-i",
            str(self.index),
            "--query-gpu=" + ",".join(SMI_FIELDS),
            "--format=csv,noheader,nounits",
            "-lms",
            str(max(1, round(self.interval * 1000))),
        ]

    def _start(self) -> None:
        self._lines = []
        self._proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # so that stopping it reaches whatever it started
        )
        stdout = self._proc.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self._lines.extend(stdout), daemon=True)
        self._reader.start()

    def _stop(self) -> tuple[list[Sample], float | None]:
        proc = self._proc
        if proc is not None:
            # An interrupt is how a person stops "nvidia-smi -lms" and lets it flush what it sampled.
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=2.0)
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        samples = [s for s in map(parse_smi_line, self._lines) if s is not None]
        return samples, None

    def _smi(self, *args: str) -> None:
        argv = [self.executable, "-i", str(self.index), *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ObserverError(f"{' '.join(argv)}: {error}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise ObserverError(f"{' '.join(argv)} failed: {why[-1] if why else f'exit status {done.returncode}'}")

    def _lock_clocks(self, sm: int, memory: int | None) -> None:
        self._smi(f"--lock-gpu-clocks={sm},{sm}")
        if memory is not None:
            self._smi(f"--lock-memory-clocks={memory},{memory}")

    def _reset_clocks(self, memory: bool) -> None:
        self._smi("--reset-gpu-clocks")
        if memory:
            self._smi("--reset-memory-clocks")


def _gpu_index(gpu: str | None) -> int | None:
    """The driver's index of a worker's GPU, from its ``FLEET_WORKER_GPU`` text ``"0:NVIDIA H100 80GB HBM3"``."""
    head = (gpu or "").partition(":")[0].strip()
    return int(head) if head.isdecimal() else None


def device_observer(gpu: str | None, env: Mapping[str, str] | None = None) -> Observer | None:
    """The observer of an evaluation worker's GPU, as its environment asks; None on a CPU worker or with none.

    Parameters
    ----------
    gpu:
        The worker's GPU as ``WorkerContext.gpu`` holds it (``"index:name"``), or None.
    env:
        Where ``FLEET_OBSERVE``, ``FLEET_OBSERVE_INTERVAL_MS`` and ``FLEET_LOCK_CLOCKS`` are read (the process's
        environment by default).
    """
    env = os.environ if env is None else env
    index = _gpu_index(gpu)
    mode = (env.get("FLEET_OBSERVE") or "auto").strip().lower()
    if mode not in ("auto", "nvml", "nvidia-smi", "off"):
        raise ObserverError(f"FLEET_OBSERVE={mode!r}: expected auto, nvml, nvidia-smi or off")
    if index is None or mode == "off":
        return None
    raw_interval = env.get("FLEET_OBSERVE_INTERVAL_MS") or str(DEFAULT_INTERVAL_MS)
    try:
        interval = float(raw_interval) / 1000
    except ValueError:
        interval = -1.0
    if not 0.001 <= interval <= 60:
        raise ObserverError(f"FLEET_OBSERVE_INTERVAL_MS={raw_interval!r}: expected milliseconds from 1 to 60000")
    lock = _parse_locks(env.get("FLEET_LOCK_CLOCKS"))
    if mode in ("auto", "nvml"):
        try:
            import pynvml
        except ImportError:
            if mode == "nvml":
                raise ObserverError("FLEET_OBSERVE=nvml needs nvidia-ml-py: pip install 'fleet-tune[gpu]'") from None
        else:
            try:
                return NvmlObserver(index, interval, lock, nvml=pynvml)
            except ObserverError:
                if mode == "nvml":
                    raise
                log.info("NVML cannot watch GPU %d; trying nvidia-smi", index)
    executable = shutil.which("nvidia-smi")
    if executable is None:
        if mode == "nvidia-smi":
            raise ObserverError("FLEET_OBSERVE=nvidia-smi, but nvidia-smi is not on PATH")
        return None
    return SmiObserver(index, interval, lock, executable=executable)


_observers: dict[str | None, Observer | None] = {}


def observed(
    gpu: str | None,
    evaluate: Callable[[], Measured],
    objective: Mapping[str, Any] | None,
    clocks: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> Measured:
    """Run ``evaluate`` under the observer of ``gpu`` and add its readings to the measurement.

    Parameters
    ----------
    gpu:
        The evaluation worker's GPU (``WorkerContext.gpu``); None on a CPU worker, which runs ``evaluate`` bare.
    evaluate:
        The workload's evaluation.
    objective:
        The workload's objective definition; with ``"observer": METRIC``, that reading becomes the objective.
    clocks:
        The workload's ``clocks`` (``{"sm": KNOB, "memory": KNOB}``): the evaluation runs at the clocks the
        configuration names, and the trial is errored, with the driver's message, where they cannot be set.
    values:
        The configuration and the problem's parameters, where ``clocks`` finds its knobs.
    """
    if gpu not in _observers:  # one observer per process: an NVML handle, settings read once
        _observers[gpu] = device_observer(gpu)
    observer = _observers[gpu]
    wanted = objective.get("observer") if isinstance(objective, Mapping) else None
    try:
        lock = clock_locks(clocks, values or {})
    except ObserverError as error:
        return Measured(state=TrialState.ERRORED, reason=str(error))
    if observer is None:
        if wanted or lock:
            needs = f"the objective is the observer's {wanted!r}" if wanted else "the spec tunes the GPU's clocks"
            return Measured(
                state=TrialState.ERRORED,
                reason=f"{needs}, and this worker observes no GPU "
                "(an NVIDIA GPU with nvidia-ml-py or nvidia-smi, and FLEET_OBSERVE not off)",
            )
        return evaluate()
    try:
        observer.start(lock)
    except ObserverError as error:
        if lock is None:
            raise  # the worker's own FLEET_LOCK_CLOCKS: its operator's setting, not this trial's
        return Measured(state=TrialState.ERRORED, reason=str(error))
    try:
        measured = evaluate()
    finally:
        readings = observer.stop()
    measured = dataclasses.replace(measured, metrics={**measured.metrics, **readings})
    if not wanted or measured.state not in MEASURED:
        return measured
    if wanted not in readings:
        return dataclasses.replace(
            measured,
            state=TrialState.ERRORED,
            objective=None,
            reason=f"the {observer.name} observer gave no {wanted!r}",
        )
    return dataclasses.replace(measured, objective=readings[wanted], samples=[readings[wanted]])
