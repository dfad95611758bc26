"""Process-level helpers the measuring benchmarks share."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: child processes run benchmark modules from there (`python -m benchmarks.NAME`)."""


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs a benchmark module in a child process started with `cwd=ROOT`."""
    return [sys.executable, "-m", module, *args]


def reexec_with(env: dict[str, str], module: str) -> None:
    """Replace this process by the same benchmark module under `env` (the ranks' allocator settings)."""
    os.chdir(ROOT)
    os.execve(sys.executable, module_command(module, *sys.argv[1:]), env)


def lower_niceness(boost: int) -> int:
    """Raise this process's priority by `boost` (inherited by calibrations and trial ranks) where
    permitted; the niceness it runs at."""
    try:
        return os.nice(-boost)
    except PermissionError:
        return os.nice(0)


def page_faults() -> int:
    """Minor page faults this process has taken so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
