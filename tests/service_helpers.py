"""Plain helpers for the service tests: request bodies, polling, fast settings, a slow search, a
service served for real on a free port, and a stand-in cost-model trainer.

Fixtures (apps on SQLite and PostgreSQL) are in `service_fixtures.py`, which `conftest.py` loads for
every test; this module holds no tests.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster

from examples.demo import ServiceThread
from optimizer_service.app import create_app
from optimizer_service.core.cost_model import TrainedCostModel, TrialSample
from optimizer_service.jobs.trials import TrialRunnerExecutor
from optimizer_service.search import search
from optimizer_service.settings import Settings
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.runtime.launch import free_port
from trial_runner import FakeBackend

FAST = {
    "poll_interval_s": 0.05,
    "heartbeat_interval_s": 0.2,
    "progress_interval_s": 0.0,
    "search_time_budget_s": 0.5,
    "search_max_candidates": 2000,
    "max_trials": 0,
}
"""Settings that make workers react in tens of milliseconds instead of seconds."""


def service_settings(database_url: str, **overrides: Any) -> Settings:
    return Settings(database_url=database_url, **{"workers": 1, **FAST, **overrides})


QUICK_SEARCH = {"time_budget_s": 0.5, "max_candidates": 500, "top_k": 3, "seed": 1}


def optimize_body(
    graph: ModelGraph | None = None, resources: ResourceSpec | None = None, **extra: Any
) -> dict[str, Any]:
    graph = graph or make_mlp_graph()
    resources = resources or make_t4_cluster(2)
    return {
        "graph": graph.model_dump(mode="json"),
        "resources": resources.model_dump(mode="json"),
        "search": QUICK_SEARCH,
        **extra,
    }


def upload(client: TestClient, graph: ModelGraph, resources: ResourceSpec) -> tuple[str, str]:
    """Store a graph and a resource spec; their ids."""
    graph_id = client.post("/v1/graphs", json=graph.model_dump(mode="json")).json()["id"]
    resource_id = client.post("/v1/resources", json=resources.model_dump(mode="json")).json()["id"]
    return graph_id, resource_id


def record_trial(
    client: TestClient, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy, **fields: Any
) -> dict[str, Any]:
    """`POST /v1/trials` of `strategy` with `fields` (step times, outcome...), its documents stored first."""
    graph_id, resource_id = upload(client, graph, resources)
    body = {"graph_id": graph_id, "resource_id": resource_id, "strategy": strategy.model_dump(mode="json"), **fields}
    response = client.post("/v1/trials", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def wait_for(client: TestClient, url: str, statuses: set[str], timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(url).json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job at {url} never reached {statuses}: {job}")


def slow_search(graph: ModelGraph, resources: ResourceSpec, *, progress: Any, **budgets: Any) -> Any:
    """The real search's answer, after a long stretch of progress reports (cancel checks happen in them)."""
    for evaluated in range(3000):
        progress(SimpleNamespace(evaluated=evaluated, best_step_time_s=None))
        time.sleep(0.01)
    return search(graph, resources, progress=progress, **budgets)


@contextlib.contextmanager
def served(database_url: str, **settings: Any) -> Iterator[str]:
    """A service started for real on a free port (fast settings, one worker, no trials); yields its URL.

    The SDK is synchronous and httpx's ASGI transport is async-only, so tests that drive the service
    over HTTP serve the app under uvicorn in a thread: every request goes through uvicorn, the
    middleware and the database."""
    with ServiceThread(create_app(service_settings(database_url, **settings))) as service:
        yield service.url


def closed_port_url() -> str:
    """A URL nothing listens on: the port was free a moment ago and is closed again."""
    return f"http://127.0.0.1:{free_port()}"


class MeanRatioTrainer:
    """A test trainer honouring the protocol: the mean log(measured / predicted), as a JSON document."""

    def __init__(self) -> None:
        self.seen: list[TrialSample] = []
        self.cross_validated: dict[str, dict[str, float]] = {}
        """Scores to report as the trainer's cross-validation (simulator and corrected), if any."""

    def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel:
        self.seen = list(samples)
        ratios = [
            math.log(s.measured_step_time_s / s.predicted_step_time_s) for s in samples if s.predicted_step_time_s
        ]
        bias = sum(ratios) / len(ratios) if ratios else 0.0
        return TrainedCostModel(
            model_json=json.dumps({"kind": "mean-log-ratio", "bias": bias}),
            n_train=len(samples),
            version=f"mean-{len(samples)}",
            metrics={"mape": 0.1, "groups": len({s.group for s in samples}), **self.cross_validated},
        )


def fake_executor(step_time: Any) -> TrialRunnerExecutor:
    """The service's real executor around trial_runner's FakeBackend (answers from a function, no processes)."""
    return TrialRunnerExecutor(FakeBackend(step_time), name="fake", warmup=1, steps=3, timeout_s=30)


LAYERS = 200_000
STALL_S = 1.0
"""Far above a healthy answer (milliseconds) and far below the seconds the validation takes."""


def large_graph_body(layers: int = LAYERS) -> bytes:
    """A valid graph of `layers` chained layers, about 75 bytes each."""
    graph: dict[str, Any] = {
        "name": "large",
        "batch_size": 8,
        "layers": [
            {"name": f"l{i}", "fwd_flops": 1_000_000, "bwd_flops": 2_000_000, "inputs": [f"l{i - 1}"] if i else []}
            | ({"variables": ["w"]} if i == 0 else {})
            for i in range(layers)
        ],
        "variables": [{"name": "w", "shape": [64, 64], "consumer": "l0"}],
    }
    return json.dumps(graph, separators=(",", ":")).encode()
