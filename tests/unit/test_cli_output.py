"""The command line's shared output: progress without a terminal, values as JSON prints them, `-o -`."""

from __future__ import annotations

import io
import os
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet.cli._common import ProgressBar, format_config, format_value, write_output
from fleet.cli.campaigns import count_trials
from fleet.errors import FleetError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_off_a_terminal_is_plain_lines_every_tenth(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("fleet.cli._common.time.monotonic", clock)
    log = io.StringIO()  # not a terminal
    bar = ProgressBar("matmul", quiet=False, stream=log)

    for done in range(1, 49):
        clock.now += 0.5
        bar.update(done, 48, SimpleNamespace(objective=2.0 / done))
    bar.warn("no worker is listening")
    bar.close()

    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "matmul: 4/48 trials, 2.0/s, best 0.5"
    assert len([line for line in lines if "trials" in line]) == 12  # every 10 % (4 trials), and nothing twice
    assert lines[-2:] == ["matmul: 48/48 trials, 2.0/s, best 0.04167", "fleet: warning: no worker is listening"]


def test_progress_off_a_terminal_every_ten_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr("fleet.cli._common.time.monotonic", clock)
    log = io.StringIO()
    bar = ProgressBar("slow", quiet=False, stream=log)

    for done, seconds in ((1, 4), (1, 4), (1, 4), (2, 4)):
        clock.now += seconds
        bar.update(done, None, None)

    assert log.getvalue() == "slow: 1/? trials, 0.1/s\n"  # after 12 s; 4 s later is too soon for the next


def test_quiet_progress_prints_only_warnings() -> None:
    log = io.StringIO()
    bar = ProgressBar("q", quiet=True, stream=log)
    bar.update(5, 5, None)
    bar.warn("w")
    bar.close()
    assert log.getvalue() == "fleet: warning: w\n"


def test_booleans_print_as_json_does() -> None:
    assert [format_value(v) for v in (True, False, None, 3, "x")] == ["true", "false", "null", "3", "x"]
    assert format_config({"unroll": False, "vector": True, "n": 8}) == "unroll=false vector=true n=8"


def test_counts_say_the_baselines_apart() -> None:
    assert count_trials({"evaluated": 48}, 2) == "48 evaluated + 2 baselines"
    assert count_trials({"evaluated": 7, "errored": 1}, 1) == "1 errored, 7 evaluated + 1 baseline"
    assert count_trials({"evaluated": 0}, 0) == "no trials"


def test_write_output_dash_is_standard_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert write_output(Path("-"), lambda out: out.write("a,b\n")) == 4
    assert capsys.readouterr().out == "a,b\n"
    assert not Path("-").exists()


def test_write_output_is_whole_or_nothing(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "steps.csv"
    write_output(target, lambda out: out.write("ok\n"))
    assert target.read_text() == "ok\n"

    def fail(out: object) -> None:
        raise FleetError("boom")

    with pytest.raises(FleetError):
        write_output(target, fail)
    assert target.read_text() == "ok\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["steps.csv"]


def test_write_output_writes_into_what_is_no_regular_file_and_never_replaces_it(tmp_path: Path) -> None:
    """`-o /dev/null` run as root once replaced the machine's /dev/null with a file of the output; a FIFO stands in
    for it here (a test that got this wrong with /dev/null itself would break the machine)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    read: list[str] = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()), daemon=True)
    reader.start()
    assert write_output(fifo, lambda out: out.write("a,b\n")) == 4
    reader.join(10)
    assert read == ["a,b\n"]
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_write_output_to_a_place_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FleetError, match="cannot write"):
        write_output(tmp_path / "file" / "x.csv", lambda out: out.write(""))


def test_control_characters_in_stored_values_print_escaped() -> None:
    # A knob's value may be any string: an escape code or a bidirectional override must not reach the terminal.
    config = {"mode": "\x1b[2J\x1b[Hfast", "name": "a\u202eb", "ok": "tab-free naïve 10\u00a0µs", "n": 3}
    line = format_config(config)
    assert line == "mode=\\x1b[2J\\x1b[Hfast name=a\\u202eb ok=tab-free naïve 10\u00a0µs n=3"
    assert format_value("line\nbreak") == "line\\nbreak"
