"""The Celery app, its routing by target, and its settings: JSON only, late acks, prefetch 1.

Outside ``fleet.tasks``, whose package imports every task (and the worker code): ``fleet status`` asks the broker
for its queues' health with this app alone (issue 42, item 12). The tasks register themselves on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
from typing import Any

from celery import Celery
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import filesystem as kombu_filesystem
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import QoS as VirtualQoS

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


# A broker link that dies (a partition: packets dropped, nothing refused) must fail a call in seconds, not hang it
# for TCP's quarter of an hour, as the PostgreSQL connections do (fleet.store._base): a publish waits for Redis's
# reply, and a worker's consumer waits on a socket that never turns readable (issue 39). socket_timeout bounds each
# reply; keepalives find an idle dead link in 5 + 3 * 2 s; tcp_user_timeout fails a connection whose data stays
# unacknowledged for 15 s; the health check pings a connection idle longer than 5 s before using it, and kombu
# drops a consumer's BRPOP whose reply is that late. Unix sockets (embedded mode) take the timeout alone.
DEAD_LINK = 15
BROKER_LINK: dict[str, Any] = {
    "socket_timeout": DEAD_LINK,
    "socket_connect_timeout": 5,
    "socket_keepalive": True,
    "socket_keepalive_options": {
        socket.TCP_KEEPIDLE: 5,
        socket.TCP_KEEPINTVL: 2,
        socket.TCP_KEEPCNT: 3,
        socket.TCP_USER_TIMEOUT: DEAD_LINK * 1000,
    },
    "health_check_interval": 5,
}


class _QoS(kombu_redis.QoS):
    """kombu's Redis QoS, which forgets a delivery even when the broker could not be told of its ack.

    kombu forgets it only after Redis answers: an ack that fails on a cut link leaves the delivery counted against
    the prefetch limit (1 here) forever, and the worker, connected again after the heal, never takes another
    message (found on the test bed, issue 39). Forgotten here, the message stays in Redis's unacknowledged set, which
    gives it back after the visibility timeout; the database's lease makes that second delivery harmless."""

    def ack(self, delivery_tag: Any) -> None:
        try:
            super().ack(delivery_tag)
        except self.channel.connection_errors:
            VirtualQoS.ack(self, delivery_tag)
            raise

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)
        except self.channel.connection_errors:
            VirtualQoS.ack(self, delivery_tag)
            raise


class _Channel(kombu_redis.Channel):
    QoS = _QoS


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`_QoS`: the transport of every redis:// and rediss:// broker URL."""

    Channel = _Channel


for _scheme in ("redis", "rediss"):
    TRANSPORT_ALIASES[_scheme] = f"{__name__}:RedisTransport"


class _FilesystemChannel(kombu_filesystem.Channel):
    """kombu's filesystem channel, whose exchange tables two processes cannot corrupt by creating them at once.

    kombu creates a missing table by opening it for writing, which empties it, and only then locks it: two workers
    started together (an embedded fleet's without redis-server, binding their remote-control queues) both found
    none, the second's table was written over the first's, longer one, and read back as JSON with the rest of the
    first after it, so a worker failed to start. Created whole in one step (a link, which fails when the file
    exists), a table is only ever read and rewritten under kombu's lock."""

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(exist_ok=True)
            fd, draft = tempfile.mkstemp(dir=self.control_folder, prefix=".table-")
            try:
                with os.fdopen(fd, "wb") as file:
                    file.write(b"[]")
                with contextlib.suppress(FileExistsError):
                    os.link(draft, table)
            finally:
                os.unlink(draft)
        super()._queue_bind(exchange, routing_key, pattern, queue)


class FilesystemTransport(kombu_filesystem.Transport):
    """kombu's filesystem transport with :class:`_FilesystemChannel`: the embedded broker without redis-server."""

    Channel = _FilesystemChannel


TRANSPORT_ALIASES["filesystem"] = f"{__name__}:FilesystemTransport"


def configure(app: Celery, settings: Settings) -> Celery:
    """Apply Fleet's settings: JSON only, late acks, prefetch 1, events on, no result backend."""
    options: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout}
    if settings.broker_url.startswith("filesystem://"):
        folder = str(settings.broker_folder)
        settings.broker_folder.mkdir(parents=True, exist_ok=True)
        options |= {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False}
        logging.getLogger("kombu.connection").addFilter(_no_hostname_warning)
    else:
        options |= BROKER_LINK
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
