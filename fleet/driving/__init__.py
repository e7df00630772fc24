"""The driving side: what keeps the fleet busy with a campaign, above the tasks and below the API.

- :mod:`fleet.driving.campaign`: a spec written to the store, and the driver of a campaign's trials;
- :mod:`fleet.driving.chains`: annealing chains on the fleet;
- :mod:`fleet.driving.pace`: whether a campaign's trials share messages, and how many are in flight;
- :mod:`fleet.driving.drivers`: ``fleet driver``, the service that drives submitted campaigns;
- :mod:`fleet.driving.history`: what earlier campaigns of a problem found, for a new one to start from.

Nothing is imported here: a command that needs the pace alone does not pay for the driver.
"""
