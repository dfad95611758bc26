"""`stratagem.predict` speed: one layout, and 64 layouts in one call, for a 70B decoder on 64 H100.

The model is Llama-3-70B's shape (80 blocks, hidden 8192, 64 heads, 8 key/value heads, ffn 28672, vocab
128256) built from its config on the meta device (`capture_hf_config`, batch 1 × 4096 tokens, the
micro-batch); the cluster is 8 DGX H100 nodes (8 GPUs on NVLink 4, 8 × 400 Gbit/s InfiniBand each, from
NVIDIA's DGX H100 data sheet). The 64 layouts are tensor {1, 2, 4, 8} × pipeline {1, 2, 4, 8} × four
memory plans, at global batch 512: what an LLM team compares (bf16 with fp32 master weights, sequence
parallelism with tensor parallelism, interleaved pipelines, selective or full recomputation, ZeRO 1 or
FSDP). Where the simulator refuses one of those knobs, the benchmark says which and times the 64
layouts it prices instead (fp32, recomputation none or full, ZeRO 0 or 2, 1F1B).

Prints one JSON object: capture seconds, one layout's predict and the 64-layout call (the first call,
which compiles the simulator's context, then the median wall and CPU seconds of the next), the target
(64 in under 1 s) and whether the median wall and CPU times meet it (on a machine whose cores other
work shares, CPU time is the figure to compare), and how many layouts fit.

    .venv/bin/python benchmarks/predict.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stratagem import Layout, UnsupportedStrategyError, capture_hf_config, predict
from stratagem.ir import Link, ModelGraph, Node, ResourceSpec

LLAMA3_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
"""Llama-3 70B (meta-llama/Meta-Llama-3-70B config.json): grouped-query attention, 8 key/value heads."""
GLOBAL_BATCH = 512
TARGET_S = 1.0


def cluster() -> ResourceSpec:
    return ResourceSpec(
        name="dgx-h100-8x8",
        nodes=[Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=list(range(8)), device="H100") for i in range(8)],
        network=Link(kind="infiniband", bandwidth_gbps=3200, latency_us=5, efficiency=0.9),
    )


def llm_layouts() -> list[Layout]:
    plans = [
        {"zero": 1, "recompute": "selective"},
        {"zero": 1, "recompute": "full"},
        {"zero": 3, "recompute": "selective"},
        {"zero": 3, "recompute": "full"},
    ]
    out = []
    for tensor, pipeline, plan in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), plans):
        interleave = {"schedule": "interleaved-1f1b", "virtual_stages": 2} if pipeline > 1 else {}
        out.append(
            Layout(
                tensor=tensor,
                pipeline=pipeline,
                global_batch=GLOBAL_BATCH,
                precision="amp-bf16",
                sequence_parallel=tensor > 1,
                **interleave,
                **plan,
            )
        )
    return out


def priced_layouts() -> list[Layout]:
    return [
        Layout(tensor=t, pipeline=p, recompute=r, zero=z, global_batch=GLOBAL_BATCH)
        for t, p, r, z in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), ("none", "full"), (0, 2))
    ]


def timed(graph: ModelGraph, resources: ResourceSpec, what: object, repeats: int) -> dict[str, float]:
    """The first call's seconds, and the median wall and CPU seconds of `repeats` more (CPU time is what
    this process spent, which other work on a shared machine does not inflate)."""
    start = time.perf_counter()
    predict(graph, resources, what)  # type: ignore[call-overload]
    first = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        predict(graph, resources, what)  # type: ignore[call-overload]
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {
        "first_s": round(first, 4),
        "median_s": round(statistics.median(wall), 4),
        "median_cpu_s": round(statistics.median(cpu), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    start = time.perf_counter()
    graph = capture_hf_config(LLAMA3_70B, batch=1, seq=4096, name="llama-3-70b")
    capture_s = time.perf_counter() - start
    resources = cluster()
    layouts, layout_set, refused = llm_layouts(), "llm", None
    try:
        predict(graph, resources, layouts)
    except UnsupportedStrategyError as error:
        layouts, layout_set, refused = priced_layouts(), "priced today", str(error)
    one = timed(graph, resources, layouts[0], args.repeats)
    many = timed(graph, resources, layouts, args.repeats)
    predictions = predict(graph, resources, layouts)
    report = {
        "model": f"{graph.name}: {graph.num_parameters / 1e9:.1f}B parameters, {len(graph.layers)} layers",
        "cluster": f"{resources.name}: {resources.num_devices} H100",
        "capture_s": round(capture_s, 2),
        "one_layout": one,
        "layouts": len(layouts),
        "layout_set": layout_set,
        "simulator_refused": refused,
        "layouts_in_one_call": many,
        "per_layout_ms": round(1e3 * many["median_s"] / len(layouts), 2),
        "target_s": TARGET_S,
        "target_met_wall": many["median_s"] < TARGET_S,
        "target_met_cpu": many["median_cpu_s"] < TARGET_S,
        "feasible_layouts": sum(p.feasible for p in predictions),
        "repeats": args.repeats,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
