"""One exception tree, rooted at :class:`FleetError`.

The CLI prints ``str(error)`` of any :class:`FleetError` as one line and exits non-zero, so each message
must say what is wrong and, where it helps, what to do about it.
"""

import unicodedata
from collections.abc import Iterable


class FleetError(Exception):
    """Base of every error Fleet raises on purpose."""


class SpecError(FleetError):
    """A campaign spec, space or knob value that is not valid."""


class ConfigurationError(FleetError):
    """Settings from the environment that cannot be used."""


class StoreError(FleetError):
    """The database cannot be reached or is not at the expected schema."""


class StoreUnavailable(StoreError):
    """The database did not answer: it is down or restarting, or the connection broke. Worth trying again."""


class NotFound(FleetError):
    """A campaign, problem or trial that does not exist."""


class WorkloadError(FleetError):
    """A build or a run that failed; the message becomes the trial's reason."""


class NodeFault(FleetError):
    """A fault of the node, not of the configuration: a full disk, an unwritable cache, a sandbox that cannot
    start. The trial goes back to the queue for another worker, and the node says it is unhealthy."""


class BrokerError(FleetError):
    """The broker cannot be reached."""


class DriverLineError(SpecError):
    """An MIOpenDriver command line that does not describe a problem Fleet can tune."""


class MIOpenDbError(FleetError):
    """A find-db, perf-db or kernel-db file (or key) that cannot be read or written."""


# Cc: C0 and C1 controls (newline, ESC); Cf: format characters (bidirectional overrides that reorder what a
# terminal shows); Zl and Zp: line and paragraph separators; Cs: lone surrogates, which are not UTF-8.
UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """`` (did you mean 'budget'?)`` for the choice closest to a mistyped ``word``, else nothing.

    Parameters
    ----------
    word:
        What the user wrote: a field, a knob, a command.
    choices:
        What it could have been.
    """
    import difflib

    names = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def printable(text: str) -> str:
    """``text`` with its control and format characters escaped (``\\x1b``), for output that prints a stored
    value (a knob's value may be any string): it cannot move the terminal's cursor or reorder what it shows."""
    if text.isprintable():
        return text
    return "".join(
        c.encode("unicode_escape", "backslashreplace").decode() if unicodedata.category(c) in UNPRINTABLE else c
        for c in text
    )


def shown(value: object, limit: int = 80) -> str:
    """``value`` as an error message may quote it: ``repr`` (so a newline or an escape code is written as
    ``\\n`` or ``\\x1b``, never reaching the terminal raw), cut to ``limit`` characters with ``...``.

    User input goes into messages through here, so that a 10 000-character name or a 5 000-digit number still
    makes one readable line.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        # repr of a large integer costs time (and fails above 4300 digits); its size is what matters.
        return f"<an integer of {value.bit_length()} bits>"
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
