"""Deploy Fleet's workers to nodes over SSH (Fabric 3): ``fab -r deploy -H node1,node2 deploy``.

``deploy`` builds a wheelhouse of Fleet and every dependency on this machine (``pip wheel``, once, then
reused while the sources do not change), uploads it (GPU nodes are often air-gapped), installs it into a
virtual environment on the node with ``pip --no-index --find-links``, writes the node's environment file
(mode 0600: the broker and database URLs from *your* environment, the node's name and targets), and starts
the workers. ``start``, ``stop``, ``restart``, ``status``, ``logs`` and ``upgrade`` do what they say.

Two ways to run the workers, chosen per node:

- **systemd** (the node runs it, and you log in as root): a ``fleet`` system user runs them; Fleet lives in
  ``/opt/fleet``, the environment file is ``/etc/fleet/node.env``; one ``fleet-eval@<gpu>.service`` per GPU
  (or ``fleet-eval.service`` for a CPU node) and one ``fleet-build.service``, with ``KillMode=mixed`` and a
  ``TimeoutStopSec`` longer than the longest measurement, so a restart lets the running one finish.
- **supervisor** (no systemd, e.g. a container): everything lives under ``~/fleet`` of the SSH user, which
  must not be root; ``fleet worker`` runs detached (``setsid``) with a pid file, and ``stop`` sends it
  SIGTERM and waits for the warm shutdown to end.

The artifact cache (``FLEET_CACHE_DIR``) is outside the virtual environment, so a redeploy keeps it.
Environment read here: ``FLEET_DATABASE_URL`` and ``FLEET_BROKER_URL`` (required), ``FLEET_STOP_TIMEOUT``
(seconds a stop waits for a measurement, default 840), ``FLEET_WHEELHOUSE`` (a wheelhouse to reuse),
``FLEET_NODE_PYTHON`` (the interpreter that builds it: the nodes' Python, default ``python3``), and
``FLEET_LEASE_SECONDS``, ``FLEET_HEARTBEAT_SECONDS``, ``FLEET_MAX_ATTEMPTS``, ``FLEET_REQUEUE_SECONDS``,
``FLEET_VISIBILITY_TIMEOUT``, which are passed on to the nodes.
"""

from __future__ import annotations

import hashlib
import io
import os
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
    "FLEET_REQUEUE_SECONDS",
    "FLEET_VISIBILITY_TIMEOUT",
)
DEFAULT_STOP_TIMEOUT = 840  # as `fleet worker --stop-timeout`, compose.yaml and .env.example; systemd waits 60 s more


@dataclass(frozen=True)
class Node:
    """Where Fleet lives on one node and how its workers are run.

    Parameters
    ----------
    systemd:
        Whether the workers are systemd units (else the plain supervisor with a pid file).
    prefix:
        Fleet's directory: the virtual environment, wheelhouses, logs, pid file, cache.
    env_file:
        The node's environment file (mode 0600).
    user:
        The unprivileged account the workers run as.
    """

    systemd: bool
    prefix: str
    env_file: str
    user: str

    @property
    def venv(self) -> str:
        return f"{self.prefix}/venv"

    @property
    def cache(self) -> str:
        return f"{self.prefix}/cache"

    @property
    def logs(self) -> str:
        return f"{self.prefix}/logs"

    @property
    def pid_file(self) -> str:
        return f"{self.prefix}/run/worker.pid"


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
            f"{c.original_host}: no systemd and logged in as root; log in as the unprivileged user the workers run as"
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
    if any(directory.glob("fleet_tune-*.whl")):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    builder = ROOT / "dist" / f"build-venv-{tag}"
    if not (builder / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(builder)], check=True)
    # pip's cache makes a rebuild after a source change take seconds.
    subprocess.run(
        [str(builder / "bin" / "python"), "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(directory), str(ROOT)],
        check=True,
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


def render_units(node: Node, args: list[str], gpu_indices: list[int], timeout: int) -> dict[str, str]:
    """The systemd unit files for a node: an evaluation template per GPU (or one CPU unit) and a build unit.

    Parameters
    ----------
    args:
        ``fleet worker`` options for the node (target, eval/build processes), without ``--gpus``.
    gpu_indices:
        The node's GPUs; empty for a CPU node.
    timeout:
        Seconds a stop waits for the running measurement (the unit adds a margin for the shutdown itself).
    """
    template = (TEMPLATES / "fleet-worker.service.in").read_text()
    fleet = f"{node.venv}/bin/fleet"
    common = {
        "@USER@": node.user,
        "@ENV_FILE@": node.env_file,
        "@HOME@": f"{node.prefix}/home",
        "@CACHE@": node.cache,
        "@LOGS@": node.logs,
        "@TIMEOUT@": str(timeout + 60),
    }

    def unit(description: str, argv: list[str]) -> str:
        text = template
        for key, value in {**common, "@DESCRIPTION@": description, "@EXEC@": " ".join(argv)}.items():
            text = text.replace(key, value)
        return text

    worker = [fleet, "worker", *args, "--stop-timeout", str(timeout)]
    units = {"fleet-build.service": unit("Fleet build worker", [*worker, "--role", "build"])}
    if gpu_indices:
        units["fleet-eval@.service"] = unit(
            "Fleet evaluation worker on GPU %i", [*worker, "--role", "eval", "--gpus", "%i"]
        )
    else:
        units["fleet-eval.service"] = unit("Fleet evaluation worker (CPU)", [*worker, "--role", "eval"])
    return units


def unit_names(gpu_indices: list[int]) -> list[str]:
    evals = [f"fleet-eval@{i}.service" for i in gpu_indices] or ["fleet-eval.service"]
    return [*evals, "fleet-build.service"]


def _gpu_indices(c: Connection, node: Node, target: str | None, gpus: str | None) -> list[int]:
    """The GPUs ``fleet worker`` would use on the node, from its own dry run."""
    command = [f"{node.venv}/bin/fleet", "worker", "--dry-run", *worker_args(target, gpus, None, None)]
    out = c.run(" ".join(_q(a) for a in command), hide=True).stdout
    return sorted(int(line.split("eval-gpu", 1)[1].split("@", 1)[0]) for line in out.splitlines() if "eval-gpu" in line)


def configure(
    c: Connection,
    node: Node,
    values: dict[str, str],
    *,
    target: str | None,
    gpus: str | None,
    eval_procs: int | None,
    build_procs: int | None,
) -> None:
    """Write the node's environment file (0600) with ``values`` and, with systemd, its units."""
    directory = os.path.dirname(node.env_file)
    c.run(f"mkdir -p {_q(directory)} && umask 077 && : > {_q(node.env_file)} && chmod 600 {_q(node.env_file)}")
    c.put(io.StringIO(render_environment(values)), node.env_file)
    c.run(f"chmod 600 {_q(node.env_file)}")
    args = worker_args(target, gpus, eval_procs, build_procs)
    c.run(
        f"printf '%s\\n' {' '.join(_q(a) for a in args)} > {_q(node.prefix)}/worker.args"
        if args
        else f": > {_q(node.prefix)}/worker.args"
    )
    if not node.systemd:
        return
    indices = _gpu_indices(c, node, target, gpus)
    unit_args = worker_args(target, None, eval_procs, build_procs)  # each evaluation unit names its GPU
    for name, text in render_units(node, unit_args, indices, stop_timeout()).items():
        c.put(io.StringIO(text), f"/etc/systemd/system/{name}")
    c.run(f"chown -R {_q(node.user)}: {_q(node.cache)} {_q(node.logs)} {_q(node.prefix)}/run")
    c.run(f"mkdir -p {_q(node.prefix)}/home && chown {_q(node.user)}: {_q(node.prefix)}/home")
    c.run(f"printf '%s\\n' {' '.join(unit_names(indices))} > {_q(node.prefix)}/units")
    c.run("systemctl daemon-reload")


def _ensure_user(c: Connection, node: Node) -> None:
    if node.systemd and not c.run(f"id -u {_q(node.user)}", warn=True, hide=True).ok:
        c.run(f"useradd --system --home-dir {_q(node.prefix)} --shell /usr/sbin/nologin {_q(node.user)}")


# -- running the workers ------------------------------------------------------------------------------------


def _units(c: Connection, node: Node) -> str:
    """The node's unit names, as the last deploy wrote them; empty before the first."""
    return " ".join(c.run(f"cat {_q(node.prefix)}/units 2>/dev/null", warn=True, hide=True).stdout.split())


def start_workers(c: Connection, node: Node) -> None:
    if node.systemd:
        units = _units(c, node)
        c.run(f"systemctl enable --now {units}")
        return
    if _running_pid(c, node):
        print(f"{c.original_host}: workers already running")
        return
    # setsid -f detaches from this SSH session; the pid file names the launcher that `stop` signals.
    script = (
        f"set -a; . {_q(node.env_file)}; set +a; cd {_q(node.prefix)}; "
        f"echo $$ > {_q(node.pid_file)}; "
        f"exec {_q(node.venv)}/bin/fleet worker $(cat {_q(node.prefix)}/worker.args) "
        f'--stop-timeout "$FLEET_STOP_TIMEOUT" --log-dir {_q(node.logs)}'
    )
    c.run(
        f"setsid -f sh -c {_q(script)} >> {_q(node.logs)}/launcher.log 2>&1 < /dev/null",
        hide=True,
    )
    c.run(
        f"for i in $(seq 50); do test -s {_q(node.pid_file)} && break; sleep 0.1; done; test -s {_q(node.pid_file)}",
        hide=True,
    )
    print(f"{c.original_host}: workers started (pid {_running_pid(c, node)})")


def _running_pid(c: Connection, node: Node) -> int | None:
    result = c.run(
        f'pid=$(cat {_q(node.pid_file)} 2>/dev/null) && kill -0 "$pid" 2>/dev/null && echo $pid', warn=True, hide=True
    )
    return int(result.stdout.strip()) if result.ok and result.stdout.strip() else None


def stop_workers(c: Connection, node: Node) -> None:
    """Warm shutdown: the launcher gets SIGTERM, each worker finishes its measurement; wait for the end."""
    if node.systemd:
        units = _units(c, node)
        if units:
            c.run(f"systemctl stop {units}")
        return
    pid = _running_pid(c, node)
    if pid is None:
        print(f"{c.original_host}: workers not running")
        return
    wait = stop_timeout() + 60
    c.run(
        f"kill -TERM {pid}; for i in $(seq {wait * 5}); do kill -0 {pid} 2>/dev/null || break; sleep 0.2; done; "
        f"if kill -0 {pid} 2>/dev/null; then echo 'still running after {wait} s' >&2; exit 1; fi; "
        f"rm -f {_q(node.pid_file)}",
        hide=True,
    )
    print(f"{c.original_host}: workers stopped")


# -- the tasks ----------------------------------------------------------------------------------------------


@task(
    help={
        "target": "The node's target (default: detected from its GPUs, else its CPU).",
        "gpus": "GPU indices to use, e.g. 0,1 (default: every GPU found).",
        "eval_procs": "Evaluation processes on a CPU node.",
        "build_procs": "Build concurrency (default: the node's cores).",
        "wheelhouse": "Install from this wheelhouse instead of building one.",
    }
)
def deploy(c, target=None, gpus=None, eval_procs=None, build_procs=None, wheelhouse=None):
    """Install Fleet on the node, write its environment and units, and start its workers."""
    node = node_layout(c)
    # Everything that can refuse does so before the node changes.
    values = node_environment(c.original_host, node, target=target, gpus=gpus)
    wheels = build_wheelhouse(Path(wheelhouse) if wheelhouse else None)
    check_python(c, wheels)
    _ensure_user(c, node)
    # Stopped first (warmly): a running worker must not import from a virtual environment being replaced.
    stop_workers(c, node)
    version = install(c, node, wheels)
    configure(
        c,
        node,
        values,
        target=target,
        gpus=gpus,
        eval_procs=int(eval_procs) if eval_procs else None,
        build_procs=int(build_procs) if build_procs else None,
    )
    start_workers(c, node)
    print(f"{c.original_host}: deployed {version} ({'systemd' if node.systemd else 'supervisor'}, {node.prefix})")


@task(help={"wheelhouse": "Install from this wheelhouse instead of building one."})
def upgrade(c, wheelhouse=None):
    """Install a new build of Fleet and restart the workers (warmly); the environment file stays."""
    node = node_layout(c)
    wheels = build_wheelhouse(Path(wheelhouse) if wheelhouse else None)
    check_python(c, wheels)
    stop_workers(c, node)
    version = install(c, node, wheels)
    start_workers(c, node)
    print(f"{c.original_host}: upgraded to {version}")


@task
def start(c):
    """Start the node's workers."""
    start_workers(c, node_layout(c))


@task
def stop(c):
    """Stop the node's workers; each finishes its current measurement first."""
    stop_workers(c, node_layout(c))


@task
def restart(c):
    """Stop the workers warmly, then start them."""
    node = node_layout(c)
    stop_workers(c, node)
    start_workers(c, node)


@task
def status(c):
    """Whether the node's workers run."""
    node = node_layout(c)
    if node.systemd:
        c.run(f"systemctl --no-pager status {_units(c, node)}")
        return
    pid = _running_pid(c, node)
    print(f"{c.original_host}: running (pid {pid})" if pid else f"{c.original_host}: stopped")


@task(help={"lines": "How many lines of each log."})
def logs(c, lines=50):
    """The last lines of the node's worker logs."""
    node = node_layout(c)
    if node.systemd:
        c.run(f"journalctl --no-pager -n {int(lines)} {' '.join('-u ' + u for u in _units(c, node).split())}")
        return
    c.run(f"cd {_q(node.logs)} && find . -name '*.log' -type f | sort | xargs -r tail -n {int(lines)}")
