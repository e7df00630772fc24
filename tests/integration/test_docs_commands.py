"""Every ```sh block of README.md, docs/*.md and examples/*/README.md runs, as a user would, from a fresh clone
outside the repository, with only the extras its page names.

The pages are the test's input: a page that changes is tested as it is. The convention, per block:

- a fenced block tagged ``sh`` is run (``bash -e -o pipefail``), from the clone's root;
- ``<!-- docs-test: skip (reason) -->`` on the line right before it skips it (a GPU, a remote host, a running
  fleet, an extra that ``[dev]`` does not install); the reason must be given;
- ``<!-- docs-test: expect TEXT -->`` right before it names a line fragment its output must hold (else some output);
- ``text`` blocks are output and are never run;
- ``<!-- docs-test: extras NAME, NAME -->`` anywhere on a page names the extras of ``fleet-tune`` its blocks need
  (``pip install 'fleet-tune[NAME]'``); a page without one runs on the base install.

The clone gets the repository's virtual environment (``.venv/bin``), installed as ``make install`` does, so nothing
is installed per block; the modules of every extra the page does not name are hidden from its commands (and the
processes they start), as on an install without them. The blocks of one page share one ``FLEET_HOME``, so a later
block sees an earlier one's campaigns, as it does for a reader who runs them in order.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
    *sorted(f"examples/{p.parent.name}/README.md" for p in (ROOT / "examples").glob("*/README.md")),
]
DIRECTIVE = re.compile(r"<!-- docs-test: (skip|expect) (.+?) -->")
EXTRAS = re.compile(r"<!-- docs-test: extras ([a-z, ]+) -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass
class Block:
    page: str
    line: int
    code: str
    skip: str | None = None
    expect: str | None = None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The ``sh`` blocks of ``page``, with the directives on the lines right before each."""
    text = (ROOT / page).read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) != "sh":
            continue
        line = text.count("\n", 0, match.start()) + 1
        block = Block(page, line, match.group(2))
        before = text[: match.start()].splitlines()
        while before and (directive := DIRECTIVE.fullmatch(before[-1].strip())):
            kind, value = directive.groups()
            if kind == "skip":
                block.skip = value
            else:
                block.expect = value
            before.pop()
        found.append(block)
    return found


def extras_of(page: str) -> set[str]:
    """The extras a page names for its blocks (``<!-- docs-test: extras ops -->``); none for the base install."""
    named = EXTRAS.findall((ROOT / page).read_text())
    return {name.strip() for names in named for name in names.split(",") if name.strip()}


def declared_extras() -> dict[str, list[str]]:
    """pyproject.toml's extras of fleet-tune (``all`` and ``dev`` aside): the distributions each installs."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: [_name(r) for r in reqs] for name, reqs in extras.items() if name not in ("all", "dev")}


def _name(requirement: str) -> str:
    """A requirement's distribution, in the one spelling of names that pip compares (``kernel-tuner``)."""
    return re.split(r"[<>=!~;\[ ]", requirement.strip())[0].lower().replace("_", "-")


def installed_with(distributions: set[str]) -> set[str]:
    """``distributions`` and every distribution they require, as pip would install them (no extras of theirs)."""
    found, todo = set(), list(distributions)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return found


def hidden_modules(extras: set[str]) -> list[str]:
    """The top-level modules of the distributions that only extras not in ``extras`` install: what an install of
    fleet-tune with ``extras`` (and what they and the base require) lacks."""
    declared = declared_extras()
    kept = installed_with({"fleet-tune", *(dist for name in extras for dist in declared[name])})
    unwanted = {dist for dists in declared.values() for dist in dists} - kept
    return sorted(
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if {_name(d) for d in dists} & unwanted
    )


HIDE = """\
# Written by tests/integration/test_docs_commands.py: the extras' modules that the page's install lacks. Every
# finder of modules is wrapped to find none of them, so that they are missing as an uninstalled module is: an
# import raises ModuleNotFoundError and importlib.util.find_spec answers None.
import sys

HIDDEN = {hidden!r}


class _Without:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)


sys.meta_path[:] = [_Without(finder) for finder in sys.meta_path]
"""


def base_install(folder: Path, extras: set[str]) -> Path:
    """A folder whose ``sitecustomize`` hides the modules of every extra but ``extras`` from a Python started with it
    on ``PYTHONPATH``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(HIDE.format(hidden=hidden_modules(extras)))
    return folder


def test_every_page_names_extras_that_exist_and_the_base_install_hides_them(tmp_path: Path) -> None:
    for page in PAGES:
        unknown = extras_of(page) - set(declared_extras())
        assert not unknown, f"{page} names extras pyproject.toml does not declare: {sorted(unknown)}"
    env = {**os.environ, "PYTHONPATH": str(base_install(tmp_path, {"mlflow"}))}
    script = "import importlib.util as u; print(u.find_spec('mlflow') is not None, u.find_spec('optuna') is None)"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]
    command = [sys.executable, "-m", "fleet.cli", "export", "optuna", "x", "--storage", "sqlite://"]
    hidden = subprocess.run(command, env=env, capture_output=True)
    assert b"pip install 'fleet-tune[" in hidden.stderr, hidden.stderr


def test_every_directive_is_right_before_a_block_and_every_skip_says_why() -> None:
    for page in PAGES:
        text = (ROOT / page).read_text()
        lines = text.splitlines()
        for number, line in enumerate(lines):
            if "docs-test:" not in line or EXTRAS.fullmatch(line.strip()):
                continue
            directive = DIRECTIVE.fullmatch(line.strip())
            assert directive, f"{page}:{number + 1}: not a docs-test directive: {line}"
            after = next(following for following in lines[number + 1 :] if not DIRECTIVE.fullmatch(following.strip()))
            assert after == "```sh", f"{page}:{number + 1}: a directive must stand right before a ```sh block"
            if directive.group(1) == "skip":
                assert re.fullmatch(r"\(.+\)", directive.group(2)), f"{page}:{number + 1}: skip (REASON)"


def test_nothing_in_readme_or_docs_points_outside_the_repository() -> None:
    for page in PAGES:
        text = (ROOT / page).read_text()
        assert "../shared" not in text, f"{page} names ../shared, which a user does not have"
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"[a-z]+://", target):
                continue
            resolved = ((ROOT / page).parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{page}: the link {target} leaves the repository"
            assert resolved.exists(), f"{page}: the link {target} names nothing"


def test_the_readme_stays_short_and_starts_with_make_run_and_make_test() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) < 12 * 1024
    lines = [line.split()[:2] for block in blocks("README.md")[:2] for line in block.code.splitlines()]
    assert lines[:2] == [["make", "run"], ["make", "test"]]


@pytest.fixture(scope="module")
def clone() -> Iterator[Path]:
    """A fresh clone of the committed tree in a folder outside the repository, with the repository's virtual
    environment as ``make install`` leaves it (``.venv/bin``, and the stamp that says the base is installed)."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-docs-"))
    folder.chmod(0o755)  # a workload run as another account reads the examples' sources
    try:
        work = folder / "fleet"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(work)], check=True, timeout=120)
        # The pages as they are now: the test's input is the pages, committed or not.
        for page in PAGES:
            shutil.copy2(ROOT / page, work / page)
        venv = work / ".venv"
        venv.mkdir()
        # bin, and what makes `python3` found there this environment (Python reads pyvenv.cfg beside the folder
        # it was started from, and then its lib): a page's `python3 -c 'import kernel_tuner'` needs both.
        for part in ("bin", "lib", "pyvenv.cfg"):
            (venv / part).symlink_to(ROOT / ".venv" / part)
        for stamp in (".installed-base", ".installed"):
            (venv / stamp).touch()  # newer than the clone's pyproject.toml: make installs nothing
        yield work
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("gcc") is None, reason="the examples build with gcc")
@pytest.mark.parametrize("page", PAGES)
def test_the_commands_of_a_page_run_from_a_fresh_clone(page: str, clone: Path) -> None:
    home = clone.parent / "homes" / page.replace("/", "-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "VIRTUAL_ENV"))}
    env["FLEET_HOME"] = str(home / ".fleet")
    env["PATH"] = f"{clone / '.venv' / 'bin'}:{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(base_install(home / "site", extras_of(page)))
    for block in blocks(page):
        if block.skip:
            continue
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{block} exited {done.returncode}:\n{block.code}\n{output[-3000:]}"
        if block.expect:
            assert block.expect in output, f"{block}: no line holds {block.expect!r}:\n{output[-3000:]}"
        else:
            assert output.strip(), f"{block} printed nothing"
