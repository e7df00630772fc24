"""``fleet bench dashboard``: optuna-dashboard's study-list and trials calls on a campaign of 100,000 trials, over
Fleet's database (``fleet dashboard``'s read-only storage) and over an Optuna RDB storage that holds the same trials,
in one run on one private PostgreSQL server.

The campaign is a Kernel Tuner cache file of ``--trials`` configurations (two knobs, some failed), made up and
imported with ``fleet import kt``; the Optuna copy is made with ``fleet export optuna``'s writer. Each storage is
timed at two levels, each call ``--repeats`` times (the median is reported):

* the storage: ``get_all_studies()`` and ``get_all_trials(study)``, what the dashboard asks of it;
* the dashboard: ``GET /api/studies`` through optuna-dashboard's WSGI app and, with ``--api-trials``,
  ``GET /api/studies/<id>`` (a new app and storage: the app caches a study's trials for ten seconds), whose
  serialization of every trial by optuna-dashboard itself takes minutes at 100,000 trials on either storage.

A finished trial never changes, so Fleet's storage keeps what it built: ``get_all_trials`` is timed cold (a new
storage, every row read) and warm (what a dashboard that polls pays). The goal: the study list and a cold trials
call on Fleet's storage each under 2 s.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

GOAL_S = 2.0


def make_cache(path: Path, trials: int) -> None:
    """A Kernel Tuner cache file of ``trials`` configurations of knobs ``x`` and ``y``; one in twenty failed."""
    from fleet.interop.kerneltuner import KTRecord, KTResults, dumps_cache

    width = 1000
    xs, ys = list(range((trials + width - 1) // width)), list(range(width))
    records = []
    for n in range(trials):
        x, y = divmod(n, width)
        if n % 20 == 7:
            records.append(KTRecord({"x": x, "y": y}, None, "RuntimeFailedConfig", None, {"compile_time": 1.0}))
            continue
        value = 1.0 + ((x - 40) ** 2 + (y - 500) ** 2 / 100) / 1000
        extra = {"compile_time": 100.0 + y % 7, "benchmark_time": 10 * value, "GFLOP/s": 1000 / value}
        records.append(KTRecord({"x": x, "y": y}, value, None, [value] * 3, extra))
    results = KTResults(
        "NVIDIA H100 80GB HBM3", "bench_kernel", [4096], ["x", "y"], {"x": xs, "y": ys}, "time", records
    )
    path.write_text(dumps_cache(results))


def _median_s(call: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _get(storage: Any, path: str) -> dict[str, Any]:
    """``GET path`` from a new optuna-dashboard app over ``storage``, in this process."""
    from io import BytesIO
    from wsgiref.util import setup_testing_defaults

    from optuna_dashboard import wsgi

    app = wsgi(storage)
    environ: dict[str, Any] = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h, *_: status.append(s)))
    assert status[0].startswith("200"), f"{path}: {status[0]}"
    return json.loads(body)


def timings(make: Callable[[], Any], study_id: int, repeats: int, api_trials: bool) -> dict[str, float]:
    """Seconds of each call on a storage that ``make`` opens; see the module docstring. The first trials call on a
    new storage is timed alone (cold); the others are the median of ``repeats`` on one storage (warm)."""
    storage = make()
    _get(storage, "/api/studies")  # optuna-dashboard's own first-use costs (imports) are not the storage's
    figures: dict[str, float] = {}
    figures["trials_cold_s"], trials = _median_s(lambda: make().get_all_trials(study_id, deepcopy=False), 1)
    figures["trials"] = len(trials)
    figures["studies_s"], studies = _median_s(storage.get_all_studies, repeats)
    assert any(s._study_id == study_id for s in studies)
    storage.get_all_trials(study_id, deepcopy=False)
    figures["trials_warm_s"], _ = _median_s(lambda: storage.get_all_trials(study_id, deepcopy=False), repeats)
    figures["api_studies_s"], _ = _median_s(lambda: _get(storage, "/api/studies"), repeats)
    if api_trials:
        figures["api_trials_s"], _ = _median_s(lambda: _get(make(), f"/api/studies/{study_id}"), 1)
    return figures


def run(trials: int, repeats: int, api_trials: bool = False) -> dict[str, Any]:
    """Make the campaign, copy it into Optuna, time both; the figures as a dict."""
    import optuna

    from fleet.bench.servers import private_postgres
    from fleet.interop.optuna_export import add_trials
    from fleet.interop.optuna_storage import SHIFT, FleetStorage
    from fleet.interop.records import import_kt
    from fleet.store import Store

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="fleet-bench-dashboard-") as tmp:
        server = private_postgres(stack)
        store = Store(server.create_database(f"fleet{uuid.uuid4().hex[:8]}"))
        store.upgrade()
        stack.callback(store.close)
        cache = Path(tmp) / "bench.json"
        make_cache(cache, trials)
        start = time.perf_counter()
        done = import_kt(store, cache)
        import_s = time.perf_counter() - start
        campaign = store.campaign(done.campaign)
        fleet = FleetStorage(store)
        url = server.create_database(f"optuna{uuid.uuid4().hex[:8]}")
        study_id = campaign.id << SHIFT
        rdb = optuna.storages.RDBStorage(url)
        frozen = fleet.get_all_trials(study_id, deepcopy=False)
        start = time.perf_counter()
        copy = optuna.create_study(storage=rdb, study_name="bench", directions=fleet.get_study_directions(study_id))
        add_trials(rdb, copy, frozen)
        copy_s = time.perf_counter() - start
        figures: dict[str, Any] = {
            "trials": trials,
            "import_s": import_s,
            "optuna_copy_s": copy_s,
            "fleet": timings(lambda: FleetStorage(store), study_id, repeats, api_trials),
            "optuna_rdb": timings(lambda: optuna.storages.RDBStorage(url), copy._study_id, repeats, api_trials),
            "goal_s": GOAL_S,
        }
        mine = figures["fleet"]
        figures["goal_met"] = max(mine["studies_s"], mine["trials_cold_s"], mine["api_studies_s"]) < GOAL_S
        return figures


@click.command("dashboard")
@click.option("--trials", type=click.IntRange(1000), default=100_000, show_default=True, help="Trials in the campaign.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True, help="Times each call is timed.")
@click.option(
    "--api-trials",
    is_flag=True,
    help="Time GET /api/studies/<id> too: optuna-dashboard's own work on the trials (minutes at 100,000).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_dashboard_command(trials: int, repeats: int, api_trials: bool, as_json: bool) -> None:
    """optuna-dashboard's study-list and trials calls on a campaign of TRIALS trials: Fleet's database against an
    Optuna RDB storage of the same trials, on one private PostgreSQL (goal: Fleet's storage under 2 s a call)."""
    figures = run(trials, repeats, api_trials)
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    click.echo(
        f"{trials} trials: imported in {figures['import_s']:.1f} s, "
        f"copied to Optuna in {figures['optuna_copy_s']:.1f} s"
    )
    click.echo(f"{'call (median s)':<24}{'Fleet':>10}{'Optuna RDB':>12}")
    for key, label in (
        ("studies_s", "get_all_studies"),
        ("trials_cold_s", "get_all_trials, cold"),
        ("trials_warm_s", "get_all_trials, warm"),
        ("api_studies_s", "GET /api/studies"),
        ("api_trials_s", "GET /api/studies/<id>"),
    ):
        if key in figures["fleet"]:
            click.echo(f"{label:<24}{figures['fleet'][key]:>10.3f}{figures['optuna_rdb'][key]:>12.3f}")
    verdict = "met" if figures["goal_met"] else "MISSED"
    click.echo(f"goal (Fleet: study list and a cold trials call under {GOAL_S:g} s each): {verdict}")
