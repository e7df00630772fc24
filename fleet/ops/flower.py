"""``fleet flower``: Flower on Fleet's Celery app, with its password from the environment.

Workers send task events (``-E``, ``task_send_sent_event``), so Flower lists each worker by its node name
(``eval-gpu0@node1``) and each task with its arguments. It is the same as ``celery -A fleet.tasks flower``;
this wrapper only refuses to serve beyond loopback without a password, and keeps the password out of the
command line (``FLOWER_BASIC_AUTH=user:password``, which Flower reads itself).
"""

from __future__ import annotations

import ipaddress
import os
import sys

# Flower's tasks page leaves out the arguments by default; a Fleet task's arguments say which trial it is.
TASKS_COLUMNS = "name,uuid,state,kwargs,result,routing_key,received,runtime,worker"


def flower_argv(port: int, address: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The argument list that runs Flower on Fleet's app.

    Parameters
    ----------
    port:
        The port to listen on.
    address:
        The address to listen on.
    extra:
        More Flower options, e.g. ``--persistent=True``.
    """
    columns = [] if "FLOWER_TASKS_COLUMNS" in os.environ else [f"--tasks_columns={TASKS_COLUMNS}"]
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "fleet.tasks",
        "flower",
        f"--port={port}",
        f"--address={address}",
        *columns,
        *extra,
    ]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"
