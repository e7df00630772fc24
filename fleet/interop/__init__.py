"""Fleet's results in and out of the field's tools: Kernel Tuner cache files, T4 files, Optuna, MLflow."""

from fleet.interop.kerneltuner import FAILURES, KTRecord, KTResults, read_cache, target_of_device
from fleet.interop.records import KTImported, export_kt, finished_trials, import_kt, write_kt
from fleet.interop.t4 import read_results, t4_document

__all__ = [
    "FAILURES",
    "KTImported",
    "KTRecord",
    "KTResults",
    "export_kt",
    "finished_trials",
    "import_kt",
    "read_cache",
    "read_results",
    "t4_document",
    "target_of_device",
    "write_kt",
]
