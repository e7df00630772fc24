"""A worker process's life: register, beat its heart, reap expired leases, say goodbye.

The launcher (``fleet worker``) passes the process's role, target and GPU in the environment
(``FLEET_WORKER_ROLE``, ``FLEET_WORKER_TARGET``, ``FLEET_WORKER_GPU``, ``FLEET_WORKER_GPUS``).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
import time
from typing import Any

from celery import signals

from fleet.errors import ConfigurationError, StoreError
from fleet.settings import conceal, freeze_at_exit, get_settings, node_name
from fleet.store import Store
from fleet.tasks.sending import send, send_steps
from fleet.workers import sandbox
from fleet.workers.execute import WorkerContext

log = logging.getLogger("fleet.worker")

_contexts: dict[int, WorkerContext] = {}
_making = threading.Lock()  # the first task and the warm-up thread may both want the context
_stop = threading.Event()


def context(name: str) -> WorkerContext:
    """This process's worker context, made on first use (after the fork, never inherited)."""
    ctx = _contexts.get(os.getpid())
    if ctx is None:
        with _making:
            ctx = _contexts.get(os.getpid())
            if ctx is None:
                settings = get_settings()
                ctx = WorkerContext(
                    store=Store(settings.database_url, durable=False, patience=settings.outage_seconds),
                    name=name,
                    settings=settings,
                    gpu=os.environ.get("FLEET_WORKER_GPU") or None,
                )
                _contexts.clear()
                _contexts[os.getpid()] = ctx
    return ctx


@signals.worker_init.connect
def _conceal(**_: Any) -> None:
    # Before the pool forks, so that every process of this worker holds its URLs out of the workloads' reach.
    conceal()
    freeze_at_exit()
    # What the imports made lives as long as the process: frozen before the pool forks, the pool processes'
    # collections never write to the pages they share with this one (the gc module's advice for forking servers).
    gc.freeze()


@signals.worker_process_init.connect
def _forget_parent(sender: Any = None, **_: Any) -> None:
    global _making
    _contexts.clear()
    _making = threading.Lock()  # a thread of the parent may have held it as the pool forked
    if isinstance(sender, str):  # the worker's name, which Celery sends this signal with
        # In a thread: Celery gives a new pool process a few seconds to say it is up.
        threading.Thread(target=_prepare, args=(sender,), name="fleet-prepare", daemon=True).start()


def _prepare(name: str) -> None:
    """Make what a process's first task would otherwise wait for: the store and its connection, and the
    device's description (nvidia-smi on a GPU node); a fifth of a second and more on a busy node."""
    try:
        ctx = context(name)
        ctx.store.connect_ahead()
        ctx.store.sync_clock()  # each pool process claims on the database's clock
        if os.environ.get("FLEET_WORKER_ROLE") == "eval":
            ctx.device  # noqa: B018 - a cached property, found now
    except Exception as error:  # the first task meets it again, and deals with it
        log.warning("could not prepare this worker process: %s", error)


@signals.worker_ready.connect
def _register(sender: Any = None, **_: Any) -> None:
    name = sender.hostname
    ctx = context(name)
    ctx.store.sync_clock()
    role = os.environ.get("FLEET_WORKER_ROLE", "build")
    target = os.environ.get("FLEET_WORKER_TARGET", "")
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) if sender.app else []
    ctx.store.register_worker(
        name=name,
        hostname=node_name(),  # the name `fab deploy` used
        role=role,
        target=target,
        queues=queues,
        gpu=ctx.gpu,
        gpus=json.loads(os.environ.get("FLEET_WORKER_GPUS", "[]")),
        cpus=os.cpu_count() or 1,
        concurrency=sender.pool.num_processes if hasattr(sender.pool, "num_processes") else 1,
        pid=os.getpid(),
    )
    _stop.clear()
    threading.Thread(target=_heartbeat, args=(ctx,), name="fleet-heartbeat", daemon=True).start()
    log.info("registered %s (%s, %s) on %s", name, role, target, ",".join(queues))
    # What a GPU run's log must show: which GPU this process was given, and what isolates its workloads.
    for pin in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if pin in os.environ:
            log.info("%s is pinned: %s=%s", name, pin, os.environ[pin])
    try:
        log.info("%s: %s", name, sandbox.describe())
    except ConfigurationError as error:  # the first task meets it again, and errs its trial with it
        log.warning("%s: %s", name, error)


def _heartbeat(ctx: WorkerContext) -> None:
    requeue_after = ctx.settings.requeue_seconds
    beats = 0
    while not _stop.wait(ctx.settings.heartbeat_seconds):
        beats += 1
        try:
            ctx.store.sync_clock()  # leases are on the database's clock: the reaper's "expired" too
            ctx.store.heartbeat(ctx.name)
            reaped = ctx.store.reap(ctx.settings.max_attempts)
            if beats * ctx.settings.heartbeat_seconds >= requeue_after / 4:
                beats = 0
                # Only for targets that a worker serves: a queue without consumers would grow at each pass.
                within = ctx.settings.liveness_seconds
                reaped += ctx.store.stale(requeue_after, served_within=within)
                send_steps(ctx.store.stale_chains(requeue_after, served_within=within))
            if reaped:
                log.warning("gave back %d trials whose worker went away", send(reaped))
        except StoreError as error:  # the database down for a while: the next beat tries again
            log.warning("heartbeat: %s", error)
        except Exception:  # the broker, or a bug: the next beat tries again
            log.exception("heartbeat failed")


def _subject(kwargs: dict[str, Any] | None) -> str:
    """What a task works on, as its log lines name it (``fleet logs --trial N`` looks for ``trial N``)."""
    kwargs = kwargs or {}
    if "trial_id" in kwargs:
        return f"trial {kwargs['trial_id']}"
    if "trial_ids" in kwargs:
        return ", ".join(f"trial {i}" for i in kwargs["trial_ids"])
    if "chain_id" in kwargs:
        return f"chain {kwargs['chain_id']} step {kwargs.get('step')}"
    return "task"


_started: dict[str, float] = {}


@signals.task_prerun.connect
def _task_start(task_id: str = "", task: Any = None, kwargs: dict[str, Any] | None = None, **_: Any) -> None:
    _started[task_id] = time.monotonic()
    if "trial_ids" in (kwargs or {}):
        return  # the task logs each of its trials' start and end itself (fleet.tasks.trials)
    name = getattr(task, "name", "?").removeprefix("fleet.")
    log.info("%s %s start (task %s)", _subject(kwargs), name, task_id)


@signals.task_postrun.connect
def _task_end(
    task_id: str = "", task: Any = None, kwargs: dict[str, Any] | None = None, retval: Any = None, **extra: Any
) -> None:
    seconds = time.monotonic() - _started.pop(task_id, time.monotonic())
    if "trial_ids" in (kwargs or {}) and extra.get("state") == "SUCCESS":
        return  # as in _task_start; a retry or a failure is the message's, and logged here
    name = getattr(task, "name", "?").removeprefix("fleet.")
    outcome = retval if extra.get("state") == "SUCCESS" else f"{extra.get('state')}: {retval!r}"
    log.info("%s %s end: %s in %.3f s (task %s)", _subject(kwargs), name, outcome, seconds, task_id)


@signals.worker_shutdown.connect
def _goodbye(sender: Any = None, **_: Any) -> None:
    _stop.set()
    ctx = _contexts.get(os.getpid())
    if ctx is not None:
        try:
            ctx.store.worker_stopped(ctx.name)
        except Exception:
            log.exception("could not mark %s stopped", ctx.name)
