"""Settings from the environment.

With no ``FLEET_DATABASE_URL`` and no ``FLEET_BROKER_URL`` set, Fleet runs *embedded*: SQLite and a local
broker under ``FLEET_HOME``, with worker processes started on this machine. With them set, the same code
talks to PostgreSQL and Redis. ``FLEET_HOME`` defaults to the nearest ``.fleet/`` that holds a database, in the
current directory or above it (as git finds ``.git/``), else ``./.fleet/``: commands run from a subdirectory
of a project see the project's history.
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleet.errors import ConfigurationError


def conceal() -> None:
    """Make this process non-dumpable, so that a command it runs cannot read its secrets.

    A command running as the same user could otherwise read the database and broker URLs from
    ``/proc/PID/environ`` of any Fleet process, or its memory, or attach a debugger. Non-dumpable
    processes' ``/proc`` entries belong to root, and core dumps are off. ``exec`` undoes it, so each Fleet
    process (the CLI, each Celery worker) calls this itself; the children it forks inherit it.
    """
    if sys.platform.startswith("linux"):
        import ctypes  # here: every fleet command calls this, and few need ctypes otherwise

        ctypes.CDLL(None, use_errno=True).prctl(4, 0)  # 4 = PR_SET_DUMPABLE


def freeze_at_exit() -> None:
    """Leave the imported modules' objects out of the garbage collector's passes at this process's exit.

    Python's shutdown collects garbage as it tears the modules down, and each pass walks every object the imports
    made (SQLAlchemy's, Celery's): about a quarter of a second of CPU when a worker process exits and a tenth when a
    ``fleet`` command does, for memory the exit hands back anyway. Exit handlers still run, streams are still
    flushed, and objects still go when their last reference does. Each Fleet process calls this, as it calls
    :func:`conceal`.
    """
    atexit.register(gc.freeze)


def positive_number(env: Mapping[str, str], name: str, default: float) -> float:
    """The positive number ``env[name]`` holds, ``default`` when unset; ConfigurationError otherwise."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigurationError(f"{name}={raw!r} must be positive")
    return value


def liveness_window(heartbeat_seconds: float, slack_seconds: float = 5.0) -> float:
    """The one liveness rule: a worker or driver is alive while its last heartbeat is at most three beats and a
    slack old. Three, so that one beat lost under load does not make it gone; the slack, so that a short
    heartbeat does not make a busy database's delay look like a death."""
    return 3 * heartbeat_seconds + slack_seconds


@dataclass(frozen=True)
class Settings:
    """Everything Fleet reads from the environment.

    Parameters
    ----------
    home:
        Directory for embedded state: the SQLite database, the local broker, logs. ``FLEET_HOME``.
    database_url:
        SQLAlchemy URL. ``FLEET_DATABASE_URL``; SQLite under ``home`` when unset.
    broker_url:
        Celery broker URL. ``FLEET_BROKER_URL``; a private Redis on a unix socket under ``home`` when
        ``redis-server`` is installed, else kombu's filesystem transport.
    lease_seconds:
        How long claimed work stays owned without a renewal before the reaper gives it back.
    max_attempts:
        Claims of one trial (or one build) before it is errored instead of tried again.
    max_node_faults:
        Node faults one trial may meet, each on a node that took it while healthy, before it is errored: a
        configuration that fills every node's disk, or runs every node out of memory, is its own fault.
        ``FLEET_MAX_NODE_FAULTS``.
    heartbeat_seconds:
        How often workers renew their registration and run the reaper.
    liveness_slack_seconds:
        How late a heartbeat may be, beyond three missed, before its worker or driver counts as gone
        (:attr:`liveness_seconds`). ``FLEET_LIVENESS_SLACK_SECONDS``.
    cache_dir:
        Each worker's artifact cache. ``FLEET_CACHE_DIR``.
    visibility_timeout:
        Seconds before Redis redelivers an unacknowledged message. Long on purpose: the database lease,
        not the broker, brings back work of a dead worker.
    requeue_seconds:
        A waiting trial whose message went out this long ago is sent again, in case the message was lost.
    driver_lease_seconds:
        How long a campaign stays with a ``fleet driver`` that stopped renewing before another takes it.
    outage_seconds:
        How long workers and drivers wait out a database that does not answer (retrying with backoff)
        before they give their work back. ``FLEET_DB_OUTAGE_SECONDS``.
    """

    home: Path
    database_url: str
    broker_url: str
    embedded_database: bool
    embedded_broker: bool
    lease_seconds: float = 60.0
    max_attempts: int = 3
    max_node_faults: int = 5
    heartbeat_seconds: float = 5.0
    liveness_slack_seconds: float = 5.0
    cache_dir: Path = Path(".fleet/cache")
    visibility_timeout: float = 3600.0
    requeue_seconds: float = 300.0
    driver_lease_seconds: float = 30.0
    outage_seconds: float = 60.0

    @property
    def liveness_seconds(self) -> float:
        """How recent a worker's or driver's last heartbeat must be for it to count as alive."""
        return liveness_window(self.heartbeat_seconds, self.liveness_slack_seconds)

    @property
    def embedded(self) -> bool:
        return self.embedded_database or self.embedded_broker

    @property
    def redis_socket(self) -> Path:
        return self.home / "redis.sock"

    @property
    def broker_folder(self) -> Path:
        return self.home / "broker"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env["FLEET_HOME"]).absolute() if env.get("FLEET_HOME") else find_home(Path.cwd())
        for name in SECRETS:
            env[name] = secret(env, name)
        database_url = env.get("FLEET_DATABASE_URL", "")
        broker_url = env.get("FLEET_BROKER_URL", "")
        if database_url and not (database_url.startswith(("postgresql", "sqlite")) and _readable(database_url)):
            raise ConfigurationError(
                f"FLEET_DATABASE_URL={_quoted(database_url)}: expected a postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
                "or sqlite:///PATH URL"
            )
        redis = ("redis://", "rediss://", "redis+socket://", "filesystem://")
        if broker_url and not (broker_url.startswith(redis) and _readable(broker_url)):
            raise ConfigurationError(
                f"FLEET_BROKER_URL={_quoted(broker_url)}: expected a redis://[:PASSWORD@]HOST:PORT/DB URL"
            )
        _refuse_placeholders(env)
        if not broker_url:
            broker_url = _embedded_broker_url(home)
        return cls(
            home=home,
            database_url=database_url or f"sqlite:///{home / 'fleet.db'}",
            broker_url=broker_url,
            embedded_database=not database_url,
            embedded_broker=not env.get("FLEET_BROKER_URL"),
            lease_seconds=positive_number(env, "FLEET_LEASE_SECONDS", 60.0),
            max_attempts=int(positive_number(env, "FLEET_MAX_ATTEMPTS", 3)),
            max_node_faults=int(positive_number(env, "FLEET_MAX_NODE_FAULTS", 5)),
            heartbeat_seconds=positive_number(env, "FLEET_HEARTBEAT_SECONDS", 5.0),
            liveness_slack_seconds=positive_number(env, "FLEET_LIVENESS_SLACK_SECONDS", 5.0),
            cache_dir=Path(env.get("FLEET_CACHE_DIR") or home / "cache").absolute(),
            visibility_timeout=positive_number(env, "FLEET_VISIBILITY_TIMEOUT", 3600.0),
            requeue_seconds=positive_number(env, "FLEET_REQUEUE_SECONDS", 300.0),
            driver_lease_seconds=positive_number(env, "FLEET_DRIVER_LEASE_SECONDS", 30.0),
            outage_seconds=positive_number(env, "FLEET_DB_OUTAGE_SECONDS", 60.0),
        )


# The settings that hold passwords: each is read from its variable, else from the file its ``_FILE`` variable
# names, else from systemd's credential of its name (``LoadCredential=fleet-database-url:...``).
SECRETS = ("FLEET_DATABASE_URL", "FLEET_BROKER_URL")


def secret(env: Mapping[str, str], name: str) -> str:
    """The value of the secret setting ``name``: from the environment, its file, or systemd's credential.

    Raises
    ------
    ConfigurationError
        When the file named cannot be read.
    """
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE", "")
    if not path and env.get("CREDENTIALS_DIRECTORY"):
        credential = Path(env["CREDENTIALS_DIRECTORY"]) / name.lower().replace("_", "-")
        path = str(credential) if credential.is_file() else ""
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise ConfigurationError(f"{name}_FILE={path!r}: cannot read it: {error.strerror}") from None


def secrets_in_environment(env: Mapping[str, str] | None = None) -> list[str]:
    """The secret settings given as plain variables: fine on a laptop, a warning on a shared node."""
    env = os.environ if env is None else env
    return [name for name in SECRETS if env.get(name)]


def child_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """``env`` for a Fleet child process, with its secrets as files instead of variables.

    A secret given as a variable is written to a file only this account can read, in ``folder`` (created private),
    and the child gets the ``_FILE`` variable: no Fleet process hands a password to a child through its
    environment, where anything that reads ``/proc/PID/environ`` of the child would find it.
    """
    out = dict(env)
    for name in SECRETS:
        value = out.pop(name, "")
        if not value:
            continue
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        path = folder / name.lower()
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(value)
        out[f"{name}_FILE"] = str(path)
    return out


# .env.example's passwords start with this: a stack started with them would be open to anyone who read it.
PLACEHOLDER = "change-me"


def _refuse_placeholders(env: dict[str, str]) -> None:
    secrets = {
        "FLEET_DATABASE_URL": urlsplit(env.get("FLEET_DATABASE_URL", "")).password,
        "FLEET_BROKER_URL": urlsplit(env.get("FLEET_BROKER_URL", "")).password,
        "FLOWER_BASIC_AUTH": env.get("FLOWER_BASIC_AUTH", "").partition(":")[2],
    }
    for name, secret in secrets.items():
        if secret and secret.startswith(PLACEHOLDER):
            raise ConfigurationError(
                f"{name} holds a placeholder password of .env.example ({PLACEHOLDER}...): "
                "set a real one in .env (openssl rand -hex 24)"
            )


def find_home(start: Path) -> Path:
    """The nearest ``.fleet/`` with a database in ``start`` or a directory above it, else ``start/.fleet``.

    Parameters
    ----------
    start:
        Where to look first: the current directory.
    """
    start = start.absolute()
    for folder in (start, *start.parents):
        if (folder / ".fleet" / "fleet.db").is_file():
            return folder / ".fleet"
    return start / ".fleet"


def _embedded_broker_url(home: Path) -> str:
    from fleet.services import RedisServer

    if RedisServer.available():
        return f"redis+socket://{home / 'redis.sock'}"
    return "filesystem://"


def _readable(url: str) -> bool:
    """Whether ``url`` parses, port included, and holds no control character (which no driver accepts)."""
    from urllib.parse import urlsplit

    try:
        port = urlsplit(url).port
    except ValueError:  # "postgresql://::::", a port out of range, an unclosed "[" of an IPv6 address
        return False
    return url.isprintable() and (port is None or port > 0)


def _quoted(url: str) -> str:
    """``url`` quoted for a message (``repr``: one line), its password hidden, cut to 200 characters."""
    text = repr(redact(url))
    return text if len(text) <= 200 else text[:197] + "..."


def redact(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: fit for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        port = parts.port
    except ValueError:
        # An URL that does not parse (its port is not a number): its password's place is not known either.
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}" if "@" in rest else url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{port}" if port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def node_name() -> str:
    """This node's name: ``FLEET_NODE_NAME`` (what ``fab deploy`` set, the name the operator knows the node by),
    else the host name. Nodes cloned from one image may share a host name; their measurements must not."""
    return os.environ.get("FLEET_NODE_NAME") or socket.gethostname()


_current: Settings | None = None


def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def reset_settings() -> None:
    """Forget the cached settings (tests and the CLI change the environment)."""
    global _current
    _current = None
