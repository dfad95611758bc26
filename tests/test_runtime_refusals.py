"""A strategy the runtime cannot execute is refused before training, naming the variable and the reason."""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import make_model, make_strategy, ps, replicas

from stratagem.errors import InvalidStrategyError, UnsupportedStrategyError
from stratagem.ir import Strategy
from stratagem.runtime import distribute, resolve_plan


def _strategy(variables: list[dict], world_size: int = 2, **extra) -> Strategy:
    return Strategy.parse({"replicas": replicas(world_size), "variables": variables, **extra})


def _all(model, synchronizer: dict) -> list[dict]:
    return [{"var_name": n, "synchronizer": synchronizer} for n, _ in model.named_parameters()]


@pytest.fixture
def model() -> torch.nn.Module:
    return make_model("rec")


@pytest.fixture
def sgd(model) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_world_size_must_equal_the_number_of_replicas(model, sgd) -> None:
    strategy = make_strategy("allreduce_groups", model, 3)
    with pytest.raises(UnsupportedStrategyError, match=r"3 replicas .* 2 ranks"):
        resolve_plan(model, sgd, strategy, world_size=2, rank=0)


def test_tensor_and_pipeline_parallelism_are_refused(model, sgd) -> None:
    strategy = _strategy(_all(model, {"kind": "allreduce"}), mesh={"data": 1, "tensor": 2, "pipeline": 1})
    with pytest.raises(UnsupportedStrategyError, match=r"tensor\(2\).*not supported yet"):
        resolve_plan(model, sgd, strategy, world_size=2, rank=0)


def test_unknown_and_missing_variables_are_named_with_their_path(model, sgd) -> None:
    variables = [
        *_all(model, {"kind": "allreduce"})[1:],
        {"var_name": "fc9.weight", "synchronizer": {"kind": "allreduce"}},
    ]
    with pytest.raises(InvalidStrategyError) as caught:
        resolve_plan(model, sgd, _strategy(variables), world_size=2, rank=0)
    paths = {p.path: p.reason for p in caught.value.problems}
    assert "'fc9.weight' is not a parameter of the model" in paths["variables[5].var_name"]
    assert "'emb.weight'" in paths["variables"]


def test_a_strategy_for_another_model_is_refused_in_one_sentence(model, sgd) -> None:
    other = [{"var_name": f"encoder.{i}.weight", "synchronizer": {"kind": "allreduce"}} for i in range(26)]
    with pytest.raises(InvalidStrategyError) as caught:
        resolve_plan(model, sgd, _strategy(other), world_size=2, rank=0)
    (problem,) = caught.value.problems
    assert problem.path == "graph_id"
    assert (
        "made for another model: none of its 26 variables ('encoder.0.weight', 'encoder.1.weight', 'encoder.2.weight', ...)"
        in problem.reason
    )


def test_a_frozen_parameter_with_a_synchronizer_is_refused(model, sgd) -> None:
    model.fc2.bias.requires_grad_(False)
    with pytest.raises(InvalidStrategyError, match=r"variables\[5\].var_name: 'fc2.bias' does not require grad"):
        resolve_plan(model, sgd, _strategy(_all(model, {"kind": "allreduce"})), world_size=2, rank=0)


def test_a_partition_that_does_not_fit_the_real_shape_is_refused(model, sgd) -> None:
    variables = _all(model, {"kind": "allreduce"})
    variables[3]["partition"] = {"axis": 1, "shards": 2}
    with pytest.raises(InvalidStrategyError, match=r"variables\[3\].partition.axis: axis 1 does not exist: fc1.bias"):
        resolve_plan(model, sgd, _strategy(variables), world_size=2, rank=0)


def test_a_server_on_a_node_without_a_replica_is_refused(model, sgd) -> None:
    variables = _all(model, {"kind": "allreduce"})
    variables[2]["synchronizer"] = ps("10.9.9.9:CPU:0")
    with pytest.raises(
        UnsupportedStrategyError, match=r"variables\[2\].synchronizer \(fc1.weight\).*'10.9.9.9:CPU:0'.*no replica"
    ):
        resolve_plan(model, sgd, _strategy(variables), world_size=2, rank=0)


def test_slicing_an_optimizer_that_is_not_elementwise_is_refused(model) -> None:
    class Normalized(torch.optim.SGD):
        """Not one of the known elementwise optimizers, as a per-tensor-norm optimizer would be."""

    strategy = make_strategy("sharded", model, 2)
    with pytest.raises(UnsupportedStrategyError, match=r"'emb.weight'.*Normalized is not known to update each element"):
        resolve_plan(model, Normalized(model.parameters(), lr=0.1), strategy, world_size=2, rank=0)
    whole = make_strategy("ps_balanced", model, 2)
    assert resolve_plan(model, Normalized(model.parameters(), lr=0.1), whole, world_size=2, rank=0).ps


def test_lbfgs_is_refused(model) -> None:
    strategy = make_strategy("allreduce_groups", model, 2)
    with pytest.raises(UnsupportedStrategyError, match="LBFGS"):
        resolve_plan(model, torch.optim.LBFGS(model.parameters()), strategy, world_size=2, rank=0)


def test_a_parameter_missing_from_the_optimizer_is_refused(model) -> None:
    optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if n != "fc1.bias"], lr=0.1)
    with pytest.raises(UnsupportedStrategyError, match=r"'fc1\.bias': the parameter is not in the optimizer"):
        resolve_plan(model, optimizer, make_strategy("allreduce_groups", model, 2), world_size=2, rank=0)


def test_hierarchical_all_reduce_with_a_compressor_is_refused(model, sgd) -> None:
    variables = _all(model, {"kind": "allreduce", "algorithm": "hierarchical", "compressor": {"kind": "fp16"}})
    with pytest.raises(
        UnsupportedStrategyError, match=r"variables\[0\].synchronizer \(emb.weight\): hierarchical .* fp16"
    ):
        resolve_plan(model, sgd, _strategy(variables), world_size=2, rank=0)


def test_distribute_without_a_process_group_says_how_to_make_one(model, sgd) -> None:
    with pytest.raises(UnsupportedStrategyError, match="init_from_env"):
        distribute(model, sgd, make_strategy("allreduce_groups", model, 1))
