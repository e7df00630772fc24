"""One self-contained HTML page of what a campaign found (``fleet report`` writes it).

The page needs nothing at view time: no network, no fonts. Its plots are inline SVG drawn here, so Fleet needs
no plotting library; its one inline script (allowed by its hash, nothing else runs) sorts and filters the table
of every trial, which reads as a plain table without it. It shows, per problem of the campaign:

- the convergence of the search: the best objective so far against trials and against wall time since the
  campaign's first trial started, one line per series (the campaign's strategy, or each annealing chain when
  trials carry a ``chain`` in their measurement's metrics or their configuration), with every measurement
  as a faint dot, errored and invalid trials as grey ticks on the x axis, and the baseline as a dashed line;
- the effect of each knob: per value, the median and the best objective over valid measurements, knobs
  ordered by how far apart their values' medians lie;
- the best configurations, with the speedup over the baseline, extra metrics, samples and where they ran;

and, for the whole campaign, trials by state, every trial (sortable, filterable), errors grouped by reason,
the strategy, space, workload and provenance. Everything that comes from users (knob names and values, reasons,
output) is escaped.

The package: :mod:`fleet.report.data` gathers what the page shows, :mod:`fleet.report.charts` draws SVG,
:mod:`fleet.report.page` writes the sections and the page (its style and script in ``page.css`` and ``page.js``).
"""

from fleet.report.page import KnobValue, dots_shown, knob_rows, render
from fleet.report.text import KNOB_VALUES, TOP

__all__ = ["KNOB_VALUES", "TOP", "KnobValue", "dots_shown", "knob_rows", "render"]
