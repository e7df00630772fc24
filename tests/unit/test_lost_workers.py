"""How a lost pool process is told to be the OOM killer's, and how a node knows it has memory again (issue 29)."""

from __future__ import annotations

from pathlib import Path

from billiard.exceptions import WorkerLostError

from fleet.tasks.lost import killed_for_memory, oom_kills
from fleet.workers.health import LOW_MEMORY_BYTES, memory_available

SIGKILLED = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 3.")


def test_a_process_sigkilled_while_the_oom_count_moved_was_the_oom_killers() -> None:
    assert killed_for_memory(SIGKILLED, 4, 5)
    assert not killed_for_memory(SIGKILLED, 5, 5)  # SIGKILLed by someone else: an attempt, as before
    assert not killed_for_memory(WorkerLostError("Worker exited prematurely: exitcode 1 Job: 3."), 4, 5)
    assert not killed_for_memory(WorkerLostError("Worker exited prematurely: signal 15 (SIGTERM) Job: 3."), 4, 5)
    assert not killed_for_memory(RuntimeError("signal 9 (SIGKILL)"), 4, 5)
    assert not killed_for_memory(SIGKILLED, None, 5)  # a kernel that does not count


def test_the_oom_count_and_the_available_memory_are_read_from_the_kernel(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 100\noom_kill 7\nnr_zone_active_file 3\n")
    assert oom_kills(vmstat) == 7
    assert oom_kills(tmp_path / "missing") is None
    assert isinstance(oom_kills(), int)  # this machine's kernel counts them
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  1000 kB\nMemAvailable:     131072 kB\n")
    assert memory_available(meminfo) == 128 << 20 < LOW_MEMORY_BYTES
    assert memory_available(tmp_path / "missing") is None
    assert (memory_available() or 0) > LOW_MEMORY_BYTES  # this machine has memory
