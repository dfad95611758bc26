"""Priming: trials time their steps over filled optimizer state, the same on every rank and strategy."""

from __future__ import annotations

import torch
from sample_documents import make_cpu_cluster, make_mlp_graph

from stratagem.builders import AllReduce
from stratagem.ir import ModelGraph, ResourceSpec, Strategy
from stratagem.runtime import distribute
from trial_runner import ReplayWorkload
from trial_runner.build import BuiltWorkload, batch_for, build_workload, make_optimizer, prime_optimizer_state

CPU = torch.device("cpu")
WIDTHS = (32, 256, 256, 10)


def topk(graph: ModelGraph, resources: ResourceSpec, ratio: float = 0.01) -> Strategy:
    """All-reduce with top-k compression of every gradient: the strategy whose early steps leave Adam state at zero."""
    strategy = AllReduce().build(graph, resources)
    configs = [config.model_dump(mode="json") for config in strategy.variables]
    for data in configs:
        data["synchronizer"]["compressor"] = {"kind": "topk", "ratio": ratio}
    return strategy.replace(variables=configs)


def zero_share(optimizer: torch.optim.Optimizer, built: BuiltWorkload) -> float:
    """The share of Adam's second-moment entries still exactly zero."""
    states = [optimizer.state[p]["exp_avg_sq"] for p in built.model.parameters()]
    return sum(int((s == 0).sum()) for s in states) / sum(s.numel() for s in states)


def primed(graph: ModelGraph, strategy: Strategy, *, rank: int) -> tuple[BuiltWorkload, torch.optim.Optimizer, bool]:
    built = build_workload(ReplayWorkload(graph), seed=3, rank=rank)
    optimizer = make_optimizer(built.optimizer_kind, built.model)
    return built, optimizer, prime_optimizer_state(built, optimizer, strategy, seed=3, device=CPU)


def test_priming_fills_the_state_with_one_step_that_is_identical_on_every_rank():
    graph = make_mlp_graph(batch_size=8, widths=WIDTHS)
    strategy = topk(graph, make_cpu_cluster(2))
    untouched = build_workload(ReplayWorkload(graph), seed=3, rank=0).model
    ranks = [primed(graph, strategy, rank=rank) for rank in (0, 1)]

    for built, optimizer, done in ranks:
        assert done
        assert all(int(optimizer.state[p]["step"]) == 1 for p in built.model.parameters())
        assert all(p.grad is None for p in built.model.parameters())
        assert zero_share(optimizer, built) < 0.2
    models = [built.model for built, _, _ in ranks]
    for first, second, start in zip(
        models[0].parameters(), models[1].parameters(), untouched.parameters(), strict=True
    ):
        assert torch.equal(first, second)
        assert not torch.equal(first, start)


def test_a_mesh_strategy_is_not_primed_because_tensor_parallelism_refuses_existing_state():
    graph = make_mlp_graph(batch_size=8, widths=WIDTHS)
    strategy = AllReduce().build(graph, make_cpu_cluster(2)).replace(recompute="full")
    _, optimizer, done = primed(graph, strategy, rank=0)
    assert not done and not optimizer.state


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, built: BuiltWorkload, steps: int) -> None:
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        built.loss(model(*batch_for(built, seed=3, rank=0, step=step, device=CPU))).backward()
        optimizer.step()


def test_top_k_training_continues_the_primed_state_instead_of_starting_from_zeros(one_rank):
    graph = make_mlp_graph(batch_size=8, widths=WIDTHS)
    strategy = topk(graph, make_cpu_cluster(1))
    shares = {}
    for prime in (False, True):
        built = build_workload(ReplayWorkload(graph), seed=3, rank=0)
        optimizer = make_optimizer(built.optimizer_kind, built.model)
        if prime:
            prime_optimizer_state(built, optimizer, strategy, seed=3, device=CPU)
        model, distributed = distribute(built.model, optimizer, strategy, rank=0)
        _train(model, distributed, built, steps=3)
        assert all(int(optimizer.state[p]["step"]) == 3 + prime for p in built.model.parameters())
        shares[prime] = zero_share(optimizer, built)
    assert shares[False] > 0.9  # three top-1% steps reach at most 3% of the entries
    assert shares[True] < 0.2
