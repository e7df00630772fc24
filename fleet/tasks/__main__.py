"""A Celery worker of Fleet's app, as the launcher starts it (:func:`fleet.workers.launch.command`).

``python -m fleet.tasks worker -n NAME -Q QUEUE -c N -l LEVEL`` starts the worker that ``celery -A fleet.tasks
worker -n NAME -Q QUEUE -c N -P prefork -E --without-gossip --without-mingle -l LEVEL`` starts, with the same
arguments to it. Celery's command line first loads every command an installed package adds to it (Flower's, with
Tornado) and its REPL's: a third of a second of CPU in each worker's main process, and a node starts two of them each
time ``fleet worker`` starts.
"""

from __future__ import annotations

import argparse
import sys

from celery.concurrency import get_implementation
from celery.platforms import maybe_drop_privileges
from celery.utils.log import mlevel
from celery.utils.nodenames import default_nodename, host_format

from fleet.tasks import app


def main(argv: list[str] | None = None) -> int:
    """Run one worker until it is stopped; its exit status."""
    parser = argparse.ArgumentParser(prog="python -m fleet.tasks", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("-n", "--hostname", required=True, help="The worker's name (NAME@HOST).")
    parser.add_argument("-Q", "--queues", required=True, help="The queues it takes tasks from, comma-separated.")
    parser.add_argument("-c", "--concurrency", type=int, required=True, help="Its pool processes.")
    parser.add_argument("-l", "--loglevel", default="INFO", help="DEBUG, INFO, WARNING, ERROR or CRITICAL.")
    args = parser.parse_args(argv)
    try:
        loglevel = mlevel(args.loglevel.upper())
    except KeyError:
        parser.error(f"unknown log level {args.loglevel!r}")
    maybe_drop_privileges(uid=None, gid=None)  # what Celery's command checks: never run as root with pickle
    worker = app.Worker(
        hostname=host_format(default_nodename(args.hostname)),
        queues=args.queues.split(","),
        concurrency=args.concurrency,
        pool=get_implementation("prefork"),
        loglevel=loglevel,
        task_events=True,
        without_gossip=True,
        without_mingle=True,
        optimization="default",
        prefetch_multiplier=app.conf.worker_prefetch_multiplier,
        no_color=False,
        quiet=False,
    )
    worker.start()
    return worker.exitcode or 0


if __name__ == "__main__":
    sys.exit(main())
