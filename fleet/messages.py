"""How trials share a Celery message: the rule the driver's pace (:mod:`fleet.driving.pace`) sends them by and the
worker holding a message (:mod:`fleet.tasks.trials`) splits them by, below both."""

CHEAP_SECONDS = 0.05
"""Trials taking at most this long each, per slot, are cheap. A worker holding a message whose trials turn
out slower sends the rest on, one per message (``fleet.tasks.trials``), once it has held it
:data:`SPLIT_SECONDS`."""

SPLIT_SECONDS = 1.0
"""A message of trials slower than cheap is split only once it has held its slot this long. A pause (a
vacuum, a busy CPU) slows every trial for a moment; splitting messages then multiplies them when the fleet is
busiest, and their cost kept 20 campaigns of cheap trials at half their rate for tens of seconds."""
