"""MIOpen's perf-db (``<arch>_<cu>.db``, SQLite): tuned solver parameters per problem.

The schema is MIOpen's own, statement for statement (as in the shipped ``gfx900_56.db``): table ``config``, one
row a problem as MIOpen's ``ProblemDescription`` sees it (for ``B`` and ``W`` from the dy side, like the key),
unique over all its columns; table ``perf_db``, one row a (solver, config) with the solver's tuned parameters
as a comma-separated string.

Two things the ``config`` table does not record, and how Fleet fills them in when reading:

- the tensors' layouts apart from the key side's input layout (column ``layout``): all three tensors are taken
  to use it (``NCHW`` in a 3-D row is MIOpen 2.x's spelling of ``NCDHW``);
- for ``B`` and ``W`` rows, the size of x (only dy's is stored): Fleet takes the smallest x that gives the
  recorded dy, which is exact for stride 1 and for every x that fits the strides exactly.

Writing is deterministic: configs sorted by their columns and numbered from 1, perf rows sorted by config and
solver and numbered from 1, into a temporary file renamed over the target only when complete.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.errors import DriverLineError, MIOpenDbError, NotFound, SpecError
from fleet.files import plain_copy
from fleet.miopen.driver import DEFAULT_LAYOUT, LAYOUTS, PRECISIONS, _conv_checked, output_sizes
from fleet.miopen.keys import DIRECTIONS, STYLES, key_frame, perf_layout
from fleet.miopen.sqlitefile import write_sqlite

CONFIG_COLUMNS = (  # noqa: SIM905 - a word list reads better than a column
    "layout data_type direction spatial_dim in_channels in_h in_w in_d fil_h fil_w fil_d out_channels "
    "batchsize pad_h pad_w pad_d conv_stride_h conv_stride_w conv_stride_d dilation_h dilation_w "
    "dilation_d bias group_count"
).split()

# MIOpen's DDL, as sqlite_master holds it in the shipped perf-dbs.
SCHEMA = (
    "CREATE TABLE `config` (`id` INTEGER PRIMARY KEY ASC,`layout` TEXT NOT NULL,`data_type` TEXT NOT NULL,"
    "`direction` TEXT NOT NULL,`spatial_dim` INT NOT NULL,`in_channels` INT NOT NULL,`in_h` INT NOT NULL,"
    "`in_w` INT NOT NULL,`in_d` INT NOT NULL,`fil_h` INT NOT NULL,`fil_w` INT NOT NULL,`fil_d` INT NOT NULL,"
    "`out_channels` INT NOT NULL,`batchsize` INT NOT NULL,`pad_h` INT NOT NULL,`pad_w` INT NOT NULL,"
    "`pad_d` INT NOT NULL,`conv_stride_h` INT NOT NULL,`conv_stride_w` INT NOT NULL,"
    "`conv_stride_d` INT NOT NULL,`dilation_h` INT NOT NULL,`dilation_w` INT NOT NULL,"
    "`dilation_d` INT NOT NULL,`bias` INT NOT NULL,`group_count` INT NOT NULL)",
    "CREATE UNIQUE INDEX `idx_config` ON config( layout,data_type,direction, spatial_dim,in_channels,in_h,in_w,"
    "in_d,fil_h,fil_w,fil_d,out_channels,batchsize,pad_h,pad_w,pad_d,conv_stride_h,conv_stride_w,conv_stride_d,"
    "dilation_h,dilation_w,dilation_d,bias,group_count )",
    "CREATE TABLE `perf_db` (`id` INTEGER PRIMARY KEY ASC,`solver` TEXT NOT NULL,`config` INTEGER NOT NULL,"
    "`params` TEXT NOT NULL)",
    "CREATE UNIQUE INDEX `idx_perf_db` ON perf_db(solver, config)",
)


@dataclass(frozen=True)
class PerfRecord:
    """One solver's tuned parameters for one problem.

    Parameters
    ----------
    params:
        The canonical conv problem with ``direction`` (see :mod:`fleet.miopen.driver`).
    solver:
        The solver, e.g. ``ConvOclDirectFwd``.
    values:
        Its tuned parameters as MIOpen serialises them, e.g. ``16,16,32,32,2,2,2,4,2``.
    """

    params: dict
    solver: str
    values: str

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.params.items())), self.solver, self.values))


def perf_config(params: Mapping[str, Any], *, style: str = "legacy") -> dict[str, Any]:
    """The perf-db ``config`` row (without ``id``) of a conv problem in one direction.

    Parameters
    ----------
    params:
        Canonical conv parameters with ``direction``.
    style:
        ``legacy`` (default: 3-D default layout written ``NCHW``, as MIOpen 2.x) or ``current``.
    """
    if style not in STYLES:
        raise SpecError(f"perf-db style must be one of {', '.join(STYLES)}, not {style!r}")
    frame = key_frame(params)
    row = {name: frame[name] for name in CONFIG_COLUMNS if name in frame}
    row.update(layout=perf_layout(params, style=style), data_type=frame["precision"])
    return {name: row[name] for name in CONFIG_COLUMNS}


def params_from_config(row: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical conv problem (with ``direction``) of a perf-db ``config`` row.

    Parameters
    ----------
    row:
        The row's columns by name (``id`` is ignored).

    Raises
    ------
    MIOpenDbError
        When the row is not a conv problem Fleet models.
    """
    try:
        return _from_config(row)
    except (KeyError, TypeError, ValueError, DriverLineError) as error:
        raise MIOpenDbError(f"perf-db config {dict(row)} is not a conv problem: {error}") from None


def _from_config(row: Mapping[str, Any]) -> dict[str, Any]:
    spatial_dim = int(row["spatial_dim"])
    if spatial_dim not in (2, 3):
        raise ValueError(f"spatial_dim {spatial_dim}")
    direction, precision = row["direction"], row["data_type"]
    if direction not in DIRECTIONS or precision not in PRECISIONS:
        raise ValueError(f"direction {direction!r} or data type {precision!r}")
    layout = row["layout"]
    if spatial_dim == 3 and layout == "NCHW":
        layout = DEFAULT_LAYOUT[3]
    if layout not in LAYOUTS[spatial_dim]:
        raise ValueError(f"layout {layout!r}")
    axes = ("d", "h", "w") if spatial_dim == 3 else ("h", "w")
    params: dict[str, Any] = {name: int(row[name]) for name in CONFIG_COLUMNS[3:]}
    params.update(precision=precision, in_layout=layout, fil_layout=layout, out_layout=layout, direction=direction)
    if direction != "F":
        # The row holds dy (as in_*) and x's channels (as out_channels); rebuild x from dy.
        params["in_channels"], params["out_channels"] = params["out_channels"], params["in_channels"]
        for axis in axes:
            dy = params[f"in_{axis}"]
            stride, dilation = params[f"conv_stride_{axis}"], params[f"dilation_{axis}"]
            fil, pad = params[f"fil_{axis}"], params[f"pad_{axis}"]
            params[f"in_{axis}"] = max(1, (dy - 1) * stride + dilation * (fil - 1) + 1 - 2 * pad)
    params = _conv_checked(params)
    depth, height, width = output_sizes(params)
    if direction != "F":
        expected = {"d": depth, "h": height, "w": width}
        for axis in axes:
            if expected[axis] != int(row[f"in_{axis}"]):
                raise ValueError(f"no input size gives dy {axis} {row[f'in_{axis}']}")
    return params


@contextlib.contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to a perf-db, ``.bz2``-compressed (decompressed to a temporary file) or not."""
    if not path.is_file():
        raise MIOpenDbError(f"perf-db {path} does not exist")
    with contextlib.ExitStack() as stack:
        try:
            plain = stack.enter_context(plain_copy(path))
        except (NotFound, SpecError) as error:  # too large, or a corrupt bzip2 (fleet.files)
            raise MIOpenDbError(str(error)) from None
        try:
            connection = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
        except sqlite3.Error as error:
            raise MIOpenDbError(f"cannot open perf-db {path}: {error}") from None
        stack.callback(connection.close)
        yield connection


def read_perf_db(path: str | Path) -> Iterator[PerfRecord]:
    """Read a perf-db, ``.bz2``-compressed (decompressed to a temporary file) or not.

    Parameters
    ----------
    path:
        The SQLite file.

    Yields
    ------
    PerfRecord
        In the file's ``perf_db`` row order.

    Raises
    ------
    MIOpenDbError
        On the first config row that is no conv problem; :func:`read_perf_rows` reads every row as it is.
    """
    path = Path(path)
    with _connect(path) as connection:
        columns = ", ".join(f"c.{name}" for name in CONFIG_COLUMNS)
        query = f"SELECT {columns}, p.solver, p.params FROM perf_db p JOIN config c ON c.id = p.config ORDER BY p.id"
        try:
            for row in connection.execute(query):
                config = dict(zip(CONFIG_COLUMNS, row[: len(CONFIG_COLUMNS)], strict=True))
                yield PerfRecord(params_from_config(config), row[-2], row[-1])
        except sqlite3.Error as error:
            raise MIOpenDbError(f"perf-db {path} is not a MIOpen perf-db: {error}") from None


@dataclass(frozen=True)
class PerfRows:
    """Every row of a perf-db as it is, whether or not Fleet can make a problem of it.

    Parameters
    ----------
    configs:
        ``config`` rows in id order: (id, {column: value}) over :data:`CONFIG_COLUMNS`.
    perf:
        ``perf_db`` rows in id order: (id, solver, config id, params).
    """

    configs: list[tuple[int, dict[str, Any]]]
    perf: list[tuple[int, str, int, str]]


def read_perf_rows(path: str | Path) -> PerfRows:
    """Read every row of a perf-db (``.bz2`` too), configs without perf rows included, changing nothing.

    Parameters
    ----------
    path:
        The SQLite file.

    Raises
    ------
    MIOpenDbError
        When the file is not a MIOpen perf-db, or a perf row names a config the file does not hold.
    """
    path = Path(path)
    with _connect(path) as connection:
        try:
            configs = [
                (row[0], dict(zip(CONFIG_COLUMNS, row[1:], strict=True)))
                for row in connection.execute(f"SELECT id, {', '.join(CONFIG_COLUMNS)} FROM config ORDER BY id")
            ]
            perf = [
                tuple(row) for row in connection.execute("SELECT id, solver, config, params FROM perf_db ORDER BY id")
            ]
        except sqlite3.Error as error:
            raise MIOpenDbError(f"perf-db {path} is not a MIOpen perf-db: {error}") from None
    ids = {number for number, _ in configs}
    for number, solver, config, _ in perf:
        if config not in ids:
            raise MIOpenDbError(
                f"perf-db {path}: perf_db row {number} ({solver}) names config {config}, which is not there"
            )
    return PerfRows(configs, perf)


def write_perf_rows(
    path: str | Path, configs: Sequence[tuple[int, Mapping[str, Any]]], perf: Sequence[tuple[int, str, int, str]]
) -> tuple[int, int]:
    """Write ``config`` and ``perf_db`` rows as they are (ids included) into a new perf-db at ``path``.

    Parameters
    ----------
    path:
        The SQLite file to create or replace, only once complete.
    configs:
        (id, {column: value}) rows; written in id order.
    perf:
        (id, solver, config id, params) rows; written in id order.

    Raises
    ------
    MIOpenDbError
        When ids repeat, a row repeats a unique index of MIOpen's, or a perf row names no config.
    """
    config_rows = sorted((number, *(row[name] for name in CONFIG_COLUMNS)) for number, row in configs)
    perf_rows = sorted(tuple(row) for row in perf)
    ids = [row[0] for row in config_rows]
    if len(set(ids)) != len(ids) or len({row[1:] for row in config_rows}) != len(config_rows):
        raise MIOpenDbError("perf-db config rows repeat an id or a problem")
    if len({row[0] for row in perf_rows}) != len(perf_rows) or len({row[1:3] for row in perf_rows}) != len(perf_rows):
        raise MIOpenDbError("perf-db perf rows repeat an id or a (solver, config)")
    known = set(ids)
    for number, solver, config, _ in perf_rows:
        if config not in known:
            raise MIOpenDbError(f"perf row {number} ({solver}) names config {config}, which is not written")
    _write(Path(path), config_rows, perf_rows)
    return len(config_rows), len(perf_rows)


def _write(path: Path, config_rows: list[tuple], perf_rows: list[tuple]) -> None:
    marks = ", ".join("?" * (len(CONFIG_COLUMNS) + 1))
    inserts = [
        (f"INSERT INTO config (id, {', '.join(CONFIG_COLUMNS)}) VALUES ({marks})", config_rows),
        ("INSERT INTO perf_db (id, solver, config, params) VALUES (?, ?, ?, ?)", perf_rows),
    ]
    write_sqlite(path, "perf-db", SCHEMA, inserts)


def write_perf_db(path: str | Path, records: Iterable[PerfRecord], *, style: str = "legacy") -> tuple[int, int]:
    """Write records as a MIOpen perf-db, replacing ``path`` only once the new file is complete.

    Parameters
    ----------
    path:
        The SQLite file to create or replace.
    records:
        The records; the same (problem, solver) twice with different values is an error.
    style:
        ``legacy`` (default) or ``current``; they differ only in the ``layout`` of 3-D rows.

    Returns
    -------
    (configs, perf_rows)
        How many rows each table got.
    """
    path = Path(path)
    values: dict[tuple, dict[str, str]] = {}
    for record in records:
        config = tuple(perf_config(record.params, style=style).values())
        if not isinstance(record.solver, str) or not record.solver or not isinstance(record.values, str):
            raise MIOpenDbError(f"perf-db record {record!r} needs a solver name and a values string")
        solvers = values.setdefault(config, {})
        if solvers.get(record.solver, record.values) != record.values:
            raise MIOpenDbError(
                f"two perf-db values for solver {record.solver} on one problem: "
                f"{solvers[record.solver]!r} and {record.values!r}"
            )
        solvers[record.solver] = record.values
    configs = sorted(values)
    config_rows = [(number, *config) for number, config in enumerate(configs, start=1)]
    perf_rows: list[tuple[int, str, int, str]] = []
    for number, config in enumerate(configs, start=1):
        for solver in sorted(values[config]):
            perf_rows.append((len(perf_rows) + 1, solver, number, values[config][solver]))
    _write(path, config_rows, perf_rows)
    return len(config_rows), len(perf_rows)


def config_key(row: Mapping[str, Any]) -> str:
    """A find-db style key for any ``config`` row, even one that is no conv problem (e.g. a negative size).

    The row's own numbers, in key order; the key side's output sizes are computed as MIOpen would for ``F``
    and as :func:`params_from_config` rebuilds x for ``B`` and ``W``, without clamping, so the key says what
    the row says. For a row that is a problem, it is that problem's legacy key.

    Parameters
    ----------
    row:
        The row's columns by name.
    """
    three = int(row["spatial_dim"]) == 3
    axes = ("d", "h", "w") if three else ("h", "w")
    outs = []
    for axis in axes:
        size, fil, pad = row[f"in_{axis}"], row[f"fil_{axis}"], row[f"pad_{axis}"]
        stride, dilation = row[f"conv_stride_{axis}"], row[f"dilation_{axis}"]
        if row["direction"] == "F":
            outs.append((size + 2 * pad - dilation * (fil - 1) - 1) // max(stride, 1) + 1)
        else:
            outs.append((size - 1) * stride + dilation * (fil - 1) + 1 - 2 * pad)

    def joined(prefix: str, sep: str) -> str:
        return sep.join(str(row[prefix + axis]) for axis in axes)

    pads = joined("pad_", "x")
    if three and pads == "0x0x0" and row["layout"] == "NCHW":
        pads = "0x0"  # MIOpen 2.x's spelling, as its 3-D rows with layout NCHW are
    groups = int(row["group_count"])
    parts = [
        str(row["in_channels"]),
        joined("in_", "-"),
        joined("fil_", "x"),
        str(row["out_channels"]),
        "-".join(str(v) for v in outs),
        str(row["batchsize"]),
        pads,
        joined("conv_stride_", "x"),
        joined("dilation_", "x"),
        str(row["bias"]),
        str(row["layout"]),
        str(row["data_type"]),
        str(row["direction"]) + (f"_g{groups}" if groups != 1 else ""),
    ]
    return "-".join(parts)
