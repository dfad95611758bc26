"""Strategy.tensor_parallel: which modules a tensor group splits, checked on its own and against the graph."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from sample_documents import make_mlp_graph

from stratagem.errors import InvalidStrategyError
from stratagem.ir import ModelGraph, ResourceSpec, Strategy, canonical_json

GPUS = ["10.0.0.1:GPU:0", "10.0.0.1:GPU:1", "10.0.0.2:GPU:0", "10.0.0.2:GPU:1"]


def cluster() -> ResourceSpec:
    return ResourceSpec.parse(
        {"nodes": [{"address": "10.0.0.1", "chief": True, "gpus": [0, 1]}, {"address": "10.0.0.2", "gpus": [0, 1]}]}
    )


def graph() -> ModelGraph:
    """fc1 784->512, fc2 512->256, fc3 256->10 (weights [out, in])."""
    return make_mlp_graph()


def strategy(
    tensor_parallel: list[dict[str, Any]], *, replicas: list[str] = GPUS, mesh: dict[str, int] | None = None
) -> dict[str, Any]:
    return {
        "replicas": replicas,
        "mesh": mesh or {"data": 2, "tensor": 2},
        "tensor_parallel": tensor_parallel,
        "variables": [{"var_name": v.name, "synchronizer": {"kind": "allreduce"}} for v in graph().variables],
    }


def self_problems(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidStrategyError) as caught:
        Strategy.parse(data)
    return str(caught.value)


def graph_problems(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidStrategyError) as caught:
        Strategy.parse(data).validate_for(graph(), cluster())
    return str(caught.value)


def test_a_megatron_pair_is_a_valid_split() -> None:
    ok = Strategy.parse(strategy([{"name": "fc1", "style": "colwise"}, {"name": "fc2", "style": "rowwise"}]))
    assert ok.validate_for(graph(), cluster()).tensor_parallel[1].style == "rowwise"


def test_the_heads_style_needs_a_head_count_the_degree_divides() -> None:
    assert "tensor_parallel[0]: heads: required for the heads style" in self_problems(
        strategy([{"name": "attn", "style": "heads"}])
    )
    assert "tensor_parallel[0].heads: mesh.tensor(2) does not divide heads(3)" in self_problems(
        strategy([{"name": "attn", "style": "heads", "heads": 3}])
    )
    assert "only the heads style takes a head count" in self_problems(
        strategy([{"name": "fc1", "style": "colwise", "heads": 4}])
    )


def test_a_module_is_split_once_and_never_inside_a_heads_split() -> None:
    text = self_problems(strategy([{"name": "fc1", "style": "colwise"}, {"name": "fc1", "style": "rowwise"}]))
    assert "tensor_parallel[1].name: 'fc1' is split twice (also tensor_parallel[0])" in text
    text = self_problems(
        strategy([{"name": "blk.attn", "style": "heads", "heads": 4}, {"name": "blk.attn.q", "style": "colwise"}])
    )
    assert "tensor_parallel[1].name: 'blk.attn.q' is inside 'blk.attn'" in text


def test_splits_without_a_tensor_group_are_refused() -> None:
    text = self_problems(strategy([{"name": "fc1", "style": "colwise"}], mesh={"data": 4}))
    assert "tensor_parallel: 1 layer(s) split but mesh.tensor is 1" in text


def test_splits_must_name_layers_of_a_kind_the_style_splits_along_an_axis_the_degree_divides() -> None:
    text = graph_problems(
        strategy(
            [
                {"name": "fc9", "style": "colwise"},
                {"name": "act1", "style": "rowwise"},
                {"name": "fc3", "style": "rowwise"},
                {"name": "fc3.x", "style": "heads", "heads": 4},
            ],
            mesh={"data": 1, "tensor": 4},
            replicas=[f"10.0.0.1:GPU:{i}" for i in range(4)],
        )
    )
    assert "tensor_parallel[0].name: 'fc9' is not a layer of the graph" in text
    assert "tensor_parallel[1].style: rowwise cannot split 'act1', a ReLU (elementwise) layer" in text
    assert "tensor_parallel[3].name: 'fc3.x' is not a module of the graph" in text
    ok = strategy(
        [{"name": "fc3", "style": "rowwise"}],
        mesh={"data": 1, "tensor": 4},
        replicas=[f"10.0.0.1:GPU:{i}" for i in range(4)],
    )
    assert "replicas[2]" in graph_problems(ok)  # GPUs 2 and 3 are not in the two-GPU nodes
    odd = strategy([{"name": "fc3", "style": "colwise"}], mesh={"data": 1, "tensor": 4}, replicas=GPUS)
    assert "mesh.tensor(4) does not divide axis 0 of fc3.weight [10, 256]" in graph_problems(odd)


def test_a_tensor_group_must_stay_inside_a_node() -> None:
    crossing = ["10.0.0.1:GPU:0", "10.0.0.2:GPU:0", "10.0.0.1:GPU:1", "10.0.0.2:GPU:1"]
    text = graph_problems(strategy([{"name": "fc1", "style": "colwise"}], replicas=crossing))
    assert "replicas: tensor group replicas[0:2] spans nodes ['10.0.0.1', '10.0.0.2']" in text


def test_fields_at_their_default_are_left_out_of_a_strategys_id() -> None:
    plain = Strategy.parse({"replicas": GPUS, "variables": [{"var_name": "a", "synchronizer": {"kind": "allreduce"}}]})
    content = {"replicas": GPUS, "variables": [{"var_name": "a", "synchronizer": {"kind": "allreduce"}}]}  # a tag stays
    assert plain.id == hashlib.sha256(canonical_json(content).encode()).hexdigest()
    split = Strategy.parse(strategy([{"name": "fc1", "style": "colwise"}]))
    assert Strategy.parse(split.to_json()).id == split.id
    assert split.id != Strategy.parse({**strategy([]), "tensor_parallel": []}).id
