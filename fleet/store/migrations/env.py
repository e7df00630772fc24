"""Alembic environment: Fleet runs migrations programmatically (``fleet db upgrade``), on a connection it passes."""

from alembic import context
from sqlalchemy import Connection

from fleet.store._models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        from sqlalchemy import create_engine

        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
        with engine.begin() as connection:
            _run(connection)
        engine.dispose()
    else:
        _run(connection)


def _run(connection: Connection) -> None:
    # SQLite cannot ALTER most things in place; batch mode rebuilds tables when a later revision needs it.
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
