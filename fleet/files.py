"""Files users hand Fleet to import: Kernel Tuner caches, MIOpen databases and driver lines, TVM records.

Each is read as a stream that stops at ``FLEET_IMPORT_BYTES`` (256 MiB), counted after decompression: a file of any
size, or a gzip or bzip2 of a few kilobytes that expands to gigabytes, is refused in one line having taken no more
memory or disk than the limit.
"""

from __future__ import annotations

import bz2
import gzip
import io
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from fleet.errors import NotFound, SpecError

IMPORT_BYTES = 256 << 20
"""What an imported file may hold, decompressed (FLEET_IMPORT_BYTES)."""

_GZIP, _BZIP2 = b"\x1f\x8b", b"BZh"


class TooLarge(SpecError):
    """An imported file holds more than the limit."""


def import_limit() -> int:
    """The bytes an imported file may hold (``FLEET_IMPORT_BYTES``)."""
    from fleet.settings import positive_number

    return int(positive_number(os.environ, "FLEET_IMPORT_BYTES", IMPORT_BYTES))


def _too_large(path: Path, limit: int) -> TooLarge:
    from fleet.bundle import size_text

    return TooLarge(f"{path}: holds more than {size_text(limit)} (FLEET_IMPORT_BYTES)")


class _Bounded(io.RawIOBase):
    """A binary stream that raises :class:`TooLarge` once more than ``limit`` bytes came through it."""

    def __init__(self, inner: io.BufferedIOBase, path: Path, limit: int) -> None:
        super().__init__()
        self._inner, self._path, self._limit, self._read = inner, path, limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]  # io's buffer protocol type
        # Never ask for more than one byte past the limit: the byte that proves the file too large.
        view = memoryview(buffer)[: self._limit + 1 - self._read]
        try:
            count = self._inner.readinto(view)
        except (EOFError, zlib.error, OSError) as error:
            if isinstance(error, OSError) and error.strerror:  # the disk's error, not the file's contents
                raise NotFound(f"{self._path}: {error.strerror}") from None
            raise SpecError(f"{self._path}: not a readable compressed file ({error})") from None
        self._read += count
        if self._read > self._limit:
            raise _too_large(self._path, self._limit)
        return count


@contextmanager
def open_bytes(path: Path) -> Iterator[io.BufferedReader[_Bounded]]:
    """``path`` as a binary stream, gunzipped or bunzipped when its first bytes say so, bounded by the limit.

    Raises
    ------
    NotFound
        When the file cannot be opened (its reason).
    TooLarge
        When more than ``FLEET_IMPORT_BYTES`` is read from it.
    SpecError
        When a compressed file is corrupt.
    """
    try:
        raw = path.open("rb")
    except OSError as error:
        raise NotFound(f"{path}: {error.strerror}") from None
    with raw:
        inner: io.BufferedIOBase = raw
        kind = _compression(raw)
        if kind == "gzip":
            inner = gzip.GzipFile(fileobj=raw)
        elif kind == "bzip2":
            inner = bz2.BZ2File(raw)
        with io.BufferedReader(_Bounded(inner, path, import_limit()), 1 << 20) as stream:
            yield stream


def _compression(raw: io.BufferedReader) -> str | None:
    """``gzip``, ``bzip2`` or None, by a file's first bytes (peeked: a pipe cannot seek back)."""
    head = raw.peek(3)[:3]
    return "gzip" if head[:2] == _GZIP else "bzip2" if head == _BZIP2 else None


def read_bytes(path: Path) -> bytes:
    """The whole of an imported file, decompressed, within the limit (see :func:`open_bytes`)."""
    with open_bytes(path) as stream:
        return stream.read()


def read_text(path: Path, errors: str = "strict") -> str:
    """An imported file's UTF-8 text, decompressed, within the limit; :class:`SpecError` when it is not UTF-8."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text") from None


@contextmanager
def open_lines(path: Path) -> Iterator[IO[str]]:
    """An imported text file's lines as a stream (memory bounded by a line, and every line by the limit)."""
    with open_bytes(path) as stream:
        yield io.TextIOWrapper(stream, encoding="utf-8", newline="\n")


@contextmanager
def plain_copy(path: Path) -> Iterator[Path]:
    """``path`` where a program reads it whole (SQLite): itself when it is not compressed and within the limit,
    else its decompressed copy in a temporary folder, written within the limit and removed afterwards."""
    limit = import_limit()
    try:
        with path.open("rb") as raw:
            compressed = _compression(raw) is not None
            size = os.fstat(raw.fileno()).st_size
    except OSError as error:
        raise NotFound(f"{path}: {error.strerror}") from None
    if not compressed:
        if size > limit:
            raise _too_large(path, limit)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="fleet-import-") as folder:
        copy = Path(folder) / path.name.removesuffix(".bz2").removesuffix(".gz")
        with open_bytes(path) as stream, copy.open("wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        yield copy
