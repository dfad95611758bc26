"""`stratagem db upgrade [--database-url URL] [--revision head]` and `stratagem db current`.

The service migrates its database at start-up; these commands let an operator do it ahead of a
rollout (or with `STRATAGEM_RUN_MIGRATIONS=false` replicas) and check where a database stands:
`current` exits 1 when the schema is behind, so a deploy script can gate on it. A database URL is
never printed with its password, in success or in error.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from optimizer_service.cli.serve import SERVICE_EXTRAS_HINT, service_settings
from optimizer_service.core.redact import mask_secrets
from stratagem.errors import StratagemError

T = TypeVar("T")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "db",
        help="migrate the service's database, or show its schema revision",
        description="Alembic migrations of the service's database, run from the installed package.",
    )
    actions = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = actions.add_parser("upgrade", help="migrate to the newest schema (or --revision)")
    upgrade.add_argument("--revision", default="head", help="target revision (default head)")
    upgrade.set_defaults(func=run_upgrade)
    current = actions.add_parser(
        "current", help="the database's revision, and whether it is the newest (exit 1 when behind)"
    )
    current.set_defaults(func=run_current)
    for action in (upgrade, current):
        action.add_argument(
            "--database-url", default=None, help="SQLAlchemy URL (default: $DATABASE_URL or sqlite:///./stratagem.db)"
        )


def run_upgrade(args: argparse.Namespace) -> int:
    migrations, engine = _open(args.database_url)
    try:
        before = _guarded(lambda: migrations.current_revision(engine), engine)
        _guarded(lambda: _upgrade(migrations, engine, args.revision), engine)
        after = _guarded(lambda: migrations.current_revision(engine), engine)
    finally:
        engine.dispose()
    where = engine.url.render_as_string(hide_password=True)
    if before == after:
        print(f"{where}: already at {after}")
    else:
        print(f"{where}: upgraded {before or '(empty)'} -> {after}")
    return 0


def run_current(args: argparse.Namespace) -> int:
    where, current, head = read_revision(args.database_url)
    state = "up to date" if current == head else f"behind head {head}; run `stratagem db upgrade`"
    print(f"{where}: {current or '(empty: no schema yet)'} ({state})")
    return 0 if current == head else 1


def read_revision(database_url: str | None) -> tuple[str, str | None, str]:
    """(the URL without its password, the database's revision, the migrations' head); a database that
    cannot be opened or read is a one-line StratagemError."""
    migrations, engine = _open(database_url)
    try:
        current = _guarded(lambda: migrations.current_revision(engine), engine)
    finally:
        engine.dispose()
    return engine.url.render_as_string(hide_password=True), current, migrations.head_revision()


def _open(database_url: str | None) -> tuple[Any, Any]:
    # imported here, not at the top, so registering the command stays light
    settings = service_settings(database_url=database_url)
    try:
        import migrations
        from optimizer_service.db import make_engine
    except ImportError as error:
        raise StratagemError(f"`stratagem db` needs the service's migrations: {error}; {SERVICE_EXTRAS_HINT}") from None
    try:
        engine = make_engine(settings.database_url)
    except Exception as error:  # SQLAlchemy refuses bad URLs and missing drivers with several types
        where = mask_secrets(settings.database_url)
        raise StratagemError(f"--database-url {where!r}: {type(error).__name__}: {mask_secrets(str(error))}") from None
    return migrations, engine


def _upgrade(migrations: Any, engine: Any, revision: str) -> None:
    """Alembic refuses an unknown or older --revision with a CommandError: one line naming the option."""
    from alembic.util import CommandError

    try:
        migrations.upgrade(engine, revision)
    except CommandError as error:
        raise StratagemError(f"--revision {revision!r}: {mask_secrets(str(error))}") from None


def _guarded(step: Callable[[], T], engine: Any) -> T:
    """Run one database step; a database that cannot be reached or used is a one-line error."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return step()
    except SQLAlchemyError as error:
        where = engine.url.render_as_string(hide_password=True)
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise StratagemError(f"database {where}: {type(error).__name__}: {mask_secrets(reason)}") from None
