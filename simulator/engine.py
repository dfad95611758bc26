"""simulate_batch: the composer. It only wires the phases in the order a step runs them:

    topology -> compute (forward, backward, tensor and context parallel, ZeRO-3 gathers, pipeline)
             -> gradients ready
             -> collective stream (all-reduce, reduce-scatter) and PS NICs, overlapping backward
             -> optimizer update -> sharded all-gather -> memory check

A synchronous step ends when compute, the collective stream and the slowest PS pull are all done,
then updates and gathers:

    bsp  = max(compute_end, collectives_done, ps_done) + update + all_gather

Asynchronous and stale-synchronous PS training take the PS wait off the critical path, up to the
staleness bound s (in steps), but the busiest PS NIC must still carry a step's traffic each step:

    local = max(compute_end, collectives_done) + update + all_gather
    ssp   = max(local, ps_throughput, bsp - s · local)        asp = max(local, ps_throughput)

Where compute and communication share the device (`DeviceSpec.comm_overlap` < 1: a CPU rank under
gloo, whose cores take turns; a GPU, whose NCCL kernels hold SMs and memory bandwidth while compute
runs), the part of each channel's transfers that ran during compute slows compute by (1 - overlap) of
it, and every completion above moves by that much (`_stolen`); with a pipeline only the busiest
stage's share of the channel runs on any one device. A GPU worker's parameter-server traffic moves by
copy engines and the host's NIC and takes nothing from its compute. On CPU cores each
collective on the collective stream that runs during compute also takes
`comm_latency_contention` times its latency from it (its hand-offs wait for a core the compute holds),
so many small collectives launched in backward cost more than one large one carrying the same bytes
(a PS node's traffic pays the overlap share only):

    stolen = (1 - overlap) · hidden + contention · hidden · latency / busy

The breakdown splits the step into components that add up to it exactly (see BREAKDOWN_KEYS). A
candidate whose numerics the device cannot run (fp8 without fp8 tensor cores) is infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.allreduce import CollectivePhase, collective_phase
from simulator.compute import update_seconds
from simulator.context import SimContext
from simulator.encoding import CandidateBatch, ConsistencyKind, Precision, SyncKind
from simulator.memory import (
    KindSums,
    MemoryPhase,
    gradient_pass_bytes,
    memory_phase,
    update_bytes,
    update_tensors,
)
from simulator.pipeline import ComputePhase, compute_phase
from simulator.ps import PSPhase, ps_phase
from simulator.step_graph import step_context, step_samples
from simulator.topology import Topology, topology

BREAKDOWN_KEYS = (
    "compute",
    "tensor_parallel",
    "pipeline_bubble",
    "pipeline_p2p",
    "allreduce",
    "sharded",
    "ps",
    "optimizer_update",
    "context_parallel",
)
"""Seconds per component; they sum to the step time. Communication entries are the *exposed* part
(`sharded` includes ZeRO-3's exposed gathers and reduce-scatters, `context_parallel` ring attention's
exposed key/value sends)."""

CHUNK = 512
"""Candidates simulated per chunk: keeps the [chunk, V] working arrays in cache-friendly sizes."""
RESULT_ARRAYS = ("step_time", "samples_per_s", "memory", "capacity", "feasible", "breakdown", "server_over")


@dataclass
class BatchResult:
    step_time: np.ndarray
    samples_per_s: np.ndarray
    memory: np.ndarray
    """[N] peak bytes on the fullest replica device."""
    capacity: np.ndarray
    """[N] bytes that device's live tensors may take (`memory.MemoryPhase.capacity`)."""
    feasible: np.ndarray
    breakdown: np.ndarray
    """[N, len(BREAKDOWN_KEYS)] seconds, columns in BREAKDOWN_KEYS order."""
    server_over: np.ndarray
    detail: dict[str, np.ndarray] = field(default_factory=dict)
    """With detail=True: per-node PS seconds and bytes, all-reduce bytes and busy time, the collectives'
    latency seconds, server memory (for explanations and tests)."""

    def __len__(self) -> int:
        return int(self.step_time.shape[0])

    def component(self, key: str) -> np.ndarray:
        return self.breakdown[:, BREAKDOWN_KEYS.index(key)]


def simulate_batch(
    context: SimContext, batch: CandidateBatch, *, validate: bool = False, detail: bool = False
) -> BatchResult:
    """Step time, memory, feasibility and breakdown of every candidate; row i depends only on row i."""
    if validate:
        batch.validate(context)
    samples = step_samples(context, batch)
    if (samples != context.batch_size).any():
        return _by_step(context, batch, samples, detail)
    n = len(batch)
    if n <= CHUNK:
        return _simulate(context, batch, detail)
    parts = [_simulate(context, batch.rows(s, min(s + CHUNK, n)), detail) for s in range(0, n, CHUNK)]
    return BatchResult(
        **{name: np.concatenate([getattr(p, name) for p in parts]) for name in RESULT_ARRAYS},
        detail={k: np.concatenate([p.detail[k] for p in parts]) for k in parts[0].detail},
    )


def _by_step(context: SimContext, batch: CandidateBatch, samples: np.ndarray, detail: bool) -> BatchResult:
    """Rows that state their micro-batch size, each group of one step size on its step's graph
    (`step_graph.step_context`), put back in row order."""
    parts, where = [], []
    for size in np.unique(samples).tolist():
        rows = np.flatnonzero(samples == size)
        parts.append(simulate_batch(step_context(context, int(size)), batch.take(rows), detail=detail))
        where.append(rows)
    order = np.argsort(np.concatenate(where), kind="stable")
    return BatchResult(
        **{name: np.concatenate([getattr(p, name) for p in parts])[order] for name in RESULT_ARRAYS},
        detail={k: np.concatenate([p.detail[k] for p in parts])[order] for k in parts[0].detail},
    )


def _simulate(context: SimContext, batch: CandidateBatch, detail: bool) -> BatchResult:
    topo = topology(context, batch)
    compute = compute_phase(context, batch, topo)
    coll = collective_phase(context, batch, topo, compute)
    ps = ps_phase(context, batch, topo, compute)
    sums = KindSums.of(context, batch, ps.rows, ps.variables)
    memory = memory_phase(context, batch, topo, compute, sums, ps.held)
    kinds = context.kinds
    tensors = update_tensors(context, batch, compute, sums)
    update = update_seconds(context, topo.kind, update_bytes(context, batch, topo, compute, sums), tensors)
    update += gradient_pass_bytes(context, batch, topo, compute, sums) / (
        kinds.memory_bandwidth[topo.kind] * kinds.elementwise_efficiency[topo.kind]
    )
    if context.graph.optimizer.max_grad_norm is not None:
        update += tensors * kinds.clip_tensor_s[topo.kind]
    step, breakdown = _compose(
        batch,
        compute,
        coll,
        ps,
        update,
        kinds.comm_overlap[topo.kind],
        kinds.comm_latency_contention[topo.kind],
        ps_overlap=np.where(topo.nccl, 1.0, kinds.comm_overlap[topo.kind]),
    )
    global_batch = context.batch_size * batch.data.astype(np.float64)
    samples = np.divide(global_batch, step, out=np.zeros_like(step), where=step > 0)
    extra = _detail(ps, coll, memory) if detail else {}
    feasible = memory.feasible & supported(context, batch, topo)
    return BatchResult(step, samples, memory.peak, memory.capacity, feasible, breakdown, memory.server_over, extra)


def supported(context: SimContext, batch: CandidateBatch, topo: Topology) -> np.ndarray:
    """[N] whether the device can run the candidate's numerics (fp8 needs fp8 tensor cores), and whether
    its step can clip the graph's gradient: an asynchronous server applies each worker's push alone, so
    no whole gradient exists to take the norm of."""
    ok = (batch.precision != Precision.FP8) | context.kinds.peaks.fp8[topo.kind]
    if context.graph.optimizer.max_grad_norm is not None:
        ok &= ~unclippable(batch)
    return ok


def unclippable(batch: CandidateBatch) -> np.ndarray:
    """[N] rows whose parameter servers run asynchronously (ASP)."""
    return (batch.consistency == ConsistencyKind.ASP) & (batch.kind == SyncKind.PS).any(axis=1)


def _compose(
    batch: CandidateBatch,
    compute: ComputePhase,
    coll: CollectivePhase,
    ps: PSPhase,
    update: np.ndarray,
    overlap: np.ndarray,
    contention: np.ndarray,
    *,
    ps_overlap: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    end = compute.end
    busy = coll.allreduce_busy + coll.sharded_busy
    latency_share = np.divide(coll.latency_busy, busy, out=np.zeros_like(busy), where=busy > 0)
    stolen_c = _stolen(end, coll.finish, busy * coll.device_share, overlap, contention * latency_share)
    stolen_p = _stolen(end, ps.finish, ps.throughput + ps.last_pull, ps_overlap, np.zeros_like(overlap))
    collectives_done = np.maximum(end, coll.finish) + stolen_c + stolen_p
    local = collectives_done + update + coll.all_gather
    bsp = np.maximum(collectives_done, ps.finish + stolen_c + stolen_p) + update + coll.all_gather
    staleness = batch.staleness.astype(np.float64)
    ssp = np.maximum(np.maximum(local, ps.throughput), bsp - staleness * local)
    asp = np.maximum(local, ps.throughput)
    step = np.where(batch.consistency == ConsistencyKind.SSP, ssp, bsp)
    step = np.where(batch.consistency == ConsistencyKind.ASP, asp, step)

    exposed = collectives_done - end - stolen_p
    ar_share = np.divide(coll.allreduce_busy, busy, out=np.zeros_like(busy), where=busy > 0)
    columns = {
        "compute": compute.compute,
        "tensor_parallel": compute.tensor_parallel,
        "pipeline_bubble": compute.bubble,
        "pipeline_p2p": compute.p2p,
        "allreduce": exposed * ar_share,
        "sharded": exposed * (1 - ar_share) + coll.all_gather + compute.fsdp,
        "ps": step - local + stolen_p,
        "optimizer_update": update,
        "context_parallel": compute.context_parallel,
    }
    return step, np.stack([columns[k] for k in BREAKDOWN_KEYS], axis=1)


def _stolen(
    end: np.ndarray, finish: np.ndarray, busy: np.ndarray, overlap: np.ndarray, contention: np.ndarray
) -> np.ndarray:
    """Seconds a channel's transfers take from compute they overlap on the same cores.

    Every transfer is ready by `end`, so the channel works without a gap from `end` to `finish`; the
    rest of its `busy` time ran during compute. Of that, the share the device cannot overlap
    (1 - `comm_overlap`: most of it when compute and communication take turns on the same CPU cores,
    none on a GPU) delays compute, and everything after it, by as much; `contention` (latency
    contention times the channel's latency share of `busy`) adds what the hidden collectives' hand-offs
    take on cores the compute holds."""
    hidden = np.maximum(busy - np.maximum(finish - end, 0.0), 0.0)
    return (1.0 - overlap + contention) * hidden


def _detail(ps: PSPhase, coll: CollectivePhase, memory: MemoryPhase) -> dict[str, np.ndarray]:
    return {
        "ps_node_seconds": ps.node_seconds,
        "ps_node_bytes": ps.node_bytes,
        "ps_held": ps.held,
        "allreduce_bytes": coll.allreduce_bytes,
        "allreduce_busy": coll.allreduce_busy,
        "collective_latency": coll.latency_busy,
    }
