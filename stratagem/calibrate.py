"""Measure this machine and describe it as a ResourceSpec, so trials here can be predicted.

Everything is measured the way a trial runs: `ranks` processes with `threads` threads each, joined by
gloo, all measuring at the same time, so they share cores, caches and memory bandwidth as trial ranks
do (and a machine busy with other work shows up as a slower machine). Each repeat ends when every
rank is done, as a synchronous step waits for its slowest rank (`Stepper`); each figure is the median
of the repeats (what a typical step sees, not the luckiest run), from the slowest rank. Every compute
probe's repeat starts from cold caches, as each layer of a step does (`CacheEvictor` reads a buffer the
size of the last-level cache first, untimed). In about 15-30 seconds:

- matmul FLOP/s: a Linear layer's forward and backward (its three matmuls), fp32; a bf16 matmul;
- convolution FLOP/s: a 3x3 convolution's forward and backward -> `conv_efficiency` (vs. matmul);
- memory bandwidth: copying 64 MB (read + write bytes per second);
- element-wise kernels (GELU, ReLU) and normalizations (LayerNorm, BatchNorm), forward and backward,
  priced on the bytes the simulator counts for them (each op's inputs and outputs forward, twice that
  backward) -> `elementwise_efficiency` and `norm_efficiency`;
- per-layer overhead of training: a chain of tiny Linear layers, forward and backward; the difference
  between a long and a short chain, per layer and pass, so the backward call's own cost cancels
  -> `launch_overhead_s`;
- the optimizer update: Adam's step over 8M parameters (more than a last-level cache holds), priced
  on the bytes the simulator counts (3 x parameters + 2 x state), once in 2 MB tensors and once in
  one 32 MB tensor: a large tensor costs more per byte (each of the update's passes, and the fresh
  pages of its temporaries, come from memory) -> `optimizer_efficiency` (small tensors) and
  `optimizer_knee_bytes` (`optimizer_size_law`);
- a plain streaming pass, the sum of two 16 MB gradients into a third (counted as its three tensors'
  bytes), as gradient compression makes around its casts and selections -> `stream_efficiency`;
- what gradient compression costs beyond streaming: fp32 -> fp16 -> fp32 casts of a 16 MB gradient
  (each cast counted as its fp32 bytes x 1.5) -> `cast_efficiency`, and the runtime's top-1% selection
  over it (`select_largest`, counted as one pass) -> `select_efficiency`, and the same over its first
  128K entries, which the runtime selects in one full `topk` -> `full_select_efficiency`;
- PowerSGD rank 4 on 16 MB of gradients, run by the runtime's own reducer (counted as the simulator's
  nine passes), once as 16 matrices of 1 MB and once as one of 16 MB -> `lowrank_efficiency` and
  `lowrank_knee_bytes` (`size_law`);
- an Adam step over 256 tensors of 64 elements, per tensor -> `optimizer_tensor_s`;
- coalescing an embedding gradient of 16384 lookups (its values and int64 indices) -> `coalesce_efficiency`;
- a ZeRO bucket of 8 MB (flatten, reduce-scatter, all-gather into a fresh buffer, copy back) against an
  all-reduce bucket of the same gradients (the ring formulas make them equal) -> `scatter_efficiency`;
- an all-gather of 4 MB per rank into fresh per-rank tensors (how sparse rows and top-k entries travel)
  against the all-reduce bucket the ring formulas price the same -> `gather_efficiency`;
- an fp16 bucket of 4M elements (flatten and divide the fp32 gradients, all-reduce 4M fp16 elements)
  against an all-reduce bucket of the same gradients, halved (the fp16 compressor's casts, error
  feedback and copy back are priced apart) -> `half_reduce_efficiency`;
- PowerSGD on 16 matrices of 64 x 64 on the ranks' team against the same on a one-rank team: what
  its two dependent all-reduces cost beyond their bytes -> `lowrank_round_s`;
- a parameter server's push (flatten, reduce to rank 0) and pull (broadcast from it, copy back) of an
  8 MB bucket against an all-reduce bucket of it -> `reduce_efficiency` and `broadcast_efficiency`;
- gloo all-reduce of 4 B to 32 MB buckets (`allreduce_bucket`), as the runtime runs them (flatten, divide, all-reduce, copy
  back); the ring model t(n) = 2(p-1)·α + 2(p-1)/p · n/B gives B from the two largest buckets and α
  from the smallest (`fit_ring`), so the link is described as a bucket sees it, copies included;
- overlap: all-reduces launched while the rank computes; the share of their time that hides behind
  the compute (1: all of it, 0: they take turns on the cores) -> `comm_overlap`. Only measured when
  the machine has cores beyond the ranks' compute threads. Without one a probe would only see the
  neighbours, and the spec takes the shared-core figures instead (`SHARED_CORE_OVERLAP`,
  `SHARED_CORE_LATENCY_CONTENTION`): fitted to real steps, not measured here.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stratagem.errors import InvalidResourceSpecError, Problem, StratagemError
from stratagem.ir import DeviceSpec, Link, Node, ResourceSpec
from stratagem.rank_env import rank_environment

DEVICE_KIND = "CPU-calibrated"
SIZES = (4, 4096, 256 << 10, 2 << 20, 8 << 20, 32 << 20)
"""All-reduce buffer sizes in bytes: small ones pin the latency, large ones the bandwidth (up to a
bucket larger than DDP's default 25 MB, since a CPU's caches make the cost per byte depend on size)."""
WORKER_TIMEOUT_S = 120.0
UPDATE_BYTES_PER_PARAM = 3 * 4 + 2 * 8
"""What the simulator counts for an fp32 Adam update: parameter and gradient in, parameter out (3 x 4
bytes), two state tensors in and out (2 x 8 bytes)."""
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
wait on its peer). Fitted, with the contention below, on accuracy runs S to Y (a grid of 0.1-0.3 and
1-2; the best within-model tau there, then MAPE). On runs AA to AI, which the fit never saw, the
within-model tau is what `principled-1.13` scored without them (docs/simulator.md, "Shared cores")."""
SHARED_CORE_LATENCY_CONTENTION = 1.5
"""`comm_latency_contention` of the same ranks: a collective that runs while the compute threads hold
the cores takes about one and a half of its latencies from that compute (its launch and its thread's
wake-ups each wait for, and preempt, a busy core), which is why one all-reduce per variable launched
in backward measures slower than one fused bucket launched at its end."""


class CalibrationError(StratagemError):
    """A measurement could not be taken (the gloo workers failed or timed out)."""


def calibrate(ranks: int = 2, *, threads: int = 1, address: str = "127.0.0.1") -> ResourceSpec:
    """A one-node ResourceSpec with this machine's figures, measured by `ranks` concurrent ranks."""
    if ranks < 2:
        raise InvalidResourceSpecError([Problem("ranks", f"must be at least 2 to measure a collective, got {ranks}")])
    spare_cores = len(os.sched_getaffinity(0)) - ranks * threads
    figures = measure(ranks, threads=threads, overlap=spare_cores > 0)
    provenance = {
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ranks": ranks,
        "threads": threads,
        "allreduce_bytes": list(SIZES),
        "spare_cores": spare_cores,
        **figures,
    }
    return spec_from_figures(provenance, address=address)


def spec_from_figures(provenance: dict[str, Any], *, address: str = "127.0.0.1") -> ResourceSpec:
    """The ResourceSpec a calibration's provenance (its settings and combined figures) describes."""
    ranks = int(provenance["ranks"])
    alpha, beta = fit_ring(provenance["allreduce_bytes"], provenance["allreduce_seconds"], ranks)
    device = device_spec(provenance, memory_bytes=_physical_memory() / ranks)
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
    """`spec` as today's calibration reads the figures it recorded (its provenance), so that a trial
    recorded long ago is predicted with today's fit and size laws as well as today's simulator; a spec
    that was not calibrated stays as it is."""
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
    Compression figures an older calibration did not measure keep their defaults."""
    matmul, bandwidth = figures["matmul_flops"], figures["copy_bandwidth"]
    small_tensor_rate, knee = optimizer_size_law(figures["optimizer_rate"], figures.get("optimizer_large_rate"))
    lowrank_rate, lowrank_knee = (
        size_law(figures["lowrank_rate"], figures.get("lowrank_large_rate"), LOWRANK_MATRIX_BYTES)
        if "lowrank_rate" in figures
        else (None, None)
    )
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
        stream_efficiency=fraction(figures["stream_rate"] / bandwidth) if "stream_rate" in figures else None,
        cast_efficiency=fraction(figures["cast_rate"] / bandwidth) if "cast_rate" in figures else None,
        select_efficiency=fraction(figures["select_rate"] / bandwidth) if "select_rate" in figures else None,
        full_select_efficiency=fraction(figures["full_select_rate"] / bandwidth)
        if "full_select_rate" in figures
        else None,
        lowrank_efficiency=fraction(lowrank_rate / bandwidth) if lowrank_rate else None,
        lowrank_knee_bytes=lowrank_knee,
        coalesce_efficiency=fraction(figures["coalesce_rate"] / bandwidth) if "coalesce_rate" in figures else None,
        scatter_efficiency=_bounded(figures["scatter_efficiency"], 8.0) if "scatter_efficiency" in figures else None,
        gather_efficiency=_bounded(figures["gather_efficiency"], 8.0) if "gather_efficiency" in figures else None,
        half_reduce_efficiency=_bounded(figures["half_reduce_efficiency"], 8.0)
        if "half_reduce_efficiency" in figures
        else None,
        reduce_efficiency=_bounded(figures["reduce_efficiency"], 8.0) if "reduce_efficiency" in figures else None,
        broadcast_efficiency=_bounded(figures["broadcast_efficiency"], 8.0)
        if "broadcast_efficiency" in figures
        else None,
        lowrank_round_s=min(figures["lowrank_round_s"], 1.0) if "lowrank_round_s" in figures else None,
        **_sharing(figures),
        is_gpu=False,
    )


def _sharing(figures: dict[str, Any]) -> dict[str, float]:
    """`comm_overlap` and `comm_latency_contention`: measured where a core was spare for communication,
    the shared-core figures where none was (a calibration that did not record it measured its overlap)."""
    if figures.get("spare_cores", 1) <= 0:
        return {"comm_overlap": SHARED_CORE_OVERLAP, "comm_latency_contention": SHARED_CORE_LATENCY_CONTENTION}
    return {"comm_overlap": min(max(figures["overlap"], 0.0), 1.0), "comm_latency_contention": 0.0}


OPTIMIZER_TENSOR_BYTES = (2 << 20, 32 << 20)
"""Parameter bytes per tensor of the two optimizer probes: 16 tensors of 2 MB, one of 32 MB."""


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
    return _bounded(value, 1.0)


def _bounded(value: float, most: float) -> float:
    return min(max(value, 1e-3), most)


LATENCY_SIZES = 3
"""How many of the smallest buffers pin the latency (their median, robust to one late wake-up)."""


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


def measure(ranks: int, *, threads: int = 1, overlap: bool = True) -> dict[str, Any]:
    """Start `ranks` gloo workers on this machine and return their combined figures (`overlap` 0
    unless measured)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stratagem-calibrate-") as folder:
        env = rank_environment(OMP_NUM_THREADS=str(threads))
        results = [Path(folder) / f"rank{rank}.json" for rank in range(ranks)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stratagem.calibrate",
                    "--worker",
                    str(rank),
                    str(ranks),
                    str(port),
                    str(results[rank]),
                    str(threads),
                    str(int(overlap)),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(ranks)
        ]
        errors = wait_for_ranks(procs, WORKER_TIMEOUT_S)
        missing = [str(path.name) for path in results if not path.exists()]
        if errors or missing:
            raise CalibrationError(
                f"calibration workers failed: {'; '.join(errors) or 'no result from ' + ', '.join(missing)}"
            )
        return combine([json.loads(path.read_text()) for path in results])


def wait_for_ranks(procs: list[subprocess.Popen], timeout_s: float) -> list[str]:
    """Wait for every rank's process; why each failed (empty when all exited 0). Past the deadline all
    are killed, since a rank waiting in a collective for a dead peer would never exit."""
    deadline = time.monotonic() + timeout_s
    errors = []
    for rank, proc in enumerate(procs):
        try:
            _, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
                other.wait()
            return [f"timed out after {timeout_s:.0f} s"]
        if proc.returncode != 0:
            errors.append(
                f"rank {rank} exited {proc.returncode}: {stderr.strip().splitlines()[-1] if stderr.strip() else ''}"
            )
    return errors


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, for a gloo rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _physical_memory() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# -- the worker: one rank's measurements (runs in its own process) ------------------------------------------


EVICT_MIN_BYTES = 64 << 20
"""What the evictor streams where the machine does not report its caches (and at least, where it does)."""
EVICT_MAX_BYTES = 1 << 30
"""Beyond this a cache is not held by one process's data anyway; streaming more would only slow calibration."""


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache the first CPU reports (Linux sysfs; sizes like `491520K`), or None."""
    sizes = []
    for entry in root.glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def eviction_bytes(cache_bytes: int | None) -> int:
    """Bytes to stream so that a probe's data is no longer cached: the last-level cache, within bounds."""
    return min(max(cache_bytes or 0, EVICT_MIN_BYTES), EVICT_MAX_BYTES)


class CacheEvictor:
    """Reads a buffer as large as the last-level cache, so the next probe finds its data in memory.

    In a training step each layer's tensors were pushed out of the caches by the rest of the step since
    they were last touched; a probe repeated in a tight loop keeps its tensors cached instead and times
    a faster machine than the step runs on. On a CPU whose last-level cache holds hundreds of MB the
    difference is large: element-wise kernels, convolutions and top-k selection reached 20-50% lower
    rates cold than hot, and calibrated hot the simulator priced the zoo models' steps 25-33% fast
    (docs/simulator.md, "Cold caches")."""

    def __init__(self, nbytes: int, device: str = "cpu") -> None:
        import torch

        self.nbytes = nbytes
        self._buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    @classmethod
    def for_this_machine(cls) -> CacheEvictor:
        return cls(eviction_bytes(last_level_cache_bytes()))

    def __call__(self) -> None:
        self._buffer.sum()


class Stepper:
    """Times work the way a synchronous step runs it: every rank runs it, then all ranks agree (one tiny
    all-reduce) whether to go on, so a sample lasts until the slowest rank is done, as a step waits for
    its slowest rank. The agreement's own latency, timed alone, is taken off. Alone (`agree` the
    identity) it is a plain median timer; on an accelerator `agree` also waits for the device, whose
    kernels run after the host has queued them. `budget_scale` shortens (or lengthens) every probe's
    time budget, for probes interleaved with other work. With `evict` (a `CacheEvictor`), every run
    starts with cold caches, as a step's layers do; the eviction is not timed, and the ranks agree once
    more after it so that no rank's sample includes another's eviction."""

    def __init__(
        self,
        agree: Callable[[bool], bool] = lambda go: go,
        *,
        budget_scale: float = 1.0,
        evict: Callable[[], object] | None = None,
    ) -> None:
        self.agree = agree
        self.budget_scale = budget_scale
        self.evict: Callable[[], object] | None = None  # the agreement's own latency is timed warm
        self.floor = 0.0
        self.floor = self.median(lambda: None, budget_s=0.2, least=10)
        self.evict = evict

    def median(self, run: Callable[[], object], *, budget_s: float, least: int = 3, most: int = 40) -> float:
        """Median seconds of `run` over repeats filling about `budget_s` of wall time, evictions
        included (after one untimed warm-up)."""
        run()
        self.agree(True)
        samples: list[float] = []
        deadline = time.perf_counter() + budget_s * self.budget_scale
        go = True
        while go:
            if self.evict is not None:
                self.evict()
                self.agree(True)
            start = time.perf_counter()
            run()
            go = self.agree(len(samples) + 1 < most and (len(samples) + 1 < least or time.perf_counter() < deadline))
            samples.append(time.perf_counter() - start)
        return max(statistics.median(samples) - self.floor, 1e-9)


@dataclass(frozen=True)
class ProbeShapes:
    """The sizes the compute probes run at. A CPU's (the defaults) take milliseconds per repeat there; an
    accelerator runs them in microseconds, where a kernel's launch and not its rate would be timed, so
    it gets its own (`GPU_PROBES`, `stratagem.calibrate_gpu`)."""

    linear: tuple[int, int] = (1024, 512)
    """Tokens and width of the Linear layer timed for the matmul rate."""
    bf16_side: int = 512
    images: tuple[int, int, int, int] = (16, 32, 32, 32)
    """Batch, channels, height and width of the convolution's and BatchNorm's input."""
    tokens: tuple[int, int] = (2048, 512)
    """Tokens and width of GELU's and LayerNorm's input."""
    copy_elements: int = 16 << 20
    gradient_elements: int = 4 << 20
    optimizer_bytes: int = 32 << 20
    """Parameter bytes of the optimizer probes (in tensors of `OPTIMIZER_TENSOR_BYTES`)."""
    lowrank: tuple[tuple[int, int], tuple[int, int]] = ((16, 512), (1, 2048))
    """(matrices, side) of the two PowerSGD probes: `LOWRANK_MATRIX_BYTES` per matrix."""
    lookups: tuple[int, int] = (16384, 20000)
    """Lookups and table rows of the coalescing probe."""


FULL_SELECTION_ENTRIES = 1 << 17
"""Entries of the full-selection probe: at 1% the runtime selects them in one `topk`, as it does a
DLRM's 85,000 dense gradients (`stratagem.topk_selection.full_selection`)."""


def _train_pass(module: Any, x: Any) -> Callable[[], None]:
    def run() -> None:
        module(x).sum().backward()

    return run


def compute_figures(stepper: Stepper, shapes: ProbeShapes = ProbeShapes(), device: str = "cpu") -> dict[str, float]:
    """This rank's compute, memory, per-layer and optimizer figures, every probe run by all ranks at once."""
    return {name: probe() for name, probe in probes(stepper, shapes, device).items()}


def probes(
    stepper: Stepper, shapes: ProbeShapes = ProbeShapes(), device: str = "cpu"
) -> dict[str, Callable[[], float]]:
    """The compute figures' probes by name, each a measurement run on call (by all ranks at once)."""
    import torch
    from torch import nn

    from stratagem.runtime.compression import select_largest

    tokens, width = shapes.linear
    side = shapes.bf16_side
    x = torch.randn(tokens, width, requires_grad=True, device=device)
    a, b = (torch.randn(side, side, dtype=torch.bfloat16, device=device) for _ in range(2))
    channels = shapes.images[1]
    images = torch.randn(*shapes.images, requires_grad=True, device=device)
    src = torch.ones(shapes.copy_elements, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    grad = torch.randn(shapes.gradient_elements, device=device)
    half, magnitudes = torch.empty_like(grad, dtype=torch.float16), grad.abs()
    other, total = torch.randn_like(grad), torch.empty_like(grad)
    (small, small_side), (large, large_side) = shapes.lowrank
    return {
        "matmul_flops": lambda: (
            3
            * 2.0
            * tokens
            * width
            * width
            / stepper.median(_train_pass(nn.Linear(width, width, bias=False, device=device), x), budget_s=1.0)
        ),
        "bf16_flops": lambda: 2.0 * side**3 / stepper.median(lambda: torch.mm(a, b), budget_s=0.5),
        "conv_flops": lambda: (
            3
            * 2.0
            * 9
            * channels
            * images.numel()
            / stepper.median(
                _train_pass(nn.Conv2d(channels, channels, 3, padding=1, bias=False, device=device), images),
                budget_s=1.0,
            )
        ),
        "copy_bandwidth": lambda: 2.0 * src.nbytes / stepper.median(lambda: dst.copy_(src), budget_s=0.5),
        "elementwise_rate": lambda: _memory_bound_rate(stepper, shapes, device, norms=False),
        "norm_rate": lambda: _memory_bound_rate(stepper, shapes, device, norms=True),
        "layer_overhead_s": lambda: _layer_overhead(stepper, device),
        "optimizer_rate": _optimizer_probe(stepper, device, total_bytes=shapes.optimizer_bytes),
        "optimizer_large_rate": _optimizer_probe(
            stepper, device, tensor_bytes=OPTIMIZER_TENSOR_BYTES[1], total_bytes=shapes.optimizer_bytes
        ),
        "optimizer_tensor_s": optimizer_tensor_probe(stepper, device),
        "stream_rate": lambda: (
            3 * grad.nbytes / stepper.median(lambda: torch.add(grad, other, out=total), budget_s=0.5)
        ),
        "cast_rate": lambda: 2 * 1.5 * grad.nbytes / stepper.median(lambda: grad.copy_(half.copy_(grad)), budget_s=0.5),
        "select_rate": lambda: (
            grad.nbytes / stepper.median(lambda: select_largest(magnitudes, grad.numel() // 100), budget_s=0.5)
        ),
        "full_select_rate": lambda: (
            FULL_SELECTION_ENTRIES
            * 4
            / stepper.median(
                lambda: select_largest(magnitudes[:FULL_SELECTION_ENTRIES], FULL_SELECTION_ENTRIES // 100), budget_s=0.3
            )
        ),
        "lowrank_rate": _lowrank_probe(stepper, device, matrices=small, side=small_side),
        "lowrank_large_rate": _lowrank_probe(stepper, device, matrices=large, side=large_side),
        "coalesce_rate": _coalesce_probe(stepper, device, lookups=shapes.lookups[0], rows=shapes.lookups[1]),
    }


def _coalesce_probe(stepper: Stepper, device: str, *, lookups: int, rows: int, dim: int = 32) -> Callable[[], float]:
    """Coalescing a fresh embedding gradient (on a CPU, 16384 lookups of 32-float rows in a 20000-row
    table), on the bytes the simulator counts: each lookup's values and int64 index."""
    import torch

    index = torch.randint(0, rows, (1, lookups), device=device)
    values = torch.randn(lookups, dim, device=device)

    def run() -> None:
        torch.sparse_coo_tensor(index, values, (rows, dim), check_invariants=False).coalesce()

    return lambda: lookups * (dim * 4 + 8) / stepper.median(run, budget_s=0.5)


LOWRANK_PASSES = 9
"""Passes over a gradient the simulator counts for PowerSGD (three for the rank-r products, six for
adding and keeping the error)."""
LOWRANK_MATRIX_BYTES = (1 << 20, 16 << 20)
"""Bytes per matrix of the two PowerSGD probes on a CPU: 16 matrices of 512 x 512, one of 2048 x 2048."""


def _lowrank_probe(stepper: Stepper, device: str, *, matrices: int, side: int, rank: int = 4) -> Callable[[], float]:
    """PowerSGD rank 4 on square gradients (16 MB on a CPU), as the runtime's reducer runs it on a
    one-rank team (no collective), priced on the passes the simulator counts: its skinny products, QR
    and error feedback stream the gradient far below a copy's rate on a CPU, and the transposed product
    of a matrix beyond the caches reads it with a stride (several times slower per byte: the size law)."""
    import torch

    from stratagem.runtime.comm import Team
    from stratagem.runtime.compression import PowerSGDReducer

    grads = [torch.randn(side, side, device=device) for _ in range(matrices)]
    reducer = PowerSGDReducer(Team([0], [0], None), rank=rank, error_feedback=True, seed=0)

    def run() -> None:
        reducer.start(grads)
        reducer.finish()

    return lambda: LOWRANK_PASSES * sum(g.nbytes for g in grads) / stepper.median(run, budget_s=0.5)


def _memory_bound_rate(stepper: Stepper, shapes: ProbeShapes, device: str, *, norms: bool) -> float:
    """Bytes/s of activations (GELU, ReLU) or normalizations (LayerNorm, BatchNorm), on the bytes the
    simulator counts: forward reads and writes each tensor once per op, backward twice the forward."""
    import torch
    from torch import nn

    tokens = torch.randn(*shapes.tokens, requires_grad=True, device=device)
    images = torch.randn(*shapes.images, requires_grad=True, device=device)
    layer_norm, batch_norm = (
        nn.LayerNorm(shapes.tokens[1], device=device),
        nn.BatchNorm2d(shapes.images[1], device=device),
    )
    first, second = (layer_norm, batch_norm) if norms else (nn.functional.gelu, torch.relu)

    def run() -> None:
        (first(tokens).sum() + second(images).sum()).backward()

    forward_bytes = 2.0 * (tokens.nbytes + images.nbytes)
    return 3 * forward_bytes / stepper.median(run, budget_s=1.0)


def _layer_overhead(stepper: Stepper, device: str = "cpu") -> float:
    """Seconds per layer and pass beyond arithmetic: (long chain - short chain) / (2 passes x extra layers)."""
    import torch
    from torch import nn

    x = torch.randn(1, 4, device=device)
    long_chain = nn.Sequential(*[nn.Linear(4, 4) for _ in range(64)]).to(device)
    short_chain = nn.Sequential(*[nn.Linear(4, 4) for _ in range(8)]).to(device)
    long = stepper.median(_train_pass(long_chain, x), budget_s=0.5, least=5)
    short = stepper.median(_train_pass(short_chain, x), budget_s=0.3, least=5)
    return (long - short) / (2 * (64 - 8))


def _optimizer_probe(
    stepper: Stepper, device: str, *, tensor_bytes: int = OPTIMIZER_TENSOR_BYTES[0], total_bytes: int = 32 << 20
) -> Callable[[], float]:
    """Bytes/s of an Adam step over `total_bytes` of parameters in tensors of `tensor_bytes` (with
    gradients and state, four times that: beyond a CPU's caches), on the bytes the simulator counts.
    The parameters and state are made once, so repeated probes time the step, not the allocation."""
    import torch

    params = [
        torch.zeros(tensor_bytes // 4, requires_grad=True, device=device)
        for _ in range(max(1, total_bytes // tensor_bytes))
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params)
    count = sum(p.numel() for p in params)
    return lambda: UPDATE_BYTES_PER_PARAM * count / stepper.median(optimizer.step, budget_s=1.0)


def optimizer_tensor_probe(
    stepper: Stepper, device: str, *, tensors: int = 256, elements: int = 64, foreach: bool | None = None
) -> Callable[[], float]:
    """Seconds per tensor of an Adam step over many tiny tensors, whose bytes cost nothing next to
    the per-tensor operations it launches (`foreach` False: the per-tensor loop even on CUDA)."""
    import torch

    params = [torch.zeros(elements, requires_grad=True, device=device) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.Adam(params, foreach=foreach)
    return lambda: stepper.median(optimizer.step, budget_s=0.3) / tensors


def gradients(torch: Any, nbytes: int, parts: int = 4) -> list[Any]:
    """`parts` fp32 gradients of `nbytes` in all: what a runtime bucket flattens."""
    return [torch.ones(max(1, nbytes // (4 * parts)), dtype=torch.float32) for _ in range(parts)]


def _copy_back(grads: list[Any], flat: Any) -> None:
    for grad, value in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(value)


def averaged_flat(dist: Any, torch: Any, grads: list[Any], scratch: Any | None = None) -> Any:
    """What every all-reduce bucket does before its collective: flatten (into `scratch`, the bucket's
    kept buffer, when given) and divide by the ranks in place. Until session 30 the runtime divided into
    a second buffer, and so did this probe."""
    flat = torch.cat(grads) if scratch is None else torch.cat(grads, out=scratch)
    return flat.div_(dist.get_world_size())


def bucket_scratch(torch: Any, grads: list[Any]) -> Any:
    """The bucket-sized buffer `averaged_flat` writes, made once and reused (`runtime.comm.FlatBuffer`)."""
    return torch.empty(sum(g.numel() for g in grads), dtype=torch.float32)


def allreduce_bucket(dist: Any, torch: Any, grads: list[Any], scratch: Any | None = None) -> None:
    """An all-reduce bucket as the runtime runs it: flatten, divide by the ranks, all-reduce, copy back."""
    flat = averaged_flat(dist, torch, grads, scratch)
    dist.all_reduce(flat)
    _copy_back(grads, flat)


def sharded_bucket(dist: Any, torch: Any, grads: list[Any]) -> None:
    """A ZeRO bucket's communication as the runtime runs it: flatten, reduce-scatter, divide this rank's
    chunk, all-gather the chunks into a fresh buffer, copy back (the shard's update left out)."""
    world = dist.get_world_size()
    flat = torch.cat(grads)
    mine = flat.new_empty(flat.numel() // world)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter(mine, flat)
    gathered = flat.new_empty(mine.numel() * world)
    all_gather(gathered, mine / world)
    _copy_back(grads, gathered)


def ps_push(dist: Any, torch: Any, grads: list[Any]) -> Any:
    """A dense PS bucket's push as the runtime runs it: flatten, reduce to the server (rank 0), which
    divides; returns the flat buffer (the average on the server)."""
    flat = torch.cat(grads)
    dist.reduce(flat, 0)
    if dist.get_rank() == 0:
        flat.div_(dist.get_world_size())
    return flat


def ps_pull(dist: Any, torch: Any, grads: list[Any], kept: Any) -> None:
    """Its pull: the server broadcasts its kept version, the others receive it into a fresh buffer, and
    every rank copies the values into its parameters."""
    values = kept if dist.get_rank() == 0 else torch.empty_like(kept)
    dist.broadcast(values, 0)
    _copy_back(grads, values)


def allreduce_seconds(dist: Any, torch: Any) -> list[float]:
    """Median seconds of an all-reduce bucket (`allreduce_bucket`) per size in SIZES, each timed from a
    barrier. The copies are what a bucket costs beyond the wire, so the fitted link includes them.

    The copies go to buffers reused over the repeats, as a training step's buckets reuse the memory
    they freed the step before. Fresh ones faulted their pages in whenever the heap had grown around
    other work: in an interleaved block (`benchmarks/interleaved.py`) of the deep replayed MLP's 8
    strategies, one 32 MiB bucket in six faulted in every page of its divide's output and the block's
    first rounds took 118-197 ms; reused, 38-47 ms from the first round. Session 25's run AD had put
    the 32 MiB bucket at 75-83 ms in that job's blocks against 51-63 in the others', so the fitted link
    priced the MLP's all-reduce 1.6 times too dear."""
    medians = []
    for size in SIZES:
        grads = gradients(torch, size)
        scratch = bucket_scratch(torch, grads)
        repeats = 10 if size <= 65536 else 4
        samples = []
        for i in range(repeats + 2):
            dist.barrier()
            start = time.perf_counter()
            allreduce_bucket(dist, torch, grads, scratch)
            if i >= 2:
                samples.append(time.perf_counter() - start)
        medians.append(statistics.median(samples))
    return medians


def _timed(dist: Any, run: Callable[[], Any]) -> float:
    """Seconds of `run` on this rank, started together with the other ranks."""
    dist.barrier()
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _ratio(dist: Any, reference: Callable[[], Any], probe: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `reference` over median seconds of `probe`, timed in turns after one warm-up."""
    probe()
    samples = [(_timed(dist, reference), _timed(dist, probe)) for _ in range(repeats)]
    alone, other = (statistics.median(column) for column in zip(*samples, strict=True))
    return alone / other


PROBE_BUCKET_BYTES = 8 << 20
"""The bucket the collective efficiency probes move. A ZeRO bucket's ratio to an all-reduce bucket was
about the same at 32 MB (median 0.56 against 0.61 over 24 calibrations), so the cheaper size stays."""


def scatter_efficiency(dist: Any, torch: Any, *, repeats: int = 4) -> float:
    """How fast a ZeRO bucket (`sharded_bucket`) runs relative to an all-reduce bucket of the same
    gradients: the ring formulas make reduce-scatter plus all-gather cost exactly one all-reduce, so the
    ratio is the share of the fitted link bandwidth (copies included, as in the fit) they reach."""
    grads = gradients(torch, PROBE_BUCKET_BYTES)
    return _ratio(
        dist, lambda: allreduce_bucket(dist, torch, grads), lambda: sharded_bucket(dist, torch, grads), repeats
    )


GATHER_BYTES = 4 << 20
"""What each rank contributes to the gather probe: a step's worth of a sparse table's touched rows."""


def gather_efficiency(dist: Any, torch: Any, *, repeats: int = 4) -> float:
    """How fast an all-gather into one fresh tensor per rank (as the runtime gathers sparse rows and
    top-k entries, whose sizes differ per step) runs relative to an all-reduce bucket that the ring
    formulas price the same: each rank contributes c bytes, the bucket holds p·c/2."""
    world = dist.get_world_size()
    mine = torch.ones(GATHER_BYTES // 4, dtype=torch.float32)
    grads = gradients(torch, GATHER_BYTES * world // 2)
    return _ratio(
        dist,
        lambda: allreduce_bucket(dist, torch, grads),
        lambda: dist.all_gather([torch.empty_like(mine) for _ in range(world)], mine),
        repeats,
    )


def half_reduce_efficiencies(dist: Any, torch: Any, *, repeats: int = 6) -> tuple[float, float]:
    """How fast an fp16 bucket moves its bytes relative to the fitted link: the runtime's fp16 bucket
    less the compressor's own passes (flatten and divide the fp32 gradients, all-reduce 4M fp16
    elements) against an fp32 all-reduce bucket of the same 16 MB of gradients, halved. The casts,
    error feedback and copy back are priced as passes of their own. A backend that reduces fp16 element
    by element at fp32's speed reads about 0.5 (gloo on CPU; NCCL about 1).

    Second, the bare fp16 all-reduce against the same fp32 bucket, halved: the figure calibrations
    before `principled-1.11` recorded as `half_reduce_efficiency`, which credited fp16 with skipping
    the flatten and divide it also makes. Kept in the provenance so runs can be scored both ways."""
    grads = gradients(torch, 16 << 20)
    half = torch.ones(4 << 20, dtype=torch.float16)

    def reference() -> None:
        allreduce_bucket(dist, torch, grads)

    def half_bucket() -> None:
        averaged_flat(dist, torch, grads)  # the casts that would turn it into `half` are priced apart
        dist.all_reduce(half)

    bucket = _ratio(dist, reference, half_bucket, repeats) / 2
    wire = _ratio(dist, reference, lambda: dist.all_reduce(half), repeats) / 2
    return bucket, wire


def root_efficiencies(dist: Any, torch: Any, *, repeats: int = 4) -> tuple[float, float]:
    """How fast a parameter server's push (`ps_push`) and pull (`ps_pull`) of one bucket move their
    bytes relative to an all-reduce bucket of the same gradients, each in the simulator's terms: the
    server receives (or sends) p-1 buffers, (p-1)·n/B, where the ring all-reduce costs 2(p-1)/p · n/B."""
    grads = gradients(torch, PROBE_BUCKET_BYTES)
    kept = torch.cat(grads)
    formula = dist.get_world_size() / 2

    def reference() -> None:
        allreduce_bucket(dist, torch, grads)

    reduce = _ratio(dist, reference, lambda: ps_push(dist, torch, grads), repeats)
    broadcast = _ratio(dist, reference, lambda: ps_pull(dist, torch, grads, kept), repeats)
    return reduce * formula, broadcast * formula


LOWRANK_ROUND_MATRICES = (16, 64)
"""The PowerSGD round probe's gradients: 16 matrices of 64 x 64, so small that the reducer's compute
and the P and Q bytes (16 KB each) are a sliver of what the two rounds cost."""


def lowrank_round_seconds(dist: Any, torch: Any, *, repeats: int = 12) -> float:
    """What a PowerSGD bucket's two dependent all-reduces cost on these ranks: the runtime's reducer
    (rank 4) on the world team, less the same reducer on a one-rank team (its compute alone), medians
    of runs taken in turns. On two gloo ranks of a 2-core machine this read 1.8-5.5 ms, against
    0.3-0.5 ms for one all-reduce of the same bytes started from a barrier (docs/simulator.md)."""
    from stratagem.runtime.comm import Team
    from stratagem.runtime.compression import PowerSGDReducer

    count, side = LOWRANK_ROUND_MATRICES
    grads = [torch.randn(side, side) for _ in range(count)]
    world = list(range(dist.get_world_size()))
    team = PowerSGDReducer(Team(world, world, dist.group.WORLD), rank=4, error_feedback=True, seed=0)
    alone = PowerSGDReducer(Team([0], [0], None), rank=4, error_feedback=True, seed=0)

    def run(reducer: PowerSGDReducer) -> None:
        reducer.start(grads)
        reducer.finish()

    run(team)
    run(alone)
    samples = [(_timed(dist, lambda: run(team)), _timed(dist, lambda: run(alone))) for _ in range(repeats)]
    both, compute = (statistics.median(column) for column in zip(*samples, strict=True))
    return max(both - compute, 0.0)


def collective_figures(dist: Any, torch: Any, *, overlap: bool) -> dict[str, Any]:
    """Every collective measurement, in one call so calibration and the benchmarks' blocks agree."""
    return {
        "allreduce_seconds": allreduce_seconds(dist, torch),
        "scatter_efficiency": scatter_efficiency(dist, torch),
        "gather_efficiency": gather_efficiency(dist, torch),
        **dict(
            zip(("half_reduce_efficiency", "half_wire_efficiency"), half_reduce_efficiencies(dist, torch), strict=True)
        ),
        **dict(zip(("reduce_efficiency", "broadcast_efficiency"), root_efficiencies(dist, torch), strict=True)),
        "lowrank_round_s": lowrank_round_seconds(dist, torch),
        "overlap": overlap_share(dist, torch) if overlap else 0.0,
    }


def overlap_share(dist: Any, torch: Any, *, repeats: int = 5) -> float:
    """How much of the all-reduce time hides behind compute: (C + A - both) / min(C, A), from the medians
    of C (a burst of matmul layers alone), A (a burst of 1 MB all-reduces alone) and both (the
    all-reduces launched asynchronously before the same compute, as the runtime launches buckets during
    backward), measured in turns so that a change of load touches all three alike."""
    from torch import nn

    layer, x = nn.Linear(512, 512, bias=False), torch.randn(1024, 512, requires_grad=True)
    buffers = [torch.ones(1 << 18) for _ in range(16)]

    def compute() -> None:
        for _ in range(4):
            layer(x).sum().backward()

    def comm_only() -> None:
        for work in [dist.all_reduce(b, async_op=True) for b in buffers]:
            work.wait()

    def both() -> None:
        works = [dist.all_reduce(b, async_op=True) for b in buffers]
        compute()
        for work in works:
            work.wait()

    compute()
    comm_only()
    samples = [(_timed(dist, compute), _timed(dist, comm_only), _timed(dist, both)) for _ in range(repeats)]
    alone_c, alone_a, together = (statistics.median(column) for column in zip(*samples, strict=True))
    return (alone_c + alone_a - together) / min(alone_c, alone_a)


def _worker(rank: int, world: int, port: int, result: str, threads: int, overlap: bool) -> None:
    """One rank: every measurement at the same time as the other ranks; writes its figures as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    torch.manual_seed(rank)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S),
    )

    def agree(go: bool) -> bool:
        flag = torch.tensor([int(go)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    figures: dict[str, Any] = dict(compute_figures(Stepper(agree, evict=CacheEvictor.for_this_machine())))
    figures.update(collective_figures(dist, torch, overlap=overlap))
    dist.barrier()
    Path(result).write_text(json.dumps(figures))
    # Skip the process group's teardown: a peer that finished first can make it abort this process.
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) == 8 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), sys.argv[7] == "1")
