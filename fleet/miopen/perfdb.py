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

import bz2
import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.errors import DriverLineError, MIOpenDbError, SpecError
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
    """
    path = Path(path)
    with contextlib.ExitStack() as stack:
        if path.suffix == ".bz2":
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-perfdb-"))
            plain = Path(directory) / path.stem
            try:
                with bz2.open(path, "rb") as source, open(plain, "wb") as target:
                    shutil.copyfileobj(source, target, 1 << 20)
            except (OSError, EOFError) as error:
                raise MIOpenDbError(f"cannot decompress perf-db {path}: {error}") from None
        else:
            plain = path
        if not plain.is_file():
            raise MIOpenDbError(f"perf-db {path} does not exist")
        try:
            connection = sqlite3.connect(f"file:{plain}?mode=ro", uri=True)
        except sqlite3.Error as error:
            raise MIOpenDbError(f"cannot open perf-db {path}: {error}") from None
        stack.callback(connection.close)
        columns = ", ".join(f"c.{name}" for name in CONFIG_COLUMNS)
        query = f"SELECT {columns}, p.solver, p.params FROM perf_db p JOIN config c ON c.id = p.config ORDER BY p.id"
        try:
            for row in connection.execute(query):
                config = dict(zip(CONFIG_COLUMNS, row[: len(CONFIG_COLUMNS)], strict=True))
                yield PerfRecord(params_from_config(config), row[-2], row[-1])
        except sqlite3.Error as error:
            raise MIOpenDbError(f"perf-db {path} is not a MIOpen perf-db: {error}") from None


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
    perf_rows = []
    for number, config in enumerate(configs, start=1):
        for solver in sorted(values[config]):
            perf_rows.append((len(perf_rows) + 1, solver, number, values[config][solver]))
    marks = ", ".join("?" * (len(CONFIG_COLUMNS) + 1))
    inserts = [
        (f"INSERT INTO config (id, {', '.join(CONFIG_COLUMNS)}) VALUES ({marks})", config_rows),
        ("INSERT INTO perf_db (id, solver, config, params) VALUES (?, ?, ?, ?)", perf_rows),
    ]
    write_sqlite(path, "perf-db", SCHEMA, inserts)
    return len(config_rows), len(perf_rows)
