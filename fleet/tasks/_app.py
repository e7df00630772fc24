"""The Celery app, its routing by target, and its settings: JSON only, late acks, prefetch 1."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from kombu import Queue

from fleet.settings import Settings, get_settings

TASK_QUEUES = {
    "fleet.compile": "build", "fleet.evaluate": "eval", "fleet.anneal_step": "eval", "fleet.tvm_measure": "eval",
}  # fmt: skip


def queue_names(target: str) -> tuple[str, str]:
    """The build and evaluation queue names of ``target``."""
    return f"build.{target}", f"eval.{target}"


def queues(target: str, roles: tuple[str, ...] = ("build", "eval")) -> list[Queue]:
    """Queue declarations of ``target`` for the given roles (durable, plain direct queues)."""
    return [Queue(f"{role}.{target}", routing_key=f"{role}.{target}") for role in roles]


def route(name: str, args: Any, kwargs: dict[str, Any], options: dict[str, Any], task: Any = None, **_: Any) -> dict:
    """Celery router: a Fleet task goes to its kind's queue of the target in its kwargs."""
    prefix = TASK_QUEUES.get(name)
    if prefix is None or "target" not in (kwargs or {}):
        return {}
    queue = f"{prefix}.{kwargs['target']}"
    return {"queue": queue, "routing_key": queue}


def _no_hostname_warning(record: logging.LogRecord) -> bool:
    """Drop kombu's warning that a filesystem broker URL has no host: it never has one, and users saw it on every
    embedded campaign without redis-server (the first GPU run's output)."""
    return not str(record.msg).startswith("No hostname was supplied")


def configure(app: Celery, settings: Settings) -> Celery:
    """Apply Fleet's settings: JSON only, late acks, prefetch 1, events on, no result backend."""
    options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout}
    if settings.broker_url.startswith("filesystem://"):
        folder = str(settings.broker_folder)
        settings.broker_folder.mkdir(parents=True, exist_ok=True)
        options |= {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False}
        logging.getLogger("kombu.connection").addFilter(_no_hostname_warning)
    app.conf.update(
        broker_url=settings.broker_url,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        event_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        task_routes=(route,),
        task_default_queue="fleet.default",
        task_ignore_result=True,
        result_backend=None,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        enable_utc=True,
    )
    return app


app = configure(Celery("fleet", set_as_current=True), get_settings())
