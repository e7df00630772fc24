"""The store: problems, campaigns, trials, artifacts, measurements, machines and workers."""

from fleet.collector import collector_paused
from fleet.store._connect import connect
from fleet.store._history import HistorySource
from fleet.store._hotpath import INLINE_BYTES
from fleet.store._metaschedule import MsRecord, MsWorkload
from fleet.store._models import (
    Artifact,
    Campaign,
    Chain,
    ChainStep,
    Machine,
    Measurement,
    Problem,
    Trial,
    Worker,
    trials_with_measurements,
    utcnow,
)
from fleet.store._steering import SteeringError, TrialRecord
from fleet.store._store import Store
from fleet.store._trials import ProblemTally, TrialDetail, TrialRow
from fleet.store._types import NewTrial, Requeue, TrialResult, TrialWork

__all__ = [
    "INLINE_BYTES",
    "Artifact",
    "Campaign",
    "Chain",
    "ChainStep",
    "HistorySource",
    "Machine",
    "Measurement",
    "MsRecord",
    "MsWorkload",
    "NewTrial",
    "Problem",
    "ProblemTally",
    "Requeue",
    "SteeringError",
    "Store",
    "Trial",
    "TrialDetail",
    "TrialRecord",
    "TrialResult",
    "TrialRow",
    "TrialWork",
    "Worker",
    "collector_paused",
    "connect",
    "trials_with_measurements",
    "utcnow",
]
