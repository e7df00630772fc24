"""A node's faults are the node's: a worker's fault (an unhealthy node), and the times a trial went back to its
queue for one

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("node_faults", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("fault", sa.Text(), nullable=True))
        batch.add_column(sa.Column("fault_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("fault_at")
        batch.drop_column("fault")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("node_faults")
