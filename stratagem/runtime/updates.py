"""Updates applied outside the user's optimizer: master copies stepped by clones of it.

A parameter server updates only the variables it serves, a ZeRO rank only its slice, so each keeps
master copies of those pieces and runs an optimizer of the user's class over them, built from the
hyper-parameters of the param group the original parameter belongs to. Hyper-parameters are copied
again before every step, so a learning-rate scheduler attached to the returned optimizer reaches the
clones too. For elementwise optimizers (SGD, Adam, ...) this is exactly the whole-tensor update;
`plan` refuses slicing anything else.

The master of a 16-bit value (a `bf16` model's) is fp32, and so is its optimizer state: an update
smaller than half a bf16 step (2^-9 of the value) would otherwise round away every step, which is why
Megatron-LM and DeepSpeed keep fp32 masters and why the simulator prices them (`simulator.precision`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import torch

from stratagem.errors import UnsupportedStrategyError
from stratagem.runtime.comm import flatten, unflatten
from stratagem.runtime.multi_optimizer import owning_optimizer
from stratagem.runtime.plan import Piece


def clone_optimizer(
    optimizer: torch.optim.Optimizer, group_index: int, tensors: list[torch.Tensor]
) -> torch.optim.Optimizer:
    """An optimizer of the user's class over `tensors`, with one param group's hyper-parameters.

    For a `MultiOptimizer` the class is that of the part owning the group (SparseAdam for a table)."""
    hyper = {k: v for k, v in optimizer.param_groups[group_index].items() if k != "params"}
    owner = owning_optimizer(optimizer, group_index)
    try:
        optimizer_class: Callable[..., torch.optim.Optimizer] = type(owner)
        return optimizer_class([{"params": tensors, **hyper}])
    except (TypeError, ValueError) as error:
        raise UnsupportedStrategyError(
            f"cannot rebuild {type(owner).__name__} for server or shard updates: {error}"
        ) from None


_SKIPPING: ContextVar[bool] = ContextVar("stratagem_skipping_updates", default=False)


@contextlib.contextmanager
def skipping_updates(skip: bool) -> Iterator[None]:
    """Inside it (when `skip`), master updates do nothing: a step whose scaled fp16 gradients overflowed
    still completes every executor's communication, so collectives stay matched, but changes no value."""
    token = _SKIPPING.set(skip)
    try:
        yield
    finally:
        _SKIPPING.reset(token)


_SCALE: ContextVar[torch.Tensor | None] = ContextVar("stratagem_update_scale", default=None)


@contextlib.contextmanager
def scaling_updates(coefficient: torch.Tensor | None) -> Iterator[None]:
    """Inside it (when `coefficient` is given), master updates step with their gradients times it: the
    clipping coefficient, which reaches gradients a server or ZeRO rank applies only here (`clipping.py`)."""
    token = _SCALE.set(coefficient)
    try:
        yield
    finally:
        _SCALE.reset(token)


def _sync_hyperparameters(source: dict, target: dict) -> None:
    for key, value in source.items():
        if key != "params":
            target[key] = value


HALF_DTYPES = (torch.bfloat16, torch.float16)


def master_copy(value: torch.Tensor) -> torch.Tensor:
    """A master copy of `value`: fp32 for a 16-bit value, else the value's own dtype."""
    detached = value.detach()
    return detached.float() if detached.dtype in HALF_DTYPES else detached.clone()


class MasterUpdater:
    """Master copies of some tensors and the optimizer clones that step them.

    `group_indices[i]` is the user's param group whose hyper-parameters apply to `values[i]`.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        group_indices: list[int],
        values: list[torch.Tensor],
        *,
        flat: bool = False,
    ) -> None:
        self.optimizer = optimizer
        self.flat: torch.Tensor | None = None
        """With `flat` (one dtype), the masters are views of this one buffer, which a server can send as
        it is instead of flattening its masters again every step."""
        if flat:
            self.flat = flatten([master_copy(v) for v in values])
            self.masters = unflatten(self.flat, [v.shape for v in values])
        else:
            self.masters = [master_copy(v) for v in values]
        by_group: dict[int, list[torch.Tensor]] = {}
        for group_index, master in zip(group_indices, self.masters, strict=True):
            by_group.setdefault(group_index, []).append(master)
        self.clones = {gi: clone_optimizer(optimizer, gi, tensors) for gi, tensors in by_group.items()}

    def step(self, grads: Sequence[torch.Tensor | None]) -> None:
        """One optimizer step of every master with the given gradients (dense or sparse; None skips one)."""
        if _SKIPPING.get():
            return
        scale = _SCALE.get()
        for master, grad in zip(self.masters, grads, strict=True):
            if grad is not None and grad.dtype != master.dtype:
                grad = grad.to(master.dtype)
            master.grad = grad if grad is None or scale is None else grad * scale
        for gi, clone in self.clones.items():
            _sync_hyperparameters(self.optimizer.param_groups[gi], clone.param_groups[0])
            clone.step()
        for master in self.masters:
            master.grad = None


class ReplicatedShards:
    """All-reduced shards of a parameter whose other shards live on servers: every rank updates them."""

    kind = "allreduce"

    def __init__(self, optimizer: torch.optim.Optimizer, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.updater = MasterUpdater(optimizer, [p.group_index for p in pieces], [p.value() for p in pieces])

    def step(self) -> None:
        self.updater.step([piece.grad().clone() for piece in self.pieces])
        with torch.no_grad():
            for piece, master in zip(self.pieces, self.updater.masters, strict=True):
                piece.value().copy_(master)
