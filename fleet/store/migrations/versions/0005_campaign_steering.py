"""Campaigns as a service: submitted campaigns, priorities, a driver lease and a failure reason

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("campaigns") as batch:
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("submitted", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("priority", sa.Float(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("driver", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("driver_lease_expires_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("campaigns") as batch:
        for column in ("driver_lease_expires_at", "driver", "priority", "submitted", "reason"):
            batch.drop_column(column)
