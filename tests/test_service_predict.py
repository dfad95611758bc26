"""`POST /v1/predict`, the trainer-config formats of `GET /v1/strategies/{id}`, and the strategy page's downloads,
through the real service."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from layout_helpers import gpt_graph, gpu_cluster, mixed_shard_synchronizers
from sample_documents import make_mlp_graph, make_t4_cluster
from served import Served
from service_helpers import STALL_S, large_graph_body, record_trial

from optimizer_service.core.ingest import INLINE_BYTES
from stratagem import Layout
from stratagem.builders import PS, AllReduce


def _documents() -> dict[str, object]:
    return {"graph": gpt_graph().model_dump(mode="json"), "resources": gpu_cluster(2, 8).model_dump(mode="json")}


def test_layouts_and_strategies_are_priced_in_the_order_given(make_client) -> None:
    client: TestClient = make_client(workers=0)
    strategy = AllReduce().build(gpt_graph(), gpu_cluster(2, 8))
    body = {
        **_documents(),
        "layouts": ["tp=2,pp=2,gbs=64", Layout(tensor=4).model_dump(mode="json")],
        "strategies": [strategy.model_dump(mode="json")],
    }
    response = client.post("/v1/predict", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["count"] == 3 and answer["graph_id"] == gpt_graph().id
    assert [p["label"] for p in answer["data"]] == [
        "dp=4,tp=2,pp=2,mb=2,gbs=64",
        "dp=4,tp=4,mb=2,gbs=8",
        "dp=16,mb=2,gbs=32",
    ]
    assert all(p["step_time_s"] > 0 and p["tokens_per_s"] > 0 for p in answer["data"])
    assert answer["data"][2]["strategy_id"] == strategy.id


def test_the_graph_and_cluster_can_be_named_by_id_or_given_as_autodist_yaml(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph_id = client.post("/v1/graphs", json=_documents()["graph"]).json()["id"]
    resource_id = client.post("/v1/resources", json=_documents()["resources"]).json()["id"]
    by_id = client.post("/v1/predict", json={"graph_id": graph_id, "resource_id": resource_id, "layouts": ["tp=2"]})
    assert by_id.status_code == 200 and by_id.json()["resource_id"] == resource_id
    spec = "nodes:\n  - address: 10.0.0.1\n    gpus: [0, 1, 2, 3]\n    chief: true\n"
    yaml_body = {"graph_id": graph_id, "resources": spec, "device": "A100-80GB", "layouts": ["dp=4"]}
    answer = client.post("/v1/predict", json=yaml_body)
    assert answer.status_code == 200 and answer.json()["data"][0]["devices"] == 4


def _problems(response) -> list[tuple[list, str]]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    return [(item["loc"], item["msg"]) for item in detail] if isinstance(detail, list) else [([], detail)]


def test_a_bad_layout_is_422_at_its_place_in_the_request(make_client) -> None:
    client: TestClient = make_client(workers=0)
    parse = _problems(client.post("/v1/predict", json={**_documents(), "layouts": ["dp=16", "tp=banana"]}))
    assert parse[0][0] == ["body", "layouts", 1, "tensor"]
    build = _problems(client.post("/v1/predict", json={**_documents(), "layouts": ["dp=16", "tp=3"]}))
    assert build == [(["body", "layouts", 1, "data"], "tensor(3)*pipeline(1)*context(1)=3 does not divide devices(16)")]
    heads = _problems(client.post("/v1/predict", json={**_documents(), "layouts": ["tp=8"]}))
    assert heads == [(["body", "layouts", 0, "tensor"], "tensor(8) does not divide heads(4)")]


def test_a_strategy_the_simulator_cannot_price_is_422_at_its_place(make_client) -> None:
    client: TestClient = make_client(workers=0)
    mixed = mixed_shard_synchronizers(gpt_graph(), gpu_cluster(2, 8))
    body = {**_documents(), "layouts": ["dp=16"], "strategies": [mixed.model_dump(mode="json")]}
    [(loc, message)] = _problems(client.post("/v1/predict", json=body))
    assert loc == ["body", "strategies", 0] and "different synchronizer kinds" in message
    foreign = PS().build(make_mlp_graph(), make_t4_cluster(2))
    body = {**_documents(), "strategies": [foreign.model_dump(mode="json")]}
    problems = _problems(client.post("/v1/predict", json=body))
    assert problems[0][0][:3] == ["body", "strategies", 0] and "made for graph" in problems[0][1]


def test_the_request_needs_one_graph_one_cluster_and_1_to_64_items(make_client) -> None:
    client: TestClient = make_client(workers=0)
    both = {**_documents(), "graph_id": "0" * 64, "layouts": ["dp=16"]}
    assert (
        "give exactly one of 'graph' and 'graph_id'; both were given"
        in _problems(client.post("/v1/predict", json=both))[0][1]
    )
    assert "got 0" in _problems(client.post("/v1/predict", json=_documents()))[0][1]
    many = _problems(client.post("/v1/predict", json={**_documents(), "layouts": ["dp=16"] * 65}))
    assert many[0][0] == ["body", "layouts"]
    missing = client.post(
        "/v1/predict", json={"graph_id": "a" * 64, "resources": _documents()["resources"], "layouts": ["dp=16"]}
    )
    assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["body", "graph_id"]


def test_a_stored_strategy_downloads_as_each_trainers_config(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    strategy = Layout.from_string("tp=2,sp,zero=3,mb=2,gbs=64,precision=amp-bf16").build(graph, cluster)
    record_trial(client, graph, cluster, strategy, step_times_s=[0.2])
    url = f"/v1/strategies/{strategy.id}"
    titan = client.get(url, params={"format": "torchtitan"})
    assert titan.status_code == 200 and titan.headers["content-type"].startswith("application/toml")
    assert f'filename="strategy-{strategy.id[:12]}-torchtitan.toml"' in titan.headers["content-disposition"]
    assert tomllib.loads(titan.text)["training"]["global_batch_size"] == 64
    assert Layout.from_torchtitan(titan.text).build(graph, cluster).id == strategy.id
    deepspeed = client.get(url, params={"format": "deepspeed"})
    assert deepspeed.status_code == 422 and "sequence parallelism" in deepspeed.json()["detail"]
    megatron = client.get(url, params={"format": "megatron"})
    assert megatron.status_code == 200 and "--sequence-parallel" in megatron.text
    assert Layout.from_megatron(megatron.text.replace("\\\n", " ")).build(graph, cluster).id == strategy.id
    accelerate = client.get(url, params={"format": "accelerate"})
    assert accelerate.status_code == 422 and "tp_plan" in accelerate.json()["detail"]
    plain = Layout.from_string("dp=16,zero=2,mb=2,gbs=32").build(graph, cluster)
    record_trial(client, graph, cluster, plain, step_times_s=[0.2])
    config = json.loads(client.get(f"/v1/strategies/{plain.id}", params={"format": "deepspeed"}).text)
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True} and config["train_batch_size"] == 32
    assert (
        yaml.safe_load(client.get(f"/v1/strategies/{plain.id}", params={"format": "accelerate"}).text)["num_machines"]
        == 2
    )


def test_the_strategy_page_offers_each_download_or_says_why_not(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, cluster = gpt_graph(), gpu_cluster(2, 8)
    strategy = Layout.from_string("tp=2,sp,zero=3,mb=2,gbs=64,precision=amp-bf16").build(graph, cluster)
    record_trial(client, graph, cluster, strategy, step_times_s=[0.2])
    page = client.get(f"/strategies/{strategy.id}").text
    assert f"/v1/strategies/{strategy.id}?format=torchtitan" in page
    assert f"/v1/strategies/{strategy.id}?format=megatron" in page
    assert f"/v1/strategies/{strategy.id}?format=deepspeed" not in page
    assert "DeepSpeed JSON (cannot express it)" in page and "dp=8,tp=2,mb=2,gbs=64,zero=3" in page


def test_a_large_inline_graph_is_priced_by_the_ingestor_like_an_optimize_body(make_client) -> None:
    """Over the inline limit the body is parsed, validated and priced in the parser process, not on the
    event loop; the answer is the same as for the graph stored and named by id."""
    client: TestClient = make_client(workers=0)
    body = large_graph_body(4000)
    assert len(body) > INLINE_BYTES
    cluster = json.dumps(make_t4_cluster(2).model_dump(mode="json"))
    inline = b'{"graph": ' + body + b', "resources": ' + cluster.encode() + b', "layouts": ["dp=8", "tp=3"]}'
    refused = client.post("/v1/predict", content=inline, headers={"content-type": "application/json"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "layouts", 1, "data"]
    inline = inline.replace(b', "tp=3"]', b"]")
    answer = client.post("/v1/predict", content=inline, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert client.app.state.stratagem.ingest.in_memory is False
    graph_id = client.post("/v1/graphs", content=body, headers={"content-type": "application/json"}).json()["id"]
    by_id = client.post(
        "/v1/predict", json={"graph_id": graph_id, "resources": json.loads(cluster), "layouts": ["dp=8"]}
    )
    assert answer.json() == by_id.json() and answer.json()["graph_id"] == graph_id


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_healthz_keeps_answering_while_a_large_inline_graph_is_priced(sqlite_url: str, tmp_path: Path) -> None:
    body = large_graph_body(100_000)
    cluster = json.dumps(make_t4_cluster(2).model_dump(mode="json")).encode()
    request = b'{"graph": ' + body + b', "resources": ' + cluster + b', "layouts": ["dp=8"]}'
    served = Served(sqlite_url, tmp_path / "service.log", workers=0)
    try:
        served.wait_healthy()
        priced, _, latencies = served.post_watching_health("/v1/predict", request)
    finally:
        served.stop()
    assert priced.status_code == 200, priced.text[:300]
    assert len(latencies) > 10 and max(latencies) < STALL_S, latencies
