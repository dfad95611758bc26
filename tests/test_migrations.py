"""The Alembic migrations build exactly the ORM's schema, undo cleanly, and are safe to run concurrently."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect

import migrations
import models

TABLES = {
    "graphs",
    "resource_specs",
    "strategies",
    "jobs",
    "job_candidates",
    "trials",
    "cost_model_versions",
    "operator_traces",
}


def _pending_diff(engine: Engine) -> list[object]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, models.Base.metadata))


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade_round_trips(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        migrations.upgrade(engine)
        assert migrations.current_revision(engine) == migrations.head_revision()
        assert _tables(engine) == TABLES
        migrations.downgrade(engine, "base")
        assert migrations.current_revision(engine) is None
        assert _tables(engine) == set()
        migrations.upgrade(engine)
        assert _tables(engine) == TABLES
    finally:
        engine.dispose()


def test_migrations_match_the_models_with_no_autogenerate_diff(database_url: str) -> None:
    engine = create_engine(database_url)
    try:
        migrations.upgrade(engine)
        assert _pending_diff(engine) == []
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)
    try:
        migrations.upgrade(engine)
        migrations.upgrade(engine)
        assert migrations.current_revision(engine) == migrations.head_revision()
    finally:
        engine.dispose()


REPLICA = """
import sys, time
from sqlalchemy import create_engine
import migrations
url, start_at = sys.argv[1], float(sys.argv[2])
engine = create_engine(url)
time.sleep(max(0.0, start_at - time.time()))
migrations.upgrade(engine)
print(migrations.current_revision(engine))
"""


@pytest.mark.slow
@pytest.mark.postgres
def test_replicas_migrating_at_once_serialize_on_the_advisory_lock(postgres_url: str) -> None:
    """Three replica processes migrate one empty database at the same instant; the lock makes it work."""
    start_at = f"{time.time() + 3.0:.3f}"
    replicas = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, postgres_url, start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [replica.communicate(timeout=120) for replica in replicas]
    for replica, (out, err) in zip(replicas, results, strict=True):
        assert replica.returncode == 0, err
        assert out.strip() == migrations.head_revision()
    engine = create_engine(postgres_url)
    try:
        assert _tables(engine) == TABLES
    finally:
        engine.dispose()
