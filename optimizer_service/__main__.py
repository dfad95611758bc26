"""`python -m optimizer_service`: serve the API with uvicorn, settings from the environment."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from optimizer_service.app import create_app
from optimizer_service.settings import Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m optimizer_service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(Settings()), host=args.host, port=args.port, log_level=args.log_level, proxy_headers=True)


if __name__ == "__main__":
    main()
