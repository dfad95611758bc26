"""Memory and time statistics, the same way on every rank and every backend."""

from __future__ import annotations

import math
import os
import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> float:
    """High-water mark: allocator peak on a GPU, the process's maximum resident set on a CPU."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(maxrss if sys.platform == "darwin" else maxrss * 1024)


def current_memory_bytes(device: torch.device) -> float:
    """What is held now, to subtract the interpreter's and torch's own footprint from the peak."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        return float(resident_pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return peak_memory_bytes(device)


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), without numpy."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: list[float]) -> float:
    return quantile(values, 0.5)
