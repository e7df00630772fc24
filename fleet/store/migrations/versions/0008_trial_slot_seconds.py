"""A trial's time on a build slot and on an evaluation slot: the drivers batch and size their windows from them

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("compile_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("eval_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("eval_seconds")
        batch.drop_column("compile_seconds")
