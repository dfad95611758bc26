"""The jobs table as a queue: every job is claimed once, lost workers are detected, owners are enforced."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

from sample_documents import make_mlp_graph, make_t4_cluster
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from models import Job, JobPhase, JobStatus, utcnow
from optimizer_service.core.documents import store_graph, store_resources
from optimizer_service.jobs import queue
from optimizer_service.jobs.types import Progress


def _queue_jobs(session_factory: sessionmaker[Session], count: int) -> list[uuid.UUID]:
    with session_factory.begin() as session:
        graph, _ = store_graph(session, make_mlp_graph())
        resources, _ = store_resources(session, make_t4_cluster(1))
        ids = [uuid.uuid4() for _ in range(count)]
        session.add_all(Job(id=i, graph_id=graph.id, resource_id=resources.id, options={}, progress={}) for i in ids)
    return ids


def test_concurrent_claimers_take_each_job_exactly_once(session_factory: sessionmaker[Session]) -> None:
    ids = _queue_jobs(session_factory, 24)
    claims: dict[str, list[uuid.UUID]] = {}
    barrier = threading.Barrier(6)

    def claimer(name: str) -> None:
        barrier.wait()
        mine = claims.setdefault(name, [])
        while (claim := queue.claim_next(session_factory, name)) is not None:
            mine.append(claim.job_id)

    threads = [threading.Thread(target=claimer, args=(f"worker-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    claimed = [job_id for jobs in claims.values() for job_id in jobs]
    assert sorted(claimed) == sorted(ids)
    with session_factory() as session:
        rows = session.scalars(select(Job)).all()
    assert {row.status for row in rows} == {JobStatus.running}
    assert {row.phase for row in rows} == {JobPhase.searching}  # a running job never reads "queued"
    assert {row.attempts for row in rows} == {1}
    owner = {job_id: name for name, jobs in claims.items() for job_id in jobs}
    assert all(row.worker_id == owner[row.id] for row in rows)


def test_claims_go_oldest_first(session_factory: sessionmaker[Session]) -> None:
    ids = _queue_jobs(session_factory, 3)
    with session_factory.begin() as session:
        for age, job_id in enumerate(ids):
            session.execute(update(Job).where(Job.id == job_id).values(created_at=utcnow() - timedelta(minutes=age)))
    order = [queue.claim_next(session_factory, "w") for _ in ids]
    assert [c.job_id for c in order if c] == list(reversed(ids))


def test_only_the_owner_can_write_progress_or_finish(session_factory: sessionmaker[Session]) -> None:
    (job_id,) = _queue_jobs(session_factory, 1)
    assert queue.claim_next(session_factory, "owner") is not None
    progress = Progress(phase=JobPhase.searching, candidates_evaluated=7)
    assert queue.write_progress(session_factory, job_id, "intruder", progress) is None
    assert queue.write_progress(session_factory, job_id, "owner", progress) is False
    assert not queue.finish_unsuccessfully(session_factory, job_id, "intruder", JobStatus.failed, "no", progress)
    assert queue.finish_unsuccessfully(session_factory, job_id, "owner", JobStatus.failed, "boom", progress)
    with session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.status, job.error, job.progress["candidates_evaluated"]) == (JobStatus.failed, "boom", 7)


def test_stale_running_jobs_are_requeued_then_failed_after_max_attempts(session_factory: sessionmaker[Session]) -> None:
    (job_id,) = _queue_jobs(session_factory, 1)
    for attempt in (1, 2):
        claim = queue.claim_next(session_factory, f"dead-worker-{attempt}")
        assert claim is not None and claim.attempt == attempt
        with session_factory.begin() as session:
            session.execute(update(Job).where(Job.id == job_id).values(heartbeat_at=utcnow() - timedelta(minutes=5)))
        counts = queue.recover_stale(session_factory, stale_after_s=60, max_attempts=2)
        with session_factory() as session:
            job = session.get(Job, job_id)
            assert job is not None
            if attempt == 1:
                assert counts == {"requeued": 1, "failed": 0}
                assert (job.status, job.worker_id) == (JobStatus.queued, None)
                assert "dead-worker-1 stopped heartbeating" in job.progress["notes"][-1]
            else:
                assert counts == {"requeued": 0, "failed": 1}
                assert job.status == JobStatus.failed
                assert "dead-worker-2 stopped heartbeating" in (job.error or "")
                assert "giving up after 2 attempts" in (job.error or "")


def test_fresh_heartbeats_are_left_alone(session_factory: sessionmaker[Session]) -> None:
    (job_id,) = _queue_jobs(session_factory, 1)
    assert queue.claim_next(session_factory, "alive") is not None
    queue.heartbeat(session_factory, [job_id], "alive")
    assert queue.recover_stale(session_factory, stale_after_s=60, max_attempts=2) == {"requeued": 0, "failed": 0}
