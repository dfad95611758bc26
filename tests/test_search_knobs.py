"""The search chooses torchtitan's knobs only where they are legal for the runner and the devices: compile
is an input (searched only with `allow_compile`), per-op checkpointing is offered beside selective
recomputation, async tensor parallelism only on an engine with tensor > 1, sequence parallelism and
compiled blocks, fp8 all-gathers only at fp8 with ZeRO-3; a fixed global batch still holds, and the
explanation names each knob (fast: small graphs on the meta device, no processes)."""

from __future__ import annotations

import math

import numpy as np
from layout_helpers import gpt_graph, gpu_cluster, llama_graph
from sample_documents import make_cpu_cluster
from test_search_dimensions import cnn_graph, evaluated

from optimizer_service.search import SearchOptions, space_size
from optimizer_service.search.difference import difference
from optimizer_service.search.guard import respects_options
from optimizer_service.search.neighbours import (
    DIMENSIONS,
    ZERO_DIMENSIONS,
    changes,
    dimension_words,
    mesh_of_row,
    neighbour_rows,
    value_words,
    zero_of_row,
)
from optimizer_service.search.proposals import mesh_row
from optimizer_service.search.space import Space
from simulator import CandidateBatch, compile_context
from simulator.encoding import Precision, SyncKind


def _stage3(rows: CandidateBatch) -> np.ndarray:
    return ((rows.kind == SyncKind.SHARDED) & (rows.zero_stage == 3)).any(axis=1)


def test_compile_is_an_input_every_candidate_and_builder_carries(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    for compile in (False, True):
        result, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32, compile=compile)
        assert (rows.compile == compile).all(), "the search never changes the user's compile unless allowed"
        assert all(c.compile == compile for c in result.candidates)
        assert result.baselines and all(s.compile == compile for s in result.baselines.values())
        assert result.candidates[0].provenance.search["options"]["compile"] is compile
    _, rows, _ = evaluated(
        monkeypatch, graph, resources, runner="engine", global_batch=32, compile=False, allow_compile=True
    )
    assert set(rows.compile.tolist()) == {False, True}
    assert not respects_options(rows, SearchOptions(compile=False))[rows.compile].any()


def test_per_op_checkpointing_is_offered_wherever_selective_recomputation_is(monkeypatch) -> None:
    engine = Space(compile_context(llama_graph(batch=1, seq=64), gpu_cluster(1, 8)), SearchOptions(runner="engine"))
    zoo = Space(compile_context(gpt_graph(), gpu_cluster(1, 4)), SearchOptions())
    for space in (engine, zoo):
        assert space.rules.recompute == ("none", "selective", "selective-op", "full")
    cnn = Space(compile_context(cnn_graph(), gpu_cluster(1, 4)), SearchOptions(runner="engine"))
    assert "selective" not in cnn.rules.recompute and "selective-op" not in cnn.rules.recompute
    hugging_face = Space(compile_context(llama_graph(batch=4, seq=64), gpu_cluster(1, 8)), SearchOptions())
    assert "selective-op" in hugging_face.rules.recompute, "the runtime turns a Hugging Face model's KV cache off"

    _, rows, _ = evaluated(
        monkeypatch, llama_graph(batch=1, seq=64), gpu_cluster(1, 8), runner="engine", global_batch=32
    )
    assert rows.selective_op.any() and rows.selective.any()
    assert not (rows.selective_op & (rows.selective | rows.recompute)).any()
    _, rows, _ = evaluated(monkeypatch, gpt_graph(), gpu_cluster(1, 4))
    assert rows.selective_op.any(), "stratagem's runtime checkpoints the zoo's blocks per op"


def test_async_tensor_parallelism_needs_an_engine_a_tensor_split_sequence_parallelism_and_compile(
    monkeypatch,
) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    result, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32, compile=True)
    on = rows.async_tp
    assert on.any() and (~on & (rows.tensor > 1)).any()
    assert (rows.tensor[on] > 1).all() and rows.sequence_parallel[on].all() and rows.compile[on].all()
    for strategy in result.candidates:
        assert not strategy.async_tensor_parallel or (strategy.sequence_parallel and strategy.compile)
    _, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32)
    assert not rows.async_tp.any(), "torchtitan runs async tensor parallelism only in compiled blocks"
    _, rows, _ = evaluated(
        monkeypatch, graph, resources, runner="engine", global_batch=32, allow_compile=True, max_candidates=3000
    )
    assert rows.async_tp.any() and rows.compile[rows.async_tp].all()
    _, rows, _ = evaluated(monkeypatch, gpt_graph(), gpu_cluster(1, 4), compile=True)
    assert (rows.tensor > 1).any() and not rows.async_tp.any(), "stratagem's runtime refuses it"
    cpus = Space(compile_context(gpt_graph(), make_cpu_cluster(4)), SearchOptions(runner="engine", compile=True))
    assert not cpus.rules.async_tp, "symmetric memory is CUDA's"


def test_fp8_all_gathers_need_fp8_and_zero_3(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    result, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32, precision="fp8")
    gathered = rows.fp8_gather
    assert gathered.any() and (~gathered & _stage3(rows)).any()
    assert (rows.precision[gathered] == Precision.FP8).all() and _stage3(rows)[gathered].all()
    for strategy in result.candidates:
        assert not strategy.fp8_all_gather or strategy.precision == "fp8"
    _, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32, precision="amp-bf16")
    assert _stage3(rows).any() and not rows.fp8_gather.any()
    _, rows, _ = evaluated(
        monkeypatch,
        graph,
        resources,
        runner="engine",
        global_batch=32,
        precision="amp-bf16",
        allow_precision=True,
        max_candidates=3000,
    )
    assert rows.fp8_gather.any() and (rows.precision[rows.fp8_gather] == Precision.FP8).all()


def test_a_fixed_global_batch_holds_with_every_knob_searched(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(2, 8)
    result, rows, scores = evaluated(
        monkeypatch,
        graph,
        resources,
        runner="engine",
        global_batch=64,
        precision="fp8",
        allow_compile=True,
        max_candidates=3000,
    )
    rows.validate(compile_context(graph, resources))
    assert rows.async_tp.any() and rows.fp8_gather.any() and rows.selective_op.any() and rows.compile.any()
    assert ((rows.data * rows.micro_batch_size * rows.micro_batches) == 64).all() and np.isfinite(scores).any()
    for strategy in result.candidates:
        assert strategy.effective_mesh.data * strategy.micro_batch_size * strategy.micro_batches == 64


def test_the_explanation_names_each_new_knob_like_the_other_dimensions() -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    options = SearchOptions(runner="engine", global_batch=32, precision="fp8", compile=True, allow_compile=True)
    space = Space(compile_context(graph, resources), options)
    index = next(i for i, m in enumerate(space.meshes) if m.async_tp and m.recompute_mode == "none")
    batch = CandidateBatch.allocate(space.context, 1)
    mesh_row(index, sharded=True, stage=3)(space, batch, np.array([0]))
    assert batch.async_tp[0] and batch.fp8_gather[0] and batch.compile[0]
    found = changes(space, batch, 0)
    assert {"async tensor parallel", "compile", "fp8 all-gather", "recompute"} <= {c.dimension for c in found}
    rows, found = neighbour_rows(space, batch, 0)
    mesh, zero = mesh_of_row(space, batch, 0), zero_of_row(space, batch, 0)
    assert "selective-op" in {mesh_of_row(space, rows, j).recompute_mode for j in range(len(found))}
    for j, change in enumerate(found):
        mine = value_words(change.dimension, mesh, zero)
        theirs = value_words(change.dimension, mesh_of_row(space, rows, j), zero_of_row(space, rows, j))
        assert mine != theirs, f"{change.dimension}: both sides read {mine!r}"
    assert all(dimension_words(d) != d for d in DIMENSIONS if " " in d or d == "compile")
    off = rows.take([j for j, c in enumerate(found) if c.dimension == "async tensor parallel"])
    assert len(off) and not off.async_tp.any() and off.compile.all(), "switching it off keeps compile"
    record = difference(space, batch, 0)
    assert record is not None and record["dimension"] in {*DIMENSIONS, *ZERO_DIMENSIONS["zero"]}
    assert "fp8 all-gathers" in record["layout"] and "sequence parallel (async)" in record["layout"]


def test_a_partly_sharded_row_names_which_variables_its_neighbour_shards() -> None:
    """Sharding every dense variable, where a row shards all but some, keeps the ZeRO stage: the
    explanation calls it a change of which variables are sharded, not of the stage."""
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    space = Space(compile_context(graph, resources), SearchOptions(runner="engine", global_batch=32))
    batch = CandidateBatch.allocate(space.context, 1)
    mesh_row(1, sharded=True, stage=2)(space, batch, np.array([0]))
    dense = np.flatnonzero(~space.context.var_sparse)
    batch.kind[0, dense[0]] = SyncKind.ALLREDUCE
    zero = zero_of_row(space, batch, 0)
    assert zero.mixed and zero.stage == 2
    found = [c for c in changes(space, batch, 0) if c.dimension == "sharded variables"]
    assert len(found) == 1 and found[0].zero is not None and found[0].zero.stage == 2
    mesh = mesh_of_row(space, batch, 0)
    assert value_words("sharded variables", mesh, zero) == f"{len(dense) - 1} of {len(dense)} dense variables sharded"
    assert value_words("sharded variables", mesh, found[0].zero) == "every dense variable sharded"
    assert dimension_words("sharded variables") == "which dense variables are ZeRO-sharded"


def test_the_space_counts_the_new_knobs() -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    fixed = space_size(graph, resources, SearchOptions(runner="engine", global_batch=32, precision="fp8"))
    searched = space_size(
        graph, resources, SearchOptions(runner="engine", global_batch=32, precision="fp8", allow_compile=True)
    )
    assert fixed.knobs["compile"] == 0 and searched.knobs["compile"] == round(math.log10(2), 3)
    assert searched.knobs["layouts"] > fixed.knobs["layouts"] + math.log10(2) - 1e-3, "async TP on top of compile"
    half = space_size(graph, resources, SearchOptions(runner="engine", global_batch=32, precision="amp-bf16"))
    assert fixed.knobs["zero"] > half.knobs["zero"], "fp8 all-gathers are a ZeRO-3 choice at fp8"
