"""Provenance: where and with what a campaign was made, kept with it (``campaigns.provenance``).

A submitted campaign, an ad-hoc call's, a TVM or Kernel Tuner import and Tuna's reasons all record it: it sits
below both the driver and the domain libraries.
"""

from __future__ import annotations

import platform
import socket
import sys
from typing import Any


def provenance(toolchain: str = "") -> dict[str, Any]:
    """Where and with what a campaign was submitted.

    ``toolchain`` names where an imported campaign's results came from. A submitted campaign has none: its
    builds' toolchains are taken by the build workers, on their machines, and recorded with each artifact.
    """
    import celery

    from fleet._version import __version__

    return {
        **({"toolchain": toolchain} if toolchain else {}),
        "fleet": __version__,
        "python": platform.python_version(),
        "celery": celery.__version__,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "argv": sys.argv[1:],
    }
