"""Drop the trials' build-key and measure-key indexes

Nothing looks trials up by either key: artifacts are found by their own unique build key, and earlier
measurements by the measurements' measure-key index. Every change of a trial's state wrote both.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_trials_measure_key", table_name="trials")
    op.drop_index("ix_trials_build_key", table_name="trials")


def downgrade() -> None:
    op.create_index("ix_trials_build_key", "trials", ["build_key"], unique=False)
    op.create_index("ix_trials_measure_key", "trials", ["measure_key"], unique=False)
