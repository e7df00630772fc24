"""Fleet's results in and out of the field's tools: Kernel Tuner cache files, T4 files, Optuna, MLflow.

What needs an optional extra (Optuna's storage, optuna-dashboard, MLflow) is imported when first used.
"""

from typing import Any

from fleet.interop.kerneltuner import FAILURES, KTRecord, KTResults, read_cache, target_of_device
from fleet.interop.records import KTImported, export_kt, finished_trials, import_kt, write_kt
from fleet.interop.t4 import read_results, t4_document

__all__ = [
    "FAILURES",
    "FleetStorage",
    "KTImported",
    "KTRecord",
    "KTResults",
    "export_kt",
    "export_mlflow",
    "export_optuna",
    "finished_trials",
    "import_kt",
    "read_cache",
    "read_results",
    "serve",
    "t4_document",
    "target_of_device",
    "write_kt",
]

_LAZY = {
    "FleetStorage": "fleet.interop.optuna_storage",
    "export_optuna": "fleet.interop.optuna_export",
    "export_mlflow": "fleet.interop.mlflow_export",
    "serve": "fleet.interop.dashboard",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fleet.interop' has no attribute {name!r}")
