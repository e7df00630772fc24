"""Teams: each campaign has an owning team (a PostgreSQL role), and PostgreSQL's row-level security keeps a team's
campaigns, trials, measurements, artifacts, stored sources and chains from every other team's logins (issue 44)

- ``teams``: the roles ``fleet team add`` made teams (their names).
- ``campaigns.team``: the owning team; None for a campaign submitted before teams, or by an operator.
- On PostgreSQL, row-level security on the tables that hold a campaign's data. A row is a team's when its campaign's
  team is a role the asker is a member of; everything else follows from the campaign: its problems, trials, chains
  and their steps; a measurement of one of its trials, or the one a trial of it reused (same measure key); an
  artifact one of its trials builds; a blob that one of its campaigns' workloads or artifacts names. A blob is
  stored only under its own SHA-256.

The tables' owner (the operator's role, which runs the migrations) is not subject to the policies, nor is a role
with BYPASSRLS (the workers' and drivers', made by ``fleet team service``): they act for every campaign. The
policies are not FORCEd on the owner: it could switch them off (``ALTER TABLE``) anyway.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# Bound when each policy is created (a policy's query names its tables by identity, not through search_path): a
# session's temporary table or view of the same name cannot stand in for them.
_MY_TEAM = (
    "team IN (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER'))"
)
_MY_CAMPAIGN = "campaign_id IN (SELECT id FROM campaigns)"
POLICIES = {
    "campaigns": [("team_rows", "ALL", _MY_TEAM)],
    "campaign_problems": [("team_rows", "ALL", _MY_CAMPAIGN)],
    "trials": [("team_rows", "ALL", _MY_CAMPAIGN)],
    "chains": [("team_rows", "ALL", _MY_CAMPAIGN)],
    "chain_steps": [("team_rows", "ALL", "chain_id IN (SELECT id FROM chains)")],
    "measurements": [
        ("team_rows", "ALL", "trial_id IN (SELECT id FROM trials)"),
        # Reused: the same measure key is the same sources, command, knobs, target and toolchain, so the team's own
        # trial would have measured the same. The key is the check: a trial naming any source_trial_id sees nothing.
        (
            "team_reused",
            "SELECT",
            "(trial_id, measure_key) IN (SELECT source_trial_id, measure_key FROM trials "
            "WHERE source_trial_id IS NOT NULL)",
        ),
    ],
    "artifacts": [("team_rows", "ALL", "build_key IN (SELECT build_key FROM trials)")],
    "blobs": [
        (
            "team_rows",
            "SELECT",
            "digest IN (SELECT workload ->> 'bundle' FROM campaigns) OR digest IN (SELECT blob_digest FROM artifacts)",
        ),
        # Content-addressed for real: bytes stored under another's digest would be what that campaign builds.
        ("team_stores", "INSERT", "digest = encode(sha256(data), 'hex') AND size = length(data)"),
    ],
}
"""Each table's policies: (name, command, condition), the condition both USING and, where it applies, WITH CHECK."""


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    with op.batch_alter_table("campaigns") as batch:
        batch.add_column(sa.Column("team", sa.String(63), nullable=True))
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite has no roles: one user, every row theirs
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
    with op.batch_alter_table("campaigns") as batch:
        batch.drop_column("team")
    op.drop_table("teams")
