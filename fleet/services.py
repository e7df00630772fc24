"""Private Redis and PostgreSQL servers for embedded mode, tests and container-free stacks.

Each server lives entirely in one directory (configuration, data, log, unix socket) and only ever
listens on 127.0.0.1 or on a unix socket, so several can run side by side without touching the
system's own services.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from fleet.errors import FleetError

__all__ = ["PostgresServer", "RedisServer", "ServiceError", "free_port"]

# sizeof(sockaddr_un.sun_path) on Linux, minus the terminating NUL.
_MAX_SOCKET_PATH = 107
_LOG_TAIL_LINES = 20
_POLL_INTERVAL = 0.05


class ServiceError(FleetError):
    """A Redis or PostgreSQL server that cannot be found, started or used."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now.

    Another process may take it before the caller binds it; servers that fail to bind report it
    through their log when they start.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _is_root() -> bool:
    return os.geteuid() == 0


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log written)"
    tail = text.strip().splitlines()[-lines:]
    return "\n".join(tail) if tail else "(log is empty)"


def _check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ServiceError(f"unix socket path {path} is longer than {_MAX_SOCKET_PATH} bytes; use a shorter directory")


def _child_pids(pid: int) -> list[int]:
    """Direct children of ``pid``, read from /proc (empty where /proc is missing)."""
    children = []
    with contextlib.suppress(OSError):
        entries = os.listdir("/proc")
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid:
                children.append(int(entry))
    return children


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie no longer holds shared memory or sockets, so it counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    # The server runs in its own session, so its group id is its pid; the group also catches forks
    # such as Redis's background rewrite children.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


class _Server(ABC):
    """What every private server does alike: run in its own session, its log in its directory; wait until it
    answers; stop, kill, and serve as a context manager. Each server supplies how it starts, answers and dies.
    """

    #: The program's name, as the errors name it.
    program: str
    #: What the server has not done when it is late, as in "did not answer within 10 s".
    readiness = "answer"
    #: The signal of a clean stop.
    stop_signal: signal.Signals

    directory: Path
    log_path: Path
    _process: subprocess.Popen[bytes] | None

    @property
    @abstractmethod
    def url(self) -> str: ...

    @property
    def pid(self) -> int | None:
        """Process id while the server runs, else None."""
        return self._process.pid if self._process is not None and self.running else None

    @property
    def running(self) -> bool:
        """Whether the process this object started is still alive."""
        return self._process is not None and self._process.poll() is None

    @abstractmethod
    def start(self, timeout: float = 10) -> Self:
        """Start the server unless it runs, and wait until it answers (by :meth:`_launch`)."""

    def _launch(
        self, command: list[str], timeout: float, *, owner: pwd.struct_passwd | None = None, **popen: Any
    ) -> None:
        """Run ``command`` in its own session, its output appended to the log, and wait until it answers.

        Parameters
        ----------
        command:
            The server's command line.
        timeout:
            Seconds to wait for it to answer.
        owner:
            The account the log is handed to, when the server runs as another.
        popen:
            More :class:`subprocess.Popen` arguments; ``stdout`` replaces the log.
        """
        with open(self.log_path, "ab") as log:
            if owner is not None:
                os.fchown(log.fileno(), owner.pw_uid, owner.pw_gid)
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=popen.pop("stdout", log),
                stderr=log,
                start_new_session=True,
                **popen,
            )
        try:
            self._wait_ready(timeout)
            self._ready()
        except BaseException:
            # Never leave a half-started server behind, whatever interrupted the wait.
            self.kill()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._probe() as answers:
            while True:
                assert self._process is not None
                code = self._process.poll()
                if code is not None:
                    self._process = None
                    raise ServiceError(
                        f"{self.program} exited with code {code} while starting; log {self.log_path}:\n"
                        f"{_log_tail(self.log_path)}{self._exit_hint()}"
                    )
                if answers():
                    return
                # An exit just now says more than the timeout would: look again first.
                if time.monotonic() >= deadline and self._process.poll() is None:
                    raise ServiceError(
                        f"{self.program} did not {self.readiness} within {timeout:g} s; log {self.log_path}:\n"
                        f"{_log_tail(self.log_path)}"
                    )
                time.sleep(_POLL_INTERVAL)

    @abstractmethod
    def _probe(self) -> contextlib.AbstractContextManager[Callable[[], bool]]:
        """A check, held for the whole wait, of whether the server answers yet (any refusal is a no)."""

    def _exit_hint(self) -> str:
        """What to add to the log tail when the server exits while starting."""
        return ""

    def _ready(self) -> None:  # noqa: B027 - most servers need nothing more
        """What a start does once the server answers (a failure stops the start)."""

    def stop(self, timeout: float = 10) -> None:
        """Stop the server with its clean-stop signal; force it after ``timeout``.

        Calling it when the server is not running does nothing.

        Parameters
        ----------
        timeout:
            Seconds to wait for a clean exit.
        """
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(self.stop_signal)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._force(process)
        self._process = None

    def _force(self, process: subprocess.Popen[bytes]) -> None:
        """End a server that did not stop in time."""
        self.kill()

    def kill(self) -> None:
        """Kill the server at once with SIGKILL, as a crash would."""
        process = self._process
        if process is None:
            return
        self._kill(process)
        self._process = None

    @abstractmethod
    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the server and whatever of it would outlive it, and wait for them."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, directory={str(self.directory)!r}, running={self.running})"


class RedisServer(_Server):
    """A private ``redis-server`` with append-only persistence.

    Parameters
    ----------
    directory:
        Holds ``redis.conf``, the append-only files and ``redis.log``; created when missing. Reusing
        the directory of a stopped or killed server brings its data back.
    port:
        TCP port to listen on, bound to 127.0.0.1 only.
    unix_socket:
        Listen on this unix socket instead of TCP (mode 700, so only this user can connect).
    password:
        Sets ``requirepass``; the URL then carries it.
    settings:
        Extra ``redis.conf`` directives that override the defaults, e.g. ``{"appendfsync": "always"}``.

    Give at most one of ``port`` and ``unix_socket``; with neither, a free TCP port is picked.
    """

    program = "redis-server"
    # SIGTERM flushes the append-only file; a server that takes longer than stop's timeout is killed.
    stop_signal = signal.SIGTERM

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        unix_socket: Path | None = None,
        password: str | None = None,
        settings: Mapping[str, str | int] | None = None,
    ) -> None:
        if port is not None and unix_socket is not None:
            raise ValueError("give either port or unix_socket, not both")
        self.directory = Path(directory).absolute()
        self.unix_socket = Path(unix_socket).absolute() if unix_socket is not None else None
        self.port = port if port is not None or unix_socket is not None else free_port()
        self.password = password
        self.settings = dict(settings or {})
        self.config_path = self.directory / "redis.conf"
        self.log_path = self.directory / "redis.log"
        self._process: subprocess.Popen[bytes] | None = None
        if self.unix_socket is not None:
            _check_socket_path(self.unix_socket)

    @staticmethod
    def executable() -> str | None:
        """Path of ``redis-server``, from PATH or /usr/bin, or None when it is not installed."""
        found = shutil.which("redis-server")
        if found:
            return found
        return "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None

    @staticmethod
    def available() -> bool:
        """Whether ``redis-server`` is installed."""
        return RedisServer.executable() is not None

    @property
    def url(self) -> str:
        """Connection URL for redis-py, kombu and Celery.

        A unix socket gives ``redis+socket:///path?virtual_host=0``: kombu and Celery strip the
        ``redis+`` prefix to pick the transport or backend and read the database from ``virtual_host``.
        """
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.unix_socket is not None:
            return f"redis+socket://{auth}{self.unix_socket}?virtual_host=0"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> Any:
        """A redis-py client for this server; ``kwargs`` go to :class:`redis.Redis`.

        Parameters
        ----------
        kwargs:
            Extra keyword arguments, e.g. ``decode_responses=True``.
        """
        import redis

        if self.unix_socket is not None:
            return redis.Redis(unix_socket_path=str(self.unix_socket), password=self.password, **kwargs)
        return redis.Redis(host="127.0.0.1", port=int(self.port or 0), password=self.password, **kwargs)

    def _config(self) -> str:
        directives: dict[str, str | int] = {
            "bind": "127.0.0.1",
            "protected-mode": "yes",
            "port": 0 if self.unix_socket is not None else int(self.port or 0),
            "daemonize": "no",
            "dir": str(self.directory),
            "logfile": str(self.log_path),
            "appendonly": "yes",
            "appendfsync": "everysec",
            "maxmemory-policy": "noeviction",
        }
        if self.unix_socket is not None:
            directives["unixsocket"] = str(self.unix_socket)
            directives["unixsocketperm"] = 700
        if self.password:
            directives["requirepass"] = self.password
        directives.update(self.settings)
        lines = ["# Written by fleet.services; rewritten on every start."]
        lines += [f"{key} {_redis_quote(str(value))}" for key, value in directives.items()]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 10) -> RedisServer:
        """Start the server and wait until it answers (checked to be this process, not a stranger on the port).

        Parameters
        ----------
        timeout:
            Seconds to wait for the server to answer.

        Raises
        ------
        ServiceError
            When redis-server is missing, exits early or does not answer in time (with its log tail).
        """
        if self.running:
            return self
        executable = self.executable()
        if executable is None:
            raise ServiceError("redis-server is not installed (apt-get install redis-server)")
        self.directory.mkdir(parents=True, exist_ok=True)
        # The file holds requirepass, so keep it private to this user.
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self._config())
        if self.unix_socket is not None:
            # A socket file left by a killed server would make the bind fail.
            with contextlib.suppress(FileNotFoundError):
                self.unix_socket.unlink()
        # Errors in the config file are printed before Redis opens its logfile, so stderr goes there too.
        self._launch([executable, str(self.config_path)], timeout, stdout=subprocess.DEVNULL, cwd=self.directory)
        return self

    @contextlib.contextmanager
    def _probe(self) -> Iterator[Callable[[], bool]]:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # redis-py retries with backoff by default, which could hold one PING past the deadline and past
        # the moment the process exits; the wait is the retry.
        client = self.client(socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))

        def answers() -> bool:
            # Refused, still loading the append-only file, or another server on the port (which ours
            # will exit over): all mean look again.
            with contextlib.suppress(redis.exceptions.RedisError):
                return bool(client.info("server").get("process_id") == self.pid)
            return False

        try:
            yield answers
        finally:
            client.close()

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _redis_quote(value: str) -> str:
    # redis.conf splits on spaces and understands C-like escapes inside double quotes.
    if value and all(ch.isalnum() or ch in "-_./:+,@" for ch in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _pg_quote(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "'" + str(value).replace("'", "''") + "'"


def _postgres_bindir() -> Path | None:
    """Directory with ``initdb`` and ``postgres``: PATH first, then Debian's newest versioned one."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres", path=str(Path(found).parent)):
        return Path(found).parent

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)
    candidates += ["/usr/local/pgsql/bin/initdb"]
    for candidate in candidates:
        bindir = Path(candidate).parent
        if os.access(candidate, os.X_OK) and os.access(bindir / "postgres", os.X_OK):
            return bindir
    return None


def _service_account() -> pwd.struct_passwd | None:
    """The account PostgreSQL runs as: ``postgres`` when we are root (it refuses root), else us."""
    if not _is_root():
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as error:
        raise ServiceError(
            "PostgreSQL refuses to run as root and there is no 'postgres' user to run it as "
            "(apt-get install postgresql creates one)"
        ) from error


def _grant_traverse(path: Path, account: pwd.struct_passwd) -> None:
    """Let ``account`` reach ``path`` by adding only search (x) permission to ancestors lacking it.

    Directories from :func:`tempfile.mkdtemp` and pytest are 0700 root; search permission alone does
    not let anyone list them.
    """
    for ancestor in reversed(path.parents):
        info = ancestor.stat()
        if info.st_uid == account.pw_uid:
            needed = stat.S_IXUSR
        elif info.st_gid == account.pw_gid:
            needed = stat.S_IXGRP
        else:
            needed = stat.S_IXOTH
        if not info.st_mode & needed:
            ancestor.chmod(stat.S_IMODE(info.st_mode) | needed)


class PostgresServer(_Server):
    """A private PostgreSQL cluster, created with ``initdb`` on first start.

    Parameters
    ----------
    directory:
        Holds the cluster in ``data/``, ``postgres.log`` and the unix socket; created when missing.
        Reusing the directory of a stopped or killed server brings its data back. Running as root,
        the directory is handed to the ``postgres`` user and its ancestors get search permission.
    port:
        TCP port on 127.0.0.1 (the only address it listens on); a free one is picked when omitted.
    user:
        Role the URL logs in as; created with LOGIN and CREATEDB but not as superuser.
    password:
        Password for ``user``. Without one, connections from 127.0.0.1 are trusted; with one, they
        need scram-sha-256. The unix socket, reachable only through ``directory``, is always trusted.
    database:
        Database owned by ``user`` that the URL points at.
    settings:
        Extra ``postgresql.conf`` settings, e.g. ``{"synchronous_commit": "off"}``.
    clients:
        The network whose TCP connections are let in (a test bed's subnet, with ``listen_addresses`` in
        ``settings``); 127.0.0.1 by default.
    synced_init:
        Whether initdb waits for its files to reach the disk; a throwaway cluster (a test bed's) starts seconds
        sooner without.
    """

    #: The bootstrap superuser initdb creates; only used over the unix socket for administration.
    superuser = "postgres"

    program = "postgres"
    readiness = "accept connections"
    # A fast shutdown, which disconnects clients and checkpoints; SIGTERM would be a "smart" shutdown that waits for
    # every client to disconnect.
    stop_signal = signal.SIGINT

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        user: str = "fleet",
        password: str | None = None,
        database: str = "fleet",
        settings: Mapping[str, str | int | float | bool] | None = None,
        clients: str = "127.0.0.1/32",
        synced_init: bool = True,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.clients = clients
        self.synced_init = synced_init
        self.port = port if port is not None else free_port()
        self.user = user
        self.password = password
        self.database = database
        self.settings = dict(settings or {})
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "postgres.log"
        self._process: subprocess.Popen[bytes] | None = None
        _check_socket_path(self.directory / f".s.PGSQL.{self.port}")

    @staticmethod
    def available() -> bool:
        """Whether PostgreSQL's server binaries are installed (and, as root, a ``postgres`` user exists)."""
        if _postgres_bindir() is None:
            return False
        try:
            _service_account()
        except ServiceError:
            return False
        return True

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the server's database, over TCP on 127.0.0.1."""
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server.

        Parameters
        ----------
        database:
            Database name.
        """
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + quote(self.password, safe="")
        return f"postgresql+psycopg2://{auth}@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def _run_as(self, account: pwd.struct_passwd | None) -> dict[str, Any]:
        """Popen arguments that drop to ``account`` (when root) in a clean environment."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env["LC_ALL"] = "C"
        if account is None:
            return {"env": env, "cwd": self.directory}
        env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
        return {
            "env": env,
            "cwd": self.directory,
            "user": account.pw_uid,
            "group": account.pw_gid,
            "extra_groups": [],
            "umask": 0o077,
        }

    def _prepare_directory(self, account: pwd.struct_passwd | None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        if account is not None:
            _grant_traverse(self.directory, account)
            os.chown(self.directory, account.pw_uid, account.pw_gid)

    def _access_hint(self, account: pwd.struct_passwd | None) -> str:
        if account is None:
            return ""
        # The usual culprit: something (a new pytest session resetting /tmp/pytest-of-root to 0700, for
        # one) took search permission away from a parent directory while the server was starting.
        return (
            f"\n(as root, PostgreSQL runs as {account.pw_name!r}, which needs search permission on every "
            f"directory above {self.directory})"
        )

    def _initdb(self, bindir: Path, account: pwd.struct_passwd | None) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self.data_dir.exists():
            # A half-made cluster from an interrupted initdb; initdb refuses non-empty directories.
            shutil.rmtree(self.data_dir)
        command = [
            str(bindir / "initdb"),
            "--pgdata",
            str(self.data_dir),
            "--username",
            self.superuser,
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--auth-local",
            "trust",
            "--auth-host",
            "scram-sha-256" if self.password else "trust",
            *([] if self.synced_init else ["--no-sync"]),
        ]
        result = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, check=False, **self._run_as(account)
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace").strip()
            raise ServiceError(f"initdb failed with code {result.returncode}:\n{output}{self._access_hint(account)}")
        with open(self.data_dir / "postgresql.conf", "a") as handle:
            handle.write("\n# fleet.services rewrites fleet.conf on every start.\ninclude_if_exists = 'fleet.conf'\n")

    def _write_settings(self, account: pwd.struct_passwd | None) -> None:
        values: dict[str, str | int | float | bool] = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": str(self.directory),
            "max_connections": 200,
        }
        values.update(self.settings)
        host_method = "scram-sha-256" if self.password else "trust"
        # Replace initdb's rules: no ::1 (we never listen there) and no replication entries. Rewritten on
        # every start so that adding or dropping the password changes the method.
        (self.data_dir / "pg_hba.conf").write_text(
            "# Written by fleet.services on every start.\n"
            "# TYPE  DATABASE  USER  ADDRESS       METHOD\n"
            "local   all       all                 trust\n"
            f"host    all       all   {self.clients:<13} {host_method}\n"
        )
        lines = [f"{key} = {_pg_quote(value)}" for key, value in values.items()]
        path = self.data_dir / "fleet.conf"
        path.write_text("# Written by fleet.services on every start.\n" + "\n".join(lines) + "\n")
        if account is not None:
            for written in (path, self.data_dir / "pg_hba.conf"):
                os.chown(written, account.pw_uid, account.pw_gid)

    def start(self, timeout: float = 30) -> PostgresServer:
        """Create the cluster if needed, start it and make sure the role and database exist.

        Parameters
        ----------
        timeout:
            Seconds to wait for the server to accept connections.

        Raises
        ------
        ServiceError
            When PostgreSQL is missing, initdb fails, or the server does not come up (with its log tail).
        """
        if self.running:
            return self
        bindir = _postgres_bindir()
        if bindir is None:
            raise ServiceError("PostgreSQL is not installed (apt-get install postgresql)")
        account = _service_account()
        self._prepare_directory(account)
        self._initdb(bindir, account)
        self._write_settings(account)
        self._launch(
            [str(bindir / "postgres"), "-D", str(self.data_dir)], timeout, owner=account, **self._run_as(account)
        )
        return self

    def _admin_connection(self, database: str = "postgres", connect_timeout: int = 5) -> Any:
        import psycopg2

        connection = psycopg2.connect(
            host=str(self.directory),
            port=self.port,
            user=self.superuser,
            dbname=database,
            connect_timeout=connect_timeout,
        )
        # CREATE DATABASE cannot run inside a transaction block.
        connection.autocommit = True
        return connection

    @contextlib.contextmanager
    def _probe(self) -> Iterator[Callable[[], bool]]:
        import psycopg2

        def answers() -> bool:
            try:
                self._admin_connection(connect_timeout=1).close()
            except psycopg2.OperationalError:
                # Refused, or "the database system is starting up"; both mean try again.
                return False
            return True

        yield answers

    def _exit_hint(self) -> str:
        return self._access_hint(_service_account())

    def _ready(self) -> None:
        self._ensure_role_and_database()

    def _ensure_role_and_database(self) -> None:
        from psycopg2 import sql

        connection = self._admin_connection()
        try:
            with connection.cursor() as cursor:
                role = sql.Identifier(self.user)
                cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (self.user,))
                if cursor.fetchone() is None:
                    cursor.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEDB").format(role))
                # Set the password on every start so a changed one takes effect; the SQL travels over
                # the socket, never on a command line.
                cursor.execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(role), (self.password,))
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cursor.fetchone() is None:
                    cursor.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(self.database), role))
        finally:
            connection.close()

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create an empty database owned by ``user`` and return its URL.

        Parameters
        ----------
        name:
            Name of the new database; it must not exist yet.
        template:
            A database to copy instead (``CREATE DATABASE ... TEMPLATE``): faster than building the same tables
            again. Nobody may be connected to it meanwhile.

        Raises
        ------
        ServiceError
            When the server is not running or the database already exists.
        """
        import psycopg2
        from psycopg2 import sql

        if not self.running:
            raise ServiceError(f"PostgreSQL in {self.directory} is not running; start() it first")
        connection = self._admin_connection()
        try:
            with connection.cursor() as cursor:
                statement = sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(self.user)
                )
                if template is not None:
                    statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
                cursor.execute(statement)
        except psycopg2.errors.DuplicateDatabase as error:
            raise ServiceError(f"database {name!r} already exists on {self.url_for(name)}") from error
        finally:
            connection.close()
        return self.url_for(name)

    def stop(self, timeout: float = 30) -> None:
        """Stop the server with a fast shutdown (SIGINT), which disconnects clients and checkpoints.

        Escalates to an immediate shutdown and then to SIGKILL if it takes longer than ``timeout``.
        Calling it when the server is not running does nothing.

        Parameters
        ----------
        timeout:
            Seconds to wait for the fast shutdown.
        """
        super().stop(timeout)

    def _force(self, process: subprocess.Popen[bytes]) -> None:
        # An immediate shutdown first, then SIGKILL.
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGQUIT)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()

    def _kill(self, process: subprocess.Popen[bytes]) -> None:
        # Every backend calls setsid(), so the process group does not reach them: collect them first, and wait for
        # them to go, so that start() on the same directory can follow at once.
        children = _child_pids(process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_pid_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(_POLL_INTERVAL)
