"""Targets: the hardware a result is valid for, which also names the queues."""

from __future__ import annotations

import platform
import re
from typing import Any

from fleet.errors import SpecError, shown

TARGET_LENGTH = 64
"""Characters of a target, as the store's ``campaigns.target`` holds them."""
TARGET = re.compile(r"^(sm_[0-9]{2,3}[a-z]?|gfx[0-9a-f]{3,5}(:[1-9][0-9]*)?|cpu-[A-Za-z0-9_]+)$")


def check_target(target: Any) -> str:
    """``target`` if it names a GPU architecture or a CPU, else :class:`SpecError`."""
    if not isinstance(target, str) or len(target) > TARGET_LENGTH or not TARGET.fullmatch(target):
        raise SpecError(
            f"unknown target {shown(target)}: expected sm_<compute capability> (sm_90), gfx<arch>:<compute units> "
            f"(gfx90a:104) or cpu-<machine> (cpu-x86_64), of at most {TARGET_LENGTH} characters"
        )
    return target


def cpu_target() -> str:
    """The target of a node that evaluates on its CPU, ``"cpu-"`` and the machine type (``cpu-x86_64``)."""
    return "cpu-" + (platform.machine() or "unknown")
