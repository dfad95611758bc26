"""The one-time data migration 0002_content_ids: stored documents get their new ids, every reference follows.

A database is built at 0001_initial holding rows written the old way (ids over full dumps, defaults
included; a strategy with `recompute_activations: true`), then upgraded; everything must load under
the present schema with its id matching its content, and link up, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sample_documents import make_cpu_cluster, make_mlp_graph

import migrations
import models
from stratagem.builders import DataParallel
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.ir.document import content_hash

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def _old_style(document: Any, excluded: set[str]) -> tuple[str, dict[str, Any]]:
    """A document as the old code stored it: a full dump, its id the hash of everything but `excluded`."""
    data = document.model_dump(mode="json")
    old_id = content_hash({k: v for k, v in data.items() if k not in excluded})
    return old_id, {**data, "id": old_id}


def _old_strategy(strategy: Strategy, graph_id: str, resources_id: str) -> tuple[str, dict[str, Any]]:
    data = strategy.model_dump(mode="json")
    data.pop("recompute")
    data.update(recompute_activations=True, graph_id=graph_id, resources_id=resources_id)
    content = {k: v for k, v in data.items() if k not in {"id", "provenance", "predicted", "measured"}}
    old_id = content_hash(content)
    return old_id, {**data, "id": old_id}


def _tables(engine: sa.Engine) -> dict[str, sa.Table]:
    """The ORM's tables: the 0001 schema is the present one, and their types bind UUIDs on every backend."""
    return dict(models.Base.metadata.tables)


def test_old_documents_get_new_ids_and_every_reference_follows(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        migrations.upgrade(engine, "0001_initial")
        graph, resources = make_mlp_graph(), make_cpu_cluster(2)
        strategy = DataParallel().build(graph, resources)
        graph_old, graph_json = _old_style(graph, {"id", "provenance"})
        spec_old, spec_json = _old_style(resources, {"id", "provenance"})
        strategy_old, strategy_json = _old_strategy(strategy, graph_old, spec_old)
        job_id, trial_id = uuid.uuid4(), uuid.uuid4()
        group = f"{graph_old[:16]}@{spec_old[:16]}"
        t = _tables(engine)
        with engine.begin() as db:
            db.execute(sa.insert(t["graphs"]).values(id=graph_old, name="mlp", json=graph_json, created_at=NOW))
            db.execute(sa.insert(t["resource_specs"]).values(id=spec_old, name="c", json=spec_json, created_at=NOW))
            db.execute(
                sa.insert(t["strategies"]).values(
                    id=strategy_old, graph_id=graph_old, resource_id=spec_old, json=strategy_json, created_at=NOW
                )
            )
            db.execute(
                sa.insert(t["jobs"]).values(
                    id=job_id,
                    graph_id=graph_old,
                    resource_id=spec_old,
                    options={"max_trials": 1},
                    status="succeeded",
                    phase="done",
                    progress={},
                    result={"best_strategy_id": strategy_old, "notes": []},
                    cancel_requested=False,
                    attempts=1,
                    best_strategy_id=strategy_old,
                    created_at=NOW,
                )
            )
            db.execute(
                sa.insert(t["job_candidates"]).values(job_id=job_id, strategy_id=strategy_old, rank=1, source="search")
            )
            db.execute(
                sa.insert(t["trials"]).values(
                    id=trial_id,
                    job_id=job_id,
                    graph_id=graph_old,
                    resource_id=spec_old,
                    strategy_id=strategy_old,
                    outcome="ok",
                    step_times_s=[0.1],
                    median_s=0.1,
                    backend="local",
                    details={"strategy_id": strategy_old, "resources_id": spec_old},
                    created_at=NOW,
                )
            )
            db.execute(
                sa.insert(t["cost_model_versions"]).values(
                    version="v1",
                    created_at=NOW,
                    booster="{}",
                    n_train=1,
                    metrics={"groups": [group]},
                    in_use=True,
                )
            )

        migrations.upgrade(engine)

        assert migrations.current_revision(engine) == migrations.head_revision()
        with engine.connect() as db:
            graph_rows = db.execute(sa.select(t["graphs"])).mappings().all()
            spec_rows = db.execute(sa.select(t["resource_specs"])).mappings().all()
            strategy_rows = db.execute(sa.select(t["strategies"])).mappings().all()
            job = db.execute(sa.select(t["jobs"])).mappings().one()
            candidate = db.execute(sa.select(t["job_candidates"])).mappings().one()
            trial = db.execute(sa.select(t["trials"])).mappings().one()
            cost_model = db.execute(sa.select(t["cost_model_versions"])).mappings().one()
        assert len(graph_rows) == len(spec_rows) == len(strategy_rows) == 1, "old rows were left behind"
        loaded_graph = ModelGraph.parse(graph_rows[0]["json"])
        loaded_spec = ResourceSpec.parse(spec_rows[0]["json"])
        loaded_strategy = Strategy.parse(strategy_rows[0]["json"])
        assert graph_rows[0]["id"] == loaded_graph.id == graph.id != graph_old
        assert spec_rows[0]["id"] == loaded_spec.id == resources.id != spec_old
        assert strategy_rows[0]["id"] == loaded_strategy.id != strategy_old
        assert loaded_strategy.recompute == "full"
        assert (loaded_strategy.graph_id, loaded_strategy.resources_id) == (graph.id, resources.id)
        assert (strategy_rows[0]["graph_id"], strategy_rows[0]["resource_id"]) == (graph.id, resources.id)
        assert (job["graph_id"], job["resource_id"], job["best_strategy_id"]) == (
            graph.id,
            resources.id,
            loaded_strategy.id,
        )
        assert job["result"]["best_strategy_id"] == loaded_strategy.id
        assert candidate["strategy_id"] == loaded_strategy.id
        assert (trial["graph_id"], trial["resource_id"], trial["strategy_id"]) == (
            graph.id,
            resources.id,
            loaded_strategy.id,
        )
        assert trial["details"] == {"strategy_id": loaded_strategy.id, "resources_id": resources.id}
        assert cost_model["metrics"]["groups"] == [f"{str(graph.id)[:16]}@{str(resources.id)[:16]}"]
    finally:
        engine.dispose()
