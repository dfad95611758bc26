"""Trials: every pre-built builder on every zoo model (small), 2 ranks on this machine, real vs replay.

For each (model, builder) the same strategy runs twice through the local backend: on the zoo model
itself and on a ReplayWorkload of its captured graph. Prints one JSON object: per pair the median
step time, samples/s and peak memory of both, and replay/real step-time ratios, plus totals. Every
trial is also written as one JSON line {graph, resources, strategy, result} to `--out`, for the
simulator-accuracy and cost-model benchmarks.

    .venv/bin/python benchmarks/trials.py [--quick] [--out trials.jsonl] [--steps 10] [--warmup 3]

Reproducible: fixed seeds (model init and per-rank, per-step batches), fixed warm-up and step counts,
one thread per rank. The machine's other load still moves the numbers; the medians damp it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stratagem import zoo
from stratagem.builders import all_builders
from stratagem.ir import ModelGraph, Node, ResourceSpec, Strategy
from stratagem.tracing import capture
from trial_runner import LocalBackend, ReplayWorkload, TrialResult, ZooWorkload, run_trial

QUICK_MODELS = ("resnet50", "dlrm")
QUICK_BUILDERS = ("DataParallel", "PS", "Parallax")
BATCH_SIZE = {"resnet50": 16, "vgg16": 16, "bert_large": 8, "gpt": 8, "dlrm": 64}
OPTIMIZER = {"dlrm": "adagrad"}
"""Adam cannot apply DLRM's sparse embedding gradients; Adagrad is what DLRM is usually trained with."""


def main() -> None:
    args = _arguments()
    models = args.models or (QUICK_MODELS if args.quick else tuple(zoo.ZOO))
    wanted = args.builders or (QUICK_BUILDERS if args.quick else None)
    builders = [b for b in all_builders() if wanted is None or b.name in wanted]
    resources = ResourceSpec(
        name="local-2cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")]
    )
    backend = LocalBackend()
    started = time.perf_counter()
    pairs: list[dict[str, Any]] = []
    with open(args.out, "w") as out:
        for name in models:
            graph = _graph(name, BATCH_SIZE.get(name, 8))
            for builder in builders:
                strategy = builder.build(graph, resources)
                workloads = {
                    "real": ZooWorkload(name, batch_size=graph.batch_size, optimizer=graph.optimizer.kind),
                    "replay": ReplayWorkload(graph),
                }
                results = {}
                for kind, workload in workloads.items():
                    result = run_trial(
                        workload,
                        resources,
                        strategy,
                        warmup=args.warmup,
                        steps=args.steps,
                        timeout=args.timeout,
                        backend=backend,
                        threads_per_rank=1,
                    )
                    _write(out, graph, resources, strategy, result)
                    results[kind] = result
                pairs.append(_pair(name, builder.name, results["real"], results["replay"]))
                print(
                    f"{name:10s} {builder.name:22s} {_line(results['real'])} | replay {_line(results['replay'])}",
                    file=sys.stderr,
                    flush=True,
                )
    print(json.dumps(_report(pairs, args, time.perf_counter() - started), indent=2))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_MODELS} x {QUICK_BUILDERS}")
    parser.add_argument("--out", default="trials.jsonl", help="JSON Lines file of {graph, resources, strategy, result}")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--models", nargs="*", choices=tuple(zoo.ZOO))
    parser.add_argument("--builders", nargs="*")
    return parser.parse_args()


def _graph(name: str, batch_size: int) -> ModelGraph:
    """The zoo model's graph as the service would receive it: captured, not written by hand."""
    module, make_batch = zoo.build(name, "small")
    return capture(module, make_batch(batch_size), batch_size=batch_size, optimizer=OPTIMIZER.get(name, "adam"))


def _write(out: Any, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, result: TrialResult) -> None:
    record = {
        "graph": graph.model_dump(mode="json"),
        "resources": resources.model_dump(mode="json"),
        "strategy": strategy.model_dump(mode="json"),
        "result": result.model_dump(mode="json"),
    }
    out.write(json.dumps(record) + "\n")
    out.flush()


def _pair(model: str, builder: str, real: TrialResult, replay: TrialResult) -> dict[str, Any]:
    ratio = replay.median_s / real.median_s if real.ok and replay.ok and real.median_s and replay.median_s else None
    return {
        "model": model,
        "builder": builder,
        "real": _summary(real),
        "replay": _summary(replay),
        "replay_over_real_step_time": ratio,
    }


def _summary(result: TrialResult) -> dict[str, Any]:
    peaks = [p for p in result.peak_memory_bytes if p is not None]
    return {
        "outcome": result.outcome.value,
        "error": (result.error or "")[:300] or None,
        "median_s": result.median_s,
        "p90_s": result.p90_s,
        "samples_per_s": result.samples_per_s,
        "peak_memory_mb": round(max(peaks) / 2**20, 1) if peaks else None,
        "compute_s": result.compute_s,
        "sync_wait_s": result.sync_wait_s,
        "undistributed_step_s": result.undistributed_step_s,
        "wall_s": round(result.wall_s, 2),
    }


def _line(result: TrialResult) -> str:
    if not result.ok:
        return f"{result.outcome.value}: {(result.error or '').splitlines()[0][:120]}"
    return f"{result.median_s * 1e3:8.1f} ms {result.samples_per_s:8.1f} samples/s"


def _report(pairs: list[dict[str, Any]], args: argparse.Namespace, elapsed: float) -> dict[str, Any]:
    ratios = [p["replay_over_real_step_time"] for p in pairs if p["replay_over_real_step_time"]]
    outcomes: dict[str, int] = {}
    for pair in pairs:
        for kind in ("real", "replay"):
            outcome = pair[kind]["outcome"]
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {
        "benchmark": "trials",
        "ranks": 2,
        "backend": "local",
        "warmup": args.warmup,
        "steps": args.steps,
        "trials": 2 * len(pairs),
        "outcomes": outcomes,
        "replay_over_real": {
            "geometric_mean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None,
            "min": min(ratios) if ratios else None,
            "max": max(ratios) if ratios else None,
            "within_2x": sum(1 for r in ratios if 0.5 <= r <= 2.0),
            "pairs": len(ratios),
        },
        "elapsed_s": round(elapsed, 1),
        "records": args.out,
        "pairs": pairs,
    }


if __name__ == "__main__":
    main()
