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
        tar.extractall(destination, filter="data")
        return tar.getnames()


def read_files(base: Path, names: list[str]) -> dict[str, bytes]:
    """Read ``names`` (relative to ``base``) for :func:`pack`."""
    return {name: (base / name).read_bytes() for name in names}
