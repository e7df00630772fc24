"""Trial commands: ``fleet trials`` lists a campaign's trials, ``fleet trial`` shows one whole."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import database_url, format_config, is_stdout, open_store, write_output
from fleet.cli.campaigns import find_campaign, glance_at_campaign
from fleet.diagnose import first_line
from fleet.errors import FleetError, NotFound
from fleet.labels import short_labels
from fleet.states import FAILED, TRIAL_STATES

TAIL_LINES = 20


def _objective(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _from_history(history: dict[str, Any] | None) -> str:
    """A trial's mark in the table when it was proposed from history: `` (history #3)``, its rank there."""
    return "" if not history else f" (history #{history.get('rank', '?')})"


@click.command("trials")
@click.argument("campaign")
@click.option(
    "--state",
    "states",
    multiple=True,
    metavar="STATE",
    help="Only trials in STATE (errored, invalid, evaluated, new, ...); give it again for several.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: every trial with its whole reason.")
@click.option(
    "--csv",
    "as_csv",
    is_flag=True,
    help="Print the full table as CSV: every trial (every step of annealing chains), a column per knob, samples, "
    "times, worker, node, toolchain, device.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=Path("-"),
    help="With --csv: the file to write (default: standard output).",
)
def trials(campaign: str, states: tuple[str, ...], as_json: bool, as_csv: bool, output: Path) -> None:
    """A table of CAMPAIGN's trials: id, problem, state, objective, attempts, worker, configuration, reason.

    A trial proposed from what related problems found best says so after its configuration: (history #RANK).
    """
    unknown = [s for s in states if s not in TRIAL_STATES]
    if unknown:
        raise FleetError(f"unknown trial state {unknown[0]!r}: one of {', '.join(TRIAL_STATES)}")
    if as_csv and (as_json or states):
        raise click.UsageError("--csv is the full table: without --json or --state")
    if as_csv:
        from fleet.export import steps_csv

        store = open_store(read_only=True)
        found = find_campaign(store, campaign)
        rows = write_output(output, lambda out: steps_csv(store, found, out))
        where = "standard output" if is_stdout(output) else output
        click.echo(f"{rows} trials of campaign {found.name} written to {where}", err=is_stdout(output))
        return
    store, found = glance_at_campaign(campaign)  # the table: no SQLAlchemy to import where a glance reads it
    rows = store.trial_rows(found.id, states or None)
    if as_json:
        out = [
            {
                "id": r.id,
                "problem": r.problem_id,
                "kind": r.problem_kind,
                "config": r.config,
                "state": r.state,
                "objective": r.objective,
                **({"objectives": r.objectives} if r.objectives else {}),
                "reason": r.reason,
                "worker": r.worker,
                "attempts": r.attempts,
                "baseline": r.baseline,
                "reused_from": r.source_trial_id,
                "history": r.history,
            }
            for r in rows
        ]
        click.echo(json.dumps({"campaign": found.name, "trials": out}, indent=2))
        return
    if not rows:
        click.echo(f"campaign {found.name} has no trials" + (f" in {', '.join(states)}" if states else ""))
        return
    table = [("ID", "PROBLEM", "STATE", "OBJECTIVE", "ATTEMPTS", "WORKER", "CONFIG", "REASON")]
    # The parameters that tell the campaign's problems apart name them (n=1024), not their ids.
    labels = short_labels((p.id, p) for p in store.campaign_problems(found.id))
    for r in rows:
        reason = "" if r.reason is None and r.state not in FAILED else first_line(r.reason, r.state)
        config = format_config(r.config) + (" (baseline)" if r.baseline else "") + _from_history(r.history)
        table.append(
            (
                str(r.id),
                labels.get(r.problem_id, r.problem_kind),
                r.state,
                _objective(r.objective),
                str(r.attempts),
                r.worker or "-",
                config,
                reason,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        click.echo("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]).rstrip())


# -- one trial ---------------------------------------------------------------------------------------------


def _when(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(sep=" ", timespec="seconds")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def _tail(text: str | None, lines: int = TAIL_LINES) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


MEASUREMENT_FIELDS = (
    "objective_name",
    "objective",
    "maximize",
    "valid",
    "samples",
    "metrics",
    "objectives",
    "node",
    "gpu",
    "worker",
    "toolchain",
)
ARTIFACT_FIELDS = ("build_key", "state", "reason", "log_tail", "worker", "attempts", "build_seconds")


def _fields(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}


def trial_dict(detail: Any) -> dict[str, Any]:
    """Everything :meth:`Store.trial_detail` found about a trial, as plain values."""
    t, m, a = detail.trial, detail.measurement, detail.artifact
    # A reused trial ran nowhere itself: its output is its source's.
    ran = detail.source or t
    return {
        "id": t.id,
        "campaign": {"id": detail.campaign.id, "name": detail.campaign.name},
        "problem": {"id": detail.problem.id, "kind": detail.problem.kind, "params": detail.problem.params},
        "target": t.target,
        "config": t.config,
        "baseline": t.baseline,
        "history": t.history,
        "state": t.state,
        "reason": t.reason if t.reason is not None or detail.source is None else detail.source.reason,
        "reused_from": t.source_trial_id,
        "worker": ran.worker,
        "attempts": ran.attempts,
        "measurement": None
        if m is None
        else {"trial": m.trial_id, **_fields(m, MEASUREMENT_FIELDS), "measured_at": _when(m.created_at)},
        "stdout_tail": ran.stdout_tail,
        "stderr_tail": ran.stderr_tail,
        "artifact": None
        if a is None
        else {**_fields(a, ARTIFACT_FIELDS), "digest": a.blob_digest, "built_at": _when(a.built_at)},
        "times": {
            "created": _when(t.created_at),
            "queued": _when(t.queued_at),
            "started": _when(t.started_at),
            "finished": _when(t.finished_at),
            "waited_seconds": _seconds(t.created_at, t.started_at),
            "ran_seconds": _seconds(t.started_at, t.finished_at),
            # What its compile and its evaluation held workers' slots: ran counts the wait between the two too.
            "compiled_seconds": t.compile_seconds,
            "evaluated_seconds": t.eval_seconds,
            "total_seconds": _seconds(t.created_at, t.finished_at),
        },
    }


@click.command("trial")
@click.argument("trial_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, with the whole tails.")
def trial(trial_id: str, as_json: bool) -> None:
    """Everything about trial ID: its state and reason, samples, output, build log, artifact, worker and timings."""
    if not trial_id.isdigit():  # one line, as for an unknown id, not Click's usage text
        raise NotFound(f"no trial {trial_id!r}: a trial id is a number, as `fleet trials CAMPAIGN` lists them")
    store = open_store(read_only=True)
    try:
        detail = store.trial_detail(int(trial_id))
    except NotFound as error:
        raise NotFound(f"{error} in {database_url()}") from None
    out = trial_dict(detail)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    for line in _trial_lines(out):
        click.echo(line)


def _trial_lines(out: dict[str, Any]) -> list[str]:
    """``fleet trial`` as text: a field a line, then each tail under its own heading."""
    problem, campaign = out["problem"], out["campaign"]
    lines = [
        f"trial {out['id']} of campaign {campaign['name']} (id {campaign['id']})",
        f"  problem   {problem['id']} {problem['kind']} {format_config(problem['params'])}".rstrip(),
        f"  target    {out['target']}",
        f"  config    {format_config(out['config'])}" + (" (baseline)" if out["baseline"] else ""),
        f"  state     {out['state']}",
    ]
    if out.get("history"):
        h = out["history"]
        lines.append(
            f"  history   proposed from history: rank {h.get('rank')} of what related problems found best "
            f"(score {h.get('score')}; from {'; '.join(h.get('sources') or []) or '-'})"
        )
    if out["reason"]:
        lines.append(f"  reason    {out['reason']}")
    if out["reused_from"] is not None:
        lines.append(f"  reused    the measurement of trial {out['reused_from']}")
    attempts = f"{out['attempts']} attempt" + ("" if out["attempts"] == 1 else "s")
    lines.append(f"  worker    {out['worker'] or '-'}, {attempts}")
    m = out["measurement"]
    if m is not None:
        validity = "valid" if m["valid"] else "NOT valid"
        lines.append(f"  {m['objective_name']:<9} {_objective(m['objective'])} ({validity})")
        if m["objectives"]:
            lines.append(f"  objectives {format_config(m['objectives'])}")
        lines.append(f"  samples   {', '.join(f'{v:.4g}' for v in m['samples']) or '-'}")
        if m["metrics"]:
            lines.append(f"  metrics   {format_config(m['metrics'])}")
        # An imported measurement has no node: its toolchain says which file it came from.
        where = " ".join(part for part in ("on", m["node"], m["gpu"]) if part) + " " if m["node"] else ""
        toolchain = f"; {m['toolchain']}" if m["toolchain"] else ""
        lines.append(f"  measured  {where}at {m['measured_at']}{toolchain}")
    a = out["artifact"]
    if a is not None:
        built = f"{a['build_seconds']:.1f} s" if a["build_seconds"] is not None else "-"
        lines.append(f"  artifact  {a['state']}, digest {a['digest'] or '-'}, built by {a['worker'] or '-'} in {built}")
        if a["reason"]:
            lines.append(f"  build     {a['reason']}")
    t = out["times"]
    lines.append(f"  created   {t['created']}, queued {t['queued'] or '-'}")
    lines.append(f"  started   {t['started'] or '-'} (waited {_duration(t['waited_seconds'])})")
    slots = "".join(
        f", its {step} {t[key]:.3f} s"
        for step, key in (("compile", "compiled_seconds"), ("evaluation", "evaluated_seconds"))
        if t[key] is not None
    )
    lines.append(f"  finished  {t['finished'] or '-'} (ran {_duration(t['ran_seconds'])}{slots})")
    for title, text in (
        ("stdout (tail)", out["stdout_tail"]),
        ("stderr (tail)", out["stderr_tail"]),
        ("build log (tail)", a and a["log_tail"]),
    ):
        if text and text.strip():
            lines.append(f"\n{title}:")
            lines.extend(f"  {line}" for line in _tail(text).splitlines())
    return lines


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


COMMANDS = (trials, trial)
