"""Collective probes: the runtime's own buckets, timed on the ranks' process group.

Each probe builds the executor a strategy would get (`stratagem.runtime`: an all-reduce bucket, a ZeRO
bucket, a parameter server's dense bucket) over probe parameters and runs its launch and finish as a
step does, kept buffers included, so what is timed is what a trial runs:

- all-reduce buckets of 4 B to 32 MB (`figures.SIZES`): flatten, divide, all-reduce, copy back. The
  ring model t(n) = 2(p-1)·α + 2(p-1)/p · n/B gives B from the two largest buckets and α from the
  smallest (`figures.fit_ring`), so the link is described as a bucket sees it, copies included;
- a ZeRO bucket of 8 MB (flatten, reduce-scatter, divide the chunk, all-gather, copy back) against an
  all-reduce bucket of the same gradients (the ring formulas make them equal) -> `scatter_efficiency`;
- an all-gather of 4 MB per rank into fresh per-rank tensors (how sparse rows and top-k entries travel)
  against the all-reduce bucket the ring formulas price the same -> `gather_efficiency`;
- an fp16 bucket of 4M elements against an all-reduce bucket of the same gradients, halved
  -> `half_reduce_efficiency`;
- PowerSGD on 16 matrices of 64 x 64 on the ranks' team against the same on a one-rank team: what
  its two dependent all-reduces cost beyond their bytes -> `lowrank_round_s`;
- a parameter server's push (flatten, reduce to rank 0, divide there) and pull (broadcast the server's
  values, copy them into the parameters) of an 8 MB bucket against an all-reduce bucket of it
  -> `reduce_efficiency` and `broadcast_efficiency`;
- overlap: all-reduces launched while the rank computes; the share of their time that hides behind
  the compute (1: all of it, 0: they take turns on the cores) -> `comm_overlap`.

An efficiency is a ratio of medians, the probe and its all-reduce reference timed in turns and each run
started from a barrier, so a change of load touches both alike. The update a server or a shard applies
is priced apart (the optimizer probes), so the probes' buckets carry an optimizer whose step changes
nothing (`Unchanged`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stratagem.calibrate.figures import SIZES
from stratagem.ir import Compressor, PSSynchronizer
from stratagem.runtime.allreduce import AllReduceBucket
from stratagem.runtime.comm import Comm, FlatBuffer, Team, Work, wait
from stratagem.runtime.compression import PowerSGDReducer, apply_compression
from stratagem.runtime.executor import Executor
from stratagem.runtime.plan import Piece
from stratagem.runtime.ps import DensePSBucket
from stratagem.runtime.sharded import ZeroBucket
from stratagem.runtime.stats import StatsRecorder

PROBE_BUCKET_BYTES = 8 << 20
"""The bucket the ZeRO and parameter-server probes move. A ZeRO bucket's ratio to an all-reduce bucket
was about the same at 32 MB (median 0.56 against 0.61 over 24 calibrations), so the cheaper size stays."""
GATHER_BYTES = 4 << 20
"""What each rank contributes to the gather probe: a step's worth of a sparse table's touched rows."""
HALF_BUCKET_BYTES = 16 << 20
"""The fp32 gradients of the fp16 probe: 4M elements."""
LOWRANK_ROUND_MATRICES = (16, 64)
"""The PowerSGD round probe's gradients: 16 matrices of 64 x 64, so small that the reducer's compute
and the P and Q bytes (16 KB each) are a sliver of what the two rounds cost."""


@dataclass(frozen=True)
class Ranks:
    """The calibration's process group as the runtime sees it, and the device this rank's tensors live on."""

    comm: Comm
    device: str = "cpu"

    @classmethod
    def world(cls, device: str = "cpu") -> Ranks:
        """The default process group, every rank on one node (as a calibration runs)."""
        size = dist.get_world_size()
        return cls(Comm(None, rank=dist.get_rank(), node_of_rank=["127.0.0.1"] * size, node_groups=False), device)

    def synchronize(self) -> None:
        """Wait for this rank's device (kernels and collectives run after the host has queued them)."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, run: Callable[[], object]) -> float:
        """Seconds of `run` on this rank, started together with the other ranks."""
        dist.barrier()
        start = time.perf_counter()
        run()
        self.synchronize()
        return time.perf_counter() - start


class Unchanged(torch.optim.Optimizer):
    """An optimizer whose step changes nothing: a probe bucket's server or shard update is priced apart."""

    def __init__(self, params: Iterable[Any]) -> None:
        super().__init__(params, {})

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        return None


def probe_pieces(nbytes: int, *, device: str = "cpu", parts: int = 4) -> list[Piece]:
    """`parts` fp32 parameters of `nbytes` in all, each with a gradient of ones: what a bucket holds."""
    numel = max(1, nbytes // (4 * parts))
    pieces = []
    for index in range(parts):
        param = nn.Parameter(torch.zeros(numel, device=device))
        param.grad = torch.ones_like(param)
        pieces.append(Piece(f"probe{index}", param, shard=0, shards=1, axis=0, start=0, length=numel, group_index=0))
    return pieces


def allreduce_bucket(ranks: Ranks, pieces: list[Piece]) -> AllReduceBucket:
    """The runtime's all-reduce bucket of `pieces`, uncompressed."""
    reducer = apply_compression(Compressor(), team=ranks.comm.world, what="the calibration's bucket", seed=0)
    return AllReduceBucket(pieces, reducer)


def zero_bucket(ranks: Ranks, pieces: list[Piece]) -> ZeroBucket:
    """The runtime's ZeRO bucket of `pieces`, sharded over every rank."""
    return ZeroBucket(pieces, comm=ranks.comm, optimizer=Unchanged(piece.param for piece in pieces))


def ps_bucket(ranks: Ranks, pieces: list[Piece]) -> DensePSBucket:
    """The runtime's dense parameter-server bucket of `pieces`, served by rank 0 under BSP."""
    sync = PSSynchronizer(reduction_destination="127.0.0.1:CPU:0")
    return DensePSBucket(
        pieces, server=0, sync=sync, comm=ranks.comm, optimizer=Unchanged(piece.param for piece in pieces)
    )


def stepped(ranks: Ranks, executor: Executor) -> Callable[[], None]:
    """One step of `executor` as the runtime drives it: launch (in backward), then finish (at the optimizer step)."""
    stats = StatsRecorder(torch.device(ranks.device))

    def run() -> None:
        stats.begin_step()
        executor.launch(stats)
        executor.finish(stats)
        stats.end_step()

    return run


class PhaseClock(StatsRecorder):
    """Marks each wait an executor reports: the ranks meet at a barrier before every wait but the first,
    so a later phase (a server's pull after its push) starts together, as a probe timed alone does."""

    def __init__(self, ranks: Ranks) -> None:
        super().__init__(torch.device(ranks.device))
        self.ranks = ranks
        self.waits: list[tuple[float, float]] = []
        """(start, end) of each wait since `clear`."""

    @contextmanager
    def waiting(self, kind: str) -> Iterator[None]:
        if self.waits:
            dist.barrier()
        start = time.perf_counter()
        with super().waiting(kind):
            yield
        self.ranks.synchronize()
        self.waits.append((start, time.perf_counter()))


def push_and_pull(ranks: Ranks, bucket: DensePSBucket, clock: PhaseClock) -> tuple[float, float]:
    """Seconds of a parameter server bucket's push (launch to the end of its first wait) and pull (its
    second wait to the end of the step), each started together with the other ranks."""
    clock.waits.clear()
    dist.barrier()
    start = time.perf_counter()
    clock.begin_step()
    bucket.launch(clock)
    bucket.finish(clock)
    clock.end_step()
    ranks.synchronize()
    end = time.perf_counter()
    if len(clock.waits) != 2:
        raise RuntimeError(f"a parameter server's bucket reported {len(clock.waits)} waits, not a push and a pull")
    (_, pushed), (pulling, _) = clock.waits
    return pushed - start, end - pulling


def _medians(samples: Sequence[tuple[float, ...]]) -> list[float]:
    return [statistics.median(column) for column in zip(*samples, strict=True)]


def _ratio(ranks: Ranks, reference: Callable[[], object], probe: Callable[[], object], repeats: int) -> float:
    """Median seconds of `reference` over median seconds of `probe`, timed in turns after one warm-up."""
    reference()
    probe()
    alone, other = _medians([(ranks.timed(reference), ranks.timed(probe)) for _ in range(repeats)])
    return alone / other


def allreduce_seconds(ranks: Ranks) -> list[float]:
    """Median seconds of an all-reduce bucket per size in SIZES, each timed from a barrier. The copies
    are what a bucket costs beyond the wire, so the fitted link includes them. Each size's bucket keeps
    its buffer over the repeats, as a training step's buckets do: fresh ones fault their pages in
    whenever the heap has grown around other work, which prices large buckets far too dear."""
    medians = []
    for size in SIZES:
        run = stepped(ranks, allreduce_bucket(ranks, probe_pieces(size, device=ranks.device)))
        repeats = 10 if size <= 65536 else 4
        samples = [ranks.timed(run) for _ in range(repeats + 2)][2:]
        medians.append(statistics.median(samples))
    return medians


def scatter_efficiency(ranks: Ranks, *, repeats: int = 4) -> float:
    """How fast a ZeRO bucket runs relative to an all-reduce bucket of the same gradients: the ring
    formulas make reduce-scatter plus all-gather cost exactly one all-reduce, so the ratio is the share
    of the fitted link bandwidth (copies included, as in the fit) they reach."""
    pieces = probe_pieces(PROBE_BUCKET_BYTES, device=ranks.device)
    reference = stepped(ranks, allreduce_bucket(ranks, pieces))
    return _ratio(ranks, reference, stepped(ranks, zero_bucket(ranks, pieces)), repeats)


def gather_efficiency(ranks: Ranks, *, repeats: int = 4) -> float:
    """How fast the runtime's all-gather into one fresh tensor per rank (as it gathers sparse rows and
    top-k entries, whose sizes differ per step) runs relative to an all-reduce bucket that the ring
    formulas price the same: each rank contributes c bytes, the bucket holds p·c/2."""
    team = ranks.comm.world
    mine = torch.ones(GATHER_BYTES // 4, dtype=torch.float32, device=ranks.device)
    pieces = probe_pieces(GATHER_BYTES * team.size // 2, device=ranks.device)
    return _ratio(ranks, stepped(ranks, allreduce_bucket(ranks, pieces)), lambda: team.all_gather(mine), repeats)


def half_reduce_efficiencies(ranks: Ranks, *, repeats: int = 6) -> tuple[float, float]:
    """How fast an fp16 bucket moves its bytes relative to the fitted link: the fp16 bucket's path less
    its casts (flatten and divide the fp32 gradients into the bucket's kept buffer, all-reduce 4M fp16
    elements) against an fp32 all-reduce bucket of the same 16 MB of gradients, halved. The casts,
    error feedback and copy back are priced as passes of their own. A backend that reduces fp16 element
    by element at fp32's speed reads about 0.5 (gloo on CPU; NCCL about 1).

    Second, the bare fp16 all-reduce against the same fp32 bucket, halved, which credits fp16 with
    skipping the flatten and divide it also makes: recorded in the provenance
    (`half_wire_efficiency`) so that trials can be scored with either definition."""
    team = ranks.comm.world
    pieces = probe_pieces(HALF_BUCKET_BYTES, device=ranks.device)
    grads = [piece.grad() for piece in pieces]
    half = torch.ones(HALF_BUCKET_BYTES // 4, dtype=torch.float16, device=ranks.device)
    buffer = FlatBuffer()
    reference = stepped(ranks, allreduce_bucket(ranks, pieces))

    def half_bucket() -> None:
        buffer.flatten(grads).div_(team.size)
        team.all_reduce(half)

    bucket = _ratio(ranks, reference, half_bucket, repeats) / 2
    wire = _ratio(ranks, reference, lambda: team.all_reduce(half), repeats) / 2
    return bucket, wire


def root_efficiencies(ranks: Ranks, *, repeats: int = 6) -> tuple[float, float]:
    """How fast a parameter server's push and pull of one bucket move their bytes relative to an
    all-reduce bucket of the same gradients, each in the simulator's terms: the server receives (or
    sends) p-1 buffers, (p-1)·n/B, where the ring all-reduce costs 2(p-1)/p · n/B. One step of the
    runtime's bucket is timed per sample, its push and pull apart (`push_and_pull`)."""
    pieces = probe_pieces(PROBE_BUCKET_BYTES, device=ranks.device)
    reference = stepped(ranks, allreduce_bucket(ranks, pieces))
    bucket, clock = ps_bucket(ranks, pieces), PhaseClock(ranks)
    reference()
    push_and_pull(ranks, bucket, clock)
    samples = [(ranks.timed(reference), *push_and_pull(ranks, bucket, clock)) for _ in range(repeats)]
    alone, push, pull = _medians(samples)
    formula = ranks.comm.world_size / 2
    return alone / push * formula, alone / pull * formula


def lowrank_round_seconds(ranks: Ranks, *, repeats: int = 12) -> float:
    """What a PowerSGD bucket's two dependent all-reduces cost on these ranks: the runtime's reducer
    (rank 4) on the world team, less the same reducer on a one-rank team (its compute alone), medians
    of runs taken in turns. On two gloo ranks of a 2-core machine this read 1.8-5.5 ms, against
    0.3-0.5 ms for one all-reduce of the same bytes started from a barrier (docs/simulator.md)."""
    count, side = LOWRANK_ROUND_MATRICES
    grads = [torch.randn(side, side, device=ranks.device) for _ in range(count)]
    team = PowerSGDReducer(ranks.comm.world, rank=4, error_feedback=True, seed=0)
    alone = PowerSGDReducer(Team([0], [0], None), rank=4, error_feedback=True, seed=0)

    def run(reducer: PowerSGDReducer) -> None:
        reducer.start(grads)
        reducer.finish()

    run(team)
    run(alone)
    both, compute = _medians(
        [(ranks.timed(lambda: run(team)), ranks.timed(lambda: run(alone))) for _ in range(repeats)]
    )
    return max(both - compute, 0.0)


def overlap_share(ranks: Ranks, *, repeats: int = 5) -> float:
    """How much of the all-reduce time hides behind compute: (C + A - both) / min(C, A), from the medians
    of C (a burst of matmul layers alone), A (a burst of 1 MB all-reduces alone) and both (the
    all-reduces launched asynchronously before the same compute, as the runtime launches buckets during
    backward), measured in turns so that a change of load touches all three alike."""
    team = ranks.comm.world
    layer = nn.Linear(512, 512, bias=False, device=ranks.device)
    x = torch.randn(1024, 512, requires_grad=True, device=ranks.device)
    buffers = [torch.ones(1 << 18, device=ranks.device) for _ in range(16)]

    def compute() -> None:
        for _ in range(4):
            layer(x).sum().backward()

    def wait_all(works: list[Work]) -> None:
        for work in works:
            wait(work)

    def comm_only() -> None:
        wait_all([team.all_reduce(b, async_op=True) for b in buffers])

    def both() -> None:
        works = [team.all_reduce(b, async_op=True) for b in buffers]
        compute()
        wait_all(works)

    compute()
    comm_only()
    alone_c, alone_a, together = _medians(
        [(ranks.timed(compute), ranks.timed(comm_only), ranks.timed(both)) for _ in range(repeats)]
    )
    return (alone_c + alone_a - together) / min(alone_c, alone_a)


def collective_figures(ranks: Ranks, *, overlap: bool) -> dict[str, Any]:
    """Every collective measurement, in one call so calibration and the benchmarks' blocks agree
    (`overlap` 0 unless measured)."""
    figures: dict[str, Any] = {
        "allreduce_seconds": allreduce_seconds(ranks),
        "scatter_efficiency": scatter_efficiency(ranks),
        "gather_efficiency": gather_efficiency(ranks),
    }
    figures["half_reduce_efficiency"], figures["half_wire_efficiency"] = half_reduce_efficiencies(ranks)
    figures["reduce_efficiency"], figures["broadcast_efficiency"] = root_efficiencies(ranks)
    figures["lowrank_round_s"] = lowrank_round_seconds(ranks)
    figures["overlap"] = overlap_share(ranks) if overlap else 0.0
    return figures
