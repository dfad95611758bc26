"""`/v1/strategies/{id}`: the stored JSON, or AutoDist's text, or a 422 saying why AutoDist cannot express it."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster
from service_helpers import record_trial

from stratagem.builders import PS
from stratagem.ir import ShardedSynchronizer, Strategy


def test_a_strategy_comes_back_as_json_and_as_autodist_text(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    strategy = PS().build(graph, resources)
    record_trial(client, graph, resources, strategy, step_times_s=[0.2])
    assert Strategy.parse(client.get(f"/v1/strategies/{strategy.id}").json()) == strategy
    text = client.get(f"/v1/strategies/{strategy.id}", params={"format": "autodist"})
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    assert text.text == strategy.to_autodist()
    assert "PSSynchronizer" in text.text


def test_a_strategy_autodist_cannot_express_is_422_with_the_reason(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    base = PS().build(graph, resources)
    sharded = base.replace(
        variables=[v.model_copy(update={"synchronizer": ShardedSynchronizer()}) for v in base.variables]
    )
    record_trial(client, graph, resources, sharded, step_times_s=[0.2])
    response = client.get(f"/v1/strategies/{sharded.id}", params={"format": "autodist"})
    assert response.status_code == 422
    assert "AutoDist" in response.json()["detail"] and "sharded" in response.json()["detail"]
    assert client.get(f"/v1/strategies/{sharded.id}", params={"format": "yaml"}).status_code == 422
