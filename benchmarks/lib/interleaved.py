"""Interleaved measurement: every strategy of one job trained side by side by one pair of gloo ranks.

Each rank builds a model copy per strategy (plus, on request, an undistributed copy), then runs
warm-up and timed steps, one step of each copy in turn with the order rotated every step, each from a
barrier so it times that step alone. On a shared machine whose speed drifts two- or threefold within a
minute, every strategy then sees the same mixture of load, so their differences are measured rather
than the drift. `stratagem.calibrate`'s probes (and the gloo all-reduce sizes) run after every timed
round of steps, so the block's spec describes the machine those steps ran on.

`benchmarks/simulator_accuracy.py` and `benchmarks/cost_model.py` both measure this way. Never run two
real-trial benchmarks beside each other on the same cores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratagem.calibrate.workers import wait_for_ranks
from stratagem.ir import ResourceSpec, Strategy
from stratagem.rank_env import rank_environment
from stratagem.runtime.launch import free_port

ROOT = Path(__file__).resolve().parents[2]

RANKS = 2
PROBE_BUDGET_SCALE = 0.25
"""Interleaved calibration probes get a quarter of `stratagem calibrate`'s time budgets: they run
after every timed round, and their median over the rounds is what counts."""
ONCE_PROBES = ("bf16_flops",)
"""Probed in the first timed round only: the zoo graphs train in fp32, and a CPU without bf16 units
takes seconds per probe."""
LOCAL = "__undistributed__"
"""The model copy every rank trains alone (no strategy): its step is the compute and update the
simulator predicts without synchronization, measured under the same load as the strategies."""


@dataclass
class Block:
    """What one interleaved run measured: per-rank reports and the spec calibrated alongside."""

    label: str
    """The workload's label, as trial results name it."""
    batch_size: int
    reports: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    resources: ResourceSpec | None = None

    def step_times(self, name: str) -> list[float]:
        """Per timed step, the slowest rank's time (a synchronous step waits for it)."""
        return [max(column) for column in zip(*(r["times"][name] for r in self.reports), strict=True)]

    def undistributed_s(self) -> float | None:
        if not self.reports or LOCAL not in self.reports[0]["times"]:
            return None
        return statistics.median(self.step_times(LOCAL))

    def sync_medians(self, name: str) -> dict[str, float]:
        """Per runtime timing (waits per kind, launch, update), the median over steps of the ranks' mean:
        where a strategy's step goes, to set beside the simulator's breakdown."""
        per_rank = [r.get("sync", {}).get(name, []) for r in self.reports]
        if not per_rank or not all(per_rank):
            return {}
        keys = sorted({key for steps in per_rank for step in steps for key in step})
        return {
            key: statistics.median(
                statistics.mean(step.get(key, 0.0) for step in column) for column in zip(*per_rank, strict=True)
            )
            for key in keys
        }

    def result(self, name: str, strategy: Strategy) -> dict[str, Any]:
        """A trial-like result for one strategy: outcome, median, per-step and per-rank times."""
        base = {
            "world_size": RANKS,
            "backend": "interleaved",
            "workload": self.label,
            "strategy_id": strategy.id,
            "global_batch_size": RANKS * self.batch_size,
            "undistributed_step_s": self.undistributed_s(),
            "optimizer_primed": bool(self.reports) and all(r["primed"].get(name, False) for r in self.reports),
        }
        refused = next((r["refused"][name] for r in self.reports if name in r["refused"]), None)
        if self.failure is not None or refused is not None:
            return {
                **base,
                "outcome": "invalid" if refused else "crash",
                "error": refused or self.failure,
                "median_s": None,
            }
        steps = self.step_times(name)
        median = statistics.median(steps)
        return {
            **base,
            "outcome": "ok",
            "error": None,
            "median_s": median,
            "step_times_s": steps,
            "sync_s": self.sync_medians(name),
            "p90_s": sorted(steps)[int(0.9 * (len(steps) - 1))],
            "samples_per_s": RANKS * self.batch_size / median,
            "ranks": [
                {"rank": i, "step_times_s": r["times"][name], "warmup_times_s": r["warmup"][name]}
                for i, r in enumerate(self.reports)
            ],
        }


def sync_parts(stats: Any) -> dict[str, float]:
    """A step's runtime timings as flat seconds: waiting per synchronizer kind, launching and updating."""
    return {
        **{f"wait_{kind}": seconds for kind, seconds in stats.wait_s.items()},
        "launch": stats.launch_s,
        "update": stats.update_s,
    }


def measure_block(
    workload: Any,
    strategies: dict[str, Strategy],
    *,
    warmup: int,
    steps: int,
    timeout: float,
    undistributed: bool = False,
    prime_optimizer: bool = True,
    env: dict[str, str] | None = None,
) -> Block:
    """Run one interleaved block of `workload` (a trial runner workload spec) under every strategy.

    `prime_optimizer` fills each copy's optimizer state first, as trials do (`TrialSpec.prime_optimizer`).
    `env` overrides the ranks' environment (`benchmarks/cpu_rank_settings.py` compares allocator settings).
    """
    from stratagem.calibrate.figures import SIZES, combine, spec_from_figures

    spare_cores = len(os.sched_getaffinity(0)) - RANKS
    job = {
        "workload": workload.model_dump(mode="json"),
        "warmup": warmup,
        "steps": steps,
        "spare_cores": spare_cores,
        "undistributed": undistributed,
        "prime_optimizer": prime_optimizer,
        "strategies": {name: strategy.model_dump(mode="json") for name, strategy in strategies.items()},
    }
    block = Block(label=workload.label, batch_size=workload.batch_size)
    with tempfile.TemporaryDirectory(prefix="stratagem-interleaved-") as folder:
        job_path = Path(folder) / "job.json"
        job_path.write_text(json.dumps(job))
        outputs = [Path(folder) / f"rank{rank}.json" for rank in range(RANKS)]
        block.failure = _launch(job_path, outputs, timeout, env or {})
        if block.failure is None:
            block.reports = [json.loads(path.read_text()) for path in outputs]
    if block.reports:
        block.resources = spec_from_figures(
            {
                "calibrated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "ranks": RANKS,
                "threads": 1,
                "allreduce_bytes": list(SIZES),
                "spare_cores": spare_cores,
                "interleaved_with": workload.label,
                **combine([r["figures"] for r in block.reports]),
            }
        )
    return block


def _launch(job: Path, outputs: list[Path], timeout: float, extra_env: dict[str, str]) -> str | None:
    """Run the ranks of a block to the end; None, or why they failed."""
    port = free_port()
    env = rank_environment(**{"OMP_NUM_THREADS": "1", **extra_env})
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.lib.interleaved", "--worker", str(job), str(rank), str(port), str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, path in enumerate(outputs)
    ]
    errors = wait_for_ranks(procs, timeout)
    missing = [path.name for path in outputs if not path.exists()]
    return "; ".join(errors) or (f"no result from {', '.join(missing)}" if missing else None)


def _worker(job_path: Path, rank: int, port: int, output: Path) -> None:
    """One rank of a block: build the copies, run the rotated steps, probe the machine between them."""
    import datetime

    import torch
    import torch.distributed as dist

    from stratagem.calibrate.collectives import Ranks, collective_figures
    from stratagem.calibrate.compute import probes as compute_probes
    from stratagem.calibrate.timing import CacheEvictor, Stepper
    from stratagem.errors import StratagemError
    from stratagem.runtime import distribute
    from trial_runner.build import batch_for, build_workload, make_optimizer, prime_optimizer_state
    from trial_runner.workloads import ReplayWorkload, ZooWorkload

    torch.set_num_threads(1)
    job = json.loads(job_path.read_text())
    workload = (ZooWorkload if job["workload"]["kind"] == "zoo" else ReplayWorkload).model_validate(job["workload"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=300),
    )
    runs: dict[str, tuple[Any, Any, Any]] = {}
    refused: dict[str, str] = {}
    primed: dict[str, bool] = {}
    for name, data in job["strategies"].items():
        built = build_workload(workload, seed=0, rank=rank)
        try:  # the runtime refuses a strategy on every rank alike, before any collective
            strategy, optimizer = Strategy.parse(data), make_optimizer(built.optimizer_kind, built.model)
            primed[name] = job["prime_optimizer"] and prime_optimizer_state(
                built, optimizer, strategy, seed=0, device=torch.device("cpu")
            )
            model, optimizer = distribute(built.model, optimizer, strategy, rank=rank)
        except StratagemError as error:
            refused[name] = f"{type(error).__name__}: {error}"
            continue
        runs[name] = (built, model, optimizer)
    if job["undistributed"]:
        local = build_workload(workload, seed=0, rank=rank)
        runs[LOCAL] = (local, local.model, make_optimizer(local.optimizer_kind, local.model))
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    warmup: dict[str, list[float]] = {name: [] for name in names}
    sync: dict[str, list[dict[str, float]]] = {name: [] for name in names}

    def agree(go: bool) -> bool:
        flag = torch.tensor([int(go)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    stepper = Stepper(agree, budget_scale=PROBE_BUDGET_SCALE, evict=CacheEvictor.for_device())
    probes = compute_probes(stepper)
    samples: dict[str, list[Any]] = {name: [] for name in probes}
    for step in range(job["warmup"] + job["steps"]):
        shift = step % max(len(names), 1)
        for name in names[shift:] + names[:shift]:
            built, model, optimizer = runs[name]
            batch = batch_for(built, seed=0, rank=rank, step=step, device=torch.device("cpu"))
            dist.barrier()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            built.loss(model(*batch)).backward()
            optimizer.step()
            (warmup if step < job["warmup"] else times)[name].append(time.perf_counter() - start)
            stats = getattr(optimizer, "sync_stats", None)
            if stats is not None and step >= job["warmup"]:
                sync[name].append(sync_parts(stats))
        if step >= job["warmup"]:
            for name, probe in probes.items():
                if not (name in ONCE_PROBES and samples[name]):
                    samples[name].append(probe())
            for name, value in collective_figures(Ranks.world(), overlap=job["spare_cores"] > 0).items():
                samples.setdefault(name, []).append(value)
    dist.barrier()
    figures = {name: statistics.median(values) for name, values in samples.items() if name != "allreduce_seconds"}
    figures["allreduce_seconds"] = [
        statistics.median(column) for column in zip(*samples["allreduce_seconds"], strict=True)
    ]
    output.write_text(
        json.dumps(
            {"times": times, "warmup": warmup, "sync": sync, "refused": refused, "primed": primed, "figures": figures}
        )
    )
    os._exit(0)  # skip the process group's teardown: a peer that finished first can make it abort


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
    else:
        raise SystemExit("benchmarks.lib.interleaved runs the ranks of a block; see benchmarks/simulator_accuracy.py")
