"""Fleet's optional extras: which extra brings which module, and the one line that says how to install it.

The base install (``pip install fleet-tune``) runs campaigns; Flower, Fabric, Prometheus, Optuna, TVM and NVML
come with extras. A command that needs one checks it first and, when it is missing, fails with one line that
names the ``pip install`` to run, rather than an ImportError or the message of a tool it would have started.
"""

from __future__ import annotations

import importlib.util
import sys

from fleet.errors import FleetError

EXTRAS = {
    "flower": ("ops", "Flower"),
    "fabric": ("ops", "Fabric"),
    "prometheus_client": ("ops", "prometheus-client"),
    "optuna": ("search", "Optuna"),
    "tvm": ("tvm", "TVM"),
    "pynvml": ("gpu", "nvidia-ml-py"),
    # T1 and T4 files are checked against the schemas Kernel Tuner ships, with jsonschema.
    "kernel_tuner": ("kerneltuner", "Kernel Tuner"),
    "jsonschema": ("kerneltuner", "jsonschema"),
}
"""Module -> (the extra that installs it, the package's name as its users know it)."""


class MissingExtra(FleetError):
    """An optional package a command needs is not installed."""


def install_line(module: str) -> str:
    """``pip install 'fleet-tune[EXTRA]'`` for the extra that brings ``module``."""
    return f"pip install 'fleet-tune[{EXTRAS[module][0]}]'"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (TVM takes seconds to load)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, what: str) -> None:
    """Raise :class:`MissingExtra` unless ``module`` is installed.

    Parameters
    ----------
    module:
        The module to find, a key of :data:`EXTRAS`.
    what:
        What needs it, e.g. ``fleet flower``: the start of the message.
    """
    if not installed(module):
        raise MissingExtra(f"{what} needs {EXTRAS[module][1]}, which is not installed: {install_line(module)}")
