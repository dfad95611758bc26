"""Alembic's entry point: runs migrations on the connection `migrations.upgrade` hands over.

Without a handed-over connection (the `alembic` command line), it connects to `sqlalchemy.url` from
the config or `DATABASE_URL` from the environment.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine

from models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("no database: set sqlalchemy.url in the Alembic config or DATABASE_URL")
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; run against a database")
_run_online()
