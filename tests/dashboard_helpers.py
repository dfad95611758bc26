"""Plain helpers for the dashboard tests: hostile names, jobs submitted and trials recorded through the API.

Works with a FastAPI TestClient and with an httpx.Client on a live server alike (same interface).
Holds no tests.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

from sample_documents import make_mlp_graph
from service_helpers import QUICK_SEARCH

from stratagem.ir import ModelGraph, ResourceSpec

XSS_NAME = "<script>alert(1)</script>"
XSS_LAYER = "<img src=x onerror=alert(2)>fc1"
"""Renames layer fc1 (and its variables): markup in names the strategy page lists."""


def hostile_graph(batch_size: int = 32) -> ModelGraph:
    """An MLP whose graph, first layer and first variables are named with markup that runs if unescaped."""
    text = json.dumps(make_mlp_graph(batch_size=batch_size, name=XSS_NAME).model_dump(mode="json", exclude={"id"}))
    return ModelGraph.model_validate(json.loads(text.replace('"fc1', json.dumps(XSS_LAYER)[:-1])))


def submit(client: Any, graph: ModelGraph, resources: ResourceSpec, **search: Any) -> dict[str, Any]:
    body = {
        "graph": graph.model_dump(mode="json"),
        "resources": resources.model_dump(mode="json"),
        "max_trials": 0,
        "search": {**QUICK_SEARCH, **search},
    }
    response = client.post("/v1/optimize", json=body)
    assert response.status_code == 202, response.text
    return dict(response.json())


def wait_until(client: Any, job_id: str, statuses: set[str], timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def candidates(client: Any, job_id: str) -> list[dict[str, Any]]:
    return list(client.get(f"/v1/jobs/{job_id}/strategies").json()["data"])


def record_trials(
    client: Any, job: dict[str, Any], *, count: int, seed: int, bias: float = 1.3, backend: str = "generated"
) -> list[dict[str, Any]]:
    """Generated measurements of the top `count` candidates: the prediction times a bias and seeded noise."""
    rng = random.Random(seed)
    recorded = []
    for candidate in candidates(client, job["id"])[:count]:
        predicted = candidate["predicted"]["step_time_s"]
        times = [predicted * bias * rng.lognormvariate(0.0, 0.15) for _ in range(5)]
        body = {
            "graph_id": job["graph_id"],
            "resource_id": job["resource_id"],
            "strategy_id": candidate["strategy_id"],
            "job_id": job["id"],
            "step_times_s": times,
            "predicted_step_time_s": predicted,
            "backend": backend,
        }
        response = client.post("/v1/trials", json=body)
        assert response.status_code == 201, response.text
        recorded.append(response.json())
    return recorded


def record_failed_trial(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    candidate = candidates(client, job["id"])[-1]
    body = {
        "graph_id": job["graph_id"],
        "resource_id": job["resource_id"],
        "strategy_id": candidate["strategy_id"],
        "job_id": job["id"],
        "outcome": "oom",
        "error": "CUDA out of memory on rank 3",
        "backend": "generated",
    }
    response = client.post("/v1/trials", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())
