"""Every tensor or pipeline layout the search can emit for a zoo model runs on real gloo ranks and
trains as one process does; layouts the runtime cannot run are never emitted, and the space says why.

For each zoo model (small config, dropout off so that runs are comparable) the graph is captured, the
search's mesh choices for a one-node CPU cluster of 2 and 4 ranks are decoded into strategies exactly
as the search decodes them (`mesh_row` + `to_strategy`, with all-reduce and with ZeRO), and every
distinct one trains STEPS steps of SGD with momentum. Beside those, the plan `tensor_plan` writes for
tensor degree 2 runs for every model, including those for which the search withholds tensor degrees
(ResNet, VGG, DLRM: the simulator prices their convolutions and tables as split, which the runtime
cannot do), so the plan's own rule is proven sound, not just unused; and the micro-batch accumulation
and recomputation the search offers when memory is short (a zoo model returns its loss, so its
micro-batches accumulate inside forward). Every parameter, gathered from its shards, and every loss must
match one process to RELATIVE, where the process trains on the mean of the data-parallel slices' (and
micro-batches') losses: what the layout computes, BatchNorm statistics included.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from runtime_helpers import relative_error, run_ranks
from zoo_training import (
    BATCH,
    MODELS,
    OVERRIDES,
    build,
    cpu_node,
    graph_of,
    make_optimizer,
    planned_layout,
    searched_layouts,
    train_alone,
    train_rank,
)

from stratagem.ir import ModelGraph, Strategy

RELATIVE = 1e-3
"""Looser than the 1e-4 of tests/test_hybrid_runtime.py: a convolution net's BatchNorm gradients sum
thousands of terms with cancellation, and one CPU's kernels order those sums differently for one
sample per micro-batch than for two (an AMD EPYC put ResNet's accumulated stem.1.bias 1.1e-4 from one
process). A synchronization bug is off by the size of the update itself."""


@pytest.fixture(scope="module")
def graphs() -> dict[str, ModelGraph]:
    return {name: graph_of(name) for name in MODELS}


# --- the ranks -----------------------------------------------------------------------------------


def worker(rank: int, world_size: int, payload: dict[str, Any]) -> dict[str, Any]:
    from stratagem.runtime import data_parallel_rank, distribute
    from stratagem.runtime.tensor_parallel import gathered_parameters

    out: dict[str, Any] = {}
    for label, case in payload["cases"].items():
        strategy = Strategy.parse(case["strategy"])
        model, make_batch = build(case["model"])
        model, optimizer = distribute(model, make_optimizer(model), strategy, rank=rank)
        index, size = data_parallel_rank(strategy, rank)
        losses = train_rank(model, optimizer, make_batch, index)
        params = {n: p.tolist() for n, p in gathered_parameters(getattr(model, "module", model)).items()}
        out[label] = {
            "params": params,
            "losses": losses,
            "data_index": index,
            "data_size": size,
            "runner": type(model).__name__,
        }
    return out


def assert_trains_like_one_process(results: list[dict[str, Any]], label: str, case: dict[str, Any]) -> None:
    data = case["strategy"]["mesh"]["data"]
    micro_batches = (case["strategy"]["pipeline"] or {}).get("micro_batches", 1)
    expected, expected_losses = train_alone(case["model"], data, micro_batches)
    for rank, result in enumerate(results):
        got = result[label]
        assert set(expected) <= set(got["params"]), (
            f"{label}: rank {rank} lacks {sorted(set(expected) - set(got['params']))}"
        )
        for name, want in expected.items():
            error = relative_error(torch.tensor(got["params"][name]), want)
            assert error < RELATIVE, f"{label}: rank {rank} {name} differs by {error:.2e} (relative)"
        assert got["runner"] == ("AccumulatedModel" if micro_batches > 1 else type(build(case["model"])[0]).__name__), (
            label
        )
        step_losses = [step[got["data_index"]] for step in expected_losses]
        assert got["losses"] == pytest.approx(step_losses, rel=RELATIVE), f"{label}: rank {rank} losses"


def cases_for(world: int, graphs: dict[str, ModelGraph]) -> dict[str, dict[str, Any]]:
    """The searched layouts for `world` ranks, and with 2 ranks each model's planned tensor(2); distinct only."""
    cases: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for name, graph in graphs.items():
        # pipelines (the transformers') run in tests/test_hybrid_pipeline_zoo.py, where each stage reports its own parameters
        layouts = {label: s for label, s in searched_layouts(name, graph, world).items() if s["mesh"]["pipeline"] == 1}
        if world == 2:
            layouts[f"{name} planned tensor(2)"] = planned_layout(graph, tensor=2)
        if world == 2 and name == "gpt":
            layouts["gpt planned tensor(2), 2 micro-batches accumulated, recomputed"] = planned_layout(
                graph, tensor=2, micro_batches=2, recompute=True
            )
        if world == 2 and name == "resnet50":
            layouts["resnet50 data(2), 2 micro-batches accumulated"] = planned_layout(graph, data=2, micro_batches=2)
        for label, strategy in layouts.items():
            key = Strategy.parse(strategy).compute_id()
            if key not in seen:
                seen.add(key)
                cases[label] = {"model": name, "strategy": strategy}
    return cases


# --- tests ---------------------------------------------------------------------------------------


def test_the_search_emits_no_layout_the_runtime_cannot_run_and_says_why(graphs: dict[str, ModelGraph]) -> None:
    from optimizer_service.search.space import Space, size_of
    from simulator import compile_context

    emitted = {}
    for name, graph in graphs.items():
        space = Space(compile_context(graph, cpu_node(4)))
        emitted[name] = sorted({m.tensor for m in space.meshes})
        if name in ("gpt", "bert_large"):  # cut between blocks: tests/test_hybrid_pipeline_zoo.py
            continue
        assert all(m.pipeline == 1 for m in space.meshes), f"{name}: a pipeline"
        notes = size_of(space).notes
        assert any("no pipeline stages" in n and "computes its loss inside forward" in n for n in notes), name
    # DLRM's indices are [tables, lookups], not batch-first: no micro-batches. Shapes tell only when the
    # batch is not the number of tables (4), hence a capture at batch 8.
    from stratagem import capture

    model, make_batch = build("dlrm")
    dlrm = capture(model, make_batch(8), batch_size=8)
    assert any(
        "input's first dimension (4) is not the batch (8)" in n
        for n in size_of(Space(compile_context(dlrm, cpu_node(4)))).notes
    )
    # transformers split by heads, column/row pairs and vocabulary; the others' convolutions or tables cannot be split
    assert emitted == {"resnet50": [1], "vgg16": [1], "bert_large": [1, 2], "gpt": [1, 2, 4], "dlrm": [1]}


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh", ["tensor(2)×pipeline(1)", "tensor(1)×pipeline(2), 2 micro-batches 1F1B, stages by compute"]
)
def test_a_searched_tensor_or_pipeline_layout_runs_as_a_service_trial(graphs: dict[str, ModelGraph], mesh: str) -> None:
    """The trial runner builds the zoo model itself and runs the searched layout to an `ok` trial."""
    from trial_runner import LocalBackend, Outcome, ZooWorkload, run_trial

    layouts = searched_layouts("gpt", graphs["gpt"], 2)
    assert f"gpt data(1)×{mesh}" in layouts, sorted(layouts)
    strategy = Strategy.parse(layouts[f"gpt data(1)×{mesh}"])
    result = run_trial(
        ZooWorkload("gpt", batch_size=BATCH, overrides=OVERRIDES["gpt"]),
        cpu_node(2),
        strategy,
        warmup=1,
        steps=2,
        timeout=120,
        backend=LocalBackend(),
        measure_undistributed=False,
    )
    assert result.outcome == Outcome.ok, result.error
    assert len(result.step_times_s) == 2
    assert not result.optimizer_primed  # tensor parallelism refuses existing optimizer state, so meshes are not primed


@pytest.mark.slow
def test_two_rank_layouts_train_like_one_process(graphs: dict[str, ModelGraph]) -> None:
    cases = cases_for(2, graphs)
    assert {case["model"] for case in cases.values()} == set(MODELS)
    results = run_ranks("test_hybrid_zoo:worker", 2, {"cases": cases}, timeout_s=300)
    for label, case in cases.items():
        assert_trains_like_one_process(results, label, case)


@pytest.mark.slow
def test_four_rank_layouts_train_like_one_process(graphs: dict[str, ModelGraph]) -> None:
    cases = cases_for(4, graphs)
    assert {case["strategy"]["mesh"]["tensor"] for case in cases.values()} == {2, 4}
    results = run_ranks("test_hybrid_zoo:worker", 4, {"cases": cases}, timeout_s=300)
    for label, case in cases.items():
        assert_trains_like_one_process(results, label, case)
