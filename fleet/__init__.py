"""Fleet: distributed autotuning on Celery workers, with every trial kept in the database.

The Python API is re-exported here: :func:`load_spec`, :class:`CampaignSpec`, :func:`submit` (which returns a
:class:`CampaignHandle`), :func:`run`, :func:`campaign`, :func:`campaigns`, :func:`status`, :func:`best`; see
:mod:`fleet.api`. ``fleet.campaign`` is that function: the driver's module is :mod:`fleet.driving.campaign`.

The names are imported when first used, not with the package: every ``fleet`` command imports this package, and
the API's modules (the driver, the store, SQLAlchemy) cost a command that needs none of them half a second.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fleet._version import __version__
from fleet.errors import FleetError

if TYPE_CHECKING:
    from fleet.api import CampaignHandle, best, campaign, campaigns, connect, run, status, submit
    from fleet.space import Knob, Space
    from fleet.spec import CampaignSpec, ProblemSpec, load_spec

_HOMES = {
    "fleet.api": ("CampaignHandle", "best", "campaign", "campaigns", "connect", "run", "status", "submit"),
    "fleet.space": ("Knob", "Space"),
    "fleet.spec": ("CampaignSpec", "ProblemSpec", "load_spec"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "CampaignHandle",
    "CampaignSpec",
    "FleetError",
    "Knob",
    "ProblemSpec",
    "Space",
    "__version__",
    "best",
    "campaign",
    "campaigns",
    "connect",
    "load_spec",
    "run",
    "status",
    "submit",
]


def __getattr__(name: str) -> Any:
    """A name of the API, imported from its module on first use and kept here."""
    if name not in _HOME:
        raise AttributeError(f"module 'fleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value
