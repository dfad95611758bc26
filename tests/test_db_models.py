"""The ORM tables on both databases: JSON round-trips, timestamps come back in UTC, references are enforced."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sample_documents import make_embedding_graph, make_t4_cluster
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from models import CostModelVersion, GraphRow, Job, Trial
from optimizer_service.core.documents import insert_if_absent, store_graph, store_resources, store_strategy
from stratagem.builders import Parallax


def test_a_document_round_trips_through_its_json_column(session_factory: sessionmaker[Session]) -> None:
    graph = make_embedding_graph()
    with session_factory.begin() as session:
        store_graph(session, graph)
    with session_factory() as session:
        row = session.get(GraphRow, graph.id)
        assert row is not None
        assert type(graph).parse(row.json) == graph
        assert row.name == "recsys"


def test_insert_if_absent_inserts_once(session_factory: sessionmaker[Session]) -> None:
    graph = make_embedding_graph()
    values = {"id": graph.id, "name": graph.name, "json": graph.model_dump(mode="json")}
    with session_factory.begin() as session:
        assert insert_if_absent(session, GraphRow, values) is True
        assert insert_if_absent(session, GraphRow, values) is False


def test_timestamps_come_back_aware_and_in_utc(session_factory: sessionmaker[Session]) -> None:
    local = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5)))
    with session_factory.begin() as session:
        session.add(CostModelVersion(version="v", booster="{}", n_train=0, metrics={}, created_at=local))
    with session_factory() as session:
        stored = session.query(CostModelVersion).one().created_at
    assert stored.tzinfo is not None and stored.utcoffset() == timedelta(0)
    assert stored == local.astimezone(UTC)


def test_a_job_must_name_a_stored_graph(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as session:
        spec, _ = store_resources(session, make_t4_cluster(1))
    with pytest.raises(IntegrityError), session_factory.begin() as session:
        session.add(Job(id=uuid.uuid4(), graph_id="e" * 64, resource_id=spec.id, options={}, progress={}))


def test_deleting_a_job_keeps_its_trials(session_factory: sessionmaker[Session]) -> None:
    graph, spec = make_embedding_graph(), make_t4_cluster(1)
    strategy = Parallax().build(graph, spec)
    with session_factory.begin() as session:
        store_graph(session, graph)
        store_resources(session, spec)
        store_strategy(session, strategy, graph_id=graph.id, resource_id=spec.id)
        job = Job(id=uuid.uuid4(), graph_id=graph.id, resource_id=spec.id, options={}, progress={})
        session.add(job)
        session.flush()
        session.add(
            Trial(
                job_id=job.id,
                graph_id=graph.id,
                resource_id=spec.id,
                strategy_id=strategy.id,
                outcome="ok",
                step_times_s=[0.1, 0.2],
                median_s=0.15,
                backend="test",
            )
        )
    with session_factory.begin() as session:
        session.delete(session.get(Job, job.id))
    with session_factory() as session:
        trial = session.query(Trial).one()
        assert trial.job_id is None and trial.step_times_s == [0.1, 0.2]
