"""Peak memory of the fullest replica device, whether the candidate fits, and the optimizer's work.

Per device: parameters + gradients + optimizer state + activations in flight.

- Tensor parallelism divides split layers' variables by the tensor degree, and the activations of
  layers that read sharded activations (`context.layer_sharded_input`); the inputs of column-parallel
  matmuls, norms and residuals stay whole on every rank (Megatron without sequence parallelism).
- Without a pipeline, m micro-batches (gradient accumulation) hold one micro-batch's activations.
- With activation recomputation a numbered block keeps only its input (per micro-batch in flight),
  plus, once, the largest block's activations rebuilt during its backward.
- Sharded (ZeRO-2 style) variables keep full parameters but 1/data of gradients and optimizer state.
- PS variables keep a parameter copy and a gradient on every worker (the forward needs the weights and
  backward produces the gradient before the push); their optimizer state lives on the server. A server
  that is also a replica adds what it holds (parameters and state of its shards) to its own peak; any
  other server (typically a node's CPU) must fit what it holds in its own memory.
- With a pipeline each device holds its stage only; activations in flight are the stage's activations
  for min(m, p - s) micro-batches under 1F1B (m under GPipe), each 1/m of the per-replica batch.
- Frozen (non-trainable) variables count as parameters.

The optimizer update streams each variable's parameters, gradient and state through memory on the
device that owns it: workers for all-reduce variables, 1/data of it for sharded ones, the server for PS;
and it pays the kind's `optimizer_tensor_s` for each tensor it steps (a variable, or a flat shard).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.context import SimContext
from simulator.encoding import CandidateBatch, Schedule, SyncKind
from simulator.pipeline import ComputePhase, block_peak
from simulator.topology import Topology
from simulator.variables import UPDATE_PARAM_PASSES, UPDATE_STATE_PASSES

# Columns of the per-variable figures summed by synchronizer kind.
PARAM_SPLIT, PARAM_REST, STATE_SPLIT, STATE_REST, UPDATE_SPLIT, UPDATE_REST = range(6)


def variable_columns(context: SimContext) -> np.ndarray:
    """[V, 4] parameter and optimizer-state bytes, each for tensor-split and unsplit variables, and [V, 6]
    with update bytes where those differ from parameter and state bytes (`context.update_per_variable`)."""
    split = context.var_tensor_split
    figures = (context.var_bytes, context.var_state_bytes) + (
        (context.var_update_bytes,) if context.update_per_variable else ()
    )
    return np.stack([c * f for c in figures for f in (split, ~split)], axis=1)


@dataclass
class KindSums:
    """Per candidate, the `variable_columns` summed over all, PS and sharded variables."""

    total: np.ndarray
    ps: np.ndarray
    sharded: np.ndarray
    ps_count: np.ndarray
    """[N] PS variables (their updates run on the servers)."""
    sharded_count: np.ndarray
    """[N] sharded variables (updated as one flat shard)."""

    @classmethod
    def of(cls, context: SimContext, batch: CandidateBatch, ps_rows: np.ndarray, ps_vars: np.ndarray) -> KindSums:
        """Sums over the flat PS entries (sorted by row) and the sharded ones; no [N, V] float work."""
        n = len(batch)
        columns = variable_columns(context)
        sharded_rows, sharded_vars = np.divmod(np.flatnonzero(batch.kind == SyncKind.SHARDED), context.num_variables)
        return cls(
            columns.sum(axis=0),
            _row_sums(columns, ps_rows, ps_vars, n),
            _row_sums(columns, sharded_rows, sharded_vars, n),
            np.bincount(ps_rows, minlength=n).astype(np.float64),
            np.bincount(sharded_rows, minlength=n).astype(np.float64),
        )

    def owned(self, split: int, rest: int, tensor: np.ndarray, data: np.ndarray) -> np.ndarray:
        """Bytes of a column pair on one worker, excluding PS variables, sharded ones over data."""
        local_split = self.total[split] - self.ps[:, split] - self.sharded[:, split]
        local_rest = self.total[rest] - self.ps[:, rest] - self.sharded[:, rest]
        return local_split / tensor + local_rest + (self.sharded[:, split] / tensor + self.sharded[:, rest]) / data


def _row_sums(columns: np.ndarray, rows: np.ndarray, variables: np.ndarray, n: int) -> np.ndarray:
    """[n, C] sum of `columns[variables]` per row."""
    out = np.zeros((n, columns.shape[1]))
    for c in range(columns.shape[1]):
        out[:, c] = np.bincount(rows, weights=columns[:, c].take(variables), minlength=n)
    return out


@dataclass
class MemoryPhase:
    peak: np.ndarray
    """[N] bytes on the fullest replica device."""
    capacity: np.ndarray
    server_over: np.ndarray
    """[N] bytes by which the fullest non-replica server exceeds its memory (0 when it fits)."""
    feasible: np.ndarray


def memory_phase(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase, sums: KindSums, held: np.ndarray
) -> MemoryPhase:
    data = batch.data.astype(np.float64)
    tensor = batch.tensor.astype(np.float64)
    params = sums.total[PARAM_SPLIT] / tensor + sums.total[PARAM_REST]
    sharded_params = sums.sharded[:, PARAM_SPLIT] / tensor + sums.sharded[:, PARAM_REST]
    grads = params - sharded_params * (1 - 1 / data)
    state = sums.owned(STATE_SPLIT, STATE_REST, tensor, data)
    frozen_split = (context.layer_frozen_bytes * context.layer_tensor_split).sum()
    frozen_rest = context.layer_frozen_bytes.sum() - frozen_split
    acts = _flat_activations(context, batch, tensor) / batch.micro_batches
    peak = params + grads + state + frozen_split / tensor + frozen_rest + acts
    if compute.piped.size:
        peak[compute.piped] = _pipelined_peak(context, batch, compute)

    replicas = batch.replicas
    peak = peak + np.where(replicas, held, 0.0).max(axis=1)
    device_capacity = context.kinds.memory_bytes[context.device_kind]
    server_over = np.maximum(np.where(replicas, 0.0, held - device_capacity).max(axis=1), 0.0)
    return MemoryPhase(
        peak=peak,
        capacity=topo.capacity,
        server_over=server_over,
        feasible=(peak <= topo.capacity) & (server_over == 0),
    )


def update_bytes(context: SimContext, batch: CandidateBatch, compute: ComputePhase, sums: KindSums) -> np.ndarray:
    """[N] bytes the optimizer streams on the busiest worker (the slowest stage's, with a pipeline)."""
    tensor, data = batch.tensor.astype(np.float64), batch.data.astype(np.float64)
    if context.update_per_variable:
        out = sums.owned(UPDATE_SPLIT, UPDATE_REST, tensor, data)
    else:
        out = UPDATE_PARAM_PASSES * sums.owned(
            PARAM_SPLIT, PARAM_REST, tensor, data
        ) + UPDATE_STATE_PASSES * sums.owned(STATE_SPLIT, STATE_REST, tensor, data)
    rows = compute.piped
    if rows.size:
        per_var = _per_variable(
            context, batch, rows, context.var_update_bytes, ps_share=0.0, sharded_share=1.0 / batch.data[rows, None]
        )
        out[rows] = _per_stage(per_var, compute.piped_var_stage, int(batch.pipeline[rows].max())).max(axis=1)
    return out


def update_tensors(context: SimContext, batch: CandidateBatch, compute: ComputePhase, sums: KindSums) -> np.ndarray:
    """[N] tensors the optimizer steps one at a time on the busiest worker (the slowest stage's, with a
    pipeline): every variable it updates itself, plus one flat shard for its sharded ones."""
    out = context.num_variables - sums.ps_count - sums.sharded_count + (sums.sharded_count > 0)
    rows = compute.piped
    if rows.size:
        own = np.where(batch.kind[rows] == SyncKind.ALLREDUCE, 1.0, 0.0)
        sharded = np.where(batch.kind[rows] == SyncKind.SHARDED, 1.0, 0.0)
        stages = int(batch.pipeline[rows].max())
        per_stage = _per_stage(own, compute.piped_var_stage, stages) + (
            _per_stage(sharded, compute.piped_var_stage, stages) > 0
        )
        out[rows] = per_stage.max(axis=1)
    return out


def _per_variable(
    context: SimContext,
    batch: CandidateBatch,
    rows: np.ndarray,
    figure: np.ndarray,
    *,
    ps_share: float,
    sharded_share: np.ndarray | float,
) -> np.ndarray:
    kind = batch.kind[rows]
    div = np.where(context.var_tensor_split, batch.tensor[rows, None].astype(np.float64), 1.0)
    share = np.where(kind == SyncKind.PS, ps_share, np.where(kind == SyncKind.SHARDED, sharded_share, 1.0))
    return figure / div * share


def _per_stage(per_var: np.ndarray, var_stage: np.ndarray, stages: int) -> np.ndarray:
    n = per_var.shape[0]
    key = (np.arange(n)[:, None] * stages + var_stage).ravel()
    return np.bincount(key, weights=per_var.ravel(), minlength=n * stages).reshape(n, stages)


def _pipelined_peak(context: SimContext, batch: CandidateBatch, compute: ComputePhase) -> np.ndarray:
    rows = compute.piped
    n = rows.size
    S = int(batch.pipeline[rows].max())
    data = batch.data[rows, None].astype(np.float64)
    params = _per_variable(context, batch, rows, context.var_bytes, ps_share=1.0, sharded_share=1.0)
    grads = _per_variable(context, batch, rows, context.var_bytes, ps_share=1.0, sharded_share=1.0 / data)
    state = _per_variable(context, batch, rows, context.var_state_bytes, ps_share=0.0, sharded_share=1.0 / data)
    stage_vars = _per_stage(params + grads + state, compute.piped_var_stage, S)
    layer_key = (np.arange(n)[:, None] * S + batch.layer_stage[rows].astype(np.intp)).ravel()
    frozen = np.bincount(
        layer_key, weights=np.broadcast_to(context.layer_frozen_bytes, (n, context.num_layers)).ravel(), minlength=n * S
    ).reshape(n, S)
    m = batch.micro_batches[rows].astype(np.float64)[:, None]
    p = batch.pipeline[rows].astype(np.float64)[:, None]
    stage = np.arange(S, dtype=np.float64)[None, :]
    in_flight = np.where(batch.schedule[rows, None] == Schedule.GPIPE, m, np.minimum(m, p - stage))
    tensor = batch.tensor[rows, None].astype(np.float64)
    acts = (compute.piped_stage_activations[:, :S] * np.maximum(in_flight, 0.0) + compute.piped_block_peak[:, None]) / m
    return (stage_vars + frozen / tensor + acts).max(axis=1)


def _flat_activations(context: SimContext, batch: CandidateBatch, tensor: np.ndarray) -> np.ndarray:
    """[N] activations held for the whole per-replica batch without a pipeline, per tensor rank. With
    recomputation: the blocks' inputs, whatever lies outside the blocks, and the largest block rebuilt."""
    acts, sharded, recomputed = context.activation_bytes, context.layer_sharded_input, context.layer_recomputed
    whole = (acts * sharded).sum() / tensor + (acts * ~sharded).sum()
    rows = np.flatnonzero(batch.recompute)
    if rows.size == 0:
        return whole
    kept = context.recompute_kept[recomputed].sum()
    outside = (acts * sharded * ~recomputed).sum() / tensor[rows] + (acts * ~sharded * ~recomputed).sum()
    out = np.array(whole, dtype=np.float64)
    for degree in np.unique(tensor[rows]).tolist():
        hit = rows[tensor[rows] == degree]
        out[hit] = (
            kept + outside[tensor[rows] == degree] + block_peak(context, acts / np.where(sharded, degree, 1.0))[0]
        )
    return out
