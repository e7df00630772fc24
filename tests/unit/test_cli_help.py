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
    assert found["Campaigns"] == [
        "tune", "submit", "resume", "pause", "cancel", "status", "trials", "trial", "best", "report", "export"
    ]  # fmt: skip
    assert found["Fleet"] == ["worker", "up", "db", "driver"]
    assert {"import", "query", "jobs", "golden", "import-db"} <= set(found["MIOpen"])
    assert found["TVM"] == ["tune-model", "run-model", "tvm"]
    assert found["Operations"] == ["exec", "call", "logs", "flower", "metrics"]
    assert found["Benchmarks"] == ["bench"]
    assert sum(len(names) for names in found.values()) == len(cli.commands)  # none left out, none twice


def test_descriptions_are_whole_and_aligned() -> None:
    text = " ".join(help_text().split("Campaigns:", 1)[1].split())

    for name, command in cli.commands.items():
        assert f"{name} {summary(command)}" in text, name
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
    text = " ".join(help_text("export").split())

    assert (
        "steps Every trial of CAMPAIGN (every step of its annealing chains) with its execution statistics, as CSV."
        in text
    )
