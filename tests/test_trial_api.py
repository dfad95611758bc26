"""The trial API's contract: JSON documents in and out, clear refusals, and a deterministic fake."""

from __future__ import annotations

import json

import pytest
import torch
from sample_documents import make_cpu_cluster, make_embedding_graph, make_mlp_graph

from stratagem.builders import DataParallel
from stratagem.errors import InvalidDocumentError, TrialFailedError
from stratagem.ir import Strategy
from trial_runner import (
    FakeBackend,
    FaultWorkload,
    Outcome,
    ReplayWorkload,
    TrialResult,
    TrialSpec,
    ZooWorkload,
    run_trial,
)
from trial_runner.build import batch_for, build_workload, derive_seed


@pytest.fixture
def setup():
    graph = make_mlp_graph(batch_size=4, widths=(8, 8, 2))
    resources = make_cpu_cluster(2)
    return graph, resources, DataParallel().build(graph, resources)


def test_trial_spec_round_trips_through_json_and_carries_no_objects(setup):
    graph, resources, strategy = setup
    spec = TrialSpec(
        workload=FaultWorkload(inner=ReplayWorkload(graph), fault="raise", rank=1),
        resources=resources,
        strategy=strategy,
        seed=7,
    )
    text = spec.to_json()
    assert json.loads(text)["workload"]["inner"]["graph"]["id"] == graph.id
    again = TrialSpec.parse(text)
    assert again == spec and again.workload.inner.graph.id == graph.id


def test_zoo_workloads_only_name_models_on_the_allow_list():
    assert ZooWorkload("resnet50", batch_size=2).label == "zoo:resnet50"
    with pytest.raises(ValueError, match=r"unknown zoo model 'os\.system'"):
        ZooWorkload("os.system")
    with pytest.raises(InvalidDocumentError, match=r"workload\.zoo\.name"):
        TrialSpec.parse(
            {
                "workload": {"kind": "zoo", "name": "examples.evil:run"},
                "resources": {"nodes": [{"address": "a", "cpus": [0], "device": "CPU"}]},
                "strategy": {"replicas": ["a:CPU:0"], "variables": []},
            }
        )


def test_bad_arguments_raise_a_clear_error_naming_the_field(setup):
    graph, resources, strategy = setup
    with pytest.raises(InvalidDocumentError, match=r"steps: Input should be greater than or equal to 1"):
        run_trial(ReplayWorkload(graph), resources, strategy, steps=0, backend=FakeBackend(lambda spec: 1.0))
    with pytest.raises(InvalidDocumentError, match=r"workload\.rank: 5 is not a rank of a 2-rank trial"):
        run_trial(FaultWorkload(inner=ReplayWorkload(graph), fault="raise", rank=5), resources, strategy)


def test_a_strategy_that_does_not_fit_the_graph_is_an_invalid_outcome_and_nothing_runs(setup):
    graph, resources, _ = setup
    other = make_embedding_graph(batch_size=4, rows=100)
    wrong = DataParallel().build(other, resources)
    backend = FakeBackend(lambda spec: 1.0)
    result = run_trial(ReplayWorkload(graph), resources, wrong, backend=backend)
    assert result.outcome == Outcome.invalid
    assert "strategy.graph_id" in result.error and "strategy.variables[0].var_name" in result.error
    assert backend.calls == []
    with pytest.raises(TrialFailedError, match="invalid"):
        result.to_measured()


def test_a_replica_outside_the_cluster_is_an_invalid_outcome(setup):
    _, resources, strategy = setup
    elsewhere = Strategy.parse(
        {
            **strategy.model_dump(mode="json", exclude={"id", "resources_id", "graph_id"}),
            "replicas": ["10.9.9.9:CPU:0", "10.9.9.9:CPU:1"],
        }
    )
    result = run_trial(ZooWorkload("gpt", batch_size=2), resources, elsewhere, backend=FakeBackend(lambda spec: 1.0))
    assert result.outcome == Outcome.invalid
    assert "strategy.replicas[0]: device '10.9.9.9:CPU:0' is not in the resource spec" in result.error


def test_fake_backend_answers_deterministically_from_its_function(setup):
    graph, resources, strategy = setup
    backend = FakeBackend(lambda spec: 0.25 if spec.seed == 0 else Outcome.oom)
    first = run_trial(ReplayWorkload(graph), resources, strategy, backend=backend, steps=4)
    second = run_trial(ReplayWorkload(graph), resources, strategy, backend=backend, steps=4)
    failed = run_trial(ReplayWorkload(graph), resources, strategy, backend=backend, seed=3)
    assert first.step_times_s == second.step_times_s == [0.25] * 4
    assert first.backend == "fake" and first.samples_per_s == pytest.approx(4 * 2 / 0.25)
    measured = first.to_measured()
    assert measured.step_time_s == 0.25 and measured.samples_per_s == pytest.approx(32.0)
    assert failed.outcome == Outcome.oom and failed.failed_rank == 0
    assert [spec.seed for spec in backend.calls] == [0, 0, 3]


def test_trial_result_round_trips_through_json(setup):
    graph, resources, strategy = setup
    result = run_trial(ReplayWorkload(graph), resources, strategy, backend=FakeBackend(lambda spec: 0.5))
    assert TrialResult.parse(result.to_json()) == result


def test_batches_are_reproducible_per_rank_and_step_and_differ_across_them():
    graph = make_embedding_graph(batch_size=4, rows=100)
    built = build_workload(ReplayWorkload(graph), seed=1, rank=0)
    cpu = torch.device("cpu")

    def batch(rank: int, step: int) -> tuple[torch.Tensor, ...]:
        return batch_for(built, seed=1, rank=rank, step=step, device=cpu)

    assert all(torch.equal(a, b) for a, b in zip(batch(1, 3), batch(1, 3), strict=True))
    assert not torch.equal(batch(0, 3)[0], batch(1, 3)[0])
    assert not torch.equal(batch(1, 3)[0], batch(1, 4)[0])
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3) != derive_seed(1, 3, 2)


def test_every_rank_builds_identical_initial_weights_from_the_seed():
    graph = make_mlp_graph(batch_size=4, widths=(8, 8, 2))
    first = build_workload(ReplayWorkload(graph), seed=5, rank=0).model.state_dict()
    second = build_workload(ReplayWorkload(graph), seed=5, rank=1).model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_graph_captured_from_the_zoo_trials_the_zoo_model_and_any_other_graph_a_replay():
    from stratagem import zoo
    from stratagem.tracing import capture
    from trial_runner import workload_for_graph

    module, make_batch = zoo.build("dlrm", "small")
    graph = capture(module, make_batch(8), batch_size=8, optimizer="adagrad")
    workload = workload_for_graph(graph)
    assert isinstance(workload, ZooWorkload)
    assert (workload.name, workload.size, workload.batch_size, workload.optimizer) == ("dlrm", "small", 8, "adagrad")
    tampered = graph.replace(provenance={**graph.provenance, "zoo": {**graph.provenance["zoo"], "name": "os.system"}})
    assert isinstance(workload_for_graph(tampered), ReplayWorkload)
    assert isinstance(workload_for_graph(make_mlp_graph()), ReplayWorkload)


def test_a_trial_of_a_graph_that_clips_clips_to_the_graphs_norm():
    from stratagem import zoo
    from stratagem.tracing import capture
    from trial_runner import workload_for_graph

    module, make_batch = zoo.build("dlrm", "small")
    graph = capture(module, make_batch(8), batch_size=8, optimizer="adagrad", max_grad_norm=1.0)
    assert workload_for_graph(graph).max_grad_norm == 1.0
    assert ZooWorkload("dlrm").max_grad_norm is None
    mlp = make_mlp_graph()
    replay = ReplayWorkload(mlp.replace(optimizer=mlp.optimizer.model_copy(update={"max_grad_norm": 0.5})))
    assert FaultWorkload(inner=replay, fault="raise").max_grad_norm == 0.5
    with pytest.raises(ValueError, match="max_grad_norm"):
        ZooWorkload("dlrm", max_grad_norm=0.0)
