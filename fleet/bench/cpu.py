"""Where a benchmark's CPU went: the fleet's processes' CPU time by role, and the cores left idle.

A rate that falls between two windows of a run has three causes that look alike from the outside: the
fleet's cost per trial grew, the fleet waited (a queue ran dry, campaigns ended unevenly), or the machine
ran slower. CPU milliseconds per trial, by role, over each window tell the first from the others, and the
idle cores tell the second. Each ``fleet`` command a benchmark starts and each private server runs in a
session of its own, so a role is a process group and the processes it starts (``fleet worker`` starts its
Celery workers in sessions of their own); what runs elsewhere (a server the environment named) is not
measured here: a fact about a machine is taken on that machine.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")

OTHER = "other"
"""What the machine's busy cores did beyond the watched roles (the benchmark's own commands, other work)."""


def _processes() -> dict[int, tuple[int, int, float]]:
    """Each process's parent, group id and CPU seconds so far: its own, not its reaped children's, which were
    counted as they ran (the seconds of one that ended between two samples are lost)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # The command name may hold spaces and parentheses: the fields follow the last ')'.
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        found[int(entry.name)] = (int(fields[1]), int(fields[2]), (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def _machine() -> tuple[float, float]:
    """The machine's busy and idle CPU seconds so far, over all its cores."""
    with open("/proc/stat") as handle:
        ticks = [int(value) for value in handle.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, and waiting on I/O
    busy = sum(ticks[:8]) - idle  # user to steal; guest time is already in user
    return busy / _TICK, idle / _TICK


class CpuMeter:
    """CPU seconds of watched process groups by role, and the machine's idle cores, sampled in a thread.

    Parameters
    ----------
    every:
        Seconds between samples.
    """

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.groups: dict[int, str] = {}  # process group id -> role
        self.samples: list[tuple[float, dict[str, float], float]] = []  # (when, seconds by role, idle seconds)
        self._seen: dict[int, tuple[str, float]] = {}  # pid -> (role, its CPU seconds when last seen)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)

    def watch(self, role: str, group: int) -> None:
        """Count as ``role`` the CPU of process group ``group`` (a process started in a session of its own: its
        pid), and of the processes it starts, in sessions of their own too (``fleet worker``'s)."""
        with self._lock:
            self.groups[group] = role

    def start(self) -> CpuMeter:
        self.sample()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        """Take one sample now. A process that exited keeps the seconds it had when last seen."""
        with self._lock:
            processes = _processes()
            roles: dict[int, str | None] = {}

            def role_of(pid: int) -> str | None:
                if pid not in roles:
                    roles[pid] = None  # a loop in a table read while it changed ends here
                    parent, group, _ = processes.get(pid, (0, 0, 0.0))
                    found = self.groups.get(group) or self.groups.get(pid)
                    roles[pid] = found or (role_of(parent) if parent > 1 else None)
                return roles[pid]

            for pid, (_, _, seconds) in processes.items():
                role = role_of(pid)
                if role is not None:
                    self._seen[pid] = (role, seconds)
            by_role = {role: 0.0 for role in self.groups.values()}
            for role, seconds in self._seen.values():
                by_role[role] += seconds
            busy, idle = _machine()
            by_role[OTHER] = busy - sum(by_role.values())
            self.samples.append((time.time(), by_role, idle))

    def _at(self, when: float) -> tuple[dict[str, float], float] | None:
        """The counters at ``when``, between the two samples around it; None outside the samples."""
        times = [sample[0] for sample in self.samples]
        right = bisect.bisect_left(times, when)
        if right == len(times) or (right == 0 and times[0] != when):
            return None
        if times[right] == when:
            return self.samples[right][1], self.samples[right][2]
        (t0, roles0, idle0), (t1, roles1, idle1) = self.samples[right - 1], self.samples[right]
        share = (when - t0) / (t1 - t0)
        roles = {role: roles0.get(role, 0.0) + share * (roles1[role] - roles0.get(role, 0.0)) for role in roles1}
        return roles, idle0 + share * (idle1 - idle0)

    def window(self, start: float, end: float, trials: int) -> dict[str, object] | None:
        """CPU milliseconds per trial by role between ``start`` and ``end`` (seconds since the epoch), their
        total over the fleet's roles, and the cores idle on average; None when the samples do not cover it."""
        if self._thread.is_alive() and self.samples and end > self.samples[-1][0]:
            self.sample()  # the window ended a moment ago, as a phase did
        before, after = self._at(start), self._at(end)
        if before is None or after is None or end <= start or trials <= 0:
            return None
        (roles0, idle0), (roles1, idle1) = before, after
        spent = {role: max(0.0, roles1[role] - roles0.get(role, 0.0)) for role in roles1}
        per_trial = {role: round(1000 * seconds / trials, 3) for role, seconds in spent.items()}
        fleet = sum(seconds for role, seconds in spent.items() if role != OTHER)
        return {
            "cpu_ms_per_trial": per_trial,
            "fleet_cpu_ms_per_trial": round(1000 * fleet / trials, 3),
            "idle_cores": round((idle1 - idle0) / (end - start), 2),
        }
