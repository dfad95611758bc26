"""Turn a workload spec into a model, a batch maker, a loss and an optimizer, on one rank.

Every rank builds the same model from the same seed, so replicas start identical before the
strategy is applied; each rank then draws its own batches from a seed derived from (seed, rank,
step), so a trial is reproducible rank by rank.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stratagem.errors import InvalidDocumentError, Problem
from stratagem.ir import Strategy
from stratagem.runtime.context_parallel import context_shard
from stratagem.runtime.hybrid import needs_mesh
from stratagem.runtime.mesh_layout import context_parallel_rank
from stratagem.runtime.multi_optimizer import MultiOptimizer
from trial_runner.replay import ReplayModel, replay_batch_maker, replay_loss
from trial_runner.workloads import ZOO_ALLOW_LIST, FaultWorkload, ReplayWorkload, ZooWorkload

ABSURD_ALLOCATION_BYTES = 1 << 50
"""A petabyte: refused by any allocator, so the `oom` fault exercises the real failure path."""


@dataclass
class BuiltWorkload:
    model: nn.Module
    make_batch: Callable[[int], tuple[torch.Tensor, ...]]
    batch_size: int
    loss: Callable[[Any], torch.Tensor]
    optimizer_kind: str
    before_step: Callable[[int, int], None] = field(default=lambda step, rank: None)
    """Called with (step, rank) before every step; faults strike here."""


def derive_seed(seed: int, rank: int, step: int) -> int:
    """A 63-bit seed that depends on all three and on nothing else (no Python hash randomisation)."""
    digest = hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def batch_for(
    built: BuiltWorkload, *, seed: int, rank: int, step: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(derive_seed(seed, rank, step))
    batch = built.make_batch(built.batch_size)
    if isinstance(batch, torch.Tensor):
        batch = (batch,)
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)


def rank_batch(
    built: BuiltWorkload, strategy: Strategy, *, seed: int, rank: int, step: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """`rank`'s batch at `step`. With context parallelism the ranks of one context group train on the same
    samples (drawn from the seed of the group's first rank), each on its positions of every sequence."""
    index, size = context_parallel_rank(strategy, rank)
    if size == 1:
        return batch_for(built, seed=seed, rank=rank, step=step, device=device)
    first = rank - index * strategy.effective_mesh.tensor
    return context_shard(strategy, rank, *batch_for(built, seed=seed, rank=first, step=step, device=device))


PRIMING_STEP = -1
"""The step number whose batch primes the optimizer state: never one of the trial's own steps."""


def prime_optimizer_state(
    built: BuiltWorkload, optimizer: torch.optim.Optimizer, strategy: Strategy, *, seed: int, device: torch.device
) -> bool:
    """Take one undistributed step so the timed steps see steady-state optimizer state; False when skipped.

    Adam's update takes the square root of its second moment, and on these CPUs the square root of
    an exact zero is several times slower than of any other value (benchmarks/zero_state_update.py).
    A top-k compressor leaves most gradient entries at zero for the first hundreds of steps, so a
    short trial would time Adam over mostly-zero state, a transient long training never sees. One
    dense step fills that state for every strategy alike. Every rank steps on rank 0's batch, so
    replicas stay identical. Meshes are skipped: tensor parallelism refuses an optimizer that
    already holds state for the parameters it splits.
    """
    if needs_mesh(strategy):
        return False
    batch = batch_for(built, seed=seed, rank=0, step=PRIMING_STEP, device=device)
    optimizer.zero_grad(set_to_none=True)
    built.loss(built.model(*batch)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return True


def build_workload(workload: ZooWorkload | ReplayWorkload | FaultWorkload, *, seed: int, rank: int) -> BuiltWorkload:
    """Build on the CPU with the shared seed; the caller moves the model to its device."""
    if isinstance(workload, FaultWorkload):
        return _build_fault(workload, seed=seed, rank=rank)
    torch.manual_seed(seed)
    if isinstance(workload, ReplayWorkload):
        return BuiltWorkload(
            model=ReplayModel(workload.graph),
            make_batch=replay_batch_maker(workload.graph),
            batch_size=workload.batch_size,
            loss=replay_loss,
            optimizer_kind=workload.optimizer,
        )
    model, make_batch = _zoo_builder(workload.name)(size=workload.size, **workload.overrides)
    return BuiltWorkload(
        model=model,
        make_batch=make_batch,
        batch_size=workload.batch_size,
        loss=output_loss,
        optimizer_kind=workload.optimizer,
    )


def _zoo_builder(name: str) -> Callable[..., tuple[nn.Module, Callable[[int], tuple[torch.Tensor, ...]]]]:
    if name not in ZOO_ALLOW_LIST:
        raise InvalidDocumentError([Problem("workload.name", f"unknown zoo model {name!r}")], document="workload")
    module_name, function = ZOO_ALLOW_LIST[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InvalidDocumentError(
            [Problem("workload.name", f"the zoo ({module_name}) is not importable on this worker: {error}")],
            document="workload",
        ) from None
    return getattr(module, function)


def output_loss(output: Any) -> torch.Tensor:
    """The zoo's models return their loss; anything else is reduced to a scalar that reaches every output."""
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(())
    if isinstance(output, torch.Tensor):
        return output.float().square().mean() if output.is_floating_point() else torch.zeros(())
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        losses = [output_loss(item) for item in output]
        return sum(losses[1:], losses[0]) if losses else torch.zeros(())
    raise InvalidDocumentError(
        [Problem("workload", f"the model returned {type(output).__name__}, not tensors")], document="workload"
    )


def _build_fault(workload: FaultWorkload, *, seed: int, rank: int) -> BuiltWorkload:
    strikes_here = workload.rank is None or workload.rank == rank
    if strikes_here and workload.step is None:
        strike(workload.fault)
    built = build_workload(workload.inner, seed=seed, rank=rank)
    if strikes_here:

        def before_step(step: int, _rank: int) -> None:
            if step == workload.step:
                strike(workload.fault)

        built.before_step = before_step
    return built


def strike(fault: str) -> None:
    """Fail the way a real trial fails: an exception, a stall, an allocator refusal, a dead process."""
    if fault == "raise":
        raise RuntimeError("injected fault: this rank raised on purpose")
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "oom":
        torch.empty(ABSURD_ALLOCATION_BYTES, dtype=torch.uint8)
    if fault == "exit":
        os._exit(17)


SPARSE_CAPABLE = ("sgd", "momentum", "adagrad")
"""Optimizer kinds whose torch optimizer applies sparse gradients itself."""

SPARSE_ADAM_KINDS = ("adam", "adamw", "lamb")
"""Kinds whose sparse tables train with `torch.optim.SparseAdam` beside the dense optimizer, as DLRM does
(torch's Adam refuses sparse gradients). SparseAdam has no weight decay: AdamW's decay reaches the dense part only."""


def make_optimizer(kind: str, model: nn.Module, *, lr: float = 1e-3) -> torch.optim.Optimizer:
    """The torch optimizer for an IR optimizer kind; `lamb` has none in torch, AdamW stands in.

    An Adam-family kind on a model with sparse embeddings is a `MultiOptimizer`: SparseAdam for the
    sparse tables, the requested optimizer for everything else.
    """
    sparse = sparse_parameters(model)
    _check_sparse_capable(kind, sparse)
    if sparse and kind in SPARSE_ADAM_KINDS:
        sparse_ids = {id(p) for p in sparse.values()}
        dense = [p for p in model.parameters() if p.requires_grad and id(p) not in sparse_ids]
        parts: list[torch.optim.Optimizer] = [torch.optim.SparseAdam(list(sparse.values()), lr=lr)]
        if dense:
            parts.append(_dense_optimizer(kind, dense, lr=lr))
        return MultiOptimizer(parts)
    return _dense_optimizer(kind, [p for p in model.parameters() if p.requires_grad], lr=lr)


def _dense_optimizer(kind: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind in ("adamw", "lamb"):
        return torch.optim.AdamW(params, lr=lr)
    raise InvalidDocumentError([Problem("workload.optimizer", f"unknown optimizer {kind!r}")], document="workload")


def sparse_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Trainable weights of embeddings built with sparse=True (their gradients are sparse), by name."""
    found: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag) and module.sparse and module.weight.requires_grad:
            found[f"{name}.weight" if name else "weight"] = module.weight
    return found


def _check_sparse_capable(kind: str, sparse: dict[str, torch.Tensor]) -> None:
    """Refuse up front what torch would refuse at the first step, naming the variable and the way out."""
    if not sparse or kind in SPARSE_CAPABLE or kind in SPARSE_ADAM_KINDS:
        return
    variable = next(iter(sparse))
    raise InvalidDocumentError(
        [
            Problem(
                "workload.optimizer",
                (
                    f"{kind} cannot apply the sparse gradient of {variable!r} (an embedding with sparse=True); "
                    f"train such a model with one of {', '.join(SPARSE_CAPABLE + SPARSE_ADAM_KINDS)}"
                ),
            )
        ],
        document="workload",
    )
