"""`distribute`: run a Strategy inside an initialized process group. Composes the executors; owns none.

Order of composition, and why:
1. `refuse_unrunnable`, then `resolve_plan`, before any collective: a strategy the runtime cannot
   execute on these devices (or clip, given `max_grad_norm`) is refused on every rank alike, with the
   reason (and the variable's name), and no rank is left waiting in a collective.
2. Place the model on the replica's kind of device (in bf16 for `bf16`, its Linears converted for
   `fp8`), then broadcast rank 0's parameters and buffers, so every rank (and every server's master
   copy, made next) starts from the same values, as DDP does.
3. The strategy's precision around the model's forward (`runtime/precision.py`), then the executors
   (`compose.apply_synchronization`, which explains their order) behind one DistributedOptimizer
   wrapping the user's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import AllReduceSynchronizer, Strategy, parse_device
from stratagem.runtime.clipping import GradClipper, Holders, check_max_grad_norm, clipping_refusal
from stratagem.runtime.comm import Comm, flatten, unflatten
from stratagem.runtime.compile import apply_compile
from stratagem.runtime.compose import apply_synchronization
from stratagem.runtime.hybrid import distribute_mesh, needs_mesh
from stratagem.runtime.optimizer import DistributedOptimizer
from stratagem.runtime.plan import resolve_plan
from stratagem.runtime.precision import (
    LossScaler,
    apply_precision_forward,
    async_tensor_parallel_refusal,
    convert_fp8,
    half_parameters,
    precision_refusal,
    set_matmul_precision,
)

if TYPE_CHECKING:
    from stratagem.runtime.pipeline_parallel import LossFn


def distribute(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    strategy: Strategy | str | Path,
    *,
    rank: int | None = None,
    process_group: dist.ProcessGroup | None = None,
    loss_fn: LossFn | None = None,
    max_grad_norm: float | None = None,
) -> tuple[nn.Module, DistributedOptimizer]:
    """Make `model` and `optimizer` train under `strategy` on this rank; train with them as usual.

    Each rank feeds its own slice of the global batch; gradients are averaged over ranks, so N ranks
    on N slices compute what one process computes on the whole batch. With a tensor, pipeline or context
    mesh the slice is the data-parallel group's (`data_parallel_rank`; with a context degree each rank then
    keeps its positions of each sequence, `context_shard`), and a pipelined strategy returns a
    `PipelinedModel` trained with `model.train_step(*inputs, target=...)` and `loss_fn(output, target)`.
    With `max_grad_norm` every step clips the averaged gradient to that global L2 norm, as
    `torch.nn.utils.clip_grad_norm_` would on one process (`clipping.py`); the optimizer's
    `last_grad_norm` is the norm before clipping. Clipping the local gradients before `optimizer.step()`
    would not do: they are not averaged yet, and servers and ZeRO shards update inside the step.
    """
    max_grad_norm = check_max_grad_norm(max_grad_norm)
    if not dist.is_available() or not dist.is_initialized():
        raise UnsupportedStrategyError(
            "no process group: call stratagem.runtime.init_from_env() or torch.distributed.init_process_group() first"
        )
    strategy = load_strategy(strategy) if isinstance(strategy, str | Path) else strategy
    refuse_unrunnable(strategy, max_grad_norm=max_grad_norm)
    world_size, me = dist.get_world_size(process_group), dist.get_rank(process_group)
    if rank is not None and rank != me:
        raise UnsupportedStrategyError(f"rank {rank} was given but this process is rank {me} of its process group")
    if needs_mesh(strategy):
        if process_group is not None and world_size != dist.get_world_size():
            raise UnsupportedStrategyError(
                "a tensor, pipeline or context mesh spans the default process group; pass process_group=None"
            )
        device = place_model(model, strategy.replicas[me])
        prepare_numerics(model, strategy, device)
        return distribute_mesh(
            model,
            optimizer,
            strategy,
            rank=me,
            world_size=world_size,
            device=device,
            loss_fn=loss_fn,
            broadcast=broadcast_module,
            max_grad_norm=max_grad_norm,
        )
    plan = resolve_plan(model, optimizer, strategy, world_size=world_size, rank=me)
    device = place_model(model, strategy.replicas[me])
    prepare_numerics(model, strategy, device)
    comm = Comm(process_group, rank=me, node_of_rank=plan.node_of_rank, node_groups=plan.needs_node_groups)
    broadcast_module(model, comm)
    scaler = LossScaler(device, group=process_group) if strategy.precision == "amp-fp16" else None
    if scaler is not None:
        scaler.watch(model.parameters())
    apply_precision_forward(model, strategy, device, scaler)
    if strategy.compile:
        apply_compile(model)
    clipper = None
    if max_grad_norm is not None:
        holders = Holders(stage_ranks=world_size, group_ranks=world_size)
        clipper = GradClipper(max_grad_norm, holders=holders, group=process_group, device=device)
    return model, apply_synchronization(plan, optimizer, comm=comm, device=device, scaler=scaler, clipper=clipper)


def refuse_unrunnable(strategy: Strategy, *, max_grad_norm: float | None = None) -> None:
    """Knobs of the strategy document that cannot run on its devices here, and clipping a strategy whose
    steps have no one gradient, are refused on every rank alike (the reason depends on the replicas, not
    on the rank), before any collective, never ignored."""
    kinds = {parse_device(replica)[1] for replica in strategy.replicas}
    kind = "CPU" if "CPU" in kinds else "GPU"
    reasons = []
    precision = precision_refusal(strategy, kind)
    if precision is not None:
        reasons.append(precision)
    async_tp = async_tensor_parallel_refusal(strategy, kind)
    if async_tp is not None:
        reasons.append(async_tp)
    if strategy.precision == "amp-fp16" and any(
        isinstance(s, AllReduceSynchronizer) and s.compressor.kind != "none" and s.compressor.error_feedback
        for c in strategy.variables
        for s in c.synchronizers
    ):
        reasons.append(
            "precision 'amp-fp16' with a compressor that keeps error feedback: a step whose scaled gradients "
            "overflowed would leave inf in the error buffer for every later step (use error_feedback false)"
        )
    clipping = clipping_refusal(strategy) if max_grad_norm is not None else None
    if clipping is not None:
        reasons.append(clipping)
    if reasons:
        raise UnsupportedStrategyError("; ".join(reasons))


def prepare_numerics(model: nn.Module, strategy: Strategy, device: torch.device) -> None:
    """The model's own numerics, before its values are broadcast: TF32 on CUDA, bf16 parameters, fp8 Linears."""
    set_matmul_precision(strategy, device)
    half_parameters(model, strategy)
    if strategy.precision == "fp8":
        convert_fp8(model, fp8_all_gather=strategy.fp8_all_gather)


def load_strategy(path: str | Path) -> Strategy:
    """A strategy file, validated (InvalidStrategyError with field paths when it is not one)."""
    return Strategy.load(path)


def place_model(model: nn.Module, replica: str) -> torch.device:
    """Keep a model that the caller already put on a device of the replica's kind; else move it there.

    Which GPU a rank uses is the launcher's business (torchrun's LOCAL_RANK, Ray's visible device);
    the strategy only says GPU or CPU, so a model already on a GPU stays where the caller put it.
    """
    kind = parse_device(replica)[1]
    current = next(iter(model.parameters()), torch.empty(0)).device
    if (kind == "GPU") == (current.type == "cuda"):
        return current
    device = replica_device(replica)
    model.to(device)
    return device


def replica_device(device_name: str) -> torch.device:
    """The torch device a replica name means in this process.

    `address:GPU:k` is `cuda:k`, unless the process sees exactly one GPU (a scheduler such as Ray
    gave it one through CUDA_VISIBLE_DEVICES), which is then the replica's GPU.
    """
    _, kind, index = parse_device(device_name)
    if kind == "CPU":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UnsupportedStrategyError(f"replica {device_name!r} is a GPU but this process has no CUDA device")
    count = torch.cuda.device_count()
    if index < count:
        device = torch.device("cuda", index)
    elif count == 1:
        device = torch.device("cuda", 0)
    else:
        raise UnsupportedStrategyError(f"replica {device_name!r}: this process sees {count} GPUs, not GPU {index}")
    torch.cuda.set_device(device)
    return device


@torch.no_grad()
def broadcast_module(model: nn.Module, comm: Comm) -> None:
    """Rank 0's parameters and buffers on every rank, one broadcast per dtype."""
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.numel()]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = flatten([t.detach() for t in group])
        comm.world.broadcast(flat, 0)
        for t, value in zip(group, unflatten(flat, [t.shape for t in group]), strict=True):
            t.copy_(value)
