"""The search offers each LLM dimension where it is legal and never where it is not, keeps a fixed
global batch and the request's precision, and says which dimension made the difference (fast: small
graphs on the meta device, no processes)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from layout_helpers import gpu_cluster, llama_graph

from optimizer_service.search import SearchOptions, search
from optimizer_service.search import driver as search_driver
from optimizer_service.search.dimensions import PRECISION_NAMES
from optimizer_service.search.evaluate import Evaluator
from optimizer_service.search.neighbours import DIMENSIONS, ZERO_DIMENSIONS
from optimizer_service.search.space import Space
from simulator import CandidateBatch, compile_context, encode, predictions, simulate
from simulator.encoding import Precision, Schedule, SyncKind
from stratagem import Layout
from stratagem.errors import InvalidDocumentError
from stratagem.ir import ModelGraph

BUDGET = {"time_budget_s": None, "max_candidates": 1500, "top_k": 3}


class Recording(Evaluator):
    """The search's evaluator, remembering every row it was asked to score."""

    rows: list[CandidateBatch] = []
    scores: list[np.ndarray] = []

    def evaluate(self, batch, labels, phase, *, force=False):  # type: ignore[no-untyped-def]
        scores = super().evaluate(batch, labels, phase, force=force)
        Recording.rows.append(batch.copy())
        Recording.scores.append(scores.copy())
        return scores


def evaluated(monkeypatch: pytest.MonkeyPatch, graph: ModelGraph, resources, **options):  # type: ignore[no-untyped-def]
    """Run a search and return its result with every row it simulated (and their scores)."""
    Recording.rows, Recording.scores = [], []
    monkeypatch.setattr(search_driver, "Evaluator", Recording)
    result = search(graph, resources, **{**BUDGET, **options})
    return result, CandidateBatch.concat(*Recording.rows), np.concatenate(Recording.scores)


@functools.cache
def cnn_graph() -> ModelGraph:
    from stratagem.tracing import capture
    from stratagem.zoo import build

    module, make_batch = build("vgg16", "small", device="meta")
    return capture(module, make_batch(8), batch_size=8)


def test_a_cnn_gets_no_context_or_sequence_parallelism_and_keeps_its_precision(monkeypatch) -> None:
    graph, resources = cnn_graph(), gpu_cluster(2, 4)
    space = Space(compile_context(graph, resources), SearchOptions(runner="engine", precision="amp-bf16"))
    assert space.rules.context == (1,) and not space.rules.sequence_parallel
    assert "selective" not in space.rules.recompute  # no attention cores to recompute
    result, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", precision="amp-bf16")
    assert (rows.context_parallel == 1).all() and not rows.sequence_parallel.any() and not rows.selective.any()
    assert (rows.precision == Precision.AMP_BF16).all()
    for strategy in result.candidates:
        assert strategy.precision == "amp-bf16" and strategy.effective_mesh.context == 1
        assert not strategy.sequence_parallel


def test_an_llm_is_offered_every_dimension_where_legal(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(2, 8)
    _, rows, _ = evaluated(
        monkeypatch, graph, resources, runner="engine", global_batch=64, max_candidates=4000, precision="amp-bf16"
    )
    rows.validate(compile_context(graph, resources))
    assert {1, 2, 4} <= set(rows.tensor.tolist()) and (rows.pipeline > 1).any()
    assert set(rows.context_parallel.tolist()) > {1}
    assert (64 % (2 * rows.context_parallel) == 0).all(), "causal ring attention balances 2·c pieces"
    schedules = set(zip(rows.schedule.tolist(), rows.virtual_stages.tolist(), strict=True))
    assert (Schedule.INTERLEAVED, 2) in schedules and {(Schedule.ZERO_BUBBLE, 1), (Schedule.ZERO_BUBBLE, 2)} & schedules
    assert rows.selective.any() and rows.recompute.any() and (~rows.selective & ~rows.recompute).any()
    assert rows.sequence_parallel.any() and not (rows.sequence_parallel & (rows.tensor == 1)).any()
    sharded = rows.kind == SyncKind.SHARDED
    assert {1, 2, 3} <= set(rows.zero_stage[sharded].tolist())
    groups = rows.shard_group[rows.shard_group > 0]
    assert groups.size and (rows.data[rows.shard_group > 0] % groups == 0).all(), (
        "a hybrid shard group divides the data degree"
    )
    stride = (rows.tensor * rows.pipeline * rows.context_parallel)[rows.shard_group > 0]
    assert (groups * stride <= 8).all(), "a hybrid shard group stays inside a node"
    assert len(set(rows.micro_batch_size.tolist())) > 2
    assert (rows.precision == Precision.AMP_BF16).all(), "precision is an input unless allowed"


def test_the_stratagem_runner_offers_only_what_its_runtime_runs(monkeypatch) -> None:
    graph, resources = llama_graph(batch=4, seq=64), gpu_cluster(1, 8)
    space = Space(compile_context(graph, resources), SearchOptions())
    assert space.rules.context == (1, 2, 4, 8), "the runtime gathers a Hugging Face model's keys and values"
    assert space.rules.deepest == 1, "a Hugging Face model is neither an nn.Sequential nor returns a 0-d loss"
    assert space.rules.tensor == (1,), "its plan cannot split grouped-query attention"
    _, rows, _ = evaluated(monkeypatch, graph, resources)
    assert (rows.pipeline == 1).all() and (rows.tensor == 1).all()
    engine = Space(compile_context(graph, resources), SearchOptions(runner="engine"))
    assert engine.rules.tensor == (1, 2, 4) and engine.rules.deepest > 1 and len(engine.rules.context) > 1
    assert engine.rules.max_pipeline(1, 2) > 1 and space.rules.max_pipeline(1, 2) == 1


def test_the_stratagem_runner_splits_the_sequence_or_cuts_stages_never_both(monkeypatch) -> None:
    from stratagem import zoo
    from stratagem.tracing import capture

    module, make_batch = zoo.build("gpt", "small", device="meta", seq=64)
    graph, resources = capture(module, make_batch(8), batch_size=8), gpu_cluster(1, 8)
    rules = Space(compile_context(graph, resources), SearchOptions()).rules
    assert len(rules.context) > 1 and rules.deepest > 1 and not rules.pipeline_context
    _, rows, _ = evaluated(monkeypatch, graph, resources)
    assert (rows.context_parallel > 1).any() and (rows.pipeline > 1).any()
    assert not ((rows.context_parallel > 1) & (rows.pipeline > 1)).any()


def test_precision_is_searched_only_when_allowed(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    result, rows, _ = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=32, precision="fp32")
    assert (rows.precision == Precision.FP32).all()
    assert all(c.precision == "fp32" for c in result.candidates)
    assert all(c.precision == "fp32" for c in result.baselines.values())
    result, rows, _ = evaluated(
        monkeypatch, graph, resources, runner="engine", global_batch=32, precision="fp32", allow_precision=True
    )
    assert {Precision.FP32, Precision.AMP_BF16, Precision.FP8, Precision.FP16} <= set(rows.precision.tolist())
    assert all(c.precision in PRECISION_NAMES for c in result.candidates)
    # an fp16 model beside fp32 master weights is an engine's mode: stratagem's runtime keeps no master copy
    _, rows, _ = evaluated(monkeypatch, graph, resources, global_batch=32, precision="fp32", allow_precision=True)
    assert Precision.AMP_BF16 in set(rows.precision.tolist()) and Precision.FP16 not in set(rows.precision.tolist())


def test_every_candidate_trains_the_fixed_global_batch(monkeypatch) -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(2, 8)
    for batch in (64, 40):  # 40: the 16 devices do not divide it, so plain data parallelism cannot train it
        result, rows, scores = evaluated(monkeypatch, graph, resources, runner="engine", global_batch=batch)
        trained = rows.data * rows.micro_batch_size * rows.micro_batches
        assert (rows.micro_batch_size > 0).all() and (trained == batch).all()
        assert np.isfinite(scores).any()
        for strategy in result.candidates:
            mesh = strategy.effective_mesh
            assert strategy.micro_batch_size is not None
            assert mesh.data * strategy.micro_batch_size * strategy.micro_batches == batch
            priced = simulate(graph, resources, [strategy])[0]
            assert priced.step_time_s == pytest.approx(strategy.predicted.step_time_s, rel=1e-9)
            assert priced.samples_per_s * priced.step_time_s == pytest.approx(batch, rel=1e-9)
        assert (batch % 16 == 0) == bool(result.baselines)


def test_a_search_out_of_time_before_anything_fits_goes_on_until_something_does() -> None:
    """With no builder able to train the batch (40 on 16 devices) and the clock gone before the first
    proposal, as on a loaded machine, the answer is still a layout that fits, not 'nothing fits'."""
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(2, 8)
    result = search(graph, resources, runner="engine", global_batch=40, time_budget_s=1e-4, max_candidates=20000)
    assert not result.baselines
    assert result.candidates and result.stopped_by == "time"
    assert all(np.isfinite(c.predicted.step_time_s) for c in result.candidates)


def test_without_a_global_batch_the_graph_batch_is_a_replica_step() -> None:
    graph, resources = llama_graph(batch=4, seq=64), gpu_cluster(1, 8)
    result = search(graph, resources, **BUDGET)
    assert all(c.micro_batch_size is None for c in result.candidates)


def test_a_global_batch_no_layout_trains_is_refused_with_the_field() -> None:
    with pytest.raises(InvalidDocumentError) as caught:
        search(cnn_graph(), gpu_cluster(2, 8), global_batch=10, **BUDGET)
    assert caught.value.problems[0].path == "search.global_batch"
    with pytest.raises(InvalidDocumentError) as caught:
        search(cnn_graph(), gpu_cluster(2, 8), precision="fp7", **BUDGET)
    assert caught.value.problems[0].path == "search.precision"


def test_a_row_that_states_its_micro_batch_is_priced_on_its_step_graph() -> None:
    graph, resources = llama_graph(batch=1, seq=64), gpu_cluster(1, 8)
    layouts = [
        Layout(tensor=2, pipeline=2, micro_batch=1, global_batch=32, precision="amp-bf16"),
        Layout(zero=3, micro_batch=1, global_batch=64, recompute="selective"),
    ]
    strategies = [layout.build(graph, resources) for layout in layouts]
    context = compile_context(graph, resources)
    batch = encode(context, strategies)
    assert batch.micro_batch_size.tolist() == [1, 1]
    for direct, priced in zip(predictions(context, batch), simulate(graph, resources, strategies), strict=True):
        assert direct.step_time_s == pytest.approx(priced.step_time_s, rel=1e-12)
        assert direct.samples_per_s == pytest.approx(priced.samples_per_s, rel=1e-12)


def test_the_explanation_names_the_dimension_that_made_the_difference() -> None:
    graph, resources = llama_graph(batch=1, seq=256), gpu_cluster(2, 8)
    result = search(graph, resources, runner="engine", global_batch=64, **BUDGET)
    best = result.candidates[0]
    record = best.provenance.search["composition"]["difference"]
    assert record["dimension"] in {*DIMENSIONS, *ZERO_DIMENSIONS["zero"]}
    assert "made the difference" in best.provenance.search["why"]
    assert record["sentence"] in best.provenance.search["why"]
    nearest = record.get("nearest")
    assert nearest is None or nearest["slower"] >= -1e-9, "the winner is no slower than its neighbours"


@functools.cache
def llama_70b() -> ModelGraph:
    """Llama-3 70B's shapes (the benchmark's config) at one sequence of 8192 tokens."""
    from benchmarks.predict import LLAMA3_70B
    from stratagem.hf import capture_hf_config

    return capture_hf_config(LLAMA3_70B, batch=1, seq=8192)


@pytest.mark.slow
def test_a_70b_decoder_on_64_h100_weighs_the_layouts_practitioners_run(monkeypatch) -> None:
    """tp=8 × pp=2 with selective recomputation (Megatron's recipe), FSDP with full recomputation
    (torchtitan's), tp=4 × pp=4 interleaved: all three priced, ranked, and none beats the answer."""
    graph, resources = llama_70b(), gpu_cluster(8, 8, "H100")
    result, rows, scores = evaluated(
        monkeypatch,
        graph,
        resources,
        runner="engine",
        global_batch=256,
        precision="amp-bf16",
        max_candidates=2500,
        top_k=3,
    )
    plain = rows.context_parallel == 1
    fsdp = ((rows.kind == SyncKind.SHARDED) & (rows.zero_stage == 3)).all(axis=1)
    practised = {
        "tp=8, pp=2, selective": plain & (rows.tensor == 8) & (rows.pipeline == 2) & rows.selective,
        "fsdp, full recompute": plain & (rows.tensor == 1) & (rows.pipeline == 1) & rows.recompute & fsdp,
        "tp=4, pp=4, interleaved": plain
        & (rows.tensor == 4)
        & (rows.pipeline == 4)
        & (rows.schedule == Schedule.INTERLEAVED),
    }
    best = {}
    for name, mask in practised.items():
        assert mask.any(), f"{name} was never evaluated"
        best[name] = float(scores[mask].min())
    ranked = sorted(best, key=lambda name: best[name])
    assert np.isfinite(best[ranked[0]]), f"none of {ranked} fits"
    winner = result.candidates[0]
    assert winner.predicted.feasible
    assert winner.predicted.step_time_s <= best[ranked[0]] * (1 + 1e-9)
    assert winner.micro_batch_size is not None and winner.precision == "amp-bf16"
