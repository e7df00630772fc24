"""Whether a fault is the node's, and whether the node is healthy again.

A full disk, a read-only or unwritable cache, a sandbox that cannot start, a worker process the kernel's OOM
killer took (:mod:`fleet.tasks.lost`): none of these says anything about the configuration being tried. A trial
that meets one goes back to its queue for another worker (counted in its ``node_faults``, not as an attempt), no
build is recorded as failed for it, and the worker says its node is unhealthy (``fleet status``) and hands work
back until :func:`check` passes again.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from fleet.errors import NodeFault
from fleet.workers import sandbox
from fleet.workers.runner import Completed

# Errors of the node's own storage, whoever met them: the worker writing its cache, or a compiler its output.
NODE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# What a command says when it met one of them (strerror's words, which compilers and linkers print).
_NODE_WORDS = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))
# Less room than this on a scratch's filesystem after a failed command: the disk, not the command, failed.
LOW_SPACE_BYTES = 16 << 20
# A write of this size must succeed for the node to count as healthy again.
PROBE_BYTES = 1 << 20
# Less memory available than this (MemAvailable): the node is short of it, and a worker process may be the
# next the kernel's OOM killer takes.
LOW_MEMORY_BYTES = 256 << 20


def from_os_error(error: OSError, where: str) -> NodeFault | None:
    """The node's fault that ``error`` (met by the worker itself, ``where``) stands for, or None."""
    if error.errno not in NODE_ERRNOS:
        return None
    return NodeFault(f"{where}: {error.strerror} ({error.filename or 'the worker'})")


def fault_in(done: Completed, scratch: Path) -> NodeFault | None:
    """The node's fault that made a command fail, or that a command which succeeded met; None when there is none.

    Either the command said so (``No space left on device``, ``Read-only file system``, ``Disk quota
    exceeded``), or its scratch's filesystem had almost no room while it ran or after it: under
    :data:`LOW_SPACE_BYTES` for a failure, under :data:`PROBE_BYTES` (the write a healthy node takes) for a
    success. A command can succeed and still have met the full disk: Python drops a file whose last write fails at
    close without a word (outside its development mode), so a build exits 0 with its artifact empty (issue 39's
    nemesis found one). The least room seen while it ran counts, not only the room at its end: another command's
    fault may have had the disk emptied meanwhile.
    """
    if done.timed_out or done.scratch_limit is not None or done.output_limit is not None:
        return None  # a command that filled its own scratch, or printed too much, did no more than it was allowed to
    said = next((words for words in _NODE_WORDS if words in done.stderr or words in done.stdout), None)
    try:
        room = os.statvfs(scratch)
        free = room.f_bavail * room.f_frsize
    except OSError:
        free = LOW_SPACE_BYTES
    if done.least_free is not None:
        free = min(free, done.least_free)
    if said is None and free >= (PROBE_BYTES if done.ok else LOW_SPACE_BYTES):
        return None
    though = ", though the command exited 0" if done.ok else ""
    return NodeFault(f"{said or 'the disk is full'} under {scratch} ({free >> 20} MiB free){though}")


def memory_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of memory available for new work (the kernel's ``MemAvailable``), or None where it is not told."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


def check(cache_dir: Path) -> str | None:
    """Why this node is still unhealthy, or None: it has memory, its cache takes a write, and the sandbox starts."""
    available = memory_available()
    if available is not None and available < LOW_MEMORY_BYTES:
        return f"only {available >> 20} MiB of memory available"
    probe = cache_dir / f".fleet-health-{os.getpid()}"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as file:
            file.write(b"\0" * PROBE_BYTES)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        return f"the cache {cache_dir}: {error.strerror}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    sandbox.probe.cache_clear()
    return sandbox.probe() if sandbox.configured() == "bwrap" else None
