"""Process-level helpers the measuring benchmarks share."""

from __future__ import annotations

import os
import resource


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
