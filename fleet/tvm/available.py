"""Whether TVM can be used here, and the one message that says how to install it."""

from __future__ import annotations

from types import ModuleType

from fleet.errors import FleetError


class TvmMissing(FleetError):
    """TVM is not installed where it is needed."""


MISSING_MESSAGE = "TVM is not installed here: pip install 'fleet-tune[tvm]'"


def require_tvm() -> ModuleType:
    """The ``tvm`` module, or :class:`TvmMissing` with the one message that says how to install it."""
    try:
        import tvm
    except ImportError:
        raise TvmMissing(MISSING_MESSAGE) from None
    return tvm


def check_tvm() -> None:
    """:class:`TvmMissing` unless TVM can be imported; cheap: TVM itself is not loaded."""
    import importlib.util
    import sys

    if "tvm" in sys.modules:
        missing = sys.modules["tvm"] is None
    else:
        try:
            missing = importlib.util.find_spec("tvm") is None
        except (ImportError, ValueError):
            missing = True
    if missing:
        raise TvmMissing(MISSING_MESSAGE)
