"""A user's third day (issue 42): each guide's path as a user walks it, in real `fleet` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SPACES, Fleet, write_spec
from tests.integration.test_embedded import embedded_env

ROOT = Path(__file__).resolve().parents[2]


class Home:
    """A scratch home, embedded as a new user has it (the private Redis `make run` starts, unless ``env`` says
    otherwise), and the `fleet` commands run in it."""

    def __init__(self, path: Path, **env: str) -> None:
        self.path = path
        self.env = embedded_env(path, **env)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleet.cli", *args],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


# -- fleet bench search --history --trace ------------------------------------------------------------------------


def test_bench_search_with_history_writes_its_trace(tmp_path: Path) -> None:
    history = tmp_path / "spaces"
    history.mkdir()
    for name in ("gemm_clblast__RTX_2080_Ti", "gemm_clblast__RTX_3060_laptop"):
        (history / f"{name}.json.gz").symlink_to(SPACES / f"{name}.json.gz")
    trace = tmp_path / "trace.jsonl"
    space = str(history / "gemm_clblast__RTX_2080_Ti.json.gz")
    args = ["--history", str(history), "--space", space, "--repeats", "1", "--jobs", "1", "--horizon", "0.2"]

    done = Home(tmp_path).cli("bench", "search", *args, "--trace", str(trace))

    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    # Each of the three strategies compared wrote its evaluations.
    assert {line["strategy"] for line in lines} == {"auto history", "auto", "random"}, lines[:3]


# -- an embedded campaign paused and resumed from another shell ------------------------------------------------------


SLOW = "import json, sys, time; time.sleep(float(sys.argv[2])); print(json.dumps({'score': float(sys.argv[1])}))"


def slow_spec(home: Path, name: str, trials: int, seconds: float = 0.4) -> Path:
    """``trials`` run-time configurations of a program that takes ``seconds``, embedded: this machine's CPU."""
    spec = {
        "name": name,
        "problems": [{"kind": "sleeper", "params": {}}],
        "space": {"knobs": {"x": {"values": list(range(1, trials + 1)), "build": False}}},
        "strategy": {"name": "grid"},
        "workload": {
            "kind": "command",
            "run": [sys.executable, "-c", SLOW, "{x}", str(seconds)],
            "objective": {"json": "score"},
        },
    }
    return write_spec(home, spec, f"{name}.json")


def trial_counts(home: Home, name: str) -> dict[str, int]:
    done = home.cli("status", name, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["campaigns"][0]["trials"]


def test_an_embedded_tune_paused_and_resumed_from_another_shell_finishes(tmp_path: Path) -> None:
    home = Home(tmp_path)
    spec = slow_spec(tmp_path, "held", 16, seconds=1.5)  # the rest outlasts a loaded machine's `fleet pause`
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec)],
        cwd=tmp_path,
        env=home.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while trial_counts_or_none(home, "held").get("evaluated", 0) < 2:
            assert tune.poll() is None and time.monotonic() < deadline, tune.communicate()
            time.sleep(0.5)

        paused = home.cli("pause", "held")
        assert paused.returncode == 0, paused.stderr
        time.sleep(2)
        resumed = home.cli("resume", "held")

        assert resumed.returncode == 0, resumed.stderr
        assert "goes on" in resumed.stderr, resumed.stderr  # the running tune drives it: this shell returns
        out, err = tune.communicate(timeout=120)
    finally:
        if tune.poll() is None:
            tune.kill()
    assert tune.returncode == 0, err
    assert "best" in out
    assert trial_counts(home, "held") == {"evaluated": 16}


def trial_counts_or_none(home: Home, name: str) -> dict[str, int]:
    """The campaign's trial counts, or none before `fleet tune` has written it."""
    done = home.cli("status", name, "--json")
    return json.loads(done.stdout)["campaigns"][0]["trials"] if done.returncode == 0 else {}


# -- fleet status: a campaign's driver and the drivers' campaigns agree ------------------------------------------------


def test_status_names_a_driver_on_the_campaign_only_while_it_drives_it(tmp_path: Path) -> None:
    from fleet.store import Store

    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    assert home.cli("submit", str(slow_spec(tmp_path, "held", 2))).returncode == 0
    store = Store(f"sqlite:///{tmp_path}/.fleet/fleet.db")
    store.register_worker(
        name="driver-a", hostname="node", role="driver", target="-", queues=[], gpu=None, gpus=[], cpus=1,
        concurrency=1, pid=1,
    )  # fmt: skip
    campaign = store.campaign("held")

    # A driver that held the campaign and let its lease run out (it stalled, or restarts under its name).
    assert store.take_campaign(campaign.id, "driver-a", lease=0.01, force=True)
    time.sleep(0.1)
    lapsed = home.cli("status").stdout
    assert "driven by driver-a" not in lapsed and "drives nothing" in lapsed, lapsed

    assert store.take_campaign(campaign.id, "driver-a", lease=60)
    held = home.cli("status").stdout
    assert "driven by driver-a" in held and "drives held" in held, held


# -- fleet import kt, then every command that reads campaigns --------------------------------------------------------

A100 = {
    "device_name": "NVIDIA A100-PCIE-40GB",
    "kernel_name": "vector_add",
    "problem_size": [1048576],
    "tune_params_keys": ["block_size_x"],
    "tune_params": {"block_size_x": [128, 256, 512]},
    "objective": "time",
    "cache": {
        "128": {"block_size_x": 128, "time": 0.051, "times": [0.05, 0.052], "compile_time": 310.0},
        "256": {"block_size_x": 256, "time": 0.043, "times": [0.043, 0.043], "compile_time": 305.0},
        "512": {"block_size_x": 512, "time": "CompilationFailedConfig", "compile_time": 12.0},
    },
}


def test_a_kernel_tuner_import_leaves_status_best_and_report_working(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    (tmp_path / "A100.json").write_text(json.dumps(A100))
    imported = home.cli("import", "kt", "A100.json", "--json")
    assert imported.returncode == 0, imported.stderr
    name = json.loads(imported.stdout)[0]["campaign"]

    for args in (["status"], ["status", name], ["best", name], ["report", name, "-o", "report.html"]):
        done = home.cli(*args)
        assert done.returncode == 0, (args, done.stderr)
    assert " done " in home.cli("status").stdout

    # The workload kind an import writes is not one a spec can run: one line says what to write instead.
    spec = {"name": "x", "problems": [{"kind": "k", "params": {}}], "space": {"knobs": {"a": [1, 2]}}}
    spec["workload"] = {"kind": "kernel_tuner"}
    refused = home.cli("validate", str(write_spec(tmp_path, spec)))
    assert refused.returncode == 1
    [line] = refused.stderr.strip().splitlines()
    assert "`fleet import kt` imported" in line and "T1 file" in line, line


# -- scripts/stack on the base install -----------------------------------------------------------------------------


def test_stack_start_without_the_ops_extra_says_the_pip_line_and_starts_nothing(tmp_path: Path) -> None:
    # Every Python process of the stack (the supervisor, `celery flower`) finds no Flower, as on the base install.
    hidden = tmp_path / "base-install"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['flower'] = None\n")
    stack_dir = tmp_path / "stack"
    env = {**embedded_env(tmp_path), "PYTHONPATH": str(hidden), "FLEET_STACK_DIR": str(stack_dir)}

    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stack"), "start"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "started" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        "stack: scripts/stack needs Flower, which is not installed: pip install 'fleet-tune[ops]'"
    ]
    assert not stack_dir.exists()


# -- Tuna: fleet resume of a reason written with --no-send; a remembered build failure run again -----------------------


def test_a_reason_written_with_no_send_resumes_its_own_jobs_and_remeasure_runs_a_failed_build_again(
    fleet: Fleet, tmp_path: Path
) -> None:
    from tests.conftest import MIOPEN
    from tests.integration.test_tuna_jobs import fake_driver

    t = fleet.target
    fleet.cli("miopen", "import", str(MIOPEN / "conv_configs_NHWC.txt"), "-t", "nhwc", check=True)
    fleet.cli("miopen", "jobs", "add", "--target", t, "--reason", "later", "--tag", "nhwc", "--no-send", check=True)
    # A node without MIOpen: every build fails, and the failure is remembered for its key.
    without = fleet.start_worker(env={"FLEET_MIOPEN_DRIVER": ""})

    resumed = fleet.cli("resume", f"later@{t}", timeout=180)

    assert resumed.returncode == 1, resumed.stderr  # no job measured anything: no success, and it says why
    assert "MIOpen is not installed on this node" in resumed.stderr

    listed = json.loads(fleet.cli("miopen", "jobs", "list", "--reason", "later", "--json", check=True).stdout)
    assert listed[0]["steps"] == {"find": {"errored": 5}}  # the find jobs it had; no perf job beside them
    fleet.stop(without)

    fleet.start_worker(env={"FLEET_MIOPEN_DRIVER": str(fake_driver(tmp_path))})
    again = fleet.cli("miopen", "jobs", "add", "--target", t, "--reason", "later", "--tag", "nhwc", "--remeasure")
    assert again.returncode == 0, again.stderr
    assert f"later@{t}: 0 jobs created, 5 already there (5 run again); 5 sent" in again.stdout
    campaign = fleet.store.campaign(f"later@{t}")
    fleet.wait_for(lambda: fleet.store.trial_counts(campaign.id) == {"evaluated": 5}, timeout=180, what="5 jobs")


# -- the GPU pinning a workload sees inside the sandbox --------------------------------------------------------------

ORDER = "import json, os; print(json.dumps({'score': float(os.environ.get('CUDA_DEVICE_ORDER') == 'PCI_BUS_ID')}))"


def test_a_workload_sees_the_device_order_its_worker_was_pinned_with(tmp_path: Path) -> None:
    # As an evaluation process of an NVIDIA GPU has it (fleet.workers.gpus): the index in CUDA_VISIBLE_DEVICES is
    # the PCI bus order's, which nvidia-smi's is, only with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    spec = {
        "name": "order",
        "problems": [{"kind": "order", "params": {}}],
        "space": {"knobs": {"x": {"values": [1], "build": False}}},
        "workload": {"kind": "command", "run": [sys.executable, "-c", ORDER], "objective": {"json": "score"}},
    }
    done = home.cli("tune", str(write_spec(tmp_path, spec)), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["problems"][0]["best"]["score"] == 1.0


# -- every mistake of item 10: one line naming the wrong word and the likely right one ------------------------------

GBPS = "import json, sys; print(json.dumps({'gbps': float(sys.argv[1]), 'seconds': 1.0}))"


def gbps_spec(**changes: object) -> dict:
    """A program that prints its 'gbps', over one knob 'block', with ``changes`` made to its spec."""
    spec: dict = {
        "name": "typos",
        "problems": [{"kind": "copy", "params": {"size": 1}}],
        "space": {"knobs": {"block": {"values": [1, 2], "build": False}}},
        "workload": {"kind": "command", "run": [sys.executable, "-c", GBPS, "{block}"], "objective": {"json": "gbps"}},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        here = spec
        for key in parents:
            here = here[key]
        here[last] = value
    return spec


@pytest.mark.parametrize(
    ("changes", "wrong", "right"),
    [
        ({"workload__run": [sys.executable, "-c", GBPS, "{blok}"]}, "{blok}", "'block'"),
        # A build-time knob: the baseline must give it, and a typo of it left it missing.
        ({"baseline": {"blocks": 1}, "space__knobs__block__build": True}, "'blocks'", "'block'"),
        ({"workload__objective": {"jsn": "gbps"}}, "'jsn'", "'json'"),
        ({"strategy": {"name": "genetic", "budget": 4, "options": {"populaton": 4}}}, "'populaton'", "'population'"),
    ],
    ids=["placeholder", "baseline knob", "objective field", "strategy option"],
)
def test_a_mistyped_word_in_a_spec_is_named_with_the_word_meant(
    tmp_path: Path, changes: dict, wrong: str, right: str
) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    done = home.cli("validate", str(write_spec(tmp_path, gbps_spec(**changes))))
    assert done.returncode == 1, done.stdout
    [line] = done.stderr.strip().splitlines()
    assert wrong in line and f"did you mean {right}?" in line, line


def test_an_objective_field_the_run_does_not_print_names_the_field_it_does(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    done = home.cli("tune", str(write_spec(tmp_path, gbps_spec(workload__objective={"json": "gbs"}))))
    assert done.returncode == 1
    assert "the run's JSON line has no field 'gbs' (did you mean 'gbps'?); its fields: 'gbps', 'seconds'" in done.stderr


def test_a_mistyped_campaign_name_is_named_with_the_campaign_meant(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    assert home.cli("submit", str(write_spec(tmp_path, gbps_spec(name="matmul-c")))).returncode == 0
    for command in ("status", "best", "report", "trials", "resume", "pause"):
        done = home.cli(command, "matmul-cc")
        assert done.returncode == 1, (command, done.stdout)
        [line] = done.stderr.strip().splitlines()
        assert "no campaign 'matmul-cc'" in line and "did you mean 'matmul-c'?" in line, (command, line)


# -- the README's Python example run outside the clone --------------------------------------------------------------


def python_example(home: Home, spec: str) -> subprocess.CompletedProcess[str]:
    """The README's first line of Python, ``fleet.submit(spec)``, run by a user's script in ``home``."""
    script = f"import fleet\ncampaign = fleet.submit({spec!r})\nprint(campaign.campaign().name)\n"
    return subprocess.run(
        [sys.executable, "-c", script], cwd=home.path, env=home.env, capture_output=True, text=True, timeout=120
    )


def test_the_python_example_run_outside_the_clone_says_where_the_spec_and_the_database_are(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")

    relative = python_example(home, "examples/matmul-c/spec.json")

    assert relative.returncode == 1
    last = relative.stderr.strip().splitlines()[-1]
    assert f"examples/matmul-c/spec.json: No such file or directory in {tmp_path}" in last, last
    assert f"Fleet's clone has {ROOT / 'examples/matmul-c/spec.json'}" in last, last
    assert not (tmp_path / ".fleet").exists()

    # The clone's spec by its absolute path works, and says that it starts a database of its own here.
    absolute = python_example(home, str(ROOT / "examples/matmul-c/spec.json"))

    assert absolute.returncode == 0, absolute.stderr
    assert absolute.stdout.strip() == "matmul-c"
    [line] = absolute.stderr.strip().splitlines()
    assert line == (
        f"fleet: a new embedded database, {tmp_path}/.fleet/fleet.db: no .fleet/ in {tmp_path} or above it holds "
        "one (run from the folder that does, or set FLEET_HOME)"
    ), line
    # Once there, it is the database: nothing more is said.
    assert python_example(home, str(ROOT / "examples/matmul-c/spec.json")).stderr == ""


# -- item 11: what the commands say of problems, budgets and progress ------------------------------------------------

SCORE = "import json, sys; print(json.dumps({'score': float(sys.argv[1]) * float(sys.argv[2])}))"


def sizes_spec(**changes: object) -> dict:
    """Two problem sizes of a quick program whose score is x * n, over eight run-time values of x."""
    spec: dict = {
        "name": "sizes",
        "problems": [{"kind": "copy", "params": {"n": 10}}, {"kind": "copy", "params": {"n": 1000}}],
        "space": {"knobs": {"x": {"values": list(range(1, 9)), "build": False}}},
        "strategy": {"name": "random", "budget": 3},
        "workload": {
            "kind": "command",
            "run": [sys.executable, "-c", SCORE, "{x}", "{n}"],
            "objective": {"json": "score", "goal": "max"},
        },
    }
    return {**spec, **changes}


def test_problems_are_named_by_their_parameters_not_their_ids(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    tuned = home.cli("tune", str(write_spec(tmp_path, sizes_spec())))
    assert tuned.returncode == 0, tuned.stderr

    # The progress line's best is of one problem, which it names: never n=10's and n=1000's mixed.
    progress = [line for line in tuned.stderr.splitlines() if "best" in line]
    assert progress and all(line.endswith((" of n=10", " of n=1000")) for line in progress), progress

    status = home.cli("status", "sizes").stdout
    assert "best of copy n=10: " in status and "best of copy n=1000: " in status, status
    assert "problem 1" not in status and "problem 2" not in status, status

    table = home.cli("trials", "sizes").stdout.splitlines()
    assert {line.split()[1] for line in table[1:]} == {"n=10", "n=1000"}, table

    rows = home.cli("trials", "sizes", "--csv").stdout.splitlines()
    assert rows[0].startswith("problem,problem_params,"), rows[0]
    assert {row.split(",")[1] for row in rows[1:]} == {"n=10", "n=1000"}, rows

    assert home.cli("report", "sizes", "-o", "report.html").returncode == 0
    page = (tmp_path / "report.html").read_text()
    assert "<h2>Problem: copy n=10</h2>" in page and "<h2>Problem: copy n=1000</h2>" in page
    assert "Problem 1" not in page


def test_a_search_that_proposes_the_baseline_spends_its_whole_budget_and_counts_steadily(tmp_path: Path) -> None:
    # A grid's first configuration is the baseline's: the budget of 4 is 4 configurations besides it.
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    spec = write_spec(tmp_path, sizes_spec(strategy={"name": "grid", "budget": 4}, baseline={"x": 1}))

    tuned = home.cli("tune", str(spec))

    assert tuned.returncode == 0, tuned.stderr
    assert "copy n=10 on cpu-x86_64: 4 evaluated + 1 baseline" in tuned.stdout, tuned.stdout
    progress = [line.split()[1] for line in tuned.stderr.splitlines() if " trials, " in line]
    assert progress and all(count.endswith("/10") for count in progress), progress
    assert progress[-1] == "10/10"

    # The same spec again measures nothing, and says so without a progress line of nothing ('0/? trials').
    again = home.cli("tune", str(spec))
    assert again.returncode == 0, again.stderr
    assert " trials, " not in again.stderr, again.stderr
    assert "nothing new measured" in again.stderr


def test_an_imported_measurement_says_where_it_came_from(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    (tmp_path / "A100.json").write_text(json.dumps(A100))
    assert home.cli("import", "kt", "A100.json").returncode == 0

    best = home.cli("best", "--kind", "kernel", "--target", "sm_80")

    assert best.returncode == 0, best.stderr
    assert "None" not in best.stdout, best.stdout
    assert "imported A100" in best.stdout.splitlines()[1], best.stdout
    name = json.loads(home.cli("status", "--json").stdout)["campaigns"][0]["name"]
    first = json.loads(home.cli("trials", name, "--json").stdout)["trials"][0]["id"]
    [measured] = [line for line in home.cli("trial", str(first)).stdout.splitlines() if "measured" in line]
    assert "None" not in measured and " on " not in measured and "imported A100" in measured, measured


def test_validate_counts_a_grid_and_shows_the_commands_it_would_run(tmp_path: Path) -> None:
    home = Home(tmp_path, FLEET_BROKER_URL="filesystem://")
    spec = sizes_spec(strategy={"name": "grid"})
    spec["workload"]["build"] = ["cc", "-DX={x}", "prog.c", "-o", "prog"]
    spec["space"]["knobs"]["x"]["build"] = True

    done = home.cli("validate", str(write_spec(tmp_path, spec)))

    assert done.returncode == 0, done.stderr
    assert "  trials    16 in all\n" in done.stdout, done.stdout  # 8 configurations of each of 2 problems
    assert "  build     cc -DX=1 prog.c -o prog" in done.stdout, done.stdout
    assert f"  run       {sys.executable} -c " in done.stdout and " 1 10\n" in done.stdout, done.stdout


def processes_under(folder: Path) -> list[str]:
    """The command lines of the live processes that name ``folder`` (a private Redis's socket, a worker's home)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended meanwhile, or not a process
        if entry.name.isdigit() and str(folder) in argv and int(entry.name) != os.getpid():
            found.append(argv)
    return found


def test_a_terminated_embedded_tune_stops_its_redis_and_workers(tmp_path: Path) -> None:
    home = Home(tmp_path)  # the private Redis `make run` starts
    spec = slow_spec(tmp_path, "held", 20)
    tune = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", "tune", str(spec)],
        cwd=tmp_path, env=home.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while trial_counts_or_none(home, "held").get("evaluated", 0) < 1:
            assert tune.poll() is None and time.monotonic() < deadline, tune.communicate()
            time.sleep(0.5)
        assert any("redis-server" in argv for argv in processes_under(tmp_path))

        tune.terminate()
        tune.communicate(timeout=60)
    finally:
        if tune.poll() is None:
            tune.kill()

    deadline = time.monotonic() + 30  # the workers' warm shutdown
    while processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_under(tmp_path) == []
    assert tune.returncode == 128 + signal.SIGTERM  # the shell's status of a command a SIGTERM ended
