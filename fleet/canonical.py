"""The one JSON text of a value, its digest, and a configuration's build-time part: what makes a problem, a
configuration or a build key unique.

A leaf below every layer: the store keys its rows with it, and the space, the spec and the domain packages their
configurations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(data: Any) -> str:
    """The one JSON text of ``data``: sorted keys, no spaces. Used for uniqueness and hashing."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(data: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``data``."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def build_part(space: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The build-time knobs of ``config`` given a space in its JSON form (see :meth:`fleet.space.Space.to_dict`):
    what decides its artifact."""
    knobs = space["knobs"]
    return {name: config[name] for name in knobs if _is_build(knobs[name]) and name in config}


def _is_build(knob: Any) -> bool:
    return knob.get("build", True) if isinstance(knob, Mapping) else True
