"""Per-step timing of a distributed step, split into compute and waiting on synchronization.

Trials need to know where a step's time goes: `compute_s` is the wall time between two optimizer
steps (data, forward, backward, including the launch of collectives that overlap backward), and
`wait_s` is the time the step spent blocked on communication that had not finished (all-reduce
handles, parameter-server round trips, ZeRO gathers). On CUDA the device is synchronized at each
boundary, so the figures are honest at the cost of a little overlap.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class SyncStats:
    step: int = 0
    """How many optimizer steps had completed when this one ended (1 for the first)."""
    compute_s: float = 0.0
    """From the end of the previous step (or `distribute`) to the start of this one."""
    launch_s: float = 0.0
    """Part of compute_s spent inside backward hooks flattening, compressing and launching collectives."""
    wait_s: dict[str, float] = field(default_factory=dict)
    """Seconds blocked on communication in the step, per synchronizer kind (allreduce, ps, sharded)."""
    update_s: float = 0.0
    """Optimizer arithmetic: the local step, server updates and shard updates."""
    step_s: float = 0.0
    """Total wall time inside `optimizer.step()`."""
    wire_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes this rank handed to collectives, per synchronizer kind."""

    @property
    def sync_wait_s(self) -> float:
        return sum(self.wait_s.values())

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "sync_wait_s": self.sync_wait_s}


class StatsRecorder:
    """Accumulates one step's SyncStats; `last` is the most recently completed step."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self.current = SyncStats()
        self.last: SyncStats | None = None
        self._steps = 0
        self._step_ended = time.perf_counter()
        self._step_started = 0.0

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def begin_step(self) -> None:
        self._step_started = self._now()
        self.current.compute_s = self._step_started - self._step_ended

    def end_step(self) -> None:
        self._step_ended = self._now()
        self._steps += 1
        self.current.step = self._steps
        self.current.step_s = self._step_ended - self._step_started
        self.last, self.current = self.current, SyncStats()

    @contextmanager
    def waiting(self, kind: str) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.current.wait_s[kind] = self.current.wait_s.get(kind, 0.0) + self._now() - start

    @contextmanager
    def updating(self) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.current.update_s += self._now() - start

    @contextmanager
    def launching(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.current.launch_s += time.perf_counter() - start

    def add_bytes(self, kind: str, n: int) -> None:
        self.current.wire_bytes[kind] = self.current.wire_bytes.get(kind, 0) + n
