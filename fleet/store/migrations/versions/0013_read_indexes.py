"""Indexes for the read commands at 100,000 trials: a campaign's counts from its index alone, and each problem's best
down its measurements in objective order

- ``ix_trials_campaign_state`` (campaign, state) grows problem, baseline and id: a campaign's counts by problem,
  state and baseline (``Store.tally``) are read from the index, not from every row of its trials, and a
  problem's baseline trials are found in it.
- ``ix_measurements_problem_objective`` (problem, objective, trial): a problem's best is the first of its
  measurements in this order that the campaign's own trial made, not the top of a ranking of them all.
- ``ix_trials_reused`` (campaign, problem) of the trials that reused an earlier measurement: few, ranked apart.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_REUSED = sa.text("source_trial_id IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_trials_campaign_state", table_name="trials")
    op.create_index("ix_trials_campaign_state", "trials", ["campaign_id", "state", "problem_id", "baseline", "id"])
    op.create_index(
        "ix_trials_reused", "trials", ["campaign_id", "problem_id"], postgresql_where=_REUSED, sqlite_where=_REUSED
    )
    op.create_index("ix_measurements_problem_objective", "measurements", ["problem_id", "objective", "trial_id"])


def downgrade() -> None:
    op.drop_index("ix_measurements_problem_objective", table_name="measurements")
    op.drop_index("ix_trials_reused", table_name="trials")
    op.drop_index("ix_trials_campaign_state", table_name="trials")
    op.create_index("ix_trials_campaign_state", "trials", ["campaign_id", "state"])
