"""The queue limit holds under concurrency: it is enforced in the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from sample_documents import make_mlp_graph, make_t4_cluster
from served import Served
from service_helpers import QUICK_SEARCH

LIMIT = 10
SUBMISSIONS = 40


async def _submit_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        return await asyncio.gather(*(http.post("/v1/optimize", json=body) for body in bodies))


@pytest.mark.slow
def test_forty_parallel_submissions_fill_a_queue_of_ten_exactly(database_url: str, tmp_path: Path) -> None:
    """No worker drains the queue (an API-only replica), so exactly LIMIT are accepted and the rest told when to retry."""
    served = Served(database_url, tmp_path / "service.log", workers=0, max_queue_length=LIMIT, retry_after_s=7)
    try:
        served.wait_healthy()
        resources = make_t4_cluster(2).model_dump(mode="json")
        bodies = [
            {"graph": make_mlp_graph(batch_size=b + 1).model_dump(mode="json"), "resources": resources}
            | {"max_trials": 0, "search": QUICK_SEARCH}
            for b in range(SUBMISSIONS)
        ]
        responses = asyncio.run(_submit_all(served.url, bodies))
        statuses = sorted(r.status_code for r in responses)
        assert statuses == [202] * LIMIT + [429] * (SUBMISSIONS - LIMIT), statuses
        refused = [r for r in responses if r.status_code == 429]
        assert all(r.headers["Retry-After"] == "7" for r in refused)
        assert all("queue is full" in r.json()["detail"] for r in refused)
        jobs = httpx.get(f"{served.url}/v1/jobs", params={"limit": 500}).json()
        assert jobs["count"] == LIMIT and {j["status"] for j in jobs["data"]} == {"queued"}
        accepted = {r.json()["id"] for r in responses if r.status_code == 202}
        assert {j["id"] for j in jobs["data"]} == accepted
        graphs = httpx.get(f"{served.url}/v1/graphs", params={"limit": 500}).json()
        assert graphs["count"] == LIMIT, "a refused submission stored its graph"
    finally:
        served.stop()
