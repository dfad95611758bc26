"""What the CPU benchmarks measure: zoo models and replayed jobs at sizes where synchronization is a
real share of the step, and the strategies each one gets.

The accuracy benchmark measures `CASES`; the cost-model benchmark measures `JOBS` (zoo models at
other sizes and replayed models whose gradients are large next to their compute). Both give every
model the strategies that execute differently on one node (`strategies_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stratagem.builders import AllReduce, all_builders
from stratagem.ir import (
    Compressor,
    ModelGraph,
    Node,
    Provenance,
    ResourceSpec,
    ShardedSynchronizer,
    Strategy,
    VariableConfig,
)


@dataclass(frozen=True)
class Case:
    """A zoo model at a size where one training step is compute worth timing on a CPU rank."""

    batch_size: int
    overrides: dict[str, int | float | bool | str] = field(default_factory=dict)
    optimizer: str = "adam"
    min_warmup: int = 0
    """Warm-up steps this model needs before its steps are representative (see `CASES`)."""


CASES: dict[str, Case] = {
    "bert_large": Case(4, {"hidden": 256, "ffn": 1024, "layers": 4, "seq": 32, "vocab": 8192}, min_warmup=5),
    "vgg16": Case(16, {"width": 16, "hidden": 2048}),
    "dlrm": Case(2048, {"dim": 32, "bottom": "256,128", "top": "256,128"}, optimizer="adagrad"),
    "gpt": Case(16, {"hidden": 128, "ffn": 512, "layers": 2, "seq": 64}, min_warmup=14),
    "resnet50": Case(16, {"width": 16}),
}
"""Sizes where synchronization is a real share of the step, so the strategies differ by more than the
machine's noise: few tokens per step for many parameters (BERT: 5M parameters, 128 tokens), VGG's
wide classifier (4.5M parameters behind cheap narrow convolutions), DLRM's sparse tables. The zoo's
language models start with saturated softmaxes whose backward is full of denormal floats, which a CPU
computes 10-20x slower until training moves away from them (GPT for about 12 steps at Adam's default
rate, BERT for 2-3), hence their longer warm-up. DLRM trains with Adagrad: Adam cannot apply its
sparse embedding gradients."""
DEFAULT_MODELS = ("bert_large", "vgg16", "dlrm")
QUICK_MODELS = ("bert_large", "dlrm")
QUICK_STRATEGIES = ("PS", "AllReduce", "Parallax", "DataParallel", "AllReduce-unfused", "AllReduce-fp16")


def build_graph(model: str) -> ModelGraph:
    """The zoo model of `CASES` captured at its size."""
    from stratagem import zoo
    from stratagem.tracing import capture

    case = CASES[model]
    module, make_batch = zoo.build(model, "small", **case.overrides)
    return capture(module, make_batch(case.batch_size), batch_size=case.batch_size, optimizer=case.optimizer)


SAME_ON_ONE_NODE = ("PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "PartitionedAR", "RandomAxisPartitionAR")
"""Builders that execute like another one on a single node, and are measured only with `--all-builders`:
AutoDist puts one server on each node, so the load-balanced and partitioned PS builders place every
shard on the same server as PS, where the runtime fuses them into the same bucket; the partitioned
all-reduce builders cut variables into pieces of the same fusion groups as AllReduce. Their trials
measure the machine's noise twice, not another strategy, and tie pairs that no ranking can order."""


def strategies_for(graph: ModelGraph, resources: ResourceSpec, *, all_builders_: bool = False) -> dict[str, Strategy]:
    """The builders that differ on this cluster, plus mixes a search would propose that cost differently
    on it: one all-reduce per variable (latency-bound), fp16, PowerSGD and top-k compression of the
    dense gradients (less wire, more arithmetic), ZeRO-style sharding. Coinciding strategies (on a
    dense model Parallax is AllReduce) keep the first name."""
    out: dict[str, Strategy] = {
        b.name: b.build(graph, resources) for b in all_builders() if all_builders_ or b.name not in SAME_ON_ONE_NODE
    }
    out["AllReduce-unfused"] = _mix(AllReduce(chunk_size=1).build(graph, resources), "AllReduce-unfused")
    for name, compressor in (
        ("AllReduce-fp16", Compressor(kind="fp16")),
        ("AllReduce-powersgd", Compressor(kind="powersgd", rank=4)),
        ("AllReduce-topk", Compressor(kind="topk", ratio=0.01)),
    ):
        out[name] = _mix(_compressed(out["AllReduce"], graph, compressor), name)
    dense = [v for v in graph.trainable_variables if not v.sparse]
    if len(dense) == len(graph.trainable_variables):
        sharded = [VariableConfig(var_name=v.name, synchronizer=ShardedSynchronizer()) for v in dense]
        out["Sharded"] = _mix(
            out["AllReduce"].replace(variables=[c.model_dump(mode="json") for c in sharded]), "Sharded"
        )
    unique: dict[str, Strategy] = {}
    seen: set[str] = set()
    for name, strategy in out.items():
        if strategy.id not in seen:
            seen.add(str(strategy.id))
            unique[name] = strategy
    return unique


def _compressed(strategy: Strategy, graph: ModelGraph, compressor: Compressor) -> Strategy:
    """`strategy` with `compressor` on the all-reduce of every dense variable (sparse rows travel as they are)."""
    sparse = {v.name for v in graph.variables if v.sparse}
    configs = []
    for config in strategy.variables:
        data = config.model_dump(mode="json")
        if config.var_name not in sparse and data["synchronizer"]["kind"] == "allreduce":
            data["synchronizer"]["compressor"] = compressor.model_dump(mode="json")
        configs.append(data)
    return strategy.replace(variables=configs)


def _mix(strategy: Strategy, name: str) -> Strategy:
    return strategy.replace(provenance=Provenance(search={"benchmark": "simulator_accuracy", "mix": name}))


# -- the cost-model benchmark's jobs --------------------------------------------------------------------

COMM_JOBS: dict[str, tuple[int, int, int, int]] = {
    # name: (dense layers, width, batch, embedding rows): gradients large next to their compute
    "mlp-wide": (4, 1536, 8, 0),
    "mlp-deep": (12, 768, 8, 0),
    "mlp-compute": (4, 1024, 128, 0),
    "embedding": (2, 256, 256, 65_536),
}
"""Replayed models (`trial_runner.ReplayWorkload`): the graph's FLOPs and bytes, burnt for real."""

ZOO_JOBS: dict[str, tuple[str, Case]] = {
    "bert_large-h384": (
        "bert_large",
        Case(2, {"hidden": 384, "ffn": 1536, "layers": 2, "seq": 32, "vocab": 8192}, min_warmup=30),
    ),
    "gpt-h256": ("gpt", Case(8, {"hidden": 256, "ffn": 1024, "layers": 2, "seq": 32, "vocab": 8192}, min_warmup=14)),
    "vgg16-wide-fc": ("vgg16", Case(8, {"width": 8, "hidden": 3072})),
    "dlrm-dim64": ("dlrm", Case(512, {"dim": 64, "bottom": "256,128", "top": "256,128"}, optimizer="adagrad")),
}
"""Zoo models at other sizes than `CASES`, chosen the same way: few
tokens per step for many parameters, a wide classifier, sparse tables. BERT at width 384 with 64 tokens
a step leaves its denormal start slowly: alone on one rank its step fell from 357 ms at step 2 to 150
at step 12 and about 106 from step 30 on, so it warms up 30 steps (5 had timed the slow start)."""

JOBS = (*ZOO_JOBS, *COMM_JOBS)


def comm_graph(name: str, layers: int, width: int, batch: int, rows: int) -> ModelGraph:
    """A model whose gradients are large next to its compute, replayed for real by the trial runner."""
    act = float(batch * width * 4)
    graph_layers: list[dict[str, Any]] = []
    variables: list[dict[str, Any]] = []
    if rows:
        variables.append(
            {
                "name": "embedding.weight",
                "shape": [rows, width],
                "sparse": True,
                "lookups_per_step": batch * 16,
                "consumer": "embedding",
            }
        )
        graph_layers.append(
            {
                "name": "embedding",
                "kind": "embedding",
                "bytes_moved": act * 16,
                "activation_bytes": act,
                "output_bytes": act,
                "variables": ["embedding.weight"],
            }
        )
    for i in range(layers):
        flops = 2.0 * batch * width * width
        variables.append({"name": f"layers.{i}.weight", "shape": [width, width], "consumer": f"layers.{i}"})
        graph_layers.append(
            {
                "name": f"layers.{i}",
                "kind": "matmul",
                "fwd_flops": flops,
                "bwd_flops": 2 * flops,
                "bytes_moved": 4.0 * width * width + 2 * act,
                "activation_bytes": act,
                "output_bytes": act,
                "inputs": [graph_layers[-1]["name"]] if graph_layers else [],
                "variables": [f"layers.{i}.weight"],
            }
        )
    return ModelGraph.parse(
        {
            "name": name,
            "batch_size": batch,
            "optimizer": {"kind": "sgd", "state_bytes_per_param": 0},
            "layers": graph_layers,
            "variables": variables,
            "provenance": {"source": "benchmarks/cost_model.py"},
        }
    )


@dataclass(frozen=True)
class Workload:
    graph: ModelGraph
    spec: Any
    """The trial runner's workload (zoo model or replay)."""
    warmup: int
    """Warm-up steps at least (the zoo's language models need more, see `CASES`)."""


def job_workload(name: str) -> Workload:
    from trial_runner import ReplayWorkload, ZooWorkload

    if name in COMM_JOBS:
        graph = comm_graph(name, *COMM_JOBS[name])
        return Workload(graph, ReplayWorkload(graph), 0)
    from stratagem import zoo
    from stratagem.tracing import capture

    model, case = ZOO_JOBS[name]
    module, make_batch = zoo.build(model, "small", **case.overrides)
    graph = capture(module, make_batch(case.batch_size), batch_size=case.batch_size, optimizer=case.optimizer)
    spec = ZooWorkload(model, batch_size=case.batch_size, overrides=case.overrides, optimizer=case.optimizer)
    return Workload(graph, spec, case.min_warmup)


def placeholder_spec() -> ResourceSpec:
    """Two CPU ranks on one node: all the builders need (devices and nodes) before the block calibrates."""
    return ResourceSpec(name="local-2cpu", nodes=[Node(address="127.0.0.1", chief=True, cpus=[0, 1], device="CPU")])
