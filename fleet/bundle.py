"""Deterministic tar bundles: source files going to workers, and built artifacts coming back."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path


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


def read_files(base: Path, names: list[str]) -> dict[str, bytes]:
    """Read ``names`` (relative to ``base``) for :func:`pack`."""
    return {name: (base / name).read_bytes() for name in names}


def unpack_files(data: bytes) -> dict[str, bytes]:
    """The files of a bundle (name -> bytes), read in memory: :func:`pack` undone."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
