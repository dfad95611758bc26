"""Measure this machine and describe it as a ResourceSpec, so trials here can be predicted.

Everything is measured the way a trial runs: `ranks` processes with `threads` threads each, joined by
gloo, all measuring at the same time, so they share cores, caches and memory bandwidth as trial ranks
do (and a machine busy with other work shows up as a slower machine). Each figure is the median of
repeated runs (what a typical step sees, not the luckiest run) from the slowest rank (it paces a
synchronous step). In about 15-30 seconds:

- matmul FLOP/s: a Linear layer's forward and backward (its three matmuls), fp32; a bf16 matmul;
- convolution FLOP/s: a 3x3 convolution's forward and backward -> `conv_efficiency` (vs. matmul);
- memory bandwidth: copying 64 MB (read + write bytes per second);
- element-wise kernels (LayerNorm + GELU, BatchNorm + ReLU, forward and backward), priced on the bytes
  the simulator counts for them (each op's inputs and outputs forward, twice that backward)
  -> `elementwise_efficiency`;
- per-layer overhead of training: a chain of tiny Linear layers, forward and backward; the difference
  between a long and a short chain, per layer and pass, so the backward call's own cost cancels
  -> `launch_overhead_s`;
- the optimizer update: Adam's step, priced on the bytes the simulator counts (3 x parameters +
  2 x state) -> `optimizer_efficiency`;
- gloo all-reduce of 4 B to 8 MB; the ring model t(n) = 2(p-1)·α + 2(p-1)/p · n/B fitted by least
  squares gives α and B;
- overlap: all-reduces launched while the rank computes; the share of their time that hides behind
  the compute (1: all of it, 0: they take turns on the cores) -> `comm_overlap`.

The spec has one node at 127.0.0.1 whose `ranks` CPUs are the devices, of kind `CPU-calibrated`
(also registered under `CPU`, so every consumer asking for the node's kind gets the measured figures).
Measured rates are what the kernels *reach*, so matmul efficiency is 1. The simulator reads the spec
like any other; nothing here imports it. Workers are plain subprocesses that report through JSON files.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stratagem.errors import InvalidResourceSpecError, Problem, StratagemError
from stratagem.ir import DeviceSpec, Link, Node, ResourceSpec

DEVICE_KIND = "CPU-calibrated"
SIZES = (4, 4096, 256 << 10, 2 << 20, 8 << 20)
"""All-reduce buffer sizes in bytes: small ones pin the latency, large ones the bandwidth."""
WORKER_TIMEOUT_S = 120.0
UPDATE_BYTES_PER_PARAM = 3 * 4 + 2 * 8
"""What the simulator counts for an fp32 Adam update: parameter and gradient in, parameter out (3 x 4
bytes), two state tensors in and out (2 x 8 bytes)."""
RATES = ("matmul_flops", "bf16_flops", "conv_flops", "copy_bandwidth", "elementwise_rate", "optimizer_rate", "overlap")
"""Figures where a higher value is better: the slowest rank's is the smallest."""


class CalibrationError(StratagemError):
    """A measurement could not be taken (the gloo workers failed or timed out)."""


def calibrate(ranks: int = 2, *, threads: int = 1, address: str = "127.0.0.1") -> ResourceSpec:
    """A one-node ResourceSpec with this machine's figures, measured by `ranks` concurrent ranks."""
    if ranks < 2:
        raise InvalidResourceSpecError([Problem("ranks", f"must be at least 2 to measure a collective, got {ranks}")])
    figures = measure(ranks, threads=threads)
    alpha, beta = fit_ring(SIZES, figures["allreduce_seconds"], ranks)
    device = device_spec(figures, memory_bytes=_physical_memory() / ranks)
    link = Link(kind="loopback", bandwidth_gbps=beta * 8 / 1e9, latency_us=alpha * 1e6, efficiency=1.0)
    return ResourceSpec(
        name=f"calibrated-{socket.gethostname()}",
        nodes=[Node(address=address, chief=True, cpus=list(range(ranks)), device=DEVICE_KIND)],
        network=link,
        intra_node=link,
        devices={DEVICE_KIND: device, "CPU": device.model_copy(update={"name": "CPU"})},
        provenance={
            "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "ranks": ranks,
            "threads": threads,
            "allreduce_bytes": list(SIZES),
            **figures,
        },
    )


def device_spec(figures: dict[str, Any], *, memory_bytes: float) -> DeviceSpec:
    """The measured rates as a device kind: efficiencies relative to the measured matmul rate and copy
    bandwidth, clamped into (0, 1] (a kernel that beats a plain copy is priced at the copy's speed)."""
    matmul, bandwidth = figures["matmul_flops"], figures["copy_bandwidth"]
    return DeviceSpec(
        name=DEVICE_KIND,
        peak_flops={"float32": matmul, "bfloat16": figures["bf16_flops"], "float16": figures["bf16_flops"]},
        memory_bytes=memory_bytes,
        memory_bandwidth=bandwidth,
        matmul_efficiency=1.0,
        elementwise_efficiency=_fraction(figures["elementwise_rate"] / bandwidth),
        launch_overhead_s=max(figures["layer_overhead_s"], 0.0),
        conv_efficiency=_fraction(figures["conv_flops"] / matmul),
        optimizer_efficiency=_fraction(figures["optimizer_rate"] / bandwidth),
        comm_overlap=min(max(figures["overlap"], 0.0), 1.0),
        is_gpu=False,
    )


def _fraction(value: float) -> float:
    return min(max(value, 1e-3), 1.0)


def fit_ring(sizes: Sequence[float], seconds: Sequence[float], ranks: int) -> tuple[float, float]:
    """Fit t(n) = 2(p-1)·α + 2(p-1)/p · n/B; returns (α seconds, B bytes/s).

    The fit minimizes *relative* error (weights 1/t), so the microsecond latencies of small buffers
    count as much as the milliseconds of large ones. α is floored at 1 µs and B kept positive, so a
    noisy measurement still gives a usable link."""
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    slope, intercept = np.polyfit(n, t, 1, w=1.0 / t)
    p = float(ranks)
    if slope <= 0:
        slope = float(t.max() / n.max())
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


def measure(ranks: int, *, threads: int = 1) -> dict[str, Any]:
    """Start `ranks` gloo workers on this machine and return their combined figures."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="stratagem-calibrate-") as folder:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        results = [Path(folder) / f"rank{rank}.json" for rank in range(ranks)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "stratagem.calibrate", "--worker", str(rank), str(ranks), str(port), str(results[rank]), str(threads)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for rank in range(ranks)
        ]
        errors = _wait_all(procs)
        missing = [str(path.name) for path in results if not path.exists()]
        if errors or missing:
            raise CalibrationError(f"calibration workers failed: {'; '.join(errors) or 'no result from ' + ', '.join(missing)}")
        return combine([json.loads(path.read_text()) for path in results])


def _wait_all(procs: list[subprocess.Popen]) -> list[str]:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
                other.wait()
            return [f"timed out after {WORKER_TIMEOUT_S:.0f} s"]
        if proc.returncode != 0:
            errors.append(f"rank {rank} exited {proc.returncode}: {stderr.strip().splitlines()[-1] if stderr.strip() else ''}")
    return errors


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _physical_memory() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# -- the worker: one rank's measurements (runs in its own process) ------------------------------------------


def median_seconds(run: Callable[[], object], *, budget_s: float, least: int = 3, most: int = 40) -> float:
    """Median wall time of `run` over repeats filling about `budget_s` (after one untimed warm-up)."""
    run()
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < most and (len(samples) < least or time.perf_counter() < deadline):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _train_pass(module: Any, x: Any) -> Callable[[], None]:
    def run() -> None:
        module(x).sum().backward()

    return run


def compute_figures(sync: Callable[[], object] = lambda: None) -> dict[str, float]:
    """This rank's compute, memory, per-layer and optimizer figures; `sync` (a barrier) runs before each
    probe so every rank measures the same thing at the same time."""
    import torch
    from torch import nn

    tokens, width = 1024, 512
    x = torch.randn(tokens, width, requires_grad=True)
    a, b = torch.randn(512, 512, dtype=torch.bfloat16), torch.randn(512, 512, dtype=torch.bfloat16)
    images = torch.randn(16, 32, 32, 32, requires_grad=True)
    src = torch.ones(16 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    probes: dict[str, Callable[[], float]] = {
        "matmul_flops": lambda: 3 * 2.0 * tokens * width * width / median_seconds(
            _train_pass(nn.Linear(width, width, bias=False), x), budget_s=1.0),
        "bf16_flops": lambda: 2.0 * 512**3 / median_seconds(lambda: torch.mm(a, b), budget_s=0.5),
        "conv_flops": lambda: 3 * 2.0 * 9 * 32 * images.numel() / median_seconds(
            _train_pass(nn.Conv2d(32, 32, 3, padding=1, bias=False), images), budget_s=1.0),
        "copy_bandwidth": lambda: 2.0 * src.nbytes / median_seconds(lambda: dst.copy_(src), budget_s=0.5),
        "elementwise_rate": _elementwise_rate,
        "layer_overhead_s": _layer_overhead,
        "optimizer_rate": _optimizer_rate,
    }
    figures = {}
    for name, probe in probes.items():
        sync()
        figures[name] = probe()
    return figures


def _elementwise_rate() -> float:
    """Bytes/s of norm and activation layers, on the bytes the simulator counts: forward reads and
    writes each tensor once per op (2 x its bytes per op, four ops), backward twice the forward."""
    import torch
    from torch import nn

    tokens = torch.randn(2048, 512, requires_grad=True)
    images = torch.randn(16, 32, 32, 32, requires_grad=True)
    layer_norm, batch_norm = nn.LayerNorm(512), nn.BatchNorm2d(32)

    def run() -> None:
        out = nn.functional.gelu(layer_norm(tokens)).sum() + torch.relu(batch_norm(images)).sum()
        out.backward()

    forward_bytes = 2 * 2.0 * (tokens.nbytes + images.nbytes)
    return 3 * forward_bytes / median_seconds(run, budget_s=1.0)


def _layer_overhead() -> float:
    """Seconds per layer and pass beyond arithmetic: (long chain - short chain) / (2 passes x extra layers)."""
    import torch
    from torch import nn

    x = torch.randn(1, 4)
    long_chain, short_chain = nn.Sequential(*[nn.Linear(4, 4) for _ in range(64)]), nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)])
    long = median_seconds(_train_pass(long_chain, x), budget_s=0.5, least=5)
    short = median_seconds(_train_pass(short_chain, x), budget_s=0.3, least=5)
    return (long - short) / (2 * (64 - 8))


def _optimizer_rate() -> float:
    """Bytes/s of an Adam step over 2M parameters, on the bytes the simulator counts."""
    import torch

    params = [torch.zeros(1 << 17, requires_grad=True) for _ in range(16)]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params)
    count = sum(p.numel() for p in params)
    return UPDATE_BYTES_PER_PARAM * count / median_seconds(optimizer.step, budget_s=1.0)


def allreduce_seconds(dist: Any, torch: Any) -> list[float]:
    """Median seconds of one all-reduce per size in SIZES, each timed from a barrier."""
    medians = []
    for size in SIZES:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32)
        repeats = 10 if size <= 65536 else 4
        samples = []
        for i in range(repeats + 2):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            if i >= 2:
                samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians


def overlap_share(dist: Any, torch: Any, *, repeats: int = 3) -> float:
    """How much of the all-reduce time hides behind compute: (C + A - both) / min(C, A), where C is a
    burst of matmul layers alone, A a burst of 1 MB all-reduces alone, and both the all-reduces launched
    asynchronously before the same compute (as the runtime launches buckets during backward)."""
    from torch import nn

    layer, x = nn.Linear(512, 512, bias=False), torch.randn(1024, 512, requires_grad=True)
    buffers = [torch.ones(1 << 18) for _ in range(16)]

    def compute() -> None:
        for _ in range(4):
            layer(x).sum().backward()

    def reduce_all() -> list[Any]:
        return [dist.all_reduce(b, async_op=True) for b in buffers]

    def timed(run: Callable[[], None]) -> float:
        dist.barrier()
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    def both() -> None:
        works = reduce_all()
        compute()
        for work in works:
            work.wait()

    def comm_only() -> None:
        for work in reduce_all():
            work.wait()

    compute()
    comm_only()
    shares = []
    for _ in range(repeats):
        alone_c, alone_a, together = timed(compute), timed(comm_only), timed(both)
        shares.append((alone_c + alone_a - together) / min(alone_c, alone_a))
    return statistics.median(shares)


def _worker(rank: int, world: int, port: int, result: str, threads: int) -> None:
    """One rank: every measurement at the same time as the other ranks; writes its figures as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    torch.manual_seed(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S))
    try:
        dist.barrier()
        figures: dict[str, Any] = dict(compute_figures(dist.barrier))
        figures["allreduce_seconds"] = allreduce_seconds(dist, torch)
        figures["overlap"] = overlap_share(dist, torch)
        Path(result).write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
