"""Deploy Fleet's workers and drivers to nodes over SSH (Fabric 3): ``fab -r deploy -H node1,node2 deploy``.

``deploy`` builds a wheelhouse of Fleet and every dependency on this machine (``pip wheel``, once, then
reused while the sources do not change), uploads it (GPU nodes are often air-gapped), installs it into a
virtual environment on the node with ``pip --no-index --find-links``, writes the node's environment file
(mode 0600: the broker and database URLs from *your* environment, the node's name and targets), and starts
what the node runs: its workers (``--role workers``, the default), a ``fleet driver`` that drives the
campaigns ``fleet submit`` hands to the fleet (``--role driver``, e.g. on a head node without a GPU), or
both (``--role workers,driver``). ``start``, ``stop``, ``restart``, ``status``, ``logs`` and ``upgrade`` do
what they say, for every role the node was deployed with.

Two ways to run them, chosen per node:

- **systemd** (the node runs it, and you log in as root): a ``fleet`` system user runs them; Fleet lives in
  ``/opt/fleet``, the environment file is ``/etc/fleet/node.env``; one ``fleet-eval@<gpu>.service`` per GPU
  (or ``fleet-eval.service`` for a CPU node) and one ``fleet-build.service``, with ``KillMode=mixed`` and a
  ``TimeoutStopSec`` longer than the longest measurement, so a restart lets the running one finish; and
  ``fleet-driver.service``, which lets go of its campaigns at once on SIGTERM.
- **supervisor** (no systemd, e.g. a container): everything lives under ``~/fleet`` of the SSH user, which
  must not be root; ``fleet worker`` and ``fleet driver`` run detached (``setsid``) with a pid file each,
  and ``stop`` sends them SIGTERM and waits for the warm shutdown to end.

The artifact cache (``FLEET_CACHE_DIR``) is outside the virtual environment, so a redeploy keeps it.
Environment read here: ``FLEET_DATABASE_URL`` and ``FLEET_BROKER_URL`` (required), ``FLEET_STOP_TIMEOUT``
(seconds a stop waits for a measurement, default 840), ``FLEET_WHEELHOUSE`` (a wheelhouse to reuse),
``FLEET_NODE_PYTHON`` (the interpreter that builds it: the nodes' Python, default ``python3``), and
``FLEET_LEASE_SECONDS``, ``FLEET_HEARTBEAT_SECONDS``, ``FLEET_MAX_ATTEMPTS``, ``FLEET_MAX_NODE_FAULTS``,
``FLEET_REQUEUE_SECONDS``, ``FLEET_VISIBILITY_TIMEOUT``, ``FLEET_DRIVER_LEASE_SECONDS``, ``FLEET_DB_OUTAGE_SECONDS``,
which are passed on to the nodes.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import re
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection, task
from invoke.exceptions import Exit

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = Path(__file__).resolve().parent / "templates"
PASSED_ON = (
    "FLEET_LEASE_SECONDS",
    "FLEET_HEARTBEAT_SECONDS",
    "FLEET_MAX_ATTEMPTS",
    "FLEET_MAX_NODE_FAULTS",
    "FLEET_REQUEUE_SECONDS",
    "FLEET_VISIBILITY_TIMEOUT",
    "FLEET_DRIVER_LEASE_SECONDS",
    "FLEET_DB_OUTAGE_SECONDS",
)
DEFAULT_STOP_TIMEOUT = 840  # as `fleet worker --stop-timeout`, compose.yaml and .env.example; systemd waits 60 s more
# The driver measures nothing: on SIGTERM it lets go of its campaigns' leases and exits, so a minute is plenty.
DRIVER_STOP_TIMEOUT = 60
# What a node may run, in the order they start (and stop in reverse: the driver lets go before the workers).
ROLES = ("workers", "driver")


@dataclass(frozen=True)
class Node:
    """Where Fleet lives on one node and how its workers and driver are run.

    Parameters
    ----------
    systemd:
        Whether they are systemd units (else the plain supervisor with a pid file each).
    prefix:
        Fleet's directory: the virtual environment, wheelhouses, logs, pid file, cache.
    env_file:
        The node's environment file (mode 0600).
    user:
        The unprivileged account they run as.
    """

    systemd: bool
    prefix: str
    env_file: str
    user: str

    @property
    def venv(self) -> str:
        return f"{self.prefix}/venv"

    @property
    def credentials(self) -> str:
        """The folder of the URL files (beside the environment file): root's under systemd, else the user's."""
        return os.path.dirname(self.env_file)

    @property
    def cache(self) -> str:
        return f"{self.prefix}/cache"

    @property
    def logs(self) -> str:
        return f"{self.prefix}/logs"

    def pid_file(self, role: str) -> str:
        """The supervisor's pid file of ``role``: ``run/worker.pid`` (the launcher) or ``run/driver.pid``."""
        return f"{self.prefix}/run/{_process(role)}.pid"


def _process(role: str) -> str:
    """``worker`` or ``driver``: the ``fleet`` command a role runs, which names its pid and args files."""
    return "worker" if role == "workers" else role


def _q(text: str) -> str:
    return shlex.quote(text)


def node_layout(c: Connection) -> Node:
    """Detect systemd and the login account on ``c``'s host, and where Fleet goes there."""
    systemd = c.run("test -d /run/systemd/system", warn=True, hide=True).ok
    uid = int(c.run("id -u", hide=True).stdout.strip())
    user = c.run("id -un", hide=True).stdout.strip()
    if systemd and uid == 0:
        return Node(True, "/opt/fleet", "/etc/fleet/node.env", "fleet")
    if uid == 0:
        raise Exit(
            f"{c.original_host}: no systemd and logged in as root; log in as the unprivileged user Fleet runs as"
        )
    home = c.run('printf %s "$HOME"', hide=True).stdout.strip()
    return Node(False, f"{home}/fleet", f"{home}/fleet/node.env", user)


# -- the wheelhouse -----------------------------------------------------------------------------------------


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([ROOT / "pyproject.toml", *ROOT.glob("fleet/**/*")]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _interpreter_tag(python: str) -> str:
    """``3.11.2-x86_64``: what a wheelhouse built with ``python`` is valid for (markers and wheel tags)."""
    probe = "import platform, sys; print('%d.%d.%d-%s' % (*sys.version_info[:3], platform.machine()))"
    return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def build_wheelhouse(directory: Path | None = None, python: str | None = None) -> Path:
    """Wheels of Fleet and all its dependencies for the nodes' Python, built once per source digest.

    pip resolves environment markers for the interpreter it runs under, so the wheels are built by a
    virtual environment of ``python``, which must be the nodes' Python (same version and machine).

    Parameters
    ----------
    directory:
        Where to put it; ``FLEET_WHEELHOUSE`` or ``dist/wheelhouse-<digest>-<python>`` by default. An
        existing wheelhouse there is reused as it is.
    python:
        The interpreter matching the nodes'; ``FLEET_NODE_PYTHON``, else ``python3`` on PATH.
    """
    python = python or os.environ.get("FLEET_NODE_PYTHON") or "python3"
    tag = _interpreter_tag(python)
    if directory is None and os.environ.get("FLEET_WHEELHOUSE"):
        directory = Path(os.environ["FLEET_WHEELHOUSE"])
    directory = directory or ROOT / "dist" / f"wheelhouse-{_sources_digest()}-{tag}"
    if (directory / "python.txt").exists():
        return directory  # built whole: python.txt is written last
    builder = ROOT / "dist" / f"build-venv-{tag}"
    # pip builds in the checkout's own build/ folder: two deploys from one checkout take turns. A wheelhouse without
    # python.txt is looked at only under the lock, so that deploys started together never take one half built.
    builder.parent.mkdir(exist_ok=True)
    with (builder.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (directory / "python.txt").exists() or any(directory.glob("fleet_tune-*.whl")):
            return directory  # built while this one waited, or made by hand (no python.txt) and taken as it is
        directory.mkdir(parents=True, exist_ok=True)
        if not (builder / "bin" / "python").exists():
            subprocess.run([python, "-m", "venv", str(builder)], check=True)
        # pip's cache makes a rebuild after a source change take seconds.
        argv = [str(builder / "bin" / "python"), "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(directory)]
        if subprocess.run([*argv, str(ROOT)], check=False).returncode != 0:
            # pip has said why above; what is left to say is what to do where this machine is as cut off as the nodes.
            raise Exit(
                f"pip could not build the wheelhouse for Python {tag} (above); where this machine cannot reach the "
                "package index, build it where pip can and name it with --wheelhouse or FLEET_WHEELHOUSE"
            )
        (directory / "python.txt").write_text(tag + "\n")
    return directory


def _tarball(wheelhouse: Path) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for wheel in sorted(wheelhouse.glob("*.whl")):
            info = tar.gettarinfo(str(wheel), arcname=wheel.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with wheel.open("rb") as handle:
                tar.addfile(info, handle)
    data = buffer.getvalue()
    return data, hashlib.sha256(data).hexdigest()[:16]


def check_python(c: Connection, wheelhouse: Path) -> None:
    """Refuse a node whose ``python3`` is not the Python the wheelhouse was built for."""
    built_for = (wheelhouse / "python.txt").read_text().strip() if (wheelhouse / "python.txt").exists() else None
    node_python = c.run(
        "python3 -c \"import platform, sys; print('%d.%d.%d-%s' % (*sys.version_info[:3], platform.machine()))\"",
        hide=True,
    ).stdout.strip()
    if built_for and built_for != node_python:
        raise Exit(
            f"{c.original_host}: the wheelhouse is for Python {built_for}, the node runs {node_python}; "
            "set FLEET_NODE_PYTHON to a matching interpreter"
        )


def install(c: Connection, node: Node, wheelhouse: Path) -> str:
    """Upload the wheelhouse (unless the node has it) and install Fleet from it, offline; returns the version."""
    data, digest = _tarball(wheelhouse)
    remote = f"{node.prefix}/wheelhouse/{digest}"
    c.run(f"mkdir -p {_q(node.prefix)}/wheelhouse {_q(node.cache)} {_q(node.logs)} {_q(node.prefix)}/run", hide=True)
    if not c.run(f"test -f {_q(remote)}/.complete", warn=True, hide=True).ok:
        c.run(f"rm -rf {_q(remote)} && mkdir -p {_q(remote)}", hide=True)
        c.put(io.BytesIO(data), f"{remote}.tar")
        c.run(f"tar -xf {_q(remote)}.tar -C {_q(remote)} && rm {_q(remote)}.tar && touch {_q(remote)}/.complete")
    python = f"{node.venv}/bin/python"
    if not c.run(f"test -x {_q(python)}", warn=True, hide=True).ok:
        c.run(f"python3 -m venv {_q(node.venv)}", hide=True)
    c.run(
        f"{_q(python)} -m pip install --quiet --no-index --find-links {_q(remote)} --upgrade --force-reinstall "
        f"--no-deps fleet-tune && {_q(python)} -m pip install --quiet --no-index --find-links {_q(remote)} fleet-tune",
        hide=True,
    )
    # Keep the two newest wheelhouses: room for a rollback, not a growing pile.
    c.run(
        f"cd {_q(node.prefix)}/wheelhouse && ls -1t | grep -v -x {_q(digest)} | tail -n +2 | xargs -r rm -rf",
        hide=True,
    )
    return c.run(f"{_q(node.venv)}/bin/fleet --version", hide=True).stdout.strip()


# -- the environment file and the units ---------------------------------------------------------------------


# The secrets, each in a file of its own (mode 0600) beside the environment file, never in it: a unit loads them
# as systemd credentials (LoadCredential=, read by Fleet from $CREDENTIALS_DIRECTORY), a plain node names them
# with FLEET_*_URL_FILE. No process's environment then holds a password.
SECRET_FILES = {"FLEET_DATABASE_URL": "database-url", "FLEET_BROKER_URL": "broker-url"}


def split_secrets(node: Node, values: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The environment file's values, and the secret files' contents by path."""
    plain = {k: v for k, v in values.items() if k not in SECRET_FILES}
    files = {f"{node.credentials}/{name}": values[key] for key, name in SECRET_FILES.items() if key in values}
    if not node.systemd:
        plain |= {f"{key}_FILE": f"{node.credentials}/{name}" for key, name in SECRET_FILES.items() if key in values}
    return plain, files


def node_environment(
    host: str, node: Node, *, target: str | None, gpus: str | None, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """The node's environment: URLs from the deploying user's environment, the node's name and targets."""
    environ = dict(os.environ if environ is None else environ)
    missing = [name for name in ("FLEET_DATABASE_URL", "FLEET_BROKER_URL") if not environ.get(name)]
    if missing:
        raise Exit(f"set {' and '.join(missing)} in your environment: the nodes get them from it")
    values = {
        "FLEET_DATABASE_URL": environ["FLEET_DATABASE_URL"],
        "FLEET_BROKER_URL": environ["FLEET_BROKER_URL"],
        "FLEET_HOME": f"{node.prefix}/home",
        "FLEET_CACHE_DIR": node.cache,
        "FLEET_NODE_NAME": host,
        "FLEET_NODE_TARGET": target or "",
        "FLEET_NODE_GPUS": gpus or "",
        "FLEET_STOP_TIMEOUT": str(stop_timeout(environ)),
        "PYTHONUNBUFFERED": "1",
    }
    values.update({name: environ[name] for name in PASSED_ON if environ.get(name)})
    return values


def stop_timeout(environ: dict[str, str] | None = None) -> int:
    raw = (os.environ if environ is None else environ).get("FLEET_STOP_TIMEOUT") or DEFAULT_STOP_TIMEOUT
    return int(float(raw))


def render_environment(values: dict[str, str]) -> str:
    """``KEY='value'`` lines that both systemd's ``EnvironmentFile=`` and a POSIX shell read the same way."""
    lines = ["# Written by fab deploy; holds secrets (mode 0600)."]
    for key, value in values.items():
        if "'" in value or "\n" in value:
            raise Exit(f"{key} holds a quote or a newline, which an environment file cannot carry")
        lines.append(f"{key}='{value}'")
    return "\n".join(lines) + "\n"


def worker_args(target: str | None, gpus: str | None, eval_procs: int | None, build_procs: int | None) -> list[str]:
    args = []
    if target:
        args += ["--target", target]
    if gpus:
        args += ["--gpus", gpus]
    if eval_procs:
        args += ["--eval-procs", str(eval_procs)]
    if build_procs:
        args += ["--build-procs", str(build_procs)]
    return args


def driver_args(host: str, max_campaigns: int | None) -> list[str]:
    """``fleet driver`` options: named after the node as its workers are, so ``fleet status`` says where it runs."""
    args = ["--name", f"driver@{host}"]
    if max_campaigns:
        args += ["--max-campaigns", str(max_campaigns)]
    return args


def parse_roles(text: str) -> list[str]:
    """``--role``'s value (``workers``, ``driver`` or ``workers,driver``) in :data:`ROLES` order."""
    asked = {role.strip() for role in text.split(",") if role.strip()}
    if not asked or asked - set(ROLES):
        raise Exit(f"--role takes {' or '.join(ROLES)}, or both comma-separated; not {text!r}")
    return [role for role in ROLES if role in asked]


def _render(template: str, values: dict[str, str]) -> str:
    text = (TEMPLATES / template).read_text()
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def render_units(node: Node, args: list[str], gpu_indices: list[int], timeout: int) -> dict[str, str]:
    """The workers' systemd unit files: an evaluation template per GPU (or one CPU unit) and a build unit.

    Parameters
    ----------
    args:
        ``fleet worker`` options for the node (target, eval/build processes), without ``--gpus``.
    gpu_indices:
        The node's GPUs; empty for a CPU node.
    timeout:
        Seconds a stop waits for the running measurement (the unit adds a margin for the shutdown itself).
    """
    fleet = f"{node.venv}/bin/fleet"
    common = {
        "@USER@": node.user,
        "@ENV_FILE@": node.env_file,
        "@CREDENTIALS@": node.credentials,
        "@HOME@": f"{node.prefix}/home",
        "@CACHE@": node.cache,
        "@LOGS@": node.logs,
        "@TIMEOUT@": str(timeout + 60),
    }

    def unit(description: str, argv: list[str]) -> str:
        return _render("fleet-worker.service.in", {**common, "@DESCRIPTION@": description, "@EXEC@": " ".join(argv)})

    worker = [fleet, "worker", *args, "--stop-timeout", str(timeout)]
    units = {"fleet-build.service": unit("Fleet build worker", [*worker, "--role", "build"])}
    if gpu_indices:
        # Each evaluation unit names its one GPU: the node's own --gpus, given in ``args``, would be a second.
        own = [fleet, "worker", *_without_option(args, "--gpus"), "--stop-timeout", str(timeout)]
        units["fleet-eval@.service"] = unit(
            "Fleet evaluation worker on GPU %i", [*own, "--role", "eval", "--gpus", "%i"]
        )
    else:
        units["fleet-eval.service"] = unit("Fleet evaluation worker (CPU)", [*worker, "--role", "eval"])
    return units


def _without_option(args: list[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value (``--gpus 0,1`` or ``--gpus=0,1``)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return kept


DRIVER_UNIT = "fleet-driver.service"


def render_driver_unit(node: Node, args: list[str]) -> str:
    """``fleet-driver.service``: ``fleet driver`` with ``args`` as the node's user, stopped within a minute."""
    return _render(
        "fleet-driver.service.in",
        {
            "@USER@": node.user,
            "@ENV_FILE@": node.env_file,
            "@CREDENTIALS@": node.credentials,
            "@HOME@": f"{node.prefix}/home",
            "@EXEC@": " ".join([f"{node.venv}/bin/fleet", "driver", *args]),
            "@TIMEOUT@": str(DRIVER_STOP_TIMEOUT),
        },
    )


def unit_names(gpu_indices: list[int], roles: tuple[str, ...] | list[str] = ("workers",)) -> list[str]:
    """The node's units for ``roles``, in the order they start."""
    names = []
    if "workers" in roles:
        names += [f"fleet-eval@{i}.service" for i in gpu_indices] or ["fleet-eval.service"]
        names.append("fleet-build.service")
    if "driver" in roles:
        names.append(DRIVER_UNIT)
    return names


# A dry run's evaluation worker line: eval-gpu0@node1, or eval-gpu0-sm_90@node1 for a GPU named by --target.
_EVAL_GPU = re.compile(r"eval-gpu(\d+)[-@]")


def _gpu_indices(c: Connection, node: Node, target: str | None, gpus: str | None) -> list[int]:
    """The GPUs ``fleet worker`` would use on the node, from its own dry run."""
    command = [f"{node.venv}/bin/fleet", "worker", "--dry-run", *worker_args(target, gpus, None, None)]
    out = c.run(" ".join(_q(a) for a in command), hide=True).stdout
    return sorted(int(found.group(1)) for line in out.splitlines() if (found := _EVAL_GPU.match(line)))


def _write_lines(c: Connection, path: str, lines: list[str]) -> None:
    c.run(f"printf '%s\\n' {' '.join(_q(a) for a in lines)} > {_q(path)}" if lines else f": > {_q(path)}")


def configure(
    c: Connection,
    node: Node,
    values: dict[str, str],
    *,
    roles: list[str],
    target: str | None,
    gpus: str | None,
    eval_procs: int | None,
    build_procs: int | None,
    max_campaigns: int | None,
) -> None:
    """Write the node's environment file (0600) with ``values``, what it runs and, with systemd, its units."""
    directory = os.path.dirname(node.env_file)
    plain, secrets = split_secrets(node, values)
    for path, text in [(node.env_file, render_environment(plain)), *((p, v + "\n") for p, v in secrets.items())]:
        c.run(f"mkdir -p {_q(directory)} && umask 077 && : > {_q(path)} && chmod 600 {_q(path)}")
        c.put(io.StringIO(text), path)
        c.run(f"chmod 600 {_q(path)}")
    args = {
        "workers": worker_args(target, gpus, eval_procs, build_procs),
        "driver": driver_args(c.original_host, max_campaigns),
    }
    for role in roles:
        _write_lines(c, f"{node.prefix}/{_process(role)}.args", args[role])
    _write_lines(c, f"{node.prefix}/roles", roles)
    if not node.systemd:
        return
    units: dict[str, str] = {}
    indices: list[int] = []
    if "workers" in roles:
        indices = _gpu_indices(c, node, target, gpus)
        unit_args = worker_args(target, None, eval_procs, build_procs)  # each evaluation unit names its GPU
        units.update(render_units(node, unit_args, indices, stop_timeout()))
    if "driver" in roles:
        units[DRIVER_UNIT] = render_driver_unit(node, args["driver"])
    for name, text in units.items():
        c.put(io.StringIO(text), f"/etc/systemd/system/{name}")
    c.run(f"chown -R {_q(node.user)}: {_q(node.cache)} {_q(node.logs)} {_q(node.prefix)}/run")
    c.run(f"mkdir -p {_q(node.prefix)}/home && chown {_q(node.user)}: {_q(node.prefix)}/home")
    names = unit_names(indices, roles)
    # A unit this deploy drops (a role no longer asked for, a GPU gone) must not come back at the next boot.
    dropped = [name for name in _units(c, node).split() if name not in names]
    if dropped:
        c.run(f"systemctl disable --now {' '.join(dropped)}", warn=True)
    _write_lines(c, f"{node.prefix}/units", names)
    c.run("systemctl daemon-reload")


def _ensure_user(c: Connection, node: Node) -> None:
    if node.systemd and not c.run(f"id -u {_q(node.user)}", warn=True, hide=True).ok:
        c.run(f"useradd --system --home-dir {_q(node.prefix)} --shell /usr/sbin/nologin {_q(node.user)}")


# -- running the workers and the driver ---------------------------------------------------------------------


def _units(c: Connection, node: Node) -> str:
    """The node's unit names, as the last deploy wrote them; empty before the first."""
    return " ".join(c.run(f"cat {_q(node.prefix)}/units 2>/dev/null", warn=True, hide=True).stdout.split())


def _roles(c: Connection, node: Node) -> list[str]:
    """What the last deploy set the node to run; ``workers`` where no deploy wrote it (the roles came later)."""
    written = c.run(f"cat {_q(node.prefix)}/roles 2>/dev/null", warn=True, hide=True).stdout.split()
    return [role for role in ROLES if role in written] if written else ["workers"]


def _command(node: Node, role: str) -> tuple[str, str]:
    """What the supervisor runs for ``role`` (sh, once the environment file is read) and the log it writes to."""
    fleet = f"exec {_q(node.venv)}/bin/fleet {_process(role)} $(cat {_q(node.prefix)}/{_process(role)}.args)"
    if role == "driver":
        return fleet, f"{node.logs}/driver.log"
    return f'{fleet} --stop-timeout "$FLEET_STOP_TIMEOUT" --log-dir {_q(node.logs)}', f"{node.logs}/launcher.log"


def start_node(c: Connection, node: Node) -> None:
    """Start what the node was deployed to run: its workers, its driver, or both."""
    if node.systemd:
        units = _units(c, node)
        if not c.run(f"systemctl enable --now {units}", warn=True).ok:
            # A worker unit's check of its node (ExecStartPre) failed: its one line is in the journal.
            failed = [u for u in units.split() if not c.run(f"systemctl is-active --quiet {u}", warn=True).ok]
            journal = f"journalctl --no-pager -o cat -n 50 {' '.join('-u ' + u for u in failed or units.split())}"
            why = c.run(f"{journal} | grep -m 1 'fleet: error'", warn=True, hide=True).stdout.strip()
            raise Exit(f"{c.original_host}: {' '.join(failed) or units} not started: {why or 'fab logs says why'}")
        return
    for role in _roles(c, node):
        _start(c, node, role)


def _start(c: Connection, node: Node, role: str) -> None:
    if _running_pid(c, node, role):
        print(f"{c.original_host}: {role} already running")
        return
    pid_file = node.pid_file(role)
    command, log = _command(node, role)
    # setsid -f detaches from this SSH session; the pid file names the process that `stop` signals (a
    # stale one is removed first, so the wait below sees the new process's).
    script = f"set -a; . {_q(node.env_file)}; set +a; cd {_q(node.prefix)}; echo $$ > {_q(pid_file)}; {command}"
    c.run(f"rm -f {_q(pid_file)}; setsid -f sh -c {_q(script)} >> {_q(log)} 2>&1 < /dev/null", hide=True)
    c.run(f"for i in $(seq 50); do test -s {_q(pid_file)} && break; sleep 0.1; done; test -s {_q(pid_file)}", hide=True)
    print(f"{c.original_host}: {role} started (pid {_running_pid(c, node, role)})")


def _running_pid(c: Connection, node: Node, role: str) -> int | None:
    result = c.run(
        f'pid=$(cat {_q(node.pid_file(role))} 2>/dev/null) && kill -0 "$pid" 2>/dev/null && echo $pid',
        warn=True,
        hide=True,
    )
    return int(result.stdout.strip()) if result.ok and result.stdout.strip() else None


def stop_node(c: Connection, node: Node) -> None:
    """Warm shutdown of what the node runs, the driver first; returns once it has ended."""
    if node.systemd:
        units = _units(c, node)
        if units:
            c.run(f"systemctl stop {units}")
        return
    for role in reversed(_roles(c, node)):
        _stop(c, node, role)


def _stop(c: Connection, node: Node, role: str) -> None:
    """SIGTERM: the launcher's workers each finish their measurement, the driver lets go of its campaigns."""
    pid = _running_pid(c, node, role)
    if pid is None:
        print(f"{c.original_host}: {role} not running")
        return
    wait = DRIVER_STOP_TIMEOUT if role == "driver" else stop_timeout() + 60
    c.run(
        f"kill -TERM {pid}; for i in $(seq {wait * 5}); do kill -0 {pid} 2>/dev/null || break; sleep 0.2; done; "
        f"if kill -0 {pid} 2>/dev/null; then echo 'still running after {wait} s' >&2; exit 1; fi; "
        f"rm -f {_q(node.pid_file(role))}",
        hide=True,
    )
    print(f"{c.original_host}: {role} stopped")


# -- the tasks ----------------------------------------------------------------------------------------------


@task(
    help={
        "role": "What the node runs: workers (the default), driver, or workers,driver.",
        "target": "The node's target (default: detected from its GPUs, else its CPU).",
        "gpus": "GPU indices to use, e.g. 0,1 (default: every GPU found).",
        "eval_procs": "Evaluation processes on a CPU node.",
        "build_procs": "Build concurrency (default: the node's cores).",
        "max_campaigns": "Campaigns the driver drives at once (default: fleet driver's).",
        "wheelhouse": "Install from this wheelhouse instead of building one.",
    }
)
def deploy(
    c, role="workers", target=None, gpus=None, eval_procs=None, build_procs=None, max_campaigns=None, wheelhouse=None
):
    """Install Fleet on the node, write its environment and units, and start its workers or driver."""
    node = node_layout(c)
    # Everything that can refuse does so before the node changes.
    roles = parse_roles(role)
    values = node_environment(c.original_host, node, target=target, gpus=gpus)
    wheels = build_wheelhouse(Path(wheelhouse) if wheelhouse else None)
    check_python(c, wheels)
    _ensure_user(c, node)
    # Stopped first (warmly): a running process must not import from a virtual environment being replaced.
    stop_node(c, node)
    version = install(c, node, wheels)
    configure(
        c,
        node,
        values,
        roles=roles,
        target=target,
        gpus=gpus,
        eval_procs=int(eval_procs) if eval_procs else None,
        build_procs=int(build_procs) if build_procs else None,
        max_campaigns=int(max_campaigns) if max_campaigns else None,
    )
    start_node(c, node)
    mode = "systemd" if node.systemd else "supervisor"
    print(f"{c.original_host}: deployed {version} ({mode}, {node.prefix}; {' and '.join(roles)})")


@task(help={"wheelhouse": "Install from this wheelhouse instead of building one."})
def upgrade(c, wheelhouse=None):
    """Install a new build of Fleet and restart the workers and driver (warmly); the environment file stays."""
    node = node_layout(c)
    wheels = build_wheelhouse(Path(wheelhouse) if wheelhouse else None)
    check_python(c, wheels)
    stop_node(c, node)
    version = install(c, node, wheels)
    start_node(c, node)
    print(f"{c.original_host}: upgraded to {version}")


@task
def start(c):
    """Start the node's workers or driver."""
    start_node(c, node_layout(c))


@task
def stop(c):
    """Stop the node's workers and driver; each worker finishes its current measurement first."""
    stop_node(c, node_layout(c))


@task
def restart(c):
    """Stop the workers and driver warmly, then start them."""
    node = node_layout(c)
    stop_node(c, node)
    start_node(c, node)


@task
def status(c):
    """Whether the node's workers and driver run."""
    node = node_layout(c)
    if node.systemd:
        c.run(f"systemctl --no-pager status {_units(c, node)}")
        return
    for role in _roles(c, node):
        pid = _running_pid(c, node, role)
        print(f"{c.original_host}: {role} running (pid {pid})" if pid else f"{c.original_host}: {role} stopped")


@task(help={"lines": "How many lines of each log."})
def logs(c, lines=50):
    """The last lines of the node's worker and driver logs."""
    node = node_layout(c)
    if node.systemd:
        c.run(f"journalctl --no-pager -n {int(lines)} {' '.join('-u ' + u for u in _units(c, node).split())}")
        return
    c.run(f"cd {_q(node.logs)} && find . -name '*.log' -type f | sort | xargs -r tail -n {int(lines)}")
