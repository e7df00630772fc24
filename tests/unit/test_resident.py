"""A resident run command (``"resident": true``): started once in the sandbox, kept between runs, ended by a timeout,
a crash, a lost lease or a change of its arguments, and then started afresh; real processes and bubblewrap.

fleet/workers/runner.py (Resident), fleet/workers/workloads/command.py, fleet/spec/workloads/command.py.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.bundle import pack
from fleet.errors import SpecError
from fleet.spec.workloads.command import CommandSpec
from fleet.workers.workloads import Job, Measured, load_workload
from fleet.workers.workloads import command as command_workload

# Counts its runs, so a test sees which command answered; an artifact's "do" says what the run does.
SERVER = """
import json, os, sys, time
count = 0
for line in sys.stdin:
    count += 1
    folder = json.loads(line)["dir"]
    do = open(os.path.join(folder, "do")).read()
    if do == "sleep":
        time.sleep(60)
    if do == "fill":  # files of its own, none large, until it is stopped
        for i in range(10000):
            open(os.path.join(folder, "f" + str(i)), "wb").write(os.urandom(1 << 18))
            time.sleep(0.01)
    if do == "crash":
        print("boom: an error", file=sys.stderr, flush=True)
        sys.exit(3)
    if do == "plant":  # a file in its directory, and a process of its own left running, for the next campaign
        open("planted", "w").write("the first campaign's")
        import subprocess
        left = [sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1] + "-left"]
        subprocess.Popen(left, start_new_session=True)
    seen = sorted(os.listdir(".")), sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    print("a line that is not the answer", flush=True)
    if do == "chat":  # a line every 50 ms for a second: more often than the lease is renewed
        for _ in range(20):
            print("still working", flush=True)
            time.sleep(0.05)
    answer = {"t": 1.5, "count": count, "cwd": os.getcwd(), "dir": folder, "pid": os.getpid()}
    print(json.dumps({**answer, "files": " ".join(seen[0]), "pids": max(seen[1])}), flush=True)
"""


@pytest.fixture(autouse=True)
def no_resident_left() -> Iterator[None]:
    yield
    if command_workload._RESIDENT is not None:
        command_workload._RESIDENT.close()
        command_workload._RESIDENT = None


def definition(*extra: str, **fields: Any) -> dict[str, Any]:
    return {
        "kind": "command",
        "run": [sys.executable, "-c", SERVER, *extra],
        "objective": {"json": "t"},
        "run_timeout": 10,
        "resident": True,
        **fields,
    }


def evaluate(
    scratch: Path,
    do: str,
    *extra: str,
    tick: Callable[[], bool] | None = None,
    campaign: int = 1,
    **fields: Any,
) -> tuple[Measured, command_workload.Resident]:
    """Evaluate a trial of ``campaign`` whose artifact says ``do``, with the server's arguments ``extra`` (a token to
    find it by)."""
    workload = load_workload(definition(*extra, **fields))
    job = Job(
        config={}, problem={}, scratch=scratch, fetch=lambda _: b"", tick=tick, tick_seconds=0.2, campaign=campaign
    )
    measured = workload.evaluate(job, pack({"do": do.encode()}))
    assert command_workload._RESIDENT is not None
    return measured, command_workload._RESIDENT


def gone(token: str, seconds: float = 20.0) -> bool:
    """Whether every process holding ``token`` has ended within ``seconds``: the sandbox's init, killed with
    bubblewrap, takes what runs in it along a moment later."""
    deadline = time.monotonic() + seconds
    while running(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def running(token: str) -> list[int]:
    """The pids of processes whose command line holds ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_one_command_answers_every_run_in_the_sandbox_with_its_state_kept(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    first, resident = evaluate(scratch, "run")
    second, same = evaluate(scratch, "run")
    assert same is resident and resident.starts == 1
    assert first.state == second.state == "evaluated" and first.objective == 1.5
    assert [first.metrics["count"], second.metrics["count"]] == [1, 2]  # one process, its state kept
    # In the sandbox: its own directory as /run/fleet/work, each run's files in its folder, its own PID namespace.
    assert first.metrics["cwd"] == "/run/fleet/work" and first.metrics["dir"] == "/run/fleet/work/run-1"
    assert second.metrics["dir"] == "/run/fleet/work/run-2"  # a folder named anew: nothing loaded by path reused
    assert not (resident.cwd / "run-1").exists() and (resident.cwd / "run-2" / "do").exists()
    assert first.metrics["pid"] < 10
    assert "not the answer" in second.stdout_tail


def test_a_run_past_its_time_ends_the_command_and_the_next_run_starts_another(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    measured, resident = evaluate(tmp_path, "sleep", token, run_timeout=1.5)
    assert measured.state == "errored" and measured.reason.startswith("the run timed out after 1.")
    assert not resident.alive and gone(token)  # the whole sandbox killed, not only its first process
    again, same = evaluate(tmp_path, "run", token)
    assert again.state == "evaluated" and again.metrics["count"] == 1 and same.starts == 2


def test_a_command_that_exits_errors_its_run_and_the_next_run_starts_another(tmp_path: Path) -> None:
    measured, resident = evaluate(tmp_path, "crash")
    assert measured.state == "errored"
    assert measured.reason == "the run exited with status 3: boom: an error", measured.reason
    assert "boom" in measured.stderr_tail and not resident.alive
    again, _ = evaluate(tmp_path, "run")
    assert again.state == "evaluated" and again.metrics["count"] == 1


def test_a_lost_lease_ends_the_command(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    measured, resident = evaluate(tmp_path, "sleep", token, tick=lambda: False)
    assert measured.state == "errored" and "killed by signal 9" in measured.reason
    assert not resident.alive and gone(token)


def test_other_arguments_start_another_command_and_close_ends_it(tmp_path: Path) -> None:
    a, b = uuid.uuid4().hex, uuid.uuid4().hex
    _, first = evaluate(tmp_path, "run", a)
    assert running(a)
    two, second = evaluate(tmp_path, "run", b)
    assert second is not first and two.metrics["count"] == 1
    assert not first.alive and gone(a) and running(b)
    folder = second.cwd
    second.close()
    assert not second.alive and gone(b) and not folder.exists()


def test_resident_is_a_boolean_and_needs_a_json_objective() -> None:
    with pytest.raises(SpecError, match="'resident' must be true or false"):
        CommandSpec(definition(resident="yes"))
    with pytest.raises(SpecError, match="must name a 'json' field"):
        CommandSpec(definition(objective={"regex": "t=(\\S+)"}))
    CommandSpec(definition())


def test_a_run_whose_scratch_grows_past_its_limit_ends_the_command_and_is_its_own_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resident command is watched as a command of its own is (FLEET_SANDBOX_SCRATCH)."""
    monkeypatch.setenv("FLEET_SANDBOX_SCRATCH", str(4 << 20))
    token = uuid.uuid4().hex
    measured, resident = evaluate(tmp_path, "fill", token, run_timeout=60)
    assert measured.state == "errored"
    assert measured.reason == "the run was killed: its scratch grew past 4 MiB (FLEET_SANDBOX_SCRATCH)"
    assert not resident.alive and gone(token)


def test_a_command_that_prints_without_answering_still_renews_its_lease(tmp_path: Path) -> None:
    """The lease is renewed every tick_seconds however often the command prints (lines that are not its answer)."""
    ticks: list[float] = []
    measured, _ = evaluate(tmp_path, "chat", tick=lambda: ticks.append(time.monotonic()) or True)
    assert measured.state == "evaluated" and len(ticks) >= 3, ticks


def test_a_resident_is_its_campaigns_own_and_another_campaign_with_the_same_command_never_runs_in_it(
    tmp_path: Path,
) -> None:
    """Issue 44, item 3: the attacker's campaign starts a resident with the victim's command, plants a file and a
    process, and would answer the victim's trials. The victim's trial gets a command of its own, in a folder of its
    own, and the attacker's command, files and processes are gone before it starts."""
    token = uuid.uuid4().hex
    planted, attacker = evaluate(tmp_path, "plant", token, campaign=666)
    assert planted.state == "evaluated" and "planted" in planted.metrics["files"].split()
    deadline = time.monotonic() + 5
    while not running(token + "-left") and time.monotonic() < deadline:
        time.sleep(0.05)  # the child it left has been forked, and is about to exec sleep
    assert running(token + "-left")
    measured, victim = evaluate(tmp_path, "run", token, campaign=7)
    assert victim is not attacker and not attacker.alive and victim.starts == 1
    assert measured.metrics["count"] == 1  # answered by its own command, not the attacker's (which says 2)
    assert "planted" not in measured.metrics["files"].split() and not attacker.cwd.exists()
    assert measured.metrics["pids"] < 10  # its own PID namespace: none of the attacker's processes in it
    assert victim.cwd != attacker.cwd and victim.cwd.name.endswith("-7")
    assert gone(token + "-left", 0) and running(token)  # the attacker's leftover died with its sandbox


def test_a_resident_left_idle_is_ended_and_the_next_run_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_RESIDENT_IDLE_SECONDS", "0.5")
    token = uuid.uuid4().hex
    first, resident = evaluate(tmp_path, "run", token)
    assert first.state == "evaluated" and running(token)
    assert gone(token, 30.0) and not resident.alive  # 0.5 s idle, on a loaded machine
    # Its folder goes just after its processes (the sandbox is ended first, then what it worked in is removed).
    deadline = time.monotonic() + 30.0
    while resident.cwd.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not resident.cwd.exists()
    again, same = evaluate(tmp_path, "run", token)
    assert again.state == "evaluated" and again.metrics["count"] == 1 and same.starts == 2
