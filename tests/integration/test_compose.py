"""compose.yaml against the Compose specification, and the same services run without containers by
scripts/stack: Redis with a password, PostgreSQL, the migration, Flower with basic auth and a CPU worker."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import redis
import yaml

from fleet.store import Store
from tests.conftest import ROOT, write_spec

# Debian's docker-compose package ships the Compose specification's schema (scripts/install-services).
COMPOSE_SCHEMA = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")
EXAMPLE_ENV = ROOT / ".env.example"


def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def readme_services() -> set[str]:
    """The services the operations guide names, in its "[`compose.yaml`](...)'s services:" paragraph."""
    text = (ROOT / "docs" / "operations.md").read_text()
    paragraph = text.split("(../compose.yaml)'s services:", 1)[1].split("\n\n", 1)[0]
    return {name for name in re.findall(r"`([a-z][a-z-]*)` \(", paragraph)}


def test_compose_file_follows_the_compose_specification() -> None:
    assert COMPOSE_SCHEMA.exists(), "run scripts/install-services (Debian's docker-compose ships the schema)"
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema).validate(compose())


def compose_secrets(env_file: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose-secrets"), "--env-file", str(env_file), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_docker_compose_resolves_the_file_with_the_example_environment(tmp_path: Path) -> None:
    executable = shutil.which("docker-compose")
    assert executable, "run scripts/install-services (Debian's docker-compose)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSTGRES_", "REDIS_", "FLOWER_", "FLEET_"))}
    base = [executable, "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml")]
    done = subprocess.run(
        [*base, "--env-file", str(EXAMPLE_ENV), "--profile", "gpu", "config"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    services = resolved["services"]
    expected = {"postgres", "redis", "migrate", "flower", "worker", "driver", "gpu-worker"}
    assert set(services) == readme_services() == expected
    # No container's environment holds a password or a URL with one: they are secret files, read by Fleet
    # (FLEET_*_URL_FILE), PostgreSQL (POSTGRES_PASSWORD_FILE) and Redis's start. Flower's basic auth is Flower's.
    for name, service in services.items():
        environment = service.get("environment", {})
        assert not {"FLEET_DATABASE_URL", "FLEET_BROKER_URL", "POSTGRES_PASSWORD", "REDIS_PASSWORD"} & set(environment)
        assert not any("change-me" in str(v) for k, v in environment.items() if k != "FLOWER_BASIC_AUTH"), name
    fleet_services = ("migrate", "flower", "worker", "driver", "gpu-worker")
    for name in fleet_services:
        assert services[name]["environment"]["FLEET_DATABASE_URL_FILE"] == "/run/secrets/fleet_database_url"
        assert services[name]["environment"]["FLEET_BROKER_URL_FILE"] == "/run/secrets/fleet_broker_url"
        assert {s["source"] if isinstance(s, dict) else s for s in services[name]["secrets"]} == {
            "fleet_database_url",
            "fleet_broker_url",
        }
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert resolved["secrets"]["fleet_database_url"]["file"] == str(ROOT / "secrets" / "fleet_database_url")
    # The workers' sandbox may make its namespaces; nothing else is unconfined.
    for name in ("worker", "gpu-worker"):
        assert "seccomp=unconfined" in services[name]["security_opt"]
    assert not any("security_opt" in services[name] for name in ("migrate", "flower", "driver", "postgres", "redis"))
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "fleet:change-me-flower"
    assert services["flower"]["ports"] == ["127.0.0.1:5555:5555/tcp"]
    assert services["migrate"]["command"] == ["fleet", "db", "upgrade"]
    # Docker waits longer than the worker does for a measurement, which waits for it to finish.
    assert services["worker"]["stop_grace_period"] == "15m"
    assert services["worker"]["environment"]["FLEET_STOP_TIMEOUT"] == "840"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # The driver: the workers' environment and dependencies (the database through migrate, and the broker).
    driver = services["driver"]
    assert driver["command"] == ["fleet", "driver"] and driver["restart"] == "unless-stopped"
    assert driver["environment"] == services["worker"]["environment"]
    assert driver["depends_on"] == services["worker"]["depends_on"]
    assert set(driver["depends_on"]) == {"migrate", "redis"}
    assert "hostname" not in driver and "deploy" not in driver  # several may run; no GPU
    assert "pgdata:/var/lib/postgresql/data:rw" in services["postgres"]["volumes"] and "pgdata" in resolved["volumes"]
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"][0] == "gpu" and services["gpu-worker"]["profiles"] == ["gpu"]
    redis_conf = " ".join(services["redis"]["command"])
    assert "appendonly yes" in redis_conf and "maxmemory-policy noeviction" in redis_conf
    assert "requirepass" in redis_conf and "/run/secrets/redis_password" in redis_conf

    # The secret files: mode 0600, the URLs built from .env's passwords.
    written = compose_secrets(EXAMPLE_ENV, tmp_path / "secrets")
    assert written.returncode == 0, written.stderr
    files = {p.name: p for p in (tmp_path / "secrets").iterdir()}
    assert set(files) == set(resolved["secrets"])
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files.values())
    assert files["fleet_broker_url"].read_text().strip() == "redis://:change-me-redis@redis:6379/0"

    # Without a password no file is written, rather than a stack with an open Redis.
    (tmp_path / "no-passwords.env").write_text("POSTGRES_USER=fleet\n")
    missing = compose_secrets(tmp_path / "no-passwords.env", tmp_path / "none")
    assert missing.returncode != 0 and "PASSWORD" in missing.stderr + missing.stdout
    assert not (tmp_path / "none").exists()

    # With the example's placeholder passwords, Fleet's services refuse to start: migrate fails, and all
    # the others wait for it; Flower (which imports Fleet's settings) stops too.
    for name, command in (
        ("migrate", [sys.executable, "-m", "fleet.cli", "db", "upgrade"]),
        ("flower", [sys.executable, "-c", "import fleet.tasks"]),
    ):
        service_env = {
            "FLEET_DATABASE_URL_FILE": str(files["fleet_database_url"]),
            "FLEET_BROKER_URL_FILE": str(files["fleet_broker_url"]),
        }
        refused = subprocess.run(command, env={**env, **service_env}, capture_output=True, text=True, check=False)
        assert refused.returncode != 0, name
        assert "placeholder password of .env.example" in refused.stderr, refused.stderr


def test_secrets_stay_out_of_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".env"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ignored.returncode == 0, ".env must be ignored"
    example = EXAMPLE_ENV.read_text()
    for name in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "FLOWER_PASSWORD"):
        assert f"{name}=change-me" in example


# -- scripts/stack -----------------------------------------------------------------------------------------


STACK_SECRETS = {
    "REDIS_PASSWORD": "stack-redis-secret",
    "POSTGRES_PASSWORD": "stack-pg-secret",
    "FLOWER_USER": "ops",
    "FLOWER_PASSWORD": "stack-flower-secret",
}


def run_stack(command: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stack"), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[dict, dict[str, str]]]:
    # Not under pytest's tmp_path: PostgreSQL runs as the postgres user when the tests run as root, and
    # pytest keeps its base directory at mode 0700.
    directory = Path(tempfile.mkdtemp(prefix="fleet-stack-"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
        **STACK_SECRETS,
        "FLEET_STACK_DIR": str(directory),
        "FLEET_CPU_TARGET": "cpu-stacktest",
        "FLEET_HEARTBEAT_SECONDS": "0.5",
    }
    started = run_stack("start", env)
    try:
        assert started.returncode == 0, f"{started.stdout}\n{started.stderr}"
        state = json.loads((directory / "state.json").read_text())
        yield state, env
    finally:
        stopped = run_stack("stop", env)
        assert stopped.returncode == 0, stopped.stderr
        shutil.rmtree(directory, ignore_errors=True)


def test_stack_status_reports_every_service(stack: tuple[dict, dict[str, str]]) -> None:
    _, env = stack
    done = run_stack("status", env)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["redis", "postgres", "flower", "worker", "driver"]
    assert "appendonly yes, maxmemory-policy noeviction" in lines[0]
    assert all(" ok " in line for line in lines)


def test_stack_redis_refuses_a_client_without_the_password(stack: tuple[dict, dict[str, str]]) -> None:
    state, _ = stack
    port = state["redis"]["port"]
    anonymous = redis.Redis(host="127.0.0.1", port=port)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    wrong = redis.Redis(host="127.0.0.1", port=port, password="wrong")
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    client = redis.Redis(host="127.0.0.1", port=port, password=STACK_SECRETS["REDIS_PASSWORD"])
    assert client.ping()
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    assert client.config_get("appendonly") == {"appendonly": "yes"}


def _get(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_stack_flower_needs_basic_auth(stack: tuple[dict, dict[str, str]]) -> None:
    state, _ = stack
    url = state["flower"]["url"]
    assert url.startswith("http://127.0.0.1:")
    assert _get(url + "workers", None) == 401
    assert _get(url + "workers", ("ops", "wrong")) == 401
    assert _get(url + "workers", ("ops", STACK_SECRETS["FLOWER_PASSWORD"])) == 200


def test_stack_runs_a_campaign_on_its_worker(stack: tuple[dict, dict[str, str]], tmp_path: Path) -> None:
    state, env = stack
    store = Store(state["database_url"])
    try:
        workers = store.workers(target="cpu-stacktest", within=30)
        assert {w.role for w in workers} == {"eval", "build"}
        assert state["postgres"]["port"] and "stack-pg-secret" in state["database_url"]
        shutil.copy(ROOT / "tests" / "data" / "poison.py", tmp_path / "poison.py")
        spec = {
            "name": "stack",
            "target": "cpu-stacktest",
            "problems": [{"kind": "script", "params": {}}],
            "space": {"knobs": {"mode": {"values": ["a", "bb"], "build": False}}},
            "workload": {
                "kind": "command",
                "sources": ["poison.py"],
                "run": [sys.executable, "poison.py", "{mode}"],
                "objective": {"json": "score", "goal": "max"},
                "repeats": 1,
            },
        }
        path = write_spec(tmp_path, spec)
        exports = run_stack("env", env).stdout
        urls = dict(re.findall(r"export (\w+)=(\S+)", exports))

        def fleet_on_stack(*args: str) -> subprocess.CompletedProcess[str]:
            """``fleet ARGS`` pointed at the stack by ``scripts/stack env``'s URLs."""
            done = subprocess.run(
                [sys.executable, "-m", "fleet.cli", *args],
                env={**env, **{k: urls[k] for k in ("FLEET_DATABASE_URL", "FLEET_BROKER_URL")}},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            return done

        done = fleet_on_stack("tune", str(path), "--no-local", "--json")
        result = json.loads(done.stdout)
        assert result["problems"][0]["trials"] == {"evaluated": 2}
        assert result["problems"][0]["best"]["config"] == {"mode": "bb"}

        # Submitted and left: the stack's own driver runs it to its end.
        path = write_spec(tmp_path, spec | {"name": "stack-submitted"}, "submitted.json")
        fleet_on_stack("submit", str(path))
        deadline = time.monotonic() + 120
        while store.campaign("stack-submitted").status != "done" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert store.campaign("stack-submitted").status == "done"
        assert store.trial_counts(store.campaign("stack-submitted").id) == {"evaluated": 2}
    finally:
        store.close()
