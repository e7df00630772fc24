"""The store: every read and write Fleet makes, on SQLite or PostgreSQL. It knows no Celery.

Ownership of work is decided here, not by the broker: a claim is a conditional UPDATE that sets a lease, a worker
renews its lease while it works, and :meth:`Store.reap` gives back work whose lease expired. Results are written
only by the lease holder, in one transaction with the state change, so each trial is recorded exactly once however
often its message is delivered.

:class:`Store` is one class, put together from a module per concern, each a class over ``_base.StoreBase`` (engines,
sessions, transactions, migrations, inserts, the hot path's connection, patience): ``_problems`` (problems, tags,
blobs, campaigns, best), ``_trials`` (trials, claims, leases, results, the reaper), ``_builds`` (artifacts and build
claims), ``_chains`` (annealing chains), ``_workers`` (machines and workers), ``_teams`` (teams of submitters:
PostgreSQL's roles), ``_steering`` (drivers' leases on campaigns, cancel, pause, priorities). The workers' hot
statements are in ``_hotpath``, the dataclasses the methods take and return in ``_types``. The Tuna tables are
written by ``fleet.tuna`` through :meth:`Store.transaction` and :meth:`Store.insert_many`.

Every public method is ``patient``: in a store whose ``patience`` is set (workers' and drivers'), a call that finds
the database down is run again, with backoff, until it answers or ``patience`` seconds pass.
"""

from fleet.store._builds import BuildStore
from fleet.store._chains import ChainStore
from fleet.store._history import HistoryStore
from fleet.store._problems import ProblemStore
from fleet.store._steering import SteeringStore
from fleet.store._teams import TeamStore
from fleet.store._workers import WorkerStore


class Store(ProblemStore, SteeringStore, BuildStore, ChainStore, WorkerStore, HistoryStore, TeamStore):
    """Fleet's database.

    Parameters
    ----------
    url:
        A SQLAlchemy URL: ``postgresql+psycopg2://...`` or ``sqlite:///path``.
    durable:
        False lets PostgreSQL acknowledge a commit before it reaches the disk (``synchronous_commit=off``),
        for worker processes: every write they make is covered by a lease, so a commit that a crash of the
        database host loses looks like a worker that died, and the lease brings the work back.
    patience:
        Seconds to wait out a database that does not answer before raising
        :class:`fleet.errors.StoreUnavailable`; 0 (a command a user typed) fails at once.
    """
