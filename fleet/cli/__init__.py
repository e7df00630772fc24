"""The ``fleet`` command line, assembled from one module per group of commands.

Every user error ends in one line on stderr and a non-zero exit. The modules of this package import from
``fleet.cli._common`` and ``fleet.cli._sections``, never from here: this module only assembles them.

The read commands a user runs most (``fleet status``, ``best``, ``report``, ``trials``, ``trial``) are found
without assembling the rest: ``fleet status`` imports its own module, not every command's (issue 42, item 12). So
are the commands that run a fleet (``tune``, ``submit``, ``worker`` and the like), which the tests run most.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from fleet.cli._sections import SectionedGroup, old_name
from fleet.errors import FleetError
from fleet.settings import Settings, conceal, freeze_at_exit

ALONE = {
    "status": "fleet.cli.campaigns",
    "best": "fleet.cli.campaigns",
    "report": "fleet.cli.campaigns",
    "trials": "fleet.cli.trials",
    "trial": "fleet.cli.trials",
    # The commands that run a fleet, which the tests run most (issue 43): each need not import every other's module.
    "tune": "fleet.cli.campaigns",
    "resume": "fleet.cli.campaigns",
    "submit": "fleet.cli.steering",
    "pause": "fleet.cli.steering",
    "cancel": "fleet.cli.steering",
    "driver": "fleet.cli.steering",
    "worker": "fleet.cli.fleet",
    "up": "fleet.cli.fleet",
}
"""Commands that their module defines whole (no other module adds to them), by name: the module that holds each."""


class FleetGroup(SectionedGroup):
    """``fleet``'s group: its commands are assembled (every module of the CLI imported) on first use of
    :attr:`commands`, and a command of :data:`ALONE` is found without them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.assembled = False
        super().__init__(*args, **kwargs)

    def assemble(self) -> None:
        """Add every command, in its section, unless that is done."""
        if not self.assembled:
            self.assembled = True  # first: assembling adds commands, which reads them
            _assemble(self)

    @property  # type: ignore[override]  # click.Group's attribute, assembled when first read
    def commands(self) -> dict[str, click.Command]:
        self.assemble()
        return self._commands

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._commands = value

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if not self.assembled and cmd_name in ALONE:
            command: click.Command = getattr(importlib.import_module(ALONE[cmd_name]), cmd_name)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.assemble()  # the sections too
        super().format_commands(ctx, formatter)


@click.group(cls=FleetGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="fleet-tune", prog_name="fleet")
@click.option("-v", "--verbose", is_flag=True, help="Log what Fleet does, the database it reads first.")
def cli(verbose: bool) -> None:
    """Fleet: tune programs for hardware on a fleet of machines.

    With no FLEET_DATABASE_URL and FLEET_BROKER_URL set, Fleet runs embedded under ./.fleet/ and starts
    its own worker processes.

    MIOpen's commands are under `fleet miopen`, TVM's under `fleet tvm`. Their old names (query, jobs, golden,
    import-db, export find-db|perf-db|kernel-db, tune-model, run-model) still work for one release, and say the new one.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


def _assemble(group: SectionedGroup) -> None:
    """Add every command of the CLI to ``group``, in its section."""
    from fleet.cli import bench, campaigns, fleet, interop, kubernetes, operations, slurm, steering, trials
    from fleet.cli.miopen import register as register_tuna
    from fleet.cli.tvm import run_model_command, tune_model_command, tvm_group

    # Run or hand over, steer, then look at what was found.
    for command in (campaigns.tune, steering.submit, campaigns.resume, steering.pause, steering.cancel):
        group.add_to_section("Campaigns", command)
    for command in (campaigns.status, *trials.COMMANDS, campaigns.best, campaigns.report, campaigns.export):
        group.add_to_section("Campaigns", command)
    group.add_to_section("Campaigns", campaigns.validate)
    for command in fleet.COMMANDS:
        group.add_to_section("Fleet", command)
    for command in steering.OPERATIONS:
        group.add_to_section("Fleet", command)
    for command in slurm.COMMANDS:  # workers that Slurm launches
        group.add_to_section("Fleet", command)
    for command in kubernetes.COMMANDS:  # workers on Kubernetes, scaled by KEDA
        group.add_to_section("Fleet", command)
    register_tuna(group, campaigns.export, bench.bench)
    group.add_to_section("MIOpen", group.commands.pop("miopen"))
    group.add_to_section("TVM", tvm_group)
    for command in (tune_model_command, run_model_command):
        group.add_command(old_name(command, f"fleet {command.name}", f"fleet tvm {command.name}"))
    interop.register(group, campaigns.export)
    for command in operations.COMMANDS:
        group.add_to_section("Operations", command)
    for command in bench.COMMANDS:
        group.add_to_section("Benchmarks", command)


READS = ("status", "best", "report", "trials", "trial")
"""Commands that read the database, print and exit."""


@contextmanager
def _collector_off_for_reads(args: list[str]) -> Iterator[None]:
    """Python's cyclic garbage collector off while ``args`` run one of :data:`READS` (the first argument that is
    not an option names it), then back as it was.

    A read command is a short process that builds many objects and few cycles: its collections, each walking every
    object built so far (SQLAlchemy's import and the rows read among them), cost it 5 to 15% of its CPU, and the
    few cycles it leaves go with the process.
    """
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command not in READS or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns Fleet's errors into one line and an exit status."""
    from fleet.settings import reset_settings

    reset_settings()
    conceal()  # every fleet process holds the database and broker URLs in its environment
    freeze_at_exit()
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        Settings.from_env()
        with _collector_off_for_reads(args):
            result = cli.main(args=args, prog_name="fleet", standalone_mode=False)
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
