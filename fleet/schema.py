"""The schema's latest revision, read from the migration files: without Alembic, and without SQLAlchemy (see
:mod:`fleet.glance`)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

VERSIONS = Path(__file__).parent / "store" / "migrations" / "versions"
"""The migration files (found beside this module: ``importlib.resources`` would import the store's package)."""

_REVISION = re.compile(r'^revision = "([^"]+)"$', re.M)
_REVISES = re.compile(r'^down_revision = (?:"([^"]+)"|None)$', re.M)


@functools.cache
def head_revision() -> str | None:
    """The revision of the migration that no other one revises, from the migration files' ``revision = "0012"``
    and ``down_revision = "0011"`` lines; None unless there is exactly one such (a branch, a file of another form)."""
    revisions, revised = set(), set()
    for path in VERSIONS.iterdir():
        if not path.name.endswith(".py"):
            continue
        source = path.read_text()
        found, revises = _REVISION.search(source), _REVISES.search(source)
        if found is None or revises is None:
            return None
        revisions.add(found.group(1))
        if revises.group(1):
            revised.add(revises.group(1))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None
