"""The baseline of the dispatch benchmark: a bare Celery two-task chain, build queue -> eval queue.

Same broker and settings as Fleet's app, no database: the second task only counts itself in Redis.
"""

from __future__ import annotations

import os

from celery import Celery

from fleet.settings import get_settings
from fleet.tasks import configure

app = configure(Celery("fleet-bench"), get_settings())
app.conf.task_routes = {"bench.build": {"queue": "bench.build"}, "bench.eval": {"queue": "bench.eval"}}
COUNTER = "fleet-bench:done"
_redis = None


@app.task(name="bench.build")
def build(n: int) -> None:
    evaluate.apply_async(args=[n])


@app.task(name="bench.eval")
def evaluate(n: int) -> None:
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["FLEET_BENCH_REDIS"])
    _redis.incr(COUNTER)
