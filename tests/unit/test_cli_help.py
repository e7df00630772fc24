"""`fleet --help`: commands in sections, each with its whole description."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from fleet.cli import cli
from fleet.cli._sections import summary


def help_text(*args: str) -> str:
    done = CliRunner().invoke(cli, [*args, "--help"], terminal_width=100)
    assert done.exit_code == 0, done.output
    return done.output


def sections(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][A-Za-z]*:", line):
            current = found.setdefault(line[:-1], [])
        elif current is not None and re.match(r"  [a-z]", line):
            current.append(line.split()[0])
    return found


def test_commands_are_listed_in_sections_in_order() -> None:
    found = sections(help_text())
    assert found.pop("Options") == []

    assert list(found) == ["Campaigns", "Fleet", "MIOpen", "TVM", "Operations", "Benchmarks"]
    assert [name for name in found["Campaigns"] if name not in ("import", "dashboard")] == [
        "tune", "submit", "resume", "pause", "cancel", "status", "trials", "trial", "best", "report", "export",
        "validate",
    ]  # fmt: skip
    assert found["Fleet"] == ["worker", "up", "db", "team", "driver", "slurm", "kubernetes"]
    assert "miopen" in found["MIOpen"]
    assert found["TVM"] == ["tvm"]
    assert found["Operations"] == ["exec", "call", "logs", "flower", "metrics"]
    assert found["Benchmarks"] == ["bench"]
    shown = [name for name, command in cli.commands.items() if not command.hidden]
    assert sum(len(names) for names in found.values()) == len(shown)  # none left out, none twice


def test_descriptions_are_whole_and_aligned() -> None:
    text = " ".join(help_text().split("Campaigns:", 1)[1].split())

    for name, command in cli.commands.items():
        assert (f"{name} {summary(command)}" in text) != command.hidden, name
    assert "..." not in text
    listing = help_text().split("Campaigns:", 1)[1]
    columns = {line.index(line.split()[1]) for line in listing.splitlines() if re.match(r"  [a-z][-a-z]+ +\S", line)}
    assert len(columns) == 1  # every section's descriptions start in one column


def test_summary_is_the_first_paragraph_on_one_line() -> None:
    @click.command()
    def example() -> None:
        """First line
        goes on here.

        Second paragraph.
        """

    assert summary(example) == "First line goes on here."


def test_sub_groups_list_whole_descriptions() -> None:
    text = " ".join(help_text("miopen").split())

    assert (
        "query Show the problem of LINE (a MIOpenDriver line, or a find-db / perf-db line or key): tags, trials, keys."
        in text
    )


def test_miopen_and_tvm_commands_are_in_their_groups_and_the_old_names_are_hidden_aliases() -> None:
    from click.testing import CliRunner

    miopen, tvm = cli.commands["miopen"], cli.commands["tvm"]
    assert {"import", "query", "jobs", "golden", "import-db", "export"} <= set(miopen.commands)  # type: ignore[attr-defined]
    assert set(miopen.commands["export"].commands) == {"find-db", "perf-db", "kernel-db"}  # type: ignore[attr-defined]
    assert {"tune-model", "run-model"} <= set(tvm.commands)  # type: ignore[attr-defined]
    for old in ("query", "jobs", "golden", "import-db", "tune-model", "run-model"):
        assert cli.commands[old].hidden, old
        assert old not in " ".join(sections(help_text()).get("MIOpen", []) + sections(help_text()).get("TVM", []))
    for old in ("find-db", "perf-db", "kernel-db", "steps"):
        assert cli.commands["export"].commands[old].hidden, old  # type: ignore[attr-defined]
    assert "their old names" in help_text().replace("\n", " ").replace("  ", " ").lower()
    done = CliRunner().invoke(cli, ["golden", "--help"])
    assert done.exit_code == 0 and "Old name of `fleet miopen golden`" in done.output


def test_an_old_name_runs_the_command_and_says_the_new_one() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "tune-model", "no-such-model"], capture_output=True, text=True, check=False
    )
    lines = done.stderr.strip().splitlines()
    assert (
        lines[0]
        == "fleet: note: `fleet tune-model` is now `fleet tvm tune-model`; the old name goes in the next release"
    )
    assert done.returncode == 1 and len(lines) == 2  # then the command's own one-line error
