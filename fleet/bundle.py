"""Deterministic tar bundles: source files going to workers, and built artifacts coming back."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Mapping
from pathlib import Path


class Refused(Exception):
    """A file that a spec, an imported file or a build names and that may not be read: ``why`` is ``outside``
    (absolute, or climbing with ``..``), ``missing``, ``link`` (it, or a folder on its way, is a symbolic link),
    ``special`` (not a regular file, or one with other names) or ``large`` (over the limit)."""

    def __init__(self, name: str, why: str, limit: int = 0) -> None:
        super().__init__(f"{name!r}: {why}")
        self.name, self.why, self.limit = name, why, limit

    def said(self, what: str, folder: str) -> str:
        """One line for the user: ``what`` the file is to them (``workload source``), ``folder`` where it must be."""
        from fleet.errors import shown

        name = shown(self.name)
        if self.why == "missing":
            plain = self.name if self.name.isprintable() else name
            return f"{what} {plain}: No such file or directory in {folder}"
        if self.why == "large":
            return f"{what} {name} is larger than {size_text(self.limit)}"
        return f"{what} {name} must be a regular file inside {folder}, named without '..' and through no link"


def read_inside(folder: Path, name: str, *, limit: int, own: bool = False) -> bytes:
    """The bytes of ``name``, a regular file inside ``folder``, read without following a link: the one check every
    path a spec, an imported file or a build names goes through.

    Each component is opened with ``O_NOFOLLOW`` from ``folder``, so no link, however placed, leads out of it
    (``k.c -> /proc/self/environ``, ``d -> /``); a FIFO or device is refused before it is read (``O_NONBLOCK``: a
    FIFO with no writer would otherwise hang the reader), and at most ``limit`` bytes are read. ``own`` also refuses
    a file with other names (a hard link the workload's account made to a file only the reader may read).

    Raises
    ------
    Refused
        Saying why, for the caller to word.
    """
    parts = name.split("/")
    if not name or name.startswith("/") or ".." in parts:
        raise Refused(name, "outside")
    try:
        here = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        raise Refused(name, "missing") from None
    try:
        for part in [p for p in parts[:-1] if p not in ("", ".")]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
            except FileNotFoundError:
                raise Refused(name, "missing") from None
            except OSError:
                raise Refused(name, "link") from None  # ELOOP or ENOTDIR: a link, or no folder
            os.close(here)
            here = inner
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=here)
        except FileNotFoundError:
            raise Refused(name, "missing") from None
        except IsADirectoryError:
            raise Refused(name, "special") from None
        except OSError:
            raise Refused(name, "link") from None
    finally:
        os.close(here)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (own and info.st_nlink != 1):
        os.close(fd)
        raise Refused(name, "special")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > limit:
            raise Refused(name, "large", limit)
        data = file.read(limit + 1)  # it may grow while read: the limit holds all the same
        if len(data) > limit:
            raise Refused(name, "large", limit)
        return data


def size_text(size: int) -> str:
    """``size`` bytes in the unit that says it shortest: ``256 MiB``, ``4 KiB``, ``17 bytes``."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.3g} {unit}"
    return f"{size} bytes"


def pack(files: Mapping[str, bytes]) -> bytes:
    """A gzip'd tar of ``files`` (name -> bytes): the same files always give the same bytes."""
    buffer = io.BytesIO()
    # mtime=0 in both the gzip header and the members keeps the digest a function of the content alone.
    import gzip

    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def unpack(data: bytes, destination: Path) -> list[str]:
    """Extract a bundle into ``destination``; refuses members that would land outside it."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(destination, filter="data")
        else:
            # Python before 3.11.4 (Debian 12's 3.11.2) has no extraction filters: allow only plain files
            # and directories with relative paths that stay inside ``destination``.
            root = destination.resolve()
            for member in tar.getmembers():
                target = (root / member.name).resolve()
                if not (member.isfile() or member.isdir()) or not target.is_relative_to(root):
                    raise tarfile.TarError(f"bundle member {member.name!r} is not a plain file inside the bundle")
            tar.extractall(destination)
        return tar.getnames()


def read_files(base: Path, names: list[str], *, limit: int = 64 << 20) -> dict[str, bytes]:
    """Read ``names`` (relative to ``base``) for :func:`pack`, each through :func:`read_inside`, at most ``limit``
    bytes in all."""
    files: dict[str, bytes] = {}
    for name in names:
        files[name] = read_inside(base, name, limit=limit)
        limit -= len(files[name])
    return files


def unpack_files(data: bytes) -> dict[str, bytes]:
    """The files of a bundle (name -> bytes), read in memory: :func:`pack` undone."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]  # a regular member always has a file
