"""Answers a user can trust, through the real job pipeline on SQLite and PostgreSQL: the rule that decided,
the re-levelled predictions after a far first trial, variants, and the user's current configuration."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster
from service_helpers import fake_executor, optimize_body

from optimizer_service.search.simplicity import Rule
from stratagem.builders import PS
from stratagem.ir import Strategy
from trial_runner import TrialSpec

pytest_plugins = ["service_fixtures"]

MISS = 2.0
"""The fake cluster runs every strategy at twice its prediction: an uncalibrated cluster."""


def _slow_cluster(spec: TrialSpec) -> float:
    assert spec.strategy.predicted is not None
    return spec.strategy.predicted.step_time_s * MISS


def _run(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/optimize", params={"wait": True, "timeout": 90}, json=optimize_body(**body))
    job = response.json()
    assert response.status_code == 200 and job["status"] == "succeeded", job
    return job


def test_a_job_names_the_rule_that_decided_and_re_levels_after_a_far_first_trial(make_client) -> None:
    client: TestClient = make_client(trials=fake_executor(_slow_cluster))
    job = _run(client, max_trials=3, current="dp=8")
    result = job["result"]
    decision = result["decision"]
    assert decision["rule"] in {rule.value for rule in Rule}
    assert decision["chosen"] == job["best_strategy_id"] and decision["basis"] == "measured"
    assert f"answer: {decision['reason']}" in result["notes"]

    relevel = result["relevel"]
    trials = client.get("/v1/trials", params={"job_id": job["id"]}).json()["data"]
    first = min(trials, key=lambda t: t["created_at"])
    assert relevel["applied"] and relevel["factor"] == pytest.approx(MISS)
    assert relevel["trial_strategy_id"] == first["strategy_id"] and relevel["measured_s"] == first["median_s"]
    assert any("re-levelled by 2.00×" in note for note in result["notes"])

    ranked = client.get(f"{job['url']}/candidates").json()["data"]
    assert ranked == client.get(f"{job['url']}/strategies").json()["data"]
    assert ranked[0]["strategy_id"] == job["best_strategy_id"]
    feasible = [c for c in ranked if c["predicted"]["feasible"]]
    assert "current" in {c["source"] for c in feasible}, "re-levelled like every untried candidate"
    for candidate in feasible:
        predicted = candidate["predicted"]["step_time_s"]
        assert candidate["relevelled_step_time_s"] == pytest.approx(MISS * predicted), candidate["source"]
        if candidate["measured"] is not None:
            assert candidate["measured"]["step_time_s"] == pytest.approx(MISS * predicted)
    assert sum(c["measured"] is not None for c in ranked) == len(trials)

    page = client.get(f"/jobs/{job['id']}").text
    assert "Re-levelled" in page and "data-relevelled" in page and decision["rule"].replace("_", " ") in page
    assert page.count("data-relevelled>") == len(ranked)


def test_near_copies_come_back_as_one_candidate_with_variants(make_client) -> None:
    client: TestClient = make_client()
    # A wide MLP at a large batch: its biases and last layer are small beside the step, so where they
    # live moves it by less than the variants' tolerance (a GPU collective still costs a little hidden).
    job = _run(client, max_trials=0, graph=make_mlp_graph(batch_size=1024, widths=(2048, 2048, 2048, 10)))
    recorded = job["result"]["variants"]
    ranked = client.get(f"{job['url']}/candidates").json()["data"]
    with_variants = [c for c in ranked if c["variant_count"]]
    assert {c["strategy_id"] for c in with_variants} == set(recorded)
    assert with_variants, "the MLP's biases and last layer are small: the search finds near-copies"
    for candidate in with_variants:
        assert candidate["source"] == "search" and candidate["variant_key"]
        assert 1 <= len(candidate["variants"]) <= candidate["variant_count"]
        assert all(v["differs"] for v in candidate["variants"])
    assert "data-variants" in client.get(f"/jobs/{job['id']}").text


def test_the_current_configuration_is_priced_beside_the_answer(make_client) -> None:
    client: TestClient = make_client()
    job = _run(client, max_trials=0, current="dp=8")
    result = job["result"]
    current = result["current"]
    assert current["label"] == "dp=8,mb=32,gbs=256" and current["feasible"] and current["same_as"] is None
    ranked = client.get(f"{job['url']}/candidates").json()["data"]
    mine = next(c for c in ranked if c["source"] == "current")
    best = ranked[0]
    assert mine["strategy_id"] == current["strategy_id"] and mine["rank"] > 1
    assert result["speedup_vs_current"] == pytest.approx(
        best["predicted"]["samples_per_s"] / mine["predicted"]["samples_per_s"]
    )
    assert any("your current configuration (dp=8,mb=32,gbs=256)" in note for note in result["notes"])
    stored = Strategy.parse(client.get(f"/v1/strategies/{current['strategy_id']}").json())
    assert stored.layout().data == 8
    page = client.get(f"/jobs/{job['id']}").text
    assert "data-current" in page and "vs your current configuration" in page


def test_a_current_strategy_that_is_also_a_candidate_is_named_as_that_candidate(make_client) -> None:
    graph, cluster = make_mlp_graph(), make_t4_cluster(2)
    client: TestClient = make_client()
    current = PS().build(graph, cluster)
    job = _run(client, max_trials=0, current=current.model_dump(mode="json"))
    assert job["result"]["current"]["same_as"] == "PS"
    assert job["options"]["current"]["id"] == current.id
    ranked = client.get(f"{job['url']}/candidates").json()["data"]
    assert not any(c["source"] == "current" for c in ranked)
    assert job["result"]["speedup_vs_current"] > 1.0, "every answer beats PS on one node pair of an MLP"


@pytest.mark.parametrize(
    ("current", "loc", "words"),
    [
        ("tp=3", ["body", "current", "data"], "does not divide devices(8)"),
        ("tp=banana", ["body", "current", "tensor"], "valid integer"),
        ({"tensor": 3}, ["body", "current", "data"], "does not divide devices(8)"),
        ("dp=8,mb=4", ["body", "current", "micro_batch"], "captured at batch 32"),
        ({"replicas": ["10.0.0.9:GPU:0"], "variables": []}, ["body", "current", "replicas", 0], ""),
    ],
)
def test_a_bad_current_configuration_is_422_at_body_current_and_queues_nothing(
    make_client, current: Any, loc: list[Any], words: str
) -> None:
    client: TestClient = make_client(workers=0)
    response = client.post("/v1/optimize", json=optimize_body(current=current))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert any(p["loc"][: len(loc)] == loc and words in p["msg"] for p in detail), detail
    assert client.get("/v1/jobs").json()["count"] == 0
