"""The embedded broker without redis-server (kombu's filesystem transport), as Fleet's app uses it: processes that
bind their queues to one exchange at the same moment, as two workers starting together do."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from kombu import Connection

import fleet.celery_app  # noqa: F401  (registers Fleet's transports)

ROUNDS = 15
PROCESSES = 6


def _bind(folder: str, name: str, start: multiprocessing.synchronize.Barrier) -> None:
    options = {"data_folder_in": folder, "data_folder_out": folder, "control_folder": folder}
    with Connection("filesystem://", transport_options=options) as connection:
        channel = connection.channel()
        start.wait()
        channel._queue_bind("celery.pidbox", "", "", name)


def test_workers_binding_to_a_new_exchange_at_once_leave_a_table_that_names_them_all(tmp_path: Path) -> None:
    """make run's workers failed to start, now and then, with ``JSONDecodeError: Extra data``: kombu creates a
    missing exchange table by truncating it before it locks it, and one worker's remote-control queue was written
    over another's longer one. Names of different lengths, started on one barrier, on a fresh folder each round."""
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        folder = tmp_path / f"round{round_}"
        folder.mkdir()
        start = context.Barrier(PROCESSES)
        names = [f"worker-{'x' * (i * 7)}@node.celery.pidbox" for i in range(PROCESSES)]
        workers = [context.Process(target=_bind, args=(str(folder), name, start)) for name in names]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [worker.exitcode for worker in workers] == [0] * PROCESSES, f"round {round_}"
        table = json.loads((folder / "celery.pidbox.exchange").read_text())
        assert sorted(queue for _, _, queue in table) == sorted(names), f"round {round_}"
        assert not [path.name for path in folder.iterdir() if path.name.startswith(".table-")]
