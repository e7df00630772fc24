"""How the page writes a value: escaped, formatted, and the constants every part shares."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping
from typing import Any

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#59a14f",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#5f6b7a",
)
DASH = "\u2013"  # what a missing value shows
TIMES = "\u00d7"  # the x of a speedup
TOP = 10
KNOB_VALUES = 30  # a knob with more values shows its TOP best and TOP worst by median, not all
DOTS = 2000  # the most measurements a chart draws as dots (it draws a subset of more, and says so)


def esc(value: Any) -> str:
    """``value`` as HTML text, quotes included, so it is safe in element content and in attributes."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)


def fmt(value: Any) -> str:
    """A number as a person reads it: 4 significant digits, no exponent for everyday magnitudes."""
    if value.__class__ is float and 1e-3 <= abs(value) < 1e4:  # most objectives: the same as below, sooner
        text = f"{value:.4g}"
        return text if "e" not in text else f"{value:.4f}".rstrip("0").rstrip(".")
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "true" if value else "false"  # as JSON, and every other output of Fleet, writes it
    if not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e4:
        text = f"{value:.4g}"
        return text if "e" not in text else f"{value:.4f}".rstrip("0").rstrip(".")
    if 1e4 <= magnitude < 1e9:
        return f"{value:,.0f}"
    return f"{value:.3e}"


def value_text(value: Any) -> str:
    """A knob value as text: strings as they are, booleans as true/false, numbers via JSON."""
    if isinstance(value, str):
        return value
    if value.__class__ is int:  # most knobs: JSON writes an int as its repr, without the encoder's machinery
        return int.__repr__(value)
    return json.dumps(value)


def config_text(config: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={value_text(v)}" for k, v in config.items())
