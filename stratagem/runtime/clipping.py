"""Global gradient-norm clipping (`OptimizerSpec.max_grad_norm`): `torch.nn.utils.clip_grad_norm_` for a
model whose gradients are spread over ranks.

The norm is the whole model's, taken after gradients are averaged and before any update, so it sits
between the executors' two step phases (`executor.py`: every executor settles, then the norm, then
every executor applies). Each rank adds up the squares of the gradient elements it holds, each divided
by the number of ranks holding that same element, and one all-reduce over the world sums them, so
every element counts once:

- what the user's optimizer steps (all-reduced parameters, FSDP2's shards, tensor-parallel splits): every
  rank of a pipeline stage holds it, whole or as its shard (a DTensor's non-Replicate placements say how
  many distinct shards there are);
- what an executor applies (a server's averaged push, a ZeRO rank's chunk): only its owner counts it, and
  every data-parallel group holding the parameter has its own owner (one per tensor rank for a parameter
  no tensor split touches, one per replicate group for a hybrid ZeRO chunk);
- a weight tied across pipeline stages: every stage holding it;
- sparse rows: the values of the coalesced gradient.

The coefficient, min(1, max_norm / (norm + 1e-6)) as torch's, multiplies the gradients the user's
optimizer steps in place and reaches master updates through `updates.scaling_updates`. The norm stays
a device tensor (no host sync) until `DistributedOptimizer.last_grad_norm` is read.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from stratagem.errors import InvalidDocumentError, Problem
from stratagem.ir import PSSynchronizer, Strategy
from stratagem.runtime.executor import Executor
from stratagem.runtime.plan import local_tensor
from stratagem.runtime.stats import StatsRecorder

EPSILON = 1e-6
"""Added to the norm before dividing, as `clip_grad_norm_` does."""


def check_max_grad_norm(value: float | None) -> float | None:
    """`value` when it is None or a positive finite norm; anything else is refused naming the argument."""
    if value is None:
        return None
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or number <= 0:
        raise InvalidDocumentError(
            [Problem("max_grad_norm", f"must be a positive finite norm (or None), got {value!r}")],
            document="distribute arguments",
        )
    return float(number)


def clipping_refusal(strategy: Strategy) -> str | None:
    """Why the strategy's steps cannot be clipped to one global norm, or None."""
    for config in strategy.variables:
        if any(isinstance(s, PSSynchronizer) and not s.sync for s in config.synchronizers):
            return (
                f"max_grad_norm with an asynchronous parameter server ({config.var_name}): ASP applies each "
                "worker's push as its own update, so a step has no one averaged gradient whose norm could be "
                "clipped (use sync true, with staleness for SSP)"
            )
    return None


@dataclass(frozen=True)
class Holders:
    """How many ranks hold the same elements of a gradient, so that a sum over every rank counts each once."""

    stage_ranks: int
    """Ranks of one pipeline stage (the world without a pipeline): each holds the stage's parameters."""
    group_ranks: int
    """Ranks of one data-parallel group, the executors' group."""
    tied: dict[int, int] = field(default_factory=dict)
    """Parameter id -> the pipeline stages holding it, for a weight tied across stages."""

    def ranks(self, param: nn.Parameter) -> int:
        """Ranks holding the elements this rank holds of `param`."""
        return self.stage_ranks * self.tied.get(id(param), 1) // _distinct_shards(param)

    def groups(self, param: nn.Parameter) -> int:
        """Data-parallel groups holding the elements this rank holds of `param`: each applies its own copy."""
        return max(1, self.ranks(param) // self.group_ranks)


def _distinct_shards(tensor: torch.Tensor) -> int:
    """Into how many distinct pieces a DTensor is split over its mesh (1 for any other tensor). Every
    placement but Replicate splits: Shard, and the strided shard FSDP2 lays over a tensor-parallel one
    (which is no Shard)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None or not isinstance(tensor, dtensor.DTensor):
        return 1
    mesh = tensor.device_mesh
    return math.prod(mesh.size(dim) for dim, placement in enumerate(tensor.placements) if not placement.is_replicate())


class GradClipper:
    """The global norm of a step's averaged gradient, over `group`, and the coefficient that clips it."""

    def __init__(
        self, max_norm: float, *, holders: Holders, group: dist.ProcessGroup | None, device: torch.device
    ) -> None:
        self.max_norm = max_norm
        self.holders = holders
        self.group = group
        self.device = device

    def clip(
        self,
        params: list[nn.Parameter],
        mastered: list[tuple[nn.Parameter, torch.Tensor]],
        executors: list[Executor],
        stats: StatsRecorder,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The total norm and the coefficient, after scaling the gradients of `params` (those the user's
        optimizer steps) in place. `mastered` are (parameter, gradient) pairs every rank of the stage steps
        through master copies (16-bit parameters, replicated shards) and `executors` hold what they apply:
        both reach their updates through `MasterUpdater`, which the caller scales with the coefficient."""
        holders = self.holders
        with stats.updating():
            terms = [(p.grad, holders.ranks(p)) for p in params if p.grad is not None]
            terms += [(grad, holders.ranks(param)) for param, grad in mastered]
            for executor in executors:
                terms += [(g.values, g.owners * holders.groups(g.param)) for g in executor.applied_gradients()]
            squares = torch.zeros((), dtype=torch.float32, device=self.device)
            for count, grads in _by_count(terms).items():
                squares += _sum_of_squares(grads) / count
        with stats.waiting("clip"):
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(squares, group=self.group)
        with stats.updating():
            norm = squares.sqrt()
            coefficient = (self.max_norm / (norm + EPSILON)).clamp(max=1.0)
            _scale_in_place([p.grad for p in params if p.grad is not None], coefficient)
        return norm, coefficient


def _by_count(terms: list[tuple[torch.Tensor, int]]) -> dict[int, list[torch.Tensor]]:
    grouped: dict[int, list[torch.Tensor]] = {}
    for grad, count in terms:
        grouped.setdefault(count, []).append(grad)
    return grouped


def _sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """One multi-tensor norm over the gradients, as `clip_grad_norm_` takes it (a loop of small norms costs
    the host a dispatch per tensor: three times the clip on these CPUs); sparse ones by their values."""
    values = [g.coalesce().values() if g.is_sparse else local_tensor(g) for g in grads]
    norms = torch._foreach_norm(values, 2, dtype=torch.float32)
    return torch.stack(norms).square().sum()


def _scale_in_place(grads: list[torch.Tensor], coefficient: torch.Tensor) -> None:
    dense = [local_tensor(g) for g in grads if not g.is_sparse]
    if dense:
        torch._foreach_mul_(dense, coefficient)
    for grad in grads:
        if grad.is_sparse:
            grad.mul_(coefficient.to(grad.dtype))
