"""The Celery app and Fleet's tasks. Tasks are thin: they load, call the worker code, and send the next step.

Queues are named after targets: ``build.<target>`` for compiles, ``eval.<target>`` for evaluations. Every
task takes ``target`` as a keyword argument, and the router reads it.
"""

from fleet.celery_app import TASK_QUEUES, app, configure, queue_names, queues, route

# The task modules register themselves on the app; importing them here lets `celery -A fleet.tasks` find them.
from fleet.tasks import lifecycle as _lifecycle  # noqa: F401
from fleet.tasks.sending import send, send_steps
from fleet.tasks.trials import anneal_step, compile, evaluate
from fleet.tasks.tvm import tvm_measure  # noqa: F401

__all__ = [
    "TASK_QUEUES", "anneal_step", "app", "compile", "configure", "evaluate", "queue_names", "queues", "route", "send",
    "send_steps",
]  # fmt: skip
