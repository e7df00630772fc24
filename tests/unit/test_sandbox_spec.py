"""What the sandbox refuses at submit, and how it is built (issue 29): file names that leave the spec's folder,
the sandbox's argument list (hidden paths, GPU device nodes, the network), and embedded Fleet without it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.errors import SpecError
from fleet.spec import parse_spec
from fleet.workers import sandbox


def spec(**workload: object) -> dict:
    return {
        "name": "s",
        "problems": [{"kind": "p", "params": {}}],
        "space": {"knobs": {"x": [1, 2]}},
        "workload": {"kind": "command", "run": ["./k"], "objective": {"json": "t"}, **workload},
    }


@pytest.mark.parametrize("name", ["/etc/passwd", "../../x", "a/../../b", "", "x" * 300])
def test_an_artifact_name_outside_the_build_folder_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(SpecError, match=r"inside the build's directory"):
        parse_spec(spec(artifacts=[name]), tmp_path)


def test_a_source_that_links_out_of_the_spec_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("password")
    folder = tmp_path / "spec"
    folder.mkdir()
    (folder / "k.c").symlink_to(secret)
    (folder / "ok.c").write_text("int main(void) { return 0; }\n")
    with pytest.raises(SpecError, match="inside the spec's directory"):
        parse_spec(spec(sources=["k.c"]), folder)
    parse_spec(spec(sources=["ok.c"]), folder)  # a plain file is fine


def test_a_space_file_outside_the_spec_folder_is_refused_before_it_runs(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(ran)!r}, 'w').close()\nx = [1]\n")
    folder = tmp_path / "spec"
    folder.mkdir()
    data = spec()
    data["space"] = {"file": "../evil.py"}
    with pytest.raises(SpecError, match="inside the spec's directory"):
        parse_spec(data, folder)
    (folder / "link.py").symlink_to(tmp_path / "evil.py")
    data["space"] = {"file": "link.py"}
    with pytest.raises(SpecError, match="inside the spec's directory"):
        parse_spec(data, folder)
    assert not ran.exists()


def test_network_is_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="'network' must be true or false"):
        parse_spec(spec(network="yes"), tmp_path)
    parse_spec(spec(network=True), tmp_path)


def test_the_sandbox_hides_the_fleet_and_passes_only_the_pinned_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    scratch = home / "cache" / "scratch" / "w1"
    scratch.mkdir(parents=True)
    secret = tmp_path / "db-url"
    secret.write_text("postgresql://x:y@db/fleet")
    monkeypatch.setenv("FLEET_HOME", str(home))
    monkeypatch.setenv("FLEET_DATABASE_URL_FILE", str(secret))
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    monkeypatch.setattr(sandbox.os.path, "exists", lambda path: path.startswith("/dev/nvidia"))
    monkeypatch.setattr(sandbox, "PRIVATE", ("/nowhere",))  # tmp_path is in /tmp, which goes whole otherwise
    argv = sandbox.wrap(["./k"], cwd=scratch, env={"CUDA_VISIBLE_DEVICES": "1"}, who=None)
    # The fleet's state and the secret file are hidden; the scratch is bound where every command finds it.
    assert ["--tmpfs", str(home)] == argv[argv.index(str(home)) - 1 : argv.index(str(home)) + 1]
    assert ["--ro-bind", "/dev/null", str(secret)] == argv[argv.index(str(secret)) - 2 : argv.index(str(secret)) + 1]
    assert argv[argv.index("--bind") : argv.index("--bind") + 3] == ["--bind", str(scratch), sandbox.WORK]
    # No network by default; the pinned GPU's node and the driver's, not the others.
    assert "--unshare-net" in argv
    bound = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind"]
    assert "/dev/nvidia1" in bound and "/dev/nvidiactl" in bound and "/dev/nvidia0" not in bound
    assert argv[-1] == "./k"
    assert "--unshare-net" not in sandbox.wrap(["./k"], cwd=scratch, env={}, network=True, who=None)


@pytest.mark.skipif(sandbox.probe() is not None, reason="bubblewrap cannot start here")
def test_a_worker_pinned_by_its_launcher_passes_its_gpu_to_a_command_whose_spec_names_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the first GPU run met (docs/gpu.md): the launcher pins an evaluation process with CUDA_VISIBLE_DEVICES
    in its own environment, a spec's run names no GPU, and the sandbox was handed no device node: every
    measurement said "no CUDA device is available". The sandbox must choose the nodes from what the command gets."""
    from fleet.workers import runner

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    asked: list[dict[str, str]] = []
    chosen = sandbox.gpu_nodes
    monkeypatch.setattr(sandbox, "gpu_nodes", lambda env: asked.append(dict(env)) or chosen(env))
    tmp_path.chmod(0o755)
    done = runner.run(["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'], cwd=tmp_path, timeout=60, env={})
    assert (done.returncode, done.stdout.strip()) == (0, "3"), done.stderr
    assert asked and all(env.get("CUDA_VISIBLE_DEVICES") == "3" for env in asked)


def test_embedded_fleet_without_bubblewrap_runs_unsandboxed_and_says_so_once(tmp_path: Path) -> None:
    # No bwrap on PATH: a fleet worker refuses (tests/integration/test_sandbox.py); embedded Fleet warns.
    code = (
        "import pathlib, sys; from fleet.workers import runner; "
        "d = pathlib.Path(sys.argv[1]); "
        "print(runner.run(['/bin/echo', 'ran'], cwd=d, timeout=30).stdout.strip()); "
        "print(runner.run(['/bin/echo', 'again'], cwd=d, timeout=30).stdout.strip())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"PATH": "/nonexistent", "FLEET_HOME": str(tmp_path / ".fleet")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ran", "again"]
    warnings = [line for line in done.stderr.splitlines() if "without a sandbox" in line]
    assert warnings == [
        "fleet: warning: bubblewrap is not installed (apt-get install bubblewrap): workloads run "
        "without a sandbox on this machine"
    ]


def test_a_knob_value_or_a_parameter_over_4_kb_is_refused_with_which_it_is(tmp_path: Path) -> None:
    data = spec()
    data["space"] = {"knobs": {"x": ["a" * 5000]}}
    with pytest.raises(SpecError, match=r"knob 'x': a string of 5000 bytes; at most 4096 are allowed"):
        parse_spec(data, tmp_path)
    data = spec()
    data["problems"] = [{"kind": "p", "params": {"n": "é" * 2100}}]
    with pytest.raises(SpecError, match=r"problem 0 parameter 'n': a string of 4200 bytes; at most 4096"):
        parse_spec(data, tmp_path)


def test_a_command_whose_scratch_grows_past_its_limit_is_killed_and_it_is_its_own_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limits on memory, processes, file size: and on what a command's scratch holds, which no rlimit gives.
    A run that writes many files, none large, is stopped at FLEET_SANDBOX_SCRATCH; its trial errs with the
    reason, and the node is not blamed (its disk had room: only the command's own share ran out)."""
    from fleet.workers import health, runner

    monkeypatch.setenv("FLEET_SANDBOX_SCRATCH", str(4 << 20))
    tmp_path.chmod(0o755)
    writer = (
        "import os, time\nfor i in range(10000):\n    open(f'f{i}', 'wb').write(os.urandom(1 << 18)); time.sleep(0.01)"
    )
    done = runner.run([sys.executable, "-c", writer], cwd=tmp_path, timeout=120, env={})
    assert not done.ok and done.scratch_limit == 4 << 20
    assert done.failure("the run") == "the run was killed: its scratch grew past 4 MiB (FLEET_SANDBOX_SCRATCH)"
    assert done.seconds < 60  # stopped within a look or two, not at its time limit
    assert health.fault_in(done, tmp_path) is None
    # Below the limit nothing is looked at twice: a command that writes less runs to its end.
    small = "open('f', 'wb').write(bytes(1 << 20)); print('ok')"
    assert runner.run([sys.executable, "-c", small], cwd=tmp_path, timeout=60, env={}).stdout.strip() == "ok"


def test_a_command_that_ran_while_its_disk_was_full_met_the_nodes_fault_though_the_disk_has_room_again(
    tmp_path: Path,
) -> None:
    """The CI found it: two builds at once on a full scratch both exited 0 with empty artifacts; the first was taken
    for the node's fault and the disk emptied, so the second, judged by the room at its end, errored its trials.
    The least room seen from a command's start to its end is what counts."""
    from fleet.workers import health, runner

    done = runner.run([sys.executable, "-c", "print('ok')"], cwd=tmp_path, timeout=60, env={})
    assert done.ok and done.least_free is not None and health.fault_in(done, tmp_path) is None
    full = dataclasses.replace(done, least_free=0)
    fault = health.fault_in(full, tmp_path)
    assert fault is not None and "though the command exited 0" in str(fault) and "(0 MiB free)" in str(fault)
    failed = dataclasses.replace(done, returncode=1, least_free=health.LOW_SPACE_BYTES - 1)
    assert health.fault_in(failed, tmp_path) is not None


def test_a_sandbox_that_cannot_tell_what_to_hide_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44, item 8: settings that cannot be read (a URL file gone) left the fleet's home and cache unhidden and
    ran the workload all the same; now the node refuses it, as a node fault (the trial goes to another worker)."""
    from fleet.workers import runner
    from fleet.workers.sandbox import SandboxUnavailable

    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLEET_DATABASE_URL_FILE", str(tmp_path / "gone"))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(SandboxUnavailable, match="cannot tell what to hide from workloads: FLEET_DATABASE_URL_FILE"):
        runner.run(["sh", "-c", "touch ran"], cwd=work, timeout=10)
    assert not (work / "ran").exists()
