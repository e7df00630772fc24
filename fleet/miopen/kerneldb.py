"""MIOpen's kernel-db (``<arch>.kdb``, SQLite): compiled code objects, so MIOpen need not compile them again.

Table ``kern_db`` (MIOpen's ``KernelConfig``): ``id``, ``kernel_name``, ``kernel_args`` (the compile options),
``kernel_blob``, ``kernel_hash`` and ``uncompressed_size``, unique over (kernel_name, kernel_args). MIOpen's
``KernDb`` stores the md5 (hex) of the *uncompressed* code object as the hash and, when it compressed the blob,
its uncompressed size; ``uncompressed_size`` 0 means the blob is stored as is. It checks the md5 on every load.
Fleet stores code objects as is (:func:`kernel_from_code_object`) and copies compressed ones unchanged.

Writing is deterministic: rows sorted by (kernel_name, kernel_args) and numbered from 1, into a temporary file
renamed over the target only when complete.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import MIOpenDbError
from fleet.miopen.sqlitefile import write_sqlite

SCHEMA = (
    "CREATE TABLE `kern_db` (`id` INTEGER PRIMARY KEY ASC,`kernel_name` TEXT NOT NULL,"
    "`kernel_args` TEXT NOT NULL,`kernel_blob` BLOB NOT NULL,`kernel_hash` TEXT NOT NULL,"
    "`uncompressed_size` INT NOT NULL)",
    "CREATE UNIQUE INDEX `idx_kern_db` ON kern_db(kernel_name, kernel_args)",
)


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel.

    Parameters
    ----------
    name:
        The kernel file name, e.g. ``MIOpenConvDirUni.cl.o``.
    args:
        Its compile options; with the name it identifies the kernel.
    blob:
        The code object, compressed when ``uncompressed_size`` is not 0.
    hash:
        The md5 (hex) of the uncompressed code object.
    uncompressed_size:
        The code object's size before compression, or 0 when ``blob`` is not compressed.
    """

    name: str
    args: str
    blob: bytes
    hash: str
    uncompressed_size: int = 0


def kernel_from_code_object(name: str, args: str, code: bytes) -> Kernel:
    """A kernel-db row for an uncompressed code object, hashed as MIOpen checks it.

    Parameters
    ----------
    name:
        The kernel file name.
    args:
        Its compile options.
    code:
        The code object's bytes.
    """
    return Kernel(name, args, bytes(code), hashlib.md5(code).hexdigest(), 0)


def write_kernel_db(path: str | Path, kernels: Iterable[Kernel]) -> int:
    """Write kernels as a MIOpen kernel-db, replacing ``path`` only once the new file is complete.

    Parameters
    ----------
    path:
        The SQLite file to create or replace.
    kernels:
        The kernels; the same (name, args) twice with different contents is an error.

    Returns
    -------
    int
        The number of rows written.
    """
    path = Path(path)
    rows: dict[tuple[str, str], Kernel] = {}
    for kernel in kernels:
        _check(kernel)
        known = rows.setdefault((kernel.name, kernel.args), kernel)
        if known != kernel:
            raise MIOpenDbError(f"two different kernels named {kernel.name} with args {kernel.args!r}")
    ordered = [rows[key] for key in sorted(rows)]
    insert = (
        "INSERT INTO kern_db (id, kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
        "VALUES (?, ?, ?, ?, ?, ?)"
    )
    numbered = [(n, k.name, k.args, k.blob, k.hash, k.uncompressed_size) for n, k in enumerate(ordered, start=1)]
    write_sqlite(path, "kernel-db", SCHEMA, [(insert, numbered)])
    return len(ordered)


def read_kernel_db(path: str | Path) -> list[Kernel]:
    """Read a MIOpen kernel-db.

    Parameters
    ----------
    path:
        The SQLite file.

    Returns
    -------
    list of Kernel
        In the file's ``id`` order.
    """
    path = Path(path)
    if not path.is_file():
        raise MIOpenDbError(f"kernel-db {path} does not exist")
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as error:
        raise MIOpenDbError(f"cannot open kernel-db {path}: {error}") from None
    try:
        rows = connection.execute(
            "SELECT kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size FROM kern_db ORDER BY id"
        ).fetchall()
    except sqlite3.Error as error:
        raise MIOpenDbError(f"{path} is not a MIOpen kernel-db: {error}") from None
    finally:
        connection.close()
    return [Kernel(name, args, bytes(blob), digest, int(size)) for name, args, blob, digest, size in rows]


def verify(kernel: Kernel) -> bool:
    """Whether an uncompressed kernel's blob matches its hash (compressed ones cannot be checked here).

    Parameters
    ----------
    kernel:
        The kernel.
    """
    if kernel.uncompressed_size:
        return True
    return hashlib.md5(kernel.blob).hexdigest() == kernel.hash


def _check(kernel: Kernel) -> None:
    if not isinstance(kernel.name, str) or not kernel.name or not isinstance(kernel.args, str):
        raise MIOpenDbError(f"a kernel needs a name and an args string, not {kernel.name!r} / {kernel.args!r}")
    if not isinstance(kernel.blob, bytes) or not isinstance(kernel.hash, str) or not kernel.hash:
        raise MIOpenDbError(f"kernel {kernel.name} needs a bytes blob and a hash")
    if isinstance(kernel.uncompressed_size, bool) or not isinstance(kernel.uncompressed_size, int):
        raise MIOpenDbError(f"kernel {kernel.name}: uncompressed_size must be an integer")
    if kernel.uncompressed_size < 0:
        raise MIOpenDbError(f"kernel {kernel.name}: uncompressed_size must not be negative")
