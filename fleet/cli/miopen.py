"""The Tuna workflow's commands, in the group ``fleet miopen``: ``import``, ``query``, ``jobs``, ``import-db``,
``golden`` and ``export find-db|perf-db|kernel-db``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import check_broker, open_store, say_scope
from fleet.cli._sections import WholeHelpGroup, old_name
from fleet.errors import NotFound, SpecError
from fleet.states import TrialState


def _store() -> Any:
    return open_store()


def _target(value: str) -> str:
    from fleet.targets import check_target

    return check_target(value)


# -- selection ---------------------------------------------------------------------------------------------

_FLAGS = (
    ("direction", "--direction", "F (forward), B (backward data) or W (backward weights); bnorm also I."),
    ("layout", "--layout", "Input layout, e.g. NCHW, NHWC."),
    ("precision", "--precision", "FP32, FP16 or BF16."),
    ("spatial_dim", "--spatial-dim", "2 or 3."),
    ("filter", "--filter", "Filter size, e.g. 3x3 (1x1x1 in 3-D)."),
    ("pad", "--pad", "Padding, e.g. 1x1."),
    ("stride", "--stride", "Strides, e.g. 2x2."),
    ("dilation", "--dilation", "Dilation, e.g. 1x1."),
    ("groups", "--groups", "Group count."),
    ("batch", "--batch", "Batch size."),
    ("channels_multiple_of", "--channels-multiple-of", "Keep problems whose in_channels % N == 0."),
)


def selection_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--tag``, ``--select`` and the parameter flags that select problems without SQL."""
    for name, flag, text in reversed(_FLAGS):
        function = click.option(flag, name, help=text)(function)
    function = click.option(
        "--select",
        "select_text",
        metavar="EXPR",
        help="A selection over the parameters, e.g. 'direction == \"F\" and in_channels % 8 == 0'.",
    )(function)
    return click.option("--tag", "tags", multiple=True, help="Problems with this tag (repeat: all of them).")(function)


def selection_of(select_text: str | None, flags: dict[str, Any]) -> str | None:
    """One selection text from ``--select`` and the flags (joined with ``and``), or None for everything."""
    given = {name: value for name, value in flags.items() if value is not None}
    parts = [f"({select_text})"] if select_text else []
    multiple = given.pop("channels_multiple_of", None)
    if multiple is not None:
        if not str(multiple).isdigit() or int(multiple) < 1:
            raise SpecError(f"--channels-multiple-of takes a positive integer, not {multiple!r}")
        parts.append(f"(in_channels % {int(multiple)} == 0)")
    if given:
        from fleet.miopen.select import selection_from_flags

        parts.append(f"({selection_from_flags(**given)})")
    return " and ".join(parts) or None


def _pop_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name, _, _ in _FLAGS}


def _selected(store: Any, tags: tuple[str, ...], selection: str | None) -> list[int]:
    from fleet.tuna.problems import select_problems

    return [pid for pid, _, _ in select_problems(store, tags=tags, selection=selection)]


# -- import, query -----------------------------------------------------------------------------------------


@click.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("-t", "--tag", "tags", multiple=True, help="Tag every problem of the file (repeatable).")
@click.option("-T", "--tag-only", is_flag=True, help="Only tag problems that exist already; create none.")
@click.option("-b", "--batch", "batches", type=click.IntRange(1), multiple=True, help="Batch size (repeatable).")
@click.option(
    "-c", "--command", type=click.Choice(["conv", "convfp16", "convbfp16"]), help="Replace each conv line's command."
)
@click.option("--mark-recurrent", is_flag=True, help="Tag the problems 'recurrent' too.")
@click.option("--strict", is_flag=True, help="Import nothing if any line cannot be read.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def import_command(
    file: Path,
    tags: tuple[str, ...],
    tag_only: bool,
    batches: tuple[int, ...],
    command: str | None,
    mark_recurrent: bool,
    strict: bool,
    as_json: bool,
) -> None:
    """Import MIOpenDriver command lines from FILE as problems (one per direction), and tag them.

    Logging preambles and flags that do not change the problem are tolerated; duplicates are found by the
    problem, not the text. A line that cannot be read is reported with its number; the rest is imported.
    """
    from fleet.files import read_text
    from fleet.tuna.problems import import_lines

    lines = read_text(file, errors="replace").splitlines()
    if tag_only and not tags and not mark_recurrent:
        raise SpecError("-T tags only: give the tag with -t")
    if strict:
        from fleet.miopen.driver import DriverLineError, parse_lines

        bad = [(n, e) for n, e in parse_lines(lines) if isinstance(e, DriverLineError)]
        if bad:
            raise SpecError(f"{file}:{bad[0][0]}: {bad[0][1]} ({len(bad)} unreadable lines; nothing imported)")
    store = _store()
    report = import_lines(
        store, lines, tags=tags, tag_only=tag_only, batches=batches, command=command, recurrent=mark_recurrent
    )
    summary = {
        "file": str(file),
        "lines": report.lines,
        "created": report.created,
        "known": report.known,
        "tagged": report.tagged,
        "not_found": report.missing,
        "unreadable": [{"line": n, "error": e} for n, e in report.unreadable],
    }
    for lineno, why in report.unreadable:
        click.echo(f"{file}:{lineno}: {why}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    tag_text = ", ".join([*tags, *(["recurrent"] if mark_recurrent else [])])
    click.echo(
        f"{file}: {report.created} created, {report.known} already known, "
        f"{report.tagged} tagged{' ' + tag_text if tag_text else ''}, {len(report.unreadable)} unreadable"
        + (f", {report.missing} not known (-T creates nothing)" if tag_only else "")
    )


@click.command("query", context_settings={"ignore_unknown_options": True})
@click.argument("line", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print JSON; the MIOpen keys are a list under 'keys'.")
def query_command(line: tuple[str, ...], as_json: bool) -> None:
    """Show the problem of LINE (a MIOpenDriver line, or a find-db / perf-db line or key): tags, trials, keys."""
    from fleet.tuna.problems import describe

    store = _store()
    found = describe(store, " ".join(line))
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for problem in found["problems"]:
        head = f"{problem['kind']} {problem['direction'] or problem['key']}"
        if problem["id"] is None:
            click.echo(f"{head}: not imported")
            if problem.get("note"):
                click.echo(f"  {problem['note']}")
            continue
        tags = ", ".join(problem["tags"]) or "no tags"
        click.echo(f"{head}: problem {problem['id']} ({tags})")
        if problem.get("note"):
            click.echo(f"  {problem['note']}")
        if not problem["trials"]:
            click.echo("  no trials")
        for t in problem["trials"]:
            best = t["best"] or {}
            result = ""
            if best.get("time_ms") is not None:
                result = f"  {best['time_ms']:.4g} ms"
                if best.get("solver"):
                    result += f" {best['solver']}"
            elif best.get("solvers"):
                result = "  " + ", ".join(f"{s}:{v}" for s, v in best["solvers"].items())
            why = f" ({t['why']})" if t["why"] else ""
            when = t["finished_at"] or t["started_at"] or t["created_at"]
            click.echo(
                f"  {t['target']:<12} {t['reason']:<24} {t['step'] or '-':<5} {t['state']}{why}{result}  [{when}]"
            )
    click.echo("keys:" if found["keys"] else "keys: none")
    for key in found["keys"]:
        click.echo(f"  {key}")


# -- jobs --------------------------------------------------------------------------------------------------


REMEASURE_HELP = (
    "Measure again where a measurement exists, build again what failed to build before (a node's MIOpen fixed), "
    "and run this reason's errored jobs again."
)


@click.group("jobs")
def jobs_group() -> None:
    """Tuna's jobs: trials of MIOpen problems on a target, grouped by reason."""


@jobs_group.command("add")
@click.option("--target", required=True, help="The target, e.g. gfx906:60, gfx90a:104, sm_90.")
@click.option("--reason", required=True, help="Why these jobs exist (a label; one campaign REASON@TARGET).")
@click.option(
    "--step",
    "steps",
    type=click.Choice(["perf", "find"]),
    multiple=True,
    help="perf (tune the solvers) and/or find (time every solver); default: find.",
)
@selection_options
@click.option("--no-send", is_flag=True, help="Write the jobs, send nothing (workers pick them up later).")
@click.option("--remeasure", is_flag=True, help=REMEASURE_HELP)
def jobs_add(
    target: str,
    reason: str,
    steps: tuple[str, ...],
    tags: tuple[str, ...],
    select_text: str | None,
    no_send: bool,
    remeasure: bool,
    **flags: Any,
) -> None:
    """Create jobs for the selected problems on a target, and send them to its workers."""
    from fleet.tuna.jobs import add_jobs

    _target(target)
    store = _store()
    selection = selection_of(select_text, _pop_flags(flags))
    problem_ids = _selected(store, tags, selection)
    if not problem_ids:
        raise NotFound("no problem matches the selection: import some with `fleet miopen import FILE -t TAG`")
    if not no_send:
        check_broker()
    added = add_jobs(store, reason, target, problem_ids, steps or ("find",), remeasure)
    sent = 0
    if added.work and not no_send:
        from fleet.tasks import send

        sent = send(added.work)
    click.echo(f"{_counted(added)}; {sent} sent to build.{target}")


def _counted(added: Any) -> str:
    again = f" ({added.again} run again)" if added.again else ""
    return f"{added.campaign.name}: {added.created} jobs created, {added.existing} already there{again}"


@jobs_group.command("copy")
@click.option("--from-reason", required=True, help="The reason whose jobs to copy.")
@click.option("--reason", required=True, help="The new reason.")
@click.option("--target", help="Only the jobs on this target.")
@click.option("--no-send", is_flag=True, help="Write the jobs, send nothing.")
@click.option("--remeasure", is_flag=True, help=REMEASURE_HELP)
def jobs_copy(from_reason: str, reason: str, target: str | None, no_send: bool, remeasure: bool) -> None:
    """Copy the jobs of one reason to another, as new jobs (invalid ones are left behind)."""
    from fleet.tuna.jobs import copy_jobs

    if target:
        _target(target)
    store = _store()
    if not no_send:
        check_broker()
    for added in copy_jobs(store, from_reason, reason, target, remeasure=remeasure):
        sent = 0
        if added.work and not no_send:
            from fleet.tasks import send

            sent = send(added.work)
        click.echo(f"{_counted(added)}; {sent} sent")


@jobs_group.command("invalidate")
@click.option("--reason", help="Jobs of this reason.")
@click.option("--target", help="Jobs on this target.")
@click.option("--step", "steps", type=click.Choice(["perf", "find"]), multiple=True, help="Only this step.")
@selection_options
def jobs_invalidate(
    reason: str | None,
    target: str | None,
    steps: tuple[str, ...],
    tags: tuple[str, ...],
    select_text: str | None,
    **flags: Any,
) -> None:
    """Mark jobs invalid: never run, never exported. Select by reason, target and/or problems."""
    from fleet.tuna.jobs import invalidate

    if target:
        _target(target)
    store = _store()
    selection = selection_of(select_text, _pop_flags(flags))
    problem_ids = _selected(store, tags, selection) if (tags or selection) else None
    changed = invalidate(store, reason=reason, target=target, problem_ids=problem_ids, steps=steps)
    click.echo(f"{changed} jobs invalidated")


@jobs_group.command("list")
@click.option("--reason", help="Jobs of this reason.")
@click.option("--target", help="Jobs on this target.")
@click.option(
    "--state",
    type=click.Choice([state.value for state in TrialState if state is not TrialState.CANCELLED]),
    help="Only jobs in this state.",
)
@selection_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def jobs_list(
    reason: str | None,
    target: str | None,
    state: str | None,
    tags: tuple[str, ...],
    select_text: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Jobs per reason, target and step, counted by state."""
    from fleet.tuna.jobs import list_jobs

    store = _store()
    selection = selection_of(select_text, _pop_flags(flags))
    problem_ids = _selected(store, tags, selection) if (tags or selection) else None
    rows = list_jobs(store, reason=reason, target=target, problem_ids=problem_ids, state=state)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no jobs")
    for row in rows:
        click.echo(f"{row['reason']:<24} {row['target']:<14} {row['total']} jobs")
        for step, counts in row["steps"].items():
            click.echo(f"  {step:<5} " + "  ".join(f"{s} {n}" for s, n in sorted(counts.items())))


# -- databases ---------------------------------------------------------------------------------------------


@click.command("import-db")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--target", required=True, help="The target the database was tuned for, e.g. gfx803:36.")
@click.option("-t", "--tag", "tags", multiple=True, help="Tag the database's problems.")
@click.option("--strict", is_flag=True, help="Import nothing, and fail, if any record maps to no driver problem.")
def import_db_command(file: Path, target: str, tags: tuple[str, ...], strict: bool) -> None:
    """Load a find-db text or perf-db SQLite file (.bz2 too) into Fleet as results on a target.

    Every record is kept. One that maps to no driver problem (a data type MIOpenDriver cannot run, a row no
    input gives) is kept as it is: exported unchanged, queryable by its key, never tuned; one warning line
    counts them.
    """
    from fleet.tuna.databases import import_db

    _target(target)
    if not file.is_file():
        raise NotFound(f"{file}: no such file")
    store = _store()
    done = import_db(store, file, target, tags=tags, strict=strict)
    if done.unmapped:
        click.echo(
            f"fleet: warning: {file}: {len(done.unmapped)} records map to no driver problem; kept as they are, "
            f"queryable by key, never tuned (first: {done.unmapped[0]})",
            err=True,
        )
    line_format = f" ({done.line_format} line format)" if done.line_format else ""
    click.echo(
        f"{file}: {done.format}{line_format}, {done.records} records, {done.problems} problems "
        f"({done.created} new, {len(done.unmapped)} kept as records only) as campaign {done.campaign}"
    )


def _export(kind: str) -> click.Command:
    @click.command(kind, help=f"Write the {kind} MIOpen reads, from results on a target.")
    @click.option("--target", required=True, help="The target, e.g. gfx906:60.")
    @click.option("--campaign", help="Only this campaign (a name, or a reason on the target).")
    @click.option(
        "--from",
        "drawn_from",
        metavar="CAMPAIGN[,..]",
        help="The best results of these campaigns on the target, or 'all' for every campaign's (default: the one "
        "campaign that has results; several are refused, since any of them could decide what MIOpen runs).",
    )
    @click.option("--golden", is_flag=True, help="From the golden set (the latest version unless --version).")
    @click.option("--version", type=click.IntRange(1), help="The golden version.")
    @click.option("--tag", "tags", multiple=True, help="Only problems with this tag.")
    @click.option("--select", "select_text", metavar="EXPR", help="Only problems matching this selection.")
    @click.option("-o", "--output", type=click.Path(path_type=Path), help="The file (default: MIOpen's name for it).")
    def command(
        target: str,
        campaign: str | None,
        drawn_from: str | None,
        golden: bool,
        version: int | None,
        tags: tuple[str, ...],
        select_text: str | None,
        output: Path | None,
        line_format: str | None = None,
    ) -> None:
        from fleet.trust import parse_from
        from fleet.tuna import databases

        _target(target)
        trusted = None if drawn_from is None else parse_from(drawn_from)
        what = databases.Selection(target, campaign, golden, version, tags, select_text, trusted)
        output = output or Path(default_name(kind, target))
        store = _store()
        say_scope(store, trusted)
        how = ""
        if kind == "find-db":
            done = databases.export_find_db(store, what, output, line_format)
            came = ", ".join(f"{n} {name}" for name, n in sorted(done.came_in.items()))
            how = f" in the {done.line_format} line format"
            if line_format is None and len(done.came_in) > 1:
                how += f" (the records came in both: {came}; --format older|newer chooses)"
        elif kind == "perf-db":
            done = databases.export_perf_db(store, what, output)
        else:
            done = databases.export_kernel_db(store, what, output)
        # Which campaigns the file drew on, said where its writer sees it (and in the sidecar).
        drew = f"; from {_campaigns_said(done.campaigns)}"
        click.echo(
            f"{done.records} records written to {output}{how}{drew} (provenance in {output.name}.provenance.json)"
        )

    if kind == "find-db":
        command = click.option(
            "--format",
            "line_format",
            type=click.Choice(["older", "newer"]),
            help="The line format: older (algorithm:solver,time,workspace,algorithm,<unused>) or newer "
            "(solver:time,workspace,algorithm). Default: the one the records came in.",
        )(command)
    return command


def _campaigns_said(names: list[str]) -> str:
    """``campaign a``, ``campaigns a, b``; a golden entry whose trial was deleted names none."""
    if not names:
        return "no campaign still stored"
    return ("campaign " if len(names) == 1 else "campaigns ") + ", ".join(names)


def default_name(kind: str, target: str) -> str:
    """MIOpen's own file name: ``gfx906_60.HIP.fdb.txt``, ``gfx906_60.db``, ``gfx906_60.kdb``."""
    stem = target.replace(":", "_")
    return {"find-db": f"{stem}.HIP.fdb.txt", "perf-db": f"{stem}.db", "kernel-db": f"{stem}.kdb"}[kind]


export_commands = [_export("find-db"), _export("perf-db"), _export("kernel-db")]


# -- golden ------------------------------------------------------------------------------------------------


@click.group("golden")
def golden_group() -> None:
    """Golden sets: the best results of chosen campaigns, versioned per target."""


@golden_group.command("update")
@click.option("--campaign", "campaigns", multiple=True, required=True, help="A campaign (or reason) to promote.")
@click.option("--target", required=True, help="The target of the golden set.")
@click.option("--version", type=click.IntRange(1), help="The new version's number (default: the next one).")
def golden_update(campaigns: tuple[str, ...], target: str, version: int | None) -> None:
    """Promote the best results of the campaigns to a new golden version (the last one, updated)."""
    from fleet.tuna.golden import update_golden

    _target(target)
    done = update_golden(_store(), target, list(campaigns), version)
    click.echo(
        f"golden {done.target} version {done.version}: {done.entries} entries "
        f"({done.promoted} from {', '.join(done.campaigns)})"
    )


@golden_group.command("list")
@click.option("--target", help="Only this target.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def golden_list(target: str | None, as_json: bool) -> None:
    """Every golden version, with its entries and campaigns."""
    from fleet.tuna.golden import versions

    rows = versions(_store(), target)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no golden versions")
    for row in rows:
        click.echo(
            f"{row['target']:<14} v{row['version']:<4} {row['entries']:>8} entries  {row['created_at']}  "
            + ", ".join(row["campaigns"])
        )


@click.group("miopen", cls=WholeHelpGroup)
def miopen_group() -> None:
    """MIOpen's Tuna workflow: driver lines as problems, jobs, golden sets, find-db / perf-db / kernel-db in and out."""


@miopen_group.group("export", cls=WholeHelpGroup)
def miopen_export() -> None:
    """Write MIOpen's databases from the measured results: find-db, perf-db and kernel-db."""


def register(main: click.Group, export: click.Group, bench: click.Group) -> None:
    """Add ``fleet miopen`` and its old top-level names (hidden, for one release) to ``fleet``'s groups.

    The old top-level ``import`` is not among them: ``fleet import`` belongs to the interchange formats, and
    falls back to :data:`import_command` for a MIOpenDriver file.
    """
    from fleet.bench.miopen import bench_command

    for command in (import_command, query_command, jobs_group, import_db_command, golden_group):
        miopen_group.add_command(command)
    for command in export_commands:
        miopen_export.add_command(command)
        export.add_command(old_name(command, f"fleet export {command.name}", f"fleet miopen export {command.name}"))
    main.add_command(miopen_group)
    for command in (query_command, jobs_group, import_db_command, golden_group):
        main.add_command(old_name(command, f"fleet {command.name}", f"fleet miopen {command.name}"))
    bench.add_command(bench_command, "miopen")
