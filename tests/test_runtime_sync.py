"""N gloo ranks training under each synchronous strategy equal one process training on the global batch.

Every synchronizer kind, mixes of them, and every pre-built builder's strategy, with SGD+momentum
(sparse embedding gradients) and Adam, on 2 and 3 ranks: after 5 steps each parameter is within
1e-5 (relative to its largest entry) of single-process training. A rank that trains on its slice
without synchronizing is far off, which shows the check can fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from runtime_helpers import (
    make_batches,
    make_model,
    make_optimizer,
    make_strategy,
    max_relative_error,
    replicas,
    run_ranks,
    train,
)

CASES = [
    "allreduce_groups",
    "allreduce_hierarchical",
    "ps_single",
    "ps_balanced",
    "ps_partitioned",
    "ps_local_replication",
    "sharded",
    "mixed",
]
COMBOS = [
    ("rec", "sgd", True),
    ("rec", "adagrad", True),
    ("rec", "adam", False),
    ("cnn", "adam", False),
    ("cnn", "sgd", False),
]
BUILDER_COMBOS = [("rec", "sgd", True), ("cnn", "adam", False)]
STEPS, GLOBAL_BATCH = 5, 12


def _builder_strategies(world_size: int) -> list[dict[str, Any]]:
    """Each builder's strategy for each model, and layouts that bucket or reduce after backward, made here
    once so that every rank runs the same one."""
    from stratagem import Layout, ResourceSpec, capture
    from stratagem.builders import all_builders

    nodes = [
        {"address": d.rsplit(":", 2)[0], "cpus": [0], "device": "CPU", "chief": i == 0}
        for i, d in enumerate(replicas(world_size))
    ]
    resources = ResourceSpec.parse({"nodes": nodes})
    runs = []
    for kind, opt_name, sparse in BUILDER_COMBOS:
        model = make_model(kind, sparse=sparse)
        inputs = make_batches(kind, steps=1, batch=GLOBAL_BATCH // world_size)[0][:-1]
        graph = capture(
            model,
            tuple(inputs),
            batch_size=GLOBAL_BATCH // world_size,
            optimizer="momentum" if opt_name == "sgd" else "adam",
        )
        made = [(f"builder {type(builder).__name__}", builder.build(graph, resources)) for builder in all_builders()]
        layouts = ["bucket=1", "overlap=false", *([] if sparse else ["zero=1,overlap=false"])]
        made += [(f"layout {text}", Layout.from_string(text).build(graph, resources)) for text in layouts]
        for label, strategy in made:
            runs.append(
                {
                    "name": f"{label}/{kind}-{opt_name}",
                    "kind": kind,
                    "opt": opt_name,
                    "sparse": sparse,
                    "strategy": strategy.model_dump(mode="json"),
                }
            )
    return runs


def _case_runs(world_size: int) -> list[dict[str, Any]]:
    runs = []
    for case in CASES:
        for kind, opt_name, sparse in COMBOS:
            strategy = make_strategy(case, make_model(kind, sparse=sparse), world_size)
            runs.append(
                {
                    "name": f"{case}/{kind}-{opt_name}",
                    "kind": kind,
                    "opt": opt_name,
                    "sparse": sparse,
                    "strategy": strategy.model_dump(mode="json"),
                }
            )
    return runs


def sync_worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from stratagem.ir import Strategy
    from stratagem.runtime import distribute

    errors: dict[str, float] = {}
    stats: dict[str, Any] = {}
    for run in payload["runs"]:
        batches = make_batches(run["kind"], steps=STEPS, batch=GLOBAL_BATCH)
        reference = make_model(run["kind"], sparse=run["sparse"])
        train(reference, make_optimizer(run["opt"], reference.parameters()), batches)
        model = make_model(run["kind"], sparse=run["sparse"])
        optimizer = make_optimizer(run["opt"], model.parameters())
        model, optimizer = distribute(model, optimizer, Strategy.parse(run["strategy"]))
        train(model, optimizer, batches, rank=rank, world_size=world_size)
        errors[run["name"]] = max_relative_error(model, reference)
        stats[run["name"]] = optimizer.sync_stats.as_dict()
    unsynchronized = make_model("rec")
    train(
        unsynchronized,
        make_optimizer("sgd", unsynchronized.parameters()),
        make_batches("rec", steps=STEPS, batch=GLOBAL_BATCH),
        rank=rank,
        world_size=world_size,
    )
    reference = make_model("rec")
    train(
        reference, make_optimizer("sgd", reference.parameters()), make_batches("rec", steps=STEPS, batch=GLOBAL_BATCH)
    )
    return {"errors": errors, "stats": stats, "control": max_relative_error(unsynchronized, reference)}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_synchronous_strategy_and_builder_matches_single_process_training(world_size: int) -> None:
    runs = _case_runs(world_size) + _builder_strategies(world_size)
    results = run_ranks("test_runtime_sync:sync_worker", world_size, {"runs": runs})
    for rank, result in enumerate(results):
        assert result["control"] > 1e-3, "training a slice without synchronization should not match"
        assert set(result["errors"]) == {run["name"] for run in runs}
        bad = {k: v for k, v in result["errors"].items() if v > 1e-5}
        assert not bad, f"rank {rank}: relative error above 1e-5 after {STEPS} steps: {bad}"
        for name, stats in result["stats"].items():
            assert stats["step"] == STEPS, name
            assert stats["step_s"] >= stats["sync_wait_s"] >= 0, name
            assert stats["compute_s"] > 0, name
