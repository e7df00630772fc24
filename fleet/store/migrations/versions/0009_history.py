"""History: a trial says when it was proposed from history; measurements are indexed by problem, target and
objective, so that a problem and target's best measurements are the first rows of the index

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("history", _JSON, nullable=True))
    # The new index starts with the old one's columns: it serves every lookup the old one did.
    op.create_index("ix_measurements_problem_target_objective", "measurements", ["problem_id", "target", "objective"])
    op.drop_index("ix_measurements_problem_target", table_name="measurements")


def downgrade() -> None:
    op.create_index("ix_measurements_problem_target", "measurements", ["problem_id", "target"])
    op.drop_index("ix_measurements_problem_target_objective", table_name="measurements")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("history")
