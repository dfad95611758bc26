"""Hybrid parallelism targets: what the search picks when data parallelism cannot fit, how its picks
compare with Megatron-LM's hand-tuned layouts, and how long the search takes for a 13B decoder.

Prints one JSON object:
- `too_large_for_data_parallel`: the zoo's GPT 1.7B (Megatron's config, captured on meta at batch 4,
  fp32 + Adam) on 2 nodes × 4 T4 (16 GB, 50 Gbit/s): plain data parallel's verdict, the layout the
  search picks, its predicted throughput and the search's own words for why;
- `megatron`: every row of Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM" (SC'21) — the paper's (t, p, d), GPUs, global batch and measured
  TFLOP/s per GPU — on DGX-A100-like nodes (8 × A100-80GB over NVLink, 8 × 200 Gbit/s HDR InfiniBand
  modelled as one 1600 Gbit/s NIC per node), beside: the simulator's prediction for the paper's own
  (t, p) (`paper_layout_predicted`); the best layout at the paper's global batch, every data degree
  tried with the graph at B/d per replica (`best_at_paper_global_batch`); and what `search()` picks for
  the graph at the paper's per-replica batch B/d (`search_choice`) — the search holds the per-replica
  batch, so a layout with more replicas trains a larger global batch, which it reports;
- `search_13b_64gpus`: search time for a 13B decoder (GPT-3 13B: 40 layers, hidden 5120, 40 heads)
  on 8 such nodes.

The Megatron graphs are built analytically from the configs (`gpt_graph`), not captured: capturing
the 1T model on meta would take minutes per model, and the analytic graph states exactly what the paper
assumes — fp16 with fp32 Adam state (16 bytes per parameter), no fused attention, activations per layer
of 34·s·b·h + 5·a·s²·b bytes (Korthikanti et al.), of which 24·s·b·h + 5·a·s²·b are split by tensor
parallelism. `analytic_vs_capture` checks its FLOPs and parameters against a capture of the zoo's 1.7B.

FLOP/s accounting: the paper counts F = 96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration, which includes
the forward pass that activation recomputation repeats. `model` TFLOP/s count only the model's own
72·B·s·l·h²·(1 + s/6h + V/12lh) (what one step needs without recomputation); the paper's figure is
shown both as published and converted to model FLOP/s, and predictions are given in model FLOP/s.

    python -m benchmarks.hybrid [--models 1.7b 18b 1t] [--candidates 2000] [--skip-capture]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from optimizer_service.search import search
from optimizer_service.search.proposals import mesh_row
from optimizer_service.search.space import Space
from simulator import CandidateBatch, context_for, predictions, simulate_batch
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

MEGATRON_TABLE_1 = [
    # name, heads, hidden, layers, tensor, pipeline, GPUs, global batch, measured TFLOP/s per GPU (Narayanan et al., SC'21, Table 1)
    ("1.7b", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6b", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5b", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18b", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39b", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76b", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145b", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310b", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("530b", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1t", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200
FP16, MASK = 2, 1


# --- the analytic GPT graph ---------------------------------------------------------------------------


def _layer(
    name: str,
    kind: str,
    *,
    fwd: float = 0.0,
    moved: float = 0.0,
    saved: float = 0.0,
    out: float = 0.0,
    inputs: list[str] | None = None,
    variables: list[str] | None = None,
    type_: str = "Module",
) -> dict[str, Any]:
    return {
        "name": name,
        "type": type_,
        "kind": kind,
        "fwd_flops": fwd,
        "bwd_flops": 2 * fwd,
        "bytes_moved": moved,
        "activation_bytes": saved,
        "output_bytes": out,
        "inputs": inputs or [],
        "variables": variables or [],
    }


def _linear(
    name: str, tokens: int, fan_in: int, fan_out: int, source: str, saved_input: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    weight = {"name": f"{name}.weight", "shape": [fan_out, fan_in], "dtype": "float16"}
    bias = {"name": f"{name}.bias", "shape": [fan_out], "dtype": "float16"}
    moved = FP16 * (tokens * (fan_in + fan_out) + fan_in * fan_out)
    layer = _layer(
        name,
        "matmul",
        fwd=2.0 * tokens * fan_in * fan_out,
        moved=moved,
        saved=FP16 * tokens * fan_in if saved_input else 0.0,
        out=FP16 * tokens * fan_out,
        inputs=[source],
        variables=[weight["name"], bias["name"]],
        type_="Linear",
    )
    return layer, [weight, bias]


def _norm(name: str, tokens: int, hidden: int, source: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    params = [{"name": f"{name}.{p}", "shape": [hidden], "dtype": "float16"} for p in ("weight", "bias")]
    layer = _layer(
        name,
        "norm",
        fwd=5.0 * tokens * hidden,
        moved=2.0 * FP16 * tokens * hidden,
        saved=FP16 * tokens * hidden,
        out=FP16 * tokens * hidden,
        inputs=[source],
        variables=[p["name"] for p in params],
        type_="LayerNorm",
    )
    return layer, params


def gpt_graph(
    hidden: int, layers: int, heads: int, batch: int, *, seq: int = SEQ, vocab: int = VOCAB, name: str = "gpt"
) -> ModelGraph:
    """A Megatron GPT (pre-norm, fused qkv, GELU MLP of 4h, learned positions, tied head) at per-replica batch `batch`."""
    t, h, a, s = batch * seq, hidden, heads, seq
    act = FP16 * t * h
    out: list[dict[str, Any]] = [
        _layer(
            "embed", "embedding", moved=2 * act, saved=8.0 * t, out=act, variables=["embed.weight"], type_="Embedding"
        ),
        _layer("positions", "embedding", moved=2 * act, out=act, variables=["positions.weight"], type_="Embedding"),
        _layer("<root>/ops0", "elementwise", fwd=t * h, moved=3 * act, out=act, inputs=["embed", "positions"]),
    ]
    variables: list[dict[str, Any]] = [
        {"name": "embed.weight", "shape": [vocab, h], "dtype": "float16"},
        {"name": "positions.weight", "shape": [s, h], "dtype": "float16"},
    ]
    previous = "<root>/ops0"
    for i in range(layers):
        p = f"blocks.{i}"
        scores = batch * a * s * s
        block: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
            _norm(f"{p}.ln1", t, h, previous),
            _linear(f"{p}.attn.qkv", t, h, 3 * h, f"{p}.ln1"),
            (
                _layer(
                    f"{p}.attn/ops0",
                    "attention",
                    fwd=4.0 * t * s * h,
                    moved=FP16 * (4 * t * h + 4 * scores),
                    saved=3 * act + 5.0 * scores,
                    out=act,
                    inputs=[f"{p}.attn.qkv"],
                    type_="Attention",
                ),
                [],
            ),
            _linear(f"{p}.attn.out", t, h, h, f"{p}.attn/ops0"),
            (
                _layer(
                    f"{p}.drop",
                    "elementwise",
                    fwd=t * h,
                    moved=2 * act,
                    saved=MASK * t * h,
                    out=act,
                    inputs=[f"{p}.attn.out"],
                ),
                [],
            ),
            (_layer(f"{p}/ops0", "elementwise", fwd=t * h, moved=3 * act, out=act, inputs=[previous, f"{p}.drop"]), []),
            _norm(f"{p}.ln2", t, h, f"{p}/ops0"),
            _linear(f"{p}.mlp.fc", t, h, 4 * h, f"{p}.ln2"),
            (
                _layer(
                    f"{p}.mlp.act",
                    "elementwise",
                    fwd=8.0 * t * 4 * h,
                    moved=2 * 4 * act,
                    saved=4 * act,
                    out=4 * act,
                    inputs=[f"{p}.mlp.fc"],
                    type_="GELU",
                ),
                [],
            ),
            _linear(f"{p}.mlp.proj", t, 4 * h, h, f"{p}.mlp.act"),
            (
                _layer(
                    f"{p}.drop#1",
                    "elementwise",
                    fwd=t * h,
                    moved=2 * act,
                    saved=MASK * t * h,
                    out=act,
                    inputs=[f"{p}.mlp.proj"],
                ),
                [],
            ),
            (
                _layer(
                    f"{p}/ops1", "elementwise", fwd=t * h, moved=3 * act, out=act, inputs=[f"{p}/ops0", f"{p}.drop#1"]
                ),
                [],
            ),
        ]
        for layer, params in block:
            out.append(layer)
            variables.extend(params)
        previous = f"{p}/ops1"
    final, params = _norm("final_norm", t, h, previous)
    out.append(final)
    variables.extend(params)
    logits = FP16 * t * vocab
    out.append(
        _layer(
            "head",
            "matmul",
            fwd=2.0 * t * h * vocab,
            moved=FP16 * (t * h + vocab * h) + logits,
            saved=act,
            out=logits,
            inputs=["final_norm"],
            variables=["embed.weight"],
            type_="Linear",
        )
    )
    out.append(
        _layer(
            "<loss>", "elementwise", fwd=5.0 * t * vocab, moved=2 * logits, saved=logits, inputs=["head"], type_="Loss"
        )
    )
    return ModelGraph.parse(
        {
            "name": name,
            "batch_size": batch,
            "dtype": "float16",
            "optimizer": {"kind": "adam", "state_bytes_per_param": 12.0},
            "layers": out,
            "variables": variables,
            "provenance": {
                "source": "benchmarks/hybrid.py (analytic)",
                "zoo": {"config": {"heads": heads, "hidden": hidden, "layers": layers}},
            },
        }
    )


def paper_flops(batch: int, hidden: int, layers: int) -> float:
    """The paper's per-iteration count, recomputation included: 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    return 96.0 * batch * SEQ * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


# --- clusters ----------------------------------------------------------------------------------------


def dgx_a100(nodes: int) -> ResourceSpec:
    return ResourceSpec.parse(
        {
            "name": f"dgx-a100 x{nodes}",
            "nodes": [
                {
                    "address": f"10.{i // 250}.{i % 250}.1",
                    "chief": i == 0,
                    "gpus": list(range(8)),
                    "device": "A100-80GB",
                }
                for i in range(nodes)
            ],
            "network": {"kind": "infiniband", "bandwidth_gbps": 1600, "latency_us": 5, "efficiency": 0.9},
        }
    )


def t4_cluster(nodes: int) -> ResourceSpec:
    return ResourceSpec.parse(
        {
            "name": f"g4dn.12xlarge x{nodes}",
            "nodes": [
                {"address": f"10.0.0.{i + 1}", "chief": i == 0, "gpus": [0, 1, 2, 3], "device": "T4"}
                for i in range(nodes)
            ],
            "network": {"kind": "ethernet", "bandwidth_gbps": 50, "latency_us": 25},
        }
    )


# --- the targets -------------------------------------------------------------------------------------


def layout(strategy: Strategy) -> dict[str, Any]:
    mesh = strategy.effective_mesh
    pipeline = strategy.pipeline
    return {
        "tensor": mesh.tensor,
        "pipeline": mesh.pipeline,
        "data": mesh.data,
        "micro_batches": pipeline.micro_batches if pipeline else 1,
        "schedule": pipeline.schedule if pipeline and mesh.pipeline > 1 else None,
        "recompute": strategy.recompute,
    }


def too_large_for_data_parallel(candidates: int) -> dict[str, Any]:
    from stratagem import zoo
    from stratagem.tracing import capture

    started = time.perf_counter()
    module, make_batch = zoo.build("gpt", "1.7b", device="meta")
    graph = capture(module, make_batch(4), batch_size=4, name="gpt-1.7b")
    captured_s = time.perf_counter() - started
    resources = t4_cluster(2)
    result = search(graph, resources, time_budget_s=None, max_candidates=candidates, top_k=3)
    best = result.candidates[0]
    dp = result.baselines["DataParallel"].predicted
    return {
        "model": "zoo gpt 1.7b (Megatron config: 24 layers, hidden 2304, 24 heads, seq 2048), fp32 + Adam, batch 4 per replica",
        "parameters": graph.num_parameters,
        "capture_s": round(captured_s, 1),
        "cluster": "2 nodes x 4 T4 (16 GB), PCIe inside a node, 50 Gbit/s between nodes",
        "data_parallel": {
            "feasible": dp.feasible,
            "reason": dp.infeasible_reason,
            "memory_per_device_gb": round(dp.memory_per_device_bytes / 1e9, 2),
        },
        "every_builder_infeasible": all(not b.predicted.feasible for b in result.baselines.values()),
        "chosen": {
            **layout(best),
            "samples_per_s": round(best.predicted.samples_per_s, 3),
            "step_time_s": round(best.predicted.step_time_s, 3),
            "memory_per_device_gb": round(best.predicted.memory_per_device_bytes / 1e9, 2),
            "feasible": best.predicted.feasible,
            "tensor_parallel_splits": len(best.tensor_parallel),
        },
        "why": best.provenance.search["why"],
        "search_s": round(result.elapsed_s, 2),
        "evaluated": result.evaluated,
    }


def best_layout(
    graph: ModelGraph,
    resources: ResourceSpec,
    *,
    tensor: int | None = None,
    pipeline: int | None = None,
    data: int | None = None,
) -> dict[str, Any] | None:
    """The simulator's best over the space's layouts that match the given degrees (every stage split,
    micro-batch count and recomputation choice the space holds for them), each with all-reduce and with
    ZeRO over the data-parallel group; None when the space has no such layout."""
    context = context_for(graph, resources)
    space = Space(context)
    picks = [
        i
        for i, m in enumerate(space.meshes)
        if (tensor is None or m.tensor == tensor)
        and (pipeline is None or m.pipeline == pipeline)
        and (data is None or m.data == data)
    ]
    if not picks:
        return None
    rows = [(index, sharded) for index in picks for sharded in (False, True)]
    batch = CandidateBatch.allocate(context, len(rows))
    for row, (index, sharded) in enumerate(rows):
        mesh_row(index, sharded=sharded)(space, batch, np.array([row]))
    result = simulate_batch(context, batch)
    scores = np.where(result.feasible, result.step_time, np.inf)
    best = int(np.argmin(scores))
    prediction = predictions(context, batch, [best])[0]
    mesh = space.meshes[rows[best][0]]
    flops = graph.total_flops * mesh.data / prediction.step_time_s / context.compute_device_indices.size / 1e12
    return {
        "tensor": mesh.tensor,
        "pipeline": mesh.pipeline,
        "data": mesh.data,
        "micro_batches": mesh.micro_batches,
        "recompute": mesh.recompute,
        "zero": rows[best][1],
        "feasible": prediction.feasible,
        "model_tflops_per_gpu": round(flops, 1) if prediction.feasible else None,
        "step_time_s": round(prediction.step_time_s, 3),
        "memory_per_device_gb": round(prediction.memory_per_device_bytes / 1e9, 1),
        "why": prediction.infeasible_reason or prediction.bottleneck,
    }


def at_global_batch(row: tuple) -> dict[str, Any] | None:
    """The best layout at the paper's global batch: for every data degree d the batch divides, the graph
    at B/d per replica and every layout with that d; the fastest step wins (same samples per step)."""
    name, heads, hidden, layers, _, _, gpus, batch, _ = row
    resources = dgx_a100(gpus // 8)
    best: dict[str, Any] | None = None
    for data in (d for d in range(1, gpus + 1) if gpus % d == 0 and batch % d == 0 and gpus // d <= 8 * 64):
        graph = gpt_graph(hidden, layers, heads, batch // data, name=f"megatron-{name}-d{data}")
        found = best_layout(graph, resources, data=data)
        if found and found["feasible"] and (best is None or found["step_time_s"] < best["step_time_s"]):
            best = found
    return best


def megatron_row(row: tuple, candidates: int) -> dict[str, Any]:
    name, heads, hidden, layers, t, p, gpus, batch, measured = row
    d = gpus // (t * p)
    graph = gpt_graph(hidden, layers, heads, batch // d, name=f"megatron-{name}")
    resources = dgx_a100(gpus // 8)
    started = time.perf_counter()
    result = search(graph, resources, time_budget_s=None, max_candidates=candidates, top_k=1)
    searched = time.perf_counter() - started
    best = result.candidates[0]
    chosen = layout(best)
    conversion = (
        72.0
        * (1 + SEQ / (6 * hidden) + VOCAB / (12 * layers * hidden))
        / (96.0 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden)))
    )
    started = time.perf_counter()
    fixed = at_global_batch(row)
    fixed_s = time.perf_counter() - started
    return {
        "model": name,
        "parameters_b": round(graph.num_parameters / 1e9, 1),
        "gpus": gpus,
        "global_batch": batch,
        "paper": {
            "tensor": t,
            "pipeline": p,
            "data": d,
            "tflops_per_gpu_published": measured,
            "model_tflops_per_gpu": round(measured * conversion, 1),
        },
        "paper_layout_predicted": best_layout(graph, resources, tensor=t, pipeline=p),
        "best_at_paper_global_batch": fixed,
        "best_at_paper_global_batch_s": round(fixed_s, 1),
        "search_choice": {
            **chosen,
            "global_batch": graph.batch_size * chosen["data"],
            "model_tflops_per_gpu": round(
                graph.total_flops * chosen["data"] / best.predicted.step_time_s / gpus / 1e12, 1
            ),
            "step_time_s": round(best.predicted.step_time_s, 3),
            "memory_per_device_gb": round(best.predicted.memory_per_device_bytes / 1e9, 1),
            "why": best.predicted.bottleneck,
            "search_s": round(searched, 1),
            "evaluated": result.evaluated,
        },
    }


def search_13b(candidates: int) -> dict[str, Any]:
    graph = gpt_graph(5120, 40, 40, 16, name="gpt-13b")
    resources = dgx_a100(8)
    started = time.perf_counter()
    context_for(graph, resources)
    compiled = time.perf_counter() - started
    out: dict[str, Any] = {
        "model": "GPT-3 13B (40 layers, hidden 5120, 40 heads, seq 2048), fp16, batch 16 per replica",
        "parameters_b": round(graph.num_parameters / 1e9, 2),
        "gpus": 64,
        "compile_s": round(compiled, 2),
        "meshes": len(Space(context_for(graph, resources)).meshes),
    }
    for label, kwargs in (
        ("default_2s_budget", {"time_budget_s": 2.0}),
        (f"{candidates}_candidates", {"time_budget_s": None, "max_candidates": candidates}),
    ):
        started = time.perf_counter()
        result = search(graph, resources, top_k=5, **kwargs)
        best = result.candidates[0]
        out[label] = {
            "search_s": round(time.perf_counter() - started, 2),
            "evaluated": result.evaluated,
            "chosen": layout(best),
            "predicted_model_tflops_per_gpu": round(
                graph.total_flops * best.effective_mesh.data / best.predicted.step_time_s / 64 / 1e12, 1
            ),
        }
    return out


def analytic_vs_capture() -> dict[str, Any]:
    from stratagem import zoo
    from stratagem.tracing import capture

    module, make_batch = zoo.build("gpt", "1.7b", device="meta")
    captured = capture(module, make_batch(1), batch_size=1)
    analytic = gpt_graph(2304, 24, 24, 1)
    return {
        "flops_ratio_analytic_over_capture": round(analytic.total_flops / captured.total_flops, 4),
        "parameters_ratio": round(analytic.num_parameters / captured.num_parameters, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=[r[0] for r in MEGATRON_TABLE_1])
    parser.add_argument("--candidates", type=int, default=2000, help="candidate budget per Megatron search")
    parser.add_argument("--skip-capture", action="store_true", help="skip the two targets that capture the zoo's 1.7B")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    if not args.skip_capture:
        print("too large for data parallel ...", file=sys.stderr)
        out["too_large_for_data_parallel"] = too_large_for_data_parallel(args.candidates)
        out["analytic_vs_capture"] = analytic_vs_capture()
    rows = []
    for row in MEGATRON_TABLE_1:
        if row[0] in args.models:
            print(f"megatron {row[0]} ...", file=sys.stderr)
            rows.append(megatron_row(row, args.candidates))
    out["megatron"] = rows
    print("13b on 64 GPUs ...", file=sys.stderr)
    out["search_13b_64gpus"] = search_13b(20000)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
