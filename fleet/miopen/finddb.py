"""MIOpen's find-db text files (``<arch>_<cu>.HIP.fdb.txt``), read and written deterministically.

One line a problem, ``KEY=entry;entry;...``, the key as :func:`fleet.miopen.keys.db_key` writes it. MIOpen 2.x
(the ``legacy`` style, as in ``gfx803_36.HIP.fdb.txt``) writes each entry as
``algorithm:solver,time_ms,workspace_bytes,kcache_algorithm,kcache_network_config``: the record id is the
algorithm (``miopenConvolutionFwdAlgoGEMM``), then ``FindDbData``'s fields in order: the solver, its time, its
workspace and the kernel-cache key the solver's kernels are stored under (``<unused>`` network config for
solvers that do not use the kernel cache). MIOpen 3.x (the ``current`` style) writes
``solver:time_ms,workspace_bytes,algorithm``. :func:`read_find_db` reads both and notes on each record the
format it came in (:attr:`FindRecord.style`); :func:`write_find_db` writes either. Users call the two formats
``older`` and ``newer`` (:data:`FORMATS`). MIOpen writes a record's entries fastest first, but not every shipped
file keeps to it (equal times, hand-merged files): ``keep_order`` writes them as they were read.
Times are written as MIOpen's C++ streams write a ``float`` (``%g``, six significant digits), which
reproduces the shipped files' values exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fleet.errors import MIOpenDbError, NotFound, SpecError
from fleet.files import open_lines

STYLES = ("legacy", "current")
# The line formats by the names users know them by.
FORMATS = {"older": "legacy", "newer": "current"}
UNUSED = "<unused>"
_FORBIDDEN = set("=;:,\n\r")


@dataclass(frozen=True)
class FindEntry:
    """One solver's result in a find-db record.

    Parameters
    ----------
    algorithm:
        The convolution algorithm, e.g. ``miopenConvolutionFwdAlgoWinograd``.
    solver:
        The solver, e.g. ``ConvBinWinogradRxSf2x3g1``.
    time_ms:
        Its measured time in milliseconds.
    workspace:
        Its workspace in bytes.
    kernel_group:
        The kernel-cache network config its kernels are stored under; ``<unused>`` when it needs none.
    kernel_algorithm:
        The kernel-cache algorithm name (legacy style's fourth field, e.g. ``rocBlas`` for GEMM); empty means
        the same as ``algorithm``.
    time_text:
        The time as the file spelt it, when that is not how :func:`format_time` writes it (``2.0`` for ``2``):
        written back as it was. Empty for the usual spelling.
    """

    algorithm: str
    solver: str
    time_ms: float
    workspace: int
    kernel_group: str = UNUSED
    kernel_algorithm: str = ""
    time_text: str = ""


@dataclass(frozen=True)
class FindRecord:
    """All entries of one problem.

    Parameters
    ----------
    key:
        The problem's MIOpen key.
    entries:
        Its solvers' results, fastest first.
    style:
        The line format it was read in (``legacy`` or ``current``); empty for a record Fleet made.
    """

    key: str
    entries: tuple[FindEntry, ...]
    style: str = ""


def read_find_db(path: str | Path) -> Iterator[FindRecord]:
    """Read a find-db text file, ``.bz2``-compressed or not.

    Parameters
    ----------
    path:
        The file. Blank lines are skipped.

    Raises
    ------
    MIOpenDbError
        On the first line that is not ``KEY=entry;...``, naming the file and line number.
    """
    path = Path(path)
    try:
        with open_lines(path) as stream:
            for number, line in enumerate(stream, start=1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                try:
                    yield parse_record(line)
                except MIOpenDbError as error:
                    raise MIOpenDbError(f"{path}:{number}: {error}") from None
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise MIOpenDbError(f"cannot read find-db {path}: {error}") from None
    except (NotFound, SpecError) as error:  # absent, too large or a corrupt bzip2 (fleet.files)
        raise MIOpenDbError(str(error)) from None


def parse_record(line: str) -> FindRecord:
    """Parse one find-db line.

    Parameters
    ----------
    line:
        ``KEY=entry;entry;...`` in either style.
    """
    key, sep, body = line.partition("=")
    if not sep or not key:
        raise MIOpenDbError("a find-db line is KEY=entry;entry;... and this one has no '='")
    if not body:
        raise MIOpenDbError(f"record {key} has no entries")
    entries = []
    counts = set()
    for text in body.split(";"):
        ident, sep, values = text.partition(":")
        fields = values.split(",")
        if not sep or not ident or len(fields) not in (3, 5):
            raise MIOpenDbError(f"entry {text!r} of {key} is not id:values with 3 or 5 values")
        counts.add(len(fields))
        time_field = fields[1 if len(fields) == 5 else 0]
        try:
            time_ms = float(time_field)
            workspace = int(fields[2 if len(fields) == 5 else 1])
        except ValueError:
            raise MIOpenDbError(f"entry {text!r} of {key} has a time or workspace that is not a number") from None
        time_text = "" if format_time(time_ms) == time_field else time_field
        if len(fields) == 5:
            solver, _, _, kernel_algorithm, kernel_group = fields
            entries.append(FindEntry(ident, solver, time_ms, workspace, kernel_group, kernel_algorithm, time_text))
        else:
            entries.append(FindEntry(fields[2], ident, time_ms, workspace, "", "", time_text))
    style = "" if len(counts) != 1 else "legacy" if counts == {5} else "current"
    return FindRecord(key, tuple(entries), style)


def format_time(time_ms: float) -> str:
    """A time as MIOpen writes it: a C++ ``float`` through an ``ostream``, i.e. ``%g``.

    Parameters
    ----------
    time_ms:
        Milliseconds.
    """
    return f"{time_ms:g}"


def format_record(record: FindRecord, *, style: str = "legacy", keep_order: bool = False) -> str:
    """One find-db line (without the newline), entries fastest first.

    Parameters
    ----------
    record:
        The record.
    style:
        ``legacy`` (MIOpen 2.x entries) or ``current`` (MIOpen 3.x).
    keep_order:
        Write the entries in the record's order instead of fastest first.
    """
    if style not in STYLES:
        raise MIOpenDbError(f"find-db style must be one of {', '.join(STYLES)}, not {style!r}")
    _check_text(record.key, "key", record.key)
    if not record.key:
        raise MIOpenDbError("a find-db record has an empty key")
    if not record.entries:
        raise MIOpenDbError(f"record {record.key} has no entries")
    parts = []
    for entry in record.entries if keep_order else sorted(record.entries, key=_entry_order):
        for name in ("algorithm", "solver", "kernel_group", "kernel_algorithm"):
            _check_text(getattr(entry, name), name, record.key)
        if not entry.algorithm or not entry.solver:
            raise MIOpenDbError(f"an entry of {record.key} has no algorithm or no solver")
        if not math.isfinite(entry.time_ms) or entry.time_ms < 0 or entry.workspace < 0:
            raise MIOpenDbError(f"entry {entry.solver} of {record.key} has a negative or non-finite value")
        time = _time_text(entry)
        if style == "legacy":
            values = [
                entry.solver,
                time,
                str(entry.workspace),
                entry.kernel_algorithm or entry.algorithm,
                entry.kernel_group or UNUSED,
            ]
            parts.append(f"{entry.algorithm}:{','.join(values)}")
        else:
            parts.append(f"{entry.solver}:{time},{entry.workspace},{entry.algorithm}")
    return f"{record.key}={';'.join(parts)}"


def write_find_db(
    records: Iterable[FindRecord], out: TextIO, *, style: str = "legacy", keep_order: bool = False
) -> int:
    """Write records as a find-db text file: sorted by key, entries fastest first, ``\\n`` line ends.

    Parameters
    ----------
    records:
        The records; two with the same key are an error.
    out:
        A text stream. Everything is formatted before the first write, so a bad record writes nothing.
    style:
        ``legacy`` (default, MIOpen 2.x) or ``current`` (MIOpen 3.x).
    keep_order:
        Write each record's entries in its own order instead of fastest first.

    Returns
    -------
    int
        The number of records written.
    """
    by_key: dict[str, FindRecord] = {}
    for record in records:
        if record.key in by_key:
            raise MIOpenDbError(f"two find-db records for key {record.key}")
        by_key[record.key] = record
    lines = [format_record(by_key[key], style=style, keep_order=keep_order) + "\n" for key in sorted(by_key)]
    out.write("".join(lines))
    return len(lines)


def _time_text(entry: FindEntry) -> str:
    # The file's own spelling survives only while it still says the same number.
    if entry.time_text:
        try:
            if float(entry.time_text) == entry.time_ms and not _FORBIDDEN & set(entry.time_text):
                return entry.time_text
        except ValueError:
            pass
    return format_time(entry.time_ms)


def _entry_order(entry: FindEntry) -> tuple:
    # Fastest first; equal times in a fixed order so the same records always give the same bytes.
    return (entry.time_ms, entry.algorithm, entry.solver, entry.workspace, entry.kernel_algorithm, entry.kernel_group)


def _check_text(value: str, name: str, key: str) -> None:
    if not isinstance(value, str) or _FORBIDDEN & set(value):
        raise MIOpenDbError(f"{name} {value!r} of record {key} holds one of = ; : , or a newline")
