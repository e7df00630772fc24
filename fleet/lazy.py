"""A package's names imported from their modules on first use (PEP 562), not with the package.

A ``fleet`` command imports the packages it passes through; one whose ``__init__`` imported every name it gives
would cost a command that needs none of them its modules' imports (issue 42, item 12).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, namespace: dict[str, Any], homes: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``homes`` (module -> its names) is imported from its
    module when first read and kept in ``namespace`` (the package's globals), so it is looked up once."""
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[name]), name)
        namespace[name] = value
        return value

    return __getattr__
