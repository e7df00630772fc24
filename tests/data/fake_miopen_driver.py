"""TEST DOUBLE for MIOpenDriver: MIOpen cannot be installed here, so the tests run this in its place.

It stands in for the real binary only as far as Fleet's ``miopen`` workload sees it: it reads a
MIOpenDriver conv or bnorm command line, prints what MIOpenDriver prints (the command line, the algorithm
and solution, the GPU kernel time, the stats lines, in MIOpenDriver's own format), and writes the files
MIOpen writes: with ``MIOPEN_DEBUG_COMPILE_ONLY=1`` a kernel cache (``<arch>.ukdb``, the ``kern_db`` schema)
under ``MIOPEN_CUSTOM_CACHE_DIR``; otherwise a user find-db (``-s 0``) or user perf-db (``-s 1``) record for
the problem's key under ``MIOPEN_USER_DB_PATH``. Times are made up, but a fixed function of the problem.

Run it through a launcher that uses the project's Python (it borrows Fleet's key function, as MIOpen has
its own). ``FAKE_MIOPEN_ARCH`` names the device (default ``gfx906_60``).
"""

import hashlib
import os
import sqlite3
import sys
from pathlib import Path

from fleet.miopen.driver import parse_line, problems
from fleet.miopen.keys import db_key

VERSION = "2_19_0_fake"
NAMES = {"F": "Forward", "B": "Backward Data", "W": "Backward Weights"}
ALGORITHMS = {
    "F": "miopenConvolutionFwdAlgo",
    "B": "miopenConvolutionBwdDataAlgo",
    "W": "miopenConvolutionBwdWeightsAlgo",
}


def main(argv: list[str]) -> int:
    arch = os.environ.get("FAKE_MIOPEN_ARCH", "gfx906_60")
    line = parse_line("MIOpenDriver " + " ".join(argv))
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    print(f"MIOpenDriver {' '.join(argv)}")
    params = problems(line)[0]
    seed = int(hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:8], 16)
    time_ms = round(0.01 + (seed % 100000) / 1e6, 6)
    if line.kind == "bnorm":
        print(f"GPU Kernel Min Time Forward Batch Normalization Elapsed: {time_ms:f} ms")
        return 0
    direction = params["direction"]
    key = db_key(params)
    if os.environ.get("MIOPEN_DEBUG_COMPILE_ONLY") == "1":
        cache = Path(os.environ["MIOPEN_CUSTOM_CACHE_DIR"])
        cache.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(cache / f"{arch}.ukdb")
        db.execute(
            "CREATE TABLE IF NOT EXISTS kern_db (id INTEGER PRIMARY KEY ASC, kernel_name TEXT NOT NULL, "
            "kernel_args TEXT NOT NULL, kernel_blob BLOB NOT NULL, kernel_hash TEXT NOT NULL, "
            "uncompressed_size INT NOT NULL)"
        )
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_kern_db ON kern_db (kernel_name, kernel_args)")
        blob = f"code object for {key}".encode()
        db.execute(
            "INSERT OR IGNORE INTO kern_db (kernel_name, kernel_args, kernel_blob, kernel_hash, uncompressed_size) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                f"winograd_{direction}.s.o",
                f"-DKEY={key} -mcpu={arch.split('_')[0]}",
                blob,
                hashlib.md5(blob).hexdigest(),
                0,
            ),
        )
        db.commit()
        db.close()
        print(
            "MIOpen(HIP): Warning [Run] MIOPEN_DEBUG_COMPILE_ONLY is enabled, escaping launching kernel",
            file=sys.stderr,
        )
        return 0
    user_db = Path(os.environ["MIOPEN_USER_DB_PATH"])
    user_db.mkdir(parents=True, exist_ok=True)
    algorithm = ALGORITHMS[direction]
    if flags.get("-s") == "1":
        with (user_db / f"{arch}.HIP.{VERSION}.udb").open("a") as out:
            out.write(f"{key}=ConvBinWinogradRxSf2x3g1:{seed % 7},{seed % 5},1\n")
    else:
        entries = [
            f"{algorithm}Winograd:ConvBinWinogradRxSf2x3g1,{time_ms:g},0,{algorithm}Winograd,<unused>",
            f"{algorithm}GEMM:GemmFwdRest,{time_ms * 3:g},32768,rocBlas,<unused>",
        ]
        with (user_db / f"{arch}.HIP.{VERSION}.ufdb.txt").open("a") as out:
            out.write(f"{key}={';'.join(entries)}\n")
    print(f"MIOpen {NAMES[direction]} Conv. Algorithm: 3, Solution: 53/ConvBinWinogradRxSf2x3g1")
    print(f"GPU Kernel Time {NAMES[direction]} Conv. Elapsed: {time_ms:f} ms (average)")
    print("stats: name, n, c, ho, wo, x, y, k, flopCnt, bytesRead, bytesWritten, GFLOPs, GB/s, timeMs")
    print(
        f"stats: {NAMES[direction].lower()}-conv, {params['batchsize']}, {params['in_channels']}, 0, 0, 0, 0, 0, "
        f"0, 0, 0, 0, 0, {time_ms:f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
