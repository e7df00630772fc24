"""``python -m fleet.cli``: the ``fleet`` command, as the tests and deployments run it."""

import sys

from fleet.cli import main

sys.exit(main())
