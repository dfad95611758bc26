"""ZeRO stage 3 (FSDP's full shard): parameters all-gathered unit by unit in forward and again in backward,
gradients reduce-scattered unit by unit in backward, with one unit prefetched.

A unit is what FSDP wraps: each numbered block and each other top-level module (`context.unit_starts`;
torchtitan calls `fully_shard` per transformer block and on the root). Each unit's parameters are
gathered before its forward; FSDP2 issues the next unit's all-gather when a unit's forward starts
(forward prefetch), so it runs behind that unit's compute. In backward the unit before is gathered when
a unit's backward starts (backward prefetch) and the unit's gradients are reduce-scattered when its
backward ends. All of a rank's FSDP collectives share its links, served in the order they are issued
(one channel, as `simulator.timeline` models every channel). Per micro-batch (FSDP re-gathers each
micro-batch and reduce-scatters each one, torchtitan's default):

    forward:  a unit starts when the unit before has finished and its own gather has landed
    backward: the same in reverse, each unit's reduce-scatter queued after the gather it prefetched

What the channel adds to the compute is exposed; so is the last reduce-scatter's tail. The rest of the
channel's time runs during compute and slows it by (1 - `comm_overlap`) of itself, as every collective
stream does (`engine._stolen`). Under hybrid
sharding each unit's reduce-scatter over the shard group is followed by the all-reduce of its shard
across the groups. Memory: 1/S of parameters, gradients and optimizer state, plus the gathered
parameters of the unit computing and the one prefetched.

With a pipeline the stage's parameters stay gathered through the step (torchtitan turns
`reshard_after_forward` off under pipeline parallelism: re-gathering per micro-batch would multiply
the traffic by m) and its gradients accumulate whole until the last micro-batch (`simulator.memory`),
so stage 3 costs what stage 2 does there and holds what stage 1 does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import collectives
from simulator.context import SimContext
from simulator.encoding import CandidateBatch, SyncKind
from simulator.topology import Topology


@dataclass
class FullShard:
    rows: np.ndarray
    """Candidates (without a pipeline) with ZeRO-3 variables."""
    exposed: np.ndarray
    """[r] seconds per step the gathers and reduce-scatters add to the compute path."""
    working: np.ndarray
    """[r] bytes of gathered parameters alive at once (two consecutive units)."""


def full_shard_rows(batch: CandidateBatch) -> np.ndarray:
    if batch.zero_stage.size == 0 or batch.zero_stage.max() < 3:
        return np.zeros(0, dtype=np.intp)
    stage3 = (batch.kind == SyncKind.SHARDED) & (batch.zero_stage == 3)
    return np.flatnonzero(stage3.any(axis=1) & (batch.pipeline <= 1))


def unit_bytes(context: SimContext, batch: CandidateBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[r, U] bytes per tensor rank of each unit's ZeRO-3 parameters as gathered (the compute dtype) and
    of their gradients (as reduced)."""
    U = context.unit_starts.size
    stage3 = (batch.kind[rows] == SyncKind.SHARDED) & (batch.zero_stage[rows] == 3)
    tensor = batch.tensor[rows, None].astype(np.float64)
    per_rank = context.var_bytes / np.where(context.var_tensor_split, tensor, 1.0)
    precision = batch.precision[rows].astype(np.intp)
    table = context.var_precision
    unit = context.layer_unit.take(context.var_layer)
    key = (np.arange(rows.size)[:, None] * U + unit[None, :]).ravel()

    def per_unit(weights: np.ndarray) -> np.ndarray:
        return np.bincount(key, weights=np.where(stage3, weights, 0.0).ravel(), minlength=rows.size * U).reshape(
            rows.size, U
        )

    gathered = per_rank * table.gathered[precision] * fp8_gather_scale(context, batch.fp8_gather[rows])
    return per_unit(gathered), per_unit(per_rank * table.gradient[precision])


FP8_GATHER_SCALE = 0.5
"""Bytes of an fp8 weight gathered over its bf16 bytes (torchao's `enable_fsdp_float8_all_gather`)."""


def fp8_weights(context: SimContext) -> np.ndarray:
    """[V] the variables torchao's float8 training converts, whose weights FSDP can gather in fp8: the 2-D
    weights of matmul layers with both dimensions multiples of 16 (`stratagem.runtime.precision.convert_fp8`)."""
    by_name = {v.name: v for v in context.graph.variables}
    shapes = [by_name[name].shape for name in context.variable_names]
    linear = context.layer_matmul.take(context.var_layer)
    return linear & np.array([len(shape) == 2 and shape[0] % 16 == 0 and shape[1] % 16 == 0 for shape in shapes])


def fp8_gather_scale(context: SimContext, rows_fp8: np.ndarray) -> np.ndarray | float:
    """[r, V] (or 1.0) what each gathered byte of the rows weighs: half for the fp8 weights of rows that
    gather them in fp8."""
    if not rows_fp8.any():
        return 1.0
    return np.where(rows_fp8[:, None] & fp8_weights(context)[None, :], FP8_GATHER_SCALE, 1.0)


def full_shard(
    context: SimContext,
    batch: CandidateBatch,
    topo: Topology,
    rows: np.ndarray,
    unit_fwd: np.ndarray,
    unit_bwd: np.ndarray,
) -> FullShard:
    """`unit_fwd`, `unit_bwd`: [r, U] seconds of each unit's forward and backward per micro-batch."""
    params, grads = unit_bytes(context, batch, rows)
    gather = _cost(topo.shard_all_gather, rows, params)
    shard = topo.shard_degree[rows, None]
    scatter = _cost(topo.shard_reduce_scatter, rows, grads) + _cost(topo.replicate, rows, grads / shard)
    per_micro = exposed(unit_fwd, unit_bwd, gather, scatter)
    hidden = np.maximum(2 * gather.sum(axis=1) + scatter.sum(axis=1) - per_micro, 0.0)
    per_micro = per_micro + (1.0 - context.kinds.comm_overlap[topo.kind[rows]]) * hidden
    working = params + np.concatenate([params[:, 1:], np.zeros((rows.size, 1))], axis=1)
    return FullShard(rows, per_micro * batch.micro_batches[rows], working.max(axis=1, initial=0.0))


def _cost(pair: tuple[np.ndarray, np.ndarray], rows: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Seconds of one collective per unit; a unit with nothing to move costs nothing."""
    seconds = collectives.cost((pair[0][rows, None], pair[1][rows, None]), nbytes)
    return np.where(nbytes > 0, seconds, 0.0)


def exposed(fwd: np.ndarray, bwd: np.ndarray, gather: np.ndarray, scatter: np.ndarray) -> np.ndarray:
    """[r] seconds one micro-batch's forward and backward take beyond their compute, with one unit
    prefetched and every collective on one channel in issue order ([r, U] inputs, units in forward order)."""
    r, U = fwd.shape
    if U == 0:
        return np.zeros(r)
    channel = gather[:, 0].copy()
    landed = channel.copy()
    clock = np.zeros(r)
    for u in range(U):
        start = np.maximum(clock, landed)
        if u + 1 < U:
            channel = np.maximum(channel, start) + gather[:, u + 1]
            landed = channel
        clock = start + fwd[:, u]
    forward = clock - fwd.sum(axis=1)
    channel = gather[:, U - 1].copy()
    landed = channel.copy()
    clock = np.zeros(r)
    for u in range(U - 1, -1, -1):
        start = np.maximum(clock, landed)
        if u > 0:
            channel = np.maximum(channel, start) + gather[:, u - 1]
            landed = channel
        clock = start + bwd[:, u]
        channel = np.maximum(channel, clock) + scatter[:, u]
    backward = clock - bwd.sum(axis=1)
    return forward + backward + np.maximum(channel - clock, 0.0)
