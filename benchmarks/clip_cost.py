"""What the runtime's gradient clip costs a step on this CPU, against what the simulator prices.

The runtime clips (`stratagem.runtime.clipping`) with one multi-tensor norm and one multi-tensor scale,
as `torch.nn.utils.clip_grad_norm_` does; the simulator prices three passes over the gradients at the
element-wise rate and, beside a multi-tensor update, nothing per tensor (`simulator.devices.CLIP_PASSES`).
Measured side by side, in turns, on one rank of a one-process gloo group: the runtime's clip of each zoo
model's gradients, and the same clip as a loop of per-tensor norms and scales (torch 1.x's), which shows
what a per-tensor dispatch costs on this host. `priced_s` is the simulator's added step time for the model
on the catalog CPU (its bandwidth is the catalog's, not this machine's).

    python -m benchmarks.clip_cost [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

MODELS = ("gpt", "resnet50", "vgg16", "dlrm")


def _median_s(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times[repeats // 10 :])


def _loop_clip(grads: list[Any], max_norm: float) -> Callable[[], object]:
    import torch

    def clip() -> None:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coefficient = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(coefficient)

    return clip


def _runtime_clip(params: list[Any], max_norm: float) -> Callable[[], object]:
    import torch

    from stratagem.runtime.clipping import GradClipper, Holders
    from stratagem.runtime.stats import StatsRecorder

    holders = Holders(stage_ranks=1, group_ranks=1)
    clipper = GradClipper(max_norm, holders=holders, group=None, device=torch.device("cpu"))
    stats = StatsRecorder(torch.device("cpu"))
    stats.begin_step()
    return lambda: clipper.clip(params, [], [], stats)


def _priced_s(name: str) -> float:
    from stratagem import predict, zoo
    from stratagem.builders import DataParallel
    from stratagem.ir import Node, ResourceSpec
    from stratagem.tracing import capture

    module, make_batch = zoo.build(name)
    cluster = ResourceSpec(name="cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0], device="CPU")])
    steps = []
    for norm in (None, 1.0):
        graph = capture(module, make_batch(2), batch_size=2, max_grad_norm=norm, trace=False)
        steps.append(predict(graph, cluster, DataParallel().build(graph, cluster)).step_time_s)
    return steps[1] - steps[0]


def measure(repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from stratagem import zoo

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = {}
        for name in MODELS:
            module, _ = zoo.build(name)
            params = [p for p in module.parameters() if p.requires_grad]
            for p in params:
                p.grad = torch.randn_like(p)
            runs = {
                "runtime_s": _runtime_clip(params, 1e-3),
                "per_tensor_loop_s": _loop_clip([p.grad for p in params], 1e-3),
            }
            samples: dict[str, list[float]] = {key: [] for key in runs}
            for _ in range(3):
                for key, run in runs.items():
                    samples[key].append(_median_s(run, repeats))
            runtime = statistics.median(samples["runtime_s"])
            loop = statistics.median(samples["per_tensor_loop_s"])
            rows[name] = {
                "tensors": len(params),
                "parameters": sum(p.numel() for p in params),
                "runtime_s": runtime,
                "per_tensor_loop_s": loop,
                "loop_over_runtime": loop / runtime,
                "priced_s": _priced_s(name),
            }
        return {"benchmark": "clip_cost", "threads": 1, "models": rows}
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
