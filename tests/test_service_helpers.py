"""Plain helpers for the service tests: request bodies, polling, fast settings, a slow search.

Fixtures (apps on SQLite and PostgreSQL) are in `service_fixtures.py`; this module holds no tests.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from conftest import make_mlp_graph, make_t4_cluster
from fastapi.testclient import TestClient

from optimizer_service.search import search
from optimizer_service.settings import Settings
from stratagem.ir import ModelGraph, ResourceSpec

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
