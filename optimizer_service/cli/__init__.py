"""The service's `stratagem` subcommands (`serve`, `db`), plugged into the library's CLI.

`stratagem` never imports the service: these modules are registered under the `stratagem.commands`
entry-point group in pyproject.toml, and `stratagem.cli` loads whatever that group holds. They stay
light at import (the service itself is imported inside the handlers), so `stratagem --help` stays fast.
"""
