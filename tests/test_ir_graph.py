"""ModelGraph's rules: strict fields, versioning, content id, and the cross-reference checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stratagem.errors import InvalidDocumentError, InvalidGraphError
from stratagem.ir import SCHEMA_VERSION, DType, Layer, ModelGraph, OptimizerSpec, Variable


def graph_dict(**overrides: Any) -> dict[str, Any]:
    """A tiny valid graph as JSON data: two linear layers, the second reading the first."""
    data: dict[str, Any] = {
        "name": "tiny",
        "batch_size": 4,
        "layers": [
            {
                "name": "fc1",
                "type": "Linear",
                "kind": "matmul",
                "fwd_flops": 64.0,
                "bwd_flops": 128.0,
                "variables": ["fc1.weight"],
            },
            {
                "name": "fc2",
                "type": "Linear",
                "kind": "matmul",
                "inputs": ["fc1"],
                "variables": ["fc2.weight", "fc2.bias"],
            },
        ],
        "variables": [
            {"name": "fc1.weight", "shape": [4, 2], "consumer": "fc1"},
            {"name": "fc2.weight", "shape": [3, 4], "dtype": "float16", "consumer": "fc2"},
            {"name": "fc2.bias", "shape": [3], "trainable": False},
        ],
    }
    data.update(overrides)
    return data


def error_text(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidGraphError) as caught:
        ModelGraph.parse(data)
    return str(caught.value)


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


def test_a_valid_graph_parses_and_gets_a_sha256_content_id() -> None:
    graph = ModelGraph.parse(graph_dict())
    assert graph.schema_version == SCHEMA_VERSION
    assert graph.id is not None and len(graph.id) == 64 and int(graph.id, 16) >= 0
    assert graph.variable("fc2.weight").dtype is DType.float16
    assert graph.layer("fc2").inputs == ["fc1"]


def test_graph_errors_are_invalid_document_errors_with_problems_listed() -> None:
    with pytest.raises(InvalidDocumentError) as caught:
        ModelGraph.parse(graph_dict(batch_size=0))
    assert isinstance(caught.value, InvalidGraphError)
    assert caught.value.problems[0].path == "batch_size"
    assert "greater than 0" in caught.value.problems[0].reason


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.update(colour="red"), "colour: Extra inputs are not permitted"),
        (lambda d: d["layers"][1].update(stride=2), "layers[1].stride: Extra inputs are not permitted"),
        (lambda d: d["variables"][0].update(init="zeros"), "variables[0].init: Extra inputs are not permitted"),
        (lambda d: d.update(optimizer={"kind": "adam", "beta": 0.9}), "optimizer.beta: Extra inputs are not permitted"),
    ],
    ids=["top-level", "layer", "variable", "optimizer"],
)
def test_unknown_fields_are_rejected_at_every_level(mutate: Any, expected: str) -> None:
    data = graph_dict()
    mutate(data)
    assert expected in error_text(data)


def test_another_schema_version_is_refused_by_name() -> None:
    text = error_text(graph_dict(schema_version="2"))
    assert "schema_version: '2' is not supported" in text


def test_content_id_is_stable_across_key_order_and_reserialization() -> None:
    graph = ModelGraph.parse(graph_dict())
    assert ModelGraph.parse(reversed_keys(graph_dict())).id == graph.id
    assert ModelGraph.parse(graph.to_json()).id == graph.id
    assert ModelGraph.parse(graph.to_json(indent=None).encode()).id == graph.id
    assert ModelGraph.parse(json.loads(graph.to_json())).id == graph.id


def test_content_id_ignores_provenance_but_not_content() -> None:
    graph = ModelGraph.parse(graph_dict())
    assert ModelGraph.parse(graph_dict(provenance={"torch": "2.13"})).id == graph.id
    assert ModelGraph.parse(graph_dict(batch_size=8)).id != graph.id
    assert ModelGraph.parse(graph_dict(name="other")).id != graph.id


def test_a_matching_id_is_accepted_and_a_wrong_one_refused() -> None:
    graph = ModelGraph.parse(graph_dict())
    assert ModelGraph.parse(graph_dict(id=graph.id)).id == graph.id
    text = error_text(graph_dict(id="0" * 64))
    assert "id: '" + "0" * 64 + "' does not match the content" in text
    assert f"expected '{graph.id}'" in text


def test_duplicate_layer_and_variable_names_are_refused_with_their_index() -> None:
    data = graph_dict()
    data["layers"].append({"name": "fc1", "inputs": ["fc2"]})
    data["variables"].append({"name": "fc1.weight", "shape": [1]})
    text = error_text(data)
    assert "layers[2].name: duplicate layer name 'fc1'" in text
    assert "variables[3].name: duplicate variable name 'fc1.weight'" in text


def test_unknown_dtype_is_refused() -> None:
    data = graph_dict()
    data["variables"][0]["dtype"] = "float128"
    assert "variables[0].dtype: Input should be" in error_text(data)


@pytest.mark.parametrize("shape", [[4, 0], [-1, 2]])
def test_dimensions_must_be_positive(shape: list[int]) -> None:
    data = graph_dict()
    data["variables"][1]["shape"] = shape
    bad = next(i for i, d in enumerate(shape) if d <= 0)
    assert f"variables[1]: shape[{bad}]: must be positive, got {shape[bad]}" in error_text(data)


def test_a_layer_reads_only_from_earlier_layers() -> None:
    data = graph_dict()
    data["layers"][0]["inputs"] = ["fc2"]
    assert "layers[0].inputs[0]: 'fc2' is a later layer; a layer reads only from earlier layers" in error_text(data)
    data = graph_dict()
    data["layers"][1]["inputs"] = ["fc1", "conv9"]
    assert "layers[1].inputs[1]: 'conv9' is not a layer of this graph" in error_text(data)
    data = graph_dict()
    data["layers"][1]["inputs"] = ["fc2"]
    assert "layers[1].inputs[0]" in error_text(data)


def test_a_layers_variables_must_exist() -> None:
    data = graph_dict()
    data["layers"][1]["variables"].append("fc2.gamma")
    assert "layers[1].variables[2]: unknown variable 'fc2.gamma'" in error_text(data)


def test_a_variables_consumer_must_be_a_layer() -> None:
    data = graph_dict()
    data["variables"][0]["consumer"] = "fc7"
    assert "variables[0].consumer: unknown layer 'fc7'" in error_text(data)


def test_a_sparse_variable_needs_lookups_and_an_axis() -> None:
    data = graph_dict()
    data["variables"][0]["sparse"] = True
    assert "variables[0]: lookups_per_step: is required for a sparse variable" in error_text(data)
    data["variables"][0].update(shape=[], lookups_per_step=3)
    assert "variables[0]: shape: a sparse variable needs at least one axis" in error_text(data)


def test_negative_costs_and_unknown_optimizers_are_refused() -> None:
    data = graph_dict()
    data["layers"][0]["fwd_flops"] = -1
    assert "layers[0].fwd_flops: Input should be greater than or equal to 0" in error_text(data)
    assert "optimizer.kind:" in error_text(graph_dict(optimizer={"kind": "adadelta"}))
    with pytest.raises(InvalidGraphError, match=r"optimizer\.kind: unknown optimizer 'adadelta'"):
        OptimizerSpec.of("adadelta")
    assert OptimizerSpec.of("adamw", 2).state_bytes_per_param == 4


def test_every_problem_is_reported_at_once() -> None:
    data = graph_dict()
    data["layers"][0]["inputs"] = ["nowhere"]
    data["layers"][1]["variables"] = ["missing"]
    with pytest.raises(InvalidGraphError) as caught:
        ModelGraph.parse(data)
    assert "layers[0].inputs[0]" in str(caught.value) and "layers[1].variables[0]" in str(caught.value)


def test_sizes_and_queries_follow_the_shapes() -> None:
    graph = ModelGraph.parse(graph_dict())
    weight = graph.variable("fc2.weight")
    assert (weight.numel, weight.nbytes, weight.row_bytes) == (12, 24, 8)
    assert [v.name for v in graph.trainable_variables] == ["fc1.weight", "fc2.weight"]
    assert graph.num_parameters == 8 + 12 + 3
    assert graph.parameter_bytes == 32 + 24 + 12
    assert graph.total_flops == 192.0
    assert Variable(name="s", shape=[]).numel == 1
    assert "tiny: 2 layers, 3 variables (0 sparse)" in graph.summary()


def test_assigning_a_field_re_derives_the_id() -> None:
    graph = ModelGraph.parse(graph_dict())
    before = graph.id
    graph.batch_size = 16
    assert graph.id != before and graph.id == graph.compute_id()
    assert graph.id == ModelGraph.parse(graph_dict(batch_size=16)).id


def test_a_refused_assignment_leaves_the_graph_unchanged() -> None:
    graph = ModelGraph.parse(graph_dict())
    before = graph.model_dump()
    with pytest.raises(InvalidGraphError, match=r"layers\[0\]\.variables\[0\]: unknown variable 'nope'"):
        graph.layers = [Layer(name="x", variables=["nope"])]
    with pytest.raises(InvalidGraphError, match="batch_size"):
        graph.batch_size = 0
    with pytest.raises(InvalidGraphError, match="does not match the content"):
        graph.id = "f" * 64
    assert graph.model_dump() == before and graph.id == graph.compute_id()


def test_replace_and_save_load_keep_ids_consistent(tmp_path: Any) -> None:
    graph = ModelGraph.parse(graph_dict())
    bigger = graph.replace(batch_size=8)
    assert bigger.batch_size == 8 and bigger.id == bigger.compute_id() != graph.id
    path = tmp_path / "graph.json"
    graph.save(path)
    assert ModelGraph.load(path) == graph


def test_shared_fixture_graphs_are_valid(
    mlp_graph: ModelGraph, embedding_graph: ModelGraph, awkward_graph: ModelGraph
) -> None:
    assert [v.name for v in mlp_graph.variables][:2] == ["fc1.weight", "fc1.bias"]
    assert mlp_graph.layer("fc1").fwd_flops == 2.0 * 32 * 784 * 512
    assert [v.name for v in embedding_graph.variables if v.sparse] == ["embedding.weight"]
    assert not embedding_graph.variable("position.weight").trainable
    assert awkward_graph.variable("prime7.weight").shape[0] == 7
    assert awkward_graph.variable("pow64.weight").shape[0] == 64


def test_text_that_is_not_a_graph_is_refused_clearly() -> None:
    with pytest.raises(InvalidGraphError, match="Invalid JSON"):
        ModelGraph.parse("{not json")
    with pytest.raises(InvalidGraphError, match="Input should be an object"):
        ModelGraph.parse(b"[]")


def test_non_finite_numbers_are_refused_naming_the_field() -> None:
    data = graph_dict()
    data["layers"][1]["bwd_flops"] = float("inf")
    assert "layers[1].bwd_flops: must be a finite number" in error_text(data)


def test_a_variables_layer_is_its_consumer_else_the_first_layer_that_lists_it():
    graph = ModelGraph(
        name="tied",
        batch_size=1,
        layers=[
            Layer(name="embed", type="Embedding", kind="embedding", variables=["wte"]),
            Layer(name="fc", type="Linear", kind="matmul", variables=["w"]),
            Layer(name="head", type="Linear", kind="matmul", variables=["wte", "w"]),
        ],
        variables=[Variable(name="wte", shape=[8, 4], consumer="head"), Variable(name="w", shape=[4, 4]),
                   Variable(name="unused", shape=[2])],
    )  # fmt: skip
    assert graph.variable_layers() == {"wte": "head", "w": "fc"}
