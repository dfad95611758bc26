"""The ranks a calibration measures on: processes joined by a process group, all measuring at once.

Everything is measured the way a trial runs: `ranks` processes with `threads` threads each, joined by
gloo, all measuring at the same time, so they share cores, caches and memory bandwidth as trial ranks
do (and a machine busy with other work shows up as a slower machine). Each rank runs every compute
probe (`compute`) and every collective probe (`collectives`) and writes its figures as JSON; the spec
takes the slowest rank's (`figures.combine`). With the nccl backend rank r measures CUDA device r at
the GPU's probe sizes; a `links` job only sweeps all-reduce sizes for the node's link (`links`). The
processes are plain subprocesses (`python -m stratagem.calibrate`).

Overlap of communication with compute is only measured when the machine has cores beyond the ranks'
compute threads. Without one a probe would only see the neighbours, and the spec takes the shared-core
figures instead (`figures.SHARED_CORE_OVERLAP`, `figures.SHARED_CORE_LATENCY_CONTENTION`).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from stratagem.calibrate.collectives import Ranks, collective_figures
from stratagem.calibrate.compute import compute_figures
from stratagem.calibrate.figures import SIZES, combine, spec_from_figures
from stratagem.calibrate.gpu import gpu_figures
from stratagem.calibrate.links import LINK_SIZES, sweep_seconds
from stratagem.calibrate.timing import CacheEvictor, Stepper
from stratagem.errors import InvalidResourceSpecError, Problem, StratagemError
from stratagem.ir import ResourceSpec
from stratagem.rank_env import rank_environment
from stratagem.runtime.launch import free_port

WORKER_TIMEOUT_S = 120.0


class CalibrationError(StratagemError):
    """A measurement could not be taken (the ranks failed or timed out)."""


@dataclass(frozen=True)
class RankJob:
    """What every rank of a calibration runs with."""

    ranks: int
    threads: int = 1
    backend: Literal["gloo", "nccl"] = "gloo"
    overlap: bool = True
    """Measure how much communication hides behind compute (else `overlap` is 0)."""
    probes: Literal["all", "links"] = "all"
    """`all`: every compute and collective probe; `links`: only the all-reduce sweep a link is fitted from
    (`links.sweep_seconds`), as `calibrate --gpu` runs it on a node's GPUs."""
    link_sizes: tuple[int, ...] = LINK_SIZES


def calibrate(ranks: int = 2, *, threads: int = 1, address: str = "127.0.0.1") -> ResourceSpec:
    """A one-node ResourceSpec with this machine's figures, measured by `ranks` concurrent gloo ranks."""
    if ranks < 2:
        raise InvalidResourceSpecError([Problem("ranks", f"must be at least 2 to measure a collective, got {ranks}")])
    spare_cores = len(os.sched_getaffinity(0)) - ranks * threads
    figures = combine(run_ranks(RankJob(ranks=ranks, threads=threads, overlap=spare_cores > 0)))
    provenance = {
        "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ranks": ranks,
        "threads": threads,
        "allreduce_bytes": list(SIZES),
        "spare_cores": spare_cores,
        **figures,
    }
    return spec_from_figures(provenance, address=address)


def run_ranks(job: RankJob, *, timeout_s: float = WORKER_TIMEOUT_S) -> list[dict[str, Any]]:
    """Start `job.ranks` measuring processes on this machine and return each rank's figures, in rank order."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="stratagem-calibrate-") as folder:
        env = rank_environment(OMP_NUM_THREADS=str(job.threads))
        results = [Path(folder) / f"rank{rank}.json" for rank in range(job.ranks)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "stratagem.calibrate", json.dumps(asdict(job)), str(rank), str(port), str(path)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank, path in enumerate(results)
        ]
        errors = wait_for_ranks(procs, timeout_s)
        missing = [path.name for path in results if not path.exists()]
        if errors or missing:
            raise CalibrationError(
                f"calibration workers failed: {'; '.join(errors) or 'no result from ' + ', '.join(missing)}"
            )
        return [json.loads(path.read_text()) for path in results]


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
            last = stderr.strip().splitlines()[-1] if stderr and stderr.strip() else ""
            errors.append(f"rank {rank} exited {proc.returncode}: {last}")
    return errors


def measure_rank(job: RankJob, rank: int, port: int, result: Path) -> None:
    """One rank: every measurement at the same time as the other ranks; writes its figures as JSON and
    leaves the process without the process group's teardown (a peer that finished first can make it
    abort this process)."""
    cuda = job.backend == "nccl"
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(job.threads)
    torch.manual_seed(rank)
    dist.init_process_group(
        job.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=job.ranks,
        timeout=datetime.timedelta(seconds=WORKER_TIMEOUT_S),
    )
    ranks = Ranks.world(device)

    def agree(go: bool) -> bool:
        ranks.synchronize()
        flag = torch.tensor([int(go)], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    if job.probes == "links":
        figures: dict[str, Any] = {"link_seconds": sweep_seconds(device, job.link_sizes)}
    else:
        stepper = Stepper(agree, evict=CacheEvictor.for_device(device))
        figures = gpu_figures(stepper, device) if cuda else compute_figures(stepper)
        figures.update(collective_figures(ranks, overlap=job.overlap))
    dist.barrier()
    result.write_text(json.dumps(figures))
    os._exit(0)


def main(argv: list[str]) -> None:
    """`python -m stratagem.calibrate JOB RANK PORT RESULT`: one rank of `run_ranks`."""
    job, rank, port, result = argv
    fields = json.loads(job)
    fields["link_sizes"] = tuple(fields.get("link_sizes", LINK_SIZES))
    measure_rank(RankJob(**fields), int(rank), int(port), Path(result))
