"""Memory and time statistics, the same way on every rank and every backend."""

from __future__ import annotations

import math
import os
import resource
import sys

import torch


def peak_memory_bytes(device: torch.device) -> float:
    """High-water mark since `reset_peak_memory`: allocator peak on a GPU, the process's maximum resident
    set on a CPU (Linux's VmHWM, which the reset clears; elsewhere the lifetime maximum)."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        return float(hwm * 1024)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(maxrss if sys.platform == "darwin" else maxrss * 1024)


def reset_peak_memory(device: torch.device) -> None:
    """Start the high-water mark afresh, so a trial's peak excludes what the worker did before building
    the model (parsing a spec that carries an operator trace, importing torch)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # Linux: reset the peak resident set size (proc(5))
    except OSError:
        pass


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


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
