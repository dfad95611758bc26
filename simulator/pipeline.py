"""Compute phase of a step: forward, backward, tensor-parallel collectives and the pipeline schedule.

Without a pipeline the step computes forward then backward, every tensor-parallel all-reduce on the
critical path (Megatron: one per row-parallel matmul in each pass, see `layers._row_parallel`), and a
variable's gradient is ready when the backward of its layer is done:

    ready(v) = compute_end - (backward work of the layers before v's layer)

With p stages and m micro-batches the slowest stage paces the schedule (1F1B and GPipe alike):

    compute path = (m + p - 1) · max_s(f_s + b_s)   where the (p - 1) share is the bubble (p-1)/(m+p-1)

plus 2(p - 1) activation sends to fill and drain the pipe. Stage s finishes its last backward s
slowest-stage backward steps before stage 0 does; gradients inside the stage are ready as above.

With activation recomputation a numbered block's backward first repeats its forward (and that
forward's tensor-parallel all-reduces).

Without a pipeline, m > 1 micro-batches are gradient accumulation: m forward/backward passes of 1/m
of the batch each (every launch and every tensor-parallel latency paid m times); gradients are ready
as the last micro-batch's backward goes by.

Candidates without a pipeline share a few configurations (device kind, tensor degree, micro-batches,
tensor link), so ready times are kept as per-configuration offsets instead of an [N, V] array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.compute import layer_times
from simulator.context import SimContext
from simulator.encoding import CandidateBatch
from simulator.topology import Topology


@dataclass
class ComputePhase:
    end: np.ndarray
    """[N] when the last backward finishes (the compute critical path)."""
    compute: np.ndarray
    tensor_parallel: np.ndarray
    bubble: np.ndarray
    p2p: np.ndarray
    config: np.ndarray
    """[N] row of `offsets` for candidates without a pipeline (0 for pipelined ones)."""
    offsets: np.ndarray
    """[U, V] ready position j: ready = end - offsets[config, j] (positions in `context.order`)."""
    piped: np.ndarray
    """Rows with a pipeline; their ready times are explicit in `piped_ready`."""
    piped_slot: np.ndarray
    """[N] index into `piped` (-1 for rows without a pipeline)."""
    piped_ready: np.ndarray
    """[Np, V] ready times of pipelined rows, in ready order."""
    piped_var_stage: np.ndarray
    """[Np, V] stage holding each variable (graph order)."""
    piped_stage_activations: np.ndarray
    """[Np, S] activation bytes of each stage for the whole per-replica batch, per tensor rank."""
    piped_block_peak: np.ndarray
    """[Np] with recomputation, the largest block's activations (rebuilt during its backward), for the
    whole per-replica batch, per tensor rank; 0 without."""

    def ready_dense(self) -> np.ndarray:
        """[N, V] gradient-ready times in ready order."""
        if self.offsets.shape[0] == 1:
            ready = self.end[:, None] - self.offsets[0]
        else:
            ready = self.end[:, None] - self.offsets[self.config]
        if self.piped.size:
            ready[self.piped] = self.piped_ready
        return ready

    def ready_at(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Ready times of (row, ready position) pairs."""
        V = self.offsets.shape[1]
        ready = self.end.take(rows) - self.offsets.ravel().take(self.config.take(rows) * V + positions)
        if self.piped.size:
            slot = self.piped_slot.take(rows)
            hit = np.flatnonzero(slot >= 0)
            ready[hit] = self.piped_ready.ravel().take(slot.take(hit) * V + positions.take(hit))
        return ready


def compute_phase(context: SimContext, batch: CandidateBatch, topo: Topology) -> ComputePhase:
    n, V = len(batch), context.num_variables
    piped = np.flatnonzero(batch.pipeline > 1)
    out = ComputePhase(
        end=np.zeros(n),
        compute=np.zeros(n),
        tensor_parallel=np.zeros(n),
        bubble=np.zeros(n),
        p2p=np.zeros(n),
        config=np.zeros(n, dtype=np.intp),
        offsets=np.zeros((1, V)),
        piped=piped,
        piped_slot=np.full(n, -1, dtype=np.intp),
        piped_ready=np.zeros((piped.size, V)),
        piped_var_stage=np.zeros((piped.size, V), dtype=np.intp),
        piped_stage_activations=np.zeros((piped.size, 1)),
        piped_block_peak=np.zeros(piped.size),
    )
    flat = np.flatnonzero(batch.pipeline <= 1)
    if flat.size:
        _flat(context, batch, topo, flat, out)
    if piped.size:
        out.piped_slot[piped] = np.arange(piped.size)
        _pipelined(context, batch, topo, piped, out)
    return out


def _configs(
    kind: np.ndarray, tensor: np.ndarray, micro: np.ndarray, recompute: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    key = (
        (kind.astype(np.int64) << 41)
        | (recompute.astype(np.int64) << 40)
        | (tensor.astype(np.int64) << 20)
        | micro.astype(np.int64)
    )
    return np.unique(key, return_inverse=True)


def _decode(key: np.int64) -> tuple[int, int, int, bool]:
    k = int(key)
    return k >> 41, (k >> 20) & 0xFFFFF, k & 0xFFFFF, bool((k >> 40) & 1)


def _times(context: SimContext, key: np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds per layer and micro-batch; a recomputed layer's backward repeats its forward."""
    kind, tensor, micro, recompute = _decode(key)
    fwd, bwd = layer_times(context, kind, tensor, micro)
    return fwd, bwd + fwd * context.layer_recomputed if recompute else bwd


def block_peak(context: SimContext, activations: np.ndarray) -> np.ndarray:
    """[n] the largest recomputed block's activations, from [n, L] (or [L]) per-layer activations."""
    per_unit = np.add.reduceat(np.atleast_2d(activations), context.unit_starts, axis=1)
    recomputed = context.layer_recomputed[context.unit_starts]
    return np.where(recomputed, per_unit, 0.0).max(axis=1, initial=0.0)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)[:-1]])


def _flat(context: SimContext, batch: CandidateBatch, topo: Topology, rows: np.ndarray, out: ComputePhase) -> None:
    latency, per_byte = topo.tensor[0][rows], topo.tensor[1][rows]
    kind_tensor, kt_inverse = _configs(
        topo.kind[rows], batch.tensor[rows], batch.micro_batches[rows], batch.recompute[rows]
    )
    links = np.stack([kt_inverse.astype(float), latency, per_byte], axis=1)
    configs, inverse = np.unique(links, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    row = context.layer_tp_allreduce
    totals = np.zeros(len(configs))
    tp_total = np.zeros(len(configs))
    offsets = np.zeros((len(configs), context.num_variables))
    for u, (kt, lat, inv) in enumerate(configs):
        key = kind_tensor[int(kt)]
        _, _, micro, recompute = _decode(key)
        fwd, bwd = _times(context, key)
        back = row * (1.0 + recompute * context.layer_recomputed)  # all-reduces per backward pass
        totals[u] = micro * (fwd.sum() + bwd.sum())
        tp_total[u] = micro * (row.sum() + back.sum()) * lat + (context.output_bytes * (row + back)).sum() * inv
        tp_count = _exclusive_cumsum(back)[context.var_layer][context.order]
        tp_bytes = _exclusive_cumsum(back * context.output_bytes)[context.var_layer][context.order]
        offsets[u] = _exclusive_cumsum(bwd)[context.var_layer][context.order] + tp_count * lat + tp_bytes / micro * inv
    out.config[rows] = inverse
    out.offsets = offsets
    out.compute[rows] = totals[inverse]
    out.tensor_parallel[rows] = tp_total[inverse]
    out.end[rows] = totals[inverse] + tp_total[inverse]


def _pipelined(context: SimContext, batch: CandidateBatch, topo: Topology, rows: np.ndarray, out: ComputePhase) -> None:
    n, L = rows.size, context.num_layers
    m = batch.micro_batches[rows].astype(float)
    p = batch.pipeline[rows].astype(float)
    recompute = batch.recompute[rows]
    keys, inverse = _configs(topo.kind[rows], batch.tensor[rows], batch.micro_batches[rows], recompute)
    fwd_table = np.zeros((len(keys), L))
    bwd_table = np.zeros((len(keys), L))
    for u, key in enumerate(keys):
        fwd_table[u], bwd_table[u] = _times(context, key)
    latency, per_byte = topo.tensor[0][rows], topo.tensor[1][rows]
    tp = context.layer_tp_allreduce * (latency[:, None] + context.output_bytes / m[:, None] * per_byte[:, None])
    tp_back = tp * (1.0 + recompute[:, None] * context.layer_recomputed)
    stage = batch.layer_stage[rows].astype(np.intp)
    S = int(batch.pipeline[rows].max())
    key = (np.arange(n)[:, None] * S + stage).ravel()

    def per_stage(values: np.ndarray) -> np.ndarray:
        return np.bincount(key, weights=values.ravel(), minlength=n * S).reshape(n, S)

    fwd, bwd = fwd_table[inverse.reshape(-1)], bwd_table[inverse.reshape(-1)]
    f_s, b_s, tp_s, tpb_s = per_stage(fwd), per_stage(bwd), per_stage(tp), per_stage(tp_back)
    stage_time = f_s + b_s + tp_s + tpb_s
    pick = np.arange(n), stage_time.argmax(axis=1)
    step = stage_time[pick]
    boundary = np.zeros(n)
    if L > 1:
        boundary = (context.output_bytes[:-1] * (stage[:, 1:] != stage[:, :-1])).sum(axis=1) / m
    p2p = 2 * ((p - 1) * topo.p2p[0][rows] + boundary * topo.p2p[1][rows])
    compute = m * (f_s[pick] + b_s[pick])
    tensor_parallel = m * (tp_s + tpb_s)[pick]
    bubble = (p - 1) * step
    end = compute + tensor_parallel + bubble + p2p

    back = bwd + tp_back
    prefix = np.cumsum(back, axis=1) - back
    base = np.cumsum(b_s + tpb_s, axis=1) - (b_s + tpb_s)
    slowest_back = (b_s + tpb_s).max(axis=1)
    var_stage = stage[:, context.var_layer]
    within = prefix[:, context.var_layer] - np.take_along_axis(base, var_stage, axis=1)
    ready = end[:, None] - var_stage * slowest_back[:, None] - within

    out.end[rows], out.compute[rows], out.tensor_parallel[rows] = end, compute, tensor_parallel
    out.bubble[rows], out.p2p[rows] = bubble, p2p
    out.piped_ready = ready[:, context.order]
    out.piped_var_stage = var_stage
    tensor = batch.tensor[rows].astype(float)[:, None]
    full = context.activation_bytes / np.where(context.layer_sharded_input, tensor, 1.0)
    out.piped_stage_activations = per_stage(
        np.where(recompute[:, None] & context.layer_recomputed, context.recompute_kept, full)
    )
    out.piped_block_peak = np.where(recompute, block_peak(context, full), 0.0)
