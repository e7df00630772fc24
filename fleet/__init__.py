"""Fleet: distributed autotuning on Celery workers, with every trial kept in the database.

The Python API is re-exported here: :func:`load_spec`, :class:`CampaignSpec`, :func:`submit`, :func:`run`,
:func:`status`, :func:`best`; see :mod:`fleet.api`.
"""

from fleet._version import __version__
from fleet.api import best, connect, run, status, submit
from fleet.errors import FleetError
from fleet.space import Knob, Space
from fleet.spec import CampaignSpec, ProblemSpec, load_spec

__all__ = [
    "CampaignSpec",
    "FleetError",
    "Knob",
    "ProblemSpec",
    "Space",
    "__version__",
    "best",
    "connect",
    "load_spec",
    "run",
    "status",
    "submit",
]
