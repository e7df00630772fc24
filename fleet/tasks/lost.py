"""A worker process the kernel's OOM killer took: its node's fault, never the configuration's.

Celery's prefork pool runs each task in a child process. When the child dies, the worker's main process requeues
the message (``task_reject_on_worker_lost``), and the trials the child held, claimed again once their leases
expire, would each count one more attempt against their configuration. A child that died because its node ran
out of memory says nothing about the configuration, so the main process, which sees the child go, asks the kernel
whether its OOM killer struck while the task ran; if it did, the child's trials go back to wait at once (counted
in ``node_faults``, no attempt spent), the builds it was making are forgotten, and the node is marked unhealthy
until it has memory again (:func:`fleet.workers.health.check`). Celery then requeues the message as before.

The kernel counts OOM kills node-wide (``oom_kill`` in ``/proc/vmstat``), not per process: a child killed by
SIGKILL while that count moved is taken for the OOM killer's. Were it another SIGKILL at the same moment, its
trials would only be spared one attempt on a node that was, in any case, short of memory.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

log = logging.getLogger(__name__)

# How billiard names the signal that ended a pool process (``signal 9 (SIGKILL)``).
_SIGKILL = re.compile(r"signal 9\b|SIGKILL")


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's OOM killer has killed on this node since boot, or None where not told."""
    try:
        for line in vmstat.read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def killed_for_memory(error: BaseException, kills_before: int | None, kills_now: int | None) -> bool:
    """Whether a pool process lost with ``error`` was taken by the OOM killer: SIGKILLed while the count moved."""
    if not isinstance(error, WorkerLostError) or not _SIGKILL.search(str(error)):
        return False
    return kills_before is not None and kills_now is not None and kills_now > kills_before


class NodeAwareRequest(Request):
    """Celery's request for Fleet's trial tasks, which gives a trial back when the OOM killer took its process."""

    oom_kills_at_start: int | None = None

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        self.oom_kills_at_start = oom_kills()
        super().on_accepted(pid, time_accepted)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        error = exc_info.exception
        if isinstance(error, ExceptionWithTraceback):
            error = error.exc
        if self.worker_pid and killed_for_memory(error, self.oom_kills_at_start, oom_kills()):
            self._give_back(self.worker_pid)
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _give_back(self, pid: int) -> None:
        from fleet.tasks.lifecycle import context
        from fleet.tasks.trials import _ids

        name = self.hostname
        trial_ids = _ids(self.kwargs.get("trial_ids"), self.kwargs.get("trial_id"))
        fault = f"the kernel's OOM killer took worker process {pid}: this node ran short of memory"
        try:
            ctx = context(name)
            given = ctx.store.give_back_lost(trial_ids, f"{name}/{pid}")
            failed = ctx.store.fail_faulted([r.trial_id for r in given], ctx.settings.max_node_faults, fault)
            ctx.store.set_fault(name, fault)
        except Exception as error:  # the leases expire and the trials are claimed again, attempts counted
            log.warning("%s; could not give its trials back: %s", fault, error)
            return
        back = [r.trial_id for r in given if r.trial_id not in failed]
        log.warning("%s; trials %s go back to their queue, no attempt spent", fault, back)
        if failed:
            log.warning("trials %s errored: %d node faults each", sorted(failed), ctx.settings.max_node_faults)
