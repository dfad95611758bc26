"""How numbers, sizes and times read on the pages: one place, so every page says them the same way."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any


def seconds(value: float | None) -> str:
    """A step time with a unit that keeps three significant digits readable (µs, ms or s)."""
    if value is None or not math.isfinite(value):
        return "—"
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def nbytes(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def percent(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 100:.{digits}f}%"


def number(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):  # bool is an int too
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else "—"
    return str(value)


def when(value: datetime | None) -> str:
    """UTC, to the second: the service stores UTC and operators compare times across replicas."""
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def short_id(value: Any, length: int = 8) -> str:
    return str(value)[:length]


def speedup(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.2f}×"


FILTERS = {
    "seconds": seconds,
    "nbytes": nbytes,
    "percent": percent,
    "number": number,
    "when": when,
    "short_id": short_id,
    "speedup": speedup,
}
