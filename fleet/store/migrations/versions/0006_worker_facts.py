"""Facts from the worker: an artifact per build key and toolchain, a trial's toolchain, a measurement's device;
reuse decided by the evaluation claim, which a trial's remeasure flag turns off

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# SQLite keeps the baseline's unnamed unique constraint without a name: batch mode finds it by this convention.
_UNNAMED = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def _old_unique() -> str:
    # PostgreSQL named the baseline's constraint itself.
    return "artifacts_build_key_key" if op.get_bind().dialect.name == "postgresql" else "uq_artifacts_build_key"


def upgrade() -> None:
    with op.batch_alter_table("artifacts", naming_convention=_UNNAMED) as batch:
        batch.drop_constraint(_old_unique(), type_="unique")
        batch.create_unique_constraint("uq_artifact_build", ["build_key", "toolchain"])
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("toolchain", sa.Text(), nullable=True))
        batch.add_column(sa.Column("remeasure", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("device_kind", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("device", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("device")
        batch.drop_column("device_kind")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("remeasure")
        batch.drop_column("toolchain")
    with op.batch_alter_table("artifacts", naming_convention=_UNNAMED) as batch:
        batch.drop_constraint("uq_artifact_build", type_="unique")
        batch.create_unique_constraint(_old_unique(), ["build_key"])
