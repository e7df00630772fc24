"""GPU discovery: the parsers on recorded tool outputs, and detect_gpus on fake tools run as real processes."""

from __future__ import annotations

import json
import platform
import shutil
import stat
import time
from pathlib import Path

import pytest

from fleet.errors import FleetError
from fleet.workers import gpus as gpus_module
from fleet.workers.gpus import (
    Gpu,
    GpuSelectionError,
    cpu_target,
    detect_gpus,
    kfd_compute_units,
    missing_gpus,
    override_gpus,
    parse_nvidia_smi,
    parse_rocm_smi,
    parse_rocminfo,
    select_gpus,
)

# nvidia-smi --query-gpu=index,name,compute_cap,uuid --format=csv,noheader

NVIDIA_SMI_1X_H100 = """\
0, NVIDIA H100 80GB HBM3, 9.0, GPU-5e1f3b7c-2d4a-8e6f-9a0b-1c2d3e4f5a6b
"""

NVIDIA_SMI_8X_H100 = """\
0, NVIDIA H100 80GB HBM3, 9.0, GPU-0b9c4a1e-7f3d-2c58-e6a1-94d07b3f2e81
1, NVIDIA H100 80GB HBM3, 9.0, GPU-6d2e8f47-1a9b-c3e5-07f2-5b8a1d4c9e36
2, NVIDIA H100 80GB HBM3, 9.0, GPU-a47c1b93-5e2f-8d06-b1c4-3f9e72a05d18
3, NVIDIA H100 80GB HBM3, 9.0, GPU-3f8a6c21-9d4e-07b5-c2a8-e61f4b09d735
4, NVIDIA H100 80GB HBM3, 9.0, GPU-c91e5d08-2b7a-4f63-a8d1-07e3c5b94f2a
5, NVIDIA H100 80GB HBM3, 9.0, GPU-7b05e2a9-c4d1-3e86-f9b2-1a6d8c3e047f
6, NVIDIA H100 80GB HBM3, 9.0, GPU-e2d74f1b-8a3c-5b09-d6e4-9c1f07a2b358
7, NVIDIA H100 80GB HBM3, 9.0, GPU-18a3b6d4-f05e-7c92-4e1b-d8a29f6c05e7
"""

NVIDIA_SMI_A100_2080TI = """\
0, NVIDIA A100-PCIE-40GB, 8.0, GPU-9f2c7a14-3b8e-d5a0-61c9-e4b87d2f0a53
1, NVIDIA GeForce RTX 2080 Ti, 7.5, GPU-4d81e0b6-a27f-9c35-e8d4-0b6a3f19c72e
"""

# rocminfo on a node with one MI250X (two GCDs, each its own GPU agent of 110 CUs) behind an EPYC CPU.
# Real rocminfo pads values with trailing spaces; ROCMINFO_MI250X_PADDED below puts them back.

_ROCMINFO_CPU_AGENT = """\
*******
Agent 1
*******
  Name:                    AMD EPYC 7A53 64-Core Processor
  Uuid:                    CPU-XX
  Marketing Name:          AMD EPYC 7A53 64-Core Processor
  Vendor Name:             CPU
  Feature:                 None specified
  Profile:                 FULL_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        0(0x0)
  Queue Min Size:          0(0x0)
  Queue Max Size:          0(0x0)
  Queue Type:              MULTI
  Node:                    0
  Device Type:             CPU
  Cache Info:
    L1:                      32768(0x8000) KB
  Chip ID:                 0(0x0)
  ASIC Revision:           0(0x0)
  Cacheline Size:          64(0x40)
  Max Clock Freq. (MHz):   2000
  BDFID:                   0
  Internal Node ID:        0
  Compute Unit:            128
  SIMDs per CU:            0
  Shader Engines:          0
  Shader Arrs. per Eng.:   0
  WatchPts on Addr. Ranges:1
  Features:                None
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: FINE GRAINED
      Size:                    528012640(0x1f78cc60) KB
      Allocatable:             TRUE
      Alloc Granule:           4KB
      Alloc Alignment:         4KB
      Accessible by all:       TRUE
    Pool 2
      Segment:                 GLOBAL; FLAGS: KERNARG, FINE GRAINED
      Size:                    528012640(0x1f78cc60) KB
      Allocatable:             TRUE
      Alloc Granule:           4KB
      Alloc Alignment:         4KB
      Accessible by all:       TRUE
  ISA Info:
"""


def _rocminfo_gpu_agent(agent: int, node: int, uuid: str, bdfid: int) -> str:
    return f"""\
*******
Agent {agent}
*******
  Name:                    gfx90a
  Uuid:                    {uuid}
  Marketing Name:          AMD Instinct MI250X
  Vendor Name:             AMD
  Feature:                 KERNEL_DISPATCH
  Profile:                 BASE_PROFILE
  Float Round Mode:        NEAR
  Max Queue Number:        128(0x80)
  Queue Min Size:          64(0x40)
  Queue Max Size:          131072(0x20000)
  Queue Type:              MULTI
  Node:                    {node}
  Device Type:             GPU
  Cache Info:
    L1:                      16(0x10) KB
    L2:                      8192(0x2000) KB
  Chip ID:                 29704(0x7408)
  ASIC Revision:           1(0x1)
  Cacheline Size:          64(0x40)
  Max Clock Freq. (MHz):   1700
  BDFID:                   {bdfid}
  Internal Node ID:        {node}
  Compute Unit:            110
  SIMDs per CU:            4
  Shader Engines:          8
  Shader Arrs. per Eng.:   1
  WatchPts on Addr. Ranges:4
  Coherent Host Access:    FALSE
  Features:                KERNEL_DISPATCH
  Fast F16 Operation:      TRUE
  Wavefront Size:          64(0x40)
  Workgroup Max Size:      1024(0x400)
  Workgroup Max Size per Dimension:
    x                        1024(0x400)
    y                        1024(0x400)
    z                        1024(0x400)
  Max Waves Per CU:        32(0x20)
  Max Work-item Per CU:    2048(0x800)
  Grid Max Size:           4294967295(0xffffffff)
  Grid Max Size per Dimension:
    x                        4294967295(0xffffffff)
    y                        4294967295(0xffffffff)
    z                        4294967295(0xffffffff)
  Max fbarriers/Workgrp:   32
  Packet Processor uCode:: 78
  SDMA engine uCode::      8
  IOMMU Support::          None
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: COARSE GRAINED
      Size:                    67092480(0x3ffc000) KB
      Allocatable:             TRUE
      Alloc Granule:           4KB
      Alloc Alignment:         4KB
      Accessible by all:       FALSE
    Pool 2
      Segment:                 GROUP
      Size:                    64(0x40) KB
      Allocatable:             FALSE
      Alloc Granule:           0KB
      Alloc Alignment:         0KB
      Accessible by all:       FALSE
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-
      Machine Models:          HSA_MACHINE_MODEL_LARGE
      Profiles:                HSA_PROFILE_BASE
      Default Rounding Mode:   NEAR
      Default Rounding Mode:   NEAR
      Fast f16:                TRUE
      Workgroup Max Size:      1024(0x400)
      Workgroup Max Size per Dimension:
        x                        1024(0x400)
        y                        1024(0x400)
        z                        1024(0x400)
      Grid Max Size:           4294967295(0xffffffff)
      Grid Max Size per Dimension:
        x                        4294967295(0xffffffff)
        y                        4294967295(0xffffffff)
        z                        4294967295(0xffffffff)
      FBarrier Max Size:       32
"""


ROCMINFO_MI250X = (
    """\
ROCk module is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.1
System Timestamp Freq.:  100.000000MHz
Sig. Max Wait Duration:  18446744073709551615 (0xFFFFFFFFFFFFFFFF) (timestamp count)
Machine Model:           LARGE
System Endianness:       LITTLE
Mwaitx:                  DISABLED
DMAbuf Support:          YES

==========
HSA Agents
==========
"""
    + _ROCMINFO_CPU_AGENT
    + _rocminfo_gpu_agent(2, 1, "GPU-3b6e1d52c8f4a917", 49408)
    + _rocminfo_gpu_agent(3, 2, "GPU-a91c07e4d2b85f36", 50432)
    + "*** Done ***\n"
)

ROCMINFO_MI250X_PADDED = "\n".join(line.ljust(60) for line in ROCMINFO_MI250X.splitlines())

# rocm-smi --showproductname --json on the same node (ROCm 6.x field names). Node ID is the card's node in
# /sys/class/kfd/kfd/topology/nodes, which is where the compute-unit count comes from.
ROCM_SMI_MI250X = json.dumps(
    {
        "card0": {
            "Card Series": "AMD Instinct MI250X",
            "Card Model": "0x7408",
            "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Card SKU": "D65209",
            "Subsystem ID": "0x0b0c",
            "Device Rev": "0x01",
            "Node ID": "1",
            "GUID": "45883",
            "GFX Version": "gfx90a",
        },
        "card1": {
            "Card Series": "AMD Instinct MI250X",
            "Card Model": "0x7408",
            "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
            "Card SKU": "D65209",
            "Subsystem ID": "0x0b0c",
            "Device Rev": "0x01",
            "Node ID": "2",
            "GUID": "17208",
            "GFX Version": "gfx90a",
        },
    },
    indent=4,
)

# /sys/class/kfd/kfd/topology/nodes/<n>/properties, abridged, for the CPU node and one MI250X GCD.
KFD_CPU_PROPERTIES = """\
cpu_cores_count 128
simd_count 0
mem_banks_count 1
gfx_target_version 0
simd_per_cu 0
"""

KFD_GCD_PROPERTIES = """\
cpu_cores_count 0
simd_count 440
mem_banks_count 1
caches_count 204
simd_id_base 2147487744
max_waves_per_simd 8
gfx_target_version 90010
simd_per_cu 4
array_count 8
simd_arrays_per_engine 1
cu_per_simd_array 16
"""


# --- parse_nvidia_smi ----------------------------------------------------------------------------------------


def test_nvidia_one_h100() -> None:
    assert parse_nvidia_smi(NVIDIA_SMI_1X_H100) == [
        Gpu(
            index=0,
            vendor="nvidia",
            name="NVIDIA H100 80GB HBM3",
            target="sm_90",
            uuid="GPU-5e1f3b7c-2d4a-8e6f-9a0b-1c2d3e4f5a6b",
        )
    ]


def test_nvidia_eight_h100() -> None:
    found = parse_nvidia_smi(NVIDIA_SMI_8X_H100)
    assert [gpu.index for gpu in found] == list(range(8))
    assert {gpu.target for gpu in found} == {"sm_90"}
    assert {gpu.vendor for gpu in found} == {"nvidia"}
    assert len({gpu.uuid for gpu in found}) == 8
    assert found[7].uuid == "GPU-18a3b6d4-f05e-7c92-4e1b-d8a29f6c05e7"


def test_nvidia_mixed_node_gives_each_card_its_own_target() -> None:
    found = parse_nvidia_smi(NVIDIA_SMI_A100_2080TI)
    assert [(gpu.index, gpu.name, gpu.target) for gpu in found] == [
        (0, "NVIDIA A100-PCIE-40GB", "sm_80"),
        (1, "NVIDIA GeForce RTX 2080 Ti", "sm_75"),
    ]


def test_nvidia_two_digit_major_compute_capability() -> None:
    found = parse_nvidia_smi("0, NVIDIA B200, 10.0, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    assert found[0].target == "sm_100"


def test_nvidia_name_with_a_comma_is_kept_whole() -> None:
    found = parse_nvidia_smi("3, Some Board, Rev 2, 8.6, GPU-11111111-2222-3333-4444-555555555555\n")
    assert [(gpu.index, gpu.name, gpu.target) for gpu in found] == [(3, "Some Board, Rev 2", "sm_86")]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "No devices were found\n",
        # An old driver without compute_cap.
        'Field "compute_cap" is not a valid field to query.\n',
        "0, NVIDIA Tesla K80, [N/A], GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d\n",
        "index, name, compute_cap, uuid\n",
        "0, NVIDIA H100 80GB HBM3\n",
    ],
)
def test_nvidia_malformed_output_gives_nothing(text: str) -> None:
    assert parse_nvidia_smi(text) == []


# --- parse_rocminfo ------------------------------------------------------------------------------------------


def test_rocminfo_mi250x_skips_the_cpu_agent() -> None:
    assert parse_rocminfo(ROCMINFO_MI250X) == [
        Gpu(index=0, vendor="amd", name="AMD Instinct MI250X", target="gfx90a:110", uuid="GPU-3b6e1d52c8f4a917"),
        Gpu(index=1, vendor="amd", name="AMD Instinct MI250X", target="gfx90a:110", uuid="GPU-a91c07e4d2b85f36"),
    ]


def test_rocminfo_padding_does_not_matter() -> None:
    assert parse_rocminfo(ROCMINFO_MI250X_PADDED) == parse_rocminfo(ROCMINFO_MI250X)


def test_rocminfo_agent_header_on_one_line() -> None:
    one_line = ROCMINFO_MI250X.replace("*******\nAgent 2\n*******", "*******  Agent 2  *******")
    assert [gpu.target for gpu in parse_rocminfo(one_line)] == ["gfx90a:110", "gfx90a:110"]


def test_rocminfo_placeholder_uuid_and_missing_marketing_name() -> None:
    text = _ROCMINFO_CPU_AGENT + _rocminfo_gpu_agent(2, 1, "GPU-XX", 768).replace(
        "Marketing Name:          AMD Instinct MI250X", "Marketing Name:"
    )
    assert parse_rocminfo(text) == [Gpu(index=0, vendor="amd", name="gfx90a", target="gfx90a:110", uuid=None)]


def test_rocminfo_unparsable_gpu_agent_keeps_the_numbering_of_the_next() -> None:
    broken = _rocminfo_gpu_agent(2, 1, "GPU-3b6e1d52c8f4a917", 49408).replace("Compute Unit:            110", "")
    text = _ROCMINFO_CPU_AGENT + broken + _rocminfo_gpu_agent(3, 2, "GPU-a91c07e4d2b85f36", 50432)
    assert [(gpu.index, gpu.uuid) for gpu in parse_rocminfo(text)] == [(1, "GPU-a91c07e4d2b85f36")]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ROCk module is loaded\nhsa api call failure at: /long_pathname/rocminfo.cc:1306\n"
        "Call returned HSA_STATUS_ERROR_OUT_OF_RESOURCES\n",
        _ROCMINFO_CPU_AGENT,
        "  Name:                    gfx90a\n  Device Type:             GPU\n  Compute Unit:            110\n",
    ],
)
def test_rocminfo_malformed_output_gives_nothing(text: str) -> None:
    assert parse_rocminfo(text) == []


# --- parse_rocm_smi and the KFD topology ---------------------------------------------------------------------


def test_rocm_smi_mi250x() -> None:
    assert parse_rocm_smi(ROCM_SMI_MI250X, compute_units={1: 110, 2: 110}) == [
        Gpu(index=0, vendor="amd", name="AMD Instinct MI250X", target="gfx90a:110"),
        Gpu(index=1, vendor="amd", name="AMD Instinct MI250X", target="gfx90a:110"),
    ]


def test_rocm_smi_agrees_with_rocminfo_on_targets() -> None:
    from_smi = parse_rocm_smi(ROCM_SMI_MI250X, compute_units={1: 110, 2: 110})
    from_rocminfo = parse_rocminfo(ROCMINFO_MI250X)
    assert [(g.index, g.target, g.name) for g in from_smi] == [(g.index, g.target, g.name) for g in from_rocminfo]


def test_rocm_smi_index_follows_topology_order_not_card_number() -> None:
    swapped = json.loads(ROCM_SMI_MI250X)
    swapped["card0"]["Node ID"], swapped["card1"]["Node ID"] = "2", "1"
    swapped["card1"]["GFX Version"] = "gfx942"
    found = parse_rocm_smi(json.dumps(swapped), compute_units={1: 304, 2: 110})
    assert sorted((gpu.index, gpu.target) for gpu in found) == [(0, "gfx942:304"), (1, "gfx90a:110")]


def test_rocm_smi_with_a_warning_before_the_json_and_old_key_spelling() -> None:
    old = {"card0": {"Card series": "AMD Instinct MI210", "Card vendor": "AMD", "GFX Version": "gfx90a", "Node ID": 1}}
    text = "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status\n\n"
    found = parse_rocm_smi(text + json.dumps(old), compute_units={1: 104})
    assert found == [Gpu(index=0, vendor="amd", name="AMD Instinct MI210", target="gfx90a:104")]


def test_rocm_smi_card_without_compute_units_is_skipped() -> None:
    assert parse_rocm_smi(ROCM_SMI_MI250X, compute_units={2: 110}) == [
        Gpu(index=0, vendor="amd", name="AMD Instinct MI250X", target="gfx90a:110")
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"system": {"Driver version": "6.7.0"}}',
        '{"card0": "N/A"}',
        '{"card0": {"Card Series": "AMD Instinct MI250X", "Node ID": "1"}}',
        '{"card0": {"GFX Version": "N/A", "Node ID": "1"}}',
        "\n==== ROCm System Management Interface ====\nERROR: GPU[0] : Unable to get product name\n",
    ],
)
def test_rocm_smi_malformed_output_gives_nothing(text: str) -> None:
    assert parse_rocm_smi(text, compute_units={1: 110}) == []


def _fake_kfd_topology(root: Path) -> Path:
    for node, properties in ((0, KFD_CPU_PROPERTIES), (1, KFD_GCD_PROPERTIES), (2, KFD_GCD_PROPERTIES)):
        (root / str(node)).mkdir(parents=True)
        (root / str(node) / "properties").write_text(properties)
    (root / "3").mkdir()  # a node without properties is skipped
    return root


def test_kfd_compute_units_reads_gpu_nodes_only(tmp_path: Path) -> None:
    assert kfd_compute_units(_fake_kfd_topology(tmp_path / "nodes")) == {1: 110, 2: 110}


def test_kfd_compute_units_without_a_driver(tmp_path: Path) -> None:
    assert kfd_compute_units(tmp_path / "missing") == {}


def test_rocm_smi_reads_the_topology_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus_module, "KFD_TOPOLOGY", _fake_kfd_topology(tmp_path / "nodes"))
    assert [gpu.target for gpu in parse_rocm_smi(ROCM_SMI_MI250X)] == ["gfx90a:110", "gfx90a:110"]


# --- detect_gpus with fake tools, run as real processes -------------------------------------------------------


# Found before any test narrows PATH down to the fake tools.
CAT = shutil.which("cat") or "/bin/cat"
SLEEP = shutil.which("sleep") or "/bin/sleep"


def _install_tool(directory: Path, name: str, body: str) -> Path:
    """An executable shell script ``name`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _printing_tool(directory: Path, name: str, output: str) -> Path:
    sample = directory / f"{name}.out"
    directory.mkdir(parents=True, exist_ok=True)
    sample.write_text(output)
    return _install_tool(directory, name, f'exec "{CAT}" "{sample}"\n')


@pytest.fixture
def tool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory that is the whole PATH, so that only the fake tools put in it exist."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    # Keep a real ROCm install out of reach too.
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    return directory


def test_detect_with_nvidia_smi(tool_dir: Path) -> None:
    _printing_tool(tool_dir, "nvidia-smi", NVIDIA_SMI_8X_H100)
    found = detect_gpus(timeout=10.0)
    assert found == parse_nvidia_smi(NVIDIA_SMI_8X_H100)
    assert len(found) == 8


def test_detect_passes_the_documented_arguments(tool_dir: Path) -> None:
    args_file = tool_dir / "args"
    _install_tool(
        tool_dir,
        "nvidia-smi",
        f'printf "%s\\n" "$@" > "{args_file}"\nprintf "%s\\n" "{NVIDIA_SMI_1X_H100.strip()}"\n',
    )
    assert [gpu.target for gpu in detect_gpus()] == ["sm_90"]
    assert args_file.read_text().split() == ["--query-gpu=index,name,compute_cap,uuid", "--format=csv,noheader"]


def test_detect_without_any_tool(tool_dir: Path) -> None:
    assert detect_gpus(timeout=5.0) == []


def test_detect_falls_through_a_failing_tool(tool_dir: Path) -> None:
    # What nvidia-smi does on a node whose driver is gone.
    _install_tool(
        tool_dir,
        "nvidia-smi",
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n',
    )
    _printing_tool(tool_dir, "rocminfo", ROCMINFO_MI250X)
    assert [gpu.target for gpu in detect_gpus(timeout=10.0)] == ["gfx90a:110", "gfx90a:110"]


def test_detect_falls_through_a_tool_that_finds_nothing(tool_dir: Path) -> None:
    _printing_tool(tool_dir, "nvidia-smi", "No devices were found\n")
    _printing_tool(tool_dir, "rocminfo", ROCMINFO_MI250X)
    assert len(detect_gpus(timeout=10.0)) == 2


def test_detect_falls_through_a_hanging_tool(tool_dir: Path) -> None:
    # The sleep is a grandchild holding the output pipe, as a wrapper script would; it must die too.
    _install_tool(tool_dir, "nvidia-smi", f'"{SLEEP}" 60\necho never\n')
    _printing_tool(tool_dir, "rocminfo", ROCMINFO_MI250X)
    started = time.monotonic()
    found = detect_gpus(timeout=1.0)
    elapsed = time.monotonic() - started
    assert [gpu.vendor for gpu in found] == ["amd", "amd"]
    assert elapsed < 8.0


def test_detect_falls_through_to_rocm_smi(tool_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus_module, "KFD_TOPOLOGY", _fake_kfd_topology(tmp_path / "kfd"))
    _install_tool(tool_dir, "rocminfo", "exit 1\n")
    _printing_tool(tool_dir, "rocm-smi", ROCM_SMI_MI250X)
    assert [(gpu.index, gpu.target) for gpu in detect_gpus(timeout=10.0)] == [(0, "gfx90a:110"), (1, "gfx90a:110")]


def test_detect_finds_rocminfo_under_rocm_path(tool_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rocm = tmp_path / "rocm"
    _printing_tool(rocm / "bin", "rocminfo", ROCMINFO_MI250X)
    monkeypatch.setenv("ROCM_PATH", str(rocm))
    assert len(detect_gpus(timeout=10.0)) == 2


def test_detect_skips_a_tool_that_cannot_be_executed(tool_dir: Path) -> None:
    (tool_dir / "nvidia-smi").write_text("not a program")
    (tool_dir / "nvidia-smi").chmod(0o644)
    _printing_tool(tool_dir, "rocminfo", ROCMINFO_MI250X)
    assert len(detect_gpus(timeout=10.0)) == 2


# --- select_gpus and override_gpus ---------------------------------------------------------------------------


@pytest.fixture
def eight() -> list[Gpu]:
    return parse_nvidia_smi(NVIDIA_SMI_8X_H100)


def test_select_all(eight: list[Gpu]) -> None:
    assert select_gpus(eight, "all") == eight
    assert select_gpus(eight, " ALL ") == eight
    assert select_gpus([], "all") == []


def test_select_by_index(eight: list[Gpu]) -> None:
    assert [gpu.index for gpu in select_gpus(eight, "0,2")] == [0, 2]
    assert [gpu.index for gpu in select_gpus(eight, " 5 , 3 ,5")] == [5, 3]


def test_select_unknown_index(eight: list[Gpu]) -> None:
    with pytest.raises(GpuSelectionError) as caught:
        select_gpus(eight, "0,9")
    message = str(caught.value)
    assert "9" in message and "0, 1, 2, 3, 4, 5, 6, 7" in message
    assert "\n" not in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, FleetError)


def test_select_on_a_node_without_gpus() -> None:
    with pytest.raises(GpuSelectionError, match="--target"):
        select_gpus([], "0")


@pytest.mark.parametrize("spec", ["", "0,", "one", "-1", "0;1", "1.5"])
def test_select_malformed(eight: list[Gpu], spec: str) -> None:
    with pytest.raises(GpuSelectionError, match="'0,2'"):
        select_gpus(eight, spec)


def test_override_nvidia() -> None:
    found = override_gpus("0,1", "sm_90")
    assert [(gpu.index, gpu.vendor, gpu.target, gpu.uuid) for gpu in found] == [
        (0, "nvidia", "sm_90", None),
        (1, "nvidia", "sm_90", None),
    ]
    assert found[1].visible_devices_env()["CUDA_VISIBLE_DEVICES"] == "1"


def test_override_amd() -> None:
    found = override_gpus("3", "gfx90a:104")
    assert [(gpu.index, gpu.vendor, gpu.target) for gpu in found] == [(3, "amd", "gfx90a:104")]
    assert found[0].visible_devices_env() == {"HIP_VISIBLE_DEVICES": "3"}


@pytest.mark.parametrize("target", ["cpu-x86_64", "sm90", "sm_", "90", "", "gfx90a:", "gfx90a:0", "GFX90A:104"])
def test_override_unknown_target(target: str) -> None:
    with pytest.raises(ValueError, match=r"sm_90.*gfx90a:104"):
        override_gpus("0", target)


def test_override_gfx_without_compute_units() -> None:
    with pytest.raises(GpuSelectionError, match="gfx90a:104"):
        override_gpus("0", "gfx90a")


@pytest.mark.parametrize("indices", ["all", "", "x"])
def test_override_bad_indices(indices: str) -> None:
    with pytest.raises(GpuSelectionError, match="--gpus"):
        override_gpus(indices, "sm_90")


# --- visible_devices_env and cpu_target ----------------------------------------------------------------------


def test_visible_devices_env_nvidia() -> None:
    gpu = parse_nvidia_smi(NVIDIA_SMI_A100_2080TI)[1]
    # PCI bus order, so that index 1 is the card nvidia-smi called 1 and not whichever CUDA thinks fastest.
    assert gpu.visible_devices_env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}


def test_visible_devices_env_amd() -> None:
    gpu = parse_rocminfo(ROCMINFO_MI250X)[1]
    assert gpu.visible_devices_env() == {"HIP_VISIBLE_DEVICES": "1"}


def test_visible_devices_env_unknown_vendor() -> None:
    with pytest.raises(ValueError, match="vendor"):
        Gpu(index=0, vendor="intel", name="Arc", target="xe").visible_devices_env()


def test_cpu_target(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cpu_target() == "cpu-" + platform.machine()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert cpu_target() == "cpu-aarch64"


def test_two_launchers_naming_gpu_0_for_different_targets_name_their_workers_apart() -> None:
    from fleet.workers.launch import plan

    first = plan(gpus=override_gpus("0", "sm_90"), target="sm_90", host="node1")
    second = plan(gpus=override_gpus("0", "sm_80"), target="sm_80", host="node1")
    names = [spec.name for spec in first + second]
    assert len(names) == len(set(names)), names
    assert [s.name for s in first if s.role == "eval"] == ["eval-gpu0-sm_90@node1"]
    found = Gpu(index=0, vendor="nvidia", name="NVIDIA H100 80GB HBM3", target="sm_90", uuid="GPU-aaaa")
    assert [s.name for s in plan(gpus=[found], host="node1") if s.role == "eval"] == ["eval-gpu0@node1"]


def test_missing_gpus_asks_the_tool_where_one_answers(tool_dir: Path, tmp_path: Path) -> None:
    _printing_tool(tool_dir, "nvidia-smi", NVIDIA_SMI_8X_H100)
    assert missing_gpus(override_gpus("0,7", "sm_90"), dev=tmp_path) is None
    said = missing_gpus(override_gpus("8", "sm_90"), dev=tmp_path)
    assert said is not None and said.startswith("GPU 8 of target sm_90 is not visible: this node shows GPU 0 (sm_90)")
    said = missing_gpus(override_gpus("0", "sm_80"), dev=tmp_path)
    assert said is not None and "GPU 0 of target sm_80 is not visible" in said


def test_missing_gpus_counts_device_nodes_where_no_tool_answers(tool_dir: Path, tmp_path: Path) -> None:
    # A container's device nodes keep the host's numbers: the one GPU a pod was given may be /dev/nvidia3.
    (tmp_path / "nvidia3").touch()
    (tmp_path / "nvidiactl").touch()
    assert missing_gpus(override_gpus("0", "sm_90"), dev=tmp_path) is None
    said = missing_gpus(override_gpus("0,1", "sm_90"), dev=tmp_path)
    assert said == (
        f"GPU(s) 0,1 of target sm_90 are not visible: no nvidia-smi answered and 1 of {tmp_path}/nvidia<N> are there"
    )
    assert missing_gpus(override_gpus("0", "gfx90a:104"), dev=tmp_path) is not None  # no /dev/kfd
    (tmp_path / "kfd").touch()
    (tmp_path / "dri").mkdir()
    (tmp_path / "dri" / "renderD128").touch()
    assert missing_gpus(override_gpus("0", "gfx90a:104"), dev=tmp_path) is None
