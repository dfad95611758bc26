"""`/v1/cost-model`: versions are listed with their metrics; retraining needs a trainer and trials."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient
from sample_documents import make_mlp_graph, make_t4_cluster
from service_helpers import MeanRatioTrainer, upload
from sqlalchemy import select

from models import CostModelVersion
from optimizer_service.core import cost_model as core
from optimizer_service.core.cost_model import promotion
from optimizer_service.db import make_engine, make_session_factory
from stratagem.builders import AllReduce, DataParallel
from stratagem.ir import ResourceSpec


def _record_trials(client: TestClient, times: list[float], *, resources: ResourceSpec | None = None) -> None:
    graph, resources = make_mlp_graph(), resources or make_t4_cluster(2)
    graph_id, resource_id = upload(client, graph, resources)
    strategies = [DataParallel().build(graph, resources), AllReduce().build(graph, resources)]
    for i, step in enumerate(times):
        body = {
            "graph_id": graph_id,
            "resource_id": resource_id,
            "strategy": strategies[i % 2].model_dump(mode="json"),
            "step_times_s": [step],
            "predicted_step_time_s": step / 2,
        }
        assert client.post("/v1/trials", json=body).status_code == 201
    failed = {"graph_id": graph_id, "resource_id": resource_id, "strategy_id": strategies[0].id, "outcome": "crash"}
    assert client.post("/v1/trials", json=failed).status_code == 201


def test_without_a_trainer_retrain_is_503_and_the_list_is_empty(make_client) -> None:
    client: TestClient = make_client(workers=0, cost_model_enabled=False)
    listing = client.get("/v1/cost-model").json()
    assert listing == {"data": [], "count": 0, "in_use": None, "trainer_configured": False}
    response = client.post("/v1/cost-model/retrain")
    assert response.status_code == 503
    assert response.json()["detail"] == "no cost model trainer configured"


def test_retraining_with_no_successful_trials_is_409(make_client) -> None:
    client: TestClient = make_client(workers=0, cost_model_trainer=MeanRatioTrainer())
    response = client.post("/v1/cost-model/retrain")
    assert response.status_code == 409 and "no successful trials" in response.json()["detail"]


def test_retraining_stores_a_json_version_and_puts_it_in_use(make_client, database_url: str) -> None:
    trainer = MeanRatioTrainer()
    client: TestClient = make_client(workers=0, cost_model_trainer=trainer)
    _record_trials(client, [0.2, 0.4, 0.3])
    first = client.post("/v1/cost-model/retrain")
    assert first.status_code == 201, first.text
    assert (first.json()["n_train"], first.json()["in_use"], first.json()["version"]) == (3, True, "mean-3")
    assert len(trainer.seen) == 3 and all(s.strategy.id and s.graph.id for s in trainer.seen)
    _record_trials(client, [0.5])
    second = client.post("/v1/cost-model/retrain").json()
    listing = client.get("/v1/cost-model").json()
    assert listing["count"] == 2 and listing["in_use"] == second["id"]
    assert [v["in_use"] for v in listing["data"]] == [True, False]
    assert listing["data"][0]["metrics"] == {
        "mape": 0.1,
        "groups": 1,
        "promotion": {"in_use": True, "why": "no cross-validated metrics (fewer than two jobs): serves"},
    }
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        stored = session.scalars(select(CostModelVersion).order_by(CostModelVersion.id)).all()
    engine.dispose()
    assert json.loads(stored[-1].booster)["kind"] == "mean-log-ratio"


def test_trials_are_grouped_by_problem_so_a_repeated_or_imported_problem_never_straddles_a_fold(make_client) -> None:
    """Imported trials arrive without their job, and a problem optimized twice measures the same
    strategies twice: grouped by job (or by trial), one strategy's times would sit on both sides."""
    trainer = MeanRatioTrainer()
    client: TestClient = make_client(workers=0, cost_model_trainer=trainer)
    _record_trials(client, [0.2, 0.4, 0.3])
    _record_trials(client, [0.25], resources=make_t4_cluster(4))
    assert client.post("/v1/cost-model/retrain").status_code == 201
    groups = [s.group for s in trainer.seen]
    assert len(set(groups[:3])) == 1 and groups[3] != groups[0]


def test_a_version_worse_than_the_simulator_alone_is_kept_but_not_put_in_use(make_client) -> None:
    trainer = MeanRatioTrainer()
    client: TestClient = make_client(workers=0, cost_model_trainer=trainer)
    _record_trials(client, [0.2, 0.4, 0.3])
    first = client.post("/v1/cost-model/retrain").json()
    trainer.cross_validated = {
        "simulator": {"top1_regret": 0.04, "log_error": 0.21},
        "corrected": {"top1_regret": 0.06, "log_error": 0.19},
    }
    _record_trials(client, [0.5])
    second = client.post("/v1/cost-model/retrain")
    assert second.status_code == 201 and second.json()["in_use"] is False
    listing = client.get("/v1/cost-model").json()
    assert listing["count"] == 2 and listing["in_use"] == first["id"]
    assert "top1_regret 0.06 > simulator's 0.04" in listing["data"][0]["metrics"]["promotion"]["why"]


def test_promotion_needs_the_correction_not_worse_in_regret_nor_in_log_error() -> None:
    simulator = {"top1_regret": 0.04, "log_error": 0.21}
    assert promotion({"simulator": simulator, "corrected": {"top1_regret": 0.02, "log_error": 0.15}})[0]
    assert promotion({"simulator": simulator, "corrected": {"top1_regret": 0.043, "log_error": 0.215}})[
        0
    ]  # within tolerance
    assert not promotion({"simulator": simulator, "corrected": {"top1_regret": 0.02, "log_error": 0.30}})[0]
    assert not promotion({"simulator": simulator, "corrected": {"top1_regret": 0.10, "log_error": 0.15}})[0]
    assert promotion({})[0] and promotion({"simulator": simulator, "corrected": {"top1_regret": float("nan")}})[0]


def test_a_version_committed_while_the_list_is_read_is_never_named_in_use_without_its_row(
    make_client, monkeypatch
) -> None:
    """The worker retrains beside the request: a version committed between the route's two reads must
    not leave `in_use` naming a version the listing lacks (seen once on PostgreSQL)."""
    client: TestClient = make_client(workers=0, cost_model_trainer=MeanRatioTrainer())
    _record_trials(client, [0.2, 0.4, 0.3])
    client.post("/v1/cost-model/retrain")
    reads = {"n": 0}

    def then_retrain(read: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = read(*args, **kwargs)
            reads["n"] += 1
            if reads["n"] == 1:
                assert client.post("/v1/cost-model/retrain").status_code == 201
            return result

        return wrapped

    monkeypatch.setattr(core, "list_versions", then_retrain(core.list_versions))
    monkeypatch.setattr(core, "version_in_use", then_retrain(core.version_in_use))
    listing = client.get("/v1/cost-model").json()
    assert reads["n"] >= 2 and listing["in_use"] in {v["id"] for v in listing["data"]}
