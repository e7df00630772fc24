"""Teams of submitters, kept apart by PostgreSQL itself (issue 44): roles, grants and row-level security.

A team is a group role that no one logs in as; a submitter logs in as a role of its own, a member of its team; the
workers and drivers log in as the service role, which acts for every campaign (BYPASSRLS). Migrations 0014's and 0015's
policies decide which rows a team's members see and change (a campaign's team is a role they are a member of, and what
belongs to such a campaign); the grants here decide which tables and columns they touch at all. So a submitter's own
``psql`` is held to its team's campaigns as ``fleet status`` is: there is no check in Python to go around.

SQLite has no roles: an embedded database is one user's, every row theirs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Connection, select, text

from fleet.errors import NotFound, StoreError
from fleet.store._base import StoreBase, patient
from fleet.store._models import Base, Campaign, Team, utcnow

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

TEAM_READS = (
    "problems", "problem_tags", "miopen_keys", "campaigns", "campaign_problems", "trials", "measurements",
    "artifacts", "blobs", "chains", "chain_steps", "machines", "workers", "teams", "ms_workloads", "ms_records",
    "alembic_version",
)  # fmt: skip
"""The tables a team's members read (row-level security picks the rows of those that hold campaigns, and of
MetaSchedule's records and workloads: migration 0015). Not the golden sets, which are the operators'."""
TEAM_INSERTS = ("problems", "problem_tags", "blobs", "campaigns", "campaign_problems")
"""What ``fleet submit`` writes (a tag only on a problem of the team's own campaigns: migration 0015). Not trials,
measurements or artifacts: only the service role writes what decides a result (a trial's keys, a measurement), so
that no submitter forges one that another team's trial would reuse. Not a problem's MIOpen key either, which decides
where an export files its results (Tuna's commands are the operators'), nor a MetaSchedule record."""
TEAM_UPDATES = {
    "campaigns": ("status", "reason", "submitted", "priority", "driver", "driver_lease_expires_at", "finished_at"),
    "trials": ("state", "reason", "worker", "lease_expires_at", "finished_at"),
    "chains": ("state",),
}
"""The columns ``fleet submit``, ``pause``, ``cancel`` and ``resume --force`` change: never a campaign's team or
definition, nor a trial's keys."""
TEAM_SEQUENCES = ("problems_id_seq", "campaigns_id_seq")


@dataclass(frozen=True)
class TeamRow:
    """A team as ``fleet team list`` shows it: its name, its members' logins, and how many campaigns it owns."""

    name: str
    members: list[str]
    campaigns: int


def role_name(name: str, what: str) -> str:
    """``name`` when it is a plain role name (lower-case letters, digits and ``_``, 63 at most); else one line."""
    if not _NAME.fullmatch(name) or name.startswith("pg_"):
        raise StoreError(f"{what} {name!r}: a role name is lower-case letters, digits and _, 63 at most, not pg_...")
    return name


class TeamStore(StoreBase):
    """Teams, their members and the service role (PostgreSQL only), and the team a new campaign belongs to."""

    def _roles(self) -> None:
        if self.dialect != "postgresql":
            raise StoreError(f"{self.display_url}: teams are PostgreSQL roles; an SQLite database has one user")

    @patient
    def add_team(self, name: str) -> None:
        """Make ``name`` a team: a role no one logs in as (created when missing), granted what submitters need."""
        self._roles()
        role_name(name, "team")
        with self.transaction() as connection:
            self._create_role(connection, name, login=False)
            connection.execute(
                self.insert(Team).values(name=name, created_at=utcnow()).on_conflict_do_nothing(index_elements=["name"])
            )
            role = _quote(connection, name)
            for table in TEAM_READS:
                connection.execute(text(f"GRANT SELECT ON {table} TO {role}"))
            for table in TEAM_INSERTS:
                connection.execute(text(f"GRANT INSERT ON {table} TO {role}"))
            for table, columns in TEAM_UPDATES.items():
                connection.execute(text(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {role}"))
            for sequence in TEAM_SEQUENCES:
                connection.execute(text(f"GRANT USAGE ON SEQUENCE {sequence} TO {role}"))

    @patient
    def add_member(self, team: str, login: str, password: str | None = None) -> bool:
        """Let ``login`` (created when missing, with ``password``) submit for ``team``; whether it was created."""
        self._roles()
        role_name(login, "login")
        with self.transaction() as connection:
            if connection.scalar(select(Team.name).where(Team.name == team)) is None:
                raise NotFound(f"no team {team!r}: make it with `fleet team add {team}`")
            created = self._create_role(connection, login, login=True, password=password)
            connection.execute(text(f"GRANT {_quote(connection, team)} TO {_quote(connection, login)}"))
        return created

    @patient
    def add_service(self, login: str, password: str | None = None) -> bool:
        """Make ``login`` (created when missing) the workers' and drivers' role: it reads and writes every row of every
        table (BYPASSRLS, which takes a superuser to give) and changes no table's definition; whether it was created.
        Tables that later migrations add are granted to it too."""
        self._roles()
        role_name(login, "service login")
        with self.transaction() as connection:
            created = self._create_role(connection, login, login=True, password=password)
            role = _quote(connection, login)
            connection.execute(text(f"ALTER ROLE {role} BYPASSRLS"))
            tables = ", ".join(sorted([*Base.metadata.tables, "alembic_version"]))
            connection.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {role}"))
            schema = _quote(connection, str(connection.scalar(text("SELECT current_schema()"))))
            connection.execute(text(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role}"))
            # Tables and sequences that later migrations make (as the owner) are the service's too.
            defaults = f"ALTER DEFAULT PRIVILEGES FOR ROLE {_quote(connection, self._owner(connection))} GRANT"
            connection.execute(text(f"{defaults} SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}"))
            connection.execute(text(f"{defaults} USAGE, SELECT ON SEQUENCES TO {role}"))
        return created

    def _create_role(self, connection: Connection, name: str, *, login: bool, password: str | None = None) -> bool:
        """Create role ``name`` unless it exists as the same kind (a login, or not); whether it was created."""
        found = connection.execute(
            text("SELECT rolcanlogin, rolsuper FROM pg_catalog.pg_roles WHERE rolname = :name"), {"name": name}
        ).first()
        if found is not None and (found.rolcanlogin != login or found.rolsuper):
            kind = "a superuser" if found.rolsuper else "a login" if found.rolcanlogin else "a role no one logs in as"
            raise StoreError(f"role {name!r} exists and is {kind}: choose another name")
        role = _quote(connection, name)
        if found is None:
            connection.execute(text(f"CREATE ROLE {role} {'LOGIN' if login else 'NOLOGIN'}"))
        if password is not None:
            connection.execute(text(f"ALTER ROLE {role} PASSWORD :password"), {"password": password})
        return found is None

    def _owner(self, connection: Connection) -> str:
        owner = connection.scalar(
            text(
                "SELECT tableowner FROM pg_catalog.pg_tables"
                " WHERE tablename = 'campaigns' AND schemaname = current_schema"
            )
        )
        assert owner is not None
        return str(owner)

    @patient
    def teams(self) -> list[TeamRow]:
        """Every team, its members' logins, and the campaigns it owns (of those the asker may see)."""
        if self.dialect != "postgresql":
            return []
        with self.transaction() as connection:
            names = list(connection.scalars(select(Team.name).order_by(Team.name)))
            rows = []
            for name in names:
                members = connection.scalars(
                    text(
                        "SELECT m.rolname FROM pg_catalog.pg_auth_members a"
                        " JOIN pg_catalog.pg_roles t ON t.oid = a.roleid JOIN pg_catalog.pg_roles m ON m.oid = a.member"
                        " WHERE t.rolname = :team ORDER BY m.rolname"
                    ),
                    {"team": name},
                )
                count = connection.scalar(select(text("count(*)")).select_from(Campaign).where(Campaign.team == name))
                rows.append(TeamRow(name, list(members), int(count or 0)))
        return rows

    @patient
    def my_teams(self) -> list[str]:
        """The teams the database's login is a member of (on SQLite, none)."""
        if self.dialect != "postgresql":
            return []
        with self.transaction() as connection:
            return list(
                connection.scalars(
                    text(
                        "SELECT t.name FROM teams t JOIN pg_catalog.pg_roles r ON r.rolname = t.name"
                        " WHERE pg_catalog.pg_has_role(current_user, r.oid, 'MEMBER') ORDER BY t.name"
                    )
                )
            )

    @patient
    def reads_every_campaign(self) -> bool:
        """Whether the database's login sees every campaign: always on SQLite; on PostgreSQL a superuser, the tables'
        owner and the service role (BYPASSRLS) do, a team's member sees its teams' campaigns only."""
        if self.dialect != "postgresql":
            return True
        with self.transaction() as connection:
            return bool(
                connection.scalar(
                    text(
                        "SELECT rolsuper OR rolbypassrls OR pg_catalog.pg_has_role(current_user, :owner, 'MEMBER')"
                        " FROM pg_catalog.pg_roles WHERE rolname = current_user"
                    ),
                    {"owner": self._owner(connection)},
                )
            )

    @patient
    def owning_team(self, given: str | None = None) -> str | None:
        """The team a campaign this login submits belongs to: ``given`` (the login must be a member), else the one team
        the login is a member of; None on SQLite, on a database without teams, and for an operator or the service role
        (who see every campaign) naming none. One line when that cannot be told.

        Parameters
        ----------
        given:
            The team the submitter named (``--team``, ``FLEET_TEAM``), if any.
        """
        if self.dialect != "postgresql":
            return None
        mine = self.my_teams()
        every = self.reads_every_campaign()
        with self.transaction() as connection:
            user = connection.scalar(text("SELECT current_user"))
            teams = list(connection.scalars(select(Team.name)))
        if given is not None:
            if every and given in teams:
                return given  # an operator or the service submits for any team
            if given not in mine:
                raise StoreError(f"{user} is not a member of team {given!r} (its teams: {', '.join(mine) or 'none'})")
            return given
        if every:
            return None  # an operator's or the service's campaign, which only they see, unless they name a team
        if len(mine) > 1:
            raise StoreError(
                f"{user} is a member of teams {', '.join(mine)}: name the campaign's with --team or FLEET_TEAM"
            )
        if not mine and teams:
            raise StoreError(f"{user} is a member of no team: an operator adds it with `fleet team member TEAM {user}`")
        return mine[0] if mine else None


def _quote(connection: Connection, name: str) -> str:
    return str(connection.dialect.identifier_preparer.quote_identifier(name))
