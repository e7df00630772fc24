"""Device observers against a fake nvidia-smi (a script on PATH printing what the real one prints) and a fake
NVML (an object with pynvml's names), and a command workload measured under them in-process."""

from __future__ import annotations

import shutil
import stat
import sys
import time
import types
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.bundle import pack
from fleet.workers import observers
from fleet.workers.observers import (
    NvmlObserver,
    ObserverError,
    Sample,
    SmiObserver,
    device_observer,
    observed,
    parse_smi_line,
    summarize,
)
from fleet.workers.workloads import Job, Measured
from fleet.workers.workloads.command import CommandWorkload

SLEEP = shutil.which("sleep") or "/bin/sleep"
DATE = shutil.which("date") or "/bin/date"

# --- parsing and summarizing ---------------------------------------------------------------------------------


def test_parse_smi_line() -> None:
    sample = parse_smi_line("2025/01/31 12:00:00.125, 1980, 2619, 412.35, 47\n")
    assert sample == Sample(datetime(2025, 1, 31, 12, 0, 0, 125000).timestamp(), 1980.0, 2619.0, 412.35, 47.0)


def test_parse_smi_line_keeps_a_sample_with_readings_the_driver_lacks() -> None:
    sample = parse_smi_line("2025/01/31 12:00:00.125, 1755, 1593, [N/A], [Not Supported]")
    assert sample is not None and sample.power_w is None and sample.temperature_c is None
    assert sample.sm_clock_mhz == 1755.0


@pytest.mark.parametrize(
    "line", ["", "timestamp, clocks.sm [MHz], clocks.mem [MHz]", "1980, 2619, 412.35, 47", "yesterday, 1, 2, 3, 4"]
)
def test_parse_smi_line_refuses_what_is_not_a_sample(line: str) -> None:
    assert parse_smi_line(line) is None


def test_summarize_weighs_power_by_time_and_integrates_energy() -> None:
    samples = [
        Sample(0.0, 1980, 2619, 100.0, 40),
        Sample(1.0, 1900, 2619, 300.0, 50),
        Sample(3.0, 1980, 2619, 300.0, 45),
    ]
    metrics = summarize(samples, seconds=4.0)
    # Trapezoids: (100+300)/2 over 1 s and 300 over 2 s -> 800 J over 3 s.
    assert metrics["power_w"] == pytest.approx(800 / 3)
    assert metrics["energy"] == pytest.approx(800 / 3 * 4.0)
    assert metrics["power_max_w"] == 300.0
    assert (metrics["sm_clock_mhz"], metrics["sm_clock_min_mhz"], metrics["mem_clock_mhz"]) == (1980, 1900, 2619)
    assert metrics["temperature_c"] == 50
    assert (metrics["observed_seconds"], metrics["observer_samples"]) == (4.0, 3.0)


def test_summarize_prefers_the_drivers_energy_and_leaves_out_what_it_lacks() -> None:
    metrics = summarize([Sample(0.0, power_w=250.0)], seconds=2.0, energy_j=480.5)
    assert metrics["energy"] == 480.5 and metrics["power_w"] == 250.0
    assert "sm_clock_mhz" not in metrics and "temperature_c" not in metrics


# --- a fake nvidia-smi ---------------------------------------------------------------------------------------


def _install(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A nvidia-smi that logs its arguments; with -lms it prints a sample every 20 ms until interrupted, as the
    real one does; a lock it is asked for succeeds unless LOCK_FAILS is set."""
    directory = tmp_path / "bin"
    calls = tmp_path / "calls"
    _install(
        directory,
        "nvidia-smi",
        f"""echo "$*" >> "{calls}"
case "$*" in
  *-lms*) while :; do
            echo "$("{DATE}" '+%Y/%m/%d %H:%M:%S.%3N'), 1980, 2619, 350.50, 44"
            "{SLEEP}" 0.02
          done ;;
  *--lock-gpu-clocks*) if [ -n "$LOCK_FAILS" ]; then
            echo "Setting locked GPU clocks is not supported for GPU 00000000:19:00.0: Insufficient Permissions" >&2
            exit 4
          fi
          echo "GPU clocks set to \\"(gpcclk 1980, 1980)\\" for GPU 00000000:19:00.0" ;;
  *) echo "All done." ;;
esac
""",
    )
    # The fake first, then what the workload's own commands need (sh, sleep); no real nvidia-smi lives there.
    monkeypatch.setenv("PATH", f"{directory}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.delenv("LOCK_FAILS", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    return calls


def test_smi_observer_samples_while_the_work_runs(fake_smi: Path) -> None:
    observer = SmiObserver(3, interval=0.02, executable=shutil.which("nvidia-smi") or "")
    observer.start()
    time.sleep(0.4)
    metrics = observer.stop()
    assert fake_smi.read_text().split("\n")[0] == (
        "-i 3 --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu "
        "--format=csv,noheader,nounits -lms 20"
    )
    assert metrics["observer_samples"] >= 3
    assert (metrics["sm_clock_mhz"], metrics["mem_clock_mhz"], metrics["temperature_c"]) == (1980, 2619, 44)
    assert metrics["power_w"] == pytest.approx(350.5)
    assert metrics["energy"] == pytest.approx(350.5 * metrics["observed_seconds"])
    assert 0.4 <= metrics["observed_seconds"] < 3.0


def test_smi_observer_locks_and_resets_the_clocks(fake_smi: Path) -> None:
    observer = SmiObserver(1, interval=0.02, lock=(1980, 2619), executable=shutil.which("nvidia-smi") or "")
    observer.start()
    observer.stop()
    calls = fake_smi.read_text().splitlines()
    assert calls[:2] == ["-i 1 --lock-gpu-clocks=1980,1980", "-i 1 --lock-memory-clocks=2619,2619"]
    assert calls[-2:] == ["-i 1 --reset-gpu-clocks", "-i 1 --reset-memory-clocks"]


def test_a_lock_that_fails_is_one_clear_error(fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCK_FAILS", "1")
    observer = SmiObserver(0, lock=(1980, None), executable=shutil.which("nvidia-smi") or "")
    with pytest.raises(ObserverError, match="Insufficient Permissions") as caught:
        observer.start()
    assert "\n" not in str(caught.value)
    assert "--reset-gpu-clocks" in fake_smi.read_text()  # nothing left locked behind


def test_device_observer_choice(fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_observer(None, {}) is None  # a CPU worker
    assert device_observer("0:NVIDIA H100 80GB HBM3", {"FLEET_OBSERVE": "off"}) is None
    found = device_observer("2:NVIDIA H100 80GB HBM3", {"FLEET_OBSERVE_INTERVAL_MS": "10", "FLEET_LOCK_CLOCKS": "1755"})
    assert isinstance(found, SmiObserver)
    assert (found.index, found.interval, found.lock) == (2, 0.01, (1755, None))
    with pytest.raises(ObserverError, match="nvidia-ml-py"):
        device_observer("0:H100", {"FLEET_OBSERVE": "nvml"})
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert device_observer("0:H100", {}) is None
    with pytest.raises(ObserverError, match="not on PATH"):
        device_observer("0:H100", {"FLEET_OBSERVE": "nvidia-smi"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLEET_OBSERVE": "always"}, "FLEET_OBSERVE='always'"),
        ({"FLEET_OBSERVE_INTERVAL_MS": "0"}, "FLEET_OBSERVE_INTERVAL_MS='0'"),
        ({"FLEET_OBSERVE_INTERVAL_MS": "fast"}, "FLEET_OBSERVE_INTERVAL_MS='fast'"),
        ({"FLEET_LOCK_CLOCKS": "max"}, "FLEET_LOCK_CLOCKS='max'"),
        ({"FLEET_LOCK_CLOCKS": "1980,2619,1"}, "SM,MEM"),
    ],
)
def test_bad_settings_are_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ObserverError, match=message) as caught:
        device_observer("0:H100", env)
    assert "\n" not in str(caught.value)


# --- a fake NVML ---------------------------------------------------------------------------------------------


class FakeNvmlError(Exception):
    pass


def fake_nvml(*, energy: bool = True, lock_fails: bool = False) -> Any:
    """An object with the names of pynvml that the observer calls, keeping a log of the calls that change state."""
    state = {"energy_mj": 1_000_000, "calls": []}

    def energy_counter(handle: str) -> int:
        if not energy:
            raise FakeNvmlError("Not Supported")
        state["energy_mj"] += 7_500  # 7.5 J between two reads
        return state["energy_mj"]

    def log(name: str, fails: bool = False) -> Any:
        def call(*args: Any) -> None:
            if fails:
                raise FakeNvmlError("Insufficient Permissions")
            state["calls"].append((name, *args))

        return call

    return types.SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=log("init"),
        nvmlDeviceGetHandleByIndex=lambda index: f"handle{index}",
        nvmlDeviceGetClockInfo=lambda handle, clock: {1: 1755, 2: 2619}[clock],
        nvmlDeviceGetPowerUsage=lambda handle: 402_250,
        nvmlDeviceGetTemperature=lambda handle, sensor: 51,
        nvmlDeviceGetTotalEnergyConsumption=energy_counter,
        nvmlDeviceSetGpuLockedClocks=log("lock-sm", lock_fails),
        nvmlDeviceSetMemoryLockedClocks=log("lock-mem", lock_fails),
        nvmlDeviceResetGpuLockedClocks=log("reset-sm"),
        nvmlDeviceResetMemoryLockedClocks=log("reset-mem"),
        state=state,
    )


def test_nvml_observer_reads_the_energy_counter_and_samples() -> None:
    nvml = fake_nvml()
    observer = NvmlObserver(5, interval=0.01, lock=(1755, 2619), nvml=nvml)
    observer.start()
    time.sleep(0.1)
    metrics = observer.stop()
    assert metrics["energy"] == pytest.approx(7.5)
    assert metrics["power_w"] == pytest.approx(402.25)
    assert (metrics["sm_clock_mhz"], metrics["mem_clock_mhz"], metrics["temperature_c"]) == (1755, 2619, 51)
    assert metrics["observer_samples"] >= 2
    assert nvml.state["calls"] == [
        ("init",),
        ("lock-sm", "handle5", 1755, 1755),
        ("lock-mem", "handle5", 2619, 2619),
        ("reset-sm", "handle5"),
        ("reset-mem", "handle5"),
    ]


def test_nvml_without_an_energy_counter_integrates_power() -> None:
    observer = NvmlObserver(0, interval=0.01, nvml=fake_nvml(energy=False))
    observer.start()
    time.sleep(0.05)
    metrics = observer.stop()
    assert metrics["energy"] == pytest.approx(402.25 * metrics["observed_seconds"])


def test_nvml_lock_refused() -> None:
    nvml = fake_nvml(lock_fails=True)
    with pytest.raises(ObserverError, match=r"cannot lock the clocks of GPU 0 .*Insufficient Permissions"):
        NvmlObserver(0, lock=(1980, None), nvml=nvml).start()
    assert ("reset-sm", "handle0") in nvml.state["calls"]


def test_device_observer_prefers_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert isinstance(device_observer("1:NVIDIA H100 80GB HBM3", {}), NvmlObserver)


# --- a command workload measured under an observer, in-process -----------------------------------------------


@pytest.fixture
def workload_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Job, bytes]:
    monkeypatch.setattr(observers, "_observers", {})  # a fresh process's cache
    script = b'sleep 0.15\necho \'{"gflops": 1234.5, "valid": true}\'\n'
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return Job({}, {"n": 64}, scratch, lambda key: b""), pack({"run.sh": script})


def _command(objective: dict[str, Any]) -> CommandWorkload:
    return CommandWorkload({"kind": "command", "run": ["sh", "run.sh", "{n}"], "objective": objective, "repeats": 2})


def test_a_command_workload_gets_the_observers_metrics(fake_smi: Path, workload_job: tuple[Job, bytes]) -> None:
    job, artifact = workload_job
    workload = _command({"name": "gflops", "json": "gflops", "goal": "max"})
    measured = observed(
        "0:NVIDIA H100 80GB HBM3", lambda: workload.evaluate(job, artifact), workload.definition["objective"]
    )
    assert measured.state == "evaluated" and measured.objective == 1234.5 and measured.samples == [1234.5, 1234.5]
    assert measured.metrics["gflops"] == 1234.5
    assert measured.metrics["sm_clock_mhz"] == 1980 and measured.metrics["power_w"] == pytest.approx(350.5)
    assert measured.metrics["energy"] > 0 and measured.metrics["observed_seconds"] >= 0.3


def test_energy_as_the_objective(workload_job: tuple[Job, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    job, artifact = workload_job
    workload = _command({"name": "energy", "json": "gflops", "observer": "energy", "goal": "min"})
    measured = observed("0:H100", lambda: workload.evaluate(job, artifact), workload.definition["objective"])
    assert measured.state == "evaluated"
    assert measured.objective == pytest.approx(7.5) and measured.samples == [measured.objective]
    assert measured.metrics["gflops"] == 1234.5  # what the runs printed stays a metric
    assert not workload.maximize


def test_energy_objective_without_an_observer_is_errored(workload_job: tuple[Job, bytes]) -> None:
    job, artifact = workload_job
    workload = _command({"name": "energy", "json": "gflops", "observer": "energy", "goal": "min"})
    measured = observed(None, lambda: workload.evaluate(job, artifact), workload.definition["objective"])
    assert measured.state == "errored" and "observes no GPU" in (measured.reason or "")


def test_a_cpu_worker_measures_bare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observers, "_observers", {})
    bare = Measured(state="evaluated", objective=1.0, samples=[1.0], metrics={"x": 2})
    assert observed(None, lambda: bare, {"json": "x"}) is bare


# --- the GPU's clocks as knobs ---------------------------------------------------------------------------------

CLOCKS = {"sm": "sm_clock", "memory": "mem_clock"}


def test_each_evaluation_runs_at_its_configurations_clocks(
    workload_job: tuple[Job, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configuration's clocks are locked for its evaluation and reset after it, in place of the worker's own
    FLEET_LOCK_CLOCKS, one configuration after the other."""
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("FLEET_LOCK_CLOCKS", "1980")
    job, artifact = workload_job
    workload = _command({"name": "gflops", "json": "gflops", "goal": "max"})
    for sm in (1410, 1755):
        values = {"n": 64, "sm_clock": sm, "mem_clock": 2619}
        measured = observed(
            "0:H100", lambda: workload.evaluate(job, artifact), workload.definition["objective"], CLOCKS, values
        )
        assert measured.state == "evaluated" and measured.metrics["energy"] == pytest.approx(7.5)
    assert [call for call in nvml.state["calls"] if call[0] != "init"] == [
        ("lock-sm", "handle0", 1410, 1410),
        ("lock-mem", "handle0", 2619, 2619),
        ("reset-sm", "handle0"),
        ("reset-mem", "handle0"),
        ("lock-sm", "handle0", 1755, 1755),
        ("lock-mem", "handle0", 2619, 2619),
        ("reset-sm", "handle0"),
        ("reset-mem", "handle0"),
    ]


def test_a_clock_the_driver_refuses_errors_that_trial_with_its_message(
    fake_smi: Path, workload_job: tuple[Job, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through nvidia-smi, as a worker without the right to change clocks: the trial is errored with the driver's
    line, nothing stays locked, and the next evaluation runs."""
    monkeypatch.setenv("LOCK_FAILS", "1")
    job, artifact = workload_job
    workload = _command({"name": "gflops", "json": "gflops", "goal": "max"})
    objective = workload.definition["objective"]
    measured = observed("0:H100", lambda: workload.evaluate(job, artifact), objective, {"sm": "sm"}, {"sm": 1410})
    assert measured.state == "errored" and measured.objective is None
    assert measured.reason is not None and "\n" not in measured.reason
    assert "--lock-gpu-clocks=1410,1410 failed: " in measured.reason and "Insufficient Permissions" in measured.reason
    calls = fake_smi.read_text().splitlines()
    assert calls == ["-i 0 --lock-gpu-clocks=1410,1410", "-i 0 --reset-gpu-clocks"]  # no sampling was started
    monkeypatch.delenv("LOCK_FAILS")
    again = observed("0:H100", lambda: workload.evaluate(job, artifact), objective, {"sm": "sm"}, {"sm": 1410})
    assert again.state == "evaluated" and again.metrics["sm_clock_mhz"] == 1980


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sm_clock": 1410.5, "mem_clock": 2619}, "clock sm_clock=1410.5: expected a whole number of MHz"),
        ({"sm_clock": "max", "mem_clock": 2619}, "clock sm_clock='max'"),
        ({"sm_clock": True, "mem_clock": 2619}, "clock sm_clock=True"),
        ({"sm_clock": 1410, "mem_clock": 0}, "clock mem_clock=0: expected a positive number"),
    ],
)
def test_a_clock_that_is_no_frequency_errors_the_trial(
    values: dict[str, Any], message: str, workload_job: tuple[Job, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    job, artifact = workload_job
    workload = _command({"name": "gflops", "json": "gflops", "goal": "max"})
    measured = observed("0:H100", lambda: workload.evaluate(job, artifact), {"json": "gflops"}, CLOCKS, values)
    assert measured.state == "errored" and message in (measured.reason or "")
    assert [call for call in nvml.state["calls"] if call[0] != "init"] == []  # nothing was run or locked


def test_clocks_on_a_worker_that_observes_no_gpu_error_the_trial(workload_job: tuple[Job, bytes]) -> None:
    job, artifact = workload_job
    workload = _command({"name": "gflops", "json": "gflops", "goal": "max"})
    values = {"sm_clock": 1410, "mem_clock": 2619}
    measured = observed(None, lambda: workload.evaluate(job, artifact), {"json": "gflops"}, CLOCKS, values)
    assert measured.state == "errored"
    assert measured.reason == (
        "the spec tunes the GPU's clocks, and this worker observes no GPU "
        "(an NVIDIA GPU with nvidia-ml-py or nvidia-smi, and FLEET_OBSERVE not off)"
    )
