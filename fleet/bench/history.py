"""``fleet bench history``: the history query a campaign makes at its start, on a database of 1,000,000 measurements.

The database is filled with SQL (``generate_series``), not through workers: ``--sources`` problem-and-target
pairs of the queried kind and as many of another kind, ``--measurements`` in all, each pair a campaign of its
own. Timed: :meth:`fleet.store.Store.history` (one query; on PostgreSQL a lateral join over the index of
problem, target and objective), and the whole start of a campaign's history
(:func:`fleet.driving.history.campaign_history`: the query and the ranking). The baseline beside it, in the same
run and database, is the same answer by a window function over every measurement of the kind (what a query that
does not read the index's first rows costs).
Uses ``FLEET_DATABASE_URL`` when it names PostgreSQL, else a private PostgreSQL started for the run.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from contextlib import ExitStack
from typing import Any

import click

KNOBS = 6
"""Knobs of each measured configuration (values 0-7 each)."""

FILL = """
INSERT INTO problems (id, kind, params, params_key, created_at)
SELECT p, CASE WHEN p <= :half THEN 'conv' ELSE 'gemm' END, jsonb_build_object('n', p), md5(p::text), now()
FROM generate_series(1, :problems) AS p;
INSERT INTO campaigns (id, name, target, space, strategy, workload, workload_key, options, provenance, status,
                       submitted, priority, created_at)
SELECT s, 'c' || s, 'sm_' || (s % :targets), '{}'::jsonb, '{"name": "grid"}'::jsonb, '{"kind": "noop"}'::jsonb,
       md5(s::text), '{}'::jsonb, '{}'::jsonb, :campaign_status, false, 1, now()
FROM generate_series(1, :sources) AS s;
INSERT INTO campaign_problems (campaign_id, problem_id, position)
SELECT s, 1 + (s - 1) / :targets, 0 FROM generate_series(1, :sources) AS s;
INSERT INTO trials (id, campaign_id, problem_id, target, config, config_key, build_key, measure_key, remeasure, seq,
                    baseline, state, attempts, created_at)
SELECT i, 1 + (i - 1) / :per, 1 + ((i - 1) / :per) / :targets, 'sm_' || ((1 + (i - 1) / :per) % :targets),
       jsonb_build_object('k0', i % 8, 'k1', (i / 8) % 8, 'k2', (i / 64) % 8, 'k3', (i / 512) % 8,
                          'k4', (i / 4096) % 8, 'k5', (i / 32768) % 8),
       md5(i::text), md5(i::text), md5(i::text), false, i, false, :trial_state, 1, now()
FROM generate_series(1, :measurements) AS i;
INSERT INTO measurements (trial_id, problem_id, target, measure_key, objective_name, maximize, objective, valid,
                          samples, metrics, toolchain, created_at)
SELECT id, problem_id, target, measure_key, 'time', false, 1 + random() * 100, random() > 0.05, '[]'::jsonb,
       '{}'::jsonb, 'nvcc 12.4', now()
FROM trials;
SELECT setval(pg_get_serial_sequence('problems', 'id'), :problems);
SELECT setval(pg_get_serial_sequence('campaigns', 'id'), :sources);
SELECT setval(pg_get_serial_sequence('trials', 'id'), :measurements);
ANALYZE;
"""

WINDOW = """
SELECT problem_id, target, objective, toolchain, config FROM (
  SELECT m.problem_id, m.target, m.objective, m.toolchain, t.config,
         row_number() OVER (PARTITION BY m.problem_id, m.target ORDER BY m.objective) AS rank
  FROM measurements m JOIN trials t ON t.id = m.trial_id JOIN problems p ON p.id = m.problem_id
  WHERE p.kind = 'conv' AND m.valid AND m.objective IS NOT NULL AND NOT m.maximize
) ranked WHERE rank <= 10
"""


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False, timeout=10
        )
    except OSError:
        return ""
    return done.stdout.strip()


def _timed(call: Any, rounds: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def run(measurements: int, sources: int, rounds: int) -> dict[str, Any]:
    """Fill a database and time the history query; see the module docstring.

    Parameters
    ----------
    measurements:
        Measurements in all (half of them of the queried kind).
    sources:
        Problem-and-target pairs in all (half of them of the queried kind), one campaign each.
    rounds:
        Times each query runs; medians are kept.
    """
    from sqlalchemy import text

    from fleet.bench.servers import postgres_url
    from fleet.driving.history import campaign_history
    from fleet.space import Space
    from fleet.states import CampaignStatus, TrialState
    from fleet.store import Store

    targets = 10
    sources = max(targets * 2, sources - sources % (targets * 2))
    per = max(1, measurements // sources)
    measurements = per * sources
    problems = sources // targets
    with ExitStack() as stack:
        store = Store(postgres_url(stack))
        stack.callback(store.close)
        store.upgrade()
        start = time.perf_counter()
        values = {
            "problems": problems,
            "half": problems // 2,
            "sources": sources,
            "targets": targets,
            "per": per,
            "measurements": measurements,
            "campaign_status": CampaignStatus.DONE,
            "trial_state": TrialState.EVALUATED,
        }
        with store.transaction() as connection:
            for statement in FILL.split(";"):
                if statement.strip():
                    connection.execute(text(statement), values)
        fill_s = time.perf_counter() - start
        with store.transaction() as connection:
            server = str(connection.exec_driver_sql("SHOW server_version").scalar())
            counted = connection.exec_driver_sql("SELECT count(*) FROM measurements").scalar()
        query_s, found = _timed(lambda: store.history("conv"), rounds)
        campaign = store.campaign(1)
        problem = store.problem(1)
        space = Space.from_dict({"knobs": {f"k{i}": list(range(8)) for i in range(KNOBS)}})
        start_s, history = _timed(lambda: campaign_history(store, campaign, problem, space, False), rounds)

        def window() -> list[Any]:
            with store.transaction() as connection:
                return list(connection.exec_driver_sql(WINDOW))

        window_s, rows = _timed(window, max(1, rounds // 3))
    return {
        "commit": _commit(),
        "postgresql": server,
        "measurements": counted,
        "sources": sources,
        "sources_of_kind": len(found),
        "runs_returned": sum(len(s.runs) for s in found),
        "fill_s": round(fill_s, 1),
        "query_ms": round(query_s * 1000, 2),
        "campaign_start_ms": round(start_s * 1000, 2),
        "transferred": len(history["configs"]) if history else 0,
        "window_ms": round(window_s * 1000, 2),
        "window_rows": len(rows),
        "rounds": rounds,
    }


@click.command("history")
@click.option(
    "--measurements", type=click.IntRange(1000), default=1_000_000, show_default=True, help="Measurements in all."
)
@click.option(
    "--sources", type=click.IntRange(20), default=1000, show_default=True, help="Problem-and-target pairs in all."
)
@click.option("--rounds", type=click.IntRange(1), default=9, show_default=True, help="Runs of each query (medians).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_history_command(measurements: int, sources: int, rounds: int, as_json: bool) -> None:
    """Time the history query a campaign makes at its start, on a PostgreSQL of 1,000,000 measurements.

    Beside it, in the same run: the same answer by a window function over every measurement of the kind. Uses
    FLEET_DATABASE_URL when it names PostgreSQL, else a private PostgreSQL started for the run.
    """
    import json

    result = run(measurements, sources, rounds)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"fleet {result['commit'] or '(not a git checkout)'} on PostgreSQL {result['postgresql']}")
    click.echo(
        f"database   {result['measurements']} measurements, {result['sources']} problem-and-target pairs "
        f"(filled in {result['fill_s']:.0f} s)"
    )
    click.echo(
        f"history    {result['query_ms']:.1f} ms: {result['sources_of_kind']} related pairs, "
        f"{result['runs_returned']} runs (median of {result['rounds']})"
    )
    click.echo(
        f"start      {result['campaign_start_ms']:.1f} ms with the ranking ({result['transferred']} configurations)"
    )
    click.echo(f"baseline   {result['window_ms']:.1f} ms: a window function over every measurement of the kind")
