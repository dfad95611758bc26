"""What an embedding layer's forward and backward cost as its table grows, against the simulator's price.

A lookup reads the rows it looks up; a table with sparse gradients (`sparse=True`) hands back only those
rows, while one with dense gradients makes autograd write a table-sized gradient in backward. Counting
the whole table as the lookup's traffic would make a recommendation model's compute grow with its
tables (a 244 MiB table priced at tens of milliseconds its lookups never take); this benchmark holds
the price to the measurement as tables grow.

Measured on one rank (one thread, a rank's allocator settings): a one-table model (`nn.Embedding`, its
output summed as capture's default loss does), forward and backward timed apart over `--repeats` steps,
the gradient dropped before each step as the trial runner drops it. The simulator prices the captured
graph on a one-device spec from this run's own calibration probes (`stratagem.calibrate.compute.compute_figures`).
Prints one JSON object: per table, the measured and priced milliseconds and their ratio.

    python -m benchmarks.embedding_lookups [--repeats 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from benchmarks.lib.system import reexec_with
from stratagem.rank_env import MALLOC_SETTINGS, rank_environment

TABLES: list[tuple[int, int, int]] = [
    (1_000, 64, 4096),
    (20_000, 64, 1024),
    (1_000_000, 64, 4096),
    (8_192, 1024, 512),
    (30_522, 1024, 512),
    (65_536, 256, 4096),
]
"""(rows, width, lookups per step): DLRM-sized and BERT-sized tables, from 0.2 MiB to 244 MiB."""


def one_table(rows: int, width: int, lookups: int, *, sparse: bool) -> tuple[Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(rows, width, sparse=sparse)), torch.randint(0, rows, (lookups,))


def timed_steps(model: Any, indices: Any, repeats: int) -> tuple[float, float]:
    """Median forward and backward seconds, after two untimed steps."""
    forward, backward = [], []
    for step in range(repeats + 2):
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        loss = model(indices).sum()
        middle = time.perf_counter()
        loss.backward()
        if step >= 2:
            forward.append(middle - started)
            backward.append(time.perf_counter() - middle)
    return statistics.median(forward), statistics.median(backward)


def one_device_spec() -> Any:
    """This rank's compute figures as a one-device spec (no collective is priced on one device)."""
    from stratagem.calibrate.compute import compute_figures
    from stratagem.calibrate.figures import DEVICE_KIND, device_spec
    from stratagem.calibrate.timing import Stepper
    from stratagem.ir import Link, Node, ResourceSpec

    device = device_spec({**compute_figures(Stepper()), "overlap": 0.0}, memory_bytes=float(8 << 30))
    link = Link(kind="loopback", bandwidth_gbps=10.0, latency_us=10.0)
    return ResourceSpec(
        name="one-rank",
        nodes=[Node(address="127.0.0.1", chief=True, cpus=[0], device=DEVICE_KIND)],
        network=link,
        intra_node=link,
        devices={DEVICE_KIND: device},
    )


def priced_seconds(model: Any, indices: Any, spec: Any) -> float:
    import simulator
    from stratagem.builders import AllReduce
    from stratagem.tracing import capture

    graph = capture(model, (indices,), batch_size=len(indices), optimizer="sgd")
    return float(simulator.simulate(graph, spec, [AllReduce().build(graph, spec)])[0].breakdown["compute"])


def measure(repeats: int) -> dict[str, Any]:
    import torch

    import simulator

    torch.set_num_threads(1)
    spec = one_device_spec()
    rows_out = []
    for rows, width, lookups in TABLES:
        for sparse in (True, False):
            model, indices = one_table(rows, width, lookups, sparse=sparse)
            forward, backward = timed_steps(model, indices, repeats)
            priced = priced_seconds(model, indices, spec)
            rows_out.append(
                {
                    "rows": rows,
                    "width": width,
                    "lookups": lookups,
                    "sparse": sparse,
                    "table_mib": round(rows * width * 4 / 2**20, 2),
                    "measured_ms": {"forward": round(1e3 * forward, 3), "backward": round(1e3 * backward, 3)},
                    "priced_ms": round(1e3 * priced, 3),
                    "priced_over_measured": round(priced / (forward + backward), 3),
                }
            )
    return {"simulator_version": simulator.SIMULATOR_VERSION, "tables": rows_out}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if any(name not in os.environ for name in MALLOC_SETTINGS):
        reexec_with(rank_environment(), "benchmarks.embedding_lookups")
    print(json.dumps({"benchmark": "embedding_lookups", "repeats": args.repeats, **measure(args.repeats)}, indent=2))


if __name__ == "__main__":
    main()
