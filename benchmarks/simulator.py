"""Simulator speed: BERT-large on 16 nodes x 4 T4 (50 Gbit/s), 10,000 different candidates.

Prints one JSON object: candidates per second for batch simulation (target >= 20,000/s on a 2-core
machine), single-simulation latency (one candidate through `simulate_batch`, and one Strategy through
`simulate`), and the context compile time. The graph comes from `stratagem.capture` on
`stratagem.zoo.bert_large` when that works here, else from a BERT-large-shaped generator below
(24 layers, real shapes, FLOPs by formula).

`--llm` times the LLM dimensions instead: a 70B decoder (Llama-3-70B's shapes, without grouped-query
attention) on 8 nodes of 8 H100, 64 layouts mixing tensor, pipeline (1F1B, interleaved, zero-bubble),
context and data parallelism, ZeRO stages 1 and 3, bf16 and fp8, and selective or full recomputation
(target: the 64 price in well under a second).

    .venv/bin/python benchmarks/simulator.py [--candidates 10000] [--synthetic] [--llm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import (
    CandidateBatch,
    Precision,
    Schedule,
    SyncKind,
    compile_context,
    predictions,
    simulate,
    simulate_batch,
    to_strategy,
)
from simulator.context import SimContext
from stratagem.ir import Layer, Link, ModelGraph, Node, ResourceSpec, Variable

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, POSITIONS, SEQ = 1024, 4096, 24, 30522, 512, 128


def bert_large_synthetic(batch: int = 32, seq: int = SEQ) -> ModelGraph:
    """BERT-large's variables with their real shapes, and per-layer FLOPs/bytes by formula (fp32)."""
    tokens = batch * seq
    act = 4.0 * tokens * HIDDEN
    layers: list[Layer] = []
    variables: list[Variable] = []

    def linear(name: str, n_in: int, n_out: int, source: str) -> str:
        variables.extend(
            [Variable(name=f"{name}.weight", shape=[n_out, n_in]), Variable(name=f"{name}.bias", shape=[n_out])]
        )
        flops = 2.0 * tokens * n_in * n_out
        layers.append(
            Layer(
                name=name,
                type="Linear",
                kind="matmul",
                fwd_flops=flops,
                bwd_flops=2 * flops,
                bytes_moved=4.0 * (n_in * n_out + tokens * (n_in + n_out)),
                activation_bytes=4.0 * tokens * n_in,
                output_bytes=4.0 * tokens * n_out,
                inputs=[source],
                variables=[f"{name}.weight", f"{name}.bias"],
            )
        )
        return name

    def norm(name: str, source: str) -> str:
        variables.extend(
            [Variable(name=f"{name}.weight", shape=[HIDDEN]), Variable(name=f"{name}.bias", shape=[HIDDEN])]
        )
        layers.append(
            Layer(
                name=name,
                type="LayerNorm",
                kind="norm",
                fwd_flops=8.0 * tokens * HIDDEN,
                bwd_flops=16.0 * tokens * HIDDEN,
                bytes_moved=2 * act,
                activation_bytes=act,
                output_bytes=act,
                inputs=[source],
                variables=[f"{name}.weight", f"{name}.bias"],
            )
        )
        return name

    for emb, rows in (("word_embeddings", VOCAB), ("position_embeddings", POSITIONS), ("token_type_embeddings", 2)):
        name = f"bert.embeddings.{emb}"
        variables.append(Variable(name=f"{name}.weight", shape=[rows, HIDDEN]))
        layers.append(
            Layer(
                name=name,
                type="Embedding",
                kind="embedding",
                bytes_moved=2 * act,
                output_bytes=act,
                variables=[f"{name}.weight"],
            )
        )
    source = norm("bert.embeddings.LayerNorm", "bert.embeddings.word_embeddings")
    for i in range(LAYERS):
        p = f"bert.encoder.layer.{i}"
        q = linear(f"{p}.attention.self.query", HIDDEN, HIDDEN, source)
        linear(f"{p}.attention.self.key", HIDDEN, HIDDEN, source)
        linear(f"{p}.attention.self.value", HIDDEN, HIDDEN, source)
        core = f"{p}.attention.self.core"
        layers.append(
            Layer(
                name=core,
                type="SDPA",
                kind="attention",
                fwd_flops=4.0 * tokens * seq * HIDDEN,
                bwd_flops=8.0 * tokens * seq * HIDDEN,
                bytes_moved=4 * act,
                activation_bytes=3 * act + 4.0 * batch * 16 * seq * seq,
                output_bytes=act,
                inputs=[q],
            )
        )
        out = linear(f"{p}.attention.output.dense", HIDDEN, HIDDEN, core)
        source = norm(f"{p}.attention.output.LayerNorm", out)
        mid = linear(f"{p}.intermediate.dense", HIDDEN, INTERMEDIATE, source)
        gelu = f"{p}.intermediate.gelu"
        layers.append(
            Layer(
                name=gelu,
                type="GELU",
                kind="elementwise",
                fwd_flops=8.0 * tokens * INTERMEDIATE,
                bwd_flops=16.0 * tokens * INTERMEDIATE,
                bytes_moved=8.0 * tokens * INTERMEDIATE,
                activation_bytes=4.0 * tokens * INTERMEDIATE,
                output_bytes=4.0 * tokens * INTERMEDIATE,
                inputs=[mid],
            )
        )
        out = linear(f"{p}.output.dense", INTERMEDIATE, HIDDEN, gelu)
        source = norm(f"{p}.output.LayerNorm", out)
    linear("bert.pooler.dense", HIDDEN, HIDDEN, source)
    return ModelGraph(
        name="bert-large-synthetic",
        batch_size=batch,
        layers=layers,
        variables=variables,
        provenance={"source": "benchmarks/simulator.py"},
    )


def bert_large_captured() -> ModelGraph | None:
    """The zoo's BERT-large through capture, or None when either is not available here."""
    try:
        from stratagem import zoo
        from stratagem.tracing import capture

        model, make_batch = zoo.bert_large(size="full", device="meta")
        return capture(model, make_batch(32), batch_size=32, name="bert_large-full")
    except Exception as error:  # the benchmark falls back rather than failing on another part's state
        print(f"capture unavailable ({type(error).__name__}: {error}); using the synthetic graph", file=sys.stderr)
        return None


def cluster(nodes: int = 16, gpus: int = 4, gbps: float = 50.0) -> ResourceSpec:
    return ResourceSpec(
        name=f"{nodes}x{gpus}-T4",
        nodes=[
            Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=list(range(gpus)), device="T4") for i in range(nodes)
        ],
        network=Link(kind="ethernet", bandwidth_gbps=gbps, latency_us=25),
    )


def random_candidates(context: SimContext, n: int, seed: int = 0) -> CandidateBatch:
    """N different candidates, drawn the way a search explores the space:

    - per variable: all-reduce (60%), PS (30%) or sharded (10%); a fusion group drawn from a
      candidate-specific number of groups; a random all-reduce algorithm; PS servers drawn from every
      device of the cluster, 30% of PS variables partitioned into 2-4 shards on different servers,
      local replication on 30% of them;
    - per candidate: compression on for 30% of candidates (then fp16, bf16, PowerSGD rank 1-8 or
      top-1% on half of their all-reduce variables); BSP 70%, SSP (staleness 1-3) 20%, ASP 10%;
      a data-parallel mesh for 70%, tensor 2 or 4 for 20%, a 4-stage pipeline (4-16 micro-batches)
      for 10%.
    """
    rng = np.random.default_rng(seed)
    V, D, L = context.num_variables, context.num_devices, context.num_layers
    b = CandidateBatch.allocate(context, n, max_shards=4)
    b.kind[:] = rng.choice([SyncKind.ALLREDUCE, SyncKind.PS, SyncKind.SHARDED], size=(n, V), p=[0.6, 0.3, 0.1])
    b.group[:] = rng.integers(0, np.maximum(1, V // rng.integers(1, 64, size=(n, 1))), size=(n, V))
    b.algorithm[:] = rng.integers(0, 4, size=(n, V))
    compress = (rng.random((n, 1)) < 0.3) & (rng.random((n, V)) < 0.5)
    b.compressor[:] = np.where(compress, rng.integers(1, 5, size=(n, 1)), 0)
    b.compressor_param[:] = np.where(
        b.compressor == 3, rng.integers(1, 9, size=(n, V)), np.where(b.compressor == 4, 0.01, 0.0)
    )
    axis0 = context.var_shape[:, 0]
    partitioned = (b.kind == SyncKind.PS) & (rng.random((n, V)) < 0.3)
    b.shards[:] = np.where(partitioned, np.minimum(rng.integers(2, 5, size=(n, V)), axis0), 1)
    b.local_replication[:] = rng.random((n, V)) < 0.3
    servers = rng.integers(0, D, size=(n, V, 4)).astype(np.int16)
    live = (b.kind == SyncKind.PS)[:, :, None] & (np.arange(4) < b.shards[:, :, None])
    b.server[:] = np.where(live, servers, -1)
    b.consistency[:] = rng.choice(3, size=n, p=[0.7, 0.2, 0.1])
    b.staleness[:] = np.where(b.consistency == 1, rng.integers(1, 4, size=n), 0)
    gpus = context.compute_device_indices.size
    mesh = rng.choice(4, size=n, p=[0.7, 0.1, 0.1, 0.1])
    for i in np.flatnonzero(mesh):
        tensor, pipeline = {1: (2, 1), 2: (4, 1), 3: (1, 4)}[int(mesh[i])]
        b.tensor[i], b.pipeline[i], b.data[i] = tensor, pipeline, gpus // (tensor * pipeline)
        if pipeline > 1:
            b.micro_batches[i] = rng.choice([4, 8, 16])
            b.layer_stage[i] = np.minimum(np.arange(L) * pipeline // L, pipeline - 1)
    return b


def timed(fn, repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and process-CPU seconds of each run (CPU time is what other jobs on a shared
    machine cannot inflate by taking turns on the cores; wall time is what a caller waits)."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def llama_70b() -> ModelGraph:
    """Llama-3-70B's shapes (80 blocks, hidden 8192, 64 heads, SwiGLU 28672, vocabulary 128256), 16
    sequences of 4096 tokens per replica and step, captured on meta."""
    from stratagem import zoo
    from stratagem.tracing import capture

    model, make_batch = zoo.gpt(
        size="7b", device="meta", hidden=8192, layers=80, heads=64, ffn=28672, seq=4096, vocab=128256
    )
    return capture(model, make_batch(16), batch_size=16, name="llama-70b-shapes")


def h100_cluster(nodes: int = 8) -> ResourceSpec:
    return ResourceSpec(
        name=f"{nodes}x8-H100",
        nodes=[Node(address=f"10.1.0.{i + 1}", chief=i == 0, gpus=list(range(8)), device="H100") for i in range(nodes)],
        network=Link(kind="infiniband", bandwidth_gbps=3200, latency_us=5),
    )


def llm_layouts(context: SimContext) -> CandidateBatch:
    """64 layouts of 64 GPUs: (tensor, pipeline, context) meshes, each with a schedule, ZeRO stage,
    precision and recomputation drawn in turn."""
    meshes = [(t, p, c) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) for c in (1, 2) if t * p * c <= 32]
    b = CandidateBatch.allocate(context, 64)
    units = context.unit_starts.size
    for i in range(64):
        t, p, c = meshes[i % len(meshes)]
        b.tensor[i], b.pipeline[i], b.context_parallel[i], b.data[i] = t, p, c, 64 // (t * p * c)
        b.precision[i] = Precision.FP8 if i % 4 == 3 else Precision.BF16
        b.sequence_parallel[i] = t > 1
        b.recompute[i], b.selective[i] = i % 3 == 0, i % 3 == 1
        b.kind[i] = SyncKind.SHARDED
        b.zero_stage[i] = 3 if p == 1 else 1
        if p > 1:
            schedule, virtual = [(Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED, 2), (Schedule.ZERO_BUBBLE, 2)][i % 3]
            b.schedule[i], b.virtual_stages[i], b.micro_batches[i] = schedule, virtual, 16  # one sequence each
            chunks = p * virtual
            b.layer_stage[i] = np.minimum(context.layer_unit * chunks // units, chunks - 1)
        else:
            b.micro_batches[i] = 16
    return b


def llm_main() -> None:
    start = time.perf_counter()
    graph = llama_70b()
    capture_s = time.perf_counter() - start
    resources = h100_cluster()
    start = time.perf_counter()
    context = compile_context(graph, resources)
    compile_s = time.perf_counter() - start
    batch = llm_layouts(context)
    batch.validate(context)
    wall, cpu = timed(lambda: simulate_batch(context, batch), 5)
    explained, _ = timed(lambda: predictions(context, batch), 3)
    result = simulate_batch(context, batch)
    best = int(np.argmax(np.where(result.feasible, result.samples_per_s, -1.0)))
    tokens = graph.batch_size * 4096 * float(batch.data[best])
    print(
        json.dumps(
            {
                "benchmark": "simulator-llm",
                "graph": graph.name,
                "layers": context.num_layers,
                "variables": context.num_variables,
                "cluster": resources.name,
                "layouts": len(batch),
                "first_batch_s": round(wall[0], 4),
                "batch_seconds_best": round(min(wall), 4),
                "batch_cpu_seconds_best": round(min(cpu), 4),
                "predictions_seconds_median": round(statistics.median(explained), 4),
                "compile_context_ms": round(1e3 * compile_s, 1),
                "capture_s": round(capture_s, 2),
                "feasible": int(result.feasible.sum()),
                "best_layout": to_strategy(context, batch, best).effective_mesh.describe(),
                "best_step_time_s": round(float(result.step_time[best]), 4),
                "best_tokens_per_s_per_gpu": round(tokens / float(result.step_time[best]) / 64, 1),
                "load_average_1min": round(os.getloadavg()[0], 2),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=10_000)
    parser.add_argument("--synthetic", action="store_true", help="skip capture, use the generated BERT-large graph")
    parser.add_argument("--llm", action="store_true", help="time 64 layouts of a 70B decoder on 64 H100 instead")
    args = parser.parse_args()
    if args.llm:
        llm_main()
        return
    graph = None if args.synthetic else bert_large_captured()
    source = "capture" if graph is not None else "synthetic"
    graph = graph or bert_large_synthetic()
    resources = cluster()
    start = time.perf_counter()
    context = compile_context(graph, resources)
    compile_s = time.perf_counter() - start
    batch = random_candidates(context, args.candidates)
    batch.validate(context)
    simulate_batch(context, batch.take(np.arange(64)))  # warm the per-config caches
    batch_wall, batch_cpu = timed(lambda: simulate_batch(context, batch), 5)
    result = simulate_batch(context, batch)
    one = batch.take([0])
    single_wall, _ = timed(lambda: simulate_batch(context, one), 50)
    strategy = to_strategy(context, batch, 0)
    strategy_wall, _ = timed(lambda: simulate(graph, resources, [strategy]), 10)
    best = float(min(batch_wall))
    print(
        json.dumps(
            {
                "benchmark": "simulator",
                "graph": graph.name,
                "graph_source": source,
                "variables": context.num_variables,
                "layers": context.num_layers,
                "cluster": resources.name,
                "candidates": len(batch),
                "candidates_per_s": round(len(batch) / best, 1),
                "candidates_per_cpu_s": round(len(batch) / float(min(batch_cpu)), 1),
                "batch_seconds_best": round(best, 4),
                "batch_seconds_median": round(statistics.median(batch_wall), 4),
                "single_candidate_batch_ms": round(1e3 * statistics.median(single_wall), 3),
                "single_strategy_simulate_ms": round(1e3 * statistics.median(strategy_wall), 3),
                "compile_context_ms": round(1e3 * compile_s, 1),
                "feasible_share": round(float(result.feasible.mean()), 3),
                "step_time_s_min": round(float(result.step_time.min()), 5),
                "step_time_s_median": round(float(np.median(result.step_time)), 5),
                "distinct_step_times": int(np.unique(result.step_time).size),
                "load_average_1min": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
