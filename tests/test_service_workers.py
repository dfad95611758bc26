"""Workers in several replicas share one database: each job runs once, lost jobs come back, shutdown hands back."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster
from service_helpers import optimize_body, service_settings, slow_search, wait_for
from sqlalchemy import select, update

from models import Job, JobStatus, utcnow
from optimizer_service.app import create_app
from optimizer_service.db import make_engine, make_session_factory


def _age_heartbeat(database_url: str, job_id: str, minutes: int = 10) -> None:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine).begin() as session:
            session.execute(
                update(Job)
                .where(Job.id == uuid.UUID(job_id))
                .values(heartbeat_at=utcnow() - timedelta(minutes=minutes))
            )
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_two_replicas_on_one_postgresql_run_twenty_jobs_each_exactly_once(postgres_url: str) -> None:
    settings = service_settings(postgres_url, workers=2)
    first, second = create_app(settings), create_app(settings)
    with TestClient(first) as a, TestClient(second) as b:
        ids = []
        for i in range(20):
            body = optimize_body(make_mlp_graph(batch_size=8 + i), make_t4_cluster(1 + i % 2))
            ids.append((a if i % 2 else b).post("/v1/optimize", json=body).json()["id"])
        jobs = [
            wait_for(a, f"/v1/jobs/{job_id}", {"succeeded", "failed", "cancelled"}, timeout_s=120) for job_id in ids
        ]
        pools = [first.state.stratagem.workers, second.state.stratagem.workers]
        processed = [job_id for pool in pools for job_id in pool.processed]
    assert [job["status"] for job in jobs] == ["succeeded"] * 20
    assert sorted(str(job_id) for job_id in processed) == sorted(ids)
    assert {job["attempts"] for job in jobs} == {1}
    assert {job["worker_id"] for job in jobs} <= {pool.worker_id for pool in pools}


def test_a_job_left_running_by_a_dead_replica_is_requeued_and_finished(make_client, database_url: str) -> None:
    dead: TestClient = make_client(workers=0)
    job_id = dead.post("/v1/optimize", json=optimize_body()).json()["id"]
    engine = make_engine(database_url)
    with make_session_factory(engine).begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == uuid.UUID(job_id))
            .values(status=JobStatus.running, worker_id="crashed-host:1:dead", attempts=1, started_at=utcnow())
        )
    engine.dispose()
    _age_heartbeat(database_url, job_id)
    alive: TestClient = make_client(stale_after_s=5)
    job = wait_for(alive, f"/v1/jobs/{job_id}", {"succeeded", "failed"}, timeout_s=60)
    assert job["status"] == "succeeded"
    assert job["attempts"] == 2
    assert any("crashed-host:1:dead stopped heartbeating" in note for note in job["progress"]["notes"])


def test_a_job_that_keeps_losing_its_worker_fails_with_a_clear_error(make_client, database_url: str) -> None:
    client: TestClient = make_client(workers=0)
    job_id = client.post("/v1/optimize", json=optimize_body()).json()["id"]
    engine = make_engine(database_url)
    with make_session_factory(engine).begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == uuid.UUID(job_id))
            .values(
                status=JobStatus.running,
                worker_id="flaky:2:gone",
                attempts=2,
                heartbeat_at=utcnow() - timedelta(hours=1),
            )
        )
    engine.dispose()
    recovering: TestClient = make_client(stale_after_s=5, max_attempts=2)
    job = wait_for(recovering, f"/v1/jobs/{job_id}", {"failed", "succeeded"}, timeout_s=30)
    assert job["status"] == "failed"
    assert "flaky:2:gone stopped heartbeating" in job["error"] and "giving up after 2 attempts" in job["error"]


def test_shutting_down_hands_a_running_job_back_to_the_queue(database_url: str) -> None:
    first = create_app(service_settings(database_url), search=slow_search)
    with TestClient(first) as client:
        url = client.post("/v1/optimize", json=optimize_body()).json()["url"]
        wait_for(client, url, {"running"})
    with TestClient(create_app(service_settings(database_url, workers=0))) as observer:
        job = observer.get(url).json()
    assert (job["status"], job["worker_id"], job["phase"]) == ("queued", None, "queued")
    assert "shutting down" in job["error"]
    with TestClient(create_app(service_settings(database_url))) as restarted:
        done = wait_for(restarted, url, {"succeeded", "failed"}, timeout_s=60)
    assert done["status"] == "succeeded" and done["attempts"] == 2 and done["error"] is None
    assert any("requeued: the service is shutting down" in note for note in done["progress"]["notes"])


def test_a_running_job_keeps_a_fresh_heartbeat(make_client, database_url: str) -> None:
    client: TestClient = make_client(search=slow_search, heartbeat_interval_s=0.1, progress_interval_s=100.0)
    url = client.post("/v1/optimize", json=optimize_body()).json()["url"]
    wait_for(client, url, {"running"})
    time.sleep(0.5)
    beats: list[Any] = []
    engine = make_engine(database_url)
    factory = make_session_factory(engine)
    for _ in range(3):
        with factory() as session:
            beats.append(session.scalar(select(Job.heartbeat_at)))
        time.sleep(0.3)
    engine.dispose()
    client.post(f"{url}/cancel")
    assert beats[0] < beats[1] < beats[2]
    assert utcnow() - beats[2] < timedelta(seconds=5)
