"""`fleet status` counts what listens: a driver is shown, and not counted as a worker."""

from __future__ import annotations

import os

import pytest

from tests.conftest import Fleet

pytestmark = pytest.mark.integration


def register(fleet: Fleet, name: str, role: str, target: str) -> None:
    fleet.store.register_worker(
        name=name,
        hostname="node1",
        role=role,
        target=target,
        queues=[] if role == "driver" else [f"{role}.{target}"],
        gpu=None,
        gpus=[],
        cpus=1,
        concurrency=1,
        pid=os.getpid(),
    )


def test_workers_listening_does_not_count_the_driver(fleet: Fleet) -> None:
    register(fleet, "eval-cpu0@node1", "eval", fleet.target)
    register(fleet, "driver@node1", "driver", "-")

    shown = fleet.cli("status", check=True).stdout

    assert "workers listening: 1; drivers: 1" in shown, shown
    assert "driver@node1" in shown and "eval-cpu0@node1" in shown
