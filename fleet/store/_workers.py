"""The store's machines and worker processes, and their heartbeats."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from fleet.store._base import StoreBase, patient
from fleet.store._models import Machine, Worker, utcnow


def served_targets(within: float) -> Any:
    """The targets that a live worker (one heard from within ``within`` seconds) serves, as a subquery: work of
    another target would be sent to a queue that no one consumes, where each sending again adds a message."""
    since = utcnow() - timedelta(seconds=within)
    return select(Worker.target).where(Worker.stopped_at.is_(None), Worker.heartbeat_at >= since)


class WorkerStore(StoreBase):
    """The machines of the fleet and the worker processes that run on them."""

    # -- machines and workers ---------------------------------------------------------------------------

    @patient
    def register_worker(
        self,
        *,
        name: str,
        hostname: str,
        role: str,
        target: str,
        queues: list[str],
        gpu: str | None,
        gpus: list[dict[str, Any]],
        cpus: int,
        concurrency: int,
        pid: int,
    ) -> None:
        """Record a worker process and its machine, or refresh them when they restart."""
        now = utcnow()
        with self.session() as session:
            self._insert_ignore(
                session,
                Machine,
                {"hostname": hostname, "targets": [], "gpus": [], "cpus": cpus, "first_seen": now, "last_seen": now},
            )
            # Locked: the workers of one node register together, and each adds its target to the list.
            machine = session.scalar(select(Machine).where(Machine.hostname == hostname).with_for_update())
            assert machine is not None
            # A driver serves every target: it adds none to its machine's.
            machine.targets = sorted(set(machine.targets) | ({target} if role != "driver" else set()))
            machine.gpus = gpus or machine.gpus
            machine.cpus, machine.last_seen = cpus, now
            self._insert_ignore(
                session,
                Worker,
                {
                    "name": name,
                    "machine_id": machine.id,
                    "role": role,
                    "target": target,
                    "queues": queues,
                    "gpu": gpu,
                    "concurrency": concurrency,
                    "pid": pid,
                    "started_at": now,
                    "heartbeat_at": now,
                },
            )
            session.execute(
                update(Worker)
                .where(Worker.name == name)
                .values(
                    machine_id=machine.id,
                    role=role,
                    target=target,
                    queues=queues,
                    gpu=gpu,
                    concurrency=concurrency,
                    pid=pid,
                    started_at=now,
                    heartbeat_at=now,
                    stopped_at=None,
                )
            )

    @patient
    def heartbeat(self, name: str) -> None:
        now = utcnow()
        with self.session() as session:
            machine_id = session.scalar(
                update(Worker).where(Worker.name == name).values(heartbeat_at=now).returning(Worker.machine_id)
            )
            if machine_id is not None:
                session.execute(update(Machine).where(Machine.id == machine_id).values(last_seen=now))

    @patient
    def worker_stopped(self, name: str) -> None:
        with self.session() as session:
            session.execute(update(Worker).where(Worker.name == name).values(stopped_at=utcnow()))

    @patient
    def workers(
        self, *, target: str | None = None, role: str | None = None, within: float | None = None
    ) -> list[Worker]:
        """Registered workers; with ``within``, only those that beat their heart in the last seconds."""
        query = select(Worker).order_by(Worker.name)
        if target is not None:
            query = query.where(Worker.target == target)
        if role is not None:
            query = query.where(Worker.role == role)
        if within is not None:
            query = query.where(
                Worker.stopped_at.is_(None), Worker.heartbeat_at >= utcnow() - timedelta(seconds=within)
            )
        with self.session() as session:
            return list(session.scalars(query))

    @patient
    def machines(self) -> list[Machine]:
        with self.session() as session:
            return list(session.scalars(select(Machine).order_by(Machine.hostname)))

    @patient
    def worker_fault(self, name: str) -> str | None:
        """Why worker ``name``'s node is unhealthy, as last said, or None."""
        with self.session() as session:
            return session.scalar(select(Worker.fault).where(Worker.name == name))

    def set_fault(self, name: str, fault: str | None) -> None:
        """Say that worker ``name``'s node is unhealthy and why (``fault``), or healthy again (None)."""
        with self.session() as session:
            current = session.scalar(select(Worker.fault).where(Worker.name == name))
            if current == fault:
                return  # its start stays when the same fault is seen again
            session.execute(
                update(Worker).where(Worker.name == name).values(fault=fault, fault_at=utcnow() if fault else None)
            )
