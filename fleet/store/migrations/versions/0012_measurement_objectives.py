"""A measurement of a workload with several objectives keeps each one's value by name

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("objectives", json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("objectives")
