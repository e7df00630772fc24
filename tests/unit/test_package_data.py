"""What pyproject.toml ships as package data exists: a pattern that matches nothing names a file that is not there."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_data_pattern_names_files_that_exist() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]
    assert package_data
    for package, patterns in package_data.items():
        directory = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert list(directory.glob(pattern)), f"{package}: {pattern!r} matches no file in {directory}"
