"""The one sandbox every command a spec brings runs in: bubblewrap, with limits and a workload account.

Why bubblewrap (Debian's ``bubblewrap``) rather than ``unshare`` driven by Fleet: one exec sets up the whole
sandbox from an argument list (``unshare`` would need a script of mounts run as root), its own init as PID 1
reaps and, when the command ends or the worker kills it, takes every process of the namespace with it
(``setsid`` and double-forked children included), and it works unprivileged through a user namespace, so a
worker that is not root gets the same sandbox. It starts in about 7 ms (``fleet bench sandbox``).

What a command sees:

- its own PID namespace (``/proc`` shows only its processes), IPC, UTS and cgroup namespaces;
- no network unless its spec asks for it (``"network": true``): a measurement has no business there, and a
  cut network keeps a workload off the broker and the database;
- the filesystem read-only, except its scratch directory, which it sees as ``/run/fleet/work`` (its home and
  working directory, wherever the worker keeps it), and a private temporary directory, ``/run/fleet/tmp``
  (``TMPDIR``); the fleet's own state (``FLEET_HOME``, the artifact cache, secret files, the credentials
  directory, ``/run``) hidden under empty directories; ``/tmp`` and ``/var/tmp`` its own, empty (the folders of the
  worker's own ``PATH`` there, a CI clone's or a test's compiler, shown read-only: :func:`shown_tools`);
- no unix socket: a read-only mount does not stop ``connect()``, so creating one is refused
  (:func:`unix_socket_filter`), network or not;
- a minimal ``/dev``, plus the device nodes of the GPU its worker is pinned to;
- a workload account: a root worker switches to ``FLEET_WORKLOAD_USER`` (``nobody`` when unset) with every
  capability dropped once the mounts are made; a worker that is not root runs it in a user namespace;
- limits on address space, processes and file size, set by the runner before bubblewrap starts, and on what
  its scratch and temporary directories hold together, which the runner watches while it runs.

``FLEET_SANDBOX=none`` turns it off; a worker then says on every start what is not isolated.
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import ConfigurationError, NodeFault

# Limits, each overridable from the environment: generous for a build, small enough that a runaway
# workload cannot take the node down with it.
DEFAULT_MEMORY_BYTES = 32 << 30
DEFAULT_PROCESSES = 4096
DEFAULT_FILE_BYTES = 8 << 30
DEFAULT_SCRATCH_BYTES = 32 << 30
# Files and folders of the worker's account that hold credentials: hidden from a workload that runs under
# the same account (a worker that is not root).
_HOME_SECRETS = (".pgpass", ".netrc", ".ssh", ".aws", ".docker", ".config/fleet", ".redis", ".rediscli_auth")

# Where a command finds its scratch directory and its temporary one: the same for every command on every node,
# reachable whatever folders above the worker's own copy its account may not pass.
WORK = "/run/fleet/work"
TMP = "/run/fleet/tmp"

NOT_ISOLATED = (
    "FLEET_SANDBOX=none: workload commands run without a sandbox: they see this node's processes, network and "
    "whole filesystem, run as {account}, and are killed by process group only"
)


class SandboxUnavailable(NodeFault):
    """The sandbox cannot start on this node: the node's fault, never the configuration's."""


@dataclass(frozen=True)
class Limits:
    """What one command may use. ``memory`` is an address-space limit (RLIMIT_AS) on a CPU worker and a
    data-segment limit (RLIMIT_DATA) on a GPU worker, whose drivers map far more address space than they use."""

    memory: int = DEFAULT_MEMORY_BYTES
    processes: int = DEFAULT_PROCESSES
    file_size: int = DEFAULT_FILE_BYTES
    # What its scratch and temporary directories may hold together; the runner watches it (no quota needed).
    scratch: int = DEFAULT_SCRATCH_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        from fleet.settings import positive_number

        def size(name: str, default: int) -> int:
            return int(positive_number(env, name, default))

        return cls(
            size("FLEET_SANDBOX_MEMORY", DEFAULT_MEMORY_BYTES),
            size("FLEET_SANDBOX_PROCESSES", DEFAULT_PROCESSES),
            size("FLEET_SANDBOX_FILE_SIZE", DEFAULT_FILE_BYTES),
            size("FLEET_SANDBOX_SCRATCH", DEFAULT_SCRATCH_BYTES),
        )


def configured() -> str:
    """``bwrap`` or ``none``, as ``FLEET_SANDBOX`` asks (``auto``, the default, means ``bwrap``).

    Raises
    ------
    ConfigurationError
        For any other value.
    """
    value = os.environ.get("FLEET_SANDBOX", "auto").strip().lower() or "auto"
    if value not in ("auto", "bwrap", "none"):
        raise ConfigurationError(f"FLEET_SANDBOX={value!r}: expected auto, bwrap or none")
    return "none" if value == "none" else "bwrap"


def mode() -> str:
    """``bwrap`` or ``none``: how commands run in this process.

    As configured; except that embedded Fleet (one user's own machine, ``make run``) where the sandbox cannot
    start goes on without it, saying so once. A fleet worker refuses to start instead (:func:`require`).
    """
    if configured() == "none":
        return "none"
    if probe() is None or not _embedded():
        return "bwrap"
    _warn_unsandboxed()
    return "none"


def _embedded() -> bool:
    from fleet.settings import Settings

    try:
        return Settings.from_env().embedded_database
    except ConfigurationError:
        return False


@functools.cache
def _warn_unsandboxed() -> None:
    print(f"fleet: warning: {probe()}: workloads run without a sandbox on this machine", file=sys.stderr)


@functools.cache
def probe() -> str | None:
    """Why the sandbox cannot start on this node, in one line, or None when it can (checked once per process)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    scratch = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        argv = wrap(["true"], cwd=scratch, env={}, hide=(), who=None)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, cwd=scratch)
    except (OSError, subprocess.TimeoutExpired, ConfigurationError) as error:
        return f"bubblewrap cannot start: {error}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
        return f"bubblewrap cannot start here (namespaces refused?): {said}"
    return None


def require() -> None:
    """Raise :class:`SandboxUnavailable` when the sandbox is on and cannot start on this node."""
    reason = probe() if mode() == "bwrap" else None
    if reason is not None:
        raise SandboxUnavailable(f"{reason}; set FLEET_SANDBOX=none to run workloads without one (not isolated)")


def account() -> pwd.struct_passwd | None:
    """The account commands run as, or None for the worker's own (a worker that is not root).

    ``FLEET_WORKLOAD_USER``; for a root worker with none set, ``nobody``: a workload never runs as root.

    Raises
    ------
    ConfigurationError
        When it names no account on this node, or a worker that is not root names another account.
    """
    name = os.environ.get("FLEET_WORKLOAD_USER") or ("nobody" if os.geteuid() == 0 and mode() != "none" else "")
    if not name:
        return None
    try:
        found = pwd.getpwnam(name)
    except KeyError:
        raise ConfigurationError(f"FLEET_WORKLOAD_USER={name!r}: no such user on this node") from None
    if found.pw_uid == os.getuid():
        return None
    if os.geteuid() != 0:
        raise ConfigurationError(
            f"FLEET_WORKLOAD_USER={name!r}: only a worker that runs as root can run commands as it"
        )
    return found


def hidden_paths(env: Mapping[str, str] | None = None) -> list[Path]:
    """What a workload must not see: the fleet's state, secret files, and credentials in the worker's home."""
    env = os.environ if env is None else env
    from fleet.settings import Settings

    try:
        settings = Settings.from_env(dict(env))
    except ConfigurationError as error:
        # Without its settings the worker cannot tell where the fleet's state is: it runs nothing rather than run a
        # workload that might see it. The node's fault: the trial goes to another worker.
        raise SandboxUnavailable(f"cannot tell what to hide from workloads: {error}") from None
    found = [settings.home, settings.cache_dir]
    for name in ("FLEET_DATABASE_URL_FILE", "FLEET_BROKER_URL_FILE", "CREDENTIALS_DIRECTORY"):
        if env.get(name):
            found.append(Path(env[name]))
    home = Path(env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)
    found += [home / name for name in _HOME_SECRETS]
    return [path.absolute() for path in found if path.exists()]


def gpu_nodes(env: Mapping[str, str]) -> list[str]:
    """The device nodes of the GPUs ``env`` pins the command to, and the drivers' shared nodes.

    Parameters
    ----------
    env:
        The command's environment: ``CUDA_VISIBLE_DEVICES`` or ``HIP_VISIBLE_DEVICES`` name the GPUs by index.
    """
    nodes: list[str] = []
    nvidia = env.get("CUDA_VISIBLE_DEVICES")
    if nvidia is not None and glob.glob("/dev/nvidia*"):
        nodes += ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
        nodes += [f"/dev/nvidia{index}" for index in _indices(nvidia)]
    amd = env.get("HIP_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES")
    if amd is not None and os.path.exists("/dev/kfd"):
        nodes.append("/dev/kfd")
        nodes += [f"/dev/dri/renderD{128 + index}" for index in _indices(amd)]
    return [node for node in nodes if os.path.exists(node)]


def _indices(pinning: str) -> list[int]:
    return [int(part) for part in pinning.split(",") if part.strip().isdigit()]


PRIVATE = ("/tmp", "/var/tmp")
"""The node's shared temporary folders: a command gets empty ones of its own (whatever is left in them, another
campaign's files, a database's or a broker's socket, is no workload's business)."""


PROGRAM_SETTINGS = ("FLEET_MIOPEN_DRIVER",)
"""The worker's settings that name a program its workloads run (fleet.workers.workloads.miopen's driver)."""


def shown_tools(env: Mapping[str, str] | None = None) -> list[Path]:
    """The folders of the worker's own ``PATH`` and ``LD_LIBRARY_PATH``, those of the programs its settings name
    (:data:`PROGRAM_SETTINGS`), and its own Python and Fleet (a clone's virtual environment and checkout), that lie
    in :data:`PRIVATE`: its toolchain (a CI checkout under ``/tmp``, a test's compiler or driver), shown read-only
    in the command's own ``/tmp``; Fleet's own paths in them stay hidden (:func:`hidden_paths`). The worker's, never
    the spec's: a spec that set ``PATH=/tmp`` would otherwise be shown the node's whole ``/tmp``."""
    env = os.environ if env is None else env
    entries = [entry for name in ("PATH", "LD_LIBRARY_PATH") for entry in (env.get(name) or "").split(":")]
    entries += [str(Path(env[name]).parent) for name in PROGRAM_SETTINGS if env.get(name)]
    entries += [sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2])]
    found: list[Path] = []
    for entry in entries:
        path = Path(entry)
        if path.is_absolute() and _under(path, PRIVATE) and path.is_dir() and path not in found:
            found.append(path)
    return found


def _under(path: Path, folders: Sequence[str | Path]) -> bool:
    return any(path == Path(folder) or Path(folder) in path.parents for folder in folders)


def _jump(where: Mapping[str, int], at: int, label: str) -> int:
    """The BPF jump offset from the instruction at ``at`` to ``label`` (0 to the next instruction)."""
    return 0 if label == "next" else where[label] - at - 1


def unix_socket_filter() -> bytes:
    """A seccomp program (classic BPF, as bubblewrap's ``--seccomp`` takes it) refusing to create a unix socket:
    ``socket(AF_UNIX, ...)`` fails with EACCES, and on i386 ``socketcall(SYS_SOCKET)`` too (its family is behind a
    pointer). A read-only mount does not stop ``connect()`` to a socket file, and one lies wherever a service put it
    (a database's in ``/tmp``, a user's agent), and a peer-credential check would see the worker's own account in a
    worker that is not root: a command reaches none. ``socketpair`` still works.
    """
    import struct

    # (audit arch, socket's number, socketcall's number or None, the lowest number of another ABI or None)
    arches = [
        (0xC000003E, 41, None, 0x40000000),  # x86_64 (x32's numbers have bit 30 set: refused whole)
        (0x40000003, 359, 102, None),  # i386, on an x86_64 kernel
        (0xC00000B7, 198, None, None),  # aarch64
        (0x40000028, 281, None, None),  # arm, on an aarch64 kernel
    ]
    program: list[tuple[int, int, int, int]] = []
    for arch, socket_nr, socketcall_nr, other_abi in arches:
        # Labels: "next" the next instruction, "skip" past this socket test, "allow" and "deny" the block's end.
        block: list[tuple[int, int, str, str]] = [(_LD, _NR, "next", "next")]
        if other_abi is not None:
            block.append((_JGE, other_abi, "deny", "next"))
        block += [(_JEQ, socket_nr, "next", "skip"), (_LD, _ARG0, "next", "next"), (_JEQ, 1, "deny", "allow")]
        if socketcall_nr is not None:  # A still holds the number here: "skip" lands on this test
            block += [(_JEQ, socketcall_nr, "next", "allow"), (_LD, _ARG0, "next", "next"), (_JEQ, 1, "deny", "allow")]
        block += [(_RET, _ALLOW, "next", "next"), (_RET, _DENY, "next", "next")]
        skip = next(at for at, i in enumerate(block) if i[1] == 1) + 1  # past the socket test's family check
        where = {"allow": len(block) - 2, "deny": len(block) - 1, "skip": skip}
        resolved = [(code, _jump(where, at, jt), _jump(where, at, jf), k) for at, (code, k, jt, jf) in enumerate(block)]
        program += [(_LD, 0, 0, _ARCH), (_JEQ, 0, len(resolved), arch), *resolved]
    program.append((_RET, 0, 0, _ALLOW))  # another architecture: nothing of ours to refuse
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# Classic BPF for unix_socket_filter: the opcodes, seccomp_data's offsets, and the verdicts.
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_NR, _ARCH, _ARG0 = 0, 4, 16  # args[0]'s low half, on these little-endian machines
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EACCES


def wrap(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    network: bool = False,
    hide: Sequence[Path] | None = None,
    tmp: Path | None = None,
    who: pwd.struct_passwd | str | None = "default",
    seccomp: int | None = None,
) -> list[str]:
    """``argv`` as the sandbox runs it in ``cwd`` (which it sees as :data:`WORK`): the bubblewrap and setpriv
    argument list.

    The runner starts it under its limits (:class:`Limits`), which the sandbox inherits.

    Parameters
    ----------
    env:
        The command's environment (its GPU pinning chooses the device nodes it gets).
    network:
        Keep the node's network (the spec asked for it).
    hide:
        Paths to hide; by default :func:`hidden_paths`.
    tmp:
        A directory of the command's own, writable, for its temporary files (seen as :data:`TMP`).
    who:
        The account to run it as; by default :func:`account`.
    seccomp:
        A file descriptor the command's start inherits, holding :func:`unix_socket_filter`: the command creates no
        unix socket, network or not (the network a spec asks for is the node's TCP/IP, not its services' sockets).
    """
    bwrap = shutil.which("bwrap") or "bwrap"
    cwd = cwd.absolute()
    box = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        box.append("--unshare-net")
    if who == "default":
        who = account()
    assert not isinstance(who, str)
    if os.geteuid() != 0:
        # Unprivileged: a user namespace, in which the worker's account is mapped to an unprivileged id.
        box += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
    box += ["--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    box += ["--tmpfs", "/run"]
    for folder in PRIVATE:
        box += ["--tmpfs", folder]
    shown = shown_tools()
    for path in shown:
        # The folders on its way, made in the private /tmp, passable by the workload's account as on the node.
        ancestors = [a for a in reversed(path.parents) if _under(a, PRIVATE) and str(a) not in PRIVATE]
        for parent in ancestors:
            box += ["--perms", "0755", "--dir", str(parent)]
        box += ["--ro-bind", str(path), str(path)]
    for path in hidden_paths() if hide is None else hide:
        if _under(path, PRIVATE) and not any(_under(path, [tool]) or _under(tool, [path]) for tool in shown):
            continue  # gone with the node's /tmp; hiding it would leave its folders' names there
        box += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    if seccomp is not None:
        box += ["--seccomp", str(seccomp)]
    for node in gpu_nodes(env):
        box += ["--dev-bind", node, node]
    box += ["--perms", "0755", "--dir", os.path.dirname(WORK)]
    if tmp is not None:
        box += ["--bind", str(tmp), TMP]
    box += ["--bind", str(cwd), WORK, "--chdir", WORK, "--"]
    if who is not None:
        groups = os.getgrouplist(who.pw_name, who.pw_gid)  # video, render: the GPUs' device nodes
        box += [
            "setpriv",
            f"--reuid={who.pw_uid}",
            f"--regid={who.pw_gid}",
            f"--groups={','.join(map(str, groups))}",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    return [*box, *argv]


def describe() -> str:
    """One line saying what isolates a workload on this node, for a worker's start."""
    who = account()
    name = who.pw_name if who is not None else pwd.getpwuid(os.getuid()).pw_name
    if mode() == "none":
        return "warning: " + NOT_ISOLATED.format(account=name)
    network = "no network unless a spec asks"
    return f"sandbox: bubblewrap, workloads as {name!r}, own PID and mount namespaces, {network}"
