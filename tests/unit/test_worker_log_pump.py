"""A worker's output pumped into its log file (fleet/ops/logs.py) while the file's disk is full for a while: issue 39's
nemesis filled a worker node's Fleet home, and the pump's thread died on the first refused line, the worker's output
lost from then on, to the file and to the launcher's own output alike, long after the disk had room again."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

from fleet.ops.logs import RotatingLog, pump


def test_lines_a_full_disk_refuses_are_counted_and_the_pump_goes_on(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "worker.log")
    kept = log.file
    log.file = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 - every write to it fails with ENOSPC
    read, write = os.pipe()
    echo = io.BytesIO()
    thread = pump(os.fdopen(read, "rb"), log, echo)
    with os.fdopen(write, "wb", buffering=0) as worker:
        for number in (1, 2, 3):
            worker.write(f"line {number}\n".encode())
        deadline = time.monotonic() + 10
        while echo.getvalue().count(b"\n") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        log.file.close()
        log.file = kept  # the disk has room again
        worker.write(b"line 4\n")
    thread.join(10)
    assert not thread.is_alive()
    assert echo.getvalue().decode().splitlines() == [f"line {n}" for n in (1, 2, 3, 4)]
    text = (tmp_path / "worker.log").read_text()
    assert text == "fleet: 3 lines of this log lost: No space left on device\nline 4\n"
