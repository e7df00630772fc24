"""The Tuna commands as a user runs them: summaries, line numbers, exit codes, and nothing half written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import MIOPEN

GOOD = "./bin/MIOpenDriver conv -n 32 -c 64 -H 28 -W 28 -k 128 -y 3 -x 3 -p 1 -q 1 -F 1 -t 1"


def test_import_reports_bad_lines_by_number_and_imports_the_rest(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "mixed.txt"
    source.write_text(f"{GOOD}\n./bin/MIOpenDriver conv -n 32 -Q 7\n\n{GOOD.replace('-F 1', '-F 2')}\n")
    done = fleet.cli("miopen", "import", str(source), "-t", "mixed")
    assert done.returncode == 0
    assert f"{source}:2: MIOpenDriver conv has no flag -Q" in done.stderr
    assert "2 created, 0 already known, 2 tagged mixed, 1 unreadable" in done.stdout
    summary = json.loads(fleet.cli("miopen", "import", str(source), "-t", "mixed", "--json", check=True).stdout)
    assert (summary["created"], summary["known"], summary["unreadable"][0]["line"]) == (0, 2, 2)


def test_strict_import_of_a_bad_file_writes_nothing(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "bad.txt"
    source.write_text(f"{GOOD}\nnot a driver line\n")
    done = fleet.cli("miopen", "import", str(source), "-t", "x", "--strict")
    assert done.returncode == 1
    assert done.stderr.startswith(f"fleet: error: {source}:2: not an MIOpenDriver command line")
    shown = json.loads(fleet.cli("miopen", "query", GOOD, "--json", check=True).stdout)
    assert shown["problems"][0]["id"] is None
    assert shown["keys"] == ["64-28-28-3x3-128-28-28-32-1x1-1x1-1x1-0-NCHW-FP32-F"]


def test_user_errors_end_in_one_line_and_exit_1(fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    cases = [
        (("miopen", "import", str(tmp_path / "missing.txt"), "-t", "x"), "No such file or directory"),
        (("miopen", "import-db", str(tmp_path / "missing.db"), "--target", "gfx803:36"), "no such file"),
        (("miopen", "import-db", str(MIOPEN / "alexnet.txt"), "--target", "gfx803:36"), "no '='"),  # not a find-db
        (
            ("miopen", "export", "find-db", "--target", "gfx906-60", "-o", str(out / "a.txt")),
            "unknown target 'gfx906-60'",
        ),
        (
            ("miopen", "export", "find-db", "--target", "gfx906:60", "-o", str(out / "b.txt")),
            "no find results to export",
        ),
        (("miopen", "export", "kernel-db", "--target", "gfx906:60", "-o", str(out / "c.kdb")), "no built kernels"),
        (
            ("miopen", "export", "perf-db", "--target", "gfx906:60", "--golden", "-o", str(out / "d.db")),
            "no golden set",
        ),
        (("miopen", "jobs", "add", "--target", "gfx906:60", "--reason", "r", "--tag", "none"), "no problem matches"),
        (
            ("miopen", "jobs", "add", "--target", "gfx906:60", "--reason", "r", "--select", "colour == 1"),
            "names colour",
        ),
        (("miopen", "golden", "update", "--campaign", "nope", "--target", "gfx906:60"), "no campaign 'nope'"),
        (("miopen", "jobs", "invalidate"), "invalidate what?"),
        (("miopen", "query", "hello"), "not a MIOpenDriver line"),
    ]
    for args, message in cases:
        done = fleet.cli(*args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("fleet: error: "), (args, done.stderr)
        assert message is None or message in lines[0], (args, lines[0])
    assert not out.exists()
    assert fleet.store.campaigns() == []


def test_query_json_lists_every_direction_key(fleet) -> None:  # type: ignore[no-untyped-def]
    line = GOOD.replace("-F 1", "-F 0")
    shown = json.loads(fleet.cli("miopen", "query", line, "--json", check=True).stdout)
    assert [k[-1] for k in shown["keys"]] == ["F", "B", "W"]
    assert [p["direction"] for p in shown["problems"]] == ["F", "B", "W"]
