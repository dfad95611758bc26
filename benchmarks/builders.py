"""How long each pre-built builder takes, and an AutoDist round trip, on a large transformer-like graph.

The search builds every baseline for every job, so they must stay cheap next to the simulator.
Prints one JSON object: per builder the median CPU time (ms) of a build over repeats, and the
AutoDist export/import times, for a GPT-like graph of `--layers` blocks on 16 nodes × 4 T4.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from stratagem.builders import all_builders
from stratagem.interop import strategy_from_autodist, strategy_to_autodist
from stratagem.ir import Layer, ModelGraph, Node, ResourceSpec, Variable


def transformer_graph(blocks: int, width: int = 1024, vocab: int = 50_257) -> ModelGraph:
    """Embedding, `blocks` pre-norm transformer blocks (12 variables each), a tied head."""
    variables = [
        Variable(name="wte.weight", shape=[vocab, width], sparse=True, lookups_per_step=8 * 1024, consumer="wte")
    ]
    layers = [Layer(name="wte", kind="embedding", variables=["wte.weight"])]
    shapes = {
        "ln_1.weight": [width],
        "ln_1.bias": [width],
        "attn.c_attn.weight": [3 * width, width],
        "attn.c_attn.bias": [3 * width],
        "attn.c_proj.weight": [width, width],
        "attn.c_proj.bias": [width],
        "ln_2.weight": [width],
        "ln_2.bias": [width],
        "mlp.c_fc.weight": [4 * width, width],
        "mlp.c_fc.bias": [4 * width],
        "mlp.c_proj.weight": [width, 4 * width],
        "mlp.c_proj.bias": [width],
    }
    for block in range(blocks):
        name = f"h.{block}"
        names = [f"{name}.{suffix}" for suffix in shapes]
        variables += [Variable(name=n, shape=s, consumer=name) for n, s in zip(names, shapes.values(), strict=True)]
        layers.append(
            Layer(name=name, kind="matmul", inputs=[layers[-1].name], variables=names, fwd_flops=1e12, bwd_flops=2e12)
        )
    return ModelGraph(name=f"gpt-{blocks}", batch_size=8, layers=layers, variables=variables)


def cluster(nodes: int = 16) -> ResourceSpec:
    return ResourceSpec(
        nodes=[Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=[0, 1, 2, 3]) for i in range(nodes)],
        network={"bandwidth_gbps": 50},
    )


def median_ms(run: Callable[[], Any], repeats: int) -> float:
    """Median CPU time of this process per run: steadier than wall time on a shared machine."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append((time.process_time() - start) * 1e3)
    return round(statistics.median(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    graph, resources = transformer_graph(args.layers), cluster()
    result: dict[str, Any] = {
        "graph": graph.name,
        "variables": len(graph.variables),
        "devices": resources.num_devices,
        "build_cpu_ms": {},
        "autodist": {},
    }
    for builder in all_builders():
        result["build_cpu_ms"][builder.name] = median_ms(lambda b=builder: b.build(graph, resources), args.repeats)
    strategy = all_builders()[2].build(graph, resources)  # PartitionedPS: the largest text
    text = strategy_to_autodist(strategy, graph=graph)
    result["autodist"] = {
        "builder": strategy.provenance.builder,
        "text_kib": round(len(text) / 1024, 1),
        "export_cpu_ms": median_ms(lambda: strategy_to_autodist(strategy, graph=graph), args.repeats),
        "import_cpu_ms": median_ms(
            lambda: strategy_from_autodist(text, graph_id=graph.id, resources_id=resources.id), args.repeats
        ),
        "same_id_after_round_trip": strategy_from_autodist(text, graph_id=graph.id, resources_id=resources.id).id
        == strategy.id,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
