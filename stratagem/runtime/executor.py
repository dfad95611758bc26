"""The contract every synchronizer executor follows, and the hooks that drive its first phase.

Phase one (`launch`) runs inside backward, from a post-accumulate-grad hook, as soon as the last
gradient an executor needs is ready: it starts asynchronous communication, as DDP's buckets do, so
it overlaps the rest of backward. The optimizer step then runs two more phases over every executor:
`settle` waits for the communication and holds the averaged gradient this rank will apply, and
`apply` runs the updates parameter servers and ZeRO shards own, then pulls or all-gathers the new
values. Every executor settles before any applies, so the global gradient norm can be taken between
the two (`clipping.py`). Collectives match by issue order, so every rank must launch, settle and
apply executors in the same order: backward order for launches (the same graph runs on every rank),
list order for anything still unlaunched at the step and for both later phases.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from stratagem.errors import UnsupportedStrategyError
from stratagem.runtime.stats import StatsRecorder


class Executor(ABC):
    kind: str
    """The synchronizer kind, for stats: allreduce, ps or sharded."""

    @property
    @abstractmethod
    def params(self) -> list[nn.Parameter]:
        """Parameters whose gradients must be ready before `launch`."""

    def launch(self, stats: StatsRecorder) -> None:  # noqa: B027 - optional phase
        """Start communication that can overlap the rest of backward; many executors have none."""

    @abstractmethod
    def settle(self, stats: StatsRecorder) -> None:
        """Complete the gradient communication: an all-reduced gradient lands in `param.grad` (the user's
        optimizer or a replicated shard steps it), a served or sharded one is held for `apply`."""

    def apply(self, stats: StatsRecorder) -> None:  # noqa: B027 - optional phase
        """Update what this executor owns with the gradient `settle` held, then share the new values."""

    def applied_gradients(self) -> list[AppliedGradient]:
        """The averaged gradient `apply` will step on this rank, for the global norm; empty when the user's
        optimizer steps this executor's gradients (the norm counts them with its parameters)."""
        return []

    def finish(self, stats: StatsRecorder) -> None:
        """Both phases of the step in turn, for an executor driven on its own (calibration probes)."""
        self.settle(stats)
        self.apply(stats)


@dataclass(frozen=True)
class AppliedGradient:
    """Part of an averaged gradient an executor applies on this rank."""

    param: nn.Parameter
    """The parameter the values belong to."""
    values: torch.Tensor
    """Dense values, or the values of a sparse gradient's rows."""
    owners: int = 1
    """Ranks of the executor's group that apply these same values (a hybrid ZeRO chunk's replicas)."""


class GradReadiness:
    """Counts each executor's ready gradients during backward and launches it when complete."""

    def __init__(self, executors: list[Executor], stats: StatsRecorder) -> None:
        self.executors = executors
        self.stats = stats
        self._by_param: dict[int, list[int]] = {}
        self._needed: list[set[int]] = []
        for index, executor in enumerate(executors):
            ids = {id(p) for p in executor.params}
            self._needed.append(ids)
            for pid in ids:
                self._by_param.setdefault(pid, []).append(index)
        self._ready: list[set[int]] = [set() for _ in executors]
        self._launched = [False] * len(executors)
        self._repeated: str | None = None
        params = {id(p): p for e in executors for p in e.params}
        hook = _weak_hook(self)
        self._handles = [p.register_post_accumulate_grad_hook(hook) for p in params.values()]
        weakref.finalize(self, _remove_handles, self._handles)

    def _on_ready(self, param: nn.Parameter) -> None:
        for index in self._by_param.get(id(param), []):
            if id(param) in self._ready[index]:
                self._repeated = "a gradient became ready twice before optimizer.step()"
                continue
            self._ready[index].add(id(param))
            if self._ready[index] == self._needed[index] and not self._launched[index]:
                self._launch(index)

    def _launch(self, index: int) -> None:
        self._launched[index] = True
        with self.stats.launching():
            self.executors[index].launch(self.stats)

    def settle_all(self) -> None:
        """Launch what backward did not (unused parameters), then settle everything, in list order."""
        if self._repeated is not None:
            raise UnsupportedStrategyError(
                f"{self._repeated}: gradient accumulation over several backward passes per step is not supported yet"
            )
        for index, launched in enumerate(self._launched):
            if not launched:
                self._launch(index)
        for executor in self.executors:
            executor.settle(self.stats)
        self._ready = [set() for _ in self.executors]
        self._launched = [False] * len(self.executors)

    def apply_all(self) -> None:
        """Apply every executor's update, in list order."""
        for executor in self.executors:
            executor.apply(self.stats)

    def remove(self) -> None:
        _remove_handles(self._handles)


def _weak_hook(readiness: GradReadiness) -> Callable[[nn.Parameter], None]:
    """A gradient hook that does not keep `readiness` alive.

    A hook lives in the parameter's C++ autograd metadata, where the garbage collector cannot see it.
    A bound method there closes a cycle (parameter -> hook -> executors -> parameter) that is never
    collected: the runtime, its buffers and its process groups leak until the interpreter exits, and
    gloo groups torn down that late can abort the process after a clean run."""
    ref = weakref.ref(readiness)

    def on_ready(param: nn.Parameter) -> None:
        target = ref()
        if target is not None:
            target._on_ready(param)

    return on_ready


def _remove_handles(handles: list) -> None:
    for handle in handles:
        handle.remove()
