"""The ``fleet`` command line. Every user error ends in one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from fleet.bench.search import search_command
from fleet.bench.tvm import tvm_bench_command
from fleet.errors import BrokerError, FleetError, NotFound
from fleet.ops.call import call_command
from fleet.ops.flower import flower_command
from fleet.ops.logs import logs_command
from fleet.ops.queues import metrics_command
from fleet.ops.remote import exec_command
from fleet.report import report_command
from fleet.settings import Settings, get_settings, redact
from fleet.tuna.cli import register as register_tuna
from fleet.tvm.cli import run_model_command, tune_model_command, tvm_group


def _store(check: bool = True) -> Any:
    from fleet.store import Store

    store = Store(get_settings().database_url)
    if check:
        if get_settings().embedded_database:
            store.upgrade()
        store.check()
    return store


def _check_broker() -> None:
    from fleet.tasks import app

    settings = get_settings()
    if settings.embedded_broker or settings.broker_url.startswith("filesystem://"):
        return
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, interval_start=0.5, timeout=5)
    except Exception as error:  # kombu raises several kinds; all mean the same to the user
        raise BrokerError(f"broker {redact(settings.broker_url)} does not answer: {error}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="fleet-tune", prog_name="fleet")
@click.option("-v", "--verbose", is_flag=True, help="Log what Fleet does.")
def cli(verbose: bool) -> None:
    """Fleet: tune programs for hardware on a fleet of machines.

    With no FLEET_DATABASE_URL and FLEET_BROKER_URL set, Fleet runs embedded under ./.fleet/ and starts
    its own worker processes.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


# -- tune, resume ------------------------------------------------------------------------------------------


@cli.command()
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--name", help="Campaign name (default: the spec's name). The same name resumes the campaign.")
@click.option("--target", help="Target to tune for (default: the spec's, else this machine's CPU).")
@click.option(
    "--window", type=click.IntRange(1), help="Trials in flight at once (default: 2 per live evaluation worker)."
)
@click.option("--remeasure", is_flag=True, help="Measure configurations again even if measured before.")
@click.option("--budget", type=click.IntRange(1), help="Override the strategy's budget (trials per problem).")
@click.option("--local/--no-local", default=None, help="Start local workers (default: when running embedded).")
@click.option("--eval-procs", type=click.IntRange(1), default=1, show_default=True, help="Local evaluation workers.")
@click.option("--detach", is_flag=True, help="Submit and send every trial of a static strategy, then return.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def tune(
    spec: Path,
    name: str | None,
    target: str | None,
    window: int | None,
    remeasure: bool,
    local: bool | None,
    eval_procs: int,
    detach: bool,
    as_json: bool,
    budget: int | None,
) -> None:
    """Run the tuning campaign described by the JSON file SPEC and print the best configuration."""
    from fleet.campaign import load_spec, submit

    campaign_spec = load_spec(spec, name=name, target=target, budget=budget)
    if remeasure:
        campaign_spec.options["remeasure"] = True
    store = _store()
    _check_broker()
    campaign = submit(store, campaign_spec)
    _drive(store, campaign, window=window, local=local, eval_procs=eval_procs, detach=detach, as_json=as_json)


@cli.command()
@click.argument("campaign")
@click.option("--window", type=click.IntRange(1), help="Trials in flight at once.")
@click.option("--local/--no-local", default=None, help="Start local workers (default: when running embedded).")
@click.option("--eval-procs", type=click.IntRange(1), default=1, show_default=True, help="Local evaluation workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def resume(campaign: str, window: int | None, local: bool | None, eval_procs: int, as_json: bool) -> None:
    """Go on with CAMPAIGN (name or id) after its driver stopped: nothing measured is measured again."""
    store = _store()
    _check_broker()
    _drive(
        store,
        store.campaign(campaign),
        window=window,
        local=local,
        eval_procs=eval_procs,
        detach=False,
        as_json=as_json,
    )


def _drive(
    store: Any, campaign: Any, *, window: int | None, local: bool | None, eval_procs: int, detach: bool, as_json: bool
) -> None:
    from contextlib import nullcontext

    from fleet.api import driver
    from fleet.local import LocalFleet

    settings = get_settings()
    local = settings.embedded if local is None else local
    fleet = LocalFleet(settings, campaign.target, eval_procs=eval_procs) if local and not detach else nullcontext()
    with fleet:
        bar = _ProgressBar(campaign.name, quiet=as_json)
        run = driver(store, campaign, window=1 << 30 if detach else window, on_progress=bar.update, on_warning=bar.warn)
        if detach:
            run.submit_all()
            click.echo(f"campaign {campaign.name} (id {campaign.id}): {len(run.in_flight)} trials sent")
            return
        summaries = run.run()
        bar.close()
    _print_summaries(store, campaign, summaries, as_json)


class _ProgressBar:
    """A bar with counts, rate and the best so far, on stderr."""

    def __init__(self, name: str, quiet: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc=name, unit="trial", file=sys.stderr, disable=quiet, dynamic_ncols=True)

    def update(self, done: int, total: int | None, best: Any) -> None:
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.n = done
        if best is not None and best.objective is not None:
            self.bar.set_postfix_str(f"best {best.objective:.4g}", refresh=False)
        self.bar.refresh()

    def warn(self, line: str) -> None:
        self.bar.write(f"fleet: warning: {line}", file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def _format_config(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def _print_summaries(store: Any, campaign: Any, summaries: list[Any], as_json: bool) -> None:
    from fleet.workers.workloads import load_workload

    workload = load_workload(campaign.workload)
    unit = workload.objective_name
    rows = []
    for s in summaries:
        problem = store.problem(s.problem_id)
        rows.append(
            {
                "problem": {"id": problem.id, "kind": problem.kind, "params": problem.params},
                "trials": s.counts,
                "best": None
                if s.best is None
                else {
                    "config": s.best.config,
                    unit: s.best.objective,
                    "trial": s.best.trial_id,
                    "metrics": s.best.metrics,
                },
                "baseline": None if s.baseline is None else {"config": s.baseline.config, unit: s.baseline.objective},
                "speedup": s.speedup,
            }
        )
    if as_json:
        click.echo(json.dumps({"campaign": campaign.name, "target": campaign.target, "problems": rows}, indent=2))
        return
    for row in rows:
        problem = row["problem"]
        params = _format_config(problem["params"])
        counts = ", ".join(f"{n} {state}" for state, n in sorted(row["trials"].items()))
        click.echo(f"\n{problem['kind']} {params}".rstrip() + f" on {campaign.target}: {counts}")
        if row["best"] is None:
            click.echo("  no valid measurement")
            continue
        click.echo(f"  best      {_format_config(row['best']['config'])}")
        click.echo(f"  {unit:<9} {row['best'][unit]:.4g}")
        if row["baseline"] is not None:
            click.echo(f"  baseline  {_format_config(row['baseline']['config'])}: {row['baseline'][unit]:.4g} {unit}")
        if row["speedup"] is not None:
            click.echo(f"  speedup   {row['speedup']:.2f}x over the baseline")


# -- status, best ----------------------------------------------------------------------------------------


@cli.command()
@click.argument("campaign", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(campaign: str | None, as_json: bool) -> None:
    """Show campaigns and their trials, or one CAMPAIGN in detail, and the workers listening."""
    from fleet.campaign import summarize

    store = _store()
    settings = get_settings()
    live = store.workers(within=3 * settings.heartbeat_seconds + 5)
    campaigns = [store.campaign(campaign)] if campaign else store.campaigns()
    report = []
    for c in campaigns:
        counts = store.trial_counts(c.id)
        waiting = sum(counts.get(s, 0) for s in ("new", "compiling", "compiled", "evaluating"))
        listening = [w.name for w in live if w.target == c.target]
        entry: dict[str, Any] = {
            "id": c.id,
            "name": c.name,
            "target": c.target,
            "status": c.status,
            "strategy": c.strategy,
            "trials": counts,
            "workers": listening,
        }
        if waiting and not any(w.role == "eval" for w in live if w.target == c.target):
            entry["warning"] = f"no worker is listening on eval.{c.target}: {waiting} trials wait"
        if campaign:
            entry["best"] = [
                {"problem": s.problem_id, "config": s.best.config, "objective": s.best.objective}
                for s in summarize(store, c)
                if s.best is not None
            ]
            errored = store.trials(c.id, ["errored"])
            reasons: dict[str, int] = {}
            for t in errored:
                reasons[t.reason or "?"] = reasons.get(t.reason or "?", 0) + 1
            entry["errors"] = reasons
        chains = store.chains(c.id)
        if chains:
            entry["chains"] = [
                {
                    "problem": ch.problem_id,
                    "chain": ch.index,
                    "step": ch.step,
                    "steps": ch.steps,
                    "state": ch.state,
                    "best": ch.best_objective,
                }
                for ch in chains
            ]
        report.append(entry)
    workers = [
        {
            "name": w.name,
            "role": w.role,
            "target": w.target,
            "gpu": w.gpu,
            "heartbeat": w.heartbeat_at.isoformat(timespec="seconds"),
        }
        for w in live
    ]
    from fleet.ops.queues import format_queues, queue_health

    try:
        health = queue_health(store)
        queues: list[dict[str, Any]] | None = [q.to_dict() for q in health]
        queue_lines = list(format_queues(health))
    except FleetError as error:  # the broker does not answer: say so, and show the rest
        queues, queue_lines = None, [f"queues: {error}"]
    if as_json:
        click.echo(json.dumps({"campaigns": report, "workers": workers, "queues": queues}, indent=2))
        return
    if not report:
        click.echo("no campaigns")
    for entry in report:
        counts = "  ".join(f"{state} {n}" for state, n in sorted(entry["trials"].items())) or "no trials"
        click.echo(f"{entry['id']:>4}  {entry['name']:<24} {entry['target']:<14} {entry['status']:<8} {counts}")
        if "warning" in entry:
            click.echo(f"      warning: {entry['warning']}")
        for best in entry.get("best", []):
            click.echo(
                f"      best of problem {best['problem']}: {best['objective']:.4g}  {_format_config(best['config'])}"
            )
        for reason, n in sorted(entry.get("errors", {}).items(), key=lambda kv: -kv[1])[:10]:
            click.echo(f"      errored x{n}: {reason}")
        for ch in entry.get("chains", []):
            best = "-" if ch["best"] is None else f"{ch['best']:.4g}"
            click.echo(
                f"      chain {ch['chain']} of problem {ch['problem']}: step {ch['step']}/{ch['steps']}, "
                f"{ch['state']}, best {best}"
            )
    click.echo(f"\nworkers listening: {len(workers)}")
    for w in workers:
        click.echo(f"  {w['name']:<36} {w['role']:<6} {w['target']:<14} {w['gpu'] or ''}")
    click.echo("")
    for line in queue_lines:
        click.echo(line)


@cli.command()
@click.argument("problem")
@click.option("--target", "-t", required=True, help="The target, e.g. sm_90, gfx90a:104, cpu-x86_64.")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Pick the problem of that kind with K=V.")
@click.option("-n", "limit", type=click.IntRange(1), default=1, show_default=True, help="How many to show.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def best(problem: str, target: str, params: tuple[str, ...], limit: int, as_json: bool) -> None:
    """The best known configuration of PROBLEM (an id, or a kind) on a target."""
    from fleet.campaign import check_target

    check_target(target)
    store = _store()
    found = _find_problem(store, problem, params)
    rows = store.best(found.id, target, limit)
    if not rows:
        raise NotFound(f"no valid measurement of problem {found.id} ({found.kind}) on {target}")
    out = [
        {
            "problem": found.id,
            "kind": found.kind,
            "params": found.params,
            "target": target,
            "config": config,
            m.objective_name: m.objective,
            "metrics": m.metrics,
            "samples": m.samples,
            "trial": m.trial_id,
            "node": m.node,
            "gpu": m.gpu,
            "worker": m.worker,
            "toolchain": m.toolchain,
            "measured_at": m.created_at.isoformat(timespec="seconds"),
        }
        for m, config in rows
    ]
    if as_json:
        click.echo(json.dumps(out if limit > 1 else out[0], indent=2))
        return
    for row, (m, config) in zip(out, rows, strict=True):
        click.echo(f"{m.objective_name} {m.objective:.4g}  {_format_config(config)}")
        click.echo(f"  trial {row['trial']} on {row['node']} ({row['worker']}), {row['measured_at']}; {m.toolchain}")


def _find_problem(store: Any, ref: str, params: tuple[str, ...]) -> Any:
    if ref.isdigit() and not params:
        return store.problem(int(ref))
    wanted: dict[str, Any] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--param")
        try:
            wanted[key] = json.loads(value)
        except json.JSONDecodeError:
            wanted[key] = value
    problems = store.find_problems(kind=ref, params=wanted)
    if not problems:
        raise NotFound(f"no problem {ref!r}" + (f" with {wanted}" if wanted else ""))
    if len(problems) > 1:
        choices = "; ".join(f"{p.id}: {_format_config(p.params)}" for p in problems[:5])
        raise FleetError(f"{len(problems)} problems of kind {ref!r}; give an id or --param K=V ({choices})")
    return problems[0]


# -- worker, up, db ---------------------------------------------------------------------------------------


@cli.command()
@click.option("--target", help="Target of this node (default: detected from its GPUs, else its CPU).")
@click.option("--gpus", help="GPU indices to use, e.g. 0,1 (default: every detected GPU).")
@click.option(
    "--eval-procs",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Evaluation processes on a node with no GPU.",
)
@click.option("--build-procs", type=click.IntRange(1), help="Build concurrency (default: the node's cores).")
@click.option("--loglevel", default="INFO", show_default=True, help="Celery log level.")
@click.option(
    "--log-dir",
    type=click.Path(path_type=Path),
    help="Where each worker's log goes (default: FLEET_LOG_DIR, else $FLEET_HOME/logs); `fleet logs` reads it.",
)
@click.option("--dry-run", is_flag=True, help="Print the worker processes this node would start, and exit.")
@click.option(
    "--role",
    type=click.Choice(["all", "eval", "build"]),
    default="all",
    show_default=True,
    help="Start only the evaluation or the build processes (one systemd unit each).",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    envvar="FLEET_STOP_TIMEOUT",
    help="Seconds a stop waits for running measurements before killing them ($FLEET_STOP_TIMEOUT).",
)
def worker(
    target: str | None,
    gpus: str | None,
    eval_procs: int,
    build_procs: int | None,
    loglevel: str,
    log_dir: Path | None,
    dry_run: bool,
    role: str,
    stop_timeout: float,
) -> None:
    """Start this node's workers: one evaluation process per GPU, plus build processes."""
    from fleet.campaign import check_target
    from fleet.workers.launch import Launcher, command, node_gpus, plan

    if target:
        check_target(target)
    specs = plan(
        gpus=node_gpus(target, gpus),
        target=target,
        eval_procs=eval_procs,
        build_procs=build_procs,
        host=os.environ.get("FLEET_NODE_NAME") or None,  # the node's name where it was deployed (deploy/)
    )
    specs = [spec for spec in specs if role in ("all", spec.role)]
    if dry_run:
        for spec in specs:
            pinning = " ".join(f"{k}={v}" for k, v in spec.env.items() if k.endswith("VISIBLE_DEVICES"))
            click.echo(f"{spec.name}  {spec.queue}  -c {spec.concurrency}  {pinning}".rstrip())
            click.echo(f"  {' '.join(command(spec, loglevel))}")
        return
    _store().close()  # the database answers and is at the latest revision, or one line says why
    from fleet.ops.logs import log_dir as default_log_dir

    launcher = Launcher(specs, log_dir=log_dir or default_log_dir(), loglevel=loglevel, echo=True)
    _serve(launcher, stop_timeout)


def _serve(launcher: Any, stop_timeout: float = 60.0) -> None:
    def stop(signum: int, _frame: Any) -> None:
        launcher.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    launcher.start()
    try:
        launcher.supervise()
    finally:
        launcher.stop(timeout=stop_timeout)


@cli.command()
@click.option("--local", is_flag=True, required=True, help="Run embedded: a private broker and this machine's workers.")
@click.option("--target", help="Target of the local workers (default: this machine's).")
@click.option("--eval-procs", type=click.IntRange(1), default=1, show_default=True, help="Evaluation processes.")
def up(local: bool, target: str | None, eval_procs: int) -> None:
    """Start an embedded fleet in the foreground (Ctrl-C stops it); `fleet tune --no-local` then uses it."""
    import time

    from fleet.local import LocalFleet
    from fleet.workers.gpus import cpu_target

    settings = get_settings()
    fleet = LocalFleet(settings, target or cpu_target(), eval_procs=eval_procs)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with fleet:
        click.echo(
            f"fleet up: database {redact(settings.database_url)}, broker {redact(settings.broker_url)}; Ctrl-C stops it"
        )
        try:
            while not stopping:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


@cli.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration to the database (FLEET_DATABASE_URL)."""
    store = _store(check=False)
    revision = store.upgrade()
    click.echo(f"database {store.display_url} is at revision {revision}")


@db.command("revision")
def db_revision() -> None:
    """Print the database's schema revision and the latest one."""
    store = _store(check=False)
    click.echo(f"{store.revision() or 'none'} (latest {store.head()})")


@cli.group()
def export() -> None:
    """Export what campaigns did."""


@export.command("steps")
@click.argument("campaign")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="The CSV file to write.")
def export_steps(campaign: str, output: Path) -> None:
    """Every trial of CAMPAIGN (every step of its annealing chains) with its execution statistics, as CSV."""
    from fleet.export import steps_csv

    store = _store()
    found = store.campaign(campaign)
    partial = output.with_name(output.name + ".partial")
    with partial.open("w", newline="") as out:
        rows = steps_csv(store, found, out)
    partial.replace(output)  # all or nothing: a failure leaves no half-written file behind
    click.echo(f"{rows} steps of campaign {found.name} written to {output}")


@cli.group()
def bench() -> None:
    """Benchmarks, each against a baseline measured in the same run (`make bench` runs them all)."""


@bench.command("dispatch")
@click.option("--trials", type=click.IntRange(10), default=2000, show_default=True, help="Trials per side.")
@click.option(
    "--rounds", type=click.IntRange(1), default=5, show_default=True, help="Turns each side takes; medians are kept."
)
@click.option("--json", "as_json", is_flag=True, help="Print {fleet_trials_per_s, celery_trials_per_s, ratio}.")
def bench_dispatch(trials: int, rounds: int, as_json: bool) -> None:
    """Trials per second of a no-op workload through the whole fleet, against a bare Celery chain.

    The two take turns (chain first in odd rounds, fleet first in even ones) and the medians are reported.
    Uses FLEET_DATABASE_URL and FLEET_BROKER_URL when set, else a private PostgreSQL and Redis started for the run.
    """
    from fleet.bench.dispatch import run

    def progress(number: int, fleet: float, chain: float) -> None:
        click.echo(
            f"round {number}/{rounds}: fleet {fleet:.1f} trials/s, chain {chain:.1f}, ratio {fleet / chain:.3f}",
            err=True,
        )

    result = run(trials, rounds, on_round=progress)
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"fleet  {result['fleet_trials_per_s']:>8.1f} trials/s  (build + evaluate + all bookkeeping)")
    click.echo(f"celery {result['celery_trials_per_s']:>8.1f} trials/s  (bare two-task chain, same broker)")
    click.echo(f"ratio  {result['ratio']:>8.3f}")


cli.add_command(report_command, "report")
for _command in (call_command, logs_command, metrics_command, flower_command):
    cli.add_command(_command)
cli.add_command(exec_command)
bench.add_command(search_command, "search")
register_tuna(cli, export, bench)
for _command in (tune_model_command, run_model_command, tvm_group):
    cli.add_command(_command)
bench.add_command(tvm_bench_command, "tvm")


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns Fleet's errors into one line and an exit status."""
    from fleet.settings import reset_settings

    reset_settings()
    try:
        Settings.from_env()
        result = cli.main(args=argv, prog_name="fleet", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Abort:
        click.echo("fleet: interrupted", err=True)
        return 130
    except FleetError as error:
        click.echo(f"fleet: error: {error}", err=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
