"""`/metrics` speaks Prometheus text with request counts and job gauges, per app, and `/healthz` tells the truth."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sample_documents import make_mlp_graph, make_t4_cluster


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_requests_by_route_and_jobs_by_status(make_client) -> None:
    client: TestClient = make_client(workers=0)
    body = {"graph": make_mlp_graph().model_dump(mode="json"), "resources": make_t4_cluster(1).model_dump(mode="json")}
    for _ in range(3):
        client.post("/v1/optimize", json=body)
    client.get("/v1/jobs")
    found = samples(client)
    assert (
        found[("stratagem_http_requests_total", (("method", "POST"), ("route", "/v1/optimize"), ("status", "202")))]
        == 3
    )
    assert found[("stratagem_http_requests_total", (("method", "GET"), ("route", "/v1/jobs"), ("status", "200")))] == 1
    assert found[("stratagem_jobs", (("status", "queued"),))] == 3
    assert found[("stratagem_jobs", (("status", "running"),))] == 0
    assert found[("stratagem_queue_length", ())] == 3
    assert (
        found[("stratagem_http_request_duration_seconds_count", (("method", "POST"), ("route", "/v1/optimize")))] == 3
    )


def test_two_apps_in_one_process_keep_separate_registries(make_client) -> None:
    first: TestClient = make_client(workers=0)
    second: TestClient = make_client(workers=0)
    first.get("/v1/graphs")
    first.get("/v1/graphs")
    second.get("/v1/graphs")
    key = ("stratagem_http_requests_total", (("method", "GET"), ("route", "/v1/graphs"), ("status", "200")))
    assert (samples(first)[key], samples(second)[key]) == (2, 1)


def test_healthz_reports_the_database_and_workers(make_client) -> None:
    health = make_client(workers=2).get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "database": "ok", "workers": 2, "version": health.json()["version"]}
