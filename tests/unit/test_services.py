"""fleet.services against real redis-server and postgres processes (no mocks)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fleet.services import PostgresServer, RedisServer, ServiceError, free_port

needs_redis = pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
needs_postgres = pytest.mark.skipif(not PostgresServer.available(), reason="PostgreSQL is not installed")


def _dsn(url: str) -> str:
    # psycopg2 takes libpq URLs, which have no "+driver" part.
    return url.replace("postgresql+psycopg2://", "postgresql://", 1)


def _config(client: redis.Redis, name: str) -> str:
    value = client.config_get(name)[name]
    return value.decode() if isinstance(value, bytes) else value


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# --- Redis -------------------------------------------------------------------------------------------


@needs_redis
def test_redis_tcp(tmp_path: Path) -> None:
    port = free_port()
    with RedisServer(tmp_path / "redis", port=port) as server:
        assert server.running
        assert server.url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(server.url)
        client.set("answer", "42")
        assert client.get("answer") == b"42"
        assert _config(client, "appendonly") == "yes"
        assert _config(client, "appendfsync") == "everysec"
        assert _config(client, "maxmemory-policy") == "noeviction"
        assert _config(client, "bind") == "127.0.0.1"
        assert _config(client, "protected-mode") == "yes"
        assert Path(_config(client, "dir")) == (tmp_path / "redis").absolute()
        client.close()
    assert not server.running
    assert (tmp_path / "redis" / "redis.conf").exists()
    assert (tmp_path / "redis" / "redis.log").stat().st_size > 0


@needs_redis
def test_redis_picks_a_port_when_none_given(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis") as server:
        assert server.port
        assert server.client().ping()


@needs_redis
def test_redis_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"
    with RedisServer(tmp_path / "redis", unix_socket=path) as server:
        assert server.url == f"redis+socket://{path}?virtual_host=0"
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        client = redis.Redis(unix_socket_path=str(path))
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert _config(client, "port") == "0"
        assert _config(client, "bind") == "127.0.0.1"
        client.close()


@needs_redis
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_redis_socket_url_works_with_kombu_and_celery(tmp_path: Path) -> None:
    from celery import Celery
    from kombu import Connection

    path = tmp_path / "r.sock"
    with RedisServer(tmp_path / "redis", unix_socket=path, password="p@ss word") as server:
        with Connection(server.url) as connection:
            queue = connection.SimpleQueue("fleet-test")
            queue.put({"n": 1})
            message = queue.get(timeout=5)
            assert message.payload == {"n": 1}
            message.ack()
            queue.close()
        app = Celery("fleet-test", broker=server.url, backend=server.url)
        app.backend.set("celery-key", "1")
        assert app.backend.get("celery-key") == b"1"
        assert server.client().get("celery-key") == b"1"


@needs_redis
def test_redis_password_is_required(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", password="s3cret") as server:
        assert server.url == f"redis://:s3cret@127.0.0.1:{server.port}/0"
        with pytest.raises(redis.exceptions.AuthenticationError):
            # No retries: redis-py would otherwise retry the refused login with backoff for seconds.
            redis.Redis(host="127.0.0.1", port=server.port, retry=Retry(NoBackoff(), 0)).ping()
        assert redis.Redis.from_url(server.url).ping()
        assert stat.S_IMODE(server.config_path.stat().st_mode) == 0o600


@needs_redis
def test_redis_data_survives_kill(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = server.client()
        client.set("durable", "yes")
        client.close()
        # appendfsync everysec: give the once-a-second fsync time to run before the crash.
        time.sleep(1.2)
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not server.running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        server.start()
        assert server.client().get("durable") == b"yes"
    finally:
        server.stop()


@needs_redis
def test_redis_stop_is_idempotent(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.stop()
    server.kill()
    server.start()
    server.stop()
    server.stop()
    server.kill()
    assert not server.running


@needs_redis
def test_redis_start_failure_reports_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = RedisServer(tmp_path / "redis", port=port)
        with pytest.raises(ServiceError, match="redis-server exited"):
            server.start(timeout=10)
        assert not server.running


@needs_redis
def test_redis_start_does_not_mistake_another_server_for_its_own(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "first") as first:
        second = RedisServer(tmp_path / "second", port=first.port)
        with pytest.raises(ServiceError, match="Address already in use"):
            second.start(timeout=10)
        assert not second.running
        assert first.client().ping()


def test_redis_port_and_socket_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RedisServer(tmp_path, port=free_port(), unix_socket=tmp_path / "r.sock")


# --- PostgreSQL --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_root() -> Iterator[Path]:
    """A private directory straight under /tmp for PostgreSQL servers.

    Not pytest's tmp_path: as root, PostgreSQL runs as the postgres user, which needs search permission on
    every parent, and each new pytest session resets /tmp/pytest-of-root to 0700.
    """
    path = Path(tempfile.mkdtemp(prefix="fleet-test-pg-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres(pg_root: Path) -> Iterator[PostgresServer]:
    if not PostgresServer.available():
        pytest.skip("PostgreSQL is not installed")
    with PostgresServer(pg_root / "module-server", settings={"synchronous_commit": "off"}) as server:
        yield server


@needs_postgres
def test_postgres_select_one(postgres: PostgresServer) -> None:
    assert postgres.url == f"postgresql+psycopg2://fleet@127.0.0.1:{postgres.port}/fleet"
    with psycopg2.connect(_dsn(postgres.url)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT 1, current_user, current_database()")
        assert cursor.fetchone() == (1, "fleet", "fleet")
    connection.close()


@needs_postgres
def test_postgres_settings(postgres: PostgresServer) -> None:
    connection = psycopg2.connect(_dsn(postgres.url))
    with connection.cursor() as cursor:
        values = {}
        for name in (
            "listen_addresses",
            "max_connections",
            "synchronous_commit",
            "fsync",
            "full_page_writes",
        ):
            cursor.execute(f"SHOW {name}")
            values[name] = cursor.fetchone()[0]
        cursor.execute("SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user")
        assert cursor.fetchone() == (False, True)
    connection.close()
    assert values == {
        "listen_addresses": "127.0.0.1",
        "max_connections": "200",
        "synchronous_commit": "off",
        "fsync": "on",
        "full_page_writes": "on",
    }


@needs_postgres
def test_postgres_create_database(postgres: PostgresServer) -> None:
    url = postgres.create_database("fleet_test_module")
    assert url == f"postgresql+psycopg2://fleet@127.0.0.1:{postgres.port}/fleet_test_module"
    connection = psycopg2.connect(_dsn(url))
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1, current_database()")
        assert cursor.fetchone() == (1, "fleet_test_module")
        cursor.execute("CREATE TABLE owned (x int)")
    connection.commit()
    connection.close()
    with pytest.raises(ServiceError, match="already exists"):
        postgres.create_database("fleet_test_module")


@needs_postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="ownership only changes when running as root")
def test_postgres_directory_belongs_to_postgres_user_as_root(postgres: PostgresServer) -> None:
    account = pwd.getpwnam("postgres")
    assert postgres.directory.stat().st_uid == account.pw_uid
    assert postgres.data_dir.stat().st_uid == account.pw_uid
    assert stat.S_IMODE(postgres.directory.stat().st_mode) == 0o700


@needs_postgres
def test_postgres_kill_restart_stop(pg_root: Path) -> None:
    server = PostgresServer(pg_root / "password", password="pa:ss word")
    server.stop()
    server.start()
    try:
        url = server.url
        assert url == f"postgresql+psycopg2://fleet:pa%3Ass%20word@127.0.0.1:{server.port}/fleet"
        with pytest.raises(psycopg2.OperationalError, match="password"):
            psycopg2.connect(host="127.0.0.1", port=server.port, user="fleet", dbname="fleet").close()
        connection = psycopg2.connect(_dsn(url))
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE kept (x int)")
            cursor.execute("INSERT INTO kept VALUES (7)")
        connection.commit()
        connection.close()
        pid = server.pid
        assert pid is not None
        server.kill()
        assert not server.running
        server.start()
        connection = psycopg2.connect(_dsn(server.url))
        with connection.cursor() as cursor:
            cursor.execute("SELECT x FROM kept")
            assert cursor.fetchall() == [(7,)]
        connection.close()
    finally:
        server.stop()
    assert not server.running
    server.stop()
    server.kill()
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(_dsn(server.url), connect_timeout=2).close()
