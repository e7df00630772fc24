"""Campaign commands: ``fleet tune``, ``resume``, ``status``, ``best``, ``report`` and ``export``."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import (
    ProgressBar,
    check_broker,
    database_url,
    format_config,
    glance_or_store,
    is_stdout,
    open_store,
    say_scope,
    write_output,
)
from fleet.cli._sections import WholeHelpGroup
from fleet.diagnose import ReasonCount, failure_reasons, no_valid_measurement
from fleet.errors import FleetError, NotFound
from fleet.fronts import WITHIN, Preference, campaign_fronts, check_preference, objective_values
from fleet.labels import problem_label, short_labels
from fleet.settings import get_settings
from fleet.states import TERMINAL, UNFINISHED, CampaignStatus, TrialState

OUTPUT_HELP = "- writes it to standard output."


def find_campaign(store: Any, ref: str) -> Any:
    """The campaign named (or numbered) ``ref``; not found, the error names the database that was searched."""
    try:
        return store.campaign(ref)
    except NotFound as error:
        raise NotFound(f"{error} in {database_url()}") from None


def glance_at_campaign(ref: str, fronts: bool = False, judged: bool = True) -> tuple[Any, Any]:
    """What a read command reads campaign ``ref`` with, and the campaign: a :class:`fleet.glance.Glance` (no
    SQLAlchemy to import: most of a small campaign's status) where it can summarize the campaign, else the store
    (where ``judged``, the command shows the best that the searcher accepts, a campaign whose best its searcher
    judges, :func:`fleet.driving.summary.judges`; with ``fronts``, one of several objectives too, whose fronts read
    every result through the store)."""
    from fleet.glance import Glance
    from fleet.spec.workloads import load_workload_spec

    store = glance_or_store()
    campaign = find_campaign(store, ref)
    several = fronts and len(load_workload_spec(campaign.workload).objectives) > 1
    if isinstance(store, Glance) and ((judged and _judges(campaign)) or several):  # searchers, fronts: the store
        store.close()
        store = open_store(read_only=True, named=True)
        campaign = find_campaign(store, ref)
    return store, campaign


def _judges(campaign: Any) -> bool:
    from fleet.driving.summary import judges  # the driver's summary, imported only for a command that judges

    return judges(campaign)


def note_missing_extras(strategy: dict[str, Any], workload: dict[str, Any] | None = None) -> None:
    """Say so when ``auto`` runs without its Optuna technique: it works, but searches less well. Not for a
    ``workload`` of several objectives: ``auto`` is then ``nsga2``, which needs no extra."""
    from fleet.extras import install_line, installed
    from fleet.spec.workloads import load_workload_spec

    chosen = strategy.get("options") or {}
    several = workload is not None and len(load_workload_spec(workload).objectives) > 1
    if strategy.get("name") == "auto" and "techniques" not in chosen and not several and not installed("optuna"):
        click.echo(
            f"fleet: note: strategy auto runs without its Optuna technique: {install_line('optuna')} adds it",
            err=True,
        )


# -- tune, resume ------------------------------------------------------------------------------------------


@click.command()
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
    from fleet.driving.campaign import load_spec, submit

    campaign_spec = load_spec(spec, name=name, target=target, budget=budget)
    if remeasure:
        campaign_spec.options["remeasure"] = True
    note_missing_extras(campaign_spec.strategy, campaign_spec.workload)
    store = open_store()
    check_broker()
    if remeasure:
        _refuse_remeasure_of_an_existing(store, campaign_spec.name)
    campaign = submit(store, campaign_spec)
    _drive(store, campaign, window=window, local=local, eval_procs=eval_procs, detach=detach, as_json=as_json)


def _refuse_remeasure_of_an_existing(store: Any, name: str) -> None:
    """``--remeasure`` with the name of a campaign that measured without it would resume it, measuring nothing
    again (its trials are recorded): one line says how to measure again, and nothing is written."""
    from fleet.errors import NotFound, SpecError

    try:
        existing = store.campaign(name)
    except NotFound:
        return
    if not existing.options.get("remeasure"):
        raise SpecError(
            f"campaign {name!r} exists and was not run with --remeasure: the same name resumes it and measures "
            f"nothing again; measure again in a new campaign: --name {name}-remeasured"
        )


@click.command()
@click.argument("campaign")
@click.option("--window", type=click.IntRange(1), help="Trials in flight at once.")
@click.option("--local/--no-local", default=None, help="Start local workers (default: when running embedded).")
@click.option("--eval-procs", type=click.IntRange(1), default=1, show_default=True, help="Local evaluation workers.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--force", is_flag=True, help="Resume a cancelled campaign too: its cancelled trials run again.")
def resume(campaign: str, window: int | None, local: bool | None, eval_procs: int, as_json: bool, force: bool) -> None:
    """Go on with CAMPAIGN (name or id) after a pause, or drive it here after its driver stopped.

    Nothing measured is measured again. A paused campaign that `fleet submit` handed to the fleet's drivers
    goes on there; any other is driven by this command until it ends, unless a live driver holds it. A
    cancelled campaign stays cancelled unless --force is given.
    """
    store = open_store(read_only=True)
    found = find_campaign(store, campaign)
    if found.status == CampaignStatus.CANCELLED:
        if not force:
            raise FleetError(
                f"campaign {found.name!r} was cancelled: `fleet resume --force {found.name}` runs its cancelled "
                "trials again"
            )
        found, reopened = store.reopen_campaign(found.id)
        click.echo(f"resuming cancelled campaign {found.name} (--force): {reopened} trials run again", err=True)
        drivers = store.workers(role="driver", within=get_settings().liveness_seconds)
        if found.submitted and drivers:
            return  # the fleet's drivers take it up again
    if found.status == CampaignStatus.PAUSED:
        found = store.resume_campaign(found.id)
        held = {} if found.submitted else live_drivers(store)
        holder = next((name for name, campaigns in held.items() if found.id in {c.id for c in campaigns}), None)
        if holder is not None:
            # The `fleet tune` (or other driver) that the pause held still runs: it goes on, this shell returns.
            click.echo(f"resumed campaign {found.name}: its driver {holder} goes on with it", err=True)
            return
        click.echo(f"resumed campaign {found.name}", err=as_json)
        if found.submitted:
            return
    check_broker()
    _drive(
        store,
        found,
        window=window,
        local=local,
        eval_procs=eval_procs,
        detach=False,
        as_json=as_json,
    )


def live_drivers(store: Any) -> dict[str, list[Any]]:
    """The campaigns each driver holds a lease on now, by driver name, on the database's clock."""
    store.sync_clock()
    return store.driven()


def _drive(
    store: Any, campaign: Any, *, window: int | None, local: bool | None, eval_procs: int, detach: bool, as_json: bool
) -> None:
    from contextlib import nullcontext

    from fleet.driving.drivers import driver
    from fleet.local import LocalFleet

    settings = get_settings()
    local = settings.embedded if local is None else local
    fleet = LocalFleet(settings, campaign.target, eval_procs=eval_procs) if local and not detach else nullcontext()
    with fleet:
        labels = short_labels((p.id, p) for p in store.campaign_problems(campaign.id))
        bar = ProgressBar(campaign.name, quiet=as_json, labels=labels)
        run = driver(
            store,
            campaign,
            window=1 << 30 if detach else window,
            on_progress=bar.update,
            on_warning=bar.warn,
            user_code=True,  # the user's own process: their space file's searcher may run here
        )
        if detach:
            run.submit_all()
            click.echo(f"campaign {campaign.name} (id {campaign.id}): {len(run.in_flight)} trials sent")
            return
        finished_before = _finished(store, campaign)
        summaries = run.run()
        bar.close()
    failure = no_valid_measurement(store, campaign, summaries)
    _print_summaries(store, campaign, summaries, as_json, failure)
    if not as_json and finished_before and _finished(store, campaign) == finished_before:
        click.echo(
            f"nothing new measured: every trial of campaign {campaign.name!r} was already recorded in "
            f"{database_url()} (--name NAME starts another campaign, --remeasure measures again)",
            err=True,
        )
    if failure is not None:
        # Exit 1: a run whose every trial failed (a wrong objective regex, a build that never works) is no success.
        raise failure
    if not as_json:
        _print_next(campaign, summaries)


def _print_next(campaign: Any, summaries: list[Any]) -> None:
    """Where the results are, and the commands that read them again."""
    name = shlex.quote(campaign.name)
    commands = [(f"fleet report {name}", "an HTML report: convergence, knob effects, best configurations")]
    if any(s.best is not None for s in summaries):
        commands.append((f"fleet best {name}", "the best configuration of each problem, one line each"))
    commands.append((f"fleet trials {name}", "every trial, its state and reason"))
    width = max(len(command) for command, _ in commands)
    click.echo(f"\nresults in {database_url()}; see them again with:")
    for command, what in commands:
        click.echo(f"  {command:<{width}}  {what}")


def _finished(store: Any, campaign: Any) -> int:
    """Trials of ``campaign`` in a terminal state: the same number after a run means it measured nothing."""
    return sum(n for state, n in store.trial_counts(campaign.id).items() if state in TERMINAL)


def count_trials(counts: dict[str, int], baselines: int) -> str:
    """Trials by state, the baselines apart: ``48 evaluated + 2 baselines``, so that a budget of 48 reads as 48."""
    text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if n) or "no trials"
    if baselines:
        text += f" + {baselines} baseline" + ("s" if baselines > 1 else "")
    return text


def _print_summaries(store: Any, campaign: Any, summaries: list[Any], as_json: bool, failure: Any = None) -> None:
    from fleet.spec.workloads import load_workload_spec

    workload = load_workload_spec(campaign.workload)
    unit = workload.objective_name
    several = len(workload.objectives) > 1
    fronts = {f.problem_id: f for f in campaign_fronts(store, campaign, workload.objectives)} if several else {}
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
        if several:
            rows[-1]["front"] = [
                {"config": p.config, "trial": p.trial_id, "objectives": objective_values(p, workload.objectives)}
                for p in fronts[s.problem_id].points
            ]
    if as_json:
        out = {"campaign": campaign.name, "target": campaign.target, "database": database_url(), "problems": rows}
        click.echo(json.dumps(out | {"failure": None if failure is None else failure.to_dict()}, indent=2))
        return
    tallies = store.tally(campaign.id, workload.maximize)
    for row in rows:
        problem = row["problem"]
        params = format_config(problem["params"])
        apart = tallies[problem["id"]].baselines if problem["id"] in tallies else {}
        searched = {state: n - apart.get(state, 0) for state, n in row["trials"].items()}
        counts = count_trials(searched, sum(apart.values()))
        click.echo(f"\n{problem['kind']} {params}".rstrip() + f" on {campaign.target}: {counts}")
        if row["best"] is None:
            click.echo("  no valid measurement")
            continue
        click.echo(f"  best      {format_config(row['best']['config'])}")
        click.echo(f"  {unit:<9} {row['best'][unit]:.4g}")
        if row["baseline"] is not None:
            click.echo(f"  baseline  {format_config(row['baseline']['config'])}: {row['baseline'][unit]:.4g} {unit}")
        elif apart:  # a baseline was asked for, and none of its runs was measured: say why there is no speedup
            ended = ", ".join(f"{n} {state}" for state, n in sorted(apart.items()) if n)
            name = shlex.quote(campaign.name)
            click.echo(f"  baseline  no valid measurement ({ended}): no speedup; fleet trials {name} says why")
        if row["speedup"] is not None:
            click.echo(f"  speedup   {row['speedup']:.2f}x over the baseline")
        if several:
            names = ", ".join(o.name for o in workload.objectives)
            click.echo(
                f"  front     {len(row['front'])} configurations none beats in every objective ({names}): "
                f"fleet best {shlex.quote(campaign.name)} shows them"
            )


# -- status, best ----------------------------------------------------------------------------------------


def _failed(store: Any, campaign: Any, tallies: Any = None, reasons: list[ReasonCount] | None = None) -> str | None:
    """Why a campaign that ended is a failure (a problem with no valid measurement), on one line; else None.

    Two queries whatever the campaign's size (an imported MIOpen database is a campaign of thousands of problems):
    its tally and its problems, not a summary with a baseline looked up per problem. ``tallies`` and ``reasons``:
    the campaign's tally and :func:`failure_reasons`, when the caller has read them already.
    """
    if tallies is None:
        tallies = store.tally(campaign.id, maximize=False, bests=False)  # counts alone: which way is better is moot
    problems = store.campaign_problems(campaign.id)

    # Evaluated is valid: a run that failed is errored or invalid. Not the tally's best, which needs an objective
    # that some valid results have none of (a perf-db's tuned parameters). The baseline's runs are not the search's.
    def evaluated(problem_id: int) -> int:
        tally = tallies.get(problem_id)
        if tally is None:
            return 0
        return tally.counts.get(TrialState.EVALUATED, 0) - tally.baselines.get(TrialState.EVALUATED, 0)

    empty = [p for p in problems if not evaluated(p.id)]
    if not empty:
        return None
    some = "" if len(empty) == len(problems) else f" for {len(empty)} of its {len(problems)} problems"
    if reasons is None:
        reasons = failure_reasons(store, campaign.id)
    if not reasons:
        return f"no valid measurement{some}: none of its trials finished"
    top = reasons[0]
    return f"no valid measurement{some}: {top.reason} (x{top.count}, e.g. fleet trial {top.trial_id})"


@click.command()
@click.argument("campaign", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(campaign: str | None, as_json: bool) -> None:
    """Show campaigns and their trials, or one CAMPAIGN in detail, and the workers listening."""
    if campaign:
        store, found = glance_at_campaign(campaign)
        campaigns = [found]
    else:
        store = glance_or_store()
        campaigns = store.campaigns()
    settings = get_settings()
    live = store.workers(within=settings.liveness_seconds)
    # One look at the leases for both views: a campaign's "driven by" and a driver's "drives" agree.
    driven = live_drivers(store)
    holders = {c.id: name for name, held in driven.items() for c in held}
    report = [_status_entry(store, c, live, holders, bool(campaign)) for c in campaigns]
    workers = [_worker_entry(w, driven) for w in live]
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
    click.echo(f"database: {database_url()}")
    if not report:
        click.echo("no campaigns")
    for entry in report:
        _print_status_entry(entry)
    _print_workers(workers)
    click.echo("")
    for line in queue_lines:
        click.echo(line)


def _status_entry(store: Any, c: Any, live: list[Any], holders: dict[int, str], detailed: bool) -> dict[str, Any]:
    """What ``fleet status`` says of campaign ``c``: its trials, workers and driver, why it failed, what waits; with
    ``detailed`` (one campaign asked for), its bests and errors too."""
    counts = store.trial_counts(c.id)
    waiting = sum(counts.get(s, 0) for s in UNFINISHED)
    listening = [w.name for w in live if w.target == c.target]
    entry: dict[str, Any] = {
        "id": c.id,
        "name": c.name,
        "target": c.target,
        "status": c.status,
        "strategy": c.strategy,
        "trials": counts,
        "workers": listening,
        "priority": c.priority,
        "submitted": c.submitted,
        "driver": holders.get(c.id),
    }
    if c.team:  # PostgreSQL's teams (issue 44): whose campaign it is
        entry["team"] = c.team
    if c.reason:
        entry["reason"] = c.reason
    summaries, tallies, reasons = _detail(store, c) if detailed else ([], None, None)
    if c.status == CampaignStatus.DONE:
        failed = _failed(store, c, tallies, reasons)
        if failed is not None:
            entry["status"], entry["reason"] = CampaignStatus.FAILED, failed
    if waiting and not any(w.role == "eval" for w in live if w.target == c.target):
        entry["warning"] = f"no worker is listening on eval.{c.target}: {waiting} trials wait"
    chains = store.chains(c.id)
    # A problem is named by its kind and parameters (the id says nothing to the user who wrote them).
    labels = {p.id: problem_label(p) for p in store.campaign_problems(c.id)} if detailed or chains else {}
    if detailed:
        entry.update(_bests_and_errors(summaries, reasons or [], labels))
    if chains:
        entry["chains"] = [
            {
                "problem": ch.problem_id,
                "label": labels.get(ch.problem_id),
                "chain": ch.index,
                "step": ch.step,
                "steps": ch.steps,
                "state": ch.state,
                "best": ch.best_objective,
            }
            for ch in chains
        ]
    return entry


def _detail(store: Any, c: Any) -> tuple[list[Any], Any, list[ReasonCount]]:
    """Campaign ``c``'s summaries, tally and failure reasons, each read once: its status's bests and errors, and
    whether it failed, all come from them."""
    from fleet.driving.summary import summarize  # not the driver and its searchers
    from fleet.spec.workloads import load_workload_spec

    tallies = store.tally(c.id, load_workload_spec(c.workload).maximize)
    return summarize(store, c, tallies=tallies), tallies, failure_reasons(store, c.id)


def _bests_and_errors(summaries: list[Any], reasons: list[ReasonCount], labels: dict[int, str]) -> dict[str, Any]:
    """One campaign's status in detail: each problem's best, and the reasons its trials failed for."""
    best = [
        {
            "problem": s.problem_id,
            "label": labels.get(s.problem_id),
            "config": s.best.config,
            "objective": s.best.objective,
        }
        for s in summaries
        if s.best is not None
    ]
    return {
        "best": best,
        "errors": {r.reason: r.count for r in reasons},
        "examples": {r.reason: r.trial_id for r in reasons},
    }


def _worker_entry(w: Any, driven: dict[str, list[Any]]) -> dict[str, Any]:
    """What ``fleet status`` says of a live worker (or driver)."""
    return {
        "name": w.name,
        "role": w.role,
        "target": w.target,
        "gpu": w.gpu,
        "heartbeat": w.heartbeat_at.isoformat(timespec="seconds"),
        **({"drives": [c.name for c in driven.get(w.name, [])]} if w.role == "driver" else {}),
        # An unhealthy node (a full disk, an unwritable cache, no sandbox) hands its work back until it heals.
        **({"fault": w.fault, "fault_since": w.fault_at.isoformat(timespec="seconds")} if w.fault else {}),
    }


def _print_status_entry(entry: dict[str, Any]) -> None:
    counts = "  ".join(f"{state} {n}" for state, n in sorted(entry["trials"].items())) or "no trials"
    click.echo(f"{entry['id']:>4}  {entry['name']:<24} {entry['target']:<14} {entry['status']:<9} {counts}")
    if "team" in entry:
        click.echo(f"      team {entry['team']}")
    if entry["driver"]:
        click.echo(f"      driven by {entry['driver']}, priority {entry['priority']:g}")
    if "reason" in entry:
        click.echo(f"      {entry['status']}: {entry['reason']}")
    if "warning" in entry:
        click.echo(f"      warning: {entry['warning']}")
    for best in entry.get("best", []):
        click.echo(f"      best of {best['label']}: {best['objective']:.4g}  {format_config(best['config'])}")
    for reason, n in list(entry.get("errors", {}).items())[:10]:
        click.echo(f"      failed x{n}: {reason}  (fleet trial {entry['examples'][reason]})")
    for ch in entry.get("chains", []):
        best = "-" if ch["best"] is None else f"{ch['best']:.4g}"
        click.echo(
            f"      chain {ch['chain']} of {ch['label']}: step {ch['step']}/{ch['steps']}, {ch['state']}, best {best}"
        )


def _print_workers(workers: list[dict[str, Any]]) -> None:
    # A driver is beside the workers in the list, not one of them: it takes campaigns, no trial.
    drivers = sum(1 for w in workers if w["role"] == "driver")
    counted = f"\nworkers listening: {len(workers) - drivers}"
    click.echo(counted + (f"; drivers: {drivers}" if drivers else ""))
    for w in workers:
        drives = f"drives {', '.join(w['drives']) or 'nothing'}" if "drives" in w else ""
        click.echo(f"  {w['name']:<36} {w['role']:<6} {w['target']:<14} {w['gpu'] or drives}".rstrip())
        if "fault" in w:
            click.echo(f"    unhealthy since {w['fault_since']}: {w['fault']} (its work goes to other workers)")


@click.command()
@click.argument("campaign", required=False)
@click.option("--kind", help="Instead of a campaign: the problem of this kind (--param picks one of several).")
@click.option("--problem", "problem_id", type=click.IntRange(1), help="Instead of a campaign: the problem of this id.")
@click.option(
    "--target",
    "-t",
    help="With --kind or --problem: the target, e.g. sm_90, cpu-x86_64 (default: the one it has results on; for a "
    "TVM operator with none, this machine's CPU).",
)
@click.option("--param", "params", multiple=True, metavar="K=V", help="With --kind: the problem with K=V.")
@click.option("-n", "limit", type=click.IntRange(1), default=1, show_default=True, help="How many to show.")
@click.option(
    "--prefer",
    metavar="OBJECTIVE",
    help="A campaign of several objectives: choose the point of the front with the best OBJECTIVE among those within "
    "--within % of the best first objective (default: the first objective's best).",
)
@click.option(
    "--within",
    type=click.FloatRange(0),
    default=WITHIN,
    show_default=True,
    help="With --prefer: how far, in percent, the first objective may be from its best.",
)
@click.option(
    "--from",
    "drawn_from",
    metavar="CAMPAIGN[,..]",
    help="With --kind or --problem: draw only on these campaigns' results, or 'all' for every campaign's (default: "
    "the one campaign that has results; several are refused, since any of them could decide the answer).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def best(
    campaign: str | None,
    kind: str | None,
    problem_id: int | None,
    target: str | None,
    params: tuple[str, ...],
    limit: int,
    prefer: str | None,
    within: float,
    drawn_from: str | None,
    as_json: bool,
) -> None:
    """The best configuration CAMPAIGN found, one line per problem (for several objectives, the Pareto front and
    the point a preference chooses); --kind or --problem: the best known of a problem among the campaigns --from
    names (for a TVM operator, its MetaSchedule records too), and which campaigns it drew on."""
    from fleet.targets import check_target
    from fleet.trust import best as trusted_best
    from fleet.trust import parse_from, resolve

    _refuse_best_options(campaign, kind, problem_id, target, params, limit, prefer, within, drawn_from)
    if campaign is not None:
        _best_of_campaign(campaign, as_json, None if prefer is None else Preference(prefer, within))
        return
    problem = str(problem_id) if kind is None else kind
    if target is not None:
        check_target(target)
    trusted = None if drawn_from is None else parse_from(drawn_from)
    store = open_store(read_only=True)
    resolve(store, trusted)
    found, tvm = _find_problem_or_tvm(store, problem, params, by_id=kind is None)
    if target is None:
        target = _target_of(store, found, tvm is not None)
    rows: list[tuple[Any, dict[str, Any], str]] = []
    if found is not None:
        # Which campaigns this answer may draw on is fleet.trust's rule: a hostile campaign's numbers stay its own.
        what = f"problem {found.id} ({found.kind}) on {target}"
        rows = trusted_best(store, found.id, target, trusted, limit, what=what)
    out = [_fleet_best(found, target, m, config, campaign) for m, config, campaign in rows]
    if tvm is not None:
        # A TVM operator's MetaSchedule records (fleet tvm tune-ms, import-ms) are among its bests, in GFLOPS too.
        from fleet.tvm.best import metaschedule_rows

        out += metaschedule_rows(store, tvm[0], tvm[1], target, limit)
        out = sorted(out, key=lambda row: -row["gflops"])[:limit]
    say_scope(store, trusted)
    if not out:
        what = f"problem {found.id} ({found.kind})" if found is not None else f"{tvm[0] if tvm else problem}"
        raise NotFound(f"no valid measurement of {what} on {target}")
    if as_json:
        click.echo(json.dumps(out if limit > 1 else out[0], indent=2))
        return
    for row in out:
        if row["source"] == "metaschedule":
            click.echo(f"gflops {row['gflops']:.4g}  metaschedule record {row['record']} ({row['steps']} trace steps)")
            where = f"trial {row['trial']} on {row['node']}" if row["trial"] else f"imported from {row['worker']}"
            click.echo(f"  {where} ({row['worker']}), {row['measured_at']}; {row['toolchain'] or 'tvm'}")
            continue
        name = rows[0][0].objective_name  # a fleet row: there are rows of Fleet's measurements
        click.echo(f"{name} {row[name]:.4g}  {format_config(row['config'])}")
        click.echo(f"  trial {row['trial']} of campaign {row['campaign']} {_measured_where(row)}")


def _refuse_best_options(
    campaign: str | None,
    kind: str | None,
    problem_id: int | None,
    target: str | None,
    params: tuple[str, ...],
    limit: int,
    prefer: str | None,
    within: float,
    drawn_from: str | None,
) -> None:
    """Refuse the options of ``fleet best`` that do not go together: a campaign's, or a problem's."""
    if sum(given is not None for given in (campaign, kind, problem_id)) != 1:
        raise click.UsageError("give a CAMPAIGN, or a problem with --kind KIND or --problem ID")
    if campaign is None and (prefer is not None or within != WITHIN):
        raise click.UsageError("--prefer and --within choose a point of a CAMPAIGN's front")
    if campaign is not None and (params or target or limit != 1 or drawn_from is not None):
        raise click.UsageError("--param, --target, --from and -n go with --kind or --problem, not with a CAMPAIGN")
    if params and kind is None:
        raise click.UsageError("--param goes with --kind")


def _fleet_best(problem: Any, target: str, m: Any, config: dict[str, Any], campaign: str) -> dict[str, Any]:
    """One of a problem's bests that Fleet measured (``m``, in ``campaign``), as ``fleet best`` shows it."""
    return {
        "problem": problem.id,
        "kind": problem.kind,
        "params": problem.params,
        "target": target,
        "source": "fleet",
        "campaign": campaign,
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


def _measured_where(row: dict[str, Any]) -> str:
    """Where and with what a best was measured; an imported one (no node) by what its toolchain says of its file."""
    if row["node"] is None:
        return f"{row['toolchain'] or 'imported'}, {row['measured_at']}"
    toolchain = f"; {row['toolchain']}" if row["toolchain"] else ""
    return f"on {row['node']} ({row['worker']}), {row['measured_at']}{toolchain}"


def _find_problem_or_tvm(
    store: Any, ref: str, params: tuple[str, ...], by_id: bool
) -> tuple[Any, tuple[str, dict[str, Any]] | None]:
    """The problem ``fleet best`` asks for, and for a TVM operator its (kind, params); a TVM operator that only
    MetaSchedule tuned has no problem of Fleet's (None)."""
    from fleet.tvm.operators import KINDS

    try:
        found = _find_problem(store, ref, params, by_id=by_id)
    except NotFound:
        if by_id or ref not in KINDS:
            raise
        return None, (ref, _wanted(params))
    return found, ((found.kind, dict(found.params)) if found.kind in KINDS else None)


def _target_of(store: Any, problem: Any, tvm: bool) -> str:
    """The target ``fleet best`` answers for when none is given: the one the problem has results on; for a TVM
    operator with none of Fleet's, this machine's CPU (its MetaSchedule records may be there)."""
    from fleet.targets import cpu_target

    try:
        if problem is None:
            raise NotFound("no problem")
        return _only_target(store, problem)
    except NotFound:
        if tvm:
            return cpu_target()
        raise


def _only_target(store: Any, problem: Any) -> str:
    """The one target ``problem`` has valid results on; none or several, one line says which to give."""
    from sqlalchemy import select

    from fleet.store import Measurement

    with store.session() as session:
        targets = sorted(
            session.scalars(
                select(Measurement.target)
                .where(
                    Measurement.problem_id == problem.id,
                    Measurement.valid.is_(True),
                    Measurement.objective.is_not(None),
                )
                .distinct()
            )
        )
    if not targets:
        raise NotFound(f"no valid measurement of problem {problem.id} ({problem.kind}) in {database_url()}")
    if len(targets) > 1:
        raise FleetError(
            f"problem {problem.id} ({problem.kind}) has results on {len(targets)} targets ({', '.join(targets)}); "
            "give one with --target"
        )
    return targets[0]


def _best_of_campaign(name: str, as_json: bool, preference: Preference | None) -> None:
    """One line per problem of campaign ``name``: its best run (the one its searcher accepts), or why none; for a
    campaign of several objectives, its front (:func:`_front_of_campaign`)."""
    store, campaign = glance_at_campaign(name, fronts=True)  # first: a folder with no database is said at once
    from fleet.driving.summary import summarize
    from fleet.spec.workloads import load_workload_spec

    objectives = load_workload_spec(campaign.workload).objectives
    if len(objectives) > 1:
        _front_of_campaign(store, campaign, objectives, as_json, preference)
        return
    if preference is not None:
        check_preference(preference, objectives)
    unit = objectives[0].name
    rows = []
    for summary in summarize(store, campaign):
        problem = store.problem(summary.problem_id)
        found = summary.best
        rows.append(
            {
                "problem": problem.id,
                "kind": problem.kind,
                "params": problem.params,
                "target": campaign.target,
                "config": None if found is None else found.config,
                unit: None if found is None else found.objective,
                "trial": None if found is None else found.trial_id,
                "speedup": summary.speedup,
            }
        )
    if as_json:
        click.echo(json.dumps({"campaign": campaign.name, "problems": rows}, indent=2))
        return
    for row in rows:
        head = f"{row['kind']} {format_config(row['params'])}".rstrip()
        if row["config"] is None:
            click.echo(f"{head}: no valid measurement (fleet trials {shlex.quote(campaign.name)} says why)")
            continue
        speedup = "" if row["speedup"] is None else f", {row['speedup']:.2f}x the baseline"
        click.echo(f"{head}: {unit} {row[unit]:.4g}  {format_config(row['config'])}  (trial {row['trial']}{speedup})")
    if rows and all(row["config"] is None for row in rows):
        raise click.exceptions.Exit(1)


def _front_of_campaign(
    store: Any, campaign: Any, objectives: list[Any], as_json: bool, preference: Preference | None
) -> None:
    """Per problem of a campaign of several objectives: its Pareto front, a table with every objective, and the
    point ``preference`` chooses (by default the first objective's best)."""
    preference = preference or Preference(objectives[0].name)
    check_preference(preference, objectives)
    names = [o.name for o in objectives]
    problems = []
    for found in campaign_fronts(store, campaign, objectives, preference):
        problem = store.problem(found.problem_id)
        points = [
            {
                "trial": p.trial_id,
                "config": p.config,
                "objectives": objective_values(p, objectives),
                "chosen": p is found.chosen,
            }
            for p in found.points
        ]
        problems.append({"problem": problem.id, "kind": problem.kind, "params": problem.params, "front": points})
    said = preference.describe(objectives)
    if as_json:
        goals = [{"name": o.name, "goal": "max" if o.maximize else "min"} for o in objectives]
        shown = {"campaign": campaign.name, "objectives": goals, "preference": said, "problems": problems}
        click.echo(json.dumps(shown, indent=2))
        return
    for entry in problems:
        head = f"{entry['kind']} {format_config(entry['params'])}".rstrip()
        if not entry["front"]:
            click.echo(f"{head}: no valid measurement (fleet trials {shlex.quote(campaign.name)} says why)")
            continue
        click.echo(f"{head}: Pareto front of {len(entry['front'])} ({', '.join(names)}); * the {said}")
        width = max(len(n) for n in names)
        click.echo("    " + "  ".join(f"{n:>{max(width, 10)}}" for n in names) + "   trial  configuration")
        for point in entry["front"]:
            cells = "  ".join(f"{point['objectives'].get(n, math.nan):>{max(width, 10)}.4g}" for n in names)
            mark = "*" if point["chosen"] else " "
            click.echo(f"  {mark} {cells}  {point['trial']:>6}  {format_config(point['config'])}")
    if problems and all(not entry["front"] for entry in problems):
        raise click.exceptions.Exit(1)


def _wanted(params: tuple[str, ...]) -> dict[str, Any]:
    """``--param K=V`` options as a dict, each value read as JSON where it is JSON."""
    wanted: dict[str, Any] = {}
    for item in params:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--param")
        try:
            wanted[key] = json.loads(value)
        except json.JSONDecodeError:
            wanted[key] = value
    return wanted


def _find_problem(store: Any, ref: str, params: tuple[str, ...], by_id: bool = False) -> Any:
    if by_id:
        return store.problem(int(ref))
    wanted = _wanted(params)
    problems = store.find_problems(kind=ref, params=wanted)
    if not problems:
        raise NotFound(f"no problem {ref!r}" + (f" with {wanted}" if wanted else "") + f" in {database_url()}")
    if len(problems) > 1:
        choices = "; ".join(f"{p.id}: {format_config(p.params)}" for p in problems[:5])
        raise FleetError(f"{len(problems)} problems of kind {ref!r}; give --problem ID or --param K=V ({choices})")
    return problems[0]


# -- report, export --------------------------------------------------------------------------------------


@click.command("report")
@click.argument("campaign")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=Path("report.html"),
    show_default=True,
    help=f"Where to write the page; {OUTPUT_HELP}",
)
def report(campaign: str, output: Path) -> None:
    """Write a self-contained HTML report of CAMPAIGN (name or id): convergence, knob effects, best configs, and
    every trial in a table to sort and filter."""
    # The page's best is the best measurement, not one a searcher judges: a glance reads any campaign of one objective.
    store, found = glance_at_campaign(campaign, fronts=True, judged=False)
    from fleet.report import render  # after the store: a folder with no database is said without the report's modules

    try:
        page = render(store, found)
    finally:
        store.close()
    write_output(output, lambda out: out.write(page))
    if not is_stdout(output):
        click.echo(f"wrote the report of campaign {found.name} to {output.resolve()}")


@click.group(cls=WholeHelpGroup)
def export() -> None:
    """Export what campaigns did, for other tools (`fleet trials CAMPAIGN --csv` is the full table)."""


@export.command("steps", hidden=True)
@click.argument("campaign")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    required=True,
    help=f"The CSV file to write; {OUTPUT_HELP}",
)
def export_steps(campaign: str, output: Path) -> None:
    """Old name of `fleet trials CAMPAIGN --csv -o FILE`, kept for one release."""
    click.echo(
        "fleet: note: `fleet export steps` is now `fleet trials CAMPAIGN --csv`; the old name goes in the next release",
        err=True,
    )
    from fleet.export import steps_csv

    store = open_store(read_only=True)
    found = find_campaign(store, campaign)
    rows = write_output(output, lambda out: steps_csv(store, found, out))
    message = f"{rows} steps of campaign {found.name} written to {'standard output' if is_stdout(output) else output}"
    click.echo(message, err=is_stdout(output))


# -- validate --------------------------------------------------------------------------------------------

COUNT_UP_TO = 200_000
"""Configurations ``fleet validate`` checks one by one against the constraints; a larger space is sampled."""
SAMPLE = 2048
"""Configurations ``fleet validate`` samples of a larger space."""


@click.command("validate")
@click.argument("spec", type=click.Path(path_type=Path))
@click.option("--target", help="Target to check for (default: the spec's, else this machine's CPU).")
def validate(spec: Path, target: str | None) -> None:
    """Check the spec SPEC and print what `fleet tune` would run: problems, knobs, space, strategy, budget.

    Nothing is written and no database is opened; an invalid spec is one line on stderr and exit 1.
    """
    from fleet.driving.campaign import load_spec
    from fleet.spec.workloads import load_workload_spec

    campaign = load_spec(spec, target=target)
    workload = load_workload_spec(campaign.workload)
    space = campaign.space
    goals = ", ".join(f"{o.name} ({'max' if o.maximize else 'min'})" for o in workload.objectives)
    several = len(workload.objectives) > 1
    click.echo(f"{spec}: valid")
    click.echo(f"  campaign  {campaign.name} on {campaign.target}")
    click.echo(f"  workload  {campaign.workload.get('kind')}, objective{'s' if several else ''} {goals}")
    for problem in campaign.problems:
        click.echo(f"  problem   {problem.kind} {format_config(problem.params)}".rstrip())
    for knob in space.knobs:
        values = ", ".join(format_config({"": v})[1:] for v in knob.values[:8])
        more = f", ... ({len(knob.values)} values)" if len(knob.values) > 8 else ""
        click.echo(f"  knob      {knob.name} ({'build' if knob.build else 'run'}): {values}{more}")
    line, valid, exact = _space_line(space)
    click.echo(f"  space     {line}")
    for what, argv in _commands(campaign, space):
        click.echo(f"  {what:<9} {shlex.join(argv)}")
    strategy = campaign.strategy
    budget = strategy.get("budget")
    per = "every valid configuration" if budget is None else f"{budget} trials"
    name = strategy.get("name")
    chosen = f"{name} (nsga2 for several objectives)" if several and name == "auto" else name
    click.echo(f"  strategy  {chosen}, {per} per problem")
    if campaign.baseline is not None:
        click.echo(f"  baseline  {format_config(campaign.baseline)}, measured once per problem besides")
    count = len(campaign.problems)
    # A budget past the valid configurations spends them all, as does a strategy with none (grid).
    per_problem = valid if budget is None else min(budget, valid)
    about = "" if exact or per_problem == budget else "about "  # a budget within an estimate is spent whole
    total = f"{about}{per_problem * count}"
    baselines = f" (+ {count} baseline{'s' if count > 1 else ''})" if campaign.baseline is not None else ""
    click.echo(f"  trials    {total} in all{baselines}")


def _space_line(space: Any) -> tuple[str, int, bool]:
    """The space's size and how many configurations its constraints leave, said in a line; that number, and
    whether it was counted (a larger space's is estimated from a sample)."""
    size = space.size
    if not space.constraints and space.predicate is None:
        return f"{size} configurations", size, True
    if size <= COUNT_UP_TO:
        valid = sum(space.is_valid(space.decode(i)) for i in range(size))
        return f"{size} configurations, {valid} of them valid under the constraints", valid, True
    sample = space.sample(SAMPLE)
    share = sum(space.is_valid(c) for c in sample) / len(sample)
    line = f"{size} configurations, about {share:.0%} of them valid under the constraints (from {len(sample)})"
    return line, round(size * share), False


def _commands(campaign: Any, space: Any) -> list[tuple[str, list[str]]]:
    """The build and run command lines of a command workload, as the first problem's first valid configuration
    fills them: what a worker will run, to read before it does."""
    workload = campaign.workload
    first = next(iter(space), None)
    if workload.get("kind") != "command" or first is None:
        return []
    from fleet.spec.workloads.command import fill

    values = {**campaign.problems[0].params, **first}
    return [(what, fill(workload[what], values)) for what in ("build", "run") if workload.get(what)]
