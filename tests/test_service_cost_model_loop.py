"""The learning loop of the service: trials -> retrain (in the worker) -> corrected ranking of later jobs.

Trials come from trial_runner's FakeBackend, which "measures" whatever a function says (here a fixed
multiple of the simulator's step time), so what the model must learn is known exactly. The service
around it is real: the database, the workers, the default trainer (`simulator.learned.Trainer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sample_documents import make_embedding_graph, make_mlp_graph, make_t4_cluster
from service_helpers import optimize_body
from sqlalchemy import select

import simulator
from models import CostModelVersion
from optimizer_service.core.cost_model import TrainedCostModel, TrialSample
from optimizer_service.core.inputs import CLIENT_BACKEND, JobOptions, SearchBudget
from optimizer_service.db import make_engine, make_session_factory
from optimizer_service.jobs.correction import LoadedCostModel, correct_candidates
from optimizer_service.jobs.pipeline import run_pipeline
from optimizer_service.jobs.trials import TrialRunnerExecutor
from optimizer_service.jobs.types import Interruption, JobInterrupted, RankedCandidate, TrialRecord
from simulator.learned import CostModel, make_record
from stratagem.builders import AllReduce, DataParallel, all_builders
from stratagem.ir import ModelGraph, PredictedPerformance, ResourceSpec, Strategy
from trial_runner import FakeBackend, TrialSpec
from trial_runner.result import Outcome

SLOWDOWN = 3.0
"""What every fake trial measures, relative to the simulator."""


def simulated_step(spec: TrialSpec) -> float:
    return float(simulator.simulate(spec.workload.graph, spec.resources, [spec.strategy])[0].step_time_s)  # type: ignore[union-attr]


def slow_executor() -> TrialRunnerExecutor:
    """Every trial measures SLOWDOWN times the simulator's step time (a consistent bias, no noise)."""
    return TrialRunnerExecutor(
        FakeBackend(lambda spec: SLOWDOWN * simulated_step(spec)), name="fake", warmup=1, steps=2, timeout_s=30
    )


def run_job(client: TestClient, graph: ModelGraph, resources: ResourceSpec, max_trials: int) -> dict[str, Any]:
    job = client.post(
        "/v1/optimize",
        params={"wait": True, "timeout": 120},
        json=optimize_body(graph, resources, max_trials=max_trials),
    ).json()
    assert job["status"] == "succeeded", job
    return job


def wait_for_version(client: TestClient, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listing = client.get("/v1/cost-model").json()
        if listing["in_use"] is not None:
            return next(v for v in listing["data"] if v["id"] == listing["in_use"])
        time.sleep(0.1)
    raise AssertionError("the worker never retrained the cost model")


def test_job_a_trials_retrain_the_model_in_the_worker_and_job_b_predictions_move_to_the_measured_scale(
    make_client,
) -> None:
    client: TestClient = make_client(trials=slow_executor(), cost_model_retrain_every=3)
    resources = make_t4_cluster(2)
    job_a = run_job(client, make_mlp_graph(), resources, max_trials=4)
    assert job_a["result"]["trials_ok"] >= 3 and job_a["result"]["cost_model_version"] is None
    before = client.get(f"{job_a['url']}/strategies").json()["data"]
    assert all(c["predicted"]["simulated_step_time_s"] is None for c in before)  # nothing learned yet: simulator alone

    version = wait_for_version(client)
    assert version["n_train"] == job_a["result"]["trials_ok"]

    job_b = run_job(client, make_embedding_graph(), resources, max_trials=2)
    assert job_b["result"]["cost_model_version"] == version["version"]
    ranked = client.get(f"{job_b['url']}/strategies").json()["data"]
    corrected = [c["predicted"] for c in ranked if c["predicted"]["simulated_step_time_s"]]
    assert len(corrected) >= 3
    for predicted in corrected:
        ratio = predicted["step_time_s"] / predicted["simulated_step_time_s"]
        assert 2.0 < ratio < 3.3, predicted  # from 1x (the simulator) most of the way to the measured 3x
        assert predicted["uncertainty"] > 0
    untried = [c["predicted"]["step_time_s"] for c in ranked if c["measured"] is None and c["predicted"]["feasible"]]
    assert untried == sorted(untried)
    best = client.get(f"{job_b['url']}/best").json()
    assert best["provenance"]["cost_model_version"] == version["version"]
    trials = client.get("/v1/trials", params={"job_id": job_b["id"]}).json()["data"]
    assert trials and all(t["median_s"] == pytest.approx(SLOWDOWN * t["predicted_step_time_s"]) for t in trials), trials


def test_retraining_with_the_default_trainer_stores_the_booster_json_and_metrics_grouped_by_job(
    make_client, database_url: str
) -> None:
    client: TestClient = make_client(trials=slow_executor(), cost_model_retrain_every=0)
    assert client.get("/v1/cost-model").json()["trainer_configured"] is True
    resources = make_t4_cluster(2)
    jobs = [run_job(client, graph, resources, max_trials=3) for graph in (make_mlp_graph(), make_embedding_graph())]
    assert client.get("/v1/cost-model").json()["in_use"] is None  # retrain_every=0: only on request
    response = client.post("/v1/cost-model/retrain")
    assert response.status_code == 201, response.text
    version = response.json()
    assert version["in_use"] and version["n_train"] == sum(j["result"]["trials_ok"] for j in jobs)
    metrics = version["metrics"]
    assert metrics["skipped"] == 0 and metrics["n_splits"] == 2
    assert metrics["corrected"]["n_groups"] == 2 and metrics["simulator"]["n"] == version["n_train"]
    assert metrics["simulator"]["mape"] == pytest.approx(1 - 1 / SLOWDOWN)  # the simulator is 3x optimistic
    assert metrics["corrected"]["mape"] < metrics["simulator"]["mape"]
    assert {"kendall_tau", "top1_regret"} <= set(metrics["corrected"])
    engine = make_engine(database_url)
    with make_session_factory(engine)() as session:
        stored = session.scalars(select(CostModelVersion)).one()
    engine.dispose()
    model = CostModel.from_json(stored.booster)
    assert model.version_ == version["version"] and model.n_train_ == version["n_train"] and model.boosters_


class BrokenTrainer:
    def __init__(self) -> None:
        self.calls = 0

    def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel:
        self.calls += 1
        raise RuntimeError("the trainer ran out of disk")


def test_a_failed_retraining_in_the_worker_is_logged_and_jobs_carry_on(
    make_client, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = BrokenTrainer()
    client: TestClient = make_client(trials=slow_executor(), cost_model_trainer=trainer, cost_model_retrain_every=1)
    with caplog.at_level(logging.ERROR, logger="optimizer_service.jobs.worker"):
        first = run_job(client, make_mlp_graph(), make_t4_cluster(2), max_trials=2)
        deadline = time.monotonic() + 30
        while trainer.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = run_job(client, make_mlp_graph(widths=(256, 128, 10)), make_t4_cluster(2), max_trials=1)
    assert trainer.calls >= 1 and first["result"]["cost_model_version"] is None and second["status"] == "succeeded"
    assert any("retraining the cost model failed" in r.getMessage() for r in caplog.records)
    assert client.get("/v1/cost-model").json()["count"] == 0


def test_a_version_the_service_cannot_apply_leaves_ranking_to_the_simulator(make_client) -> None:
    class ForeignTrainer:
        def train(self, samples: Sequence[TrialSample]) -> TrainedCostModel:
            return TrainedCostModel(
                model_json='{"kind": "someone else\'s model"}', n_train=len(samples), version="foreign-1"
            )

    client: TestClient = make_client(
        trials=slow_executor(), cost_model_trainer=ForeignTrainer(), cost_model_retrain_every=0
    )
    run_job(client, make_mlp_graph(), make_t4_cluster(2), max_trials=1)
    assert client.post("/v1/cost-model/retrain").status_code == 201
    job = run_job(client, make_embedding_graph(), make_t4_cluster(2), max_trials=0)
    assert job["result"]["cost_model_version"] is None
    ranked = client.get(f"{job['url']}/strategies").json()["data"]
    assert all(c["predicted"]["simulated_step_time_s"] is None for c in ranked)


# --- the pipeline on its own ------------------------------------------------------------------------

NO_TRIALS = JobOptions(max_trials=0, search=SearchBudget(time_budget_s=0.5, max_candidates=300, top_k=5, seed=0))


def ps_averse_model() -> CostModel:
    """Trained on jobs where parameter-server traffic costs 4x what the simulator says and the rest 1x."""
    resources = make_t4_cluster(2)
    records = []
    graphs = [
        make_mlp_graph(widths=w, name=f"mlp{i}")
        for i, w in enumerate([(784, 512, 10), (1024, 1024, 10), (512, 256, 64, 10)])
    ]
    graphs += [make_embedding_graph(rows=rows) for rows in (20_000, 200_000)]
    for graph in graphs:
        strategies = [builder.build(graph, resources) for builder in all_builders()]
        for strategy, prediction in zip(strategies, simulator.simulate(graph, resources, strategies), strict=True):
            measured = prediction.step_time_s + 3 * prediction.breakdown.get("ps", 0.0)
            records.append(make_record(graph, resources, strategy, prediction, measured_step_time_s=measured))
    return CostModel(n_bootstrap=4).fit(records)


def builders_predicted(graph: ModelGraph, resources: ResourceSpec) -> list[Strategy]:
    """Every builder's strategy with the simulator's prediction: a fixed candidate set, unlike a timed search."""
    strategies = [builder.build(graph, resources) for builder in all_builders()]
    predictions = simulator.simulate(graph, resources, strategies)
    return [s.replace(predicted=p.to_predicted()) for s, p in zip(strategies, predictions, strict=True)]


def test_with_a_cost_model_the_pipeline_ranks_by_the_corrected_time_and_keeps_the_simulators() -> None:
    model = LoadedCostModel(version="cm-test", model=ps_averse_model())
    graph, resources = make_embedding_graph(rows=50_000), make_t4_cluster(2)
    strategies = builders_predicted(graph, resources)
    raw = {s.id: s.predicted for s in strategies}
    plain = run_pipeline(graph, resources, NO_TRIALS, lambda p: None, lambda: False, search=fixed_search(strategies))
    result = run_pipeline(
        graph, resources, NO_TRIALS, lambda p: None, lambda: False, search=fixed_search(strategies), cost_model=model
    )
    assert plain.summary["cost_model_version"] is None and result.summary["cost_model_version"] == "cm-test"
    assert all(c.strategy.predicted == raw[c.strategy.id] for c in plain.candidates)  # no model: the simulator alone
    feasible = [c for c in result.candidates if c.strategy.predicted and c.strategy.predicted.feasible]
    steps = [c.strategy.predicted.step_time_s for c in feasible]  # type: ignore[union-attr]
    assert len(feasible) >= 3 and steps == sorted(steps)
    assert [c.source for c in feasible] != [c.source for c in plain.candidates if c.strategy.predicted.feasible]  # type: ignore[union-attr]
    ratios = []
    for candidate in feasible:
        predicted, before = candidate.strategy.predicted, raw[candidate.strategy.id]
        assert predicted is not None and before is not None
        assert predicted.simulated_step_time_s == pytest.approx(before.step_time_s)
        assert predicted.breakdown == before.breakdown and candidate.strategy.provenance.cost_model_version == "cm-test"
        assert predicted.samples_per_s * predicted.step_time_s == pytest.approx(
            before.samples_per_s * before.step_time_s
        )
        ratios.append(
            (predicted.step_time_s / before.step_time_s, before.breakdown.get("ps", 0.0) / before.step_time_s)
        )
    ps_heavy = max(ratios, key=lambda r: r[1])
    no_ps = [ratio for ratio, share in ratios if share == 0]
    assert ps_heavy[1] > 0.2 and no_ps and ps_heavy[0] > 1.3 * max(no_ps), ratios


def placed_records(resources: ResourceSpec, jobs: list[tuple[int, str, float]]) -> list[Any]:
    """Every builder's strategy on an embedding model of each (rows, place, factor), measured at factor
    times the simulator and recorded as measured at place: one job per model."""
    records = []
    for index, (rows, place, factor) in enumerate(jobs):
        graph = make_embedding_graph(rows=rows)
        strategies = [b.build(graph, resources) for b in all_builders()]
        for strategy, prediction in zip(strategies, simulator.simulate(graph, resources, strategies), strict=True):
            records.append(
                make_record(
                    graph,
                    resources,
                    strategy,
                    prediction,
                    measured_step_time_s=factor * prediction.step_time_s,
                    group_id=f"job-{index}",
                    source=place,
                )
            )
    return records


def test_candidates_take_the_level_of_the_place_where_the_jobs_trials_run() -> None:
    """Trials from this service's runner measured 3x the simulator, imported published ones 1x: a job
    whose trials run here is corrected by this runner's level, one elsewhere by neither."""
    resources = make_t4_cluster(2)
    records = placed_records(
        resources,
        [(20_000, "fake", SLOWDOWN), (80_000, "fake", SLOWDOWN), (40_000, "paper", 1.0), (160_000, "paper", 1.0)],
    )
    model = LoadedCostModel(version="cm-places", model=CostModel(n_bootstrap=4).fit(records))
    graph = make_embedding_graph(rows=50_000)

    def factors(place: str | None) -> list[float]:
        candidates = [RankedCandidate(strategy=s, source="test") for s in builders_predicted(graph, resources)]
        raw = {c.strategy.id: c.strategy.predicted.step_time_s for c in candidates}  # type: ignore[union-attr]
        correct_candidates(graph, resources, candidates, model, place=place)
        return [
            c.strategy.predicted.step_time_s / raw[c.strategy.id] for c in candidates if c.strategy.predicted.feasible
        ]  # type: ignore[union-attr]

    here, elsewhere = factors("fake"), factors(None)
    assert here and all(2.0 < f < SLOWDOWN * 1.05 for f in here), here
    assert all(0.7 < f < 1.4 for f in elsewhere), elsewhere


def test_a_job_without_a_trial_runner_takes_the_level_of_the_trials_clients_record() -> None:
    """Trials a client recorded (backend `external`, the user's own cluster) measured 3x the simulator,
    imported published ones 1x: a job with no trial runner is priced at the clients' level."""
    resources = make_t4_cluster(2)
    records = placed_records(
        resources, [(20_000, CLIENT_BACKEND, SLOWDOWN), (80_000, CLIENT_BACKEND, SLOWDOWN), (40_000, "paper", 1.0)]
    )
    model = LoadedCostModel(version="cm-clients", model=CostModel(n_bootstrap=4).fit(records))
    graph = make_embedding_graph(rows=50_000)
    strategies = builders_predicted(graph, resources)
    raw = {s.id: s.predicted.step_time_s for s in strategies}  # type: ignore[union-attr]
    result = run_pipeline(
        graph, resources, NO_TRIALS, lambda p: None, lambda: False, search=fixed_search(strategies), cost_model=model
    )
    factors = [
        c.strategy.predicted.step_time_s / raw[c.strategy.id]  # type: ignore[union-attr]
        for c in result.candidates
        if c.strategy.predicted is not None and c.strategy.predicted.feasible
    ]
    assert factors and all(2.0 < f < SLOWDOWN * 1.05 for f in factors), factors


def fixed_search(strategies: list[Strategy]) -> Any:
    def search(graph: ModelGraph, resources: ResourceSpec, **budgets: Any) -> Any:
        return SimpleNamespace(
            candidates=strategies,
            baselines={},
            evaluated=len(strategies),
            elapsed_s=0.0,
            speedup_vs_data_parallel=None,
            speedup_vs_best_builder=None,
            summary=dict,
        )

    return search


class TimesBackend:
    """Measures each strategy at `factor` times its prediction."""

    backend = "test"

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.ran: list[str] = []

    def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord:
        self.ran.append(str(strategy.id))
        step = self.factor * strategy.predicted.step_time_s  # type: ignore[union-attr]
        return TrialRecord(
            strategy=strategy, outcome=Outcome.ok, backend=self.backend, step_times_s=[step], median_s=step, p90_s=step
        )


def two_candidates() -> list[Strategy]:
    graph, resources = make_mlp_graph(), make_t4_cluster(2)
    first, second = DataParallel().build(graph, resources), AllReduce(chunk_size=1).build(graph, resources)
    assert first.id != second.id
    predicted = [
        PredictedPerformance(step_time_s=t, samples_per_s=256 / t, memory_per_device_bytes=1e9) for t in (1.0, 1.2)
    ]
    return [s.replace(predicted=p) for s, p in zip((first, second), predicted, strict=True)]


@pytest.mark.parametrize(("factor", "basis"), [(3.0, "measured"), (1.1, "measured"), (0.5, "measured")])
def test_the_answer_is_predicted_only_when_its_interval_clears_every_measurement(factor: float, basis: str) -> None:
    strategies = two_candidates()
    backend = TimesBackend(factor)
    options = JobOptions(max_trials=1, search=SearchBudget(time_budget_s=0.5, max_candidates=10, top_k=2, seed=0))
    result = run_pipeline(
        make_mlp_graph(),
        make_t4_cluster(2),
        options,
        lambda p: None,
        lambda: False,
        search=fixed_search(strategies),
        trials=backend,
    )
    assert backend.ran == [strategies[0].id]  # the predicted best is tried first, and the budget is one trial
    assert result.summary["answer_basis"] == basis
    expected = strategies[1].id if basis == "predicted" else strategies[0].id
    assert result.best.strategy.id == expected and result.candidates[0] is result.best
    if basis == "predicted":
        # measured 3.0 s; the untried one, rescaled by the job's bias, has an upper bound below 3.0 less noise
        assert result.best.strategy.measured is None and "upper bound" in str(result.summary["answer_reason"])
        assert result.candidates[1].strategy.measured is not None


def test_when_every_offered_candidate_fails_the_job_fails_with_the_reasons() -> None:
    class Crashing(TimesBackend):
        def run(self, graph: ModelGraph, resources: ResourceSpec, strategy: Strategy) -> TrialRecord:
            return TrialRecord(
                strategy=strategy, outcome=Outcome.crash, backend=self.backend, error="rank 0 segfaulted"
            )

    options = JobOptions(max_trials=4, search=SearchBudget(time_budget_s=0.5, max_candidates=10, top_k=2, seed=0))
    with pytest.raises(JobInterrupted, match=r"every candidate failed its trial.*rank 0 segfaulted") as stop:
        run_pipeline(
            make_mlp_graph(),
            make_t4_cluster(2),
            options,
            lambda p: None,
            lambda: False,
            search=fixed_search(two_candidates()),
            trials=Crashing(1.0),
        )
    assert stop.value.why == Interruption.failed
