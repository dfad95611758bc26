"""Fixtures for service tests: an app on a fresh SQLite file or a fresh PostgreSQL database.

PostgreSQL: the session creates one database through the `test` database (`CREATE DATABASE
stratagem_test_<random>`, dropped when the session ends) and every test that asks for `postgres_url`
gets its own empty schema in it, so tests never see each other's rows. The server is the one at 127.0.0.1:5432 (override with
`STRATAGEM_TEST_POSTGRES_URL`); when it is unreachable those tests are skipped with the reason.

`conftest.py` loads this module as a plugin, so every test can ask for these fixtures; plain helpers
(request bodies, polling, settings) are in `service_helpers.py`, imported normally.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_helpers import service_settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import migrations
from optimizer_service.app import create_app
from optimizer_service.db import make_engine, make_session_factory

ADMIN_URL = os.environ.get("STRATAGEM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


class PostgresDatabases:
    """One throw-away database for the session, and a fresh schema in it for every test.

    Schemas are cheap to create and drop; databases are not (each DROP DATABASE forces a checkpoint).
    A test's URL sets `search_path` to its schema, so the app, Alembic and reflection all see only it.
    """

    def __init__(self, admin_url: str) -> None:
        self._admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        self._url = make_url(admin_url)
        self._database: str | None = None
        self._engine: Any = None

    def reachable(self) -> str | None:
        try:
            with self._admin.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception as error:  # any reason the server cannot be used is a reason to skip
            return f"PostgreSQL at {self._url.render_as_string(hide_password=True)} is unreachable: {error}"
        return None

    def create(self) -> str:
        """A URL whose connections live in a new, empty schema."""
        if self._database is None:
            self._database = f"stratagem_test_{uuid.uuid4().hex[:12]}"
            with self._admin.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{self._database}"'))
            self._engine = create_engine(self._database_url(), isolation_level="AUTOCOMMIT")
        schema = f"t_{uuid.uuid4().hex[:12]}"
        with self._engine.connect() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        return self._database_url() + f"?options=-csearch_path%3D{schema}"

    def _database_url(self) -> str:
        return self._url.set(database=self._database).render_as_string(hide_password=False)

    def drop_all(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        if self._database is not None:
            with self._admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{self._database}" WITH (FORCE)'))
        self._admin.dispose()


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[PostgresDatabases]:
    databases = PostgresDatabases(ADMIN_URL)
    problem = databases.reachable()
    if problem:
        pytest.skip(problem)
    yield databases
    databases.drop_all()


@pytest.fixture
def postgres_url(postgres_databases: PostgresDatabases) -> str:
    return postgres_databases.create()


@pytest.fixture
def sqlite_url(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'stratagem.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.slow])])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn: a fresh SQLite file, then a fresh PostgreSQL database (a real server, so
    the integration suite's; the quick suite runs the same tests on SQLite)."""
    name = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    return str(request.getfixturevalue(name))


MakeClient = Callable[..., TestClient]


@pytest.fixture
def session_factory(database_url: str) -> Iterator[sessionmaker[Session]]:
    """ORM sessions on this test's database, migrated to the head revision; no app, no workers."""
    engine = make_engine(database_url)
    migrations.upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture
def make_client(database_url: str) -> Iterator[MakeClient]:
    """`make_client(workers=0, search=..., ...)`: a started app on this test's database.

    Settings keywords go to `Settings`; `search`, `trials`, `cost_model_trainer` and `pipeline` go to
    `create_app`. Every client is shut down (workers stopped) at the end of the test.
    """
    with contextlib.ExitStack() as stack:

        def make(**options: Any) -> TestClient:
            app_keys = ("search", "trials", "cost_model_trainer", "pipeline")
            app_kwargs = {key: options.pop(key) for key in app_keys if key in options}
            app = create_app(service_settings(database_url, **options), **app_kwargs)
            return stack.enter_context(TestClient(app, raise_server_exceptions=False))

        yield make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """An app with one worker thread and no trials."""
    return make_client()
