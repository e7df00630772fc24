"""The limits a spec is held to, so that whatever it holds can be stored, printed on one line and evaluated.

The lengths are the store's column sizes (``fleet/store/_models.py``; ``tests/unit/test_spec_hostile.py``
holds the two together): a longer name would pass SQLite and then fail PostgreSQL halfway through writing a
campaign. Control characters are refused in names, kinds and tags because they are printed as they are: a
newline or an escape code in one would rewrite the user's terminal.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from fleet.errors import UNPRINTABLE, SpecError, shown
from fleet.space import MAX_INTEGER_BITS, check_text

NAME_LENGTH = 128
"""Characters of a campaign's name (``campaigns.name``)."""
KIND_LENGTH = 64
"""Characters of a problem's kind (``problems.kind``)."""
TAG_LENGTH = 128
"""Characters of a problem's tag (``problem_tags.tag``)."""
PATH_LENGTH = 4096
"""Characters of a file name in a spec (a source, a space file): Linux's PATH_MAX."""
SPEC_BYTES = 16 << 20
"""Bytes of a spec file: far more than any real one, and little enough to read and check at once."""
SOURCES_BYTES = 64 << 20
"""Bytes of a spec's source files together (a T1 file's kernel included): stored with its campaign, sent to workers."""
TIMEOUT_SECONDS = 86400.0
"""The most seconds a spec may give a build or a run (a fleet's operator may allow less: FLEET_MAX_TIMEOUT)."""
JSON_DEPTH = 32
"""Nesting of the objects and lists of a spec (a workload's templates nest a few levels)."""


def check_label(where: str, value: Any, limit: int) -> str:
    """``value`` if it is a string of 1 to ``limit`` characters with no control character, else SpecError."""
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where} must be a non-empty string, not {shown(value)}")
    if len(value) > limit:
        raise SpecError(f"{where} {shown(value, 40)} has {len(value)} characters; at most {limit} are allowed")
    for character in value:
        if unicodedata.category(character) in UNPRINTABLE:
            raise SpecError(f"{where} {shown(value, 40)} holds the control character {character!r}")
    return value


def check_json(where: str, data: Any) -> None:
    """Raise SpecError unless ``data`` is JSON the store can hold and a digest can be taken of.

    That is: objects with string keys, lists, strings with no NUL or lone surrogate, integers of at most
    64 bits, finite numbers, booleans and null, nested at most :data:`JSON_DEPTH` deep.
    """
    # Iterative, so that a hostile nesting cannot exhaust the stack of the check itself.
    pending: list[tuple[str, Any, int]] = [(where, data, 0)]
    while pending:
        place, value, depth = pending.pop()
        if depth > JSON_DEPTH:
            raise SpecError(f"{where} is nested more than {JSON_DEPTH} deep")
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            check_text(place, value)
        elif isinstance(value, int):
            if value.bit_length() > MAX_INTEGER_BITS:
                raise SpecError(f"{place}: {shown(value)} is larger than an integer of {MAX_INTEGER_BITS} bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise SpecError(f"{place}: {value!r} is not a finite number")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SpecError(f"{place}: the key {shown(key)} is not a string")
                check_text(f"{place}: the key", key)
                pending.append((f"{place} {shown(key, 40)}", item, depth + 1))
        elif isinstance(value, list | tuple):
            pending.extend((f"{place} [{index}]", item, depth + 1) for index, item in enumerate(value))
        else:
            raise SpecError(f"{place}: {shown(value)} is not JSON (a {type(value).__name__})")
