"""Trials: recorded by clients or run by jobs, every one a row; a measured winner beats a predicted one."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_cpu_cluster, make_mlp_graph, make_t4_cluster
from service_helpers import fake_executor, optimize_body, record_trial, service_settings, upload

from optimizer_service.app import create_app
from optimizer_service.jobs.trials import workload_for
from stratagem.builders import AllReduce, DataParallel
from stratagem.ir import Strategy
from trial_runner import Outcome, ReplayWorkload, TrialSpec, ZooWorkload


def test_a_trial_measured_elsewhere_is_recorded_with_its_summaries(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, resources = make_mlp_graph(batch_size=16), make_t4_cluster(2)
    strategy = DataParallel().build(graph, resources)
    trial = record_trial(
        client, graph, resources, strategy, step_times_s=[0.4, 0.1, 0.2, 0.3, 0.5], peak_memory_bytes=1e9
    )
    graph_id = trial["graph_id"]
    assert (trial["outcome"], trial["median_s"], trial["p90_s"], trial["backend"]) == ("ok", 0.3, 0.5, "external")
    assert trial["samples_per_s"] == pytest.approx(16 * 8 / 0.3)
    assert trial["strategy_id"] == strategy.id
    assert Strategy.parse(client.get(f"/v1/strategies/{strategy.id}").json()).id == strategy.id
    listed = client.get("/v1/trials", params={"graph_id": graph_id}).json()
    assert listed["count"] == 1 and listed["data"][0]["id"] == trial["id"]
    assert client.get(f"/v1/trials/{trial['id']}").json() == trial


def test_a_failed_trial_is_recorded_without_a_step_time(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, resources = make_mlp_graph(), make_t4_cluster(1)
    strategy = AllReduce().build(graph, resources)
    trial = record_trial(client, graph, resources, strategy, outcome="oom", error="CUDA out of memory on rank 3")
    assert (trial["outcome"], trial["median_s"], trial["error"]) == ("oom", None, "CUDA out of memory on rank 3")


def test_a_trial_is_checked_against_its_graph_and_cluster(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph, resources = make_mlp_graph(), make_t4_cluster(1)
    graph_id, resource_id = upload(client, graph, resources)
    foreign = DataParallel().build(graph, make_t4_cluster(2))
    body = {
        "graph_id": graph_id,
        "resource_id": resource_id,
        "strategy": foreign.model_dump(mode="json"),
        "step_times_s": [0.1],
    }
    response = client.post("/v1/trials", json=body)
    assert response.status_code == 422
    assert any(
        p["loc"][:3] == ["body", "strategy", "replicas"] and "not in the resource spec" in p["msg"]
        for p in response.json()["detail"]
    )
    missing = client.post("/v1/trials", json={**body, "graph_id": "d" * 64})
    assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["body", "graph_id"]
    no_times = client.post("/v1/trials", json={**body, "step_times_s": []})
    assert no_times.status_code == 422 and "needs its step times" in no_times.json()["detail"][0]["msg"]


def test_a_trial_filter_naming_nothing_stored_is_404_not_an_empty_page(make_client) -> None:
    client: TestClient = make_client(workers=0)
    graph_id, _ = upload(client, make_mlp_graph(), make_t4_cluster(1))
    assert client.get("/v1/trials", params={"graph_id": graph_id}).json()["count"] == 0  # stored, no trials yet: empty
    for params, loc in (
        ({"job_id": "00000000-0000-4000-8000-000000000000"}, ["query", "job_id"]),
        ({"graph_id": "e" * 64}, ["query", "graph_id"]),
    ):
        response = client.get("/v1/trials", params=params)
        assert response.status_code == 404 and response.json()["detail"][0]["loc"] == loc, response.text


def test_a_job_with_trials_answers_with_the_fastest_measured_strategy(make_client) -> None:
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    measured: dict[str, float] = {}

    def respond(spec: TrialSpec) -> float | Outcome:
        # Reverse the prediction: the later a candidate is tried, the faster it "runs"; the first one fails.
        # Faster than any prediction, so no untried candidate's interval can clear them (else it would be the answer).
        if not measured:
            measured[spec.strategy.id] = 0.0
            return Outcome.oom
        measured[str(spec.strategy.id)] = 1e-5 / (len(measured) + 1)
        return measured[str(spec.strategy.id)]

    client: TestClient = make_client(trials=fake_executor(respond))
    job = client.post(
        "/v1/optimize", params={"wait": True, "timeout": 60}, json=optimize_body(graph, resources, max_trials=3)
    ).json()
    assert job["status"] == "succeeded", job
    ran = job["result"]["trials_ran"]
    assert job["result"]["answer_basis"] == "measured" and 2 <= ran <= 3 and job["result"]["trials_ok"] == ran - 1
    assert (job["progress"]["trials_done"], job["progress"]["trials_budget"]) == (ran, 3)
    fastest = min((t, s) for s, t in measured.items() if t > 0)[1]
    best = Strategy.parse(client.get(f"{job['url']}/best").json())
    assert (
        best.id == fastest
        and best.measured is not None
        and best.measured.step_time_s == pytest.approx(measured[fastest])
    )
    trials = client.get("/v1/trials", params={"job_id": job["id"]}).json()
    assert trials["count"] == ran
    assert sorted(t["outcome"] for t in trials["data"]) == sorted(["oom"] + ["ok"] * (ran - 1))
    assert all(t["backend"] == "fake" and t["predicted_step_time_s"] for t in trials["data"])
    ranked = client.get(f"{job['url']}/strategies").json()["data"]
    assert ranked[0]["strategy_id"] == fastest and ranked[0]["measured"] is not None


def test_without_a_trial_backend_the_job_says_no_trials_ran(make_client) -> None:
    client: TestClient = make_client()
    job = client.post("/v1/optimize", params={"wait": True, "timeout": 60}, json=optimize_body(max_trials=4)).json()
    assert job["status"] == "succeeded"
    assert job["result"]["trials_ran"] == 0 and job["result"]["answer_basis"] == "predicted"
    assert any("no trial backend is configured" in note for note in job["result"]["notes"])
    best = client.get(f"{job['url']}/best").json()
    assert any("answer basis predicted" in note for note in best["provenance"]["notes"])


def test_a_graph_trains_a_zoo_model_only_when_its_own_shapes_are_that_models() -> None:
    """Provenance names a model to compare against; the graph's variables decide, and nothing it says is built."""
    from stratagem import zoo
    from stratagem.tracing import capture

    graph = make_mlp_graph()
    assert isinstance(workload_for(graph), ReplayWorkload)
    claims_resnet = graph.model_copy(update={"provenance": {"zoo": {"name": "resnet50", "size": "small"}}})
    assert isinstance(workload_for(claims_resnet), ReplayWorkload)
    module, make_batch = zoo.build("dlrm", "small")
    captured = capture(module, make_batch(4), batch_size=4)
    workload = workload_for(captured)
    assert isinstance(workload, ZooWorkload) and (workload.name, workload.size) == ("dlrm", "small")
    assert workload.batch_size == 4 and workload.overrides == {}
    inflated = {**captured.provenance["zoo"], "size": "full", "overrides": {"dim": 4000}}
    steered = workload_for(captured.replace(provenance={**captured.provenance, "zoo": inflated}))
    assert isinstance(steered, ZooWorkload) and (steered.size, steered.overrides) == ("small", {})
    sneaky = graph.model_copy(update={"provenance": {"zoo": {"name": "os:system"}}})
    assert isinstance(workload_for(sneaky), ReplayWorkload)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.timeout(300))])
def test_a_job_runs_a_real_trial_on_the_configured_backend(
    sqlite_url: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settings alone pick the backend: two gloo ranks as local processes, or two actors on a local Ray."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    graph, resources = make_mlp_graph(batch_size=8, widths=(64, 32, 8)), make_cpu_cluster(2)
    settings = service_settings(sqlite_url, trials_backend=backend, trial_warmup=1, trial_steps=3, trial_timeout_s=120)
    with TestClient(create_app(settings)) as client:
        job = client.post(
            "/v1/optimize", params={"wait": True, "timeout": 240}, json=optimize_body(graph, resources, max_trials=1)
        ).json()
        trials = client.get("/v1/trials", params={"job_id": job["id"]}).json()["data"]
    assert job["status"] == "succeeded", job
    assert len(trials) == 1 and trials[0]["outcome"] == "ok" and trials[0]["backend"] == backend, trials
    assert len(trials[0]["step_times_s"]) == 3 and trials[0]["median_s"] > 0
    assert job["result"]["answer_basis"] == "measured"
