"""The device an evaluation worker records on its measurements (issue 13): its GPU's model, driver and runtime,
or the CPU's model; recorded outputs of the vendors' tools, and this machine's own CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.workers import gpus
from fleet.workers.gpus import Device, cpu_model, describe_device, parse_nvidia_device

QUERY = "0, NVIDIA H100 80GB HBM3, 550.54.15\n1, NVIDIA A100-SXM4-80GB, 550.54.15\n"
HEADER = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"


def test_an_nvidia_gpu_is_its_name_with_driver_and_cuda_versions() -> None:
    assert parse_nvidia_device(QUERY, HEADER, 1) == Device(
        kind="NVIDIA A100-SXM4-80GB", description="NVIDIA A100-SXM4-80GB, driver 550.54.15, CUDA 12.4"
    )
    # Without the header's CUDA version, the rest still counts; an index nvidia-smi does not list, nothing.
    assert parse_nvidia_device(QUERY, None, 0) == Device(
        kind="NVIDIA H100 80GB HBM3", description="NVIDIA H100 80GB HBM3, driver 550.54.15"
    )
    assert parse_nvidia_device(QUERY, HEADER, 7) is None


def test_the_cpu_model_comes_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  7763 64-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 7763 64-Core Processor"
    assert cpu_model(tmp_path / "missing")  # platform's answer, never empty


def test_a_cpu_worker_records_its_cpu() -> None:
    device = describe_device(None)
    assert device.kind == cpu_model() and device.description.startswith(device.kind)


def test_an_amd_gpu_is_its_detected_name_with_rocm_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # No nvidia-smi on this node; rocm-smi reports the driver, ROCm's version file the runtime.
    answers = {gpus.ROCM_DRIVER_ARGS[0]: '{"system": {"Driver version": "6.8.5"}}'}
    monkeypatch.setattr(gpus, "_run_tool", lambda args, timeout: answers.get(args[0]))
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("6.3.1-48\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    assert describe_device("1:AMD Instinct MI250X") == Device(
        kind="AMD Instinct MI250X", description="AMD Instinct MI250X, driver 6.8.5, ROCm 6.3.1-48"
    )
