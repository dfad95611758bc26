"""`stratagem serve [--host 127.0.0.1] [--port 8000] [--workers N] [--database-url URL]`: run the service.

Options left out come from the environment (`STRATAGEM_*`, `DATABASE_URL`, `RAY_ADDRESS`), exactly
as `python -m optimizer_service` reads them; options given win. Several API processes are several
`stratagem serve` behind a load balancer sharing one PostgreSQL: jobs live in the database.

Where neither the options nor the environment say where trials run, `stratagem serve` runs them on a
Ray it starts itself over this machine's devices (and says so at start-up), so the trials a request
asks for are never silently skipped; `--trials-backend none` turns them off.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from stratagem.cli.jobs import positive_int
from stratagem.errors import StratagemError

SERVICE_EXTRAS_HINT = "install the service extras: pip install 'stratagem[service]'"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_PORT = 65535


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the optimizer service (REST API, job workers, dashboard) with uvicorn",
        description="Run the Stratagem service. Options not given come from STRATAGEM_* environment variables.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker threads that run jobs in this process; 0 serves the API only (default: $STRATAGEM_WORKERS or 1)",
    )
    parser.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: $DATABASE_URL or sqlite:///./stratagem.db)"
    )
    parser.add_argument(
        "--trials-backend",
        choices=("ray", "local", "none"),
        default=None,
        help="where trials run (default: the Ray at RAY_ADDRESS, else a Ray started here over this machine's devices)",
    )
    parser.add_argument("--ray-address", default=None, help="Ray cluster for trials (default: $RAY_ADDRESS)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top, so registering the command stays light and a missing extra is one line
    try:
        import uvicorn

        from optimizer_service.app import create_app
    except ImportError as error:
        raise StratagemError(f"`stratagem serve` needs the service: {error}; {SERVICE_EXTRAS_HINT}") from None
    settings = service_settings(
        database_url=args.database_url,
        workers=args.workers,
        trials_backend=args.trials_backend,
        ray_address=args.ray_address,
    )
    settings = with_embedded_trials(settings)
    check_database(settings.database_url)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(trials_note(settings), flush=True)
    ray = start_embedded_ray(settings)
    try:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level, proxy_headers=True)
    finally:
        if ray is not None:
            ray.close()
    return 0


def with_embedded_trials(settings: Any) -> Any:
    """Trials on a local Ray (`RayBackend` without an address starts one) where nothing chose a backend.

    A Ray started in this process installs a fatal-signal handler that ends the process on SIGTERM before
    uvicorn's graceful shutdown (which stops that Ray) can finish, leaving Ray's agents behind; the
    service stops on SIGTERM itself, so that handler is turned off."""
    if settings.trials_backend is None and settings.ray_address is None:
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        return settings.model_copy(update={"trials_backend": "ray"})
    return settings


def start_embedded_ray(settings: Any) -> Any:
    """Start the Ray that trials run on here, in the main thread, before serving; None where trials run
    elsewhere. Started from a job's worker thread instead, its agents outlive `ray.shutdown()`; the
    service's own trial backend then finds Ray running, and this one stops it after uvicorn returns."""
    if settings.effective_trials_backend != "ray" or settings.ray_address:
        return None
    from trial_runner import RayBackend

    backend = RayBackend()
    backend.connect()
    return backend


def trials_note(settings: Any) -> str:
    """The start-up line saying where the trials a request asks for will run."""
    backend = settings.effective_trials_backend
    if backend == "none":
        return "trials: off (--trials-backend none); answers come from the simulator and the learned correction"
    if backend == "local":
        return "trials: local processes on this machine (--trials-backend local)"
    if settings.ray_address:
        return f"trials: on the Ray cluster at {settings.ray_address}"
    return (
        f"trials: on a Ray started here over this machine's devices ({local_devices()}); "
        "--trials-backend none turns them off, RAY_ADDRESS names a cluster"
    )


def local_devices() -> str:
    cpus = os.cpu_count() or 1
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        gpus = 0
    return f"{cpus} CPU(s), {gpus} GPU(s)"


def port_number(text: str) -> int:
    """An argparse type: a TCP port, so 70000 is a usage error rather than a trace from bind()."""
    value = positive_int(text)
    if value > MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_PORT}, got {value}")
    return value


def check_database(database_url: str) -> None:
    """Open the database once before starting uvicorn, so one that cannot be used (a folder that does not
    exist, a file that is no database, a server that refuses) is a one-line error, not a startup trace."""
    from optimizer_service.cli.db import read_revision

    read_revision(database_url)


def service_settings(**overrides: Any) -> Any:
    """The service's Settings from the environment, with the options given on the command line on top.

    A bad value (from either place) is a StratagemError naming the setting, not a pydantic trace.
    """
    try:
        from pydantic import ValidationError

        from optimizer_service.settings import Settings
    except ImportError as error:
        raise StratagemError(f"the service settings are not installed: {error}; {SERVICE_EXTRAS_HINT}") from None
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'settings'}: {item['msg']}"
            for item in error.errors(include_url=False)
        )
        raise StratagemError(f"invalid service settings: {problems}") from None
