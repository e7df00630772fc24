"""Commands that take results in from the field's tools and give Fleet's out to them: ``fleet import kt``,
``fleet export kt|optuna|mlflow`` and ``fleet dashboard``."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import click

from fleet.cli._common import database_url, open_store
from fleet.cli._sections import WholeHelpGroup
from fleet.errors import FleetError, NotFound


def _campaign(store: Any, ref: str) -> Any:
    try:
        return store.campaign(ref)
    except NotFound as error:
        raise NotFound(f"{error} in {database_url()}") from None


def _say_unmapped(unmapped: dict[str, int], where: str) -> None:
    for what, count in sorted(unmapped.items()):
        click.echo(f"fleet: not mapped ({where}): {count} {what}", err=True)


# -- fleet import --------------------------------------------------------------------------------------------


class ImportGroup(WholeHelpGroup):
    """``fleet import``: a group of importers whose first argument, when it names none of them, goes to the
    command that ``fleet import FILE`` always ran (MIOpen driver command lines), with its own options."""

    def __init__(self, *args: Any, legacy: click.Command | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", {}).update(ignore_unknown_options=True, allow_interspersed_args=False)
        super().__init__(*args, **kwargs)
        self.legacy = legacy

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if self.legacy is not None and args and args[0] not in self.commands:
            return self.legacy.name, self.legacy, args
        return super().resolve_command(ctx, args)

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_usage(ctx, formatter)
        if self.legacy is not None:
            formatter.write_usage(ctx.command_path, "FILE [OPTIONS]   (MIOpenDriver command lines; see below)")

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.legacy is not None:
            with formatter.section("fleet import FILE"):
                formatter.write_text(inspect.cleandoc(self.legacy.help or ""))
                formatter.write_dl([r for p in self.legacy.params if (r := p.get_help_record(ctx)) is not None])
        super().format_epilog(ctx, formatter)


def import_group(legacy: click.Command | None) -> click.Group:
    """The ``fleet import`` group, falling back to ``legacy`` (MIOpen's ``fleet import FILE``)."""

    @click.group("import", cls=ImportGroup, legacy=legacy, invoke_without_command=False)
    def group() -> None:
        """Import results and problems: Kernel Tuner and T4 files (kt), or MIOpenDriver command lines (FILE)."""

    group.add_command(import_kt_command)
    return group


@click.command("kt")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--target", help="The target the results are valid for (default: the one the device's name gives).")
@click.option("--kernel", help="The kernel's name, for a T4 file with no cache file beside it.")
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON.")
def import_kt_command(files: tuple[Path, ...], target: str | None, kernel: str | None, as_json: bool) -> None:
    """Import Kernel Tuner cache files and T4 results files (gzip'd too) as measurements of a problem and target.

    Each file becomes a done campaign ``import-kt-<file>-<hash>@<target>`` whose provenance names the file; its
    kernel and problem size are the problem, each configuration a trial, so `fleet best` and reports use them.
    Every file is read and checked before anything is stored; a file imported before adds nothing.
    """
    from fleet.interop.kerneltuner import target_of_device
    from fleet.interop.records import import_kt
    from fleet.interop.t4 import read_results
    from fleet.targets import check_target

    if target:
        check_target(target)
    read = []
    for path in files:
        if not path.is_file():
            raise NotFound(f"{path}: no such file")
        results = read_results(path)
        if not target:
            target_of_device(results.device)
        read.append((path, results))
    store = open_store()
    done = [import_kt(store, path, target=target, kernel=kernel, results=results) for path, results in read]
    if as_json:
        click.echo(json.dumps([d.__dict__ for d in done], indent=2))
        return
    for d in done:
        what = "imported" if d.created else "already imported"
        click.echo(
            f"{what} {d.path}: {d.records} configurations ({d.invalid} failed) on {d.target} as campaign {d.campaign}"
        )
        if d.duplicates:
            click.echo(f"fleet: {d.path}: {d.duplicates} configurations given twice (the first kept)", err=True)


# -- fleet export kt ----------------------------------------------------------------------------------------


@click.command("kt")
@click.argument("campaign")
@click.option(
    "-o",
    "--output",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="The folder to write <kernel>-<problem>/<device>.json, <device>_T4.json and <kernel>_T1.json in.",
)
def export_kt_command(campaign: str, directory: Path) -> None:
    """Every finished trial of CAMPAIGN as a Kernel Tuner cache file and its T4 twin, per problem.

    Fleet's compile and evaluation times become compile_time and benchmark_time, its samples times, numeric
    metrics stay metrics; failed trials get Kernel Tuner's failure strings and T4's invalidity. Beside them, the
    campaign's space as a T1 input file (with the kernel's file, for a campaign made from a T1 file) where T1 can
    express it. What cannot be mapped is counted on stderr.
    """
    from fleet.extras import require
    from fleet.interop.records import export_kt, write_kt, write_t1

    # Checked first: the T1 and T4 files are checked against Kernel Tuner's schemas, after the cache file is written.
    require("kernel_tuner", "fleet export kt")
    require("jsonschema", "fleet export kt")
    store = open_store(read_only=True)
    found = _campaign(store, campaign)
    exports = export_kt(store, found)
    if not exports:
        raise NotFound(f"campaign {found.name} has no problems")
    for exported in exports:
        _say_unmapped(exported.unmapped, f"problem {exported.problem.id}")
        for what, count in sorted(exported.t1_unwritable.items()):
            click.echo(f"fleet: no T1 file (problem {exported.problem.id}): {count} {what}", err=True)
        for note in exported.t1_notes:
            click.echo(f"fleet: T1 (problem {exported.problem.id}): {note}", err=True)
    paths = write_kt(exports, directory, found.target)
    for exported, path in zip(exports, paths[::2], strict=True):
        click.echo(f"{len(exported.results.records)} configurations of problem {exported.problem.id} -> {path}")
    for path in write_t1(exports, directory):
        click.echo(f"T1 input file -> {path}")


def register(main: Any, export: click.Group) -> None:
    """Add the interop commands to ``fleet`` (a :class:`~fleet.cli._sections.SectionedGroup`: ``import``, a group
    that falls back to MIOpen's ``fleet import FILE``, and ``dashboard``) and to ``fleet export``."""
    from fleet.cli.miopen import import_command

    group = import_group(import_command)
    if any("import" in names for names in main.sections.values()):
        main.add_command(group)  # where MIOpen's ``fleet import FILE`` was listed
    else:
        main.add_to_section("Campaigns", group)
    export.add_command(export_kt_command)
    register_dashboard(main, export)


# -- Optuna: fleet dashboard, fleet export optuna -----------------------------------------------------------


def _needs(module: str, extra: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise FleetError(f"this command needs {module}: pip install 'fleet-tune[{extra}]'")


@click.command("dashboard")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: any free port.")
@click.option("-c", "--campaign", "campaigns", multiple=True, help="Show only this campaign (repeatable).")
def dashboard(host: str, port: int, campaigns: tuple[str, ...]) -> None:
    """Serve optuna-dashboard over Fleet's database, live: one study per campaign and problem.

    Nothing is copied: each page reads the database (read-only), so running campaigns show their new trials on
    reload. Failed and invalid trials carry their reasons, and each trial its worker, device and timings as user
    attributes. Needs the `dashboard` extra.
    """
    _needs("optuna_dashboard", "dashboard")
    from fleet.interop.dashboard import serve

    store = open_store(read_only=True)
    for ref in campaigns:
        _campaign(store, ref)
    serve(store, host, port, campaigns, announce=lambda url: click.echo(f"fleet dashboard: serving {url}", err=True))


@click.command("optuna")
@click.argument("campaign")
@click.option(
    "--storage",
    required=True,
    help="The Optuna storage to copy into: a database URL (sqlite:///optuna.db, postgresql://...) that is not "
    "Fleet's own, or a journal file (a path ending in .log or .journal).",
)
def export_optuna_command(campaign: str, storage: str) -> None:
    """Copy CAMPAIGN's trials into an Optuna storage, one study per problem, timestamps kept.

    Open it with optuna.load_study(study_name="<campaign> / problem <id>", storage=...). A study of that name
    in the storage already is an error, and nothing is written.
    """
    _needs("optuna", "dashboard")
    from fleet.interop.optuna_export import export_optuna
    from fleet.settings import get_settings

    store = open_store(read_only=True)
    found = _campaign(store, campaign)
    for name, count in export_optuna(store, found, storage, fleet_url=get_settings().database_url):
        click.echo(f"{count} trials -> study {name!r} in {storage}")


def register_dashboard(main: Any, export: click.Group) -> None:
    main.add_to_section("Campaigns", dashboard)
    export.add_command(export_optuna_command)
    export.add_command(export_mlflow_command)
    from fleet.bench.dashboard import bench_dashboard_command
    from fleet.cli.bench import bench

    bench.add_command(bench_dashboard_command, "dashboard")


# -- MLflow --------------------------------------------------------------------------------------------------


@click.command("mlflow")
@click.argument("campaign")
@click.option("--experiment", help="The MLflow experiment (default: the campaign's name); created when missing.")
def export_mlflow_command(campaign: str, experiment: str | None) -> None:
    """CAMPAIGN as MLflow runs: a parent run for the campaign, a child run per finished trial.

    Knobs are params; the objective, numeric metrics and compile and evaluation seconds are metrics; state,
    reason, worker and device are tags. The tracking server is MLflow's own (MLFLOW_TRACKING_URI). Needs the
    `mlflow` extra.
    """
    _needs("mlflow", "mlflow")
    from fleet.interop.mlflow_export import export_mlflow

    store = open_store(read_only=True)
    found = _campaign(store, campaign)
    done = export_mlflow(store, found, experiment)
    click.echo(
        f"campaign {found.name}: parent run {done.parent_run_id} and {done.runs} trial runs in experiment "
        f"{done.experiment_id} at {done.tracking_uri}"
    )
