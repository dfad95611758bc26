"""Graphs and resource specs over HTTP: deduplicated by content id, fetched back unchanged, refused clearly."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster

from stratagem.ir import ModelGraph, ResourceSpec

AUTODIST_YAML = """
nodes:
  - address: 10.0.0.1
    gpus: [0, 1, 2, 3]
    chief: true
    network_bandwidth: 25
  - address: 10.0.0.2
    gpus: [0, 1, 2, 3]
    network_bandwidth: 25
"""


def test_uploading_the_same_graph_twice_returns_one_id_201_then_200(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph = make_mlp_graph()
    first = client.post("/v1/graphs", json=graph.model_dump(mode="json"))
    second = client.post("/v1/graphs", json=graph.model_dump(mode="json"))
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"] == graph.id
    assert first.json()["num_variables"] == len(graph.variables)
    assert first.json()["num_parameters"] == graph.num_parameters
    assert client.get("/v1/graphs").json()["count"] == 1


def test_a_stored_graph_comes_back_identical(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph = make_embedding_graph()
    url = client.post("/v1/graphs", json=graph.model_dump(mode="json")).json()["url"]
    fetched = ModelGraph.parse(client.get(url).json())
    assert fetched == graph


def test_graph_listing_pages_with_a_total_count(make_client) -> None:
    client: TestClient = make_client(workers=0)
    ids = {
        client.post("/v1/graphs", json=make_mlp_graph(batch_size=b).model_dump(mode="json")).json()["id"]
        for b in (8, 16, 32)
    }
    page = client.get("/v1/graphs", params={"limit": 2, "offset": 0}).json()
    rest = client.get("/v1/graphs", params={"limit": 2, "offset": 2}).json()
    assert (page["count"], len(page["data"]), len(rest["data"])) == (3, 2, 1)
    assert {g["id"] for g in page["data"] + rest["data"]} == ids


def test_resource_specs_are_deduplicated_and_fetched_back(make_client) -> None:
    client: TestClient = make_client(workers=0)
    spec = make_t4_cluster(2)
    first = client.post("/v1/resources", json=spec.model_dump(mode="json"))
    second = client.post("/v1/resources", json=spec.model_dump(mode="json"))
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["num_devices"] == 8
    assert ResourceSpec.parse(client.get(first.json()["url"]).json()) == spec


def test_unknown_and_malformed_ids_are_404(make_client) -> None:
    client: TestClient = make_client(workers=0)
    for path in (
        "/v1/graphs/" + "0" * 64,
        "/v1/graphs/not-an-id",
        "/v1/resources/" + "a" * 64,
        "/v1/strategies/" + "b" * 64,
    ):
        response = client.get(path)
        assert response.status_code == 404, path
        assert "no " in response.json()["detail"]


def test_a_graph_breaking_a_rule_is_refused_with_the_field_path_and_reason(make_client) -> None:
    client: TestClient = make_client(workers=0)
    data = make_mlp_graph().model_dump(mode="json", exclude={"id"})
    data["layers"][0]["inputs"] = ["fc2"]
    data["variables"][0]["shape"] = [0, 784]
    data["layers"][1]["colour"] = "blue"
    response = client.post("/v1/graphs", json=data)
    assert response.status_code == 422
    problems = response.json()["detail"]
    assert {"loc": ["body", "layers", 1, "colour"], "msg": "Extra inputs are not permitted"} in problems
    assert any(p["loc"][:3] == ["body", "variables", 0] and "must be positive, got 0" in p["msg"] for p in problems)
    assert not any("Value error," in p["msg"] for p in problems)


def test_a_cross_reference_problem_names_the_layer_input(make_client) -> None:
    client: TestClient = make_client(workers=0)
    data = make_mlp_graph().model_dump(mode="json", exclude={"id"})
    data["layers"][0]["inputs"] = ["fc2"]
    problems = client.post("/v1/graphs", json=data).json()["detail"]
    assert any("layers[0].inputs[0]" in p["msg"] and "later layer" in p["msg"] for p in problems), problems


def test_body_that_is_not_json_is_a_422_saying_so(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/graphs", content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"][0]["msg"]


def test_autodist_yaml_resources_are_accepted_by_optimize(make_client) -> None:
    client: TestClient = make_client(workers=0)
    body = {"graph": make_mlp_graph().model_dump(mode="json"), "resources": AUTODIST_YAML, "device": "V100"}
    created = client.post("/v1/optimize", json=body)
    assert created.status_code == 202
    job = client.get(created.json()["url"]).json()
    spec = ResourceSpec.parse(client.get(f"/v1/resources/{job['resource_id']}").json())
    assert [n.address for n in spec.nodes] == ["10.0.0.1", "10.0.0.2"]
    assert spec.nodes[0].device == "V100" and spec.network.bandwidth_gbps == 25


def test_bad_autodist_yaml_points_into_body_resources(make_client) -> None:
    client: TestClient = make_client(workers=0)
    body = {"graph": make_mlp_graph().model_dump(mode="json"), "resources": "nodes:\n  - address: a\n    gpu: [0]\n"}
    response = client.post("/v1/optimize", json=body)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "resources", "nodes", 0, "gpu"]
    assert "unknown key" in response.json()["detail"][0]["msg"]


def test_an_invalid_inline_resource_spec_has_no_union_tag_in_its_path(make_client) -> None:
    client: TestClient = make_client(workers=0)
    body = {
        "graph": make_mlp_graph().model_dump(mode="json"),
        "resources": {"nodes": [{"address": "a", "gpus": [0], "bogus": 1}]},
    }
    problems = client.post("/v1/optimize", json=body).json()["detail"]
    assert {"loc": ["body", "resources", "nodes", 0, "bogus"], "msg": "Extra inputs are not permitted"} in problems


def test_optimize_needs_exactly_one_graph_and_one_resources(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph = make_mlp_graph().model_dump(mode="json")
    neither = client.post("/v1/optimize", json={"graph": graph})
    both = client.post("/v1/optimize", json={"graph": graph, "graph_id": "a" * 64, "resources": AUTODIST_YAML})
    assert neither.status_code == both.status_code == 422
    assert (
        "resources: give exactly one of 'resources' and 'resource_id'; neither was given"
        in neither.json()["detail"][0]["msg"]
    )
    assert "graph: give exactly one of 'graph' and 'graph_id'; both were given" in both.json()["detail"][0]["msg"]


def test_optimize_by_unknown_graph_id_is_404_naming_the_field(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/optimize", json={"graph_id": "c" * 64, "resources": AUTODIST_YAML})
    assert response.status_code == 404
    assert response.json()["detail"][0]["loc"] == ["body", "graph_id"]
