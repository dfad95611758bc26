"""How a probe is timed: as a synchronous step runs it, from cold caches, the median of its repeats."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

EVICT_MIN_BYTES = 64 << 20
"""What the evictor streams where the machine does not report its caches (and at least, where it does)."""
EVICT_MAX_BYTES = 1 << 30
"""Beyond this a cache is not held by one process's data anyway; streaming more would only slow calibration."""


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache the first CPU reports (Linux sysfs; sizes like `491520K`), or None."""
    sizes = []
    for entry in root.glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def eviction_bytes(cache_bytes: int | None) -> int:
    """Bytes to stream so that a probe's data is no longer cached: the last-level cache, within bounds."""
    return min(max(cache_bytes or 0, EVICT_MIN_BYTES), EVICT_MAX_BYTES)


class CacheEvictor:
    """Reads a buffer as large as the last-level cache, so the next probe finds its data in memory.

    In a training step each layer's tensors were pushed out of the caches by the rest of the step since
    they were last touched; a probe repeated in a tight loop keeps its tensors cached instead and times
    a faster machine than the step runs on. On a CPU whose last-level cache holds hundreds of MB the
    difference is large: element-wise kernels, convolutions and top-k selection reached 20-50% lower
    rates cold than hot, and calibrated hot the simulator priced the zoo models' steps 25-33% fast
    (docs/simulator.md, "Cold caches")."""

    def __init__(self, nbytes: int, device: str = "cpu") -> None:
        self.nbytes = nbytes
        self._buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    @classmethod
    def for_device(cls, device: str = "cpu") -> CacheEvictor:
        """This machine's last-level cache on a CPU; twice the L2 cache on a CUDA device."""
        if torch.device(device).type != "cuda":
            return cls(eviction_bytes(last_level_cache_bytes()))
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20))
        return cls(2 * l2_bytes, device=device)

    def __call__(self) -> None:
        self._buffer.sum()


class Stepper:
    """Times work the way a synchronous step runs it: every rank runs it, then all ranks agree (one tiny
    all-reduce) whether to go on, so a sample lasts until the slowest rank is done, as a step waits for
    its slowest rank. The agreement's own latency, timed alone, is taken off. Alone (`agree` the
    identity) it is a plain median timer; on an accelerator `agree` also waits for the device, whose
    kernels run after the host has queued them. `budget_scale` shortens (or lengthens) every probe's
    time budget, for probes interleaved with other work. With `evict` (a `CacheEvictor`), every run
    starts with cold caches, as a step's layers do; the eviction is not timed, and the ranks agree once
    more after it so that no rank's sample includes another's eviction."""

    def __init__(
        self,
        agree: Callable[[bool], bool] = lambda go: go,
        *,
        budget_scale: float = 1.0,
        evict: Callable[[], object] | None = None,
    ) -> None:
        self.agree = agree
        self.budget_scale = budget_scale
        self.evict: Callable[[], object] | None = None  # the agreement's own latency is timed warm
        self.floor = 0.0
        self.floor = self.median(lambda: None, budget_s=0.2, least=10)
        self.evict = evict

    def median(self, run: Callable[[], object], *, budget_s: float, least: int = 3, most: int = 40) -> float:
        """Median seconds of `run` over repeats filling about `budget_s` of wall time, evictions
        included (after one untimed warm-up)."""
        run()
        self.agree(True)
        samples: list[float] = []
        deadline = time.perf_counter() + budget_s * self.budget_scale
        go = True
        while go:
            if self.evict is not None:
                self.evict()
                self.agree(True)
            start = time.perf_counter()
            run()
            go = self.agree(len(samples) + 1 < most and (len(samples) + 1 < least or time.perf_counter() < deadline))
            samples.append(time.perf_counter() - start)
        return max(statistics.median(samples) - self.floor, 1e-9)
