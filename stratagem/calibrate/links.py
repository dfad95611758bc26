"""A node's GPU link measured as NCCL sees it: an all-reduce sweep by message size, fitted back into a `Link`.

`stratagem calibrate --gpu` on a node with several GPUs of one kind starts one rank per GPU joined by
NCCL (`workers.RankJob(backend="nccl", probes="links")`); each times `torch.distributed.all_reduce` of
fp32 buffers from 8 bytes to 1 GiB (`LINK_SIZES`, the span nccl-tests' `all_reduce_perf` sweeps), each
from a barrier and until the device is done, and the slowest rank's medians are kept. The fit inverts
the model the simulator prices NCCL with (`stratagem.ir.nccl`, `simulator.collectives`):

- bus bandwidth B from the two largest buffers, where NCCL runs its Simple-protocol ring:
  t(n) = latency + 2(p-1)/p · n/B, so B = 2(p-1)/p · Δn/Δt (nccl-tests' `busbw`);
- the link's latency (one Simple ring step) from the smallest buffers, where NCCL runs LL:
  t = base_LL + 2(p-1) · step_LL + 2(p-1)/p · n/(0.5 B), and a Simple step is step_LL × NCCL's
  Simple/LL ratio on the link.

The sweep itself only calls `torch.distributed`, so it runs under gloo on CPU ranks too (how its code is
tested here); the fit is a pure function of sizes and seconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from stratagem.ir import Link
from stratagem.ir.nccl import BASE_LATENCY_US, LL, RING_EFFICIENCY, SIMPLE, step_ratio

LINK_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20, 1 << 30)
"""Buffer bytes the sweep all-reduces: the small ones pin the latency, the two largest the bandwidth."""
LATENCY_SIZES = 2
"""How many of the smallest buffers pin the latency (their median)."""
LINK_CLASSES = {"nvlink": "nvlink", "pcie": "pcie"}
"""A link kind's class in NCCL's tuning tables."""


def sweep_seconds(device: str, sizes: Sequence[int] = LINK_SIZES, *, repeats: int = 5) -> list[float]:
    """Median seconds of one all-reduce per buffer size on the default process group, each timed from a
    barrier until this rank's device is done (the buffers kept, as a step's buckets are)."""
    cuda = torch.device(device).type == "cuda"
    medians = []
    for size in sizes:
        buffer = torch.ones(max(1, size // 4), device=device)
        samples = []
        for _ in range(repeats + 2):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            start = torch.cuda.Event(enable_timing=True) if cuda else None
            end = torch.cuda.Event(enable_timing=True) if cuda else None
            began = time.perf_counter()
            if start is not None:
                start.record()
            dist.all_reduce(buffer)
            if end is not None and start is not None:
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3)
            else:
                samples.append(time.perf_counter() - began)
        medians.append(statistics.median(samples[2:]))
    return medians


def fit_nccl_link(sizes: Sequence[float], seconds: Sequence[float], ranks: int, kind: str) -> Link:
    """The link whose NCCL ring reproduces the sweep: bus bandwidth from the two largest buffers, the
    Simple ring step from the smallest ones' LL time (see the module docstring)."""
    if ranks < 2 or len(sizes) < LATENCY_SIZES + 2 or len(sizes) != len(seconds):
        raise ValueError(f"a link fit needs two or more ranks and {LATENCY_SIZES + 2} or more sizes with times")
    link_class = LINK_CLASSES.get(kind, "pcie")
    p = float(ranks)
    steps = 2 * (p - 1)
    slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
    bus = steps / p / slope if slope > 0 else steps / p * sizes[-1] / seconds[-1]
    per_byte_ll = steps / p / (RING_EFFICIENCY[LL] * bus)
    small = statistics.median(t - n * per_byte_ll for n, t in zip(sizes[:LATENCY_SIZES], seconds, strict=False))
    step_ll = max(small - BASE_LATENCY_US["ring"][LL] * 1e-6, 0.0) / steps
    simple_step = step_ll / step_ratio(link_class, "ring", LL) * step_ratio(link_class, "ring", SIMPLE)
    return Link(kind=kind, bandwidth_gbps=bus * 8 / 1e9, latency_us=max(simple_step * 1e6, 0.0), efficiency=1.0)  # type: ignore[arg-type]


def busbw(sizes: Sequence[float], seconds: Sequence[float], ranks: int) -> list[float]:
    """nccl-tests' bus bandwidth of each all-reduce: 2(p-1)/p · n / t, bytes per second."""
    factor = 2 * (ranks - 1) / ranks
    return [factor * n / t if t > 0 else 0.0 for n, t in zip(sizes, seconds, strict=True)]
