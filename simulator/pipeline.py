"""Compute phase of a step: forward, backward, tensor- and context-parallel exchanges, ZeRO-3 gathers and
the pipeline schedule.

Without a pipeline the step computes forward then backward, every tensor-parallel all-reduce on the
critical path (Megatron: one per row-parallel matmul in each pass, see `layers._row_parallel`; with
sequence parallelism each becomes a reduce-scatter and an all-gather, the same bytes on a ring and the
same time), and a variable's gradient is ready when the backward of its layer is done:

    ready(v) = compute_end - (backward work of the layers before v's layer)

With p ranks and m micro-batches the slowest rank paces the schedule; `simulator.schedules` prices the
bubble of GPipe, 1F1B, interleaved 1F1B and zero-bubble schedules:

    compute path = m · max_r(f_r + b_r) + bubble + fill and drain sends

Rank r finishes its last backward r slowest-rank backward steps before rank 0 does; gradients inside
the rank are ready as above.

With full recomputation a numbered block's backward first repeats its forward (and that forward's
tensor-parallel all-reduces); with selective recomputation only its attention core's forward; with
per-op selective checkpointing the forward of the layers it does not keep (`layers.op_recomputed`).
Context parallelism adds ring attention's exposed key/value sends (`simulator.context_parallel`), ZeRO
stage 3 its exposed gathers and reduce-scatters (`simulator.fsdp`).

Without a pipeline, m > 1 micro-batches are gradient accumulation: m forward/backward passes of 1/m
of the batch each (every launch and every tensor-parallel latency paid m times); gradients are ready
as the last micro-batch's backward goes by.

Candidates without a pipeline share a few configurations (device kind, tensor degree, micro-batches,
knobs, links), so ready times are kept as per-configuration offsets instead of an [N, V] array.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator import activations, collectives, context_parallel, fsdp, schedules
from simulator.activations import block_peak
from simulator.compute import PLAIN, Knobs, layer_times
from simulator.context import SimContext
from simulator.encoding import CandidateBatch, Schedule
from simulator.topology import Topology

__all__ = ["ComputePhase", "block_peak", "compute_phase"]


@dataclass
class ComputePhase:
    end: np.ndarray
    """[N] when the last backward finishes (the compute critical path)."""
    compute: np.ndarray
    tensor_parallel: np.ndarray
    bubble: np.ndarray
    p2p: np.ndarray
    context_parallel: np.ndarray
    """[N] ring attention's exposed key/value sends."""
    fsdp: np.ndarray
    """[N] ZeRO-3's exposed parameter gathers and gradient reduce-scatters."""
    fsdp_working: np.ndarray
    """[N] bytes of ZeRO-3 parameters gathered at once (two units)."""
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
    """[Np, V] pipeline rank holding each variable (graph order)."""
    piped_layer_rank: np.ndarray
    """[Np, L] pipeline rank running each layer."""
    piped_stage_activations: np.ndarray
    """[Np, S] activation bytes each rank holds per micro-batch in flight, times m (the whole per-replica
    batch's worth), per tensor rank."""
    piped_block_peak: np.ndarray
    """[Np] activations rebuilt at once during backward under recomputation, for the whole per-replica
    batch, per tensor rank; 0 without."""

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
    n, V, L = len(batch), context.num_variables, context.num_layers
    piped = np.flatnonzero(batch.pipeline > 1)
    out = ComputePhase(
        end=np.zeros(n),
        compute=np.zeros(n),
        tensor_parallel=np.zeros(n),
        bubble=np.zeros(n),
        p2p=np.zeros(n),
        context_parallel=np.zeros(n),
        fsdp=np.zeros(n),
        fsdp_working=np.zeros(n),
        config=np.zeros(n, dtype=np.intp),
        offsets=np.zeros((1, V)),
        piped=piped,
        piped_slot=np.full(n, -1, dtype=np.intp),
        piped_ready=np.zeros((piped.size, V)),
        piped_var_stage=np.zeros((piped.size, V), dtype=np.intp),
        piped_layer_rank=np.zeros((piped.size, L), dtype=np.intp),
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


MICRO_BITS, TENSOR_BITS = 20, 12
"""Bits of the micro-batch count and of the tensor degree in a configuration key (`validate` bounds both);
the context degree takes the next 12, then the flags, compile, the precision, async TP, per-op
checkpointing and the device kind."""


def _configs(batch: CandidateBatch, kind: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique (kind, knobs, tensor, micro-batches) keys of `rows` and each row's index among them."""
    key = (
        (kind.astype(np.int64) << 53)
        | (batch.selective_op[rows].astype(np.int64) << 52)
        | (batch.async_tp[rows].astype(np.int64) << 51)
        | (batch.precision[rows].astype(np.int64) << 48)
        | (batch.compile[rows].astype(np.int64) << 47)
        | (batch.recompute[rows].astype(np.int64) << 46)
        | (batch.selective[rows].astype(np.int64) << 45)
        | (batch.sequence_parallel[rows].astype(np.int64) << 44)
        | (batch.context_parallel[rows].astype(np.int64) << (MICRO_BITS + TENSOR_BITS))
        | (batch.tensor[rows].astype(np.int64) << MICRO_BITS)
        | batch.micro_batches[rows].astype(np.int64)
    )
    keys, inverse = np.unique(key, return_inverse=True)
    return keys, inverse.reshape(-1)


@dataclass(frozen=True)
class Config:
    """What decides a candidate's per-layer times and activations, decoded from its `_configs` key."""

    kind: int
    tensor: int
    micro: int
    recompute: bool
    selective: bool
    knobs: Knobs
    async_tp: bool = False
    selective_op: bool = False

    @classmethod
    def decode(cls, key: np.int64) -> Config:
        return _decode(int(key))

    def shape(self) -> activations.Shape:
        return activations.Shape(
            tensor=self.tensor,
            context_parallel=self.knobs.context_parallel,
            sequence_parallel=self.knobs.sequence_parallel,
            precision=self.knobs.precision,
            selective=self.selective,
            recompute=self.recompute,
            selective_op=self.selective_op,
        )


@functools.lru_cache(maxsize=4096)
def _decode(k: int) -> Config:
    knobs = Knobs(
        precision=(k >> 48) & 0x7,
        context_parallel=(k >> (MICRO_BITS + TENSOR_BITS)) & 0xFFF,
        sequence_parallel=bool((k >> 44) & 1),
        compile=bool((k >> 47) & 1),
    )
    return Config(
        kind=k >> 53,
        selective_op=bool((k >> 52) & 1),
        async_tp=bool((k >> 51) & 1),
        tensor=(k >> MICRO_BITS) & 0xFFF,
        micro=k & 0xFFFFF,
        recompute=bool((k >> 46) & 1),
        selective=bool((k >> 45) & 1),
        knobs=knobs,
    )


def _times(context: SimContext, config: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward, backward and weight-gradient seconds per layer and micro-batch; a recomputed layer's
    backward repeats its forward (every layer of a numbered block under full recomputation, its attention
    core under selective)."""
    fwd, bwd = layer_times(context, config.kind, config.tensor, config.micro, config.knobs)
    weight = 0.5 * bwd * context.layer_weight_grad
    if config.recompute:
        return fwd, bwd + fwd * context.layer_recomputed, weight
    if config.selective:
        return fwd, bwd + fwd * (context.layer_attention & context.layer_recomputed), weight
    if config.selective_op:
        return fwd, bwd + fwd * context.op_recomputed, weight
    return fwd, bwd, weight


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)[:-1]])


def _wire_scale(context: SimContext, config: Config) -> float:
    if config.knobs == PLAIN:
        return 1.0
    return float(context.var_precision.activation[config.knobs.precision]) / config.knobs.context_parallel


def _flat(context: SimContext, batch: CandidateBatch, topo: Topology, rows: np.ndarray, out: ComputePhase) -> None:
    latency, per_byte = topo.tensor[0][rows], topo.tensor[1][rows]
    keys, config_of = _configs(batch, topo.kind[rows], rows)
    ring = batch.context_parallel[rows] > 1
    columns = [config_of.astype(float), latency, per_byte]
    if ring.any():
        columns += [np.where(ring, topo.cp[0][rows], 0.0), np.where(ring, topo.cp[1][rows], 0.0)]
    links = np.stack(columns, axis=1)
    configs, inverse = np.unique(links, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    row = context.layer_tp_allreduce
    U = len(configs)
    totals, tp_total, cp_total = np.zeros(U), np.zeros(U), np.zeros(U)
    offsets = np.zeros((U, context.num_variables))
    sharded = fsdp.full_shard_rows(batch)
    units = context.unit_starts.size if sharded.size else 0
    unit_fwd, unit_bwd = np.zeros((U, units)), np.zeros((U, units))
    for u, link in enumerate(configs):
        config = Config.decode(keys[int(link[0])])
        lat, inv = link[1], link[2]
        micro = config.micro
        fwd, bwd, _ = _times(context, config)
        back = row * (1.0 + config.recompute * context.layer_recomputed)  # all-reduces per backward pass
        scale = _wire_scale(context, config)
        wire = context.output_bytes if scale == 1.0 else context.output_bytes * scale
        totals[u] = micro * (fwd.sum() + bwd.sum())
        per = lat + wire / micro * inv  # one tensor-parallel collective per micro-batch, per layer
        tp_f, tp_b = row * per, back * per
        if config.async_tp:
            overlap = context.kinds.comm_overlap[config.kind]
            tp_f = collectives.async_tensor_parallel(tp_f, fwd, config.tensor, overlap)
            tp_b = collectives.async_tensor_parallel(tp_b, bwd, config.tensor, overlap)
        tp_total[u] = micro * (tp_f.sum() + tp_b.sum())
        offsets[u] = (
            _exclusive_cumsum(bwd)[context.var_layer][context.order]
            + _exclusive_cumsum(tp_b)[context.var_layer][context.order]
        )
        ring_f: np.ndarray | float = 0.0
        ring_b: np.ndarray | float = 0.0
        if config.knobs.context_parallel > 1:
            exposed_f, exposed_b = context_parallel.exposed_per_layer(
                context,
                fwd,
                bwd,
                degree=config.knobs.context_parallel,
                tensor=config.tensor,
                micro_batches=micro,
                activation_scale=float(context.var_precision.activation[config.knobs.precision]),
                latency=link[3],
                per_byte=link[4],
            )
            cp_total[u] = micro * (exposed_f.sum() + exposed_b.sum())
            offsets[u] += _exclusive_cumsum(exposed_b)[context.var_layer][context.order]
            ring_f, ring_b = exposed_f, exposed_b
        if units:
            unit_fwd[u] = np.bincount(context.layer_unit, weights=fwd + tp_f + ring_f, minlength=units)
            unit_bwd[u] = np.bincount(context.layer_unit, weights=bwd + tp_b + ring_b, minlength=units)
    out.config[rows] = inverse
    out.offsets = offsets
    out.compute[rows] = totals[inverse]
    out.tensor_parallel[rows] = tp_total[inverse]
    out.context_parallel[rows] = cp_total[inverse]
    out.end[rows] = totals[inverse] + tp_total[inverse] + cp_total[inverse]
    if sharded.size:
        slot = np.full(len(batch), -1, dtype=np.intp)
        slot[rows] = inverse
        full = fsdp.full_shard(context, batch, topo, sharded, unit_fwd[slot[sharded]], unit_bwd[slot[sharded]])
        out.fsdp[sharded] = full.exposed
        out.fsdp_working[sharded] = full.working
        out.end[sharded] += full.exposed


def _pipelined(context: SimContext, batch: CandidateBatch, topo: Topology, rows: np.ndarray, out: ComputePhase) -> None:
    n, L = rows.size, context.num_layers
    m = batch.micro_batches[rows].astype(float)
    p = batch.pipeline[rows].astype(float)
    virtual = batch.virtual_stages[rows]
    schedule = batch.schedule[rows]
    recompute = batch.recompute[rows]
    keys, inverse = _configs(batch, topo.kind[rows], rows)
    configs = [Config.decode(key) for key in keys]
    fwd_table, bwd_table, weight_table = np.zeros((len(keys), L)), np.zeros((len(keys), L)), np.zeros((len(keys), L))
    scale_table = np.ones(len(keys))
    for u, config in enumerate(configs):
        fwd_table[u], bwd_table[u], weight_table[u] = _times(context, config)
        scale_table[u] = _wire_scale(context, config)
    scale = scale_table[inverse][:, None]
    latency, per_byte = topo.tensor[0][rows], topo.tensor[1][rows]
    wire = context.output_bytes if (scale == 1.0).all() else context.output_bytes * scale
    tp = context.layer_tp_allreduce * (latency[:, None] + wire / m[:, None] * per_byte[:, None])
    tp_back = tp * (1.0 + recompute[:, None] * context.layer_recomputed)
    fwd, bwd, weight = fwd_table[inverse], bwd_table[inverse], weight_table[inverse]
    pieced = batch.async_tp[rows]
    if pieced.any():
        degree = batch.tensor[rows, None].astype(float)
        overlap = context.kinds.comm_overlap[topo.kind[rows]][:, None]
        tp = np.where(pieced[:, None], collectives.async_tensor_parallel(tp, fwd, degree, overlap), tp)
        tp_back = np.where(pieced[:, None], collectives.async_tensor_parallel(tp_back, bwd, degree, overlap), tp_back)
    ring_f, ring_b = _ring(context, batch, topo, rows, fwd, bwd)
    chunk = batch.layer_stage[rows].astype(np.intp)
    rank = chunk if (virtual == 1).all() else schedules.chunk_rank(chunk, batch.pipeline[rows], schedule, virtual)
    R = int(batch.pipeline[rows].max())
    C = int((batch.pipeline[rows] * virtual).max())
    by_chunk = _summer(chunk, n, C)
    by_rank = _summer(rank, n, R)

    f_s, b_s, tp_s, tpb_s = by_rank(fwd), by_rank(bwd), by_rank(tp), by_rank(tp_back)
    stage_back = b_s + tpb_s
    stage_time = f_s + b_s + tp_s + tpb_s
    ring_s: np.ndarray | None = None
    if ring_f is not None and ring_b is not None:
        cpb_s = by_rank(ring_b)
        ring_s = by_rank(ring_f) + cpb_s
        stage_back = stage_back + cpb_s
        stage_time = stage_time + ring_s
        bwd_all = bwd + tp_back + ring_b
        fwd_all = fwd + tp + ring_f
    else:
        bwd_all, fwd_all = bwd + tp_back, fwd + tp
    pick = np.arange(n), stage_time.argmax(axis=1)
    step = stage_time[pick]
    ring = m * ring_s[pick] if ring_s is not None else np.zeros(n)
    if ((schedule <= Schedule.GPIPE) & (virtual == 1)).all():
        bubble = (p - 1) * step
        chunk_back = stage_back
    else:
        chunk_time = by_chunk(fwd_all + bwd_all)
        chunk_pick = np.arange(n), chunk_time.argmax(axis=1)
        zbv = virtual >= 2
        forward = np.where(zbv, by_chunk(fwd + tp)[chunk_pick], (f_s + tp_s)[pick])
        backward = np.where(zbv, by_chunk(bwd + tp_back)[chunk_pick], (b_s + tpb_s)[pick])
        weights = np.where(zbv, by_chunk(weight)[chunk_pick], by_rank(weight)[pick])
        bubble = schedules.bubble(schedule, virtual, p, m, step, chunk_time[chunk_pick], forward, backward, weights)
        chunk_back = by_chunk(bwd_all)
    boundary = np.zeros(n)
    if L > 1:
        boundary = (wire[..., :-1] * (chunk[:, 1:] != chunk[:, :-1])).sum(axis=1) / m
    crossings = p * virtual - 1
    p2p = 2 * (crossings * topo.p2p[0][rows] + boundary * topo.p2p[1][rows])
    compute = m * (f_s[pick] + b_s[pick])
    tensor_parallel = m * (tp_s + tpb_s)[pick]
    end = compute + tensor_parallel + bubble + p2p + ring

    prefix = np.cumsum(bwd_all, axis=1) - bwd_all
    base = np.cumsum(chunk_back, axis=1) - chunk_back
    slowest_back = stage_back.max(axis=1)
    var_chunk, var_rank = chunk[:, context.var_layer], rank[:, context.var_layer]
    within = prefix[:, context.var_layer] - np.take_along_axis(base, var_chunk, axis=1)
    ready = end[:, None] - var_rank * slowest_back[:, None] - within

    out.end[rows], out.compute[rows], out.tensor_parallel[rows] = end, compute, tensor_parallel
    out.bubble[rows], out.p2p[rows], out.context_parallel[rows] = bubble, p2p, ring
    out.piped_ready = ready[:, context.order]
    out.piped_var_stage = var_rank
    out.piped_layer_rank = rank
    held, rebuilt = _held(context, configs, inverse)
    out.piped_stage_activations = by_rank(held)
    out.piped_block_peak = rebuilt


def _summer(index: np.ndarray, n: int, size: int) -> Callable[[np.ndarray], np.ndarray]:
    """A function summing [n, L] (or [L]) values into [n, size] by `index` (chunk or rank of each layer)."""
    key = (np.arange(n)[:, None] * size + index).ravel()

    def per(values: np.ndarray) -> np.ndarray:
        flat = values.ravel() if values.shape == index.shape else np.broadcast_to(values, index.shape).ravel()
        return np.bincount(key, weights=flat, minlength=n * size).reshape(n, size)

    return per


def _ring(
    context: SimContext, batch: CandidateBatch, topo: Topology, rows: np.ndarray, fwd: np.ndarray, bwd: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """[n, L] ring attention's exposed seconds per micro-batch (None when no row has a context group)."""
    degree = batch.context_parallel[rows]
    if not (degree > 1).any():
        return None, None
    column = lambda a: a.astype(np.float64)[:, None]  # noqa: E731
    return context_parallel.exposed_per_layer(
        context,
        fwd,
        bwd,
        degree=column(degree),
        tensor=column(batch.tensor[rows]),
        micro_batches=column(batch.micro_batches[rows]),
        activation_scale=column(context.var_precision.activation[batch.precision[rows]]),
        latency=column(topo.cp[0][rows]),
        per_byte=column(topo.cp[1][rows]),
    )


def _held(context: SimContext, configs: list[Config], inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, L] activations each layer holds for the whole per-replica batch per rank, and [n] the bytes
    rebuilt at once in backward."""
    gpu = bool((context.gpu_activation_bytes != context.activation_bytes).any())
    figures = [
        _activation_figures(
            context, dataclasses.replace(config.shape(), gpu=gpu and context.kinds.specs[config.kind].is_gpu)
        )
        for config in configs
    ]
    held = np.stack([f[0] for f in figures])
    rebuilt = np.array([f[1] for f in figures])
    return held[inverse], rebuilt[inverse]


def _activation_figures(context: SimContext, shape: activations.Shape) -> tuple[np.ndarray, float]:
    cached = context._activations.get(shape)
    if cached is None:
        cached = context._activations[shape] = (activations.held(context, shape), activations.rebuilt(context, shape))
    return cached
