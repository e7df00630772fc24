"""``fleet worker --check``, the probe of deploy/kubernetes/'s worker containers, against the real Redis and
PostgreSQL: 0 and one line when the node's workers can work; 1 and one line naming what failed when the broker or
the database does not answer, the workload account is unusable or the GPUs named are not there."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from fleet.ops.kubernetes import target_objects
from tests.conftest import Fleet
from tests.integration.test_kubernetes_worker import container


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_check_passes_when_database_broker_and_sandbox_answer(fleet: Fleet) -> None:
    done = fleet.cli("worker", "--target", fleet.target, "--check", timeout=60)
    assert done.returncode == 0, done.stderr
    line = one_line(done)
    assert line.startswith("worker check ok: ") and "database" in line and "broker" in line, line
    assert "sandbox starts" in line
    assert fleet.store.workers(within=60) == []  # a check starts no worker


def test_check_names_the_broker_the_database_or_the_account_that_failed(fleet: Fleet) -> None:
    port = closed_port()
    done = fleet.cli(
        "worker", "--target", fleet.target, "--check", env={"FLEET_BROKER_URL": f"redis://127.0.0.1:{port}/0"}
    )
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith("fleet: error: worker check failed: broker redis://127.0.0.1:") and str(port) in line, line

    port = closed_port()
    url = f"postgresql://fleet:hunter2@127.0.0.1:{port}/fleet"
    done = fleet.cli("worker", "--target", fleet.target, "--check", env={"FLEET_DATABASE_URL": url})
    assert done.returncode == 1
    line = one_line(done)
    assert "worker check failed: " in line and f"127.0.0.1:{port}" in line and "hunter2" not in line, line

    done = fleet.cli("worker", "--target", fleet.target, "--check", env={"FLEET_WORKLOAD_USER": "no-such-account"})
    assert done.returncode == 1
    assert "worker check failed: FLEET_WORKLOAD_USER='no-such-account'" in one_line(done)


def test_check_of_a_gpu_target_fails_where_its_gpus_are_not_visible(fleet: Fleet) -> None:
    # GPU 63 of sm_90: on no machine this runs on, so its tool (if any) or its device nodes say it is not there.
    done = fleet.cli("worker", "--target", "sm_90", "--gpus", "63", "--check", timeout=60)
    assert done.returncode == 1
    line = one_line(done)
    assert "worker check failed: GPU" in line and "of target sm_90" in line and "not visible" in line, line
    # A build-only worker of the same target needs no GPU.
    assert fleet.cli("worker", "--target", "sm_90", "--role", "build", "--check", timeout=60).returncode == 0


def test_the_manifests_probe_runs_from_the_pods_secret_files(fleet: Fleet) -> None:
    evals, builds, *_ = target_objects("sm_90", gpus=1)
    for deployment, status in ((builds, 0), (evals, 1)):  # this machine has no GPU for the eval pod
        argv, env, _ = container(fleet, deployment)
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
        argv = [str(Path(sys.executable).parent / probe[0]), *probe[1:]]
        done = subprocess.run(argv, env=env, cwd=fleet.home, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == status, (deployment["metadata"]["name"], done.stdout, done.stderr)
        one_line(done)
