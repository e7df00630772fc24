"""Queue health: messages waiting, messages delivered and not yet acknowledged, and consumers, per queue.

Flower shows workers and tasks, but not a queue that no worker consumes, nor messages a worker took and has
not acknowledged; this module reads them from the broker itself:

- kombu's Redis transport keeps a queue's waiting messages in a list named after the queue, plus one list
  per priority step (``<queue>\\x06\\x16<step>``) when messages carry priorities; the messages delivered to a
  consumer and not yet acknowledged in the ``unacked`` hash (indexed by time in ``unacked_index``), each as
  ``[message, exchange, routing_key]``. Fleet routes every task with the routing key equal to its queue's
  name, so the routing key says which queue an unacknowledged message came from.
- kombu's filesystem transport (embedded mode without ``redis-server``) keeps each waiting message as one
  file ``<time>_<id>.<queue>.msg`` in its data folder and removes it on delivery: waiting messages are
  counted, and unacknowledged ones cannot be seen (shown as ``-``, exported as no sample).
- Consumers are the live workers registered in the database, whose heartbeat runs in the worker's main
  process, and, where a queue holds work that none of them consumes or the database knows no live worker,
  the workers that answer Celery's ``inspect().active_queues()`` (a prefork worker answers even while its
  pool is busy; one whose heartbeats stopped is found so). On the filesystem transport, which has no
  broadcast, only the database is asked.

The broker's keys are read over a plain socket (:mod:`fleet.ops.resp`), without Celery, kombu or redis-py, unless
the broadcast is needed or the broker's URL asks for TLS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fleet.errors import BrokerError
from fleet.settings import Settings, get_settings, redact
from fleet.states import CampaignStatus

FLEET_QUEUES = ("build.", "eval.")
NOBODY_TIMEOUT = 0.2
"""Seconds to wait for workers' answers when the database knows no live worker."""


@dataclass
class QueueHealth:
    """The figures of one queue.

    Parameters
    ----------
    name:
        The queue, e.g. ``eval.sm_90``.
    waiting:
        Messages in the queue, not yet delivered.
    unacked:
        Messages delivered to a worker and not yet acknowledged; None where the transport cannot tell.
    consumers:
        Names of the workers consuming it.
    """

    name: str
    waiting: int = 0
    unacked: int | None = 0
    consumers: list[str] = field(default_factory=list)

    @property
    def warning(self) -> str | None:
        """A line for a queue with work and nobody to do it, else None."""
        if self.consumers:
            return None
        if self.waiting:
            return f"{self.name}: {self.waiting} messages wait and no worker consumes the queue"
        if self.unacked:
            return f"{self.name}: {self.unacked} messages were taken by a worker that is gone; Redis redelivers them"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.name,
            "waiting": self.waiting,
            "unacked": self.unacked,
            "consumers": self.consumers,
            "warning": self.warning,
        }


def _redis_counts(settings: Settings, app: Any) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Waiting and unacknowledged messages per queue, and the queues bound in the broker, from kombu's keys: read
    over a plain socket (:mod:`fleet.ops.resp`), or through kombu for a broker that needs TLS."""
    from fleet.ops.resp import connect

    try:
        connection = connect(settings.broker_url)
        if connection is None:
            if app is None:
                from fleet.celery_app import app
            with app.connection_for_read() as link:
                link.ensure_connection(max_retries=1, interval_start=0.2, timeout=5)
                return _kombu_counts(link.default_channel)
        with connection:
            return _counts(connection, KEYPREFIX_QUEUE, SEP, UNACKED_KEY)
    except Exception as error:  # sockets, kombu and redis-py raise many kinds; all mean the same here
        raise BrokerError(f"broker {redact(settings.broker_url)} does not answer: {error}") from None


KEYPREFIX_QUEUE, SEP, UNACKED_KEY = "_kombu.binding.%s", "\x06\x16", "unacked"
"""kombu's Redis transport's names: a queue's bindings, the separator in a binding, the hash of unacknowledged
messages (its channel's ``keyprefix_queue``, ``sep``, ``unacked_key``; Fleet sets no ``global_keyprefix``)."""


def _kombu_counts(channel: Any) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """:func:`_counts` through kombu's channel (its redis-py client and its own names)."""

    class Client:
        def scan(self, match: str, kind: str | None = None) -> Any:
            return channel.client.scan_iter(match=match, _type=kind)

        def command(self, name: str, key: Any) -> Any:
            return getattr(channel.client, name.lower())(key)

    return _counts(Client(), channel.keyprefix_queue, channel.sep, channel.unacked_key)


def _counts(
    client: Any, keyprefix_queue: str, sep: str, unacked_key: str
) -> tuple[dict[str, int], dict[str, int], set[str]]:
    known: set[str] = set()
    for key in client.scan(keyprefix_queue % "*"):
        for member in client.command("SMEMBERS", key):
            known.add((member.decode() if isinstance(member, bytes) else member).split(sep)[-1])
    waiting: dict[str, int] = {}
    for key in client.scan("*", "LIST"):
        name = (key.decode() if isinstance(key, bytes) else key).split(sep)[0]
        waiting[name] = waiting.get(name, 0) + int(client.command("LLEN", key))
    unacked: dict[str, int] = {}
    for raw in client.command("HVALS", unacked_key):
        try:
            routing_key = json.loads(raw)[2]
        except (ValueError, IndexError, TypeError):
            continue
        unacked[routing_key] = unacked.get(routing_key, 0) + 1
    return waiting, unacked, known


def _filesystem_counts(settings: Settings) -> dict[str, int]:
    waiting: dict[str, int] = {}
    folder = settings.broker_folder
    if not folder.is_dir():
        return waiting
    for entry in folder.iterdir():
        rest = entry.name.partition(".")[2]
        if rest.endswith(".msg"):
            name = rest.removesuffix(".msg")
            waiting[name] = waiting.get(name, 0) + 1
    return waiting


def inspect_consumers(app: Any, timeout: float, expected: int | None = None) -> dict[str, set[str]]:
    """The workers that answer ``inspect().active_queues()`` within ``timeout`` seconds, by queue name.

    With ``expected`` (the live workers the database knows), the answer comes as soon as that many have
    replied, instead of after the whole timeout.
    """
    replies = app.control.inspect(timeout=timeout, limit=expected or None).active_queues() or {}
    consumers: dict[str, set[str]] = {}
    for worker, queues in replies.items():
        for queue in queues or []:
            consumers.setdefault(queue["name"], set()).add(worker)
    return consumers


def queue_health(
    store: Any | None = None,
    *,
    app: Any = None,
    settings: Settings | None = None,
    inspect_timeout: float = 1.0,
) -> list[QueueHealth]:
    """The health of every Fleet queue the broker knows, or that a campaign or a live worker names.

    Parameters
    ----------
    store:
        The database: its live workers count as consumers, its campaigns' targets name queues. Optional.
    app:
        The Celery app (Fleet's by default).
    settings:
        Fleet's settings (the process's by default).
    inspect_timeout:
        Seconds to wait for workers' answers to ``inspect().active_queues()``.
    """
    settings = settings or get_settings()
    filesystem = settings.broker_url.startswith("filesystem://")
    names: set[str] = set()
    consumers: dict[str, set[str]] = {}
    unacked: dict[str, int] = {}
    if not filesystem and settings.embedded_broker and not settings.redis_socket.exists():
        # Said before Celery is imported, which costs `fleet status` more than its own queries.
        raise BrokerError("the embedded broker is not running (`fleet up --local` or `fleet tune` starts it)")
    if filesystem:
        waiting = _filesystem_counts(settings)
    else:
        waiting, unacked, names = _redis_counts(settings, app)
    live = [] if store is None else store.workers(within=settings.liveness_seconds)
    if store is not None:
        for worker in live:
            for queue in worker.queues or []:
                consumers.setdefault(queue, set()).add(worker.name)
        for campaign in store.campaigns():
            if campaign.status == CampaignStatus.RUNNING:
                names.update((f"build.{campaign.target}", f"eval.{campaign.target}"))
    celery_workers = sum(1 for worker in live if worker.role != "driver")
    unserved = [n for n, count in [*waiting.items(), *unacked.items()] if count and not consumers.get(n)]
    if not filesystem and (unserved or not celery_workers):
        # Celery's broadcast finds workers the database does not know live (their heartbeats stopped): asked where
        # a queue holds work that no live worker consumes, or where the database knows none. With none live, one
        # that answers anyway has missed its heartbeats for 20 s: a short look finds it, instead of waiting out
        # the whole timeout for answers that mostly never come.
        if app is None:
            from fleet.celery_app import app  # not fleet.tasks: every task and the worker code
        timeout = inspect_timeout if celery_workers else min(inspect_timeout, NOBODY_TIMEOUT)
        for queue, answered in inspect_consumers(app, timeout, expected=celery_workers).items():
            consumers.setdefault(queue, set()).update(answered)
    names.update(waiting, unacked, consumers)
    shown = sorted(n for n in names if n.startswith(FLEET_QUEUES) or waiting.get(n) or unacked.get(n))
    return [
        QueueHealth(
            name=name,
            waiting=waiting.get(name, 0),
            unacked=None if filesystem else unacked.get(name, 0),
            consumers=sorted(consumers.get(name, ())),
        )
        for name in shown
    ]


def format_queues(queues: Iterable[QueueHealth]) -> Iterator[str]:
    """Lines for ``fleet status``: one per queue, then one per warning."""
    queues = list(queues)
    if not queues:
        yield "queues: none"
        return
    yield f"{'queue':<36} {'waiting':>8} {'unacked':>8} {'consumers':>9}"
    for q in queues:
        unacked = "-" if q.unacked is None else str(q.unacked)
        yield f"{q.name:<36} {q.waiting:>8} {unacked:>8} {len(q.consumers):>9}"
    for q in queues:
        if q.warning:
            yield f"warning: {q.warning}"


# -- Prometheus -----------------------------------------------------------------------------------------------


class QueueCollector:
    """A Prometheus collector that reads the queues (and live workers) afresh at each scrape.

    Parameters
    ----------
    store:
        The database, for live workers; optional.
    """

    def __init__(self, store: Any | None = None, inspect_timeout: float = 1.0) -> None:
        self.store = store
        self.inspect_timeout = inspect_timeout

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("fleet_broker_up", "1 when the broker answered this scrape, else 0")
        try:
            queues = queue_health(self.store, inspect_timeout=self.inspect_timeout)
            up.add_metric([], 1)
        except BrokerError:
            queues = []
            up.add_metric([], 0)
        yield up
        families = {
            "waiting": GaugeMetricFamily(
                "fleet_queue_messages_waiting", "Messages waiting in the queue", labels=["queue"]
            ),
            "unacked": GaugeMetricFamily(
                "fleet_queue_messages_unacked",
                "Messages delivered to a worker and not yet acknowledged",
                labels=["queue"],
            ),
            "consumers": GaugeMetricFamily("fleet_queue_consumers", "Workers consuming the queue", labels=["queue"]),
            "stranded": GaugeMetricFamily(
                "fleet_queue_without_consumer", "1 when the queue has work and no worker consumes it", labels=["queue"]
            ),
        }
        for q in queues:
            families["waiting"].add_metric([q.name], q.waiting)
            if q.unacked is not None:
                families["unacked"].add_metric([q.name], q.unacked)
            families["consumers"].add_metric([q.name], len(q.consumers))
            families["stranded"].add_metric([q.name], 1 if q.warning else 0)
        yield from families.values()
        if self.store is not None:
            live = GaugeMetricFamily(
                "fleet_workers_live", "Workers whose heartbeat is recent", labels=["role", "target"]
            )
            counts: dict[tuple[str, str], int] = {}
            settings = get_settings()
            for worker in self.store.workers(within=settings.liveness_seconds):
                counts[(worker.role, worker.target)] = counts.get((worker.role, worker.target), 0) + 1
            for (role, target), n in sorted(counts.items()):
                live.add_metric([role, target], n)
            yield live


def registry(store: Any | None = None) -> Any:
    """A Prometheus registry holding only Fleet's queue metrics."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(QueueCollector(store))
    return reg
