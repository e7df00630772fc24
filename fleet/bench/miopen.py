"""``fleet bench miopen``: import each of MIOpen's shipped databases, a find-db of real size, and look problems up
by MIOpen key.

First the four files of ``../shared/miopen`` (two find-dbs, two perf-dbs), each imported whole into its own
target: records per second, a record being a find-db line or a perf-db row of either table.

The find-db is made from the real keys of ``gfx803_36.HIP.fdb.txt`` (MIOpen's shipped find-db, in
``../shared/miopen``), varied in batch size until it holds ``--problems`` distinct keys, each with that
key's real entries. Both figures are taken on PostgreSQL: ``FLEET_DATABASE_URL`` when it names one, else a
private server started for the run. The baseline beside the import is a plain parse of the same file
(reading records and computing keys, no database), so the figure says what the database adds.
"""

from __future__ import annotations

import bz2
import json
import random
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "miopen"
SOURCE = SHARED / "gfx803_36.HIP.fdb.txt.bz2"
FILES = ("gfx803_36.HIP.fdb.txt.bz2", "gfx90a68.HIP.fdb.txt.bz2", "gfx900_56.db.bz2", "gfx1030_36.db.bz2")
BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def make_find_db(source: Path, problems: int, output: Path) -> int:
    """Write a find-db of ``problems`` distinct keys, varying the batch sizes of ``source``'s keys."""
    from fleet.errors import FleetError
    from fleet.miopen.keys import db_key, parse_key

    with bz2.open(source, "rt") as handle:
        lines = [line.rstrip("\n") for line in handle if "=" in line]
    seen: set[str] = set()
    written = 0
    with output.open("w") as out:
        for batch in (None, *BATCHES):
            for line in lines:
                if written >= problems:
                    return written
                key, _, entries = line.partition("=")
                if batch is not None:
                    try:
                        key = db_key({**parse_key(key), "batchsize": batch})
                    except FleetError:
                        continue
                if key in seen:
                    continue
                seen.add(key)
                out.write(f"{key}={entries}\n")
                written += 1
    return written


def _parse_only(path: Path) -> float:
    from fleet.canonical import digest
    from fleet.miopen.finddb import read_find_db
    from fleet.miopen.keys import parse_key

    start = time.perf_counter()
    for record in read_find_db(path):
        digest(parse_key(record.key))
    return time.perf_counter() - start


def _commit() -> str | None:
    """The git commit of the Fleet checkout that runs the bench (figures are quoted with it), when it is one."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def run(problems: int = 120_000, lookups: int = 1000, files: bool = True) -> dict[str, Any]:
    """Import the shipped files and a ``problems``-key find-db into PostgreSQL, time key lookups; return the figures."""

    from fleet.bench.servers import postgres_url
    from fleet.store import Store
    from fleet.tuna.databases import import_db
    from fleet.tuna.problems import problems_by_key

    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-miopen-")))
        store = Store(postgres_url(stack))
        stack.callback(store.close)
        store.upgrade()
        with store.transaction() as connection:
            server = str(connection.exec_driver_sql("SHOW server_version").scalar())
        shipped: list[dict[str, Any]] = []
        for name in FILES if files else ():
            start = time.perf_counter()
            imported = import_db(store, SHARED / name, f"gfx{uuid.uuid4().hex[:3]}:{len(shipped) + 1}")
            seconds = time.perf_counter() - start
            shipped.append(
                {
                    "file": name,
                    "records": imported.records,
                    "unmapped": len(imported.unmapped),
                    "import_s": round(seconds, 2),
                    "records_per_s": round(imported.records / seconds, 1),
                }
            )
        path = workdir / f"bench{uuid.uuid4().hex[:6]}_36.HIP.fdb.txt"
        count = make_find_db(SOURCE, problems, path)
        parse_s = _parse_only(path)
        start = time.perf_counter()
        done = import_db(store, path, f"gfx{uuid.uuid4().hex[:3]}:36")
        import_s = time.perf_counter() - start
        keys = [line.partition("=")[0] for line in path.read_text().splitlines()]
        sample = random.Random(1).sample(keys, min(lookups, len(keys)))
        times = []
        for key in sample:
            t0 = time.perf_counter()
            found = problems_by_key(store, key)
            times.append(time.perf_counter() - t0)
            if not found:
                raise RuntimeError(f"key {key} was imported but is not found")
    return {
        "commit": _commit(),
        "postgresql": server,
        "files": shipped,
        "problems": count,
        "imported_problems": done.problems,
        "import_s": round(import_s, 2),
        "import_problems_per_s": round(count / import_s, 1),
        "parse_only_s": round(parse_s, 2),
        "query_ms_median": round(statistics.median(times) * 1000, 3),
        "query_ms_p99": round(sorted(times)[int(0.99 * (len(times) - 1))] * 1000, 3),
        "lookups": len(times),
    }


@click.command("miopen")
@click.option("--problems", type=click.IntRange(100), default=120_000, show_default=True, help="Keys in the find-db.")
@click.option("--lookups", type=click.IntRange(1), default=1000, show_default=True, help="Key lookups to time.")
@click.option("--no-files", is_flag=True, help="Skip the four shipped files.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def bench_command(problems: int, lookups: int, no_files: bool, as_json: bool) -> None:
    """Import MIOpen's four shipped databases and a 120,000-problem find-db into PostgreSQL; time a query by key.

    Uses FLEET_DATABASE_URL when it names PostgreSQL, else a private PostgreSQL started for the run.
    """
    result = run(problems, lookups, files=not no_files)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"fleet {result['commit'] or '(not a git checkout)'} on PostgreSQL {result['postgresql']}")
    for item in result["files"]:
        click.echo(
            f"import   {item['file']:<28} {item['records']:>7} records in {item['import_s']:6.1f} s "
            f"({item['records_per_s']:.0f} records/s; {item['unmapped']} kept as records only)"
        )
    click.echo(
        f"import   {result['problems']} problems in {result['import_s']:.1f} s "
        f"({result['import_problems_per_s']:.0f}/s; parsing alone {result['parse_only_s']:.1f} s)"
    )
    click.echo(f"query    by key: median {result['query_ms_median']:.2f} ms, p99 {result['query_ms_p99']:.2f} ms")
