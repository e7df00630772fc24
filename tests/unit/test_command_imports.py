"""What the read commands import (issue 42, item 12): only what they need, so that they start quickly.

Not a timed test: the modules a command imports are what its start-up costs, and they do not vary with the
machine's load. ``fleet bench scale`` measures the seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.schema import head_revision
from fleet.store import Store

HEAVY = (
    "alembic",
    "celery",
    "kombu",
    "fleet.bench.search",
    "fleet.bench.pareto",
    "fleet.driving.campaign",
    "fleet.api",
)


def imported_by(home: Path, *args: str, broker: str | None = None, status: int = 0) -> set[str]:
    """The modules a `fleet` command imported, run in its own process in ``home`` (embedded, no broker running
    unless ``broker`` names one), checked to exit with ``status``."""
    script = (
        "import json, sys\nfrom fleet.cli import main\n"
        f"code = main({list(args)!r})\n"
        "print(json.dumps([code, sorted(sys.modules)]))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "FLEET_HOME": str(home / ".fleet")} | (
        {"FLEET_BROKER_URL": broker} if broker else {}
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=home, env=env, capture_output=True, text=True, timeout=60)
    code, modules = json.loads(done.stdout.splitlines()[-1])
    assert code == status, done.stderr
    return set(modules)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / ".fleet").mkdir()
    Store(f"sqlite:///{tmp_path}/.fleet/fleet.db").upgrade()
    return tmp_path


def test_the_version_imports_no_database_library(home: Path) -> None:
    modules = imported_by(home, "--version")
    assert not {m for m in modules if m.split(".")[0] == "sqlalchemy"}
    assert not modules & set(HEAVY)


def test_fleet_status_imports_no_migrations_broker_driver_or_benchmarks(home: Path) -> None:
    assert not imported_by(home, "status") & set(HEAVY)


def test_fleet_status_of_the_whole_database_reads_it_without_sqlalchemy(home: Path) -> None:
    modules = imported_by(home, "status")
    assert "fleet.glance" in modules
    assert not {m for m in modules if m.split(".")[0] == "sqlalchemy" or m.startswith("fleet.store")}


def test_fleet_status_imports_its_own_commands_module_and_no_searcher(home: Path) -> None:
    modules = imported_by(home, "status")
    assert {m for m in modules if m.startswith("fleet.cli.")} == {
        "fleet.cli._common", "fleet.cli._sections", "fleet.cli.campaigns",
    }  # fmt: skip
    assert not {m for m in modules if m.startswith(("fleet.search", "fleet.workers"))}


def test_fleet_status_reads_the_filesystem_brokers_queues_without_celery(home: Path) -> None:
    modules = imported_by(home, "status", broker="filesystem://")
    assert "fleet.ops.queues" in modules  # it asked the broker: the messages are files, and there is no broadcast
    assert not {m for m in modules if m.startswith(("fleet.tasks", "fleet.celery_app", "celery", "kombu"))}


OTHER_COMMANDS = ("fleet.cli.bench", "fleet.cli.operations", "fleet.cli.tvm", "fleet.cli.miopen", "fleet.cli.slurm")
"""Modules of commands that none of those a fleet runs most needs."""


@pytest.mark.parametrize(
    "command",
    [("submit", "spec.json"), ("tune", "--help"), ("resume", "--help"), ("pause", "--help"), ("worker", "--help")],
    ids=lambda command: command[0],
)
def test_the_commands_that_run_a_fleet_import_no_other_commands_module(home: Path, command: tuple[str, ...]) -> None:
    spec = {"name": "c", "target": "cpu-x", "space": {"knobs": {"a": [1, 2]}}, "workload": {"kind": "noop"}}
    (home / "spec.json").write_text(json.dumps(spec | {"problems": [{"kind": "noop", "params": {}}]}))
    modules = imported_by(home, *command)
    assert not {m for m in modules if m.startswith(OTHER_COMMANDS)}


def test_the_whole_cli_is_assembled_for_any_other_command_and_for_help(home: Path) -> None:
    assert "fleet.cli.operations" in imported_by(home, "--help")
    assert "fleet.cli.tvm" in imported_by(home, "db", "--help")


def test_the_head_revision_read_from_the_migration_files_is_alembics() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(Path(sys.modules["fleet.store"].__file__).parent / "migrations"))
    assert head_revision() == ScriptDirectory.from_config(config).get_current_head()


def test_the_package_still_gives_the_api_and_its_campaign_function() -> None:
    # The driver's module imported first, as a command does: fleet.campaign is still the API's function, and the
    # module keeps its own name.
    script = (
        "import fleet.driving.campaign as module, fleet; "
        "print(callable(fleet.campaign), fleet.campaign.__module__, fleet.submit.__module__, module.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["True", "fleet.api", "fleet.api", "fleet.driving.campaign"]


def test_a_workloads_spec_imports_no_searcher_nor_the_campaigns_spec() -> None:
    # What fleet best, status CAMPAIGN and report read a campaign's objective with.
    script = "import json, sys, fleet.spec.workloads; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    modules = set(json.loads(done.stdout))
    assert not {m for m in modules if m.startswith(("fleet.search", "fleet.replay", "fleet.spec.campaign"))}


@pytest.fixture
def campaign(home: Path) -> str:
    """A finished campaign in ``home``'s database (three configurations imported as Kernel Tuner wrote them)."""
    from fleet.interop.kerneltuner import KTRecord, KTResults, dumps_cache
    from fleet.interop.records import import_kt

    records = [
        KTRecord({"bx": 32}, 1.5, None, [1.5], {}),
        KTRecord({"bx": 64}, None, "CompilationFailedConfig", None, {}),
        KTRecord({"bx": 128}, 0.75, None, [0.75], {}),
    ]
    results = KTResults("NVIDIA A100-PCIE-40GB", "k", [1024], ["bx"], {"bx": [32, 64, 128]}, "time", records)
    (home / "k.json").write_text(dumps_cache(results))
    store = Store(f"sqlite:///{home}/.fleet/fleet.db")
    try:
        return import_kt(store, home / "k.json", results=results).campaign
    finally:
        store.close()


@pytest.mark.parametrize(
    "command",
    [("status", "{}"), ("best", "{}"), ("report", "{}", "-o", "-"), ("trials", "{}", "--state", "errored")],
    ids=lambda command: command[0],
)
def test_a_campaigns_read_commands_import_no_searcher_driver_or_broker(
    home: Path, campaign: str, command: tuple[str, ...]
) -> None:
    modules = imported_by(home, *(arg.format(campaign) for arg in command))
    assert not modules & set(HEAVY)
    assert not {m for m in modules if m.startswith(("fleet.search", "fleet.replay", "fleet.spec.campaign"))}


@pytest.mark.parametrize(
    "command", [("status",), ("best",), ("report", "-o", "-"), ("trials",)], ids=lambda command: command[0]
)
def test_a_campaigns_status_best_report_and_trials_read_it_without_sqlalchemy(
    home: Path, campaign: str, command: tuple[str, ...]
) -> None:
    modules = imported_by(home, command[0], campaign, *command[1:])
    assert "fleet.glance" in modules
    assert not {m for m in modules if m.split(".")[0] == "sqlalchemy" or m.startswith("fleet.store")}


@pytest.mark.parametrize(
    "command", [("status",), ("status", "c"), ("best", "c"), ("report", "c"), ("trials", "c")], ids=" ".join
)
def test_a_read_command_in_a_folder_with_no_database_says_so_without_sqlalchemy(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    modules = imported_by(tmp_path, *command, status=1)
    assert not {m for m in modules if m.split(".")[0] == "sqlalchemy" or m.startswith("fleet.store")}
    assert not (tmp_path / ".fleet").exists()


def test_a_read_command_runs_with_the_cyclic_collector_off_and_puts_it_back() -> None:
    import gc

    from fleet.cli import _collector_off_for_reads

    assert gc.isenabled()
    with _collector_off_for_reads(["-v", "report", "c", "-o", "-"]):
        assert not gc.isenabled()
    assert gc.isenabled()
    with _collector_off_for_reads(["tune", "spec.json"]):  # a long-running command keeps it
        assert gc.isenabled()
