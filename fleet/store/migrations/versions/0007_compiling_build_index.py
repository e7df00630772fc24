"""A partial index of compiling trials by build key: the compiles handed to a build, found at its end

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COMPILING = sa.text("state = 'compiling'")


def upgrade() -> None:
    op.create_index(
        "ix_trials_compiling_build",
        "trials",
        ["build_key"],
        postgresql_where=_COMPILING,
        sqlite_where=_COMPILING,
    )


def downgrade() -> None:
    op.drop_index("ix_trials_compiling_build", table_name="trials")
