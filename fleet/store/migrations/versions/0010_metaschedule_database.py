"""MetaSchedule's database: its workloads and tuning records, as MetaSchedule writes them, with provenance

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "ms_workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("shash", sa.String(length=32), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("line_key", sa.String(length=64), nullable=False),
        sa.Column("tvm", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("line_key", name="uq_ms_workload_line"),
    )
    op.create_index("ix_ms_workloads_shash", "ms_workloads", ["shash"])
    op.create_table(
        "ms_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("record_key", sa.String(length=64), nullable=False),
        sa.Column("mean_seconds", sa.Float(), nullable=True),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("provenance", _JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["ms_workloads.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workload_id", "record_key", name="uq_ms_record"),
    )
    op.create_index("ix_ms_records_workload_seconds", "ms_records", ["workload_id", "mean_seconds"])


def downgrade() -> None:
    op.drop_index("ix_ms_records_workload_seconds", table_name="ms_records")
    op.drop_table("ms_records")
    op.drop_index("ix_ms_workloads_shash", table_name="ms_workloads")
    op.drop_table("ms_workloads")
