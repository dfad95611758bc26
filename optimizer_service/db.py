"""Engines and sessions for one app instance, tuned per backend.

SQLite is the zero-install default, and several worker threads share its file: WAL journaling lets
readers proceed during a write, and a busy timeout makes a writer wait for the lock instead of
failing at once. Foreign keys are off in SQLite unless asked for, so they are turned on.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

SQLITE_BUSY_TIMEOUT_S = 30


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)


def _sqlite_engine(url: str) -> Engine:
    in_memory = url in ("sqlite://", "sqlite:///:memory:")
    connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
    # An in-memory database exists per connection: every thread must share the one connection.
    pool = {"poolclass": StaticPool} if in_memory else {}
    engine = create_engine(url, connect_args=connect_args, **pool)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if not in_memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.close()

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: rows read in a request stay usable after its commit.
    return sessionmaker(bind=engine, expire_on_commit=False)


def is_postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"
