"""One-rank trials of zoo models on a CUDA device, beside the simulator's predictions for the same
graph on the catalog's GPU kind and on the device as `stratagem calibrate --gpu` measured it just
before (`calibrate_gpu`). Needs CUDA; prints one JSON object: per model the trial's median step, the
same model's plain PyTorch step (no Stratagem runtime: what the runtime itself adds on one rank),
both predictions and their ratios to the trial, the runtime's own account of its waits, and the MAPE
of each prediction.

    python -m benchmarks.gpu_one_rank --device H100
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks.lib.gpu import CASES, optimizer_for, plain_step_ms
from simulator import simulate
from simulator.metrics import mape
from stratagem import zoo
from stratagem.builders import DataParallel
from stratagem.calibrate import calibrate_gpu
from stratagem.ir import Node, ResourceSpec
from stratagem.tracing import capture
from trial_runner import LocalBackend, ZooWorkload, run_trial


def measure_case(
    name: str, batch: int, overrides: dict[str, Any], catalog: ResourceSpec, calibrated: ResourceSpec
) -> dict[str, Any]:
    optimizer = optimizer_for(name)
    module, make_batch = zoo.build(name, "small", **overrides)
    graph = capture(module, make_batch(batch), batch_size=batch, optimizer=optimizer)
    priced = {
        label: simulate(graph, spec, [DataParallel().build(graph, spec)])[0]
        for label, spec in (("catalog", catalog), ("calibrated", calibrated))
    }
    strategy = DataParallel().build(graph, calibrated)
    workload = ZooWorkload(name, size="small", batch_size=batch, overrides=overrides, optimizer=optimizer)
    result = run_trial(workload, calibrated, strategy, warmup=10, steps=20, timeout=300, backend=LocalBackend())
    measured = result.median_s
    return {
        "model": name,
        "batch": batch,
        "parameters": graph.parameter_bytes // 4,
        "outcome": str(result.outcome),
        "error": result.error,
        "measured_ms": round(measured * 1e3, 3) if measured else None,
        "plain_pytorch_ms": plain_step_ms(name, batch, overrides),
        "runtime_wait_ms": {kind: round(s * 1e3, 3) for kind, s in result.ranks[0].wait_by_kind_s.items()}
        if result.ranks
        else None,
        **{f"{label}_ms": round(p.step_time_s * 1e3, 3) for label, p in priced.items()},
        **{f"{label}_ratio": round(p.step_time_s / measured, 3) if measured else None for label, p in priced.items()},
        "calibrated_breakdown_ms": {k: round(v * 1e3, 3) for k, v in priced["calibrated"].breakdown.items() if v},
        "peak_memory_gb": [round(p / 1e9, 3) for p in result.peak_memory_bytes],
        "predicted_memory_gb": round(priced["calibrated"].memory_per_device_bytes / 1e9, 3),
    }


def ratio_mape(cases: list[dict[str, Any]], label: str) -> float | None:
    """MAPE of one prediction over the cases, from its predicted/measured ratios."""
    ratios = [case[f"{label}_ratio"] for case in cases if case[f"{label}_ratio"] is not None]
    return round(mape(measured=[1.0] * len(ratios), predicted=ratios), 3) if ratios else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="H100", help="the catalog device kind the simulator prices")
    args = parser.parse_args()
    catalog = ResourceSpec(name="gpu-1x1", nodes=[Node(address="127.0.0.1", chief=True, gpus=[0], device=args.device)])
    started = time.perf_counter()
    calibrated = calibrate_gpu(0)
    calibration_s = time.perf_counter() - started
    calibrated = calibrated.model_copy(update={"nodes": [calibrated.nodes[0].model_copy(update={"gpus": [0]})]})
    kind = calibrated.nodes[0].device
    cases = [measure_case(name, batch, overrides, catalog, calibrated) for name, batch, overrides in CASES]
    print(
        json.dumps(
            {
                "benchmark": "gpu_one_rank",
                "device": args.device,
                "calibrated_kind": kind,
                "calibration_s": round(calibration_s, 1),
                "mape": {"catalog": ratio_mape(cases, "catalog"), "calibrated": ratio_mape(cases, "calibrated")},
                "cases": cases,
                "calibrated_device": calibrated.devices[kind].model_dump(exclude_none=True),
                "figures": calibrated.provenance,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
