"""One rank of a trial: join the process group, build the workload, apply the strategy, time steps.

The same `run_rank` runs in a spawned process (local backend, via `python -m trial_runner.worker`)
and inside a Ray actor. It never raises: whatever goes wrong becomes the rank's outcome and error
text, so the supervisor can tell an out-of-memory from a crash from a peer that went away.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from stratagem.errors import InfeasibleStrategyError, InvalidDocumentError, UnsupportedStrategyError
from stratagem.runtime import SyncStats, distribute, replica_device
from trial_runner.build import (
    BuiltWorkload,
    batch_for,
    build_workload,
    make_optimizer,
    prime_optimizer_state,
    rank_batch,
)
from trial_runner.lifeline import die_with_parent
from trial_runner.measure import current_memory_bytes, peak_memory_bytes, reset_peak_memory
from trial_runner.result import Outcome, Progress, RankReport
from trial_runner.spec import TrialSpec
from trial_runner.workloads import FaultWorkload

ProgressFn = Callable[[Progress], None]

UNDISTRIBUTED_STEPS = 3
PEER_LOST_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "communicator was aborted",
)
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")
ERROR_TEXT_LIMIT = 4000


def run_rank(
    spec: TrialSpec, *, rank: int, master_addr: str, master_port: int, threads: int, progress: ProgressFn
) -> RankReport:
    report = RankReport(rank=rank)

    def advance(phase: str, step: int = 0) -> None:
        report.phase = phase
        progress(Progress(phase, step, max(report.warmup_times_s + report.step_times_s, default=0.0)))

    try:
        device = replica_device(spec.strategy.replicas[rank])
        report.device = str(device)
        if device.type == "cpu":
            torch.set_num_threads(threads)
        advance("init")
        _init_process_group(spec, rank, device, master_addr, master_port)
        _train(spec, rank, device, report, advance)
        advance("done", spec.warmup + spec.steps)
    except BaseException as error:  # every failure is an outcome, never a crash of the caller
        report.outcome, report.error = classify(error)
        report.peer_lost = is_peer_lost(error)
    report.finished_at = time.time()
    return report


def _init_process_group(spec: TrialSpec, rank: int, device: torch.device, address: str, port: int) -> None:
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.timeout_s),
    )


def _train(
    spec: TrialSpec, rank: int, device: torch.device, report: RankReport, advance: Callable[[str, int], None]
) -> None:
    advance("build", 0)
    reset_peak_memory(device)
    report.baseline_memory_bytes = current_memory_bytes(device)
    built = build_workload(spec.workload, seed=spec.seed, rank=rank)
    built.batch_size = spec.strategy.step_samples(built.batch_size)
    built.model.to(device)
    optimizer = make_optimizer(built.optimizer_kind, built.model)
    if spec.prime_optimizer:
        report.optimizer_primed = prime_optimizer_state(built, optimizer, spec.strategy, seed=spec.seed, device=device)
    advance("distribute", 0)
    model, optimizer = distribute(
        built.model, optimizer, spec.strategy, rank=rank, max_grad_norm=spec.workload.max_grad_norm
    )
    dist.barrier()
    for step in range(spec.warmup + spec.steps):
        warm = step < spec.warmup
        built.before_step(step, rank)
        batch = rank_batch(built, spec.strategy, seed=spec.seed, rank=rank, step=step, device=device)
        seconds = _train_step(model, optimizer, built, batch, device)
        (report.warmup_times_s if warm else report.step_times_s).append(seconds)
        if not warm:
            _record_sync(report, getattr(optimizer, "sync_stats", None))
        advance("warmup" if warm else "timed", step + 1)
    report.peak_memory_bytes = peak_memory_bytes(device)
    _average_waits(report)
    dist.barrier()
    if spec.measure_undistributed and _is_data_parallel(spec):
        advance("undistributed", spec.warmup + spec.steps)
        report.undistributed_times_s = _measure_undistributed(spec, rank, device)


def _train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    built: BuiltWorkload,
    batch: tuple[torch.Tensor, ...],
    device: torch.device,
) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = built.loss(model(*batch))
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _record_sync(report: RankReport, stats: SyncStats | None) -> None:
    """Keep the runtime's own account of the step: time blocked per synchronizer kind, bytes sent."""
    if stats is None:
        return
    report.sync_wait_times_s.append(float(stats.sync_wait_s))
    for kind, seconds in stats.wait_s.items():
        report.wait_by_kind_s[kind] = report.wait_by_kind_s.get(kind, 0.0) + float(seconds)
    report.wire_bytes = {kind: int(n) for kind, n in stats.wire_bytes.items()}


def _average_waits(report: RankReport) -> None:
    steps = len(report.sync_wait_times_s)
    if steps:
        report.wait_by_kind_s = {kind: total / steps for kind, total in report.wait_by_kind_s.items()}


def _is_data_parallel(spec: TrialSpec) -> bool:
    mesh = spec.strategy.effective_mesh
    return mesh.tensor == 1 and mesh.pipeline == 1 and mesh.context == 1


def _measure_undistributed(spec: TrialSpec, rank: int, device: torch.device) -> list[float]:
    """Time the same steps on an undistributed replica: what the step costs without any synchronization."""
    workload = spec.workload.inner if isinstance(spec.workload, FaultWorkload) else spec.workload
    built = build_workload(workload, seed=spec.seed, rank=rank)
    built.batch_size = spec.strategy.step_samples(built.batch_size)
    built.model.to(device)
    optimizer = make_optimizer(built.optimizer_kind, built.model)
    times = []
    for step in range(spec.warmup, spec.warmup + 1 + UNDISTRIBUTED_STEPS):
        batch = batch_for(built, seed=spec.seed, rank=rank, step=step, device=device)
        times.append(_train_step(built.model, optimizer, built, batch, device))
    return times[1:]


def classify(error: BaseException) -> tuple[Outcome, str]:
    """The outcome an exception stands for, and its text with the innermost frames."""
    text = f"{type(error).__name__}: {error}"
    frames = "".join(traceback.format_tb(error.__traceback__)[-3:])
    detail = f"{text}\n{frames}" if frames else text
    if len(detail) > ERROR_TEXT_LIMIT:
        detail = detail[: ERROR_TEXT_LIMIT // 2] + "\n...\n" + detail[-ERROR_TEXT_LIMIT // 2 :]
    if isinstance(error, (InvalidDocumentError, UnsupportedStrategyError, InfeasibleStrategyError)):
        return Outcome.invalid, detail
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and any(marker in str(error).lower() for marker in OOM_MARKERS)
    ):
        return Outcome.oom, detail
    return Outcome.crash, detail


def is_peer_lost(error: BaseException) -> bool:
    """A collective failed because another rank went away: an echo, not the trial's root cause."""
    return isinstance(error, RuntimeError) and any(marker in str(error).lower() for marker in PEER_LOST_MARKERS)


class FileProgress:
    """Progress as a tiny JSON file, replaced atomically, for a supervisor in another process."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, progress: Progress) -> None:
        scratch = self.path.with_suffix(".progress-tmp")
        scratch.write_text(json.dumps(progress._asdict()))
        os.replace(scratch, self.path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one rank of a trial (started by LocalBackend).")
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--parent-pid", type=int, default=None, help="die when this process (the supervisor) dies")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    progress = FileProgress(args.progress)
    progress(Progress("start", 0))
    try:
        spec = TrialSpec.parse(args.spec.read_text())
        report = run_rank(
            spec,
            rank=args.rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
            threads=args.threads,
            progress=progress,
        )
    except InvalidDocumentError as error:
        report = RankReport(rank=args.rank, outcome=Outcome.invalid, error=str(error), finished_at=time.time())
    scratch = args.result.with_suffix(".tmp")
    scratch.write_text(report.model_dump_json())
    os.replace(scratch, args.result)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a process group whose peer died can block it indefinitely.
    os._exit(0)


if __name__ == "__main__":
    main()
