"""The layout the search chooses beside the one published, for LLM runs others measured.

For Llama-3 8B and 70B on H100 (torchtitan's published runs: `torchtitan_benchmarks` rows of
`shared/published/gpu_measurements.csv`) and Megatron's 145B and 310B GPTs on 1536-1920 A100 (SC'21
Table 1), each graph captured as the published benchmark captures the row (`benchmarks.lib.published_models`:
the source's attention, compute dtype and optimizer) on the meta device at micro-batch 1 and the
row's sequence, on the row's cluster, the search (engine runner, the row's global batch, precision and
compile, a 2 s budget) is run and both layouts are priced with `stratagem.predict`. Prints one JSON
object: `rows`, one per distinct published layout (model, GPUs, sequence, layout, precision, compile,
async tensor parallelism, fp8 all-gathers), with the
published layout and its predicted tokens/s/GPU and MFU, the measured tokens/s/GPU, the chosen layout
and its figures, and the search's seconds; `llama3_70b_64xh100`, the search alone for the 70B on 64 H100
(no published run: the bf16 run's global batch per GPU, 2 sequences of 8192); `summary`.

    python -m benchmarks.llm_dimensions [--csv PATH] [--budget 2.0] [--only llama3.1-8b ...]

Clusters from the rows: H100 nodes of 8 with 400 Gb/s per GPU between nodes (torchtitan's Grand Teton
H100s are the catalog's `H100-SXM-96GB-HBM2e`, the 96 GB HBM2e part at its 500 W cap); A100-80GB DGX nodes with 8 × 200 Gb/s HDR InfiniBand (SC'21 §5).
A row's layout is read the way the published benchmark reads it (`benchmarks.lib.published_layouts`:
torchtitan splits norms along the sequence under tensor parallelism and checkpoints per op, and states
`compile`, `async_tp` and `fsdp_float8_all_gather` per row; Megatron's `--fp16` and torchtitan's FSDP2
train a 16-bit model beside fp32 main weights without autocast, `fp16` and `bf16`, and Megatron's fused
kernels price as compiled blocks). The row's precision and compile are the
search's inputs (the user's numerics and trainer); async tensor parallelism and fp8 all-gathers are the
search's to choose.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.lib import published_rows
from benchmarks.lib.published_capture import capture
from benchmarks.lib.published_layouts import FUSED_KERNELS, precision, recompute
from benchmarks.lib.published_models import model_spec, training_graph
from optimizer_service.search import search
from simulator import SIMULATOR_VERSION
from stratagem import Layout, predict
from stratagem.ir import ModelGraph, ResourceSpec, Strategy

ROOT = Path(__file__).resolve().parents[1]
CSV_NAME = Path("shared") / "published" / "gpu_measurements.csv"
SOURCES = ("torchtitan_benchmarks", "megatron_sc21_table1")
MODELS = ("llama3.1-8b", "llama3.1-70b", "megatron-gpt-145.6B", "megatron-gpt-310.1B")
H100_96GB = "H100-SXM 96GB HBM2e (500W cap)"
GPU_KINDS = {"A100-SXM4-80GB": "A100-80GB", H100_96GB: "H100-SXM-96GB-HBM2e"}
INFINIBAND_LATENCY_US = 5.0
"""One RDMA hop between nodes (docs/layouts.md's worked example)."""


@dataclass(frozen=True)
class Row:
    published: published_rows.Row
    """The published benchmark's reading of the CSV line."""
    precision: str
    recompute: str
    measured_tokens_per_gpu: float

    @property
    def seq(self) -> int:
        return int(self.published.config["seq"])

    @property
    def compile(self) -> bool:
        """torchtitan states it per row; Megatron's fused kernels are what compiled blocks price."""
        return self.published.other.get("compile") is True or self.published.source in FUSED_KERNELS

    @property
    def async_tp(self) -> bool:
        return self.published.other.get("async_tp") is True

    @property
    def fp8_all_gather(self) -> bool:
        return self.published.other.get("fsdp_float8_all_gather") is True

    def key(self) -> tuple:
        return (
            self.published.model,
            self.published.n_gpus,
            self.seq,
            self.precision,
            self.published.dp,
            self.published.tp,
            self.published.pp,
            self.published.micro_batch,
            self.compile,
            self.async_tp,
            self.fp8_all_gather,
        )


def find_csv(given: str | None) -> Path:
    if given:
        return Path(given)
    for base in (ROOT, *ROOT.parents):
        if (base / CSV_NAME).is_file():
            return base / CSV_NAME
    raise SystemExit(f"no {CSV_NAME} above {ROOT}; pass --csv")


def read_rows(path: Path, models: tuple[str, ...]) -> list[Row]:
    """The rows of these models, one per distinct layout (compile, async-TP and fp8-gather variants each their own)."""
    out: dict[tuple, Row] = {}
    for read in published_rows.read_rows(path):
        if read.source not in SOURCES or read.model not in models or read.gpu not in GPU_KINDS:
            continue
        row = _row(read)
        out.setdefault(row.key(), row)
    return list(out.values())


def _row(read: published_rows.Row) -> Row:
    if read.measured_metric == "tokens_per_s_per_gpu":
        measured = read.measured_value
    else:
        measured = read.global_batch * int(read.config["seq"]) / (read.measured_step_s * read.n_gpus)
    return Row(published=read, precision=precision(read), recompute=recompute(read), measured_tokens_per_gpu=measured)


# --- the model and the cluster ---------------------------------------------------------------


def cluster(gpu: str, n_gpus: int, per_node: int, inter_node_gbps: float) -> ResourceSpec:
    kind = GPU_KINDS[gpu]
    nodes = [
        {"address": f"node{i:04d}", "chief": i == 0, "gpus": list(range(per_node)), "device": kind}
        for i in range(n_gpus // per_node)
    ]
    spec: dict[str, Any] = {"name": f"{kind}x{n_gpus}", "nodes": nodes}
    if len(nodes) > 1:
        spec["network"] = {"kind": "infiniband", "bandwidth_gbps": inter_node_gbps, "latency_us": INFINIBAND_LATENCY_US}
    return ResourceSpec.parse(spec)


def published_strategy(row: Row, graph: ModelGraph, resources: ResourceSpec) -> Strategy:
    """The row's layout on the graph captured at one sample: built with micro-batches of the graph's one
    sample, then stating the row's micro-batch size, so a step trains the row's global batch."""
    context = int(row.published.other.get("cp", 1))
    chunks = int(row.published.other.get("virtual_pipeline_chunks", 1))
    count = row.published.global_batch // (row.published.micro_batch * row.published.dp)
    layout = Layout(
        data=row.published.dp,
        tensor=row.published.tp,
        pipeline=row.published.pp,
        context=context,
        micro_batch=graph.batch_size,
        micro_batches=count,
        schedule="interleaved-1f1b" if chunks > 1 else "1f1b",
        virtual_stages=chunks,
        zero=row.published.zero_stage,
        recompute=row.recompute,
        precision=row.precision,
        sequence_parallel=bool(row.published.other.get("seq_parallel"))
        or (row.published.source == SOURCES[0] and row.published.tp > 1),
        compile=row.compile,
        async_tensor_parallel=row.async_tp,
        fp8_all_gather=row.fp8_all_gather,
    )
    return layout.build(graph, resources).replace(micro_batch_size=row.published.micro_batch)


# --- one row ---------------------------------------------------------------------------------


def describe(strategy: Strategy) -> dict[str, Any]:
    mesh = strategy.effective_mesh
    stages = {getattr(c.synchronizer, "stage", 0) for c in strategy.variables}
    pipeline = strategy.pipeline
    return {
        "dp": mesh.data,
        "tp": mesh.tensor,
        "pp": mesh.pipeline,
        "cp": mesh.context,
        "micro_batch": strategy.micro_batch_size,
        "micro_batches": strategy.micro_batches,
        "schedule": pipeline.schedule if pipeline is not None and mesh.pipeline > 1 else None,
        "virtual_stages": pipeline.virtual_stages if pipeline is not None else 1,
        "zero": sorted(stages),
        "recompute": strategy.recompute,
        "sequence_parallel": strategy.sequence_parallel,
        "async_tensor_parallel": strategy.async_tensor_parallel,
        "fp8_all_gather": strategy.fp8_all_gather,
        "precision": strategy.precision,
        "compile": strategy.compile,
    }


def figures(graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> dict[str, Any]:
    priced = predict(graph, resources, strategy)
    devices = len(resources.compute_devices)
    return {
        "feasible": priced.feasible,
        "step_time_s": round(priced.step_time_s, 3),
        "tokens_per_s_per_gpu": round(priced.tokens_per_s / devices, 1) if priced.tokens_per_s else None,
        "mfu": round(priced.mfu, 3) if priced.mfu is not None else None,
        "memory_gb": round(priced.memory_per_device_bytes / 1e9, 1),
        **({"infeasible_reason": priced.infeasible_reason} if not priced.feasible else {}),
    }


def compare(
    graph: ModelGraph, resources: ResourceSpec, *, global_batch: int, precision: str, compile: bool, budget: float
) -> tuple[Strategy, dict[str, Any]]:
    started = time.perf_counter()
    result = search(
        graph,
        resources,
        time_budget_s=budget,
        top_k=3,
        runner="engine",
        global_batch=global_batch,
        precision=precision,
        compile=compile,
    )
    seconds = time.perf_counter() - started
    best = result.candidates[0]
    record = best.provenance.search or {}
    return best, {
        "search_s": round(seconds, 2),
        "evaluated": result.evaluated,
        "stopped_by": result.stopped_by,
        "why": (record.get("composition") or {}).get("difference", {}) or {},
    }


def run_row(row: Row, budget: float, graphs: dict[tuple, ModelGraph]) -> dict[str, Any]:
    graph = captured(row, graphs)
    resources = cluster(
        row.published.gpu, row.published.n_gpus, row.published.gpus_per_node, row.published.inter_node_gbps or 0.0
    )
    published = published_strategy(row, graph, resources)
    chosen, search_record = compare(
        graph,
        resources,
        global_batch=row.published.global_batch,
        precision=row.precision,
        compile=row.compile,
        budget=budget,
    )
    return {
        "model": row.published.model,
        "source": row.published.source,
        "cluster": f"{row.published.n_gpus} × {GPU_KINDS[row.published.gpu]}",
        "seq": row.seq,
        "global_batch": row.published.global_batch,
        "precision": row.precision,
        "compile": row.compile,
        "measured_tokens_per_s_per_gpu": round(row.measured_tokens_per_gpu, 1),
        "published": {"layout": describe(published), **figures(graph, resources, published)},
        "chosen": {"layout": describe(chosen), **figures(graph, resources, chosen)},
        "search": {k: v for k, v in search_record.items() if k != "why"},
        "why_chosen": search_record["why"].get("sentence"),
    }


def captured(row: Row, graphs: dict[tuple, ModelGraph]) -> ModelGraph:
    """The row's graph at one sample, stepping the optimizer as the row's engine does."""
    key = (row.published.model, row.seq)
    if key not in graphs:
        graphs[key] = capture(replace(model_spec(row.published), batch=1))
    return training_graph(graphs[key], row.published)


def rows_70b_64(rows: list[Row]) -> Iterator[Row]:
    """The 70B's published bf16 run (compiled, synchronous tensor parallelism), on 64 H100 instead of 256: the
    2 s search-time target."""
    for row in rows:
        if row.published.model == "llama3.1-70b" and row.precision == "bf16" and not row.async_tp:
            yield row
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--csv", default=None)
    parser.add_argument("--budget", type=float, default=2.0)
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    rows = read_rows(find_csv(args.csv), tuple(args.only))
    graphs: dict[tuple, ModelGraph] = {}
    out: dict[str, Any] = {"budget_s": args.budget, "simulator_version": SIMULATOR_VERSION, "rows": []}
    for row in sorted(
        rows,
        key=lambda r: (MODELS.index(r.published.model), r.published.n_gpus, r.seq, r.precision, r.compile, r.async_tp),
    ):
        out["rows"].append(run_row(row, args.budget, graphs))
    for row in rows_70b_64(rows):
        graph = captured(row, graphs)
        resources = cluster(row.published.gpu, 64, 8, row.published.inter_node_gbps or 0.0)
        batch = row.published.global_batch * 64 // row.published.n_gpus
        chosen, record = compare(
            graph, resources, global_batch=batch, precision=row.precision, compile=row.compile, budget=args.budget
        )
        out["llama3_70b_64xh100"] = {
            "global_batch": batch,
            "precision": row.precision,
            "compile": row.compile,
            "chosen": {"layout": describe(chosen), **figures(graph, resources, chosen)},
            "search": {k: v for k, v in record.items() if k != "why"},
            "why_chosen": record["why"].get("sentence"),
        }
    out["summary"] = summary(out["rows"])
    print(json.dumps(out, indent=1))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [
        r["chosen"]["tokens_per_s_per_gpu"] / r["published"]["tokens_per_s_per_gpu"]
        for r in rows
        if r["published"]["feasible"] and r["published"]["tokens_per_s_per_gpu"] and r["chosen"]["tokens_per_s_per_gpu"]
    ]
    return {
        "rows": len(rows),
        "published_feasible": sum(r["published"]["feasible"] for r in rows),
        "chosen_over_published_geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3)
        if ratios
        else None,
        "search_s_max": max((r["search"]["search_s"] for r in rows), default=None),
    }


if __name__ == "__main__":
    main()
