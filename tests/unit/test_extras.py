"""A command whose optional extra is missing says the one ``pip install`` line; ``postgresql://`` uses psycopg2.

Each missing package is simulated in a subprocess by ``sys.modules[name] = None``, which makes its import fail
as an uninstalled package's does, while the rest of the environment stays the one the tests run in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fleet_without(module: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys; sys.modules[{module!r}] = None\nfrom fleet.cli import main\nsys.exit(main({args!r}))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_HOME"] = str(tmp_path / ".fleet")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("flower", ["flower"], "ops"),
        ("fabric", ["exec", "--hosts", "node1", "true"], "ops"),
        ("prometheus_client", ["metrics"], "ops"),
        ("tvm", ["tvm", "tune-model", "tiny-cnn"], "tvm"),
        ("jsonschema", ["export", "kt", "some-campaign", "-o", "out"], "kerneltuner"),
        ("kernel_tuner", ["export", "kt", "some-campaign", "-o", "out"], "kerneltuner"),
    ],
)
def test_a_command_whose_extra_is_missing_says_the_pip_line(
    module: str, args: list[str], extra: str, tmp_path: Path
) -> None:
    done = _fleet_without(module, args, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].endswith(f"pip install 'fleet-tune[{extra}]'"), lines[0]


def test_auto_without_optuna_says_what_adds_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['optuna'] = None\n"
        "from fleet.cli.campaigns import note_missing_extras\n"
        "note_missing_extras({'name': 'auto', 'budget': 20})\n"
        "note_missing_extras({'name': 'random', 'budget': 20})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stderr.strip().splitlines() == [
        "fleet: note: strategy auto runs without its Optuna technique: pip install 'fleet-tune[search]' adds it"
    ]


def test_the_optuna_strategy_without_optuna_says_the_pip_line() -> None:
    code = (
        "import sys; sys.modules['optuna'] = None\nfrom fleet.search.optuna_search import load_optuna\nload_optuna()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "pip install 'fleet-tune[search]'" in done.stderr


def test_the_all_extra_holds_every_other_extra() -> None:
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (held,) = extras["all"]
    found = re.fullmatch(r"fleet-tune\[([a-z,]+)\]", held)
    assert found, held
    assert set(found.group(1).split(",")) == set(extras) - {"all", "dev"}


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_plain_postgresql_url_uses_psycopg2(scheme: str) -> None:
    from fleet.store import Store

    store = Store(f"{scheme}://fleet:secret@127.0.0.1:1/fleet")  # nothing connects until a query
    try:
        assert store.engine.dialect.driver == "psycopg2"
        assert store.display_url == "postgresql+psycopg2://fleet:***@127.0.0.1:1/fleet"
    finally:
        store.close()


def test_a_url_that_names_its_driver_is_kept() -> None:
    from sqlalchemy.engine import make_url

    from fleet.store._base import driver_url

    url = "postgresql+psycopg2://fleet@db-host/fleet"
    assert driver_url(make_url(url), url)[1] == url
