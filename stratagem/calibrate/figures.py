"""The measured figures and how they become a ResourceSpec.

A calibration's figures are rates (bytes or FLOP per second), times and ratios, one set per rank;
`combine` keeps the slowest rank's, as a synchronous step waits for its slowest rank. The spec they
describe has one node at `address` whose CPUs are the devices, of kind `DEVICE_KIND` (also registered
under `CPU`, so every consumer asking for the node's kind gets the measured figures), and one link,
fitted to the all-reduce buckets (`fit_ring`). Measured rates are what the kernels reach, so matmul
efficiency is 1; the other efficiencies are rates relative to the matmul rate or the copy bandwidth.
The spec records the figures as its provenance, so `reread` can rebuild it as today's reading of the
same measurement. Nothing here imports torch or the simulator.
"""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratagem.errors import InvalidResourceSpecError, Problem
from stratagem.ir import DeviceSpec, Link, Node, ResourceSpec

DEVICE_KIND = "CPU-calibrated"
SIZES = (4, 4096, 256 << 10, 2 << 20, 8 << 20, 32 << 20)
"""All-reduce buffer sizes in bytes: small ones pin the latency, large ones the bandwidth (up to a
bucket larger than DDP's default 25 MB, since a CPU's caches make the cost per byte depend on size)."""
UPDATE_BYTES_PER_PARAM = 3 * 4 + 2 * 8
"""What the simulator counts for an fp32 Adam update: parameter and gradient in, parameter out (3 x 4
bytes), two state tensors in and out (2 x 8 bytes)."""
OPTIMIZER_TENSOR_BYTES = (2 << 20, 32 << 20)
"""Parameter bytes per tensor of the two optimizer probes: 16 tensors of 2 MB, one of 32 MB."""
LOWRANK_MATRIX_BYTES = (1 << 20, 16 << 20)
"""Bytes per matrix of the two PowerSGD probes on a CPU: 16 matrices of 512 x 512, one of 2048 x 2048."""
RATES = (
    "matmul_flops",
    "bf16_flops",
    "conv_flops",
    "copy_bandwidth",
    "elementwise_rate",
    "norm_rate",
    "optimizer_rate",
    "optimizer_large_rate",
    "stream_rate",
    "cast_rate",
    "select_rate",
    "lowrank_rate",
    "lowrank_large_rate",
    "coalesce_rate",
    "scatter_efficiency",
    "gather_efficiency",
    "half_reduce_efficiency",
    "half_wire_efficiency",
    "reduce_efficiency",
    "broadcast_efficiency",
    "overlap",
)
"""Figures where a higher value is better: the slowest rank's is the smallest."""

SHARED_CORE_OVERLAP = 0.2
"""`comm_overlap` of ranks with no core to spare for gloo's threads. Communication and compute take
turns on the cores, but not strictly: a bucket's copies fill moments a rank's compute leaves idle (a
wait on its peer). Fitted together with the contention below to measured steps of the accuracy
benchmark (a grid of 0.1-0.3 and 1-2; the best within-model Kendall tau, then MAPE) and checked on
steps the fit did not see (docs/simulator.md, "Shared cores")."""
SHARED_CORE_LATENCY_CONTENTION = 1.5
"""`comm_latency_contention` of the same ranks: a collective that runs while the compute threads hold
the cores takes about one and a half of its latencies from that compute (its launch and its thread's
wake-ups each wait for, and preempt, a busy core), which is why one all-reduce per variable launched
in backward measures slower than one fused bucket launched at its end."""
LATENCY_SIZES = 3
"""How many of the smallest buffers pin the latency (their median, robust to one late wake-up)."""


def spec_from_figures(provenance: dict[str, Any], *, address: str = "127.0.0.1") -> ResourceSpec:
    """The ResourceSpec a calibration's provenance (its settings and combined figures) describes."""
    ranks = int(provenance["ranks"])
    alpha, beta = fit_ring(provenance["allreduce_bytes"], provenance["allreduce_seconds"], ranks)
    device = device_spec(provenance, memory_bytes=physical_memory() / ranks)
    link = Link(kind="loopback", bandwidth_gbps=beta * 8 / 1e9, latency_us=alpha * 1e6, efficiency=1.0)
    return ResourceSpec(
        name=f"calibrated-{socket.gethostname()}",
        nodes=[Node(address=address, chief=True, cpus=list(range(ranks)), device=DEVICE_KIND)],
        network=link,
        intra_node=link,
        devices={DEVICE_KIND: device, "CPU": device.model_copy(update={"name": "CPU"})},
        provenance=provenance,
    )


def reread(spec: ResourceSpec) -> ResourceSpec:
    """`spec` rebuilt from the figures it recorded (its provenance), so that a trial recorded long ago
    is predicted with today's fit and size laws as well as today's simulator; a spec that was not
    calibrated stays as it is."""
    provenance = spec.provenance or {}
    if "allreduce_seconds" not in provenance or not spec.nodes:
        return spec
    return spec_from_figures(dict(provenance), address=spec.nodes[0].address)


def average(specs: Sequence[ResourceSpec]) -> ResourceSpec:
    """One spec for a stretch of time bracketed by calibrations (e.g. one before and one after a block of
    trials), on a machine whose load drifts: work that ran during the stretch took the mean of the times
    each calibration measured, so rates average harmonically and times arithmetically."""
    figures = [spec.provenance for spec in specs]
    if not figures or any("allreduce_seconds" not in f for f in figures):
        raise InvalidResourceSpecError(
            [Problem("provenance", "averaging needs calibrated specs (with their measured figures)")]
        )
    first = figures[0]
    out: dict[str, Any] = {
        key: first[key] for key in ("ranks", "threads", "allreduce_bytes", "spare_cores") if key in first
    }
    for key in (*RATES, "layer_overhead_s", "lowrank_round_s"):
        if any(key not in f for f in figures):
            continue
        values = [float(f[key]) for f in figures]
        harmonic = key in RATES and key != "overlap" and min(values) > 0
        out[key] = len(values) / sum(1.0 / v for v in values) if harmonic else statistics.fmean(values)
    out["allreduce_seconds"] = [
        statistics.fmean(column) for column in zip(*(f["allreduce_seconds"] for f in figures), strict=True)
    ]
    out["calibrated_at"] = [f.get("calibrated_at") for f in figures]
    return spec_from_figures(out, address=specs[0].nodes[0].address)


def device_spec(figures: dict[str, Any], *, memory_bytes: float) -> DeviceSpec:
    """The measured rates as a device kind: efficiencies relative to the measured matmul rate and copy
    bandwidth, clamped into (0, 1] (a kernel that beats a plain copy is priced at the copy's speed).
    A figure the calibration did not record keeps the device's default."""
    matmul, bandwidth = figures["matmul_flops"], figures["copy_bandwidth"]
    small_tensor_rate, knee = optimizer_size_law(figures["optimizer_rate"], figures.get("optimizer_large_rate"))
    lowrank_rate, lowrank_knee = (
        size_law(figures["lowrank_rate"], figures.get("lowrank_large_rate"), LOWRANK_MATRIX_BYTES)
        if "lowrank_rate" in figures
        else (None, None)
    )

    def share(key: str) -> float | None:
        return fraction(figures[key] / bandwidth) if key in figures else None

    def ratio(key: str) -> float | None:
        return bounded(figures[key], 8.0) if key in figures else None

    return DeviceSpec(
        name=DEVICE_KIND,
        peak_flops={"float32": matmul, "bfloat16": figures["bf16_flops"], "float16": figures["bf16_flops"]},
        memory_bytes=memory_bytes,
        memory_bandwidth=bandwidth,
        matmul_efficiency=1.0,
        elementwise_efficiency=fraction(figures["elementwise_rate"] / bandwidth),
        norm_efficiency=fraction(figures["norm_rate"] / bandwidth),
        launch_overhead_s=max(figures["layer_overhead_s"], 0.0),
        conv_efficiency=fraction(figures["conv_flops"] / matmul),
        optimizer_efficiency=fraction(small_tensor_rate / bandwidth),
        optimizer_knee_bytes=knee,
        optimizer_tensor_s=figures.get("optimizer_tensor_s"),
        stream_efficiency=share("stream_rate"),
        cast_efficiency=share("cast_rate"),
        select_efficiency=share("select_rate"),
        full_select_efficiency=share("full_select_rate"),
        lowrank_efficiency=fraction(lowrank_rate / bandwidth) if lowrank_rate else None,
        lowrank_knee_bytes=lowrank_knee,
        coalesce_efficiency=share("coalesce_rate"),
        scatter_efficiency=ratio("scatter_efficiency"),
        gather_efficiency=ratio("gather_efficiency"),
        half_reduce_efficiency=ratio("half_reduce_efficiency"),
        reduce_efficiency=ratio("reduce_efficiency"),
        broadcast_efficiency=ratio("broadcast_efficiency"),
        lowrank_round_s=min(figures["lowrank_round_s"], 1.0) if "lowrank_round_s" in figures else None,
        **_sharing(figures),
        is_gpu=False,
    )


def _sharing(figures: dict[str, Any]) -> dict[str, Any]:
    """`comm_overlap` and `comm_latency_contention`: measured where a core was spare for communication,
    the shared-core figures where none was (a calibration that did not record it measured its overlap)."""
    if figures.get("spare_cores", 1) <= 0:
        return {"comm_overlap": SHARED_CORE_OVERLAP, "comm_latency_contention": SHARED_CORE_LATENCY_CONTENTION}
    return {"comm_overlap": min(max(figures["overlap"], 0.0), 1.0), "comm_latency_contention": 0.0}


def optimizer_size_law(rate: float, large_rate: float | None) -> tuple[float, float | None]:
    """`size_law` of the two optimizer probes."""
    return size_law(rate, large_rate, OPTIMIZER_TENSOR_BYTES)


def size_law(rate: float, large_rate: float | None, sizes: tuple[int, int]) -> tuple[float, float | None]:
    """(rate for small tensors, knee bytes) from a probe on small tensors and one on a large tensor
    (`sizes`: bytes per tensor of each), with the per-byte cost growing as `1 + bytes / knee`: their
    ratio r solves `(1 + large / knee) / (1 + small / knee) = r`. No knee when the large tensor is not
    slower per byte (within 5%)."""
    small, large = sizes
    ratio = rate / large_rate if large_rate else 1.0
    if ratio <= 1.05:
        return rate, None
    knee = max((large - ratio * small) / (ratio - 1.0), float(small))
    return rate * (1.0 + small / knee), knee


def fraction(value: float) -> float:
    return bounded(value, 1.0)


def bounded(value: float, most: float) -> float:
    return min(max(value, 1e-3), most)


def fit_ring(sizes: Sequence[float], seconds: Sequence[float], ranks: int) -> tuple[float, float]:
    """Hockney's two ends of t(n) = 2(p-1)·α + 2(p-1)/p · n/B; returns (α seconds, B bytes/s).

    B is the slope between the two largest buffers: what a byte costs at the sizes buckets have (MBs,
    beyond the caches). α is the median time of the smallest buffers once their bytes are paid. A
    least-squares line through every size would let the small buffers' flat floor (a rank's wake-up
    on loopback TCP, about 1 ms on a busy 2-core machine) tilt the slope, so it mispriced exactly the
    large buckets a step moves. α is floored at 1 µs and B kept positive, so a noisy measurement
    still gives a usable link."""
    n, t = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    order = np.argsort(n)
    if n.shape != t.shape or n.size < 2 or n[order[-1]] == n[order[-2]]:
        raise InvalidResourceSpecError(
            [
                Problem(
                    "allreduce_bytes",
                    "the link fit needs one all-reduce time per size, and its two largest sizes different",
                )
            ]
        )
    n, t = n[order], t[order]
    p = float(ranks)
    slope = (t[-1] - t[-2]) / (n[-1] - n[-2])
    if slope <= 0:
        slope = float(t[-1] / n[-1])
    intercept = float(np.median(t[:LATENCY_SIZES] - slope * n[:LATENCY_SIZES]))
    alpha = max(intercept / (2 * (p - 1)), 1e-6)
    beta = 2 * (p - 1) / p / slope
    return alpha, beta


def combine(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The slowest rank's figure for each measurement: the lowest rate, the longest time."""
    out: dict[str, Any] = {}
    for key in per_rank[0]:
        values = [report[key] for report in per_rank]
        if isinstance(values[0], list):
            out[key] = [max(column) for column in zip(*values, strict=True)]
        else:
            out[key] = min(values) if key in RATES else max(values)
    return out


def physical_memory() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
