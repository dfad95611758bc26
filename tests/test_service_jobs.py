"""Jobs end to end over HTTP: submit, follow, rank, answer, cancel, time out, and refuse when full."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster
from service_helpers import QUICK_SEARCH, optimize_body, slow_search, wait_for

from stratagem.client import render_progress
from stratagem.ir import ModelGraph, ResourceSpec, Strategy


def test_a_job_runs_to_a_valid_best_strategy(make_client) -> None:
    client: TestClient = make_client()
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    response = client.post("/v1/optimize", params={"wait": True, "timeout": 60}, json=optimize_body(graph, resources))
    assert response.status_code == 200, response.text
    job = response.json()
    assert (job["status"], job["phase"], job["error"]) == ("succeeded", "done", None)
    assert job["progress"]["candidates_evaluated"] >= 1
    assert job["result"]["answer_basis"] == "predicted"
    assert any("no trials ran" in note for note in job["result"]["notes"])
    best = Strategy.parse(client.get(f"{job['url']}/best").json())
    best.validate_for(graph, resources)
    assert best.id == job["best_strategy_id"]
    assert best.predicted is not None and best.predicted.step_time_s > 0


def test_the_answer_comes_first_then_candidates_by_predicted_step_time(make_client) -> None:
    client: TestClient = make_client()
    job = client.post(
        "/v1/optimize", params={"wait": True, "timeout": 60}, json=optimize_body(make_embedding_graph())
    ).json()
    candidates = client.get(f"{job['url']}/strategies").json()
    assert candidates["count"] >= 2
    assert [c["rank"] for c in candidates["data"]] == list(range(1, candidates["count"] + 1))
    feasible = [c["predicted"]["step_time_s"] for c in candidates["data"][1:] if c["predicted"]["feasible"]]
    assert feasible == sorted(feasible)
    assert candidates["data"][0]["strategy_id"] == job["best_strategy_id"] == job["result"]["decision"]["chosen"]
    assert {c["source"] for c in candidates["data"]} & {"AllReduce", "PS", "DataParallel", "Parallax", "search"}
    for candidate in candidates["data"]:
        assert Strategy.parse(candidate["strategy"]).id == candidate["strategy_id"]


def test_submitting_without_wait_answers_202_with_the_job_url(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/optimize", json=optimize_body())
    assert response.status_code == 202
    created = response.json()
    assert response.headers["location"] == created["url"]
    job = client.get(created["url"]).json()
    assert (job["status"], job["phase"]) == ("queued", "queued")
    assert job["options"]["search"]["max_candidates"] == QUICK_SEARCH["max_candidates"]
    assert job["options"]["max_trials"] == 0


def test_wait_that_runs_out_answers_202(make_client) -> None:
    client: TestClient = make_client(workers=0)
    started = time.monotonic()
    response = client.post("/v1/optimize", params={"wait": True, "timeout": 0.3}, json=optimize_body())
    assert response.status_code == 202
    assert 0.3 <= time.monotonic() - started < 10


def test_a_wait_timeout_that_is_not_a_number_says_so_and_queues_nothing(make_client) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/optimize", params={"wait": True, "timeout": "nan"}, json=optimize_body())
    assert response.status_code == 422
    assert response.json()["detail"] == [{"loc": ["query", "timeout"], "msg": "Input should be a finite number"}]
    assert client.get("/v1/jobs").json()["count"] == 0


def test_a_queued_job_already_shows_its_trial_budget(make_client) -> None:
    # 'trials 0/0' while waiting for a worker read as if no trial would run
    client: TestClient = make_client(workers=0)
    url = client.post("/v1/optimize", json=optimize_body(max_trials=3)).json()["url"]
    job = client.get(url).json()
    assert job["status"] == "queued"
    assert (job["progress"]["trials_done"], job["progress"]["trials_budget"]) == (0, 3)
    assert render_progress(job).endswith("trials 0/3")


def test_jobs_list_filters_by_status_and_pages(make_client) -> None:
    client: TestClient = make_client(workers=0)
    ids = [
        client.post("/v1/optimize", json=optimize_body(make_mlp_graph(batch_size=b))).json()["id"] for b in (4, 8, 16)
    ]
    client.post(f"/v1/jobs/{ids[0]}/cancel")
    queued = client.get("/v1/jobs", params={"status": "queued"}).json()
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}).json()
    assert {j["id"] for j in queued["data"]} == set(ids[1:]) and queued["count"] == 2
    assert [j["id"] for j in cancelled["data"]] == [ids[0]]
    page = client.get("/v1/jobs", params={"limit": 1, "offset": 1}).json()
    assert (page["count"], len(page["data"])) == (3, 1)
    assert client.get("/v1/jobs", params={"status": "sleeping"}).status_code == 422


def test_cancelling_a_queued_job_is_immediate(make_client) -> None:
    client: TestClient = make_client(workers=0)
    job_id = client.post("/v1/optimize", json=optimize_body()).json()["id"]
    assert "has no answer yet (it is queued)" in client.get(f"/v1/jobs/{job_id}/best").json()["detail"]
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["finished_at"] is not None
    best = client.get(f"/v1/jobs/{job_id}/best")
    assert best.status_code == 409
    assert "has no answer and will get none (it is cancelled" in best.json()["detail"]  # not "yet": it has ended


def test_cancelling_a_running_job_stops_it_at_its_next_check(make_client) -> None:
    client: TestClient = make_client(search=slow_search)
    url = client.post("/v1/optimize", json=optimize_body()).json()["url"]
    running = wait_for(client, url, {"running"})
    assert running["worker_id"]
    assert client.post(f"{url}/cancel").json()["cancel_requested"] is True
    job = wait_for(client, url, {"cancelled", "failed", "succeeded"}, timeout_s=20)
    assert job["status"] == "cancelled"
    assert job["error"] == "cancelled on request"
    assert job["phase"] == "searching" and job["finished_at"] is not None


def test_a_job_past_its_time_limit_fails_saying_so(make_client) -> None:
    client: TestClient = make_client(search=slow_search, job_timeout_s=0.5)
    url = client.post("/v1/optimize", json=optimize_body()).json()["url"]
    job = wait_for(client, url, {"failed", "succeeded", "cancelled"}, timeout_s=20)
    assert job["status"] == "failed"
    assert "past its limit of 0 s" in job["error"] or "past its limit of 1 s" in job["error"]


def test_progress_is_visible_while_the_job_runs(make_client) -> None:
    client: TestClient = make_client(search=slow_search)
    url = client.post("/v1/optimize", json=optimize_body()).json()["url"]
    wait_for(client, url, {"running"})
    deadline = time.monotonic() + 10
    seen = 0
    while time.monotonic() < deadline and seen < 50:
        job = client.get(url).json()
        seen = job["progress"].get("candidates_evaluated", 0)
        time.sleep(0.05)
    assert job["phase"] == "searching" and seen >= 50
    assert job["heartbeat_at"] is not None
    client.post(f"{url}/cancel")


def test_a_full_queue_answers_429_with_retry_after(make_client) -> None:
    client: TestClient = make_client(workers=0, max_queue_length=2, retry_after_s=7)
    for _ in range(2):
        assert client.post("/v1/optimize", json=optimize_body()).status_code == 202
    response = client.post("/v1/optimize", json=optimize_body())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert "queue is full (2 queued, limit 2)" in response.json()["detail"]
    assert client.get("/v1/jobs").json()["count"] == 2


def test_unknown_jobs_are_404_and_malformed_ids_422(make_client) -> None:
    client: TestClient = make_client(workers=0)
    missing = "00000000-0000-4000-8000-000000000000"
    for path in (f"/v1/jobs/{missing}", f"/v1/jobs/{missing}/best", f"/v1/jobs/{missing}/strategies"):
        assert client.get(path).status_code == 404, path
    assert client.post(f"/v1/jobs/{missing}/cancel").status_code == 404
    assert client.get("/v1/jobs/not-a-uuid").status_code == 422


def test_a_job_with_a_failing_search_fails_with_its_message(make_client) -> None:
    def broken_search(graph: ModelGraph, resources: ResourceSpec, **_: Any) -> Any:
        raise ValueError("the space is empty for this cluster")

    client: TestClient = make_client(search=broken_search)
    job = client.post("/v1/optimize", params={"wait": True, "timeout": 30}, json=optimize_body()).json()
    assert job["status"] == "failed"
    assert "ValueError" in job["error"] and "the space is empty" in job["error"]
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("max_trials", [None, 3])
def test_options_are_stored_resolved_with_service_defaults(make_client, max_trials: int | None) -> None:
    client: TestClient = make_client(workers=0, search_top_k=4, max_trials=2)
    body = optimize_body()
    body["search"] = {"seed": 9}
    if max_trials is not None:
        body["max_trials"] = max_trials
    job = client.get(client.post("/v1/optimize", json=body).json()["url"]).json()
    assert job["options"]["search"]["top_k"] == 4 and job["options"]["search"]["seed"] == 9
    assert job["options"]["max_trials"] == (2 if max_trials is None else max_trials)
