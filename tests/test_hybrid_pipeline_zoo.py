"""The zoo's transformers (no nn.Sequential, loss inside forward, tied embedding and head) are cut into
pipeline stages between their blocks and train as one process does, on real gloo ranks; the search
offers them pipelines, and what the traced route cannot run is refused before any collective.

Each case trains STEPS steps of SGD with momentum through `loss = model(*batch); loss.backward()`,
the trial worker's contract. One process trains on the mean over data-parallel slices of the mean
micro-batch loss; every stage's parameters (the tied weight on both ends) and every loss must match it
to RELATIVE.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from runtime_helpers import relative_error, run_ranks
from zoo_training import (
    build,
    cpu_node,
    graph_of,
    make_optimizer,
    searched_layouts,
    train_alone,
    train_rank,
)

from stratagem.errors import UnsupportedStrategyError
from stratagem.ir import ModelGraph, Strategy
from stratagem.parallel_rules import Refusal, block_cuts, graph_pipeline_route, pipeline_route

RELATIVE = 1e-4


def pipeline_layout(graph: ModelGraph, *, data: int, cut: str, micro_batches: int, schedule: str) -> dict[str, Any]:
    """data × pipeline(2) with the stages cut at the beginning of block `cut`, dense variables all-reduced."""
    names = [layer.name for layer in graph.layers]
    first = next(i for i, name in enumerate(names) if name.startswith(cut + "."))
    world = 2 * data
    strategy = Strategy.parse(
        {
            "replicas": [f"127.0.0.1:CPU:{r}" for r in range(world)],
            "mesh": {"data": data, "tensor": 1, "pipeline": 2},
            "pipeline": {
                "stages": [names[:first], names[first:]],
                "micro_batches": micro_batches,
                "schedule": schedule,
            },
            "variables": [
                {"var_name": v.name, "synchronizer": {"kind": "allreduce"}} for v in graph.trainable_variables
            ],
        }
    )
    return strategy.validate_for(graph, cpu_node(world)).model_dump(mode="json")


def worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from stratagem.runtime import data_parallel_rank, distribute

    out: dict[str, Any] = {}
    for label, case in payload["cases"].items():
        strategy = Strategy.parse(case["strategy"])
        model, make_batch = build(case["model"])
        runner, optimizer = distribute(model, make_optimizer(model), strategy, rank=rank)
        index, _ = data_parallel_rank(strategy, rank)
        losses = train_rank(runner, optimizer, make_batch, index)
        held = sorted(runner.held)
        out[label] = {
            "params": {n: model.get_parameter(n).tolist() for n in held},
            "losses": losses,
            "data_index": index,
            "runner": type(runner).__name__,
        }
    return out


def assert_trains_like_one_process(results: list[dict[str, Any]], label: str, case: dict[str, Any]) -> None:
    strategy = case["strategy"]
    expected, expected_losses = train_alone(
        case["model"], strategy["mesh"]["data"], strategy["pipeline"]["micro_batches"]
    )
    seen: set[str] = set()
    for rank, result in enumerate(results):
        got = result[label]
        assert got["runner"] == "TracedPipelinedModel", label
        for name, values in got["params"].items():
            want = expected[name]
            error = relative_error(torch.tensor(values), want)
            assert error < RELATIVE, f"{label}: rank {rank} {name} differs by {error:.2e} (relative)"
        seen |= set(got["params"])
        assert got["losses"] == pytest.approx([step[got["data_index"]] for step in expected_losses], rel=RELATIVE), (
            label
        )
    assert seen == set(expected), f"{label}: no stage holds {sorted(set(expected) - seen)}"


@pytest.fixture(scope="module")
def graphs() -> dict[str, ModelGraph]:
    return {name: graph_of(name) for name in ("gpt", "bert_large", "resnet50")}


def test_the_zoo_transformers_are_cut_between_blocks_and_the_rest_keeps_a_clear_refusal(
    graphs: dict[str, ModelGraph],
) -> None:
    from optimizer_service.search.space import Space, size_of
    from simulator import compile_context

    assert graph_pipeline_route(graphs["gpt"]) == graph_pipeline_route(graphs["bert_large"]) == "blocks"
    refusal = graph_pipeline_route(graphs["resnet50"])
    assert isinstance(refusal, Refusal) and "no layer sits in a numbered block of a ModuleList named blocks" in str(
        refusal
    )
    for name in ("gpt", "bert_large"):
        space = Space(compile_context(graphs[name], cpu_node(4)))
        piped = [m for m in space.meshes if m.pipeline > 1]
        assert piped, name
        assert all(m.tensor == 1 and not m.recompute for m in piped), name
        assert not any("no pipeline stages" in note for note in size_of(space).notes), name
    returns_logits = pipeline_route("stratagem.zoo.Transformer", returns_loss=False, blocks=["blocks.0", "blocks.1"])
    assert (
        "nor can it be cut between the blocks of a model that returns its loss: it does not return its own loss"
        in str(returns_logits)
    )
    stages = [["embed", "blocks.0.ln1"], ["blocks.0.mlp.fc", "head"]]
    assert "block 'blocks.0' is split between stages 0 and 1" in str(block_cuts(stages))
    assert "begins with 'final_norm', not inside a numbered block" in str(block_cuts([["embed"], ["final_norm"]]))


class _LossBlocks(torch.nn.Module):
    """Returns its own loss, its two blocks held in `container` under the name the runtime cuts at."""

    def __init__(self, container: torch.nn.Module) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, 8)
        self.blocks = container

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        blocks = self.blocks.values() if isinstance(self.blocks, torch.nn.ModuleDict) else self.blocks
        for block in blocks:
            x = block(x)
        return ((self.embed(x) - y) ** 2).mean()


def test_blocks_the_runtime_cannot_cut_are_not_offered_a_pipeline() -> None:
    """Layer names read `blocks.0.weight` whether a ModuleList or a ModuleDict holds the blocks; only
    the capture can tell, and the runtime cuts only the ModuleList."""
    from stratagem.tracing import capture

    inputs = (torch.randn(4, 8), torch.randn(4, 8))
    as_list = capture(_LossBlocks(torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])), inputs, batch_size=4)
    as_dict = capture(
        _LossBlocks(torch.nn.ModuleDict({str(i): torch.nn.Linear(8, 8) for i in range(2)})), inputs, batch_size=4
    )
    assert as_list.provenance["block_lists"] == ["blocks"] and as_dict.provenance["block_lists"] == []
    assert [layer.name for layer in as_list.layers] == [layer.name for layer in as_dict.layers]
    assert graph_pipeline_route(as_list) == "blocks"
    refusal = graph_pipeline_route(as_dict)
    assert isinstance(refusal, Refusal) and "no layer sits in a numbered block of a ModuleList named blocks" in str(
        refusal
    )
    recorded_before = as_dict.model_copy(
        update={"provenance": {k: v for k, v in as_dict.provenance.items() if k != "block_lists"}}
    )
    assert graph_pipeline_route(recorded_before) == "blocks"  # a graph captured before capture recorded them: as before


def test_a_traced_pipeline_refuses_tensor_splits_before_any_collective(graphs: dict[str, ModelGraph]) -> None:
    from stratagem.runtime.hybrid import _block_cuts

    model, _ = build("gpt")
    layout = pipeline_layout(graphs["gpt"], data=1, cut="blocks.1", micro_batches=2, schedule="gpipe")
    assert _block_cuts(Strategy.parse(layout), model) == ["blocks.1"]
    layout["recompute"] = "full"
    del layout["id"]
    with pytest.raises(UnsupportedStrategyError, match="a traced stage holds neither DTensor splits nor recomputation"):
        _block_cuts(Strategy.parse(layout), model)


@pytest.mark.slow
def test_two_stages_train_like_one_process(graphs: dict[str, ModelGraph]) -> None:
    cases = {
        "gpt pipeline(2) GPipe, tied embedding across stages": {
            "model": "gpt",
            "strategy": pipeline_layout(graphs["gpt"], data=1, cut="blocks.1", micro_batches=2, schedule="gpipe"),
        },
        "bert pipeline(2) 1F1B, embeddings alone in stage 0": {
            "model": "bert_large",
            "strategy": pipeline_layout(graphs["bert_large"], data=1, cut="blocks.0", micro_batches=4, schedule="1f1b"),
        },
    }
    results = run_ranks("test_hybrid_pipeline_zoo:worker", 2, {"cases": cases}, timeout_s=240)
    for label, case in cases.items():
        assert_trains_like_one_process(results, label, case)


@pytest.mark.slow
def test_two_stages_by_data_two_and_a_searched_layout_train_like_one_process(graphs: dict[str, ModelGraph]) -> None:
    searched = {
        label: layout
        for label, layout in searched_layouts("gpt", graphs["gpt"], 4).items()
        if layout["mesh"]["pipeline"] == 2 and layout["mesh"]["data"] == 2
    }
    assert searched
    label, layout = next(iter(sorted(searched.items())))
    cases = {
        "gpt data(2)×pipeline(2) 1F1B": {
            "model": "gpt",
            "strategy": pipeline_layout(graphs["gpt"], data=2, cut="blocks.1", micro_batches=2, schedule="1f1b"),
        },
        f"searched: {label}": {"model": "gpt", "strategy": layout},
    }
    results = run_ranks("test_hybrid_pipeline_zoo:worker", 4, {"cases": cases}, timeout_s=240)
    for label, case in cases.items():
        assert_trains_like_one_process(results, label, case)
