"""The runner: one command, as a list of arguments, in a scratch directory, with a time limit, in the sandbox.

Every command a spec brings runs here, and so in :mod:`fleet.workers.sandbox` (bubblewrap): its own PID,
mount and network namespaces, a workload account, the fleet's state hidden, killed whole when it ends. The
command gets a minimal environment so that a worker's secrets never reach user code; the worker's own
processes are non-dumpable (:func:`fleet.settings.conceal`) besides. With ``FLEET_SANDBOX=none`` the command
runs in a session of its own, killed by process group, as ``FLEET_WORKLOAD_USER`` when the worker is root.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import pwd
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fleet.bundle import size_text
from fleet.workers import sandbox
from fleet.workers.sandbox import SandboxUnavailable

TAIL_BYTES = 4096
# How often a running command's scratch is looked at (see _ScratchWatch).
WATCH_SECONDS = 1.0
# How often its output's size is: a command may print a gigabyte a second.
OUTPUT_WATCH_SECONDS = 0.1
OUTPUT_BYTES = 16 << 20
"""What a command may print, stdout and stderr together, before it is stopped (FLEET_OUTPUT_LIMIT): what is kept of
it is read into memory, and its objective is found within it."""
_PASSED_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "CUDA_VISIBLE_DEVICES",
    # With the index above: its order is the PCI bus's, as nvidia-smi's and NVML's are (fleet.workers.gpus).
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "LD_LIBRARY_PATH",
)


@dataclass(frozen=True)
class Completed:
    """What a command did.

    Parameters
    ----------
    returncode:
        Exit status; negative for a signal, None when it was killed for running past its limit.
    stdout, stderr:
        The output (decoded, errors replaced), at most :func:`output_limit` bytes of it.
    seconds:
        Wall time.
    timed_out:
        True when the time limit killed it.
    scratch_limit:
        The limit its scratch outgrew, when that killed it (:class:`fleet.workers.sandbox.Limits`).
    output_limit:
        The limit its output outgrew, when that stopped it (:func:`output_limit`).
    least_free:
        The fewest bytes free on its scratch's filesystem seen from its start to its end, when they were read: a
        command that started on a full disk met it, though the disk may have room again when it ends.
    """

    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    scratch_limit: int | None = None
    output_limit: int | None = None
    least_free: int | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.output_limit is None

    @property
    def stdout_tail(self) -> str:
        return self.stdout[-TAIL_BYTES:]

    @property
    def stderr_tail(self) -> str:
        return self.stderr[-TAIL_BYTES:]

    def failure(self, what: str) -> str:
        """One line saying how the command failed, for a trial's reason."""
        if self.timed_out:
            return f"{what} timed out after {self.seconds:.1f} s"
        if self.scratch_limit is not None:
            return f"{what} was killed: its scratch grew past {size_text(self.scratch_limit)} (FLEET_SANDBOX_SCRATCH)"
        if self.output_limit is not None:
            return f"{what} was killed: it printed more than {size_text(self.output_limit)} (FLEET_OUTPUT_LIMIT)"
        if self.returncode is not None and self.returncode < 0:
            return f"{what} was killed by signal {-self.returncode}{_signal_name(-self.returncode)}"
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        # Compilers end with context (a caret line, a summary); the last line naming an error says more.
        errors = [line for line in lines if "error" in line.lower()]
        last = (errors or lines or [""])[-1]
        return f"{what} exited with status {self.returncode}" + (f": {last.strip()[:300]}" if last else "")


def _status(code: int, boxed: bool) -> int:
    """The command's exit status as Popen gives it: negative for a signal. Bubblewrap's init exits with 128 + N
    for a command killed by signal N, as a shell does; it is said as the signal it was."""
    if boxed and 128 < code <= 128 + 64:
        return 128 - code
    return code


def _signal_name(number: int) -> str:
    """`` (SIGSEGV)`` for 11: what a reader of ``killed by signal 11`` needs; nothing for a signal with no name."""
    return f" ({signal.Signals(number).name})" if number in {s.value for s in signal.Signals} else ""


def sandbox_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a command runs with: a few harmless variables from ours, then ``extra``."""
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    tick: Callable[[], bool] | None = None,
    tick_seconds: float = 5.0,
    network: bool = False,
) -> Completed:
    """Run ``argv`` in ``cwd`` in the sandbox and wait for it, at most ``timeout`` seconds.

    Parameters
    ----------
    argv:
        The command: program and arguments, never a shell string.
    tick:
        Called every ``tick_seconds`` while the command runs (the worker renews its lease there);
        returning False kills the command, because the worker no longer owns the work.
    network:
        Leave the command the node's network (its spec asked for it).

    Raises
    ------
    SandboxUnavailable
        When the sandbox cannot start: the node's fault, not the command's.
    """
    argv = [str(a) for a in argv]
    start = time.monotonic()
    # The whole environment the command gets, the worker's GPU pinning included: the sandbox chooses the device
    # nodes it passes from this (a worker pinned by its launcher, with no pinning in the spec, is the usual case).
    env = sandbox_env(env)
    if not _found(argv[0], cwd, env):
        # Said here as Popen says it: under setpriv the guard shell would say it in its own words.
        return Completed(argv, 127, "", f"cannot run {argv[0]}: No such file or directory", 0.0)
    with contextlib.ExitStack() as cleanup:
        return _run(argv, cwd, env, timeout, tick, tick_seconds, network, start, cleanup)


def _run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    tick: Callable[[], bool] | None,
    tick_seconds: float,
    network: bool,
    start: float,
    cleanup: contextlib.ExitStack,
) -> Completed:
    """:func:`run`'s work; ``cleanup`` removes what the sandbox needed, however the run ends."""
    boxed = sandbox.mode() == "bwrap"
    if boxed:
        command, options, info_read, writer = _box(argv, cwd, env, network, cleanup)
    else:
        command, options = _launch(argv, _as_account(cwd, env))
    # Output goes to files, not pipes: a chatty command cannot fill a pipe and hang while we wait.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                **options,
            )
        except OSError as error:
            return Completed(argv, 127, "", f"cannot run {argv[0]}: {error.strerror}", 0.0)
        if boxed:
            writer.close()  # the child holds it: the pipe ends when bubblewrap does
        scratch = _ScratchWatch(_scratch(cwd), sandbox.Limits.from_env(os.environ))
        limit = output_limit()
        try:
            stopped = _watch(proc, out, err, scratch, limit, start, timeout, tick, tick_seconds)
        finally:
            # Always, however the wait ended (a lease lost, the database gone, the task stopped): nothing
            # the command started may outlive it, run beside the retry and disturb its measurement.
            _kill_group(proc)
        timed_out, overgrown = stopped == "timed out", stopped == "overgrown"
        printed_too_much = stopped == "printed too much"
        seconds = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        if boxed:
            _check_started(info_read, err, timed_out)
            err.seek(0)
        # What it printed between the last look and its end may pass the limit too: only the limit's worth is read.
        printed_too_much = printed_too_much or _size(out) + _size(err) > limit
        return Completed(
            argv,
            None if timed_out else _status(proc.returncode, boxed),
            _text(out.read(limit)),
            _text(err.read(max(0, limit - _size(out)) if not printed_too_much else TAIL_BYTES)),
            seconds,
            timed_out,
            scratch.limit if overgrown else None,
            limit if printed_too_much else None,
            scratch.least_free(),
        )


def _watch(
    proc: subprocess.Popen[bytes],
    out: IO[bytes],
    err: IO[bytes],
    scratch: _ScratchWatch,
    limit: int,
    start: float,
    timeout: float,
    tick: Callable[[], bool] | None,
    tick_seconds: float,
) -> str | None:
    """Wait for the command to exit, ticking every ``tick_seconds``; why it was stopped: "timed out" (``timeout``
    seconds after ``start``), "printed too much" (past ``limit`` bytes), "overgrown" (its scratch), or None (it
    exited, or ``tick`` said the work is no longer this worker's)."""
    next_tick = start + tick_seconds
    with _Exit(proc) as exited:
        while True:
            now = time.monotonic()
            left = timeout - (now - start)
            if left <= 0:
                return "timed out"
            if exited.wait(max(0.0, min(left, next_tick - now, OUTPUT_WATCH_SECONDS))):
                return None
            if _size(out) + _size(err) > limit:
                return "printed too much"
            if scratch.overgrown():
                return "overgrown"
            if time.monotonic() >= next_tick:
                next_tick += tick_seconds
                if tick is not None and not tick():
                    return None


def output_limit() -> int:
    """Bytes a command may print, stdout and stderr together (FLEET_OUTPUT_LIMIT, 16 MiB)."""
    from fleet.settings import positive_number

    return int(positive_number(os.environ, "FLEET_OUTPUT_LIMIT", OUTPUT_BYTES))


def _size(file: IO[bytes]) -> int:
    return os.fstat(file.fileno()).st_size


def seen(path: Path, cwd: Path) -> str:
    """``path``, a file or folder in ``cwd``, as the command run in ``cwd`` sees it: in the sandbox, its scratch is
    at :data:`fleet.workers.sandbox.WORK`, wherever the worker keeps it. For paths a command's environment names."""
    if sandbox.mode() != "bwrap":
        return str(path)
    return str(Path(sandbox.WORK) / path.relative_to(cwd))


def _text(output: bytes) -> str:
    """A command's output as text the database stores: undecodable bytes and NULs (PostgreSQL's text refuses
    them; ``cat /proc/self/environ`` prints them) become U+FFFD."""
    return output.decode(errors="replace").replace("\0", "\ufffd")


def _found(program: str, cwd: Path, env: Mapping[str, str]) -> bool:
    """Whether ``program`` names a file, looked up as exec would: in ``cwd``, or on the command's PATH."""
    if "/" in program:
        return (cwd / program).exists()
    return shutil.which(program, mode=os.F_OK, path=sandbox_env(env).get("PATH", os.defpath)) is not None


def workload_account() -> pwd.struct_passwd | None:
    """The account commands run as (see :func:`fleet.workers.sandbox.account`), or None for the worker's own."""
    return sandbox.account()


def _give(cwd: Path, account: pwd.struct_passwd | None) -> None:
    """Hand ``cwd`` and what it holds to ``account``, which works in it; nothing for the worker's own."""
    if account is None:
        return
    for root, dirs, files in os.walk(cwd):
        for name in [root, *(os.path.join(root, entry) for entry in dirs + files)]:
            os.lchown(name, account.pw_uid, account.pw_gid)


def _as_account(cwd: Path, env: dict[str, str]) -> pwd.struct_passwd | None:
    """The account to run the command as, which is given ``cwd`` to work in; None for the worker's own."""
    account = workload_account()
    _give(cwd, account)
    if account is not None:
        env.setdefault("HOME", str(cwd))  # the worker's own home is not the workload's to write in
    return account


def _box(
    argv: list[str], cwd: Path, env: dict[str, str], network: bool, cleanup: contextlib.ExitStack
) -> tuple[list[str], dict[str, Any], int, IO[bytes]]:
    """``argv`` made to run in the sandbox in ``cwd``: its temporary folder made (and removed by ``cleanup``), both
    folders given to the sandbox's account and ``env`` pointed at them; return the command, Popen's options, and the
    pipe bubblewrap reports its child on: the end to read (closed by ``cleanup``) and the end the child holds, to
    close once it has started (``cleanup`` closes it otherwise)."""
    sandbox.require()
    tmp = _tmp(cwd)
    tmp.mkdir(exist_ok=True)
    cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
    _give(cwd, sandbox.account())
    _give(tmp, sandbox.account())
    env.update(HOME=sandbox.WORK, TMPDIR=sandbox.TMP)
    info_read, info_write = os.pipe()
    cleanup.callback(os.close, info_read)
    writer = cleanup.enter_context(os.fdopen(info_write, "wb"))  # closed once, by the caller or by cleanup
    gpu = bool(sandbox.gpu_nodes(env))
    seccomp = _filter_fd(cleanup)
    box = sandbox.wrap(argv, cwd=cwd, env=env, network=network, tmp=tmp, seccomp=seccomp)
    command, options = _launch(box, None, gpu)
    options["pass_fds"] = (info_write, seccomp)
    return _info_fd(command, info_write), options, info_read, writer


def _filter_fd(cleanup: contextlib.ExitStack) -> int:
    """A file holding the sandbox's seccomp program, read from its start by bubblewrap (closed by ``cleanup``)."""
    fd = os.memfd_create("fleet-seccomp", os.MFD_CLOEXEC)
    cleanup.callback(os.close, fd)
    os.write(fd, _FILTER)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


_FILTER = sandbox.unix_socket_filter()


def _tmp(cwd: Path) -> Path:
    """The sandbox's temporary folder of a command run in ``cwd``: beside it, not in it."""
    return cwd.with_name(cwd.name + ".tmp")


def _scratch(cwd: Path) -> list[Path]:
    """What a command run in ``cwd`` may fill: its folder, and its temporary folder where it has one."""
    tmp = _tmp(cwd)
    return [cwd, tmp] if tmp.exists() else [cwd]


def _info_fd(command: list[str], fd: int) -> list[str]:
    """``command`` with bubblewrap told to write its child's pid to ``fd`` once the sandbox is up."""
    at = next(i for i, arg in enumerate(command) if os.path.basename(arg) == "bwrap")
    return [*command[: at + 1], "--info-fd", str(fd), *command[at + 1 :]]


def _check_started(info: int, err: Any, timed_out: bool) -> None:
    """Raise :class:`SandboxUnavailable` when bubblewrap never started the command (its info pipe stayed empty)."""
    started = bool(os.read(info, 4096))
    if started or timed_out:
        return
    said = [line for line in err.read().decode(errors="replace").splitlines() if line.startswith("bwrap:")]
    if said:
        raise SandboxUnavailable(f"the sandbox could not start: {said[-1]}")


# Run by setpriv once the parent-death signal is armed: a worker that died before that cannot send it, so
# the command must not start. $1 is the worker's pid; $2-$5 the limits (memory option and kB, processes, file
# size in 512-byte blocks), set here because a shell builtin costs nothing where prlimit would be one more exec;
# the rest is the command, exec'd as it is (same pid), with the environment it was given: the shell would add PWD.
_GUARD = (
    '[ "$PPID" = "$1" ] || exit 137; ulimit "$2" "$3" && ulimit -p "$4" && ulimit -f "$5" && ulimit -c 0 '
    '|| exit 126; shift 5; unset PWD; exec "$@"'
)


@functools.cache
def _setpriv() -> str | None:
    """util-linux's ``setpriv`` when it can set a parent-death signal on this node, else None."""
    path = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if path is None:
        return None
    probe = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], capture_output=True, check=False)
    return path if probe.returncode == 0 else None


def _launch(argv: list[str], account: pwd.struct_passwd | None, gpu: bool = False) -> tuple[list[str], dict[str, Any]]:
    """The argument list and Popen options that start ``argv`` as ``account``, dying with this process.

    Through ``setpriv`` and a guard shell where there is one: both cost about a millisecond to start,
    and CPython starts them with vfork, where a ``preexec_fn`` or Popen's own account switch makes it
    fork the whole worker (10 ms for 100 MB idle, far more on a loaded node, per command).
    """
    setpriv = _setpriv()
    groups = [] if account is None else os.getgrouplist(account.pw_name, account.pw_gid)  # video, render: GPUs
    if setpriv is None:
        options: dict[str, Any] = {"preexec_fn": _die_with(os.getpid())}
        if account is not None:
            options |= {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}
        return argv, options
    switch: list[str] = []
    if account is not None:
        switch = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", f"--groups={','.join(map(str, groups))}"]
    # setpriv switches accounts before it arms the signal: a switch clears it (see prctl(2)).
    limits = sandbox.Limits.from_env(os.environ)
    # A GPU driver maps far more address space than it uses: there the data segment is what is limited.
    memory = ["-d" if gpu else "-v", str(limits.memory // 1024)]
    guard = ["sh", "-c", _GUARD, "fleet-run", str(os.getpid()), *memory, str(limits.processes)]
    guard.append(str(limits.file_size // 512))
    return [setpriv, *switch, "--pdeathsig", "KILL", "--", *guard, *argv], {}


def _die_with(parent: int) -> Callable[[], None] | None:
    """What the child runs before the command: ask for SIGKILL when the worker process that waits for it dies.

    A SIGKILLed worker runs no ``finally``; without this its measurement would go on beside the retry.
    (Only the command itself gets the signal; the rest of its process group is killed by ``_kill_group``.)
    Used where there is no ``setpriv``, which does the same without a preexec_fn (see :func:`_launch`).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the worker died before the request took effect
            os._exit(137)

    return arm


class _Exit:
    """Waits for a child process to end, woken by the kernel the moment it does.

    ``Popen.wait(timeout)`` polls, sleeping up to 50 ms between looks: a command that runs for a while is
    seen to end 25 ms late on average.
    A pidfd becomes readable when the process ends; where there is none (not Linux 5.3+), it polls.
    """

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.fd = os.pidfd_open(proc.pid)

    def __enter__(self) -> _Exit:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def wait(self, seconds: float) -> bool:
        """True once the process has ended (and is reaped), False when ``seconds`` passed first."""
        if self.fd is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        poll = select.poll()
        poll.register(self.fd, select.POLLIN)
        if not poll.poll(seconds * 1000):
            return False
        self.proc.wait()  # it has ended: this reaps it at once
        return True


class _ScratchWatch:
    """Whether a command's scratch (its folder and temporary folder) has grown past its limit.

    No quota is needed: the free space of the scratch's filesystem is read every :data:`WATCH_SECONDS` (a
    ``statvfs``, microseconds), and only once it has fallen by the limit since the command started are the
    folders themselves walked, to tell the command's files from whatever else the node wrote meanwhile.
    """

    def __init__(self, folders: list[Path], limits: sandbox.Limits) -> None:
        self.folders = folders
        self.limit = limits.scratch
        self.free = self.least = _free(folders[0])

    def overgrown(self) -> bool:
        free = self._read()
        if self.free is None or free is None or self.free - free <= self.limit:
            return False
        return sum(_usage(folder) for folder in self.folders) > self.limit

    def least_free(self) -> int | None:
        """The fewest bytes free seen since the command started, its end included."""
        self._read()
        return self.least

    def _read(self) -> int | None:
        free = _free(self.folders[0])
        if free is not None:
            self.least = free if self.least is None else min(self.least, free)
        return free


def _free(folder: Path) -> int | None:
    try:
        room = os.statvfs(folder)
    except OSError:
        return None
    return room.f_bavail * room.f_frsize


def _usage(folder: Path) -> int:
    """Bytes the files under ``folder`` take on disk; links are not followed."""
    total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                total += _usage(Path(entry.path))
            else:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Resident:
    """A command kept running in the sandbox between runs, given one run at a time (a ``resident`` workload).

    Started like any command (:func:`run`: the sandbox, its limits, a workload account, dying with the worker),
    with ``cwd`` as its working directory, which it keeps. Each run's files go in a fresh folder of it
    (:meth:`fresh_folder`), and the run is one line on the command's stdin, ``{"dir": FOLDER}`` (the folder as
    the command sees it); the command answers with one line on stdout, a JSON object. It pays its start
    (importing a library, loading a model) once, not once a run. A run that exceeds its time, whose lease is
    lost, or whose command exits ends the command, sandbox and all; the next run starts a fresh one.

    Parameters
    ----------
    argv:
        The command: program and arguments, never a shell string.
    cwd:
        Its own directory (created, and removed by :meth:`close`); each run's files are in a folder of it.
    env, network:
        As for :func:`run`.
    idle:
        Seconds it may wait for its next run before it is ended (None: it waits as long as its worker lives): a
        campaign that stopped sending work leaves nothing of its own running on the node.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        network: bool = False,
        idle: float | None = None,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.cwd = cwd
        self.env = dict(env or {})
        self.network = network
        self.idle = idle
        # Its use and the idle timer's end of it, which runs in the timer's thread, take turns: a run never finds
        # its command or folder taken away halfway (reentrant: a run that fails ends the command itself).
        self._lock = threading.RLock()
        self._uses = 0
        self._timer: threading.Timer | None = None
        self.folder = cwd / "run-0"
        self.runs = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._cleanup = contextlib.ExitStack()
        self._err: Any = None
        self._info: int | None = None
        self._pending = b""
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def fresh_folder(self) -> Path:
        """An empty folder for the next run's files, the last run's removed.

        Each run has a folder of its own name (``run-N``): a command that loads a library by its path (TVM's
        ``load_module``, ``dlopen``) would otherwise be given the one it loaded before, still in memory.
        """
        with self._lock:
            self._used()
            return self._fresh_folder()

    def _fresh_folder(self) -> Path:
        if self._proc is not None and not self.alive:
            self.close()  # it ended between runs: what it left goes now, not once the next run's files are there
        shutil.rmtree(self.folder, ignore_errors=True)
        self.runs += 1
        self.folder = self.cwd / f"run-{self.runs}"
        self.folder.mkdir(parents=True)
        return self.folder

    def _start(self) -> Completed | None:
        """Start the command; a Completed when it cannot run at all (no such program)."""
        self.close()
        self.cwd.mkdir(parents=True, exist_ok=True)
        env = sandbox_env(self.env)
        if not _found(self.argv[0], self.cwd, env):
            return Completed(self.argv, 127, "", f"cannot run {self.argv[0]}: No such file or directory", 0.0)
        cleanup = self._cleanup
        cleanup.callback(shutil.rmtree, self.cwd, ignore_errors=True)
        self._err = cleanup.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 (it lives as the command does)
        writer = None
        if sandbox.mode() == "bwrap":
            command, options, self._info, writer = _box(self.argv, self.cwd, env, self.network, cleanup)
        else:
            self._info = None
            command, options = _launch(self.argv, _as_account(self.cwd, env))
        try:
            self._proc = subprocess.Popen(
                command,
                cwd=self.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._err,
                env=env,
                start_new_session=True,
                **options,
            )
        except OSError as error:
            return Completed(self.argv, 127, "", f"cannot run {self.argv[0]}: {error.strerror}", 0.0)
        finally:
            if writer is not None:
                writer.close()  # the child holds it: the pipe ends when bubblewrap does
        for pipe in (self._proc.stdin, self._proc.stdout):
            self._cleanup.callback(_quietly_close, pipe)
        self._cleanup.callback(_kill_group, self._proc)  # first of all: the pipes are closed once it is gone
        self._pending = b""
        self.starts += 1
        return None

    def call(self, *, timeout: float, tick: Callable[[], bool] | None = None, tick_seconds: float = 5.0) -> Completed:
        """Run once with the files in :attr:`folder`, starting the command first if it is not running; wait at
        most ``timeout`` seconds (its start included) for its answer.

        ``returncode`` is 0 once the command answered: ``stdout`` is what it printed for this run, its answer the
        last line; otherwise the command has ended, and the Completed says how, as :func:`run`'s would.

        Raises
        ------
        SandboxUnavailable
            When the sandbox cannot start: the node's fault, not the command's.
        """
        with self._lock:
            self._used()
            try:
                return self._call(timeout, tick, tick_seconds)
            finally:
                self._idle_timer()

    def _used(self) -> None:
        """Count a use (the lock held): an idle timer armed before it no longer ends the command."""
        self._uses += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _idle_timer(self) -> None:
        """End the command once it has waited :attr:`idle` seconds with no use (the lock held)."""
        if self.idle is None or not self.alive:
            return
        self._timer = threading.Timer(self.idle, self._end_idle, (self._uses,))
        self._timer.daemon = True
        self._timer.start()

    def _end_idle(self, uses: int) -> None:
        with self._lock:
            if uses == self._uses:  # not used since the timer was armed
                self.close()

    def _call(self, timeout: float, tick: Callable[[], bool] | None, tick_seconds: float) -> Completed:
        start = time.monotonic()
        if not self.alive:
            failed = self._start()
            if failed is not None:
                return failed
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        if sandbox.mode() == "bwrap":
            _give(self.folder, sandbox.account())
        self._err.seek(0)
        self._err.truncate()
        out = bytearray()
        request = json.dumps({"dir": seen(self.folder, self.cwd)}).encode() + b"\n"
        try:
            self._proc.stdin.write(request)
            self._proc.stdin.flush()
        except BrokenPipeError:
            return self._ended(out, start, timed_out=False)
        fd = self._proc.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLIN | select.POLLHUP)
        # The same watch as a command of its own gets (run): its folder and temporary folder together.
        scratch = _ScratchWatch(_scratch(self.cwd), sandbox.Limits.from_env(os.environ))
        limit = output_limit()
        next_tick = start + tick_seconds
        while True:
            line, nl, rest = self._pending.partition(b"\n")
            if nl:
                self._pending = rest
                out += line + b"\n"
                if _answer(line):
                    self._err.seek(0)
                    err = _text(self._err.read(max(0, limit - len(out))))
                    seconds = time.monotonic() - start
                    return Completed(self.argv, 0, _text(bytes(out)), err, seconds, least_free=scratch.least_free())
                continue
            now = time.monotonic()
            left = timeout - (now - start)
            if left <= 0:
                return self._ended(out, start, timed_out=True)
            if poll.poll(max(0.0, min(left, next_tick - now, OUTPUT_WATCH_SECONDS)) * 1000):
                chunk = os.read(fd, 65536)
                if not chunk:  # the command closed its output: it has ended, or is of no more use
                    out += self._pending
                    return self._ended(out, start, timed_out=False)
                self._pending += chunk
            if len(out) + len(self._pending) + _size(self._err) > limit:
                return self._ended(out, start, timed_out=False, printed_limit=limit)
            if scratch.overgrown():
                return self._ended(out, start, timed_out=False, scratch_limit=scratch.limit)
            # Renewed on time even while the command prints lines that are not its answer.
            if time.monotonic() >= next_tick:
                next_tick += tick_seconds
                if tick is not None and not tick():
                    return self._ended(out, start, timed_out=False)

    def _ended(
        self,
        out: bytearray,
        start: float,
        timed_out: bool,
        scratch_limit: int | None = None,
        printed_limit: int | None = None,
    ) -> Completed:
        """End the command (it may have ended already) and say how, as :func:`run` would have."""
        assert self._proc is not None
        proc = self._proc
        if not timed_out:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)  # it closed its output as it exited: its status, not our kill
        _kill_group(proc)
        self._err.seek(0)
        if self._info is not None:
            _check_started(self._info, self._err, timed_out)
            self._err.seek(0)
        done = Completed(
            self.argv,
            None if timed_out else _status(proc.returncode, self._info is not None),
            _text(bytes(out)),  # no more than its limit: it is stopped past it
            _text(self._err.read(output_limit())),
            time.monotonic() - start,
            timed_out,
            scratch_limit,
            printed_limit,
        )
        self.close()
        return done

    def close(self) -> None:
        """End the command, sandbox and all, and remove its directory."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._proc = None
            self._info = None
            self._cleanup.close()
            self._cleanup = contextlib.ExitStack()


def _quietly_close(pipe: Any) -> None:
    with contextlib.suppress(OSError):
        pipe.close()


def _answer(line: bytes) -> bool:
    """Whether a line of a resident command's output is its answer: a JSON object."""
    text = line.strip()
    if not text.startswith(b"{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
