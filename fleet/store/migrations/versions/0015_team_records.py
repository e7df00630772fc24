"""Teams, second part (issue 44): MetaSchedule's records have an owning team, and a team tags only its own problems

- ``ms_records.team``: the team whose ``fleet tvm tune-ms`` or ``import-ms`` made the record; ``''`` for an
  operator's (every record from before). Part of a record's identity, so the same record text imported for two
  teams is each one's.
- On PostgreSQL, row-level security: a record is its team's members' (as a campaign is, migration 0014), and a
  MetaSchedule workload (an IRModule, shared by its line as a problem is by its key) shows to a team's member only
  when one of its team's records is of it. A tag is added by a team's member only to a problem of its own
  campaigns (``fleet submit`` tags them once the campaign is written); every login still reads every tag.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# As in 0014: bound when each policy is created, so no session's temporary pg_roles stands in.
_MY_TEAM = (
    "team IN (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))"
)
POLICIES = {
    "ms_records": [("team_rows", "ALL", _MY_TEAM)],
    "ms_workloads": [("team_rows", "SELECT", "id IN (SELECT workload_id FROM ms_records)")],
    "problem_tags": [
        ("every_reader", "SELECT", "true"),
        ("team_tags", "INSERT", "problem_id IN (SELECT problem_id FROM campaign_problems)"),
    ],
}
"""Each table's policies: (name, command, condition), as in 0014."""


def upgrade() -> None:
    with op.batch_alter_table("ms_records") as batch:
        batch.add_column(sa.Column("team", sa.String(63), nullable=False, server_default=""))
        batch.drop_constraint("uq_ms_record", type_="unique")
        batch.create_unique_constraint("uq_ms_record", ["workload_id", "record_key", "team"])
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, policies in POLICIES.items():
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        for name, command, condition in policies:
            check = "" if command in ("SELECT", "DELETE") else f" WITH CHECK ({condition})"
            using = "" if command == "INSERT" else f" USING ({condition})"
            op.execute(f"CREATE POLICY {name} ON {table} FOR {command} TO PUBLIC{using}{check}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, policies in POLICIES.items():
            for name, _command, _condition in policies:
                op.execute(f"DROP POLICY {name} ON {table}")
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    # A record stored for several teams keeps one row (its first), which is every login's again.
    op.execute(
        "DELETE FROM ms_records WHERE id NOT IN (SELECT min(id) FROM ms_records GROUP BY workload_id, record_key)"
    )
    with op.batch_alter_table("ms_records") as batch:
        batch.drop_constraint("uq_ms_record", type_="unique")
        batch.create_unique_constraint("uq_ms_record", ["workload_id", "record_key"])
        batch.drop_column("team")
