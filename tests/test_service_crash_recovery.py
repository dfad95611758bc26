"""`kill -9` the service during a job's trials and start it again: no rank outlives it, nothing runs twice.

Real processes throughout: the service under uvicorn, its trials as local gloo ranks, the database
SQLite or PostgreSQL. The ranks' scratch folders live under the test's own TMPDIR, so the test finds
exactly its ranks among the machine's processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sample_documents import make_cpu_cluster, make_mlp_graph
from served import Served, processes_with

BUDGET = 3


def _settings(scratch: Path) -> dict[str, Any]:
    return {
        "workers": 1,
        "trials_backend": "local",
        "trial_warmup": 1,
        "trial_steps": 2,
        "trial_timeout_s": 120,
        "poll_interval_s": 0.2,
        "heartbeat_interval_s": 0.5,
        "stale_after_s": 3,
        "progress_interval_s": 0,
        "TMPDIR": str(scratch),
    }


def _wait(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_service_killed_mid_trial_leaves_no_rank_and_resumes_within_its_budget(
    database_url: str, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    graph, resources = make_mlp_graph(batch_size=8, widths=(64, 32, 8)), make_cpu_cluster(2)
    body = {
        "graph": graph.model_dump(mode="json"),
        "resources": resources.model_dump(mode="json"),
        "max_trials": BUDGET,
        "search": {"time_budget_s": 30, "max_candidates": 200, "top_k": 5, "seed": 0},
    }
    first = Served(database_url, tmp_path / "first.log", **_settings(scratch))
    try:
        first.wait_healthy()
        job = httpx.post(f"{first.url}/v1/optimize", json=body, timeout=60).json()
        trials_url = f"{first.url}/v1/trials?job_id={job['id']}"
        _wait(lambda: httpx.get(trials_url, timeout=10).json()["count"] >= 1, 240, "the first trial row")
        ranks = _wait(lambda: processes_with(str(scratch)), 120, "the next trial's ranks")
    finally:
        first.kill()
    survivors = _wait(lambda: not processes_with(str(scratch)) or None, 10, "the ranks to die with the service")
    assert survivors, f"ranks {ranks} outlived the killed service"

    second = Served(database_url, tmp_path / "second.log", **_settings(scratch))
    try:
        second.wait_healthy()
        job_url = f"{second.url}/v1/jobs/{job['id']}"
        ended = _wait(
            lambda: (data := httpx.get(job_url, timeout=10).json())["status"] in ("succeeded", "failed") and data,
            300,
            "the resumed job to end",
        )
        trials = httpx.get(f"{second.url}/v1/trials", params={"job_id": job["id"]}, timeout=10).json()
    finally:
        second.stop()
    assert ended["status"] == "succeeded", ended
    assert ended["attempts"] == 2
    strategies = [t["strategy_id"] for t in trials["data"]]
    assert len(strategies) == len(set(strategies)), "a strategy was trialled twice"
    assert trials["count"] == ended["result"]["trials_ran"] <= BUDGET
    notes = ended["progress"]["notes"]
    assert len(notes) == len(set(notes)), notes
    assert any("resumed with" in note for note in notes), notes
