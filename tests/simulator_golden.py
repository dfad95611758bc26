"""The golden set: a few hundred candidates whose predictions must not move unless a formula does.

Every zoo model at its small size and at a GPU-scale size (captured on meta), on a calibrated CPU
host, a two-node CPU cluster and three GPU clusters; the candidates are every builder's strategy and
random rows of the search's structured proposals and AutoSync samples. The fixture
(`tests/data/simulator_golden.json`) holds each candidate's step time, memory, feasibility and
breakdown, and a fingerprint of its inputs (graph id, cluster id, strategy id or the batch row's
bytes), so a test can tell a changed prediction from a changed input.

    PYTHONPATH=. python tests/simulator_golden.py     # rewrite the fixture
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sample_documents import make_loopback_cpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer_service.search.proposals import autosync_samples, structured_proposals
from optimizer_service.search.space import SearchOptions, Space
from simulator import BREAKDOWN_KEYS, CandidateBatch, compile_context, encode, simulate_batch
from simulator.encoding import DTYPES
from stratagem import zoo
from stratagem.builders import all_builders
from stratagem.ir import DeviceSpec, Link, ModelGraph, Node, ResourceSpec
from stratagem.tracing import capture

FIXTURE = Path(__file__).parent / "data" / "simulator_golden.json"
RANDOM_PER_CASE = 4
TOLERANCE = 1e-12

GRAPHS: dict[str, tuple[str, str, dict, int]] = {
    "resnet50-small": ("resnet50", "small", {}, 8),
    "resnet50-full": ("resnet50", "full", {}, 8),
    "vgg16-small": ("vgg16", "small", {}, 8),
    "vgg16-full": ("vgg16", "full", {}, 8),
    "bert_large-small": ("bert_large", "small", {}, 8),
    "bert_large-full": ("bert_large", "full", {}, 8),
    "gpt-small": ("gpt", "small", {}, 8),
    "gpt-full": ("gpt", "full", {}, 4),
    "gpt-7b-4layers": ("gpt", "7b", {"layers": 4}, 2),
    "dlrm-small": ("dlrm", "small", {}, 64),
    "dlrm-full": ("dlrm", "full", {}, 64),
}
"""Name: (zoo model, size, overrides, batch size)."""

ENCODED_FIELDS = (
    "data",
    "tensor",
    "pipeline",
    "micro_batches",
    "schedule",
    "consistency",
    "staleness",
    "recompute",
    "replicas",
    "layer_stage",
    "kind",
    "group",
    "algorithm",
    "compressor",
    "compressor_param",
    "shards",
    "partition_axis",
    "local_replication",
    "server",
)
"""The batch fields a search row's fingerprint always covers; a field added later counts only where a row
leaves its default (`batch_fingerprint`), so the rows written before it keep their fingerprints."""


def calibrated_cpu() -> ResourceSpec:
    """One host of two CPU ranks with every figure calibration writes, so every CPU-only path runs."""
    device = DeviceSpec(
        name="CPU",
        peak_flops={"float32": 60e9, "bfloat16": 30e9, "float16": 10e9},
        memory_bytes=16e9,
        memory_bandwidth=12e9,
        matmul_efficiency=0.8,
        elementwise_efficiency=0.3,
        launch_overhead_s=30e-6,
        norm_efficiency=0.2,
        conv_efficiency=0.5,
        optimizer_efficiency=0.25,
        optimizer_knee_bytes=24e6,
        optimizer_tensor_s=25e-6,
        optimizer_loop_tensor_s=40e-6,
        cast_efficiency=0.1,
        stream_efficiency=0.6,
        select_efficiency=0.05,
        full_select_efficiency=0.02,
        lowrank_efficiency=0.08,
        lowrank_knee_bytes=70e6,
        coalesce_efficiency=0.04,
        scatter_efficiency=0.5,
        gather_efficiency=0.7,
        half_reduce_efficiency=0.5,
        reduce_efficiency=1.2,
        broadcast_efficiency=2.4,
        lowrank_round_s=4e-3,
        comm_overlap=0.2,
        comm_latency_contention=1.5,
        is_gpu=False,
    )
    return make_loopback_cpus("cpu-calibrated", device, bandwidth_gbps=6.0, latency_us=150.0)


def clusters() -> dict[str, ResourceSpec]:
    def gpus(name: str, device: str, nodes: int, per_node: int, gbps: float, latency_us: float) -> ResourceSpec:
        return ResourceSpec(
            name=name,
            nodes=[
                Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=list(range(per_node)), device=device)
                for i in range(nodes)
            ],
            network=Link(kind="infiniband" if gbps > 100 else "ethernet", bandwidth_gbps=gbps, latency_us=latency_us),
        )

    return {
        "cpu-calibrated": calibrated_cpu(),
        "cpu-2x2": ResourceSpec(
            name="cpu-2x2",
            nodes=[Node(address=f"10.1.0.{i + 1}", chief=i == 0, cpus=[0, 1], device="CPU") for i in range(2)],
            network=Link(kind="ethernet", bandwidth_gbps=10, latency_us=30),
        ),
        "t4-2x4": gpus("t4-2x4", "T4", 2, 4, 50.0, 25.0),
        "a100-2x8": gpus("a100-2x8", "A100-80GB", 2, 8, 800.0, 5.0),
        "h100-2x8": gpus("h100-2x8", "H100", 2, 8, 3200.0, 4.0),
    }


def graphs() -> dict[str, ModelGraph]:
    out = {}
    for name, (model, size, overrides, batch) in GRAPHS.items():
        module, make_batch = zoo.build(model, size, device="meta", **overrides)
        out[name] = capture(module, make_batch(batch), batch_size=batch, name=name)
    return out


def batch_fingerprint(batch: CandidateBatch, row: int, defaults: CandidateBatch) -> str:
    """`defaults`: one row as `CandidateBatch.allocate` writes it, for the fields added later."""
    digest = hashlib.sha256()
    later = [name for name in DTYPES if name not in ENCODED_FIELDS]
    for name in (*ENCODED_FIELDS, *later):
        array = np.ascontiguousarray(getattr(batch, name)[row])
        if name in later and np.array_equal(array.ravel(), np.ravel(getattr(defaults, name)[0])):
            continue
        digest.update(name.encode())
        digest.update(str(array.dtype).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Case:
    graph: str
    cluster: str
    graph_id: str
    resources_id: str
    sources: list[str]
    inputs: list[str]
    batch: CandidateBatch
    context: object


def cases() -> Iterator[Case]:
    """Every (graph, cluster) pair with its candidates, in a fixed order; builders first."""
    specs = clusters()
    for graph_name, graph in graphs().items():
        for cluster_name, resources in specs.items():
            context = compile_context(graph, resources)
            builders = all_builders()
            strategies = [b.build(graph, resources) for b in builders]
            built = encode(context, strategies)
            space = Space(context, SearchOptions(allow_compression=True, allow_async=True))
            rng = np.random.default_rng(len(graph_name) * 1000 + len(cluster_name))
            structured = structured_proposals(space, space.max_shards).batch
            picked = structured.take(
                rng.choice(len(structured), size=min(RANDOM_PER_CASE, len(structured)), replace=False)
            )
            sampled = autosync_samples(space, RANDOM_PER_CASE, rng, space.max_shards).batch
            batch = CandidateBatch.concat(built, picked, sampled)
            batch.validate(context)
            sources = [f"builder:{b.name}" for b in builders]
            sources += [f"structured:{i}" for i in range(len(picked))] + [f"sampled:{i}" for i in range(len(sampled))]
            inputs = [str(s.id)[:16] for s in strategies]
            defaults = CandidateBatch.allocate(context, 1, max_shards=batch.max_shards)
            inputs += [batch_fingerprint(batch, i, defaults) for i in range(len(strategies), len(batch))]
            yield Case(graph_name, cluster_name, str(graph.id), str(resources.id), sources, inputs, batch, context)


def predict(case: Case) -> list[dict]:
    result = simulate_batch(case.context, case.batch)  # type: ignore[arg-type]
    return [
        {
            "source": case.sources[i],
            "input": case.inputs[i],
            "step_time": float(result.step_time[i]),
            "memory": float(result.memory[i]),
            "feasible": bool(result.feasible[i]),
            "breakdown": [float(x) for x in result.breakdown[i]],
        }
        for i in range(len(case.batch))
    ]


def write() -> None:
    records = [
        {
            "graph": case.graph,
            "cluster": case.cluster,
            "graph_id": case.graph_id,
            "resources_id": case.resources_id,
            "candidates": predict(case),
        }
        for case in cases()
    ]
    document = {
        "about": "tests/simulator_golden.py: predictions that must not move unless a formula does",
        "breakdown_keys": list(BREAKDOWN_KEYS),
        "cases": records,
    }
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(document, separators=(",", ":")) + "\n")
    count = sum(len(r["candidates"]) for r in records)
    print(f"wrote {count} candidates in {len(records)} cases to {FIXTURE} ({FIXTURE.stat().st_size / 1e3:.0f} KB)")


if __name__ == "__main__":
    write()
