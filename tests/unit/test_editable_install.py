"""`import fleet` finds the package from any folder, a folder holding the clone (named ``fleet/``) too.

setuptools' default editable install maps ``fleet`` with a finder that Python asks after its path search, and the
path search takes a ``fleet/`` folder in the current directory for a namespace package: ``fleet.submit`` was then
missing. The Makefile installs in compat mode, which puts the clone on ``sys.path``; this test installs a clone as
the Makefile does (its ``EDITABLE`` options), into a fresh virtual environment that borrows this one's packages.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _makefile_editable() -> list[str]:
    found = re.search(r"^EDITABLE\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert found, "the Makefile names its editable-install options in EDITABLE"
    return found.group(1).split()


def test_import_fleet_from_the_folder_that_holds_a_clone_named_fleet(tmp_path: Path) -> None:
    clone = tmp_path / "fleet"
    # The committed tree: the working tree may hold another change halfway.
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This environment's packages (Celery, SQLAlchemy, setuptools), without its own editable install of Fleet:
    # the .pth files of a folder a .pth names are not read.
    (Path(purelib) / "zz_borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps"]
    install += ["--no-build-isolation", *_makefile_editable(), "-e", str(clone)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    done = subprocess.run(
        [python, "-c", "import fleet; print(fleet.__file__, callable(fleet.submit))"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(clone / "fleet" / "__init__.py"), "True"]
