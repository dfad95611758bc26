"""Page faults and step time of one strategy at a time, as a trial runs it, beside an undistributed copy.

A trial trains one strategy on its own pair of ranks, so its buckets' memory is the only large memory
a step frees and takes again. Each rank here builds a zoo model under one strategy plus an undistributed
copy, and runs their steps in turn from a barrier; it reports per copy the median step time and the
median page faults a step took (memory touched for the first time: a buffer the allocator handed back
to the kernel and mapped again). The ratio strategy/undistributed is the figure to compare across runs
or commits: both copies saw the same load.

`--glibc-defaults` starts the ranks without Stratagem's allocator settings (`stratagem/rank_env.py`),
as a user's own launcher (torchrun) would.

    python -m benchmarks.trial_page_faults [--model bert_large] [--strategies AllReduce PS] [--glibc-defaults]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.system import ROOT, module_command, page_faults
from stratagem.calibrate.workers import wait_for_ranks
from stratagem.rank_env import rank_environment
from stratagem.runtime.launch import free_port

RANKS = 2


def _child(model: str, strategy_name: str, steps: int, warmup: int, port: int, rank: int, out: Path) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from benchmarks.lib.cases import CASES, build_graph, strategies_for
    from stratagem.ir import Node, ResourceSpec
    from stratagem.runtime import distribute
    from trial_runner.build import batch_for, build_workload, make_optimizer, prime_optimizer_state
    from trial_runner.workloads import ZooWorkload

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=300),
    )
    case = CASES[model]
    workload = ZooWorkload(model, batch_size=case.batch_size, overrides=case.overrides, optimizer=case.optimizer)
    resources = ResourceSpec(
        name="this-machine", nodes=[Node(address="127.0.0.1", chief=True, cpus=list(range(RANKS)), device="CPU")]
    )
    strategy = strategies_for(build_graph(model), resources)[strategy_name]
    built = build_workload(workload, seed=0, rank=rank)
    optimizer = make_optimizer(built.optimizer_kind, built.model)
    prime_optimizer_state(built, optimizer, strategy, seed=0, device=torch.device("cpu"))
    model_, optimizer = distribute(built.model, optimizer, strategy, rank=rank)
    local = build_workload(workload, seed=0, rank=rank)
    copies = {
        strategy_name: (built, model_, optimizer),
        "undistributed": (local, local.model, make_optimizer(local.optimizer_kind, local.model)),
    }
    times: dict[str, list[float]] = {name: [] for name in copies}
    faults: dict[str, list[int]] = {name: [] for name in copies}
    for step in range(warmup + steps):
        for name in list(copies)[step % 2 :] + list(copies)[: step % 2]:
            spec, net, opt = copies[name]
            batch = batch_for(spec, seed=0, rank=rank, step=step, device=torch.device("cpu"))
            dist.barrier()
            before, start = page_faults(), time.perf_counter()
            opt.zero_grad(set_to_none=True)
            spec.loss(net(*batch)).backward()
            opt.step()
            if step >= warmup:
                times[name].append(time.perf_counter() - start)
                faults[name].append(page_faults() - before)
    out.write_text(json.dumps({"times": times, "faults": faults}))
    dist.barrier()
    os._exit(0)


def measure(model: str, strategy: str, *, steps: int, warmup: int, glibc_defaults: bool) -> dict[str, Any]:
    """One strategy's pair of ranks: per copy, the slowest rank's median step (ms) and median faults."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if glibc_defaults else rank_environment(OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="stratagem-faults-") as folder:
        outs = [Path(folder) / f"rank{rank}.json" for rank in range(RANKS)]
        procs = [
            subprocess.Popen(
                module_command(
                    "benchmarks.trial_page_faults",
                    "--child",
                    model,
                    strategy,
                    str(steps),
                    str(warmup),
                    str(port),
                    str(rank),
                    str(out),
                ),
                cwd=ROOT,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank, out in enumerate(outs)
        ]
        errors = wait_for_ranks(procs, 900)
        if errors:
            raise SystemExit("; ".join(errors))
        reports = [json.loads(out.read_text()) for out in outs]
    result: dict[str, Any] = {}
    for name in reports[0]["times"]:
        steps_s = [max(column) for column in zip(*(r["times"][name] for r in reports), strict=True)]
        result[name] = {
            "step_ms": round(statistics.median(steps_s) * 1e3, 2),
            "page_faults_per_step": statistics.median(f for r in reports for f in r["faults"][name]),
        }
    result["over_undistributed"] = round(result[strategy]["step_ms"] / result["undistributed"]["step_ms"], 3)
    return result


def main() -> None:
    if len(sys.argv) == 9 and sys.argv[1] == "--child":
        _child(
            sys.argv[2],
            sys.argv[3],
            int(sys.argv[4]),
            int(sys.argv[5]),
            int(sys.argv[6]),
            int(sys.argv[7]),
            Path(sys.argv[8]),
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_large")
    parser.add_argument("--strategies", nargs="+", default=["AllReduce", "PS"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--glibc-defaults", action="store_true", help="start the ranks without Stratagem's allocator settings"
    )
    args = parser.parse_args()
    results = {
        name: measure(args.model, name, steps=args.steps, warmup=args.warmup, glibc_defaults=args.glibc_defaults)
        for name in args.strategies
    }
    print(
        json.dumps(
            {
                "model": args.model,
                "allocator_settings": not args.glibc_defaults,
                "steps": args.steps,
                "load_average_1m": round(os.getloadavg()[0], 2),
                "strategies": results,
            }
        )
    )


if __name__ == "__main__":
    main()
