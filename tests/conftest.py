"""Shared fixtures: a private Redis and PostgreSQL for the session, and a Fleet environment per test.

Integration tests never skip: when a server cannot start, they fail, and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleet.services import PostgresServer, RedisServer
from fleet.store import Store

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
"""What the tests read, shipped in the repository (tests/data/README.md): never the development set beside it."""
SPACES = DATA / "tuning-spaces"
MIOPEN = DATA / "miopen"


def pytest_configure(config: pytest.Config) -> None:
    """Recorded spaces are looked up in the tests' samples, by the tests and by the workers they start (which
    inherit the environment), whatever a development checkout has beside it."""
    os.environ["FLEET_TUNING_SPACES"] = str(SPACES)


def _traversable(path: Path) -> None:
    """Let the workload account pass through ``path`` and the folders above it (execute bit only, no listing)."""
    for folder in (path, *path.parents):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o011)


@pytest.fixture(scope="session", autouse=True)
def _workloads_reach_their_tools() -> None:
    """Workloads run as ``nobody`` when the tests run as root (the sandbox never runs one as root), as on a real
    node where the service account's tools sit in folders others may pass through. Here the interpreter, the
    repository and pytest's folders sit under root-only ones (``/root``, pytest's 0700 folders): the workloads get
    the execute bit on the way to them, and files keep their own modes."""
    if os.geteuid() == 0:
        _traversable(Path(os.path.realpath(sys.executable)).parent)
        _traversable(ROOT)


@pytest.fixture(autouse=True)
def _tmp_path_reachable(request: pytest.FixtureRequest) -> None:
    if os.geteuid() == 0 and "tmp_path" in request.fixturenames:
        _traversable(request.getfixturevalue("tmp_path"))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    # Not under tmp_path: pytest resets its base directory to mode 0700 at each session start, which
    # locks out the `postgres` user that the server runs as when the tests run as root.
    directory = Path(tempfile.mkdtemp(prefix="fleet-test-pg-"))
    # fsync off: the tests crash PostgreSQL's processes, never the machine, so the page cache keeps every write.
    # After a crash the server fsyncs each file of every test's database before it answers (over 60 s late in a
    # parallel run); with fsync off it skips that.
    try:
        with PostgresServer(directory, settings={"fsync": "off"}) as server:
            yield server
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _migrate(url: str) -> None:
    store = Store(url)
    store.upgrade()
    store.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite database, which each test's copies: a copy takes far less than every migration."""
    path = tmp_path_factory.mktemp("template") / "fleet.db"
    _migrate(f"sqlite:///{path}")
    assert not path.with_name("fleet.db-wal").exists(), "the template's write-ahead log must be in the file"
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresServer) -> str:
    """A migrated, empty PostgreSQL database, which each test's database copies (CREATE DATABASE ... TEMPLATE)."""
    name = "fleet_template"
    _migrate(postgres_server.create_database(name))
    return name


def migrated_database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of a new, migrated, empty database of this test on ``backend`` (sqlite or postgresql)."""
    if backend == "sqlite":
        path = tmp_path / "fleet.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"t{uuid.uuid4().hex[:12]}", template=request.getfixturevalue("postgres_template"))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store on each backend: the store's contract holds on both."""
    s = Store(migrated_database(request.param, tmp_path, request))
    yield s
    s.close()


@dataclass
class Fleet:
    """A Fleet installation for one test: its environment, its store, and the processes it started."""

    env: dict[str, str]
    store: Store
    home: Path
    target: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cli(
        self, *args: str, timeout: float = 300, check: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``fleet ARGS`` in a subprocess with this installation's environment."""
        done = subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args],
            env={**self.env, **(env or {})},
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"fleet {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def start_worker(
        self, *args: str, expect: int = 2, env: dict[str, str] | None = None, log: str = "worker.log"
    ) -> subprocess.Popen[bytes]:
        """Start ``fleet worker ARGS`` (its own process group) and wait until ``expect`` workers registered."""
        before = {w.name for w in self.store.workers(within=2)}
        with (self.home / log).open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleet.cli", "worker", "--target", self.target, *args],
                env={**self.env, **(env or {})},
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        if expect:
            self.wait_for(
                lambda: len({w.name for w in self.store.workers(within=2)} - before) >= expect,
                timeout=60,
                what=f"workers to register (log: {self.home / log})",
            )
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        self._stop_all([proc], sig, timeout)

    @staticmethod
    def _stop_all(procs: list[subprocess.Popen[bytes]], sig: int, timeout: float) -> None:
        """Signal every process group first, then wait for each: their shutdowns (seconds each) overlap.

        A process started without a session of its own has no group of its id: it is signalled alone, never left
        running (a worker left behind would take the next test's tasks from the session's Redis)."""
        signalled = []
        for proc in procs:
            if proc.poll() is not None:
                continue
            _signal(proc, sig)
            signalled.append(proc)
        deadline = time.monotonic() + timeout
        for proc in signalled:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc, signal.SIGKILL)
                proc.wait()

    @staticmethod
    def wait_for(condition: object, timeout: float = 60, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")

    def close(self) -> None:
        self._stop_all([proc for proc in self.procs if proc.poll() is None], signal.SIGTERM, timeout=30)
        self.store.close()


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to the group ``proc`` leads, or to ``proc`` alone where it leads none."""
    try:
        group = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        if group == proc.pid:
            os.killpg(group, sig)
        else:
            proc.send_signal(sig)


@pytest.fixture
def fleet(request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer) -> Iterator[Fleet]:
    """Fleet on the session's PostgreSQL (a fresh database) and Redis (flushed), with short leases."""
    redis_server.client().flushall()
    url = migrated_database("postgresql", tmp_path, request)
    home = tmp_path / "home"
    home.mkdir()
    target = f"cpu-t{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "FLEET_DATABASE_URL": url,
        "FLEET_BROKER_URL": redis_server.url,
        "FLEET_HOME": str(home / ".fleet"),
        "FLEET_LEASE_SECONDS": "3",
        "FLEET_HEARTBEAT_SECONDS": "0.5",
        "FLEET_MAX_ATTEMPTS": "3",
        "PYTHONUNBUFFERED": "1",
    }
    installation = Fleet(env, Store(url), home, target)
    yield installation
    installation.close()
    left = _left_running(home, url)
    if left:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"processes of this test still ran after it (killed): {left}")


def _left_running(home: Path, url: str, grace: float = 10) -> dict[int, str]:
    """The processes still running in ``home`` or with ``url`` in their environment, ``grace`` seconds after the
    test's own were stopped: a worker left behind would take the next test's tasks from the session's Redis."""
    deadline = time.monotonic() + grace
    while True:
        left = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
                environ = (entry / "environ").read_bytes()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone, or a kernel thread
                continue
            if Path(cwd).is_relative_to(home) or url.encode() in environ:
                left[int(entry.name)] = cmdline.strip()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def write_spec(directory: Path, spec: dict, name: str = "spec.json") -> Path:
    """Write a spec (and nothing else) as JSON; return its path."""
    path = directory / name
    path.write_text(json.dumps(spec, indent=2))
    return path


DURATIONS = ROOT / "tests" / "durations.json"
"""Seconds each test file took in a whole run; only their order counts. ``make test`` writes a fresh one to
test-artifacts/durations.json: copy it here when files grow or are added."""

_took: dict[str, float] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest files first. ``make test`` runs each file whole in one process (``--dist loadfile``): a long file
    started last would keep one process busy while the others stand idle at the end (longest first is the classic
    rule for this). A file not listed yet counts as fast. Within a file, the order is the file's own."""
    seconds = json.loads(DURATIONS.read_text())
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0.0))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    file = report.nodeid.partition("::")[0]
    _took[file] = _took.get(file, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under `make test` (and so in CI) a skipped test is a failure: every test must really run. The files'
    durations are kept for the next ordering (see ``DURATIONS``)."""
    if _took and not hasattr(session.config, "workerinput"):  # the controller, which hears every file
        out = ROOT / "test-artifacts" / "durations.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({f: round(s, 1) for f, s in sorted(_took.items())}, indent=0) + "\n")
    if not os.environ.get("FLEET_REQUIRE_SERVICES"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"FLEET_REQUIRE_SERVICES is set and {len(skipped)} tests were skipped", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
