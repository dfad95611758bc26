"""What the runtime's gradient clip costs a step, against what the simulator prices.

The runtime clips (`stratagem.runtime.clipping`) with one multi-tensor norm and one multi-tensor scale,
as `torch.nn.utils.clip_grad_norm_` does; the simulator prices three passes over the gradients at the
element-wise rate and, beside a multi-tensor update, nothing per tensor (`simulator.devices.CLIP_PASSES`).
Measured side by side, in turns, on one rank of a one-process gloo group: the runtime's clip of each
case's gradients, and the same clip as a loop of per-tensor norms and scales (torch 1.x's), which shows
what a per-tensor dispatch costs on this host. The cases are the zoo models' gradients and, to measure
the rate the bytes move at, 64 flat tensors of 4M fp32 elements each (1 GiB; `--flat-elements`). `priced_s` is the simulator's
added step time on one device of the catalog kind (`--kind`; the catalog's figures, not this machine's).

    python -m benchmarks.clip_cost [--repeats 200] [--device cuda --kind H200]
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
FLAT = "flat_64"
FLAT_TENSORS, FLAT_ELEMENTS = 64, 4 << 20


def _median_s(run: Callable[[], object], repeats: int, sync: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
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


def _runtime_clip(params: list[Any], max_norm: float, device: Any) -> Callable[[], object]:
    from stratagem.runtime.clipping import GradClipper, Holders
    from stratagem.runtime.stats import StatsRecorder

    holders = Holders(stage_ranks=1, group_ranks=1)
    clipper = GradClipper(max_norm, holders=holders, group=None, device=device)
    stats = StatsRecorder(device)
    stats.begin_step()
    return lambda: clipper.clip(params, [], [], stats)


def _cluster(kind: str) -> Any:
    from stratagem.ir import Node, ResourceSpec

    if kind == "CPU":
        return ResourceSpec(name="cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0], device="CPU")])
    return ResourceSpec(name=kind.lower(), nodes=[Node(address="127.0.0.1", chief=True, gpus=[0], device=kind)])


def _priced_s(name: str, kind: str, elements: int) -> float:
    from stratagem import predict, zoo
    from stratagem.builders import DataParallel
    from stratagem.tracing import capture

    if name == FLAT:
        from simulator.devices import CLIP_PASSES
        from stratagem.ir.catalog import CATALOG

        spec = CATALOG[kind]
        return CLIP_PASSES * 4 * FLAT_TENSORS * elements / (spec.memory_bandwidth * spec.elementwise_efficiency)
    module, make_batch = zoo.build(name)
    cluster = _cluster(kind)
    steps = []
    for norm in (None, 1.0):
        graph = capture(module, make_batch(2), batch_size=2, max_grad_norm=norm, trace=False)
        steps.append(predict(graph, cluster, DataParallel().build(graph, cluster)).step_time_s)
    return steps[1] - steps[0]


def _parameters(name: str, device: Any, elements: int) -> list[Any]:
    import torch

    from stratagem import zoo

    if name == FLAT:
        params = [torch.nn.Parameter(torch.zeros(elements, device=device)) for _ in range(FLAT_TENSORS)]
    else:
        params = [p for p in zoo.build(name)[0].to(device).parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def measure(
    repeats: int, device_name: str = "cpu", kind: str = "CPU", flat_elements: int = FLAT_ELEMENTS
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = torch.device(device_name)
    sync: Callable[[], object] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = {}
        for name in (*MODELS, FLAT):
            params = _parameters(name, device, flat_elements)
            runs = {
                "runtime_s": _runtime_clip(params, 1e-3, device),
                "per_tensor_loop_s": _loop_clip([p.grad for p in params], 1e-3),
            }
            samples: dict[str, list[float]] = {key: [] for key in runs}
            for _ in range(3):
                for key, run in runs.items():
                    samples[key].append(_median_s(run, repeats, sync))
            runtime = statistics.median(samples["runtime_s"])
            loop = statistics.median(samples["per_tensor_loop_s"])
            priced = _priced_s(name, kind, flat_elements)
            rows[name] = {
                "tensors": len(params),
                "parameters": sum(p.numel() for p in params),
                "runtime_s": runtime,
                "per_tensor_loop_s": loop,
                "loop_over_runtime": loop / runtime,
                "priced_s": priced,
                "priced_over_runtime": priced / runtime,
            }
        return {"benchmark": "clip_cost", "device": device_name, "kind": kind, "threads": 1, "cases": rows}
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--device", default="cpu", help="torch device the gradients live on (cpu, cuda)")
    parser.add_argument("--kind", default="CPU", help="catalog kind the price is taken on (CPU, H200, ...)")
    parser.add_argument("--flat-elements", type=int, default=FLAT_ELEMENTS, help="elements of each flat tensor")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.repeats, args.device, args.kind, args.flat_elements), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
