"""`python -m optimizer_service`: serve the API with uvicorn, settings from the environment."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from optimizer_service.app import create_app
from optimizer_service.cli.serve import LOG_LEVELS, check_database, port_number, service_settings
from stratagem.errors import StratagemError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimizer_service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    args = parser.parse_args(argv)
    try:
        settings = service_settings()
        check_database(settings.database_url)
    except StratagemError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level, proxy_headers=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
