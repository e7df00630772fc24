"""What ``fleet bench systemd`` (fleet/bench/systemd.py) decides before it boots anything: whether the node's Debian
root (fleet/ops/nspawn.py) is reused or built, how systemd-nspawn boots it, the campaign it hands over, what it says
where it cannot run, and its table of figures. The run itself needs root and minutes: `make bench`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fleet.bench.systemd import NODE, TARGET, campaign_spec, figures_table, systemd_bench_command
from fleet.ops import nspawn
from fleet.ops.nodes import Bed, Node
from fleet.ops.nspawn import RECIPE_FILE, Recipe, ensure_root, is_built, nspawn_argv
from fleet.spec.campaign import parse_spec


def test_a_root_is_named_by_its_recipe_and_any_change_to_the_recipe_names_another() -> None:
    recipe = Recipe()
    assert recipe.name == f"debian-bookworm-{recipe.digest}" and recipe.name == Recipe().name
    changed = [Recipe(packages=(*recipe.packages, "procps")), Recipe(suite="trixie"), Recipe(setup="true")]
    assert len({recipe.name, *(other.name for other in changed)}) == 4
    assert recipe.debootstrap(Path("/cache/root")) == [
        "debootstrap", "--variant=minbase",
        "--include=systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,bubblewrap",
        "bookworm", "/cache/root", "http://deb.debian.org/debian",
    ]  # fmt: skip


def test_a_root_counts_as_built_only_once_its_own_recipe_file_is_there(tmp_path: Path) -> None:
    recipe = Recipe()
    folder = tmp_path / recipe.name
    assert not is_built(folder, recipe)  # never built
    (folder / "root").mkdir(parents=True)
    assert not is_built(folder, recipe)  # a build cut short: no recipe file
    (folder / RECIPE_FILE).write_text("{")
    assert not is_built(folder, recipe)
    (folder / RECIPE_FILE).write_text(json.dumps(Recipe(suite="trixie").record()))
    assert not is_built(folder, recipe)
    (folder / RECIPE_FILE).write_text(json.dumps(recipe.record()))
    assert is_built(folder, recipe)


def test_a_built_root_is_reused_without_debootstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = Recipe()
    (tmp_path / recipe.name / "root").mkdir(parents=True)
    (tmp_path / recipe.name / RECIPE_FILE).write_text(json.dumps(recipe.record()))
    (tmp_path / "debian-bookworm-000000000000").mkdir()  # an older recipe's root, removed at the next build only

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("debootstrap ran for a root that is built")

    monkeypatch.setattr(nspawn.subprocess, "run", refuse)
    said: list[str] = []
    assert ensure_root(tmp_path, recipe, said.append) == (tmp_path / recipe.name / "root", False)
    assert said == [] and (tmp_path / "debian-bookworm-000000000000").exists()


def test_systemd_nspawn_boots_the_root_as_the_node_in_its_namespace_and_never_writes_to_the_root() -> None:
    node = Node(NODE, "10.77.0.11", NODE, "/var/tmp/fleet-nodes-sdx/sd1", login="root")
    argv = nspawn_argv(Path("/cache/root"), node, Path("/run/netns/sdx-sd1"), Path("/var/tmp/bed/id_ed25519.pub"))
    assert argv[0] == "systemd-nspawn" and "--boot" in argv
    assert {
        "--directory=/cache/root",
        f"--hostname={NODE}",
        "--network-namespace-path=/run/netns/sdx-sd1",
        "--volatile=overlay",  # every write of the boot goes to a tmpfs: the cached root stays as it was built
        "--bind-ro=/var/tmp/bed/id_ed25519.pub:/root/.ssh/authorized_keys",
        "--bind-ro=/var/tmp/fleet-nodes-sdx/sd1/hostname:/etc/hostname",  # systemd would set the root's own
        "--register=no",  # the machine has no systemd (nor machined) to register with
        "--keep-unit",
    } <= set(argv)


def test_the_ssh_config_logs_in_to_a_systemd_node_as_root_and_to_the_others_as_the_node_account(
    tmp_path: Path,
) -> None:
    bed = Bed.create(1, prefix="sdx", root=tmp_path)
    bed.nodes[NODE] = Node(NODE, "10.77.0.12", NODE, str(tmp_path / NODE), login="root")
    Path(bed.directory).mkdir()
    bed.write_ssh_config()
    hosts = [block.splitlines() for block in bed.ssh_config.read_text().split("Host ")[1:]]
    assert [(lines[0], lines[2].strip()) for lines in hosts] == [("node1", "User fleetbed"), (NODE, "User root")]
    assert bed.netns_path(bed[NODE]) == Path("/run/netns/sdx-sd1")


def test_the_campaign_is_one_the_fleet_takes(tmp_path: Path) -> None:
    spec = parse_spec(campaign_spec("systemd", 12), tmp_path)
    assert spec.target == TARGET and spec.strategy["budget"] == 12


def test_without_root_the_bench_says_so_in_one_line_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(systemd_bench_command, [])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: nodes: making network, mount and PID namespaces needs root"]


def test_a_missing_tool_is_named_with_its_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(nspawn, "_which", lambda tool: tool != "systemd-nspawn")
    with pytest.raises(nspawn.BedError) as raised:
        nspawn.check_tools()
    assert str(raised.value) == "systemd node: systemd-nspawn (apt-get install systemd-container) missing"


def test_the_figures_are_one_line_a_step() -> None:
    figures = {
        "root": "/root/.fleet/nspawn/debian-bookworm-0123456789ab/root", "root_built": False, "root_s": 0.0,
        "boot_s": 3.2, "wheelhouse_s": 0.4, "refused_s": 30.2, "refused": "sd1: ... bubblewrap is not installed",
        "deploy_s": 11.5, "trials": 12, "campaign_s": 6.1, "by_node": {NODE: 12},
        "status_active": 3, "stop_s": 2.5, "fleet_processes_after_stop": 0, "poweroff_s": 1.1, "leftovers": [],
        "units": {"fleet-eval.service": {"user": "fleet", "credentials": ["fleet-broker-url", "fleet-database-url"]}},
    }  # fmt: skip
    lines = figures_table(figures)
    assert [line.split()[0] for line in lines] == [
        "root", "boot", "wheels", "refused", "deploy", "campaign", "status", "stop", "poweroff", "teardown",
    ]  # fmt: skip
    assert lines[0].split()[1:3] == ["reused", "0.0"]
    assert lines[3].endswith("bubblewrap is not installed")
    assert "fleet-eval.service (fleet, credentials fleet-broker-url fleet-database-url)" in lines[4]
    assert lines[5].split()[1:3] == ["12", "6.1"] and lines[5].endswith(f"by node: {NODE} 12")
