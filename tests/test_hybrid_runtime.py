"""Tensor, pipeline and hybrid meshes train a small GPT exactly as one process does.

Each mesh shape runs on real gloo ranks (one process per rank) for STEPS optimizer steps (SGD with
momentum; one case Adam) on a generated global batch; every parameter, gathered from the ranks that
hold it, must match single-process training on the whole batch to RELATIVE (`relative_error`),
and so must the losses. Under Adam the attention key biases are left out: their gradient is zero in
exact arithmetic (softmax ignores a constant added to every key score), and Adam scales float noise
of either run up to full-size steps. Hybrid
cases also put some variables on a parameter server, ZeRO sharding or a partitioned all-reduce over
the data-parallel group, next to the tensor splits and stages. One spawn per world size runs several
mesh shapes in turn, since starting the processes dominates the cost.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from runtime_helpers import relative_error, run_ranks
from tiny_gpt import (
    BATCH,
    SEQ,
    STEPS,
    VOCAB,
    loss_fn,
    split_plan,
    tiny_gpt,
)
from torch import nn

from stratagem.ir import ModelGraph, ResourceSpec, Strategy

RELATIVE = 1e-4
ZERO_GRADIENT = (".attn.k.bias",)
"""Parameters whose exact gradient is zero, compared only under SGD (see the module docstring)."""


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
        for _ in range(STEPS)
    ]


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train_alone(kind: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    model = tiny_gpt()
    optimizer = make_optimizer(kind, model.parameters())
    losses = []
    for ids, target in batches():
        loss = loss_fn(model(ids), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return {n: p.detach() for n, p in model.named_parameters()}, losses


# --- strategies ----------------------------------------------------------------------------------


def the_graph() -> ModelGraph:
    from stratagem import capture

    return capture(tiny_gpt(), (torch.zeros(BATCH, SEQ, dtype=torch.long),), batch_size=BATCH)


def cluster(world: int, tensor: int) -> ResourceSpec:
    nodes = world // tensor
    return ResourceSpec.parse(
        {
            "nodes": [
                {"address": f"10.0.0.{j + 1}", "chief": j == 0, "cpus": list(range(tensor)), "device": "CPU"}
                for j in range(nodes)
            ]
        }
    )


def two_stages(graph: ModelGraph) -> list[list[str]]:
    """Embeddings and the first block, then the second block and the head (root ops ride along)."""
    stages: list[list[str]] = [[], []]
    stage = 0
    for layer in graph.layers:
        child = layer.name.split("/")[0].split(".")[0]
        if child in ("2", "3"):
            stage = 1
        stages[stage].append(layer.name)
    return stages


def make_strategy(
    graph: ModelGraph,
    *,
    data: int,
    tensor: int,
    pipeline: int,
    micro_batches: int = 1,
    schedule: str = "1f1b",
    recompute: bool = False,
    extra: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    world = data * tensor * pipeline
    replicas = [f"10.0.0.{r // tensor + 1}:CPU:{r % tensor}" for r in range(world)]
    variables = [
        {"var_name": v.name, "synchronizer": {"kind": "allreduce", "group": i // 4}, **(extra or {}).get(v.name, {})}
        for i, v in enumerate(graph.trainable_variables)
    ]
    strategy: dict[str, Any] = {
        "replicas": replicas,
        "mesh": {"data": data, "tensor": tensor, "pipeline": pipeline},
        "variables": variables,
        "recompute": "full" if recompute else "none",
    }
    if tensor > 1:
        strategy["tensor_parallel"] = split_plan()
    if pipeline > 1 or micro_batches > 1:
        stages = two_stages(graph) if pipeline == 2 else [[layer.name for layer in graph.layers]]
        strategy["pipeline"] = {"stages": stages, "micro_batches": micro_batches, "schedule": schedule}
    checked = Strategy.parse(strategy).validate_for(graph, cluster(world, tensor))
    return checked.model_dump(mode="json")


def ps(address: str) -> dict[str, Any]:
    return {"synchronizer": {"kind": "ps", "reduction_destination": f"{address}:CPU:0"}}


def cases(world: int) -> dict[str, dict[str, Any]]:
    graph = the_graph()
    if world == 2:
        return {
            "tp2": make_strategy(graph, data=1, tensor=2, pipeline=1),
            "tp2-adam": make_strategy(graph, data=1, tensor=2, pipeline=1),
            "tp2-recompute": make_strategy(graph, data=1, tensor=2, pipeline=1, recompute=True),
            "pp2-gpipe": make_strategy(graph, data=1, tensor=1, pipeline=2, micro_batches=2, schedule="gpipe"),
            "dp2-accumulate": make_strategy(graph, data=2, tensor=1, pipeline=1, micro_batches=2, schedule="gpipe"),
        }
    return {
        # tensor splits inside nodes 10.0.0.1 and 10.0.0.2; beside them a PS variable and a ZeRO-sharded split weight
        "dp2-tp2": make_strategy(
            graph,
            data=2,
            tensor=2,
            pipeline=1,
            extra={"0.pos.weight": ps("10.0.0.1"), "1.fc.weight": {"synchronizer": {"kind": "sharded", "group": 7}}},
        ),
        # stage 0 on ranks 0, 2 and stage 1 on ranks 1, 3; a PS variable per stage and a partitioned all-reduce
        "dp2-pp2-1f1b": make_strategy(
            graph,
            data=2,
            tensor=1,
            pipeline=2,
            micro_batches=2,
            extra={
                "0.pos.weight": ps("10.0.0.3"),
                "3.ln.weight": ps("10.0.0.2"),
                "2.proj.weight": {
                    "partition": {"axis": 0, "shards": 2},
                    "synchronizer": {"kind": "allreduce", "group": 9},
                    "shard_synchronizers": [{"kind": "allreduce", "group": 9}, {"kind": "sharded", "group": 9}],
                },
            },
        ),
        "tp2-pp2-1f1b-recompute": make_strategy(graph, data=1, tensor=2, pipeline=2, micro_batches=4, recompute=True),
    }


# --- the ranks -----------------------------------------------------------------------------------


def worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    from stratagem.runtime import data_parallel_rank, distribute, local_batch

    out: dict[str, Any] = {}
    for label, raw in payload["cases"].items():
        strategy = Strategy.parse(raw)
        model = tiny_gpt()
        optimizer = make_optimizer(optimizer_of(label), model.parameters())
        model, optimizer = distribute(model, optimizer, strategy, loss_fn=loss_fn)
        index, size = data_parallel_rank(strategy, rank)
        forwards = count_forwards(getattr(model, "stage", model), "1.fc")
        losses = []
        for ids, target in batches():
            ids, target = (
                local_batch(ids, rank=index, world_size=size),
                local_batch(target, rank=index, world_size=size),
            )
            if hasattr(model, "train_step"):
                loss = model.train_step(ids, target=target)
            else:
                loss = loss_fn(model(ids), target)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(None if loss is None else float(loss))
        module = getattr(model, "stage", model)
        params = {
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().tolist()
            for n, p in module.named_parameters()
        }
        local = {n: p.to_local().numel() if isinstance(p, DTensor) else p.numel() for n, p in module.named_parameters()}
        out[label] = {
            "params": params,
            "local_numel": local,
            "losses": losses,
            "data_index": index,
            "data_size": size,
            "fc_forwards": forwards[0] if forwards else None,
        }
    return out


def count_forwards(module: nn.Module, name: str) -> list[int]:
    """A counter of `name`'s forward calls (recomputation runs them again in backward); empty if absent."""
    if name not in dict(module.named_modules()):
        return []
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    module.get_submodule(name).register_forward_hook(hook)
    return calls


def optimizer_of(label: str) -> str:
    return "adam" if label.endswith("-adam") else "sgd"


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[dict[str, torch.Tensor], list[float]]]:
    return {kind: train_alone(kind) for kind in ("sgd", "adam")}


Run = tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]
"""Every rank's results, and the strategies they ran, by case label."""


@pytest.fixture(scope="module")
def two_ranks() -> Run:
    strategies = cases(2)
    return run_ranks("test_hybrid_runtime:worker", 2, {"cases": strategies}, timeout_s=300), strategies


@pytest.fixture(scope="module")
def four_ranks() -> Run:
    strategies = cases(4)
    return run_ranks("test_hybrid_runtime:worker", 4, {"cases": strategies}, timeout_s=300), strategies


def assert_work_is_split(results: list[dict[str, Any]], label: str, strategy: dict[str, Any]) -> None:
    """Tensor ranks hold a 1/T shard of each split weight; a stage holds only its own modules; a
    recomputed block runs its forward twice per micro-batch."""
    full = dict(tiny_gpt().named_parameters())
    tensor, pipeline = strategy["mesh"]["tensor"], strategy["mesh"]["pipeline"]
    for result in results:
        held = result[label]["local_numel"]
        for name in ("0.tok.weight", "1.attn.q.weight", "2.fc.weight", "2.proj.weight", "3.out.weight"):
            if name in held:
                assert held[name] == full[name].numel() // tensor, f"{label}: {name} holds {held[name]} numbers"
        forwards = result[label]["fc_forwards"]
        if forwards is not None:
            micro = (strategy["pipeline"] or {}).get("micro_batches", 1)
            expected = (2 if strategy["recompute"] == "full" else 1) * STEPS * micro
            shape_inference = 1 if strategy["pipeline"] else 0  # a pipeline stage's first step infers shapes once
            assert expected <= forwards <= expected + shape_inference, (
                f"{label}: 1.fc ran forward {forwards} times, not {expected}"
            )
        if "1.ln1.weight" in held:
            assert held["1.ln1.weight"] == full["1.ln1.weight"].numel(), f"{label}: layer norms stay whole"
        if pipeline > 1:
            assert not ("0.tok.weight" in held and "3.out.weight" in held), (
                f"{label}: a rank holds both ends of the pipeline"
            )


def assert_trains_like_one_process(results: list[dict[str, Any]], label: str, references: dict[str, Any]) -> None:
    expected, expected_losses = references[optimizer_of(label)]
    seen: set[str] = set()
    for rank, result in enumerate(results):
        for name, values in result[label]["params"].items():
            seen.add(name)
            if optimizer_of(label) == "adam" and name.endswith(ZERO_GRADIENT):
                continue
            want = expected[name]
            got = torch.tensor(values)
            error = relative_error(got, want)
            assert error < RELATIVE, f"{label}: rank {rank} {name} differs by {error:.2e} (relative)"
    assert seen == set(expected), f"{label}: no rank holds {sorted(set(expected) - seen)}"
    # the mean over data-parallel groups of each group's loss is the whole batch's loss
    groups = {r[label]["data_index"]: r[label]["losses"] for r in results if r[label]["losses"][0] is not None}
    assert len(groups) == results[0][label]["data_size"], f"{label}: some data-parallel group reported no loss"
    mean = [sum(step) / len(groups) for step in zip(*groups.values(), strict=True)]
    assert mean == pytest.approx(expected_losses, rel=RELATIVE)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["tp2", "tp2-adam", "tp2-recompute", "pp2-gpipe", "dp2-accumulate"])
def test_two_rank_meshes_train_like_one_process(two_ranks: Run, reference, label: str) -> None:
    results, strategies = two_ranks
    assert_work_is_split(results, label, strategies[label])
    assert_trains_like_one_process(results, label, reference)


@pytest.mark.slow
@pytest.mark.parametrize("label", ["dp2-tp2", "dp2-pp2-1f1b", "tp2-pp2-1f1b-recompute"])
def test_four_rank_hybrid_meshes_train_like_one_process(four_ranks: Run, reference, label: str) -> None:
    results, strategies = four_ranks
    assert_work_is_split(results, label, strategies[label])
    assert_trains_like_one_process(results, label, reference)


def test_ranks_sit_on_the_mesh_tensor_innermost() -> None:
    from stratagem.runtime import MeshLayout

    layout = MeshLayout(data=2, pipeline=2, tensor=2)
    assert [layout.coordinates(r) for r in range(8)] == list(itertools.product(range(2), range(2), range(2)))
    assert layout.data_group(3) == [3, 7]
