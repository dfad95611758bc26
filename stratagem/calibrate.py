"""Measure this machine and describe it as a ResourceSpec, so trials here can be predicted.

What is measured, in about 10-20 seconds:

- matrix-multiply FLOP/s (torch fp32 and bf16 matmul, `threads` CPU threads, as a trial rank runs);
- memory bandwidth (copying a tensor much larger than the caches: read + write bytes per second);
- per-layer dispatch overhead (a tiny Linear forward);
- loopback collective cost with gloo: `ranks` processes all-reduce buffers from 4 B to 8 MB; the
  ring model t(n) = 2(p-1)·α + 2(p-1)/p · n/B is fitted by least squares, giving α and B.

The spec has one node at 127.0.0.1 whose `ranks` CPUs are the devices, of kind `CPU-calibrated`
(also registered under `CPU`, so every consumer asking for the node's kind gets the measured figures).
Measured figures are what kernels *reach*, so efficiencies are 1. The simulator reads the spec like
any other; nothing here imports it. Workers are plain subprocesses that report through a JSON file.
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

import numpy as np

from stratagem.errors import InvalidResourceSpecError, Problem, StratagemError
from stratagem.ir import DeviceSpec, Link, Node, ResourceSpec

DEVICE_KIND = "CPU-calibrated"
SIZES = (4, 4096, 256 << 10, 2 << 20, 8 << 20)
"""All-reduce buffer sizes in bytes: small ones pin the latency, large ones the bandwidth."""
WORKER_TIMEOUT_S = 90.0


class CalibrationError(StratagemError):
    """A measurement could not be taken (the gloo workers failed or timed out)."""


def calibrate(ranks: int = 2, *, threads: int = 1, address: str = "127.0.0.1") -> ResourceSpec:
    """A one-node ResourceSpec with this machine's measured compute, memory and loopback figures."""
    if ranks < 2:
        raise InvalidResourceSpecError([Problem("ranks", f"must be at least 2 to measure a collective, got {ranks}")])
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fp32 = matmul_flops(torch.float32)
        bf16 = matmul_flops(torch.bfloat16, size=512)
        bandwidth = copy_bandwidth()
        launch = dispatch_overhead()
    finally:
        torch.set_num_threads(previous)
    sizes, seconds = allreduce_timings(ranks, threads=threads)
    alpha, beta = fit_ring(sizes, seconds, ranks)
    memory = _physical_memory() / ranks
    device = DeviceSpec(
        name=DEVICE_KIND,
        peak_flops={"float32": fp32, "bfloat16": bf16, "float16": bf16},
        memory_bytes=memory,
        memory_bandwidth=bandwidth,
        matmul_efficiency=1.0,
        elementwise_efficiency=1.0,
        launch_overhead_s=launch,
        is_gpu=False,
    )
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
            "allreduce_bytes": list(sizes),
            "allreduce_seconds": list(seconds),
            "torch": torch.__version__,
        },
    )


def _best_rate(work: float, run: Callable[[], None], *, repeats: int = 5, budget_s: float = 2.0) -> float:
    """work / the fastest of a few timed runs (the fastest is the least disturbed by neighbours)."""
    run()
    best, deadline = float("inf"), time.perf_counter() + budget_s
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return work / best


def matmul_flops(dtype: object, size: int = 1024) -> float:
    """FLOP/s of an n×n by n×n matmul: 2n³ operations."""
    import torch

    a = torch.randn(size, size, dtype=dtype)  # type: ignore[arg-type]
    b = torch.randn(size, size, dtype=dtype)  # type: ignore[arg-type]
    return _best_rate(2.0 * size**3, lambda: torch.mm(a, b), budget_s=1.0)


def copy_bandwidth(nbytes: int = 64 << 20) -> float:
    """Bytes/s of a large copy, counting the read and the write."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _best_rate(2.0 * nbytes, lambda: dst.copy_(src), budget_s=1.0)


def dispatch_overhead(calls: int = 2000) -> float:
    """Seconds one tiny layer costs beyond its arithmetic: the floor every layer pays per pass."""
    import torch

    layer = torch.nn.Linear(1, 1)
    x = torch.ones(1, 1)
    with torch.no_grad():
        per_batch = _best_rate(1.0, lambda: [layer(x) for _ in range(calls)])
    return 1.0 / per_batch / calls


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


def allreduce_timings(ranks: int, *, threads: int = 1) -> tuple[list[int], list[float]]:
    """Median all-reduce seconds per buffer size, measured by `ranks` gloo processes on loopback."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="stratagem-calibrate-") as folder:
        result = Path(folder) / "rank0.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "stratagem.calibrate", "--worker", str(rank), str(ranks), str(port), str(result), str(threads)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for rank in range(ranks)
        ]
        errors = _wait_all(procs)
        if errors or not result.exists():
            raise CalibrationError(f"gloo all-reduce workers failed: {'; '.join(errors) or 'no result written'}")
        data = json.loads(result.read_text())
    return data["sizes"], data["seconds"]


def _wait_all(procs: list[subprocess.Popen]) -> list[str]:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
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


def _worker(rank: int, world: int, port: int, result: str, threads: int) -> None:
    """One gloo rank: time all_reduce at each size; rank 0 writes the medians as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S))
    try:
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
        if rank == 0:
            Path(result).write_text(json.dumps({"sizes": list(SIZES), "seconds": medians}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
