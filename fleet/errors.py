"""One exception tree, rooted at :class:`FleetError`.

The CLI prints ``str(error)`` of any :class:`FleetError` as one line and exits non-zero, so each message
must say what is wrong and, where it helps, what to do about it.
"""


class FleetError(Exception):
    """Base of every error Fleet raises on purpose."""


class SpecError(FleetError):
    """A campaign spec, space or knob value that is not valid."""


class ConfigurationError(FleetError):
    """Settings from the environment that cannot be used."""


class StoreError(FleetError):
    """The database cannot be reached or is not at the expected schema."""


class NotFound(FleetError):
    """A campaign, problem or trial that does not exist."""


class WorkloadError(FleetError):
    """A build or a run that failed; the message becomes the trial's reason."""


class BrokerError(FleetError):
    """The broker cannot be reached."""


class DriverLineError(SpecError):
    """An MIOpenDriver command line that does not describe a problem Fleet can tune."""


class MIOpenDbError(FleetError):
    """A find-db, perf-db or kernel-db file (or key) that cannot be read or written."""
