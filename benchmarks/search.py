"""Search quality and latency on the zoo, on AutoDist's benchmark cluster (g4dn.12xlarge: 4 × T4, 50 Gbit/s).

Prints one JSON object:
- `bert_large_16x4`: BERT-large (captured at full size, batch 32) on 16 nodes × 4 T4 with a 2 s
  budget: search seconds, candidates evaluated, predicted step times and speed-ups (the same search
  run first, in a fresh process, is `first_search_in_process`);
- `zoo`: every zoo model on 1, 2, 4 and 8 nodes × 4 T4: speed-up of the found strategy over plain data
  parallel and over the best AutoDist builder (never below 1.0), and search seconds;
- `dlrm_vs_data_parallel`: the recommendation model's speed-up over plain data parallel per cluster
  size, the case parameter servers exist for;
- `reproducible`: the same seed under a candidate budget gives the same strategies.

    python -m benchmarks.search [--budget 2.0] [--nodes 1 2 4 8] [--models bert_large dlrm]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from optimizer_service.search import search
from stratagem import zoo
from stratagem.errors import StratagemError
from stratagem.ir import ModelGraph, ResourceSpec
from stratagem.tracing import capture

BATCH = {"resnet50": 32, "vgg16": 32, "bert_large": 32, "gpt": 4, "dlrm": 1024}
"""Per-replica batch sizes: the image and BERT figures of AutoDist's benchmarks; GPT at sequence 1024."""


def g4dn_cluster(nodes: int) -> ResourceSpec:
    return ResourceSpec.parse(
        {
            "name": f"g4dn.12xlarge x{nodes}",
            "nodes": [
                {"address": f"10.0.0.{i + 1}", "gpus": [0, 1, 2, 3], "chief": i == 0, "device": "T4"}
                for i in range(nodes)
            ],
            "network": {"kind": "ethernet", "bandwidth_gbps": 50, "latency_us": 25},
        }
    )


def captured(name: str) -> tuple[ModelGraph, float]:
    started = time.perf_counter()
    module, make_batch = zoo.build(name, "full", device="meta")
    graph = capture(module, make_batch(BATCH[name]), batch_size=BATCH[name], name=name)
    return graph, time.perf_counter() - started


def run(graph: ModelGraph, resources: ResourceSpec, budget: float | None, **kwargs: Any) -> dict[str, Any]:
    try:
        result = search(graph, resources, time_budget_s=budget, **kwargs)
    except StratagemError as error:
        return {"error": str(error)}
    best = result.candidates[0]
    return {
        "search_s": round(result.elapsed_s, 3),
        "evaluated": result.evaluated,
        "evaluated_by_phase": result.evaluated_by_phase,
        "stopped_by": result.stopped_by,
        "step_time_s": best.predicted.step_time_s,
        "data_parallel_step_time_s": result.baselines["DataParallel"].predicted.step_time_s,
        "speedup_vs_data_parallel": _round(result.speedup_vs_data_parallel),
        "speedup_vs_best_builder": _round(result.speedup_vs_best_builder),
        "best_builder": result.best_builder,
        "found_by": best.provenance.search["found_by"],
        "strategy": best.describe(),
        "strategy_id": best.id,
        "log10_space": result.space.log10_candidates,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=2.0, help="time budget per search, seconds")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--models", nargs="+", default=list(BATCH))
    args = parser.parse_args()

    graphs, capture_s = {}, {}
    for name in dict.fromkeys(["bert_large", *args.models]):
        graphs[name], capture_s[name] = captured(name)
    out: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "load_average_1m_at_start": round(os.getloadavg()[0], 2)},
        "budget_s": args.budget,
        "capture_s": {k: round(v, 2) for k, v in capture_s.items()},
    }
    # the first search of a process also pays one-time costs (lazy imports, first numpy calls): report it apart
    out["first_search_in_process"] = run(graphs["bert_large"], g4dn_cluster(16), args.budget, max_candidates=20000)
    out["bert_large_16x4"] = run(graphs["bert_large"], g4dn_cluster(16), args.budget, max_candidates=20000)
    out["zoo"] = {
        name: {f"{n}x4": run(graphs[name], g4dn_cluster(n), args.budget, max_candidates=20000) for n in args.nodes}
        for name in args.models
    }
    rows = [r for per_model in out["zoo"].values() for r in per_model.values() if "error" not in r]
    out["min_speedup_vs_best_builder"] = min(
        (r["speedup_vs_best_builder"] for r in rows if r["speedup_vs_best_builder"]), default=None
    )
    if "dlrm" in out["zoo"]:
        out["dlrm_vs_data_parallel"] = {k: r.get("speedup_vs_data_parallel") for k, r in out["zoo"]["dlrm"].items()}
    repeat = [run(graphs["bert_large"], g4dn_cluster(4), None, max_candidates=1500, seed=3) for _ in range(2)]
    out["reproducible"] = {
        "same_answer": repeat[0]["strategy_id"] == repeat[1]["strategy_id"],
        "evaluated": repeat[0]["evaluated"],
        "search_s": repeat[0]["search_s"],
    }
    out["machine"]["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
