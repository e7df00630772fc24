"""Which GPUs a worker node has, and the *target* each one tunes for.

A worker starts one evaluation process per GPU, pinned with ``CUDA_VISIBLE_DEVICES`` (NVIDIA) or
``HIP_VISIBLE_DEVICES`` (AMD), and subscribes it to the queues of that GPU's target. Results only compare
within one target, so the target names the code generation *and* the size of the part:

* NVIDIA: ``sm_`` and the compute capability without the dot, ``8.6`` -> ``sm_86``.
* AMD: the gfx architecture, ``:`` and the compute-unit count, ``gfx90a:104``, as MIOpen's Tuna names them:
  two parts of one architecture with different CU counts tune to different optima.
* No GPU: ``cpu-`` and :func:`platform.machine`, ``cpu-x86_64``.

Detection runs the vendors' own tools and parses their text; nothing here links against a GPU library, so
this module imports on any machine. The parsers are public so that they can be tested against recorded
outputs of real nodes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import FleetError
from fleet.targets import cpu_target

__all__ = [
    "KFD_TOPOLOGY",
    "Device",
    "Gpu",
    "GpuSelectionError",
    "cpu_target",
    "describe_device",
    "detect_gpus",
    "kfd_compute_units",
    "missing_gpus",
    "override_gpus",
    "parse_nvidia_smi",
    "parse_rocm_smi",
    "parse_rocminfo",
    "select_gpus",
]

log = logging.getLogger(__name__)

KFD_TOPOLOGY = Path("/sys/class/kfd/kfd/topology/nodes")
"""Where the amdgpu kernel driver describes each HSA node (CPUs and GPUs) in ``<node>/properties``."""

# The command lines whose output the parsers below read; detect_gpus runs them in this order.
NVIDIA_SMI_ARGS = ("nvidia-smi", "--query-gpu=index,name,compute_cap,uuid", "--format=csv,noheader")
ROCMINFO_ARGS = ("rocminfo",)
ROCM_SMI_ARGS = ("rocm-smi", "--showproductname", "--json")
_ROCM_TOOLS = frozenset({ROCMINFO_ARGS[0], ROCM_SMI_ARGS[0]})

_SM_TARGET = re.compile(r"sm_[1-9][0-9]*[a-z]?")
_GFX_NAME = re.compile(r"gfx[0-9a-f]+")
_GFX_TARGET = re.compile(r"(gfx[0-9a-f]+):([1-9][0-9]*)")
_COMPUTE_CAP = re.compile(r"([1-9][0-9]*)\.([0-9])")


class GpuSelectionError(FleetError, ValueError):
    """A ``--gpus`` or ``--target`` value that does not name GPUs of this node."""


@dataclass(frozen=True)
class Gpu:
    """One GPU of this node.

    Parameters
    ----------
    index:
        Ordinal to put in ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``.
    vendor:
        ``"nvidia"`` or ``"amd"``.
    name:
        Product name, e.g. ``"NVIDIA H100 80GB HBM3"``, ``"AMD Instinct MI250X"``.
    target:
        What the GPU tunes for, e.g. ``"sm_90"``, ``"gfx90a:104"``.
    uuid:
        The driver's unique id (``GPU-...``), when it reports one.
    """

    index: int
    vendor: str
    name: str
    target: str
    uuid: str | None = None

    def visible_devices_env(self) -> dict[str, str]:
        """Environment that makes this GPU the only one, as device 0, of a child process."""
        if self.vendor == "nvidia":
            # CUDA numbers devices fastest first unless told otherwise, while nvidia-smi (where the index
            # comes from) numbers them by PCI bus; on a node with an A100 and an RTX 2080 Ti the two orders
            # differ and the child would run on the other card, under the other card's target.
            return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(self.index)}
        if self.vendor == "amd":
            return {"HIP_VISIBLE_DEVICES": str(self.index)}
        raise ValueError(f"GPU {self.index} has unknown vendor {self.vendor!r}; expected 'nvidia' or 'amd'")


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Read the GPUs out of ``nvidia-smi --query-gpu=index,name,compute_cap,uuid --format=csv,noheader``.

    Each line looks like ``0, NVIDIA H100 80GB HBM3, 9.0, GPU-5e1f...``. Lines that do not parse (a driver
    too old for ``compute_cap`` prints ``[N/A]`` or an error) are skipped.

    Parameters
    ----------
    text:
        The command's standard output.
    """
    gpus = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4:
            continue
        # A product name could hold a comma; index, compute_cap and uuid never do, so take them from the ends.
        index_text, compute_cap, uuid = fields[0], fields[-2], fields[-1]
        name = ", ".join(fields[1:-2])
        cap = _COMPUTE_CAP.fullmatch(compute_cap)
        if not index_text.isdecimal() or cap is None or not name:
            continue
        gpus.append(
            Gpu(
                index=int(index_text),
                vendor="nvidia",
                name=name,
                target=f"sm_{cap.group(1)}{cap.group(2)}",
                uuid=uuid if uuid.startswith(("GPU-", "MIG-")) else None,
            )
        )
    return gpus


def _rocminfo_agents(text: str) -> list[dict[str, str]]:
    """Split ``rocminfo`` output into one ``{field: value}`` per ``Agent N`` block."""
    agents: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        # Current rocminfo puts "Agent N" on a line between two "*******" lines; tolerate it on one line too.
        if re.fullmatch(r"\**\s*Agent \d+\s*\**", stripped):
            current = {}
            agents.append(current)
            continue
        if current is None or ":" not in stripped:
            continue
        key, _, value = stripped.partition(":")
        # The agent's own fields come first; the ISA Info section further down repeats "Name:" (with the
        # full "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"), and that one must not replace the agent's.
        current.setdefault(key.strip(), value.strip())
    return agents


def parse_rocminfo(text: str) -> list[Gpu]:
    """Read the GPUs out of plain ``rocminfo`` output.

    Each ``*******  Agent N  *******`` block is a CPU or a GPU; only blocks with ``Device Type: GPU`` count,
    and a GPU's index is its place among them, which is how HIP numbers devices for
    ``HIP_VISIBLE_DEVICES``. The target is the block's ``Name:`` (``gfx90a``) and ``Compute Unit:``; the
    name is ``Marketing Name:``; the uuid is ``Uuid:`` unless it is the ``GPU-XX`` placeholder of parts
    without one.

    Parameters
    ----------
    text:
        The command's standard output.
    """
    gpus = []
    ordinal = 0
    for agent in _rocminfo_agents(text):
        if agent.get("Device Type", "").upper() != "GPU":
            continue
        # Count every GPU agent, parsable or not, so that later indices still match HIP's numbering.
        index = ordinal
        ordinal += 1
        arch = agent.get("Name", "")
        compute_units = agent.get("Compute Unit", "")
        if _GFX_NAME.fullmatch(arch) is None or not compute_units.isdecimal() or int(compute_units) == 0:
            log.debug("rocminfo: skipping GPU agent %d with Name=%r, Compute Unit=%r", index, arch, compute_units)
            continue
        uuid = agent.get("Uuid", "")
        gpus.append(
            Gpu(
                index=index,
                vendor="amd",
                name=agent.get("Marketing Name") or arch,
                target=f"{arch}:{int(compute_units)}",
                uuid=uuid if uuid.startswith("GPU-") and uuid != "GPU-XX" else None,
            )
        )
    return gpus


def kfd_compute_units(root: Path | None = None) -> dict[int, int]:
    """Compute units of each GPU node of the amdgpu driver's topology, by node id.

    ``rocm-smi`` does not report compute units, so :func:`parse_rocm_smi` takes them from here: a node's
    ``properties`` file has ``simd_count`` and ``simd_per_cu``, and their quotient is what ROCr, and so
    ``rocminfo``, reports as ``Compute Unit``. CPU nodes (``simd_count 0``) are left out.

    Parameters
    ----------
    root:
        The ``topology/nodes`` directory, :data:`KFD_TOPOLOGY` by default; a missing or unreadable one gives
        ``{}``.
    """
    units: dict[int, int] = {}
    try:
        nodes = [path for path in (root or KFD_TOPOLOGY).iterdir() if path.name.isdecimal()]
    except OSError:
        return units
    for node in nodes:
        try:
            text = (node / "properties").read_text()
        except OSError:
            continue
        properties = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdecimal():
                properties[key] = int(value)
        simds, per_cu = properties.get("simd_count", 0), properties.get("simd_per_cu", 0)
        if simds > 0 and per_cu > 0:
            units[int(node.name)] = simds // per_cu
    return units


def parse_rocm_smi(text: str, compute_units: Mapping[int, int] | None = None) -> list[Gpu]:
    """Read the GPUs out of ``rocm-smi --showproductname --json``.

    The JSON maps ``card0``, ``card1``, ... to fields of which this reads ``Card Series`` (the name),
    ``GFX Version`` (``gfx90a``) and ``Node ID`` (the card's node in the amdgpu driver's topology). No
    ``rocm-smi`` output carries the compute-unit count (``--showhw`` refuses ``--json`` altogether), so it
    comes from ``compute_units``, by node id. A card without a known node or count is skipped rather than
    given a target without its CU count, which would subscribe it to queues that no campaign fills. The
    index is the card's place among the GPU nodes, the order in which HIP numbers devices.

    Parameters
    ----------
    text:
        The command's standard output. Text before the JSON object (some versions print warnings there)
        is ignored.
    compute_units:
        Compute units by topology node id; by default read with :func:`kfd_compute_units`.
    """
    start = text.find("{")
    if start < 0:
        return []
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    if compute_units is None:
        compute_units = kfd_compute_units()
    gpu_nodes = sorted(compute_units)
    gpus = []
    cards = [(int(key[4:]), value) for key, value in data.items() if re.fullmatch(r"card\d+", key)]
    for card, fields in sorted(cards, key=lambda item: item[0]):
        if not isinstance(fields, dict):
            continue
        # Older rocm-smi versions spell the keys "Card series", "Card vendor", ...
        fields = {str(key).strip().lower(): str(value).strip() for key, value in fields.items()}
        arch = fields.get("gfx version", "")
        node_text = fields.get("node id", "")
        node = int(node_text) if node_text.isdecimal() else None
        if _GFX_NAME.fullmatch(arch) is None or node is None or node not in compute_units:
            log.debug("rocm-smi: skipping card%d with GFX Version=%r, Node ID=%r", card, arch, node_text)
            continue
        gpus.append(
            Gpu(
                index=gpu_nodes.index(node),
                vendor="amd",
                name=fields.get("card series") or arch,
                target=f"{arch}:{compute_units[node]}",
            )
        )
    return gpus


def _find_tool(name: str) -> str | None:
    """Path of a vendor tool: on PATH, or in ROCm's bin directory, which installs often leave off PATH."""
    found = shutil.which(name)
    if found is not None or name not in _ROCM_TOOLS:
        return found
    candidate = Path(os.environ.get("ROCM_PATH") or "/opt/rocm") / "bin" / name
    return str(candidate) if os.access(candidate, os.X_OK) and candidate.is_file() else None


def _run_tool(args: tuple[str, ...], timeout: float) -> str | None:
    """Standard output of a tool that ran and exited 0 within ``timeout`` seconds, else None."""
    executable = _find_tool(args[0])
    if executable is None:
        log.debug("%s: not found", args[0])
        return None
    try:
        # A session of its own, so that on timeout the whole group (a wrapper script and what it started)
        # can be killed; killing only the direct child leaves grandchildren holding the output pipe.
        proc = subprocess.Popen(
            [executable, *args[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
    except OSError as error:
        log.debug("%s: cannot run: %s", args[0], error)
        return None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("%s: no answer within %.0f s; skipping it", args[0], timeout)
        _abandon(proc)
        return None
    if proc.returncode != 0:
        log.debug("%s: exit status %d: %s", args[0], proc.returncode, stderr.strip()[:500])
        return None
    return stdout


def _abandon(proc: subprocess.Popen[str]) -> None:
    """Kill a hung tool's process group without waiting on it for long."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=2.0)
    except subprocess.TimeoutExpired:
        # A tool stuck in the kernel (nvidia-smi on a wedged driver) cannot die; leave it rather than hang
        # the worker's start-up behind it.
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def detect_gpus(timeout: float = 10.0) -> list[Gpu]:
    """The GPUs of this node, from the first vendor tool that names any.

    Tries ``nvidia-smi``, then ``rocminfo``, then ``rocm-smi`` (see ``NVIDIA_SMI_ARGS``, ``ROCMINFO_ARGS``,
    ``ROCM_SMI_ARGS`` for the exact command lines). A tool that is missing, exits non-zero, hangs past
    ``timeout`` or prints nothing parsable is skipped. ROCm tools are also looked for in
    ``$ROCM_PATH/bin`` (``/opt/rocm/bin`` by default).

    Parameters
    ----------
    timeout:
        Seconds to wait for each tool.

    Returns
    -------
    list[Gpu]
        Sorted by index; empty when no tool answers, which makes this a CPU node (:func:`cpu_target`)
        unless ``--target`` and ``--gpus`` say otherwise (:func:`override_gpus`).
    """
    parsers = (
        (NVIDIA_SMI_ARGS, parse_nvidia_smi),
        (ROCMINFO_ARGS, parse_rocminfo),
        (ROCM_SMI_ARGS, parse_rocm_smi),
    )
    for args, parse in parsers:
        output = _run_tool(args, timeout)
        if output is None:
            continue
        gpus = parse(output)
        if gpus:
            log.info("%s found %d GPU(s): %s", args[0], len(gpus), ", ".join(g.target for g in gpus))
            return sorted(gpus, key=lambda gpu: gpu.index)
        log.debug("%s answered but named no usable GPU", args[0])
    return []


def _parse_indices(spec: str, option: str) -> list[int]:
    """The indices of a comma-separated list such as ``"0,2"``, in order, without repeats."""
    indices: list[int] = []
    for token in spec.split(","):
        token = token.strip()
        if not token.isdecimal():
            raise GpuSelectionError(
                f"{option} {spec!r}: expected 'all' or GPU indices separated by commas, such as '0,2'"
            )
        if int(token) not in indices:
            indices.append(int(token))
    return indices


def select_gpus(gpus: list[Gpu], spec: str) -> list[Gpu]:
    """The GPUs that ``--gpus`` asks for.

    Parameters
    ----------
    gpus:
        The GPUs found on this node (:func:`detect_gpus`).
    spec:
        ``"all"`` for every GPU, or indices separated by commas (``"0,2"``), kept in the order given.

    Raises
    ------
    GpuSelectionError
        When ``spec`` is malformed or names an index that ``gpus`` does not have.
    """
    if spec.strip().lower() == "all":
        return list(gpus)
    by_index = {gpu.index: gpu for gpu in gpus}
    wanted = _parse_indices(spec, "--gpus")
    missing = [index for index in wanted if index not in by_index]
    if missing:
        found = ", ".join(str(index) for index in sorted(by_index))
        detail = (
            f"this node has GPUs {found}"
            if found
            else "no GPUs were detected here; pass --target as well to name them by hand"
        )
        raise GpuSelectionError(f"--gpus {spec!r}: no GPU with index {', '.join(map(str, missing))}; {detail}")
    return [by_index[index] for index in wanted]


GIVEN = "(given by --target)"
"""The end of the name of a GPU that ``--target T --gpus N`` named, which no tool found."""


def given(gpu: Gpu) -> bool:
    """Whether ``gpu`` was named by ``--target T --gpus N`` rather than found: its index need not be unique on the
    node, since another launcher may name the same one for another target."""
    return gpu.uuid is None and gpu.name.endswith(GIVEN)


def override_gpus(indices: str, target: str) -> list[Gpu]:
    """GPU records built by hand from ``--target T --gpus 0,1``, for a node whose tools cannot be run.

    Parameters
    ----------
    indices:
        GPU indices separated by commas (``"0,1"``); ``"all"`` is refused, there being nothing to count.
    target:
        ``sm_<cc>`` for NVIDIA (``sm_90``) or ``gfx<arch>:<compute units>`` for AMD (``gfx90a:104``).

    Raises
    ------
    GpuSelectionError
        (a :class:`ValueError`) when either value is malformed.
    """
    target = target.strip()
    if _SM_TARGET.fullmatch(target):
        vendor = "nvidia"
    elif _GFX_TARGET.fullmatch(target):
        vendor = "amd"
    elif _GFX_NAME.fullmatch(target):
        raise GpuSelectionError(
            f"--target {target!r}: an AMD target needs its compute-unit count too, such as "
            f"'{target}:104' (rocminfo prints it as 'Compute Unit')"
        )
    else:
        raise GpuSelectionError(
            f"--target {target!r}: expected 'sm_<compute capability>' for NVIDIA (such as 'sm_90') or "
            f"'gfx<arch>:<compute units>' for AMD (such as 'gfx90a:104')"
        )
    if indices.strip().lower() == "all":
        raise GpuSelectionError("--gpus all cannot be used with --target; list the indices, such as '0,1'")
    return [
        Gpu(index=index, vendor=vendor, name=f"GPU {index} {GIVEN}", target=target)
        for index in _parse_indices(indices, "--gpus")
    ]


def missing_gpus(wanted: list[Gpu], timeout: float = 10.0, dev: Path = Path("/dev")) -> str | None:
    """Why this node does not show the GPUs ``wanted`` (named by ``--target T --gpus N``), or None when it does.

    The vendor's tool, where one answers, must name each index with its target. Where none does (a container or a
    batch node without the tools), the driver's device nodes must be there, as many as the highest index needs:
    a container's nodes keep the host's numbers (``/dev/nvidia3`` seen as GPU 0), so they are counted, not named.
    """
    if not wanted:
        return None
    indices = ",".join(str(gpu.index) for gpu in wanted)
    found = {gpu.index: gpu for gpu in detect_gpus(timeout)}
    if found:
        shown = ", ".join(f"{gpu.index} ({gpu.target})" for gpu in found.values())
        for gpu in wanted:
            if gpu.index not in found or found[gpu.index].target != gpu.target:
                return f"GPU {gpu.index} of target {gpu.target} is not visible: this node shows GPU {shown}"
        return None
    vendor = wanted[0].vendor
    if vendor == "nvidia":
        nodes = [p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia[0-9]+", p.name)]
        named = f"{dev}/nvidia<N>"
    else:
        nodes = list((dev / "dri").glob("renderD*")) if (dev / "kfd").exists() else []
        named = f"{dev}/kfd and {dev}/dri/renderD<N>"
    if len(nodes) <= max(gpu.index for gpu in wanted):
        tool = "nvidia-smi" if vendor == "nvidia" else "rocminfo or rocm-smi"
        return (
            f"GPU(s) {indices} of target {wanted[0].target} are not visible: no {tool} answered and "
            f"{len(nodes)} of {named} are there"
        )
    return None


# What an evaluation worker asks about its device, once per process, for the measurements' provenance.
NVIDIA_DEVICE_ARGS = ("nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader")
NVIDIA_SMI_HEADER_ARGS = ("nvidia-smi",)
ROCM_DRIVER_ARGS = ("rocm-smi", "--showdriverversion", "--json")
_CUDA_VERSION = re.compile(r"CUDA Version:\s*([0-9.]+)")


@dataclass(frozen=True)
class Device:
    """The device a measurement ran on, as its evaluation worker found it.

    Parameters
    ----------
    kind:
        The model: ``"NVIDIA H100 80GB HBM3"``, or the CPU's model name on a CPU worker. Measurements are
        reused only between devices of one kind.
    description:
        The model with its driver and runtime versions, where the vendor's tools tell them.
    """

    kind: str
    description: str


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's CPU model, as ``/proc/cpuinfo`` names it (``platform`` where there is none)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            # "model name" on x86; "Model" or "CPU part" on some ARM kernels.
            if key.strip() in ("model name", "Model") and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown CPU"


def parse_nvidia_device(query: str, header: str | None, index: int) -> Device | None:
    """The GPU ``index`` of ``nvidia-smi --query-gpu=index,name,driver_version`` with the header's CUDA version."""
    for line in query.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 3 and fields[0] == str(index) and fields[1]:
            cuda = _CUDA_VERSION.search(header or "")
            parts = [fields[1], f"driver {fields[2]}"] + ([f"CUDA {cuda.group(1)}"] if cuda else [])
            return Device(kind=fields[1], description=", ".join(parts))
    return None


def _rocm_versions(timeout: float) -> list[str]:
    """The amdgpu driver's and ROCm's versions, as far as this node tells them."""
    versions = []
    output = _run_tool(ROCM_DRIVER_ARGS, timeout)
    with contextlib.suppress(ValueError, AttributeError):
        driver = json.loads(output or "{}").get("system", {}).get("Driver version")
        if driver:
            versions.append(f"driver {driver}")
    with contextlib.suppress(OSError):
        rocm = (Path(os.environ.get("ROCM_PATH") or "/opt/rocm") / ".info" / "version").read_text().strip()
        if rocm:
            versions.append(f"ROCm {rocm}")
    return versions


def describe_device(gpu: str | None, timeout: float = 10.0) -> Device:
    """The device of an evaluation worker: its GPU (``"index:name"``, as ``FLEET_WORKER_GPU`` holds it), or the CPU.

    The GPU's name comes from the worker's own detection (:func:`detect_gpus`); its driver and runtime
    versions from ``nvidia-smi``, or ``rocm-smi`` and ROCm's version file, where those answer. A tool that
    does not answer leaves its versions out; it never fails the worker.
    """
    if not gpu:
        model = cpu_model()
        return Device(kind=model, description=f"{model} ({platform.machine()}, {os.cpu_count() or 0} cores)")
    index_text, _, name = gpu.partition(":")
    index = int(index_text) if index_text.isdigit() else 0
    query = _run_tool(NVIDIA_DEVICE_ARGS, timeout)
    if query is not None:
        found = parse_nvidia_device(query, _run_tool(NVIDIA_SMI_HEADER_ARGS, timeout), index)
        if found is not None:
            return found
    name = name or gpu
    return Device(kind=name, description=", ".join([name, *_rocm_versions(timeout)]))
