"""``fleet bench systemd``: ``fab deploy``'s systemd path run for real, on a node that boots systemd (issue 39).

A bed (fleet/ops/nodes.py) of a database node (PostgreSQL, Redis) and one systemd node: a Debian root made once by
``debootstrap`` and kept (fleet/ops/nspawn.py), booted by ``systemd-nspawn -b`` in a network namespace on the bed's
bridge, with sshd letting root in. From the operator's seat (the bed's switch), as docs/operations.md says:

- ``fab deploy`` to the node with its ``bwrap`` taken away: each worker unit checks its node before it starts
  (``ExecStartPre=fleet worker ... --check``), so the deploy fails, saying in one line that bubblewrap is missing;
- ``fab deploy --role workers,driver``: the node has systemd and the login is root, so the fabfile makes the
  ``fleet`` system user, installs Fleet in ``/opt/fleet`` from a wheelhouse built for the node's Python, writes the
  URLs as files that the units load as systemd credentials, and enables ``fleet-eval``, ``fleet-build`` and
  ``fleet-driver``;
- a campaign handed over with ``fleet submit``: the node's driver drives it, its workers measure every trial, each
  measurement naming the node (``FLEET_NODE_NAME``, and the host name its run saw);
- ``fab status``, then ``fab stop``: no Fleet process left on the node; then the node is powered off
  (``systemctl poweroff`` over SSH) and must exit cleanly, and the bed is torn down, leaving no namespace, mount,
  loop device or process behind.

Prints what it did with its seconds; exits 1, with the reason in one line, on any failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from fleet.ops.nodes import DATABASE_ADDRESS, POSTGRES_PORT, REDIS_PORT, Bed, BedError, check_host
from fleet.ops.nspawn import Recipe, SystemdNode, check_tools, default_cache, ensure_root
from fleet.states import CampaignStatus, TrialState

NODE = "sd1"  # the systemd node's name: its host name, its name in the ssh config and FLEET_NODE_NAME
TARGET = "cpu-bed"
UNITS = ("fleet-eval.service", "fleet-build.service", "fleet-driver.service")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BWRAP = "/usr/bin/bwrap"  # the sandbox, taken away for the first deploy
SECRETS = ("FLEET_DATABASE_URL=", "FLEET_BROKER_URL=")  # what no unit's environment may hold
PROBE = "import platform, sys; print('%d.%d.%d-%s' % (*sys.version_info[:3], platform.machine()))"


class SystemdBenchError(BedError):
    """A step of the run that did not do what it should."""


@dataclass
class Run:
    """One run's bed, node and the seat's environment, and the figures gathered so far."""

    bed: Bed
    node: SystemdNode
    env: dict[str, str] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def seat(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``argv`` run at the operator's seat (the bed's switch) with the operator's environment."""
        return subprocess.run(
            self.bed.at_switch(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def fab(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        fab = Path(sys.executable).parent / "fab"
        return self.seat([str(fab), "-r", str(DEPLOY), "-S", str(self.bed.ssh_config), "-H", NODE, *args], timeout)

    def on_node(self, command: str) -> str:
        """``command``'s output, run as root on the node over SSH; a failure stops the run."""
        done = self.node.ssh(command)
        if done.returncode != 0:
            raise SystemdBenchError(f"on {NODE}: {command}: {(done.stderr or done.stdout).strip()}")
        return done.stdout.strip()


def run(trials: int = 12, cache: Path | None = None, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build or reuse the root, boot the node, deploy, run a campaign, stop, power off, tear down; the figures.

    Raises :class:`BedError` (one line) on any failure, after tearing everything down."""
    check_host()
    check_tools()
    if not (DEPLOY / "fabfile.py").exists() or not (Path(sys.executable).parent / "fab").exists():
        raise BedError(
            "fleet bench systemd: needs a clone of Fleet (deploy/fabfile.py) and Fabric (pip install -e '.[ops]')"
        )
    begun = time.monotonic()
    recipe = Recipe()
    cache = cache or default_cache()
    root, built = ensure_root(cache, recipe, say)
    figures: dict[str, Any] = {"root": str(root), "root_built": built, "root_s": round(time.monotonic() - begun, 1)}
    say(f"root {'built' if built else 'reused'} in {figures['root_s']} s: {root}")
    bed = Bed.create(0, prefix=f"sd{uuid.uuid4().hex[:6]}")
    node: SystemdNode | None = None
    try:
        begun = time.monotonic()
        bed.up()
        node = SystemdNode(bed, bed.wire(NODE, login="root"), root)
        figures["bed_s"] = round(time.monotonic() - begun, 1)
        begun = time.monotonic()
        node.boot()
        figures["boot_s"] = round(time.monotonic() - begun, 1)
        say(f"{NODE} booted in {figures['boot_s']} s (systemd running, sshd up)")
        bench = Run(bed, node, figures=figures)
        try:
            _deploy_and_measure(bench, trials, say)
        except BaseException:
            _save_failure(bench, cache)
            raise
        begun = time.monotonic()
        status = node.poweroff()
        figures["poweroff_s"] = round(time.monotonic() - begun, 1)
        if status != 0:
            raise SystemdBenchError(f"{NODE} powered off with exit status {status}: {node.console_tail()}")
        say(f"{NODE} powered off in {figures['poweroff_s']} s (exit status 0)")
    finally:
        if node is not None:
            node.kill()
        bed.down()
    figures["leftovers"] = leftovers(bed, root)
    if figures["leftovers"]:
        raise SystemdBenchError(f"left behind: {'; '.join(figures['leftovers'])}")
    return figures


def _deploy_and_measure(bench: Run, trials: int, say: Callable[[str], None]) -> None:
    """``fab deploy`` to the node, a campaign measured there, ``fab status``, ``fab stop``."""
    from fleet.store import Store

    figures = bench.figures
    python = node_interpreter(bench.on_node(f'python3 -c "{PROBE}"'))
    # The seat reaches nothing beyond the bed, pip's index least of all: the wheelhouse is built here first, for the
    # node's Python, where the fabfile finds it (as for air-gapped nodes).
    begun = time.monotonic()
    fabfile().build_wheelhouse(python=python)
    figures["wheelhouse_s"] = round(time.monotonic() - begun, 1)
    bench.env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
        "FLEET_DATABASE_URL": f"postgresql+psycopg2://fleet@{DATABASE_ADDRESS}:{POSTGRES_PORT}/fleet",
        "FLEET_BROKER_URL": f"redis://{DATABASE_ADDRESS}:{REDIS_PORT}/0",
        "FLEET_NODE_PYTHON": python,
        "FLEET_HOME": str(Path(bench.bed.directory) / "seat"),
        "FLEET_HEARTBEAT_SECONDS": "1",
        "FLEET_STOP_TIMEOUT": "60",
        "PYTHONUNBUFFERED": "1",
    }
    deploy = ["deploy", "--role", "workers,driver", "--target", TARGET, "--eval-procs", "1", "--build-procs", "1"]
    # First to a node that lacks the workloads' sandbox: each worker unit checks its node before it starts, so the
    # deploy must fail, saying why in one line, rather than say "deployed" over workers that restart every 5 s.
    begun = time.monotonic()
    bench.on_node(f"mv {BWRAP} {BWRAP}.away")
    refused = bench.fab(*deploy)
    bench.on_node(f"mv {BWRAP}.away {BWRAP}")
    figures["refused_s"] = round(time.monotonic() - begun, 1)
    said = refused.stderr.strip().splitlines()[-1:]
    if refused.returncode == 0 or not said or "bubblewrap is not installed" not in said[0]:
        raise SystemdBenchError(f"fab deploy to a node without bubblewrap did not fail saying so: {said}")
    figures["refused"] = said[0]
    say(f"fab deploy to {NODE} without bubblewrap refused in {figures['refused_s']} s: {said[0]}")
    begun = time.monotonic()
    deployed = bench.fab(*deploy)
    figures["deploy_s"] = round(time.monotonic() - begun, 1)
    _must(deployed, "fab deploy")
    if f"{NODE}: deployed fleet" not in deployed.stdout or "(systemd, /opt/fleet;" not in deployed.stdout:
        raise SystemdBenchError(f"fab deploy did not deploy with systemd: {deployed.stdout.strip()}")
    say(f"fab deploy (systemd) in {figures['deploy_s']} s: {deployed.stdout.strip().splitlines()[-1]}")
    figures["units"] = _check_units(bench)
    store = Store(bench.bed.database_url)  # read through the database node's unix socket
    try:
        names = {f"eval-cpu0@{NODE}", f"build-{TARGET}@{NODE}", f"driver@{NODE}"}
        _wait(lambda: names <= {w.name for w in store.workers(within=30)}, 120, "the node's workers and driver")
        spec = Path(bench.bed.directory) / "spec.json"
        spec.write_text(json.dumps(campaign_spec("systemd", trials)))
        begun = time.monotonic()
        _must(bench.seat([sys.executable, "-m", "fleet.cli", "submit", str(spec)], 120), "fleet submit")
        _wait(lambda: store.campaign("systemd").status == CampaignStatus.DONE, 300, "the campaign to end")
        figures["campaign_s"] = round(time.monotonic() - begun, 1)
        figures.update(measured(store, "systemd", trials))
        say(f"{figures['trials']} trials measured in {figures['campaign_s']} s, by node: {figures['by_node']}")
        status = bench.fab("status", timeout=60)
        _must(status, "fab status")
        figures["status_active"] = status.stdout.count("Active: active (running)")
        begun = time.monotonic()
        _must(bench.fab("stop"), "fab stop")
        figures["stop_s"] = round(time.monotonic() - begun, 1)
        figures["fleet_processes_after_stop"] = len(fleet_processes(bench.bed, bench.node))
        figures["units_after_stop"] = bench.node.ssh(f"systemctl is-active {' '.join(UNITS)}").stdout.split()
        figures["registered_after_stop"] = sorted(w.name for w in store.workers(within=30) if w.name in names)
    finally:
        store.close()
    say(f"fab stop in {figures['stop_s']} s: {figures['fleet_processes_after_stop']} Fleet processes left")
    if figures["fleet_processes_after_stop"] or figures["registered_after_stop"]:
        raise SystemdBenchError(f"fab stop left Fleet running: {figures['registered_after_stop']}")
    if set(figures["units_after_stop"]) != {"inactive"}:
        raise SystemdBenchError(f"fab stop left units {figures['units_after_stop']}")


def _check_units(bench: Run) -> dict[str, Any]:
    """Each unit active, run by the ``fleet`` user, with its URLs as credentials: none in its environment, nor in
    the environment file."""
    units = {}
    for unit in UNITS:
        pid = bench.on_node(f"systemctl show --property=MainPID --value {unit}")
        user = bench.on_node(f"stat -c %U /proc/{pid}")
        environ = bench.on_node(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
        credentials = bench.on_node(f"ls /run/credentials/{unit}")
        units[unit] = {"user": user, "credentials": credentials.split()}
        urls = [line.split("=", 1)[0] for line in environ if line.startswith(SECRETS)]
        if user != "fleet" or urls or not any(line.startswith("CREDENTIALS_DIRECTORY=") for line in environ):
            raise SystemdBenchError(f"{unit}: run by {user}, URLs in its environment: {urls or 'none'}")
    env_file = bench.on_node("cat /etc/fleet/node.env")
    if "_URL" in env_file:
        raise SystemdBenchError(f"/etc/fleet/node.env holds a URL: {env_file}")
    return units


def campaign_spec(name: str, trials: int) -> dict[str, Any]:
    """A grid of ``trials`` quick trials; each run prints its score and the host name it ran on."""
    run = "import json, socket, sys; print(json.dumps({'score': int(sys.argv[1]), 'host': socket.gethostname()}))"
    return {
        "name": name,
        "target": TARGET,
        "problems": [{"kind": "systemd", "params": {}}],
        "space": {"knobs": {"r": {"values": list(range(trials))}}},
        "strategy": {"name": "grid", "budget": trials},
        "workload": {
            "kind": "command",
            "run": ["python3", "-I", "-S", "-c", run, "{r}"],
            "objective": {"json": "score", "goal": "max"},
            "repeats": 1,
        },
    }


def measured(store: Any, name: str, trials: int) -> dict[str, Any]:
    """The campaign's measurements by node; a failure unless every trial was measured once, by the systemd node's
    evaluation worker, naming that node, on a host of that name."""
    from sqlalchemy import select

    from fleet.store import Measurement, Trial

    campaign = store.campaign(name)
    with store.session() as session:
        query = select(Measurement).join(Trial).where(Trial.campaign_id == campaign.id)
        rows = [(m.node, m.worker, m.metrics.get("host")) for m in session.scalars(query)]
    by_node: dict[str, int] = {}
    for node, _, _ in rows:
        by_node[node] = by_node.get(node, 0) + 1
    counts = store.trial_counts(campaign.id)
    wrong = [row for row in rows if row != (NODE, f"eval-cpu0@{NODE}", NODE)]
    if counts != {TrialState.EVALUATED: trials} or len(rows) != trials or wrong:
        raise SystemdBenchError(f"trials {counts}, {len(rows)} measurements, not all by {NODE}: {wrong[:3]}")
    return {"trials": len(rows), "by_node": by_node}


def node_interpreter(tag: str) -> str:
    """An interpreter of this machine that is the node's Python (``3.11.2-x86_64``): what builds its wheelhouse."""
    candidates = ["/usr/bin/python3", shutil.which("python3"), sys.executable]
    for python in dict.fromkeys(c for c in candidates if c):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            if fabfile()._interpreter_tag(python) == tag:
                return python
    raise SystemdBenchError(f"no Python {tag} on this machine to build the node's wheelhouse with (tried {candidates})")


def fabfile() -> ModuleType:
    """deploy/fabfile.py as a module (it is not part of the fleet package)."""
    if "fleet_fabfile" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fleet_fabfile", DEPLOY / "fabfile.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["fleet_fabfile"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["fleet_fabfile"]


def fleet_processes(bed: Bed, node: SystemdNode) -> list[str]:
    """The command lines of Fleet's processes on the node, read from the machine (no ``ps`` in the root)."""
    found = []
    pids = subprocess.run(["ip", "netns", "pids", bed.netns(node.node)], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "/opt/fleet/" in args:
                found.append(args.strip())
    return found


def leftovers(bed: Bed, root: Path) -> list[str]:
    """What the run left on the machine: the bed's namespaces, mounts of the root or the bed, loop devices of the
    bed, systemd-nspawn processes of the root."""
    found = [f"network namespace {n}" for n in _lines(["ip", "netns", "list"]) if n.startswith(f"{bed.prefix}-")]
    found += [f"mount {m}" for m in Path("/proc/self/mounts").read_text().splitlines() if str(root) in m
              or bed.directory in m]  # fmt: skip
    found += [f"loop device {line}" for line in _lines(["losetup", "-a"]) if bed.directory in line]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if args.startswith("systemd-nspawn") and str(root) in args:
                found.append(f"process {pid} {args.strip()}")
    if Path(bed.directory).exists():
        found.append(f"folder {bed.directory}")
    return found


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()


def _must(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise SystemdBenchError(f"{what} failed (exit status {done.returncode}): {tail}")


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemdBenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)


def _save_failure(bench: Run, cache: Path) -> None:
    """The node's console and its units' journal, kept in ``cache`` for a failed run (the bed's folder goes)."""
    journal = bench.node.ssh("journalctl --no-pager -n 200 -u 'fleet-*'").stdout
    with contextlib.suppress(OSError):
        (cache / "last-failure.log").write_text(
            bench.node.log.read_text(errors="replace") + "\n--- journal of fleet-*\n" + journal
        )


def figures_table(figures: dict[str, Any]) -> list[str]:
    """The run's figures, one line each."""
    units = figures.get("units", {})
    return [
        f"{'root':<10} {'built' if figures['root_built'] else 'reused':>7} {figures['root_s']:>7.1f} s  "
        + figures["root"],
        f"{'boot':<10} {'':>7} {figures['boot_s']:>7.1f} s  systemd-nspawn -b to systemd running, sshd up",
        f"{'wheels':<10} {'':>7} {figures['wheelhouse_s']:>7.1f} s  the wheelhouse for the node's Python",
        f"{'refused':<10} {'':>7} {figures['refused_s']:>7.1f} s  fab deploy to the node without bubblewrap: "
        + figures["refused"],
        f"{'deploy':<10} {'systemd':>7} {figures['deploy_s']:>7.1f} s  fab deploy --role workers,driver: "
        + ", ".join(f"{u} ({v['user']}, credentials {' '.join(v['credentials'])})" for u, v in units.items()),
        f"{'campaign':<10} {figures['trials']:>7} {figures['campaign_s']:>7.1f} s  trials measured, by node: "
        + ", ".join(f"{n} {c}" for n, c in figures["by_node"].items()),
        f"{'status':<10} {figures['status_active']:>7} {'':>9}  units active (running) in fab status",
        f"{'stop':<10} {figures['fleet_processes_after_stop']:>7} {figures['stop_s']:>7.1f} s  fab stop; Fleet "
        f"processes left",
        f"{'poweroff':<10} {0:>7} {figures['poweroff_s']:>7.1f} s  systemctl poweroff; the container's exit status",
        f"{'teardown':<10} {len(figures['leftovers']):>7} {'':>9}  namespaces, mounts, loop devices, processes left",
    ]


@click.command("systemd")
@click.option("--trials", type=click.IntRange(1), default=12, show_default=True, help="Trials of the campaign.")
@click.option(
    "--cache",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where the node's Debian root is kept between runs (default: nspawn in FLEET_HOME, else ~/.fleet).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def systemd_bench_command(trials: int, cache: Path | None, as_json: bool) -> None:
    """`fab deploy` in systemd mode to a node booted by systemd-nspawn, a campaign it measures, `fab stop`.

    A bed of a database node and a Debian node (debootstrap, built once and kept) booted with systemd-nspawn in the
    bed's network; from the operator's seat, `fab deploy --role workers,driver` (systemd units, the URLs as
    credentials), `fleet submit` of a campaign the node's driver drives and its workers measure, `fab status`,
    `fab stop`, then the node powered off and the bed torn down. Prints the seconds of each step; exits 1 on any
    failure. Needs root, namespaces, and Debian's debootstrap and systemd-container.
    """
    try:
        figures = run(trials, cache, say=lambda line: click.echo(line, err=True))
    except BedError as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps(figures))
        return
    for line in figures_table(figures):
        click.echo(line)
