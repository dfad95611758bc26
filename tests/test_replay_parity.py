"""A trace replay trains like itself: N gloo ranks under a strategy equal one process taking the same N batches.

An operator trace runs at the batch it was captured at, so the one-process reference steps on the N
ranks' batches as micro-batches (each loss divided by N, gradients summed): the mean over ranks that
every synchronous strategy computes. Parameters must agree to 1e-5 relative after three steps, for
a CNN with batch norm, a decoder with attention, and a recommendation model with sparse embeddings.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from runtime_helpers import max_relative_error, run_ranks
from sample_documents import make_cpu_cluster

pytestmark = pytest.mark.slow

STEPS = 3
MODELS = {"resnet50": ("adam", 4), "gpt": ("adam", 4), "dlrm": ("adagrad", 16)}
BUILDERS = ("DataParallel", "AllReduce", "PS")


def _runs(world_size: int) -> list[dict[str, Any]]:
    from stratagem import zoo
    from stratagem.builders import all_builders
    from stratagem.tracing import capture

    resources = make_cpu_cluster(world_size)
    runs = []
    for name, (optimizer, batch) in MODELS.items():
        torch.manual_seed(0)
        model, make_batch = zoo.build(name, "small")
        graph = capture(model, make_batch(batch), batch_size=batch, optimizer=optimizer)
        for builder in all_builders():
            if builder.name in BUILDERS:
                runs.append(
                    {
                        "name": f"{name}/{builder.name}",
                        "graph": graph.model_dump(mode="json"),
                        "trace": graph.trace.model_dump(mode="json"),
                        "strategy": builder.build(graph, resources).model_dump(mode="json"),
                    }
                )
    return runs


def parity_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    errors = {run["name"]: _parity(run, rank, world_size) for run in payload["runs"]}
    return {"errors": {k: v[0] for k, v in errors.items()}, "control": next(iter(errors.values()))[1]}


def _parity(run: dict[str, Any], rank: int, world_size: int) -> tuple[float, float]:
    """(error of the distributed replay, error of a replay that trains on its own batches alone)."""
    from stratagem.ir import ModelGraph, Strategy
    from stratagem.runtime import distribute
    from stratagem.tracing.optrace import OperatorTrace
    from trial_runner.build import derive_seed, make_optimizer
    from trial_runner.replay import ReplayModel, replay_batch_maker, replay_loss

    graph = ModelGraph.parse(run["graph"]).attach_trace(OperatorTrace.parse(run["trace"]))
    make_batch = replay_batch_maker(graph)

    def batch(step: int, of_rank: int) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(derive_seed(7, of_rank, step))
        return make_batch(graph.batch_size)

    def train(ranks: list[int], strategy: Strategy | None) -> torch.nn.Module:
        torch.manual_seed(0)
        model = ReplayModel(graph)
        optimizer = make_optimizer(graph.optimizer.kind, model, lr=0.01)
        if strategy is not None:
            model, optimizer = distribute(model, optimizer, strategy)
        for step in range(STEPS):
            optimizer.zero_grad()
            for other in ranks:
                (replay_loss(model(*batch(step, other))) / len(ranks)).backward()
            optimizer.step()
        return model

    reference = train(list(range(world_size)), None)
    distributed = train([rank], Strategy.parse(run["strategy"]))
    alone = train([rank], None)
    return max_relative_error(distributed, reference), max_relative_error(alone, reference)


def test_n_rank_replay_equals_one_process_replay_of_the_same_batches() -> None:
    runs = _runs(2)
    assert len(runs) == len(MODELS) * len(BUILDERS)
    for rank, result in enumerate(run_ranks("test_replay_parity:parity_worker", 2, {"runs": runs}, timeout_s=400)):
        assert result["control"] > 1e-3
        assert set(result["errors"]) == {run["name"] for run in runs}
        bad = {name: error for name, error in result["errors"].items() if error > 1e-5}
        assert not bad, f"rank {rank}: relative error above 1e-5 after {STEPS} steps: {bad}"
