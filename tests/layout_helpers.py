"""Models and clusters the layout, predict and engine-config tests share (captured once per process)."""

from __future__ import annotations

import functools

from stratagem.ir import ModelGraph, Node, ResourceSpec, Strategy

SMALL_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
"""A Llama-architecture config small enough to capture in a second (grouped-query attention included)."""


@functools.cache
def gpt_graph(layers: int = 4, batch: int = 2, hidden: int | None = None, seq: int | None = None) -> ModelGraph:
    """The zoo's small GPT (4 heads), deeper, wider (ffn 4 × hidden) or longer where asked."""
    from stratagem import zoo
    from stratagem.tracing import capture

    wider = {"hidden": hidden, "ffn": 4 * hidden} if hidden else {}
    longer = {"seq": seq} if seq else {}
    module, make_batch = zoo.gpt("small", device="meta", layers=layers, **wider, **longer)
    return capture(module, make_batch(batch), batch_size=batch)


@functools.cache
def llama_graph(batch: int = 1, seq: int = 64) -> ModelGraph:
    from stratagem.hf import capture_hf_config

    return capture_hf_config(SMALL_LLAMA, batch=batch, seq=seq)


def gpu_cluster(nodes: int = 2, gpus: int = 8, device: str = "H100") -> ResourceSpec:
    return ResourceSpec(
        name=f"{device.lower()}-{nodes}x{gpus}",
        nodes=[
            Node(address=f"10.0.0.{i + 1}", chief=i == 0, gpus=list(range(gpus)), device=device) for i in range(nodes)
        ],
        network={"kind": "infiniband", "bandwidth_gbps": 400, "latency_us": 5},
    )


def mixed_shard_synchronizers(graph: ModelGraph, cluster: ResourceSpec) -> Strategy:
    """All-reduce with the first variable split in two, one half all-reduced and one through a PS: a
    strategy the simulator cannot price."""
    from stratagem.builders import AllReduce
    from stratagem.ir import AllReduceSynchronizer, Partition, PSSynchronizer, VariableConfig

    base = AllReduce().build(graph, cluster)
    halves = VariableConfig(
        var_name=base.variables[0].var_name,
        synchronizer=AllReduceSynchronizer(),
        partition=Partition(axis=0, shards=2),
        shard_synchronizers=[AllReduceSynchronizer(), PSSynchronizer(reduction_destination="10.0.0.1:CPU:0")],
    )
    return base.replace(variables=[halves, *base.variables[1:]])
