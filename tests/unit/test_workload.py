"""The command workload, the sandboxed runner and bundles, with real gcc builds and real processes.

fleet/workers/workloads/command.py, fleet/workers/runner.py, fleet/bundle.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pwd
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from fleet.bundle import pack, read_files, unpack
from fleet.errors import SpecError
from fleet.workers import runner, sandbox
from fleet.workers.runner import TAIL_BYTES, Completed, run, sandbox_env
from fleet.workers.workloads import WORKLOADS, Job, load_workload
from fleet.workers.workloads.command import CommandWorkload, fill, names_in

# A tiny program whose output is chosen by its first argument. "json" prints a score that grows with each
# run in the same directory (count.txt), so warm-up and the median are visible in the samples.
SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef SIZE
#define SIZE 1
#endif
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "json";
    int scale = argc > 2 ? atoi(argv[2]) : 1;
    int count = 0;
    FILE *f = fopen("count.txt", "r");
    if (f) { if (fscanf(f, "%d", &count) != 1) count = 0; fclose(f); }
    count++;
    f = fopen("count.txt", "w"); fprintf(f, "%d", count); fclose(f);
    if (!strcmp(mode, "json")) {
        printf("warming up\n{\"score\": %d, \"size\": %d, \"scale\": %d, \"count\": %d}\n",
               count * count * SIZE * scale, SIZE, scale, count);
    } else if (!strcmp(mode, "regex")) {
        printf("time: %d.5 ms\n", SIZE * scale);
    } else if (!strcmp(mode, "invalid")) {
        printf("{\"score\": 1, \"valid\": false}\n");
    } else if (!strcmp(mode, "fail")) {
        fprintf(stderr, "first line\nboom: out of memory\n\n");
        return 3;
    } else if (!strcmp(mode, "nan")) {
        printf("{\"score\": NaN}\n");
    } else {
        printf("nothing to see\n");
    }
    return 0;
}
"""


def definition(**overrides: Any) -> dict[str, Any]:
    base = {
        "kind": "command",
        "build": ["gcc", "-O1", "-DSIZE={size}", "k.c", "-o", "k"],
        "artifacts": ["k"],
        "run": ["./k", "{mode}", "{scale}"],
        "objective": {"name": "score", "goal": "max", "json": "score"},
    }
    base.update(overrides)
    return base


class Sources:
    """A source bundle as a worker sees it: a digest in the definition, bytes through fetch()."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.bundle = pack(files)
        self.digest = hashlib.sha256(self.bundle).hexdigest()

    def fetch(self, digest: str) -> bytes:
        assert digest == self.digest
        return self.bundle


@pytest.fixture
def sources() -> Sources:
    return Sources({"k.c": SOURCE.encode()})


def job(scratch: Path, config: dict, problem: dict | None = None, fetch: Any = None, **kwargs: Any) -> Job:
    scratch.mkdir(parents=True, exist_ok=True)
    return Job(config, problem or {}, scratch, fetch or _no_fetch, **kwargs)


def _no_fetch(digest: str) -> bytes:
    raise AssertionError(f"unexpected fetch of {digest}")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The program built once with SIZE=10, shared by the evaluation tests."""
    src = Sources({"k.c": SOURCE.encode()})
    w = CommandWorkload(definition(bundle=src.digest))
    built = w.build(job(tmp_path_factory.mktemp("build"), {"size": 10}, fetch=src.fetch))
    assert built.data is not None, built.reason
    return built.data


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):  # gone, or going while its entry was read (ESRCH)
        return False
    return fields[0] not in ("Z", "X")


def _until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    return _until(lambda: not alive(pid), seconds)


def running(marker: str) -> list[int]:
    """The live processes whose command line is ``marker`` (its words): a command in the sandbox has a pid of its
    own namespace, so the test finds it by what it runs (``sleep 61.25``), as seen from outside."""
    wanted = marker.split()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            except OSError:
                continue
            if words == wanted and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def wait_all_gone(marker: str, seconds: float = 5.0) -> bool:
    return _until(lambda: not running(marker), seconds)


# --- fill and names_in -----------------------------------------------------------------------------


def test_fill_replaces_knobs_and_problem_params() -> None:
    assert fill(["gcc", "-DTILE={tile}", "-DN={n}", "k.c"], {"tile": 8, "n": 1024}) == [
        "gcc",
        "-DTILE=8",
        "-DN=1024",
        "k.c",
    ]


def test_fill_renders_several_fields_in_one_argument() -> None:
    assert fill(["{a}x{b}:{a}"], {"a": 2, "b": "y"}) == ["2xy:2"]


def test_fill_renders_bools_as_one_and_zero() -> None:
    assert fill(["-DFAST={fast}", "-DSAFE={safe}"], {"fast": True, "safe": False}) == ["-DFAST=1", "-DSAFE=0"]


def test_fill_double_braces_are_literal_braces() -> None:
    values = {"tile": 8}
    assert fill(["{{tile}}", "a{{b}}c", "{{{tile}}}", "}}{{"], values) == ["{tile}", "a{b}c", "{8}", "}{"]


def test_fill_leaves_lone_braces_and_non_identifiers_alone() -> None:
    assert fill(["{", "}", "{1}", "{a b}"], {}) == ["{", "}", "{1}", "{a b}"]


def test_fill_conditional_items_choose_then_or_else() -> None:
    template = ["gcc", {"if": "fast", "then": ["-ffast-math", "-DF={fast}"], "else": ["-fno-fast-math"]}, "k.c"]
    assert fill(template, {"fast": True}) == ["gcc", "-ffast-math", "-DF=1", "k.c"]
    assert fill(template, {"fast": False}) == ["gcc", "-fno-fast-math", "k.c"]


def test_fill_conditional_without_else_adds_nothing_when_false() -> None:
    assert fill(["a", {"if": "x", "then": ["b"]}, "c"], {"x": 0}) == ["a", "c"]


def test_fill_nested_conditionals() -> None:
    template = [{"if": "a", "then": [{"if": "b", "then": ["ab"], "else": ["a"]}], "else": ["none"]}]
    assert fill(template, {"a": True, "b": False}) == ["a"]
    assert fill(template, {"a": True, "b": True}) == ["ab"]
    assert fill(template, {"a": False, "b": True}) == ["none"]


def test_fill_always_returns_a_list_of_str() -> None:
    argv = fill(["{i}", "{f}", "{b}", "{s}", {"if": "b", "then": ["{f}"]}], {"i": 3, "f": 2.5, "b": True, "s": "x y"})
    assert argv == ["3", "2.5", "1", "x y", "2.5"]
    assert all(type(a) is str for a in argv)


def test_fill_value_with_shell_characters_stays_one_argument() -> None:
    assert fill(["{s}"], {"s": "; rm -rf / $(x)"}) == ["; rm -rf / $(x)"]


def test_names_in_finds_fields_and_conditions_but_not_escapes() -> None:
    template = ["{a}", "x{{b}}", "{c}{d}", {"if": "e", "then": ["{f}"], "else": ["{g}", {"if": "h", "then": []}]}]
    assert names_in(template) == {"a", "c", "d", "e", "f", "g", "h"}


# --- CommandWorkload validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"run": "./k json 1"}, "shell string is not allowed"),
        ({"run": []}, "non-empty list"),
        ({"run": None}, "non-empty list"),
        ({"build": "gcc k.c"}, "'build' must be a non-empty list"),
        ({"run": ["./k", 3]}, "argument 3 is not a string"),
        ({"run": ["./k", {"if": "x", "than": ["a"]}]}, "conditional item"),
        ({"run": ["./k", {"if": 1, "then": ["a"]}]}, "conditional item"),
        ({"run": ["./k", {"if": "x", "then": "-O3"}]}, "non-empty list"),
        ({"objective": None}, "'objective' must name"),
        ({"objective": {"name": "t"}}, "'objective' must name"),
        ({"objective": {"json": "t", "regex": "t: (.*)"}}, "'objective' must name"),
        ({"objective": {"json": "t", "goal": "fastest"}}, "'goal' must be 'min' or 'max'"),
        ({"objective": {"regex": "time: \\S+"}}, "exactly one group"),
        ({"objective": {"regex": "(\\w+): (\\S+)"}}, "exactly one group"),
        ({"objective": {"regex": "time: ("}}, "objective regex"),
        ({"repeats": -1}, "'repeats' must be an integer >= 1"),
        ({"repeats": 0}, "'repeats' must be an integer >= 1"),
        ({"repeats": "3"}, "'repeats' must be an integer >= 1"),
        ({"warmup": -1}, "'warmup' must be an integer >= 0"),
        ({"run_timeout": 0}, "'run_timeout' must be a number of seconds, more than 0 and at most 86400"),
        ({"build_timeout": "60"}, "'build_timeout' must be a number of seconds, more than 0 and at most 86400"),
        ({"artifacts": "k"}, "'artifacts' must be a list"),
        ({"shell": True}, "unknown field 'shell'"),
    ],
)
def test_command_workload_rejects_bad_definitions(overrides: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        CommandWorkload(definition(**overrides))


def test_command_workload_accepts_a_regex_objective_and_no_build() -> None:
    w = CommandWorkload(definition(build=None, objective={"regex": "time: (\\S+) ms"}))
    assert w.objective_name == "objective"
    assert not w.maximize


def test_objective_name_and_goal() -> None:
    assert CommandWorkload(definition()).objective_name == "score"
    assert CommandWorkload(definition(objective={"json": "gflops", "goal": "max"})).objective_name == "gflops"
    assert CommandWorkload(definition()).maximize


def test_load_workload_rejects_unknown_kinds() -> None:
    known = ", ".join(sorted(WORKLOADS))
    with pytest.raises(SpecError, match=rf"unknown workload kind 'shell' \(known: {known}\)"):
        load_workload({"kind": "shell"})
    with pytest.raises(SpecError, match="must be an object"):
        load_workload(["command"])  # type: ignore[arg-type]


def test_check_accepts_knobs_and_problem_params() -> None:
    CommandWorkload(definition()).check(["size", "mode"], {"scale": 2})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, r"workload 'run' uses \{scale\}, which is neither a knob nor a problem parameter"),
        ({"build": ["gcc", "-DT={tile}", "k.c"]}, r"'build' uses \{tile\}"),
        ({"build": ["gcc", {"if": "fast", "then": ["-O3"]}, "k.c"]}, r"'build' uses \{fast\}"),
    ],
)
def test_check_catches_a_template_naming_an_unknown_knob(overrides: dict, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        CommandWorkload(definition(**overrides)).check(["size", "mode"], {})


def test_toolchain_is_the_first_line_of_the_compiler_version() -> None:
    assert "gcc" in CommandWorkload(definition()).toolchain().lower()


def test_toolchain_that_cannot_run_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="cannot run the toolchain command"):
        CommandWorkload(definition(toolchain=["/nonexistent/cc", "--version"])).toolchain()


# --- real builds ---------------------------------------------------------------------------------


def test_build_produces_an_artifact_bundle_with_the_executable(tmp_path: Path, sources: Sources) -> None:
    w = CommandWorkload(definition(bundle=sources.digest))
    built = w.build(job(tmp_path / "scratch", {"size": 4}, fetch=sources.fetch))
    assert built.data is not None and built.reason is None
    assert built.seconds > 0
    out = tmp_path / "out"
    out.mkdir()
    assert unpack(built.data, out) == ["k"]
    assert os.access(out / "k", os.X_OK)


def test_build_that_fails_gives_no_data_and_a_reason_with_the_exit_status(tmp_path: Path) -> None:
    broken = Sources({"k.c": b"int main(void) { return 0 }\n"})
    built = CommandWorkload(definition(bundle=broken.digest)).build(
        job(tmp_path / "scratch", {"size": 1}, fetch=broken.fetch)
    )
    assert built.data is None
    assert built.reason is not None
    assert built.reason.startswith("the build exited with status 1")
    assert "error" in built.log_tail


def test_build_that_does_not_produce_an_artifact_is_a_failure(tmp_path: Path, sources: Sources) -> None:
    w = CommandWorkload(definition(bundle=sources.digest, artifacts=["k", "k.so"]))
    built = w.build(job(tmp_path / "scratch", {"size": 1}, fetch=sources.fetch))
    assert built.data is None
    assert built.reason == "the build did not produce 'k.so'"


def test_build_without_a_command_bundles_the_sources(tmp_path: Path, sources: Sources) -> None:
    w = CommandWorkload(definition(bundle=sources.digest, build=None, artifacts=[]))
    built = w.build(job(tmp_path / "scratch", {}, fetch=sources.fetch))
    assert built.data is not None
    out = tmp_path / "out"
    out.mkdir()
    assert unpack(built.data, out) == ["k.c"]


def test_build_command_that_does_not_exist_fails_cleanly(tmp_path: Path) -> None:
    w = CommandWorkload(definition(build=["/nonexistent/cc", "k.c"]))
    built = w.build(job(tmp_path / "scratch", {"size": 1}))
    assert built.data is None
    assert (built.reason or "").startswith("the build exited with status 127: cannot run /nonexistent/cc")


# --- real evaluations ------------------------------------------------------------------------------


def test_evaluate_discards_warmup_and_takes_the_median_of_the_repeats(tmp_path: Path, artifact: bytes) -> None:
    w = CommandWorkload(definition(warmup=1, repeats=3))
    measured = w.evaluate(job(tmp_path, {"size": 10, "mode": "json"}, {"scale": 2}), artifact)
    assert measured.state == "evaluated"
    # Runs 2, 3 and 4 count (run 1 warms up): score = count^2 * SIZE * scale.
    assert measured.samples == [80.0, 180.0, 320.0]
    assert measured.objective == 180.0
    assert measured.metrics["count"] == 3
    assert measured.metrics["size"] == 10
    assert "score" in measured.stdout_tail


def test_evaluate_with_a_regex_objective(tmp_path: Path, artifact: bytes) -> None:
    w = CommandWorkload(definition(objective={"name": "ms", "regex": "time: (\\S+) ms"}, repeats=2))
    measured = w.evaluate(job(tmp_path, {"size": 10, "mode": "regex"}, {"scale": 3}), artifact)
    assert measured.state == "evaluated"
    assert measured.samples == [30.5, 30.5]
    assert measured.objective == 30.5


def test_evaluate_valid_false_gives_state_invalid(tmp_path: Path, artifact: bytes) -> None:
    measured = CommandWorkload(definition()).evaluate(job(tmp_path, {"mode": "invalid"}, {"scale": 1}), artifact)
    assert measured.state == "invalid"
    assert measured.reason == "the run reported an invalid result"


def test_evaluate_non_zero_exit_is_errored_with_the_last_stderr_line(tmp_path: Path, artifact: bytes) -> None:
    measured = CommandWorkload(definition()).evaluate(job(tmp_path, {"mode": "fail"}, {"scale": 1}), artifact)
    assert measured.state == "errored"
    assert measured.reason == "the run exited with status 3: boom: out of memory"
    assert "first line" in measured.stderr_tail


def test_evaluate_output_without_the_objective_is_errored(tmp_path: Path, artifact: bytes) -> None:
    measured = CommandWorkload(definition()).evaluate(job(tmp_path, {"mode": "quiet"}, {"scale": 1}), artifact)
    assert measured.state == "errored"
    assert measured.reason == "no JSON line with 'score' in the run's output"
    assert measured.stdout_tail == "nothing to see\n"


def test_evaluate_nan_objective_is_not_a_valid_measurement(tmp_path: Path, artifact: bytes) -> None:
    # json.loads accepts NaN (and float() accepts "nan" from a regex). A NaN objective compares false with
    # everything, and Postgres sorts NaN above every number: it would become the "best" when maximizing.
    measured = CommandWorkload(definition()).evaluate(job(tmp_path, {"mode": "nan"}, {"scale": 1}), artifact)
    assert measured.state != "evaluated"


def test_evaluate_timeout_is_errored_promptly_and_kills_grandchildren(tmp_path: Path) -> None:
    # The run starts a background sleep and waits for it: killing only the direct child would leave it.
    w = CommandWorkload(definition(run=["sh", "-c", "sleep 60.125 & wait"], run_timeout=1))
    scratch = tmp_path / "scratch"
    start = time.monotonic()
    measured = w.evaluate(job(scratch, {}), pack({"k": b""}))
    assert time.monotonic() - start < 15
    assert measured.state == "errored"
    assert "timed out" in (measured.reason or "")
    assert wait_all_gone("sleep 60.125"), "the grandchild sleep survived the timeout"


def test_evaluate_passes_job_env_to_the_run(tmp_path: Path) -> None:
    w = CommandWorkload(definition(run=["sh", "-c", 'echo "{\\"score\\": $HIP_VISIBLE_DEVICES}"']))
    measured = w.evaluate(job(tmp_path, {}, env={"HIP_VISIBLE_DEVICES": "5"}), pack({"k": b""}))
    assert measured.objective == 5.0


# --- parse -----------------------------------------------------------------------------------------


def test_parse_takes_the_last_json_line_with_the_objective() -> None:
    w = CommandWorkload(definition())
    out = '{"score": 1}\nnoise {"score": 9}\n{"other": 2}\n  {"score": 3, "x": "y"}  \n[1, 2]\n{bad json\n'
    assert w.parse(out) == (3.0, {"score": 3, "x": "y"})


def test_parse_ignores_a_non_numeric_objective() -> None:
    w = CommandWorkload(definition())
    assert w.parse('{"score": "fast"}\n{"score": true}\n') is None


def test_parse_regex_takes_the_last_match_and_rejects_non_numbers() -> None:
    w = CommandWorkload(definition(objective={"regex": "t=(\\S+)"}))
    assert w.parse("t=1\nt=2.5\n") == (2.5, {})
    assert w.parse("t=fast\n") is None
    assert w.parse("nothing\n") is None


# --- the runner ----------------------------------------------------------------------------------


@pytest.fixture(params=["setpriv", "preexec_fn"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the runner starts a command: through setpriv (vfork), and without it (a forked preexec_fn)."""
    if request.param == "setpriv" and runner._setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig on this node")
    if request.param == "preexec_fn":
        monkeypatch.setattr(runner, "_setpriv", lambda: None)
    return request.param


def test_runner_environment_keeps_secrets_out_but_passes_gpu_pinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    monkeypatch.setenv("FLEET_DATABASE_URL", "postgresql://fleet:hunter2@db/fleet")
    monkeypatch.setenv("FLEET_BROKER_URL", "redis://:hunter2@broker:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    done = run(["env"], cwd=tmp_path, timeout=30, env={"HIP_VISIBLE_DEVICES": "1"})
    assert done.ok
    expected = sandbox_env({"HIP_VISIBLE_DEVICES": "1"})
    if sandbox.mode() == "bwrap":
        # The sandbox's own: a home and a /tmp of the workload's, and where bubblewrap started it.
        expected |= {"HOME": sandbox.WORK, "TMPDIR": sandbox.TMP, "PWD": sandbox.WORK}
    assert set(done.stdout.splitlines()) == {f"{k}={v}" for k, v in expected.items()}
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert "hunter2" not in done.stdout
    assert not any(name.startswith("FLEET_") for name in env)
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["HIP_VISIBLE_DEVICES"] == "1"
    assert env["PATH"] == os.environ["PATH"]


def test_sandbox_env_extra_overrides_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("FLEET_BROKER_URL", "redis://x")
    env = sandbox_env({"CUDA_VISIBLE_DEVICES": "1"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "FLEET_BROKER_URL" not in env


def test_runner_runs_in_cwd_and_captures_both_streams(tmp_path: Path) -> None:
    (tmp_path / "mine").write_text("here")
    done = run(["sh", "-c", "pwd; cat mine; echo oops >&2"], cwd=tmp_path, timeout=30)
    assert done.ok and done.returncode == 0
    # In the sandbox the scratch directory is seen where every command finds it, whatever its path outside.
    assert done.stdout.split() == [sandbox.WORK if sandbox.mode() == "bwrap" else str(tmp_path), "here"]
    assert done.stderr == "oops\n"


def test_runner_converts_arguments_to_str(tmp_path: Path) -> None:
    done = run(["echo", 1, 2.5], cwd=tmp_path, timeout=30)  # type: ignore[list-item]
    assert done.argv == ["echo", "1", "2.5"]
    assert done.stdout == "1 2.5\n"


def test_runner_missing_program_is_status_127(tmp_path: Path, launcher: str) -> None:
    done = run(["/nonexistent/program"], cwd=tmp_path, timeout=30)
    assert done.returncode == 127 and not done.ok
    # Both ways a command starts say so alike, in one line.
    assert (
        done.failure("the run")
        == "the run exited with status 127: cannot run /nonexistent/program: No such file or directory"
    )


def test_runner_command_keeps_its_pid_session_and_environment(tmp_path: Path, launcher: str) -> None:
    # The guard shell execs the command: the pid Popen gave is the command's, leading its own session. In the
    # sandbox, the command is the first child of bubblewrap's init (pid 1), which leads the sandbox's session.
    done = run(["sh", "-c", 'echo $$ $(ps -o sid= -p $$) "$FOO"'], cwd=tmp_path, timeout=30, env={"FOO": "a b"})
    pid, sid, foo = done.stdout.split(maxsplit=2)
    assert done.ok and foo == "a b\n"
    assert (pid, sid) == ("2", "1") if sandbox.mode() == "bwrap" else pid == sid


def test_runner_guard_does_not_start_the_command_once_the_worker_is_gone(tmp_path: Path) -> None:
    # setpriv arms the parent-death signal a moment after the worker started it; a worker killed in that moment
    # cannot send it, so the guard sees another parent and exits before the command starts.
    if runner._setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig on this node")
    command, _ = runner._launch(["touch", "ran"], None)
    command[command.index(str(os.getpid()))] = "1"
    done = subprocess.run(command, cwd=tmp_path, check=False)
    assert done.returncode == 137
    assert not (tmp_path / "ran").exists()


def test_runner_chatty_output_does_not_hang_and_tails_are_bounded(tmp_path: Path) -> None:
    # 2 MB on each stream: more than a pipe holds, so a runner reading pipes only at the end would deadlock.
    done = run(
        ["sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' a; head -c 2000000 /dev/zero | tr '\\0' b >&2"],
        cwd=tmp_path,
        timeout=60,
    )
    assert done.ok
    assert len(done.stdout) == 2_000_000
    assert done.stdout_tail == "a" * TAIL_BYTES
    assert done.stderr_tail == "b" * TAIL_BYTES


def test_runner_timeout_kills_the_process_group(tmp_path: Path, launcher: str) -> None:
    start = time.monotonic()
    done = run(["sh", "-c", "sleep 60.25 & sleep 60"], cwd=tmp_path, timeout=0.5)
    assert time.monotonic() - start < 10
    assert done.timed_out and done.returncode is None and not done.ok
    assert done.failure("the run").startswith("the run timed out after")
    assert wait_all_gone("sleep 60.25")


def test_runner_tick_returning_false_stops_the_command_early(tmp_path: Path) -> None:
    calls: list[float] = []

    def tick() -> bool:
        calls.append(time.monotonic())
        return False

    start = time.monotonic()
    done = run(["sleep", "60"], cwd=tmp_path, timeout=120, tick=tick, tick_seconds=0.1)
    assert time.monotonic() - start < 10
    assert len(calls) == 1
    assert not done.ok and not done.timed_out
    assert done.failure("the run") == "the run was killed by signal 9 (SIGKILL)"


def test_a_signal_that_killed_a_command_is_named() -> None:
    assert Completed(["./k"], -11, "", "", 0.1).failure("the run") == "the run was killed by signal 11 (SIGSEGV)"
    assert Completed(["./k"], -40, "", "", 0.1).failure("the run") == "the run was killed by signal 40"


def test_runner_tick_returning_true_lets_the_command_finish(tmp_path: Path) -> None:
    calls: list[float] = []

    def tick() -> bool:
        calls.append(time.monotonic())
        return True

    done = run(["sh", "-c", "sleep 0.5; echo done"], cwd=tmp_path, timeout=60, tick=tick, tick_seconds=0.05)
    assert done.ok and done.stdout == "done\n"
    assert len(calls) >= 2


def test_runner_waits_by_polling_where_there_is_no_pidfd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(runner.os, "pidfd_open", no_pidfd)
    calls: list[float] = []
    done = run(
        ["sh", "-c", "sleep 0.3; echo done"],
        cwd=tmp_path,
        timeout=60,
        tick=lambda: calls.append(time.monotonic()) is None,
        tick_seconds=0.05,
    )
    assert done.ok and done.stdout == "done\n"
    assert len(calls) >= 2


def test_runner_failure_with_empty_stderr_names_only_the_status(tmp_path: Path) -> None:
    done = run(["sh", "-c", "exit 4"], cwd=tmp_path, timeout=30)
    assert done.failure("the build") == "the build exited with status 4"


def test_runner_kills_what_the_command_left_behind_after_a_normal_exit(tmp_path: Path, launcher: str) -> None:
    # A benchmark that daemonizes a helper would keep the GPU busy during the next trial's measurement.
    done = run(["sh", "-c", "sleep 60.375 > /dev/null 2>&1 &"], cwd=tmp_path, timeout=30)
    assert done.ok
    try:
        assert wait_all_gone("sleep 60.375", seconds=1)
    finally:
        for child in running("sleep 60.375"):
            os.kill(child, 9)  # the sleep this test started


def test_runner_kills_the_command_when_the_wait_ends_in_an_error(tmp_path: Path, launcher: str) -> None:
    # A lease renewal that raises (the database gone) must not leave the measurement running beside the retry.
    def tick() -> bool:
        raise ConnectionError("the database does not answer")

    with pytest.raises(ConnectionError):
        run(["sleep", "60.5"], cwd=tmp_path, timeout=120, tick=tick, tick_seconds=0.2)
    assert wait_all_gone("sleep 60.5")


@pytest.mark.parametrize("account", ["own", "nobody"])
def test_runner_command_dies_with_a_worker_killed_by_sigkill(tmp_path: Path, launcher: str, account: str) -> None:
    # A SIGKILLed worker runs no cleanup: the command must not outlive it and disturb the next measurement.
    # As another account too: switching accounts clears the parent-death signal unless it is armed after.
    env = dict(os.environ)
    if account == "nobody":
        if os.geteuid() != 0:
            pytest.skip("only a worker that runs as root runs commands as another account")
        env["FLEET_WORKLOAD_USER"] = "nobody"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, sys; from fleet.workers import runner; "
            + ("runner._setpriv = lambda: None; " if launcher == "preexec_fn" else "")
            + "runner.run(['sh', '-c', 'id -u > run.uid; exec sleep 60.625'], cwd=pathlib.Path(sys.argv[1]), "
            "timeout=120)",
            str(tmp_path),
        ],
        env=env,
    )
    deadline = time.monotonic() + 30
    while not running("sleep 60.625") and time.monotonic() < deadline:
        time.sleep(0.05)
    uid = int((tmp_path / "run.uid").read_text())
    worker.kill()
    worker.wait()
    try:
        # A root worker's sandbox never runs a workload as root: with no FLEET_WORKLOAD_USER, it runs as nobody.
        boxed_root = os.geteuid() == 0 and sandbox.mode() == "bwrap"
        assert uid == (pwd.getpwnam("nobody").pw_uid if account == "nobody" or boxed_root else os.getuid())
        assert wait_all_gone("sleep 60.625", seconds=5)
    finally:
        for command in running("sleep 60.625"):
            os.kill(command, 9)


# --- bundles -----------------------------------------------------------------------------------------


def test_pack_is_deterministic_regardless_of_insertion_order() -> None:
    a = pack({"b.c": b"two", "a.c": b"one", "dir/c.h": b"three"})
    b = pack({"dir/c.h": b"three", "a.c": b"one", "b.c": b"two"})
    assert a == b


def test_pack_has_no_timestamp_in_it() -> None:
    # The gzip header's mtime (bytes 4-8) and every member's mtime are 0, so packing later gives the same bytes.
    data = pack({"a": b"1"})
    assert data[4:8] == b"\0\0\0\0"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert [m.mtime for m in tar.getmembers()] == [0]


def test_pack_depends_on_content_and_names() -> None:
    assert pack({"a": b"1"}) != pack({"a": b"2"})
    assert pack({"a": b"1"}) != pack({"b": b"1"})


def test_unpack_round_trips_files_sorted_and_executable(tmp_path: Path) -> None:
    files = {"z.bin": b"\x00\x01", "a.txt": b"hello", "sub/c.h": b"#define X 1\n"}
    assert unpack(pack(files), tmp_path) == ["a.txt", "sub/c.h", "z.bin"]
    assert read_files(tmp_path, sorted(files)) == files
    assert (tmp_path / "z.bin").stat().st_mode & stat.S_IXUSR


def _tar_gz(*members: tarfile.TarInfo, data: bytes = b"evil") -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def test_unpack_refuses_a_member_that_climbs_out(tmp_path: Path) -> None:
    destination = tmp_path / "a" / "b"
    destination.mkdir(parents=True)
    with pytest.raises(tarfile.TarError):
        unpack(_tar_gz(tarfile.TarInfo("../escaped.txt")), destination)
    assert not (tmp_path / "a" / "escaped.txt").exists()


def test_unpack_refuses_a_symlink_pointing_outside(tmp_path: Path) -> None:
    link = tarfile.TarInfo("link")
    link.type, link.linkname = tarfile.SYMTYPE, "../../outside"
    with pytest.raises(tarfile.TarError):
        unpack(_tar_gz(link), tmp_path / "dest")


def test_unpack_keeps_an_absolute_name_inside_the_destination(tmp_path: Path) -> None:
    target = tmp_path / "outside" / "abs.txt"
    destination = tmp_path / "dest"
    destination.mkdir()
    unpack(_tar_gz(tarfile.TarInfo(str(target))), destination)
    assert not target.exists()
    assert (destination / str(target).lstrip("/")).read_bytes() == b"evil"


def test_runner_says_a_command_the_sandbox_saw_killed_by_a_signal_was_killed_by_it(tmp_path: Path) -> None:
    done = run(["sh", "-c", "kill -SEGV $$"], cwd=tmp_path, timeout=30)
    assert done.failure("the run") == "the run was killed by signal 11 (SIGSEGV)"


NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def test_a_toolchain_is_named_with_its_version_even_where_its_first_line_has_none() -> None:
    """The first GPU run recorded every trial's toolchain as "nvcc: NVIDIA (R) Cuda compiler driver", the same for
    every CUDA release; a configuration measured with one must not pass for another's (docs/gpu.md)."""
    from fleet.workers.workloads.command import toolchain_line

    assert toolchain_line(NVCC_VERSION) == (
        "nvcc: NVIDIA (R) Cuda compiler driver (Cuda compilation tools, release 13.0, V13.0.88)"
    )
    assert toolchain_line(NVCC_VERSION.replace("13.0", "12.4")) != toolchain_line(NVCC_VERSION)
    gcc = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
    assert toolchain_line(gcc) == "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"  # what earlier trials hold, unchanged
    assert toolchain_line("mytool\nno version here\n") == "mytool"
    assert toolchain_line("\n\n") == ""
