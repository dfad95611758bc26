"""One-rank trials of zoo models on a CUDA device, beside the simulator's prediction for the same
graph on a catalog GPU: a first look at how the uncalibrated catalog figures price a real GPU step
(`stratagem calibrate` measures CPU ranks only). Needs CUDA; prints one JSON object.

    python benchmarks/gpu_one_rank.py --device H100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples import zoo
from simulator import simulate
from stratagem.builders import DataParallel
from stratagem.ir import Node, ResourceSpec
from stratagem.tracing import capture
from trial_runner import LocalBackend, ZooWorkload, run_trial

CASES: list[tuple[str, int, dict[str, Any]]] = [
    ("bert_large", 16, {"layers": 4, "hidden": 1024, "ffn": 4096, "seq": 128, "heads": 16}),
    ("gpt", 16, {"hidden": 1024, "ffn": 4096, "layers": 4, "seq": 256, "heads": 16}),
    ("vgg16", 64, {"width": 64, "hidden": 4096}),
    ("resnet50", 64, {"width": 64}),
    ("dlrm", 4096, {}),
]
"""Zoo models at sizes a GPU computes in milliseconds, each with its batch per step."""


def measure_case(name: str, batch: int, overrides: dict[str, Any], resources: ResourceSpec) -> dict[str, Any]:
    optimizer = "adagrad" if name == "dlrm" else "adam"
    module, make_batch = zoo.build(name, "small", **overrides)
    graph = capture(module, make_batch(batch), batch_size=batch, optimizer=optimizer)
    strategy = DataParallel().build(graph, resources)
    prediction = simulate(graph, resources, [strategy])[0]
    workload = ZooWorkload(name, size="small", batch_size=batch, overrides=overrides, optimizer=optimizer)
    result = run_trial(workload, resources, strategy, warmup=10, steps=20, timeout=300, backend=LocalBackend())
    return {
        "model": name, "batch": batch, "parameters": graph.parameter_bytes // 4, "outcome": str(result.outcome), "error": result.error,
        "measured_ms": round(result.median_s * 1e3, 3) if result.median_s else None,
        "predicted_ms": round(prediction.step_time_s * 1e3, 3),
        "predicted_breakdown_ms": {k: round(v * 1e3, 3) for k, v in prediction.breakdown.items() if v},
        "peak_memory_gb": [round(p / 1e9, 3) for p in result.peak_memory_bytes],
        "predicted_memory_gb": round(prediction.memory_per_device_bytes / 1e9, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="H100", help="the catalog device kind the simulator prices")
    args = parser.parse_args()
    resources = ResourceSpec(name="gpu-1x1", nodes=[Node(address="127.0.0.1", chief=True, gpus=[0], device=args.device)])
    print(json.dumps({"benchmark": "gpu_one_rank", "device": args.device,
                      "cases": [measure_case(name, batch, overrides, resources) for name, batch, overrides in CASES]}, indent=2))


if __name__ == "__main__":
    main()
