"""The store the environment names."""

from __future__ import annotations

from fleet.settings import Settings, get_settings
from fleet.store._store import Store


def connect(settings: Settings | None = None) -> Store:
    """The store ``FLEET_DATABASE_URL`` names; an embedded database is migrated on first use.

    Parameters
    ----------
    settings:
        Settings to read instead of the process's own (``fleet.settings.get_settings()``).
    """
    settings = settings or get_settings()
    store = Store(settings.database_url)
    if settings.embedded_database and not store.at_head():
        store.upgrade()
    store.check()
    return store
