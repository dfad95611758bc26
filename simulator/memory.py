"""Peak memory of the fullest replica device, whether the candidate fits, and the optimizer's work.

Per device: parameters + gradients + optimizer state + activations in flight.

- Tensor parallelism divides split layers' variables by the tensor degree; activations follow
  `simulator.activations` (tensor, sequence and context parallelism, precision, recomputation).
- Without a pipeline, m micro-batches (gradient accumulation) hold one micro-batch's activations.
- Precision sets the bytes of each state (`simulator.precision`): the captured dtype for `fp32` and
  `tf32`; fp32 parameters and gradients plus the half weight copies autocast saves for `amp-*`;
  16-bit parameters and gradients with an fp32 master copy kept beside the optimizer state for `bf16`
  and `fp8`.
- Sharded variables (ZeRO, over S = shard group (or data) × context ranks): stage 1 keeps 1/S of the
  optimizer state (master copy included), stage 2 also 1/S of the gradients, stage 3 also 1/S of the
  parameters plus the two units it has gathered (`simulator.fsdp`).
- Under a pipeline a rank holds its chunks' whole gradients at every ZeRO stage: the schedule
  accumulates each micro-batch's gradient unsharded and reduces once after the last
  (torch.distributed.pipelining's `backward_maybe_with_nosync` turns FSDP2's gradient sync and its
  resharding off until then, and FSDP2 keeps the sum at the gradient's precision), and stage 3's
  parameters stay gathered (`simulator.fsdp`). So pipelined ZeRO 2 and 3 hold what ZeRO 1 does, their
  parameters whole.
- PS variables keep a parameter copy and a gradient on every worker (the forward needs the weights and
  backward produces the gradient before the push); their optimizer state lives on the server. A server
  that is also a replica adds what it holds (parameters and state of its shards) to its own peak; any
  other server (typically a node's CPU) must fit what it holds in its own memory.
- With a pipeline each device holds its rank's chunks only; activations in flight are the rank's
  activations for the micro-batches its schedule keeps (`simulator.schedules.in_flight`), each 1/m of
  the per-replica batch.
- Frozen (non-trainable) variables count as parameters.

The optimizer update streams each variable's parameters, gradient and state through memory on the
device that owns it: workers for all-reduce variables, 1/S of it for sharded ones, the server for PS;
and it pays the kind's `optimizer_tensor_s` for each tensor it steps (a variable, or a flat shard).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator import activations, schedules
from simulator.context import SimContext
from simulator.devices import CLIP_PASSES, UPDATE_PARAM_PASSES, UPDATE_STATE_PASSES
from simulator.encoding import CandidateBatch, Precision, SyncKind
from simulator.pipeline import ComputePhase, block_peak
from simulator.precision import LOSS_SCALED, UNSCALE_PASSES
from simulator.topology import Topology

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
    stage1: np.ndarray | None = None
    """[N, C] sharded variables at ZeRO stage 1 (None when there are none)."""
    stage3: np.ndarray | None = None
    """[N, C] sharded variables at ZeRO stage 3 of candidates without a pipeline (None when none)."""

    @classmethod
    def of(cls, context: SimContext, batch: CandidateBatch, ps_rows: np.ndarray, ps_vars: np.ndarray) -> KindSums:
        """Sums over the flat PS entries (sorted by row) and the sharded ones; no [N, V] float work."""
        n = len(batch)
        columns = variable_columns(context)
        sharded = np.flatnonzero(batch.kind == SyncKind.SHARDED)
        sharded_rows, sharded_vars = np.divmod(sharded, context.num_variables)
        sums = cls(
            columns.sum(axis=0),
            _row_sums(columns, ps_rows, ps_vars, n),
            _row_sums(columns, sharded_rows, sharded_vars, n),
            np.bincount(ps_rows, minlength=n).astype(np.float64),
            np.bincount(sharded_rows, minlength=n).astype(np.float64),
        )
        stage = batch.zero_stage.ravel().take(sharded)
        if (stage != 2).any():
            flat = batch.pipeline.take(sharded_rows) <= 1
            for name, mask in (("stage1", stage == 1), ("stage3", (stage == 3) & flat)):
                if mask.any():
                    setattr(sums, name, _row_sums(columns, sharded_rows[mask], sharded_vars[mask], n))
        return sums

    def owned(self, split: int, rest: int, tensor: np.ndarray, shards: np.ndarray) -> np.ndarray:
        """Bytes of a column pair on one worker, excluding PS variables, sharded ones over `shards`."""
        local_split = self.total[split] - self.ps[:, split] - self.sharded[:, split]
        local_rest = self.total[rest] - self.ps[:, rest] - self.sharded[:, rest]
        return local_split / tensor + local_rest + (self.sharded[:, split] / tensor + self.sharded[:, rest]) / shards


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
    """[N] bytes that device's live tensors may take: its memory less what the process holds outside
    them (`reserved_memory_bytes`), over one plus the caching allocator's share (`allocator_overhead`)."""
    server_over: np.ndarray
    """[N] bytes by which the fullest non-replica server exceeds its memory (0 when it fits)."""
    feasible: np.ndarray


def memory_phase(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase, sums: KindSums, held: np.ndarray
) -> MemoryPhase:
    tensor = batch.tensor.astype(np.float64)
    shards = topo.shard_degree
    params = sums.total[PARAM_SPLIT] / tensor + sums.total[PARAM_REST]
    sharded_params = sums.sharded[:, PARAM_SPLIT] / tensor + sums.sharded[:, PARAM_REST]
    grads = params - sharded_params * (1 - 1 / shards)
    state = sums.owned(STATE_SPLIT, STATE_REST, tensor, shards)
    frozen_split = (context.layer_frozen_bytes * context.layer_tensor_split).sum()
    frozen = frozen_split / tensor + context.layer_frozen_bytes.sum() - frozen_split
    acts = _flat_activations(context, batch, tensor, _gpu_saves_less(context)[topo.kind]) / batch.micro_batches
    if sums.stage1 is not None:
        stage1 = sums.stage1[:, PARAM_SPLIT] / tensor + sums.stage1[:, PARAM_REST]
        grads = grads + stage1 * (1 - 1 / shards)
    if sums.stage3 is not None:
        stage3 = sums.stage3[:, PARAM_SPLIT] / tensor + sums.stage3[:, PARAM_REST]
        params = params - stage3 * (1 - 1 / shards)
    scaled = np.flatnonzero(batch.precision > Precision.TF32)
    if scaled.size:
        params, grads, state, frozen = _precision_state(context, batch, scaled, shards, (params, grads, state, frozen))
    peak = params + grads + state + frozen + acts + compute.fsdp_working
    if compute.piped.size:
        peak[compute.piped] = _pipelined_peak(context, batch, topo, compute)
    peak = peak + _backward_extra(context, batch, topo) / batch.micro_batches

    replicas = batch.replicas
    peak = peak + np.where(replicas, held, 0.0).max(axis=1)
    device_capacity = context.kinds.memory_bytes[context.device_kind]
    server_over = np.maximum(np.where(replicas, 0.0, held - device_capacity).max(axis=1), 0.0)
    room = (topo.capacity - _reserved(context)[topo.kind]) / _allocated(context)[topo.kind]
    return MemoryPhase(peak=peak, capacity=room, server_over=server_over, feasible=(peak <= room) & (server_over == 0))


def _precision_state(
    context: SimContext,
    batch: CandidateBatch,
    rows: np.ndarray,
    shards: np.ndarray,
    figures: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parameters, gradients, state and frozen bytes of `rows` (precisions other than the captured dtype):
    the captured figures rescaled to the precision's bytes, plus the master copies (kept and sharded with
    the optimizer state) and autocast's half weight copies (of the matmul weights held whole)."""
    params, grads, state, frozen = (np.array(f, dtype=np.float64) * np.ones(len(batch)) for f in figures)
    precision = batch.precision[rows].astype(np.intp)
    table = context.var_precision
    kind, stage = batch.kind[rows], batch.zero_stage[rows]
    sharded = kind == SyncKind.SHARDED
    full_shard = sharded & (stage == 3) & (batch.pipeline[rows] <= 1)[:, None]
    div = np.where(context.var_tensor_split, batch.tensor[rows, None].astype(np.float64), 1.0)
    captured = context.var_bytes / div
    numel = context.var_numel / div
    share = shards[rows, None]
    held = np.where(full_shard, 1.0 / share, 1.0)
    grad_held = np.where(sharded & (stage >= 2), 1.0 / share, 1.0)
    params[rows] += (captured * held * (table.parameter[precision] - 1.0)).sum(axis=1)
    grads[rows] += (captured * grad_held * (table.gradient[precision] - 1.0)).sum(axis=1)
    owned = np.where(kind == SyncKind.PS, 0.0, np.where(sharded, 1.0 / share, 1.0))
    state[rows] += table.master[precision] * (numel * owned).sum(axis=1)
    cast = _autocast(context)
    params[rows] += table.weight_copy[precision] * (numel * cast * ~full_shard).sum(axis=1)
    frozen[rows] *= table.graph_gradient[precision]
    return params, grads, state, frozen


def _autocast(context: SimContext) -> np.ndarray:
    """[V] variables autocast casts to half precision: weights of matmuls and convolutions (embeddings,
    norms and biases of other layers run in fp32)."""
    return context.layer_matmul.take(context.var_layer).astype(np.float64)


def update_bytes(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase, sums: KindSums
) -> np.ndarray:
    """[N] bytes the optimizer streams on the busiest worker (the slowest rank's, with a pipeline)."""
    tensor, shards = batch.tensor.astype(np.float64), topo.shard_degree
    if context.update_per_variable:
        out = sums.owned(UPDATE_SPLIT, UPDATE_REST, tensor, shards)
    else:
        out = UPDATE_PARAM_PASSES * sums.owned(
            PARAM_SPLIT, PARAM_REST, tensor, shards
        ) + UPDATE_STATE_PASSES * sums.owned(STATE_SPLIT, STATE_REST, tensor, shards)
    return _busiest_stage(context, batch, topo, compute, out, context.var_update_bytes)


def gradient_pass_bytes(
    context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase, sums: KindSums
) -> np.ndarray:
    """[N] bytes the step streams over the gradients the busiest worker steps, beside the update: dynamic
    loss scaling unscales them (`precision.UNSCALE_PASSES`, under a loss-scaled precision), a clip takes
    their norm and scales them (`devices.CLIP_PASSES`, when the graph's optimizer clips)."""
    passes = np.where(np.isin(batch.precision, LOSS_SCALED), UNSCALE_PASSES, 0.0)
    if context.graph.optimizer.max_grad_norm is not None:
        passes += CLIP_PASSES
    if not passes.any():
        return np.zeros(len(batch))
    owned = sums.owned(PARAM_SPLIT, PARAM_REST, batch.tensor.astype(np.float64), topo.shard_degree)
    return passes * _busiest_stage(context, batch, topo, compute, owned, context.var_bytes)


def _busiest_stage(
    context: SimContext,
    batch: CandidateBatch,
    topo: Topology,
    compute: ComputePhase,
    out: np.ndarray,
    per_variable: np.ndarray,
) -> np.ndarray:
    """`out`, what each rank steps, with a pipeline's rows replaced by the busiest stage's sum of
    `per_variable` (a [V] figure) over the variables it steps."""
    rows = compute.piped
    if rows.size:
        shards = topo.shard_degree
        per_var = _per_variable(
            context, batch, rows, per_variable, ps_share=0.0, sharded_share=1.0 / shards[rows, None]
        )
        out[rows] = _per_stage(per_var, compute.piped_var_stage, int(batch.pipeline[rows].max())).max(axis=1)
    return out


def update_tensors(context: SimContext, batch: CandidateBatch, compute: ComputePhase, sums: KindSums) -> np.ndarray:
    """[N] tensors the optimizer steps one at a time on the busiest worker (the slowest rank's, with a
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


def _pipelined_peak(context: SimContext, batch: CandidateBatch, topo: Topology, compute: ComputePhase) -> np.ndarray:
    rows = compute.piped
    n = rows.size
    S = int(batch.pipeline[rows].max())
    shards = topo.shard_degree[rows, None]
    state_bytes = context.var_state_bytes
    params = grads = _per_variable(context, batch, rows, context.var_bytes, ps_share=1.0, sharded_share=1.0)
    precision = batch.precision[rows].astype(np.intp)
    scaled = precision > Precision.TF32
    if scaled.any():
        table = context.var_precision
        params = (
            params * table.parameter[precision]
            + _per_variable(context, batch, rows, context.var_numel, ps_share=1.0, sharded_share=1.0)
            * table.weight_copy[precision][:, None]
        )
        grads = grads * table.gradient[precision]
        state_bytes = state_bytes + table.master[precision][:, None] * context.var_numel
    state = _per_variable(context, batch, rows, state_bytes, ps_share=0.0, sharded_share=1.0 / shards)
    stage_vars = _per_stage(params + grads + state, compute.piped_var_stage, S)
    layer_key = (np.arange(n)[:, None] * S + compute.piped_layer_rank).ravel()
    frozen = np.bincount(
        layer_key, weights=np.broadcast_to(context.layer_frozen_bytes, (n, context.num_layers)).ravel(), minlength=n * S
    ).reshape(n, S)
    if scaled.any():
        frozen = frozen * context.var_precision.graph_gradient[precision][:, None]
    m = batch.micro_batches[rows].astype(np.float64)
    p = batch.pipeline[rows].astype(np.float64)
    in_flight = schedules.in_flight(batch.schedule[rows], batch.virtual_stages[rows], p, m, S)
    tensor = batch.tensor[rows, None].astype(np.float64)
    acts = (compute.piped_stage_activations[:, :S] * in_flight + compute.piped_block_peak[:, None]) / m[:, None]
    return (stage_vars + frozen / tensor + acts).max(axis=1)


def _gpu_saves_less(context: SimContext) -> np.ndarray:
    """[K] kinds on which the graph's layers save less than captured (GPUs, where the graph records it)."""
    differs = bool((context.gpu_activation_bytes != context.activation_bytes).any())
    return np.array([spec.is_gpu and differs for spec in context.kinds.specs], dtype=bool)


def _flat_activations(context: SimContext, batch: CandidateBatch, tensor: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """[N] activations held for the whole per-replica batch without a pipeline, per tensor rank. With
    recomputation: the blocks' inputs, whatever lies outside the blocks, and the largest block rebuilt.
    Rows in `gpu` take what a GPU's kernels save (`activations.Shape.gpu`)."""
    acts, sharded, recomputed = context.activation_bytes, context.layer_sharded_input, context.layer_recomputed
    whole = (acts * sharded).sum() / tensor + (acts * ~sharded).sum()
    rows = np.flatnonzero(batch.recompute)
    out = np.array(whole, dtype=np.float64)
    if rows.size:
        kept = context.recompute_kept[recomputed].sum()
        outside = (acts * sharded * ~recomputed).sum() / tensor[rows] + (acts * ~sharded * ~recomputed).sum()
        for degree in np.unique(tensor[rows]).tolist():
            hit = rows[tensor[rows] == degree]
            out[hit] = (
                kept + outside[tensor[rows] == degree] + block_peak(context, acts / np.where(sharded, degree, 1.0))[0]
            )
    knobs = np.flatnonzero(
        (batch.precision > 0)
        | (batch.context_parallel > 1)
        | batch.sequence_parallel
        | batch.selective
        | batch.selective_op
        | gpu
    )
    if knobs.size:
        shapes, inverse = _row_shapes(batch, knobs, gpu[knobs])
        held = [float(activations.held(context, shape).sum()) + activations.rebuilt(context, shape) for shape in shapes]
        out[knobs] = np.array(held)[inverse]
    return out


def _row_shapes(batch: CandidateBatch, rows: np.ndarray, gpu: np.ndarray) -> tuple[list[activations.Shape], np.ndarray]:
    """The distinct activation shapes among `rows`, and each row's index into them: a batch holds
    thousands of rows but a handful of shapes, each priced once. A shape is one row of `keys`."""
    keys = np.stack(
        [
            batch.tensor[rows],
            batch.context_parallel[rows],
            batch.sequence_parallel[rows],
            batch.precision[rows],
            batch.selective[rows],
            batch.recompute[rows],
            batch.selective_op[rows],
            gpu,
        ],
        axis=1,
    ).astype(np.int64)
    packed = np.zeros(len(rows), dtype=np.int64)
    for column in keys.T:
        packed = packed * (int(column.max()) + 1) + column
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    shapes = [
        activations.Shape(
            tensor=int(t),
            context_parallel=int(c),
            sequence_parallel=bool(sp),
            precision=int(p),
            selective=bool(sel),
            recompute=bool(rc),
            selective_op=bool(op),
            gpu=bool(g),
        )
        for t, c, sp, p, sel, rc, op, g in keys[first].tolist()
    ]
    return shapes, inverse.reshape(-1)


def _backward_extra(context: SimContext, batch: CandidateBatch, topo: Topology) -> np.ndarray:
    """[N] gradient bytes backward holds beyond the activations at its fullest, for the whole per-replica
    batch (`activations.backward_extra`), on GPU kinds; 0 on CPUs, whose figures calibration measured
    with them included."""
    out = np.zeros(len(batch))
    gpu = np.array([spec.is_gpu for spec in context.kinds.specs], dtype=bool)[topo.kind]
    rows = np.flatnonzero(gpu)
    if rows.size:
        shapes, inverse = _row_shapes(batch, rows, np.ones(rows.size, dtype=bool))
        extra = [activations.backward_extra(context, shape, activations.held(context, shape)) for shape in shapes]
        out[rows] = np.array(extra)[inverse]
    return out


def tensor_room(context: SimContext, kinds: np.ndarray) -> np.ndarray:
    """Bytes each of `kinds`' devices has for live tensors: the rule `memory_phase` decides fits by,
    for callers that prune before pricing (the search's mesh cutting)."""
    memory = context.kinds.memory_bytes[kinds]
    return (memory - _reserved(context)[kinds]) / _allocated(context)[kinds]


def _reserved(context: SimContext) -> np.ndarray:
    """[K] bytes each kind's process holds outside its tensors (`DeviceSpec.reserved_memory_bytes`)."""
    return np.array([spec.reserved_memory_bytes or 0.0 for spec in context.kinds.specs])


def _allocated(context: SimContext) -> np.ndarray:
    """[K] what each kind's allocator holds per byte of live tensors (`DeviceSpec.allocator_overhead`)."""
    return np.array([1.0 + (spec.allocator_overhead or 0.0) for spec in context.kinds.specs])
