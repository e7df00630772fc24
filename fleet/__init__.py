"""Fleet: distributed autotuning on Celery workers, with every trial kept in the database.

The Python API is re-exported here: :func:`load_spec`, :class:`CampaignSpec`, :func:`submit` (which returns a
:class:`CampaignHandle`), :func:`run`, :func:`campaign`, :func:`campaigns`, :func:`status`, :func:`best`; see
:mod:`fleet.api`. ``fleet.campaign`` is that function: the driver's module is :mod:`fleet.driving.campaign`.

The names are imported when first used, not with the package: every ``fleet`` command imports this package, and
the API's modules (the driver, the store, SQLAlchemy) cost a command that needs none of them half a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet._version import __version__
from fleet.errors import FleetError
from fleet.lazy import lazy_names

if TYPE_CHECKING:
    from fleet.api import CampaignHandle, best, campaign, campaigns, connect, run, status, submit
    from fleet.space import Knob, Space
    from fleet.spec import CampaignSpec, ProblemSpec, load_spec

_HOMES = {
    "fleet.api": ("CampaignHandle", "best", "campaign", "campaigns", "connect", "run", "status", "submit"),
    "fleet.space": ("Knob", "Space"),
    "fleet.spec": ("CampaignSpec", "ProblemSpec", "load_spec"),
}

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

__getattr__ = lazy_names(__name__, globals(), _HOMES)
