"""Fleet: distributed autotuning on Celery workers, with every trial kept in the database.

The Python API is re-exported here: :func:`load_spec`, :class:`CampaignSpec`, :func:`submit` (which returns a
:class:`CampaignHandle`), :func:`run`, :func:`campaign`, :func:`campaigns`, :func:`status`, :func:`best`; see
:mod:`fleet.api`. ``fleet.campaign`` is the function: the module of that name is imported as
``from fleet.campaign import ...``, which still works.
"""

from fleet._version import __version__
from fleet.api import CampaignHandle, best, campaign, campaigns, connect, run, status, submit
from fleet.errors import FleetError
from fleet.space import Knob, Space
from fleet.spec import CampaignSpec, ProblemSpec, load_spec

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
