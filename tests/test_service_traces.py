"""Operator traces over HTTP: uploaded with their graph, stored once, fetched back, refused clearly."""

from __future__ import annotations

import base64
import gzip
import io
import json

import pytest
import torch
from fastapi.testclient import TestClient
from service_helpers import served
from torch import nn

import stratagem
from optimizer_service.core.graph_upload import MAX_TRACE_BYTES
from stratagem.ir import ModelGraph
from stratagem.tracing import capture
from stratagem.tracing.optrace import OperatorTrace


def _captured() -> ModelGraph:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return capture(model, (torch.randn(4, 6),), batch_size=4)


def _upload_body(graph: ModelGraph, trace: OperatorTrace | None = None) -> dict:
    trace = trace or graph.trace
    return {"graph": graph.model_dump(mode="json"), "trace": base64.b64encode(trace.to_bytes()).decode()}


def test_a_graph_uploaded_with_its_trace_stores_both_and_serves_the_trace_back(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph = _captured()
    first = client.post("/v1/graphs", json=_upload_body(graph))
    second = client.post("/v1/graphs", json=_upload_body(graph))
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == graph.id
    assert client.get(f"/v1/graphs/{graph.id}").json()["trace_id"] == graph.trace_id
    served_trace = client.get(f"/v1/graphs/{graph.id}/trace")
    assert served_trace.status_code == 200 and served_trace.headers["content-type"] == "application/gzip"
    assert OperatorTrace.from_bytes(served_trace.content) == graph.trace


def test_a_graph_alone_is_stored_as_before_and_has_no_trace_to_serve(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph = _captured()
    assert client.post("/v1/graphs", json=graph.model_dump(mode="json")).status_code == 201
    missing = client.get(f"/v1/graphs/{graph.id}/trace")
    assert missing.status_code == 404 and "operator trace" in missing.text
    untraced = ModelGraph.parse(graph.model_dump(mode="json", exclude={"id", "trace_id"}))
    assert client.post("/v1/graphs", json=untraced.model_dump(mode="json")).status_code == 201
    assert client.get(f"/v1/graphs/{untraced.id}/trace").status_code == 404


def _bad_uploads() -> list[tuple[str, object, list, str]]:
    graph = _captured()
    body = _upload_body(graph)
    other = capture(nn.Sequential(nn.Linear(2, 2)), (torch.randn(1, 2),), batch_size=1).trace
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as stream:
        stream.write(b"[" * (300 << 20))
    not_json = base64.b64encode(gzip.compress(b"not json")).decode()
    malformed = json.loads(graph.trace.model_dump_json(exclude={"id"}))
    malformed["forward"][0]["op"] = "import os"
    return [
        ("not base64", {**body, "trace": "%%%"}, ["body", "trace"], "not base64"),
        ("not gzip JSON", {**body, "trace": not_json}, ["body", "trace"], ""),
        ("too big", {**body, "trace": "A" * (MAX_TRACE_BYTES * 4 // 3 + 8)}, ["body", "trace"], "the limit is"),
        ("a bomb", {**body, "trace": base64.b64encode(bomb.getvalue()).decode()}, ["body", "trace"], "decompresses"),
        ("another graph's", _upload_body(graph, other), ["body", "graph", "trace_id"], "the trace's id"),
        (
            "malformed",
            {**body, "trace": base64.b64encode(gzip.compress(json.dumps(malformed).encode())).decode()},
            ["body", "trace"],
            "forward[0].op: 'import os' is not an op name",
        ),
        ("unknown field", {**body, "extra": 1}, ["body", "extra"], "unknown field"),
        ("a broken graph", {**body, "graph": {"layers": []}}, ["body", "graph"], ""),
    ]


@pytest.mark.parametrize("case", _bad_uploads(), ids=lambda case: case[0])
def test_a_bad_trace_upload_is_a_422_naming_the_field(make_client, case) -> None:
    client: TestClient = make_client(workers=0, max_body_bytes=64 << 20)  # the trace's own limit speaks first
    _, body, loc, message = case
    response = client.post("/v1/graphs", json=body)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(item["loc"][: len(loc)] == loc and message in item["msg"] for item in detail), detail
    assert client.get("/v1/graphs").json()["count"] == 0


def test_the_sdk_uploads_the_trace_beside_the_graph_and_reads_it_back(tmp_path) -> None:
    graph = _captured()
    with served(f"sqlite:///{tmp_path / 'service.db'}") as url, stratagem.Client(url) as client:
        assert client.upload_graph(graph) == graph.id
        assert client.graph_trace(graph.id) == graph.trace
        fetched = client.graph(graph.id)
        assert fetched.trace_id == graph.trace_id and fetched.trace is None


def test_a_jobs_trials_replay_the_stored_trace_and_its_notes_say_so(make_client) -> None:
    from service_helpers import fake_executor, optimize_body

    from stratagem.ir import Node, ResourceSpec
    from trial_runner import TrialSpec

    seen: list[str | None] = []

    def respond(spec: TrialSpec) -> float:
        seen.append(spec.workload.trace.id if getattr(spec.workload, "trace", None) is not None else None)
        return 0.01

    client: TestClient = make_client(trials=fake_executor(respond))
    graph = _captured()
    assert client.post("/v1/graphs", json=_upload_body(graph)).status_code == 201
    cluster = ResourceSpec(nodes=[Node(address="10.0.0.1", chief=True, cpus=[0, 1])])
    body = {**optimize_body(graph, cluster, max_trials=1), "graph_id": graph.id}
    del body["graph"]
    job = client.post("/v1/optimize", params={"wait": True, "timeout": 60}, json=body).json()
    assert job["status"] == "succeeded", job
    assert seen and seen[0] == graph.trace_id
    notes = " ".join(job["progress"]["notes"])
    assert "operator trace" in notes and "forward" in notes
