"""Embedded mode: a whole fleet on this machine, with no server installed.

SQLite under ``FLEET_HOME``, a private ``redis-server`` on a unix socket there (or kombu's filesystem
transport when Redis is not installed), and ``fleet worker``'s processes for this machine's target.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from fleet.errors import FleetError
from fleet.services import RedisServer
from fleet.settings import Settings
from fleet.store import Store
from fleet.workers.launch import Launcher, node_gpus, plan

log = logging.getLogger("fleet.local")

POLL = 0.5
"""Seconds between two looks at the worker processes, to restart one that died."""


class LocalFleet:
    """Start what embedded mode needs, and stop it afterwards.

    Parameters
    ----------
    settings:
        Where the state lives and which broker to use.
    target:
        The target to start workers for; GPUs of that target are used when this machine has them.
    eval_procs, build_procs:
        Worker processes of a CPU target.
    """

    def __init__(self, settings: Settings, target: str, *, eval_procs: int = 1, build_procs: int | None = None) -> None:
        self.settings = settings
        self.target = target
        self.eval_procs = eval_procs
        self.build_procs = build_procs
        self.redis: RedisServer | None = None
        self.launcher: Launcher | None = None
        self._on_terminate: Any = None  # the SIGTERM handler to put back when it stops

    @property
    def log_dir(self) -> Path:
        from fleet.ops.logs import log_dir

        return log_dir(self.settings)

    def start(self, timeout: float = 60.0) -> LocalFleet:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        if self.settings.embedded_broker and self.settings.broker_url.startswith("redis+socket://"):
            self.redis = RedisServer(self.settings.home / "redis", unix_socket=self.settings.redis_socket)
            if not _answers(self.redis):
                self.redis.start()
            else:
                self.redis = None  # another process of ours started it; leave it to that one
        try:
            return self._start_workers(timeout)
        except BaseException:
            # Whatever stopped the start (no GPU of the target, a worker that died at once, Ctrl-C), it
            # leaves no broker or worker behind.
            self.stop()
            raise

    def _start_workers(self, timeout: float) -> LocalFleet:
        store = Store(self.settings.database_url)
        try:
            if self.settings.embedded_database:
                store.upgrade()
            specs = plan(
                gpus=node_gpus(self.target, None),
                target=self.target,
                eval_procs=self.eval_procs,
                build_procs=self.build_procs,
            )
            env = {**os.environ, "FLEET_HOME": str(self.settings.home)}
            self.launcher = Launcher(specs, log_dir=self.log_dir, env=env).start()
            names = {s.name for s in specs}
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if names <= {w.name for w in store.workers(within=30)}:
                    # The campaign is driven on the caller's thread; without this a killed worker stalls it.
                    self.launcher.supervise_in_background(POLL)
                    return self
                if any(p.poll() is not None for p in self.launcher.procs.values()):
                    break
                time.sleep(0.2)
        finally:
            store.close()
        raise FleetError(f"local workers did not start; see their logs under {self.log_dir}")

    def stop(self) -> None:
        """Stop the workers (supervision first, so none is started again) and the broker we started."""
        if self.launcher is not None:
            self.launcher.stop()
            self.launcher = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> LocalFleet:
        self._on_terminate = _unwind_on_terminate()
        return self.start()

    def __exit__(self, *_: object) -> None:
        try:
            self.stop()
        finally:
            if self._on_terminate is not None:
                signal.signal(signal.SIGTERM, self._on_terminate)


def _unwind_on_terminate() -> Any:
    """Make a SIGTERM end this process as Ctrl-C does, through ``__exit__``: by default it ends at once, leaving the
    private Redis it started running. Only in the main thread and where no one chose a handler; returns the one to
    put back (None when none was set here)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def unwind(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # the status a shell gives a command that a signal ended

    return signal.signal(signal.SIGTERM, unwind)


def _answers(redis: RedisServer) -> bool:
    """Whether a Redis already serves on the socket (started by another Fleet process)."""
    import redis as redis_py

    try:
        return bool(redis.client(socket_timeout=1).ping())
    except (redis_py.RedisError, OSError):
        return False
