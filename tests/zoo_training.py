"""The zoo models the hybrid runtime tests train on gloo ranks: builds, batches, graphs, clusters and searched layouts."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stratagem.ir import ModelGraph, ResourceSpec, Strategy

MODELS = ("resnet50", "vgg16", "bert_large", "gpt", "dlrm")


STEPS, BATCH = 3, 4


OVERRIDES: dict[str, dict[str, Any]] = {"bert_large": {"dropout": 0.0}, "gpt": {"dropout": 0.0}}


def build(name: str) -> tuple[torch.nn.Module, Any]:
    """The zoo model with every dropout off (VGG's classifier has a fixed 0.5)."""
    from stratagem import zoo

    torch.manual_seed(0)
    model, make_batch = zoo.build(name, "small", **OVERRIDES.get(name, {}))
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model, make_batch


def batch_of(make_batch: Any, step: int, slice_index: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1000 * step + slice_index + 1)
    return make_batch(BATCH)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def graph_of(name: str) -> ModelGraph:
    from stratagem import capture

    model, make_batch = build(name)
    return capture(model, make_batch(BATCH), batch_size=BATCH)


def cpu_node(world: int) -> ResourceSpec:
    return ResourceSpec.parse(
        {"nodes": [{"address": "127.0.0.1", "chief": True, "cpus": list(range(world)), "device": "CPU"}]}
    )


def searched_layouts(name: str, graph: ModelGraph, world: int) -> dict[str, dict[str, Any]]:
    """Every non-data-parallel layout the search may emit, decoded as the search decodes it."""
    from optimizer_service.search.proposals import mesh_row
    from optimizer_service.search.space import Space
    from simulator import CandidateBatch, compile_context, to_strategy

    resources = cpu_node(world)
    context = compile_context(graph, resources)
    space = Space(context)
    out = {}
    for index, mesh in enumerate(space.meshes):
        if mesh.tensor == mesh.pipeline == mesh.micro_batches == 1 and not mesh.recompute:
            continue
        for sharded in (False, True):
            batch = CandidateBatch.allocate(context, 1)
            mesh_row(index, sharded=sharded)(space, batch, np.array([0]))
            strategy = to_strategy(context, batch, 0).validate_for(graph, resources)
            assert any(c.synchronizer.kind == "sharded" for c in strategy.variables) == sharded
            out[f"{name} {mesh.label()}{' ZeRO' if sharded else ''}"] = strategy.model_dump(mode="json")
    return out


def planned_layout(
    graph: ModelGraph, *, data: int = 1, tensor: int = 1, micro_batches: int = 1, recompute: bool = False
) -> dict[str, Any]:
    """A layout on data × tensor ranks with the plan `tensor_plan` writes, dense variables all-reduced."""
    from simulator import compile_context

    world = data * tensor
    resources = cpu_node(world)
    plan = compile_context(graph, resources).tensor_plan(tensor)
    strategy: dict[str, Any] = {
        "replicas": [f"127.0.0.1:CPU:{r}" for r in range(world)],
        "mesh": {"data": data, "tensor": tensor, "pipeline": 1},
        "tensor_parallel": [split.model_dump(mode="json", exclude_none=True) for split in plan],
        "recompute": "full" if recompute else "none",
        "variables": [
            {"var_name": v.name, "synchronizer": {"kind": "ps", "reduction_destination": "127.0.0.1:CPU:0"}}
            if v.sparse
            else {"var_name": v.name, "synchronizer": {"kind": "allreduce"}}
            for v in graph.trainable_variables
        ],
    }
    if micro_batches > 1:
        strategy["pipeline"] = {
            "stages": [[layer.name for layer in graph.layers]],
            "micro_batches": micro_batches,
            "schedule": "gpipe",
        }
    return Strategy.parse(strategy).validate_for(graph, resources).model_dump(mode="json")


def train_rank(model: Any, optimizer: torch.optim.Optimizer, make_batch: Any, slice_index: int) -> list[float]:
    """STEPS steps of one rank, distributed `model` on its data-parallel slice; each step's loss."""
    losses = []
    for step in range(STEPS):
        loss = model(*batch_of(make_batch, step, slice_index))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def train_alone(name: str, data: int, micro_batches: int) -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    """One process on every data-parallel slice of each step, each slice the mean of its micro-batches' losses."""
    model, make_batch = build(name)
    optimizer = make_optimizer(model)
    losses = []
    for step in range(STEPS):
        slices = []
        for d in range(data):
            chunks = zip(*(t.chunk(micro_batches) for t in batch_of(make_batch, step, d)), strict=True)
            slices.append(torch.stack([model(*chunk) for chunk in chunks]).mean())
        loss = torch.stack(slices).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([float(s.detach()) for s in slices])
    return {n: p.detach() for n, p in model.named_parameters()}, losses
