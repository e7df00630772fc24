"""Embedded mode, as `make run` uses it: no server installed, SQLite and a local broker under ./.fleet/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Fleet, write_spec
from tests.integration.test_campaign import kernel_spec


def embedded_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return {**env, "PYTHONUNBUFFERED": "1", "FLEET_HEARTBEAT_SECONDS": "0.5", **extra}


def fleet_cli(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("broker", ["private redis", "filesystem"])
def test_tune_with_no_server_installed(fleet: Fleet, broker: str) -> None:
    # `fleet` supplies a scratch home and the kernel's source; its PostgreSQL and Redis are not used here.
    spec = kernel_spec(fleet)
    spec.pop("target")
    path = write_spec(fleet.home, spec)
    env = embedded_env(fleet.home, **({"FLEET_BROKER_URL": "filesystem://"} if broker == "filesystem" else {}))

    done = fleet_cli(fleet.home, env, "tune", str(path))

    assert done.returncode == 0, done.stderr
    assert "best      size=4 scale=10" in done.stdout
    assert "speedup   4.00x over the baseline" in done.stdout
    assert "8/8" in done.stderr  # the progress bar counts trials
    assert "No hostname was supplied" not in done.stderr  # kombu's noise on a filesystem broker, never a user's
    assert (fleet.home / ".fleet" / "fleet.db").exists()
    best = fleet_cli(fleet.home, env, "best", "--kind", "kernel", "--target", spec_target(), "--json")
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["score"] == 40.0
    # What the run started, it stopped: no private Redis answers on the socket any more.
    assert not (fleet.home / ".fleet" / "redis.sock").exists() or not _answers(fleet.home / ".fleet" / "redis.sock")


def spec_target() -> str:
    from fleet.workers.gpus import cpu_target

    return cpu_target()


def _answers(socket: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(socket), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def test_python_api_submit_run_status_best(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet as api
    from fleet.settings import get_settings, reset_settings
    from fleet.tasks import app, configure

    for key, value in fleet.env.items():
        if key.startswith("FLEET_"):
            monkeypatch.setenv(key, value)
    reset_settings()
    configure(app, get_settings())
    fleet.start_worker()
    spec = api.load_spec(write_spec(fleet.home, kernel_spec(fleet)))

    campaign = api.submit(spec)
    summaries = api.run(campaign, local=False)

    assert api.status(campaign) == {"evaluated": 8}
    assert summaries[0].best.config == {"size": 4, "scale": 10}
    assert summaries[0].speedup == 4.0
    measurement, config = api.best(summaries[0].problem_id, fleet.target)[0]
    assert (measurement.objective, config) == (40.0, {"size": 4, "scale": 10})
    # The same trials as a table: one row each, one column per knob.
    frame = campaign.to_pandas()
    assert len(frame) == 8 and set(frame["state"]) == {"evaluated"}
    best = frame.loc[frame["objective"].idxmax()]
    assert (best["config.size"], best["config.scale"], best["objective"]) == (4, 10, 40.0)
    assert frame["id"].is_unique and (frame["attempts"] == 1).all()
    reset_settings()
