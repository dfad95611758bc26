"""How the service fails: 413 for big bodies, 401 without the key, JSON 500s with a request id, no partial writes."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster

from optimizer_service.core.cost_model import TrainedCostModel, TrialSample


def test_a_declared_content_length_over_the_limit_is_413(make_client) -> None:
    client: TestClient = make_client(workers=0, max_body_bytes=1000)
    body = make_mlp_graph().model_dump_json().encode()
    assert len(body) > 1000
    response = client.post("/v1/graphs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "limit is 1000 bytes" in response.json()["detail"]
    assert client.get("/v1/graphs").json()["count"] == 0


def test_a_streamed_body_without_length_is_cut_off_at_the_limit(make_client) -> None:
    client: TestClient = make_client(workers=0, max_body_bytes=1000)
    body = make_mlp_graph().model_dump_json().encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 300):
            yield body[start : start + 300]

    response = client.post("/v1/graphs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "more than 1000 bytes received" in response.json()["detail"]


def test_a_body_under_the_limit_streamed_in_chunks_is_accepted(make_client) -> None:
    client: TestClient = make_client(workers=0)
    body = make_mlp_graph().model_dump_json().encode()
    response = client.post(
        "/v1/graphs", content=iter([body[:100], body[100:]]), headers={"content-type": "application/json"}
    )
    assert response.status_code == 201


def test_writes_need_the_api_key_when_one_is_set_but_reads_stay_open(make_client) -> None:
    client: TestClient = make_client(workers=0, api_key="s3cret")
    graph = make_mlp_graph().model_dump(mode="json")
    missing = client.post("/v1/graphs", json=graph)
    wrong = client.post("/v1/graphs", json=graph, headers={"Authorization": "Bearer nope"})
    right = client.post("/v1/graphs", json=graph, headers={"Authorization": "Bearer s3cret"})
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 201)
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "API key is required" in missing.json()["detail"]
    assert client.get("/v1/graphs").status_code == 200
    assert client.post(f"/v1/jobs/{'0' * 8}-0000-4000-8000-{'0' * 12}/cancel").status_code == 401


def test_reads_can_require_the_key_too(make_client) -> None:
    client: TestClient = make_client(workers=0, api_key="s3cret", read_requires_key=True)
    assert client.get("/v1/graphs").status_code == 401
    assert client.get("/v1/graphs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/healthz").status_code == 200


class ExplodingTrainer:
    def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel:
        raise RuntimeError("the trainer fell over")


def test_an_unexpected_error_is_a_json_500_with_a_request_id_and_a_logged_trace(
    make_client, caplog: pytest.LogCaptureFixture
) -> None:
    client: TestClient = make_client(workers=0, cost_model_trainer=ExplodingTrainer())
    graph, resources = make_mlp_graph(), make_t4_cluster(1)
    graph_id = client.post("/v1/graphs", json=graph.model_dump(mode="json")).json()["id"]
    resource_id = client.post("/v1/resources", json=resources.model_dump(mode="json")).json()["id"]
    from stratagem.builders import DataParallel

    strategy = DataParallel().build(graph, resources)
    recorded = client.post(
        "/v1/trials",
        json={
            "graph_id": graph_id,
            "resource_id": resource_id,
            "strategy": strategy.model_dump(mode="json"),
            "step_times_s": [0.1],
        },
    )
    assert recorded.status_code == 201
    with caplog.at_level(logging.ERROR):
        response = client.post("/v1/cost-model/retrain", headers={"X-Request-ID": "req-42"})
    assert response.status_code == 500
    assert response.json() == {
        "detail": "internal server error; the service logged the details under this request id",
        "request_id": "req-42",
    }
    assert response.headers["x-request-id"] == "req-42"
    assert "Traceback" not in response.text and "fell over" not in response.text
    assert any("req-42" in record.getMessage() and record.exc_info for record in caplog.records)
    assert client.get("/v1/cost-model").json()["count"] == 0


def test_every_response_carries_a_request_id(make_client) -> None:
    client: TestClient = make_client(workers=0)
    first, second = client.get("/healthz"), client.get("/v1/graphs/" + "0" * 64)
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert second.json()["request_id"] == second.headers["x-request-id"]


def test_a_failed_submission_leaves_nothing_behind(make_client) -> None:
    client: TestClient = make_client(workers=0, max_queue_length=1)
    client.post(
        "/v1/optimize",
        json={
            "graph": make_mlp_graph().model_dump(mode="json"),
            "resources": make_t4_cluster(1).model_dump(mode="json"),
        },
    )
    other_graph = make_mlp_graph(batch_size=3)
    refused = client.post(
        "/v1/optimize",
        json={"graph": other_graph.model_dump(mode="json"), "resources": make_t4_cluster(3).model_dump(mode="json")},
    )
    assert refused.status_code == 429
    assert client.get(f"/v1/graphs/{other_graph.id}").status_code == 404
    assert client.get("/v1/resources").json()["count"] == 1


@pytest.mark.parametrize(
    ("content", "headers", "message"),
    [
        (
            b'{"graph_id": "ab',
            {"content-type": "application/json"},
            "the body is not valid JSON: Unterminated string starting at line 1 column 14 (char 13)",
        ),
        (
            b'{\n  "max_trials": 4,\n  "device": }',
            {"content-type": "application/json"},
            "the body is not valid JSON: Expecting value at line 3 column 13 (char 33)",
        ),
        (b"", {"content-type": "application/json"}, "the body is empty; expected a JSON object"),
        (
            b'{"graph_id": "ab"}',
            {"content-type": "application/x-www-form-urlencoded"},
            "the body was not read as JSON: send it with 'Content-Type: application/json'",
        ),
    ],
)
def test_a_body_that_is_not_a_json_object_says_what_the_client_sent(
    make_client, content: bytes, headers: dict[str, str], message: str
) -> None:
    # the parser's offset is no field path, and "Field required" / "a valid dictionary" describe the model, not the request
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/optimize", content=content, headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"] == [{"loc": ["body"], "msg": message}]
