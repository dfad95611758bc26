"""Alembic migrations for `models/`, configured in code so they run from the installed package.

`upgrade(engine)` is what the service calls at start-up. On PostgreSQL it first takes a
transaction-scoped advisory lock, so replicas starting together migrate one at a time: the first
does the work, the others wait and then find nothing to do. PostgreSQL's DDL is transactional, so a
failed migration leaves the schema as it was.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, text

SCRIPT_LOCATION = Path(__file__).resolve().parent
ADVISORY_LOCK_KEY = 0x5354524154  # "STRAT": one key for every Stratagem deployment sharing a database
# Alembic keeps its running context in module globals: two migrations in one process must not overlap.
_IN_PROCESS = threading.Lock()


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at this package; with a connection, migrations run on it."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    with _IN_PROCESS, engine.begin() as connection:
        _lock(connection)
        command.upgrade(alembic_config(connection), revision)


def downgrade(engine: Engine, revision: str) -> None:
    with _IN_PROCESS, engine.begin() as connection:
        _lock(connection)
        command.downgrade(alembic_config(connection), revision)


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration revisions found in {SCRIPT_LOCATION / 'versions'}")
    return head


def _lock(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
