"""Step time of the runtime's executors next to torch DDP, on gloo ranks of this machine.

Each strategy trains a 6-layer MLP (`--width` 512: 1.6 M parameters; 1024: 6.3 M, a 25 MB bucket)
for warm-up and timed steps on `--ranks` CPU processes; rank 0 reports the median step time (forward,
backward, optimizer step), the median time the step spent waiting on synchronization
(`optimizer.sync_stats`), the bytes this rank handed to collectives per step and the page faults a
step took (memory the step touched for the first time: a bucket allocated afresh every step faults
in its pages, which on a virtual machine costs more than the copy). DDP (one bucket per 25 MB, its
default, kept across steps) is the baseline the all-reduce executor should stay close to.

Usage: python -m benchmarks.runtime_step [--ranks 2] [--steps 20] [--width 512]   (prints one JSON object)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.system import ROOT, module_command, page_faults
from stratagem.rank_env import rank_environment

LAYERS, BATCH = 6, 64


def _strategies(names: list[str], world: int) -> dict[str, dict[str, Any] | None]:
    replicas = [f"10.0.0.{i + 1}:CPU:0" for i in range(world)]
    servers = [f"10.0.0.{i + 1}:CPU:0" for i in range(world)]

    def each(sync) -> dict[str, Any]:
        return {
            "replicas": replicas,
            "variables": [{"var_name": n, "synchronizer": sync(i)} for i, n in enumerate(names)],
        }

    def ps(i: int) -> dict[str, Any]:
        return {"kind": "ps", "reduction_destination": servers[i % world]}

    return {
        "ddp": None,
        "allreduce-1-group": each(lambda i: {"kind": "allreduce", "group": 0}),
        "allreduce-per-layer": each(lambda i: {"kind": "allreduce", "group": i // 2}),
        "allreduce-fp16": each(lambda i: {"kind": "allreduce", "compressor": {"kind": "fp16"}}),
        "allreduce-powersgd-r4": each(lambda i: {"kind": "allreduce", "compressor": {"kind": "powersgd", "rank": 4}}),
        "allreduce-topk-1%": each(lambda i: {"kind": "allreduce", "compressor": {"kind": "topk", "ratio": 0.01}}),
        "ps-one-server": each(lambda i: {"kind": "ps", "reduction_destination": servers[0]}),
        "ps-load-balanced": each(ps),
        "sharded": each(lambda i: {"kind": "sharded"}),
    }


def _model(width: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _child(out: Path, steps: int, warmup: int, width: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from stratagem.ir import Strategy
    from stratagem.runtime import distribute

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    names = [n for n, _ in _model(width).named_parameters()]
    x, y = torch.randn(BATCH, width), torch.randint(0, 10, (BATCH,))
    results: dict[str, Any] = {}
    for label, strategy in _strategies(names, world).items():
        model = _model(width)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if strategy is None:
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            model, optimizer = distribute(model, optimizer, Strategy.parse(strategy))
        times, waits, sent, faults = [], [], [], []
        for step in range(warmup + steps):
            dist.barrier()
            faulted = page_faults()
            start = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            elapsed = time.perf_counter() - start
            if step >= warmup:
                times.append(elapsed)
                faults.append(page_faults() - faulted)
                stats = getattr(optimizer, "sync_stats", None)
                if stats is not None:  # DDP has no such measurement
                    waits.append(stats.sync_wait_s)
                    sent.append(sum(stats.wire_bytes.values()))
        results[label] = {
            "step_ms": round(statistics.median(times) * 1e3, 2),
            "sync_wait_ms": round(statistics.median(waits) * 1e3, 2) if waits else None,
            "bytes_per_step": statistics.median(sent) if sent else None,
            "page_faults_per_step": statistics.median(faults),
        }
    if rank == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--width", type=int, default=512, help="the MLP's width (1024 makes one 25 MB bucket)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(Path(args.child), args.steps, args.warmup, args.width)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = rank_environment(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.ranks), OMP_NUM_THREADS="1"
        )
        command = module_command(
            "benchmarks.runtime_step",
            "--child",
            str(out),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--width",
            str(args.width),
        )
        procs = [subprocess.Popen(command, cwd=ROOT, env=dict(env, RANK=str(r))) for r in range(args.ranks)]
        codes = [p.wait(timeout=900) for p in procs]
        if any(codes):
            raise SystemExit(f"a rank failed: exit codes {codes}")
        results = json.loads(out.read_text())
    params = sum(p.numel() for p in _model(args.width).parameters())
    ddp = results["ddp"]["step_ms"]
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "parameters": params,
                "batch_per_rank": BATCH,
                "steps": args.steps,
                "cpus": os.cpu_count(),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "strategies": results,
                "allreduce_vs_ddp": round(results["allreduce-1-group"]["step_ms"] / ddp, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
