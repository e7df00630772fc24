"""Selecting MIOpen problems by their parameters, as Tuna's SQL does, with a small safe expression language.

A selection is an expression over a problem's parameters (see :mod:`fleet.miopen.driver`) in the language of
:mod:`fleet.expr` (arithmetic, comparisons, ``and or not in``, ``min max abs``; nothing is ever ``eval``-ed)::

    direction == "F" and layout == "NHWC" and precision in ("FP16", "BF16")
    spatial_dim == 3 and filter == "3x3x3"
    in_channels % 8 == 0 and stride == "2x2" and groups == 1

Every canonical parameter name can be used, plus these friendly names:

==================  ==========================================================================================
``kind``            ``conv`` or ``bnorm``
``layout``          a conv problem's ``in_layout``; a bnorm problem's ``layout``
``filter``          ``"YxX"`` in 2-D, ``"ZxYxX"`` in 3-D (``fil_d``, ``fil_h``, ``fil_w`` one by one)
``pad``             ``"PhxPw"`` / ``"PdxPhxPw"``
``stride``          ``"UxV"`` / ``"SdxUxV"`` (``conv_stride_*`` one by one)
``dilation``        ``"LxJ"`` / ``"DdxLxJ"``
``groups``          ``group_count``
``batch``, ``n``    ``batchsize``
``c``, ``k``        ``in_channels``, ``out_channels``
``dims``            ``spatial_dim``
==================  ==========================================================================================

A name the problem does not have (``fil_h`` of a bnorm problem) has no value, and any comparison with it is
false, so one selection can run over problems of both kinds. A name that no problem has is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fleet.errors import SpecError
from fleet.expr import Expression, Undefined

PARAMETERS = (  # noqa: SIM905 - a word list reads better than a column
    "spatial_dim precision batchsize in_channels out_channels in_d in_h in_w fil_d fil_h fil_w pad_d "
    "pad_h pad_w conv_stride_d conv_stride_h conv_stride_w dilation_d dilation_h dilation_w group_count "
    "bias in_layout fil_layout out_layout direction mode save run"
).split()
ALIASES = ("kind", "layout", "filter", "pad", "stride", "dilation", "groups", "batch", "n", "c", "k", "dims")
NAMES = frozenset(PARAMETERS) | frozenset(ALIASES)

# CLI flag -> selection name, for selection_from_flags.
FLAGS = {
    "kind": "kind",
    "direction": "direction",
    "layout": "layout",
    "precision": "precision",
    "spatial_dim": "spatial_dim",
    "filter": "filter",
    "pad": "pad",
    "stride": "stride",
    "dilation": "dilation",
    "groups": "groups",
    "batch": "batchsize",
    "in_channels": "in_channels",
    "out_channels": "out_channels",
}
_SIZES = re.compile(r"\d+(x\d+){1,2}")


def selection_values(params: Mapping[str, Any], kind: str | None = None) -> dict[str, Any]:
    """The values a selection sees for one problem: its parameters and the friendly names.

    Parameters
    ----------
    params:
        Canonical problem parameters (with ``direction``).
    kind:
        ``conv`` or ``bnorm``; guessed from the parameters when left out.
    """
    values: dict[str, Any] = {name: None for name in NAMES}
    values.update({name: value for name, value in params.items() if name in NAMES})
    if kind is None:
        kind = "conv" if "fil_h" in params else "bnorm" if "layout" in params else None
    values["kind"] = kind
    three = params.get("spatial_dim") == 3
    if kind == "conv":
        values["layout"] = params.get("in_layout")
        for alias, prefix in (
            ("filter", "fil_"),
            ("pad", "pad_"),
            ("stride", "conv_stride_"),
            ("dilation", "dilation_"),
        ):
            axes = ("d", "h", "w") if three else ("h", "w")
            parts = [params.get(prefix + axis) for axis in axes]
            values[alias] = "x".join(str(part) for part in parts) if None not in parts else None
    else:
        values["layout"] = params.get("layout")
    values["groups"] = params.get("group_count")
    values["batch"] = values["n"] = params.get("batchsize")
    values["c"] = params.get("in_channels")
    values["k"] = params.get("out_channels")
    values["dims"] = params.get("spatial_dim")
    return values


def compile_selection(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """Compile a selection into a predicate over problem parameters.

    Parameters
    ----------
    text:
        The expression; empty (or only spaces) selects every problem.

    Returns
    -------
    callable
        ``predicate(params) -> bool``; ``params`` may carry ``"kind"`` to say the problem's kind.

    Raises
    ------
    SpecError
        When the text is not an allowed expression or names something no problem has.
    """
    if not text or not text.strip():
        return lambda params: True
    try:
        expression = Expression(text)
    except SpecError as error:
        raise SpecError(f"selection {text!r}: {_reason(error)}") from None
    unknown = sorted(expression.names - NAMES)
    if unknown:
        hint = ""
        if any(name.isupper() or name in ("F", "B", "W", "I") for name in unknown):
            hint = ' (put values in quotes: layout == "NHWC")'
        raise SpecError(
            f"selection {text!r} names {', '.join(unknown)}, which no problem has{hint}; "
            f"known: {', '.join(sorted(NAMES))}"
        )

    def predicate(params: Mapping[str, Any]) -> bool:
        values = selection_values(params, params.get("kind") if isinstance(params.get("kind"), str) else None)
        try:
            return bool(expression(values))
        except (TypeError, Undefined):
            # A missing parameter (None) or a comparison between a number and a string: not selected.
            return False

    return predicate


def selection_from_flags(**flags: Any) -> str:
    """A selection expression from CLI flags; flags left at ``None`` (or empty) are ignored.

    Parameters
    ----------
    **flags:
        ``kind``, ``direction``, ``layout``, ``precision``, ``spatial_dim``, ``filter`` (``"3x3"``), ``pad``,
        ``stride``, ``dilation``, ``groups``, ``batch``, ``in_channels``, ``out_channels``. A value may be a
        list or tuple, meaning any of them.

    Returns
    -------
    str
        e.g. ``direction == 'F' and layout == 'NHWC' and filter in ('3x3', '5x5')``, or ``""`` for no flags.

    Raises
    ------
    SpecError
        For an unknown flag or a value of the wrong form.
    """
    clauses = []
    for flag, value in flags.items():
        if flag not in FLAGS:
            raise SpecError(f"no selection flag {flag!r}; known: {', '.join(FLAGS)}")
        if value is None or (isinstance(value, Sequence) and not isinstance(value, str) and not value):
            continue
        items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
        literals = [_literal(flag, item) for item in items]
        name = FLAGS[flag]
        if len(literals) == 1:
            clauses.append(f"{name} == {literals[0]}")
        else:
            clauses.append(f"{name} in ({', '.join(literals)})")
    return " and ".join(clauses)


def _literal(flag: str, value: Any) -> str:
    if flag in ("spatial_dim", "groups", "batch", "in_channels", "out_channels"):
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise SpecError(f"--{flag.replace('_', '-')} must be an integer, not {value!r}") from None
        if isinstance(value, bool) or number < 1 or str(number) != str(value).strip():
            raise SpecError(f"--{flag.replace('_', '-')} must be a positive integer, not {value!r}")
        return str(number)
    text = str(value).strip()
    if flag in ("filter", "pad", "stride", "dilation"):
        if not _SIZES.fullmatch(text):
            raise SpecError(f"--{flag} must look like 3x3 or 3x3x3, not {value!r}")
    elif flag in ("layout", "precision", "direction"):
        text = text.upper()
        if not re.fullmatch(r"[A-Z0-9]+", text):
            raise SpecError(f"--{flag} {value!r} is not a {flag}")
    elif not re.fullmatch(r"[a-z]+", text):
        raise SpecError(f"--{flag} {value!r} is not a problem kind")
    return repr(text)


def _reason(error: SpecError) -> str:
    # fleet.expr words its messages for space constraints; keep only the reason.
    message = str(error)
    return message.split(": ", 1)[1] if ": " in message else message
