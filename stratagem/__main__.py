"""`python -m stratagem`: the command line, for when the `stratagem` script is not on PATH."""

from stratagem.cli import main

raise SystemExit(main())
