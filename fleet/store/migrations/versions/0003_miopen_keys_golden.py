"""MIOpen database keys and golden sets

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "miopen_keys",
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("db_key", sa.String(length=512), nullable=False),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("problem_id"),
    )
    op.create_index(op.f("ix_miopen_keys_db_key"), "miopen_keys", ["db_key"], unique=False)
    op.create_table(
        "golden_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("campaigns", JSON, nullable=False),
        sa.Column("provenance", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("target", "version", name="uq_golden_version"),
    )
    op.create_table(
        "golden_entries",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.String(length=16), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=True),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("toolchain", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["golden_versions.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"]),
        sa.PrimaryKeyConstraint("version_id", "problem_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("golden_entries")
    op.drop_table("golden_versions")
    op.drop_index(op.f("ix_miopen_keys_db_key"), table_name="miopen_keys")
    op.drop_table("miopen_keys")
